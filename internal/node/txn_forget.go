package node

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/kv"
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
// coordinator remembers an aborted attempt for it). So the coordinator
// then marks the record removable after TxnRecordRetention (KindTxnForget
// with After, many records to a proposal, at most markInterval later),
// and the leader of the record's shard removes the marked records whose
// time has come (sweepRecords, every forgetInterval). The mark is in the
// record: the removal happens whatever becomes of the coordinator after
// it, a restart included. A record it cannot vouch for — the attempt's
// outcome unknown, a resolve that did not apply, a coordinator that
// stopped before it marked the record — stays, unless it is an ABORTED
// record another node wrote (a wound, an expiry): that node marks it too,
// removable once the attempt is past its commit deadline
// (forgetAbortedLater). Should the node that was to mark a record stop
// first, the leader of the record's shard removes it itself
// (sweepUnmarked): a COMMITTED record that lists its participants (the
// shards it prepared in) once none of them holds the attempt prepared —
// its intents resolved, by its coordinator or, after it stopped, by the
// participants' leaders (txn_orphans.go) — and the retention has passed
// since its commit; an ABORTED record that keeps its abort time, once
// forgetAbortedLater's time has passed since.
//
// Should a record be looked up after all, its absence reads as PENDING:
// the attempt's start is long past its expiry, so whoever looks aborts it
// (writing an ABORTED record), which is the truth for an aborted attempt;
// a committed attempt has no intent left to misjudge.

// maxForgetQueue bounds the records a node waits to mark; past it, new
// ones are left in place (counted in groupkv_txn_records_kept_total).
const maxForgetQueue = 1 << 20

// maxForgetBatch bounds the records one KindTxnForget names.
const maxForgetBatch = 1024

// maxMarkTries bounds how many times a node proposes the mark of a record
// (once every markInterval) while its proposals fail, say while the
// record's shard elects a leader; then it leaves the record in place.
const maxMarkTries = 20

// maxSweepBatches bounds the removals one sweep of a shard proposes; the
// next sweep goes on.
const maxSweepBatches = 16

type recordForgetter struct {
	mu    sync.Mutex
	queue []forgetEntry
	// swept is when the records of the shards led here were last swept.
	swept time.Time

	forgotten prometheus.Counter
	marked    prometheus.Counter
	unmarked  prometheus.Counter
	kept      prometheus.Counter
	waiting   prometheus.GaugeFunc
}

// forgetEntry is a record to mark removable after a time.
type forgetEntry struct {
	after time.Time
	ref   shard.TxnRecordRef
	// tries is how many proposals of its mark failed.
	tries int
}

func newRecordForgetter(reg *prometheus.Registry) *recordForgetter {
	f := &recordForgetter{}
	f.forgotten = counter(reg,
		"groupkv_txn_records_forgotten_total",
		"Records of finished transactions this node removed, as the leader of their shard, once their retention passed.")
	f.marked = counter(reg,
		"groupkv_txn_records_marked_total",
		"Records of finished transactions this node marked removable once their retention passes.")
	f.unmarked = counter(reg,
		"groupkv_txn_records_unmarked_forgotten_total",
		"Records of finished transactions that nobody marked removable (their coordinator, or whoever aborted them, stopped first) this node removed, as the leader of their shard: a committed one once no participant held it prepared.")
	f.kept = counter(reg,
		"groupkv_txn_records_kept_total",
		"Records of finished transactions this node could not mark or remove (its queue was full, or the proposal failed); they stay in storage.")
	f.waiting = registerCounter(reg, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "groupkv_txn_records_to_forget",
		Help: "Records of finished transactions waiting for this node to mark them removable.",
	}, func() float64 {
		f.mu.Lock()
		defer f.mu.Unlock()
		return float64(len(f.queue))
	})).(prometheus.GaugeFunc)
	return f
}

// forgetInterval is how often a node removes, from the shards it leads,
// the records whose retention passed.
func (n *Node) forgetInterval() time.Duration {
	if n.opts.TxnRecordRetention < 0 {
		return 10 * time.Second // records are kept: nothing is ever marked
	}
	return min(max(n.opts.TxnRecordRetention/4, 10*time.Millisecond), 10*time.Second)
}

// markInterval is how often a node marks the records it is done with: the
// records it would leave unmarked if it stopped are those of that time.
func (n *Node) markInterval() time.Duration {
	return min(n.forgetInterval(), time.Second)
}

// forgetRecordLater has the record of attempt m, which is decided and has
// no intent left anywhere, removed once TxnRecordRetention has passed.
func (n *Node) forgetRecordLater(m txn.Meta) {
	n.forgetRecordAfter(m, n.opts.TxnRecordRetention)
}

// forgetRecordAfter has the decided record of attempt m removed after d.
func (n *Node) forgetRecordAfter(m txn.Meta, d time.Duration) {
	if n.opts.TxnRecordRetention < 0 || !m.Anchor.IsSet() {
		return
	}
	f := n.forgetter
	e := forgetEntry{after: time.Now().Add(d), ref: shard.TxnRecordRef{ID: m.ID, Anchor: m.Anchor}}
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

// forgetAbortedLater has the ABORTED record of attempt m, which this node
// aborted on another's behalf (a wound, an expiry), removed once m can no
// longer commit either way: past TxnRecordRetention and past m's commit
// deadline (MaxTxnDuration from its start, which came before now; a commit
// past it aborts). Removed, the record reads as PENDING to whoever looks,
// an attempt long expired, which they abort: the same outcome, so intents
// of m still in place are resolved alike.
func (n *Node) forgetAbortedLater(m txn.Meta) {
	n.forgetRecordAfter(m, n.abortedRetention())
}

// abortedRetention is how long after its abort an ABORTED record that its
// coordinator does not vouch for stays.
func (n *Node) abortedRetention() time.Duration {
	return max(n.opts.TxnRecordRetention, n.opts.MaxTxnDuration+n.opts.TxnTimeout)
}

// forgetTick marks the records this node is done with, and, every
// forgetInterval, removes those of the shards it leads whose time came.
func (n *Node) forgetTick() {
	n.markRecords()
	f := n.forgetter
	f.mu.Lock()
	sweep := time.Since(f.swept) >= n.forgetInterval()
	if sweep {
		f.swept = time.Now()
	}
	f.mu.Unlock()
	if sweep {
		n.sweepRecords()
	}
}

// forgetDueRecords marks the records this node is done with and removes
// those of the shards it leads whose time came, now.
func (n *Node) forgetDueRecords() {
	n.markRecords()
	n.sweepRecords()
}

// markRecords marks the queued records removable, in one proposal per
// anchor shard and time (and per maxForgetBatch records), the times
// rounded up to markInterval so that records queued together share one
// (a record removed a little later than it could be is harmless; one
// removed earlier is not); a failed proposal is tried again at the next
// tick, up to maxMarkTries times. An aborted attempt this node still
// remembers for its retry is marked once it is forgotten (its retry took
// it, or TxnIdleTimeout passed): a retry that linked itself to a record
// already gone would write one anew (beginSession).
func (n *Node) markRecords() {
	f := n.forgetter
	f.mu.Lock()
	taken := f.queue
	f.queue = nil
	f.mu.Unlock()
	if len(taken) == 0 {
		return
	}
	var again, marks []forgetEntry
	n.txns.mu.Lock()
	for _, e := range taken {
		if _, ok := n.txns.ended[e.ref.ID]; ok {
			again = append(again, e)
		} else {
			marks = append(marks, e)
		}
	}
	n.txns.mu.Unlock()
	type markKey struct {
		shard uint64
		after time.Time
	}
	grain := n.markInterval()
	byKey := map[markKey][]forgetEntry{}
	for _, e := range marks {
		id, err := n.anchorShard(e.ref.Anchor)
		if err != nil {
			f.kept.Inc() // its collection is gone, or the node cannot route
			continue
		}
		k := markKey{id, e.after.Truncate(grain)}
		if k.after.Before(e.after) {
			k.after = k.after.Add(grain)
		}
		byKey[k] = append(byKey[k], e)
	}
	for k, es := range byKey {
		for len(es) > 0 {
			batch := es[:min(len(es), maxForgetBatch)]
			es = es[len(batch):]
			c := &shard.TxnForgetCmd{Records: make([]shard.TxnRecordRef, len(batch)), After: uint64(k.after.UnixNano())}
			for i, e := range batch {
				c.Records[i] = e.ref
			}
			if n.proposeForget(k.shard, c) {
				continue
			}
			for _, e := range batch {
				if e.tries++; e.tries < maxMarkTries {
					again = append(again, e)
				} else {
					f.kept.Inc()
				}
			}
		}
	}
	if len(again) > 0 {
		f.mu.Lock()
		f.queue = append(f.queue, again...)
		f.mu.Unlock()
	}
}

// sweepRecords removes, from each shard led here, the records marked
// removable whose time came, up to maxSweepBatches proposals a shard, and
// the decided records nobody marked (removeUnmarked). The records of the
// shards of one collection are read in one pass (shard.SweepTxnRecords).
func (n *Node) sweepRecords() {
	if n.opts.TxnRecordRetention < 0 {
		return
	}
	byCollection := map[uint32][]shard.Desc{}
	n.eachLed(func(id uint64, _ *shard.Shard) {
		if d, ok := n.host.Desc(id); ok && !d.IsMeta() {
			byCollection[d.Collection] = append(byCollection[d.Collection], d)
		}
	})
	now := time.Now()
	committed, aborted := n.unmarkedBefore(now)
	for _, ds := range byCollection {
		sweeps, err := shard.SweepTxnRecords(n.eng.DB, ds, uint64(now.UnixNano()), committed, aborted, maxSweepBatches*maxForgetBatch, maxForgetBatch)
		if err != nil {
			n.log.Warn("listing the records of finished transactions to remove failed", "collection", ds[0].Collection, "err", err)
			continue
		}
		for i, d := range ds {
			for due := sweeps[i].Due; len(due) > 0; {
				batch := due[:min(len(due), maxForgetBatch)]
				due = due[len(batch):]
				if !n.proposeForget(d.ShardID, &shard.TxnForgetCmd{Records: batch}) {
					break
				}
			}
			n.removeUnmarked(d.ShardID, sweeps[i].Unmarked)
		}
	}
}

// unmarkedBefore answers the bounds below which a decided record nobody
// marked is removed, at now: a COMMITTED one committed more than
// TxnRecordRetention + TxnTimeout ago (a timestamp), once none of its
// participants holds the attempt prepared (no intent of it is left to look
// the record up); an ABORTED one aborted longer ago than
// forgetAbortedLater waits (Unix nanoseconds; the attempt is past its
// commit deadline: read as PENDING, the record is aborted again by
// whoever looks).
func (n *Node) unmarkedBefore(now time.Time) (committed, aborted uint64) {
	return cluster.TimestampFromTime(now.Add(-n.opts.TxnRecordRetention - n.opts.TxnTimeout)), uint64(now.Add(-n.abortedRetention()).UnixNano())
}

// sweepUnmarkedBefore removes from shard id (led here; d its descriptor)
// the decided records nobody marked, committed below committed (a
// timestamp) or aborted before aborted (Unix nanoseconds).
func (n *Node) sweepUnmarkedBefore(id uint64, d shard.Desc, committed, aborted uint64) {
	recs, err := shard.UnmarkedTxnRecords(n.eng.DB, d, committed, aborted, maxForgetBatch)
	if err != nil {
		n.log.Warn("listing the unmarked records of committed transactions failed", "shard", id, "err", err)
		return
	}
	n.removeUnmarked(id, recs)
}

// removeUnmarked removes from shard id (led here) the unmarked records
// recs (shard.UnmarkedTxnRecords) of which no participant holds the
// attempt prepared.
func (n *Node) removeUnmarked(id uint64, recs []shard.UnmarkedTxnRecord) {
	if len(recs) == 0 {
		return
	}
	var err error
	ctx, cancel := context.WithTimeout(context.Background(), n.retryWindow())
	defer cancel()
	prepared := map[uint64]map[string]bool{} // per participant; nil: unknown
	var refs []shard.TxnRecordRef
	for _, r := range recs {
		resolved := true
		for _, p := range n.withSuccessors(r.Participants) { // none for an ABORTED record
			set, ok := prepared[p]
			if !ok {
				if set, err = n.preparedNow(ctx, p); err != nil {
					n.log.Debug("reading a participant's prepared transactions failed; its records stay", "shard", p, "err", err)
				}
				prepared[p] = set
			}
			if set == nil || set[r.Ref.ID] {
				resolved = false
				break
			}
		}
		if resolved {
			refs = append(refs, r.Ref)
		}
	}
	if len(refs) > 0 && n.proposeForget(id, &shard.TxnForgetCmd{Records: refs}) {
		n.forgetter.unmarked.Add(float64(len(refs)))
		n.log.Info("removed records of committed transactions their coordinators did not mark", "shard", id, "records", len(refs))
	}
}

// preparedIn returns the transactions prepared in shard id, read here
// after a read barrier or on a node holding a replica.
func (n *Node) preparedIn(ctx context.Context, id uint64) (map[string]bool, error) {
	set := map[string]bool{}
	if n.hasReplica(id) {
		if err := n.readBarrier(ctx, id); err != nil {
			return nil, err
		}
		err := shard.EachPrepared(n.eng.DB, id, func(m txn.Meta, _ uint64, _, _ []txn.Target) error {
			set[m.ID] = true
			return nil
		})
		return set, err
	}
	d := n.collectionOfShard(id)
	if d == nil {
		return nil, kv.Errorf(kv.CodeUnavailable, "shard %d is in no collection of node %d's catalog", id, n.id)
	}
	parts, err := runParts(ctx, n, []uint64{id}, func(ctx context.Context, p readPart) (*shardReadResponse, error) {
		return n.readPart(ctx, p, shardReadRequest{Op: "prepared"}, d)
	})
	if err != nil {
		return nil, err
	}
	for _, p := range parts {
		for _, t := range p.Prepared {
			set[t] = true
		}
	}
	return set, nil
}

// withSuccessors returns shards and the shards that took over prepares
// from them, and from those, as the catalog here has them: the shards
// split from them (a split gives its new shard the prepares of the
// intents it takes, shard.inheritPrepared) and the shard each was merged
// into (which takes them all, shard.inheritMergedPrepared).
func (n *Node) withSuccessors(shards []uint64) []uint64 {
	if len(shards) == 0 {
		return nil
	}
	out := slices.Clone(shards)
	n.mu.RLock()
	defer n.mu.RUnlock()
	for i := 0; i < len(out); i++ {
		if _, m, ok := n.mergedEntryLocked(out[i]); ok {
			if !slices.Contains(out, m.MergedInto) {
				out = append(out, m.MergedInto)
			}
			continue
		}
		d := n.collectionOfShardLocked(out[i])
		if d == nil {
			continue
		}
		for _, s := range d.Shards {
			if s.SplitFrom == out[i] && !slices.Contains(out, s.ID) {
				out = append(out, s.ID)
			}
		}
	}
	return out
}

// mergedEntryLocked returns the catalog's entry of shard id if it was
// merged into a neighbour (CollectionDesc.Merged, a bounded list).
func (n *Node) mergedEntryLocked(id uint64) (*cluster.CollectionDesc, cluster.ShardDesc, bool) {
	for _, d := range n.mu.catalog {
		for _, m := range d.Merged {
			if m.ID == id && m.MergedInto != 0 {
				return d, m, true
			}
		}
	}
	return nil, cluster.ShardDesc{}, false
}

// preparedNow is preparedIn for a participant of a record, which may have
// been merged away since: once the shard it was merged into applied the
// merge on a replica here, the merged shard holds nothing (its prepares
// are the other's, asked too: withSuccessors). Where that cannot be told
// here, the error stays, and so does the record.
func (n *Node) preparedNow(ctx context.Context, id uint64) (map[string]bool, error) {
	set, err := n.preparedIn(ctx, id)
	if err == nil {
		return set, nil
	}
	if _, ok := n.mergedSuccessor(id); ok {
		return map[string]bool{}, nil
	}
	return nil, err
}

// collectionOfShard returns the collection shard id is a shard of, nil if
// none in the catalog here.
func (n *Node) collectionOfShard(id uint64) *cluster.CollectionDesc {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.collectionOfShardLocked(id)
}

func (n *Node) collectionOfShardLocked(id uint64) *cluster.CollectionDesc {
	for _, d := range n.mu.catalog {
		for _, s := range d.Shards {
			if s.ID == id {
				return d
			}
		}
	}
	return nil
}

// proposeForget proposes c in shard id and counts what it marked or
// removed; false if it failed (the records stay as they were).
func (n *Node) proposeForget(id uint64, c *shard.TxnForgetCmd) bool {
	ctx, cancel := context.WithTimeout(context.Background(), n.retryWindow())
	res, err := n.propose(ctx, id, shard.EncodeTxnForget(c))
	cancel()
	if err != nil || res.Err != nil {
		n.log.Debug("marking or removing finished transactions' records failed; they stay", "shard", id, "records", len(c.Records), "mark", c.After != 0, "err", err, "refused", res.Err)
		return false
	}
	if c.After != 0 {
		n.forgetter.marked.Add(float64(res.Count))
	} else {
		n.forgetter.forgotten.Add(float64(res.Count))
	}
	if skipped := len(c.Records) - res.Count; skipped > 0 {
		// Already gone, never written (a one-phase commit that left
		// none) or moved away by a split or merge.
		n.log.Debug("some finished transactions' records were not there", "shard", id, "records", skipped)
	}
	return true
}
