package api_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/groupkv/groupkv/internal/api"
	"github.com/groupkv/groupkv/internal/kv"
	pb "github.com/groupkv/groupkv/proto/groupkvpb"
)

// TestGRPCPipelineBatchWire: a server announces batches in the header of
// a stream whose client asked for them (and only then), serves each
// request of a batch as if it came alone, and refuses a batch within a
// batch.
func TestGRPCPipelineBatchWire(t *testing.T) {
	ctx := context.Background()
	addr, _ := grpcServe(t, newGRPCFake())
	c := grpcBare(t, addr)
	if _, err := c.CreateCollection(ctx, &pb.CreateCollectionRequest{Name: "c"}); err != nil {
		t.Fatal(err)
	}

	for _, ask := range []bool{false, true} {
		sctx := ctx
		if ask {
			sctx = metadata.AppendToOutgoingContext(ctx, api.PipelineBatchKey, "1")
		}
		s, err := c.Pipeline(sctx)
		if err != nil {
			t.Fatal(err)
		}
		// A batch is read whether or not the client asked for batched
		// answers.
		if err := s.Send(&pb.PipelineRequest{Batch: []*pb.PipelineRequest{
			{Id: 1, Op: &pb.PipelineRequest_Put{Put: &pb.PutRequest{Collection: "c", Key: []byte("k"), Value: []byte("v")}}},
			{Id: 2, Op: &pb.PipelineRequest_Get{Get: &pb.GetRequest{Collection: "fail", Key: []byte("not_found")}}},
			{Id: 3},
		}}); err != nil {
			t.Fatal(err)
		}
		md, err := s.Header()
		if err != nil {
			t.Fatal(err)
		}
		if got := slices.Contains(md.Get(api.PipelineBatchKey), "1"); got != ask {
			t.Errorf("client asked for batches: %v; header announces them: %v (%v)", ask, got, md)
		}
		if err := s.Send(&pb.PipelineRequest{Id: 4, Op: &pb.PipelineRequest_Get{Get: &pb.GetRequest{Collection: "c", Key: []byte("k")}}}); err != nil {
			t.Fatal(err)
		}
		got, batches := closeAndReceive(t, s)
		if batches > 0 && !ask {
			t.Errorf("%d batches of answers to a client that did not ask for them", batches)
		}
		if len(got) != 4 {
			t.Fatalf("answers %v, want one per request", got)
		}
		if got[1].GetPut().GetVersion() == 0 {
			t.Errorf("a put in a batch: %v", got[1])
		}
		if e := got[2].GetError(); e.GetCode() != string(kv.CodeNotFound) {
			t.Errorf("a get in a batch that fails not_found: %v", got[2])
		}
		if e := got[3].GetError(); e.GetCode() != string(kv.CodeInvalidArgument) {
			t.Errorf("a request in a batch without an operation: %v", got[3])
		}
		if string(got[4].GetGet().GetValue()) != "v" {
			t.Errorf("a get after the batch: %v", got[4])
		}
	}

	s, err := c.Pipeline(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&pb.PipelineRequest{Batch: []*pb.PipelineRequest{{Id: 1, Batch: []*pb.PipelineRequest{{Id: 2}}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); status.Code(err) != codes.InvalidArgument {
		t.Errorf("a batch within a batch: %v, want InvalidArgument", err)
	}
}

// closeAndReceive closes the sending side of s and receives its answers
// until it ends, by id, the answers of batches among them; it counts the
// batches.
func closeAndReceive(t *testing.T, s pb.GroupKV_PipelineClient) (got map[uint64]*pb.PipelineResponse, batches int) {
	t.Helper()
	if err := s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	got = map[uint64]*pb.PipelineResponse{}
	for {
		resp, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return got, batches
		}
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
		answers := []*pb.PipelineResponse{resp}
		if len(resp.GetBatch()) > 0 {
			answers = resp.GetBatch()
			batches++
		}
		for _, r := range answers {
			if got[r.GetId()] != nil {
				t.Errorf("request %d answered twice", r.GetId())
			}
			got[r.GetId()] = r
		}
	}
}

// pipelineWatch is a stream interceptor that counts the batches a server's
// Pipeline streams receive and send; with old, it also hides the client's
// request for batches, so that the server answers as one without them
// (no announcement, every answer a message of its own).
type pipelineWatch struct {
	old                    bool
	batchesIn, batchesOut  atomic.Int64
	requests, requestsIn   atomic.Int64
	answersOut, messageOut atomic.Int64
	// largestBatchOut is the encoded size of the largest batch of
	// answers sent, less 16 bytes an answer for the batch's framing.
	largestBatchOut atomic.Int64
}

func (w *pipelineWatch) intercept(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if info.FullMethod != pipelineMethod {
		return h(srv, ss)
	}
	ctx := ss.Context()
	if w.old {
		md, _ := metadata.FromIncomingContext(ctx)
		md = md.Copy()
		delete(md, api.PipelineBatchKey)
		ctx = metadata.NewIncomingContext(ctx, md)
	}
	return h(srv, &watchedStream{ServerStream: ss, ctx: ctx, w: w})
}

type watchedStream struct {
	grpc.ServerStream
	ctx context.Context
	w   *pipelineWatch
}

func (s *watchedStream) Context() context.Context { return s.ctx }

func (s *watchedStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if req, ok := m.(*pb.PipelineRequest); ok && err == nil {
		s.w.requestsIn.Add(1)
		if n := len(req.GetBatch()); n > 0 {
			s.w.batchesIn.Add(1)
			s.w.requests.Add(int64(n))
		} else {
			s.w.requests.Add(1)
		}
	}
	return err
}

func (s *watchedStream) SendMsg(m any) error {
	if resp, ok := m.(*pb.PipelineResponse); ok {
		s.w.messageOut.Add(1)
		if n := len(resp.GetBatch()); n > 0 {
			s.w.batchesOut.Add(1)
			s.w.answersOut.Add(int64(n))
			size := int64(proto.Size(resp) - 16*n)
			for old := s.w.largestBatchOut.Load(); size > old && !s.w.largestBatchOut.CompareAndSwap(old, size); old = s.w.largestBatchOut.Load() {
			}
		} else {
			s.w.answersOut.Add(1)
		}
	}
	return s.ServerStream.SendMsg(m)
}

// TestGRPCPipelineBatches: a dialed DB's concurrent requests go in
// batches, and come back in batches, once the server announced them, and
// never to a server that did not; either way each gets its own answer.
func TestGRPCPipelineBatches(t *testing.T) {
	for _, old := range []bool{true, false} {
		t.Run(fmt.Sprintf("old=%v", old), func(t *testing.T) {
			ctx := context.Background()
			w := &pipelineWatch{old: old}
			addr, _ := grpcServe(t, newGRPCFake(), grpc.ChainStreamInterceptor(w.intercept))
			db := grpcDial(t, addr)
			if _, err := db.CreateCollection(ctx, kv.CollectionOptions{Name: "c"}); err != nil {
				t.Fatal(err)
			}
			// Rounds of concurrent puts and gets until both sides sent a
			// batch (a sender yields before it sends, so that those ready
			// to add join it: nearly always in the first round), or, for
			// an old server, a fixed number of rounds.
			const clients = 32
			for round := 0; round < 50; round++ {
				var wg sync.WaitGroup
				for g := range clients {
					wg.Add(1)
					go func() {
						defer wg.Done()
						k := []byte(fmt.Sprintf("r%d-k%d", round, g))
						if _, err := db.Put(ctx, kv.PutRequest{Collection: "c", Key: k, Value: k}); err != nil {
							t.Errorf("put %s: %v", k, err)
							return
						}
						if rec, err := db.Get(ctx, kv.GetRequest{Collection: "c", Key: k}); err != nil || string(rec.Value) != string(k) {
							t.Errorf("get %s: %+v, %v", k, rec, err)
						}
					}()
				}
				wg.Wait()
				if t.Failed() || (!old && w.batchesIn.Load() > 0 && w.batchesOut.Load() > 0) || (old && round == 9) {
					break
				}
			}
			t.Logf("requests %d in %d messages (%d batches); answers %d in %d messages (%d batches)",
				w.requests.Load(), w.requestsIn.Load(), w.batchesIn.Load(), w.answersOut.Load(), w.messageOut.Load(), w.batchesOut.Load())
			if old {
				if w.batchesIn.Load() != 0 || w.batchesOut.Load() != 0 {
					t.Errorf("batches on a stream whose server did not announce them: %d sent, %d answered", w.batchesIn.Load(), w.batchesOut.Load())
				}
			} else if w.batchesIn.Load() == 0 || w.batchesOut.Load() == 0 {
				t.Errorf("no batch in 50 rounds of %d concurrent requests: %d sent, %d answered", clients, w.batchesIn.Load(), w.batchesOut.Load())
			}
			if w.requests.Load() != w.answersOut.Load() {
				t.Errorf("%d requests, %d answers", w.requests.Load(), w.answersOut.Load())
			}
		})
	}
}

// TestGRPCPipelineBatchesOfLargeValues: answers of large values go in
// batches no larger than api.MaxBatchBytes (a batch of many could pass the
// largest message a client takes), and each is answered whole.
func TestGRPCPipelineBatchesOfLargeValues(t *testing.T) {
	ctx := context.Background()
	w := &pipelineWatch{}
	addr, _ := grpcServe(t, newGRPCFake(), grpc.ChainStreamInterceptor(w.intercept))
	db := grpcDial(t, addr)
	if _, err := db.CreateCollection(ctx, kv.CollectionOptions{Name: "c"}); err != nil {
		t.Fatal(err)
	}
	const keys, size = 8, 400 << 10
	for i := range keys {
		v := bytes.Repeat([]byte{byte('a' + i)}, size)
		if _, err := db.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte(fmt.Sprint(i)), Value: v}); err != nil {
			t.Fatal(err)
		}
	}
	for round := 0; round < 20 && w.batchesOut.Load() == 0; round++ {
		var wg sync.WaitGroup
		for g := range 32 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				k := g % keys
				rec, err := db.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte(fmt.Sprint(k))})
				if err != nil || len(rec.Value) != size || rec.Value[0] != byte('a'+k) || rec.Value[size-1] != byte('a'+k) {
					t.Errorf("get %d: %d bytes, %v", k, len(rec.Value), err)
				}
			}()
		}
		wg.Wait()
		if t.Failed() {
			return
		}
	}
	if w.batchesOut.Load() == 0 {
		t.Fatalf("no batch of answers in 20 rounds of 32 concurrent gets")
	}
	if n := w.largestBatchOut.Load(); n > api.MaxBatchBytes {
		t.Errorf("a batch of %d bytes of answers, more than %d", n, api.MaxBatchBytes)
	}
}
