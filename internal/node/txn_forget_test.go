package node

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/shard"
	"github.com/groupkv/groupkv/internal/storage"
	"github.com/groupkv/groupkv/internal/txn"
)

// eachTxnRecord calls fn with the id and record of every transaction
// record of collection coll in n's storage.
func eachTxnRecord(t *testing.T, n *Node, coll uint32, fn func(id string, rec txn.Record)) {
	t.Helper()
	lo, hi := storage.TxnRecordSpan(coll)
	it, err := n.eng.DB.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	for it.First(); it.Valid(); it.Next() {
		rec, _, err := txn.DecodeRecord(it.Value())
		if err != nil {
			t.Fatal(err)
		}
		k := it.Key()
		fn(string(k[len(k)-40:]), rec)
	}
}

// countTxnRecords counts the transaction records of collection coll in n's
// storage, by status.
func countTxnRecords(t *testing.T, n *Node, coll uint32) map[txn.Status]int {
	t.Helper()
	counts := map[txn.Status]int{}
	eachTxnRecord(t, n, coll, func(_ string, rec txn.Record) { counts[rec.Status]++ })
	return counts
}

// describeTxnRecords lists the transaction records of collection coll.
func describeTxnRecords(t *testing.T, n *Node, coll uint32) string {
	t.Helper()
	var sb strings.Builder
	eachTxnRecord(t, n, coll, func(id string, rec txn.Record) {
		fmt.Fprintf(&sb, "%s %s reason=%q wounded-by=%v retried-as=%v\n", id, rec.Status, rec.Reason, rec.WoundedBy != nil, rec.RetriedAs != nil)
	})
	return sb.String()
}

// contendedTransfers runs clients goroutines each moving one unit between
// two of accounts keys of collection "c" rounds times, in serializable
// transactions spanning shards; conflicts wound and abort attempts, so
// both COMMITTED and ABORTED records are written. It returns the attempts
// that did not commit.
func contendedTransfers(t *testing.T, n *Node, accounts, clients, rounds int) int {
	t.Helper()
	aborted, _ := transfersWhile(t, n, accounts, clients, func(r int) bool { return r < rounds })
	return aborted
}

// transfersLeavingRecords runs contendedTransfers until it has left a
// decided record in collection coll, at most 10 times: only a transaction
// someone else met (a conflict) leaves its record behind, and on a loaded
// machine the clients may happen not to meet for a while.
func transfersLeavingRecords(t *testing.T, n *Node, coll uint32, accounts, clients, rounds int) (aborted int) {
	t.Helper()
	for batch := 1; ; batch++ {
		aborted += contendedTransfers(t, n, accounts, clients, rounds)
		counts := countTxnRecords(t, n, coll)
		if counts[txn.Committed] > 0 || batch == 10 {
			t.Logf("%d transfers in %d batches; records %v", batch*clients*rounds, batch, counts)
			return aborted
		}
	}
}

// transfer is a committed transfer of one unit, at its commit version.
type transfer struct {
	from, to string
	version  uint64
}

// transfersWhile is contendedTransfers with each client going on to its
// next round r while more(r); it returns the attempts that did not commit
// and the transfers that did.
func transfersWhile(t *testing.T, n *Node, accounts, clients int, more func(r int) bool) (aborted int, committed []transfer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; more(r); r++ {
				from := strconv.Itoa((c + r) % accounts)
				to := strconv.Itoa((c + 2*r + 1) % accounts)
				if from == to {
					to = strconv.Itoa((c + 2*r + 2) % accounts)
				}
				v, attempts, err := transact(ctx, n, kv.TxnOptions{}, func(id string) error {
					for _, k := range []string{from, to} {
						rec, found, err := n.TxnGet(ctx, id, kv.KeyRef{Collection: "c", Key: []byte(k)})
						if err != nil {
							return fmt.Errorf("get %s: %w", k, err)
						}
						v := 0
						if found {
							v, _ = strconv.Atoi(string(rec.Value))
						}
						if k == from {
							v--
						} else {
							v++
						}
						if err := n.TxnPut(ctx, id, kv.PutItem{Collection: "c", Key: []byte(k), Value: []byte(strconv.Itoa(v))}); err != nil {
							return fmt.Errorf("put %s: %w", k, err)
						}
					}
					return nil
				})
				mu.Lock()
				aborted += attempts - 1
				if err != nil {
					errs = append(errs, err)
				} else {
					committed = append(committed, transfer{from, to, v})
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
	return aborted, committed
}

// checkBalances checks that accounts "0".."accounts-1" of collection "c"
// sum to zero and that no intent is left on them.
func checkBalances(t *testing.T, n *Node, accounts int) {
	t.Helper()
	ctx := context.Background()
	sum := 0
	for i := range accounts {
		rec, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte(strconv.Itoa(i))})
		if kv.CodeOf(err) == kv.CodeNotFound {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		v, _ := strconv.Atoi(string(rec.Value))
		sum += v
	}
	if sum != 0 {
		t.Errorf("the balances sum to %d, not 0", sum)
	}
}

// TestTxnRecordsForgotten: the records of finished transactions — committed
// across shards, and aborted by wounds — are removed once the retention
// passed, and only then; the data they committed stays.
func TestTxnRecordsForgotten(t *testing.T) {
	const accounts, clients, rounds = 6, 4, 15
	for _, tc := range []struct {
		name      string
		retention time.Duration
	}{
		{"kept within the retention", time.Hour},
		{"removed after it", 20 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A record a wound wrote is removed by the wounder's side too,
			// once its owner is past its deadline: MaxTxnDuration +
			// TxnTimeout after the wound.
			n := openTest(t, t.TempDir(), Options{Logger: quietLogger(), TickInterval: 20 * time.Millisecond, TxnRecordRetention: tc.retention,
				TxnTimeout: time.Second, MaxTxnDuration: 2 * time.Second})
			defer n.Close()
			ctx := context.Background()
			d, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "c", Partitioning: kv.PartitionHash, Shards: 4})
			if err != nil {
				t.Fatal(err)
			}
			aborted := transfersLeavingRecords(t, n, d.ID, accounts, clients, rounds)
			t.Logf("%d aborted attempts", aborted)
			checkBalances(t, n, accounts)
			forgotten := func() float64 { return testutil.ToFloat64(n.forgetter.forgotten) }
			if tc.retention == time.Hour {
				counts := countTxnRecords(t, n, d.ID)
				t.Logf("records: %v", counts)
				if counts[txn.Committed] == 0 {
					t.Fatalf("no COMMITTED record after %d transfers across shards: %v", clients*rounds, counts)
				}
				n.forgetDueRecords()
				if after := countTxnRecords(t, n, d.ID); fmt.Sprint(after) != fmt.Sprint(counts) {
					t.Fatalf("records changed within the retention: %v -> %v", counts, after)
				}
				if f := forgotten(); f != 0 {
					t.Fatalf("%v records forgotten within the retention", f)
				}
				return
			}
			// Liveness: a generous deadline that only catches a hang.
			deadline := time.Now().Add(30 * time.Second)
			for {
				counts := countTxnRecords(t, n, d.ID)
				if counts[txn.Committed]+counts[txn.Aborted] == 0 {
					if counts[txn.Pending] != 0 {
						t.Fatalf("PENDING records of finished transactions left: %v", counts)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("records left 30 s after the last transaction, retention %v: %v (forgotten %v)\n%s", tc.retention, counts, forgotten(), describeTxnRecords(t, n, d.ID))
				}
				time.Sleep(20 * time.Millisecond)
			}
			if forgotten() == 0 {
				t.Fatalf("no record forgotten for %d transfers", clients*rounds)
			}
			t.Logf("%v records forgotten", forgotten())
			checkBalances(t, n, accounts)
			// The records' shards still answer for them: a late look-up
			// of a removed record reads PENDING, never COMMITTED.
			if kept := testutil.ToFloat64(n.forgetter.kept); kept != 0 {
				t.Fatalf("%v records kept", kept)
			}
		})
	}
}

// TestTxnRecordsForgottenAfterRestart: a record its coordinator marked
// removable is removed by the leader of its shard once its time comes,
// though the coordinator stopped in between (here the same node, restarted:
// what it had in memory is gone).
func TestTxnRecordsForgottenAfterRestart(t *testing.T) {
	const accounts, clients, rounds = 6, 4, 15
	dir := t.TempDir()
	opts := Options{Logger: quietLogger(), TickInterval: 20 * time.Millisecond, TxnRecordRetention: 2 * time.Second,
		TxnTimeout: 500 * time.Millisecond, MaxTxnDuration: time.Second}
	n := openTest(t, dir, opts)
	ctx := context.Background()
	d, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "c", Partitioning: kv.PartitionHash, Shards: 4})
	if err != nil {
		n.Close()
		t.Fatal(err)
	}
	aborted := transfersLeavingRecords(t, n, d.ID, accounts, clients, rounds)
	t.Logf("%d aborted attempts", aborted)
	// Every decided record is marked (resolves finish after the commits
	// answer, and marks are proposed every markInterval). Liveness: a
	// generous deadline that only catches a hang.
	deadline := time.Now().Add(30 * time.Second)
	for {
		decided, unmarked := 0, 0
		eachTxnRecord(t, n, d.ID, func(_ string, rec txn.Record) {
			if rec.Status != txn.Pending {
				decided++
				if rec.ForgetAfter == 0 {
					unmarked++
				}
			}
		})
		if unmarked == 0 {
			t.Logf("%d decided records, all marked", decided)
			if decided == 0 {
				n.Close()
				t.Fatal("no decided record left to see removed after the restart")
			}
			break
		}
		if time.Now().After(deadline) {
			n.Close()
			t.Fatalf("%d of %d decided records not marked 30 s after the last transaction", unmarked, decided)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	n = openTest(t, dir, opts)
	defer n.Close()
	// The records are there after the restart (none was due before it),
	// and the restarted node removes them. (Not counted by its metric
	// alone: a removal applied after its proposal's wait ended is not.)
	if counts := countTxnRecords(t, n, d.ID); counts[txn.Committed]+counts[txn.Aborted] == 0 {
		t.Fatal("no decided record left after the restart: removed before it")
	}
	for {
		counts := countTxnRecords(t, n, d.ID)
		if counts[txn.Committed]+counts[txn.Aborted] == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("records left after the restart: %v\n%s", counts, describeTxnRecords(t, n, d.ID))
		}
		time.Sleep(20 * time.Millisecond)
	}
	checkBalances(t, n, accounts)
}

// TestTxnForgetLeavesUndecided: a removal names a record whose attempt is
// still PENDING (it never does, but a late one could): the record stays.
func TestTxnForgetLeavesUndecided(t *testing.T) {
	n := openTest(t, t.TempDir(), Options{Logger: quietLogger(), TickInterval: 20 * time.Millisecond})
	defer n.Close()
	ctx := context.Background()
	d, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "c", Partitioning: kv.PartitionHash, Shards: 2})
	if err != nil {
		t.Fatal(err)
	}
	desc, err := n.collection("c")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := n.route(desc, []byte("k"))
	pending := txn.Meta{ID: txn.NewID(1, 1), Priority: 1, Attempt: 1, Start: 1, Anchor: txn.Anchor{Collection: d.ID, Bucket: b, Key: []byte("k")}}
	done := pending
	done.ID = txn.NewID(2, 1)
	if _, err := n.recordCAS(ctx, txn.RecordCmd{Op: txn.OpHeartbeat, Meta: pending, TS: 5}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.recordCAS(ctx, txn.RecordCmd{Op: txn.OpAbort, Meta: done, Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	id, err := n.anchorShard(pending.Anchor)
	if err != nil {
		t.Fatal(err)
	}
	res, err := n.propose(ctx, id, shard.EncodeTxnForget(&shard.TxnForgetCmd{Records: []shard.TxnRecordRef{{ID: pending.ID, Anchor: pending.Anchor}, {ID: done.ID, Anchor: done.Anchor}}}))
	if err != nil || res.Err != nil {
		t.Fatal(err, res.Err)
	}
	if res.Count != 1 {
		t.Fatalf("removed %d records, want 1", res.Count)
	}
	if counts := countTxnRecords(t, n, d.ID); counts[txn.Pending] != 1 || len(counts) != 1 {
		t.Fatalf("records after the removal: %v, want the PENDING one", counts)
	}
}

// TestTxnForgetMarksEachRecordItsTime: records queued together for one
// shard with different retentions (a wound's ABORTED record waits for its
// attempt's deadline, a resolved one only for the retention) are each
// marked with their own time: the first goes, the second stays.
func TestTxnForgetMarksEachRecordItsTime(t *testing.T) {
	n := openTest(t, t.TempDir(), Options{Logger: quietLogger(), TickInterval: 20 * time.Millisecond, TxnRecordRetention: time.Hour})
	defer n.Close()
	ctx := context.Background()
	d, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "c", Partitioning: kv.PartitionHash, Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	desc, err := n.collection("c")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := n.route(desc, []byte("k"))
	soon := txn.Meta{ID: txn.NewID(1, 1), Priority: 1, Attempt: 1, Start: 1, Anchor: txn.Anchor{Collection: d.ID, Bucket: b, Key: []byte("k")}}
	late := soon
	late.ID = txn.NewID(2, 1)
	for _, m := range []txn.Meta{soon, late} {
		if _, err := n.recordCAS(ctx, txn.RecordCmd{Op: txn.OpAbort, Meta: m, Reason: "test"}); err != nil {
			t.Fatal(err)
		}
	}
	n.forgetRecordAfter(soon, 0)
	n.forgetRecordAfter(late, time.Hour)
	n.forgetDueRecords() // marks both
	time.Sleep(n.markInterval())
	n.forgetDueRecords() // removes the first
	var left []string
	eachTxnRecord(t, n, d.ID, func(id string, rec txn.Record) {
		left = append(left, id)
		if rec.ForgetAfter == 0 {
			t.Errorf("record %s not marked", id)
		}
	})
	if len(left) != 1 || left[0] != late.ID {
		t.Fatalf("records left %v, want only %s", left, late.ID)
	}
}

// TestTxnReadOnlyHeartbeatRecordForgotten: a serializable attempt that only
// read, and lived long enough to heartbeat (which writes a PENDING record),
// leaves its record decided, and the record goes after the retention.
func TestTxnReadOnlyHeartbeatRecordForgotten(t *testing.T) {
	n := openTest(t, t.TempDir(), Options{Logger: quietLogger(), TickInterval: 20 * time.Millisecond, TxnTimeout: 200 * time.Millisecond, TxnRecordRetention: time.Hour})
	defer n.Close()
	ctx := context.Background()
	d, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "c", Partitioning: kv.PartitionHash, Shards: 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte("k"), Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	id, err := n.BeginTxn(ctx, kv.TxnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := n.TxnGet(ctx, id, kv.KeyRef{Collection: "c", Key: []byte("k")}); err != nil {
		t.Fatal(err)
	}
	// Heartbeats every TxnTimeout/4 while the client is heard from.
	deadline := time.Now().Add(30 * time.Second)
	for countTxnRecords(t, n, d.ID)[txn.Pending] == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no heartbeat wrote a record in 30 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := n.CommitTxn(ctx, id); err != nil {
		t.Fatal(err)
	}
	if counts := countTxnRecords(t, n, d.ID); counts[txn.Committed] != 1 || len(counts) != 1 {
		t.Fatalf("records after the commit: %v, want one COMMITTED", counts)
	}
	// The retention passes.
	n.forgetter.mu.Lock()
	for i := range n.forgetter.queue {
		n.forgetter.queue[i].after = time.Now()
	}
	n.forgetter.mu.Unlock()
	n.forgetDueRecords() // marks it, its time rounded up to markInterval
	time.Sleep(n.markInterval())
	n.forgetDueRecords()
	if counts := countTxnRecords(t, n, d.ID); len(counts) != 0 {
		t.Fatalf("records after the retention: %v, want none", counts)
	}
}

// TestTxnReadPastDeadlineAborts: an attempt past MaxTxnDuration reads no
// more (its record may be gone, so PENDING vouches for nothing); it could
// not commit anyway.
func TestTxnReadPastDeadlineAborts(t *testing.T) {
	n := openTest(t, t.TempDir(), Options{Logger: quietLogger(), TickInterval: 20 * time.Millisecond, MaxTxnDuration: 300 * time.Millisecond})
	defer n.Close()
	ctx := context.Background()
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "c", Partitioning: kv.PartitionHash, Shards: 2}); err != nil {
		t.Fatal(err)
	}
	id, err := n.BeginTxn(ctx, kv.TxnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := n.TxnGet(ctx, id, kv.KeyRef{Collection: "c", Key: []byte("a")}); err != nil {
		t.Fatalf("a read within the deadline: %v", err)
	}
	time.Sleep(400 * time.Millisecond)
	_, _, err = n.TxnGet(ctx, id, kv.KeyRef{Collection: "c", Key: []byte("b")})
	if kv.CodeOf(err) != kv.CodeTxnAborted {
		t.Fatalf("a read past the deadline: %v, want txn_aborted", err)
	}
}

// TestTxnUnmarkedCommittedRecordForgotten: the coordinator of a
// cross-shard commit stops right after the commit point (it neither
// resolves nor marks the record). The leader of the record's shard removes
// the record only once neither participant holds the attempt prepared.
func TestTxnUnmarkedCommittedRecordForgotten(t *testing.T) {
	n, ctx, _ := openUnswept(t, 4)
	keys := keysInTwoShards(t, n, "c")
	id, rec := commitUnresolved(ctx, t, n, "c", keys)
	ad := anchorCollection(ctx, t, n)
	if !rec.Listed || len(rec.Participants) != 2 || rec.ForgetAfter != 0 {
		t.Fatalf("the committed record: %s %+v, want it unmarked, listing two participants\n%s", id, rec, describeTxnRecords(t, n, ad.ID))
	}
	sweep := func() {
		t.Helper()
		n.eachLed(func(sid uint64, _ *shard.Shard) {
			if sd, ok := n.host.Desc(sid); ok {
				n.sweepUnmarkedBefore(sid, sd, math.MaxUint64, 0)
			}
		})
	}
	exists := func() bool {
		found := false
		eachTxnRecord(t, n, ad.ID, func(i string, _ txn.Record) { found = found || i == id })
		return found
	}
	sweep()
	if !exists() {
		t.Fatal("the record was removed while both participants held the attempt prepared")
	}
	res := shard.TxnResult{ID: id, Status: txn.Committed, CommitTS: rec.CommitTS}
	if err := n.resolvePrepared(ctx, rec.Participants[0], id, res); err != nil {
		t.Fatal(err)
	}
	sweep()
	if !exists() {
		t.Fatal("the record was removed while a participant held the attempt prepared")
	}
	if err := n.resolvePrepared(ctx, rec.Participants[1], id, res); err != nil {
		t.Fatal(err)
	}
	sweep()
	if exists() {
		t.Fatal("the record stays once no participant holds the attempt prepared")
	}
	if got := testutil.ToFloat64(n.forgetter.unmarked); got != 1 {
		t.Fatalf("groupkv_txn_records_unmarked_forgotten_total = %v, want 1", got)
	}
	for _, k := range keys {
		if r, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte(k)}); err != nil || string(r.Value) != "v"+k {
			t.Fatalf("%s: %q %v, want the committed v%s", k, r.Value, err, k)
		}
	}
}

// TestTxnUnmarkedAbortedRecordForgotten: an ABORTED record nobody marked
// (whoever aborted it stopped first) keeps its abort time, and the leader
// of its shard removes it once the attempt is past its commit deadline.
func TestTxnUnmarkedAbortedRecordForgotten(t *testing.T) {
	n, ctx, d := openUnswept(t, 2)
	now, err := n.latest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	key := []byte("anchor")
	m := txn.Meta{ID: txn.NewID(now, 1), Priority: now, Attempt: 1, Start: now, Anchor: txn.Anchor{Collection: d.ID, Bucket: cluster.Bucket(key), Key: key}}
	before := uint64(time.Now().UnixNano())
	if rec, err := n.recordCAS(ctx, txn.RecordCmd{Op: txn.OpAbort, Meta: m, Reason: "test"}); err != nil || rec.Status != txn.Aborted {
		t.Fatalf("aborting: %+v %v", rec, err)
	}
	var abortedAt uint64
	eachTxnRecord(t, n, d.ID, func(id string, r txn.Record) {
		if id == m.ID {
			abortedAt = r.AbortedAt
		}
	})
	if abortedAt < before || abortedAt > uint64(time.Now().UnixNano()) {
		t.Fatalf("the record's abort time is %d, want the time of the abort (after %d)", abortedAt, before)
	}
	sweep := func(abortedBefore uint64) bool {
		t.Helper()
		n.eachLed(func(sid uint64, _ *shard.Shard) {
			if sd, ok := n.host.Desc(sid); ok {
				n.sweepUnmarkedBefore(sid, sd, 0, abortedBefore)
			}
		})
		found := false
		eachTxnRecord(t, n, d.ID, func(id string, _ txn.Record) { found = found || id == m.ID })
		return found
	}
	if !sweep(abortedAt) {
		t.Fatal("the record was removed before its time")
	}
	if sweep(abortedAt + 1) {
		t.Fatal("the record stays after its time")
	}
}

// openUnswept opens a node with unsweptOptions and a hash collection "c"
// of shards shards; the node closes when the test ends.
func openUnswept(t *testing.T, shards int) (*Node, context.Context, kv.CollectionInfo) {
	t.Helper()
	var opts Options
	unsweptOptions(&opts)
	n := openTest(t, t.TempDir(), opts)
	t.Cleanup(func() { n.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	d, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "c", Partitioning: kv.PartitionHash, Shards: shards})
	if err != nil {
		t.Fatal(err)
	}
	return n, ctx, d
}
