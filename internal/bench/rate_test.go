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
	ctx := context.Background()
	const rate = 200 // one operation every 5 ms
	d := &stallDriver{memDriver: newMemDriver(), at: 20, stall: 300 * time.Millisecond}
	r, err := NewRunner(d, Options{Records: 100, Clients: 1, Duration: time.Second, Rate: rate, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Load(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := r.Run(ctx, WorkloadC)
	if err != nil {
		t.Fatal(err)
	}
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
