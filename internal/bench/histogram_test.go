package bench

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"
	"time"
)

// Test names start with TestBench so that `go test -run Bench` selects
// them all.

func TestBenchHistogramBuckets(t *testing.T) {
	// Every value lies in its bucket's range, and a bucket is at most
	// 1/subBuckets of its values wide.
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 100000; i++ {
		v := r.Uint64N(1 << uint(r.IntN(40)+1))
		b := bucketOf(v)
		lo, hi := bucketRange(b)
		if v < lo || v > hi {
			t.Fatalf("value %d in bucket %d of range [%d, %d]", v, b, lo, hi)
		}
		if lo >= subBuckets && float64(hi-lo+1)/float64(lo) > 1.0/subBuckets+1e-12 {
			t.Fatalf("bucket %d [%d, %d] is wider than 1/%d", b, lo, hi, subBuckets)
		}
	}
	// Buckets tile the range: each starts right after the previous.
	for b := 1; b < numBuckets; b++ {
		_, prevHi := bucketRange(b - 1)
		lo, _ := bucketRange(b)
		if lo != prevHi+1 {
			t.Fatalf("bucket %d starts at %d, bucket %d ends at %d", b, lo, b-1, prevHi)
		}
	}
	if got := bucketOf(math.MaxUint64); got != numBuckets-1 {
		t.Fatalf("the largest value went to bucket %d, want the last, %d", got, numBuckets-1)
	}
}

func TestBenchHistogramPercentiles(t *testing.T) {
	var h Histogram
	if h.Percentile(50) != 0 || h.Mean() != 0 || h.Max() != 0 {
		t.Fatal("an empty histogram answers non-zero")
	}
	// 1µs to 100ms, uniform: percentile q is q% of 100ms.
	const n = 100000
	for i := 1; i <= n; i++ {
		h.Record(time.Duration(i) * time.Microsecond)
	}
	if h.Count() != n || h.Min() != time.Microsecond || h.Max() != n*time.Microsecond {
		t.Fatalf("count %d min %v max %v", h.Count(), h.Min(), h.Max())
	}
	if want := time.Duration(n+1) * time.Microsecond / 2; h.Mean() != want {
		t.Fatalf("mean %v, want %v", h.Mean(), want)
	}
	for _, q := range []float64{1, 50, 90, 99, 99.9, 100} {
		want := q / 100 * n * float64(time.Microsecond)
		got := float64(h.Percentile(q))
		if math.Abs(got-want)/want > 0.01 {
			t.Errorf("p%v = %v, want %v within 1%%", q, time.Duration(got), time.Duration(want))
		}
	}
	if h.Percentile(100) != h.Max() || h.Percentile(0) != h.Min() {
		t.Errorf("p0 %v p100 %v, want min %v max %v", h.Percentile(0), h.Percentile(100), h.Min(), h.Max())
	}

	// Against exact percentiles of a skewed sample, merged from parts.
	r := rand.New(rand.NewPCG(3, 4))
	var parts [4]Histogram
	var all []float64
	for i := 0; i < 50000; i++ {
		v := time.Duration(math.Exp(r.NormFloat64()*1.5+13)) + 1 // log-normal around 0.4ms
		parts[i%4].Record(v)
		all = append(all, float64(v))
	}
	var m Histogram
	for i := range parts {
		m.Merge(&parts[i])
	}
	sort.Float64s(all)
	for _, q := range []float64{50, 99, 99.9} {
		exact := all[int(math.Ceil(q/100*float64(len(all))))-1]
		got := float64(m.Percentile(q))
		if math.Abs(got-exact)/exact > 0.01 {
			t.Errorf("merged p%v = %v, exact %v", q, time.Duration(got), time.Duration(exact))
		}
	}
	if m.Count() != uint64(len(all)) || float64(m.Min()) != all[0] || float64(m.Max()) != all[len(all)-1] {
		t.Errorf("merged count %d min %v max %v", m.Count(), m.Min(), m.Max())
	}
}
