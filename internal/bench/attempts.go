package bench

import (
	"math"
	"sort"
)

// AttemptHistogram counts how many attempts each committed transaction
// took, exactly: attempt counts are small integers, so it keeps one counter
// per count seen.
//
// The zero value is empty and ready to use. It is not safe for concurrent
// use; the runner gives each client its own and merges them.
type AttemptHistogram struct {
	// small[i] counts transactions of i+1 attempts, for i < len(small).
	small [64]uint64
	// large counts transactions of more than len(small) attempts, by count.
	large map[int]uint64
	total uint64
	sum   uint64
	max   int
}

// Record adds one transaction that took n attempts; n < 1 counts as 1.
func (h *AttemptHistogram) Record(n int) {
	n = max(n, 1)
	if n <= len(h.small) {
		h.small[n-1]++
	} else {
		if h.large == nil {
			h.large = map[int]uint64{}
		}
		h.large[n]++
	}
	h.total++
	h.sum += uint64(n)
	h.max = max(h.max, n)
}

// Merge adds the counts of o to h.
func (h *AttemptHistogram) Merge(o *AttemptHistogram) {
	for i, c := range o.small {
		h.small[i] += c
	}
	for n, c := range o.large {
		if h.large == nil {
			h.large = map[int]uint64{}
		}
		h.large[n] += c
	}
	h.total += o.total
	h.sum += o.sum
	h.max = max(h.max, o.max)
}

// Count is the number of recorded transactions.
func (h *AttemptHistogram) Count() uint64 { return h.total }

// Max is the largest attempt count recorded; 0 when empty.
func (h *AttemptHistogram) Max() int { return h.max }

// Mean is the mean attempt count; 0 when empty.
func (h *AttemptHistogram) Mean() float64 {
	if h.total == 0 {
		return 0
	}
	return float64(h.sum) / float64(h.total)
}

// Buckets lists the attempt counts recorded and how many transactions took
// each, by increasing attempt count.
func (h *AttemptHistogram) Buckets() []AttemptBucket {
	var out []AttemptBucket
	for i, c := range h.small {
		if c > 0 {
			out = append(out, AttemptBucket{Attempts: i + 1, Count: c})
		}
	}
	var large []AttemptBucket
	for n, c := range h.large {
		large = append(large, AttemptBucket{Attempts: n, Count: c})
	}
	sort.Slice(large, func(i, j int) bool { return large[i].Attempts < large[j].Attempts })
	return append(out, large...)
}

// Percentile is the smallest attempt count n such that at least q percent
// of the recorded transactions took n attempts or fewer (q in [0, 100]),
// exactly; 0 when empty.
func (h *AttemptHistogram) Percentile(q float64) int {
	if h.total == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q / 100 * float64(h.total)))
	rank = max(rank, 1)
	var seen uint64
	for _, b := range h.Buckets() {
		seen += b.Count
		if seen >= rank {
			return b.Attempts
		}
	}
	return h.max
}

// Stats summarizes h for a result.
func (h *AttemptHistogram) Stats() AttemptStats {
	return AttemptStats{
		Count:   h.total,
		Mean:    h.Mean(),
		P50:     h.Percentile(50),
		P99:     h.Percentile(99),
		Max:     h.max,
		Buckets: h.Buckets(),
	}
}

// AttemptBucket is the number of transactions that took Attempts attempts.
type AttemptBucket struct {
	Attempts int    `json:"attempts"`
	Count    uint64 `json:"count"`
}

// AttemptStats summarize the attempts per committed transaction of a run.
type AttemptStats struct {
	Count   uint64          `json:"count"`
	Mean    float64         `json:"mean"`
	P50     int             `json:"p50"`
	P99     int             `json:"p99"`
	Max     int             `json:"max"`
	Buckets []AttemptBucket `json:"buckets,omitempty"`
}
