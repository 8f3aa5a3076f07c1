package node

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/replication"
	"github.com/groupkv/groupkv/internal/shard"
	"github.com/groupkv/groupkv/internal/txn"
)

// The coordinator side of transactions: a node keeps the attempts it
// began (sessions), takes their locks on the shards' leaders as fn reads
// and writes, buffers their writes, and commits them:
//
//   - a read-only attempt validates that every lock it took is still held
//     in the term it was granted in (its reads were consistent at its last
//     read) and releases them;
//   - an attempt whose keys are all in its anchor's shard commits in one
//     proposal there (a one-phase prepare);
//   - otherwise every participant prepares (intents, read set) in its own
//     log, then the record moves PENDING → COMMITTED at the highest prepare
//     version — the commit point — and the participants resolve their
//     intents afterwards, asynchronously.
//
// Before a read is returned, the coordinator confirms that its record is
// still PENDING (not wounded), so fn never sees an inconsistent state.

// testSkipReadLocks makes serializable transactions read without locks,
// so that tests can show the history checker catches what follows. Never
// set outside tests.
var testSkipReadLocks atomic.Bool

type txnSessions struct {
	mu sync.Mutex
	m  map[string]*txnSession
	// ended maps attempts that aborted with a record to that record's
	// meta and wounder, for their retries: a retry links itself to the
	// attempt it retries (OpRetry) and first waits until the wounder's
	// transaction has ended, so that no transaction wounds another twice
	// and a transaction needs at most as many attempts as there are
	// transactions older than it. Entries go after TxnIdleTimeout.
	ended map[string]endedAttempt
	// gaveUp holds attempts that ended aborted and that their coordinator
	// here will not retry (a one-shot transaction that answered another
	// error: a refused write, its context's end): a retry of a transaction
	// one of them wounded need not wait for theirs. Entries go after
	// TxnIdleTimeout.
	gaveUp map[string]time.Time
}

type endedAttempt struct {
	meta    txn.Meta
	wounder *txn.Meta // nil: not a wound
	at      time.Time
}

type participant struct {
	shard  uint64
	term   uint64
	reads  []txn.Target
	writes []shard.Op
	// confirmed is the shard's applied version the last time its leader
	// confirmed the attempt's locks there (txnLockResponse.Confirmed).
	confirmed uint64
}

type bufferedWrite struct {
	coll   string
	delete bool
	value  []byte
	tags   []string
}

type txnSession struct {
	n        *Node
	mu       sync.Mutex
	meta     txn.Meta
	iso      kv.Isolation
	readOnly bool
	// readTS is the snapshot of snapshot-isolation and read-only attempts.
	readTS uint64
	writes map[string]*bufferedWrite // lockKey(collection id, key)
	parts  map[uint64]*participant
	// forUpdate maps the keys read for update (wkey) to the shard whose
	// exclusive lock the read took: a write of one there takes no lock
	// again. (Should the lock be lost meanwhile, the prepare finds it
	// gone, as for a key written twice.)
	forUpdate map[string]uint64
	ops       int
	bytes     int
	// done: committed, aborted or abandoned; abortErr says how (nil:
	// committed, at version).
	done     bool
	abortErr error
	version  uint64
	// client: the attempt's id was answered to a client (BeginTxn), which
	// may send its commit again: its outcome is remembered when it ends.
	client   bool
	lastUsed time.Time
	stopHB   chan struct{}
	hb       bool // heartbeats started
	// beat: a heartbeat was proposed, so a record may exist.
	beat atomic.Bool
	// wounded: the attempt wounded another; linked: it is linked from the
	// attempt it retries. Either way it must leave a decided record (its
	// victims' retries wait for it, following links), even where a commit
	// needs none.
	wounded, linked bool
	// abortAsked: its client asked to abort it (AbortTxn, or a retry_of
	// naming it); opCancel cuts short the operation under way, waiting
	// for a lock, say, so that the abort need not wait for it (abortNow).
	abortAsked atomic.Bool
	opCancel   atomic.Pointer[context.CancelFunc]
	// epoch is the shards' load number when the attempt began
	// (shard.TxnRecordEpoch), before its id was known to anyone: a shard
	// loaded since may hold its record without knowing.
	epoch uint64
}

// mustRecord reports whether the attempt must leave a decided record.
func (s *txnSession) mustRecord() bool { return s.wounded || s.linked }

func wkey(coll uint32, key []byte) string {
	var buf [64]byte
	return string(appendWkey(buf[:0], coll, key))
}

// appendWkey appends wkey(coll, key) to dst: s.writes[string(appendWkey(
// buf[:0], ...))] looks a write up without allocating the key.
func appendWkey(dst []byte, coll uint32, key []byte) []byte {
	return append(binary.BigEndian.AppendUint32(dst, coll), key...)
}

// BeginTxn implements kv.TxnBackend.
func (n *Node) BeginTxn(ctx context.Context, opts kv.TxnOptions) (string, error) {
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return "", err
	}
	defer done()
	s, err := n.beginSession(ctx, opts, true)
	if err != nil {
		return "", err
	}
	return s.meta.ID, nil
}

// beginSession begins an attempt; client says whether its id goes to a
// client (which may send its commit again), rather than staying inside
// the node (a one-shot transaction, a batch).
func (n *Node) beginSession(ctx context.Context, opts kv.TxnOptions, client bool) (*txnSession, error) {
	iso := opts.Isolation
	if iso == "" {
		iso = kv.IsolationSerializable
	}
	if iso != kv.IsolationSerializable && iso != kv.IsolationSnapshot {
		return nil, kv.Errorf(kv.CodeInvalidArgument, "isolation %q is neither %q nor %q", iso, kv.IsolationSerializable, kv.IsolationSnapshot)
	}
	priority, attempt := uint64(0), uint32(1)
	var prev *endedAttempt
	if opts.RetryOf != "" {
		p, a, err := txn.ParseID(opts.RetryOf)
		if err != nil {
			return nil, kv.Errorf(kv.CodeInvalidArgument, "retry_of: %v", err)
		}
		priority, attempt = p, a+1
		if err := n.endRetried(ctx, opts.RetryOf); err != nil {
			return nil, err
		}
		prev = n.takeEnded(opts.RetryOf)
		if prev == nil {
			// Begun on another node (a client behind a load balancer).
			prev = n.takeEndedElsewhere(ctx, opts.RetryOf)
		}
		if prev != nil && prev.wounder != nil {
			if err := n.awaitTxnEnd(ctx, prev.wounder); err != nil {
				return nil, err
			}
		}
	}
	var now uint64
	var err error
	if priority == 0 {
		// A first attempt's priority is a timestamp the oracle issues to
		// it alone: two transactions never tie, so the order between them
		// is one and the same at every attempt of either.
		now, err = n.uniqueTimestamp(ctx)
		priority = now
	} else {
		now, err = n.latest(ctx)
	}
	if err != nil {
		return nil, err
	}
	s := &txnSession{n: n, iso: iso, readOnly: opts.ReadOnly, writes: map[string]*bufferedWrite{},
		parts: map[uint64]*participant{}, lastUsed: time.Now(), stopHB: make(chan struct{}), client: client,
		epoch: shard.TxnRecordEpoch()}
	s.meta = txn.Meta{ID: txn.NewID(priority, attempt), Priority: priority, Attempt: attempt, Start: now}
	if opts.ReadOnly || iso == kv.IsolationSnapshot {
		s.readTS = now
	}
	if prev != nil && prev.meta.Anchor.IsSet() {
		// Link the attempt it retries to this one, which keeps that
		// attempt's anchor so that the link names where its record is.
		// Set before the link is asked: a link that applied but did not
		// answer still obliges this attempt to decide its record.
		s.meta.Anchor = prev.meta.Anchor
		s.linked = true
		next := s.meta
		if _, err := n.recordCAS(ctx, txn.RecordCmd{Op: txn.OpRetry, Meta: prev.meta, Next: &next}); err != nil {
			n.log.Debug("linking a retried attempt failed; those waiting for it stop at it", "txn", prev.meta.ID, "next", s.meta.ID, "err", err)
		}
	}
	n.txns.mu.Lock()
	if n.txns.m == nil {
		n.txns.m = map[string]*txnSession{}
	}
	n.txns.m[s.meta.ID] = s
	n.txns.mu.Unlock()
	return s, nil
}

// endRetried makes sure attempt id, which a new attempt retries, does not
// commit: an attempt still under way here is aborted (its client gave it
// up), and one known to have committed refuses the retry, which would
// apply the transaction again.
func (n *Node) endRetried(ctx context.Context, id string) error {
	n.txns.mu.Lock()
	s := n.txns.m[id]
	n.txns.mu.Unlock()
	if s != nil {
		s.abortNow() // an operation under way stops waiting
		s.mu.Lock()
		s.abortLocked(ctx, kv.Errorf(kv.CodeTxnAborted, "transaction %s was given up for a new attempt (retry_of)", id))
		o := s.outcome()
		s.mu.Unlock()
		return o.refuseRetry(id)
	}
	if o, ok := n.rememberedOutcome(id); ok {
		return o.refuseRetry(id)
	}
	return nil
}

// refuseRetry is the error of a retry of attempt id, which ended as o:
// none unless it committed.
func (o txnOutcome) refuseRetry(id string) error {
	if o.err != nil {
		return nil
	}
	return kv.Errorf(kv.CodeInvalidArgument, "retry_of: transaction %s committed (at version %d); a retry would apply it again", id, o.version)
}

// noteEnded remembers an attempt that aborted with record rec, for its
// retry.
func (n *Node) noteEnded(m txn.Meta, rec shard.TxnResult) {
	n.txns.mu.Lock()
	defer n.txns.mu.Unlock()
	if n.txns.ended == nil {
		n.txns.ended = map[string]endedAttempt{}
	}
	n.txns.ended[m.ID] = endedAttempt{meta: m, wounder: rec.WoundedBy, at: time.Now()}
}

// noteGaveUp notes that attempt id ended and will not be retried here.
func (n *Node) noteGaveUp(id string) {
	n.txns.mu.Lock()
	defer n.txns.mu.Unlock()
	if n.txns.gaveUp == nil {
		n.txns.gaveUp = map[string]time.Time{}
	}
	n.txns.gaveUp[id] = time.Now()
}

// gaveUp reports whether attempt id ended here, not to be retried.
func (n *Node) gaveUp(id string) bool {
	n.txns.mu.Lock()
	defer n.txns.mu.Unlock()
	_, ok := n.txns.gaveUp[id]
	return ok
}

// takeEnded returns and forgets what this node remembers of attempt id
// (nil: nothing).
func (n *Node) takeEnded(id string) *endedAttempt {
	n.txns.mu.Lock()
	defer n.txns.mu.Unlock()
	e, ok := n.txns.ended[id]
	if !ok {
		return nil
	}
	delete(n.txns.ended, id)
	return &e
}

// endedLookupTimeout bounds how long a retry asks the other nodes for the
// attempt it retries; one that does not answer in time is taken not to
// know it.
const endedLookupTimeout = 2 * time.Second

type txnEndedRequest struct {
	ID string `json:"id"`
}

type txnEndedResponse struct {
	Found   bool      `json:"found,omitempty"`
	Meta    txn.Meta  `json:"meta"`
	Wounder *txn.Meta `json:"wounder,omitempty"`
}

// handleTxnEnded answers, and forgets, what this node remembers of an
// aborted attempt for the retry another node begins.
func (n *Node) handleTxnEnded(_ context.Context, req *txnEndedRequest) (*txnEndedResponse, error) {
	e := n.takeEnded(req.ID)
	if e == nil {
		return &txnEndedResponse{}, nil
	}
	return &txnEndedResponse{Found: true, Meta: e.meta, Wounder: e.wounder}, nil
}

// takeEndedElsewhere asks every other member for the aborted attempt id,
// which a retry on this node names: the node that coordinated it answers
// (and forgets) its meta and its wounder, so that the retry waits for the
// wounder and links itself as it would on that node. nil: no node
// remembers it.
func (n *Node) takeEndedElsewhere(ctx context.Context, id string) *endedAttempt {
	var others []uint64
	for _, m := range n.members() {
		if m.ID != n.id {
			others = append(others, m.ID)
		}
	}
	if len(others) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, endedLookupTimeout)
	defer cancel()
	found := make(chan *endedAttempt, len(others))
	for _, peer := range others {
		go func() {
			var resp txnEndedResponse
			if err := n.callNode(ctx, peer, "TxnEnded", &txnEndedRequest{ID: id}, &resp); err != nil || !resp.Found {
				found <- nil
				return
			}
			found <- &endedAttempt{meta: resp.Meta, wounder: resp.Wounder, at: time.Now()}
		}()
	}
	for range others {
		if e := <-found; e != nil {
			return e // one node coordinated it; the others know nothing
		}
	}
	return nil
}

// awaitTxnEnd waits until the transaction of attempt m has ended: until
// an attempt of it committed, or aborted and was not retried within
// retryGrace. It follows the transaction from attempt to attempt by the
// links retries leave in the records (OpRetry). An attempt aborted by a
// wound is retried only once its own wounder's transaction has ended, so
// the wait follows that wounder first, and gives the retry its grace only
// then. Every transaction it follows is older than the one before, so
// the wait ends; what waits holds no lock.
func (n *Node) awaitTxnEnd(ctx context.Context, m *txn.Meta) error {
	followed := map[string]bool{}
	return n.awaitTxnEndFrom(ctx, m, followed, 0)
}

// maxWounderChain bounds how many wounders awaitTxnEnd follows back from
// an unretried attempt; past it, the grace alone decides.
const maxWounderChain = 8

func (n *Node) awaitTxnEndFrom(ctx context.Context, m *txn.Meta, followed map[string]bool, depth int) error {
	grace := n.opts.TxnTimeout / 4
	var abortedSince time.Time // when m was first seen aborted and not linked
	for attempt := 0; ; attempt++ {
		rec, err := n.settleRecord(ctx, m)
		switch {
		case err != nil:
		case rec.Status == txn.Committed:
			return nil
		case rec.Status == txn.Aborted && rec.RetriedAs != nil:
			next := *rec.RetriedAs
			m, abortedSince, attempt = &next, time.Time{}, 0
			continue
		case rec.Status == txn.Aborted:
			if w := rec.WoundedBy; w != nil && !followed[w.ID] && depth < maxWounderChain {
				followed[w.ID] = true
				if err := n.awaitTxnEndFrom(ctx, w, followed, depth+1); err != nil {
					return err
				}
				abortedSince = time.Time{}
				continue
			}
			if n.gaveUp(m.ID) {
				return nil // its coordinator here said so
			}
			if abortedSince.IsZero() {
				abortedSince = time.Now()
			} else if time.Since(abortedSince) > grace {
				return nil // not retried: the transaction gave up
			}
		}
		select {
		case <-ctx.Done():
			return kv.Errorf(kv.CodeUnavailable, "waiting for transaction %s, which wounded this one, to end: %v", m.ID, ctx.Err())
		case <-time.After(min(time.Duration(1<<min(attempt, 5))*time.Millisecond, 20*time.Millisecond)):
		}
	}
}

// findSession looks attempt id up: it answers the attempt, locked, while
// it runs; its outcome once it ended and while this node remembers it;
// neither when the node does not know it (begun elsewhere, or forgotten).
func (n *Node) findSession(id string) (*txnSession, *txnOutcome, error) {
	n.txns.mu.Lock()
	s := n.txns.m[id]
	n.txns.mu.Unlock()
	if s != nil {
		s.mu.Lock()
		if s.done {
			// It ended while this request waited for it (a commit
			// under way, say).
			o := s.outcome()
			s.mu.Unlock()
			return nil, &o, nil
		}
		s.lastUsed = time.Now()
		return s, nil, nil
	}
	// An attempt's outcome is remembered before it leaves the sessions
	// (forget), so that one not found there is found here if it ended.
	if o, ok := n.rememberedOutcome(id); ok {
		return nil, &o, nil
	}
	if _, _, err := txn.ParseID(id); err != nil {
		return nil, nil, kv.Errorf(kv.CodeNotFound, "no transaction %q: %v", id, err)
	}
	return nil, nil, nil
}

// session returns the attempt id, locked, for an operation whose context
// cancel cuts short (abortNow), or the error an operation (other than a
// commit) of it answers. The caller ends with s.unlock.
func (n *Node) session(id string, cancel context.CancelFunc) (*txnSession, error) {
	s, o, err := n.findSession(id)
	switch {
	case err != nil:
		return nil, err
	case o != nil && o.err == nil:
		return nil, kv.Errorf(kv.CodeInvalidArgument, "transaction %s has committed (at version %d); it takes no more operations", id, o.version)
	case o != nil:
		return nil, o.err
	case s == nil:
		// The attempt cannot go on, whatever became of it.
		return nil, kv.TxnUnknown(kv.Errorf(kv.CodeTxnAborted, "transaction %s is not known to node %d (it finished, expired or was begun elsewhere); retry it", id, n.id))
	}
	s.opCancel.Store(&cancel)
	if s.abortAsked.Load() {
		cancel() // asked before the operation could be cut short
	}
	return s, nil
}

// unlock ends an operation of the attempt begun by Node.session.
func (s *txnSession) unlock() {
	s.opCancel.Store(nil)
	s.mu.Unlock()
}

// abortNow asks the attempt to abort, cutting short its operation under
// way; the caller then takes s.mu to abort it.
func (s *txnSession) abortNow() {
	s.abortAsked.Store(true)
	if c := s.opCancel.Load(); c != nil {
		(*c)()
	}
}

// abortError turns the error of an operation cut short by its client's
// abort into the abort's.
func (s *txnSession) abortError(err error) error {
	if err != nil && s.abortAsked.Load() {
		return kv.Errorf(kv.CodeTxnAborted, "transaction %s was aborted by its client while it waited", s.meta.ID)
	}
	return err
}

// outcome is how the attempt ended. s.mu is held, and s.done set.
func (s *txnSession) outcome() txnOutcome {
	return txnOutcome{version: s.version, err: s.abortErr}
}

// forget removes the attempt, which ended, from the sessions, having
// remembered its outcome first if its client may ask for it. s.mu is
// held.
func (s *txnSession) forget() {
	if s.client {
		s.n.rememberOutcome(s.meta.ID, s.outcome())
	}
	s.n.txns.mu.Lock()
	delete(s.n.txns.m, s.meta.ID)
	s.n.txns.mu.Unlock()
}

// expireSessions aborts session transactions idle for longer than
// TxnIdleTimeout (their client went away).
func (n *Node) expireSessions() {
	cutoff := time.Now().Add(-n.opts.TxnIdleTimeout)
	n.txns.mu.Lock()
	var idle []*txnSession
	for _, s := range n.txns.m {
		if s.mu.TryLock() {
			if s.lastUsed.Before(cutoff) && !s.done {
				idle = append(idle, s)
			}
			s.mu.Unlock()
		}
	}
	for id, e := range n.txns.ended {
		if e.at.Before(cutoff) {
			delete(n.txns.ended, id)
		}
	}
	for id, at := range n.txns.gaveUp {
		if at.Before(cutoff) {
			delete(n.txns.gaveUp, id)
		}
	}
	n.txns.mu.Unlock()
	n.outcomes.prune(time.Now(), n.opts.TxnIdleTimeout, n.opts.MaxTxnOutcomes)
	for _, s := range idle {
		s.mu.Lock()
		if !s.done && s.lastUsed.Before(cutoff) {
			s.abortLocked(context.Background(), kv.Errorf(kv.CodeTxnAborted, "transaction %s expired: no request for %v", s.meta.ID, n.opts.TxnIdleTimeout))
		}
		s.mu.Unlock()
	}
}

// abortLocked ends the attempt as aborted with err: its record is aborted
// (if it may have locks anywhere), its unprepared locks released. s.mu is
// held.
func (s *txnSession) abortLocked(ctx context.Context, err error) {
	if s.done {
		return
	}
	s.done, s.abortErr = true, err
	close(s.stopHB)
	n := s.n
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), n.retryWindow())
	defer cancel()
	if s.meta.Anchor.IsSet() && (len(s.parts) > 0 || s.linked) {
		rec, cerr := n.recordCAS(ctx, txn.RecordCmd{Op: txn.OpAbort, Meta: s.meta, Reason: err.Error()})
		if cerr != nil {
			n.log.Debug("aborting a transaction record failed; it expires", "txn", s.meta.ID, "err", cerr)
		} else if rec.Status != txn.Pending {
			// Decided, and the attempt prepared nowhere (a prepare
			// ends in commit or abortPrepared): no intent of it exists.
			n.forgetRecordLater(s.meta)
		}
		n.noteEnded(s.meta, rec)
	}
	// The releases get time of their own: a record's shard without a
	// leader may have taken all of ctx, and the locks elsewhere would
	// then wait for the record to expire.
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), n.retryWindow())
	defer rcancel()
	for id := range s.parts {
		if _, rerr := n.txnRelease(rctx, &txnReleaseRequest{Shard: id, ID: s.meta.ID}); rerr != nil {
			n.log.Debug("releasing a transaction's locks failed; waiters find its record aborted", "txn", s.meta.ID, "shard", id, "err", rerr)
		}
	}
	s.forget()
}

// fail turns an operation's error into the attempt's outcome: an abort
// (txn_aborted) ends the attempt.
func (s *txnSession) fail(ctx context.Context, err error) error {
	if kv.CodeOf(err) == kv.CodeTxnAborted {
		s.abortLocked(ctx, err)
	}
	return err
}

// checkLimits counts ops operations of more bytes more in the attempt,
// or, if they would pass its limits, answers why and counts nothing.
func (s *txnSession) checkLimits(ops, more int) error {
	if err := s.withinLimits(ops, more); err != nil {
		return err
	}
	s.ops += ops
	s.bytes += more
	return nil
}

// withinLimits answers why ops operations of more bytes more would pass
// the attempt's limits, or nil.
func (s *txnSession) withinLimits(ops, more int) error {
	if s.ops+ops > s.n.opts.MaxTxnOps {
		return kv.Errorf(kv.CodeTooLarge, "transaction %s has more than %d operations", s.meta.ID, s.n.opts.MaxTxnOps)
	}
	if s.bytes+more > s.n.opts.MaxTxnBytes {
		return kv.Errorf(kv.CodeTooLarge, "transaction %s has more than %d bytes of keys and values", s.meta.ID, s.n.opts.MaxTxnBytes)
	}
	return nil
}

// txnRoute returns the collection, bucket and shard of a key of a
// transaction.
// txnCollection returns the collection name of a transaction's read or
// write of key, checking the key.
func (n *Node) txnCollection(name string, key []byte) (*cluster.CollectionDesc, error) {
	d, err := n.collection(name)
	if err != nil {
		return nil, err
	}
	if err := kv.ValidateKey(key); err != nil {
		return nil, err
	}
	return d, nil
}

func (s *txnSession) part(id uint64) *participant {
	p := s.parts[id]
	if p == nil {
		p = &participant{shard: id}
		s.parts[id] = p
	}
	return p
}

// lock takes locks of the attempt on shardID's leader and notes the term
// they were granted in; with read it returns the keys' latest records,
// once the attempt is confirmed PENDING after the grant.
func (s *txnSession) lock(ctx context.Context, shardID uint64, targets []txn.Target, mode txn.Mode, read bool) (*txnLockResponse, error) {
	if !s.meta.Anchor.IsSet() {
		return nil, kv.Errorf(kv.CodeInternal, "transaction %s has no anchor", s.meta.ID)
	}
	anchorHere := s.anchoredIn(shardID)
	resp, err := s.n.txnLock(ctx, s.lockRequest(shardID, targets, mode, read, read && anchorHere))
	if err := s.granted(ctx, shardID, targets, mode, read, resp, err); err != nil {
		return nil, err
	}
	if read {
		if err := s.checkPending(ctx, anchorHere, resp); err != nil {
			return nil, err
		}
		var seen uint64
		for i := range resp.Records {
			seen = max(seen, resp.Records[i].seen())
		}
		if err := s.validateEarlier(ctx, []shardSeen{{shardID, seen}}, nil); err != nil {
			return nil, err
		}
	}
	s.ensureHeartbeat()
	return resp, nil
}

// shardSeen is the highest version a read saw in a shard (0: any shard).
type shardSeen struct {
	shard, version uint64
}

// validateEarlier confirms, before reads are returned, that the locks the
// attempt read under in other shards are still held, where what the
// reads saw (seen) could have been written after they were lost.
//
// Checking the attempt's record (checkPending) covers locks that went to
// an older transaction, which aborts the record first; not locks lost
// with a shard's leader, whose successor starts with an empty table: a
// transaction may then overwrite a key the attempt read there, and a key
// of another shard, which the attempt reads next. Such a write, made in
// the new leader's term, has a version above the shard's applied version
// when the old leader last confirmed the attempt's locks (confirmed), and
// so does everything that follows it (versions grow along every shard's
// log, and a transaction commits above each of its participants'). So a
// read that saw nothing above a shard's confirmed version cannot show a
// write the attempt's locks there were meant to keep out; one that did is
// checked with the shard's leader, which answers whether the locks are
// still held in their term: if not, the attempt aborts before fn sees
// the read (txn_aborted).
//
// A scan or tag query, which reads every shard of its span at one
// version, names the shards the attempt read under before it (earlier):
// only those are checked. (A shard it locked for the first time holds
// nothing the attempt read before to disagree with the page.) Nil checks
// every shard.
func (s *txnSession) validateEarlier(ctx context.Context, seen []shardSeen, earlier map[uint64]bool) error {
	for _, p := range s.parts {
		if p.term == 0 || len(p.reads) == 0 || earlier != nil && !earlier[p.shard] {
			continue // no lock to validate, or none it read under before
		}
		var v uint64
		for _, e := range seen {
			if e.shard != p.shard {
				v = max(v, e.version)
			}
		}
		if v <= p.confirmed {
			continue
		}
		s.n.metrics.readValidations.Inc()
		held, confirmed, err := s.n.txnValidate(ctx, &txnReleaseRequest{Shard: p.shard, ID: s.meta.ID, Term: p.term, Validate: true})
		if err != nil && ctx.Err() == nil {
			// No leader to ask (the shard is electing one, or a split or
			// a merge replaced it, dropping its locks): the locks cannot
			// be vouched for, and neither can the read.
			return kv.Errorf(kv.CodeTxnAborted, "transaction %s could not confirm its locks in shard %d (%v); what it would read next may not be consistent with what it read there", s.meta.ID, p.shard, err)
		}
		if err != nil {
			return err
		}
		if !held {
			return kv.Errorf(kv.CodeTxnAborted, "transaction %s no longer holds its locks in shard %d (the shard changed leader, or the transaction was wounded or expired); what it would read next may not be consistent with what it read there", s.meta.ID, p.shard)
		}
		p.confirmed = max(p.confirmed, confirmed)
	}
	return nil
}

// readShards returns the shards the attempt read under so far.
func (s *txnSession) readShards() map[uint64]bool {
	out := make(map[uint64]bool, len(s.parts))
	for id, p := range s.parts {
		if len(p.reads) > 0 {
			out[id] = true
		}
	}
	return out
}

// anchoredIn reports whether shardID holds the attempt's record.
func (s *txnSession) anchoredIn(shardID uint64) bool {
	id, err := s.n.anchorShard(s.meta.Anchor)
	return err == nil && id == shardID
}

// lockRequest is the request taking targets' locks in shardID; check asks
// the shard, which holds the attempt's record, to read it after the grant.
func (s *txnSession) lockRequest(shardID uint64, targets []txn.Target, mode txn.Mode, read, check bool) *txnLockRequest {
	return &txnLockRequest{Shard: shardID, Meta: s.meta, Targets: targets, Mode: mode, Read: read, CheckRecord: check, epoch: s.epoch}
}

// granted notes the answer of a lock request of the attempt in shardID:
// the shard becomes a participant, holding the locks in the term they
// were granted in.
func (s *txnSession) granted(ctx context.Context, shardID uint64, targets []txn.Target, mode txn.Mode, read bool, resp *txnLockResponse, err error) error {
	p := s.part(shardID)
	if err != nil {
		if p.term == 0 && len(p.reads) == 0 && len(p.writes) == 0 {
			// The attempt's first request there failed: the shard is no
			// participant. Whatever the request locked before it failed is
			// let go, so that the commit need not validate a shard it
			// never read (it would find no lock of a known term there).
			if _, rerr := s.n.txnRelease(ctx, &txnReleaseRequest{Shard: shardID, ID: s.meta.ID}); rerr == nil {
				delete(s.parts, shardID)
			}
		}
		return err
	}
	if p.term != 0 && p.term != resp.Term {
		return locksLostError(shardID)
	}
	p.term = resp.Term
	p.confirmed = max(p.confirmed, resp.Confirmed)
	s.wounded = s.wounded || resp.Wounded
	if mode == txn.Shared || read {
		// A read for update is a read too: should the shard's leader
		// change after the prepare, its lock comes back (as a shared
		// lock) from the prepared entry's reads.
		p.reads = append(p.reads, targets...)
	}
	return nil
}

// checkPending confirms, after reads made under locks granted, that the
// attempt is still PENDING, so that no lock it read under went to an
// older transaction before the reads: from the record the lock request
// read (checked, when the shard holds it) or from the record itself.
func (s *txnSession) checkPending(ctx context.Context, checked bool, resp *txnLockResponse) error {
	var st txn.Status
	if checked {
		st = resp.Status
	} else {
		rec, err := s.n.readOwnRecord(ctx, &s.meta, s.epoch)
		if err != nil {
			return err
		}
		st = rec.Status
	}
	if st == txn.Aborted {
		return kv.Errorf(kv.CodeTxnAborted, "transaction %s was aborted (wounded by an older transaction or expired)", s.meta.ID)
	}
	if s.pastDeadline() {
		// It can no longer commit; and the record of an attempt
		// wounded this long ago may be gone (txn_forget.go), so
		// PENDING no longer vouches for its reads.
		return kv.Errorf(kv.CodeTxnAborted, "transaction %s ran past its deadline (%v from its start)", s.meta.ID, s.n.opts.MaxTxnDuration)
	}
	return nil
}

// ensureHeartbeat starts the attempt's heartbeats once it holds locks.
func (s *txnSession) ensureHeartbeat() {
	if s.hb {
		return
	}
	s.hb = true
	n := s.n
	meta := s.meta
	stop := s.stopHB
	n.bg.Add(1)
	go func() {
		defer n.bg.Done()
		t := time.NewTicker(n.opts.TxnTimeout / 4)
		defer t.Stop()
		var busy time.Time
		for {
			select {
			case <-stop:
				return
			case <-n.stop:
				return
			case <-t.C:
			}
			// The node heartbeats for the client while the client is
			// heard from: during a request (which holds the session) and
			// for TxnTimeout after one. A client that went silent — killed,
			// cut off — stops the heartbeats, and its record expires as a
			// coordinator's would: whoever waits for its locks aborts it
			// after the expiry timeout rather than after TxnIdleTimeout.
			if s.mu.TryLock() {
				heard := s.lastUsed
				s.mu.Unlock()
				if busy.After(heard) {
					heard = busy
				}
				if time.Since(heard) > n.opts.TxnTimeout {
					continue
				}
			} else {
				busy = time.Now()
			}
			ctx, cancel := context.WithTimeout(context.Background(), n.opts.TxnTimeout)
			now, err := n.latest(ctx)
			if err == nil {
				var rec shard.TxnResult
				s.beat.Store(true)
				rec, err = n.recordCAS(ctx, txn.RecordCmd{Op: txn.OpHeartbeat, Meta: meta, TS: now})
				if err == nil && rec.Status != txn.Pending {
					cancel()
					return
				}
			}
			cancel()
		}
	}()
}

func (s *txnSession) setAnchor(d *cluster.CollectionDesc, bucket uint16, key []byte) {
	if !s.meta.Anchor.IsSet() {
		s.meta.Anchor = txn.Anchor{Collection: d.ID, Bucket: bucket, Key: append([]byte{}, key...)}
	}
}

// TxnGet implements kv.TxnBackend.
func (n *Node) TxnGet(ctx context.Context, id string, ref kv.KeyRef) (kv.Record, bool, error) {
	return n.txnGet(ctx, id, ref, txn.Shared)
}

// TxnGetForUpdate implements kv.TxnBackend.
func (n *Node) TxnGetForUpdate(ctx context.Context, id string, ref kv.KeyRef) (kv.Record, bool, error) {
	return n.txnGet(ctx, id, ref, txn.Exclusive)
}

// txnGet reads ref in attempt id, locking it in mode.
func (n *Node) txnGet(ctx context.Context, id string, ref kv.KeyRef, mode txn.Mode) (kv.Record, bool, error) {
	ctx, cancel, done, err := n.beginCancel(ctx)
	if err != nil {
		return kv.Record{}, false, err
	}
	defer done()
	if isGroupAttempt(id) {
		return n.groupTxnGet(ctx, id, ref, mode == txn.Exclusive)
	}
	s, err := n.session(id, cancel)
	if err != nil {
		return kv.Record{}, false, err
	}
	defer s.unlock()
	if mode == txn.Exclusive && s.readOnly {
		return kv.Record{}, false, kv.Errorf(kv.CodeInvalidArgument, "transaction %s is read-only: it reads for update nothing it could write", s.meta.ID)
	}
	rec, found, err := s.getLocked(ctx, ref, mode)
	return rec, found, s.abortError(err)
}

func (s *txnSession) get(ctx context.Context, ref kv.KeyRef) (kv.Record, bool, error) {
	return s.getLocked(ctx, ref, txn.Shared)
}

// getLocked reads ref under a lock of mode (a serializable attempt; a
// snapshot one reads at its timestamp and takes none).
func (s *txnSession) getLocked(ctx context.Context, ref kv.KeyRef, mode txn.Mode) (kv.Record, bool, error) {
	n := s.n
	d, err := n.txnCollection(ref.Collection, ref.Key)
	if err != nil {
		return kv.Record{}, false, err
	}
	if err := s.checkLimits(1, len(ref.Key)); err != nil {
		return kv.Record{}, false, err
	}
	var kbuf [64]byte
	if w := s.writes[string(appendWkey(kbuf[:0], d.ID, ref.Key))]; w != nil {
		if w.delete {
			return kv.Record{}, false, nil
		}
		return kv.Record{Key: ref.Key, Value: w.value, Tags: w.tags}, true, nil
	}
	if s.readTS != 0 {
		rec, err := n.txnGetAt(ctx, kv.GetRequest{Collection: ref.Collection, Key: ref.Key, Version: s.readTS})
		if kv.CodeOf(err) == kv.CodeNotFound {
			return kv.Record{}, false, nil
		}
		if err != nil {
			return kv.Record{}, false, s.fail(ctx, err)
		}
		return rec, true, nil
	}
	if testSkipReadLocks.Load() {
		// Tests of the history checker only: a read without its lock.
		rec, err := n.Get(ctx, kv.GetRequest{Collection: ref.Collection, Key: ref.Key})
		if kv.CodeOf(err) == kv.CodeNotFound {
			return kv.Record{}, false, nil
		}
		return rec, err == nil, err
	}
	if d.Partitioning == kv.PartitionTag {
		return s.tagGet(ctx, d, ref.Key, mode)
	}
	bucket, shardID := n.route(d, ref.Key)
	s.setAnchor(d, bucket, ref.Key)
	resp, err := s.lock(ctx, shardID, []txn.Target{{Collection: d.ID, Key: ref.Key}}, mode, true)
	if err != nil {
		return kv.Record{}, false, s.fail(ctx, err)
	}
	if mode == txn.Exclusive {
		if s.forUpdate == nil {
			s.forUpdate = make(map[string]uint64)
		}
		s.forUpdate[wkey(d.ID, ref.Key)] = shardID
	}
	r := resp.Records[0]
	if !r.Found {
		return kv.Record{}, false, nil
	}
	return kv.Record{Key: ref.Key, Value: r.Value, Tags: r.Tags, Version: r.Version}, true, nil
}

// TxnPut implements kv.TxnBackend.
func (n *Node) TxnPut(ctx context.Context, id string, item kv.PutItem) error {
	if err := kv.ValidateTags(item.Tags); err != nil {
		return err
	}
	if len(item.Value) > n.opts.MaxValueSize {
		return kv.Errorf(kv.CodeTooLarge, "value is %d bytes, the limit is %d", len(item.Value), n.opts.MaxValueSize)
	}
	if item.IfVersion != nil {
		return kv.Errorf(kv.CodeInvalidArgument, "a put inside a transaction takes no condition: read the key instead")
	}
	return n.txnWrite(ctx, id, item.Collection, item.Key, &bufferedWrite{value: item.Value, tags: item.Tags})
}

// TxnDelete implements kv.TxnBackend.
func (n *Node) TxnDelete(ctx context.Context, id string, ref kv.KeyRef) error {
	return n.txnWrite(ctx, id, ref.Collection, ref.Key, &bufferedWrite{delete: true})
}

func (n *Node) txnWrite(ctx context.Context, id, coll string, key []byte, w *bufferedWrite) error {
	ctx, cancel, done, err := n.beginCancel(ctx)
	if err != nil {
		return err
	}
	defer done()
	if err := checkWritable(ctx, coll); err != nil {
		return err
	}
	if isGroupAttempt(id) {
		return n.groupTxnWrite(ctx, id, kv.KeyRef{Collection: coll, Key: key}, w.value, w.tags, w.delete)
	}
	s, err := n.session(id, cancel)
	if err != nil {
		return err
	}
	defer s.unlock()
	return s.abortError(s.write(ctx, coll, key, w))
}

func (s *txnSession) write(ctx context.Context, coll string, key []byte, w *bufferedWrite) error {
	if s.readOnly {
		return kv.Errorf(kv.CodeInvalidArgument, "transaction %s is read-only", s.meta.ID)
	}
	d, err := s.n.txnCollection(coll, key)
	if err != nil {
		return err
	}
	if err := s.checkLimits(1, len(key)+len(w.value)); err != nil {
		return err
	}
	k := wkey(d.ID, key)
	var (
		bucket  uint16
		shardID uint64
	)
	if d.Partitioning == kv.PartitionTag {
		if bucket, shardID, err = s.tagWriteTarget(ctx, d, key, w); err != nil {
			return err
		}
		// A put may have moved the key: its earlier write, in another
		// shard of the collection, goes.
		for _, sh := range d.Shards {
			if p := s.parts[sh.ID]; p != nil && sh.ID != shardID {
				p.writes = slices.DeleteFunc(p.writes, func(op shard.Op) bool { return bytes.Equal(op.Key, key) })
			}
		}
		w.coll = coll
		s.writes[k] = w
		if shardID == 0 {
			return nil // a delete of a key never put: nothing to write
		}
	} else {
		bucket, shardID = s.n.route(d, key)
		s.setAnchor(d, bucket, key)
		if locked, ok := s.forUpdate[k]; s.writes[k] == nil && (!ok || locked != shardID) {
			if _, err := s.lock(ctx, shardID, []txn.Target{{Collection: d.ID, Key: key}}, txn.Exclusive, false); err != nil {
				return s.fail(ctx, err)
			}
		}
		w.coll = coll
		s.writes[k] = w
	}
	p := s.part(shardID)
	op := shard.Op{Type: shard.OpPut, Bucket: bucket, Key: append([]byte{}, key...), Value: w.value, Tags: w.tags}
	if w.delete {
		op = shard.Op{Type: shard.OpDelete, Bucket: bucket, Key: op.Key}
	}
	for i := range p.writes {
		if bytes.Equal(p.writes[i].Key, key) {
			p.writes[i] = op
			return nil
		}
	}
	p.writes = append(p.writes, op)
	return nil
}

// TxnScan implements kv.TxnBackend: a serializable attempt locks the
// whole span it scans (no phantoms) on every shard it touches.
func (n *Node) TxnScan(ctx context.Context, id string, req kv.ScanRequest) (kv.ScanResult, error) {
	ctx, cancel, done, err := n.beginCancel(ctx)
	if err != nil {
		return kv.ScanResult{}, err
	}
	defer done()
	if isGroupAttempt(id) {
		return kv.ScanResult{}, kv.Errorf(kv.CodeInvalidArgument, "a group transaction reads its members by key; it does not scan")
	}
	s, err := n.session(id, cancel)
	if err != nil {
		return kv.ScanResult{}, err
	}
	defer s.unlock()
	res, err := s.scan(ctx, req)
	return res, s.abortError(err)
}

// scan reads a page of a scan in the attempt.
func (s *txnSession) scan(ctx context.Context, req kv.ScanRequest) (kv.ScanResult, error) {
	n := s.n
	d, err := n.collection(req.Collection)
	if err != nil {
		return kv.ScanResult{}, err
	}
	if s.readTS != 0 {
		if req.Page == "" {
			req.Version = s.readTS
		}
		res, err := n.txnScan(ctx, req, checkAtTimestamp)
		if err != nil {
			return res, s.fail(ctx, err)
		}
		return s.overlay(d, req, res), nil
	}
	earlier := s.readShards()
	if err := s.lockSpan(ctx, d, req.Start, req.End); err != nil {
		return kv.ScanResult{}, err
	}
	req.Version = 0
	res, err := n.txnScan(ctx, req, checkMembers)
	if err != nil {
		return res, s.fail(ctx, err)
	}
	if err := s.stillPending(ctx); err != nil {
		return kv.ScanResult{}, err
	}
	// What the page saw (deletions too) is at or below its version.
	if err := s.validateEarlier(ctx, []shardSeen{{0, res.Version}}, earlier); err != nil {
		return kv.ScanResult{}, s.fail(ctx, err)
	}
	return s.overlay(d, req, res), nil
}

// TxnGetByTags implements kv.TxnBackend: a serializable attempt locks the
// whole collection.
func (n *Node) TxnGetByTags(ctx context.Context, id string, q kv.TagQuery) (kv.ScanResult, error) {
	ctx, cancel, done, err := n.beginCancel(ctx)
	if err != nil {
		return kv.ScanResult{}, err
	}
	defer done()
	if isGroupAttempt(id) {
		return kv.ScanResult{}, kv.Errorf(kv.CodeInvalidArgument, "a group transaction reads its members by key; it does not query tags")
	}
	s, err := n.session(id, cancel)
	if err != nil {
		return kv.ScanResult{}, err
	}
	defer s.unlock()
	res, err := s.getByTags(ctx, q)
	return res, s.abortError(err)
}

// getByTags reads a page of a tag query in the attempt.
func (s *txnSession) getByTags(ctx context.Context, q kv.TagQuery) (kv.ScanResult, error) {
	n := s.n
	d, err := n.collection(q.Collection)
	if err != nil {
		return kv.ScanResult{}, err
	}
	// Records the attempt wrote are read as it wrote them: those that
	// carry the tags asked for are in the answer, the others not.
	tags, all := q.All, true
	if len(q.All) == 0 {
		tags, all = q.Any, false
	}
	keep := func(w *bufferedWrite) bool { return hasTags(w.tags, tags, all) }
	if s.readTS != 0 {
		if q.Page == "" {
			q.Version = s.readTS
		}
		res, err := n.txnGetByTags(ctx, q, checkAtTimestamp)
		if err != nil {
			return res, s.fail(ctx, err)
		}
		return s.mergeOwn(d, nil, nil, q.Page, false, q.Limit, res, keep), nil
	}
	earlier := s.readShards()
	if err := s.lockSpan(ctx, d, nil, nil); err != nil {
		return kv.ScanResult{}, err
	}
	q.Version = 0
	res, err := n.txnGetByTags(ctx, q, checkMembers)
	if err != nil {
		return res, s.fail(ctx, err)
	}
	if err := s.stillPending(ctx); err != nil {
		return kv.ScanResult{}, err
	}
	if err := s.validateEarlier(ctx, []shardSeen{{0, res.Version}}, earlier); err != nil {
		return kv.ScanResult{}, s.fail(ctx, err)
	}
	return s.mergeOwn(d, nil, nil, q.Page, false, q.Limit, res, keep), nil
}

// stillPending confirms, after a read made past the span locks' record
// check (a scan or a tag query reads after its locks are granted), that
// the attempt is still PENDING: wounded since, its locks went to an older
// transaction whose writes the read may hold next to what fn read before,
// and fn must not see it.
func (s *txnSession) stillPending(ctx context.Context) error {
	if f := s.n.knobs.beforePendingCheck.Load(); f != nil {
		(*f)(s.meta)
	}
	rec, err := s.n.readOwnRecord(ctx, &s.meta, s.epoch)
	if err != nil {
		return s.fail(ctx, err)
	}
	if rec.Status == txn.Aborted {
		return s.fail(ctx, kv.Errorf(kv.CodeTxnAborted, "transaction %s was aborted while it read (wounded by an older transaction or expired)", s.meta.ID))
	}
	return nil
}

// lockSpan locks [start, end) of collection d shared on every shard it
// touches, and confirms the attempt is not aborted.
func (s *txnSession) lockSpan(ctx context.Context, d *cluster.CollectionDesc, start, end []byte) error {
	ids := shardsIn(d, start, end) // every shard of a hash or tag collection
	if !s.meta.Anchor.IsSet() {
		// Anchor at the span's first shard's start.
		key := start
		if len(key) == 0 {
			key = []byte{0}
		}
		bucket, id := s.n.route(d, key)
		if d.Partitioning == kv.PartitionRange {
			ids = append([]uint64{id}, ids...)
		}
		s.setAnchor(d, bucket, key)
		if anchor, err := s.n.anchorShard(s.meta.Anchor); err == nil && !contains(ids, anchor) {
			ids = append(ids, anchor)
		}
	}
	seen := map[uint64]bool{}
	for _, id := range ids {
		if seen[id] {
			continue
		}
		seen[id] = true
		t := txn.Target{Collection: d.ID, Key: append([]byte{}, start...), IsSpan: true, End: append([]byte(nil), end...)}
		if _, err := s.lock(ctx, id, []txn.Target{t}, txn.Shared, true); err != nil {
			return s.fail(ctx, err)
		}
	}
	return nil
}

// overlay merges the attempt's own writes into a page of a scan of
// [start, end) of d that continued from page (empty: its first page).
func (s *txnSession) overlay(d *cluster.CollectionDesc, req kv.ScanRequest, res kv.ScanResult) kv.ScanResult {
	return s.mergeOwn(d, req.Start, req.End, req.Page, req.Reverse, req.Limit, res, func(*bufferedWrite) bool { return true })
}

// mergeOwn merges the attempt's own writes of d in [start, end) into res,
// a page of a read in key order (descending with reverse) of at most limit
// records that continued from page: a key the attempt wrote is read as it
// wrote it (version 0), when keep says the written record belongs in the
// read, and not at all when it deleted it or keep says no. Own writes past
// the page's last key, when the read goes on, are a later page's. The
// merged page holds at most limit records; when it stops short of what it
// merged, its NextPage continues after its own last key.
func (s *txnSession) mergeOwn(d *cluster.CollectionDesc, start, end []byte, page string, reverse bool, limit int, res kv.ScanResult, keep func(*bufferedWrite) bool) kv.ScanResult {
	if len(s.writes) == 0 {
		return res
	}
	limit, err := pageLimit(limit)
	if err != nil {
		return res // the read refused it already
	}
	var after []byte // the key the page continues from
	if page != "" {
		if _, _, last, err := decodePage(page); err == nil {
			after = last
		}
	}
	// order compares keys in the read's order.
	order := func(a, b []byte) int {
		if reverse {
			return bytes.Compare(b, a)
		}
		return bytes.Compare(a, b)
	}
	more := res.NextPage != ""
	var pageEnd []byte // own writes past it belong to a later page
	if more && len(res.Items) > 0 {
		pageEnd = res.Items[len(res.Items)-1].Key
	}
	type own struct {
		key []byte
		w   *bufferedWrite
	}
	var owns []own
	for k, w := range s.writes {
		coll, key := uint32(k[0])<<24|uint32(k[1])<<16|uint32(k[2])<<8|uint32(k[3]), []byte(k[4:])
		if coll != d.ID || bytes.Compare(key, start) < 0 || len(end) > 0 && bytes.Compare(key, end) >= 0 {
			continue
		}
		if after != nil && order(key, after) <= 0 {
			continue // an earlier page showed it
		}
		if more && (pageEnd == nil || order(key, pageEnd) > 0) {
			continue // a later page shows it
		}
		owns = append(owns, own{key, w})
	}
	if len(owns) == 0 {
		return res
	}
	sort.Slice(owns, func(i, j int) bool { return order(owns[i].key, owns[j].key) < 0 })
	items := make([]kv.Record, 0, min(len(res.Items)+len(owns), limit))
	i, j := 0, 0
	for len(items) < limit && (i < len(res.Items) || j < len(owns)) {
		if j == len(owns) || i < len(res.Items) && order(res.Items[i].Key, owns[j].key) < 0 {
			items = append(items, res.Items[i])
			i++
			continue
		}
		if i < len(res.Items) && bytes.Equal(res.Items[i].Key, owns[j].key) {
			i++ // the attempt's write replaces what is stored
		}
		if w := owns[j].w; !w.delete && keep(w) {
			items = append(items, kv.Record{Key: owns[j].key, Value: w.value, Tags: w.tags})
		}
		j++
	}
	if i < len(res.Items) || j < len(owns) {
		// Stopped at the limit with records left: the next page begins
		// after the last one given.
		res.NextPage = encodePage(res.Version, reverse, items[len(items)-1].Key)
	}
	res.Items = items
	return res
}

// AbortTxn implements kv.TxnBackend.
func (n *Node) AbortTxn(ctx context.Context, id string) error {
	if isGroupAttempt(id) {
		return n.groupTxnAbort(ctx, id)
	}
	n.txns.mu.Lock()
	s := n.txns.m[id]
	n.txns.mu.Unlock()
	if s == nil {
		return nil
	}
	s.abortNow() // an operation under way stops waiting
	s.mu.Lock()
	defer s.mu.Unlock()
	s.abortLocked(ctx, kv.Errorf(kv.CodeTxnAborted, "transaction %s was aborted by its client", id))
	return nil
}

// CommitTxn implements kv.TxnBackend.
func (n *Node) CommitTxn(ctx context.Context, id string) (uint64, error) {
	// A commit runs to its end whatever becomes of its request, even one
	// whose context ended before it began (see commit).
	ctx, done, err := n.begin(context.WithoutCancel(ctx))
	if err != nil {
		return 0, err
	}
	defer done()
	if isGroupAttempt(id) {
		return n.groupTxnCommit(ctx, id)
	}
	s, o, err := n.findSession(id)
	switch {
	case err != nil:
		return 0, err
	case o != nil:
		// It ended: a commit sent again (its client lost the answer)
		// answers what the first one did.
		return o.answer()
	case s == nil:
		return 0, kv.Errorf(kv.CodeCommitUnknown, "transaction %s is not known to node %d: it was begun elsewhere, or it ended more than %v ago and the node no longer remembers whether it committed; read what it wrote before running it again", id, n.id, n.opts.TxnIdleTimeout)
	}
	defer s.mu.Unlock()
	return s.commit(ctx)
}

// commit commits the attempt. Once begun, a commit runs to its end
// whatever becomes of the request (its client may be gone): cut short, a
// prepare would abort the attempt and a commit point left in flight
// would leave its outcome unknown, its locks held, until it expired. Its
// own timeout bounds it.
func (s *txnSession) commit(ctx context.Context) (uint64, error) {
	n := s.n
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), n.opts.RequestTimeout)
	defer cancel()
	var writers []*participant
	for _, p := range s.parts {
		if len(p.writes) > 0 {
			writers = append(writers, p)
		}
	}
	if len(writers) == 0 {
		v, err := s.commitReadOnly(ctx)
		if err != nil {
			return 0, s.fail(ctx, err)
		}
		s.finish(v)
		if s.mustRecord() || s.beat.Load() {
			n.forgetRecordLater(s.meta) // COMMITTED, and it wrote nothing
		}
		return v, nil
	}
	deadline := s.meta.Start + uint64(n.opts.MaxTxnDuration.Milliseconds())<<cluster.LogicalBits
	anchor, err := n.anchorShard(s.meta.Anchor)
	if err != nil {
		return 0, err
	}
	if len(s.parts) == 1 && s.parts[anchor] != nil {
		p := s.parts[anchor]
		res, err := n.propose(ctx, anchor, shard.EncodeTxnPrepare(&shard.TxnPrepareCmd{Meta: s.meta, LockTerm: p.term, OnePhase: true, Record: s.mustRecord(), Deadline: deadline, ReadTS: s.readTS, Writes: p.writes, Reads: p.reads}))
		if err == nil && res.Err != nil {
			err = res.Err
		} else if err != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil) {
			// The wait ended, not the proposal: it may be queued or in
			// flight, and commit.
			return 0, s.unknown(err)
		}
		if err != nil {
			if kv.CodeOf(err) == kv.CodeTxnAborted {
				return 0, s.fail(ctx, err)
			}
			if refused(err) {
				// Refused before it was proposed, and a retry would be:
				// the attempt ends, and the caller is told why.
				s.abortLocked(ctx, kv.Errorf(kv.CodeTxnAborted, "transaction %s could not commit: %v", s.meta.ID, err))
				return 0, err
			}
			if kv.CodeOf(err) == kv.CodeUnavailable || kv.CodeOf(err) == kv.CodeNotLeader {
				// Refused before it was proposed, or by the shard: the
				// attempt did not commit.
				return 0, s.fail(ctx, kv.Errorf(kv.CodeTxnAborted, "transaction %s could not commit: %v", s.meta.ID, err))
			}
			return 0, s.unknown(err)
		}
		s.finish(res.Version)
		if s.mustRecord() || s.beat.Load() {
			// It left a COMMITTED record (or one a heartbeat wrote) and
			// no intent.
			n.forgetRecordLater(s.meta)
		}
		return res.Version, nil
	}
	// Two phases: prepare every participant. When the record's shard is
	// one of them, it goes last: once every other one prepared, one
	// proposal there commits its writes and the record together (Last),
	// with no intent and no resolve of its own. Its version, drawn then,
	// is the commit's: the prepares' need not be timestamps issued after
	// they were queued (Early), only below it.
	last := s.parts[anchor]
	type prepared struct {
		p       *participant
		version uint64
		err     error
	}
	out := make(chan prepared, len(s.parts))
	sent := 0
	for _, p := range s.parts {
		if p == last {
			continue
		}
		sent++
		n.workers.Go(func() {
			res, err := n.propose(ctx, p.shard, shard.EncodeTxnPrepare(&shard.TxnPrepareCmd{Meta: s.meta, LockTerm: p.term, Early: last != nil, ReadTS: s.readTS, Writes: p.writes, Reads: p.reads}))
			if err == nil && res.Err != nil {
				err = res.Err
			}
			out <- prepared{p, res.Version, err}
		})
	}
	var commitTS uint64
	var failed error
	for range sent {
		r := <-out
		if r.err != nil {
			if failed == nil || kv.CodeOf(r.err) == kv.CodeTxnAborted {
				failed = r.err
			}
			continue
		}
		commitTS = max(commitTS, r.version)
	}
	if failed != nil {
		// Not every participant prepared: the attempt aborts (those that
		// did resolve their intents away).
		err := kv.Errorf(kv.CodeTxnAborted, "transaction %s could not prepare: %v", s.meta.ID, failed)
		s.abortPrepared(ctx, err)
		if refused(failed) {
			return 0, failed // a retry would be refused too
		}
		return 0, err
	}
	// The commit point. The record lists the participants, so that it
	// can go once none holds the attempt prepared should this node stop
	// before it marks the record (txn_forget.go).
	participants := make([]uint64, 0, len(s.parts))
	for _, p := range s.parts {
		if p != last {
			participants = append(participants, p.shard)
		}
	}
	slices.Sort(participants)
	if last != nil {
		if f := n.knobs.beforeLast.Load(); f != nil {
			(*f)()
		}
		return s.commitLast(ctx, last, participants, commitTS, deadline)
	}
	var rec shard.TxnResult
	for attempt := 0; ; attempt++ {
		rec, err = n.recordCAS(ctx, txn.RecordCmd{Op: txn.OpCommit, Meta: s.meta, TS: commitTS, Deadline: deadline, Participants: participants, Listed: true})
		if err == nil || ctx.Err() != nil || attempt >= 3 {
			break
		}
	}
	if err != nil {
		return 0, s.unknown(err)
	}
	if rec.Status != txn.Committed {
		err := kv.Errorf(kv.CodeTxnAborted, "transaction %s was aborted before it could commit: %s", s.meta.ID, rec.Reason)
		s.abortPrepared(ctx, err)
		return 0, err
	}
	s.finish(rec.CommitTS)
	n.resolveAsync(s.meta, s.parts, rec)
	return rec.CommitTS, nil
}

// commitLast commits the attempt in the shard of its record, every other
// participant (others) prepared below commitTS: the record's shard
// commits its writes and the record, listing the others, in one proposal
// at a version above commitTS — the commit point — and the others resolve.
func (s *txnSession) commitLast(ctx context.Context, last *participant, others []uint64, commitTS, deadline uint64) (uint64, error) {
	n := s.n
	res, err := n.propose(ctx, last.shard, shard.EncodeTxnPrepare(&shard.TxnPrepareCmd{Meta: s.meta, LockTerm: last.term, OnePhase: true,
		Last: true, MinCommit: commitTS, Participants: others, Deadline: deadline, ReadTS: s.readTS, Writes: last.writes, Reads: last.reads}))
	if err == nil && res.Err != nil {
		err = res.Err
	} else if err != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil) {
		// The wait ended, not the proposal: it may be queued or in
		// flight, and commit.
		return 0, s.unknown(err)
	}
	if err != nil {
		if c := kv.CodeOf(err); c == kv.CodeTxnAborted || c == kv.CodeUnavailable || c == kv.CodeNotLeader {
			// Refused by the shard, or before it was proposed: the
			// attempt did not commit; the others resolve it away.
			aborted := kv.Errorf(kv.CodeTxnAborted, "transaction %s could not commit: %v", s.meta.ID, err)
			s.abortPrepared(ctx, aborted)
			if refused(err) {
				return 0, err // a retry would be refused too
			}
			return 0, aborted
		}
		return 0, s.unknown(err)
	}
	s.finish(res.Version)
	rest := make(map[uint64]*participant, len(s.parts)-1)
	for id, p := range s.parts {
		if p != last {
			rest[id] = p
		}
	}
	n.resolveAsync(s.meta, rest, shard.TxnResult{Status: txn.Committed, CommitTS: res.Version})
	return res.Version, nil
}

// pastDeadline reports whether the attempt began more than MaxTxnDuration
// ago, by this node's clock: a commit of it would abort.
func (s *txnSession) pastDeadline() bool {
	deadline := s.meta.Start + uint64(s.n.opts.MaxTxnDuration.Milliseconds())<<cluster.LogicalBits
	return cluster.TimestampFromTime(s.n.opts.Clock()) > deadline
}

// commitReadOnly ends an attempt that wrote nothing: its reads were
// consistent if every lock it took is still held in the term it was
// granted in.
func (s *txnSession) commitReadOnly(ctx context.Context) (uint64, error) {
	n := s.n
	v := s.readTS
	if v == 0 {
		for _, p := range s.parts {
			if p.term == 0 {
				continue // no lock was granted there (its request failed): nothing to validate
			}
			held, err := n.txnRelease(ctx, &txnReleaseRequest{Shard: p.shard, ID: s.meta.ID, Term: p.term, Validate: true})
			if err != nil {
				return 0, err
			}
			if !held {
				// Released (wounded by an older transaction, expired), or
				// lost with a leader: its reads are no longer vouched for.
				return 0, kv.Errorf(kv.CodeTxnAborted, "transaction %s no longer holds its read locks in shard %d (wounded by an older transaction, expired, or the shard changed leader)", s.meta.ID, p.shard)
			}
		}
		var err error
		if v, err = n.latest(ctx); err != nil {
			return 0, err
		}
	}
	if s.mustRecord() || s.beat.Load() {
		// Its victims wait for its record to be decided; and a record a
		// heartbeat wrote is decided, so that it can go (txn_forget.go).
		rec, err := n.recordCAS(ctx, txn.RecordCmd{Op: txn.OpCommit, Meta: s.meta, TS: v, Listed: true}) // no intents
		if err != nil {
			return 0, err
		}
		if rec.Status != txn.Committed {
			return 0, kv.Errorf(kv.CodeTxnAborted, "transaction %s was aborted: %s", s.meta.ID, rec.Reason)
		}
	}
	if s.readTS == 0 {
		for _, p := range s.parts {
			n.txnRelease(ctx, &txnReleaseRequest{Shard: p.shard, ID: s.meta.ID})
		}
	}
	return v, nil
}

// finish ends an attempt committed at version v.
func (s *txnSession) finish(v uint64) {
	s.done, s.version = true, v
	close(s.stopHB)
	s.forget()
}

// unknown ends an attempt whose commit outcome is unknown.
func (s *txnSession) unknown(err error) error {
	e := kv.Errorf(kv.CodeCommitUnknown, "the outcome of transaction %s is unknown: %v", s.meta.ID, err)
	s.done, s.abortErr = true, e
	close(s.stopHB)
	s.forget()
	return e
}

// abortPrepared aborts an attempt some of whose participants may have
// prepared: the record is aborted first (so no one commits it), then every
// participant resolves its intents away.
func (s *txnSession) abortPrepared(ctx context.Context, err error) {
	n := s.n
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), n.retryWindow())
	defer cancel()
	rec, cerr := n.recordCAS(ctx, txn.RecordCmd{Op: txn.OpAbort, Meta: s.meta, Reason: err.Error()})
	n.noteEnded(s.meta, rec)
	s.done, s.abortErr = true, err
	close(s.stopHB)
	s.forget()
	if cerr != nil {
		return // the record expires; whoever meets an intent resolves it
	}
	n.resolveAsync(s.meta, s.parts, rec)
}

// resolveAsync resolves the intents of a finished attempt m, decided as
// rec, in every participant, in the background; locks of participants with
// nothing to resolve are released by the resolve too. Once every resolve
// applied, nothing needs m's record but late look-ups: it goes after the
// retention (forgetRecordLater).
func (n *Node) resolveAsync(m txn.Meta, parts map[uint64]*participant, rec shard.TxnResult) {
	if n.knobs.skipResolves.Load() {
		return
	}
	id := m.ID
	var (
		mu      sync.Mutex
		pending = len(parts)
		failed  bool
	)
	resolved := func(ok bool) {
		mu.Lock()
		defer mu.Unlock()
		pending--
		failed = failed || !ok
		if pending == 0 && !failed && rec.Status != txn.Pending {
			n.forgetRecordLater(m)
		}
	}
	for _, p := range parts {
		var keys []shard.TxnKey
		for _, w := range p.writes {
			keys = append(keys, shard.TxnKey{Bucket: w.Bucket, Key: w.Key})
		}
		n.queueResolve(p.shard, &shard.TxnResolveCmd{ID: id, Commit: rec.Status == txn.Committed, CommitTS: rec.CommitTS, Keys: keys}, resolved)
	}
}

// ExecTxn implements kv.TxnBackend: a one-shot transaction, retried with
// its priority until it commits.
func (n *Node) ExecTxn(ctx context.Context, req kv.ExecRequest) (kv.ExecResult, error) {
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return kv.ExecResult{}, err
	}
	defer done()
	if err := validateExec(ctx, req); err != nil {
		return kv.ExecResult{}, err
	}
	var retryOf string
	for attempt := 0; ; attempt++ {
		s, err := n.beginSession(ctx, kv.TxnOptions{RetryOf: retryOf}, false)
		if err != nil {
			return kv.ExecResult{}, err
		}
		s.mu.Lock()
		res, err := s.exec(ctx, req)
		if err != nil && !s.done {
			s.abortLocked(ctx, err)
		}
		s.mu.Unlock()
		if kv.CodeOf(err) != kv.CodeTxnAborted || ctx.Err() != nil {
			if err != nil {
				n.noteGaveUp(s.meta.ID)
			}
			return res, err
		}
		retryOf = s.meta.ID
		d := min(time.Duration(1<<min(attempt, 6))*time.Millisecond, 50*time.Millisecond)
		select {
		case <-ctx.Done():
			n.noteGaveUp(s.meta.ID)
			return kv.ExecResult{}, err
		case <-time.After(d):
		}
	}
}

// validateExec refuses a one-shot transaction that is malformed
// (kv.ValidateExec) or writes a collection of groupkv's own.
func validateExec(ctx context.Context, req kv.ExecRequest) error {
	if err := kv.ValidateExec(req); err != nil {
		return err
	}
	for _, branch := range []struct {
		name string
		ops  []kv.TxnOp
	}{{"then", req.Then}, {"else", req.Else}} {
		for i, op := range branch.ops {
			if op.Op == kv.TxnOpGet {
				continue
			}
			if err := checkWritable(ctx, op.Collection); err != nil {
				return kv.Errorf(kv.CodeOf(err), "%s[%d]: %s", branch.name, i, kv.AsError(err).Message)
			}
		}
	}
	return nil
}

func (s *txnSession) exec(ctx context.Context, req kv.ExecRequest) (kv.ExecResult, error) {
	return runExec(ctx, sessionExec{s}, req)
}

// execAttempt is an attempt a one-shot transaction runs in: a general
// transaction's or a group transaction's.
type execAttempt interface {
	get(ctx context.Context, ref kv.KeyRef) (kv.Record, bool, error)
	// getForUpdate reads a key the transaction may write.
	getForUpdate(ctx context.Context, ref kv.KeyRef) (kv.Record, bool, error)
	// batchGet reads refs (forUpdate: keys the transaction may write) as
	// get (getForUpdate) reads each; name names a key of refs in an error.
	batchGet(ctx context.Context, refs []kv.KeyRef, forUpdate bool, name func(int) string) ([]kv.BatchGetItem, error)
	put(ctx context.Context, op kv.TxnOp) error
	del(ctx context.Context, ref kv.KeyRef) error
	commit(ctx context.Context) (uint64, error)
}

type sessionExec struct{ s *txnSession }

func (e sessionExec) get(ctx context.Context, ref kv.KeyRef) (kv.Record, bool, error) {
	return e.s.get(ctx, ref)
}

func (e sessionExec) getForUpdate(ctx context.Context, ref kv.KeyRef) (kv.Record, bool, error) {
	return e.s.getLocked(ctx, ref, txn.Exclusive)
}

func (e sessionExec) batchGet(ctx context.Context, refs []kv.KeyRef, forUpdate bool, name func(int) string) ([]kv.BatchGetItem, error) {
	mode := txn.Shared
	if forUpdate {
		mode = txn.Exclusive
	}
	return e.s.batchGet(ctx, refs, mode, name)
}

func (e sessionExec) put(ctx context.Context, op kv.TxnOp) error {
	if err := kv.ValidateTags(op.Tags); err != nil {
		return err
	}
	return e.s.write(ctx, op.Collection, op.Key, &bufferedWrite{value: op.Value, tags: op.Tags})
}

func (e sessionExec) del(ctx context.Context, ref kv.KeyRef) error {
	return e.s.write(ctx, ref.Collection, ref.Key, &bufferedWrite{delete: true})
}

func (e sessionExec) commit(ctx context.Context) (uint64, error) { return e.s.commit(ctx) }

// wkeyName names a key of a collection (by name) in a map.
func wkeyName(coll string, key []byte) string { return coll + "\x00" + string(key) }

// runExec runs a one-shot transaction in attempt a: the compares of If,
// then the operations of Then or Else, then the commit.
func runExec(ctx context.Context, a execAttempt, req kv.ExecRequest) (kv.ExecResult, error) {
	// A compared key that a branch writes is read for update: two
	// compare-and-sets of one key queue at the compare instead of both
	// reading it and one being wounded at its write.
	written := make(map[string]bool)
	for _, ops := range [][]kv.TxnOp{req.Then, req.Else} {
		for _, op := range ops {
			if op.Op != kv.TxnOpGet {
				written[wkeyName(op.Collection, op.Key)] = true
			}
		}
	}
	// The compares are read in at most two batch gets: the keys a branch
	// writes, for update, and the others.
	cur := make([]kv.BatchGetItem, len(req.If))
	var upd, shr []int
	for i, c := range req.If {
		if written[wkeyName(c.Collection, c.Key)] {
			upd = append(upd, i)
		} else {
			shr = append(shr, i)
		}
	}
	for _, g := range []struct {
		idx       []int
		forUpdate bool
	}{{upd, true}, {shr, false}} {
		if len(g.idx) == 0 {
			continue
		}
		refs := make([]kv.KeyRef, len(g.idx))
		for j, i := range g.idx {
			refs[j] = kv.KeyRef{Collection: req.If[i].Collection, Key: req.If[i].Key}
		}
		items, err := a.batchGet(ctx, refs, g.forUpdate, func(j int) string { return fmt.Sprintf("if[%d]", g.idx[j]) })
		if err != nil {
			return kv.ExecResult{}, err
		}
		for j, i := range g.idx {
			cur[i] = items[j]
		}
	}
	ok := true
	for i, c := range req.If {
		rec, found := cur[i], cur[i].Found
		switch {
		case c.HasValue:
			ok = ok && found && bytes.Equal(rec.Value, c.Value)
		case c.Version == 0:
			ok = ok && !found
		default:
			ok = ok && found && rec.Version == c.Version
		}
	}
	ops := req.Then
	if !ok {
		ops = req.Else
	}
	results := make([]kv.TxnOpResult, len(ops))
	// writes are the branch's puts and deletes; own are its gets that
	// found a key the branch put before them, answered at the commit
	// version (the record's once committed), not 0.
	var writes, own []int
	wrote := make(map[string]bool)
	for i := 0; i < len(ops); i++ {
		op := ops[i]
		ref := kv.KeyRef{Collection: op.Collection, Key: op.Key}
		switch op.Op {
		case kv.TxnOpGet:
			// A run of gets is read in one batch get: each sees the
			// writes of the operations before the run.
			end := i + 1
			for end < len(ops) && ops[end].Op == kv.TxnOpGet {
				end++
			}
			refs := make([]kv.KeyRef, end-i)
			for j := range refs {
				refs[j] = kv.KeyRef{Collection: ops[i+j].Collection, Key: ops[i+j].Key}
			}
			first := i
			items, err := a.batchGet(ctx, refs, false, func(j int) string { return fmt.Sprintf("operation %d", first+j) })
			if err != nil {
				return kv.ExecResult{}, err
			}
			for j, it := range items {
				if it.Found {
					results[i+j] = kv.TxnOpResult{Found: true, Value: it.Value, Tags: it.Tags, Version: it.Version}
					if wrote[wkeyName(refs[j].Collection, refs[j].Key)] {
						own = append(own, i+j)
					}
				}
			}
			i = end - 1
		case kv.TxnOpPut:
			if err := a.put(ctx, op); err != nil {
				return kv.ExecResult{}, err
			}
			writes = append(writes, i)
			wrote[wkeyName(op.Collection, op.Key)] = true
		case kv.TxnOpDelete:
			if err := a.del(ctx, ref); err != nil {
				return kv.ExecResult{}, err
			}
			writes = append(writes, i)
			wrote[wkeyName(op.Collection, op.Key)] = true
		}
	}
	v, err := a.commit(ctx)
	if err != nil {
		return kv.ExecResult{}, err
	}
	for _, i := range writes {
		results[i] = kv.TxnOpResult{Version: v}
	}
	for _, i := range own {
		results[i].Version = v
	}
	return kv.ExecResult{Succeeded: ok, Version: v, Results: results}, nil
}

// batchTxn writes a batch that spans several shards as one transaction,
// retried with its priority until it commits: every record gets the
// commit version, or none is written.
func (n *Node) batchTxn(ctx context.Context, keys []kv.KeyRef, byShard map[uint64][]batchOp) ([]kv.WriteResult, error) {
	var retryOf string
	for attempt := 0; ; attempt++ {
		s, err := n.beginSession(ctx, kv.TxnOptions{RetryOf: retryOf}, false)
		if err != nil {
			return nil, err
		}
		s.mu.Lock()
		v, err := s.batch(ctx, keys, byShard)
		if err != nil && !s.done {
			s.abortLocked(ctx, err)
		}
		s.mu.Unlock()
		if err == nil {
			out := make([]kv.WriteResult, len(keys))
			for i, k := range keys {
				// A delete of a key of a tag collection never placed is in
				// no shard: it wrote nothing, at no version.
				out[i] = kv.WriteResult{Collection: k.Collection, Key: k.Key}
			}
			for _, ops := range byShard {
				for _, o := range ops {
					out[o.index].Version = v
				}
			}
			return out, nil
		}
		if kv.CodeOf(err) != kv.CodeTxnAborted || ctx.Err() != nil {
			return nil, err
		}
		retryOf = s.meta.ID
		select {
		case <-ctx.Done():
			return nil, kv.Errorf(kv.CodeUnavailable, "the batch kept conflicting with transactions: %v", ctx.Err())
		case <-time.After(min(time.Duration(1<<min(attempt, 6))*time.Millisecond, 50*time.Millisecond)):
		}
	}
}

func (s *txnSession) batch(ctx context.Context, keys []kv.KeyRef, byShard map[uint64][]batchOp) (uint64, error) {
	// Conditions first, each read under its lock.
	for _, ops := range byShard {
		for _, o := range ops {
			if !o.op.HasCond {
				continue
			}
			// Read for update: the op writes the key, and two conditional
			// writes of one key queue here instead of both reading under
			// shared locks and one being wounded at the write.
			k := keys[o.index]
			rec, found, err := s.getLocked(ctx, k, txn.Exclusive)
			if err != nil {
				return 0, err
			}
			cur := uint64(0)
			if found {
				cur = rec.Version
			}
			if cur != o.op.CondVersion {
				return 0, kv.Errorf(kv.CodeConditionFailed, "key %q is at version %d, the condition wants version %d", k.Key, cur, o.op.CondVersion)
			}
		}
	}
	for _, ops := range byShard {
		for _, o := range ops {
			k := keys[o.index]
			w := &bufferedWrite{value: o.op.Value, tags: o.op.Tags, delete: o.op.Type == shard.OpDelete}
			if err := s.write(ctx, k.Collection, k.Key, w); err != nil {
				return 0, err
			}
		}
	}
	return s.commit(ctx)
}

var _ kv.TxnBackend = (*Node)(nil)

// refused reports whether err is a write the node refused to propose
// (its disk is low, Host.RefuseWrites): retrying the transaction would
// be refused the same way.
func refused(err error) bool {
	_, ok := errors.AsType[*replication.WritesRefusedError](err)
	return ok
}
