package groupkv

import (
	"context"
	"sync"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
)

// Concurrent puts of a remote DB share RPCs when the connection is busy,
// as gets do (getbatch.go): up to putDirectLimit puts go out as RPCs of
// their own; a put that comes while that many are in flight waits, and
// when one of them answers, the puts waiting by then go out together in
// one independent BatchPut. A lone client (one put at a time) never
// waits.
//
// A put that shares a BatchPut is written as it alone would be: the batch
// is independent (the server writes each item by a Put of its own, at a
// version of its own, while the puts wait: linearizable each) and answers
// each item's version or the error its Put failed with. A batch carries a
// key once (a second put of the key waits for the next batch) and is
// never sent again: if the call fails as a whole, each of its puts fails
// with that error, as a put of its own failing the same way would (the
// server may have written some of them). Conditional puts, and values
// above putBatchValueMax, go alone.
//
// A put whose context ends while it waits is taken out of the queue and
// never sent; once its batch is sent, it answers its context's error, as
// a put whose RPC was sent would, and the write may still happen.
const (
	putDirectLimit = 4
	// putBatchMax bounds the items of one BatchPut (the server allows
	// kv.DefaultMaxBatchKeys).
	putBatchMax = 256
	// putBatchBytes bounds the values of one BatchPut: a batch stays far
	// below the message size limits of both sides.
	putBatchBytes = 1 << 20
	// putBatchValueMax is the largest value a coalesced put carries.
	putBatchValueMax = 64 << 10
	// putBatchTimeout bounds a BatchPut; each of its puts waits no longer
	// than its own context allows.
	putBatchTimeout = time.Minute
)

// putBatcher coalesces a remote DB's puts (see putDirectLimit): direct
// sends one put, batch an independent BatchPut and answers each item's
// version or error.
type putBatcher struct {
	direct func(context.Context, PutRequest) (uint64, error)
	batch  func(context.Context, []PutItem) ([]uint64, []error, error)

	mu       sync.Mutex
	inflight int // RPCs of puts in flight, direct or batched
	queue    []*queuedPut
}

type queuedPut struct {
	item    PutItem
	done    chan struct{}
	version uint64
	err     error
}

// coalescable reports whether req may share a BatchPut.
func coalescable(req PutRequest) bool {
	return req.IfVersion == nil && len(req.Value) <= putBatchValueMax
}

// put writes req alone (direct) or as part of a batch.
func (b *putBatcher) put(ctx context.Context, req PutRequest) (uint64, error) {
	b.mu.Lock()
	if b.inflight < putDirectLimit || !coalescable(req) {
		b.inflight++
		b.mu.Unlock()
		v, err := b.direct(ctx, req)
		b.release()
		return v, err
	}
	q := &queuedPut{item: PutItem{Collection: req.Collection, Key: req.Key, Value: req.Value, Tags: req.Tags}, done: make(chan struct{})}
	b.queue = append(b.queue, q)
	b.mu.Unlock()
	select {
	case <-q.done:
		return q.version, q.err
	case <-ctx.Done():
	}
	b.mu.Lock()
	for i, w := range b.queue {
		if w == q {
			// Not sent: it never will be.
			b.queue = append(b.queue[:i:i], b.queue[i+1:]...)
			b.mu.Unlock()
			return 0, ctx.Err()
		}
	}
	b.mu.Unlock()
	return 0, ctx.Err()
}

// release ends an RPC of puts: if puts wait, it sends a batch of them (in
// the background, keeping the RPC's place in flight); else the place is
// freed.
func (b *putBatcher) release() {
	b.mu.Lock()
	if len(b.queue) == 0 {
		b.inflight--
		b.mu.Unlock()
		return
	}
	puts := b.take()
	b.mu.Unlock()
	go func() {
		b.send(puts)
		b.release()
	}()
}

// take removes from the queue the puts of the next batch, oldest first: at
// most putBatchMax of them and putBatchBytes of values (at least one), and
// each key once. b.mu is held.
func (b *putBatcher) take() []*queuedPut {
	var (
		puts  []*queuedPut
		left  []*queuedPut
		bytes int
		keys  = make(map[string]bool)
	)
	for _, q := range b.queue {
		id := q.item.Collection + "\x00" + string(q.item.Key)
		full := len(puts) >= putBatchMax || (len(puts) > 0 && bytes+len(q.item.Value) > putBatchBytes)
		if full || keys[id] {
			left = append(left, q)
			continue
		}
		keys[id] = true
		bytes += len(q.item.Value)
		puts = append(puts, q)
	}
	b.queue = left
	return puts
}

// send writes puts in one BatchPut and answers each.
func (b *putBatcher) send(puts []*queuedPut) {
	items := make([]PutItem, len(puts))
	for i, q := range puts {
		items[i] = q.item
	}
	ctx, cancel := context.WithTimeout(context.Background(), putBatchTimeout)
	versions, errs, err := b.batch(ctx, items)
	cancel()
	if err == nil && (len(versions) != len(puts) || len(errs) != len(puts)) {
		err = kv.Errorf(kv.CodeInternal, "a batch put of %d items answered %d", len(puts), len(versions))
	}
	for i, q := range puts {
		if err != nil {
			q.err = err
		} else {
			q.version, q.err = versions[i], errs[i]
		}
		close(q.done)
	}
}
