package node

import (
	"context"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/txn"
)

// TestTxnRetryOnAnotherNodeWaitsForWounder: an attempt coordinated by node
// 1 is wounded by an older transaction coordinated by node 2; its client
// retries it (retry_of) through node 3. The retry learns the wounder from
// node 1, waits until the wounder's transaction has ended before it
// begins, and links itself to the attempt it retries, as a retry on node
// 1 would: so one transaction wounds another at most once whichever node
// a client's requests reach.
func TestTxnRetryOnAnotherNodeWaitsForWounder(t *testing.T) {
	c := startCluster(t, 3, func(o *Options) { o.TxnTimeout = 2 * time.Second })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c.createTxnCollections(ctx)
	n1, n2, n3 := c.node(1).n, c.node(2).n, c.node(3).n
	k := kv.KeyRef{Collection: "h", Key: []byte("hot")}

	older, err := n2.BeginTxn(ctx, kv.TxnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	younger, err := n1.BeginTxn(ctx, kv.TxnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := n1.TxnPut(ctx, younger, kv.PutItem{Collection: "h", Key: k.Key, Value: []byte("younger")}); err != nil {
		t.Fatal(err)
	}
	// The older one takes the key's lock: it wounds the younger holder.
	if err := n2.TxnPut(ctx, older, kv.PutItem{Collection: "h", Key: k.Key, Value: []byte("older")}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := n1.TxnGet(ctx, younger, kv.KeyRef{Collection: "h", Key: []byte("other")}); kv.CodeOf(err) != kv.CodeTxnAborted {
		t.Fatalf("the wounded attempt read on: %v, want txn_aborted", err)
	}
	n1.AbortTxn(ctx, younger)

	type begun struct {
		id  string
		err error
	}
	retried := make(chan begun, 1)
	go func() {
		id, err := n3.BeginTxn(ctx, kv.TxnOptions{RetryOf: younger})
		retried <- begun{id, err}
	}()
	// Not a timing assertion: however long it takes, the retry must not
	// begin while its wounder runs.
	select {
	case b := <-retried:
		t.Fatalf("the retry began (%s, %v) while the transaction that wounded its previous attempt still ran", b.id, b.err)
	case <-time.After(300 * time.Millisecond):
	}
	if _, err := n2.CommitTxn(ctx, older); err != nil {
		t.Fatal(err)
	}
	var b begun
	select {
	case b = <-retried:
	case <-time.After(30 * time.Second): // only catches a hang
		t.Fatal("the retry did not begin 30 s after its wounder committed")
	}
	if b.err != nil {
		t.Fatal(b.err)
	}
	p0, a0, _ := txn.ParseID(younger)
	if p, a, _ := txn.ParseID(b.id); p != p0 || a != a0+1 {
		t.Fatalf("retry %s: priority %d attempt %d, want %d and %d", b.id, p, a, p0, a0+1)
	}
	// The attempt it retries links it, in the record node 1's attempt left.
	n3.txns.mu.Lock()
	s := n3.txns.m[b.id]
	n3.txns.mu.Unlock()
	if s == nil {
		t.Fatalf("node 3 does not coordinate the retry %s", b.id)
	}
	rec, err := n3.readRecord(ctx, &txn.Meta{ID: younger, Anchor: s.meta.Anchor})
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != txn.Aborted || rec.RetriedAs == nil || rec.RetriedAs.ID != b.id {
		t.Fatalf("the record of %s: %+v, want ABORTED and retried as %s", younger, rec, b.id)
	}
	// The retry runs and commits like any attempt.
	if err := n3.TxnPut(ctx, b.id, kv.PutItem{Collection: "h", Key: k.Key, Value: []byte("retry")}); err != nil {
		t.Fatal(err)
	}
	if _, err := n3.CommitTxn(ctx, b.id); err != nil {
		t.Fatal(err)
	}
	if r, err := n1.Get(ctx, kv.GetRequest{Collection: "h", Key: k.Key}); err != nil || string(r.Value) != "retry" {
		t.Fatalf("after the retry committed: %q, %v", r.Value, err)
	}
}
