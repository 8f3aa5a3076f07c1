package elle

import (
	"slices"
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

// Recorder records a history of transactions run concurrently by the
// clients of a test. Its zero value is ready to use; it is safe for
// concurrent use.
//
// Each client calls Invoke just before it sends a transaction and Complete
// on the returned Pending once it knows the outcome:
//
//	p := rec.Invoke(client, []elle.Op{elle.Read("x"), elle.Append("y", v)})
//	xs, err := runTxn(ctx, ...)
//	switch {
//	case err == nil:
//		p.Complete([]elle.Op{elle.Read("x", xs...), elle.Append("y", v)}, elle.OK)
//	case abortedForSure(err): // conflict, refused before proposing
//		p.Complete(nil, elle.Fail)
//	default: // timeout, lost connection, commit unknown
//		p.Complete(nil, elle.Info)
//	}
//
// Take care with errors a client library maps for convenience: a context
// deadline is an unknown outcome (Info), not an abort.
type Recorder struct {
	clock clock
	mu    struct {
		sync.Mutex
		// txns[i] has ID i. done[i] reports that Complete was called on it.
		txns []Txn
		done []bool
	}
}

// Pending is a transaction that has been invoked and not yet completed.
// Complete must be called on it once.
type Pending struct {
	r *Recorder
	i int
}

// Invoke records that process invokes a transaction now and returns it,
// pending. ops are the micro-operations the transaction will run, reads
// without results; they stand for the transaction if it never completes.
// Transactions get IDs 0, 1, 2… in order of invocation.
func (r *Recorder) Invoke(process int, ops []Op) *Pending {
	at := r.clock.now()
	ops = cloneOps(ops)
	r.mu.Lock()
	defer r.mu.Unlock()
	i := len(r.mu.txns)
	r.mu.txns = append(r.mu.txns, Txn{ID: i, Process: process, Invoke: at, Outcome: Info, Ops: ops})
	r.mu.done = append(r.mu.done, false)
	return &Pending{r: r, i: i}
}

// ID returns the transaction's ID in the history.
func (p *Pending) ID() int { return p.i }

// Complete records that the transaction completed now with outcome out.
// ops are the micro-operations as run, each read with the list it
// observed; nil keeps those given to Invoke (enough for Fail and Info, whose
// reads are ignored). The Recorder copies ops.
func (p *Pending) Complete(ops []Op, out Outcome) {
	at := p.r.clock.now()
	ops = cloneOps(ops)
	p.r.mu.Lock()
	defer p.r.mu.Unlock()
	if p.r.mu.done[p.i] {
		panic("elle: Complete called twice on one transaction")
	}
	p.r.mu.done[p.i] = true
	t := &p.r.mu.txns[p.i]
	t.Complete, t.Outcome = at, out
	if ops != nil {
		t.Ops = ops
	}
}

// History returns a copy of the transactions recorded so far, in order of
// invocation. A transaction still pending is included with outcome Info: a
// client that never got an answer cannot know whether it committed.
func (r *Recorder) History() History {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := make(History, len(r.mu.txns))
	for i, t := range r.mu.txns {
		t.Ops = cloneOps(t.Ops)
		h[i] = t
	}
	return h
}

// cloneOps copies ops and the lists of their reads.
func cloneOps(ops []Op) []Op {
	if ops == nil {
		return nil
	}
	c := slices.Clone(ops)
	for i := range c {
		c[i].Values = slices.Clone(c[i].Values)
	}
	return c
}
