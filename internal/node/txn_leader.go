package node

import (
	"context"
	"errors"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/shard"
	"github.com/groupkv/groupkv/internal/txn"
)

// The leader side of transactions: a lock table per shard this node
// leads, created when the leadership is ready (rebuilt from the shard's
// prepared transactions) and closed when it ends; the peer methods a
// coordinator calls (TxnLock, TxnValidate, TxnRelease, TxnRecord); and the
// locks plain writes take for the length of their proposal.

type lockTables struct {
	mu sync.Mutex
	m  map[uint64]*txn.LockTable
	// spans are the spans the tables hold the prepared locks of: a
	// merge widens the shard when its trigger applies, and the table a
	// moment later (adoptMergedLocks); until then a lock on a key the
	// merge brought in guards nothing.
	spans map[uint64]shard.Desc
}

// lockSpan returns the span whose prepared locks the lock table of
// shardID holds.
func (n *Node) lockSpan(shardID uint64) (shard.Desc, bool) {
	n.ltabs.mu.Lock()
	defer n.ltabs.mu.Unlock()
	d, ok := n.ltabs.spans[shardID]
	return d, ok
}

func (n *Node) setLockSpan(shardID uint64, d shard.Desc) {
	n.ltabs.mu.Lock()
	defer n.ltabs.mu.Unlock()
	if _, ok := n.ltabs.m[shardID]; ok {
		n.ltabs.spans[shardID] = d
	}
}

func (n *Node) lockTable(shardID uint64) *txn.LockTable {
	n.ltabs.mu.Lock()
	defer n.ltabs.mu.Unlock()
	return n.ltabs.m[shardID]
}

// openLockTable starts the lock table of a leadership of shardID that
// became ready at term, with the locks of the shard's prepared
// transactions.
func (n *Node) openLockTable(shardID uint64, sm *shard.Shard) {
	if shardID == cluster.MetaShardID {
		return
	}
	_, term := sm.Applied()
	lt := txn.NewLockTable(term, n.opts.TxnCheckInterval)
	err := shard.EachPrepared(n.eng.DB, shardID, func(m txn.Meta, _ uint64, writes, reads []txn.Target) error {
		mm := m
		lt.Restore(&mm, writes, reads)
		return nil
	})
	if err != nil {
		n.log.Error("rebuilding the lock table failed", "shard", shardID, "err", err)
	}
	n.ltabs.mu.Lock()
	if old := n.ltabs.m[shardID]; old != nil {
		old.Close()
	}
	if n.ltabs.m == nil {
		n.ltabs.m = map[uint64]*txn.LockTable{}
		n.ltabs.spans = map[uint64]shard.Desc{}
	}
	n.ltabs.m[shardID] = lt
	n.ltabs.spans[shardID] = sm.Desc()
	n.ltabs.mu.Unlock()
}

func (n *Node) closeLockTable(shardID uint64) {
	n.ltabs.mu.Lock()
	lt := n.ltabs.m[shardID]
	delete(n.ltabs.m, shardID)
	delete(n.ltabs.spans, shardID)
	n.ltabs.mu.Unlock()
	if lt != nil {
		lt.Close()
	}
}

// onTxnApplied updates the lock table when a prepare or resolve applied.
func (n *Node) onTxnApplied(shardID uint64, kind shard.CommandKind, res shard.Result) {
	if kind == shard.KindTxnResolveBatch {
		if lt := n.lockTable(shardID); lt != nil {
			for _, id := range res.Resolved {
				lt.Release(id)
			}
		}
		return
	}
	if res.Txn == nil || res.Txn.ID == "" {
		return
	}
	lt := n.lockTable(shardID)
	if lt == nil {
		return
	}
	switch {
	case kind == shard.KindTxnResolve, kind == shard.KindTxnPrepare && res.Txn.Status == txn.Committed:
		lt.Release(res.Txn.ID)
	case kind == shard.KindTxnPrepare:
		lt.MarkPrepared(res.Txn.ID)
	}
}

// errLocksLost turns a lock table's loss into the answer a coordinator
// acts on: its attempt cannot commit.
func locksLostError(shardID uint64) error {
	return kv.Errorf(kv.CodeTxnAborted, "shard %d changed leader; the transaction's locks there were lost", shardID)
}

// leaderResolver is the lock table's view of the cluster.
type leaderResolver struct {
	n     *Node
	shard uint64
	// by is the requester, named in the records it wounds.
	by *txn.Meta
	// wounded is set when the requester wounded someone.
	wounded *bool
}

func (r leaderResolver) Wound(ctx context.Context, victim *txn.Meta) (bool, error) {
	if r.by != nil && !r.by.Plain {
		// An attempt already aborted (wounded itself, or expired, while
		// it waited for a lock) wounds no one: it can never commit, and a
		// transaction it wounded again after that one's retry began
		// would be wounded twice by it.
		own, err := r.n.readRecord(ctx, r.by)
		if err != nil {
			return false, err
		}
		if own.Status == txn.Aborted {
			return false, kv.Errorf(kv.CodeTxnAborted, "transaction %s was aborted while it waited for a lock in shard %d (wounded by an older transaction or expired)", r.by.ID, r.shard)
		}
	}
	rec, err := r.n.recordCAS(ctx, txn.RecordCmd{Op: txn.OpAbort, Meta: *victim, By: r.by, Reason: "wounded by an older transaction"})
	if err != nil {
		return false, err
	}
	if rec.Status == txn.Aborted && r.wounded != nil {
		*r.wounded = true
	}
	if rec.Status == txn.Aborted && rec.WoundedBy != nil && r.by != nil && rec.WoundedBy.ID == r.by.ID {
		// This wound wrote the record. Its owner's coordinator removes it
		// once it learns of the abort; if it never does (it committed in
		// one phase, leaving no record, just before the wound; or it
		// died), the wound's side removes it (txn_forget.go).
		r.n.forgetAbortedLater(*victim)
	}
	return rec.Status == txn.Aborted, nil
}

// Aborted implements txn.SelfChecker: a requester that waits for a lock
// looks at its own record now and then, and stops waiting once it was
// aborted.
func (r leaderResolver) Aborted(ctx context.Context, m *txn.Meta) (bool, error) {
	rec, err := r.n.readRecord(ctx, m)
	return rec.Status == txn.Aborted, err
}

func (r leaderResolver) Check(ctx context.Context, holder *txn.Meta, prepared bool) (bool, error) {
	rec, err := r.n.settleRecord(ctx, holder)
	if err != nil {
		return false, err
	}
	if rec.Status == txn.Pending {
		return false, nil
	}
	if prepared {
		return true, r.n.resolvePrepared(ctx, r.shard, holder.ID, rec)
	}
	return true, nil
}

// settleRecord reads holder's record through its shard's log, and aborts
// it when its owner has not shown a sign of life for longer than its
// expiry timeout.
func (n *Node) settleRecord(ctx context.Context, m *txn.Meta) (shard.TxnResult, error) {
	rec, err := n.readRecord(ctx, m)
	if err != nil || rec.Status != txn.Pending {
		return rec, err
	}
	now, err := n.latest(ctx)
	if err != nil {
		return rec, err
	}
	timeout := uint64(txn.ExpiryTimeout(n.opts.TxnTimeout, m.Attempt).Milliseconds()) << cluster.LogicalBits
	if now <= timeout {
		return rec, nil
	}
	idle := now - timeout
	if txn.LastAlive(txn.Record{Heartbeat: rec.Heartbeat}, *m) >= idle {
		return rec, nil
	}
	rec, err = n.recordCAS(ctx, txn.RecordCmd{Op: txn.OpAbort, Meta: *m, IfIdleBefore: idle, Reason: "its coordinator stopped heartbeating"})
	if err == nil && rec.Status == txn.Aborted {
		n.forgetAbortedLater(*m) // its coordinator may be gone
	}
	return rec, err
}

// resolvePrepared resolves the intents transaction id prepared in shardID
// by its record rec (COMMITTED or ABORTED).
func (n *Node) resolvePrepared(ctx context.Context, shardID uint64, id string, rec shard.TxnResult) error {
	var keys []shard.TxnKey
	err := shard.EachPrepared(n.eng.DB, shardID, func(m txn.Meta, _ uint64, writes, _ []txn.Target) error {
		if m.ID != id {
			return nil
		}
		for _, w := range writes {
			in, ok, err := shard.ReadIntent(n.eng.DB, w.Collection, w.Key)
			if err != nil {
				return err
			}
			if ok {
				keys = append(keys, shard.TxnKey{Bucket: in.Bucket, Key: w.Key})
			}
		}
		return nil
	})
	if err != nil {
		return kv.Errorf(kv.CodeInternal, "reading the prepared transactions of shard %d: %v", shardID, err)
	}
	_, err = n.propose(ctx, shardID, shard.EncodeTxnResolve(&shard.TxnResolveCmd{ID: id, Commit: rec.Status == txn.Committed, CommitTS: rec.CommitTS, Keys: keys}))
	return err
}

// anchorShard returns the shard that keeps the record anchored at a.
func (n *Node) anchorShard(a txn.Anchor) (uint64, error) {
	n.mu.RLock()
	var d *cluster.CollectionDesc
	for _, c := range n.mu.catalog {
		if c.ID == a.Collection {
			d = c
			break
		}
	}
	n.mu.RUnlock()
	if d == nil {
		return 0, kv.Errorf(kv.CodeUnavailable, "collection %d of a transaction record is not in node %d's catalog", a.Collection, n.id)
	}
	var i int
	if d.Partitioning == kv.PartitionRange {
		_, i = d.Route(a.Key, "")
	} else {
		i = sort.Search(len(d.Shards), func(i int) bool { return d.Shards[i].BucketEnd > uint32(a.Bucket) })
		if i == len(d.Shards) {
			return 0, kv.Errorf(kv.CodeInternal, "bucket %d of a transaction record is outside collection %q", a.Bucket, d.Name)
		}
	}
	return n.localOwner(d.ID, d.Shards[i].ID, a.Bucket, a.Key), nil
}

// readRecord reads the record of m linearizably: on a replica of its
// shard after a ReadIndex round, here or on a node that holds one. A
// shard that split or merged away meanwhile is routed again.
func (n *Node) readRecord(ctx context.Context, m *txn.Meta) (shard.TxnResult, error) {
	return n.readOwnRecord(ctx, m, 0)
}

// readOwnRecord is readRecord for the coordinator of m, which began at
// load number epoch (shard.TxnRecordEpoch; 0: unknown): a local replica of
// the record's shard that knows no record of m was written answers
// PENDING without looking it up.
func (n *Node) readOwnRecord(ctx context.Context, m *txn.Meta, epoch uint64) (shard.TxnResult, error) {
	deadline := time.Now().Add(n.retryWindow())
	for attempt := 0; ; attempt++ {
		res, err := n.readRecordOnce(ctx, m, epoch)
		if err == nil || !retryable(err) || ctx.Err() != nil {
			return res, err
		}
		if berr := backoff(ctx, attempt, deadline, err); berr != nil {
			return shard.TxnResult{}, berr
		}
	}
}

func (n *Node) readRecordOnce(ctx context.Context, m *txn.Meta, epoch uint64) (shard.TxnResult, error) {
	id, err := n.anchorShard(m.Anchor)
	if err != nil {
		return shard.TxnResult{}, err
	}
	var out shard.TxnResult
	if ok, err := n.forwardRead(ctx, []uint64{id}, "txn_record", m, &out); ok {
		return out, err
	}
	if err := n.readBarrier(ctx, id); err != nil {
		return shard.TxnResult{}, err
	}
	if n.host.NoTxnRecord(id, m, epoch) {
		return *shard.RecordResult(txn.Record{}), nil
	}
	rec, _, err := shard.ReadTxnRecord(n.eng.DB, m)
	if err != nil {
		return shard.TxnResult{}, kv.Errorf(kv.CodeInternal, "reading the record of %s: %v", m.ID, err)
	}
	return *shard.RecordResult(rec), nil
}

// recordCAS applies a record command to the record's shard and answers
// the record after it.
func (n *Node) recordCAS(ctx context.Context, c txn.RecordCmd) (shard.TxnResult, error) {
	// A shard frozen for a merge refuses records until the shard taking
	// it in applied the merge (a round or two of clusterLoop): ride that
	// out as a failover.
	deadline := time.Now().Add(max(n.retryWindow(), 8*clusterInterval))
	if c.Now == 0 {
		c.Now = uint64(time.Now().UnixNano())
	}
	for attempt := 0; ; attempt++ {
		id, err := n.anchorShard(c.Meta.Anchor)
		if err != nil {
			return shard.TxnResult{}, err
		}
		res, err := n.propose(ctx, id, shard.EncodeTxnRecord(c))
		if err == nil && res.Err != nil {
			err = res.Err
		}
		if err == nil {
			if res.Txn == nil {
				return shard.TxnResult{}, kv.Errorf(kv.CodeInternal, "a record command of shard %d answered no record", id)
			}
			return *res.Txn, nil
		}
		// A shard that no longer owns the anchor (a split moved it)
		// answers unavailable: route again.
		if !retryable(err) {
			return shard.TxnResult{}, err
		}
		if berr := backoff(ctx, attempt, deadline, err); berr != nil {
			return shard.TxnResult{}, berr
		}
	}
}

// Peer methods of the leader side.

type txnLockRequest struct {
	Shard   uint64       `json:"shard"`
	Meta    txn.Meta     `json:"meta"`
	Targets []txn.Target `json:"targets"`
	Mode    txn.Mode     `json:"mode"`
	// Read asks for the latest committed record of each key target.
	Read bool `json:"read,omitempty"`
	// CheckRecord asks, after the read, for the requester's own record
	// (its anchor is in this shard).
	CheckRecord bool `json:"check_record,omitempty"`
	// Hops counts the nodes that forwarded the request: a node without a
	// replica of the shard sends it to one with a replica, which forwards
	// it to the shard's leader (handleTxnLock).
	Hops int `json:"hops,omitempty"`
	// epoch is the requester's load number (shard.TxnRecordEpoch) when it
	// asks in its own process; 0 from another node.
	epoch uint64
}

type lockedRecord struct {
	Found   bool     `json:"found,omitempty"`
	Value   []byte   `json:"value,omitempty"`
	Tags    []string `json:"tags,omitempty"`
	Version uint64   `json:"version,omitempty"`
	// Deleted is the version of the deletion of a key not found (0: none
	// is kept).
	Deleted uint64 `json:"deleted,omitempty"`
}

// seen is the version of what r read: the record's, or its deletion's.
func (r *lockedRecord) seen() uint64 { return max(r.Version, r.Deleted) }

type txnLockResponse struct {
	Term    uint64         `json:"term"`
	Records []lockedRecord `json:"records,omitempty"`
	// Status is the requester's record status when CheckRecord was set.
	Status txn.Status `json:"status"`
	// Wounded: the requester wounded a holder to get its locks; its
	// victims' retries wait for its record to be decided, so it must
	// leave one.
	Wounded bool `json:"wounded,omitempty"`
	// Confirmed is the shard's applied version when the leadership that
	// granted the locks was confirmed: a write that another transaction
	// makes there once they are lost (to a new leader) has a greater
	// version (see txnSession.validateEarlier).
	Confirmed uint64     `json:"confirmed,omitempty"`
	Error     *peerError `json:"error,omitempty"`
}

// txnLock takes the locks of req on the shard's leader, here or where it
// is, and reads what req asks.
func (n *Node) txnLock(ctx context.Context, req *txnLockRequest) (*txnLockResponse, error) {
	search := n.leaderSearch()
	for attempt := 0; ; attempt++ {
		var resp *txnLockResponse
		var err error
		search.try()
		if n.lockTable(req.Shard) != nil {
			resp, err = n.txnLockLocal(ctx, req)
		} else if target := n.shardTarget(req.Shard, attempt); target == 0 {
			err = kv.Errorf(kv.CodeUnavailable, "shard %d has no leader", req.Shard)
		} else {
			resp = new(txnLockResponse)
			if _, err = n.callLeader(ctx, req.Shard, target, "TxnLock", req, resp); err == nil {
				err = resp.Error.err()
			}
		}
		if err == nil {
			return resp, nil
		}
		if !retryable(err) || ctx.Err() != nil {
			return nil, lockUnreachable(req.Shard, err)
		}
		if n.isMergedAway(req.Shard) && !n.hasReplica(req.Shard) {
			// The shard was merged into its neighbour since the key was
			// routed to it, and its locks went with it: the attempt
			// retries, routed to the shard that took the key in.
			return nil, kv.Errorf(kv.CodeTxnAborted, "transaction %s: shard %d was merged into its neighbour while the transaction locked keys in it; retry the transaction", req.Meta.ID, req.Shard)
		}
		if berr := search.backoff(ctx, attempt, err); berr != nil {
			return nil, lockUnreachable(req.Shard, berr)
		}
	}
}

// lockUnreachable is the error of a lock request that found no leader of
// shard to take it within its retries: a not_leader (a leadership moving,
// or this node's own that ended while it waited, as after a pause) says
// unavailable to the transaction's client, which addressed no shard and
// has no leader to ask.
func lockUnreachable(shard uint64, err error) error {
	if kv.CodeOf(err) == kv.CodeNotLeader {
		return kv.Errorf(kv.CodeUnavailable, "no leader of shard %d took the transaction's locks in time (%v); retry", shard, kv.AsError(err).Message)
	}
	return err
}

func (n *Node) handleTxnLock(ctx context.Context, req *txnLockRequest) (*txnLockResponse, error) {
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return &txnLockResponse{Error: toPeerError(err)}, nil
	}
	defer done()
	if leader := n.forwardTo(req.Shard, req.Hops); leader != 0 {
		req.Hops++
		resp := new(txnLockResponse)
		if _, err := n.callLeader(ctx, req.Shard, leader, "TxnLock", req, resp); err != nil {
			return &txnLockResponse{Error: toPeerError(err)}, nil
		}
		return resp, nil
	}
	resp, err := n.txnLockLocal(ctx, req)
	if err != nil {
		return &txnLockResponse{Error: toPeerError(err)}, nil
	}
	return resp, nil
}

// shardTarget is the node a request for shardID's leader goes to: the
// leader this node's replica knows, or, without a replica here, a node
// holding one (which forwards it: forwardTo), picked by attempt among
// those not found silent lately; 0 when there is none.
func (n *Node) shardTarget(shardID uint64, attempt int) uint64 {
	if n.hasReplica(shardID) {
		if l := n.leaderOf(shardID); l != n.id {
			return l
		}
		return 0
	}
	return n.otherHolder(shardID, attempt)
}

// otherHolder is the i-th (modulo their number) of the other nodes the
// catalog lists as holding shardID, counting only those not found silent
// lately if any are; 0 when there is none.
func (n *Node) otherHolder(shardID uint64, i int) uint64 {
	nodes, k := n.answeringFirst(slices.DeleteFunc(n.shardNodes(shardID), func(id uint64) bool { return id == n.id }))
	if len(nodes) == 0 {
		return 0
	}
	if k == 0 {
		k = len(nodes) // none answered lately: any
	}
	return nodes[i%k]
}

// forwardTo is the leader a request for shardID's leader that came here
// after hops forwards is passed on to: this node's replica is not the
// leader and knows another. 0: it is served (or refused) here.
func (n *Node) forwardTo(shardID uint64, hops int) uint64 {
	if n.lockTable(shardID) != nil || !n.hasReplica(shardID) || hops >= maxHops {
		return 0
	}
	if l := n.leaderOf(shardID); l != n.id {
		return l
	}
	return 0
}

func (n *Node) txnLockLocal(ctx context.Context, req *txnLockRequest) (*txnLockResponse, error) {
	lt := n.lockTable(req.Shard)
	if lt == nil {
		return nil, kv.Errorf(kv.CodeNotLeader, "node %d does not lead shard %d", n.id, req.Shard)
	}
	for _, t := range req.Targets {
		if t.IsSpan {
			continue // checked at prepare (shard/txn.go)
		}
		if g := n.groupHolding(req.Shard, t.Collection, t.Key); g != "" {
			if n.groupGone(ctx, g) {
				// A late join of a group refused or deleted meanwhile:
				// its leader releases the key within a few messages.
				return nil, kv.Errorf(kv.CodeUnavailable, "key %q is held by group %q, which no longer exists, until the group's leader releases it; retry", t.Key, g)
			}
			return nil, kv.Errorf(kv.CodeKeyInGroup, "key %q belongs to group %q; use a transaction of the group", t.Key, g)
		}
	}
	var wounded bool
	r := leaderResolver{n: n, shard: req.Shard, by: &req.Meta, wounded: &wounded}
	for _, t := range req.Targets {
		if err := lt.Acquire(ctx, &req.Meta, t, req.Mode, r); err != nil {
			if errors.Is(err, txn.ErrLocksLost) {
				return nil, locksLostError(req.Shard)
			}
			if errors.Is(err, txn.ErrLocksDropped) {
				return nil, kv.Errorf(kv.CodeTxnAborted, "transaction %s: the shard %d split or merged, dropping its locks there; retry the transaction", req.Meta.ID, req.Shard)
			}
			if errors.Is(err, txn.ErrAborted) {
				return nil, kv.Errorf(kv.CodeTxnAborted, "transaction %s was aborted (wounded by an older transaction or expired); it takes no lock in shard %d", req.Meta.ID, req.Shard)
			}
			if ctx.Err() != nil {
				return nil, kv.Errorf(kv.CodeUnavailable, "waiting for a lock in shard %d: %v", req.Shard, ctx.Err())
			}
			return nil, err
		}
	}
	// A lock counts only while the leadership that granted it lasts:
	// confirm it after the grant, then read (after what the group state
	// showed of the keys is in storage too).
	if err := n.host.ReadBarrier(ctx, req.Shard); err != nil {
		return nil, err
	}
	if err := n.groupsVisible(ctx, req.Shard); err != nil {
		return nil, err
	}
	// Read before the leadership is checked: while it lasts, no write of a
	// later one has applied here.
	confirmed, _ := n.host.AppliedVersion(req.Shard)
	if term, ok := n.host.LeaderTerm(req.Shard); !ok || term != lt.Term {
		// The barrier was answered, but not by this leadership: the table
		// is stale (its leadership ended and its close is on the way).
		return nil, locksLostError(req.Shard)
	}
	if lt.Closed() {
		return nil, locksLostError(req.Shard)
	}
	if !lt.Holds(req.Meta.ID) {
		// Released while the barrier waited: an older transaction wounded
		// the requester, a waiter found it expired, or the shard split.
		return nil, kv.Errorf(kv.CodeTxnAborted, "transaction %s was aborted while its lock in shard %d was confirmed (wounded by an older transaction, expired, or the shard split)", req.Meta.ID, req.Shard)
	}
	d, ok := n.host.Desc(req.Shard)
	span, spanned := n.lockSpan(req.Shard)
	if ok && spanned && d.Partitioning != kv.PartitionTag {
		// A split applied before the lock was granted moved the key to
		// the new shard, whose lock table does not know this one: its
		// lock here guards nothing. (A split applied after the grant
		// drops the lock: onSplit.) Nor does a lock on a key a merge
		// brought in before the table took the merged shard's prepared
		// locks. The keys of a tag collection, placed by tag, are
		// checked by their prepare.
		for _, t := range req.Targets {
			var bucket uint16
			if d.Partitioning == kv.PartitionHash {
				bucket = cluster.Bucket(t.Key)
			}
			if !t.IsSpan && (!d.Owns(bucket, t.Key) || !span.Owns(bucket, t.Key)) {
				lt.Release(req.Meta.ID)
				return nil, kv.Errorf(kv.CodeTxnAborted, "transaction %s: key %q is not shard %d's to lock (a split moved it out, or the shard has not taken over the locks of a merge yet); retry the transaction", req.Meta.ID, t.Key, req.Shard)
			}
		}
	}
	resp := &txnLockResponse{Term: lt.Term, Wounded: wounded, Confirmed: confirmed}
	if req.Read {
		for _, t := range req.Targets {
			if t.IsSpan {
				resp.Records = append(resp.Records, lockedRecord{})
				continue
			}
			val, version, found, err := n.readKey(t.Collection, t.Key, shard.Latest)
			if err != nil {
				return nil, kv.Errorf(kv.CodeInternal, "reading %q: %v", t.Key, err)
			}
			rec := lockedRecord{Found: found}
			if found {
				rec.Value, rec.Tags, rec.Version = val.Value, val.Tags, version
			} else {
				rec.Deleted = version
			}
			resp.Records = append(resp.Records, rec)
		}
		if f := n.knobs.lockedRead.Load(); f != nil {
			(*f)(req.Shard)
		}
		if !lt.Holds(req.Meta.ID) {
			// Dropped while it read: a merge's prepared locks taken in
			// (adoptMergedLocks) or a split (onSplit) after the checks
			// above. What it read may miss a committed transaction's
			// unresolved intent, and the record check below would not
			// tell (a drop aborts no record): the attempt goes, before
			// fn sees it.
			return nil, kv.Errorf(kv.CodeTxnAborted, "transaction %s lost its lock in shard %d while it read (the shard split or merged); retry the transaction", req.Meta.ID, req.Shard)
		}
	}
	if req.CheckRecord && !n.host.NoTxnRecord(req.Shard, &req.Meta, req.epoch) {
		rec, _, err := shard.ReadTxnRecord(n.eng.DB, &req.Meta)
		if err != nil {
			return nil, kv.Errorf(kv.CodeInternal, "reading the record of %s: %v", req.Meta.ID, err)
		}
		resp.Status = rec.Status
	}
	return resp, nil
}

type txnReleaseRequest struct {
	Shard uint64 `json:"shard"`
	ID    string `json:"id"`
	// Term, when set, asks only whether the locks of ID are still held in
	// that term (a read-only transaction's validation), confirming the
	// leadership first; nothing is released.
	Term     uint64 `json:"term,omitempty"`
	Validate bool   `json:"validate,omitempty"`
	// Hops is as txnLockRequest's.
	Hops int `json:"hops,omitempty"`
}

type txnReleaseResponse struct {
	Held bool `json:"held,omitempty"`
	// Confirmed, of a validation that found the locks held, is as
	// txnLockResponse's.
	Confirmed uint64     `json:"confirmed,omitempty"`
	Error     *peerError `json:"error,omitempty"`
}

func (n *Node) handleTxnRelease(ctx context.Context, req *txnReleaseRequest) (*txnReleaseResponse, error) {
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return &txnReleaseResponse{Error: toPeerError(err)}, nil
	}
	defer done()
	if leader := n.forwardTo(req.Shard, req.Hops); leader != 0 {
		req.Hops++
		resp := new(txnReleaseResponse)
		if _, err := n.callLeader(ctx, req.Shard, leader, "TxnRelease", req, resp); err != nil {
			return &txnReleaseResponse{Error: toPeerError(err)}, nil
		}
		return resp, nil
	}
	held, confirmed, err := n.txnReleaseLocal(ctx, req)
	return &txnReleaseResponse{Held: held, Confirmed: confirmed, Error: toPeerError(err)}, nil
}

func (n *Node) txnReleaseLocal(ctx context.Context, req *txnReleaseRequest) (held bool, confirmed uint64, err error) {
	lt := n.lockTable(req.Shard)
	if !req.Validate {
		if lt != nil {
			lt.Release(req.ID)
		}
		return false, 0, nil
	}
	if lt == nil || lt.Term != req.Term {
		return false, 0, nil
	}
	if err := n.host.ReadBarrier(ctx, req.Shard); err != nil {
		return false, 0, err
	}
	confirmed, _ = n.host.AppliedVersion(req.Shard) // as in txnLockLocal
	if term, ok := n.host.LeaderTerm(req.Shard); !ok || term != lt.Term {
		return false, 0, nil
	}
	return !lt.Closed() && lt.Holds(req.ID), confirmed, nil
}

// txnRelease releases (or validates) the locks of a transaction in a
// shard, on its leader wherever it is.
func (n *Node) txnRelease(ctx context.Context, req *txnReleaseRequest) (bool, error) {
	held, _, err := n.txnValidate(ctx, req)
	return held, err
}

// txnValidate is txnRelease answering, of a validation that found the
// locks held, the shard's applied version when it did (see
// txnLockResponse.Confirmed).
func (n *Node) txnValidate(ctx context.Context, req *txnReleaseRequest) (held bool, confirmed uint64, err error) {
	if n.lockTable(req.Shard) != nil {
		return n.txnReleaseLocal(ctx, req)
	}
	target := n.shardTarget(req.Shard, 0)
	if target == 0 {
		return false, 0, kv.Errorf(kv.CodeUnavailable, "shard %d has no leader", req.Shard)
	}
	var resp txnReleaseResponse
	if _, err := n.callLeader(ctx, req.Shard, target, "TxnRelease", req, &resp); err != nil {
		return false, 0, err
	}
	return resp.Held, resp.Confirmed, resp.Error.err()
}

// tryPlainLocks is plainLocks for a plain write of keys that must not
// wait: ok is false where plainLocks could wait (a transaction holds or
// takes locks in the shard), and nothing was taken.
func (n *Node) tryPlainLocks(shardID uint64) (release func(), ok bool) {
	lt := n.lockTable(shardID)
	if lt == nil {
		return func() {}, true
	}
	if _, ok := n.descOf(shardID); !ok {
		return func() {}, true
	}
	if lt.AdmitPlain() {
		return lt.DonePlainFunc(), true
	}
	return nil, false
}

// plainLocks takes, on the leader of shardID, exclusive locks on the keys
// of a plain write (or the span of a delete range) for the length of its
// proposal, so that it never overwrites a key a transaction holds, nor one
// whose committed transaction has not resolved its intent yet. It returns the release function;
// a command that is not a plain write needs nothing.
func (n *Node) plainLocks(ctx context.Context, shardID uint64, cmd []byte) (func(), error) {
	if len(cmd) > 0 && shard.CommandKind(cmd[0]) == shard.KindTxnPrepare {
		return func() {}, n.markPrepared(ctx, shardID, cmd)
	}
	if len(cmd) == 0 || shard.CommandKind(cmd[0]) != shard.KindWrite && shard.CommandKind(cmd[0]) != shard.KindDeleteRange && shard.CommandKind(cmd[0]) != shard.KindPlace {
		return func() {}, nil
	}
	lt := n.lockTable(shardID)
	if lt == nil {
		return func() {}, nil
	}
	d, ok := n.descOf(shardID)
	if !ok {
		return func() {}, nil
	}
	if shard.CommandKind(cmd[0]) == shard.KindWrite && lt.AdmitPlain() {
		// No transaction holds or takes a lock in the shard: nothing to
		// wait for, and those that come wait for this write.
		return lt.DonePlain, nil
	}
	var targets []txn.Target
	switch shard.CommandKind(cmd[0]) {
	case shard.KindWrite:
		// The common case: the keys alone, the values not decoded.
		var buf [4][]byte
		keys, err := shard.WriteKeys(cmd, buf[:0])
		if err != nil {
			return nil, kv.Errorf(kv.CodeInternal, "decoding a write: %v", err)
		}
		targets = make([]txn.Target, len(keys))
		for i, k := range keys {
			targets[i] = txn.Target{Collection: d.Collection, Key: k}
		}
	case shard.KindDeleteRange:
		c, err := shard.DecodeCommand(cmd)
		if err != nil {
			return nil, kv.Errorf(kv.CodeInternal, "decoding a range delete: %v", err)
		}
		targets = []txn.Target{{Collection: d.Collection, Key: c.Start, IsSpan: true, End: c.End}}
	case shard.KindPlace:
		c, err := shard.DecodeCommand(cmd)
		if err != nil {
			return nil, kv.Errorf(kv.CodeInternal, "decoding a placement: %v", err)
		}
		// The placement of a key of a tag collection, in its home shard:
		// transactions that read or write the key lock it there, so that
		// it does not move under them (txn_tag.go).
		t := txn.Target{Collection: d.Collection, Key: c.Place.Key}
		if c.Place.Op != shard.PlaceSet {
			// A Key Group's pin does not move the placement: Apply
			// refuses moves of a pinned key. (Its proposer holds the
			// key's lock in the record's shard, which may be this one.)
			return func() {}, nil
		}
		if c.Place.Txn != "" {
			if !lt.HoldsExclusive(c.Place.Txn, t) {
				return nil, kv.Errorf(kv.CodeTxnAborted, "transaction %s no longer holds the lock on the placement of %q in shard %d (wounded by an older transaction, or expired)", c.Place.Txn, c.Place.Key, shardID)
			}
			return func() {}, nil
		}
		targets = []txn.Target{t}
	}
	m := &txn.Meta{ID: "plain-" + n.plainSeq(), Priority: txn.PlainPriority, Plain: true}
	r := leaderResolver{n: n, shard: shardID}
	if err := lt.AcquireAll(ctx, m, targets, r); err != nil {
		if errors.Is(err, txn.ErrLocksLost) {
			return nil, kv.Errorf(kv.CodeNotLeader, "shard %d changed leader", shardID)
		}
		return nil, kv.Errorf(kv.CodeUnavailable, "waiting for a transaction's lock in shard %d: %v", shardID, err)
	}
	return func() { lt.Release(m.ID) }, nil
}

// markPrepared marks, on the leader about to propose it, the locks of a
// prepare's transaction prepared; a transaction that lost a lock (wounded,
// expired, or the leadership changed) is refused before its prepare is
// proposed.
func (n *Node) markPrepared(ctx context.Context, shardID uint64, cmd []byte) error {
	// The keys and targets alone: the values are the shard's to decode.
	var keys [16][]byte
	p := shard.PrepareLocks{Writes: keys[:0]}
	if err := shard.DecodePrepareLocks(cmd, &p); err != nil {
		return kv.Errorf(kv.CodeInternal, "decoding a prepare: %v", err)
	}
	lt := n.lockTable(shardID)
	if lt == nil {
		// Not this node's to check: a follower forwards the prepare to
		// the leader, which checks it; a leader not ready yet is of a
		// newer term, whose Apply refuses the prepare.
		return nil
	}
	if lt.Term != p.LockTerm {
		return locksLostError(shardID)
	}
	d, ok := n.descOf(shardID)
	if !ok {
		return locksLostError(shardID)
	}
	writes := make([]txn.Target, len(p.Writes))
	for i, k := range p.Writes {
		writes[i] = txn.Target{Collection: d.Collection, Key: k}
	}
	if !lt.Prepare(p.ID, writes, p.Reads) {
		return kv.Errorf(kv.CodeTxnAborted, "transaction %s no longer holds its locks in shard %d (wounded by an older transaction, or expired)", p.ID, shardID)
	}
	if n.host.MinPrepared(shardID) != 0 {
		// An intent of another transaction on a key this one holds
		// locked is stale (its prepare applied after its locks went):
		// resolve it from its record, or the prepare is refused.
		for _, w := range writes {
			if !n.host.MayHoldIntent(shardID, w.Key) {
				continue
			}
			in, ok, err := shard.ReadIntent(n.eng.DB, w.Collection, w.Key)
			if err != nil {
				return kv.Errorf(kv.CodeInternal, "reading the intent on %q: %v", w.Key, err)
			}
			if ok && in.Meta.ID != p.ID {
				if err := n.settleIntent(ctx, []uint64{shardID}, w.Collection, w.Key, in, shard.Latest); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// descOf returns the descriptor of the local replica of shardID.
func (n *Node) descOf(shardID uint64) (shard.Desc, bool) {
	return n.host.Desc(shardID)
}

func (n *Node) plainSeq() string {
	return strconv.FormatUint(n.plainCounter.Add(1), 36)
}
