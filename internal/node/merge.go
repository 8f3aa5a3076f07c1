package node

import (
	"bytes"
	"context"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/shard"
	"github.com/groupkv/groupkv/internal/storage"
	"github.com/groupkv/groupkv/internal/txn"
)

// Merges (see internal/shard/merge.go): MergeShards changes the catalog
// (the left shard takes its right neighbour's span; the right one moves to
// CollectionDesc.Merged); then, from conformShards on the shards' leaders
// (mergePending):
//
//  1. the right shard's leader proposes the freeze to the right shard's
//     log; every replica applying it persists the frozen state, and the
//     right shard refuses writes from then on (unavailable: retry);
//  2. the left shard's leader asks the node of every replica of the left
//     group — the catalog's and every member of its configuration — for
//     its right replica's frozen state (each answers only once that state
//     is durable) and, once every one has it, proposes the merge trigger
//     to the left shard's log, carrying that state;
//  3. every replica applying the trigger widens the left shard and, in the
//     same batch, loses its right replica (raft state, shard state and
//     this node's record of it); onMerge updates this node's maps.
//
// Step 2 is why the trigger's Apply needs nothing but the command: the
// right records it takes over are in every replica's Pebble before the
// trigger is even proposed, and they stay there (a frozen shard changes
// nothing, and only the trigger removes the replica). A replica that
// skips the trigger — its log truncated past it, it gets a snapshot of the
// merged left shard instead — drops its frozen right replica in
// dropCovered.
//
// Requests racing a merge: a write the frozen right shard refuses is
// routed again (writeRouted) until the left shard applied the trigger
// here; a linearizable get of a frozen shard's key first applies what the
// left shard committed (Get); snapshot reads fence every local shard of
// the collection anyway; and a shard this node's catalog still names but
// whose replica a merge removed is read through the shard that took it in
// (liveShards, localOwner).

// MergeShards merges shard left of collection name with its right
// neighbour, into left. It answers, with the collection's description,
// once the merged shard serves.
func (n *Node) MergeShards(ctx context.Context, name string, left uint64) (kv.CollectionInfo, error) {
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return kv.CollectionInfo{}, err
	}
	defer done()
	d, err := n.collection(name)
	if err != nil {
		return kv.CollectionInfo{}, err
	}
	if left == 0 {
		return kv.CollectionInfo{}, kv.Errorf(kv.CodeInvalidArgument, "name the shard of %q to merge with its right neighbour", name)
	}
	at := -1
	for i, s := range d.Shards {
		if s.ID == left {
			at = i
		}
	}
	switch {
	case at < 0:
		return kv.CollectionInfo{}, kv.Errorf(kv.CodeInvalidArgument, "collection %q has no shard %d", name, left)
	case at == len(d.Shards)-1:
		return kv.CollectionInfo{}, kv.Errorf(kv.CodeInvalidArgument, "shard %d is the last shard of %q: it has no right neighbour to merge with", left, name)
	}
	right := d.Shards[at+1]
	if err := n.checkMergeable(ctx, d, d.Shards[at], right); err != nil {
		return kv.CollectionInfo{}, err
	}
	res, err := n.propose(ctx, cluster.MetaShardID, shard.EncodeMergeShards(name, left))
	if err == nil && res.Err != nil {
		err = res.Err
	}
	if err != nil {
		return kv.CollectionInfo{}, err
	}
	if err := n.waitMerged(ctx, d.Partitioning, left, right); err != nil {
		return kv.CollectionInfo{}, err
	}
	d, err = n.collection(name)
	if err != nil {
		return kv.CollectionInfo{}, err
	}
	return d.Info(n.leaderNode(d)), nil
}

// checkMergeable refuses, before the catalog changes, a merge of shards
// whose replicas are not on the same nodes or whose groups are not
// settled: a move under way, or a split or merge not applied yet.
func (n *Node) checkMergeable(ctx context.Context, d *cluster.CollectionDesc, left, right cluster.ShardDesc) error {
	probe := *d
	probe.Shards = append([]cluster.ShardDesc(nil), d.Shards...)
	probe.Merged = nil
	if _, err := probe.Merge(left.ID); err != nil {
		return kv.Errorf(kv.CodeConditionFailed, "shards %d and %d of %q cannot merge: %v", left.ID, right.ID, d.Name, err)
	}
	for _, s := range []cluster.ShardDesc{left, right} {
		resp, err := n.leaderConf(ctx, s.ID)
		if err != nil {
			return err
		}
		if !resp.Settled || resp.Frozen != nil || resp.Desc == nil || !sameSpan(*resp.Desc, s) {
			return kv.Errorf(kv.CodeConditionFailed, "shard %d of %q has a move, split or merge in progress; retry once it finished", s.ID, d.Name)
		}
		if resp.Groups {
			return kv.Errorf(kv.CodeConditionFailed, "shard %d of %q leads a key group or holds keys of one; it merges once they are deleted", s.ID, d.Name)
		}
	}
	return nil
}

func sameSpan(d shard.Desc, s cluster.ShardDesc) bool {
	return bytes.Equal(d.Start, s.Start) && bytes.Equal(d.End, s.End) && (d.End == nil) == (s.End == nil) &&
		d.BucketStart == s.BucketStart && d.BucketEnd == s.BucketEnd
}

// leaderConf asks the node leading shardID for the shard's state there.
func (n *Node) leaderConf(ctx context.Context, shardID uint64) (*confResponse, error) {
	for _, id := range n.shardNodes(shardID) {
		resp, err := n.confOf(ctx, id, shardID)
		if err == nil && resp.Leader {
			return resp, nil
		}
	}
	return nil, kv.Errorf(kv.CodeUnavailable, "shard %d has no leader to ask; retry", shardID)
}

// confOf asks node id for the state of its replica of shardID.
func (n *Node) confOf(ctx context.Context, id, shardID uint64) (*confResponse, error) {
	if id == n.id {
		return n.handleConf(ctx, &confRequest{Shard: shardID})
	}
	nd, ok := n.nodeDesc(id)
	if !ok {
		return nil, kv.Errorf(kv.CodeUnavailable, "node %d is not a known member", id)
	}
	c, err := n.peers.conn(nd.PeerAddr)
	if err != nil {
		return nil, err
	}
	var resp confResponse
	if err := c.Invoke(ctx, "/"+movesService+"/Conf", &confRequest{Shard: shardID}, &resp); err != nil {
		return nil, err
	}
	return &resp, nil
}

// waitMerged waits until a replica of left (here, or on a node that holds
// one) has applied the merge of right, and left serves.
func (n *Node) waitMerged(ctx context.Context, p kv.Partitioning, left uint64, right cluster.ShardDesc) error {
	covers := func(d *shard.Desc) bool {
		if d == nil {
			return false
		}
		if p == kv.PartitionRange {
			return right.End == nil && d.End == nil || right.End != nil && d.End != nil && bytes.Compare(d.End, right.End) >= 0
		}
		return d.BucketEnd >= right.BucketEnd
	}
	for {
		if n.hasReplica(left) {
			if d, ok := n.host.Desc(left); ok && covers(&d) {
				return n.readBarrier(ctx, left)
			}
		} else {
			for _, id := range n.shardNodes(left) {
				if resp, err := n.confOf(ctx, id, left); err == nil && resp.Leader && covers(resp.Desc) {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return kv.Errorf(kv.CodeUnavailable, "the merge of shard %d into shard %d is under way but not applied yet: %v", right.ID, left, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// mergePending takes, on the leader of shard id, the step of a merge the
// catalog holds that is the shard's to take: the freeze of a merged right
// shard, or the trigger in the left shard once its right neighbour is
// frozen on every node.
func (n *Node) mergePending(id uint64) error {
	n.mu.RLock()
	m, isMerged := n.mu.merged[id]
	ref, inCatalog := n.mu.shards[id]
	n.mu.RUnlock()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if isMerged {
		if f, err := shard.ReadFrozen(n.eng.DB, id); err != nil || f != nil {
			return err
		}
		res, err := n.host.Propose(ctx, id, shard.EncodeFreeze(m.MergedInto))
		if err == nil && res.Err != nil {
			err = res.Err
		}
		if err == nil {
			n.log.Info("froze a shard merged into its left neighbour", "shard", id, "into", m.MergedInto)
		}
		return err
	}
	if !inCatalog {
		return nil
	}
	desc, ok := n.host.Desc(id)
	if !ok {
		return nil
	}
	cat := ref.coll.Shards[ref.index]
	var right *cluster.ShardDesc
	for i := range ref.coll.Merged {
		r := &ref.coll.Merged[i]
		if r.MergedInto != id {
			continue
		}
		// (An entry of an older merge may be next to the span again after
		// a split at the same place: its replicas are gone, so no node
		// answers it frozen below.)
		if ref.coll.Partitioning == kv.PartitionRange {
			if desc.End != nil && bytes.Equal(r.Start, desc.End) {
				right = r
			}
		} else if r.BucketStart == desc.BucketEnd {
			right = r
		}
	}
	if right == nil {
		return nil
	}
	// Every node of the group must hold the right shard frozen: the
	// catalog's replicas and every member of the group's configuration
	// (a replica added since would apply the trigger too). A node that
	// answered frozen stays so until the trigger removes its replica, so
	// its answer is remembered (per replica of the left shard: a node back
	// with an empty disk has a new one, and is asked again).
	type member struct{ rid, node uint64 }
	var members []member
	for _, r := range cat.Replicas {
		members = append(members, member{r.ID, r.Node})
	}
	cs, _ := n.host.ConfState(id)
	for _, rid := range append(append(append([]uint64(nil), cs.Voters...), cs.Learners...), cs.VotersOutgoing...) {
		node, ok := n.replicaNode(id, rid)
		if !ok {
			return nil // a member this node cannot place yet
		}
		members = append(members, member{rid, node})
	}
	var frozen *shard.FrozenState
	for _, m := range members {
		key := confirmKey{left: id, rid: m.rid, node: m.node, right: right.ID}
		n.confirmMu.Lock()
		f, ok := n.confirmed[key]
		n.confirmMu.Unlock()
		if !ok {
			resp, err := n.confOf(ctx, m.node, right.ID)
			if err != nil || resp.Frozen == nil {
				return nil // asked again on the next round
			}
			f = *resp.Frozen
			n.confirmMu.Lock()
			n.confirmed[key] = f
			n.confirmMu.Unlock()
		}
		if frozen != nil && f != *frozen {
			return nil
		}
		frozen = &f
	}
	if frozen == nil || frozen.Into != id || n.knobs.holdMergeTrigger.Load() {
		return nil
	}
	rd := shard.Desc{ShardID: right.ID, Start: right.Start, End: right.End, BucketStart: right.BucketStart, BucketEnd: right.BucketEnd}
	res, err := n.host.Propose(ctx, id, shard.EncodeMergeTrigger(rd, *frozen))
	if err == nil && res.Err != nil {
		err = res.Err
	}
	if err == nil {
		n.log.Info("merged a shard into its left neighbour", "shard", id, "merged", right.ID)
		n.confirmMu.Lock()
		for k := range n.confirmed {
			if k.right == right.ID {
				delete(n.confirmed, k)
			}
		}
		n.confirmMu.Unlock()
	}
	return err
}

// frozenHere answers, for the left shard's leader, the frozen state of
// this node's replica of shardID, once it is durable (nil: not frozen
// here, or no replica).
func (n *Node) frozenHere(shardID uint64) *shard.FrozenState {
	if !n.hasReplica(shardID) {
		return nil
	}
	f, err := shard.ReadFrozen(n.eng.DB, shardID)
	if err != nil || f == nil {
		return nil
	}
	// The apply batch that froze it was committed without a sync: sync
	// the log, so that the frozen records survive a crash before the
	// trigger removes this replica (whose log could not replay them then).
	if err := n.eng.LogData(nil, pebble.Sync); err != nil {
		return nil
	}
	return f
}

// onMerge runs in the raft loop after the merge trigger was applied in
// left's log here: the replication layer removed the right replica and
// its record; this node's maps follow.
func (n *Node) onMerge(left uint64, mr *shard.MergeResult) {
	if f := n.knobs.atMerge.Load(); f != nil {
		(*f)()
	}
	n.adoptMergedLocks(left, mr.Right)
	n.setLockSpan(left, mr.Desc)
	n.mu.Lock()
	lr, ok := n.mu.replicas[left]
	delete(n.mu.replicas, mr.Right)
	n.mu.mergedAway[mr.Right] = left
	if ok {
		lr.Desc = mr.Desc
		n.mu.replicas[left] = lr
	}
	n.mu.Unlock()
	if !ok {
		return
	}
	b := n.eng.DB.NewBatch()
	defer b.Close()
	if err := n.writeReplica(b, lr); err == nil {
		if err := n.eng.Commit(b, pebble.Sync); err != nil {
			n.log.Error("recording a merge failed", "shard", left, "err", err)
		}
	}
}

// adoptMergedLocks moves the locks of a merge, on the left shard's
// leader: the right shard's table goes (its waiters fail with their locks
// lost and retry, routed to the left shard; its unprepared holders' locks
// are gone, so their prepares fail), and the left one takes the locks of
// the transactions the right one held prepared, whose entries and intents
// the left shard took in with the merge: without them a reader locking a
// key here would not see the intent of a committed transaction still
// unresolved.
func (n *Node) adoptMergedLocks(left, right uint64) {
	n.closeLockTable(right)
	lt := n.lockTable(left)
	if lt == nil {
		return
	}
	dropped := 0
	err := shard.EachPrepared(n.eng.DB, left, func(m txn.Meta, _ uint64, writes, reads []txn.Target) error {
		mm := m
		dropped += lt.Adopt(&mm, writes, reads)
		return nil
	})
	if err != nil {
		n.log.Error("taking over the locks of a merged shard failed", "shard", left, "merged", right, "err", err)
	}
	if dropped > 0 {
		n.log.Debug("a merge dropped the locks of unprepared transactions", "shard", left, "transactions", dropped)
	}
}

// mergingHere reports whether r, a replica held here of a shard the
// catalog no longer has, belongs to a collection that still exists and is
// left for the merge to remove: its records are another shard's now, and
// the left shard's replica here removes it when it applies the merge.
func (n *Node) mergingHere(r localReplica) bool {
	n.mu.RLock()
	defer n.mu.RUnlock()
	if _, ok := n.mu.shards[r.Desc.ShardID]; ok {
		return false // moved away, not merged
	}
	if _, ok := n.mu.merged[r.Desc.ShardID]; ok {
		return true
	}
	// Out of Merged already (a bounded list): a shard of a live
	// collection is never removed with its collection's records.
	for id, o := range n.mu.replicas {
		if id != r.Desc.ShardID && o.Desc.Collection == r.Desc.Collection {
			if _, ok := n.mu.shards[id]; ok {
				return true
			}
		}
	}
	return false
}

// isMergedAway reports whether shardID was merged into another shard,
// by this node's catalog or by a merge applied here.
func (n *Node) isMergedAway(shardID uint64) bool {
	n.mu.RLock()
	defer n.mu.RUnlock()
	_, catalog := n.mu.merged[shardID]
	_, here := n.mu.mergedAway[shardID]
	return catalog || here
}

// liveShards replaces in shards those whose replica here a merge removed
// by the shard that took them in (a catalog that has not caught up still
// names them).
func (n *Node) liveShards(shards []uint64) []uint64 {
	n.mu.RLock()
	defer n.mu.RUnlock()
	var out []uint64
	for _, id := range shards {
		for hops := 0; hops < 64; hops++ {
			into, ok := n.mu.mergedAway[id]
			if !ok {
				break
			}
			if _, held := n.mu.replicas[id]; held {
				break
			}
			id = into
		}
		if !contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}

// autoMerge merges, on the leaders here of range shards, a shard and its
// right neighbour when together they are below Options.MergeBytes and
// neither was split lately. Only boundaries a split made are merged away:
// the split points a collection was created with are the user's, and
// stay (the right shard of such a boundary has no SplitFrom).
func (n *Node) autoMerge() {
	type cand struct {
		left  uint64
		right cluster.ShardDesc
		name  string
	}
	var cands []cand
	n.mu.RLock()
	for id := range n.mu.replicas {
		ref, ok := n.mu.shards[id]
		if !ok || ref.coll.Partitioning == kv.PartitionTag || ref.index == len(ref.coll.Shards)-1 {
			continue
		}
		right := ref.coll.Shards[ref.index+1]
		if right.SplitFrom == 0 {
			continue
		}
		quiet := true
		for _, s := range []uint64{id, right.ID} {
			if at, ok := n.mu.splitAt[s]; ok && time.Since(at) < n.opts.MergeQuiet {
				quiet = false
			}
		}
		if _, held := n.mu.replicas[right.ID]; held && quiet {
			cands = append(cands, cand{id, right, ref.coll.Name})
		}
	}
	n.mu.RUnlock()
	for _, c := range cands {
		if !n.host.Ready(c.left) {
			continue
		}
		ld, ok := n.host.Desc(c.left)
		if !ok {
			continue
		}
		var size int64
		if ld.Partitioning == kv.PartitionHash {
			rd, ok := n.host.Desc(c.right.ID)
			if !ok || ld.BucketEnd != c.right.BucketStart || rd.BucketStart != c.right.BucketStart {
				continue
			}
			ls, lerr := n.shardSize(ld)
			rs, rerr := n.shardSize(rd)
			if lerr != nil || rerr != nil {
				continue
			}
			size = ls + rs
		} else {
			if ld.End == nil || !bytes.Equal(ld.End, c.right.Start) {
				continue
			}
			rd := ld
			rd.Start, rd.End = c.right.Start, c.right.End
			start, _ := ld.Span()
			_, end := rd.Span()
			u, err := n.eng.DB.EstimateDiskUsage(start, end)
			if err != nil {
				continue
			}
			size = int64(u)
		}
		if size >= n.opts.MergeBytes {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := n.MergeShards(ctx, c.name, c.left)
		cancel()
		if err != nil {
			n.log.Warn("merging two shards below the merge size failed", "shard", c.left, "right", c.right.ID, "bytes", size, "err", err)
		} else {
			n.log.Info("merged two shards below the merge size", "shard", c.left, "right", c.right.ID, "bytes", size)
		}
		return // one merge per round: the catalog changed under the others
	}
}

// mergeRetryWindow bounds how long a write refused by a merge in flight
// (the right shard frozen, the left one not widened yet) is routed again:
// a merge takes a few rounds of the cluster loop.
const mergeRetryWindow = 15 * time.Second

// rerouter routes the key of a write to a hash or range collection again
// from the current catalog and local replicas; for a tag collection it
// corrects the shard first found by the local replicas only.
func (n *Node) rerouter(d *cluster.CollectionDesc, bucket uint16, key []byte) func(prev uint64) uint64 {
	return func(prev uint64) uint64 {
		if d.Partitioning == kv.PartitionTag {
			return n.localOwner(d.ID, prev, bucket, key)
		}
		cur, err := n.collection(d.Name)
		if err != nil || cur.ID != d.ID {
			return prev
		}
		_, id := n.route(cur, key)
		return id
	}
}

// writeRouted is write, routed again while a merge in flight refuses the
// command with unavailable (nothing was written): a frozen right shard, a
// left shard not widened yet, or a right shard gone. It gives up on other
// refusals, or when the route and the shard's merge state say nothing
// changed.
func (n *Node) writeRouted(ctx context.Context, shardID uint64, reroute func(prev uint64) uint64, cmd []byte) (uint64, error) {
	deadline := time.Now().Add(mergeRetryWindow)
	for attempt := 0; ; attempt++ {
		v, err := n.write(ctx, shardID, cmd)
		if err == nil || kv.CodeOf(err) != kv.CodeUnavailable || ctx.Err() != nil {
			return v, err
		}
		next := reroute(shardID)
		if next == shardID && !n.inMerge(shardID) {
			return v, err
		}
		if berr := backoff(ctx, attempt, deadline, err); berr != nil {
			return v, berr
		}
		shardID = next
	}
}

// inMerge reports whether shardID was merged away or took in a merged
// shard, as far as this node knows.
func (n *Node) inMerge(shardID uint64) bool {
	n.mu.RLock()
	defer n.mu.RUnlock()
	if _, ok := n.mu.merged[shardID]; ok {
		return true
	}
	if _, ok := n.mu.mergedAway[shardID]; ok {
		return true
	}
	for _, m := range n.mu.merged {
		if m.MergedInto == shardID {
			return true
		}
	}
	return false
}

// shardRef returns the catalog's descriptor of shardID.
func (n *Node) shardRef(shardID uint64) (cluster.ShardDesc, bool) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	ref, ok := n.mu.shards[shardID]
	if !ok {
		return cluster.ShardDesc{}, false
	}
	return ref.coll.Shards[ref.index], true
}

// frozenInto returns the shard that shardID, frozen for a merge on this
// node's replica, is merged into; 0 when it is not frozen here.
func (n *Node) frozenInto(shardID uint64) uint64 {
	if !n.hasReplica(shardID) {
		return 0
	}
	sm := n.host.StateMachine(shardID)
	if sm == nil {
		return 0
	}
	return sm.FrozenInto()
}

// mergedSuccessor returns the shard that took shardID in, once this
// node's replica of it has applied the merge (its span holds the merged
// shard's, and with it the merged shard's prepared transactions); ok is
// false while the merge is not known here to be through.
func (n *Node) mergedSuccessor(shardID uint64) (uint64, bool) {
	if n.hasReplica(shardID) {
		return 0, false
	}
	n.mu.RLock()
	d, m, merged := n.mergedEntryLocked(shardID)
	n.mu.RUnlock()
	if !merged {
		return 0, false
	}
	span := shard.Desc{ShardID: m.ID, Collection: d.ID, Partitioning: d.Partitioning, Start: m.Start, End: m.End, BucketStart: m.BucketStart, BucketEnd: m.BucketEnd}
	if !n.spanCovers(m.MergedInto, span) {
		return 0, false
	}
	return m.MergedInto, true
}

// spanCovers reports whether the span shardID's replica here applied
// holds all of d's.
func (n *Node) spanCovers(shardID uint64, d shard.Desc) bool {
	o, ok := n.host.Desc(shardID)
	if !ok || o.Collection != d.Collection {
		return false
	}
	if o.Partitioning == kv.PartitionRange {
		return bytes.Compare(o.Start, d.Start) <= 0 && (o.End == nil || d.End != nil && bytes.Compare(d.End, o.End) <= 0)
	}
	return o.BucketStart <= d.BucketStart && d.BucketEnd <= o.BucketEnd
}

// dropCovered removes the replicas here of frozen shards whose span
// another replica here holds now: a snapshot of the shard they merge into,
// taken after the merge, replaced the records of both, so the merge
// trigger will not be applied here. Only the raft and shard state and the
// node's record go: the records are the other shard's. Called with
// reconcileMu held.
func (n *Node) dropCovered() error {
	n.mu.RLock()
	var drop []localReplica
	var into []uint64
	for id, r := range n.mu.replicas {
		if id == cluster.MetaShardID {
			continue
		}
		f, err := shard.ReadFrozen(n.eng.DB, id)
		if err != nil || f == nil {
			continue
		}
		d, ok := n.host.Desc(id)
		if _, held := n.mu.replicas[f.Into]; ok && held && n.spanCovers(f.Into, d) {
			drop = append(drop, r)
			into = append(into, f.Into)
		}
	}
	n.mu.RUnlock()
	for i, r := range drop {
		id := r.Desc.ShardID
		n.host.RemoveGroup(id)
		n.host.WaitRemoved(id)
		b := n.eng.DB.NewBatch()
		for _, span := range []func(uint64) ([]byte, []byte){storage.RaftSpan, storage.ShardStateSpan} {
			start, end := span(id)
			if err := b.DeleteRange(start, end, nil); err != nil {
				b.Close()
				return err
			}
		}
		if err := b.Delete(replicaKey(id), nil); err != nil {
			b.Close()
			return err
		}
		err := n.eng.Commit(b, pebble.Sync)
		b.Close()
		if err != nil {
			return err
		}
		n.mu.Lock()
		delete(n.mu.replicas, id)
		n.mu.mergedAway[id] = into[i]
		n.mu.Unlock()
		n.log.Info("removed a merged replica a snapshot of the shard it merged into covers", "shard", id, "into", into[i])
	}
	return nil
}

// confirmKey names the answer of the node of replica rid of shard left
// that it holds shard right frozen (mergePending).
type confirmKey struct{ left, rid, node, right uint64 }

// withMerging is liveShards(shards) and the replicas here of shards of
// the same collections that are being merged away: until the merge is
// applied here, their records are read where the catalog names the shard
// that takes them in, and their GC threshold counts too.
func (n *Node) withMerging(shards []uint64) []uint64 {
	out := n.liveShards(shards)
	n.mu.RLock()
	defer n.mu.RUnlock()
	colls := map[uint32]bool{}
	for _, id := range out {
		if r, ok := n.mu.replicas[id]; ok {
			colls[r.Desc.Collection] = true
		} else if ref, ok := n.mu.shards[id]; ok {
			colls[ref.coll.ID] = true
		}
	}
	for id := range n.mu.merged {
		if r, ok := n.mu.replicas[id]; ok && colls[r.Desc.Collection] && !contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}
