package cluster

import (
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// fakeEpoch is the start time of fake clocks; its sub-millisecond part
// checks that timestamps truncate to milliseconds.
var fakeEpoch = time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.UTC)

// fakeClock is a manual clock safe for concurrent use.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: fakeEpoch} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// fakePersist records the marks an oracle proposes. It must not call the
// oracle: persist runs under the oracle's mutex.
type fakePersist struct {
	mu    sync.Mutex
	marks []uint64
}

func (p *fakePersist) persist(hwm uint64) {
	p.mu.Lock()
	p.marks = append(p.marks, hwm)
	p.mu.Unlock()
}

// last returns the last proposed mark, 0 if none.
func (p *fakePersist) last() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.marks) == 0 {
		return 0
	}
	return p.marks[len(p.marks)-1]
}

func (p *fakePersist) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.marks)
}

// oracleChecker issues through an oracle and checks every invariant: each
// timestamp is above the previous one and the activation mark, at most the
// applied mark, and at most Latest().
type oracleChecker struct {
	t       *testing.T
	o       *Oracle
	clock   *fakeClock
	p       *fakePersist
	floor   uint64 // every timestamp must be above it
	applied uint64 // every timestamp must be at most it
	last    uint64
}

func newOracleChecker(t *testing.T) *oracleChecker {
	c := &oracleChecker{t: t, clock: newFakeClock(), p: &fakePersist{}}
	c.o = NewOracle(c.clock.Now, c.p.persist)
	return c
}

// activate activates the oracle. Every mark applied so far may have been
// issued up to by an earlier leader, so all of them are floors.
func (c *oracleChecker) activate(hwm uint64) {
	c.o.Activate(hwm)
	c.floor = max(c.floor, hwm, c.last, c.applied)
	c.applied = max(c.applied, hwm)
}

func (c *oracleChecker) persisted(hwm uint64) {
	c.o.OnPersisted(hwm)
	c.applied = max(c.applied, hwm)
}

// next calls TryNext and checks the answer.
func (c *oracleChecker) next() (uint64, bool) {
	c.t.Helper()
	ts, ok := c.o.TryNext(0)
	if !ok {
		if ts != 0 {
			c.t.Fatalf("TryNext = %d, false", ts)
		}
		return 0, false
	}
	if ts <= c.floor {
		c.t.Fatalf("issued %d, not above the activation mark %d", ts, c.floor)
	}
	if ts <= c.last {
		c.t.Fatalf("issued %d after %d", ts, c.last)
	}
	if ts > c.applied {
		c.t.Fatalf("issued %d above the applied mark %d", ts, c.applied)
	}
	if l := c.o.Latest(); l < ts {
		c.t.Fatalf("Latest() = %d below issued %d", l, ts)
	}
	c.last = ts
	return ts, true
}

func (c *oracleChecker) mustNext() uint64 {
	c.t.Helper()
	ts, ok := c.next()
	if !ok {
		c.t.Fatalf("TryNext refused at clock %v (applied mark %d, last %d)", c.clock.Now(), c.applied, c.last)
	}
	return ts
}

func (c *oracleChecker) mustRefuse() {
	c.t.Helper()
	if ts, ok := c.next(); ok {
		c.t.Fatalf("TryNext issued %d, want a refusal (applied mark %d)", ts, c.applied)
	}
}

func ms(d time.Duration) uint64 { return uint64(d.Milliseconds()) << LogicalBits }

func TestOracleInactive(t *testing.T) {
	c := newOracleChecker(t)
	if c.o.Active() {
		t.Fatal("a new oracle is active")
	}
	c.mustRefuse()
	c.persisted(TimestampFromTime(fakeEpoch) + ms(time.Hour))
	c.mustRefuse() // a persisted mark does not activate it
	if c.p.count() != 0 {
		t.Fatalf("an inactive oracle proposed marks %v", c.p.marks)
	}
	c.activate(0)
	if !c.o.Active() {
		t.Fatal("not active after Activate")
	}
	// The mark applied before activation is a floor: a new one must apply.
	c.mustRefuse()
	c.persisted(c.p.last())
	c.mustNext()
	c.o.Deactivate()
	if c.o.Active() {
		t.Fatal("active after Deactivate")
	}
	c.mustRefuse()
}

// TestOracleWaitsForPersistence activates below the clock: nothing may be
// issued until the proposed mark is applied.
func TestOracleWaitsForPersistence(t *testing.T) {
	c := newOracleChecker(t)
	phys := TimestampFromTime(fakeEpoch)
	c.activate(phys - ms(time.Minute))
	if got, want := c.p.last(), phys+ms(tsoWindow); got != want {
		t.Fatalf("Activate proposed %d, want the clock plus the window %d", got, want)
	}
	c.mustRefuse()
	c.mustRefuse()
	c.persisted(c.p.last())
	if ts := c.mustNext(); ts != phys {
		t.Fatalf("first timestamp %d, want the clock's %d", ts, phys)
	}
}

// TestOracleActivateAboveClock activates with a mark ahead of the clock (a
// previous leader's window): issuing starts above it.
func TestOracleActivateAboveClock(t *testing.T) {
	c := newOracleChecker(t)
	phys := TimestampFromTime(fakeEpoch)
	hwm := phys + ms(10*time.Second)
	c.activate(hwm)
	if c.p.count() != 0 {
		t.Fatalf("Activate proposed %v though the mark is far ahead of the clock", c.p.marks)
	}
	// Everything up to hwm may have been issued by the previous leader, so
	// the next timestamp needs a new mark.
	c.mustRefuse()
	if c.p.last() <= hwm {
		t.Fatalf("TryNext proposed %d, not above the activation mark %d", c.p.last(), hwm)
	}
	c.persisted(c.p.last())
	if ts := c.mustNext(); ts != hwm+1 {
		t.Fatalf("first timestamp %d, want %d", ts, hwm+1)
	}
	c.mustNext()
}

// TestOracleWindow uses up a window: the oracle renews it ahead of time and
// refuses once the clock passes an applied mark that was not renewed.
func TestOracleWindow(t *testing.T) {
	c := newOracleChecker(t)
	phys := TimestampFromTime(fakeEpoch)
	c.activate(0)
	c.persisted(c.p.last()) // phys + 3s
	c.mustNext()
	n := c.p.count()

	// With more than tsoRenew left, no renewal.
	c.clock.Advance(999 * time.Millisecond)
	c.mustNext()
	if c.p.count() != n {
		t.Fatalf("renewed with more than %v left: %v", tsoRenew, c.p.marks)
	}
	// With less left, a renewal is proposed and issuing goes on.
	c.clock.Advance(2 * time.Millisecond)
	c.mustNext()
	if c.p.count() != n+1 || c.p.last() != phys+ms(1001*time.Millisecond)+ms(tsoWindow) {
		t.Fatalf("renewal: marks %v", c.p.marks)
	}
	// The renewal is not applied: at the applied mark the clock's own
	// timestamp is issued, then the window is used up.
	c.clock.Advance(3*time.Second - 1001*time.Millisecond)
	if ts := c.mustNext(); ts != phys+ms(tsoWindow) {
		t.Fatalf("issued %d at the applied mark %d", ts, phys+ms(tsoWindow))
	}
	c.mustRefuse()
	c.clock.Advance(time.Second)
	c.mustRefuse()
	// Once the renewal applies, issuing resumes.
	c.persisted(c.p.marks[n])
	c.mustNext()
	// An older mark applied late changes nothing.
	c.persisted(phys)
	c.mustNext()
}

// TestOracleCounterExhausted uses up an applied mark within one
// millisecond: the logical counter stops at the mark.
func TestOracleCounterExhausted(t *testing.T) {
	c := newOracleChecker(t)
	phys := TimestampFromTime(fakeEpoch)
	c.activate(0)
	// An older, smaller mark is what applied (the window's proposal is
	// still in flight).
	c.persisted(phys + 5)
	for i := uint64(0); i <= 5; i++ {
		if ts := c.mustNext(); ts != phys+i {
			t.Fatalf("timestamp %d is %d, want %d", i, ts, phys+i)
		}
	}
	c.mustRefuse()
	c.mustRefuse()
	c.persisted(c.p.last())
	if ts := c.mustNext(); ts != phys+6 {
		t.Fatalf("after the window applied: %d, want %d", ts, phys+6)
	}
}

func TestOracleLogicalCounter(t *testing.T) {
	c := newOracleChecker(t)
	phys := TimestampFromTime(fakeEpoch)
	c.activate(0)
	c.persisted(c.p.last())
	for i := uint64(0); i < 10000; i++ {
		ts := c.mustNext()
		if ts != phys+i {
			t.Fatalf("timestamp %d within one millisecond is %d, want %d", i, ts, phys+i)
		}
		if !TimeFromTimestamp(ts).Equal(fakeEpoch.Truncate(time.Millisecond)) {
			t.Fatalf("timestamp %d has wall time %v", ts, TimeFromTimestamp(ts))
		}
	}
	// The next millisecond starts over at its own physical time.
	c.clock.Advance(time.Millisecond)
	if ts := c.mustNext(); ts != phys+ms(time.Millisecond) {
		t.Fatalf("next millisecond: %d, want %d", ts, phys+ms(time.Millisecond))
	}
}

func TestOracleClockBackwards(t *testing.T) {
	c := newOracleChecker(t)
	c.activate(0)
	c.persisted(c.p.last())
	c.clock.Advance(time.Second)
	c.persisted(TimestampFromTime(c.clock.Now()) + ms(time.Minute))
	high := c.mustNext()
	c.clock.Advance(-5 * time.Second)
	for i := uint64(1); i <= 100; i++ {
		if ts := c.mustNext(); ts != high+i {
			t.Fatalf("clock went back: timestamp %d, want %d", ts, high+i)
		}
	}
	if l := c.o.Latest(); l < high+100 {
		t.Fatalf("Latest() = %d below issued %d", l, high+100)
	}
	// The clock catches up and passes the last timestamp.
	c.clock.Advance(5*time.Second + time.Millisecond)
	if ts := c.mustNext(); ts != TimestampFromTime(c.clock.Now()) {
		t.Fatalf("clock caught up: %d, want %d", ts, TimestampFromTime(c.clock.Now()))
	}
}

// TestOracleReactivate loses and regains leadership with a stale mark: the
// oracle never goes back below what it issued.
func TestOracleReactivate(t *testing.T) {
	c := newOracleChecker(t)
	c.activate(0)
	c.persisted(c.p.last())
	for range 10 {
		c.mustNext()
	}
	c.o.Deactivate()
	c.mustRefuse()
	c.clock.Advance(-time.Second)
	c.activate(0)
	// Everything up to the applied mark may have been issued: the oracle
	// needs a new mark first.
	c.mustRefuse()
	c.persisted(c.p.last())
	c.mustNext()
}

// TestOracleIssuesAboveLatest names a version with Latest and then issues
// within the same millisecond: what is issued afterwards, one timestamp or
// a window, is above the named version (a watch from it sees the write),
// also when the clock has passed the applied mark.
func TestOracleIssuesAboveLatest(t *testing.T) {
	c := newOracleChecker(t)
	phys := TimestampFromTime(fakeEpoch)
	c.activate(0)
	c.persisted(c.p.last())
	if l := c.o.Latest(); l != phys {
		t.Fatalf("Latest() = %d, want the clock's %d", l, phys)
	}
	if ts := c.mustNext(); ts != phys+1 {
		t.Fatalf("issued %d after Latest named %d", ts, phys)
	}
	l := c.o.Latest()
	if first, ok := c.o.TryNextN(0, 10); !ok || first <= l {
		t.Fatalf("TryNextN = %d, %v after Latest named %d", first, ok, l)
	}
	c.last = c.o.Latest()

	// The clock passes the applied mark (no timestamp was asked for a
	// while): Latest answers the clock, and the next timestamp, once the
	// renewed mark applied, is above it.
	c.clock.Advance(time.Minute)
	l = c.o.Latest()
	if want := TimestampFromTime(c.clock.Now()); l != want {
		t.Fatalf("Latest() = %d, want the clock's %d", l, want)
	}
	c.mustRefuse()
	c.persisted(c.p.last())
	if ts := c.mustNext(); ts <= l {
		t.Fatalf("issued %d after Latest named %d", ts, l)
	}
}

// TestOracleRandom drives an oracle with random clock moves, persistence
// delays and leadership changes, checking the invariants at every step.
func TestOracleRandom(t *testing.T) {
	seed := rand.Uint64()
	rng := rand.New(rand.NewPCG(seed, 0))
	defer func() {
		if t.Failed() {
			t.Logf("SEED %d", seed)
		}
	}()
	c := newOracleChecker(t)
	c.activate(0)
	applied := 0 // marks c.p.marks[:applied] were reported persisted
	issued := 0
	for step := 0; step < 20000; step++ {
		switch r := rng.IntN(100); {
		case r < 60:
			if _, ok := c.next(); ok {
				issued++
			}
		case r < 80:
			c.clock.Advance(time.Duration(rng.IntN(1500)-300) * time.Millisecond / 10)
		case r < 95:
			if n := c.p.count(); applied < n {
				applied += 1 + rng.IntN(n-applied)
				c.persisted(c.p.marks[applied-1])
			}
		case r < 97:
			c.o.Deactivate()
			c.mustRefuse()
			c.activate(c.applied)
		default:
			if l := c.o.Latest(); l < c.last {
				t.Fatalf("Latest() = %d below issued %d", l, c.last)
			}
		}
		if t.Failed() {
			return
		}
	}
	if issued == 0 {
		t.Fatalf("seed %d: nothing issued", seed)
	}
}

// TestOracleConcurrent issues from many goroutines while the clock moves
// back and forth: every timestamp is unique, and each goroutine sees its own
// increasing. Run with -race.
func TestOracleConcurrent(t *testing.T) {
	clock := newFakeClock()
	p := &fakePersist{}
	o := NewOracle(clock.Now, p.persist)
	o.Activate(0)
	o.OnPersisted(TimestampFromTime(fakeEpoch) + ms(time.Hour))

	const workers, per = 16, 2000
	results := make([][]uint64, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var last uint64
			for i := 0; i < per; i++ {
				if i%100 == 0 {
					// Clock moves, some backwards, from many goroutines.
					clock.Advance(time.Duration(int(i/100)%3-1) * time.Millisecond)
				}
				ts, ok := o.TryNext(0)
				if !ok {
					t.Errorf("worker %d: TryNext refused", w)
					return
				}
				if ts <= last {
					t.Errorf("worker %d: %d after %d", w, ts, last)
					return
				}
				if l := o.Latest(); l < ts {
					t.Errorf("worker %d: Latest() = %d below %d", w, l, ts)
					return
				}
				last = ts
				results[w] = append(results[w], ts)
			}
		}()
	}
	wg.Wait()
	seen := make(map[uint64]int, workers*per)
	for w, r := range results {
		for _, ts := range r {
			if prev, dup := seen[ts]; dup {
				t.Fatalf("timestamp %d issued to workers %d and %d", ts, prev, w)
			}
			seen[ts] = w
		}
	}
	if len(seen) != workers*per {
		t.Fatalf("%d timestamps, want %d", len(seen), workers*per)
	}
}
