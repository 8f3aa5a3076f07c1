package node

import (
	"bytes"
	"context"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/replication"
	"github.com/groupkv/groupkv/internal/shard"
	"github.com/groupkv/groupkv/internal/storage"
)

// Splits (see internal/shard/split.go): SplitShard changes the catalog;
// the parent's leader (conformShards → splitPending) proposes the split to
// the parent's log; every replica applying it creates the child replica
// (onSplit), whose group then elects a leader on its own.

// SplitShard splits a shard of collection name: of a range collection, the
// shard holding key, at key; of a hash or tag collection, shard shardID,
// in the middle of its buckets. It answers once the new shard serves.
func (n *Node) SplitShard(ctx context.Context, name string, key []byte, shardID uint64) (kv.CollectionInfo, error) {
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return kv.CollectionInfo{}, err
	}
	defer done()
	d, err := n.collection(name)
	if err != nil {
		return kv.CollectionInfo{}, err
	}
	if d.Partitioning == kv.PartitionRange {
		if err := kv.ValidateKey(key); err != nil {
			return kv.CollectionInfo{}, err
		}
		_, i := d.Route(key, "")
		shardID = d.Shards[i].ID
	} else if shardID == 0 {
		return kv.CollectionInfo{}, kv.Errorf(kv.CodeInvalidArgument, "name the shard of %s collection %q to split", d.Partitioning, name)
	}
	if ref, ok := n.shardRef(shardID); ok {
		// A shard taking in a merged neighbour splits once the merge is
		// through (its replicas' span is the catalog's again).
		if resp, err := n.leaderConf(ctx, shardID); err == nil && (resp.Desc == nil || !sameSpan(*resp.Desc, ref)) {
			return kv.CollectionInfo{}, kv.Errorf(kv.CodeConditionFailed, "shard %d of %q has a split or merge in progress; retry once it finished", shardID, name)
		} else if err == nil && resp.Groups {
			return kv.CollectionInfo{}, kv.Errorf(kv.CodeConditionFailed, "shard %d of %q leads a key group or holds keys of one; it splits once they are deleted", shardID, name)
		}
	}
	res, err := n.propose(ctx, cluster.MetaShardID, shard.EncodeSplitShard(name, shardID, key, 0))
	if err == nil && res.Err != nil {
		err = res.Err
	}
	if err != nil {
		return kv.CollectionInfo{}, err
	}
	var child uint64
	for _, s := range res.Desc.Shards {
		if s.SplitFrom == shardID && s.ID > child {
			child = s.ID
		}
	}
	for {
		n.mu.RLock()
		_, known := n.mu.shards[child]
		n.mu.RUnlock()
		if known {
			break
		}
		select {
		case <-ctx.Done():
			return kv.CollectionInfo{}, kv.Errorf(kv.CodeUnavailable, "the split of shard %d has not reached node %d: %v", shardID, n.id, ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
	if n.host.Ready(shardID) {
		// Leading the parent here, split it now rather than at the next
		// round of conformShards: until the parent applies the split,
		// what the catalog places in the new shard (records of
		// transactions among it) is read by waiting for it.
		if err := n.splitPending(shardID); err != nil {
			n.log.Debug("splitting a shard at once failed; the next round retries", "shard", shardID, "err", err)
		}
	}
	for {
		var err error
		if n.hasReplica(child) {
			err = n.readBarrier(ctx, child)
		} else {
			err = n.waitRemoteShard(ctx, child)
		}
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return kv.CollectionInfo{}, err
		}
		time.Sleep(10 * time.Millisecond)
	}
	d, err = n.collection(name)
	if err != nil {
		return kv.CollectionInfo{}, err
	}
	return d.Info(n.leaderNode(d)), nil
}

// splitLoop splits, on the leaders here, range shards that grew past
// Options.SplitBytes.
// It also merges, there, adjacent range shards that shrank below
// Options.MergeBytes together (merge.go).
func (n *Node) splitLoop() {
	defer n.bg.Done()
	if n.opts.SplitBytes < 0 && n.opts.MergeBytes <= 0 {
		return
	}
	n.every(n.opts.SplitCheckInterval, func() {
		if n.opts.SplitBytes >= 0 {
			n.autoSplit()
		}
		if n.opts.MergeBytes > 0 {
			n.autoMerge()
		}
	})
}

func (n *Node) autoSplit() {
	n.mu.RLock()
	type cand struct {
		id   uint64
		name string
	}
	var cands []cand
	for id, r := range n.mu.replicas {
		if ref, ok := n.mu.shards[id]; ok && (r.Desc.Partitioning == kv.PartitionRange || r.Desc.Partitioning == kv.PartitionHash) {
			cands = append(cands, cand{id, ref.coll.Name})
		}
	}
	n.mu.RUnlock()
	for _, c := range cands {
		if !n.host.Ready(c.id) {
			continue
		}
		desc, ok := n.host.Desc(c.id)
		if !ok {
			continue
		}
		size, err := n.shardSize(desc)
		if err != nil || size < n.opts.SplitBytes {
			continue
		}
		var key []byte
		var id uint64
		if desc.Partitioning == kv.PartitionHash {
			// A hash shard splits its span of buckets in the middle.
			if desc.BucketEnd-desc.BucketStart < 2 {
				continue
			}
			id = c.id
		} else {
			key, err = shard.MiddleKey(n.eng.DB, desc)
			if err != nil || key == nil || bytes.Equal(key, desc.Start) {
				continue
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err = n.SplitShard(ctx, c.name, key, id)
		cancel()
		if err != nil {
			n.log.Warn("splitting a shard that grew past the split size failed", "shard", c.id, "bytes", size, "err", err)
		} else {
			n.log.Info("split a shard that grew past the split size", "shard", c.id, "bytes", size, "at", string(key))
		}
	}
}

// shardSize estimates the bytes on disk of the replica of desc here. A
// range shard's keys are one span; a hash shard's are spread over its
// collection's key space (keys are stored in key order, whatever their
// bucket), so it is the collection's usage here shared out by bucket span
// among the collection's replicas here.
func (n *Node) shardSize(desc shard.Desc) (int64, error) {
	if desc.Partitioning != kv.PartitionHash {
		start, end := desc.Span()
		size, err := n.eng.DB.EstimateDiskUsage(start, end)
		return int64(size), err
	}
	start, end := storage.CollectionSpan(desc.Collection)
	total, err := n.eng.DB.EstimateDiskUsage(start, end)
	if err != nil {
		return 0, err
	}
	var buckets uint64
	for _, id := range n.localShardsOf(desc.Collection) {
		if d, ok := n.host.Desc(id); ok {
			buckets += uint64(d.BucketEnd - d.BucketStart)
		}
	}
	if buckets == 0 {
		return 0, nil
	}
	return int64(total * uint64(desc.BucketEnd-desc.BucketStart) / buckets), nil
}

// awaitSplitChild reports whether child, a shard this node's catalog has
// and its replicas do not, is a split child of a parent held here that
// appears here soon: the split is in the parent's log, and applying it
// creates the child. It waits a few election timeouts at most.
func (n *Node) awaitSplitChild(ctx context.Context, child uint64) bool {
	n.mu.RLock()
	ref, ok := n.mu.shards[child]
	var parent uint64
	if ok {
		parent = ref.coll.Shards[ref.index].SplitFrom
	}
	n.mu.RUnlock()
	if parent == 0 || !n.hasReplica(parent) {
		return false
	}
	deadline := time.Now().Add(n.retryWindow())
	for !n.hasReplica(child) {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		// The parent's barrier applies everything committed so far,
		// the split among it once its leader proposed it.
		_ = n.readBarrier(ctx, parent)
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// splitPending proposes, on the leader of shard id, the split the catalog
// holds and the shard's replicas have not applied yet.
func (n *Node) splitPending(id uint64) error {
	n.mu.RLock()
	lr, ok := n.mu.replicas[id]
	ref, inCatalog := n.mu.shards[id]
	var child *cluster.ShardDesc
	if ok && inCatalog {
		cat := ref.coll.Shards[ref.index]
		for i := range ref.coll.Shards {
			c := &ref.coll.Shards[i]
			if c.SplitFrom != id {
				continue
			}
			if ref.coll.Partitioning == kv.PartitionRange {
				if bytes.Equal(c.Start, cat.End) && !bytes.Equal(lr.Desc.End, cat.End) {
					child = c
				}
			} else if c.BucketStart == cat.BucketEnd && lr.Desc.BucketEnd != cat.BucketEnd {
				child = c
			}
		}
	}
	n.mu.RUnlock()
	if child == nil {
		return nil
	}
	if _, exists := n.host.ConfState(child.ID); exists {
		return nil // applied here; the record catches up in onSplit
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	res, err := n.host.Propose(ctx, id, shard.EncodeSplitTrigger(child.ID, child.Start, child.BucketStart))
	if err == nil && res.Err != nil {
		err = res.Err
	}
	if err == nil {
		n.log.Info("split a shard", "shard", id, "new_shard", child.ID)
	}
	return err
}

// onSplit runs in the raft loop after a split of parent was applied here:
// it records and starts the child replica, from the state the split wrote.
func (n *Node) onSplit(parent uint64, sr *shard.SplitResult) {
	n.mu.RLock()
	lr, ok := n.mu.replicas[parent]
	campaign := false
	if ref, found := n.mu.shards[sr.Child.ShardID]; found {
		rs := ref.coll.Shards[ref.index].Replicas
		campaign = len(rs) > 1 && rs[0].Node == n.id
	}
	n.mu.RUnlock()
	if lt := n.lockTable(parent); lt != nil {
		// The parent's leader: the transactions holding locks here on keys
		// now the child's hold nothing there; they lose their locks here
		// (those not prepared: a prepared one is the child's too, and
		// its locks go with its resolves) and retry.
		if dropped := lt.DropUnprepared(); dropped > 0 {
			n.log.Debug("a split dropped the locks of unprepared transactions", "shard", parent, "transactions", dropped)
		}
		if d, ok := n.host.Desc(parent); ok {
			n.setLockSpan(parent, d)
		}
	}
	if !ok {
		return
	}
	child := localReplica{ReplicaID: lr.ReplicaID, Desc: sr.Child}
	narrowed := lr
	if lr.Desc.Partitioning == kv.PartitionRange {
		narrowed.Desc.End = sr.Child.Start
	} else {
		narrowed.Desc.BucketEnd = sr.Child.BucketStart
	}
	b := n.eng.DB.NewBatch()
	defer b.Close()
	if err := n.writeReplica(b, narrowed); err != nil {
		n.log.Error("recording a split failed", "shard", parent, "err", err)
		return
	}
	if err := n.eng.Commit(b, pebble.Sync); err != nil {
		n.log.Error("recording a split failed", "shard", parent, "err", err)
		return
	}
	n.mu.Lock()
	n.mu.replicas[parent] = narrowed
	now := time.Now()
	n.mu.splitAt[parent], n.mu.splitAt[child.Desc.ShardID] = now, now
	n.mu.Unlock()
	if sr.Existing {
		// A replica of the child was placed here, empty, before this
		// parent replica applied the split: it is filled by a snapshot.
		return
	}
	if err := n.startChild(child, campaign); err != nil {
		n.log.Error("starting a split shard failed", "shard", child.Desc.ShardID, "err", err)
	}
}

// startChild records and starts the replica of a split's child whose raft
// and shard state the split wrote here, unless it already runs. The split
// applied in the parent (onSplit) and reconcile, when it meets that state,
// both call it; childMu makes one of them start it.
func (n *Node) startChild(child localReplica, campaign bool) error {
	n.childMu.Lock()
	defer n.childMu.Unlock()
	if _, running := n.host.Desc(child.Desc.ShardID); !running {
		b := n.eng.DB.NewBatch()
		defer b.Close()
		if err := n.writeReplica(b, child); err != nil {
			return err
		}
		if err := n.eng.Commit(b, pebble.Sync); err != nil {
			return err
		}
		if err := n.host.AddGroupWith(child.Desc, child.ReplicaID, replication.GroupOptions{Campaign: campaign}); err != nil {
			return err
		}
	}
	n.mu.Lock()
	if _, ok := n.mu.replicas[child.Desc.ShardID]; !ok {
		n.mu.replicas[child.Desc.ShardID] = child
	}
	n.mu.Unlock()
	return nil
}
