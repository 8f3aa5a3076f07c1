package node

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
)

// TestTxnGetForUpdate: a read for update locks the key exclusively, so a
// younger transaction's plain read of it waits for the older one's commit
// and sees its write (a shared read lock would have let it read at once),
// on a range and on a tag collection (whose reads lock a home shard
// too). A read-only transaction refuses it.
func TestTxnGetForUpdate(t *testing.T) {
	n := openTest(t, t.TempDir(), Options{Logger: quietLogger(), TickInterval: 20 * time.Millisecond})
	defer n.Close()
	ctx := context.Background()
	for _, c := range []kv.CollectionOptions{{Name: "r", Partitioning: kv.PartitionRange}, {Name: "t", Partitioning: kv.PartitionTag}} {
		if _, err := n.CreateCollection(ctx, c); err != nil {
			t.Fatal(err)
		}
		ref := kv.KeyRef{Collection: c.Name, Key: []byte("k")}
		if _, err := n.Put(ctx, kv.PutRequest{Collection: c.Name, Key: ref.Key, Value: []byte("1"), Tags: []string{"g"}}); err != nil {
			t.Fatal(err)
		}
		older, err := n.BeginTxn(ctx, kv.TxnOptions{})
		if err != nil {
			t.Fatal(err)
		}
		rec, found, err := n.TxnGetForUpdate(ctx, older, ref)
		if err != nil || !found || string(rec.Value) != "1" {
			t.Fatalf("%s: read for update: %q %v %v, want \"1\"", c.Name, rec.Value, found, err)
		}
		younger, err := n.BeginTxn(ctx, kv.TxnOptions{})
		if err != nil {
			t.Fatal(err)
		}
		type read struct {
			v   string
			err error
		}
		got := make(chan read, 1)
		go func() {
			rec, _, err := n.TxnGet(ctx, younger, ref)
			got <- read{string(rec.Value), err}
		}()
		select {
		case r := <-got:
			t.Fatalf("%s: a younger transaction read %q (%v) past a read for update", c.Name, r.v, r.err)
		case <-time.After(300 * time.Millisecond):
		}
		if err := n.TxnPut(ctx, older, kv.PutItem{Collection: c.Name, Key: ref.Key, Value: []byte("2"), Tags: []string{"g"}}); err != nil {
			t.Fatal(err)
		}
		if _, err := n.CommitTxn(ctx, older); err != nil {
			t.Fatalf("%s: commit: %v", c.Name, err)
		}
		select {
		case r := <-got:
			if r.err != nil || r.v != "2" {
				t.Fatalf("%s: the younger transaction read %q (%v), want the older one's \"2\"", c.Name, r.v, r.err)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: the younger transaction's read still waits after the commit", c.Name)
		}
		if _, err := n.CommitTxn(ctx, younger); err != nil {
			t.Fatal(err)
		}
	}
	ro, err := n.BeginTxn(ctx, kv.TxnOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := n.TxnGetForUpdate(ctx, ro, kv.KeyRef{Collection: "r", Key: []byte("k")}); kv.CodeOf(err) != kv.CodeInvalidArgument {
		t.Fatalf("read for update in a read-only transaction: %v, want invalid_argument", err)
	}
}

// TestGroupTxnGetForUpdate: in a group transaction a read for update reads
// as a get does (the group's leader validates the reads at the commit), and
// a read-only group transaction refuses it.
func TestGroupTxnGetForUpdate(t *testing.T) {
	n, ctx := openWithCollection(t)
	ref := func(k string) kv.KeyRef { return kv.KeyRef{Collection: "c", Key: []byte(k)} }
	if _, err := n.CreateGroup(ctx, kv.GroupSpec{ID: "g", Leader: ref("a"), Members: []kv.KeyRef{ref("b")}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := groupTransact(ctx, n, "g", func(a string) error {
		return n.TxnPut(ctx, a, kv.PutItem{Collection: "c", Key: []byte("b"), Value: []byte("1")})
	}); err != nil {
		t.Fatal(err)
	}
	_, _, err := groupTransact(ctx, n, "g", func(a string) error {
		rec, found, err := n.TxnGetForUpdate(ctx, a, ref("b"))
		if err != nil || !found || string(rec.Value) != "1" {
			t.Fatalf("read for update in a group transaction: %q %v %v", rec.Value, found, err)
		}
		return n.TxnPut(ctx, a, kv.PutItem{Collection: "c", Key: []byte("b"), Value: []byte("2")})
	})
	if err != nil {
		t.Fatal(err)
	}
	ro, err := n.BeginGroupTxn(ctx, "g", kv.TxnOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := n.TxnGetForUpdate(ctx, ro, ref("b")); kv.CodeOf(err) != kv.CodeInvalidArgument {
		t.Fatalf("read for update in a read-only group transaction: %v, want invalid_argument", err)
	}
	if rec, _, err := n.TxnGet(ctx, ro, ref("b")); err != nil || string(rec.Value) != "2" {
		t.Fatalf("read in the read-only group transaction: %q %v", rec.Value, err)
	}
}

// execReads records how runExec reads: "get c/k" or "update c/k".
type execReads struct{ reads []string }

func (e *execReads) get(_ context.Context, ref kv.KeyRef) (kv.Record, bool, error) {
	e.reads = append(e.reads, "get "+ref.Collection+"/"+string(ref.Key))
	return kv.Record{}, false, nil
}

func (e *execReads) getForUpdate(_ context.Context, ref kv.KeyRef) (kv.Record, bool, error) {
	e.reads = append(e.reads, "update "+ref.Collection+"/"+string(ref.Key))
	return kv.Record{}, false, nil
}

// batchGet records one entry per batch: "update c/a c/d".
func (e *execReads) batchGet(_ context.Context, refs []kv.KeyRef, forUpdate bool, _ func(int) string) ([]kv.BatchGetItem, error) {
	r := "get"
	if forUpdate {
		r = "update"
	}
	for _, ref := range refs {
		r += " " + ref.Collection + "/" + string(ref.Key)
	}
	e.reads = append(e.reads, r)
	return make([]kv.BatchGetItem, len(refs)), nil
}

func (e *execReads) put(context.Context, kv.TxnOp) error    { return nil }
func (e *execReads) del(context.Context, kv.KeyRef) error   { return nil }
func (e *execReads) commit(context.Context) (uint64, error) { return 1, nil }

// TestExecComparesWrittenKeysForUpdate: a one-shot transaction reads for
// update the compared keys that Then or Else writes (put or delete), and
// plainly those it only compares or gets, or that another collection's
// key of the same name is written.
func TestExecComparesWrittenKeysForUpdate(t *testing.T) {
	e := &execReads{}
	_, err := runExec(context.Background(), e, kv.ExecRequest{
		If: []kv.Compare{{Collection: "c", Key: []byte("a"), Version: 7}, {Collection: "c", Key: []byte("b")},
			{Collection: "c", Key: []byte("d"), HasValue: true, Value: []byte("x")}, {Collection: "c", Key: []byte("e")}, {Collection: "c2", Key: []byte("a")}},
		Then: []kv.TxnOp{{Op: kv.TxnOpPut, Collection: "c", Key: []byte("a"), Value: []byte("1")}, {Op: kv.TxnOpGet, Collection: "c", Key: []byte("e")}},
		Else: []kv.TxnOp{{Op: kv.TxnOpDelete, Collection: "c", Key: []byte("d")}},
	})
	if err != nil {
		t.Fatal(err)
	}
	// The compares in two batches; they fail: Else runs, and reads nothing.
	want := []string{"update c/a c/d", "get c/b c/e c2/a"}
	if !slices.Equal(e.reads, want) {
		t.Fatalf("reads %q, want %q", e.reads, want)
	}

	// A run of gets in a branch is one batch, read after the writes
	// before it; the compares all pass (every key absent).
	e = &execReads{}
	if _, err := runExec(context.Background(), e, kv.ExecRequest{
		If: []kv.Compare{{Collection: "c", Key: []byte("a")}},
		Then: []kv.TxnOp{{Op: kv.TxnOpGet, Collection: "c", Key: []byte("x")}, {Op: kv.TxnOpGet, Collection: "c", Key: []byte("y")},
			{Op: kv.TxnOpPut, Collection: "c", Key: []byte("x"), Value: []byte("1")},
			{Op: kv.TxnOpGet, Collection: "c", Key: []byte("x")}, {Op: kv.TxnOpDelete, Collection: "c", Key: []byte("y")}},
	}); err != nil {
		t.Fatal(err)
	}
	want = []string{"get c/a", "get c/x c/y", "get c/x"}
	if !slices.Equal(e.reads, want) {
		t.Fatalf("reads %q, want %q", e.reads, want)
	}
}

// TestTxnWriteAfterLostForUpdateLock: a write of a key the attempt read
// for update takes no second lock; if the read's lock was lost meanwhile
// (an older transaction wounded the attempt and took it), the attempt
// cannot commit that write: its commit fails with txn_aborted, and the
// older transaction's write is what stays.
func TestTxnWriteAfterLostForUpdateLock(t *testing.T) {
	n, ctx := openRangeTxn(t)
	ref := kv.KeyRef{Collection: "c", Key: []byte("k")}
	if _, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: ref.Key, Value: []byte("0")}); err != nil {
		t.Fatal(err)
	}
	older, younger := beginOlderYounger(t, n)
	if _, _, err := n.TxnGetForUpdate(ctx, younger, ref); err != nil {
		t.Fatal(err)
	}
	// The older one wounds the younger and takes the key.
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if rec, _, err := n.TxnGetForUpdate(rctx, older, ref); err != nil || string(rec.Value) != "0" {
		t.Fatalf("the older transaction's read for update: %q %v", rec.Value, err)
	}
	// The younger one's write may be refused at once, wait for the older
	// one and then be refused, or be refused at its commit: it must not
	// commit.
	young := make(chan error, 1)
	go func() {
		err := n.TxnPut(rctx, younger, kv.PutItem{Collection: "c", Key: ref.Key, Value: []byte("young")})
		if err == nil {
			_, err = n.CommitTxn(rctx, younger)
		}
		young <- err
	}()
	if err := n.TxnPut(ctx, older, kv.PutItem{Collection: "c", Key: ref.Key, Value: []byte("old")}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.CommitTxn(ctx, older); err != nil {
		t.Fatalf("the older transaction's commit: %v", err)
	}
	if err := <-young; kv.CodeOf(err) != kv.CodeTxnAborted {
		t.Fatalf("the wounded transaction's write and commit: %v, want txn_aborted", err)
	}
	rec, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: ref.Key})
	if err != nil || string(rec.Value) != "old" {
		t.Fatalf("k reads %q (%v), want the older transaction's \"old\"", rec.Value, err)
	}
}
