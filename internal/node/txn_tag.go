package node

import (
	"bytes"
	"context"
	"slices"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/shard"
	"github.com/groupkv/groupkv/internal/txn"
)

// Transactions over tag collections.
//
// A record of a tag collection lives in the shard of its placement tag,
// which the key's home shard records (placement.go). A transaction reads
// or writes such a key in two places:
//
//   - its home shard, where it locks the key — shared to read, exclusive to
//     write — before it reads the placement: a plain put that places or
//     moves the key locks it there too for its KindPlace (plainLocks), so
//     the placement does not change under the transaction. The lock is
//     part of the transaction's read set there, so a new leader restores
//     it from the prepare.
//   - the shard of the placement, where it locks and reads the record, and
//     where its write becomes an intent, as in any collection.
//
// A put that places a key not placed yet (or placed, but deleted), or that
// would move it, proposes the new placement in the home shard while the
// transaction holds the key there (shard.Placement.Txn); should the
// transaction abort, the placement stays, naming no live record, as after
// a delete. A put that changes the placement tag of a live record is
// refused (placement_tag_changed), as a plain put is: delete the record in
// one transaction and put it in another.

// tagHomeLock locks key of tag collection d in its home shard (exclusive
// for a write) and reads its placement after the grant. With read, the
// lock also confirms that the attempt is not aborted (as every read does)
// and returns the home shard's response.
func (s *txnSession) tagHomeLock(ctx context.Context, d *cluster.CollectionDesc, key []byte, mode txn.Mode) (tag string, placed bool, home uint64, resp *txnLockResponse, err error) {
	hb, home := homeOf(d, key)
	s.setAnchor(d, hb, key)
	t := txn.Target{Collection: d.ID, Key: append([]byte{}, key...)}
	resp, err = s.lock(ctx, home, []txn.Target{t}, mode, mode == txn.Shared)
	if err != nil {
		return "", false, 0, nil, s.fail(ctx, err)
	}
	if mode == txn.Exclusive {
		// Restored as a shared lock if the home shard's leader changes
		// after the prepare: that still keeps plain puts from moving the
		// key.
		p := s.part(home)
		if !slices.ContainsFunc(p.reads, func(u txn.Target) bool {
			return !u.IsSpan && u.Collection == t.Collection && bytes.Equal(u.Key, t.Key)
		}) {
			p.reads = append(p.reads, t)
		}
	}
	tag, placed, err = s.n.placementOf(ctx, d, key)
	if err != nil {
		return "", false, 0, nil, err
	}
	return tag, placed, home, resp, nil
}

// tagGet reads key of tag collection d under the attempt's locks.
func (s *txnSession) tagGet(ctx context.Context, d *cluster.CollectionDesc, key []byte, mode txn.Mode) (kv.Record, bool, error) {
	tag, placed, home, resp, err := s.tagHomeLock(ctx, d, key, mode)
	if err != nil {
		return kv.Record{}, false, err
	}
	if !placed {
		return kv.Record{}, false, nil // never put: the home lock keeps it so
	}
	_, i := d.Route(key, tag)
	// An exclusive home lock reads nothing (tagHomeLock): the record's
	// shard is read under its own lock even when it is the home shard.
	if id := d.Shards[i].ID; id != home || mode == txn.Exclusive {
		if resp, err = s.lock(ctx, id, []txn.Target{{Collection: d.ID, Key: key}}, mode, true); err != nil {
			return kv.Record{}, false, s.fail(ctx, err)
		}
	}
	r := resp.Records[0]
	if !r.Found {
		return kv.Record{}, false, nil
	}
	return kv.Record{Key: key, Value: r.Value, Tags: r.Tags, Version: r.Version}, true, nil
}

// tagWriteTarget locks key of tag collection d for a write — the home
// shard's lock first, then the record's — and returns the bucket and shard
// the write goes to. A delete of a key never placed goes nowhere (shard 0):
// there is nothing to delete. A put places or moves the key as needed.
func (s *txnSession) tagWriteTarget(ctx context.Context, d *cluster.CollectionDesc, key []byte, w *bufferedWrite) (uint16, uint64, error) {
	n := s.n
	cur, placed, home, _, err := s.tagHomeLock(ctx, d, key, txn.Exclusive)
	if err != nil {
		return 0, 0, err
	}
	lockRecord := func(id uint64) error {
		if _, err := s.lock(ctx, id, []txn.Target{{Collection: d.ID, Key: key}}, txn.Exclusive, false); err != nil {
			return s.fail(ctx, err)
		}
		return nil
	}
	if w.delete {
		if !placed {
			return 0, 0, nil
		}
		bucket, i := d.Route(key, cur)
		return bucket, d.Shards[i].ID, lockRecord(d.Shards[i].ID)
	}
	want := ""
	if len(w.tags) > 0 {
		want = w.tags[0]
	}
	bucket, i := d.Route(key, want)
	if placed && cur == want {
		return bucket, d.Shards[i].ID, lockRecord(d.Shards[i].ID)
	}
	if placed {
		// Another placement: only a record that is not live may move.
		_, j := d.Route(key, cur)
		resp, err := s.lock(ctx, d.Shards[j].ID, []txn.Target{{Collection: d.ID, Key: key}}, txn.Shared, true)
		if err != nil {
			return 0, 0, s.fail(ctx, err)
		}
		if resp.Records[0].Found {
			return 0, 0, kv.Errorf(kv.CodePlacementTagChanged,
				"key %q is placed by tag %q; a put must keep it as the first tag until the key is deleted (in an earlier transaction)", key, cur)
		}
	}
	hb, _ := homeOf(d, key)
	res, err := n.propose(ctx, home, shard.EncodePlace(shard.Placement{Bucket: hb, Key: key, HasOld: placed, Old: cur, New: want, Txn: s.meta.ID}))
	if err == nil && res.Err != nil {
		err = res.Err
	}
	if kv.CodeOf(err) == kv.CodeConditionFailed {
		// Under the attempt's exclusive lock only a lock it lost lets the
		// placement change.
		err = kv.Errorf(kv.CodeTxnAborted, "transaction %s: the placement of %q changed under its lock: %v", s.meta.ID, key, err)
	}
	if err != nil {
		return 0, 0, s.fail(ctx, err)
	}
	return bucket, d.Shards[i].ID, lockRecord(d.Shards[i].ID)
}
