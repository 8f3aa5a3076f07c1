package api_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/api"
	"github.com/groupkv/groupkv/internal/kv"
)

// asyncFake is a grpcFake that starts the puts and deletes of collection
// "async" with PutAsync and DeleteAsync and answers them only when the
// test calls answerAll, from the test's goroutine (as a raft loop answers
// them); it refuses the others, which Put and Delete then serve.
type asyncFake struct {
	*grpcFake
	mu      sync.Mutex
	pending []func()
	started chan string
}

func newAsyncFake() *asyncFake {
	return &asyncFake{grpcFake: newGRPCFake(), started: make(chan string, 64)}
}

func (f *asyncFake) PutAsync(ctx context.Context, req kv.PutRequest, done func(uint64, error)) bool {
	if req.Collection != "async" {
		return false
	}
	req.Collection = "c"
	f.mu.Lock()
	f.pending = append(f.pending, func() { done(f.grpcFake.Put(ctx, req)) })
	f.mu.Unlock()
	f.started <- string(req.Key)
	return true
}

func (f *asyncFake) DeleteAsync(ctx context.Context, req kv.DeleteRequest, done func(uint64, error)) bool {
	if req.Collection != "async" {
		return false
	}
	req.Collection = "c"
	f.mu.Lock()
	f.pending = append(f.pending, func() { done(f.grpcFake.Delete(ctx, req)) })
	f.mu.Unlock()
	f.started <- "delete " + string(req.Key)
	return true
}

// answerAll answers every write started, on the caller's goroutine.
func (f *asyncFake) answerAll() {
	f.mu.Lock()
	p := f.pending
	f.pending = nil
	f.mu.Unlock()
	for _, answer := range p {
		answer()
	}
}

// TestGRPCPipelineAsyncPuts: puts a backend starts with PutAsync hold
// nothing up while they wait (other requests on the stream are answered),
// and each is answered with its own outcome once the backend calls back,
// from a goroutine of its own; a put it refuses is served by Put.
func TestGRPCPipelineAsyncPuts(t *testing.T) {
	ctx := context.Background()
	f := newAsyncFake()
	addr, _ := grpcServe(t, f)
	db := grpcDial(t, addr)
	if _, err := db.CreateCollection(ctx, kv.CollectionOptions{Name: "c"}); err != nil {
		t.Fatal(err)
	}
	const puts = 16
	type answer struct {
		key string
		v   uint64
		err error
	}
	answers := make(chan answer, puts)
	for i := range puts {
		go func() {
			k := fmt.Sprintf("a%d", i)
			v, err := db.Put(ctx, kv.PutRequest{Collection: "async", Key: []byte(k), Value: []byte(k)})
			answers <- answer{k, v, err}
		}()
	}
	for range puts {
		select {
		case <-f.started:
		case <-time.After(10 * time.Second):
			t.Fatal("the puts did not reach PutAsync")
		}
	}
	// While they wait: a put PutAsync refuses, and a get, are answered.
	if _, err := db.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte("sync"), Value: []byte("s")}); err != nil {
		t.Fatal(err)
	}
	if rec, err := db.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte("sync")}); err != nil || string(rec.Value) != "s" {
		t.Fatalf("get while puts wait: %+v, %v", rec, err)
	}
	select {
	case a := <-answers:
		t.Fatalf("put %s answered before the backend called back: %d, %v", a.key, a.v, a.err)
	default:
	}
	f.answerAll()
	for range puts {
		a := <-answers
		if a.err != nil {
			t.Fatalf("put %s: %v", a.key, a.err)
		}
		rec, err := db.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte(a.key)})
		if err != nil || string(rec.Value) != a.key || rec.Version != a.v {
			t.Fatalf("put %s answered version %d; it reads %+v, %v", a.key, a.v, rec, err)
		}
	}

	// Deletes likewise: one of a key, one on a condition that fails (the
	// backend's error, as its Delete gives it).
	dels := make(chan answer, 2)
	wrong := uint64(1 << 40)
	for _, k := range []string{"a0", "a1"} {
		go func() {
			req := kv.DeleteRequest{Collection: "async", Key: []byte(k)}
			if k == "a1" {
				req.IfVersion = &wrong
			}
			v, err := db.Delete(ctx, req)
			dels <- answer{k, v, err}
		}()
	}
	for range 2 {
		<-f.started
	}
	f.answerAll()
	for range 2 {
		a := <-dels
		switch {
		case a.key == "a0" && (a.err != nil || a.v == 0):
			t.Fatalf("delete a0: %d, %v", a.v, a.err)
		case a.key == "a1" && kv.CodeOf(a.err) != kv.CodeConditionFailed:
			t.Fatalf("delete of a1 on a wrong version: %d, %v; want condition failed", a.v, a.err)
		}
	}
	if _, err := db.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte("a0")}); kv.CodeOf(err) != kv.CodeNotFound {
		t.Fatalf("get a0 after its delete: %v, want not found", err)
	}
}

// TestGRPCPipelineDrainWaitsForAsyncPuts: a stream the server drains ends
// only once the puts it started were answered: the one in flight is
// answered, not cut off.
func TestGRPCPipelineDrainWaitsForAsyncPuts(t *testing.T) {
	ctx := context.Background()
	f := newAsyncFake()
	draining := make(chan struct{})
	addr, _ := grpcServeWith(t, f, api.GRPCConfig{Draining: draining})
	db := grpcDial(t, addr)
	if _, err := db.CreateCollection(ctx, kv.CollectionOptions{Name: "c"}); err != nil {
		t.Fatal(err)
	}
	inFlight := make(chan error, 1)
	go func() {
		_, err := db.Put(ctx, kv.PutRequest{Collection: "async", Key: []byte("first"), Value: []byte("1")})
		inFlight <- err
	}()
	<-f.started
	close(draining)
	time.Sleep(20 * time.Millisecond) // the handler drains, waiting for the put
	select {
	case err := <-inFlight:
		t.Fatalf("the put in flight was answered before the backend called back: %v", err)
	default:
	}
	f.answerAll()
	if err := <-inFlight; err != nil {
		t.Fatalf("the put in flight when the server drained: %v, want it answered", err)
	}
}
