package node

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/groupkv/groupkv/internal/shard"
	"github.com/groupkv/groupkv/internal/txn"
)

// Records of finished transactions.
//
// A transaction's record is needed while anyone may still look it up: a
// reader meeting one of its intents, a waiter following the transaction
// from attempt to attempt, a retry linking itself to the attempt it
// retries. Its coordinator knows when the first is over: once the attempt
// is decided and every participant's resolve applied, no intent of it is
// left. The others look soon after the end (a waiter within
// TxnCheckInterval, a retry within TxnIdleTimeout, which is how long the
// coordinator remembers an aborted attempt for it), so the coordinator
// removes the record TxnRecordRetention later (KindTxnForget, many records
// to a proposal). A record it cannot vouch for — the attempt's outcome
// unknown, a resolve that did not apply, a coordinator that stopped before
// the retention passed — stays, unless it is an ABORTED record another
// node wrote (a wound, an expiry): that node removes it too, once the
// attempt is past its commit deadline (forgetAbortedLater).
//
// Should a record be looked up after all, its absence reads as PENDING:
// the attempt's start is long past its expiry, so whoever looks aborts it
// (writing an ABORTED record), which is the truth for an aborted attempt;
// a committed attempt has no intent left to misjudge.

// maxForgetQueue bounds the records a node waits to remove; past it, new
// ones are left in place (counted in groupkv_txn_records_kept_total).
const maxForgetQueue = 1 << 20

// maxForgetBatch bounds the records one KindTxnForget names.
const maxForgetBatch = 1024

type recordForgetter struct {
	mu    sync.Mutex
	queue []forgetEntry

	forgotten prometheus.Counter
	kept      prometheus.Counter
	waiting   prometheus.GaugeFunc
}

type forgetEntry struct {
	due time.Time
	ref shard.TxnRecordRef
}

func newRecordForgetter(reg *prometheus.Registry) *recordForgetter {
	f := &recordForgetter{}
	f.forgotten = registerCounter(reg, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "groupkv_txn_records_forgotten_total",
		Help: "Records of finished transactions this node removed once their retention passed.",
	})).(prometheus.Counter)
	f.kept = registerCounter(reg, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "groupkv_txn_records_kept_total",
		Help: "Records of finished transactions this node could not remove (its queue was full, or the removal failed); they stay in storage.",
	})).(prometheus.Counter)
	f.waiting = registerCounter(reg, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "groupkv_txn_records_to_forget",
		Help: "Records of finished transactions waiting for their retention to pass before this node removes them.",
	}, func() float64 {
		f.mu.Lock()
		defer f.mu.Unlock()
		return float64(len(f.queue))
	})).(prometheus.GaugeFunc)
	return f
}

// forgetInterval is how often a node removes the records whose retention
// passed.
func (n *Node) forgetInterval() time.Duration {
	if n.opts.TxnRecordRetention < 0 {
		return 10 * time.Second // records are kept: nothing is ever queued
	}
	return min(max(n.opts.TxnRecordRetention/4, 10*time.Millisecond), 10*time.Second)
}

// forgetRecordLater removes the record of attempt m, which is decided and
// has no intent left anywhere, once TxnRecordRetention has passed.
func (n *Node) forgetRecordLater(m txn.Meta) {
	n.forgetRecordAfter(m, n.opts.TxnRecordRetention)
}

// forgetRecordAfter removes the decided record of attempt m after d.
func (n *Node) forgetRecordAfter(m txn.Meta, d time.Duration) {
	if n.opts.TxnRecordRetention < 0 || !m.Anchor.IsSet() {
		return
	}
	f := n.forgetter
	e := forgetEntry{due: time.Now().Add(d), ref: shard.TxnRecordRef{ID: m.ID, Anchor: m.Anchor}}
	f.mu.Lock()
	full := len(f.queue) >= maxForgetQueue
	if !full {
		f.queue = append(f.queue, e)
	}
	f.mu.Unlock()
	if full {
		f.kept.Inc()
	}
}

// forgetAbortedLater removes the ABORTED record of attempt m, which this
// node aborted on another's behalf (a wound, an expiry), once m can no
// longer commit either way: past TxnRecordRetention and past m's commit
// deadline (MaxTxnDuration from its start, which came before now; a commit
// past it aborts). Removed, the record reads as PENDING to whoever looks,
// an attempt long expired, which they abort: the same outcome, so intents
// of m still in place are resolved alike.
func (n *Node) forgetAbortedLater(m txn.Meta) {
	n.forgetRecordAfter(m, max(n.opts.TxnRecordRetention, n.opts.MaxTxnDuration+n.opts.TxnTimeout))
}

// forgetDueRecords removes the records whose retention passed, in one
// proposal per anchor shard (and per maxForgetBatch records).
func (n *Node) forgetDueRecords() {
	f := n.forgetter
	now := time.Now()
	f.mu.Lock()
	var taken []forgetEntry
	left := 0
	for _, e := range f.queue {
		if e.due.After(now) {
			f.queue[left] = e
			left++
			continue
		}
		taken = append(taken, e)
	}
	clear(f.queue[left:])
	f.queue = f.queue[:left]
	f.mu.Unlock()
	// An aborted attempt this node still remembers for its retry keeps its
	// record until the retry has linked itself to it (beginSession): a
	// link that found no record would write one anew. It waits another
	// retention; the memory lasts TxnIdleTimeout.
	var refs []shard.TxnRecordRef
	var again []forgetEntry
	n.txns.mu.Lock()
	for _, e := range taken {
		if _, ok := n.txns.ended[e.ref.ID]; ok {
			again = append(again, forgetEntry{due: now.Add(n.opts.TxnRecordRetention), ref: e.ref})
			continue
		}
		refs = append(refs, e.ref)
	}
	n.txns.mu.Unlock()
	if len(again) > 0 {
		f.mu.Lock()
		f.queue = append(f.queue, again...)
		f.mu.Unlock()
	}
	if len(refs) == 0 {
		return
	}
	byShard := map[uint64][]shard.TxnRecordRef{}
	for _, r := range refs {
		id, err := n.anchorShard(r.Anchor)
		if err != nil {
			f.kept.Inc() // its collection is gone, or the node cannot route
			continue
		}
		byShard[id] = append(byShard[id], r)
	}
	for id, rs := range byShard {
		for len(rs) > 0 {
			batch := rs[:min(len(rs), maxForgetBatch)]
			rs = rs[len(batch):]
			ctx, cancel := context.WithTimeout(context.Background(), n.retryWindow())
			res, err := n.propose(ctx, id, shard.EncodeTxnForget(&shard.TxnForgetCmd{Records: batch}))
			cancel()
			if err != nil || res.Err != nil {
				// Left in place; a later look-up finds it as it was.
				n.log.Debug("removing finished transactions' records failed; they stay", "shard", id, "records", len(batch), "err", err, "refused", res.Err)
				f.kept.Add(float64(len(batch)))
				continue
			}
			f.forgotten.Add(float64(res.Count))
			if skipped := len(batch) - res.Count; skipped > 0 {
				// Already gone, never written (a one-phase commit that
				// left none) or moved away by a split or merge.
				n.log.Debug("some finished transactions' records were not there to remove", "shard", id, "records", skipped)
			}
		}
	}
}
