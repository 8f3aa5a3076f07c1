package node

import (
	"cmp"
	"context"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/shard"
	"github.com/groupkv/groupkv/internal/txn"
)

// TestTxnBankWhileReshaping: serializable transfers between the accounts
// of a range collection while its shard splits and merges again and
// again, each split and each merge landing among transactions that hold
// locks, wait for them or are prepared in the shards that change. Every
// transfer commits or retries (none waits forever for a lock in a table
// its shard's change left behind), and the balances sum to zero.
func TestTxnBankWhileReshaping(t *testing.T) {
	c := startCluster(t, 1, func(o *Options) { o.TxnTimeout = 2 * time.Second })
	bankWhileReshaping(t, c, 1, 15, 30*time.Millisecond)
}

// TestTxnBankWhileReshapingThreeNodes: the same on three nodes, every
// shard with three replicas: the merged shard's records and resolves
// must land on every replica of the shard that takes it in, which must
// agree afterwards.
func TestTxnBankWhileReshapingThreeNodes(t *testing.T) {
	c := startCluster(t, 3, func(o *Options) { o.TxnTimeout = 2 * time.Second })
	bankWhileReshaping(t, c, 3, 8, 50*time.Millisecond)
	n := c.node(1).n
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c.eventually(60*time.Second, "every replica is in place", func() error { return c.settledEverywhere("c") })
	d, _ := n.collection("c")
	for _, s := range d.Shards {
		cr, err := n.CheckShard(ctx, s.ID)
		if err != nil || cr.Status != kv.ConsistencyOK {
			t.Errorf("consistency of shard %d: %+v, %v", s.ID, cr, err)
		}
	}
}

// bankWhileReshaping creates range collection "c" with replicas replicas
// and runs transfers between six of its accounts through node 1 while the
// shard splits at "3" and merges back reshapes times, pause before each
// split and each merge; then it checks the balances. On several nodes a
// split is let settle on every replica first, and a merge refused while
// a group settles is asked again.
func bankWhileReshaping(t *testing.T, c *testCluster, replicas, reshapes int, pause time.Duration) {
	t.Helper()
	const accounts, clients = 6, 4
	n := c.node(1).n
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "c", Partitioning: kv.PartitionRange, Replicas: replicas}); err != nil {
		t.Fatal(err)
	}
	var done atomic.Bool
	reshaped := make(chan int, 1)
	go func() {
		defer done.Store(true)
		i := 0
		defer func() { reshaped <- i }()
		for ; i < reshapes; i++ {
			time.Sleep(pause)
			info, err := n.SplitShard(ctx, "c", []byte("3"), 0)
			if err != nil {
				t.Errorf("split %d: %v", i, err)
				return
			}
			if replicas > 1 {
				c.eventually(60*time.Second, "the split settled", func() error { return c.settledEverywhere("c") })
			}
			time.Sleep(pause)
			for {
				_, err := n.MergeShards(ctx, "c", info.Shards[0].ID)
				if err == nil {
					break
				}
				if replicas == 1 || kv.CodeOf(err) != kv.CodeConditionFailed || ctx.Err() != nil {
					t.Errorf("merge %d: %v", i, err)
					return
				}
				time.Sleep(20 * time.Millisecond) // a group still settling
			}
		}
	}()
	aborted, committed := transfersWhile(t, n, accounts, clients, func(int) bool { return !done.Load() })
	t.Logf("%d transfers, %d aborted attempts, %d splits and merges", len(committed), aborted, <-reshaped)
	checkBalances(t, n, accounts)
	if t.Failed() {
		explainBalances(t, n, "c", committed)
	}
}

// explainBalances logs, for each account whose stored history departs
// from the committed transfers, the first transfer whose version holds a
// balance other than the transfers before it add up to: a lost update
// shows as a balance one transfer behind.
func explainBalances(t *testing.T, n *Node, coll string, committed []transfer) {
	t.Helper()
	d, err := n.collection(coll)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(committed, func(a, b transfer) int { return cmp.Compare(a.version, b.version) })
	balance := map[string]int{}
	reported := map[string]bool{}
	for i, tr := range committed {
		for _, k := range []string{tr.from, tr.to} {
			if k == tr.from {
				balance[k]--
			} else {
				balance[k]++
			}
			if reported[k] {
				continue
			}
			val, version, found, err := shard.ReadRecord(n.eng.DB, d.ID, []byte(k), tr.version)
			got, _ := strconv.Atoi(string(val.Value))
			if err != nil || !found || version != tr.version || got != balance[k] {
				reported[k] = true
				t.Errorf("account %s after transfer %d of %d (%s→%s at version %d): stored %d at version %d (found %v, %v), the transfers add up to %d",
					k, i, len(committed), tr.from, tr.to, tr.version, got, version, found, err, balance[k])
			}
		}
	}
}

// TestTxnCommitLastAfterMerge: a transaction prepared in the right shard
// of a range collection, which is then merged into the left shard that
// holds its record, commits there as the last participant. That commit
// releases the transaction's locks in the left shard, the locks on the
// merged keys included, so it must resolve the intents the merge brought
// in: the next transaction to lock such a key reads the committed value,
// not the one before it. (Left unresolved, with the coordinator's own
// resolves held back here, the next transaction read the old value and
// overwrote the commit: a lost update.)
func TestTxnCommitLastAfterMerge(t *testing.T) {
	n, ctx := rangeCollection(t, kv.PutRequest{Key: []byte("1"), Value: []byte("old")}, kv.PutRequest{Key: []byte("5"), Value: []byte("old")})
	info, err := n.SplitShard(ctx, "c", []byte("3"), 0)
	if err != nil {
		t.Fatal(err)
	}
	left := info.Shards[0].ID
	merged := false
	merge := func() {
		if merged {
			return
		}
		merged = true
		if _, err := n.MergeShards(ctx, "c", left); err != nil {
			t.Errorf("merge: %v", err)
		}
	}
	n.knobs.beforeLast.Store(&merge)
	n.knobs.skipResolves.Store(true)
	_, attempts, err := transact(ctx, n, kv.TxnOptions{}, func(id string) error {
		// "1" first: the record is anchored in the left shard.
		for _, k := range []string{"1", "5"} {
			if err := n.TxnPut(ctx, id, kv.PutItem{Collection: "c", Key: []byte(k), Value: []byte("new")}); err != nil {
				return err
			}
		}
		return nil
	})
	n.knobs.beforeLast.Store(nil)
	n.knobs.skipResolves.Store(false)
	if err != nil {
		t.Fatal(err)
	}
	if !merged || attempts != 1 {
		t.Fatalf("merged %v, %d attempts: the commit did not run across the merge", merged, attempts)
	}
	d, err := n.collection("c")
	if err != nil || len(d.Shards) != 1 {
		t.Fatalf("after the merge: %+v, %v", d, err)
	}
	if _, _, err := transact(ctx, n, kv.TxnOptions{}, func(id string) error {
		rec, found, err := n.TxnGet(ctx, id, kv.KeyRef{Collection: "c", Key: []byte("5")})
		if err != nil {
			return err
		}
		if !found || string(rec.Value) != "new" {
			t.Errorf("a transaction after the commit read 5 = %q (found %v), want \"new\"", rec.Value, found)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestTxnReadLosesLockWhileReading: a transaction whose locks in a shard
// are dropped while it reads there (a split or a merge's prepared locks
// taken in, which abort no record) gets no value: what it read may miss
// an intent the change brought, and fn must not see it. Its retry reads.
func TestTxnReadLosesLockWhileReading(t *testing.T) {
	n, ctx := rangeCollection(t, kv.PutRequest{Key: []byte("k"), Value: []byte("v")})
	drops := 0
	drop := func(shardID uint64) {
		if drops == 0 {
			drops += n.lockTable(shardID).DropUnprepared()
		}
	}
	n.knobs.lockedRead.Store(&drop)
	defer n.knobs.lockedRead.Store(nil)
	id, err := n.BeginTxn(ctx, kv.TxnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rec, found, err := n.TxnGet(ctx, id, kv.KeyRef{Collection: "c", Key: []byte("k")})
	if kv.CodeOf(err) != kv.CodeTxnAborted || drops != 1 {
		t.Fatalf("a read whose lock was dropped while it read: %q (found %v), %v; %d dropped", rec.Value, found, err, drops)
	}
	_ = n.AbortTxn(ctx, id)
	id, err = n.BeginTxn(ctx, kv.TxnOptions{RetryOf: id})
	if err != nil {
		t.Fatal(err)
	}
	if rec, found, err := n.TxnGet(ctx, id, kv.KeyRef{Collection: "c", Key: []byte("k")}); err != nil || !found || string(rec.Value) != "v" {
		t.Fatalf("the retry's read: %q (found %v), %v", rec.Value, found, err)
	}
	if _, err := n.CommitTxn(ctx, id); err != nil {
		t.Fatal(err)
	}
}

// TestTxnScanAfterWound: a scan, or a tag query, of a serializable
// transaction reads after its span locks were granted and its record
// checked; one wounded in between (its locks then an older transaction's)
// gets no page: fn must not see what it read.
func TestTxnScanAfterWound(t *testing.T) {
	n, ctx := rangeCollection(t, kv.PutRequest{Key: []byte("k"), Value: []byte("v"), Tags: []string{"t"}})
	for _, read := range []string{"scan", "tags"} {
		t.Run(read, func(t *testing.T) {
			wounds := 0
			wound := func(m txn.Meta) {
				if wounds > 0 {
					return
				}
				wounds++
				rec, err := n.recordCAS(ctx, txn.RecordCmd{Op: txn.OpAbort, Meta: m, Reason: "wounded by the test"})
				if err != nil || rec.Status != txn.Aborted {
					t.Errorf("wounding %s: %+v, %v", m.ID, rec, err)
				}
			}
			n.knobs.beforePendingCheck.Store(&wound)
			defer n.knobs.beforePendingCheck.Store(nil)
			id, err := n.BeginTxn(ctx, kv.TxnOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var res kv.ScanResult
			if read == "scan" {
				res, err = n.TxnScan(ctx, id, kv.ScanRequest{Collection: "c"})
			} else {
				res, err = n.TxnGetByTags(ctx, id, kv.TagQuery{Collection: "c", All: []string{"t"}})
			}
			if kv.CodeOf(err) != kv.CodeTxnAborted || wounds != 1 || len(res.Items) != 0 {
				t.Fatalf("a %s of a transaction wounded while it read: %d items, %v (%d wounds)", read, len(res.Items), err, wounds)
			}
			_ = n.AbortTxn(ctx, id)
		})
	}
}

// rangeCollection starts one node with range collection "c" holding puts
// (their Collection set to "c"), and returns it with a context that ends
// with the test (a minute at most).
func rangeCollection(t *testing.T, puts ...kv.PutRequest) (*Node, context.Context) {
	t.Helper()
	n := startCluster(t, 1, nil).node(1).n
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "c", Partitioning: kv.PartitionRange}); err != nil {
		t.Fatal(err)
	}
	for _, p := range puts {
		p.Collection = "c"
		if _, err := n.Put(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	return n, ctx
}
