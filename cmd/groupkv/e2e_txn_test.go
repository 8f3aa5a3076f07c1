package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/groupkv/groupkv"
)

// TestEndToEndTxnForms drives the transaction forms of the HTTP API, exactly
// as written, and `groupkv txn`, against a real three-node cluster.
func TestEndToEndTxnForms(t *testing.T) {
	c := newTCluster(t, 3)
	c.startAll()
	c.createCollection(1, "c", 3)
	c.leaderOf("c")
	ctx := context.Background()
	must := func(a kvAnswer, err error) kvAnswer {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	if a := must(c.do(ctx, "PUT", c.url(1)+"/v1/kv/c/x", "9")); a.code != 200 {
		t.Fatalf("PUT x: %s", a)
	}
	// A session through node 2.
	a := must(c.do(ctx, "POST", c.url(2)+"/v1/txn", `{"isolation": "serializable"}`))
	var begin struct {
		Txn string `json:"txn"`
	}
	if a.code != 200 || json.Unmarshal([]byte(a.body), &begin) != nil || begin.Txn == "" {
		t.Fatalf("POST /v1/txn: %s", a)
	}
	base := c.url(2) + "/v1/txn/" + begin.Txn
	if a := must(c.do(ctx, "POST", base+"/get", `{"collection": "c", "key": "a"}`)); a.code != 200 || strings.TrimSpace(a.body) != `{"found":false}` {
		t.Fatalf("get of an absent key: %s", a)
	}
	if a := must(c.do(ctx, "POST", base+"/put", `{"collection": "c", "key": "a", "value": "1", "tags": ["t"]}`)); a.code != 200 {
		t.Fatalf("put: %s", a)
	}
	if a := must(c.do(ctx, "POST", base+"/put", `{"collection": "c", "key": "b", "value_base64": "/w=="}`)); a.code != 200 {
		t.Fatalf("put base64: %s", a)
	}
	var got struct {
		Found   bool   `json:"found"`
		Value   string `json:"value"`
		Version uint64 `json:"version"`
	}
	a = must(c.do(ctx, "POST", base+"/get", `{"collection": "c", "key": "a"}`))
	if a.code != 200 || json.Unmarshal([]byte(a.body), &got) != nil || !got.Found || got.Value != "1" {
		t.Fatalf("a transaction does not read its own write: %s", a)
	}
	// A batch get: its own write, an absent key and a stored one, in order.
	a = must(c.do(ctx, "POST", base+"/batch_get", `{"keys": [{"collection": "c", "key": "a"}, {"collection": "c", "key": "z"}, {"collection": "c", "key": "x"}], "for_update": true}`))
	var batch struct {
		Items []struct {
			Collection string `json:"collection"`
			Key        string `json:"key"`
			Found      bool   `json:"found"`
			Value      string `json:"value"`
			Version    uint64 `json:"version"`
		} `json:"items"`
	}
	if a.code != 200 || json.Unmarshal([]byte(a.body), &batch) != nil || len(batch.Items) != 3 ||
		batch.Items[0].Key != "a" || !batch.Items[0].Found || batch.Items[0].Value != "1" || batch.Items[0].Version != 0 ||
		batch.Items[1].Key != "z" || batch.Items[1].Found ||
		batch.Items[2].Key != "x" || !batch.Items[2].Found || batch.Items[2].Value != "9" || batch.Items[2].Version == 0 ||
		batch.Items[2].Collection != "c" {
		t.Fatalf("batch get: %s", a)
	}
	if a := must(c.do(ctx, "POST", base+"/batch_get", `{"keys": [{"collection": "c", "key": "a"}, {"collection": "c", "key": ""}]}`)); a.code != 400 || a.errCode != "invalid_argument" || !strings.Contains(a.body, "keys[1]") {
		t.Fatalf("batch get of an empty key: %s", a)
	}
	a = must(c.do(ctx, "POST", base+"/commit", ``))
	var commit struct {
		Committed bool   `json:"committed"`
		Version   uint64 `json:"version"`
	}
	if a.code != 200 || json.Unmarshal([]byte(a.body), &commit) != nil || !commit.Committed || commit.Version == 0 {
		t.Fatalf("commit: %s", a)
	}
	// Every node reads the commit, at its version.
	for id := 1; id <= 3; id++ {
		a := must(c.do(ctx, "GET", c.url(id)+"/v1/kv/c/a", ""))
		if v, err := getVersion(a); a.code != 200 || err != nil || v != commit.Version {
			t.Fatalf("node %d reads a as %s (%v), want version %d", id, a, err, commit.Version)
		}
	}
	// The commit sent again (its answer lost) answers the same, and
	// applies nothing again; an abort does not undo it. Another node,
	// which does not know the attempt, cannot tell: 503 commit_unknown,
	// as for an id nobody began.
	first := a
	for range 2 {
		if a := must(c.do(ctx, "POST", base+"/commit", ``)); a.code != 200 || a.body != first.body {
			t.Fatalf("commit sent again: %s, want %s", a, first)
		}
	}
	if a := must(c.do(ctx, "POST", base+"/abort", ``)); a.code != 200 {
		t.Fatalf("abort of a committed transaction: %s", a)
	}
	if a := must(c.do(ctx, "POST", base+"/commit", ``)); a.code != 200 || a.body != first.body {
		t.Fatalf("commit sent again after an abort: %s, want %s", a, first)
	}
	if a := must(c.do(ctx, "GET", c.url(2)+"/v1/kv/c/a", "")); a.code != 200 {
		t.Fatalf("a after the commits sent again: %s", a)
	} else if v, err := getVersion(a); err != nil || v != commit.Version {
		t.Fatalf("a after the commits sent again: %s (%v), want version %d", a, err, commit.Version)
	}
	for _, url := range []string{c.url(1) + "/v1/txn/" + begin.Txn, c.url(2) + "/v1/txn/00000000000000010000000100000000000000aa"} {
		if a := must(c.do(ctx, "POST", url+"/commit", ``)); a.code != 503 || a.errCode != "commit_unknown" {
			t.Fatalf("commit of an attempt the node does not know (%s): %s, want 503 commit_unknown", url, a)
		}
	}
	// Abort is idempotent; an aborted session answers 409 txn_aborted.
	a = must(c.do(ctx, "POST", c.url(3)+"/v1/txn", `{}`))
	json.Unmarshal([]byte(a.body), &begin)
	base = c.url(3) + "/v1/txn/" + begin.Txn
	for range 2 {
		if a := must(c.do(ctx, "POST", base+"/abort", ``)); a.code != 200 {
			t.Fatalf("abort: %s", a)
		}
	}
	if a := must(c.do(ctx, "POST", base+"/put", `{"collection": "c", "key": "a", "value": "x"}`)); a.code != 409 || a.errCode != "txn_aborted" {
		t.Fatalf("put in an aborted transaction: %s", a)
	}
	for range 2 {
		if a := must(c.do(ctx, "POST", base+"/commit", ``)); a.code != 409 || a.errCode != "txn_aborted" {
			t.Fatalf("commit of an aborted transaction: %s", a)
		}
	}
	// retry_of keeps the priority: a new attempt begins.
	if a := must(c.do(ctx, "POST", c.url(3)+"/v1/txn", fmt.Sprintf(`{"retry_of": %q}`, begin.Txn))); a.code != 200 {
		t.Fatalf("retry_of: %s", a)
	} else {
		var retry struct {
			Txn string `json:"txn"`
		}
		json.Unmarshal([]byte(a.body), &retry)
		c.do(ctx, "POST", c.url(3)+"/v1/txn/"+retry.Txn+"/abort", ``)
	}

	// The one-shot form, as the API documents it.
	c.put(1, "c", "d", "x")
	c.put(1, "c", "e", "E")
	va := commit.Version
	body := fmt.Sprintf(`{"if": [{"collection": "c", "key": "a", "version": %d}, {"collection": "c", "key": "z", "version": 0}, {"collection": "c", "key": "d", "value": "x"}],
	  "then": [{"op": "put", "collection": "c", "key": "a", "value": "2", "tags": ["t"]}, {"op": "delete", "collection": "c", "key": "d"}, {"op": "get", "collection": "c", "key": "e"}],
	  "else": [{"op": "get", "collection": "c", "key": "a"}]}`, va)
	a = must(c.do(ctx, "POST", c.url(1)+"/v1/txn/exec", body))
	var exec struct {
		Succeeded bool   `json:"succeeded"`
		Version   uint64 `json:"version"`
		Results   []struct {
			Found   bool   `json:"found"`
			Value   string `json:"value"`
			Version uint64 `json:"version"`
		} `json:"results"`
	}
	if a.code != 200 || json.Unmarshal([]byte(a.body), &exec) != nil || !exec.Succeeded || len(exec.Results) != 3 ||
		exec.Results[0].Version != exec.Version || exec.Results[1].Version != exec.Version || !exec.Results[2].Found || exec.Results[2].Value != "E" {
		t.Fatalf("exec: %s", a)
	}
	// The same compare fails now, through the CLI: the else branch runs.
	out, err := exec_command(t, c.node(3).addr, body)
	if err != nil {
		t.Fatalf("groupkv txn: %v\n%s", err, out)
	}
	if !strings.Contains(out, `"succeeded": false`) || !strings.Contains(out, `"value": "2"`) {
		t.Fatalf("groupkv txn answered:\n%s", out)
	}
	if a := must(c.do(ctx, "GET", c.url(2)+"/v1/kv/c/d", "")); a.code != 404 {
		t.Fatalf("d after the exec: %s", a)
	}
}

func exec_command(t *testing.T, addr, body string) (string, error) {
	t.Helper()
	cmd := exec.Command(binary, "txn", "--addr", addr)
	cmd.Stdin = strings.NewReader(body)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestEndToEndTxnBankWithKill: concurrent transfers through the Go client
// on every node of a three-node cluster, with read-only-by-locks audits
// and a watch of the accounts; one node is killed with SIGKILL and
// restarted during the run, then two leaders are paused (SIGSTOP) in turn
// and resumed. Every audit and the end see the same total, and so does
// the watch after each version it delivers.
func TestEndToEndTxnBankWithKill(t *testing.T) { testEndToEndTxnBank(t, 3) }

// TestEndToEndTxnBankFourNodes is TestEndToEndTxnBankWithKill on four
// nodes, more than a shard's three replicas: some node holds no replica of
// some shard of the accounts, and its transactions, audits and watch (the
// watch runs through it) reach that shard through the other nodes, which
// are killed and restarted in turn, and two paused, meanwhile.
func TestEndToEndTxnBankFourNodes(t *testing.T) { testEndToEndTxnBank(t, 4) }

func testEndToEndTxnBank(t *testing.T, nodes int) {
	c := newTCluster(t, nodes)
	c.startAll()
	const coll, accounts, initial = "bank", 10, 100
	c.createCollection(1, coll, 4)
	c.leaderOf(coll)
	for i := range accounts {
		c.put(1, coll, fmt.Sprintf("acct%02d", i), strconv.Itoa(initial))
	}
	// The watch runs through a node without a replica of some shard of
	// the accounts when there is one (there must be on four nodes), and
	// the node killed is another.
	st, err := c.status(1)
	if err != nil {
		t.Fatal(err)
	}
	lacks := func(id int) bool {
		return slices.ContainsFunc(st.shards(coll), func(s tshard) bool { return !slices.Contains(s.Replicas, id) })
	}
	watcher := 1
	for id := range nodes {
		if lacks(id + 1) {
			watcher = id + 1
		}
	}
	// On three nodes node 3 is killed; on more, every node but the
	// watch's in turn, so that the node serving it is killed too.
	victims := []int{3}
	if nodes > 3 {
		if !lacks(watcher) {
			t.Fatalf("no node of %d lacks a replica of a shard of %q: %+v", nodes, coll, st.shards(coll))
		}
		victims = slices.DeleteFunc(c.ids(), func(id int) bool { return id == watcher })
	}
	t.Logf("watching through node %d; killing nodes %v in turn", watcher, victims)
	dbs := make([]groupkv.DB, nodes)
	for i := range dbs {
		db, err := groupkv.Dial(c.node(i+1).addr, groupkv.WithoutShardRouting())
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		dbs[i] = db
	}
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	var down atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	var transfers, audits, gaveUp atomic.Int64
	errs := make(chan error, 16)
	pick := func(rng *rand.Rand) groupkv.DB {
		for {
			i := rng.IntN(nodes)
			if int64(i+1) != down.Load() {
				return dbs[i]
			}
		}
	}
	key := func(i int) []byte { return []byte(fmt.Sprintf("acct%02d", i)) }
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(seed), uint64(w)))
			for !stop.Load() {
				db := pick(rng)
				from, to := rng.IntN(accounts), rng.IntN(accounts)
				if from == to {
					continue
				}
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				err := db.Transact(ctx, func(tx *groupkv.Tx) error {
					var x, y int
					if w%2 == 1 {
						// Odd workers read both accounts in one batch get.
						items, err := tx.BatchGetForUpdate(ctx, []groupkv.KeyRef{{Collection: coll, Key: key(from)}, {Collection: coll, Key: key(to)}})
						if err != nil {
							return err
						}
						x, _ = strconv.Atoi(string(items[0].Value))
						y, _ = strconv.Atoi(string(items[1].Value))
					} else {
						a, err := tx.Get(ctx, groupkv.GetRequest{Collection: coll, Key: key(from)})
						if err != nil {
							return err
						}
						b, err := tx.Get(ctx, groupkv.GetRequest{Collection: coll, Key: key(to)})
						if err != nil {
							return err
						}
						x, _ = strconv.Atoi(string(a.Value))
						y, _ = strconv.Atoi(string(b.Value))
					}
					if err := tx.Put(ctx, groupkv.PutRequest{Collection: coll, Key: key(from), Value: []byte(strconv.Itoa(x - 1))}); err != nil {
						return err
					}
					return tx.Put(ctx, groupkv.PutRequest{Collection: coll, Key: key(to), Value: []byte(strconv.Itoa(y + 1))})
				})
				cancel()
				var unknown *groupkv.CommitUnknownError
				var ctxErr *groupkv.TxnContextError
				switch {
				case err == nil:
					transfers.Add(1)
				case errors.As(err, &unknown):
					// The outcome is unknown: it committed whole or not at
					// all; the total is the same either way.
					gaveUp.Add(1)
				case errors.As(err, &ctxErr), groupkv.CodeOf(err) == groupkv.CodeUnavailable:
					// The node went away mid-transaction: the attempt
					// never committed (its locks expire).
					gaveUp.Add(1)
				default:
					errs <- fmt.Errorf("transfer: %w", err)
					return
				}
			}
		}()
	}
	for a := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(seed), uint64(100+a)))
			for !stop.Load() {
				db := pick(rng)
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				sum := 0
				err := db.Transact(ctx, func(tx *groupkv.Tx) error {
					sum = 0
					if a == 1 {
						// The second auditor reads every account in one batch get.
						refs := make([]groupkv.KeyRef, accounts)
						for i := range refs {
							refs[i] = groupkv.KeyRef{Collection: coll, Key: key(i)}
						}
						items, err := tx.BatchGet(ctx, refs)
						if err != nil {
							return err
						}
						for _, it := range items {
							v, _ := strconv.Atoi(string(it.Value))
							sum += v
						}
						return nil
					}
					for i := range accounts {
						r, err := tx.Get(ctx, groupkv.GetRequest{Collection: coll, Key: key(i)})
						if err != nil {
							return err
						}
						v, _ := strconv.Atoi(string(r.Value))
						sum += v
					}
					return nil
				})
				cancel()
				if err != nil {
					gaveUp.Add(1)
					continue
				}
				if sum != accounts*initial {
					errs <- fmt.Errorf("an audit saw a total of %d, want %d", sum, accounts*initial)
					return
				}
				audits.Add(1)
			}
		}()
	}
	w := startBankWatch(t, dbs[watcher-1], coll, accounts, accounts*initial)
	for _, victim := range victims {
		time.Sleep(3 * time.Second)
		down.Store(int64(victim))
		c.kill(victim)
		time.Sleep(3 * time.Second)
		c.start(victim, false)
		c.waitHealthy(victim)
		down.Store(0)
	}
	time.Sleep(3 * time.Second)
	// Then the leader of a shard of the accounts, and after it the
	// meta shard's (the timestamp oracle), are paused for 3 s, long
	// enough for a new leader, and resumed; the clients go on using
	// them: their locks and timestamps must not outlive their
	// leadership.
	for _, target := range []string{coll, ""} {
		leader := c.leaderOf(target)
		c.signal(leader, syscall.SIGSTOP)
		time.Sleep(3 * time.Second)
		c.signal(leader, syscall.SIGCONT)
		t.Logf("paused node %d (leader of %q) for 3s", leader, target)
		time.Sleep(3 * time.Second)
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// The end: plain reads through every node agree on the total (the
	// locks of attempts cut off by the kill expire first).
	for id := 1; id <= nodes; id++ {
		c.eventually(60*time.Second, "the final total", func() error {
			sum := 0
			for i := range accounts {
				a, err := c.do(context.Background(), "GET", c.url(id)+"/v1/kv/"+coll+"/"+string(key(i)), "")
				if err != nil || a.code != 200 {
					return fmt.Errorf("node %d: account %d: %v %s", id, i, err, a)
				}
				v, err := strconv.Atoi(a.body) // a plain GET answers the raw value
				if err != nil {
					return fmt.Errorf("node %d: account %d holds %q", id, i, a.body)
				}
				sum += v
			}
			if sum != accounts*initial {
				return fmt.Errorf("node %d: total %d, want %d", id, sum, accounts*initial)
			}
			return nil
		})
	}
	if transfers.Load() == 0 || audits.Load() == 0 {
		t.Fatalf("%d transfers and %d audits committed", transfers.Load(), audits.Load())
	}
	t.Logf("%d transfers, %d audits committed; %d attempts cut off by the kill", transfers.Load(), audits.Load(), gaveUp.Load())
	// The watch ends where the reads do: every account's last value.
	final := map[string]string{}
	for i := range accounts {
		a, err := c.do(context.Background(), "GET", c.url(1)+"/v1/kv/"+coll+"/"+string(key(i)), "")
		if err != nil || a.code != 200 {
			t.Fatalf("account %d: %v %s", i, err, a)
		}
		final[string(key(i))] = a.body
	}
	w.waitFor(t, final)
}

// bankWatch follows the accounts of a bank test through one node's Watch
// and checks, after each version it delivers, that the accounts it has
// seen hold the total.
type bankWatch struct {
	mu       sync.Mutex
	values   map[string]string
	versions int   // versions delivered with every account seen
	err      error // the first failed check, or how the watch ended
	cancel   context.CancelFunc
	done     chan struct{}
}

func startBankWatch(t *testing.T, db groupkv.DB, coll string, accounts, total int) *bankWatch {
	ctx, cancel := context.WithCancel(context.Background())
	w := &bankWatch{values: map[string]string{}, cancel: cancel, done: make(chan struct{})}
	t.Cleanup(func() {
		cancel()
		<-w.done
	})
	var at uint64 // the version of the changes being gathered
	check := func() error {
		if len(w.values) < accounts {
			return nil
		}
		sum := 0
		for _, v := range w.values {
			n, err := strconv.Atoi(v)
			if err != nil {
				return fmt.Errorf("an account holds %q", v)
			}
			sum += n
		}
		if sum != total {
			return fmt.Errorf("after version %d the watch's accounts hold %d in all, want %d", at, sum, total)
		}
		w.versions++
		return nil
	}
	go func() {
		defer close(w.done)
		err := db.Watch(ctx, groupkv.WatchRequest{Collection: coll}, func(ev groupkv.Event) error {
			w.mu.Lock()
			defer w.mu.Unlock()
			if ev.Version > at && at > 0 || ev.Type == groupkv.EventProgress && ev.Version >= at {
				// Every change of version at is in.
				if err := check(); err != nil {
					return err
				}
			}
			if ev.Type == groupkv.EventProgress {
				return nil
			}
			if ev.Version < at {
				return fmt.Errorf("change %s@%d after one at %d", ev.Key, ev.Version, at)
			}
			at = ev.Version
			if ev.Type != groupkv.EventPut {
				return fmt.Errorf("a %s of %s@%d; accounts are only written", ev.Type, ev.Key, ev.Version)
			}
			w.values[string(ev.Key)] = string(ev.Value)
			return nil
		})
		if ctx.Err() == nil {
			w.mu.Lock()
			w.err = fmt.Errorf("the watch ended: %v", err)
			w.mu.Unlock()
		}
	}()
	return w
}

// waitFor waits until the watch holds final, failing the test if it
// ended or failed a check first.
func (w *bankWatch) waitFor(t *testing.T, final map[string]string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		w.mu.Lock()
		err, got, versions := w.err, maps.Clone(w.values), w.versions
		w.mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		if maps.Equal(got, final) {
			t.Logf("the watch held the total after each of %d versions and ends at the accounts' last values", versions)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the watch holds %v, not the accounts' last values %v, 60 s after the run", got, final)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
