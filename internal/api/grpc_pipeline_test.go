package api_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	groupkv "github.com/groupkv/groupkv"
	"github.com/groupkv/groupkv/internal/api"
	"github.com/groupkv/groupkv/internal/kv"
	pb "github.com/groupkv/groupkv/proto/groupkvpb"
)

const pipelineMethod = "/groupkv.v1.GroupKV/Pipeline"

// gateFake is a grpcFake whose puts and gets of collection "gate" wait: each
// sends its key on entered, then waits for release to be closed (and then
// acts on collection "c" instead) or for its context to end (and then sends
// its key on left).
type gateFake struct {
	*grpcFake
	entered chan string
	left    chan string
	release chan struct{}
}

func newGateFake() *gateFake {
	return &gateFake{grpcFake: newGRPCFake(), entered: make(chan string, 16), left: make(chan string, 16), release: make(chan struct{})}
}

func (f *gateFake) wait(ctx context.Context, key []byte) error {
	f.entered <- string(key)
	select {
	case <-f.release:
		return nil
	case <-ctx.Done():
		f.left <- string(key)
		return ctx.Err()
	}
}

func (f *gateFake) Put(ctx context.Context, req kv.PutRequest) (uint64, error) {
	if req.Collection == "gate" {
		if err := f.wait(ctx, req.Key); err != nil {
			return 0, err
		}
		req.Collection = "c"
	}
	return f.grpcFake.Put(ctx, req)
}

func (f *gateFake) Get(ctx context.Context, req kv.GetRequest) (kv.Record, error) {
	if req.Collection == "gate" {
		if err := f.wait(ctx, req.Key); err != nil {
			return kv.Record{}, err
		}
		req.Collection = "c"
	}
	return f.grpcFake.Get(ctx, req)
}

// rpcCounter counts the RPCs a server gets, by operation ("put",
// "pipeline", "batch_get"...), as they begin.
type rpcCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *rpcCounter) add(method string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[method[len("/groupkv.v1.GroupKV/"):]]++
}

func (c *rpcCounter) get(method string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[method]
}

// options are the server options that count its RPCs; with refusePipeline
// the server answers Pipeline as a server older than it does
// (UNIMPLEMENTED).
func (c *rpcCounter) options(refusePipeline bool) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			c.add(info.FullMethod)
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			c.add(info.FullMethod)
			if refusePipeline && info.FullMethod == pipelineMethod {
				return status.Errorf(codes.Unimplemented, "unknown method Pipeline for service groupkv.v1.GroupKV")
			}
			return h(srv, ss)
		}),
	}
}

// TestGRPCPipelineAnswersEachWhenDone: a dialed DB's puts, gets and
// deletes go as messages of one Pipeline stream, not as unary RPCs, and a
// request that waits holds up none sent after it.
func TestGRPCPipelineAnswersEachWhenDone(t *testing.T) {
	ctx := context.Background()
	f := newGateFake()
	var rpcs rpcCounter
	addr, _ := grpcServe(t, f, rpcs.options(false)...)
	db := grpcDial(t, addr)
	if _, err := db.CreateCollection(ctx, kv.CollectionOptions{Name: "c"}); err != nil {
		t.Fatal(err)
	}
	slow := make(chan error, 1)
	go func() {
		_, err := db.Put(ctx, kv.PutRequest{Collection: "gate", Key: []byte("slow"), Value: []byte("s")})
		slow <- err
	}()
	<-f.entered
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := []byte(fmt.Sprintf("k%d", i))
			v, err := db.Put(ctx, kv.PutRequest{Collection: "c", Key: k, Value: k})
			if err != nil || v == 0 {
				t.Errorf("put %s while another waits: %d, %v", k, v, err)
				return
			}
			rec, err := db.Get(ctx, kv.GetRequest{Collection: "c", Key: k})
			if err != nil || string(rec.Value) != string(k) || rec.Version != v {
				t.Errorf("get %s: %+v, %v; want the value put at %d", k, rec, err, v)
			}
			if i%2 == 0 {
				if _, err := db.Delete(ctx, kv.DeleteRequest{Collection: "c", Key: k}); err != nil {
					t.Errorf("delete %s: %v", k, err)
				}
				if _, err := db.Get(ctx, kv.GetRequest{Collection: "c", Key: k}); !errors.Is(err, groupkv.ErrNotFound) {
					t.Errorf("get %s after its delete: %v, want not found", k, err)
				}
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-slow:
		t.Fatalf("the waiting put answered before it was released: %v", err)
	default:
	}
	close(f.release)
	if err := <-slow; err != nil {
		t.Fatalf("the released put: %v", err)
	}
	if rec, err := db.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte("slow")}); err != nil || string(rec.Value) != "s" {
		t.Errorf("get of the released put: %+v, %v", rec, err)
	}
	for _, m := range []string{"Put", "Get", "Delete", "BatchGet"} {
		if n := rpcs.get(m); n != 0 {
			t.Errorf("%d unary %s RPCs, want none (the pipeline carries them)", n, m)
		}
	}
	if n := rpcs.get("Pipeline"); n != 1 {
		t.Errorf("%d Pipeline streams, want 1", n)
	}
}

// TestGRPCPipelineErrorsAsUnary: a pipelined request fails with exactly
// the error its unary RPC gives (from a server without Pipeline).
func TestGRPCPipelineErrorsAsUnary(t *testing.T) {
	ctx := context.Background()
	piped := grpcDial(t, func() string { a, _ := grpcServe(t, newGRPCFake()); return a }())
	var rpcs rpcCounter
	unaryAddr, _ := grpcServe(t, newGRPCFake(), rpcs.options(true)...)
	unary := grpcDial(t, unaryAddr)
	var keys []string
	for _, c := range grpcCodes {
		keys = append(keys, string(c.kv))
	}
	keys = append(keys, "plain", "wrapped", "ctx-canceled", "ctx-deadline")
	ops := map[string]func(db groupkv.DB, key []byte) error{
		"put": func(db groupkv.DB, key []byte) error {
			_, err := db.Put(ctx, kv.PutRequest{Collection: "fail", Key: key})
			return err
		},
		"get": func(db groupkv.DB, key []byte) error {
			_, err := db.Get(ctx, kv.GetRequest{Collection: "fail", Key: key})
			return err
		},
		"delete": func(db groupkv.DB, key []byte) error {
			_, err := db.Delete(ctx, kv.DeleteRequest{Collection: "fail", Key: key})
			return err
		},
	}
	for name, op := range ops {
		for _, k := range keys {
			got, want := op(piped, []byte(k)), op(unary, []byte(k))
			if want == nil || !reflect.DeepEqual(got, want) {
				t.Errorf("%s %s: pipelined %#v, unary %#v", name, k, got, want)
			}
			for _, target := range []error{context.Canceled, context.DeadlineExceeded, groupkv.ErrNotFound} {
				if errors.Is(got, target) != errors.Is(want, target) {
					t.Errorf("%s %s: errors.Is(%v, %v) pipelined %t, unary %t", name, k, got, target, errors.Is(got, target), !errors.Is(got, target))
				}
			}
		}
	}
	if rpcs.get("Put") == 0 || rpcs.get("Get") == 0 || rpcs.get("Delete") == 0 {
		t.Errorf("the server without Pipeline got unary RPCs %v, want puts, gets and deletes", rpcs.n)
	}
	if n := rpcs.get("Pipeline"); n != 1 {
		t.Errorf("Pipeline asked %d times of a server without it, want once", n)
	}
}

// TestGRPCPipelineOldServer: against a server without Pipeline, a dialed
// DB's requests go as unary RPCs, and its concurrent gets share BatchGets.
func TestGRPCPipelineOldServer(t *testing.T) {
	ctx := context.Background()
	var rpcs rpcCounter
	addr, _ := grpcServe(t, newGRPCFake(), rpcs.options(true)...)
	db := grpcDial(t, addr)
	if _, err := db.CreateCollection(ctx, kv.CollectionOptions{Name: "c"}); err != nil {
		t.Fatal(err)
	}
	for i := range 16 {
		k := []byte(fmt.Sprintf("k%d", i))
		if _, err := db.Put(ctx, kv.PutRequest{Collection: "c", Key: k, Value: k}); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 50 {
				k := []byte(fmt.Sprintf("k%d", (g+j)%16))
				if rec, err := db.Get(ctx, kv.GetRequest{Collection: "c", Key: k}); err != nil || string(rec.Value) != string(k) {
					t.Errorf("get %s: %+v, %v", k, rec, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if rpcs.get("Put") != 16 || rpcs.get("BatchGet") == 0 {
		t.Errorf("RPCs %v: want 16 unary puts and gets sharing BatchGets", rpcs.n)
	}
	if n := rpcs.get("Pipeline"); n != 1 {
		t.Errorf("Pipeline asked %d times of a server without it, want once", n)
	}
}

// TestGRPCPipelineRequestDeadline: a pipelined request's deadline reaches
// the server, which ends the request there when it passes (the stream
// itself goes on).
func TestGRPCPipelineRequestDeadline(t *testing.T) {
	f := newGateFake()
	addr, _ := grpcServe(t, f)
	db := grpcDial(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := db.Get(ctx, kv.GetRequest{Collection: "gate", Key: []byte("k")})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("get past its deadline: %v, want context.DeadlineExceeded", err)
	}
	select {
	case <-f.left:
	case <-time.After(30 * time.Second):
		t.Fatal("the server's get did not end when the request's deadline passed")
	}
}

// TestGRPCPipelineDrain: a server that drains (shuts down) answers the
// requests it serves, serves no more, and ends the stream so that the
// client knows the requests left unanswered were not served: a write is
// answered, or fails unavailable and was not applied — never
// commit_unknown.
func TestGRPCPipelineDrain(t *testing.T) {
	ctx := context.Background()
	f := newGateFake()
	draining := make(chan struct{})
	addr, _ := grpcServeWith(t, f, api.GRPCConfig{Draining: draining})
	db := grpcDial(t, addr)
	if _, err := db.CreateCollection(ctx, kv.CollectionOptions{Name: "c"}); err != nil {
		t.Fatal(err)
	}
	inFlight := make(chan error, 1)
	go func() {
		_, err := db.Put(ctx, kv.PutRequest{Collection: "gate", Key: []byte("first"), Value: []byte("1")})
		inFlight <- err
	}()
	<-f.entered
	close(draining)
	const late = 8
	lateErrs := make(chan error, late)
	for i := range late {
		go func() {
			_, err := db.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte(fmt.Sprintf("late%d", i)), Value: []byte("x")})
			lateErrs <- err
		}()
	}
	time.Sleep(50 * time.Millisecond) // the late puts are on their way
	close(f.release)
	if err := <-inFlight; err != nil {
		t.Errorf("the put in flight when the server drained: %v, want it answered", err)
	}
	unserved := 0
	for i := range late {
		err := <-lateErrs
		if err == nil {
			continue
		}
		if kv.CodeOf(err) != kv.CodeUnavailable {
			t.Errorf("a put sent while the server drained: %v, want success or unavailable", err)
			continue
		}
		unserved++
		if _, gerr := f.grpcFake.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte(fmt.Sprintf("late%d", i))}); kv.CodeOf(gerr) != kv.CodeNotFound {
			t.Errorf("late%d answered %v but was applied (%v)", i, err, gerr)
		}
	}
	t.Logf("%d of %d puts sent while the server drained were refused unserved", unserved, late)
	if unserved == 0 {
		t.Error("no put sent while the server drained was refused")
	}
}

// TestGRPCPipelineWire drives a Pipeline stream with a bare gRPC client: one
// answer per request, with its id, an error for a request that names no
// operation, and the end of the stream once the client closed its side.
func TestGRPCPipelineWire(t *testing.T) {
	ctx := context.Background()
	addr, _ := grpcServe(t, newGRPCFake())
	c := grpcBare(t, addr)
	if _, err := c.CreateCollection(ctx, &pb.CreateCollectionRequest{Name: "c"}); err != nil {
		t.Fatal(err)
	}
	s, err := c.Pipeline(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, req := range []*pb.PipelineRequest{
		{Id: 7},
		{Id: 8, Op: &pb.PipelineRequest_Get{Get: &pb.GetRequest{Collection: "fail", Key: []byte("not_found")}}},
		{Id: 9, Op: &pb.PipelineRequest_Put{Put: &pb.PutRequest{Collection: "c", Key: []byte("k"), Value: []byte("v")}}},
		{Id: 10, Op: &pb.PipelineRequest_Get{Get: &pb.GetRequest{Collection: "fail", Key: []byte("ctx-deadline")}}},
	} {
		if err := s.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	got, _ := closeAndReceive(t, s)
	if len(got) != 4 {
		t.Fatalf("answers %v, want one per request", got)
	}
	if e := got[7].GetError(); e.GetCode() != string(kv.CodeInvalidArgument) || e.GetGrpcCode() != uint32(codes.InvalidArgument) {
		t.Errorf("a request without an operation: %v", got[7])
	}
	if e := got[8].GetError(); e.GetCode() != string(kv.CodeNotFound) || e.GetGrpcCode() != uint32(codes.NotFound) || e.GetMessage() != grpcFakeMessage(kv.CodeNotFound) {
		t.Errorf("a get that fails not_found: %v", got[8])
	}
	if got[9].GetPut().GetVersion() == 0 {
		t.Errorf("a put: %v", got[9])
	}
	if e := got[10].GetError(); e.GetCode() != "" || e.GetGrpcCode() != uint32(codes.DeadlineExceeded) {
		t.Errorf("a get whose context ended: %v", got[10])
	}
}

// TestGRPCPipelineClose: closing the DB fails the requests in flight on
// its pipeline, as unavailable, and the server's side ends.
func TestGRPCPipelineClose(t *testing.T) {
	f := newGateFake()
	addr, _ := grpcServe(t, f)
	db, err := groupkv.Dial(addr, groupkv.WithoutShardRouting())
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := db.Get(context.Background(), kv.GetRequest{Collection: "gate", Key: []byte("k")})
		errc <- err
	}()
	<-f.entered
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if kv.CodeOf(err) != kv.CodeUnavailable {
			t.Errorf("get in flight when the DB closed: %v, want unavailable", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a get in flight was not answered when the DB closed")
	}
	select {
	case <-f.left:
	case <-time.After(30 * time.Second):
		t.Fatal("the server's get did not end when the client's stream did")
	}
}

// TestGRPCPipelineLargeValue: a put of a large value goes as a unary RPC
// (it would hold up the stream's other messages while it is sent); the
// others keep to the pipeline.
func TestGRPCPipelineLargeValue(t *testing.T) {
	ctx := context.Background()
	var rpcs rpcCounter
	addr, _ := grpcServe(t, newGRPCFake(), rpcs.options(false)...)
	db := grpcDial(t, addr)
	if _, err := db.CreateCollection(ctx, kv.CollectionOptions{Name: "c"}); err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 1<<20)
	for i := range big {
		big[i] = byte(i)
	}
	for _, v := range [][]byte{[]byte("small"), big} {
		if _, err := db.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte("k"), Value: v}); err != nil {
			t.Fatal(err)
		}
		rec, err := db.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte("k")})
		if err != nil || !bytes.Equal(rec.Value, v) {
			t.Fatalf("get after a put of %d bytes: %d bytes, %v", len(v), len(rec.Value), err)
		}
	}
	if n := rpcs.get("Put"); n != 1 {
		t.Errorf("%d unary puts, want 1 (the large one)", n)
	}
}
