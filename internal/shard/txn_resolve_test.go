package shard

import (
	"testing"

	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/txn"
)

// TestResolveCommit: a committing resolve writes its intent's value at the
// commit timestamp, whether it takes the intent from what the prepare
// left in memory or reads it back after a reload, and never moves a key
// back: a version at or above the commit written after the prepare (by a
// delete range, which does not look for intents, or by a write between a
// first resolve and a late second prepare of the same transaction) stays
// the key's newest.
func TestResolveCommit(t *testing.T) {
	desc := Desc{ShardID: 2, Collection: 1, Partitioning: kv.PartitionRange}
	id := txn.NewID(1, 1)
	type step struct {
		version uint64
		cmd     []byte
		reload  bool // Load the shard anew before the command
	}
	put := func(v uint64, value string) step {
		return step{version: v, cmd: EncodeWrite([]Op{{Type: OpPut, Key: []byte("a"), Value: []byte(value)}})}
	}
	prepare := func(v uint64, value string) step {
		p := &TxnPrepareCmd{Meta: txn.Meta{ID: id, Priority: 1}, LockTerm: 1,
			Writes: []Op{{Type: OpPut, Key: []byte("a"), Value: []byte(value)}}}
		return step{version: v, cmd: EncodeTxnPrepare(p)}
	}
	resolve := func(v, commitTS uint64) step {
		return step{version: v, cmd: EncodeTxnResolve(&TxnResolveCmd{ID: id, Commit: true, CommitTS: commitTS})}
	}
	deleteRange := func(v uint64) step {
		return step{version: v, cmd: EncodeDeleteRange([]byte("a"), []byte("z"))}
	}
	reloaded := func(s step) step { s.reload = true; return s }
	for _, tc := range []struct {
		name        string
		steps       []step
		found       bool
		value       string
		wantVersion uint64
	}{
		{"from memory", []step{put(10, "old"), prepare(20, "new"), resolve(30, 25)}, true, "new", 25},
		{"after a reload", []step{put(10, "old"), prepare(20, "new"), reloaded(resolve(30, 25))}, true, "new", 25},
		{"prepared at the commit", []step{put(10, "old"), prepare(25, "new"), resolve(30, 25)}, true, "new", 25},
		{"absent before", []step{prepare(20, "new"), resolve(30, 25)}, true, "new", 25},
		{"delete range above the commit", []step{put(10, "old"), prepare(20, "new"), deleteRange(30), resolve(40, 25)}, false, "", 30},
		{"delete range below the commit", []step{put(10, "old"), prepare(20, "new"), deleteRange(30), resolve(40, 35)}, true, "new", 35},
		{"delete range before the prepare", []step{put(10, "old"), deleteRange(15), prepare(20, "new"), resolve(40, 25)}, true, "new", 25},
		{"prepared again after its resolve", []step{put(10, "old"), prepare(20, "new"), resolve(30, 25), put(40, "newer"), prepare(50, "new"), resolve(60, 25)}, true, "newer", 40},
		{"prepared again, reloaded", []step{put(10, "old"), prepare(20, "new"), resolve(30, 25), put(40, "newer"), prepare(50, "new"), reloaded(resolve(60, 25))}, true, "newer", 40},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := memDB(t)
			s, err := Load(db, desc)
			if err != nil {
				t.Fatal(err)
			}
			for i, st := range tc.steps {
				if st.reload {
					if s, err = Load(db, desc); err != nil {
						t.Fatal(err)
					}
				}
				SetVersion(st.cmd, st.version)
				if res := applyOne(t, db, s, st.cmd); res.Err != nil {
					t.Fatalf("step %d (version %d): %v", i, st.version, res.Err)
				}
			}
			val, version, found, err := ReadRecord(db, 1, []byte("a"), Latest)
			if err != nil {
				t.Fatal(err)
			}
			if found != tc.found || string(val.Value) != tc.value || version != tc.wantVersion {
				t.Fatalf("a = %q@%d (found %v), want %q@%d (found %v)", val.Value, version, found, tc.value, tc.wantVersion, tc.found)
			}
			if _, held, err := ReadIntent(db, 1, []byte("a")); held || err != nil {
				t.Fatalf("a still holds an intent (%v)", err)
			}
		})
	}
}

// TestResolveAfterSplitAndMerge: a prepare's intent that a split gave to
// the new shard, which resolved it there, is not written again by the
// resolve of the shard that prepared it once the two merged back, even
// though that shard applied the prepare and the key is its own again:
// the key keeps the version written after the first resolve.
func TestResolveAfterSplitAndMerge(t *testing.T) {
	db := memDB(t)
	leftDesc := Desc{ShardID: 2, Collection: 1, Partitioning: kv.PartitionRange}
	rightDesc := Desc{ShardID: 3, Collection: 1, Partitioning: kv.PartitionRange, Start: []byte("g")}
	id := txn.NewID(1, 1)
	left, err := Load(db, leftDesc)
	if err != nil {
		t.Fatal(err)
	}
	apply := func(s *Shard, version uint64, cmd []byte) Result {
		t.Helper()
		if version != 0 {
			SetVersion(cmd, version)
		}
		res := applyOne(t, db, s, cmd)
		if res.Err != nil {
			t.Fatalf("version %d: %v", version, res.Err)
		}
		return res
	}
	put := func(s *Shard, version uint64, value string) {
		t.Helper()
		apply(s, version, EncodeWrite([]Op{{Type: OpPut, Key: []byte("m"), Value: []byte(value)}}))
	}
	put(left, 10, "old")
	apply(left, 20, EncodeTxnPrepare(&TxnPrepareCmd{Meta: txn.Meta{ID: id, Priority: 1}, LockTerm: 1,
		Writes: []Op{{Type: OpPut, Key: []byte("m"), Value: []byte("new")}}}))
	apply(left, 0, EncodeSplitTrigger(rightDesc.ShardID, rightDesc.Start, 0))
	right, err := Load(db, rightDesc)
	if err != nil {
		t.Fatal(err)
	}
	apply(right, 30, EncodeTxnResolve(&TxnResolveCmd{ID: id, Commit: true, CommitTS: 25}))
	put(right, 40, "newer")
	f := apply(right, 45, EncodeFreeze(leftDesc.ShardID))
	apply(left, 0, EncodeMergeTrigger(rightDesc, *f.Freeze))
	apply(left, 50, EncodeTxnResolve(&TxnResolveCmd{ID: id, Commit: true, CommitTS: 25}))
	val, version, found, err := ReadRecord(db, 1, []byte("m"), Latest)
	if err != nil || !found || string(val.Value) != "newer" || version != 40 {
		t.Fatalf("m = %q@%d (found %v, %v), want \"newer\"@40", val.Value, version, found, err)
	}
}
