package groupkv

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
)

// batchFake answers gets and batch gets from a map; direct gets block on
// gate while it is not nil.
type batchFake struct {
	mu      sync.Mutex
	data    map[string]string
	gate    chan struct{}
	started chan struct{} // a direct get began
	batches [][]KeyRef
	fail    error // of every batch
	directs int
}

func (f *batchFake) direct(ctx context.Context, req GetRequest) (Record, error) {
	f.mu.Lock()
	f.directs++
	gate := f.gate
	f.mu.Unlock()
	if f.started != nil {
		f.started <- struct{}{}
	}
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return Record{}, kv.Errorf(kv.CodeUnavailable, "%v", ctx.Err())
		}
	}
	if err := ctx.Err(); err != nil {
		return Record{}, kv.Errorf(kv.CodeUnavailable, "%v", err)
	}
	v, ok := f.data[string(req.Key)]
	if !ok {
		return Record{}, kv.Errorf(kv.CodeNotFound, "key %q not found", req.Key)
	}
	return Record{Key: req.Key, Value: []byte(v), Version: 7}, nil
}

// batcher is a getBatcher over f.
func (f *batchFake) batcher() *getBatcher {
	return &getBatcher{direct: f.direct, batch: f.batch}
}

func (f *batchFake) batch(_ context.Context, keys []KeyRef) (BatchGetResult, error) {
	f.mu.Lock()
	f.batches = append(f.batches, keys)
	fail := f.fail
	f.mu.Unlock()
	if fail != nil {
		return BatchGetResult{}, fail
	}
	res := BatchGetResult{Version: 9}
	for _, k := range keys {
		v, ok := f.data[string(k.Key)]
		it := kv.BatchGetItem{Collection: k.Collection, Key: k.Key, Found: ok}
		if ok {
			it.Value, it.Version = []byte(v), 7
		}
		res.Items = append(res.Items, it)
	}
	return res, nil
}

// TestGetBatcherAlone: gets one at a time never wait nor batch.
func TestGetBatcherAlone(t *testing.T) {
	f := &batchFake{data: map[string]string{"a": "1"}}
	b := f.batcher()
	ctx := context.Background()
	for range 10 {
		rec, err := b.get(ctx, GetRequest{Collection: "c", Key: []byte("a")})
		if err != nil || string(rec.Value) != "1" {
			t.Fatalf("get: %q %v", rec.Value, err)
		}
	}
	if _, err := b.get(ctx, GetRequest{Collection: "c", Key: []byte("x")}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get of a missing key: %v", err)
	}
	if len(f.batches) != 0 || f.directs != 11 || b.inflight != 0 {
		t.Fatalf("%d batches, %d direct gets, %d in flight", len(f.batches), f.directs, b.inflight)
	}
}

// busy starts getDirectLimit direct gets that block until the returned
// function is called, and waits until they are in flight.
func busy(t *testing.T, b *getBatcher, f *batchFake) (release func(), wait func()) {
	t.Helper()
	f.gate, f.started = make(chan struct{}), make(chan struct{}, getDirectLimit)
	var wg sync.WaitGroup
	for range getDirectLimit {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := b.get(context.Background(), GetRequest{Collection: "c", Key: []byte("a")}); err != nil {
				t.Error(err)
			}
		}()
	}
	for range getDirectLimit {
		<-f.started
	}
	f.started = nil
	return func() { close(f.gate) }, wg.Wait
}

// queued waits until n gets wait in b's queue.
func queued(t *testing.T, b *getBatcher, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b.mu.Lock()
		q := len(b.queue)
		b.mu.Unlock()
		if q == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d gets queued, want %d", q, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestGetBatcherBatches: gets that come while getDirectLimit are in flight
// go out in one BatchGet, each key once, and each answers what a get of
// its own would: its value, its own copy of it, ErrNotFound.
func TestGetBatcherBatches(t *testing.T) {
	f := &batchFake{data: map[string]string{"a": "1", "b": "2", "c": "3"}}
	b := f.batcher()
	release, wait := busy(t, b, f)
	keys := []string{"b", "c", "b", "x", "c", "b"}
	recs := make([]Record, len(keys))
	errs := make([]error, len(keys))
	var wg sync.WaitGroup
	for i, k := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			recs[i], errs[i] = b.get(context.Background(), GetRequest{Collection: "c", Key: []byte(k)})
		}()
	}
	queued(t, b, len(keys))
	release()
	wg.Wait()
	wait()
	if len(f.batches) != 1 || len(f.batches[0]) != 3 {
		t.Fatalf("batches %v, want one of the 3 keys", f.batches)
	}
	for i, k := range keys {
		want, ok := f.data[k]
		switch {
		case !ok && !errors.Is(errs[i], ErrNotFound):
			t.Fatalf("get %d of %s: %v, want ErrNotFound", i, k, errs[i])
		case ok && (errs[i] != nil || string(recs[i].Value) != want || string(recs[i].Key) != k || recs[i].Version != 7):
			t.Fatalf("get %d of %s: %+v %v", i, k, recs[i], errs[i])
		}
	}
	recs[0].Value[0] = 'x'
	if string(recs[2].Value) != "2" || string(recs[5].Value) != "2" {
		t.Fatal("gets of one key in one batch share a value")
	}
	// The batch's place in flight is freed after it answers.
	deadline := time.Now().Add(10 * time.Second)
	for {
		b.mu.Lock()
		inflight, q := b.inflight, len(b.queue)
		b.mu.Unlock()
		if inflight == 0 && q == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after: %d in flight, %d queued", inflight, q)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestGetBatcherBatchFails: when the batch fails as a whole, each of its
// gets goes alone and answers its own result.
func TestGetBatcherBatchFails(t *testing.T) {
	f := &batchFake{data: map[string]string{"a": "1", "b": "2"}, fail: kv.Errorf(kv.CodeNotFound, "collection \"nope\" not found")}
	b := f.batcher()
	release, wait := busy(t, b, f)
	var wg sync.WaitGroup
	var got [2]error
	var rec Record
	for i, k := range []string{"b", "x"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := b.get(context.Background(), GetRequest{Collection: "c", Key: []byte(k)})
			got[i] = err
			if i == 0 {
				rec = r
			}
		}()
	}
	queued(t, b, 2)
	release()
	wg.Wait()
	wait()
	if got[0] != nil || string(rec.Value) != "2" || !errors.Is(got[1], ErrNotFound) || kv.AsError(got[1]).Message != `key "x" not found` {
		t.Fatalf("after a failed batch: %q %v, %v", rec.Value, got[0], got[1])
	}
	if len(f.batches) != 1 || f.directs != getDirectLimit+2 {
		t.Fatalf("%d batches, %d direct gets", len(f.batches), f.directs)
	}
}

// TestGetBatcherContext: a queued get whose context ends returns at once
// with the context's error.
func TestGetBatcherContext(t *testing.T) {
	f := &batchFake{data: map[string]string{"a": "1"}}
	b := f.batcher()
	release, wait := busy(t, b, f)
	defer wait()
	defer release()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := b.get(ctx, GetRequest{Collection: "c", Key: []byte("a")})
		done <- err
	}()
	queued(t, b, 1)
	cancel()
	select {
	case err := <-done:
		if kv.CodeOf(err) != kv.CodeUnavailable {
			t.Fatalf("canceled get: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a canceled get still waits for its batch")
	}
}
