package shard

import (
	"errors"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/txn"
)

// TestResolvedIntentsStayGone: the intents and prepared entries a resolve
// removes stay removed once Pebble flushes and compacts them — however
// often their transaction was prepared, across reloads of the shard. A
// resolve removes what a prepare it applied itself set with a single
// deletion (deleteOnce), which would bring an older value back were the
// key set twice since its last deletion.
func TestResolvedIntentsStayGone(t *testing.T) {
	desc := Desc{ShardID: 2, Collection: 1, Partitioning: kv.PartitionRange}
	t1, t2 := txn.NewID(1, 1), txn.NewID(2, 1)
	type step struct {
		cmd    []byte
		reload bool // Load the shard anew before the command
		// again, with no command: every intent and prepared entry is set
		// again as it is, as a snapshot restored over them would set them
		again bool
	}
	prepare := func(id string, keys ...string) step {
		p := &TxnPrepareCmd{Meta: txn.Meta{ID: id, Priority: 1}, LockTerm: 1}
		for _, k := range keys {
			p.Writes = append(p.Writes, Op{Type: OpPut, Key: []byte(k), Value: []byte(id + k)})
		}
		return step{cmd: EncodeTxnPrepare(p)}
	}
	resolve := func(id string, commit bool) step {
		return step{cmd: EncodeTxnResolve(&TxnResolveCmd{ID: id, Commit: commit, CommitTS: 1000})}
	}
	reloaded := func(s step) step { s.reload = true; return s }
	setAgain := step{again: true}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"prepared once", []step{prepare(t1, "a", "b"), resolve(t1, true)}},
		{"prepared twice", []step{prepare(t1, "a", "b"), prepare(t1, "a", "b"), resolve(t1, true)}},
		{"prepared twice, aborted", []step{prepare(t1, "a", "b"), prepare(t1, "a", "b"), resolve(t1, false)}},
		{"prepared again with another key", []step{prepare(t1, "a"), prepare(t1, "a", "b"), resolve(t1, true)}},
		{"prepared again after a reload", []step{prepare(t1, "a", "b"), reloaded(prepare(t1, "a", "b")), resolve(t1, true)}},
		{"resolved after a reload", []step{prepare(t1, "a", "b"), prepare(t1, "a"), reloaded(resolve(t1, true))}},
		{"set again in storage", []step{prepare(t1, "a", "b"), setAgain, reloaded(resolve(t1, true))}},
		{"one transaction after another", []step{prepare(t1, "a", "b"), resolve(t1, true), prepare(t2, "a", "b"), prepare(t2, "b"), resolve(t2, false)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := memDB(t)
			s, err := Load(db, desc)
			if err != nil {
				t.Fatal(err)
			}
			for i, st := range tc.steps {
				if st.again {
					setAllAgain(t, db)
					continue
				}
				if st.reload {
					if s, err = Load(db, desc); err != nil {
						t.Fatal(err)
					}
				}
				SetVersion(st.cmd, uint64(10*(i+1)))
				if res := applyOne(t, db, s, st.cmd); res.Err != nil {
					t.Fatalf("step %d: %v", i, res.Err)
				}
			}
			if err := db.Flush(); err != nil {
				t.Fatal(err)
			}
			if err := db.Compact(t.Context(), []byte{0}, []byte{0xff, 0xff, 0xff, 0xff}, true); err != nil {
				t.Fatal(err)
			}
			if err := Intents(db, 1, nil, nil, func(key []byte, in txn.Intent) error {
				t.Errorf("key %q holds an intent of %s after its resolve", key, in.Meta.ID)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if err := EachPrepared(db, desc.ShardID, func(m txn.Meta, _ uint64, _, _ []txn.Target) error {
				t.Errorf("%s is still prepared after its resolve", m.ID)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		})
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
