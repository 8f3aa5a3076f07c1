package linearizability

import (
	"sync"
	"sync/atomic"
	"time"
)

// epoch is the origin of every Recorder's clock.
var epoch = time.Now()

// clock is a shared, strictly increasing clock: nanoseconds of Go's monotonic
// clock since epoch, bumped by one where two readings would otherwise tie or
// go backwards. Readings are totally ordered by one atomic variable, so a
// reading taken after another completed (in real time) is greater.
type clock struct {
	last atomic.Int64
}

func (c *clock) now() int64 {
	t := int64(time.Since(epoch))
	for {
		last := c.last.Load()
		next := max(t, last+1)
		if c.last.CompareAndSwap(last, next) {
			return next
		}
	}
}

// Recorder records a history of operations issued concurrently by the clients
// of a test. Its zero value is ready to use; it is safe for concurrent use.
//
// Each client calls Begin just before it sends an operation and End on the
// returned Pending just after the answer arrives (or Fail if the operation
// definitely did not take effect):
//
//	p := rec.Begin(client, linearizability.Put(key, value))
//	v, err := db.Put(ctx, req)
//	switch {
//	case err == nil:
//		p.End(linearizability.PutOK(v))
//	case refusedBeforeProposing(err): // not the leader, unavailable
//		p.Fail()
//	default: // timeout, lost connection, commit_unknown
//		p.End(linearizability.Unknown())
//	}
//
// Take care with errors a client library maps for convenience: a context
// deadline is an unknown outcome, not a refusal.
type Recorder struct {
	// Timeout bounds Recorder.Check; zero means DefaultTimeout.
	Timeout time.Duration
	// Dir is where Recorder.Check writes visualisations; empty means
	// os.TempDir().
	Dir string

	clock clock
	mu    sync.Mutex
	ops   []record
}

// record is one operation of a Recorder and how far it got.
type record struct {
	op    Operation
	state recordState
}

type recordState uint8

const (
	pending recordState = iota
	ended
	failed
)

// Pending is an operation that has begun and not yet ended. Exactly one of
// End and Fail must be called on it, once.
type Pending struct {
	r *Recorder
	i int
}

// Begin records that client invokes op now and returns the pending
// operation. Clients are small non-negative integers (they label the rows of
// the visualisation); a client must not have two operations pending at once
// for the history to read well, though the checker does not require it.
func (r *Recorder) Begin(client int, op Op) *Pending {
	call := r.clock.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = append(r.ops, record{op: Operation{Client: client, Op: op, Call: call}})
	return &Pending{r: r, i: len(r.ops) - 1}
}

// End records that the operation returned now with outcome out. An unknown
// outcome (out.OK false) keeps the operation in the history as possibly
// taking effect at any time after its invocation; an unknown get, which
// constrains nothing, is left out of the check.
func (p *Pending) End(out Outcome) {
	ret := p.r.clock.now()
	p.finish(func(rec *record) {
		rec.op.Out, rec.op.Return, rec.state = out, ret, ended
	})
}

// Fail records that the operation definitely did not take effect (it was
// refused, sent to a node that is not the leader, or found the service
// unavailable before proposing); it is dropped from the history.
func (p *Pending) Fail() {
	p.finish(func(rec *record) { rec.state = failed })
}

func (p *Pending) finish(f func(*record)) {
	p.r.mu.Lock()
	defer p.r.mu.Unlock()
	rec := &p.r.ops[p.i]
	if rec.state != pending {
		panic("linearizability: End or Fail called twice on one operation: " + rec.op.Op.String())
	}
	f(rec)
}

// History returns the operations recorded so far, in order of invocation,
// without the failed ones. An operation still pending is included with an
// unknown outcome, returning now: a client that never got an answer cannot
// know whether its operation took effect.
func (r *Recorder) History() History {
	now := r.clock.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	h := make(History, 0, len(r.ops))
	for _, rec := range r.ops {
		switch rec.state {
		case ended:
			h = append(h, rec.op)
		case pending:
			op := rec.op
			op.Out, op.Return = Unknown(), now
			h = append(h, op)
		}
	}
	return h
}
