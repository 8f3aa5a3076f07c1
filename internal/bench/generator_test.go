package bench

import (
	"math"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
)

func seeded(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0)) }

// drawN returns the frequency of each item in n draws of c.
func drawN(c Chooser, r *rand.Rand, n int) map[uint64]int {
	freq := map[uint64]int{}
	for i := 0; i < n; i++ {
		freq[c.Next(r)]++
	}
	return freq
}

func TestBenchFNVHash64(t *testing.T) {
	// YCSB's first key is "user6284781860667377211": fnvhash64(0).
	for v, want := range map[uint64]uint64{0: 6284781860667377211, 1: 8517097267634966620, 2: 1820151046732198393, 12345: 1792800413050876852} {
		if got := FNVHash64(v); got != want {
			t.Errorf("FNVHash64(%d) = %d, want %d", v, got, want)
		}
	}
	if got := string(KeyName(0)); got != "user6284781860667377211" {
		t.Errorf("KeyName(0) = %q", got)
	}
}

func TestBenchChoosersDeterministic(t *testing.T) {
	c := NewCounter(1000)
	for name, mk := range map[string]func() Chooser{
		"uniform":   func() Chooser { return Uniform{N: 1000} },
		"zipfian":   func() Chooser { return NewScrambledZipfian(1000) },
		"latest":    func() Chooser { return NewLatest(c) },
		"unscrambl": func() Chooser { return NewZipfian(1000, ZipfianConstant) },
	} {
		a, b := mk(), mk()
		ra, rb := seeded(42), seeded(42)
		for i := 0; i < 1000; i++ {
			x, y := a.Next(ra), b.Next(rb)
			if x != y {
				t.Fatalf("%s: draw %d differs with the same seed: %d, %d", name, i, x, y)
			}
			if x >= 1000 {
				t.Fatalf("%s: draw %d out of range", name, x)
			}
		}
		other, ro := mk(), seeded(43)
		same := 0
		r := seeded(42)
		for i := 0; i < 1000; i++ {
			if a.Next(r) == other.Next(ro) {
				same++
			}
		}
		if name == "uniform" && same > 50 {
			t.Errorf("%s: seeds 42 and 43 agree on %d of 1000 draws", name, same)
		}
	}
}

func TestBenchUniform(t *testing.T) {
	const n, draws = 10, 200000
	freq := drawN(Uniform{N: n}, seeded(1), draws)
	for i := uint64(0); i < n; i++ {
		if f := float64(freq[i]) / draws; math.Abs(f-0.1) > 0.01 {
			t.Errorf("item %d drawn %.3f of the time, want 0.1", i, f)
		}
	}
}

func TestBenchZipfian(t *testing.T) {
	const n, draws = 1000, 400000
	z := NewZipfian(n, ZipfianConstant)
	freq := drawN(z, seeded(2), draws)
	zn := zeta(0, n, ZipfianConstant, 0)
	// Items 0 and 1 are drawn with probability 1/zeta and 1/(2^theta zeta).
	for i, want := range []float64{1 / zn, 1 / (math.Pow(2, ZipfianConstant) * zn)} {
		got := float64(freq[uint64(i)]) / draws
		if math.Abs(got-want)/want > 0.05 {
			t.Errorf("item %d drawn %.4f of the time, want %.4f", i, got, want)
		}
	}
	// Popularity falls with the item number.
	if !(freq[0] > freq[10] && freq[10] > freq[500]) {
		t.Errorf("frequencies of items 0, 10, 500: %d, %d, %d", freq[0], freq[10], freq[500])
	}
}

func TestBenchScrambledZipfian(t *testing.T) {
	const n, draws = 10000, 400000
	freq := drawN(NewScrambledZipfian(n), seeded(3), draws)
	counts := make([]int, 0, len(freq))
	for _, c := range freq {
		counts = append(counts, c)
	}
	sort.Sort(sort.Reverse(sort.IntSlice(counts)))
	// The most popular item takes 1/zeta(10^10, 0.99) of the draws.
	if got, want := float64(counts[0])/draws, 1/scrambledZetan; math.Abs(got-want)/want > 0.1 {
		t.Errorf("the most popular item is drawn %.4f of the time, want about %.4f", got, want)
	}
	// Skewed: the top 1% of items take far more than 1% of the draws.
	top := 0
	for _, c := range counts[:n/100] {
		top += c
	}
	if f := float64(top) / draws; f < 0.2 {
		t.Errorf("the top 1%% of items take %.3f of the draws: not skewed", f)
	}
	// Scattered: the most popular items are not the first ones.
	if freq[0] == counts[0] && freq[1] == counts[1] {
		t.Error("items 0 and 1 are the most popular: the draws are not scrambled")
	}
	if FNVHash64(0)%n != hottest(freq) {
		t.Errorf("the hottest item is %d, want FNVHash64(0)%%n = %d", hottest(freq), FNVHash64(0)%n)
	}
}

func hottest(freq map[uint64]int) uint64 {
	var best uint64
	for k, c := range freq {
		if c > freq[best] || (c == freq[best] && k < best) {
			best = k
		}
	}
	return best
}

func TestBenchLatest(t *testing.T) {
	c := NewCounter(1000)
	l := NewLatest(c)
	r := seeded(4)
	freq := drawN(l, r, 100000)
	if h := hottest(freq); h != c.Last() {
		t.Errorf("the hottest item is %d, want the newest, %d", h, c.Last())
	}
	if freq[c.Last()] <= freq[c.Last()-100] {
		t.Errorf("newest drawn %d times, 100 older %d times", freq[c.Last()], freq[c.Last()-100])
	}
	// Inserts move the popularity to the new items, once acknowledged.
	k := c.Next()
	if got := drawN(l, r, 1000); got[k] != 0 {
		t.Fatalf("item %d drawn before its insert was acknowledged", k)
	}
	c.Acknowledge(k)
	freq = drawN(l.Clone(), r, 100000)
	if h := hottest(freq); h != k {
		t.Errorf("the hottest item is %d, want the new one, %d", h, k)
	}
	for v := range freq {
		if v > k {
			t.Fatalf("drew %d, above the newest item %d", v, k)
		}
	}
}

func TestBenchCounter(t *testing.T) {
	c := NewCounter(10)
	if c.Last() != 9 || c.Count() != 10 {
		t.Fatalf("Last %d Count %d, want 9 and 10", c.Last(), c.Count())
	}
	a, b, d := c.Next(), c.Next(), c.Next()
	if a != 10 || b != 11 || d != 12 {
		t.Fatalf("Next gave %d %d %d", a, b, d)
	}
	c.Acknowledge(d)
	c.Acknowledge(b)
	if c.Last() != 9 {
		t.Fatalf("Last %d while item 10 is in flight", c.Last())
	}
	c.Acknowledge(a)
	if c.Last() != 12 {
		t.Fatalf("Last %d after 10, 11, 12 are acknowledged", c.Last())
	}

	// Concurrent inserts all end up acknowledged.
	c = NewCounter(0)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				c.Acknowledge(c.Next())
			}
		})
	}
	wg.Wait()
	if c.Count() != 8000 {
		t.Fatalf("Count %d after 8000 acknowledged inserts", c.Count())
	}
}
