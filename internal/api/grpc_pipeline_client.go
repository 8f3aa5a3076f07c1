package api

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/groupkv/groupkv/proto/groupkvpb"
)

// Pipeline sends a client's requests as messages of one Pipeline stream
// instead of unary RPCs: a message on an open stream costs client and
// server a fraction of an RPC (no stream to open, no headers and trailers
// to encode and parse). The requests in flight on it are answered as each
// completes. Its zero value is not usable: set C.
//
// Invoke fails as the unary RPC would: with the same status (code,
// message, ErrorDetail), the trailer the unary handler would have set
// (groupkv-code, groupkv-txn) in a grpc.Trailer option, and a grpc.Peer
// option filled once the request was sent. The stream is opened on first
// use and again after it ended. A request in flight when it broke fails
// with the stream's status, as a unary RPC whose connection broke (sent:
// it may have been served); when the server ended it on purpose (shutting
// down), the requests it did not answer were not served: they fail
// UNAVAILABLE as if never sent. A server without the RPC (older than this
// client) answers UNIMPLEMENTED: the pipeline is then off for good, and
// Invoke answers ErrPipelineOff, so that the caller sends a unary RPC.
type Pipeline struct {
	C pb.GroupKVClient

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

	sendMu sync.Mutex

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]*pipeCall
	err     error // the stream's end (its Recv's error); nothing is added after
}

type pipeCall struct {
	done chan struct{}
	resp *pb.PipelineResponse
	err  error // the stream's end, if it ended before the answer
}

// PipelineMaxValue is the largest value a client should send on a
// pipeline: the messages of one stream go one after the other, and a larger
// one would hold up the requests behind it while it is sent.
const PipelineMaxValue = 64 << 10

// ErrPipelineOff says the server has no Pipeline RPC: send a unary RPC.
var ErrPipelineOff = errors.New("api: the server has no Pipeline RPC")

// pipelinePeer is the peer address a grpc.Peer option of a pipelined
// request gets once the request was sent (the stream's own is not known
// to its client).
var pipelinePeer = &net.TCPAddr{}

// Invoke sends req and waits for its answer, and fails as the unary RPC
// would (see Pipeline); opts may hold grpc.Trailer and grpc.Peer options,
// which it fills as the unary RPC would, and no other.
func (p *Pipeline) Invoke(ctx context.Context, req *pb.PipelineRequest, opts ...grpc.CallOption) (*pb.PipelineResponse, error) {
	if err := ctx.Err(); err != nil {
		return nil, status.FromContextError(err).Err()
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
	ps.sendMu.Lock()
	err := ps.s.Send(req)
	ps.sendMu.Unlock()
	if err != nil {
		// The stream ended; its receiver answers every call in flight
		// (this one with them) with the reason.
		ps.cancel()
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		ps.mu.Lock()
		delete(ps.pending, req.Id)
		ps.mu.Unlock()
		setPeer(opts)
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if c.err != nil {
		switch {
		case status.Code(c.err) == codes.Unimplemented:
			return nil, ErrPipelineOff
		case pipelineDrained(c.err):
			// Not served: as if never sent (no peer), and without the
			// detail, whose code is the stream's, not the request's.
			return nil, status.Error(codes.Unavailable, status.Convert(c.err).Message())
		}
		setPeer(opts)
		return nil, c.err
	}
	setPeer(opts)
	e := c.resp.GetError()
	if e == nil {
		return c.resp, nil
	}
	var md metadata.MD
	st := status.New(codes.Code(e.GetGrpcCode()), e.GetMessage())
	if e.GetCode() != "" {
		md = metadata.Pairs(CodeTrailer, e.GetCode())
		if d, err := st.WithDetails(&pb.ErrorDetail{Code: e.GetCode()}); err == nil {
			st = d
		}
	}
	if e.GetTxn() != "" {
		md = metadata.Join(md, metadata.Pairs(TxnTrailer, e.GetTxn()))
	}
	for _, o := range opts {
		if t, ok := o.(grpc.TrailerCallOption); ok {
			*t.TrailerAddr = md
		}
	}
	return nil, st.Err()
}

// setPeer fills the grpc.Peer options of a request that was sent.
func setPeer(opts []grpc.CallOption) {
	for _, o := range opts {
		if p, ok := o.(grpc.PeerCallOption); ok {
			p.PeerAddr.Addr = pipelinePeer
		}
	}
}

// pipelineDrained reports whether err is the status of a stream the
// server ended on purpose (PipelineDrained).
func pipelineDrained(err error) bool {
	st, ok := status.FromError(err)
	if !ok {
		return false
	}
	for _, d := range st.Details() {
		if d, ok := d.(*pb.ErrorDetail); ok && d.GetCode() == PipelineDrained {
			return true
		}
	}
	return false
}

// open returns the open stream, opening one if there is none.
func (p *Pipeline) open(ctx context.Context) (*pipeStream, error) {
	for {
		p.mu.Lock()
		switch {
		case p.off:
			p.mu.Unlock()
			return nil, ErrPipelineOff
		case p.closed:
			p.mu.Unlock()
			return nil, status.Error(codes.Canceled, "the pipeline is closed")
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
				return nil, status.FromContextError(ctx.Err()).Err()
			}
			continue
		}
		ch := make(chan struct{})
		p.opening = ch
		p.mu.Unlock()

		// The stream outlives the request that opens it: its context ends
		// when the stream is forgotten or the DB closed.
		sctx, cancel := context.WithCancel(context.Background())
		s, err := p.C.Pipeline(sctx)
		p.mu.Lock()
		p.opening = nil
		close(ch)
		switch {
		case err != nil:
			p.mu.Unlock()
			cancel()
			if status.Code(err) == codes.Unimplemented {
				p.setOff()
				return nil, ErrPipelineOff
			}
			return nil, err
		case p.closed:
			p.mu.Unlock()
			cancel()
			return nil, status.Error(codes.Canceled, "the pipeline is closed")
		}
		ps := &pipeStream{s: s, cancel: cancel, pending: map[uint64]*pipeCall{}}
		p.stream = ps
		p.mu.Unlock()
		go p.receive(ps)
		return ps, nil
	}
}

func (p *Pipeline) setOff() {
	p.mu.Lock()
	p.off = true
	p.mu.Unlock()
}

// forget drops ps as the open stream, if it still is.
func (p *Pipeline) forget(ps *pipeStream) {
	p.mu.Lock()
	if p.stream == ps {
		p.stream = nil
	}
	p.mu.Unlock()
}

// receive hands ps's answers to their calls until it ends, then answers
// the calls still in flight on it with the reason and forgets it.
func (p *Pipeline) receive(ps *pipeStream) {
	for {
		resp, err := ps.s.Recv()
		if err != nil {
			ps.mu.Lock()
			ps.err = err
			pending := ps.pending
			ps.pending = nil
			ps.mu.Unlock()
			p.forget(ps)
			if status.Code(err) == codes.Unimplemented {
				p.setOff()
			}
			ps.cancel()
			for _, c := range pending {
				c.err = err
				close(c.done)
			}
			return
		}
		ps.mu.Lock()
		c := ps.pending[resp.GetId()]
		delete(ps.pending, resp.GetId())
		ps.mu.Unlock()
		if c != nil { // nil: its caller gave up waiting
			c.resp = resp
			close(c.done)
		}
	}
}

// Close ends the open stream, failing the calls in flight on it, and
// opens no other.
func (p *Pipeline) Close() {
	p.mu.Lock()
	p.closed = true
	ps := p.stream
	p.stream = nil
	p.mu.Unlock()
	if ps != nil {
		ps.cancel()
	}
}
