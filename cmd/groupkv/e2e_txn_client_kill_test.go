package main

// End-to-end tests of a session transaction whose client is a process of
// its own, killed with SIGKILL: while it holds locks on several shards
// (TestEndToEndTxnClientKillHolding) and while its commit is in flight
// (TestEndToEndTxnClientKillCommitting). The client is this test binary
// run again (TestHelperTxnClient, with txnClientEnv set), speaking HTTP to
// one node of a real three-node cluster.
//
// A session's gateway heartbeats the attempt's record only while its
// client is heard from (during a request and for TxnTimeout after one), so
// a killed client's locks expire about two TxnTimeouts (5 s by default;
// the server has no flag for it) after its last request: transactions of
// others on the same keys, through other nodes, must then go through, and
// see all of the dead client's writes or none of them.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/groupkv/groupkv"
)

// txnClientEnv, set, makes this test binary a transaction client
// (TestHelperTxnClient) rather than a test run; TestMain then builds no
// server binary. The client's parameters are in the variables below.
const (
	txnClientEnv     = "GROUPKV_TXN_CLIENT"
	txnClientURLEnv  = "GROUPKV_TXN_CLIENT_URL"  // the node's base URL
	txnClientCollEnv = "GROUPKV_TXN_CLIENT_COLL" // the collection
	txnClientKeysEnv = "GROUPKV_TXN_CLIENT_KEYS" // its keys, comma-separated
	txnClientTagEnv  = "GROUPKV_TXN_CLIENT_TAG"  // it writes tag + "-" + key to each key
)

// txnClientPrefix begins every line of the client's protocol on its
// standard output:
//
//	TXN <id>                  the attempt began
//	LOCKED                    it read and wrote every key: it holds their locks
//	COMMITTING                it sends the commit right after this line
//	COMMIT <status> <body>    the commit's answer (COMMIT error <err>: none)
//	ERROR <what>              something the test did not expect
//
// After LOCKED the client re-reads its first key every 300 ms, so that its
// gateway goes on heartbeating the attempt, until a line "commit" on its
// standard input; it exits when its standard input closes.
const txnClientPrefix = "txnclient: "

// TestHelperTxnClient is the transaction client process of the tests
// below; it does nothing in an ordinary test run.
func TestHelperTxnClient(t *testing.T) {
	if os.Getenv(txnClientEnv) == "" {
		return
	}
	os.Exit(runTxnClient())
}

func runTxnClient() int {
	base, coll, tag := os.Getenv(txnClientURLEnv), os.Getenv(txnClientCollEnv), os.Getenv(txnClientTagEnv)
	keys := strings.Split(os.Getenv(txnClientKeysEnv), ",")
	say := func(format string, args ...any) {
		// Standard output is not buffered: a line is out when this returns.
		fmt.Printf(txnClientPrefix+format+"\n", args...)
	}
	// Whatever becomes of the test, the client does not outlive it long.
	time.AfterFunc(3*time.Minute, func() {
		say("ERROR still running after 3m")
		os.Exit(4)
	})
	hc := &http.Client{Timeout: 30 * time.Second}
	post := func(path string, body any) (kvAnswer, error) {
		b := ""
		if body != nil {
			j, err := json.Marshal(body)
			if err != nil {
				return kvAnswer{}, err
			}
			b = string(j)
		}
		return doHTTP(context.Background(), hc, "POST", base+path, b)
	}
	type keyRef struct {
		Collection string `json:"collection"`
		Key        string `json:"key"`
	}
	type putReq struct {
		Collection string `json:"collection"`
		Key        string `json:"key"`
		Value      string `json:"value"`
	}
	a, err := post("/v1/txn", map[string]string{})
	var begin struct {
		Txn string `json:"txn"`
	}
	if err != nil || a.code != 200 || json.Unmarshal([]byte(a.body), &begin) != nil || begin.Txn == "" {
		say("ERROR begin: %v %s", err, a)
		return 1
	}
	say("TXN %s", begin.Txn)
	txn := "/v1/txn/" + begin.Txn
	for _, k := range keys {
		if a, err := post(txn+"/get", keyRef{coll, k}); err != nil || a.code != 200 || !strings.Contains(a.body, `"found":true`) {
			say("ERROR get %s: %v %s", k, err, a)
			return 1
		}
		if a, err := post(txn+"/put", putReq{coll, k, tag + "-" + k}); err != nil || a.code != 200 {
			say("ERROR put %s: %v %s", k, err, a)
			return 1
		}
	}
	say("LOCKED")
	var mu sync.Mutex
	committing := false
	go func() {
		for {
			time.Sleep(300 * time.Millisecond)
			mu.Lock()
			if committing {
				mu.Unlock()
				return
			}
			a, err := post(txn+"/get", keyRef{coll, keys[0]})
			mu.Unlock()
			if err != nil || a.code != 200 {
				say("ERROR keep-alive get: %v %s", err, a)
			}
		}
	}()
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		if sc.Text() != "commit" {
			continue
		}
		mu.Lock()
		committing = true
		mu.Unlock()
		say("COMMITTING")
		a, err := post(txn+"/commit", nil)
		if err != nil {
			say("COMMIT error %v", err)
		} else {
			say("COMMIT %d %s", a.code, strings.TrimSpace(a.body))
		}
	}
	return 3
}

// txnClient is a running transaction client process.
type txnClient struct {
	tag  string
	keys []string
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *tlog // its standard output and error

	lines chan string // protocol lines, the prefix cut
	mu    sync.Mutex
	seen  []string // every protocol line so far
	done  chan struct{}
	err   error // its exit status, once done is closed
}

// startTxnClient starts a client process that begins a transaction
// through url, reads and writes every key of coll in keys, and waits.
func startTxnClient(t *testing.T, url, coll, tag string, keys []string) *txnClient {
	t.Helper()
	cl := &txnClient{tag: tag, keys: keys, out: &tlog{}, lines: make(chan string, 1000), done: make(chan struct{})}
	cl.cmd = exec.Command(os.Args[0], "-test.run=^TestHelperTxnClient$", "-test.count=1")
	cl.cmd.Env = append(os.Environ(), txnClientEnv+"=1", txnClientURLEnv+"="+url, txnClientCollEnv+"="+coll,
		txnClientKeysEnv+"="+strings.Join(keys, ","), txnClientTagEnv+"="+tag)
	cl.cmd.Stderr = cl.out
	var err error
	if cl.in, err = cl.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cl.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.cmd.Start(); err != nil {
		t.Fatalf("starting transaction client %s: %v", tag, err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(cl.out, line)
			if rest, ok := strings.CutPrefix(line, txnClientPrefix); ok {
				cl.mu.Lock()
				cl.seen = append(cl.seen, rest)
				cl.mu.Unlock()
				cl.lines <- rest
			}
		}
		close(cl.lines)
		err := cl.cmd.Wait() // after every read of stdout, as Wait requires
		cl.mu.Lock()
		cl.err = err
		cl.mu.Unlock()
		close(cl.done)
	}()
	t.Cleanup(func() {
		cl.kill()
		if t.Failed() {
			t.Logf("transaction client %s (keys %v) output:\n%s", tag, keys, cl.out.tail(40))
		}
	})
	return cl
}

// waitFor waits for the client's protocol line beginning with what, and
// fails the test on an ERROR line, its exit, or timeout.
func (cl *txnClient) waitFor(t *testing.T, what string, timeout time.Duration) string {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		select {
		case line, ok := <-cl.lines:
			switch {
			case !ok:
				<-cl.done
				t.Fatalf("transaction client %s exited (%v) before %s:\n%s", cl.tag, cl.err, what, cl.out.tail(40))
			case strings.HasPrefix(line, "ERROR"):
				t.Fatalf("transaction client %s: %s", cl.tag, line)
			case strings.HasPrefix(line, what):
				return line
			}
		case <-timer.C:
			t.Fatalf("transaction client %s did not say %s within %v:\n%s", cl.tag, what, timeout, cl.out.tail(40))
		}
	}
}

// running reports whether the client's process is running.
func (cl *txnClient) running() bool {
	select {
	case <-cl.done:
		return false
	default:
		return true
	}
}

// kill kills the client with SIGKILL, if it runs, and waits for it.
func (cl *txnClient) kill() {
	if cl.running() {
		cl.cmd.Process.Signal(syscall.SIGKILL)
	}
	<-cl.done
}

// protocol answers every protocol line the client wrote.
func (cl *txnClient) protocol() []string {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return slices.Clone(cl.seen)
}

// errLines answers the client's ERROR lines.
func (cl *txnClient) errLines() []string {
	var out []string
	for _, l := range cl.protocol() {
		if strings.HasPrefix(l, "ERROR") {
			out = append(out, l)
		}
	}
	return out
}

// ---------------------------------------------------------------------------
// The cluster and the checks

// killClientColl is the tests' collection: a range collection whose
// shards begin at "", "b", "c" and "d", so that keys "a-…", "b-…", "c-…"
// and "d-…" are in four different shards.
const killClientColl = "kc"

// clientKeys answers the keys of the client tagged tag: one in each shard.
func clientKeys(tag string) []string {
	return []string{"a-" + tag, "b-" + tag, "c-" + tag, "d-" + tag}
}

func initValue(key string) string { return "init-" + key }

// startKillClientCluster starts a three-node cluster with the tests'
// collection and waits until the shards' leaders have spread (at least two
// nodes lead them) and every shard is led by its preferred replica, and
// has been for two seconds: a leader that changes drops its lock table, and
// with it the locks the tests check are held.
func startKillClientCluster(t *testing.T) *tcluster {
	t.Helper()
	if testing.Short() {
		t.Skip("starts three server processes and waits out a lock expiry")
	}
	c := newTCluster(t, 3)
	start := time.Now()
	c.startAll()
	a, err := c.do(context.Background(), "POST", c.url(1)+"/v1/collections",
		fmt.Sprintf(`{"name": %q, "partitioning": "range", "split_points": ["b", "c", "d"], "replicas": 3}`, killClientColl))
	if err != nil || a.code != 200 {
		t.Fatalf("creating %s: %v %s", killClientColl, err, a)
	}
	var stable string
	var since time.Time
	c.eventually(60*time.Second, "every shard of "+killClientColl+" is led by its preferred replica, steadily", func() error {
		var view string
		for _, id := range c.ids() {
			st, err := c.status(id)
			if err != nil {
				return err
			}
			ss := st.shards(killClientColl)
			if len(ss) != 4 {
				return fmt.Errorf("node %d lists %d shards of %s, want 4", id, len(ss), killClientColl)
			}
			var v []string
			leaders := map[int]bool{}
			for _, s := range ss {
				if s.Leader == 0 || len(s.Replicas) == 0 || s.Leader != s.Replicas[0] {
					return fmt.Errorf("node %d: shard %d has replicas %v and leader %d", id, s.Shard, s.Replicas, s.Leader)
				}
				v = append(v, fmt.Sprintf("shard %d: leader %d", s.Shard, s.Leader))
				leaders[s.Leader] = true
			}
			if len(leaders) < 2 {
				return fmt.Errorf("node %d: one node leads every shard (%s); the leaders spread", id, strings.Join(v, ", "))
			}
			if view != "" && strings.Join(v, ", ") != view {
				return fmt.Errorf("nodes disagree: %s; %s", view, strings.Join(v, ", "))
			}
			view = strings.Join(v, ", ")
		}
		if view != stable {
			stable, since = view, time.Now()
		}
		if time.Since(since) < 2*time.Second {
			return fmt.Errorf("leaders %s only for %v", view, time.Since(since))
		}
		return nil
	})
	t.Logf("cluster ready after %v; %s", time.Since(start).Round(time.Millisecond), stable)
	return c
}

// killClientHTTP is the test's client for requests that may wait for a
// dead client's locks.
var killClientHTTP = &http.Client{Timeout: 30 * time.Second}

func jsonKey(coll, key string) string {
	b, _ := json.Marshal(map[string]string{"collection": coll, "key": key})
	return string(b)
}

// probeLock answers nil when a transaction through url cannot read key
// for window: it waits (for the exclusive lock of an older transaction),
// or answers a conflict. The probe's attempt is aborted after.
func probeLock(url, coll, key string, window time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, err := doHTTP(ctx, killClientHTTP, "POST", url+"/v1/txn", `{}`)
	var begin struct {
		Txn string `json:"txn"`
	}
	if err != nil || a.code != 200 || json.Unmarshal([]byte(a.body), &begin) != nil || begin.Txn == "" {
		return fmt.Errorf("beginning the probe: %v %s", err, a)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		doHTTP(ctx, killClientHTTP, "POST", url+"/v1/txn/"+begin.Txn+"/abort", "")
	}()
	wctx, wcancel := context.WithTimeout(context.Background(), window)
	defer wcancel()
	start := time.Now()
	a, err = doHTTP(wctx, killClientHTTP, "POST", url+"/v1/txn/"+begin.Txn+"/get", jsonKey(coll, key))
	switch {
	case err != nil && errors.Is(err, context.DeadlineExceeded):
		return nil // it waited the window out
	case err == nil && a.code == 409:
		return nil
	case err == nil && a.code == 200:
		return fmt.Errorf("a transaction read %s after %v, while the client held its lock: %s", key, time.Since(start).Round(time.Millisecond), a)
	default:
		return fmt.Errorf("the probe of %s answered %v %s", key, err, a)
	}
}

// probeLocks checks, for every key of every client at once, that the
// client's lock on it keeps a transaction through url from reading it.
func probeLocks(t *testing.T, c *tcluster, url string, clients []*txnClient) {
	t.Helper()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []string
	for _, cl := range clients {
		for _, k := range cl.keys {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := probeLock(url, killClientColl, k, 2*time.Second); err != nil {
					mu.Lock()
					errs = append(errs, err.Error())
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	for _, cl := range clients {
		if !cl.running() {
			t.Errorf("transaction client %s exited (%v) before it was killed", cl.tag, cl.err)
		}
		for _, l := range cl.errLines() {
			t.Errorf("transaction client %s: %s", cl.tag, l)
		}
	}
	if len(errs) > 0 {
		st, _ := c.status(1)
		t.Fatalf("the live clients' locks are not all held:\n  %s\nshards as node 1 sees them: %+v", strings.Join(errs, "\n  "), st.shards(killClientColl))
	}
}

// batchGet reads keys with a plain batch get through url, retrying 503
// and transport errors until ctx ends; an absent key reads "".
func batchGet(ctx context.Context, url string, keys []string) (map[string]string, error) {
	type keyRef struct {
		Collection string `json:"collection"`
		Key        string `json:"key"`
	}
	var req struct {
		Keys []keyRef `json:"keys"`
	}
	for _, k := range keys {
		req.Keys = append(req.Keys, keyRef{killClientColl, k})
	}
	body, _ := json.Marshal(req)
	for {
		a, err := doHTTP(ctx, killClientHTTP, "POST", url+"/v1/batch/get", string(body))
		if err == nil && a.code == 200 {
			var res struct {
				Items []struct {
					Key   string `json:"key"`
					Found bool   `json:"found"`
					Value string `json:"value"`
				} `json:"items"`
			}
			if err := json.Unmarshal([]byte(a.body), &res); err != nil || len(res.Items) != len(keys) {
				return nil, fmt.Errorf("batch get through %s answered %s", url, a)
			}
			out := map[string]string{}
			for i, it := range res.Items {
				if it.Key != keys[i] {
					return nil, fmt.Errorf("batch get through %s answered key %q for %q", url, it.Key, keys[i])
				}
				if it.Found {
					out[it.Key] = it.Value
				}
			}
			return out, nil
		}
		if err == nil && a.code != 503 {
			return nil, fmt.Errorf("batch get through %s: %s", url, a)
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("batch get through %s: no answer before the deadline: %v %s", url, err, a)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// readTxn reads keys in a serializable session transaction through url,
// retrying an attempt that is aborted (with retry_of) or fails otherwise,
// until ctx ends; an absent key reads "". It answers how many attempts it
// took, and the gets that waited (for a lock) longer than half a second.
func readTxn(ctx context.Context, url string, keys []string) (map[string]string, int, []string, error) {
	var retryOf, last string
	var waits []string
	for attempt := 1; ; attempt++ {
		if ctx.Err() != nil {
			return nil, attempt - 1, waits, fmt.Errorf("no read transaction through %s committed before the deadline; the last failure: %s", url, last)
		}
		vals, id, err := readTxnAttempt(ctx, url, keys, retryOf, &waits)
		if err == nil {
			return vals, attempt, waits, nil
		}
		last = err.Error()
		if id != "" {
			retryOf = id
			actx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			doHTTP(actx, killClientHTTP, "POST", url+"/v1/txn/"+id+"/abort", "")
			cancel()
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func readTxnAttempt(ctx context.Context, url string, keys []string, retryOf string, waits *[]string) (map[string]string, string, error) {
	body := `{}`
	if retryOf != "" {
		body = fmt.Sprintf(`{"retry_of": %q}`, retryOf)
	}
	a, err := doHTTP(ctx, killClientHTTP, "POST", url+"/v1/txn", body)
	var begin struct {
		Txn string `json:"txn"`
	}
	if err != nil || a.code != 200 || json.Unmarshal([]byte(a.body), &begin) != nil || begin.Txn == "" {
		return nil, "", fmt.Errorf("begin: %v %s", err, a)
	}
	out := map[string]string{}
	for _, k := range keys {
		start := time.Now()
		a, err := doHTTP(ctx, killClientHTTP, "POST", url+"/v1/txn/"+begin.Txn+"/get", jsonKey(killClientColl, k))
		if took := time.Since(start); took > 500*time.Millisecond {
			*waits = append(*waits, fmt.Sprintf("%s %v", k, took.Round(time.Millisecond)))
		}
		var got struct {
			Found bool   `json:"found"`
			Value string `json:"value"`
		}
		if err != nil || a.code != 200 || json.Unmarshal([]byte(a.body), &got) != nil {
			return nil, begin.Txn, fmt.Errorf("get %s: %v %s", k, err, a)
		}
		if got.Found {
			out[k] = got.Value
		}
	}
	a, err = doHTTP(ctx, killClientHTTP, "POST", url+"/v1/txn/"+begin.Txn+"/commit", "")
	if err != nil || a.code != 200 {
		return nil, begin.Txn, fmt.Errorf("commit: %v %s", err, a)
	}
	return out, "", nil
}

// outcome says whether the keys of the client tagged tag read all of its
// writes ("all") or none of them ("none"), and fails otherwise: with a
// mix, or a value that is neither the client's nor the initial one.
func outcome(tag string, vals map[string]string) (string, error) {
	mine, initial := 0, 0
	var desc []string
	for _, k := range clientKeys(tag) {
		v, ok := vals[k]
		switch {
		case ok && v == tag+"-"+k:
			mine++
		case ok && v == initValue(k):
			initial++
		}
		if ok {
			desc = append(desc, fmt.Sprintf("%s=%q", k, v))
		} else {
			desc = append(desc, k+" absent")
		}
	}
	switch {
	case mine == len(clientKeys(tag)):
		return "all", nil
	case initial == len(clientKeys(tag)):
		return "none", nil
	default:
		return "", fmt.Errorf("client %s's keys read %d of its writes and %d initial values: %s", tag, mine, initial, strings.Join(desc, ", "))
	}
}

// checkAfterKill checks, once the clients were killed, that transactions
// through nodes other than gateway go through and that every client's
// writes are visible whole or not at all, alike on every node and in
// plain and transactional reads; then it overwrites every key in a
// transaction through the Go client, and checks every node reads that.
// want maps a client's tag to the outcome it must have ("" when either
// will do). It answers each client's outcome.
func checkAfterKill(t *testing.T, c *tcluster, gateway int, killed time.Time, clients []*txnClient, want map[string]string) map[string]string {
	t.Helper()
	var others []int
	for _, id := range c.ids() {
		if id != gateway {
			others = append(others, id)
		}
	}
	var keys []string
	for _, cl := range clients {
		keys = append(keys, cl.keys...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	outcomes := func(what string, vals map[string]string) map[string]string {
		t.Helper()
		out := map[string]string{}
		for _, cl := range clients {
			o, err := outcome(cl.tag, vals)
			if err != nil {
				t.Fatalf("%s: not all-or-nothing: %v", what, err)
			}
			if w := want[cl.tag]; w != "" && o != w {
				t.Fatalf("%s: client %s's writes read %q, want %q", what, cl.tag, o, w)
			}
			out[cl.tag] = o
		}
		return out
	}

	// A plain batch get (which waits for intents the dead clients may
	// have prepared to be decided). A client whose commit was cut off may
	// still commit after it (its commit point was in flight), never the
	// other way round.
	start := time.Now()
	vals, err := batchGet(ctx, c.url(others[0]), keys)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("a batch get through node %d answered in %v", others[0], time.Since(start).Round(time.Millisecond))
	first := outcomes(fmt.Sprintf("a batch get through node %d %v after the kill", others[0], time.Since(killed).Round(time.Millisecond)), vals)

	// A transaction reading every key, under locks: it waits for the dead
	// clients' locks to expire.
	vals, attempts, waits, err := readTxn(ctx, c.url(others[1]), keys)
	if err != nil {
		t.Fatalf("%v (%v after the kill; gets that waited: %v)", err, time.Since(killed).Round(time.Millisecond), waits)
	}
	t.Logf("a transaction through node %d read every key %v after the kill, in %d attempt(s); gets that waited: %v", others[1], time.Since(killed).Round(time.Millisecond), attempts, waits)
	final := outcomes(fmt.Sprintf("a transaction through node %d", others[1]), vals)
	for tag, o := range first {
		if o == "all" && final[tag] != "all" {
			t.Fatalf("client %s's writes were read whole by a batch get, then not by a transaction after it", tag)
		}
	}
	// Decided now: every node, the gateway too, reads the same.
	for _, id := range c.ids() {
		vals, err := batchGet(ctx, c.url(id), keys)
		if err != nil {
			t.Fatal(err)
		}
		got := outcomes(fmt.Sprintf("a batch get through node %d after the transaction", id), vals)
		if !maps.Equal(got, final) {
			t.Fatalf("a batch get through node %d reads the clients' outcomes %v after a transaction read %v", id, got, final)
		}
	}

	// A transaction of the Go client overwrites every key.
	db, err := groupkv.Dial(c.node(others[0]).addr, groupkv.WithoutShardRouting())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	start = time.Now()
	err = db.Transact(ctx, func(tx *groupkv.Tx) error {
		seen := map[string]string{}
		for _, k := range keys {
			r, err := tx.Get(ctx, groupkv.GetRequest{Collection: killClientColl, Key: []byte(k)})
			if err != nil {
				return err
			}
			seen[k] = string(r.Value)
		}
		for _, cl := range clients {
			if o, err := outcome(cl.tag, seen); err != nil || o != final[cl.tag] {
				return fmt.Errorf("the Go client's transaction reads client %s's writes as %q (%v), want %q", cl.tag, o, err, final[cl.tag])
			}
		}
		for _, k := range keys {
			if err := tx.Put(ctx, groupkv.PutRequest{Collection: killClientColl, Key: []byte(k), Value: []byte("after-" + k)}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("a transaction overwriting every key through node %d: %v (%v after the kill)", others[0], err, time.Since(killed).Round(time.Millisecond))
	}
	t.Logf("the Go client's transaction through node %d overwrote every key in %v", others[0], time.Since(start).Round(time.Millisecond))
	if bad := overwritten(ctx, t, c, keys); len(bad) > 0 {
		t.Fatalf("after the overwrite: %s", strings.Join(bad, "; "))
	}
	return final
}

// overwritten reads keys through every node with a batch get and
// describes each key not read as the overwrite "after-"+key left it.
func overwritten(ctx context.Context, t *testing.T, c *tcluster, keys []string) []string {
	t.Helper()
	var bad []string
	for _, id := range c.ids() {
		vals, err := batchGet(ctx, c.url(id), keys)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if vals[k] != "after-"+k {
				bad = append(bad, fmt.Sprintf("node %d reads %s as %q, want %q", id, k, vals[k], "after-"+k))
			}
		}
	}
	return bad
}

// killClientIdle is the servers' TxnIdleTimeout (they have no flag for
// it: the default): how long a gateway keeps a silent attempt, and
// remembers how an attempt ended.
const killClientIdle = 30 * time.Second

// commitDeadAttempts sends, once checkAfterKill overwrote every key, the
// commit of each dead client's attempt through its gateway, as if the
// client had come back and sent its commit again. Each answers how the
// attempt ended, as checkAfterKill found it (outcomes): 200 with the
// version its commit answered (when the client saw it) if its writes are
// visible whole, 409 txn_aborted if they are not — or 503 commit_unknown
// once the gateway may have forgotten the attempt: after remembered, by
// which it surely still knew it (an attempt's outcome is remembered for
// killClientIdle after it ended, a silent attempt is kept killClientIdle
// after its last request). Never 409 for an attempt that committed, nor
// 200 for one that did not; and every key must still read what the
// overwrite wrote. It answers each commit's answer.
func commitDeadAttempts(t *testing.T, c *tcluster, gateway int, clients []*txnClient, outcomes map[string]string, remembered map[string]time.Time) []kvAnswer {
	t.Helper()
	var out []kvAnswer
	var keys []string
	for _, cl := range clients {
		keys = append(keys, cl.keys...)
		id, version := "", uint64(0)
		for _, l := range cl.protocol() {
			if rest, ok := strings.CutPrefix(l, "TXN "); ok {
				id = rest
			}
			if rest, ok := strings.CutPrefix(l, "COMMIT 200 "); ok {
				var commit struct {
					Version uint64 `json:"version"`
				}
				if err := json.Unmarshal([]byte(rest), &commit); err != nil || commit.Version == 0 {
					t.Fatalf("client %s's commit answered %q", cl.tag, l)
				}
				version = commit.Version
			}
		}
		if id == "" {
			t.Fatalf("transaction client %s named no attempt: %q", cl.tag, cl.protocol())
		}
		a, err := c.do(context.Background(), "POST", c.url(gateway)+"/v1/txn/"+id+"/commit", "")
		if err != nil {
			t.Fatalf("a commit of client %s's attempt %s, sent again through node %d: %v", cl.tag, id, gateway, err)
		}
		// known: the gateway surely still knew the attempt when it
		// answered (now at the latest), with a margin for the clocks of
		// the test and the server.
		known := time.Now().Before(remembered[cl.tag].Add(-2 * time.Second))
		forgotten := !known && a.code == 503 && a.errCode == "commit_unknown"
		what := fmt.Sprintf("a commit of client %s's attempt %s (its writes visible: %s), sent again through node %d after others overwrote its keys", cl.tag, id, outcomes[cl.tag], gateway)
		switch outcomes[cl.tag] {
		case "all":
			var commit struct {
				Committed bool   `json:"committed"`
				Version   uint64 `json:"version"`
			}
			ok := a.code == 200 && json.Unmarshal([]byte(a.body), &commit) == nil && commit.Committed && (version == 0 || commit.Version == version)
			if !ok && !forgotten {
				t.Errorf("%s, answered %s; want 200 with version %d (its first commit's, 0: not seen)", what, a, version)
			}
		case "none":
			if !(a.code == 409 && a.errCode == "txn_aborted") && !forgotten {
				t.Errorf("%s, answered %s; want 409 txn_aborted", what, a)
			}
		default:
			t.Fatalf("client %s has no outcome: %v", cl.tag, outcomes)
		}
		if forgotten {
			t.Logf("%s answered %s: the gateway no longer remembers it", what, a)
		}
		out = append(out, a)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, b := range overwritten(ctx, t, c, keys) {
		t.Errorf("after the dead clients' commits were sent again, %s", b)
	}
	return out
}

// putInitial writes every key of the clients' its initial value.
func putInitial(c *tcluster, tags ...string) {
	for _, tag := range tags {
		for _, k := range clientKeys(tag) {
			c.put(1, killClientColl, k, initValue(k))
		}
	}
}

// ---------------------------------------------------------------------------
// The tests

// TestEndToEndTxnClientKillHolding: a client process holding locks on four
// shards (led by several nodes) is killed with SIGKILL. Its locks were
// held while it lived (a transaction through another node could not read
// its keys); after the kill, transactions through the other nodes go
// through within a minute, nothing of it is visible, and its attempt can
// no longer commit through its gateway.
func TestEndToEndTxnClientKillHolding(t *testing.T) {
	c := startKillClientCluster(t)
	const gateway = 2
	putInitial(c, "h")
	cl := startTxnClient(t, c.url(gateway), killClientColl, "h", clientKeys("h"))
	cl.waitFor(t, "LOCKED", 30*time.Second)
	probeLocks(t, c, c.url(3), []*txnClient{cl})
	cl.kill()
	killed := time.Now()
	t.Logf("client killed (%v); it said %q", cl.err, cl.protocol())
	final := checkAfterKill(t, c, gateway, killed, []*txnClient{cl}, map[string]string{"h": "none"})

	// The dead client's attempt cannot commit now: its locks went to
	// others. Its gateway keeps it for killClientIdle after its last
	// request (a keep-alive, less than a second before the kill), then
	// remembers it aborted for as long.
	commitDeadAttempts(t, c, gateway, []*txnClient{cl}, final, map[string]time.Time{"h": killed.Add(-time.Second + 2*killClientIdle)})
	t.Logf("done %v after the kill", time.Since(killed).Round(time.Millisecond))
}

// TestEndToEndTxnClientKillCommitting: eleven client processes hold locks
// on four shards each. The first commits and is killed once its commit
// answered, which measures how long a commit takes, L; each of the others
// sends its commit and is killed with SIGKILL from 0 to 2 L later: before
// the node has its commit, while the commit is in flight, or after it.
// Their locks were held before; after the kill, transactions through the
// other nodes go through within a minute, and each client's writes are
// visible whole (every key, on every node, in plain and transactional
// reads) or not at all — whole where its commit was answered 200.
func TestEndToEndTxnClientKillCommitting(t *testing.T) {
	c := startKillClientCluster(t)
	const gateway = 3
	fractions := []float64{0, 0.2, 0.4, 0.6, 0.7, 0.8, 0.9, 1, 1.2, 2}
	tags := []string{"cal"}
	for i := range fractions {
		tags = append(tags, fmt.Sprintf("k%d", i))
	}
	putInitial(c, tags...)
	var clients []*txnClient
	for _, tag := range tags {
		cl := startTxnClient(t, c.url(gateway), killClientColl, tag, clientKeys(tag))
		cl.waitFor(t, "LOCKED", 30*time.Second)
		clients = append(clients, cl)
	}
	probeLocks(t, c, c.url(1), clients)

	// remembered: until when the gateway surely knows how each attempt
	// ended (commitDeadAttempts). An attempt whose commit reached the
	// gateway ended after the test told its client to commit; one whose
	// commit did not is kept killClientIdle after its last keep-alive,
	// less than a second before that.
	remembered := map[string]time.Time{}
	commit := func(cl *txnClient) time.Time {
		t.Helper()
		before := time.Now()
		if _, err := io.WriteString(cl.in, "commit\n"); err != nil {
			t.Fatalf("telling client %s to commit: %v", cl.tag, err)
		}
		cl.waitFor(t, "COMMITTING", 30*time.Second)
		remembered[cl.tag] = before.Add(-time.Second + killClientIdle)
		return time.Now()
	}
	start := commit(clients[0])
	answer := clients[0].waitFor(t, "COMMIT ", 30*time.Second)
	took := time.Since(start)
	if !strings.HasPrefix(answer, "COMMIT 200 ") {
		t.Fatalf("client %s's commit, with nothing in its way, answered %s", clients[0].tag, answer)
	}
	clients[0].kill()
	t.Logf("client %s's commit was answered %v after it said COMMITTING", clients[0].tag, took.Round(10*time.Microsecond))
	delays := []time.Duration{0}
	var killed time.Time
	for i, cl := range clients[1:] {
		delay := time.Duration(fractions[i] * float64(took))
		delays = append(delays, delay)
		time.Sleep(delay - time.Since(commit(cl)))
		cl.kill()
		killed = time.Now()
	}
	want := map[string]string{}
	answers := map[string]string{}
	for _, cl := range clients {
		answers[cl.tag] = "none"
		for _, l := range cl.protocol() {
			if strings.HasPrefix(l, "COMMIT ") {
				answers[cl.tag] = l
				switch {
				case strings.HasPrefix(l, "COMMIT 200 "):
					want[cl.tag] = "all"
				case strings.HasPrefix(l, "COMMIT 409 "):
					want[cl.tag] = "none"
				}
			}
		}
	}
	got := checkAfterKill(t, c, gateway, killed, clients, want)
	again := commitDeadAttempts(t, c, gateway, clients, got, remembered)
	count := map[string]int{}
	for i, cl := range clients {
		when := fmt.Sprintf("killed %v after COMMITTING", delays[i].Round(10*time.Microsecond))
		if i == 0 {
			when = "killed after its commit answered"
		}
		t.Logf("client %s, %s: commit answer %q; its writes: %s; its commit sent again: %s", cl.tag, when, answers[cl.tag], got[cl.tag], again[i])
		count[got[cl.tag]]++
	}
	t.Logf("%d clients' writes are visible whole, %d not at all; done %v after the last kill", count["all"], count["none"], time.Since(killed).Round(time.Millisecond))
}
