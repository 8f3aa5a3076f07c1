package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestBenchWorkloadMixes(t *testing.T) {
	for _, w := range Workloads {
		if err := w.Validate(); err != nil {
			t.Fatal(err)
		}
		got, err := LookupWorkload("Workload" + w.Name)
		if err != nil || got.Name != w.Name {
			t.Fatalf("LookupWorkload(%q) = %v, %v", w.Name, got.Name, err)
		}
		const n = 200000
		var counts [numOpTypes]int
		r := seeded(5)
		for i := 0; i < n; i++ {
			counts[w.ChooseOp(r)]++
		}
		for op, p := range w.Proportions {
			if got := float64(counts[op]) / n; math.Abs(got-p) > 0.005 {
				t.Errorf("workload %s: %v is %.3f of the ops, want %.2f", w.Name, OpType(op), got, p)
			}
		}
		if w.Proportions[OpScan] > 0 {
			lo, hi := w.MaxScanLength, 0
			for i := 0; i < 10000; i++ {
				l := w.ScanLength(r)
				lo, hi = min(lo, l), max(hi, l)
			}
			if lo != 1 || hi != w.MaxScanLength {
				t.Errorf("workload %s: scan lengths span [%d, %d], want [1, %d]", w.Name, lo, hi, w.MaxScanLength)
			}
		}
	}
	if _, err := LookupWorkload("g"); !errors.Is(err, ErrUnknownWorkload) {
		t.Errorf("LookupWorkload(g) = %v", err)
	}
	bad := Workload{Name: "x", Proportions: props(OpRead, 0.5), Distribution: "pareto"}
	if err := bad.Validate(); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("Validate of a bad workload = %v", err)
	}
}

// memDriver is an in-memory Driver: a sorted map, with an optional
// failure of every failEvery-th update.
type memDriver struct {
	mu        sync.Mutex
	recs      map[string][]byte
	failEvery int64
	updates   atomic.Int64
	calls     [numOpTypes]atomic.Int64
}

var _ Driver = (*memDriver)(nil)

var errInjected = errors.New("injected failure")

func newMemDriver() *memDriver { return &memDriver{recs: map[string][]byte{}} }

func (m *memDriver) System() string                          { return "mem" }
func (m *memDriver) Version(context.Context) (string, error) { return "1", nil }
func (m *memDriver) Close() error                            { return nil }

func (m *memDriver) Reset(context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.recs = map[string][]byte{}
	return nil
}

func (m *memDriver) Check(context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.recs) == 0 {
		return ErrNotLoaded
	}
	return nil
}

func (m *memDriver) Load(ctx context.Context, keys, values [][]byte) error {
	for i := range keys {
		m.put(keys[i], values[i])
	}
	return nil
}

func (m *memDriver) put(k, v []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.recs[string(k)] = bytes.Clone(v)
}

func (m *memDriver) Read(ctx context.Context, key []byte) error {
	m.calls[OpRead].Add(1)
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.recs[string(key)]; !ok {
		return fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	return nil
}

func (m *memDriver) Update(ctx context.Context, key, value []byte) error {
	m.calls[OpUpdate].Add(1)
	if n := m.updates.Add(1); m.failEvery > 0 && n%m.failEvery == 0 {
		return errInjected
	}
	m.put(key, value)
	return nil
}

func (m *memDriver) Insert(ctx context.Context, key, value []byte) error {
	m.calls[OpInsert].Add(1)
	m.put(key, value)
	return nil
}

func (m *memDriver) Scan(ctx context.Context, key []byte, n int) (int, error) {
	m.calls[OpScan].Add(1)
	m.mu.Lock()
	defer m.mu.Unlock()
	var keys []string
	for k := range m.recs {
		if k >= string(key) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return min(n, len(keys)), nil
}

func TestBenchRunnerMemory(t *testing.T) {
	ctx := context.Background()
	m := newMemDriver()
	var statuses []Status
	var smu sync.Mutex
	r, err := NewRunner(m, Options{
		Records: 1000, Clients: 4, Duration: 200 * time.Millisecond, Warmup: 50 * time.Millisecond, Seed: 7,
		Progress:         func(s Status) { smu.Lock(); statuses = append(statuses, s); smu.Unlock() },
		ProgressInterval: 20 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Run(ctx, WorkloadA); !errors.Is(err, ErrNotLoaded) {
		t.Fatalf("Run before a load: %v, want ErrNotLoaded", err)
	}
	lr, err := r.Load(ctx)
	if err != nil || lr.Records != 1000 || len(m.recs) != 1000 {
		t.Fatalf("Load: %+v, %v; %d records stored", lr, err, len(m.recs))
	}
	for _, w := range Workloads {
		res, err := r.Run(ctx, w)
		if err != nil {
			t.Fatalf("workload %s: %v", w.Name, err)
		}
		all := res.Latency[AllOps]
		if res.Ops == 0 || res.Errors != 0 || all.Count != res.Ops || res.OpsPerSec <= 0 {
			t.Fatalf("workload %s: ops %d errors %d all %+v ops/s %v", w.Name, res.Ops, res.Errors, all, res.OpsPerSec)
		}
		if res.Seconds < 0.2 || res.Seconds > 1 {
			t.Errorf("workload %s: measured %.3fs of a 0.2s run", w.Name, res.Seconds)
		}
		// The top-level counts add up, and follow the mix.
		var sum int64
		for op, p := range w.Proportions {
			nested := OpType(op) == OpRead || OpType(op) == OpUpdate // parts of an rmw
			if l := res.Latency[OpType(op).String()]; p == 0 && !nested && l.Count != 0 {
				t.Errorf("workload %s ran %d %v", w.Name, l.Count, OpType(op))
			}
		}
		for _, name := range []string{"read", "update", "insert", "scan"} {
			sum += res.Latency[name].Count
		}
		rmw := res.Latency["rmw"].Count
		if want := res.Ops + rmw; sum != want { // an rmw is a read and an update too
			t.Errorf("workload %s: ops by type sum to %d, want %d", w.Name, sum, want)
		}
		if w.Name == "f" && (rmw == 0 || res.Latency["update"].Count != rmw) {
			t.Errorf("workload f: %d rmw, %d updates", rmw, res.Latency["update"].Count)
		}
		if res.Params.Distribution != w.Distribution || res.Params.Seed != 7 || res.System != "mem" {
			t.Errorf("workload %s: params %+v system %s", w.Name, res.Params, res.System)
		}
	}
	// Inserts of D and E went to new keys: the store grew by their count.
	if got := len(m.recs); got != int(r.inserts.Count()) || got <= 1000 {
		t.Errorf("%d records stored, the counter says %d", got, r.inserts.Count())
	}
	smu.Lock()
	defer smu.Unlock()
	phases := map[string]bool{}
	for _, s := range statuses {
		phases[s.Phase] = true
	}
	if !phases["load"] || !phases["warmup"] || !phases["run"] || !statuses[len(statuses)-1].Done {
		t.Errorf("progress saw phases %v, last %+v", phases, statuses[len(statuses)-1])
	}
}

func TestBenchRunnerErrors(t *testing.T) {
	m := newMemDriver()
	m.failEvery = 3
	res := loadAndRun(t, m, Options{Records: 500, Clients: 2, Duration: 100 * time.Millisecond, Seed: 1}, WorkloadA)
	u := res.Latency["update"]
	if u.Errors == 0 || res.Errors != u.Errors || len(res.ErrorSamples) != 1 || res.ErrorSamples[0] != errInjected.Error() {
		t.Fatalf("update %+v, errors %d, samples %q", u, res.Errors, res.ErrorSamples)
	}
	if frac := float64(u.Errors) / float64(u.Errors+u.Count); math.Abs(frac-1.0/3) > 0.05 {
		t.Errorf("%.2f of updates failed, want 1/3", frac)
	}
	if res.Latency[AllOps].Count != res.Ops || res.Latency["read"].Errors != 0 {
		t.Errorf("all %+v read %+v", res.Latency[AllOps], res.Latency["read"])
	}

	if _, err := NewRunner(m, Options{Records: -1, Clients: -2, Duration: -time.Second, Distribution: "normal"}); !errors.Is(err, ErrInvalidOptions) {
		t.Fatalf("NewRunner with bad options: %v", err)
	} else {
		for _, want := range []string{"records -1", "clients -2", "duration -1s", `distribution "normal"`} {
			if !bytes.Contains([]byte(err.Error()), []byte(want)) {
				t.Errorf("error %q does not mention %s", err, want)
			}
		}
	}
}

// loadAndRun loads d with a runner of opts and runs w once, failing t on
// an error.
func loadAndRun(t *testing.T, d Driver, opts Options, w Workload) Result {
	t.Helper()
	ctx := context.Background()
	r, err := NewRunner(d, opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Load(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := r.Run(ctx, w)
	if err != nil {
		t.Fatal(err)
	}
	return res
}
