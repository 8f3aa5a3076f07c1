package shard

import (
	"errors"
	"fmt"
	"testing"

	"github.com/cockroachdb/pebble/v2"

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
	type step = txnStep
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
			runTxnSteps(t, db, desc, tc.steps)
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

// txnStep is a command applied to a shard at version by runTxnSteps.
type txnStep struct {
	version uint64
	cmd     []byte
	reload  bool // Load the shard anew before the command
	// setAgain, with no command: every key of the store is set again
	// with the value it has, as a snapshot restored over them would.
	setAgain bool
}

// runTxnSteps loads shard desc from db and applies steps to it in order;
// a command the shard refuses fails the test.
func runTxnSteps(t *testing.T, db *pebble.DB, desc Desc, steps []txnStep) {
	t.Helper()
	s, err := Load(db, desc)
	if err != nil {
		t.Fatal(err)
	}
	for i, st := range steps {
		if st.setAgain {
			setAllAgain(t, db)
			continue
		}
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
}

// setAllAgain sets every key of db again with the value it has.
func setAllAgain(t *testing.T, db *pebble.DB) {
	t.Helper()
	it, err := db.NewIter(nil)
	if err != nil {
		t.Fatal(err)
	}
	b := db.NewBatch()
	for ok := it.First(); ok; ok = it.Next() {
		if err := b.Set(it.Key(), it.Value(), nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := errors.Join(it.Close(), b.Commit(pebble.Sync)); err != nil {
		t.Fatal(err)
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

// TestResolveBatch: a batch of resolves applies each as a resolve of its
// own would — a commit's intent becomes a version at its commit
// timestamp, an abort's vanishes, a transaction resolved before is left
// as it is — at the batch's one version, and names the transactions
// resolved; a batch at a version the shard passed applies nothing.
func TestResolveBatch(t *testing.T) {
	db := memDB(t)
	s, err := Load(db, Desc{ShardID: 2, Collection: 1, Partitioning: kv.PartitionRange})
	if err != nil {
		t.Fatal(err)
	}
	apply := func(version uint64, cmd []byte) Result {
		t.Helper()
		return applyAt(t, db, s, version, cmd)
	}
	a, b, c := txn.NewID(1, 1), txn.NewID(2, 1), txn.NewID(3, 1)
	prepare := func(version uint64, id, key, value string) {
		t.Helper()
		p := &TxnPrepareCmd{Meta: txn.Meta{ID: id, Priority: 1}, LockTerm: 1, Writes: []Op{{Type: OpPut, Key: []byte(key), Value: []byte(value)}}}
		if res := apply(version, EncodeTxnPrepare(p)); res.Err != nil {
			t.Fatalf("prepare %s: %v", key, res.Err)
		}
	}
	apply(10, EncodeWrite([]Op{{Type: OpPut, Key: []byte("b"), Value: []byte("old")}}))
	prepare(20, a, "a", "va")
	prepare(21, b, "b", "vb")
	prepare(22, c, "c", "vc")
	if res := apply(30, EncodeTxnResolve(&TxnResolveCmd{ID: c, Commit: true, CommitTS: 25})); res.Err != nil {
		t.Fatal(res.Err)
	}
	apply(31, EncodeWrite([]Op{{Type: OpPut, Key: []byte("c"), Value: []byte("newer")}}))
	batch := EncodeTxnResolveBatch([]*TxnResolveCmd{
		{ID: a, Commit: true, CommitTS: 26, Keys: []TxnKey{{Key: []byte("a")}}},
		{ID: b, Keys: []TxnKey{{Key: []byte("b")}}},
		{ID: c, Commit: true, CommitTS: 25, Keys: []TxnKey{{Key: []byte("c")}}},
	})
	stale := append([]byte(nil), batch...)
	if res := apply(31, stale); res.Err == nil {
		t.Fatal("a batch at a version the shard passed applied")
	}
	if s.MinPrepared() == 0 {
		t.Fatal("a refused batch resolved transactions")
	}
	res := apply(40, batch)
	if res.Err != nil || res.Version != 40 || len(res.Resolved) != 3 || res.Resolved[0] != a || res.Resolved[1] != b || res.Resolved[2] != c {
		t.Fatalf("batch: %+v", res)
	}
	for _, w := range []struct {
		key, value string
		version    uint64
	}{{"a", "va", 26}, {"b", "old", 10}, {"c", "newer", 31}} {
		val, version, found, err := ReadRecord(db, 1, []byte(w.key), Latest)
		if err != nil || !found || string(val.Value) != w.value || version != w.version {
			t.Fatalf("%s = %q@%d (found %v, %v), want %q@%d", w.key, val.Value, version, found, err, w.value, w.version)
		}
		if _, held, err := ReadIntent(db, 1, []byte(w.key)); held || err != nil {
			t.Fatalf("%s still holds an intent (%v)", w.key, err)
		}
	}
	if s.MinPrepared() != 0 || s.MaxVersion() != 40 {
		t.Fatalf("after the batch: min prepared %d, max version %d", s.MinPrepared(), s.MaxVersion())
	}
}

// TestCommitLast: the record's shard, as the last participant, commits
// its writes at the proposal's version with no intent, and leaves the
// record COMMITTED listing the other participants; it refuses, writing
// nothing, a version not above the others' prepares, or a record a wound
// aborted.
func TestCommitLast(t *testing.T) {
	desc := Desc{ShardID: 2, Collection: 1, Partitioning: kv.PartitionRange}
	anchor := txn.Anchor{Collection: 1, Key: []byte("a")}
	cmd := func(id string, minCommit uint64) []byte {
		return EncodeTxnPrepare(&TxnPrepareCmd{Meta: txn.Meta{ID: id, Priority: 1, Anchor: anchor}, LockTerm: 1, OnePhase: true,
			Last: true, MinCommit: minCommit, Participants: []uint64{5, 7}, Writes: []Op{{Type: OpPut, Key: []byte("a"), Value: []byte("new")}}})
	}
	db := memDB(t)
	s, err := Load(db, desc)
	if err != nil {
		t.Fatal(err)
	}
	apply := func(version uint64, cmd []byte) Result {
		t.Helper()
		return applyAt(t, db, s, version, cmd)
	}
	apply(10, EncodeWrite([]Op{{Type: OpPut, Key: []byte("a"), Value: []byte("old")}}))
	id := txn.NewID(1, 1)
	if res := apply(20, cmd(id, 20)); res.Err == nil {
		t.Fatal("a commit at its others' prepare version applied")
	}
	if val, v, _, _ := ReadRecord(db, 1, []byte("a"), Latest); string(val.Value) != "old" || v != 10 {
		t.Fatalf("a refused commit wrote a = %q@%d", val.Value, v)
	}
	res := apply(30, cmd(id, 25))
	if res.Err != nil || res.Version != 30 || res.Txn == nil || res.Txn.Status != txn.Committed {
		t.Fatalf("commit: %+v", res)
	}
	if val, v, _, _ := ReadRecord(db, 1, []byte("a"), Latest); string(val.Value) != "new" || v != 30 {
		t.Fatalf("a = %q@%d, want new@30", val.Value, v)
	}
	if _, held, _ := ReadIntent(db, 1, []byte("a")); held || s.MinPrepared() != 0 {
		t.Fatal("the last participant left an intent or a prepare")
	}
	rec, ok, err := ReadTxnRecord(db, &txn.Meta{ID: id, Anchor: anchor})
	if err != nil || !ok || rec.Status != txn.Committed || rec.CommitTS != 30 || !rec.Listed || len(rec.Participants) != 2 {
		t.Fatalf("record %+v (found %v, %v), want COMMITTED at 30 listing [5 7]", rec, ok, err)
	}
	// A wounded transaction's last participant commits nothing.
	wounded := txn.NewID(2, 1)
	if r := applyOne(t, db, s, EncodeTxnRecord(txn.RecordCmd{Op: txn.OpAbort, Meta: txn.Meta{ID: wounded, Priority: 2, Anchor: anchor}, Reason: "wounded"})); r.Err != nil {
		t.Fatal(r.Err)
	}
	if r := apply(50, cmd(wounded, 45)); r.Err == nil || kv.CodeOf(r.Err) != kv.CodeTxnAborted {
		t.Fatalf("the wounded transaction's commit: %+v", r)
	}
	if val, v, _, _ := ReadRecord(db, 1, []byte("a"), Latest); string(val.Value) != "new" || v != 30 {
		t.Fatalf("after the refused commit a = %q@%d, want new@30", val.Value, v)
	}
}

// TestOneEntryPerTransaction: a transaction prepared in a shard that
// already holds an entry of it — taken in from the right shard of a
// merge, or from the parent of a split, or written by an earlier prepare —
// keeps one entry naming every intent, so that its resolve resolves them
// all; and when the shard is the record's, its last participant's commit
// resolves them itself, at the commit version: the commit releases the
// transaction's locks, so an intent left for later would be read past.
func TestOneEntryPerTransaction(t *testing.T) {
	leftDesc := Desc{ShardID: 2, Collection: 1, Partitioning: kv.PartitionRange, End: []byte("g")}
	rightDesc := Desc{ShardID: 3, Collection: 1, Partitioning: kv.PartitionRange, Start: []byte("g")}
	anchor := txn.Anchor{Collection: 1, Key: []byte("a")}
	id := txn.NewID(1, 1)
	meta := txn.Meta{ID: id, Priority: 1, Anchor: anchor}
	prepare := func(key, value string) []byte {
		return EncodeTxnPrepare(&TxnPrepareCmd{Meta: meta, LockTerm: 1, Writes: []Op{{Type: OpPut, Key: []byte(key), Value: []byte(value)}}})
	}
	last := func(minCommit uint64, writes ...Op) []byte {
		return EncodeTxnPrepare(&TxnPrepareCmd{Meta: meta, LockTerm: 1, OnePhase: true, Last: true, MinCommit: minCommit, Participants: []uint64{3}, Writes: writes})
	}
	put := func(key, value string) Op { return Op{Type: OpPut, Key: []byte(key), Value: []byte(value)} }
	type state struct {
		db          *pebble.DB
		left, right *Shard
	}
	apply := func(t *testing.T, st *state, s *Shard, version uint64, cmd []byte) Result {
		t.Helper()
		if version != 0 {
			SetVersion(cmd, version)
		}
		res := applyOne(t, st.db, s, cmd)
		if res.Err != nil {
			t.Fatalf("version %d: %v", version, res.Err)
		}
		return res
	}
	// merged: the transaction prepared "h" in the right shard, which the
	// left one took in.
	merged := func(t *testing.T) *state {
		st := &state{db: memDB(t)}
		var err error
		if st.left, err = Load(st.db, leftDesc); err != nil {
			t.Fatal(err)
		}
		if st.right, err = Load(st.db, rightDesc); err != nil {
			t.Fatal(err)
		}
		apply(t, st, st.right, 20, prepare("h", "vh"))
		f := apply(t, st, st.right, 21, EncodeFreeze(leftDesc.ShardID))
		apply(t, st, st.left, 0, EncodeMergeTrigger(rightDesc, *f.Freeze))
		return st
	}
	// split: the transaction prepared "h" in the whole range; a split
	// gave "h" to the right shard, whose record ("i") it is.
	split := func(t *testing.T) *state {
		st := &state{db: memDB(t)}
		var err error
		whole := leftDesc
		whole.End = nil
		if st.left, err = Load(st.db, whole); err != nil {
			t.Fatal(err)
		}
		apply(t, st, st.left, 20, prepare("h", "vh"))
		apply(t, st, st.left, 0, EncodeSplitTrigger(rightDesc.ShardID, rightDesc.Start, 0))
		if st.right, err = Load(st.db, rightDesc); err != nil {
			t.Fatal(err)
		}
		return st
	}
	want := func(t *testing.T, st *state, s *Shard, key, value string, version uint64) {
		t.Helper()
		val, v, found, err := ReadRecord(st.db, 1, []byte(key), Latest)
		if err != nil || !found || string(val.Value) != value || v != version {
			t.Fatalf("%s = %q@%d (found %v, %v), want %q@%d", key, val.Value, v, found, err, value, version)
		}
		if _, held, err := ReadIntent(st.db, 1, []byte(key)); held || err != nil {
			t.Fatalf("%s still holds an intent (%v)", key, err)
		}
		if s.MayHoldIntent([]byte(key)) {
			t.Fatalf("%s still counted as holding an intent", key)
		}
	}
	noEntry := func(t *testing.T, st *state, s *Shard) {
		t.Helper()
		if s.MinPrepared() != 0 {
			t.Fatalf("shard %d: min prepared %d after the resolve", s.Desc().ShardID, s.MinPrepared())
		}
		err := EachPrepared(st.db, s.Desc().ShardID, func(m txn.Meta, _ uint64, _, _ []txn.Target) error {
			return fmt.Errorf("shard %d still holds %s prepared", s.Desc().ShardID, m.ID)
		})
		if err != nil {
			t.Fatal(err)
		}
	}

	t.Run("merged, then prepared again", func(t *testing.T) {
		st := merged(t)
		apply(t, st, st.left, 30, prepare("b", "vb"))
		apply(t, st, st.left, 40, EncodeTxnResolve(&TxnResolveCmd{ID: id, Commit: true, CommitTS: 35, Keys: []TxnKey{{Key: []byte("b")}}}))
		want(t, st, st.left, "b", "vb", 35)
		want(t, st, st.left, "h", "vh", 35)
		noEntry(t, st, st.left)
	})
	t.Run("merged, then committed last", func(t *testing.T) {
		st := merged(t)
		res := apply(t, st, st.left, 30, last(25, put("a", "va")))
		if res.Txn == nil || res.Txn.Status != txn.Committed {
			t.Fatalf("commit: %+v", res)
		}
		want(t, st, st.left, "a", "va", 30)
		want(t, st, st.left, "h", "vh", 30)
		noEntry(t, st, st.left)
	})
	t.Run("merged, then committed last over its own intent", func(t *testing.T) {
		st := merged(t)
		apply(t, st, st.left, 30, last(25, put("h", "newer")))
		want(t, st, st.left, "h", "newer", 30)
		noEntry(t, st, st.left)
	})
	t.Run("split, then committed last", func(t *testing.T) {
		st := split(t)
		meta.Anchor = txn.Anchor{Collection: 1, Key: []byte("i")}
		defer func() { meta.Anchor = anchor }()
		apply(t, st, st.right, 30, last(25, put("i", "vi")))
		want(t, st, st.right, "i", "vi", 30)
		want(t, st, st.right, "h", "vh", 30)
		noEntry(t, st, st.right)
	})
}

// TestMinPreparedHeldUntilResolveCommitted: a transaction resolved in a
// batch holds the shard's resolved timestamp back (MinPrepared) until the
// batch is committed, even when a prepare later in the same batch adds an
// entry: its commit-timestamp versions are below versions already
// applied, and a watcher that passed them before they are visible would
// never see them.
func TestMinPreparedHeldUntilResolveCommitted(t *testing.T) {
	db := memDB(t)
	s, err := Load(db, Desc{ShardID: 2, Collection: 1, Partitioning: kv.PartitionRange})
	if err != nil {
		t.Fatal(err)
	}
	a, b := txn.NewID(1, 1), txn.NewID(2, 1)
	prepare := func(id, key string) []byte {
		return EncodeTxnPrepare(&TxnPrepareCmd{Meta: txn.Meta{ID: id, Priority: 1}, LockTerm: 1, Writes: []Op{{Type: OpPut, Key: []byte(key), Value: []byte("v")}}})
	}
	if res := applyAt(t, db, s, 20, prepare(a, "a")); res.Err != nil {
		t.Fatal(res.Err)
	}
	applyAt(t, db, s, 25, EncodeWrite([]Op{{Type: OpPut, Key: []byte("z"), Value: []byte("z")}}))

	batch := db.NewIndexedBatch()
	defer batch.Close()
	index, _ := s.Applied()
	for i, c := range []struct {
		version uint64
		cmd     []byte
	}{
		{30, EncodeTxnResolve(&TxnResolveCmd{ID: a, Commit: true, CommitTS: 22, Keys: []TxnKey{{Key: []byte("a")}}})},
		{31, prepare(b, "b")},
	} {
		SetVersion(c.cmd, c.version)
		if res, err := s.Apply(batch, index+1+uint64(i), 1, c.cmd); err != nil || res.Err != nil {
			t.Fatalf("command %d: %v %v", i, err, res.Err)
		}
	}
	if err := s.FinishBatch(batch); err != nil {
		t.Fatal(err)
	}
	if m := s.MinPrepared(); m == 0 || m > 20 {
		t.Fatalf("before the batch is committed: min prepared %d, want a's prepare version 20 (its resolved write at 22 is not visible yet)", m)
	}
	if err := batch.Commit(pebble.Sync); err != nil {
		t.Fatal(err)
	}
	s.Committed()
	if m := s.MinPrepared(); m != 31 {
		t.Fatalf("after the batch is committed: min prepared %d, want b's prepare version 31", m)
	}
}
