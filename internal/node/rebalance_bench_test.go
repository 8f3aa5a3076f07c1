package node

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/shard"
)

// BenchmarkRebalance measures what moving replicas onto a new node
// costs a write workload, and how fast the data moves.
//
// Three in-process nodes (real gRPC on 127.0.0.1, 20 ms raft ticks as in
// the cluster tests) hold two collections of 4 shards and 3 replicas:
// "bench", loaded with 1024 keys of 64 KiB (64 MiB of values), and
// "filler", nearly empty. Each node then holds 8 replicas. When a fourth
// node joins, the rebalancer moves single shard replicas onto it until
// per-node counts differ by at most one (6 each: six replicas move, a
// follower replica before a preferred leader, shards by id, so mostly of
// "bench"), then spreads the preferred leaders.
//
// The raft tick is 20 ms as in the cluster tests; GROUPKV_BENCH_TICK
// overrides it (e.g. 100ms, the nodes' default).
//
// The experiment, run once whatever b.N is (run it with -benchtime 1x; its
// whole duration is the reported ns/op):
//
//   - steady: 16 goroutines put 1 KiB values to random keys of "bench"
//     through random nodes among the first three for 5 s: steady-ops/s
//     and steady-p99-ms (acknowledged puts only; failures are counted in
//     steady-errors);
//   - rebalance: the same workload runs while a fourth node is added and
//     the rebalancer moves replicas onto it (each: learner, snapshot,
//     voter, removal of the source's replica, the source deleting its
//     copy), until the replica counts differ by at most one and
//     settledEverywhere holds for both collections: rebalance-ops/s,
//     rebalance-p99-ms, rebalance-errors, and rebalance-s, the time from
//     adding the node to settled. rebalance-s includes joining and waiting
//     for the rebalancer's next round (every second on the meta leader);
//     move-s is the part from the first move in the catalog to settled.
//   - steady-dropped-msgs and rebalance-dropped-msgs count the raft
//     messages the nodes' transports dropped in each phase (unresolvable
//     replica, full queue, unreachable node).
//   - moved-MiB is what was moved: the snapshot data of the shards the new
//     node holds at the end (every retained version, index entries and
//     shard state); seconds-per-GiB is rebalance-s divided
//     by it, move-s-per-GiB is move-s divided by it.
func BenchmarkRebalance(b *testing.B) {
	const (
		loadKeys    = 1024
		loadValue   = 64 << 10
		writers     = 16
		writeValue  = 1 << 10
		steadyFor   = 5 * time.Second
		bound       = 120 * time.Second // only catches hangs
		movedColl   = "bench"
		fillerColl  = "filler"
		collShards  = 4
		loadPerPut  = 16 // 1 MiB per batch
		loadWorkers = 4
	)
	ctx := context.Background()
	bc := startBenchCluster(b, 3)
	for _, name := range []string{movedColl, fillerColl} {
		if _, err := bc.nodes[0].n.CreateCollection(ctx, kv.CollectionOptions{Name: name, Shards: collShards, Replicas: 3}); err != nil {
			b.Fatal(err)
		}
	}
	// Load: 64 MiB of incompressible values.
	loadStart := time.Now()
	var next atomic.Int64
	var lwg sync.WaitGroup
	errs := make(chan error, loadWorkers)
	for w := 0; w < loadWorkers; w++ {
		lwg.Add(1)
		go func(w int) {
			defer lwg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for {
				lo := int(next.Add(loadPerPut)) - loadPerPut
				if lo >= loadKeys {
					return
				}
				var items []kv.PutItem
				for i := lo; i < min(lo+loadPerPut, loadKeys); i++ {
					v := make([]byte, loadValue)
					for j := 0; j < len(v); j += 8 {
						u := rng.Uint64()
						for k := 0; k < 8; k++ {
							v[j+k] = byte(u >> (8 * k))
						}
					}
					items = append(items, kv.PutItem{Collection: movedColl, Key: []byte(fmt.Sprintf("load%05d", i)), Value: v})
				}
				cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
				_, err := bc.nodes[w%len(bc.nodes)].n.BatchPut(cctx, items)
				cancel()
				if err != nil {
					errs <- err
					return
				}
			}
		}(w)
	}
	lwg.Wait()
	select {
	case err := <-errs:
		b.Fatalf("loading: %v", err)
	default:
	}
	for i := 0; i < 16; i++ {
		if _, err := bc.nodes[0].n.Put(ctx, kv.PutRequest{Collection: fillerColl, Key: []byte(fmt.Sprint("f", i)), Value: []byte("x")}); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("loaded %d MiB into %q in %v", loadKeys*loadValue>>20, movedColl, time.Since(loadStart).Round(time.Millisecond))
	bc.waitSettled(bound, movedColl, fillerColl)
	clients := append([]*testNode(nil), bc.nodes...)
	// Raft messages the nodes' transports dropped (unresolvable replica,
	// full queue, unreachable node).
	dropped := func() (sum uint64) {
		for _, tn := range bc.nodes {
			sum += tn.n.tr.Dropped()
		}
		return sum
	}

	b.ResetTimer()
	// Steady phase.
	droppedBefore := dropped()
	steady := runWriteLoad(ctx, clients, movedColl, writers, writeValue, func(stop chan struct{}) {
		time.Sleep(steadyFor)
		close(stop)
	})

	steadyDropped := dropped() - droppedBefore

	// Rebalance phase: the workload runs from adding the node to settled.
	droppedBefore = dropped()
	var addedAt, movedAt, settledAt time.Time
	var n4 *testNode
	moved := 0
	during := runWriteLoad(ctx, clients, movedColl, writers, writeValue, func(stop chan struct{}) {
		defer close(stop)
		addedAt = time.Now()
		n4 = bc.addNode()
		deadline := time.Now().Add(bound)
		for moved == 0 {
			if time.Now().After(deadline) {
				b.Errorf("no replica moved onto node %d within %v", n4.id, bound)
				return
			}
			for _, name := range []string{movedColl, fillerColl} {
				if d, err := bc.nodes[0].n.collection(name); err == nil {
					for _, s := range d.Shards {
						if slices.ContainsFunc(s.Replicas, func(r cluster.Replica) bool { return r.Node == n4.id }) {
							moved++
						}
					}
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
		movedAt = time.Now()
		for {
			err := bc.pollSettled(deadline, movedColl, fillerColl)
			if err == nil {
				err = bc.replicasBalanced(movedColl, fillerColl)
			}
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				b.Errorf("not balanced and settled within %v: %v", bound, err)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		settledAt = time.Now()
	})
	b.StopTimer()
	rebalanceDropped := dropped() - droppedBefore
	if b.Failed() {
		b.FailNow()
	}

	// What moved: the snapshot data of the shards on the new node.
	var movedBytes, movedShards int
	for _, name := range []string{movedColl, fillerColl} {
		d, err := bc.nodes[0].n.collection(name)
		if err != nil {
			b.Fatal(err)
		}
		for _, s := range d.Shards {
			n4.n.mu.RLock()
			r, ok := n4.n.mu.replicas[s.ID]
			n4.n.mu.RUnlock()
			if !ok {
				continue
			}
			data, err := shard.SnapshotData(n4.n.eng.DB, r.Desc)
			if err != nil {
				b.Fatal(err)
			}
			movedBytes += len(data)
			movedShards++
		}
	}
	var streamed uint64
	for _, tn := range bc.nodes {
		streamed += tn.n.tr.SnapshotsStreamed()
	}
	gib := float64(movedBytes) / (1 << 30)
	rebalanceS := settledAt.Sub(addedAt).Seconds()
	moveS := settledAt.Sub(movedAt).Seconds()
	b.Logf("moved %d replicas (%.1f MiB of snapshot data, %d snapshots streamed in the cluster) onto node %d: "+
		"catalog changed %.2fs after adding the node, balanced and settled %.2fs later",
		movedShards, float64(movedBytes)/(1<<20), streamed, n4.id, movedAt.Sub(addedAt).Seconds(), moveS)
	b.Logf("steady: %s", steady)
	b.Logf("rebalance: %s", during)
	b.ReportMetric(steady.opsPerSec(), "steady-ops/s")
	b.ReportMetric(steady.p99ms(), "steady-p99-ms")
	b.ReportMetric(float64(steady.errors), "steady-errors")
	b.ReportMetric(during.opsPerSec(), "rebalance-ops/s")
	b.ReportMetric(during.p99ms(), "rebalance-p99-ms")
	b.ReportMetric(float64(during.errors), "rebalance-errors")
	b.ReportMetric(float64(steadyDropped), "steady-dropped-msgs")
	b.ReportMetric(float64(rebalanceDropped), "rebalance-dropped-msgs")
	b.ReportMetric(rebalanceS, "rebalance-s")
	b.ReportMetric(moveS, "move-s")
	b.ReportMetric(float64(movedBytes)/(1<<20), "moved-MiB")
	b.ReportMetric(rebalanceS/gib, "seconds-per-GiB")
	b.ReportMetric(moveS/gib, "move-s-per-GiB")
}

// loadResult is what a run of runWriteLoad observed.
type loadResult struct {
	elapsed   time.Duration
	latencies []time.Duration // of acknowledged puts, sorted
	errors    int
	firstErr  error
	byCode    map[kv.Code]int // failed puts by error code
}

func (r loadResult) opsPerSec() float64 {
	return float64(len(r.latencies)) / r.elapsed.Seconds()
}

func (r loadResult) quantile(q float64) time.Duration {
	if len(r.latencies) == 0 {
		return 0
	}
	i := int(float64(len(r.latencies))*q+0.999999) - 1
	return r.latencies[max(0, min(i, len(r.latencies)-1))]
}

func (r loadResult) p99ms() float64 { return float64(r.quantile(0.99)) / float64(time.Millisecond) }

func (r loadResult) String() string {
	return fmt.Sprintf("%d puts in %.2fs (%.0f/s), p50 %v p99 %v max %v, %d failed %v (first: %v)",
		len(r.latencies), r.elapsed.Seconds(), r.opsPerSec(), r.quantile(0.5).Round(time.Microsecond),
		r.quantile(0.99).Round(time.Microsecond), r.quantile(1).Round(time.Microsecond), r.errors, r.byCode, r.firstErr)
}

// runWriteLoad runs writers goroutines putting values of size bytes to
// random keys of coll through random nodes of nodes, until phase closes
// the channel it is given; phase runs on the calling goroutine.
func runWriteLoad(ctx context.Context, nodes []*testNode, coll string, writers, size int, phase func(stop chan struct{})) loadResult {
	stop := make(chan struct{})
	type out struct {
		lat      []time.Duration
		errors   int
		firstErr error
		byCode   map[kv.Code]int
	}
	outs := make([]out, writers)
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(start.UnixNano()), uint64(w)))
			value := make([]byte, size)
			for {
				select {
				case <-stop:
					return
				default:
				}
				for j := range value {
					value[j] = byte(rng.Uint32())
				}
				key := []byte(fmt.Sprintf("w%07d", rng.IntN(1<<20)))
				tn := nodes[rng.IntN(len(nodes))]
				cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				t0 := time.Now()
				_, err := tn.n.Put(cctx, kv.PutRequest{Collection: coll, Key: key, Value: value})
				d := time.Since(t0)
				cancel()
				if err != nil {
					if outs[w].firstErr == nil {
						outs[w].firstErr = fmt.Errorf("through node %d at %s: %w", tn.id, time.Now().Format("15:04:05.000"), err)
					}
					outs[w].errors++
					if outs[w].byCode == nil {
						outs[w].byCode = map[kv.Code]int{}
					}
					outs[w].byCode[kv.CodeOf(err)]++
					continue
				}
				outs[w].lat = append(outs[w].lat, d)
			}
		}(w)
	}
	phase(stop)
	wg.Wait()
	r := loadResult{elapsed: time.Since(start), byCode: map[kv.Code]int{}}
	for _, o := range outs {
		r.latencies = append(r.latencies, o.lat...)
		r.errors += o.errors
		for code, k := range o.byCode {
			r.byCode[code] += k
		}
		if r.firstErr == nil {
			r.firstErr = o.firstErr
		}
	}
	slices.Sort(r.latencies)
	return r
}

// benchCluster is testCluster for a benchmark: in-process nodes joined
// into one cluster, real gRPC between them on 127.0.0.1 through a
// faultNet. (testCluster's helpers take a *testing.T.)
type benchCluster struct {
	tb    testing.TB
	net   *faultNet
	nodes []*testNode
	join  string
}

func startBenchCluster(tb testing.TB, size int) *benchCluster {
	tb.Helper()
	bc := &benchCluster{tb: tb, net: newFaultNet()}
	for i := 0; i < size; i++ {
		bc.addNode()
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok := true
		for _, tn := range bc.nodes {
			ok = ok && len(tn.n.members()) == size
		}
		if ok {
			return bc
		}
		if time.Now().After(deadline) {
			tb.Fatalf("not every node knows %d members within 30s", size)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// addNode starts one more node, joined to the first, and waits until it
// serves (as testCluster.addNode).
func (bc *benchCluster) addNode() *testNode {
	tb := bc.tb
	tb.Helper()
	id := uint64(len(bc.nodes) + 1)
	opts := Options{DataDir: tb.TempDir(), NodeID: id, TickInterval: benchTick(tb),
		Dialer: bc.net.dialer(id), Logger: quietLogger()}
	if bc.join != "" {
		opts.Join = []string{bc.join}
	}
	n, err := Open(opts)
	if err != nil {
		tb.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv := grpc.NewServer()
	n.RegisterPeer(srv)
	go srv.Serve(l)
	bc.net.mu.Lock()
	bc.net.addrNode[l.Addr().String()] = id
	bc.net.mu.Unlock()
	n.Serve(fmt.Sprintf("127.0.0.1:%d", 41000+id), l.Addr().String())
	tn := &testNode{id: id, n: n, srv: srv}
	tb.Cleanup(func() {
		tn.srv.Stop()
		tn.n.Close()
	})
	bc.nodes = append(bc.nodes, tn)
	if bc.join == "" {
		bc.join = l.Addr().String()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := n.WaitReady(ctx); err != nil {
		tb.Fatalf("node %d: %v", id, err)
	}
	return tn
}

// benchTick is the raft tick of the benchmark's nodes: 20 ms as in the
// cluster tests (elections after 200 ms), or GROUPKV_BENCH_TICK (a
// duration; the nodes' default is 100 ms).
func benchTick(tb testing.TB) time.Duration {
	s := os.Getenv("GROUPKV_BENCH_TICK")
	if s == "" {
		return 20 * time.Millisecond
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		tb.Fatalf("GROUPKV_BENCH_TICK: %v", err)
	}
	return d
}

// pollSettled waits until settledEverywhere holds for every collection of
// names, or deadline passes.
func (bc *benchCluster) pollSettled(deadline time.Time, names ...string) error {
	c := &testCluster{nodes: bc.nodes}
	for {
		var err error
		for _, name := range names {
			if err = c.settledEverywhere(name); err != nil {
				break
			}
		}
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// replicasBalanced checks that the catalog's replica counts per node, over
// the shards of names, differ by at most one.
func (bc *benchCluster) replicasBalanced(names ...string) error {
	count := map[uint64]int{}
	for _, tn := range bc.nodes {
		count[tn.id] = 0
	}
	for _, name := range names {
		d, err := bc.nodes[0].n.collection(name)
		if err != nil {
			return err
		}
		for _, s := range d.Shards {
			for _, r := range s.Replicas {
				count[r.Node]++
			}
		}
	}
	lo, hi := 1<<30, 0
	for _, c := range count {
		lo, hi = min(lo, c), max(hi, c)
	}
	if hi-lo > 1 {
		return fmt.Errorf("replicas per node %v", count)
	}
	return nil
}

func (bc *benchCluster) waitSettled(d time.Duration, names ...string) {
	bc.tb.Helper()
	if err := bc.pollSettled(time.Now().Add(d), names...); err != nil {
		bc.tb.Fatalf("not settled within %v: %v", d, err)
	}
}
