package groupkv

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/groupkv/groupkv/internal/api"
	"github.com/groupkv/groupkv/internal/kv"
	pb "github.com/groupkv/groupkv/proto/groupkvpb"
)

// pipeline sends a remote DB's single-key requests (Get, Put, Delete), and
// its short scans where the server serves them there, as messages of one
// Pipeline stream instead of unary RPCs: a message on an
// open stream costs client and server a fraction of an RPC (no stream to
// open, no headers and trailers to encode and parse). The requests in
// flight on it are answered as each completes.
//
// The stream is opened on first use and again after it ended. A request in
// flight when it broke fails as a unary RPC whose connection broke does:
// unavailable, or for a write commit_unknown (it may have been applied);
// when the server ended it on purpose (shutting down), the requests it did
// not answer were not served and fail unavailable. A server without the
// RPC (older than this client) answers unimplemented: the pipeline is then
// off for good, and requests go as unary RPCs (errPipelineOff).
type pipeline struct {
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
	sends   api.Coalescer[*pb.PipelineRequest]
	batches atomic.Bool
	// scans says the server announced that it serves scans on the stream
	// (in its header); until then a scan goes as a unary RPC.
	scans atomic.Bool

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

// pipelineMaxValue is the largest value a put sends on the pipeline: the
// messages of one stream go one after the other, and a larger one would
// hold up the requests behind it while it is sent.
const pipelineMaxValue = 64 << 10

// pipelineMaxScan is the largest page a scan asks for on the pipeline: as
// with values (pipelineMaxValue), a long answer would hold up the answers
// behind it.
const pipelineMaxScan = 128

// errPipelineOff says the server has no Pipeline RPC: send a unary RPC.
var errPipelineOff = kv.Errorf(kv.CodeUnimplemented, "the server has no Pipeline RPC")

// errPipelineNoScan says the stream's server has not announced scans: send
// the scan as a unary RPC.
var errPipelineNoScan = kv.Errorf(kv.CodeUnimplemented, "the server serves no scans on its Pipeline stream")

// call sends req and waits for its answer. write says whether req writes:
// if the stream breaks after it was sent, its outcome is unknown.
func (p *pipeline) call(ctx context.Context, req *pb.PipelineRequest, write bool) (*pb.PipelineResponse, error) {
	if err := ctx.Err(); err != nil {
		return nil, api.ErrorFromStatus(status.FromContextError(err).Err(), false)
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
		if req.GetScan() != nil && !ps.scans.Load() {
			return nil, errPipelineNoScan
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
		delete(ps.pending, req.Id)
		ps.mu.Unlock()
		return nil, api.ErrorFromStatus(status.FromContextError(ctx.Err()).Err(), write)
	}
	if c.err != nil {
		if api.IsUnimplemented(c.err) {
			return nil, errPipelineOff
		}
		return nil, api.PipelineEnd(c.err, write)
	}
	if e := c.resp.GetError(); e != nil {
		return nil, api.PipelineErrorFromPB(e, write)
	}
	return c.resp, nil
}

// open returns the open stream, opening one if there is none.
func (p *pipeline) open(ctx context.Context) (*pipeStream, error) {
	for {
		p.mu.Lock()
		switch {
		case p.off:
			p.mu.Unlock()
			return nil, errPipelineOff
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
				return nil, api.ErrorFromStatus(status.FromContextError(ctx.Err()).Err(), false)
			}
			continue
		}
		ch := make(chan struct{})
		p.opening = ch
		p.mu.Unlock()

		// The stream outlives the request that opens it: its context ends
		// when the stream is forgotten or the DB closed.
		sctx, cancel := context.WithCancel(context.Background())
		s, err := p.c.Pipeline(metadata.AppendToOutgoingContext(sctx, api.PipelineBatchKey, "1", api.PipelineOpsKey, api.PipelineOpScan))
		p.mu.Lock()
		p.opening = nil
		close(ch)
		switch {
		case err != nil:
			p.mu.Unlock()
			cancel()
			if api.IsUnimplemented(err) {
				p.setOff()
				return nil, errPipelineOff
			}
			return nil, api.ErrorFromStatus(err, false)
		case p.closed:
			p.mu.Unlock()
			cancel()
			return nil, kv.Errorf(kv.CodeUnavailable, "the DB is closed: Dial again")
		}
		ps := &pipeStream{s: s, cancel: cancel, pending: map[uint64]*pipeCall{}}
		p.stream = ps
		p.mu.Unlock()
		go p.receive(ps)
		return ps, nil
	}
}

func (p *pipeline) setOff() {
	p.mu.Lock()
	p.off = true
	p.mu.Unlock()
}

// forget drops ps as the open stream, if it still is.
func (p *pipeline) forget(ps *pipeStream) {
	p.mu.Lock()
	if p.stream == ps {
		p.stream = nil
	}
	p.mu.Unlock()
}

// send sends the requests queued on ps (api.Coalescer): in batches when
// the server reads them.
func (ps *pipeStream) send(q []*pb.PipelineRequest) error {
	return api.SendRequests(ps.s, q, ps.batches.Load())
}

// receive hands ps's answers to their calls until it ends, then answers
// the calls still in flight on it with the reason and forgets it. It reads
// the stream's header first: a server that reads batches, or serves scans,
// says so there (an older one sends its header with its first answer, and
// until then the requests go one per message, and scans as unary RPCs).
func (p *pipeline) receive(ps *pipeStream) {
	if md, err := ps.s.Header(); err == nil {
		ps.batches.Store(slices.Contains(md.Get(api.PipelineBatchKey), "1"))
		ps.scans.Store(slices.Contains(md.Get(api.PipelineOpsKey), api.PipelineOpScan))
	}
	for {
		resp, err := ps.s.Recv()
		if err != nil {
			ps.mu.Lock()
			ps.err = err
			pending := ps.pending
			ps.pending = nil
			ps.mu.Unlock()
			p.forget(ps)
			if api.IsUnimplemented(err) {
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
	ps.mu.Unlock()
	if c != nil { // nil: its caller gave up waiting
		c.resp = resp
		close(c.done)
	}
}

// close ends the open stream, failing the calls in flight on it, and
// opens no other.
func (p *pipeline) close() {
	p.mu.Lock()
	p.closed = true
	ps := p.stream
	p.stream = nil
	p.mu.Unlock()
	if ps != nil {
		ps.cancel()
	}
}
