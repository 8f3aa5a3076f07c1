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
