package txn

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"slices"
	"sort"
	"sync"
	"time"
)

// Mode is a lock mode.
type Mode byte

const (
	Shared    Mode = 1
	Exclusive Mode = 2
)

// Target is what a lock covers: one key of a collection, or (IsSpan) the
// keys [Key, End) of it (an empty End: unbounded). Transactions lock spans
// shared (their scans and tag queries); a plain delete of a range locks
// its span exclusive.
type Target struct {
	Collection uint32
	Key        []byte
	IsSpan     bool
	End        []byte
}

func (t Target) covers(coll uint32, key []byte) bool {
	if !t.IsSpan {
		return t.Collection == coll && bytes.Equal(t.Key, key)
	}
	return t.Collection == coll && bytes.Compare(key, t.Key) >= 0 && (len(t.End) == 0 || bytes.Compare(key, t.End) < 0)
}

// Resolver is what a lock table asks of the node about holders it meets.
type Resolver interface {
	// Wound aborts victim (a replicated compare-and-set of its record,
	// PENDING → ABORTED) and reports whether its record is ABORTED now.
	// A COMMITTED record answers false.
	Wound(ctx context.Context, victim *Meta) (aborted bool, err error)
	// Check looks at holder's record: it answers done when the holder
	// will never use its locks again (ABORTED, COMMITTED, or PENDING with
	// an expired heartbeat, which Check aborts). For a prepared holder,
	// done means its intents here were resolved (Check resolves them).
	Check(ctx context.Context, holder *Meta, prepared bool) (done bool, err error)
}

// ErrLocksLost is returned to requesters of a lock table that was closed
// (its leader lost leadership).
var ErrLocksLost = errors.New("the shard's leader changed; its locks were lost")

// ErrAborted is returned to a requester known to be aborted: wounded in
// this table by an older transaction (its record is ABORTED), or found
// aborted by its own record while it waited (SelfChecker). It can never
// commit, so it does not wait for a lock it could not use.
var ErrAborted = errors.New("the transaction was aborted (wounded by an older transaction or expired)")

// SelfChecker is a Resolver that can also tell a waiting requester that
// its own record is no longer PENDING (wounded elsewhere, or expired).
type SelfChecker interface {
	// Aborted reports whether m's record is ABORTED.
	Aborted(ctx context.Context, m *Meta) (bool, error)
}

// ErrLocksDropped is returned to a transaction whose locks a split or a
// merge of the shard dropped (DropUnprepared, Adopt): what it read under
// them may be stale by now, so its attempt takes no lock here again.
var ErrLocksDropped = errors.New("the transaction's locks in this shard were dropped by a split or a merge of the shard")

type keyLock struct {
	key    string          // the key in LockTable.keys (lockKey)
	excl   string          // exclusive holder id
	shared map[string]bool // shared holder ids
	// plain are the plain writes holding the key: exclusive against
	// transactions, compatible with each other (see AcquireAll).
	plain map[string]bool
}

func (kl *keyLock) empty() bool {
	return kl.excl == "" && len(kl.shared) == 0 && len(kl.plain) == 0
}

type spanLock struct {
	t    Target
	id   string
	mode Mode
	// plain: the span of a plain delete of a range, compatible with plain
	// writes.
	plain bool
}

// waiter is a transaction waiting for a lock on t: plain writes that
// would take a lock it waits for wait behind it (see AcquireAll).
type waiter struct {
	t  Target
	id string
}

// overlaps reports whether two spans of one collection share a key.
func (t Target) overlaps(u Target) bool {
	if t.Collection != u.Collection {
		return false
	}
	// [a, b) and [c, d) overlap iff a < d and c < b (empty end: unbounded).
	aBeforeD := len(u.End) == 0 || bytes.Compare(t.Key, u.End) < 0
	cBeforeB := len(t.End) == 0 || bytes.Compare(u.Key, t.End) < 0
	return aBeforeD && cBeforeB
}

type holding struct {
	meta     *Meta
	keys     map[string]Mode
	spans    []Target
	prepared bool
	// excludes: the holder has a lock other than a plain write's shared
	// one (counted in LockTable.excluding).
	excludes bool
	// since is when the holder got its first lock here.
	since time.Time
}

// firstCheck returns when a waiter that begins to wait now for holders
// first looks at them: one CheckInterval from now, or at once if one of
// them (not a plain write, which is never checked) has held its locks for
// that long already; a dead coordinator's locks met on one shard after
// another are then freed without an interval's wait on each.
func (lt *LockTable) firstCheck(now time.Time, holders []*holding) time.Time {
	for _, h := range holders {
		if !h.meta.Plain && now.Sub(h.since) >= lt.CheckInterval {
			return now
		}
	}
	return now.Add(lt.CheckInterval)
}

// LockTable is the lock table of one shard at one leadership term. It is
// safe for concurrent use.
type LockTable struct {
	// Term is the raft term of the leadership the table belongs to; locks
	// granted by it are valid only while the term lasts.
	Term uint64
	// CheckInterval is how often a waiter looks at the holders it waits
	// for (a dead coordinator's locks are freed by Check).
	CheckInterval time.Duration

	mu      sync.Mutex
	keys    map[string]*keyLock
	spans   []spanLock
	held    map[string]*holding
	waiters []waiter
	// changed is closed at the next change of the table, for those that
	// wait for one; nil while nobody does (changedLocked).
	changed chan struct{}
	closed  bool
	// freeHoldings and freeKeys keep released holdings and emptied key
	// locks, their maps cleared, for the next locks: a plain write takes
	// and releases one of each per write (maxFree at most).
	freeHoldings []*holding
	freeKeys     []*keyLock
	// dropped are the transactions whose locks DropUnprepared or Adopt
	// dropped; Acquire refuses them (ErrLocksDropped). Had one taken a
	// key again, its prepare would find every lock it names held, the
	// read it made before the drop unguarded in between.
	dropped map[string]bool
	// wounded are the transactions an Acquire here wounded, the last
	// maxWounded of them (woundedRing, oldest first): Acquire refuses them
	// at once (ErrAborted) rather than let them wait for a lock they could
	// not use.
	wounded     map[string]struct{}
	woundedRing []string

	// Plain writes admitted without a lock (AdmitPlain). While no holder
	// has a lock a plain write would wait for (excluding) and no
	// transaction is taking one (taking), a plain write only counts
	// itself in (admitted): it could not conflict with anything. A
	// transaction that comes counts itself in taking, which admits no
	// more, and is granted nothing until the admitted ones are done; they
	// are in flight for one raft proposal each.
	excluding int // holders whose locks exclude plain writes (holding.excludes)
	taking    int // Acquire, AcquireAll and TryAcquireAll calls under way but plain writes'
	admitted  int // plain writes admitted by AdmitPlain, not yet done
	// donePlain is DonePlain as a function value, made once.
	donePlain func()
}

// AdmitPlain admits a plain write without taking its locks, and reports
// whether it did: when no lock a plain write would wait for is held and
// no transaction is taking one. An admitted write calls DonePlain once
// its proposal is done; until then transactions wait for it (see
// LockTable.admitted). A write not admitted takes its locks (AcquireAll).
func (lt *LockTable) AdmitPlain() bool {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	if lt.closed || lt.excluding > 0 || lt.taking > 0 {
		return false
	}
	lt.admitted++
	return true
}

// DonePlain ends a plain write that AdmitPlain admitted.
func (lt *LockTable) DonePlain() {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	lt.admitted--
	if lt.admitted == 0 {
		lt.broadcastLocked()
	}
}

// DonePlainFunc returns DonePlain as a function value, the same one every
// time: a write admitted on every request does not allocate one each.
func (lt *LockTable) DonePlainFunc() func() { return lt.donePlain }

// beginTakingLocked counts a transaction's call in taking: no plain write
// is admitted until endTaking.
func (lt *LockTable) beginTakingLocked() { lt.taking++ }

func (lt *LockTable) endTaking() {
	lt.mu.Lock()
	lt.taking--
	lt.mu.Unlock()
}

// NewLockTable returns the empty lock table of a leadership at term.
func NewLockTable(term uint64, checkInterval time.Duration) *LockTable {
	lt := &LockTable{Term: term, CheckInterval: checkInterval, keys: map[string]*keyLock{},
		held: map[string]*holding{}}
	lt.donePlain = lt.DonePlain
	return lt
}

func lockKey(coll uint32, key []byte) string {
	var buf [64]byte
	return string(appendLockKey(buf[:0], coll, key))
}

// appendLockKey appends the lockKey of coll and key to b. A lookup by
// string(appendLockKey(buf[:0], ...)) into a map allocates nothing.
func appendLockKey(b []byte, coll uint32, key []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, coll)
	return append(b, key...)
}

// maxFree bounds each of a table's free lists.
const maxFree = 256

// popFree takes the last element off a free list; nil if it is empty.
func popFree[T any](list *[]*T) *T {
	n := len(*list)
	if n == 0 {
		return nil
	}
	x := (*list)[n-1]
	(*list)[n-1] = nil
	*list = (*list)[:n-1]
	return x
}

// newHoldingLocked returns an empty holding of m, from the free list if it has
// one.
func (lt *LockTable) newHoldingLocked(m *Meta, prepared bool) *holding {
	h := popFree(&lt.freeHoldings)
	if h == nil {
		h = &holding{keys: map[string]Mode{}}
	}
	h.meta, h.prepared, h.since = m, prepared, time.Now()
	return h
}

// freeHoldingLocked keeps h, released, for a later holder. Nothing may
// refer to h any more: callers outside the lock copy what they need of
// a holding (Acquire's victims, AcquireAll's metas).
func (lt *LockTable) freeHoldingLocked(h *holding) {
	if len(lt.freeHoldings) >= maxFree || len(h.keys) > 64 {
		return // a large map is left to the collector
	}
	clear(h.keys)
	*h = holding{keys: h.keys, spans: h.spans[:0]}
	lt.freeHoldings = append(lt.freeHoldings, h)
}

// keyLockLocked returns the lock of the key whose lockKey is k (made
// from a caller's buffer: it is copied only when the lock is new),
// creating it.
func (lt *LockTable) keyLockLocked(k []byte) *keyLock {
	if kl := lt.keys[string(k)]; kl != nil {
		return kl
	}
	kl := popFree(&lt.freeKeys)
	if kl == nil {
		kl = &keyLock{}
	}
	kl.key = string(k)
	lt.keys[kl.key] = kl
	return kl
}

// dropKeyLockLocked removes kl, empty, from the table and keeps it for a
// later key.
func (lt *LockTable) dropKeyLockLocked(kl *keyLock) {
	delete(lt.keys, kl.key)
	if len(lt.freeKeys) >= maxFree || len(kl.shared) > 64 || len(kl.plain) > 64 {
		return
	}
	clear(kl.shared)
	clear(kl.plain)
	*kl = keyLock{shared: kl.shared, plain: kl.plain}
	lt.freeKeys = append(lt.freeKeys, kl)
}

func splitLockKey(k string) (uint32, []byte) {
	return binary.BigEndian.Uint32([]byte(k[:4])), []byte(k[4:])
}

// broadcastLocked wakes every waiter.
func (lt *LockTable) broadcastLocked() {
	if lt.changed != nil {
		close(lt.changed)
		lt.changed = nil
	}
}

// changedLocked returns the channel the table's next change closes. A
// table nobody waits on makes none: every release broadcasts, and most
// (a plain write's, uncontended) have nobody to wake.
func (lt *LockTable) changedLocked() chan struct{} {
	if lt.changed == nil {
		lt.changed = make(chan struct{})
	}
	return lt.changed
}

// conflictsLocked returns the holders (other than m) whose locks conflict
// with m taking t in mode. With share (a plain write's request), the locks
// of other plain writes do not conflict.
func (lt *LockTable) conflictsLocked(m *Meta, t Target, mode Mode, share bool) []*holding {
	var out []*holding
	add := func(id string) {
		if id == "" || id == m.ID {
			return
		}
		h := lt.held[id]
		for _, o := range out {
			if o == h {
				return
			}
		}
		out = append(out, h)
	}
	keyConflicts := func(kl *keyLock) {
		add(kl.excl)
		if mode == Exclusive {
			for id := range kl.shared {
				add(id)
			}
		}
		if !share {
			// A plain write's lock is a write's: it conflicts with every
			// lock but another plain write's.
			for id := range kl.plain {
				add(id)
			}
		}
	}
	if !t.IsSpan {
		var buf [64]byte
		if kl := lt.keys[string(appendLockKey(buf[:0], t.Collection, t.Key))]; kl != nil {
			keyConflicts(kl)
		}
		for _, s := range lt.spans {
			if share && s.plain {
				continue
			}
			if (mode == Exclusive || s.mode == Exclusive) && s.t.covers(t.Collection, t.Key) {
				add(s.id)
			}
		}
		return out
	}
	// A span conflicts with the exclusive locks of keys inside it, and an
	// exclusive span with every lock inside it.
	for k, kl := range lt.keys {
		coll, key := splitLockKey(k)
		if t.covers(coll, key) {
			keyConflicts(kl)
		}
	}
	for _, s := range lt.spans {
		if share && s.plain {
			continue
		}
		if (mode == Exclusive || s.mode == Exclusive) && s.t.overlaps(t) {
			add(s.id)
		}
	}
	return out
}

// waitedForLocked reports whether a transaction other than m waits for a
// lock that t would take a part of.
func (lt *LockTable) waitedForLocked(m *Meta, t Target) bool {
	for _, w := range lt.waiters {
		if w.id == m.ID {
			continue
		}
		switch {
		case !t.IsSpan && !w.t.IsSpan:
			if w.t.Collection == t.Collection && bytes.Equal(w.t.Key, t.Key) {
				return true
			}
		case !t.IsSpan:
			if w.t.covers(t.Collection, t.Key) {
				return true
			}
		case !w.t.IsSpan:
			if t.covers(w.t.Collection, w.t.Key) {
				return true
			}
		default:
			if t.overlaps(w.t) {
				return true
			}
		}
	}
	return false
}

// Waiting reports whether transaction id waits for a lock in the table.
func (lt *LockTable) Waiting(id string) bool {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	for _, w := range lt.waiters {
		if w.id == id {
			return true
		}
	}
	return false
}

// addWaiterLocked records that m waits for a lock on t; the returned
// function removes it and wakes the waiters (plain writes waiting behind
// it).
func (lt *LockTable) addWaiterLocked(m *Meta, t Target) func() {
	w := waiter{t: t, id: m.ID}
	lt.waiters = append(lt.waiters, w)
	return func() {
		lt.mu.Lock()
		defer lt.mu.Unlock()
		for i := range lt.waiters {
			if lt.waiters[i].id == w.id && targetEqual(lt.waiters[i].t, w.t) {
				lt.waiters = append(lt.waiters[:i], lt.waiters[i+1:]...)
				break
			}
		}
		lt.broadcastLocked()
	}
}

func targetEqual(a, b Target) bool {
	return a.Collection == b.Collection && a.IsSpan == b.IsSpan && bytes.Equal(a.Key, b.Key) && bytes.Equal(a.End, b.End)
}

// grantLocked grants m a lock on t in mode; with share (a plain write's
// exclusive lock), one that other plain writes may hold too.
func (lt *LockTable) grantLocked(m *Meta, t Target, mode Mode, share bool) {
	h := lt.held[m.ID]
	if h == nil {
		h = lt.newHoldingLocked(m, false)
		lt.held[m.ID] = h
	}
	if !share && !h.excludes {
		h.excludes = true
		lt.excluding++
	}
	if t.IsSpan {
		lt.spans = append(lt.spans, spanLock{t: t, id: m.ID, mode: mode, plain: share && mode == Exclusive})
		h.spans = append(h.spans, t)
		return
	}
	var buf [64]byte
	kl := lt.keyLockLocked(appendLockKey(buf[:0], t.Collection, t.Key))
	k := kl.key
	if mode == Exclusive && share {
		if kl.plain == nil {
			kl.plain = map[string]bool{}
		}
		kl.plain[m.ID] = true
		h.keys[k] = Exclusive
		return
	}
	if mode == Exclusive {
		kl.excl = m.ID
		delete(kl.shared, m.ID)
		h.keys[k] = Exclusive
		return
	}
	if kl.excl == m.ID || kl.plain[m.ID] {
		return // an exclusive lock covers reads
	}
	if kl.shared == nil {
		kl.shared = map[string]bool{}
	}
	kl.shared[m.ID] = true
	h.keys[k] = Shared
}

// Acquire grants m a lock on t in mode, waiting while older transactions
// (or plain writes) hold conflicting locks and wounding younger unprepared
// holders; a transaction also waits for the plain writes admitted without
// locks (AdmitPlain), and none is admitted until it returns. It fails
// with ErrLocksLost once the table is closed, with the resolver's errors,
// or with ctx's.
func (lt *LockTable) Acquire(ctx context.Context, m *Meta, t Target, mode Mode, r Resolver) error {
	var committed map[string]bool // victims found committed: waited for
	// nextCheck is when this waiter next looks at the holders it waits
	// for; a change in the table wakes it without putting that off, so
	// that holders are checked even while other keys keep changing.
	var nextCheck time.Time
	var unwait func()
	taking := false
	defer func() {
		if unwait != nil {
			unwait()
		}
		if taking {
			lt.endTaking()
		}
	}()
	for {
		lt.mu.Lock()
		if lt.closed {
			lt.mu.Unlock()
			return ErrLocksLost
		}
		if lt.dropped[m.ID] {
			lt.mu.Unlock()
			return ErrLocksDropped
		}
		if _, ok := lt.wounded[m.ID]; ok {
			lt.mu.Unlock()
			return ErrAborted
		}
		if !m.Plain && !taking {
			lt.beginTakingLocked()
			taking = true
		}
		conflicts := lt.conflictsLocked(m, t, mode, m.Plain)
		if len(conflicts) == 0 && (m.Plain || lt.admitted == 0) && !(m.Plain && lt.waitedForLocked(m, t)) {
			lt.grantLocked(m, t, mode, m.Plain)
			if taking {
				lt.taking--
				taking = false
			}
			lt.mu.Unlock()
			return nil
		}
		if !m.Plain && unwait == nil {
			// Plain writes that come now wait behind this transaction,
			// though they share the lock with the plain writes it waits
			// for: a stream of them would keep it waiting forever.
			unwait = lt.addWaiterLocked(m, t)
		}
		ch := lt.changedLocked()
		if nextCheck.IsZero() {
			nextCheck = lt.firstCheck(time.Now(), conflicts)
		}
		type victim struct {
			meta     *Meta
			prepared bool
		}
		vs := make([]victim, len(conflicts))
		for i, h := range conflicts {
			vs[i] = victim{h.meta, h.prepared}
		}
		lt.mu.Unlock()

		waitOnly := true
		for _, v := range vs {
			if m.Plain || v.meta.Plain || v.prepared || !Older(m, v.meta) || committed[v.meta.ID] {
				continue
			}
			// wound-wait: an older requester aborts a younger holder.
			aborted, err := r.Wound(ctx, v.meta)
			if err != nil {
				return err
			}
			if aborted {
				lt.mu.Lock()
				lt.woundedLocked(v.meta.ID)
				lt.mu.Unlock()
				waitOnly = false
			} else {
				// Committed: its locks go when it resolves; wait.
				if committed == nil {
					committed = map[string]bool{}
				}
				committed[v.meta.ID] = true
			}
		}
		if !waitOnly {
			continue
		}
		timer := time.NewTimer(time.Until(nextCheck))
		select {
		case <-ch:
			timer.Stop()
			continue
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-timer.C:
		}
		nextCheck = time.Now().Add(lt.CheckInterval)
		// Waited a while: see whether the requester can still commit (an
		// older transaction may have wounded it in another shard), then
		// whether the holders are still alive.
		if sc, ok := r.(SelfChecker); ok && !m.Plain {
			if aborted, err := sc.Aborted(ctx, m); err == nil && aborted {
				return ErrAborted
			} else if err != nil && ctx.Err() != nil {
				return ctx.Err()
			}
		}
		for _, v := range vs {
			if v.meta.Plain {
				continue
			}
			done, err := r.Check(ctx, v.meta, v.prepared)
			if err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				continue
			}
			if done && !v.prepared {
				lt.releaseUnprepared(v.meta.ID)
			}
		}
	}
}

// TryAcquireAll grants m exclusive locks on every key of targets if no
// other holds any of them, and reports whether it did; it never wounds,
// and waits only for the plain writes admitted without locks (AdmitPlain),
// each in flight for one proposal. (A key yielding to a key group is
// locked so for the length of its yield's proposal.) ErrLocksLost: the
// table is closed; or ctx's error.
func (lt *LockTable) TryAcquireAll(ctx context.Context, m *Meta, targets []Target) (bool, error) {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	lt.beginTakingLocked()
	defer func() { lt.taking-- }()
	for {
		if lt.closed {
			return false, ErrLocksLost
		}
		for _, t := range targets {
			if len(lt.conflictsLocked(m, t, Exclusive, false)) > 0 {
				return false, nil
			}
		}
		if lt.admitted == 0 {
			break
		}
		ch := lt.changedLocked()
		lt.mu.Unlock()
		select {
		case <-ch:
			lt.mu.Lock()
		case <-ctx.Done():
			lt.mu.Lock()
			return false, ctx.Err()
		}
	}
	for _, t := range targets {
		lt.grantLocked(m, t, Exclusive, false)
	}
	return true, nil
}

// AcquireAll grants m exclusive locks on every key of targets at once, or
// none: while any is held by another, it holds nothing and waits. Plain
// writes lock this way, so that they never hold a lock while they wait
// (no deadlock with a transaction waiting for them); holders that stay
// are checked every CheckInterval like Acquire's.
//
// The locks of plain writes (m.Plain) exclude transactions, not each
// other: plain writes of one key are ordered by the shard's log, which
// assigns their versions in that order, and a conditional one is checked
// in Apply; serializing them through the lock made a hot key's writes
// wait a raft round each. A plain write also waits while a transaction
// waits for a lock it would share a key with, so that plain writes cannot
// keep a transaction out of a hot key forever.
func (lt *LockTable) AcquireAll(ctx context.Context, m *Meta, targets []Target, r Resolver) error {
	var nextCheck time.Time // as in Acquire
	taking := false
	defer func() {
		if taking {
			lt.endTaking()
		}
	}()
	for {
		lt.mu.Lock()
		if lt.closed {
			lt.mu.Unlock()
			return ErrLocksLost
		}
		if !m.Plain && !taking {
			lt.beginTakingLocked()
			taking = true
		}
		var conflicts []*holding
		waited := false
		for _, t := range targets {
			conflicts = append(conflicts, lt.conflictsLocked(m, t, Exclusive, m.Plain)...)
			waited = waited || m.Plain && lt.waitedForLocked(m, t)
		}
		if len(conflicts) == 0 && !waited && (m.Plain || lt.admitted == 0) {
			for _, t := range targets {
				lt.grantLocked(m, t, Exclusive, m.Plain)
			}
			if taking {
				lt.taking--
				taking = false
			}
			lt.mu.Unlock()
			return nil
		}
		ch := lt.changedLocked()
		if nextCheck.IsZero() {
			nextCheck = lt.firstCheck(time.Now(), conflicts)
		}
		metas := make([]*Meta, 0, len(conflicts))
		prepared := make([]bool, 0, len(conflicts))
		for _, h := range conflicts {
			metas = append(metas, h.meta)
			prepared = append(prepared, h.prepared)
		}
		lt.mu.Unlock()
		timer := time.NewTimer(time.Until(nextCheck))
		select {
		case <-ch:
			timer.Stop()
			continue
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-timer.C:
		}
		nextCheck = time.Now().Add(lt.CheckInterval)
		for i, h := range metas {
			if h.Plain {
				continue
			}
			done, err := r.Check(ctx, h, prepared[i])
			if err != nil && ctx.Err() != nil {
				return ctx.Err()
			}
			if err == nil && done && !prepared[i] {
				lt.releaseUnprepared(h.ID)
			}
		}
	}
}

// releaseUnprepared releases the locks of a holder a Check found done,
// unless it prepared since the waiter looked: then its locks stay until
// its intents are resolved (else a reader would get past an unresolved
// intent of a committed transaction and read the value before it).
func (lt *LockTable) releaseUnprepared(id string) {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	if h := lt.held[id]; h != nil && h.prepared {
		return
	}
	lt.releaseLocked(id)
}

// DropUnprepared drops every lock of the transactions that hold locks here
// and have not prepared (plain writes' aside), and reports how many. A
// split calls it on the parent's table: a key it locked may be the new
// shard's now, whose own table knows nothing of the lock, so those
// transactions lose their locks here, and their prepares and validations
// fail (they retry, with their priority).
func (lt *LockTable) DropUnprepared() int {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	n := 0
	for id, h := range lt.held {
		if h.prepared || h.meta.Plain {
			continue
		}
		lt.dropLocked(id)
		n++
	}
	return n
}

// maxWounded bounds LockTable.wounded.
const maxWounded = 1024

// woundedLocked releases the locks of id, which a wound aborted, and
// remembers it (see wounded).
func (lt *LockTable) woundedLocked(id string) {
	lt.releaseLocked(id)
	if _, ok := lt.wounded[id]; ok {
		return
	}
	if lt.wounded == nil {
		lt.wounded = map[string]struct{}{}
	}
	if len(lt.woundedRing) == maxWounded {
		delete(lt.wounded, lt.woundedRing[0])
		lt.woundedRing = lt.woundedRing[1:]
	}
	lt.wounded[id] = struct{}{}
	lt.woundedRing = append(lt.woundedRing, id)
}

// dropLocked releases the locks of id for good (see dropped).
func (lt *LockTable) dropLocked(id string) {
	if lt.dropped == nil {
		lt.dropped = map[string]bool{}
	}
	lt.dropped[id] = true
	lt.releaseLocked(id)
}

// Release drops every lock of transaction id and wakes the waiters.
func (lt *LockTable) Release(id string) {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	lt.releaseLocked(id)
}

func (lt *LockTable) releaseLocked(id string) {
	h := lt.held[id]
	if h == nil {
		return
	}
	delete(lt.held, id)
	if h.excludes {
		lt.excluding--
	}
	for k := range h.keys {
		kl := lt.keys[k]
		if kl == nil {
			continue
		}
		if kl.excl == id {
			kl.excl = ""
		}
		delete(kl.shared, id)
		delete(kl.plain, id)
		if kl.empty() {
			lt.dropKeyLockLocked(kl)
		}
	}
	if len(h.spans) > 0 {
		out := lt.spans[:0]
		for _, s := range lt.spans {
			if s.id != id {
				out = append(out, s)
			}
		}
		lt.spans = out
	}
	lt.freeHoldingLocked(h)
	lt.broadcastLocked()
}

// Prepare marks the locks of transaction id prepared before its prepare is
// proposed, if it still holds an exclusive lock on every key of writes and
// a lock on every key of reads (and its spans): from then on it is waited
// for, never wounded, so no lock it prepares with is handed over while the
// prepare is in flight. It reports false, marking nothing, when a lock is
// gone (the transaction was wounded or expired).
func (lt *LockTable) Prepare(id string, writes, reads []Target) bool {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	h := lt.held[id]
	if h == nil || lt.closed {
		return false
	}
	for _, t := range writes {
		if h.keys[lockKey(t.Collection, t.Key)] != Exclusive {
			return false
		}
	}
	for _, t := range reads {
		if t.IsSpan {
			if len(h.spans) == 0 {
				return false
			}
			continue
		}
		if _, ok := h.keys[lockKey(t.Collection, t.Key)]; !ok {
			return false
		}
	}
	h.prepared = true
	return true
}

// MarkPrepared marks the locks of transaction id prepared: they are no
// longer wounded, only waited for (its intents are durable). It reports
// whether id held any lock here.
func (lt *LockTable) MarkPrepared(id string) bool {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	h := lt.held[id]
	if h == nil {
		return false
	}
	h.prepared = true
	return true
}

// Restore grants the locks of a prepared transaction, rebuilt from its
// logged intents and read set by a new leader. Conflicts are impossible:
// the transactions prepared at once in one shard held compatible locks.
func (lt *LockTable) Restore(m *Meta, writes []Target, reads []Target) {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	if lt.closed {
		return
	}
	for _, t := range writes {
		lt.grantLocked(m, t, Exclusive, false)
	}
	for _, t := range reads {
		lt.grantLocked(m, t, Shared, false)
	}
	if h := lt.held[m.ID]; h != nil {
		h.prepared = true
	} else {
		lt.held[m.ID] = lt.newHoldingLocked(m, true)
	}
}

// Adopt grants the locks of a prepared transaction that a merge brought
// into this shard (the merged shard's table, which held them, is gone).
// An unprepared transaction holding a lock here that conflicts with one
// of them took it between the merge's apply and this call, on a key whose
// intent its read did not see: it loses every lock here (its prepare or
// validation fails and it retries). Adopt reports how many lost theirs.
// Adopting locks the transaction holds here already changes nothing.
func (lt *LockTable) Adopt(m *Meta, writes, reads []Target) int {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	if lt.closed {
		return 0
	}
	dropped := 0
	grant := func(t Target, mode Mode) {
		for _, h := range lt.conflictsLocked(m, t, mode, false) {
			if !h.prepared && !h.meta.Plain {
				lt.dropLocked(h.meta.ID)
				dropped++
			}
		}
		if h := lt.held[m.ID]; h != nil && t.IsSpan && slices.ContainsFunc(h.spans, func(s Target) bool { return targetEqual(s, t) }) {
			return
		}
		lt.grantLocked(m, t, mode, false)
	}
	for _, t := range writes {
		grant(t, Exclusive)
	}
	for _, t := range reads {
		grant(t, Shared)
	}
	if h := lt.held[m.ID]; h != nil {
		h.prepared = true
	} else {
		lt.held[m.ID] = lt.newHoldingLocked(m, true)
	}
	return dropped
}

// HoldsExclusive reports whether transaction id holds an exclusive lock on
// key target t here.
func (lt *LockTable) HoldsExclusive(id string, t Target) bool {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	h := lt.held[id]
	return h != nil && !lt.closed && h.keys[lockKey(t.Collection, t.Key)] == Exclusive
}

// Holds reports whether transaction id holds a lock here.
func (lt *LockTable) Holds(id string) bool {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	_, ok := lt.held[id]
	return ok
}

// Close drops every lock (the leadership ended) and fails every waiter.
func (lt *LockTable) Close() {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	if lt.closed {
		return
	}
	lt.closed = true
	lt.keys, lt.spans, lt.held = map[string]*keyLock{}, nil, map[string]*holding{}
	lt.excluding = 0
	lt.broadcastLocked()
}

// Closed reports whether the table was closed.
func (lt *LockTable) Closed() bool {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	return lt.closed
}

// Dump describes the table's locks, one per line in a stable order (for
// tests).
func (lt *LockTable) Dump() []string {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	var out []string
	for k, kl := range lt.keys {
		_, key := splitLockKey(k)
		if kl.excl != "" {
			out = append(out, string(key)+" X "+kl.excl+prepMark(lt.held[kl.excl]))
		}
		for id := range kl.shared {
			out = append(out, string(key)+" S "+id+prepMark(lt.held[id]))
		}
		for id := range kl.plain {
			out = append(out, string(key)+" X "+id+" plain")
		}
	}
	for _, s := range lt.spans {
		l := "[" + string(s.t.Key) + "," + string(s.t.End) + ") " + map[Mode]string{Shared: "S", Exclusive: "X"}[s.mode] + " " + s.id + prepMark(lt.held[s.id])
		if s.plain {
			l += " plain"
		}
		out = append(out, l)
	}
	sort.Strings(out)
	return out
}

func prepMark(h *holding) string {
	if h != nil && h.prepared {
		return " prepared"
	}
	return ""
}
