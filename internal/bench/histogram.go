package bench

import (
	"math"
	"math/bits"
	"time"
)

// Histogram counts durations in log-linear buckets, like HdrHistogram with
// two significant digits: every power of two is split into subBuckets equal
// buckets, so a recorded value is known to within 1/subBuckets (0.8%) of
// itself. Values below subBuckets nanoseconds are exact.
//
// The zero value is empty and ready to use. A Histogram is not safe for
// concurrent use; the runner gives each client its own and merges them.
type Histogram struct {
	// counts[i] is the number of values in bucket i (see bucketOf).
	counts     [numBuckets]uint64
	total      uint64
	sum        float64 // nanoseconds, for the mean
	min, max   uint64  // nanoseconds; meaningful when total > 0
	overflowed uint64  // values above maxTrackable, counted in the last bucket
}

const (
	subBits    = 7
	subBuckets = 1 << subBits // 128: 0.8% relative precision
	// maxShift bounds the tracked range to values below 2^(maxShift+subBits+1)
	// ns (about 18 minutes), far above any request latency; larger values are
	// clamped into the last bucket.
	maxShift     = 32
	numBuckets   = subBuckets + (maxShift+1)*subBuckets
	maxTrackable = uint64(1)<<(maxShift+subBits+1) - 1
)

// bucketOf returns the bucket of v (nanoseconds).
func bucketOf(v uint64) int {
	if v > maxTrackable {
		v = maxTrackable
	}
	if v < subBuckets {
		return int(v)
	}
	shift := bits.Len64(v) - subBits - 1 // >= 0: the top subBits+1 bits are kept
	m := v >> uint(shift)                // in [subBuckets, 2*subBuckets)
	return subBuckets + shift*subBuckets + int(m-subBuckets)
}

// bucketRange returns the smallest and largest value of bucket i.
func bucketRange(i int) (lo, hi uint64) {
	if i < subBuckets {
		return uint64(i), uint64(i)
	}
	shift := (i - subBuckets) / subBuckets
	m := uint64(subBuckets + (i-subBuckets)%subBuckets)
	return m << uint(shift), (m+1)<<uint(shift) - 1
}

// Record adds one duration; negative durations count as zero.
func (h *Histogram) Record(d time.Duration) {
	v := uint64(0)
	if d > 0 {
		v = uint64(d)
	}
	if v > maxTrackable {
		h.overflowed++
	}
	h.counts[bucketOf(v)]++
	if h.total == 0 || v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
	h.total++
	h.sum += float64(v)
}

// Merge adds the values of o to h.
func (h *Histogram) Merge(o *Histogram) {
	if o.total == 0 {
		return
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.total == 0 || o.min < h.min {
		h.min = o.min
	}
	if o.max > h.max {
		h.max = o.max
	}
	h.total += o.total
	h.sum += o.sum
	h.overflowed += o.overflowed
}

// Count is the number of recorded values.
func (h *Histogram) Count() uint64 { return h.total }

// Min and Max are the extreme recorded values, exactly; 0 when empty.
func (h *Histogram) Min() time.Duration { return time.Duration(h.min) }
func (h *Histogram) Max() time.Duration { return time.Duration(h.max) }

// Mean is the exact mean of the recorded values; 0 when empty.
func (h *Histogram) Mean() time.Duration {
	if h.total == 0 {
		return 0
	}
	return time.Duration(h.sum / float64(h.total))
}

// Percentile returns the value below or at which q percent of the recorded
// values lie (q in [0, 100]), to within the bucket precision: the middle of
// the bucket holding that rank, kept within [Min, Max]; p0 and p100 are Min
// and Max exactly. It is 0 when empty.
func (h *Histogram) Percentile(q float64) time.Duration {
	if h.total == 0 {
		return 0
	}
	if q <= 0 {
		return time.Duration(h.min)
	}
	if q >= 100 {
		return time.Duration(h.max)
	}
	rank := uint64(math.Ceil(q / 100 * float64(h.total)))
	if rank == 0 {
		rank = 1
	}
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			lo, hi := bucketRange(i)
			v := lo + (hi-lo)/2
			v = max(v, h.min)
			v = min(v, h.max)
			return time.Duration(v)
		}
	}
	return time.Duration(h.max)
}
