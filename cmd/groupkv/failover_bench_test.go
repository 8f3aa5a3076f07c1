package main

import (
	"context"
	"fmt"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// failoverKills is the number of leader kills of BenchmarkClusterFailover.
const failoverKills = 20

// failoverWriter puts one key over and over through a node of a cluster
// (target, changed between kills), and tells who waits for it when a put
// sent after a given moment succeeds.
type failoverWriter struct {
	c      *tcluster
	coll   string
	target atomic.Int64 // the node the puts go through
	client *http.Client

	mu    sync.Mutex
	since time.Time      // the moment watch is about
	watch chan time.Time // gets the ack time of the first put sent at or after since
	errs  map[string]int // error answers (code, or "transport") since the last reset
	stop  chan struct{}
	done  chan struct{}
	puts  atomic.Int64
}

func (w *failoverWriter) run() {
	defer close(w.done)
	for i := 0; ; i++ {
		select {
		case <-w.stop:
			return
		default:
		}
		id := int(w.target.Load())
		sent := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		a, err := doHTTP(ctx, w.client, "PUT", w.c.url(id)+"/v1/kv/"+w.coll+"/w", "w"+strconv.Itoa(i))
		cancel()
		acked := time.Now()
		w.mu.Lock()
		if err == nil && a.code == 200 {
			w.puts.Add(1)
			if w.watch != nil && !sent.Before(w.since) {
				w.watch <- acked
				w.watch = nil
			}
			w.mu.Unlock()
			continue
		}
		what := "transport error"
		if err == nil {
			what = fmt.Sprintf("%d %s", a.code, a.errCode)
		}
		w.errs[what]++
		w.mu.Unlock()
		time.Sleep(2 * time.Millisecond) // the resolution of the measurement
	}
}

// watchFrom answers a channel that gets the ack time of the first put sent
// at or after since, and resets the error counts.
func (w *failoverWriter) watchFrom(since time.Time) <-chan time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	ch := make(chan time.Time, 1)
	w.since, w.watch = since, ch
	w.errs = map[string]int{}
	return ch
}

func (w *failoverWriter) errors() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.errs)
}

// BenchmarkClusterFailover measures how long writes stop when the leader of
// a shard dies: on a three-node cluster, with a writer putting one key of a
// one-shard collection (replicated on all three) through a node that is
// not the shard's leader, it kills the leader with SIGKILL 20 times and
// measures, each time, the time from the kill to the first successful put
// sent after it; then it restarts the killed node on its data and waits
// until it is healthy and has caught up before the next kill. It reports
// the median and the maximum as resume-p50-ms and resume-max-ms, and logs
// every kill.
//
// One run of the benchmark function is the whole 20-kill experiment,
// whatever b.N is: run it with -benchtime 1x (the default -benchtime also
// runs it once, as one run takes well over a second). ns/op is then the
// duration of the experiment, kills, restarts and waits included.
//
//	go test ./cmd/groupkv -run '^$' -bench ClusterFailover -benchtime 1x
func BenchmarkClusterFailover(b *testing.B) {
	c := newTCluster(b, 3)
	c.startAll()
	const coll = "failover"
	c.createCollection(1, coll, 1)
	leader := c.leaderOf(coll)
	c.put(1, coll, "w", "ready")

	w := &failoverWriter{c: c, coll: coll, client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}},
		errs: map[string]int{}, stop: make(chan struct{}), done: make(chan struct{})}
	w.target.Store(int64(1 + leader%3)) // a node that does not lead
	go w.run()
	defer func() {
		select {
		case <-w.stop:
		default:
			close(w.stop)
		}
		<-w.done
	}()
	time.Sleep(500 * time.Millisecond)

	b.ResetTimer()
	var resumes []time.Duration
	var details []string // one per kill
	for round := 1; round <= failoverKills; round++ {
		leader := c.leaderOf(coll)
		writer := 1 + leader%3
		w.target.Store(int64(writer))
		time.Sleep(100 * time.Millisecond) // puts in flight go to the new target
		killed := time.Now()
		resumed := w.watchFrom(killed)
		c.kill(leader)
		var resume time.Duration
		select {
		case at := <-resumed:
			resume = at.Sub(killed)
		case <-time.After(30 * time.Second):
			b.Fatalf("kill %d: no put through node %d succeeded within 30s of killing node %d (the leader); errors: %v",
				round, writer, leader, w.errors())
		}
		errs := w.errors()
		c.start(leader, false)
		healthy := c.waitHealthy(leader)
		// Caught up: a linearizable read through the restarted node
		// waits until its replica has applied what the leader committed.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		a, err := c.do(ctx, "GET", c.url(leader)+"/v1/kv/"+coll+"/w", "")
		cancel()
		if err != nil || a.code != 200 {
			b.Fatalf("kill %d: a read through the restarted node %d: %v %s", round, leader, err, a)
		}
		resumes = append(resumes, resume)
		var failed []string
		for _, k := range slices.Sorted(maps.Keys(errs)) {
			failed = append(failed, fmt.Sprintf("%s x%d", k, errs[k]))
		}
		details = append(details, fmt.Sprintf("kill %d: node %d, puts through %d resumed in %d ms (%s), healthy %d ms after restart",
			round, leader, writer, resume.Milliseconds(), strings.Join(failed, ", "), healthy.Milliseconds()))
	}
	b.StopTimer()

	sorted := slices.Clone(resumes)
	slices.Sort(sorted)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	p50 := sorted[int(math.Ceil(0.5*float64(len(sorted))))-1] // nearest rank
	b.ReportMetric(ms(p50), "resume-p50-ms")
	b.ReportMetric(ms(sorted[len(sorted)-1]), "resume-max-ms")
	all := make([]string, len(resumes))
	for i, d := range resumes {
		all[i] = strconv.FormatInt(d.Milliseconds(), 10)
	}
	// The testing package keeps 10 lines of a benchmark's log: a summary,
	// then the kills three to a line.
	b.Logf("writes resumed after (ms, in kill order): %s; p50 %.0f ms, max %.0f ms; %d puts succeeded in all",
		strings.Join(all, " "), ms(p50), ms(sorted[len(sorted)-1]), w.puts.Load())
	for i := 0; i < len(details); i += 3 {
		b.Logf("%s", strings.Join(details[i:min(i+3, len(details))], "; "))
	}
}
