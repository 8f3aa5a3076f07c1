package api_test

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/grpc/metadata"

	"github.com/groupkv/groupkv/internal/api"
	"github.com/groupkv/groupkv/internal/kv"
	pb "github.com/groupkv/groupkv/proto/groupkvpb"
)

// nowFake is a grpcFake that answers the gets of collection "now" at once
// (GetNow), as the gets of collection "c", and refuses every other, which
// Get then serves; it counts the gets each way.
type nowFake struct {
	*grpcFake
	now, slow chan string
}

func (f *nowFake) GetNow(req kv.GetRequest) (kv.Record, error, bool) {
	if req.Collection != "now" {
		return kv.Record{}, nil, false
	}
	req.Collection = "c"
	rec, err := f.grpcFake.Get(context.Background(), req)
	f.now <- string(req.Key)
	return rec, err, true
}

func (f *nowFake) Get(ctx context.Context, req kv.GetRequest) (kv.Record, error) {
	f.slow <- string(req.Key)
	return f.grpcFake.Get(ctx, req)
}

// TestGRPCPipelineGetsNow: the gets of one message that the backend
// answers at once (GetNow) go back together, in one message, each with
// its own answer (a record, or not found); a get it does not take is
// served by Get, and answered too.
func TestGRPCPipelineGetsNow(t *testing.T) {
	ctx := context.Background()
	const gets = 12
	f := &nowFake{grpcFake: newGRPCFake(), now: make(chan string, 2*gets), slow: make(chan string, 2*gets)}
	addr, _ := grpcServe(t, f)
	c := grpcBare(t, addr)
	if _, err := c.CreateCollection(ctx, &pb.CreateCollectionRequest{Name: "c"}); err != nil {
		t.Fatal(err)
	}
	versions := map[string]uint64{}
	for i := range gets - 1 { // the last key is missing
		k := fmt.Sprintf("k%d", i)
		resp, err := c.Put(ctx, &pb.PutRequest{Collection: "c", Key: []byte(k), Value: []byte("v" + k)})
		if err != nil {
			t.Fatal(err)
		}
		versions[k] = resp.GetVersion()
	}
	s, err := c.Pipeline(metadata.AppendToOutgoingContext(ctx, api.PipelineBatchKey, "1"))
	if err != nil {
		t.Fatal(err)
	}
	var batch []*pb.PipelineRequest
	for i := range gets {
		batch = append(batch, &pb.PipelineRequest{Id: uint64(i + 1), Op: &pb.PipelineRequest_Get{Get: &pb.GetRequest{Collection: "now", Key: []byte(fmt.Sprintf("k%d", i))}}})
	}
	if err := s.Send(&pb.PipelineRequest{Batch: batch}); err != nil {
		t.Fatal(err)
	}
	resp, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetBatch()) != gets {
		t.Fatalf("the first message answers %d of the %d gets answered at once: %v", len(resp.GetBatch()), gets, resp)
	}
	for _, r := range resp.GetBatch() {
		k := fmt.Sprintf("k%d", r.GetId()-1)
		if v, ok := versions[k]; ok {
			if g := r.GetGet(); string(g.GetValue()) != "v"+k || g.GetVersion() != v {
				t.Errorf("get %s answered %v, want v%s at %d", k, r, k, v)
			}
		} else if r.GetError().GetCode() != string(kv.CodeNotFound) {
			t.Errorf("get of missing %s answered %v, want not found", k, r)
		}
	}
	if len(f.now) != gets || len(f.slow) != 0 {
		t.Fatalf("%d gets answered at once and %d by Get, want %d and 0", len(f.now), len(f.slow), gets)
	}

	// A get GetNow refuses is Get's.
	if err := s.Send(&pb.PipelineRequest{Id: 100, Op: &pb.PipelineRequest_Get{Get: &pb.GetRequest{Collection: "c", Key: []byte("k0")}}}); err != nil {
		t.Fatal(err)
	}
	got, _ := closeAndReceive(t, s)
	if g := got[100].GetGet(); string(g.GetValue()) != "vk0" || len(f.slow) != 1 {
		t.Fatalf("a get GetNow refused: %v, served by Get %d times", got[100], len(f.slow))
	}
}
