package bench

import (
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
)

// Key choosers reproduce the generators of YCSB's core package
// (site.ycsb.generator): the same formulas and constants, so that a
// workload here stresses a store the way the YCSB workload of the same name
// does. They draw from the caller's *rand.Rand and are not safe for
// concurrent use, except Counter, which clients share.

// Chooser picks item numbers (YCSB's "keynum").
type Chooser interface {
	// Next returns the next item number.
	Next(r *rand.Rand) uint64
}

// ZipfianConstant is YCSB's default skew (zipfian_constant): a few items
// are very popular, most are rarely touched.
const ZipfianConstant = 0.99

// Uniform chooses an item of [0, N) with equal probability.
type Uniform struct{ N uint64 }

var _ Chooser = Uniform{}

// Next implements Chooser.
func (u Uniform) Next(r *rand.Rand) uint64 { return r.Uint64N(u.N) }

// Zipfian is YCSB's ZipfianGenerator: item i of [0, items) is chosen with
// probability proportional to 1/(i+1)^theta, by the method of Gray et al.,
// "Quickly Generating Billion-Record Synthetic Databases" (SIGMOD 1994). Item
// 0 is the most popular.
//
// Like YCSB's, it can be asked for a larger item count than it was built for
// (NextN), and then extends its zeta sum incrementally; it never shrinks it.
type Zipfian struct {
	items      uint64 // the count it was built for; eta keeps using it, as in YCSB
	theta      float64
	alpha      float64
	zeta2theta float64
	// zetan is zeta(countForZeta, theta).
	zetan        float64
	countForZeta uint64
	eta          float64
}

// NewZipfian returns a Zipfian over [0, items) with skew theta. It sums
// items terms: O(items) time.
func NewZipfian(items uint64, theta float64) *Zipfian {
	return newZipfianZeta(items, theta, zeta(0, items, theta, 0))
}

// newZipfianZeta is NewZipfian with zeta(items, theta) already known.
func newZipfianZeta(items uint64, theta, zetan float64) *Zipfian {
	z := &Zipfian{
		items:        items,
		theta:        theta,
		alpha:        1 / (1 - theta),
		zeta2theta:   zeta(0, 2, theta, 0),
		zetan:        zetan,
		countForZeta: items,
	}
	z.eta = (1 - math.Pow(2/float64(items), 1-theta)) / (1 - z.zeta2theta/zetan)
	return z
}

// zeta returns initial + the sum of 1/(i+1)^theta for i in [from, to).
func zeta(from, to uint64, theta, initial float64) float64 {
	sum := initial
	for i := from; i < to; i++ {
		sum += 1 / math.Pow(float64(i+1), theta)
	}
	return sum
}

// Clone returns an independent copy, for another client.
func (z *Zipfian) Clone() *Zipfian {
	c := *z
	return &c
}

// Next implements Chooser over the item count z was built for.
func (z *Zipfian) Next(r *rand.Rand) uint64 { return z.NextN(r, z.items) }

// NextN returns an item of [0, n).
func (z *Zipfian) NextN(r *rand.Rand, n uint64) uint64 {
	if n > z.countForZeta {
		z.zetan = zeta(z.countForZeta, n, z.theta, z.zetan)
		z.countForZeta = n
		z.eta = (1 - math.Pow(2/float64(z.items), 1-z.theta)) / (1 - z.zeta2theta/z.zetan)
	}
	u := r.Float64()
	uz := u * z.zetan
	if uz < 1 {
		return 0
	}
	if uz < 1+math.Pow(0.5, z.theta) {
		return 1
	}
	return uint64(float64(n) * math.Pow(z.eta*u-z.eta+1, z.alpha))
}

// Constants of YCSB's ScrambledZipfianGenerator: it draws from a zipfian
// over a huge fixed item count, whose zeta is precomputed, and hashes the
// draw into the real range. Popular items are thus spread over the key
// space instead of clustered at its start.
const (
	scrambledItemCount = 10_000_000_000
	scrambledZetan     = 26.46902820178302 // zeta(scrambledItemCount, 0.99)
)

// ScrambledZipfian is YCSB's ScrambledZipfianGenerator with the default
// constant 0.99: zipfian popularity, scattered over [0, N) by FNV-1a.
type ScrambledZipfian struct {
	N    uint64
	zipf *Zipfian
}

var _ Chooser = (*ScrambledZipfian)(nil)

// NewScrambledZipfian returns a ScrambledZipfian over [0, n); it is cheap.
func NewScrambledZipfian(n uint64) *ScrambledZipfian {
	// YCSB builds its ZipfianGenerator(0, ITEM_COUNT) over max-min+1 items.
	return &ScrambledZipfian{N: n, zipf: newZipfianZeta(scrambledItemCount+1, ZipfianConstant, scrambledZetan)}
}

// Next implements Chooser.
func (s *ScrambledZipfian) Next(r *rand.Rand) uint64 {
	return FNVHash64(s.zipf.Next(r)) % s.N
}

// Latest is YCSB's SkewedLatestGenerator: the most recently inserted items
// are the most popular (zipfian over the distance from the newest).
type Latest struct {
	counter *Counter
	zipf    *Zipfian
}

var _ Chooser = (*Latest)(nil)

// NewLatest returns a Latest over the items counter has acknowledged;
// counter must have acknowledged at least one. It sums as many terms as
// that: O(items) time; use Clone for further clients.
func NewLatest(counter *Counter) *Latest {
	return &Latest{counter: counter, zipf: NewZipfian(counter.Last(), ZipfianConstant)}
}

// Clone returns an independent chooser on the same counter.
func (l *Latest) Clone() *Latest { return &Latest{counter: l.counter, zipf: l.zipf.Clone()} }

// Next implements Chooser. As in YCSB it answers max - zipf(max), where
// max is the newest acknowledged item: never item 0 (harmless).
func (l *Latest) Next(r *rand.Rand) uint64 {
	m := l.counter.Last()
	if m == 0 {
		return 0
	}
	z := l.zipf.NextN(r, m)
	if z > m {
		return 0
	}
	return m - z
}

// Counter hands out the item numbers of inserts and tracks which have been
// acknowledged (YCSB's AcknowledgedCounterGenerator): readers only choose
// items below the first one still in flight, so they never ask for a record
// that is being written. It is safe for concurrent use.
type Counter struct {
	next atomic.Uint64
	// limit is the number of items known done: every item below it has been
	// acknowledged. Invariant: limit <= next.
	limit atomic.Uint64
	mu    struct {
		sync.Mutex
		// done holds the acknowledged items at or above limit.
		done map[uint64]struct{}
	}
}

// NewCounter returns a Counter whose items [0, start) exist already.
func NewCounter(start uint64) *Counter {
	c := &Counter{}
	c.next.Store(start)
	c.limit.Store(start)
	c.mu.done = map[uint64]struct{}{}
	return c
}

// Next reserves the next item number for an insert; the caller must
// Acknowledge it once the insert is over, failed or not.
func (c *Counter) Next() uint64 { return c.next.Add(1) - 1 }

// Acknowledge marks item v as written.
func (c *Counter) Acknowledge(v uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mu.done[v] = struct{}{}
	l := c.limit.Load()
	for {
		if _, ok := c.mu.done[l]; !ok {
			break
		}
		delete(c.mu.done, l)
		l++
	}
	c.limit.Store(l)
}

// Last is the highest item number below which every item is acknowledged
// (YCSB's lastValue); 0 when there is none, or only item 0.
func (c *Counter) Last() uint64 {
	l := c.limit.Load()
	if l == 0 {
		return 0
	}
	return l - 1
}

// Count is the number of items below which every item is acknowledged.
func (c *Counter) Count() uint64 { return c.limit.Load() }

// FNVHash64 is YCSB's Utils.fnvhash64: 64-bit FNV-1a over the eight bytes
// of v, least significant first, made non-negative as Java's Math.abs does
// (Math.abs(Long.MIN_VALUE) stays negative there; here it maps to 0).
func FNVHash64(v uint64) uint64 {
	const (
		offsetBasis = 0xCBF29CE484222325
		prime       = 1099511628211
	)
	h := uint64(offsetBasis)
	for i := 0; i < 8; i++ {
		h ^= v & 0xff
		v >>= 8
		h *= prime
	}
	if int64(h) < 0 {
		h = uint64(-int64(h))
		if int64(h) < 0 { // Long.MIN_VALUE
			return 0
		}
	}
	return h
}
