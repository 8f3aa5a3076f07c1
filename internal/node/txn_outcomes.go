package node

import (
	"sync"
	"time"
)

// The outcomes of the session attempts a node finished, for a commit sent
// again: its client may have lost the first commit's answer, and must
// learn what became of the attempt rather than run the transaction again
// on a guess. A node remembers the outcome of each attempt whose id it
// answered to a client (BeginTxn, BeginGroupTxn) for TxnIdleTimeout after
// the attempt finished, and at most MaxTxnOutcomes of them, forgetting
// the oldest first. A commit of an attempt it does not know — begun
// elsewhere, or forgotten — answers commit_unknown: the id alone does not
// say where the attempt's record is, nor whether it has one.

// txnOutcome is how an attempt ended.
type txnOutcome struct {
	// version is the commit version, when err is nil.
	version uint64
	// err is nil when the attempt committed; else what its commit answers:
	// a txn_aborted error (it did not commit) or a commit_unknown one.
	err error
}

// answer is what a commit of the attempt answers.
func (o txnOutcome) answer() (uint64, error) {
	if o.err != nil {
		return 0, o.err
	}
	return o.version, nil
}

type outcomeEntry struct {
	txnOutcome
	at  time.Time
	seq uint64
}

type outcomeRef struct {
	id  string
	seq uint64
}

// txnOutcomes remembers outcomes, oldest first in order.
type txnOutcomes struct {
	mu    sync.Mutex
	m     map[string]outcomeEntry
	order []outcomeRef // order[head:] are the live references
	head  int
	seq   uint64
}

// add remembers the outcome of attempt id (replacing an earlier one), and
// forgets those older than ttl and the oldest beyond max.
func (t *txnOutcomes) add(id string, o txnOutcome, now time.Time, ttl time.Duration, max int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[string]outcomeEntry{}
	}
	t.seq++
	t.m[id] = outcomeEntry{txnOutcome: o, at: now, seq: t.seq}
	t.order = append(t.order, outcomeRef{id: id, seq: t.seq})
	t.pruneLocked(now, ttl, max)
}

// get answers the outcome of attempt id, if it is remembered and younger
// than ttl.
func (t *txnOutcomes) get(id string, now time.Time, ttl time.Duration) (txnOutcome, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.m[id]
	if !ok || now.Sub(e.at) > ttl {
		return txnOutcome{}, false
	}
	return e.txnOutcome, true
}

// prune forgets the outcomes older than ttl and the oldest beyond max.
func (t *txnOutcomes) prune(now time.Time, ttl time.Duration, max int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pruneLocked(now, ttl, max)
}

func (t *txnOutcomes) pruneLocked(now time.Time, ttl time.Duration, max int) {
	for t.head < len(t.order) {
		r := t.order[t.head]
		e, ok := t.m[r.id]
		switch {
		case !ok || e.seq != r.seq:
			// Replaced by a later outcome, whose reference is further on.
		case len(t.m) > max || now.Sub(e.at) > ttl:
			delete(t.m, r.id)
		default:
			t.compactLocked()
			return
		}
		t.order[t.head] = outcomeRef{}
		t.head++
	}
	t.compactLocked()
}

// compactLocked drops the references before head once they are half of
// order.
func (t *txnOutcomes) compactLocked() {
	if t.head == len(t.order) {
		t.order, t.head = t.order[:0], 0
		return
	}
	if t.head > len(t.order)/2 {
		n := copy(t.order, t.order[t.head:])
		clear(t.order[n:])
		t.order, t.head = t.order[:n], 0
	}
}

// len answers how many outcomes are remembered.
func (t *txnOutcomes) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}

// rememberOutcome remembers how attempt id ended.
func (n *Node) rememberOutcome(id string, o txnOutcome) {
	n.outcomes.add(id, o, time.Now(), n.opts.TxnIdleTimeout, n.opts.MaxTxnOutcomes)
}

// rememberedOutcome answers how attempt id ended, if this node remembers.
func (n *Node) rememberedOutcome(id string) (txnOutcome, bool) {
	return n.outcomes.get(id, time.Now(), n.opts.TxnIdleTimeout)
}
