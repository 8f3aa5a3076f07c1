package replication

import (
	"context"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/shard"
	"github.com/groupkv/groupkv/internal/txn"
)

type readNowResult struct {
	version uint64
	ok      bool
	err     error
}

func (e *hostEnv) readNowAsync(ctx context.Context) <-chan readNowResult {
	ch := make(chan readNowResult, 1)
	go func() {
		v, ok, err := e.h.ReadNow(ctx, []uint64{testShardID})
		ch <- readNowResult{v, ok, err}
	}()
	return ch
}

// TestHostReadNowSkipsWritesInFlight freezes the Host loop with two
// proposals handed versions but not applied, and checks that ReadNow
// answers anyway, at the version of the last applied write: below both,
// which are not acknowledged, so a read may leave them out.
func TestHostReadNowSkipsWritesInFlight(t *testing.T) {
	e := newHostEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w0, err := e.propose(ctx, putCmd("w0", "v", nil))
	if err != nil || w0.Err != nil {
		t.Fatalf("w0: %v %v", err, w0.Err)
	}

	// b0 and b1 get versions; the loop then stops in b2's TryNext, before
	// it persists them.
	g2 := newGate(t)
	e.vs.setGates(nil, nil, g2)
	e.vs.setPaused(true)
	base := e.queued()
	b0 := e.proposeAsync(ctx, putCmd("b0", "v", nil))
	b1 := e.proposeAsync(ctx, putCmd("b1", "v", nil))
	b2 := e.proposeAsync(ctx, putCmd("b2", "v", nil))
	e.waitQueued(base + 3)
	e.vs.setPaused(false)
	e.h.Signal()
	waitClosed(t, "b2 waiting for a version", g2.entered)

	var r readNowResult
	select {
	case r = <-e.readNowAsync(ctx):
	case <-time.After(10 * time.Second):
		t.Fatal("ReadNow waited for writes in flight (the loop is frozen until it returns)")
	}
	if r.err != nil || !r.ok {
		t.Fatalf("ReadNow = %d, %v, %v; want a version", r.version, r.ok, r.err)
	}
	if r.version != w0.Version {
		t.Fatalf("ReadNow = %d; want %d, the version of the last applied write", r.version, w0.Version)
	}
	g2.open()
	for i, ch := range []<-chan proposeResult{b0, b1, b2} {
		res := waitResult(t, "b", ch)
		if res.err != nil || res.res.Err != nil {
			t.Fatalf("b%d: %v %v", i, res.err, res.res.Err)
		}
		if res.res.Version <= r.version {
			t.Fatalf("b%d got version %d, at or below the read's %d", i, res.res.Version, r.version)
		}
	}

	// With nothing in flight, a second read is at the last applied write,
	// and a write after it lands above it.
	r2 := <-e.readNowAsync(ctx)
	applied := e.waitApplied(4)
	if last := applied[len(applied)-1]; !r2.ok || r2.version != last {
		t.Fatalf("ReadNow after the writes = %d, %v; want %d", r2.version, r2.ok, last)
	}
	w1, err := e.propose(ctx, putCmd("w1", "v", nil))
	if err != nil || w1.Err != nil || w1.Version <= r2.version {
		t.Fatalf("w1 after a read at %d: %d %v %v", r2.version, w1.Version, err, w1.Err)
	}
}

// TestHostReadNowPrepared checks that ReadNow declines while the shard
// holds a prepared transaction, whose commit timestamp may lie above
// every version the shard applied, and reads at or above the resolve once
// it is applied.
func TestHostReadNowPrepared(t *testing.T) {
	e := newHostEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := e.propose(ctx, putCmd("w0", "v", nil)); err != nil {
		t.Fatal(err)
	}
	term, ok := e.h.LeaderTerm(testShardID)
	if !ok {
		t.Fatal("the test shard has no ready leader")
	}
	id := txn.NewID(1, 1)
	key := []byte("t")
	prep, err := e.propose(ctx, shard.EncodeTxnPrepare(&shard.TxnPrepareCmd{Meta: txn.Meta{ID: id, Priority: 1}, LockTerm: term,
		Writes: []shard.Op{{Type: shard.OpPut, Bucket: cluster.Bucket(key), Key: key, Value: []byte("tv")}}}))
	if err != nil || prep.Err != nil {
		t.Fatalf("prepare: %v %v", err, prep.Err)
	}
	if r := <-e.readNowAsync(ctx); r.ok || r.err != nil {
		t.Fatalf("ReadNow with a prepared transaction = %d, %v, %v; want it to decline", r.version, r.ok, r.err)
	}
	// Committed above everything applied, as by a participant elsewhere
	// that prepared later.
	commitTS := prep.Version + 1000
	e.vs.mu.Lock()
	e.vs.next = max(e.vs.next, commitTS)
	e.vs.mu.Unlock()
	if res, err := e.propose(ctx, shard.EncodeTxnResolve(&shard.TxnResolveCmd{ID: id, Commit: true, CommitTS: commitTS})); err != nil || res.Err != nil {
		t.Fatalf("resolve: %v %v", err, res.Err)
	}
	r := <-e.readNowAsync(ctx)
	if !r.ok || r.err != nil {
		t.Fatalf("ReadNow after the resolve = %d, %v, %v; want a version", r.version, r.ok, r.err)
	}
	if val, v := e.read("t"); val != "tv" || v != commitTS || r.version < v {
		t.Fatalf("ReadNow = %d after the resolve; the key reads %q at %d, want tv at %d, at or below the read", r.version, val, v, commitTS)
	}
}

// TestHostFenceBelowWritesInFlight freezes the Host loop with proposals
// handed versions well above the last applied write, and checks that a
// snapshot read between the two answers at once: nothing at or below it
// is still to be applied.
func TestHostFenceBelowWritesInFlight(t *testing.T) {
	e := newHostEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w0, err := e.propose(ctx, putCmd("w0", "v", nil))
	if err != nil || w0.Err != nil {
		t.Fatalf("w0: %v %v", err, w0.Err)
	}
	g1 := newGate(t)
	e.vs.setGates(nil, g1)
	e.vs.setPaused(true)
	e.vs.mu.Lock()
	e.vs.next = w0.Version + 100
	e.vs.mu.Unlock()
	base := e.queued()
	b0 := e.proposeAsync(ctx, putCmd("b0", "v", nil))
	b1 := e.proposeAsync(ctx, putCmd("b1", "v", nil))
	e.waitQueued(base + 2)
	e.vs.setPaused(false)
	e.h.Signal()
	waitClosed(t, "b1 waiting for a version", g1.entered)

	// b0 holds version w0+101, unapplied: a read at w0+50 waits for nothing.
	ts := w0.Version + 50
	read := make(chan error, 1)
	go func() { read <- e.h.SnapshotRead(ctx, testShardID, ts) }()
	select {
	case err := <-read:
		if err != nil {
			t.Fatalf("SnapshotRead(%d): %v", ts, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("SnapshotRead(%d) waited for a write in flight above it (the loop is frozen until it returns)", ts)
	}
	g1.open()
	for i, ch := range []<-chan proposeResult{b0, b1} {
		res := waitResult(t, "b", ch)
		if res.err != nil || res.res.Err != nil {
			t.Fatalf("b%d: %v %v", i, res.err, res.res.Err)
		}
		if res.res.Version <= ts {
			t.Fatalf("b%d got version %d, at or below the snapshot read at %d", i, res.res.Version, ts)
		}
	}
}
