package shard

import (
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/txn"
)

// TestMayHoldIntent: the shard counts the keys its prepared transactions
// write — after a prepare, after a reload from storage, after a merge
// brings in the right shard's — and only those; a resolve uncounts them.
// A conflicting prepare is refused all the same, and a plain write over
// an intent too; a shard frozen for a merge refuses resolves.
func TestMayHoldIntent(t *testing.T) {
	db := memDB(t)
	leftDesc := Desc{ShardID: 2, Collection: 1, Partitioning: kv.PartitionRange, End: []byte("g")}
	rightDesc := Desc{ShardID: 3, Collection: 1, Partitioning: kv.PartitionRange, Start: []byte("g")}
	apply := func(s *Shard, cmd []byte) Result {
		t.Helper()
		return applyOne(t, db, s, cmd)
	}
	version := uint64(10)
	versioned := func(cmd []byte) []byte {
		version++
		SetVersion(cmd, version)
		return cmd
	}
	prepare := func(s *Shard, id string, keys ...string) Result {
		t.Helper()
		p := &TxnPrepareCmd{Meta: txn.Meta{ID: id, Priority: 1}, LockTerm: 1}
		for _, k := range keys {
			p.Writes = append(p.Writes, Op{Type: OpPut, Key: []byte(k), Value: []byte("v" + k)})
		}
		return apply(s, versioned(EncodeTxnPrepare(p)))
	}
	holds := func(s *Shard, want ...string) {
		t.Helper()
		for _, k := range []string{"a", "b", "c", "h", "i"} {
			w := false
			for _, x := range want {
				w = w || x == k
			}
			if got := s.MayHoldIntent([]byte(k)); got != w {
				t.Errorf("shard %d: MayHoldIntent(%s) = %v, want %v", s.Desc().ShardID, k, got, w)
			}
		}
	}
	left, err := Load(db, leftDesc)
	if err != nil {
		t.Fatal(err)
	}
	right, err := Load(db, rightDesc)
	if err != nil {
		t.Fatal(err)
	}
	t1, t2, t3 := txn.NewID(1, 1), txn.NewID(2, 1), txn.NewID(3, 1)
	if res := prepare(left, t1, "a", "b"); res.Err != nil {
		t.Fatal(res.Err)
	}
	holds(left, "a", "b")
	if res := prepare(left, t2, "b", "c"); kv.CodeOf(res.Err) != kv.CodeTxnAborted {
		t.Fatalf("a prepare over t1's intent on b: %v, want txn_aborted", res.Err)
	}
	holds(left, "a", "b")
	if res := apply(left, versioned(EncodeWrite([]Op{{Type: OpPut, Key: []byte("a"), Value: []byte("x")}}))); kv.CodeOf(res.Err) != kv.CodeUnavailable {
		t.Fatalf("a plain write over t1's intent on a: %v, want unavailable", res.Err)
	}
	if left, err = Load(db, leftDesc); err != nil {
		t.Fatal(err)
	}
	holds(left, "a", "b")
	if res := prepare(right, t3, "h"); res.Err != nil {
		t.Fatal(res.Err)
	}
	holds(right, "h")
	f := apply(right, versioned(EncodeFreeze(2)))
	if f.Err != nil {
		t.Fatal(f.Err)
	}
	// Frozen, the right shard resolves nothing: its replicas must hand the
	// same prepares over, whenever each applies the merge.
	if res := apply(right, versioned(EncodeTxnResolve(&TxnResolveCmd{ID: t3}))); kv.CodeOf(res.Err) != kv.CodeUnavailable {
		t.Fatalf("a resolve in the frozen shard: %v, want unavailable", res.Err)
	}
	holds(right, "h")
	if res := apply(left, EncodeMergeTrigger(rightDesc, *f.Freeze)); res.Err != nil {
		t.Fatal(res.Err)
	}
	holds(left, "a", "b", "h")
	apply(left, versioned(EncodeTxnResolve(&TxnResolveCmd{ID: t1, Commit: true, CommitTS: version})))
	holds(left, "h")
	// A resolve uncounts its keys once its batch is committed: until then
	// a reader outside the apply loop finds the intent in storage.
	b := db.NewIndexedBatch()
	index, _ := left.Applied()
	if _, err := left.Apply(b, index+1, 1, versioned(EncodeTxnResolve(&TxnResolveCmd{ID: t3}))); err != nil {
		t.Fatal(err)
	}
	if err := left.FinishBatch(b); err != nil {
		t.Fatal(err)
	}
	holds(left, "h")
	if err := b.Commit(pebble.Sync); err != nil {
		t.Fatal(err)
	}
	b.Close()
	left.Committed()
	holds(left)
	if left.MinPrepared() != 0 {
		t.Fatalf("min prepared %d with nothing prepared", left.MinPrepared())
	}
	val, _, found, err := ReadRecord(db, 1, []byte("a"), Latest)
	if err != nil || !found || string(val.Value) != "va" {
		t.Fatalf("a after t1 committed: %q %v %v", val.Value, found, err)
	}
	if _, found, err := ReadIntent(db, 1, []byte("h")); found || err != nil {
		t.Fatalf("h holds an intent after t3 aborted: %v", err)
	}
}

// TestReleaseResolved: a resolve's transaction holds MinPrepared back
// until the owner's ReleaseResolved, after Published, so that the owner
// can publish the resolve's version in between (replication.Host.ReadNow
// reads MinPrepared, then the versions).
func TestReleaseResolved(t *testing.T) {
	db := memDB(t)
	desc := Desc{ShardID: 2, Collection: 1, Partitioning: kv.PartitionRange}
	s, err := Load(db, desc)
	if err != nil {
		t.Fatal(err)
	}
	id := txn.NewID(1, 1)
	p := &TxnPrepareCmd{Meta: txn.Meta{ID: id, Priority: 1}, LockTerm: 1,
		Writes: []Op{{Type: OpPut, Key: []byte("a"), Value: []byte("va")}}}
	if res := applyAt(t, db, s, 10, EncodeTxnPrepare(p)); res.Err != nil {
		t.Fatal(res.Err)
	}
	if got := s.MinPrepared(); got != 10 {
		t.Fatalf("MinPrepared after the prepare = %d, want 10", got)
	}
	cmd := EncodeTxnResolve(&TxnResolveCmd{ID: id, Commit: true, CommitTS: 15})
	SetVersion(cmd, 20)
	b := db.NewIndexedBatch()
	defer b.Close()
	index, _ := s.Applied()
	if res, err := s.Apply(b, index+1, 1, cmd); err != nil || res.Err != nil {
		t.Fatalf("resolve: %v %v", err, res.Err)
	}
	if err := s.FinishBatch(b); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(pebble.Sync); err != nil {
		t.Fatal(err)
	}
	s.Published()
	if got := s.MinPrepared(); got != 10 {
		t.Fatalf("MinPrepared after Published = %d, want 10 until ReleaseResolved", got)
	}
	if s.MayHoldIntent([]byte("a")) {
		t.Fatal("the resolved key still counts as an intent after Published")
	}
	s.ReleaseResolved()
	if got := s.MinPrepared(); got != 0 {
		t.Fatalf("MinPrepared after ReleaseResolved = %d, want 0", got)
	}
}
