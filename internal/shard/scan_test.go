package shard

import (
	"fmt"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/storage"
)

// TestScanMatchesModel scans, forward and backward, at random versions and
// bounds, a shard whose keys have from one to a dozen versions (some of
// them deletes) and whose keys are prefixes of one another or hold zero
// bytes, and compares each answer with a model of the writes. Some keys'
// latest pointers are of format 2 (no value).
func TestScanMatchesModel(t *testing.T) {
	rng, seed := seededRand(t, 7)
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
	// A third of the keys get a pointer as format 2 wrote it: version and
	// bucket, no value (read from the version's data key).
	formatTwo := 0
	for _, k := range keys {
		lk := storage.LatestKey(nil, 1, []byte(k))
		ptr, ok, err := storage.GetValue(db, lk)
		if err != nil {
			t.Fatal(err)
		}
		if !ok || rng.IntN(3) != 0 {
			continue
		}
		version, bucket, _, err := storage.DecodeLatest(ptr)
		if err != nil {
			t.Fatal(err)
		}
		if err := db.Set(lk, storage.EncodeLatest(nil, version, bucket, nil), pebble.Sync); err != nil {
			t.Fatal(err)
		}
		formatTwo++
	}
	if formatTwo == 0 {
		t.Fatalf("seed %d: no pointer rewritten as format 2", seed)
	}
	var fromPointer, fromVersions int
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
				if newest := model[k][len(model[k])-1]; cur.v == newest.v {
					fromPointer++
				} else {
					fromVersions++
				}
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
	// Both ways of answering were taken: from a key's latest pointer, and
	// from its versions when it was written after the scan's version.
	if fromPointer == 0 || fromVersions == 0 {
		t.Fatalf("seed %d: %d records expected from latest pointers, %d from older versions; the test must reach both", seed, fromPointer, fromVersions)
	}
}

// TestScanStalePointerOfMovedKey: in a collection whose keys move between
// shards (a tag collection), a key's latest pointer may name the version
// applied last on this node rather than the newest: here the tombstone
// its old shard wrote before the key moved, applied after the new shard's
// newer version. A scan with Moves answers the newest version at or below
// its own, as walking the versions does, whether it reads every bucket or
// only the new one; and it does not answer for the old bucket.
func TestScanStalePointerOfMovedKey(t *testing.T) {
	db := memDB(t)
	s, err := Load(db, Desc{ShardID: 2, Collection: 1, Partitioning: kv.PartitionTag, BucketStart: 0, BucketEnd: 10})
	if err != nil {
		t.Fatal(err)
	}
	const oldBucket, newBucket = 1, 2
	b := db.NewIndexedBatch()
	// Live in the old bucket at 5, deleted there at 10, written in the
	// new bucket at 20; "a" and "z" stay put around it.
	for _, w := range []struct {
		key     string
		bucket  uint16
		version uint64
		value   string
	}{{"a", newBucket, 3, "a"}, {"k", oldBucket, 5, "old"}, {"k", oldBucket, 10, ""}, {"k", newBucket, 20, "new"}, {"z", oldBucket, 4, "z"}} {
		if err := s.writeVersion(b, []byte(w.key), w.bucket, w.version, w.value == "", nil, []byte(w.value), nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.FinishBatch(b); err != nil {
		t.Fatal(err)
	}
	// The old bucket's tombstone applied last: the pointer names it.
	stale := storage.EncodeLatest(nil, 10, oldBucket, storage.EncodeValue(nil, storage.MVCCValue{Tombstone: true, Bucket: oldBucket}))
	if err := b.Set(storage.LatestKey(nil, 1, []byte("k")), stale, nil); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(pebble.Sync); err != nil {
		t.Fatal(err)
	}
	scan := func(asOf uint64, owned func(uint16) bool) []string {
		t.Helper()
		var got []string
		if err := Scan(db, ScanOptions{Collection: 1, AsOf: asOf, Owned: owned, Moves: true}, func(r ScanRecord) bool {
			got = append(got, fmt.Sprintf("%s=%s@%d", r.Key, r.Value, r.Version))
			return true
		}); err != nil {
			t.Fatal(err)
		}
		return got
	}
	only := func(b uint16) func(uint16) bool { return func(x uint16) bool { return x == b } }
	for _, c := range []struct {
		asOf  uint64
		owned func(uint16) bool
		want  []string
	}{
		{30, nil, []string{"a=a@3", "k=new@20", "z=z@4"}},
		{30, only(newBucket), []string{"a=a@3", "k=new@20"}},
		{30, only(oldBucket), []string{"z=z@4"}},
		{15, nil, []string{"a=a@3", "z=z@4"}},
		{7, only(oldBucket), []string{"k=old@5", "z=z@4"}},
	} {
		if got := scan(c.asOf, c.owned); !slices.Equal(got, c.want) {
			t.Errorf("as of %d: %v, want %v", c.asOf, got, c.want)
		}
	}
}
