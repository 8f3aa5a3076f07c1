package shard

import (
	"bytes"
	"fmt"
	"reflect"
	"sort"
	"testing"

	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/storage"
	"github.com/groupkv/groupkv/internal/txn"
)

// TestSweepTxnRecords: one pass over the records of a collection answers,
// for each of several shards, the records it owns that are due for removal
// and those nobody marked, in key order, each list cut at its limit —
// checked against the records written, sorted and filtered here, over
// random records and limits (the seed is printed on failure).
func TestSweepTxnRecords(t *testing.T) {
	rng, seed := seededRand(t, 1)
	db := memDB(t)
	const coll = 7
	ds := []Desc{
		{ShardID: 11, Collection: coll, Partitioning: kv.PartitionHash, BucketStart: 0, BucketEnd: 100},
		{ShardID: 12, Collection: coll, Partitioning: kv.PartitionHash, BucketStart: 100, BucketEnd: 200},
		{ShardID: 13, Collection: coll, Partitioning: kv.PartitionHash, BucketStart: 200, BucketEnd: 300},
	}
	const now, committedBefore, abortedBefore = 1000, 500, 700
	type written struct {
		key    []byte // its storage key
		ref    TxnRecordRef
		rec    txn.Record
		shard  int
		due    bool
		unmark bool
	}
	var all []written
	b := db.NewBatch()
	for i := range 400 {
		bucket := uint16(rng.IntN(300))
		key := []byte(fmt.Sprintf("k%d", rng.IntN(1000)))
		id := fmt.Sprintf("t%d", i)
		var rec txn.Record
		w := written{shard: int(bucket) / 100}
		switch rng.IntN(6) {
		case 0: // marked, due
			rec = txn.Record{Status: txn.Committed, CommitTS: uint64(rng.IntN(1000) + 1), ForgetAfter: uint64(rng.IntN(now) + 1)}
			w.due = true
		case 1: // marked, not yet due
			rec = txn.Record{Status: txn.Aborted, ForgetAfter: now + uint64(rng.IntN(100)+1)}
		case 2: // committed, listed, nobody marked it, long ago
			rec = txn.Record{Status: txn.Committed, CommitTS: uint64(rng.IntN(committedBefore-1) + 1), Listed: true, Participants: []uint64{11, 13}}
			w.unmark = true
		case 3: // committed recently, or not listed
			rec = txn.Record{Status: txn.Committed, CommitTS: committedBefore + uint64(rng.IntN(100)), Listed: rng.IntN(2) == 0}
			if !rec.Listed {
				rec.CommitTS = uint64(rng.IntN(committedBefore-1) + 1)
			}
		case 4: // aborted long ago, nobody marked it
			rec = txn.Record{Status: txn.Aborted, AbortedAt: uint64(rng.IntN(abortedBefore-1) + 1)}
			w.unmark = true
		default: // pending
			rec = txn.Record{Status: txn.Pending, Heartbeat: uint64(rng.IntN(1000))}
		}
		w.key = storage.TxnRecordKey(coll, key, id)
		w.ref = TxnRecordRef{ID: id, Anchor: txn.Anchor{Collection: coll, Bucket: bucket, Key: key}}
		w.rec = rec
		if err := b.Set(w.key, txn.EncodeRecord(rec, bucket), nil); err != nil {
			t.Fatal(err)
		}
		all = append(all, w)
	}
	// Another collection's records are not read.
	if err := b.Set(storage.TxnRecordKey(coll+1, []byte("k"), "other"), txn.EncodeRecord(txn.Record{Status: txn.Committed, ForgetAfter: 1}, 5), nil); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(nil); err != nil {
		t.Fatal(err)
	}
	sort.Slice(all, func(i, j int) bool { return bytes.Compare(all[i].key, all[j].key) < 0 })

	for _, limits := range [][2]int{{1000, 1000}, {3, 2}, {0, 4}, {5, 0}, {0, 0}} {
		dueLimit, unmarkedLimit := limits[0], limits[1]
		got, err := SweepTxnRecords(db, ds, now, committedBefore, abortedBefore, dueLimit, unmarkedLimit)
		if err != nil {
			t.Fatal(err)
		}
		for i := range ds {
			var want TxnRecordSweep
			for _, w := range all {
				if w.shard != i {
					continue
				}
				if w.due && len(want.Due) < dueLimit {
					want.Due = append(want.Due, w.ref)
				}
				if w.unmark && len(want.Unmarked) < unmarkedLimit {
					want.Unmarked = append(want.Unmarked, UnmarkedTxnRecord{Ref: w.ref, Status: w.rec.Status, CommitTS: w.rec.CommitTS, Participants: w.rec.Participants})
				}
			}
			if !reflect.DeepEqual(got[i], want) {
				t.Fatalf("seed %d, limits %d/%d, shard %d: swept\n%+v\nwant\n%+v", seed, dueLimit, unmarkedLimit, ds[i].ShardID, got[i], want)
			}
			// The one-shard forms answer the same.
			due, err := DueTxnRecords(db, ds[i], now, dueLimit)
			if err != nil {
				t.Fatal(err)
			}
			unmarked, err := UnmarkedTxnRecords(db, ds[i], committedBefore, abortedBefore, unmarkedLimit)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(due, want.Due) || !reflect.DeepEqual(unmarked, want.Unmarked) {
				t.Fatalf("seed %d, limits %d/%d, shard %d: one-shard forms answer %+v and %+v", seed, dueLimit, unmarkedLimit, ds[i].ShardID, due, unmarked)
			}
		}
	}
	if _, err := SweepTxnRecords(db, []Desc{ds[0], {ShardID: 20, Collection: coll + 1, Partitioning: kv.PartitionHash, BucketEnd: 10}}, now, 0, 0, 10, 10); err == nil {
		t.Fatal("shards of two collections swept at once")
	}
	if got, err := SweepTxnRecords(db, []Desc{MetaDesc}, now, committedBefore, abortedBefore, 10, 10); err != nil || len(got) != 1 || got[0].Due != nil || got[0].Unmarked != nil {
		t.Fatalf("the meta shard swept %+v, %v; want nothing", got, err)
	}
}
