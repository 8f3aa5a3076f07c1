package node

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeOracle issues timestamps for versionSource tests: a fetch is given
// its window when it asks (as the real oracle issues on arrival), and the
// answer is held until the test releases it.
type fakeOracle struct {
	mu       sync.Mutex
	issued   uint64 // the highest timestamp issued
	inFlight int
	most     int // the most fetches in flight at once
	waiting  []chan struct{}
}

func (o *fakeOracle) fetchWindow(ctx context.Context, count int, floor uint64) (uint64, error) {
	o.mu.Lock()
	first := max(o.issued, floor) + 1
	o.issued = first + uint64(count) - 1
	o.inFlight++
	o.most = max(o.most, o.inFlight)
	release := make(chan struct{})
	o.waiting = append(o.waiting, release)
	o.mu.Unlock()
	<-release
	o.mu.Lock()
	o.inFlight--
	o.mu.Unlock()
	return first, nil
}

// release answers the i-th of the fetches waiting (false: none waits).
func (o *fakeOracle) release(pick func(n int) int) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.waiting) == 0 {
		return false
	}
	i := pick(len(o.waiting))
	close(o.waiting[i])
	o.waiting = append(o.waiting[:i], o.waiting[i+1:]...)
	return true
}

func (o *fakeOracle) issueElsewhere(k uint64) {
	o.mu.Lock()
	o.issued += k
	o.mu.Unlock()
}

func (o *fakeOracle) high() uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.issued
}

type inactiveOracle struct{}

func (inactiveOracle) Active() bool                  { return false }
func (inactiveOracle) TryNext(uint64) (uint64, bool) { return 0, false }

// TestVersionSourceRealTime: a proposal's version is above every
// timestamp the oracle issued before the proposal was queued — to this
// node's earlier windows or to anyone else — however the window fetches
// interleave and in whatever order their answers come back; and no more
// than maxFetches fetches run at once.
func TestVersionSourceRealTime(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	for round := range 20 {
		o := &fakeOracle{}
		var seq atomic.Uint64
		stop := make(chan struct{})
		v := &versionSource{fetchSize: 1 + rng.IntN(8), local: inactiveOracle{}, fetchWindow: o.fetchWindow, stop: stop,
			proposalSeq: seq.Load, signal: func() {}}
		type proposal struct {
			seq, above uint64 // above: the oracle's highest when it was queued
		}
		var pending []proposal
		issued := map[uint64]bool{}
		try := func() {
			// The host tries its queued proposals in order, each until
			// one gets no timestamp.
			for len(pending) > 0 {
				p := pending[0]
				ts, ok := v.TryNextAfter(0, p.seq)
				if !ok {
					return
				}
				if ts <= p.above {
					t.Fatalf("seed %d round %d: proposal %d got version %d, not above %d, which the oracle issued before it was queued", seed, round, p.seq, ts, p.above)
				}
				if issued[ts] {
					t.Fatalf("seed %d round %d: version %d issued twice", seed, round, ts)
				}
				issued[ts] = true
				pending = pending[1:]
			}
		}
		for step := 0; step < 2000 || len(pending) > 0; step++ {
			if step > 100000 {
				t.Fatalf("seed %d round %d: proposals %v still wait", seed, round, pending)
			}
			switch r := rng.IntN(10); {
			case r < 3 && step < 2000:
				// What the oracle issued before the proposal is queued:
				// read first, as a fetch whose goroutine runs meanwhile
				// may take the new number and issue its window at once.
				above := o.high()
				pending = append(pending, proposal{seq: seq.Add(1), above: above})
			case r < 4:
				o.issueElsewhere(uint64(1 + rng.IntN(5)))
			case r < 7:
				if !o.release(rng.IntN) {
					time.Sleep(10 * time.Microsecond) // a fetch's goroutine may not have asked yet
				}
			default:
				try()
			}
		}
		close(stop)
		for o.release(func(int) int { return 0 }) {
		}
		if o.most > maxFetches {
			t.Fatalf("seed %d round %d: %d fetches ran at once, at most %d may", seed, round, o.most, maxFetches)
		}
	}
}

// TestVersionSourceSecondFetch: a proposal queued while a fetch is in
// flight starts a second one instead of waiting for the first to end, and
// a window fetched earlier that arrives later does not replace a newer
// one.
func TestVersionSourceSecondFetch(t *testing.T) {
	o := &fakeOracle{}
	var seq atomic.Uint64
	v := &versionSource{fetchSize: 10, local: inactiveOracle{}, fetchWindow: o.fetchWindow, stop: make(chan struct{}),
		proposalSeq: seq.Load, signal: func() {}}
	waitAsked := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
			o.mu.Lock()
			got := len(o.waiting)
			o.mu.Unlock()
			if got == n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d fetches asked, want %d", got, n)
			}
		}
	}
	waitWindow := func(s uint64) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
			v.mu.Lock()
			got, fetching := v.mu.seq, v.mu.fetching
			v.mu.Unlock()
			if got == s && fetching < 2 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("window of proposal %d, want %d", got, s)
			}
		}
	}
	// Proposal 1: fetch A asks (the oracle issues 1..10).
	if _, ok := v.TryNextAfter(0, seq.Add(1)); ok {
		t.Fatal("a timestamp before any window was fetched")
	}
	waitAsked(1)
	// Proposal 2, queued while A is in flight: fetch B (11..20).
	if _, ok := v.TryNextAfter(0, seq.Add(1)); ok {
		t.Fatal("proposal 2 got a timestamp from no window")
	}
	waitAsked(2)
	// Proposal 3: two fetches are in flight already.
	if _, ok := v.TryNextAfter(0, seq.Add(1)); ok {
		t.Fatal("proposal 3 got a timestamp from no window")
	}
	time.Sleep(10 * time.Millisecond)
	o.mu.Lock()
	if len(o.waiting) != 2 {
		t.Fatalf("%d fetches asked; two may run at once", len(o.waiting))
	}
	o.mu.Unlock()
	// B answers first: proposal 2 may use its window, proposal 3 not.
	o.release(func(int) int { return 1 })
	waitWindow(2)
	if ts, ok := v.TryNextAfter(0, 2); !ok || ts != 11 {
		t.Fatalf("proposal 2 got %d, %v; want 11 from fetch B's window", ts, ok)
	}
	if _, ok := v.TryNextAfter(0, 3); ok {
		t.Fatal("proposal 3 used a window fetched before it was queued")
	}
	// A answers late: its older window (1..10) is dropped.
	o.release(func(int) int { return 0 })
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		v.mu.Lock()
		fetching := v.mu.fetching
		v.mu.Unlock()
		if fetching == 1 { // A ended; proposal 3's fetch C is in flight
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d fetches in flight, want 1", fetching)
		}
	}
	if ts, ok := v.TryNextAfter(0, 1); !ok || ts != 12 {
		t.Fatalf("proposal 1 got %d, %v; want 12, the next of fetch B's window", ts, ok)
	}
	o.release(func(int) int { return 0 })
	waitWindow(3)
	if ts, ok := v.TryNextAfter(0, 3); !ok || ts != 21 {
		t.Fatalf("proposal 3 got %d, %v; want 21 from fetch C's window", ts, ok)
	}
}
