package shard

import (
	"testing"

	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/txn"
)

// TestNoTxnRecord: a shard answers "no record" for a transaction exactly
// when storage holds none, under random heartbeats, aborts, commits and
// removals, for transactions begun after it was loaded; and never for one
// begun before (its record may predate the shard's list), for an anchor
// it no longer owns after a split, or after a reload.
func TestNoTxnRecord(t *testing.T) {
	rng, seed := seededRand(t, 1)
	db := memDB(t)
	desc := Desc{ShardID: 2, Collection: 1, Partitioning: kv.PartitionRange}
	before := TxnRecordEpoch()
	s, err := Load(db, desc)
	if err != nil {
		t.Fatal(err)
	}
	epoch := TxnRecordEpoch()
	newMetas := func() []txn.Meta {
		var metas []txn.Meta
		for i, k := range []string{"a", "b", "c", "d", "e", "f"} {
			metas = append(metas, txn.Meta{ID: txn.NewID(uint64(i+1), 1), Priority: uint64(i + 1), Attempt: 1,
				Anchor: txn.Anchor{Collection: 1, Key: []byte(k)}})
		}
		return metas
	}
	metas := newMetas()
	check := func(step int, s *Shard, epoch uint64, wantKnown func(m *txn.Meta) bool) {
		t.Helper()
		for i := range metas {
			m := &metas[i]
			_, exists, err := ReadTxnRecord(db, m)
			if err != nil {
				t.Fatal(err)
			}
			no := s.NoTxnRecord(m, epoch)
			if no && exists {
				t.Fatalf("seed %d, step %d: the shard says %s has no record, storage holds one", seed, step, m.ID)
			}
			if known := wantKnown(m); known && no == exists {
				t.Fatalf("seed %d, step %d: NoTxnRecord(%s) = %v with a record in storage: %v", seed, step, m.ID, no, exists)
			} else if !known && no {
				t.Fatalf("seed %d, step %d: NoTxnRecord(%s) = true where the shard cannot know", seed, step, m.ID)
			}
		}
	}
	all := func(*txn.Meta) bool { return true }
	none := func(*txn.Meta) bool { return false }
	version := uint64(100)
	steps := func(s *Shard, n int, epoch uint64, known func(*txn.Meta) bool) {
		t.Helper()
		for step := range n {
			m := metas[rng.IntN(len(metas))]
			var cmd []byte
			switch rng.IntN(4) {
			case 0:
				cmd = EncodeTxnRecord(txn.RecordCmd{Op: txn.OpHeartbeat, Meta: m, TS: version})
			case 1:
				cmd = EncodeTxnRecord(txn.RecordCmd{Op: txn.OpAbort, Meta: m, Reason: "test", Now: 1})
			case 2:
				version++
				cmd = EncodeTxnRecord(txn.RecordCmd{Op: txn.OpCommit, Meta: m, TS: version})
			case 3:
				cmd = EncodeTxnForget(&TxnForgetCmd{Records: []TxnRecordRef{{ID: m.ID, Anchor: m.Anchor}}})
			}
			applyOne(t, db, s, cmd)
			check(step, s, epoch, known)
			check(step, s, before, none)
		}
	}
	steps(s, 200, epoch, all)
	// A split: what the shard listed before it no longer vouches for a
	// transaction begun before; for one begun after, it knows where it
	// still owns the anchor (the others' records are written in the new
	// shard).
	if res := applyOne(t, db, s, EncodeSplitTrigger(3, []byte("d"), 0)); res.Err != nil {
		t.Fatal(res.Err)
	}
	check(-1, s, epoch, none)
	after := TxnRecordEpoch()
	metas = newMetas()
	steps(s, 100, after, func(m *txn.Meta) bool { return string(m.Anchor.Key) < "d" })
	// A reload knows nothing of what was written before it.
	if s, err = Load(db, s.Desc()); err != nil {
		t.Fatal(err)
	}
	check(-2, s, after, none)
}
