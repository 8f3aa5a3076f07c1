package api

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/groupkv/groupkv/internal/kv"
	pb "github.com/groupkv/groupkv/proto/groupkvpb"
)

// PipelineClient sends requests as messages of one Pipeline stream instead
// of unary RPCs: a remote Go client's single-key requests (Get, Put,
// Delete), its short scans, and its transactions' gets and commits where
// the server serves those there (TxnAttempt). A message on an open stream
// costs client and server a fraction of an RPC (no stream to open, no
// headers and trailers to encode and parse). The requests in flight on it
// are answered as each completes.
//
// The stream is opened on first use and again after it ended. A request in
// flight when it broke fails as a unary RPC whose connection broke does:
// unavailable, or for a write commit_unknown (it may have been applied);
// when the server ended it on purpose (shutting down), the requests it did
// not answer were not served and fail unavailable. A server without the
// RPC (older than this client) answers unimplemented: the pipeline is then
// off for good, and requests go as unary RPCs (ErrPipelineOff). After
// Close every call fails unavailable.
type PipelineClient struct {
	c pb.GroupKVClient

	mu      sync.Mutex
	off     bool // the server has no Pipeline RPC
	closed  bool
	stream  *pipeStream
	opening chan struct{} // closed when the stream being opened is ready or failed
}

// pipeStream is one Pipeline stream and its requests in flight.
type pipeStream struct {
	s      pb.GroupKV_PipelineClient
	cancel context.CancelFunc

	// sends coalesces the requests of concurrent calls; batches says the
	// server announced that it reads batches (in the stream's header),
	// after which the requests queued while a send was under way go in
	// one message.
	sends   Coalescer[*pb.PipelineRequest]
	batches atomic.Bool
	// header is closed once the stream's header was read (or failed).
	header chan struct{}
	// scans and txns say the server announced that it serves scans, and
	// transactions' gets and commits, on the stream (in its header); until
	// then they go as unary RPCs.
	scans, txns atomic.Bool

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]*pipeCall
	err     error // the stream's end (its Recv's error); nothing is added after
}

type pipeCall struct {
	done chan struct{}
	resp *pb.PipelineResponse
	err  error // the stream's end, if it ended before the answer
	// late, set when the caller gave up waiting, takes the answer instead
	// (under the stream's mu).
	late func(*pb.PipelineResponse)
}

// PipelineMaxValue is the largest value a Go client's put sends on the
// pipeline, and PipelineMaxMessage the largest transaction's commit: the
// messages of one stream go one after the other, and a larger one would
// hold up the requests behind it while it is sent.
const (
	PipelineMaxValue   = 64 << 10
	PipelineMaxMessage = 64 << 10
)

// PipelineMaxScan is the largest page a Go client's scan asks for on the
// pipeline: as with values (PipelineMaxValue), a long answer would hold up
// the answers behind it.
const PipelineMaxScan = 128

// ErrPipelineOff says the server has no Pipeline RPC: send a unary RPC.
var ErrPipelineOff = kv.Errorf(kv.CodeUnimplemented, "the server has no Pipeline RPC")

// ErrPipelineNoOp says the stream's server has not announced the request's
// operation (a scan, a transaction's get or commit): send it as a unary
// RPC.
var ErrPipelineNoOp = kv.Errorf(kv.CodeUnimplemented, "the server does not serve this operation on its Pipeline stream")

// NewPipelineClient returns a PipelineClient over c; it opens no stream
// before its first call.
func NewPipelineClient(c pb.GroupKVClient) *PipelineClient { return &PipelineClient{c: c} }

// Call sends req and waits for its answer: its response, or the error of
// the request (PipelineErrorFromPB) or of the stream. write says whether
// req writes: if the stream breaks after it was sent, its outcome is
// unknown. ErrPipelineOff and ErrPipelineNoOp say that req was not sent
// and must go as a unary RPC.
func (p *PipelineClient) Call(ctx context.Context, req *pb.PipelineRequest, write bool) (*pb.PipelineResponse, error) {
	resp, err := p.Exchange(ctx, req, write, nil)
	if err != nil {
		return nil, err
	}
	if e := resp.GetError(); e != nil {
		return nil, PipelineErrorFromPB(e, write)
	}
	return resp, nil
}

// Exchange is Call answering a response that holds a PipelineError as it
// is: an error is returned only when no response came (or when req must go
// as a unary RPC). If ctx ends before the response comes, late (when not
// nil) is called with it once it does, on the stream's receiving goroutine
// (it must not block); it is never called if the stream ends first.
func (p *PipelineClient) Exchange(ctx context.Context, req *pb.PipelineRequest, write bool, late func(*pb.PipelineResponse)) (*pb.PipelineResponse, error) {
	resp, err := p.exchange(ctx, req, write, late)
	if err != nil && err != ErrPipelineOff && err != ErrPipelineNoOp && p.isClosed() {
		return nil, kv.Errorf(kv.CodeUnavailable, "the DB is closed: Dial again")
	}
	return resp, err
}

func (p *PipelineClient) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

func (p *PipelineClient) exchange(ctx context.Context, req *pb.PipelineRequest, write bool, late func(*pb.PipelineResponse)) (*pb.PipelineResponse, error) {
	if err := ctx.Err(); err != nil {
		return nil, ErrorFromStatus(status.FromContextError(err).Err(), false)
	}
	if dl, ok := ctx.Deadline(); ok {
		req.TimeoutMicros = uint64(max(time.Until(dl)/time.Microsecond, 1))
	}
	var (
		ps *pipeStream
		c  = &pipeCall{done: make(chan struct{})}
	)
	for {
		var err error
		if ps, err = p.open(ctx); err != nil {
			return nil, err
		}
		if req.GetScan() != nil && !ps.scans.Load() ||
			(req.GetTxnGet() != nil || req.GetCommitTxn() != nil) && !ps.txns.Load() {
			return nil, ErrPipelineNoOp
		}
		ps.mu.Lock()
		if ps.err == nil {
			ps.nextID++
			req.Id = ps.nextID
			ps.pending[req.Id] = c
			ps.mu.Unlock()
			break
		}
		// It ended since open returned it: nothing was sent on it, and
		// the next open makes a new one (or finds the pipeline off).
		ps.mu.Unlock()
		p.forget(ps)
	}
	if err := ps.sends.Add(req, ps.send); err != nil {
		// The stream ended; its receiver answers every call in flight
		// (this one with them) with the reason.
		ps.cancel()
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		ps.mu.Lock()
		_, waiting := ps.pending[req.Id]
		if waiting && late != nil {
			c.late = late
		} else {
			delete(ps.pending, req.Id)
		}
		ps.mu.Unlock()
		if !waiting && late != nil {
			<-c.done // answered, or the stream ended, since ctx did
			if c.resp != nil {
				late(c.resp)
			}
		}
		return nil, ErrorFromStatus(status.FromContextError(ctx.Err()).Err(), write)
	}
	if c.err != nil {
		if IsUnimplemented(c.err) {
			return nil, ErrPipelineOff
		}
		return nil, PipelineEnd(c.err, write)
	}
	return c.resp, nil
}

// Open opens the stream if none is open and waits for its header, in which
// the server names what it serves on it: the requests sent before it came
// go as unary RPCs where they need the server to have named them (scans,
// transactions). A server older than the batches of the stream sends its
// header with its first answer: Open then waits until ctx ends.
func (p *PipelineClient) Open(ctx context.Context) error {
	ps, err := p.open(ctx)
	if err != nil {
		return err
	}
	select {
	case <-ps.header:
		return nil
	case <-ctx.Done():
		return ErrorFromStatus(status.FromContextError(ctx.Err()).Err(), false)
	}
}

// open returns the open stream, opening one if there is none.
func (p *PipelineClient) open(ctx context.Context) (*pipeStream, error) {
	for {
		p.mu.Lock()
		switch {
		case p.off:
			p.mu.Unlock()
			return nil, ErrPipelineOff
		case p.closed:
			p.mu.Unlock()
			return nil, kv.Errorf(kv.CodeUnavailable, "the DB is closed: Dial again")
		case p.stream != nil:
			ps := p.stream
			p.mu.Unlock()
			return ps, nil
		case p.opening != nil:
			ch := p.opening
			p.mu.Unlock()
			select {
			case <-ch:
			case <-ctx.Done():
				return nil, ErrorFromStatus(status.FromContextError(ctx.Err()).Err(), false)
			}
			continue
		}
		ch := make(chan struct{})
		p.opening = ch
		p.mu.Unlock()

		// The stream outlives the request that opens it: its context ends
		// when the stream is forgotten or the DB closed.
		sctx, cancel := context.WithCancel(context.Background())
		s, err := p.c.Pipeline(metadata.AppendToOutgoingContext(sctx, PipelineBatchKey, "1", PipelineOpsKey, PipelineOpScan, PipelineOpsKey, PipelineOpScanBytes, PipelineOpsKey, PipelineOpTxn))
		p.mu.Lock()
		p.opening = nil
		close(ch)
		switch {
		case err != nil:
			p.mu.Unlock()
			cancel()
			if IsUnimplemented(err) {
				p.setOff()
				return nil, ErrPipelineOff
			}
			return nil, ErrorFromStatus(err, false)
		case p.closed:
			p.mu.Unlock()
			cancel()
			return nil, kv.Errorf(kv.CodeUnavailable, "the DB is closed: Dial again")
		}
		ps := &pipeStream{s: s, cancel: cancel, pending: map[uint64]*pipeCall{}, header: make(chan struct{})}
		p.stream = ps
		p.mu.Unlock()
		go p.receive(ps)
		return ps, nil
	}
}

func (p *PipelineClient) setOff() {
	p.mu.Lock()
	p.off = true
	p.mu.Unlock()
}

// forget drops ps as the open stream, if it still is.
func (p *PipelineClient) forget(ps *pipeStream) {
	p.mu.Lock()
	if p.stream == ps {
		p.stream = nil
	}
	p.mu.Unlock()
}

// send sends the requests queued on ps (Coalescer): in batches when
// the server reads them.
func (ps *pipeStream) send(q []*pb.PipelineRequest) error {
	return SendRequests(ps.s, q, ps.batches.Load())
}

// receive hands ps's answers to their calls until it ends, then answers
// the calls still in flight on it with the reason and forgets it. It reads
// the stream's header first: a server that reads batches, or serves scans
// or transactions, says so there (an older one sends its header with its first answer, and
// until then the requests go one per message, and scans as unary RPCs).
func (p *PipelineClient) receive(ps *pipeStream) {
	if md, err := ps.s.Header(); err == nil {
		ps.batches.Store(slices.Contains(md.Get(PipelineBatchKey), "1"))
		ps.scans.Store(slices.Contains(md.Get(PipelineOpsKey), PipelineOpScan))
		ps.txns.Store(slices.Contains(md.Get(PipelineOpsKey), PipelineOpTxn))
	}
	close(ps.header)
	for {
		resp, err := ps.s.Recv()
		if err != nil {
			ps.mu.Lock()
			ps.err = err
			pending := ps.pending
			ps.pending = nil
			ps.mu.Unlock()
			p.forget(ps)
			if IsUnimplemented(err) {
				p.setOff()
			}
			ps.cancel()
			for _, c := range pending {
				c.err = err
				close(c.done)
			}
			return
		}
		if len(resp.GetBatch()) == 0 {
			ps.answer(resp)
			continue
		}
		for _, r := range resp.GetBatch() {
			ps.answer(r)
		}
	}
}

// answer hands resp to its call.
func (ps *pipeStream) answer(resp *pb.PipelineResponse) {
	ps.mu.Lock()
	c := ps.pending[resp.GetId()]
	delete(ps.pending, resp.GetId())
	var late func(*pb.PipelineResponse)
	if c != nil {
		late = c.late
	}
	ps.mu.Unlock()
	switch {
	case c == nil: // its caller gave up waiting
	case late != nil:
		late(resp)
	default:
		c.resp = resp
		close(c.done)
	}
}

// Close ends the open stream, failing the calls in flight on it, and
// opens no other.
func (p *PipelineClient) Close() {
	p.mu.Lock()
	p.closed = true
	ps := p.stream
	p.stream = nil
	p.mu.Unlock()
	if ps != nil {
		ps.cancel()
	}
}

// PipelineMethod names the unary RPC that serves what the Pipeline request
// r asks for ("Get", "TxnGet", ...), "" for a batch or a request that names
// no operation.
func PipelineMethod(r *pb.PipelineRequest) string {
	switch r.GetOp().(type) {
	case *pb.PipelineRequest_Put:
		return "Put"
	case *pb.PipelineRequest_Get:
		return "Get"
	case *pb.PipelineRequest_Delete:
		return "Delete"
	case *pb.PipelineRequest_Scan:
		return "Scan"
	case *pb.PipelineRequest_TxnGet:
		return "TxnGet"
	case *pb.PipelineRequest_CommitTxn:
		return "CommitTxn"
	}
	return ""
}
