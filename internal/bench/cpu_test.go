package bench

import (
	"context"
	"math"
	"runtime/metrics"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// meteredDriver is a memDriver whose "server" spends a millisecond of CPU
// per update and nothing else.
type meteredDriver struct {
	*memDriver
	reads atomic.Int64 // ServerCPU calls
}

var _ CPUMeter = (*meteredDriver)(nil)

func (m *meteredDriver) ServerCPU(context.Context) (time.Duration, error) {
	m.reads.Add(1)
	return time.Duration(m.calls[OpUpdate].Load()) * time.Millisecond, nil
}

// TestBenchRunnerServerCPU checks that a run reads the server's CPU time
// over its measured time only: not the load's updates, not the warm-up's.
func TestBenchRunnerServerCPU(t *testing.T) {
	m := &meteredDriver{memDriver: newMemDriver()}
	res := loadAndRun(t, m, Options{Records: 1000, Clients: 4, Duration: 300 * time.Millisecond, Warmup: 100 * time.Millisecond, Seed: 3}, WorkloadA)
	if m.reads.Load() != 2 {
		t.Fatalf("the server's CPU time was read %d times, want 2 (start and end of the measured time)", m.reads.Load())
	}
	updates := res.Latency[OpUpdate.String()].Count
	want := float64(updates) * 1e-3
	// The meter is read around the measured time, the operations counted
	// by their start: they agree but for the operations at its two ends.
	if res.ServerCPUSeconds < 0.8*want || res.ServerCPUSeconds > 1.2*want {
		t.Fatalf("server CPU %.3fs over %d measured updates: want about %.3fs", res.ServerCPUSeconds, updates, want)
	}
	if per := res.ServerCPUPerOp(); per < 300 || per > 700 {
		t.Errorf("server CPU per operation %.0fµs; half the operations cost 1000µs", per)
	}
	if res.ClientCPUSeconds <= 0 {
		t.Errorf("client CPU %vs: not measured", res.ClientCPUSeconds)
	}
	var b strings.Builder
	if err := WriteSummary(&b, res); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "CPU over the measured time: server ") {
		t.Errorf("the summary does not give the CPU figures:\n%s", b.String())
	}
}

func TestBenchParseCPU(t *testing.T) {
	got, err := parseCPUMetric(strings.NewReader("# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 12.5\nprocess_max_fds 1024\n"))
	if err != nil || got != 12.5 {
		t.Fatalf("parseCPUMetric: %v, %v", got, err)
	}
	if _, err := parseCPUMetric(strings.NewReader("go_goroutines 7\n")); err == nil {
		t.Fatal("parseCPUMetric found a CPU time in metrics without one")
	}
	d, err := parseRedisCPU("# CPU\r\nused_cpu_sys:1.250000\r\nused_cpu_user:2.500000\r\nused_cpu_sys_children:9.000000\r\n")
	if err != nil || d != 3750*time.Millisecond {
		t.Fatalf("parseRedisCPU: %v, %v", d, err)
	}
	if _, err := parseRedisCPU("# CPU\r\nused_cpu_sys:1.0\r\n"); err == nil {
		t.Fatal("parseRedisCPU answered without used_cpu_user")
	}
}

func TestHistogramQuantile(t *testing.T) {
	buckets := []float64{0, 1e-6, 1e-3, 1e-2, math.Inf(1)}
	h0 := &metrics.Float64Histogram{Buckets: buckets, Counts: []uint64{5, 5, 5, 5}}
	// In between: 90 waits under 1 µs, 9 under 1 ms, 1 under 10 ms, 0 longer.
	h1 := &metrics.Float64Histogram{Buckets: buckets, Counts: []uint64{95, 14, 6, 5}}
	for _, c := range []struct{ q, want float64 }{{0.5, 1e-6}, {0.9, 1e-6}, {0.95, 1e-3}, {0.99, 1e-3}, {1, 1e-2}} {
		if got := histogramQuantile(h0, h1, c.q); got != c.want {
			t.Errorf("quantile %v: %v, want %v", c.q, got, c.want)
		}
	}
	// Only the open-ended bucket grew: its lower bound.
	h2 := &metrics.Float64Histogram{Buckets: buckets, Counts: []uint64{5, 5, 5, 7}}
	if got := histogramQuantile(h0, h2, 0.99); got != 1e-2 {
		t.Errorf("quantile in the open bucket: %v, want 0.01", got)
	}
	if got := histogramQuantile(h0, h0, 0.99); got != 0 {
		t.Errorf("nothing counted: %v, want 0", got)
	}
	if got := histogramQuantile(nil, h1, 0.99); got != 0 {
		t.Errorf("no first reading: %v, want 0", got)
	}
}
