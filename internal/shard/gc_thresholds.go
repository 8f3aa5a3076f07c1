package shard

import (
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
)

// GCThresholds is a node's view of its shards' GC thresholds for readers,
// so that a read need not look the threshold up in storage to know its
// versions were still there (a scan checks it after it read, see
// Node.checkRetained).
//
// The one rule: for every shard, the value Get answers is never below
// the threshold committed to storage. Thresholds only rise, and every
// apply that raises one (a GC, a merge taking in the right shard's, a
// split giving the child its parent's) raises it here while it writes it
// into the batch, before the batch commits. A restored snapshot replaces
// the threshold with the batch that restores it, written elsewhere than
// by Apply: the host holds the shard (Hold) over that commit, and Get
// reads storage while it is held. A value above storage's — a raise whose
// batch has not committed yet, a replica removed since — only makes a
// read refuse versions that are about to go, or whose replica is gone.
type GCThresholds struct {
	m sync.Map // shard ID -> *gcThreshold
}

type gcThreshold struct {
	v atomic.Uint64
	// known: v is at least what storage held once (Get read it, or the
	// shard published what it loaded); before, raises alone may miss a
	// threshold an earlier process committed.
	known atomic.Bool
	held  atomic.Int32
}

// NewGCThresholds returns an empty view.
func NewGCThresholds() *GCThresholds { return &GCThresholds{} }

func (t *GCThresholds) entry(id uint64) *gcThreshold {
	if e, ok := t.m.Load(id); ok {
		return e.(*gcThreshold)
	}
	e, _ := t.m.LoadOrStore(id, new(gcThreshold))
	return e.(*gcThreshold)
}

// Raise makes shard id's threshold at least v.
func (t *GCThresholds) Raise(id, v uint64) {
	if t == nil {
		return
	}
	raise(&t.entry(id).v, v)
}

func raise(a *atomic.Uint64, v uint64) {
	for {
		cur := a.Load()
		if cur >= v || a.CompareAndSwap(cur, v) {
			return
		}
	}
}

// Loaded publishes shard id's threshold v, as loaded from storage.
func (t *GCThresholds) Loaded(id, v uint64) {
	if t == nil {
		return
	}
	e := t.entry(id)
	raise(&e.v, v)
	e.known.Store(true)
}

// Hold makes Get read shard id's threshold from storage until the
// matching Release.
func (t *GCThresholds) Hold(id uint64) {
	if t == nil {
		return
	}
	t.entry(id).held.Add(1)
}

// Release ends a Hold of shard id, whose threshold is now v (as loaded
// from storage after the commit).
func (t *GCThresholds) Release(id, v uint64) {
	if t == nil {
		return
	}
	e := t.entry(id)
	raise(&e.v, v)
	e.known.Store(true)
	e.held.Add(-1)
}

// Get answers shard id's GC threshold, reading it from r the first time
// (and while the shard is held). Without a view (t nil) it reads r.
func (t *GCThresholds) Get(r pebble.Reader, id uint64) (uint64, error) {
	if t == nil {
		return ReadGCThreshold(r, id)
	}
	if e, ok := t.m.Load(id); ok {
		e := e.(*gcThreshold)
		if e.known.Load() && e.held.Load() == 0 {
			return e.v.Load(), nil
		}
	}
	// Read storage, then publish what it held: a raise that overtook the
	// read is kept (Raise keeps the larger), and storage never holds more
	// than a raise before it.
	v, err := ReadGCThreshold(r, id)
	if err != nil {
		return 0, err
	}
	e := t.entry(id)
	raise(&e.v, v)
	e.known.Store(true)
	return e.v.Load(), nil
}
