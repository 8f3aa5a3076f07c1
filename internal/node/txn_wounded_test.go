package node

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
)

// TestTxnWoundedStopsWaiting: an attempt wounded by an older transaction
// is told so by its next lock request instead of waiting for a lock it
// could not use: at once in the shard where it was wounded, and at the
// next look at its own record in another shard (every TxnCheckInterval).
// The older transaction, never waited out, commits.
func TestTxnWoundedStopsWaiting(t *testing.T) {
	n := openTest(t, t.TempDir(), Options{Logger: quietLogger(), TickInterval: 20 * time.Millisecond,
		TxnCheckInterval: 20 * time.Millisecond})
	t.Cleanup(func() { n.Close() })
	ctx := context.Background()
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "c", Partitioning: kv.PartitionRange,
		SplitPoints: [][]byte{[]byte("m")}}); err != nil {
		t.Fatal(err)
	}
	ref := func(k string) kv.KeyRef { return kv.KeyRef{Collection: "c", Key: []byte(k)} }
	for _, sameShard := range []bool{true, false} {
		older, younger := beginOlderYounger(t, n)
		// The older one holds z (the other shard) for update.
		if _, _, err := n.TxnGetForUpdate(ctx, older, ref("z")); err != nil {
			t.Fatal(err)
		}
		if _, _, err := n.TxnGet(ctx, younger, ref("a")); err != nil {
			t.Fatal(err)
		}
		// The older one's write of a wounds the younger one.
		if err := n.TxnPut(ctx, older, kv.PutItem{Collection: "c", Key: []byte("a"), Value: []byte("older")}); err != nil {
			t.Fatal(err)
		}
		next := "a" // the shard it was wounded in
		if !sameShard {
			next = "z"
		}
		// A generous deadline that only catches a wait for the older
		// transaction's end, which never comes before this answers.
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		_, _, err := n.TxnGetForUpdate(wctx, younger, ref(next))
		cancel()
		if kv.CodeOf(err) != kv.CodeTxnAborted {
			t.Fatalf("same shard %v: the wounded attempt's get of %s answered %v, want txn_aborted", sameShard, next, err)
		}
		if _, err := n.CommitTxn(ctx, older); err != nil {
			t.Fatalf("same shard %v: the older transaction did not commit: %v", sameShard, err)
		}
		if _, err := n.CommitTxn(ctx, younger); kv.CodeOf(err) != kv.CodeTxnAborted {
			t.Fatalf("same shard %v: the wounded attempt's commit answered %v, want txn_aborted", sameShard, err)
		}
	}
}

// TestTxnAbortDoesNotWait: an abort of an attempt whose get waits for a
// lock answers without waiting for the lock's holder, and the get answers
// txn_aborted; the holder commits.
func TestTxnAbortDoesNotWait(t *testing.T) {
	n := openTest(t, t.TempDir(), Options{Logger: quietLogger(), TickInterval: 20 * time.Millisecond})
	t.Cleanup(func() { n.Close() })
	ctx := context.Background()
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "c", Partitioning: kv.PartitionRange}); err != nil {
		t.Fatal(err)
	}
	ref := kv.KeyRef{Collection: "c", Key: []byte("k")}
	older, younger := beginOlderYounger(t, n)
	if _, _, err := n.TxnGetForUpdate(ctx, older, ref); err != nil {
		t.Fatal(err)
	}
	// A generous deadline that only catches a wait for the holder's end.
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	got := make(chan error, 1)
	go func() {
		_, _, err := n.TxnGet(wctx, younger, ref)
		got <- err
	}()
	d, err := n.collection("c")
	if err != nil {
		t.Fatal(err)
	}
	_, id := n.route(d, ref.Key)
	for !n.lockTable(id).Waiting(younger) {
		select {
		case err := <-got:
			t.Fatalf("the younger attempt's get answered %v without waiting", err)
		case <-wctx.Done():
			t.Fatal("the younger attempt's get never waited")
		case <-time.After(time.Millisecond):
		}
	}
	if err := n.AbortTxn(wctx, younger); err != nil {
		t.Fatal(err)
	}
	if err := <-got; kv.CodeOf(err) != kv.CodeTxnAborted {
		t.Fatalf("the aborted attempt's get answered %v, want txn_aborted", err)
	}
	if wctx.Err() != nil {
		t.Fatal("the abort waited for the holder")
	}
	if _, err := n.CommitTxn(ctx, older); err != nil {
		t.Fatalf("the holder did not commit: %v", err)
	}
}

// TestOperationsRefuseEndedContext: an operation whose context ended
// before it began does nothing and answers the context's error.
func TestOperationsRefuseEndedContext(t *testing.T) {
	n := openTest(t, t.TempDir(), Options{Logger: quietLogger(), TickInterval: 20 * time.Millisecond})
	t.Cleanup(func() { n.Close() })
	ctx := context.Background()
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "c"}); err != nil {
		t.Fatal(err)
	}
	ended, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := n.Put(ended, kv.PutRequest{Collection: "c", Key: []byte("k"), Value: []byte("v")}); !errors.Is(err, context.Canceled) || kv.CodeOf(err) != kv.CodeUnavailable {
		t.Fatalf("a put with an ended context answered %v", err)
	}
	if _, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte("k")}); kv.CodeOf(err) != kv.CodeNotFound {
		t.Fatalf("the refused put wrote: get answered %v", err)
	}
	if _, err := n.Get(ended, kv.GetRequest{Collection: "c", Key: []byte("k")}); !errors.Is(err, context.Canceled) {
		t.Fatalf("a get with an ended context answered %v", err)
	}
	if _, err := n.BeginTxn(ended, kv.TxnOptions{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("a begin with an ended context answered %v", err)
	}
}
