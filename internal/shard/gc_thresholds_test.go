package shard

import (
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/storage"
)

// TestGCThresholdsRaisedBeforeCommit: every apply that raises a GC
// threshold — a GC, a split giving the child its parent's, a merge taking
// the right shard's — raises the node's view before its batch commits, so
// that a read checking the view after it read never passes a threshold
// whose collection it could have seen.
func TestGCThresholdsRaisedBeforeCommit(t *testing.T) {
	db := memDB(t)
	view := NewGCThresholds()
	leftDesc := Desc{ShardID: 2, Collection: 1, Partitioning: kv.PartitionRange}
	rightDesc := Desc{ShardID: 3, Collection: 1, Partitioning: kv.PartitionRange, Start: []byte("g")}
	left, err := Load(db, leftDesc)
	if err != nil {
		t.Fatal(err)
	}
	left.SetGCThresholds(view)
	check := func(r pebble.Reader, when string) {
		t.Helper()
		for _, id := range []uint64{leftDesc.ShardID, rightDesc.ShardID} {
			want, err := ReadGCThreshold(r, id)
			if err != nil {
				t.Fatal(err)
			}
			got, err := view.Get(db, id)
			if err != nil {
				t.Fatal(err)
			}
			if got < want {
				t.Fatalf("%s: shard %d's threshold is %d, the view answers %d", when, id, want, got)
			}
		}
	}
	apply := func(s *Shard, version uint64, cmd []byte) Result {
		t.Helper()
		if version != 0 {
			SetVersion(cmd, version)
		}
		res := applyOneThen(t, db, s, cmd, func(b *pebble.Batch) { check(b, "before the commit") })
		if res.Err != nil {
			t.Fatalf("version %d: %v", version, res.Err)
		}
		check(db, "after the commit")
		return res
	}
	put := func(s *Shard, version uint64, key string) {
		t.Helper()
		apply(s, version, EncodeWrite([]Op{{Type: OpPut, Key: []byte(key), Value: []byte("v")}}))
	}
	put(left, 10, "a")
	put(left, 12, "m")
	put(left, 14, "m")
	apply(left, 0, EncodeGC(13))
	apply(left, 0, EncodeSplitTrigger(rightDesc.ShardID, rightDesc.Start, 0))
	right, err := Load(db, rightDesc)
	if err != nil {
		t.Fatal(err)
	}
	right.SetGCThresholds(view)
	put(right, 20, "m")
	put(right, 22, "m")
	apply(right, 0, EncodeGC(21))
	f := apply(right, 25, EncodeFreeze(leftDesc.ShardID))
	apply(left, 0, EncodeMergeTrigger(rightDesc, *f.Freeze))
	if got, _ := view.Get(db, leftDesc.ShardID); got != 21 {
		t.Fatalf("after the merge the view answers %d for the left shard, want 21", got)
	}
}

// TestGCThresholdsStorage: the view reads storage until it knows a
// shard's threshold, and while the shard is held (a snapshot replacing
// it), and keeps the higher of what it read and what was raised.
func TestGCThresholdsStorage(t *testing.T) {
	db := memDB(t)
	set := func(id, v uint64) {
		t.Helper()
		b := db.NewBatch()
		if err := storage.PutUint64(b, storage.ShardStateKey(id, stateGCThreshold), v); err != nil {
			t.Fatal(err)
		}
		if err := b.Commit(pebble.Sync); err != nil {
			t.Fatal(err)
		}
	}
	view := NewGCThresholds()
	get := func(id, want uint64) {
		t.Helper()
		if got, err := view.Get(db, id); err != nil || got != want {
			t.Fatalf("shard %d: the view answers %d (%v), want %d", id, got, err, want)
		}
	}
	// A raise alone does not vouch for what an earlier process committed.
	set(5, 100)
	view.Raise(5, 50)
	get(5, 100)
	view.Raise(5, 120)
	get(5, 120)
	// Known: storage is not read again.
	set(6, 10)
	get(6, 10)
	set(6, 30)
	get(6, 10)
	// Held: storage is read, then the release publishes the new value.
	view.Hold(6)
	get(6, 30)
	set(6, 40)
	get(6, 40)
	view.Release(6, 40)
	set(6, 45)
	get(6, 40)
	// No view: storage.
	var none *GCThresholds
	if got, err := none.Get(db, 6); err != nil || got != 45 {
		t.Fatalf("without a view: %d (%v), want 45", got, err)
	}
}
