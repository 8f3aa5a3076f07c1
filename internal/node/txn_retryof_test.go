package node

import (
	"context"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
)

// TestTxnRetryOf: a new attempt that retries one (retry_of) ends it first:
// an attempt still under way is aborted, so that the two never both
// commit; one that committed refuses the retry. Two retries of one
// attempt, writing each other's keys crosswise, do not wait for each
// other: one wounds the other, which is refused at its next lock.
func TestTxnRetryOf(t *testing.T) {
	n := openTest(t, t.TempDir(), Options{Logger: quietLogger(), TickInterval: 20 * time.Millisecond})
	t.Cleanup(func() { n.Close() })
	ctx := context.Background()
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "c", Partitioning: kv.PartitionRange}); err != nil {
		t.Fatal(err)
	}
	put := func(id, k string) error {
		return n.TxnPut(ctx, id, kv.PutItem{Collection: "c", Key: []byte(k), Value: []byte(id)})
	}
	get := func(k string) string {
		t.Helper()
		r, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte(k)})
		if kv.CodeOf(err) == kv.CodeNotFound {
			return ""
		}
		if err != nil {
			t.Fatal(err)
		}
		return string(r.Value)
	}

	// A retry of an attempt under way.
	live, err := n.BeginTxn(ctx, kv.TxnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := put(live, "a"); err != nil {
		t.Fatal(err)
	}
	retry, err := n.BeginTxn(ctx, kv.TxnOptions{RetryOf: live})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.CommitTxn(ctx, live); kv.CodeOf(err) != kv.CodeTxnAborted {
		t.Fatalf("the commit of an attempt retried answered %v, want txn_aborted", err)
	}
	if err := put(retry, "b"); err != nil {
		t.Fatal(err)
	}
	v, err := n.CommitTxn(ctx, retry)
	if err != nil {
		t.Fatal(err)
	}
	if a, b := get("a"), get("b"); a != "" || b != retry {
		t.Fatalf("after the retry committed: a = %q (want absent), b = %q (want %q)", a, b, retry)
	}

	// A retry of an attempt that committed.
	if _, err := n.BeginTxn(ctx, kv.TxnOptions{RetryOf: retry}); kv.CodeOf(err) != kv.CodeInvalidArgument {
		t.Fatalf("a retry of an attempt committed at %d answered %v, want invalid_argument", v, err)
	}

	// Two retries of one aborted attempt, crosswise.
	ab, err := n.BeginTxn(ctx, kv.TxnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.AbortTxn(ctx, ab); err != nil {
		t.Fatal(err)
	}
	r1, err := n.BeginTxn(ctx, kv.TxnOptions{RetryOf: ab})
	if err != nil {
		t.Fatal(err)
	}
	r2, err := n.BeginTxn(ctx, kv.TxnOptions{RetryOf: ab})
	if err != nil {
		t.Fatal(err)
	}
	if err := put(r1, "d1"); err != nil {
		t.Fatal(err)
	}
	if err := put(r2, "d2"); err != nil {
		t.Fatal(err)
	}
	// Neither commits before both crosswise puts answered: a put that
	// waited for the other's end would hang until the deadline, which
	// only catches that.
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	crossed := make(chan error, 2)
	for _, c := range []struct{ id, key string }{{r1, "d2"}, {r2, "d1"}} {
		go func() {
			crossed <- n.TxnPut(wctx, c.id, kv.PutItem{Collection: "c", Key: []byte(c.key), Value: []byte(c.id)})
		}()
	}
	var aborted int
	for range 2 {
		switch err := <-crossed; {
		case err == nil:
		case kv.CodeOf(err) == kv.CodeTxnAborted:
			aborted++
		default:
			t.Fatalf("a crosswise put answered %v", err)
		}
	}
	if aborted != 1 {
		t.Fatalf("%d of the crosswise puts answered txn_aborted, want 1 (one retry wounds the other)", aborted)
	}
	var committed []string
	for _, id := range []string{r1, r2} {
		if _, err := n.CommitTxn(ctx, id); err == nil {
			committed = append(committed, id)
		} else if kv.CodeOf(err) != kv.CodeTxnAborted {
			t.Fatal(err)
		}
	}
	if len(committed) != 1 {
		t.Fatalf("%d of the two retries committed, want 1", len(committed))
	}
	if d1, d2 := get("d1"), get("d2"); d1 != committed[0] || d2 != committed[0] {
		t.Fatalf("d1 = %q, d2 = %q: want both written by %s", d1, d2, committed[0])
	}
}
