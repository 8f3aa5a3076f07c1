package node

import (
	"bytes"
	"context"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/shard"
	"github.com/groupkv/groupkv/internal/txn"
)

// Plain reads meeting intents. An intent is the write of a prepared
// transaction; whether it is visible depends on the transaction's record:
//
//   - COMMITTED: visible to reads of the latest state and at or above its
//     commit timestamp — the read resolves it first, then reads;
//   - ABORTED: never visible — the read resolves it away first;
//   - PENDING: invisible to reads of the latest state (the commit point
//     is still to come); a read at a version at or above the prepare
//     version waits until the record is decided (or its owner expired),
//     since the commit timestamp may fall below the read's version.

// settleIntents makes the intents of collection coll in [start, end) (nil
// end: unbounded) held in the local replicas of shards safe to read past
// at asOf (shard.Latest: the latest state).
func (n *Node) settleIntents(ctx context.Context, shards []uint64, coll uint32, start, end []byte, asOf uint64) error {
	point := oneKey(start, end)
	any := false
	for _, id := range shards {
		// A point read looks only where the shard may hold an intent on
		// its key.
		if n.host.MinPrepared(id) != 0 && (!point || n.host.MayHoldIntent(id, start)) {
			any = true
			break
		}
	}
	if !any {
		return nil
	}
	type found struct {
		key []byte
		in  txn.Intent
	}
	var intents []found
	err := shard.Intents(n.eng.DB, coll, start, end, func(key []byte, in txn.Intent) error {
		intents = append(intents, found{key, in})
		return nil
	})
	if err != nil {
		return kv.Errorf(kv.CodeInternal, "reading intents: %v", err)
	}
	for _, f := range intents {
		if err := n.settleIntent(ctx, shards, coll, f.key, f.in, asOf); err != nil {
			return err
		}
	}
	return nil
}

func (n *Node) settleIntent(ctx context.Context, shards []uint64, coll uint32, key []byte, in txn.Intent, asOf uint64) error {
	owner := func() uint64 {
		for _, id := range n.liveShards(shards) {
			if d, ok := n.host.Desc(id); ok && d.Collection == coll && d.Owns(in.Bucket, key) {
				return id
			}
		}
		return 0
	}
	if owner() == 0 {
		return nil // another shard's, not read here
	}
	deadline := time.Now().Add(n.retryWindow() + 8*clusterInterval)
	for attempt := 0; ; attempt++ {
		rec, err := n.settleRecord(ctx, &in.Meta)
		if err != nil {
			return err
		}
		if rec.Status != txn.Pending {
			id := owner()
			if id == 0 {
				return kv.Errorf(kv.CodeUnavailable, "key %q left the shards read here while its intent was settled; retry", key)
			}
			res, err := n.propose(ctx, id, shard.EncodeTxnResolve(&shard.TxnResolveCmd{ID: in.Meta.ID,
				Commit: rec.Status == txn.Committed, CommitTS: rec.CommitTS, Keys: []shard.TxnKey{{Bucket: in.Bucket, Key: key}}}))
			if err == nil && res.Err != nil {
				err = res.Err
			}
			if err != nil && n.frozenInto(id) != 0 {
				// Frozen for a merge, the shard refuses resolves until
				// the shard taking it in applied the merge: then resolve
				// there.
				if berr := backoff(ctx, attempt, deadline, err); berr != nil {
					return berr
				}
				continue
			}
			if err != nil {
				return err
			}
			// Read after the resolve: the local replica must have
			// applied it.
			return n.readBarrier(ctx, id)
		}
		if asOf == shard.Latest || in.PrepareVersion > asOf {
			return nil
		}
		select {
		case <-ctx.Done():
			return kv.Errorf(kv.CodeUnavailable, "waiting for transaction %s, prepared on key %q: %v", in.Meta.ID, key, ctx.Err())
		case <-time.After(n.opts.TxnCheckInterval / 4):
		}
	}
}

// keyEnd returns the smallest key after key.
func keyEnd(key []byte) []byte {
	return append(append([]byte{}, key...), 0)
}

// oneKey reports whether the span [start, end) holds one key, start (end
// is keyEnd(start)).
func oneKey(start, end []byte) bool {
	return len(end) == len(start)+1 && end[len(start)] == 0 && bytes.HasPrefix(end, start)
}
