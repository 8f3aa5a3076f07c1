package groupkv

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
)

// putFake writes puts into a map, each at the next version; direct puts
// block on gate while it is not nil. Items of collection "nope" fail with
// ErrCollectionNotFound.
type putFake struct {
	mu      sync.Mutex
	data    map[string]string
	version uint64
	gate    chan struct{}
	started chan struct{} // a direct put began
	batches [][]PutItem
	fail    error // of every batch
	directs []PutRequest
}

func (f *putFake) write(coll string, key, value []byte) (uint64, error) {
	if coll == "nope" {
		return 0, kv.Errorf(kv.CodeCollectionNotFound, "collection %q not found", coll)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.version++
	f.data[string(key)] = string(value)
	return f.version, nil
}

func (f *putFake) direct(ctx context.Context, req PutRequest) (uint64, error) {
	f.mu.Lock()
	f.directs = append(f.directs, req)
	gate := f.gate
	f.mu.Unlock()
	if f.started != nil {
		f.started <- struct{}{}
	}
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return f.write(req.Collection, req.Key, req.Value)
}

func (f *putFake) batch(_ context.Context, items []PutItem) ([]uint64, []error, error) {
	f.mu.Lock()
	f.batches = append(f.batches, items)
	fail := f.fail
	f.mu.Unlock()
	if fail != nil {
		return nil, nil, fail
	}
	versions, errs := make([]uint64, len(items)), make([]error, len(items))
	for i, it := range items {
		versions[i], errs[i] = f.write(it.Collection, it.Key, it.Value)
	}
	return versions, errs, nil
}

func (f *putFake) batcher() *putBatcher {
	return &putBatcher{direct: f.direct, batch: f.batch}
}

// busyPuts starts putDirectLimit direct puts (of key "busy") that block
// until the returned function is called, and waits until they are in
// flight.
func busyPuts(t *testing.T, b *putBatcher, f *putFake) (release func(), wait func()) {
	t.Helper()
	f.gate, f.started = make(chan struct{}), make(chan struct{}, putDirectLimit)
	var wg sync.WaitGroup
	for range putDirectLimit {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := b.put(context.Background(), PutRequest{Collection: "c", Key: []byte("busy"), Value: []byte("0")}); err != nil {
				t.Error(err)
			}
		}()
	}
	for range putDirectLimit {
		<-f.started
	}
	f.started = nil
	return func() { close(f.gate) }, wg.Wait
}

// queuedPuts waits until n puts wait in b's queue.
func queuedPuts(t *testing.T, b *putBatcher, n int) {
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
			t.Fatalf("%d puts queued, want %d", q, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// idle waits until b has nothing in flight nor queued.
func (b *putBatcher) idle(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b.mu.Lock()
		inflight, q := b.inflight, len(b.queue)
		b.mu.Unlock()
		if inflight == 0 && q == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d puts in flight, %d queued", inflight, q)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestPutBatcherAlone: puts one at a time never wait nor batch.
func TestPutBatcherAlone(t *testing.T) {
	f := &putFake{data: map[string]string{}}
	b := f.batcher()
	for i := range 10 {
		v, err := b.put(context.Background(), PutRequest{Collection: "c", Key: []byte("a"), Value: []byte(fmt.Sprint(i))})
		if err != nil || v != uint64(i+1) {
			t.Fatalf("put %d: version %d, %v", i, v, err)
		}
	}
	if len(f.batches) != 0 || len(f.directs) != 10 || f.data["a"] != "9" {
		t.Fatalf("%d batches, %d direct puts, a = %q", len(f.batches), len(f.directs), f.data["a"])
	}
	b.idle(t)
}

// TestPutBatcherBatches: puts that come while putDirectLimit are in flight
// go out in independent batches, each key at most once per batch (a second
// put of a key goes in a later batch; the key ends with the value of the
// put answered with the highest version), each put answering its own
// version or error; a conditional put and a large value go alone at once.
func TestPutBatcherBatches(t *testing.T) {
	f := &putFake{data: map[string]string{}}
	b := f.batcher()
	release, wait := busyPuts(t, b, f)
	type put struct {
		coll, key string
		value     []byte
	}
	puts := []put{{"c", "a", []byte("a1")}, {"c", "b", []byte("b1")}, {"c", "a", []byte("a2")}, {"nope", "x", []byte("x")}, {"c", "a", []byte("a3")}, {"c", "d", []byte("d1")}}
	versions := make([]uint64, len(puts))
	errs := make([]error, len(puts))
	var wg sync.WaitGroup
	for i, p := range puts {
		// One after the other, so that the queue holds them in order.
		wg.Add(1)
		go func() {
			defer wg.Done()
			versions[i], errs[i] = b.put(context.Background(), PutRequest{Collection: p.coll, Key: []byte(p.key), Value: p.value})
		}()
		queuedPuts(t, b, i+1)
	}
	// These two go out at once, beside the busy ones, not queued.
	zero := uint64(0)
	for i, req := range []PutRequest{
		{Collection: "c", Key: []byte("cond"), Value: []byte("1"), IfVersion: &zero},
		{Collection: "c", Key: []byte("large"), Value: make([]byte, putBatchValueMax+1)},
	} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := b.put(context.Background(), req); err != nil {
				t.Error(err)
			}
		}()
		deadline := time.Now().Add(10 * time.Second)
		for {
			f.mu.Lock()
			n := len(f.directs)
			f.mu.Unlock()
			if n == putDirectLimit+i+1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("put of %s did not go out alone", req.Key)
			}
			time.Sleep(time.Millisecond)
		}
		queuedPuts(t, b, len(puts))
	}
	release()
	wg.Wait()
	wait()
	b.idle(t)
	for _, batch := range f.batches {
		seen := map[string]bool{}
		for _, it := range batch {
			if seen[it.Collection+"/"+string(it.Key)] {
				t.Fatalf("batch %v has key %s twice", batch, it.Key)
			}
			seen[it.Collection+"/"+string(it.Key)] = true
		}
	}
	if len(f.batches) != 3 {
		t.Fatalf("%d batches (%v), want 3 (a is put three times)", len(f.batches), f.batches)
	}
	for i, p := range puts {
		if p.coll == "nope" {
			if !errors.Is(errs[i], ErrCollectionNotFound) || versions[i] != 0 {
				t.Fatalf("put %d in an unknown collection: %d, %v", i, versions[i], errs[i])
			}
			continue
		}
		if errs[i] != nil || versions[i] == 0 {
			t.Fatalf("put %d of %s: %d, %v", i, p.key, versions[i], errs[i])
		}
	}
	// The three puts of a were in flight together, so any order is theirs;
	// a holds the value of the one answered with the highest version.
	last := 0
	for _, i := range []int{2, 4} {
		if versions[i] > versions[last] {
			last = i
		}
	}
	if f.data["a"] != string(puts[last].value) || f.data["b"] != "b1" || f.data["d"] != "d1" {
		t.Fatalf("versions %v; a = %q, b = %q, d = %q", versions, f.data["a"], f.data["b"], f.data["d"])
	}
	if len(f.directs) != putDirectLimit+2 {
		t.Fatalf("%d direct puts, want %d", len(f.directs), putDirectLimit+2)
	}
}

// TestPutBatcherBatchFails: when the batch fails as a whole, each of its
// puts answers that error, and none is sent again (the server may have
// written it).
func TestPutBatcherBatchFails(t *testing.T) {
	f := &putFake{data: map[string]string{}, fail: kv.Errorf(kv.CodeCommitUnknown, "the connection broke")}
	b := f.batcher()
	release, wait := busyPuts(t, b, f)
	var wg sync.WaitGroup
	var got [2]error
	for i, k := range []string{"a", "b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, got[i] = b.put(context.Background(), PutRequest{Collection: "c", Key: []byte(k), Value: []byte("1")})
		}()
	}
	queuedPuts(t, b, 2)
	release()
	wg.Wait()
	wait()
	b.idle(t)
	for i, err := range got {
		if kv.CodeOf(err) != kv.CodeCommitUnknown {
			t.Fatalf("put %d after a failed batch: %v", i, err)
		}
	}
	if len(f.batches) != 1 || len(f.directs) != putDirectLimit {
		t.Fatalf("%d batches, %d direct puts", len(f.batches), len(f.directs))
	}
}

// TestPutBatcherContext: a queued put whose context ends returns at once
// with the context's error and is never sent.
func TestPutBatcherContext(t *testing.T) {
	f := &putFake{data: map[string]string{}}
	b := f.batcher()
	release, wait := busyPuts(t, b, f)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := b.put(ctx, PutRequest{Collection: "c", Key: []byte("a"), Value: []byte("1")})
		done <- err
	}()
	queuedPuts(t, b, 1)
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("canceled put: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a canceled put still waits for its batch")
	}
	release()
	wait()
	b.idle(t)
	if _, ok := f.data["a"]; ok || len(f.batches) != 0 {
		t.Fatalf("a canceled put was sent: %d batches, data %v", len(f.batches), f.data)
	}
}
