package shard

import (
	"testing"

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
	// Versions 10, 20, ... in the order the steps are written.
	var version uint64
	next := func(cmd []byte) txnStep {
		version += 10
		return txnStep{version: version, cmd: cmd}
	}
	prepare := func(id string, keys ...string) txnStep {
		p := &TxnPrepareCmd{Meta: txn.Meta{ID: id, Priority: 1}, LockTerm: 1}
		for _, k := range keys {
			p.Writes = append(p.Writes, Op{Type: OpPut, Key: []byte(k), Value: []byte(id + k)})
		}
		return next(EncodeTxnPrepare(p))
	}
	resolve := func(id string, commit bool) txnStep {
		return next(EncodeTxnResolve(&TxnResolveCmd{ID: id, Commit: commit, CommitTS: 1000}))
	}
	reloaded := func(s txnStep) txnStep { s.reload = true; return s }
	setAgain := txnStep{setAgain: true}
	for _, tc := range []struct {
		name  string
		steps []txnStep
	}{
		{"prepared once", []txnStep{prepare(t1, "a", "b"), resolve(t1, true)}},
		{"prepared twice", []txnStep{prepare(t1, "a", "b"), prepare(t1, "a", "b"), resolve(t1, true)}},
		{"prepared twice, aborted", []txnStep{prepare(t1, "a", "b"), prepare(t1, "a", "b"), resolve(t1, false)}},
		{"prepared again with another key", []txnStep{prepare(t1, "a"), prepare(t1, "a", "b"), resolve(t1, true)}},
		{"prepared again after a reload", []txnStep{prepare(t1, "a", "b"), reloaded(prepare(t1, "a", "b")), resolve(t1, true)}},
		{"resolved after a reload", []txnStep{prepare(t1, "a", "b"), prepare(t1, "a"), reloaded(resolve(t1, true))}},
		{"set again in storage", []txnStep{prepare(t1, "a", "b"), setAgain, reloaded(resolve(t1, true))}},
		{"one transaction after another", []txnStep{prepare(t1, "a", "b"), resolve(t1, true), prepare(t2, "a", "b"), prepare(t2, "b"), resolve(t2, false)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := memDB(t)
			runTxnSteps(t, db, desc, tc.steps)
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
