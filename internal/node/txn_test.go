package node

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/txn"
)

// openRangeTxn opens a node in a temporary directory, closed when the
// test ends, with one range collection "c" of one shard.
func openRangeTxn(t *testing.T) (*Node, context.Context) {
	t.Helper()
	n := openTest(t, t.TempDir(), Options{Logger: quietLogger(), TickInterval: 20 * time.Millisecond})
	t.Cleanup(func() { n.Close() })
	ctx := context.Background()
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "c", Partitioning: kv.PartitionRange}); err != nil {
		t.Fatal(err)
	}
	return n, ctx
}

// beginOlderYounger begins two serializable attempts on n, the first older
// (of higher priority) than the second.
func beginOlderYounger(t *testing.T, n *Node) (older, younger string) {
	t.Helper()
	ctx := context.Background()
	var err error
	if older, err = n.BeginTxn(ctx, kv.TxnOptions{}); err != nil {
		t.Fatal(err)
	}
	if younger, err = n.BeginTxn(ctx, kv.TxnOptions{}); err != nil {
		t.Fatal(err)
	}
	return older, younger
}

// transact runs fn in a transaction on n until it commits, keeping its
// priority across attempts, and returns the commit version and the
// number of attempts.
func transact(ctx context.Context, n *Node, opts kv.TxnOptions, fn func(id string) error) (uint64, int, error) {
	return transactFrom(ctx, n, opts, nil, fn)
}

// transactFrom is transact calling begin, when not nil, before each
// attempt begins: a history that records attempts must take their start
// before BeginTxn, which draws the attempt's timestamps.
func transactFrom(ctx context.Context, n *Node, opts kv.TxnOptions, begin func(), fn func(id string) error) (uint64, int, error) {
	for attempt := 1; ; attempt++ {
		if begin != nil {
			begin()
		}
		id, err := n.BeginTxn(ctx, opts)
		if err != nil {
			return 0, attempt, err
		}
		err = fn(id)
		var v uint64
		if err == nil {
			v, err = n.CommitTxn(ctx, id)
		}
		if err == nil {
			return v, attempt, nil
		}
		n.AbortTxn(ctx, id)
		if kv.CodeOf(err) != kv.CodeTxnAborted || ctx.Err() != nil {
			return 0, attempt, err
		}
		opts.RetryOf = id
		time.Sleep(time.Duration(rand.N(attempt*2+1)) * time.Millisecond)
	}
}

func TestTxnReadYourWritesCommitAbort(t *testing.T) {
	n := openTest(t, t.TempDir(), Options{Logger: quietLogger(), TickInterval: 20 * time.Millisecond})
	defer n.Close()
	ctx := context.Background()
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "c", Partitioning: kv.PartitionHash, Shards: 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte("a"), Value: []byte("0")}); err != nil {
		t.Fatal(err)
	}
	id, err := n.BeginTxn(ctx, kv.TxnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rec, found, err := n.TxnGet(ctx, id, kv.KeyRef{Collection: "c", Key: []byte("a")})
	if err != nil || !found || string(rec.Value) != "0" {
		t.Fatalf("get a: %v %v %q", err, found, rec.Value)
	}
	for i, k := range []string{"a", "b", "c", "d", "e"} {
		if err := n.TxnPut(ctx, id, kv.PutItem{Collection: "c", Key: []byte(k), Value: []byte("v" + strconv.Itoa(i))}); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.TxnDelete(ctx, id, kv.KeyRef{Collection: "c", Key: []byte("e")}); err != nil {
		t.Fatal(err)
	}
	if rec, found, err := n.TxnGet(ctx, id, kv.KeyRef{Collection: "c", Key: []byte("b")}); err != nil || !found || string(rec.Value) != "v1" {
		t.Fatalf("own write of b not seen: %v %v %q", err, found, rec.Value)
	}
	if _, found, err := n.TxnGet(ctx, id, kv.KeyRef{Collection: "c", Key: []byte("e")}); err != nil || found {
		t.Fatalf("own delete of e not seen: %v %v", err, found)
	}
	// Before the commit, plain reads see the old state.
	if r, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte("a")}); err != nil || string(r.Value) != "0" {
		t.Fatalf("plain get of a before commit: %v %q", err, r.Value)
	}
	v, err := n.CommitTxn(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range []string{"a", "b", "c", "d"} {
		r, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte(k)})
		if err != nil || string(r.Value) != "v"+strconv.Itoa(i) || r.Version != v {
			t.Fatalf("after commit at %d: %s = %q@%d, %v", v, k, r.Value, r.Version, err)
		}
	}
	if _, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte("e")}); kv.CodeOf(err) != kv.CodeNotFound {
		t.Fatalf("e: %v", err)
	}
	// A batch get and a scan see the whole commit at one version.
	res, err := n.Scan(ctx, kv.ScanRequest{Collection: "c"})
	if err != nil || len(res.Items) != 4 {
		t.Fatalf("scan: %v %d items", err, len(res.Items))
	}
	// The commit is final: a commit sent again answers the same version
	// and applies nothing; other operations are refused.
	if v2, err := n.CommitTxn(ctx, id); err != nil || v2 != v {
		t.Fatalf("a second commit answered %d, %v; want %d, nil", v2, err, v)
	}
	if err := n.TxnPut(ctx, id, kv.PutItem{Collection: "c", Key: []byte("a"), Value: []byte("late")}); kv.CodeOf(err) != kv.CodeInvalidArgument {
		t.Fatalf("a put after the commit: %v, want invalid_argument", err)
	}

	// Abort discards, and frees the locks at once.
	id2, _ := n.BeginTxn(ctx, kv.TxnOptions{})
	if err := n.TxnPut(ctx, id2, kv.PutItem{Collection: "c", Key: []byte("a"), Value: []byte("lost")}); err != nil {
		t.Fatal(err)
	}
	if err := n.AbortTxn(ctx, id2); err != nil {
		t.Fatal(err)
	}
	if err := n.AbortTxn(ctx, id2); err != nil {
		t.Fatalf("abort is not idempotent: %v", err)
	}
	if _, _, err := n.TxnGet(ctx, id2, kv.KeyRef{Collection: "c", Key: []byte("a")}); kv.CodeOf(err) != kv.CodeTxnAborted {
		t.Fatalf("get in an aborted transaction: %v", err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := n.Put(wctx, kv.PutRequest{Collection: "c", Key: []byte("a"), Value: []byte("plain")}); err != nil {
		t.Fatalf("plain put after the abort: %v", err)
	}
	if r, _ := n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte("a")}); string(r.Value) != "plain" {
		t.Fatalf("a = %q", r.Value)
	}
}

func TestTxnPlainPutWaitsForLock(t *testing.T) {
	n, ctx := openRangeTxn(t)
	id, _ := n.BeginTxn(ctx, kv.TxnOptions{})
	if _, _, err := n.TxnGet(ctx, id, kv.KeyRef{Collection: "c", Key: []byte("k")}); err != nil {
		t.Fatal(err)
	}
	put := make(chan error, 1)
	go func() {
		_, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte("k"), Value: []byte("plain")})
		put <- err
	}()
	select {
	case err := <-put:
		t.Fatalf("a plain put went past a transaction's read lock: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := n.TxnPut(ctx, id, kv.PutItem{Collection: "c", Key: []byte("j"), Value: []byte("txn")}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.CommitTxn(ctx, id); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-put:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the plain put still waits after the commit")
	}
}

func TestTxnExec(t *testing.T) {
	n := openTest(t, t.TempDir(), Options{Logger: quietLogger(), TickInterval: 20 * time.Millisecond})
	defer n.Close()
	ctx := context.Background()
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "c", Partitioning: kv.PartitionHash, Shards: 2}); err != nil {
		t.Fatal(err)
	}
	va, _ := n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte("a"), Value: []byte("1")})
	n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte("d"), Value: []byte("x")})
	ve, _ := n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte("e"), Value: []byte("E")})
	req := kv.ExecRequest{
		If: []kv.Compare{{Collection: "c", Key: []byte("a"), Version: va}, {Collection: "c", Key: []byte("b"), Version: 0},
			{Collection: "c", Key: []byte("d"), HasValue: true, Value: []byte("x")}},
		Then: []kv.TxnOp{{Op: kv.TxnOpPut, Collection: "c", Key: []byte("a"), Value: []byte("2"), Tags: []string{"t"}},
			{Op: kv.TxnOpDelete, Collection: "c", Key: []byte("d")}, {Op: kv.TxnOpGet, Collection: "c", Key: []byte("e")}},
		Else: []kv.TxnOp{{Op: kv.TxnOpGet, Collection: "c", Key: []byte("a")}},
	}
	res, err := n.ExecTxn(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Succeeded || len(res.Results) != 3 || res.Results[0].Version != res.Version || res.Results[1].Version != res.Version ||
		!res.Results[2].Found || string(res.Results[2].Value) != "E" || res.Results[2].Version != ve {
		t.Fatalf("exec: %+v", res)
	}
	// The same compare fails now: a moved on.
	res2, err := n.ExecTxn(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if res2.Succeeded || len(res2.Results) != 1 || string(res2.Results[0].Value) != "2" || res2.Results[0].Version != res.Version {
		t.Fatalf("exec else: %+v", res2)
	}
	if _, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte("d")}); kv.CodeOf(err) != kv.CodeNotFound {
		t.Fatalf("d after exec: %v", err)
	}
	// A get of a key the branch put before it answers the value put at
	// the commit version, as a get after the commit does; a get before
	// the put, and of a key the branch deleted, answer the store.
	res3, err := n.ExecTxn(ctx, kv.ExecRequest{Then: []kv.TxnOp{
		{Op: kv.TxnOpGet, Collection: "c", Key: []byte("e")},
		{Op: kv.TxnOpPut, Collection: "c", Key: []byte("e"), Value: []byte("E2")},
		{Op: kv.TxnOpDelete, Collection: "c", Key: []byte("a")},
		{Op: kv.TxnOpGet, Collection: "c", Key: []byte("e")},
		{Op: kv.TxnOpGet, Collection: "c", Key: []byte("a")},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if !res3.Succeeded || len(res3.Results) != 5 || string(res3.Results[0].Value) != "E" || res3.Results[0].Version != ve ||
		string(res3.Results[3].Value) != "E2" || res3.Results[3].Version != res3.Version || res3.Results[4].Found {
		t.Fatalf("exec reading its own writes: %+v", res3)
	}
	got, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte("e")})
	if err != nil || got.Version != res3.Results[3].Version {
		t.Fatalf("e after exec: %+v, %v; the exec's get answered version %d", got, err, res3.Results[3].Version)
	}
}

// TestTxnBankCluster moves money between accounts in concurrent
// transactions through every node of a three-node cluster while auditors
// read every account in serializable read-only transactions: every audit,
// and the end, sees the same total.
func TestTxnBankCluster(t *testing.T) { testTxnBank(t, 3) }

// TestTxnBankFourNodes is TestTxnBankCluster on four nodes, where a
// shard's three replicas leave one node without: that node coordinates
// transactions whose locks, validations and releases it sends to a node
// that holds the shard, which passes them to the leader.
func TestTxnBankFourNodes(t *testing.T) { testTxnBank(t, 4) }

func testTxnBank(t *testing.T, nodes int) {
	c := startCluster(t, nodes, func(o *Options) { o.TxnTimeout = 2 * time.Second })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	n1 := c.node(1).n
	info, err := n1.CreateCollection(ctx, kv.CollectionOptions{Name: "bank", Partitioning: kv.PartitionHash, Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	const accounts, initial = 8, 100
	for _, tn := range c.nodes {
		c.eventually(30*time.Second, "collection everywhere", func() error {
			_, err := tn.n.DescribeCollection(ctx, "bank")
			return err
		})
	}
	if nodes > 3 {
		d, err := n1.collection("bank")
		if err != nil {
			t.Fatal(err)
		}
		if len(c.withoutReplica(d)) == 0 {
			t.Fatalf("every node holds every shard of %v", info.Shards)
		}
	}
	for i := range accounts {
		if _, err := n1.Put(ctx, kv.PutRequest{Collection: "bank", Key: []byte(fmt.Sprintf("acct%02d", i)), Value: []byte(strconv.Itoa(initial))}); err != nil {
			t.Fatal(err)
		}
	}
	refs := make([]kv.KeyRef, accounts)
	for i := range refs {
		refs[i] = kv.KeyRef{Collection: "bank", Key: []byte(fmt.Sprintf("acct%02d", i))}
	}
	// readAll reads every account, one by one or (batch) in one batch get.
	readAll := func(n *Node, id string, batch bool) (int, error) {
		sum := 0
		if batch {
			items, err := n.TxnBatchGet(ctx, id, refs, false)
			if err != nil {
				return 0, err
			}
			for i, it := range items {
				if !it.Found {
					return 0, fmt.Errorf("account %d missing", i)
				}
				v, err := strconv.Atoi(string(it.Value))
				if err != nil {
					return 0, err
				}
				sum += v
			}
			return sum, nil
		}
		for i := range accounts {
			rec, found, err := n.TxnGet(ctx, id, kv.KeyRef{Collection: "bank", Key: []byte(fmt.Sprintf("acct%02d", i))})
			if err != nil {
				return 0, err
			}
			if !found {
				return 0, fmt.Errorf("account %d missing", i)
			}
			v, err := strconv.Atoi(string(rec.Value))
			if err != nil {
				return 0, err
			}
			sum += v
		}
		return sum, nil
	}
	seed := clusterSeed(t)
	var stop atomic.Bool
	var wg sync.WaitGroup
	var transfers, audits, maxAttempts atomic.Int64
	errs := make(chan error, 64)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			for !stop.Load() {
				n := c.nodes[rng.IntN(len(c.nodes))].n
				from, to := rng.IntN(accounts), rng.IntN(accounts)
				if from == to {
					continue
				}
				amount := 1 + rng.IntN(10)
				_, attempts, err := transact(ctx, n, kv.TxnOptions{}, func(id string) error {
					get := func(i int) (int, error) {
						read := n.TxnGet
						if w%2 == 1 {
							read = n.TxnGetForUpdate // both kinds of read in one run
						}
						rec, _, err := read(ctx, id, kv.KeyRef{Collection: "bank", Key: []byte(fmt.Sprintf("acct%02d", i))})
						if err != nil {
							return 0, err
						}
						return strconv.Atoi(string(rec.Value))
					}
					var a, b int
					if w >= 2 {
						// Workers 2 and 3 read both accounts in one batch get.
						items, err := n.TxnBatchGet(ctx, id, []kv.KeyRef{refs[from], refs[to]}, w%2 == 1)
						if err != nil {
							return err
						}
						if a, err = strconv.Atoi(string(items[0].Value)); err != nil {
							return err
						}
						if b, err = strconv.Atoi(string(items[1].Value)); err != nil {
							return err
						}
					} else {
						var err error
						if a, err = get(from); err != nil {
							return err
						}
						if b, err = get(to); err != nil {
							return err
						}
					}
					if err := n.TxnPut(ctx, id, kv.PutItem{Collection: "bank", Key: []byte(fmt.Sprintf("acct%02d", from)), Value: []byte(strconv.Itoa(a - amount))}); err != nil {
						return err
					}
					return n.TxnPut(ctx, id, kv.PutItem{Collection: "bank", Key: []byte(fmt.Sprintf("acct%02d", to)), Value: []byte(strconv.Itoa(b + amount))})
				})
				if err != nil {
					errs <- fmt.Errorf("transfer: %w", err)
					return
				}
				transfers.Add(1)
				for m := maxAttempts.Load(); int64(attempts) > m && !maxAttempts.CompareAndSwap(m, int64(attempts)); m = maxAttempts.Load() {
				}
			}
		}()
	}
	for a := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				n := c.nodes[(a+i)%len(c.nodes)].n
				var sum int
				_, _, err := transact(ctx, n, kv.TxnOptions{}, func(id string) error {
					var err error
					sum, err = readAll(n, id, i%2 == 1)
					return err
				})
				if err != nil {
					errs <- fmt.Errorf("audit: %w", err)
					return
				}
				if sum != accounts*initial {
					errs <- fmt.Errorf("audit through node %d saw a total of %d, want %d", n.id, sum, accounts*initial)
					return
				}
				audits.Add(1)
			}
		}()
	}
	deadline := time.Now().Add(8 * time.Second)
	for time.Now().Before(deadline) && len(errs) == 0 {
		time.Sleep(50 * time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// The end state, read by plain reads.
	res, err := n1.BatchGet(ctx, func() []kv.KeyRef {
		var ks []kv.KeyRef
		for i := range accounts {
			ks = append(ks, kv.KeyRef{Collection: "bank", Key: []byte(fmt.Sprintf("acct%02d", i))})
		}
		return ks
	}())
	if err != nil {
		t.Fatal(err)
	}
	sum := 0
	for _, it := range res.Items {
		v, _ := strconv.Atoi(string(it.Value))
		sum += v
	}
	if sum != accounts*initial {
		t.Errorf("final total %d, want %d", sum, accounts*initial)
	}
	if transfers.Load() == 0 || audits.Load() == 0 {
		t.Errorf("%d transfers and %d audits ran", transfers.Load(), audits.Load())
	}
	t.Logf("seed %d: %d transfers, %d audits, at most %d attempts per transfer", seed, transfers.Load(), audits.Load(), maxAttempts.Load())
	_ = errors.New
}

// TestTxnWatchSeesEveryCommit: a watch of a collection written by
// concurrent multi-shard transactions and plain puts delivers every
// committed write exactly once, in version order — a resolve writes at the
// commit timestamp, below versions the shard applied since it prepared, so
// the shard's resolved timestamp must wait for it.
func TestTxnWatchSeesEveryCommit(t *testing.T) {
	n := openTest(t, t.TempDir(), Options{Logger: quietLogger(), TickInterval: 20 * time.Millisecond})
	defer n.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "w", Partitioning: kv.PartitionHash, Shards: 4}); err != nil {
		t.Fatal(err)
	}
	start, err := n.latest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	type ev struct {
		key     string
		version uint64
	}
	var mu sync.Mutex
	var events []ev
	wctx, wcancel := context.WithCancel(ctx)
	watchDone := make(chan error, 1)
	go func() {
		watchDone <- n.Watch(wctx, kv.WatchRequest{Collection: "w", FromVersion: start}, func(e kv.Event) error {
			if e.Type == kv.EventPut {
				mu.Lock()
				events = append(events, ev{string(e.Key), e.Version})
				mu.Unlock()
			}
			return nil
		})
	}()
	want := map[ev]bool{}
	var wmu sync.Mutex
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 25 {
				keys := []string{fmt.Sprintf("t%d-%d-a", w, i), fmt.Sprintf("t%d-%d-b", w, i), fmt.Sprintf("t%d-%d-c", w, i)}
				v, _, err := transact(ctx, n, kv.TxnOptions{}, func(id string) error {
					for _, k := range keys {
						if err := n.TxnPut(ctx, id, kv.PutItem{Collection: "w", Key: []byte(k), Value: []byte("v")}); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					t.Error(err)
					return
				}
				wmu.Lock()
				for _, k := range keys {
					want[ev{k, v}] = true
				}
				wmu.Unlock()
				pk := fmt.Sprintf("p%d-%d", w, i)
				pv, err := n.Put(ctx, kv.PutRequest{Collection: "w", Key: []byte(pk), Value: []byte("v")})
				if err != nil {
					t.Error(err)
					return
				}
				wmu.Lock()
				want[ev{pk, pv}] = true
				wmu.Unlock()
			}
		}()
	}
	wg.Wait()
	deadline := time.Now().Add(60 * time.Second)
	for {
		mu.Lock()
		got := len(events)
		mu.Unlock()
		if got >= len(want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	wcancel()
	<-watchDone
	mu.Lock()
	defer mu.Unlock()
	seen := map[ev]bool{}
	for i, e := range events {
		if i > 0 && e.version < events[i-1].version {
			t.Fatalf("event %d (%s@%d) comes after %s@%d", i, e.key, e.version, events[i-1].key, events[i-1].version)
		}
		if seen[e] {
			t.Fatalf("event %s@%d delivered twice", e.key, e.version)
		}
		seen[e] = true
		if !want[e] {
			t.Fatalf("event %s@%d was never written", e.key, e.version)
		}
	}
	for e := range want {
		if !seen[e] {
			t.Fatalf("the watch missed %s@%d (%d events of %d)", e.key, e.version, len(events), len(want))
		}
	}
}

// TestTxnPrioritiesUnique begins many transactions at once through every
// node of a cluster: no two first attempts get one priority, so the
// order between two transactions (wound-wait's) is the same at every
// attempt of either; a retry keeps its transaction's priority.
func TestTxnPrioritiesUnique(t *testing.T) {
	c := startCluster(t, 3, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const perClient, clientsPerNode = 40, 3
	var mu sync.Mutex
	seen := map[uint64]string{}
	var wg sync.WaitGroup
	for _, tn := range c.nodes {
		for range clientsPerNode {
			wg.Add(1)
			go func(n *Node) {
				defer wg.Done()
				for range perClient {
					id, err := n.BeginTxn(ctx, kv.TxnOptions{})
					if err != nil {
						t.Error(err)
						return
					}
					n.AbortTxn(ctx, id)
					p, _, err := txn.ParseID(id)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					if other, ok := seen[p]; ok {
						t.Errorf("transactions %s and %s have one priority %d", other, id, p)
					}
					seen[p] = id
					mu.Unlock()
				}
			}(tn.n)
		}
	}
	wg.Wait()
	if len(seen) != len(c.nodes)*clientsPerNode*perClient && !t.Failed() {
		t.Fatalf("%d priorities for %d transactions", len(seen), len(c.nodes)*clientsPerNode*perClient)
	}
	// A retry keeps the priority.
	n := c.nodes[0].n
	id, err := n.BeginTxn(ctx, kv.TxnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.AbortTxn(ctx, id)
	retry, err := n.BeginTxn(ctx, kv.TxnOptions{RetryOf: id})
	if err != nil {
		t.Fatal(err)
	}
	defer n.AbortTxn(ctx, retry)
	p1, a1, _ := txn.ParseID(id)
	p2, a2, _ := txn.ParseID(retry)
	if p1 != p2 || a2 != a1+1 {
		t.Fatalf("retry %s of %s: priority %d attempt %d, want %d and %d", retry, id, p2, a2, p1, a1+1)
	}
}

// TestTxnSilentClientLocksExpire: a transaction whose client went silent
// after taking a lock (killed between two requests) loses it once its
// record's heartbeat expired — a plain write waiting for the key gets it —
// although its session lives on until TxnIdleTimeout, set here far beyond
// the test; the attempt then answers txn_aborted.
func TestTxnSilentClientLocksExpire(t *testing.T) {
	const txnTimeout = 500 * time.Millisecond
	n := openTest(t, t.TempDir(), Options{Logger: quietLogger(), TickInterval: 20 * time.Millisecond,
		TxnTimeout: txnTimeout, TxnIdleTimeout: time.Hour})
	defer n.Close()
	ctx := context.Background()
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "c", Partitioning: kv.PartitionHash, Shards: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte("k"), Value: []byte("0")}); err != nil {
		t.Fatal(err)
	}
	id, err := n.BeginTxn(ctx, kv.TxnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := n.TxnGet(ctx, id, kv.KeyRef{Collection: "c", Key: []byte("k")}); err != nil {
		t.Fatal(err)
	}
	// The client says nothing more. A plain write of the key waits for
	// the transaction's read lock, until the record expires; the deadline
	// only catches a hang (the expiry is a few TxnTimeouts).
	wctx, cancel := context.WithTimeout(ctx, 60*txnTimeout)
	defer cancel()
	if _, err := n.Put(wctx, kv.PutRequest{Collection: "c", Key: []byte("k"), Value: []byte("1")}); err != nil {
		t.Fatalf("a write of a key read by a silent client's transaction: %v", err)
	}
	if _, err := n.CommitTxn(ctx, id); kv.CodeOf(err) != kv.CodeTxnAborted {
		t.Fatalf("the silent client's commit: %v, want txn_aborted", err)
	}
}
