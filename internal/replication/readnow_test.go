package replication

import (
	"context"
	"fmt"
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

// freezeInFlight queues n puts, b0 to b(n-1), and lets the Host loop hand
// versions to all but the last, in whose TryNext it stops: n-1 proposals
// hold versions, none is persisted. With skip, the versions start that far
// above the last one handed out. The gate returned lets the loop go on.
func (e *hostEnv) freezeInFlight(t *testing.T, ctx context.Context, n int, skip uint64) ([]<-chan proposeResult, *versionGate) {
	t.Helper()
	gate := newGate(t)
	gates := make([]*versionGate, n)
	gates[n-1] = gate
	e.vs.setGates(gates...)
	e.vs.setPaused(true)
	e.vs.mu.Lock()
	e.vs.next += skip
	e.vs.mu.Unlock()
	base := e.queued()
	results := make([]<-chan proposeResult, n)
	for i := range results {
		results[i] = e.proposeAsync(ctx, putCmd(fmt.Sprint("b", i), "v", nil))
		e.waitQueued(base + uint64(i) + 1) // queued, and so versioned, in order
	}
	e.vs.setPaused(false)
	e.h.Signal()
	waitClosed(t, "the last proposal waiting for a version", gate.entered)
	return results, gate
}

// thawAbove lets the loop frozen by freezeInFlight go on and checks that
// every proposal it held was applied at a version above read, the version
// of a read served meanwhile.
func thawAbove(t *testing.T, gate *versionGate, results []<-chan proposeResult, read uint64) {
	t.Helper()
	gate.open()
	for i, ch := range results {
		res := waitResult(t, fmt.Sprint("b", i), ch)
		if res.err != nil || res.res.Err != nil {
			t.Fatalf("b%d: %v %v", i, res.err, res.res.Err)
		}
		if res.res.Version <= read {
			t.Fatalf("b%d got version %d, at or below the read at %d served while it was in flight", i, res.res.Version, read)
		}
	}
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
	bs, g2 := e.freezeInFlight(t, ctx, 3, 0)

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
	thawAbove(t, g2, bs, r.version)

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
	bs, g1 := e.freezeInFlight(t, ctx, 2, 100)

	// b0 holds a version above w0+100, unapplied: a read at w0+50 waits
	// for nothing.
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
	thawAbove(t, g1, bs, ts)
}
