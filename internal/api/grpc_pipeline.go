package api

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/groupkv/groupkv/internal/kv"
	pb "github.com/groupkv/groupkv/proto/groupkvpb"
)

// PipelineDrained is the code of the ErrorDetail of the status that ends a
// Pipeline stream the server closed on purpose (GRPCConfig.Draining): every
// request it read was answered before it, so a request the client has no
// answer to was not served. A stream that ended any other way (a broken
// connection, a server stopped hard) may have served a request whose
// answer was lost.
const PipelineDrained = "pipeline_drained"

// Pipeline serves a stream of single-key requests (see the RPC's comment in
// proto/groupkv.proto): each request runs on a worker and is answered when
// it completes, in any order. The stream ends after the client closed its
// side and every request it sent was answered, or when the server drains.
func (s *grpcService) Pipeline(st pb.GroupKV_PipelineServer) error {
	ctx := st.Context()
	var (
		wg      sync.WaitGroup
		sendMu  sync.Mutex
		sendErr error
	)
	send := func(resp *pb.PipelineResponse) {
		sendMu.Lock()
		defer sendMu.Unlock()
		if sendErr == nil {
			sendErr = st.Send(resp)
		}
	}
	// Requests are read on a goroutine of their own so that draining
	// need not wait for the next one; what it reads after the handler
	// stopped taking them is dropped unserved, as the drained status says.
	reqs := make(chan *pb.PipelineRequest)
	recvErr := make(chan error, 1)
	stopRecv := make(chan struct{})
	defer close(stopRecv)
	go func() {
		for {
			req, err := st.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case reqs <- req:
			case <-stopRecv:
				return
			}
		}
	}()
	finish := func(err error) error {
		wg.Wait() // no Send may follow the handler's return
		sendMu.Lock()
		defer sendMu.Unlock()
		if err == nil {
			err = sendErr
		}
		return err
	}
	for {
		select {
		case req := <-reqs:
			wg.Add(1)
			s.workers.run(func() {
				defer wg.Done()
				send(s.pipelined(ctx, req))
			})
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				err = nil
			}
			return finish(err)
		case <-s.draining:
			if err := finish(nil); err != nil {
				return err
			}
			st, _ := status.New(codes.Unavailable, "the node is shutting down; requests not answered on this stream were not served").
				WithDetails(&pb.ErrorDetail{Code: PipelineDrained})
			return st.Err()
		}
	}
}

// pipelined serves one request of a Pipeline stream as the unary RPC of
// the same name serves it.
func (s *grpcService) pipelined(ctx context.Context, req *pb.PipelineRequest) *pb.PipelineResponse {
	start := time.Now()
	if t := req.GetTimeoutMicros(); t != 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(t)*time.Microsecond)
		defer cancel()
	}
	resp := &pb.PipelineResponse{Id: req.GetId()}
	var (
		op      string
		err     error
		trailer metadata.MD
	)
	switch r := req.GetOp().(type) {
	case *pb.PipelineRequest_Put:
		op = "put"
		var v uint64
		if v, err = s.b.Put(ctx, PutRequestFromPB(r.Put)); err == nil {
			resp.Result = &pb.PipelineResponse_Put{Put: &pb.PutResponse{Version: v}}
		}
	case *pb.PipelineRequest_Get:
		op = "get"
		var rec kv.Record
		if rec, err = s.b.Get(ctx, GetRequestFromPB(r.Get)); err == nil {
			resp.Result = &pb.PipelineResponse_Get{Get: RecordToPB(rec)}
		}
	case *pb.PipelineRequest_Delete:
		op = "delete"
		var v uint64
		if v, err = s.b.Delete(ctx, DeleteRequestFromPB(r.Delete)); err == nil {
			resp.Result = &pb.PipelineResponse_Delete{Delete: &pb.DeleteResponse{Version: v}}
		}
	case *pb.PipelineRequest_TxnGet:
		// The unary handlers, their trailers caught (trailerSink).
		op = opTxnGet
		var m *pb.TxnGetResponse
		if m, err = s.TxnGet(withTrailerSink(ctx, &trailer), r.TxnGet); err == nil {
			resp.Result = &pb.PipelineResponse_TxnGet{TxnGet: m}
		}
	case *pb.PipelineRequest_CommitTxn:
		op = opTxnCommit
		var m *pb.CommitTxnResponse
		if m, err = s.CommitTxn(withTrailerSink(ctx, &trailer), r.CommitTxn); err == nil {
			resp.Result = &pb.PipelineResponse_CommitTxn{CommitTxn: m}
		}
	default:
		op = "pipeline"
		err = kv.Errorf(kv.CodeInvalidArgument, "pipelined request %d names no operation: give put, get, delete, txn_get or commit_txn", req.GetId())
	}
	var code kv.Code
	if err != nil {
		e := pipelineErrorToPB(err, trailer)
		resp.Result = &pb.PipelineResponse_Error{Error: e}
		code = kv.Code(e.GetCode())
		if code == "" {
			code = kv.CodeUnavailable // the request's context ended, as GRPCMetricsInterceptor counts it
		}
	}
	if s.observe != nil {
		s.observe(op, code, time.Since(start).Seconds())
	}
	return resp
}

// pipelineErrorToPB is the PipelineError of a request that failed with
// err: a Backend's error (as StatusFromError makes it a status), or the
// status error of a unary handler with the trailer it set.
func pipelineErrorToPB(err error, trailer metadata.MD) *pb.PipelineError {
	if st, ok := status.FromError(err); ok {
		e := &pb.PipelineError{Message: st.Message(), GrpcCode: uint32(st.Code())}
		for _, d := range st.Details() {
			if d, ok := d.(*pb.ErrorDetail); ok && e.Code == "" {
				e.Code = d.GetCode()
			}
		}
		if ids := trailer.Get(TxnTrailer); len(ids) > 0 {
			e.Txn = ids[0]
		}
		return e
	}
	st, code := StatusFromError(err)
	return &pb.PipelineError{Code: string(code), Message: st.Message(), GrpcCode: uint32(st.Code())}
}

// trailerSink is the context key under which a unary handler called for a
// pipelined request finds where its trailer goes (setTrailer).
type trailerSink struct{}

func withTrailerSink(ctx context.Context, md *metadata.MD) context.Context {
	return context.WithValue(ctx, trailerSink{}, md)
}

// setTrailer sets a unary handler's trailer: on its RPC, or, for a
// pipelined request, in the sink its caller reads (withTrailerSink).
func setTrailer(ctx context.Context, md metadata.MD) {
	if sink, ok := ctx.Value(trailerSink{}).(*metadata.MD); ok {
		*sink = metadata.Join(*sink, md)
		return
	}
	// SetTrailer fails only outside a handler's context; the detail
	// still carries the code then.
	_ = grpc.SetTrailer(ctx, md)
}

// workerPool runs functions on goroutines that outlive them: a worker
// keeps the stack it grew serving a request for the next one, where a
// goroutine per request would grow a new stack each time (runtime.newstack
// took a tenth of a node's CPU under a write load that way). A function
// that finds no idle worker gets a new one; a worker idle for
// workerIdleTimeout exits.
type workerPool struct {
	work chan func()
}

const workerIdleTimeout = 30 * time.Second

func newWorkerPool() *workerPool { return &workerPool{work: make(chan func())} }

// run runs f on an idle worker, or on a new one.
func (p *workerPool) run(f func()) {
	select {
	case p.work <- f:
	default:
		go p.worker(f)
	}
}

func (p *workerPool) worker(f func()) {
	f()
	t := time.NewTimer(workerIdleTimeout)
	defer t.Stop()
	for {
		select {
		case f := <-p.work:
			f()
			t.Reset(workerIdleTimeout)
		case <-t.C:
			return
		}
	}
}

// PipelinedMethod answers the name of the unary RPC a pipelined request
// stands for ("Put", "TxnGet", ...), or "" for a request that names no
// operation.
func PipelinedMethod(req *pb.PipelineRequest) string {
	switch req.GetOp().(type) {
	case *pb.PipelineRequest_Put:
		return "Put"
	case *pb.PipelineRequest_Get:
		return "Get"
	case *pb.PipelineRequest_Delete:
		return "Delete"
	case *pb.PipelineRequest_TxnGet:
		return "TxnGet"
	case *pb.PipelineRequest_CommitTxn:
		return "CommitTxn"
	}
	return ""
}
