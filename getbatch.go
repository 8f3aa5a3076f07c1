package groupkv

import (
	"bytes"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
)

// Against a server without Pipeline (api.PipelineClient), concurrent gets of a
// remote DB share RPCs when the connection is busy:
// up to getDirectLimit gets go out as RPCs of their own; a get that comes
// while that many are in flight waits, and when one of them answers, the
// gets waiting by then go out together in one BatchGet. A lone client
// (one get at a time) never waits; a loaded one sends fewer, larger RPCs,
// which is where the cost of a get is (its RPC, not its read: a node
// reads a key in a few microseconds and answers an RPC in tens).
//
// A get that shares a BatchGet answers what it alone would: the batch is
// independent (the server reads each key as a Get of its own, after the
// gets were asked and before they are answered: linearizable, as a get
// is; a server too old for the flag reads them at one version, which is
// linearizable too); a key not found is ErrNotFound. If the batch fails as
// a whole (one key of an unknown collection fails it), each of its gets is
// sent alone, so each gets its own answer. Gets of an older version
// (GetRequest.Version) go alone.
const (
	getDirectLimit = 4
	// getBatchMax bounds the keys of one BatchGet (the server allows
	// kv.DefaultMaxBatchKeys).
	getBatchMax = 256
	// getBatchTimeout bounds a BatchGet; each of its gets waits no longer
	// than its own context allows.
	getBatchTimeout = time.Minute
)

// getBatcher coalesces a remote DB's gets (see getDirectLimit): direct
// sends one get, batch an independent BatchGet.
type getBatcher struct {
	direct func(context.Context, GetRequest) (Record, error)
	batch  func(context.Context, []KeyRef) (BatchGetResult, error)

	mu       sync.Mutex
	inflight int // RPCs of gets in flight, direct or batched
	queue    []*queuedGet
}

type queuedGet struct {
	ref  kv.KeyRef
	done chan struct{}
	rec  Record
	err  error
	// alone: the batch failed; the get goes on its own.
	alone bool
}

// get answers req alone (direct) or as part of a batch.
func (b *getBatcher) get(ctx context.Context, req GetRequest) (Record, error) {
	b.mu.Lock()
	if b.inflight < getDirectLimit {
		b.inflight++
		b.mu.Unlock()
		rec, err := b.direct(ctx, req)
		b.release()
		return rec, err
	}
	q := &queuedGet{ref: KeyRef{Collection: req.Collection, Key: req.Key}, done: make(chan struct{})}
	b.queue = append(b.queue, q)
	b.mu.Unlock()
	select {
	case <-q.done:
	case <-ctx.Done():
		// Left behind: the batch answers no one when it comes.
		return b.direct(ctx, req) // fails at once with the context's error
	}
	if q.alone {
		return b.direct(ctx, req)
	}
	return q.rec, q.err
}

// release ends an RPC of gets: if gets wait, it sends them in one BatchGet
// (in the background, keeping the RPC's place in flight); else the place
// is freed.
func (b *getBatcher) release() {
	b.mu.Lock()
	if len(b.queue) == 0 {
		b.inflight--
		b.mu.Unlock()
		return
	}
	n := min(len(b.queue), getBatchMax)
	gets := b.queue[:n:n]
	b.queue = append([]*queuedGet(nil), b.queue[n:]...)
	b.mu.Unlock()
	go func() {
		b.send(gets)
		b.release()
	}()
}

// send asks for gets in one BatchGet and answers each.
func (b *getBatcher) send(gets []*queuedGet) {
	// One key once: duplicates share its item.
	index := make(map[string]int, len(gets))
	keys := make([]KeyRef, 0, len(gets))
	at := make([]int, len(gets))
	for i, q := range gets {
		id := q.ref.Collection + "\x00" + string(q.ref.Key)
		j, ok := index[id]
		if !ok {
			j = len(keys)
			index[id] = j
			keys = append(keys, q.ref)
		}
		at[i] = j
	}
	ctx, cancel := context.WithTimeout(context.Background(), getBatchTimeout)
	res, err := b.batch(ctx, keys)
	cancel()
	if err == nil && len(res.Items) != len(keys) {
		err = kv.Errorf(kv.CodeInternal, "a batch get of %d keys answered %d", len(keys), len(res.Items))
	}
	used := make([]bool, len(keys))
	for i, q := range gets {
		switch {
		case err != nil:
			q.alone = true
		case !res.Items[at[i]].Found:
			q.err = kv.Errorf(kv.CodeNotFound, "key %q not found", q.ref.Key)
		default:
			it := res.Items[at[i]]
			if used[at[i]] {
				// Each caller its own value.
				it.Value, it.Tags = bytes.Clone(it.Value), slices.Clone(it.Tags)
			}
			used[at[i]] = true
			q.rec = Record{Key: q.ref.Key, Value: it.Value, Tags: it.Tags, Version: it.Version}
		}
	}
	// Only now: the copies above read values a woken caller may change.
	for _, q := range gets {
		close(q.done)
	}
}
