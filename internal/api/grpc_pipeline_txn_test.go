package api

import (
	"context"
	"errors"
	"io"
	"slices"
	"testing"

	"google.golang.org/grpc/metadata"

	"github.com/groupkv/groupkv/internal/kv"
	pb "github.com/groupkv/groupkv/proto/groupkvpb"
)

// TestGRPCPipelineTxnWire: on a Pipeline stream whose client asked for
// them, the server names transactions in its header and serves a
// transaction's gets and commits as TxnGet and CommitTxn serve them: a
// request without an attempt is refused invalid_argument, a failure after
// the request's begin names the attempt it began (PipelineError.txn, as
// the unary trailer does), a get that began its attempt answers its id,
// and a commit its version; the stream goes on after each failure.
func TestGRPCPipelineTxnWire(t *testing.T) {
	tf := newTxnFake()
	tf.errs["TxnGetForUpdate"] = kv.Errorf(kv.CodeTxnAborted, "wounded by an older transaction")
	tf.rec, tf.found = kv.Record{Value: []byte("v1"), Version: 3}, true
	tf.commitV = 42
	c, _ := grpcTxnServe(t, tf)
	ctx := metadata.AppendToOutgoingContext(context.Background(), PipelineOpsKey, PipelineOpTxn)
	s, err := c.Pipeline(ctx)
	if err != nil {
		t.Fatal(err)
	}
	md, err := s.Header()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(md.Get(PipelineOpsKey), PipelineOpTxn) {
		t.Fatalf("header %v names no transactions", md)
	}
	begin := &pb.TxnBegin{Isolation: "serializable"}
	for _, req := range []*pb.PipelineRequest{
		{Id: 1, Op: &pb.PipelineRequest_TxnGet{TxnGet: &pb.TxnGetRequest{Collection: "c", Key: []byte("k")}}},
		{Id: 2, Op: &pb.PipelineRequest_TxnGet{TxnGet: &pb.TxnGetRequest{Begin: begin, Collection: "c", Key: []byte("k"), ForUpdate: true}}},
		{Id: 3, Op: &pb.PipelineRequest_TxnGet{TxnGet: &pb.TxnGetRequest{Begin: begin, Collection: "c", Key: []byte("k")}}},
	} {
		if err := s.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	got := map[uint64]*pb.PipelineResponse{}
	for len(got) < 3 {
		r, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range append(r.GetBatch(), r) {
			if q.GetResult() != nil {
				got[q.GetId()] = q
			}
		}
	}
	if e := got[1].GetError(); e.GetCode() != string(kv.CodeInvalidArgument) || e.GetTxn() != "" {
		t.Errorf("a get naming no attempt: %v", got[1])
	}
	aborted := got[2].GetError()
	if aborted.GetCode() != string(kv.CodeTxnAborted) || aborted.GetTxn() == "" {
		t.Errorf("a get that began its attempt and failed: %v", got[2])
	}
	m := got[3].GetTxnGet()
	if m.GetTxn() == "" || m.GetTxn() == aborted.GetTxn() || !m.GetFound() || string(m.GetValue()) != "v1" || m.GetVersion() != 3 {
		t.Fatalf("a get that began its attempt: %v", got[3])
	}
	commit := &pb.PipelineRequest{Id: 4, Op: &pb.PipelineRequest_CommitTxn{CommitTxn: &pb.CommitTxnRequest{Txn: m.GetTxn(),
		Writes: []*pb.TxnOp{{Op: "put", Collection: "c", Key: []byte("k"), Value: []byte("v2")}}}}}
	if err := s.Send(commit); err != nil {
		t.Fatal(err)
	}
	if err := s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	r, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if r.GetId() != 4 || r.GetCommitTxn().GetVersion() != 42 {
		t.Fatalf("the commit: %v", r)
	}
	if _, err := s.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("the stream's end: %v", err)
	}
	if call := tf.lastCall(t); call.method != "CommitTxn" || call.txn != m.GetTxn() {
		t.Fatalf("last call %+v, want the commit of %s", call, m.GetTxn())
	}
}
