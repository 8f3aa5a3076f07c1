package node

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
)

// putOutcome records the calls of a PutAsync callback.
type putOutcome struct {
	calls atomic.Int32
	ch    chan asyncPut
}

type asyncPut struct {
	version uint64
	err     error
}

func newPutOutcome() *putOutcome { return &putOutcome{ch: make(chan asyncPut, 2)} }

func (o *putOutcome) done(v uint64, err error) {
	o.calls.Add(1)
	o.ch <- asyncPut{v, err}
}

func (o *putOutcome) wait(t *testing.T, what string) asyncPut {
	t.Helper()
	select {
	case r := <-o.ch:
		return r
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: no answer after 20s", what)
		return asyncPut{}
	}
}

// TestPutAsync: a put PutAsync takes (a delete DeleteAsync takes) is
// answered as Put (Delete) answers it — the version it is read at, the
// error of a failed condition or of an absent key — once; a request it
// does not take (bad input, a tag collection, a shard where a transaction
// holds a lock) starts nothing, for Put to serve.
func TestPutAsync(t *testing.T) {
	n := mtOpen(t, t.TempDir(), Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	mtCreate(t, n, kv.CollectionOptions{Name: "h", Shards: 1})
	mtCreate(t, n, kv.CollectionOptions{Name: "t", Partitioning: kv.PartitionTag, Shards: 1})

	o := newPutOutcome()
	if !n.PutAsync(ctx, kv.PutRequest{Collection: "h", Key: []byte("a"), Value: []byte("1")}, o.done) {
		t.Fatal("PutAsync did not take a put of a hash collection led here")
	}
	r := o.wait(t, "put a")
	if r.err != nil || r.version == 0 {
		t.Fatalf("put a answered version %d, %v", r.version, r.err)
	}
	rec, err := n.Get(ctx, kv.GetRequest{Collection: "h", Key: []byte("a")})
	if err != nil || string(rec.Value) != "1" || rec.Version != r.version {
		t.Fatalf("a reads %q at version %d (%v), answered version %d", rec.Value, rec.Version, err, r.version)
	}

	// A failed condition: the code Put gives.
	wrong := r.version + 5
	o2 := newPutOutcome()
	if !n.PutAsync(ctx, kv.PutRequest{Collection: "h", Key: []byte("a"), Value: []byte("2"), IfVersion: &wrong}, o2.done) {
		t.Fatal("PutAsync did not take a conditional put")
	}
	if r2 := o2.wait(t, "conditional put"); kv.CodeOf(r2.err) != kv.CodeConditionFailed {
		t.Fatalf("a put on a wrong condition answered %d, %v; want condition failed", r2.version, r2.err)
	}
	if _, err := n.Put(ctx, kv.PutRequest{Collection: "h", Key: []byte("a"), Value: []byte("2"), IfVersion: &wrong}); kv.CodeOf(err) != kv.CodeConditionFailed {
		t.Fatalf("Put on the same condition: %v", err)
	}

	refused := func(what string, req kv.PutRequest) {
		t.Helper()
		o := newPutOutcome()
		if n.PutAsync(ctx, req, o.done) {
			t.Fatalf("PutAsync took %s", what)
		}
		select {
		case r := <-o.ch:
			t.Fatalf("PutAsync refused %s and answered it too: %+v", what, r)
		case <-time.After(10 * time.Millisecond):
		}
	}
	refused("an empty key", kv.PutRequest{Collection: "h", Value: []byte("1")})
	refused("a missing collection", kv.PutRequest{Collection: "nope", Key: []byte("a"), Value: []byte("1")})
	refused("a value over the limit", kv.PutRequest{Collection: "h", Key: []byte("a"), Value: make([]byte, n.opts.MaxValueSize+1)})
	refused("a put of a tag collection", kv.PutRequest{Collection: "t", Key: []byte("a"), Value: []byte("1"), Tags: []string{"x"}})

	// A transaction's lock in the shard: Put waits for it, PutAsync does
	// not take the put.
	id, err := n.BeginTxn(ctx, kv.TxnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.TxnPut(ctx, id, kv.PutItem{Collection: "h", Key: []byte("x"), Value: []byte("t")}); err != nil {
		t.Fatal(err)
	}
	refused("a put in a shard where a transaction holds a lock", kv.PutRequest{Collection: "h", Key: []byte("y"), Value: []byte("1")})
	if err := n.AbortTxn(ctx, id); err != nil {
		t.Fatal(err)
	}
	o3 := newPutOutcome()
	if !n.PutAsync(ctx, kv.PutRequest{Collection: "h", Key: []byte("y"), Value: []byte("1")}, o3.done) {
		t.Fatal("PutAsync did not take a put once the transaction ended")
	}
	if r3 := o3.wait(t, "put y"); r3.err != nil {
		t.Fatal(r3.err)
	}
	// Deletes: of a key that is there, read as gone after; of one that is
	// not, not found, as Delete says.
	o4 := newPutOutcome()
	if !n.DeleteAsync(ctx, kv.DeleteRequest{Collection: "h", Key: []byte("a")}, o4.done) {
		t.Fatal("DeleteAsync did not take a delete of a hash collection led here")
	}
	if r4 := o4.wait(t, "delete a"); r4.err != nil || r4.version == 0 {
		t.Fatalf("delete a answered %d, %v", r4.version, r4.err)
	}
	if _, err := n.Get(ctx, kv.GetRequest{Collection: "h", Key: []byte("a")}); kv.CodeOf(err) != kv.CodeNotFound {
		t.Fatalf("get a after its delete: %v, want not found", err)
	}
	o5 := newPutOutcome()
	if !n.DeleteAsync(ctx, kv.DeleteRequest{Collection: "h", Key: []byte("a")}, o5.done) {
		t.Fatal("DeleteAsync did not take a delete of an absent key")
	}
	if r5 := o5.wait(t, "delete a again"); kv.CodeOf(r5.err) != kv.CodeNotFound {
		t.Fatalf("a delete of an absent key answered %d, %v; want not found", r5.version, r5.err)
	}
	if n.DeleteAsync(ctx, kv.DeleteRequest{Collection: "t", Key: []byte("a")}, newPutOutcome().done) {
		t.Fatal("DeleteAsync took a delete of a tag collection")
	}
	for _, o := range []*putOutcome{o, o2, o3, o4, o5} {
		if c := o.calls.Load(); c != 1 {
			t.Fatalf("a callback ran %d times, want once", c)
		}
	}
}

// TestPutAsyncContextEnded: a put whose context ended before it was
// applied is answered at once with commit unknown, as Put answers it,
// and once only: its proposal is still applied, and its later outcome
// not answered again.
func TestPutAsyncContextEnded(t *testing.T) {
	n := mtOpen(t, t.TempDir(), Options{})
	mtCreate(t, n, kv.CollectionOptions{Name: "h", Shards: 1})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	o := newPutOutcome()
	if !n.PutAsync(ctx, kv.PutRequest{Collection: "h", Key: []byte("a"), Value: []byte("1")}, o.done) {
		t.Fatal("PutAsync did not take the put")
	}
	if r := o.wait(t, "put a"); kv.CodeOf(r.err) != kv.CodeCommitUnknown {
		t.Fatalf("a put whose context had ended answered %d, %v; want commit unknown", r.version, r.err)
	}
	rctx, rcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer rcancel()
	for {
		rec, err := n.Get(rctx, kv.GetRequest{Collection: "h", Key: []byte("a")})
		if err == nil && string(rec.Value) == "1" {
			break
		}
		if err != nil && kv.CodeOf(err) != kv.CodeNotFound {
			t.Fatal(err)
		}
		if rctx.Err() != nil {
			t.Fatal("the put whose answer was commit unknown was never applied")
		}
		time.Sleep(time.Millisecond)
	}
	// Its proposal's outcome came after the answer: not answered again.
	time.Sleep(20 * time.Millisecond)
	if c := o.calls.Load(); c != 1 {
		t.Fatalf("the callback ran %d times, want once", c)
	}
}
