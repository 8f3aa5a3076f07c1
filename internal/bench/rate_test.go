package bench

import (
	"context"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// stallDriver is a memDriver whose at-th read takes stall.
type stallDriver struct {
	*memDriver
	reads atomic.Int64
	at    int64
	stall time.Duration
}

func (s *stallDriver) Read(ctx context.Context, key []byte) error {
	if s.reads.Add(1) == s.at {
		time.Sleep(s.stall)
	}
	return s.memDriver.Read(ctx, key)
}

// TestBenchRunnerRate checks a paced run: it starts no more operations
// than its schedule holds, and the operations a stalled server kept
// waiting count their latency from their scheduled start, not from when
// the client could send them (no coordinated omission).
func TestBenchRunnerRate(t *testing.T) {
	const rate = 200 // one operation every 5 ms
	d := &stallDriver{memDriver: newMemDriver(), at: 20, stall: 300 * time.Millisecond}
	res := loadAndRun(t, d, Options{Records: 100, Clients: 1, Duration: time.Second, Rate: rate, Seed: 3}, WorkloadC)
	if res.Workload != "c@200/s" || res.Params.Rate != rate {
		t.Errorf("workload %q, rate %v; want c@200/s, 200", res.Workload, res.Params.Rate)
	}
	// The schedule holds one start every 5 ms of the second.
	if res.Ops == 0 || res.Ops > rate+1 {
		t.Errorf("%d operations in a second at %d/s", res.Ops, rate)
	}
	// The stall held back the operations scheduled during its 300 ms:
	// about 60, waiting 150 ms on average. Counted from when they were
	// sent, their mean would be 300 ms spread over ~200 operations.
	all := res.Latency[AllOps]
	if all.MeanUs < 10_000 {
		t.Errorf("mean latency %.0f µs after a 300 ms stall at %d/s: the wait before a late start is not counted", all.MeanUs, rate)
	}
	if read := res.Latency["read"]; read.Count != all.Count || read.MeanUs < 10_000 {
		t.Errorf("reads: %d, mean %.0f µs; all: %d, mean %.0f µs", read.Count, read.MeanUs, all.Count, all.MeanUs)
	}
}

func TestBenchRunnerRateRefused(t *testing.T) {
	for _, rate := range []float64{-1, math.NaN(), math.Inf(1), 1e9} {
		_, err := NewRunner(newMemDriver(), Options{Rate: rate, Clients: 1})
		if err == nil || !strings.Contains(err.Error(), "rate") {
			t.Errorf("rate %v: %v, want an error naming the rate", rate, err)
		}
	}
	if _, err := NewTxnRunner(nil, Options{Rate: 100}); err == nil || !strings.Contains(err.Error(), "closed-loop") {
		t.Errorf("txn runner with a rate: %v, want a refusal", err)
	}
}

// TestBenchRunnerWindows checks that a stall shows in the window where
// the operations it held started, and that the windows count every
// measured operation.
func TestBenchRunnerWindows(t *testing.T) {
	const rate = 200 // one operation every 5 ms
	// The 100th read is scheduled at 495 ms: in the window of 400-500 ms.
	d := &stallDriver{memDriver: newMemDriver(), at: 100, stall: 200 * time.Millisecond}
	res := loadAndRun(t, d, Options{Records: 100, Clients: 1, Duration: time.Second, Rate: rate, Seed: 3, Window: 100 * time.Millisecond}, WorkloadC)
	if len(res.Windows) != 10 {
		t.Fatalf("%d windows of 100 ms in a second: %+v", len(res.Windows), res.Windows)
	}
	var ops int64
	slowest := 0
	for i, w := range res.Windows {
		ops += w.Ops
		if want := float64(i * 100); w.StartMs != want {
			t.Errorf("window %d starts at %v ms, want %v", i, w.StartMs, want)
		}
		if w.MaxMs > res.Windows[slowest].MaxMs {
			slowest = i
		}
	}
	if ops != res.Ops {
		t.Errorf("windows count %d operations, the run %d", ops, res.Ops)
	}
	if slowest != 4 || res.Windows[4].MaxMs < 200 {
		t.Errorf("slowest window %d (max %.1f ms), want window 4 (400-500 ms) at 200 ms or more: %+v", slowest, res.Windows[slowest].MaxMs, res.Windows)
	}
	var b strings.Builder
	if err := WriteSummary(&b, res); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "slowest windows of 100ms: 0.40s max") {
		t.Errorf("summary does not name the stalled window first:\n%s", b.String())
	}
	if _, err := NewRunner(newMemDriver(), Options{Clients: 1, Window: -time.Second}); err == nil || !strings.Contains(err.Error(), "window") {
		t.Errorf("negative window: %v, want an error naming the window", err)
	}
}
