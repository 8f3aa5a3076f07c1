package bench

import (
	"bytes"
	"errors"
	"image/png"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// sampleResults are results of three systems on two workloads, and an
// older run of one of them that the latest replaces.
func sampleResults() []Result {
	mk := func(system, version, workload string, opsPerSec, p99Us float64) Result {
		return Result{
			System: system, Version: version, Workload: workload,
			Time:    time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
			Params:  Params{Addr: "127.0.0.1:1", Records: 1000, ValueSize: 100, Clients: 64, DurationSeconds: 20, WarmupSeconds: 5, Distribution: DistZipfian, Seed: 9},
			Host:    Host{GOOS: "linux", GOARCH: "amd64", NumCPU: 2, GoVersion: "go1.26"},
			Seconds: 20, Ops: int64(opsPerSec * 20), OpsPerSec: opsPerSec,
			Latency: map[string]Latency{
				"read": {Count: int64(opsPerSec * 10), MeanUs: 900, P50Us: 800, P99Us: p99Us, P999Us: 2 * p99Us, MaxUs: 3 * p99Us},
				AllOps: {Count: int64(opsPerSec * 20), MeanUs: 1000, P50Us: 900, P99Us: p99Us, P999Us: 2 * p99Us, MaxUs: 3 * p99Us},
			},
		}
	}
	return []Result{
		mk("redis", "7.0.15", "a", 1000, 99999), // replaced below
		mk("groupkv", "abc", "a", 10000, 20000),
		mk("etcd", "3.4.23", "a", 4000, 40000),
		mk("redis", "7.0.15", "a", 25000, 6000),
		mk("groupkv", "abc", "c", 30000, 9000),
		mk("etcd", "3.4.23", "c", 5000, 30000),
		mk("redis", "7.0.15", "c", 50000, 4000),
	}
}

func TestBenchResultRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "results.json")
	want := sampleResults()
	want[1].ErrorSamples = []string{"unavailable: shard 3 has no leader yet"}
	want[1].Errors = 1
	want[1].Load = &LoadResult{Records: 1000, Seconds: 0.5, RecordsPer: 2000}
	for _, r := range want {
		if err := AppendResult(path, r); err != nil {
			t.Fatal(err)
		}
	}
	got, err := ReadResultsFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip changed the results:\ngot  %+v\nwant %+v", got, want)
	}

	// A JSON array reads the same.
	arr := `[{"system":"x","workload":"a","ops_per_sec":5,"latency":{"all":{"p99_us":7}}}]` + "\n"
	rs, err := ReadResults(strings.NewReader(arr))
	if err != nil || len(rs) != 1 || rs[0].OpsPerSec != 5 || rs[0].Latency[AllOps].P99Us != 7 {
		t.Fatalf("array: %+v, %v", rs, err)
	}
	if _, err := ReadResults(strings.NewReader("{\"system\": 3}")); err == nil {
		t.Fatal("a malformed record read without error")
	}

	// LatestResults keeps the last run of each pair, in display order.
	latest := LatestResults(got)
	var order []string
	for _, r := range latest {
		order = append(order, r.Workload+"/"+r.System)
	}
	if want := "a/groupkv a/etcd a/redis c/groupkv c/etcd c/redis"; strings.Join(order, " ") != want {
		t.Fatalf("latest order %v, want %s", order, want)
	}
	if latest[2].OpsPerSec != 25000 {
		t.Fatalf("the older redis run was kept: %+v", latest[2])
	}
}

func TestBenchReport(t *testing.T) {
	var b bytes.Buffer
	if err := WriteMarkdown(&b, sampleResults(), "groupkv"); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"| workload | system | version | ops/s | p50 ms | p99 ms | p99.9 ms | server CPU µs/op | client CPU µs/op | errors |\n|---|---|---|--:|--:|--:|--:|--:|--:|--:|\n",
		"| workload | system | op | count | ops/s | mean | p50 | p99 | p99.9 | max | errors |\n|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|\n",
		"| a | groupkv | abc | 10000 | 0.90 | 20.0 | 40.0 | – | – | 0 |",
		"| workload | ops/s groupkv/etcd | p99 groupkv/etcd | ops/s groupkv/redis | p99 groupkv/redis |",
		"| a | 2.50 | 0.50 | 0.40 | 3.33 |",
		"| c | 6.00 | 0.30 | 0.60 | 2.25 |",
		"| c | redis | read | 500000 | 25000 |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	if err := WriteMarkdown(&b, nil, "groupkv"); !errors.Is(err, ErrNoResults) {
		t.Errorf("empty report: %v", err)
	}
	b.Reset()
	if err := WriteSummary(&b, sampleResults()[1]); err != nil || !strings.Contains(b.String(), "read  100000") {
		t.Errorf("summary: %v\n%s", err, b.String())
	}
}

func TestBenchChartPNG(t *testing.T) {
	for _, size := range []ChartOptions{{}, {Width: 800, Height: 600}} {
		var b bytes.Buffer
		if err := WriteChartPNG(&b, sampleResults(), size); err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(&b)
		if err != nil {
			t.Fatalf("not a PNG: %v", err)
		}
		size.EnsureDefaults()
		if got := img.Bounds().Size(); got.X != size.Width || got.Y != size.Height {
			t.Fatalf("chart is %v, want %dx%d", got, size.Width, size.Height)
		}
		// Every system's color shows (its bars and legend swatch), and
		// there is text (dark pixels).
		seen := map[[3]uint32]int{}
		dark := 0
		for y := 0; y < size.Height; y++ {
			for x := 0; x < size.Width; x++ {
				r, g, bl, _ := img.At(x, y).RGBA()
				seen[[3]uint32{r >> 8, g >> 8, bl >> 8}]++
				if r>>8 < 0x50 && g>>8 < 0x50 && bl>>8 < 0x50 {
					dark++
				}
			}
		}
		for i := 0; i < 3; i++ {
			c := palette[i]
			if seen[[3]uint32{uint32(c.R), uint32(c.G), uint32(c.B)}] < 500 {
				t.Errorf("%dx%d: system %d's color barely shows", size.Width, size.Height, i)
			}
		}
		if dark < 1000 {
			t.Errorf("%dx%d: only %d dark pixels: no text?", size.Width, size.Height, dark)
		}
	}
	if _, err := Chart(nil, ChartOptions{}); !errors.Is(err, ErrNoResults) {
		t.Errorf("chart of nothing: %v", err)
	}
	if _, err := Chart(sampleResults(), ChartOptions{Width: 10, Height: 10}); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("a 10x10 chart: %v", err)
	}
}

func TestBenchNiceScale(t *testing.T) {
	for _, c := range []struct{ max, step, top float64 }{
		{25828, 10000, 30000},
		{9.3, 2, 12},
		{100, 20, 120},
		{0, 1, 5},
	} {
		step, top := niceScale(c.max, 5)
		if step != c.step || top != c.top {
			t.Errorf("niceScale(%v) = %v, %v; want %v, %v", c.max, step, top, c.step, c.top)
		}
	}
}

// roundResults are three rounds of groupkv, etcd and Redis on workloads a
// and b, with a rerun of one round that replaces it.
func roundResults() []Result {
	var rs []Result
	mk := func(system, workload string, round int, opsPerSec, p99Us float64) {
		r := sampleResults()[1]
		r.System, r.Workload, r.Params.Round = system, workload, round
		r.OpsPerSec, r.Latency = opsPerSec, map[string]Latency{AllOps: {Count: 1, P50Us: 900, P99Us: p99Us}, "read": {Count: 1, P99Us: p99Us}}
		rs = append(rs, r)
	}
	// Round 2 of groupkv on a: first a slow run, then its rerun.
	mk("groupkv", "a", 2, 1, 1e6)
	for round, g := range []float64{30000, 25000, 36000} {
		n := round + 1
		mk("groupkv", "a", n, g, 8000)
		mk("etcd", "a", n, 9000, 24000)
		mk("redis", "a", n, 30000, []float64{6000, 9000, 7000}[round])
		mk("groupkv", "b", n, 50000, 4000)
		mk("etcd", "b", n, 9000, 20000)
		mk("redis", "b", n, 40000, 6000)
	}
	return rs
}

func TestBenchReportRounds(t *testing.T) {
	var b bytes.Buffer
	if err := WriteMarkdown(&b, roundResults(), "groupkv"); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"| workload | system | version | round | ops/s | p50 ms | p99 ms | p99.9 ms | server CPU µs/op | client CPU µs/op | errors |\n|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|\n",
		"| workload | system | round | op | count | ops/s | mean | p50 | p99 | p99.9 | max | errors |\n|---|---|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|\n",
		"| a | groupkv | abc | 2 | 25000 |",
		// Medians of the rounds' ratios, then each round's.
		"| a | 3.33 (3.33, 2.78, 4.00) | 0.33 (0.33, 0.33, 0.33) | 1.00 (1.00, 0.83, 1.20) | 1.14 (1.33, 0.89, 1.14) |",
		"| put throughput ≥ 3× etcd's | a | 3.33 (3.33, 2.78, 4.00) | 2 of 3 | yes |",
		"| put throughput ≥ Redis's | a | 1.00 (1.00, 0.83, 1.20) | 2 of 3 | yes |",
		"| get throughput ≥ ½ Redis's | b | 1.25 (1.25, 1.25, 1.25) | 3 of 3 | yes |",
		// p99 against the better peer of each round (Redis's here).
		"| p99 ≤ the better peer's | a | 1.14 (1.33, 0.89, 1.14) | 1 of 3 | no |",
		"| p99 ≤ the better peer's | b | 0.67 (0.67, 0.67, 0.67) | 3 of 3 | yes |",
		"| a | groupkv | 2 | read |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "| a | groupkv | abc | 2 | 1 |") {
		t.Errorf("the replaced run of round 2 is in the report:\n%s", out)
	}
	// The chart draws each system's median round.
	med := MedianResults(roundResults())
	for _, r := range med {
		if r.System == "groupkv" && r.Workload == "a" && r.OpsPerSec != 30000 {
			t.Errorf("median round of groupkv on a: %v ops/s, want 30000", r.OpsPerSec)
		}
	}
	if len(med) != 6 {
		t.Errorf("MedianResults kept %d results, want 6", len(med))
	}
}

// TestMedianResultsPaced: the rounds of a paced workload all run at its
// rate, so the chart's round is the one of median p99, not a stalled one
// that happened to finish a hair faster.
func TestMedianResultsPaced(t *testing.T) {
	var rs []Result
	for round, c := range []struct{ rate, p99 float64 }{{29997, 7300}, {29998, 88300}, {29999, 5200}} {
		r := sampleResults()[1]
		r.System, r.Workload, r.Params.Round, r.Params.Rate = "groupkv", PacedWorkload("a", 30000), round+1, 30000
		r.OpsPerSec, r.Latency = c.rate, map[string]Latency{AllOps: {Count: 1, P99Us: c.p99}}
		rs = append(rs, r)
	}
	med := MedianResults(rs)
	if len(med) != 1 || med[0].Params.Round != 1 {
		t.Fatalf("median of the paced rounds: %+v, want round 1 (p99 7.3 ms)", med)
	}
}
