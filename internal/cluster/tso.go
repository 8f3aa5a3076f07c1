package cluster

import (
	"sync"
	"time"
)

// LogicalBits is the number of low bits of a hybrid timestamp that count
// events within one millisecond.
const LogicalBits = 18

// TimestampFromTime returns the smallest hybrid timestamp of t's millisecond.
func TimestampFromTime(t time.Time) uint64 {
	return uint64(t.UnixMilli()) << LogicalBits
}

// TimeFromTimestamp returns the wall time of a hybrid timestamp.
func TimeFromTimestamp(ts uint64) time.Time {
	return time.UnixMilli(int64(ts >> LogicalBits))
}

// Oracle windows: the oracle persists a high-water mark tsoWindow ahead of
// the clock and renews it once less than tsoRenew remains, so a healthy
// leader never waits on persistence, and a new leader starts at most
// tsoWindow ahead of real time.
const (
	tsoWindow = 3 * time.Second
	tsoRenew  = 2 * time.Second
)

// Oracle issues strictly increasing hybrid timestamps. It runs on the meta
// shard's leader only. Every timestamp it issues is at most the persisted
// high-water mark; a new leader starts above the mark it finds applied.
type Oracle struct {
	clock func() time.Time
	// persist proposes a new high-water mark to the meta shard. It must not
	// block; OnPersisted reports the mark once applied.
	persist func(hwm uint64)

	mu struct {
		sync.Mutex
		// active is true while this node leads the meta shard and has loaded
		// the applied high-water mark.
		active bool
		// last is the last timestamp issued. Invariant: last <= hwm.
		last uint64
		// named is the highest timestamp Latest answered: every timestamp
		// issued later is above it.
		named uint64
		// hwm is the highest applied high-water mark.
		hwm uint64
		// requested is the highest mark proposed; requested >= hwm.
		requested uint64
	}
}

// NewOracle returns an inactive oracle.
func NewOracle(clock func() time.Time, persist func(hwm uint64)) *Oracle {
	return &Oracle{clock: clock, persist: persist}
}

// Activate starts issuing above hwm, the applied high-water mark, after this
// node became leader of the meta shard and applied an entry of its term.
func (o *Oracle) Activate(hwm uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.mu.active = true
	if hwm > o.mu.hwm {
		o.mu.hwm = hwm
	}
	o.mu.last = o.mu.hwm
	o.mu.requested = o.mu.hwm
	o.renewLocked(o.physical())
}

// Deactivate stops issuing (leadership lost).
func (o *Oracle) Deactivate() {
	o.mu.Lock()
	o.mu.active = false
	o.mu.Unlock()
}

// OnPersisted records an applied high-water mark.
func (o *Oracle) OnPersisted(hwm uint64) {
	o.mu.Lock()
	if hwm > o.mu.hwm {
		o.mu.hwm = hwm
	}
	if hwm > o.mu.requested {
		o.mu.requested = hwm
	}
	o.mu.Unlock()
}

func (o *Oracle) physical() uint64 { return TimestampFromTime(o.clock()) }

func (o *Oracle) renewLocked(phys uint64) {
	if o.mu.requested < phys+uint64(tsoRenew.Milliseconds())<<LogicalBits {
		o.mu.requested = phys + uint64(tsoWindow.Milliseconds())<<LogicalBits
		o.persist(o.mu.requested)
	}
}

// TryNext issues a timestamp above floor and above every one issued before,
// or returns false when the oracle is inactive or must wait for its
// high-water mark to be persisted (the caller retries after the next apply
// cycle). A shard leader passes as floor its last version and its read
// watermark, so that every version it assigns is one the oracle issued:
// Latest never falls below an acknowledged write.
func (o *Oracle) TryNext(floor uint64) (uint64, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.mu.active {
		return 0, false
	}
	ts := max(o.physical(), o.mu.last+1, o.mu.named+1, floor+1)
	o.renewLocked(ts)
	if ts > o.mu.hwm {
		return 0, false
	}
	o.mu.last = ts
	return ts, true
}

// TryNextN reserves count consecutive timestamps above floor and above
// every one issued before and returns the first, for a node that hands
// them to its own shard leaders. false as for TryNext.
func (o *Oracle) TryNextN(floor uint64, count int) (uint64, bool) {
	if count < 1 {
		count = 1
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.mu.active {
		return 0, false
	}
	ts := max(o.physical(), o.mu.last+1, o.mu.named+1, floor+1)
	end := ts + uint64(count) - 1
	o.renewLocked(end)
	if end > o.mu.hwm {
		return 0, false
	}
	o.mu.last = end
	return ts, true
}

// Active reports whether the oracle issues timestamps.
func (o *Oracle) Active() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.mu.active
}

// Latest returns a timestamp at or above every one issued so far: the
// highest a snapshot read may name without reading the future. Every
// timestamp issued afterwards is above it, so that a write that starts
// after a reader took its version (to watch the changes above it, say)
// lands above that version even within the same millisecond.
func (o *Oracle) Latest() uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.mu.named = max(o.mu.named, o.mu.last, o.physical())
	return o.mu.named
}
