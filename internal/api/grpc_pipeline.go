package api

import (
	"cmp"
	"context"
	"errors"
	"io"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

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
	batches, scanBytes := false, false
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		// Announced before anything else, so that the client's first
		// requests find it (its receiver reads the header first).
		var header metadata.MD
		if slices.Contains(md.Get(PipelineBatchKey), "1") {
			header = metadata.Join(header, metadata.Pairs(PipelineBatchKey, "1"))
			batches = true
		}
		if slices.Contains(md.Get(PipelineOpsKey), PipelineOpScan) {
			header = metadata.Join(header, metadata.Pairs(PipelineOpsKey, PipelineOpScan))
			if slices.Contains(md.Get(PipelineOpsKey), PipelineOpScanBytes) {
				header = metadata.Join(header, metadata.Pairs(PipelineOpsKey, PipelineOpScanBytes))
				scanBytes = true
			}
		}
		if _, err := s.txn(); err == nil && slices.Contains(md.Get(PipelineOpsKey), PipelineOpTxn) {
			header = metadata.Join(header, metadata.Pairs(PipelineOpsKey, PipelineOpTxn))
		}
		if header != nil {
			if err := st.SendHeader(header); err != nil {
				return err
			}
		}
	}
	var (
		wg    sync.WaitGroup
		sends Coalescer[*pb.PipelineResponse]
	)
	sendQueued := func(q []*pb.PipelineResponse) error {
		limit := maxBatchBytes
		if !batches {
			limit = 0 // each alone
		}
		err := sendBatched(q, limit, responseSize, st.Send, func(q []*pb.PipelineResponse) error {
			return st.Send(&pb.PipelineResponse{Batch: q})
		})
		// Sent (marshaled into gRPC's buffers), or never to be: the
		// scans' answers are not read again.
		for _, r := range q {
			if b := r.GetScanBytes(); b != nil {
				releaseScanBytes(b)
			}
		}
		return err
	}
	send := func(resp *pb.PipelineResponse) {
		_ = sends.Add(resp, sendQueued) // a failed send ends the stream (finish)
	}
	// Requests are read, and handed to workers, on a goroutine of their
	// own so that draining need not wait for the next one; what it reads
	// after the handler stopped taking them is dropped unserved, as the
	// drained status says.
	var (
		mu sync.Mutex
		// stopped: no request is served any more. Guards deadlines too.
		stopped   bool
		deadlines sharedDeadlines
	)
	// answer queues a response from a goroutine that must not block (the
	// loop that applied a put): a worker sends it, with whatever else was
	// queued meanwhile, unless a send is under way.
	drain := func() {
		wg.Add(1)
		s.workers.Go(func() {
			defer wg.Done()
			_ = sends.Drain(sendQueued) // a failed send ends the stream (finish)
		})
	}
	answer := func(resp *pb.PipelineResponse) {
		if sends.Push(resp) {
			drain()
		}
	}
	// now holds the answers of the gets of one message served at once
	// (getNow), queued together when the message is done.
	var now []*pb.PipelineResponse
	serve := func(req *pb.PipelineRequest) {
		if err := s.roles.Check(ctx, pipelinedRole(req), "a pipelined request"); err != nil {
			send(s.finishPipelined(&pb.PipelineResponse{Id: req.GetId()}, "pipeline", err, "", time.Now()))
			return
		}
		if resp := s.getNow(req); resp != nil {
			now = append(now, resp)
			return
		}
		rctx := ctx
		if t := req.GetTimeoutMicros(); t != 0 {
			rctx = deadlines.context(ctx, time.Duration(t)*time.Microsecond)
		}
		if req.GetPut() != nil || req.GetDelete() != nil {
			// A write that holds no worker while raft writes it down.
			wg.Add(1)
			if s.writeAsync(rctx, req, func(resp *pb.PipelineResponse) {
				answer(resp)
				wg.Done()
			}) {
				return
			}
			wg.Done()
		}
		wg.Add(1)
		s.workers.Go(func() {
			defer wg.Done()
			send(s.pipelined(rctx, req, scanBytes))
		})
	}
	recvErr := make(chan error, 1)
	go func() {
		for {
			req, err := st.Recv()
			if err == nil {
				err = checkPipelineBatch(req)
			}
			if err != nil {
				recvErr <- err
				return
			}
			mu.Lock()
			if stopped {
				mu.Unlock()
				return
			}
			if len(req.GetBatch()) == 0 {
				serve(req)
			}
			for _, r := range req.GetBatch() {
				serve(r)
			}
			if len(now) > 0 {
				if sends.PushAll(now) {
					drain()
				}
				clear(now)
				now = now[:0]
			}
			mu.Unlock()
		}
	}()
	stop := func() {
		mu.Lock()
		stopped = true
		mu.Unlock()
	}
	defer func() {
		mu.Lock()
		stopped = true
		deadlines.release()
		mu.Unlock()
	}()
	finish := func(err error) error {
		stop()
		wg.Wait() // no Send may follow the handler's return
		if err == nil {
			err = sends.Err()
		}
		return err
	}
	for {
		select {
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

func responseSize(r *pb.PipelineResponse) int { return proto.Size(r) }

// scanEacher is a backend that hands a scan's records to a function as it
// reads them (node.Node.ScanEach).
type scanEacher interface {
	ScanEach(ctx context.Context, req kv.ScanRequest, each func(*kv.Record)) (kv.ScanResult, error)
}

// scanBytes serves a scan whose answer goes in scan_bytes: its records
// encoded as the backend reads them, where it can hand them over.
func (s *grpcService) scanBytes(ctx context.Context, req kv.ScanRequest) ([]byte, error) {
	e := scanBytes{limit: cmp.Or(req.Limit, kv.DefaultPageSize)}
	if b, ok := s.b.(scanEacher); ok {
		res, err := b.ScanEach(ctx, req, e.add)
		if err != nil {
			return nil, err
		}
		return e.finish(res), nil
	}
	res, err := s.b.Scan(ctx, req)
	if err != nil {
		return nil, err
	}
	for i := range res.Items {
		e.add(&res.Items[i])
	}
	return e.finish(res), nil
}

// SendRequests sends the requests q on a client's Pipeline stream s: in
// batches of at most maxBatchBytes when batches (the server announced
// them), else one per message.
func SendRequests(s pb.GroupKV_PipelineClient, q []*pb.PipelineRequest, batches bool) error {
	limit := maxBatchBytes
	if !batches {
		limit = 0
	}
	return sendBatched(q, limit, func(r *pb.PipelineRequest) int { return proto.Size(r) }, s.Send, func(q []*pb.PipelineRequest) error {
		return s.Send(&pb.PipelineRequest{Batch: q})
	})
}

// PipelineBatchKey is the metadata key by which a Pipeline client asks for
// batched responses and a server announces that it reads batched requests
// (see the RPC's comment in proto/groupkv.proto).
const PipelineBatchKey = "groupkv-pipeline-batch"

// PipelineOpsKey is the metadata key by which a Pipeline client asks which
// of the operations beyond get, put and delete the server serves on the
// stream, and the server names those it does, in the stream's header.
const PipelineOpsKey = "groupkv-pipeline-ops"

// PipelineOpScan names scans (PipelineRequest.scan) under PipelineOpsKey.
const PipelineOpScan = "scan"

// PipelineOpScanBytes names scans answered in
// PipelineResponse.scan_bytes under PipelineOpsKey.
const PipelineOpScanBytes = "scan_bytes"

// PipelineOpTxn names a transaction's gets and commits
// (PipelineRequest.txn_get, commit_txn) under PipelineOpsKey.
const PipelineOpTxn = "txn"

// checkPipelineBatch refuses a request whose batch holds a batch.
func checkPipelineBatch(req *pb.PipelineRequest) error {
	for _, r := range req.GetBatch() {
		if len(r.GetBatch()) > 0 {
			return status.Error(codes.InvalidArgument, "a request in a Pipeline batch holds a batch of its own")
		}
	}
	return nil
}

// sharedDeadlines gives the requests of a stream their timeouts without a
// timer each: requests whose deadlines fall within deadlineSlack of one
// another share one context, whose deadline is at most 2×deadlineSlack
// later than each asked for (never earlier). A context replaced ends at its
// deadline, or with the stream's. Owned by the stream's receiving loop.
type sharedDeadlines struct {
	ctx      context.Context
	cancel   context.CancelFunc
	deadline time.Time
}

// deadlineSlack bounds how much later than asked a request's deadline
// falls, and how often a stream makes a timer.
const deadlineSlack = 20 * time.Millisecond

func (d *sharedDeadlines) context(parent context.Context, timeout time.Duration) context.Context {
	want := time.Now().Add(timeout)
	if d.ctx != nil && !want.After(d.deadline) && d.deadline.Sub(want) <= 2*deadlineSlack {
		return d.ctx
	}
	d.deadline = want.Add(deadlineSlack)
	d.ctx, d.cancel = context.WithDeadline(parent, d.deadline)
	return d.ctx
}

func (d *sharedDeadlines) release() {
	if d.cancel != nil {
		d.cancel()
	}
}

// pipelined serves one request of a Pipeline stream as the unary RPC of
// the same name serves it; a scan in scan_bytes when scanBytes.
func (s *grpcService) pipelined(ctx context.Context, req *pb.PipelineRequest, scanBytes bool) *pb.PipelineResponse {
	start := time.Now()
	resp := &pb.PipelineResponse{Id: req.GetId()}
	var (
		op    string
		err   error
		began string // the attempt a failed transaction's request began
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
	case *pb.PipelineRequest_Scan:
		op = "scan"
		if scanBytes {
			var b []byte
			if b, err = s.scanBytes(ctx, ScanRequestFromPB(r.Scan)); err == nil {
				resp.Result = &pb.PipelineResponse_ScanBytes{ScanBytes: b}
			}
			break
		}
		var res kv.ScanResult
		if res, err = s.b.Scan(ctx, ScanRequestFromPB(r.Scan)); err == nil {
			// The scan field, encoded here: see appendScanAnswer.
			resp.ProtoReflect().SetUnknown(appendScanAnswer(nil, res))
		}
	case *pb.PipelineRequest_TxnGet:
		op = opTxnGet
		var m *pb.TxnGetResponse
		if m, began, err = s.txnGet(ctx, r.TxnGet); err == nil {
			resp.Result = &pb.PipelineResponse_TxnGet{TxnGet: m}
		}
	case *pb.PipelineRequest_CommitTxn:
		op = opTxnCommit
		var m *pb.CommitTxnResponse
		if m, began, err = s.commitTxn(ctx, r.CommitTxn); err == nil {
			resp.Result = &pb.PipelineResponse_CommitTxn{CommitTxn: m}
		}
	default:
		op = "pipeline"
		err = kv.Errorf(kv.CodeInvalidArgument, "pipelined request %d names no operation: give put, get, delete, scan, txn_get or commit_txn", req.GetId())
	}
	return s.finishPipelined(resp, op, err, began, start)
}

// getNow serves req at once, on the goroutine reading the stream, if it
// is a get the backend answers without waiting (node.Node.GetNow); else
// it returns nil.
func (s *grpcService) getNow(req *pb.PipelineRequest) *pb.PipelineResponse {
	g := req.GetGet()
	if g == nil {
		return nil
	}
	b, ok := s.b.(nowGetter)
	if !ok {
		return nil
	}
	start := time.Now()
	rec, err, ok := b.GetNow(GetRequestFromPB(g))
	if !ok {
		return nil
	}
	a := &getAnswer{}
	a.resp.Id = req.GetId()
	if err == nil {
		a.get = pb.GetResponse{Key: rec.Key, Value: rec.Value, Tags: rec.Tags, Version: rec.Version}
		a.w.Get = &a.get
		a.resp.Result = &a.w
	}
	return s.finishPipelined(&a.resp, "get", err, "", start)
}

// getAnswer is the response to a get, in one allocation.
type getAnswer struct {
	resp pb.PipelineResponse
	w    pb.PipelineResponse_Get
	get  pb.GetResponse
}

// nowGetter is a backend that answers the gets that need no wait at once
// (node.Node.GetNow).
type nowGetter interface {
	GetNow(req kv.GetRequest) (kv.Record, error, bool)
}

// writeAsync starts a put or a delete on a backend that answers it later
// (node.Node.PutAsync, DeleteAsync) and reports whether it did; answer is
// then called once with the response, from a goroutine that must not
// block.
func (s *grpcService) writeAsync(ctx context.Context, req *pb.PipelineRequest, answer func(*pb.PipelineResponse)) bool {
	b, ok := s.b.(asyncWriter)
	if !ok {
		return false
	}
	r := &writeReply{s: s, start: time.Now(), answer: answer}
	r.resp.Id = req.GetId()
	if put := req.GetPut(); put != nil {
		return b.PutAsync(ctx, PutRequestFromPB(put), r.put)
	}
	return b.DeleteAsync(ctx, DeleteRequestFromPB(req.GetDelete()), r.delete)
}

// writeReply answers a put or delete of a Pipeline stream: its response,
// in one allocation with what answers it.
type writeReply struct {
	s      *grpcService
	start  time.Time
	answer func(*pb.PipelineResponse)
	resp   pb.PipelineResponse
	put1   pb.PipelineResponse_Put
	putR   pb.PutResponse
	del1   pb.PipelineResponse_Delete
	delR   pb.DeleteResponse
}

func (r *writeReply) put(v uint64, err error) {
	if err == nil {
		r.putR.Version = v
		r.put1.Put = &r.putR
		r.resp.Result = &r.put1
	}
	r.answer(r.s.finishPipelined(&r.resp, "put", err, "", r.start))
}

func (r *writeReply) delete(v uint64, err error) {
	if err == nil {
		r.delR.Version = v
		r.del1.Delete = &r.delR
		r.resp.Result = &r.del1
	}
	r.answer(r.s.finishPipelined(&r.resp, "delete", err, "", r.start))
}

// asyncWriter is a backend that starts a put or a delete and answers it
// later, where it can (node.Node.PutAsync, DeleteAsync).
type asyncWriter interface {
	PutAsync(ctx context.Context, req kv.PutRequest, done func(uint64, error)) bool
	DeleteAsync(ctx context.Context, req kv.DeleteRequest, done func(uint64, error)) bool
}

// finishPipelined completes resp, the response to a request of kind op
// begun at start: the error err, if any (began: the attempt a failed
// transaction's request began), and the request's metrics.
func (s *grpcService) finishPipelined(resp *pb.PipelineResponse, op string, err error, began string, start time.Time) *pb.PipelineResponse {
	var code kv.Code
	if err != nil {
		e := pipelineErrorToPB(err)
		e.Txn = began
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

// pipelineErrorToPB is what StatusFromError makes of err, as a
// PipelineError.
func pipelineErrorToPB(err error) *pb.PipelineError {
	st, code := StatusFromError(err)
	return &pb.PipelineError{Code: string(code), Message: st.Message(), GrpcCode: uint32(st.Code())}
}

// PipelineErrorFromPB is the error ErrorFromStatus gives for the unary
// RPC's failure that e describes.
func PipelineErrorFromPB(e *pb.PipelineError, mayHaveRun bool) error {
	if e.GetCode() != "" {
		return &kv.Error{Code: kv.Code(e.GetCode()), Message: e.GetMessage()}
	}
	return ErrorFromStatus(status.Error(codes.Code(e.GetGrpcCode()), e.GetMessage()), mayHaveRun)
}

// PipelineEnd is the error of a request in flight on a Pipeline stream
// that ended with err (its Recv's error): unavailable when the server
// drained it (the request was not served), else what ErrorFromStatus
// makes of err with mayHaveRun.
func PipelineEnd(err error, mayHaveRun bool) error {
	if st, ok := status.FromError(err); ok {
		for _, d := range st.Details() {
			if d, ok := d.(*pb.ErrorDetail); ok && d.GetCode() == PipelineDrained {
				return kv.Errorf(kv.CodeUnavailable, "%s", st.Message())
			}
		}
	}
	return ErrorFromStatus(err, mayHaveRun)
}

// IsUnimplemented reports whether err is the status of an RPC the server
// does not know.
func IsUnimplemented(err error) bool {
	return status.Code(err) == codes.Unimplemented
}
