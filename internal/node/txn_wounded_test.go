package node

import (
	"context"
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
