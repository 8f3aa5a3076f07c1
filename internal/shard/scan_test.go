package shard

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
)

// TestScanMatchesModel scans, forward and backward, at random versions and
// bounds, a shard whose keys have from one to a dozen versions (some of
// them deletes) and whose keys are prefixes of one another or hold zero
// bytes, and compares each answer with a model of the writes.
func TestScanMatchesModel(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	db := memDB(t)
	s, err := Load(db, Desc{ShardID: 2, Collection: 1, Partitioning: kv.PartitionRange})
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{"a", "a\x00", "a\x00\x00", "a\x00b", "a\x01", "ab", "abc", "b", "b\xff", "c", "\x00", "\xff\xff"}
	for i := range 30 {
		keys = append(keys, fmt.Sprintf("k%02d", i))
	}
	type version struct {
		v     uint64
		value string // "" for a delete
	}
	model := map[string][]version{} // oldest first
	next := uint64(10)
	var written []uint64
	for range 400 {
		k := keys[rng.IntN(len(keys))]
		// Skew: a few keys get many versions.
		if rng.IntN(3) == 0 {
			k = keys[rng.IntN(3)]
		}
		op := Op{Type: OpPut, Key: []byte(k), Value: []byte(fmt.Sprintf("%s@%d", k, next))}
		if rng.IntN(5) == 0 {
			op = Op{Type: OpDelete, Key: []byte(k)}
		}
		cmd := EncodeWrite([]Op{op})
		SetVersion(cmd, next)
		if res := applyOne(t, db, s, cmd); res.Err != nil {
			t.Fatalf("seed %d: write %q at %d: %v", seed, k, next, res.Err)
		}
		model[k] = append(model[k], version{next, string(op.Value)})
		written = append(written, next)
		next += uint64(1 + rng.IntN(3))
	}
	sorted := slices.Clone(keys)
	slices.Sort(sorted)
	for i := range 300 {
		asOf := uint64(5 + rng.IntN(int(next)))
		if rng.IntN(2) == 0 {
			// Just at or below a version written: the newest versions
			// of some key are then above it, the next one at it.
			asOf = written[rng.IntN(len(written))] - uint64(rng.IntN(2))
		}
		var start, end []byte
		if rng.IntN(2) == 0 {
			start = []byte(sorted[rng.IntN(len(sorted))])
		}
		if rng.IntN(2) == 0 {
			end = []byte(sorted[rng.IntN(len(sorted))])
		}
		reverse := rng.IntN(2) == 0
		limit := rng.IntN(8) // 0: none
		var want []string
		for _, k := range sorted {
			if start != nil && k < string(start) || end != nil && k >= string(end) {
				continue
			}
			var cur *version
			for j := range model[k] {
				if model[k][j].v <= asOf {
					cur = &model[k][j]
				}
			}
			if cur != nil && cur.value != "" {
				want = append(want, fmt.Sprintf("%q=%s@%d", k, cur.value, cur.v))
			}
		}
		if reverse {
			slices.Reverse(want)
		}
		if limit > 0 && len(want) > limit {
			want = want[:limit]
		}
		var got []string
		err := Scan(db, ScanOptions{Collection: 1, Start: start, End: end, AsOf: asOf, Reverse: reverse, Limit: limit}, func(r ScanRecord) bool {
			got = append(got, fmt.Sprintf("%q=%s@%d", r.Key, r.Value, r.Version))
			return true
		})
		if err != nil {
			t.Fatalf("seed %d, scan %d: %v", seed, i, err)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("seed %d, scan %d (as of %d, [%q, %q), reverse %v, limit %d):\ngot  %v\nwant %v", seed, i, asOf, start, end, reverse, limit, got, want)
		}
	}
	// Some key had more versions than a scan steps over before seeking.
	most := 0
	for _, vs := range model {
		most = max(most, len(vs))
	}
	if most <= scanStepsBeforeSeek+1 {
		t.Fatalf("seed %d: at most %d versions of a key; the test does not reach the seek", seed, most)
	}
}
