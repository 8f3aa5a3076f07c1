package node

import (
	"context"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/shard"
	"github.com/groupkv/groupkv/internal/storage"
)

// Moving replicas (see docs/cluster.md, "Placement"):
//
//   - The catalog holds each shard's target replicas. A move replaces the
//     replica of one shard on one node by a joining replica with a new
//     raft id on another (shard.KindMoveShardReplica; the older
//     shard.KindMoveReplicas does so in every shard of a collection).
//   - The node of a joining replica creates it empty; the shard's leader
//     conforms the group's configuration to the target one change at a
//     time: the new replica joins as a learner and gets a snapshot, is
//     promoted to voter once caught up, and only then is the replica that
//     left the target removed (a leader that is leaving hands leadership
//     to a caught-up target voter first).
//   - The node that lost a replica keeps it, serving as a member, until
//     the leader's configuration no longer holds it; then it deletes the
//     replica's raft state and exactly the keys the shard owns.
//   - The meta shard's leader rebalances: it moves single shard replicas
//     off draining nodes, and from the node holding the most replicas (of
//     every shard of every collection) to the one holding the fewest while
//     they differ by more than one; a few moves of different shards per
//     round, once every shard's configuration matches its target. Then it
//     spreads the preferred leaders the same way.

const movesService = "groupkv.peer.v1.Moves"

type confRequest struct {
	Shard uint64 `json:"shard"`
}

type confResponse struct {
	Leader   bool     `json:"leader"`
	Voters   []uint64 `json:"voters"`
	Learners []uint64 `json:"learners"`
	// Settled: the configuration matches the catalog's target replicas.
	Settled bool `json:"settled"`
	// Desc is the shard's descriptor as its replica here applied it.
	Desc *shard.Desc `json:"desc,omitempty"`
	// Frozen is the replica's frozen state once a freeze for a merge was
	// applied and made durable here (merge.go).
	Frozen *shard.FrozenState `json:"frozen,omitempty"`
	// Groups: the replica leads a key group or holds keys of one; the
	// shard neither splits nor merges then (shard/group.go).
	Groups bool `json:"groups,omitempty"`
}

func (n *Node) registerMoves(s grpc.ServiceRegistrar) {
	s.RegisterService(&grpc.ServiceDesc{
		ServiceName: movesService,
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{
			{MethodName: "Conf", Handler: unary(n.handleConf)},
		},
	}, n)
}

func (n *Node) handleConf(ctx context.Context, req *confRequest) (*confResponse, error) {
	cs, ok := n.host.ConfState(req.Shard)
	if !ok {
		return &confResponse{}, nil
	}
	resp := &confResponse{Leader: n.host.Ready(req.Shard), Voters: cs.Voters, Learners: cs.Learners,
		Settled: n.settled(req.Shard, cs), Frozen: n.frozenHere(req.Shard)}
	if d, ok := n.host.Desc(req.Shard); ok {
		resp.Desc = &d
	}
	if sm := n.host.StateMachine(req.Shard); sm != nil {
		resp.Groups = sm.HoldsGroups()
	}
	return resp, nil
}

// shardInCatalog reports whether shardID belongs to a collection that
// still exists.
func (n *Node) shardInCatalog(shardID uint64) bool {
	n.mu.RLock()
	defer n.mu.RUnlock()
	_, ok := n.mu.shards[shardID]
	return ok
}

// target returns the catalog's target replica ids of shardID.
func (n *Node) target(shardID uint64) ([]uint64, bool) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	ref, ok := n.mu.shards[shardID]
	if !ok {
		return nil, false
	}
	var ids []uint64
	for _, r := range ref.coll.Shards[ref.index].Replicas {
		ids = append(ids, r.ID)
	}
	return ids, true
}

// settled reports whether configuration cs of shardID is its target: the
// target replicas are its voters, and it has no learner. A shard whose
// replica here has not applied the span the catalog gives it (a split or
// merge under way) is not settled either: a move waits for it, since a
// merge needs the same replicas from the catalog change to the trigger.
func (n *Node) settled(shardID uint64, cs raftpb.ConfState) bool {
	target, ok := n.target(shardID)
	if !ok {
		return false
	}
	n.mu.RLock()
	ref, inCatalog := n.mu.shards[shardID]
	n.mu.RUnlock()
	if !inCatalog {
		return false
	}
	if d, ok := n.host.Desc(shardID); ok && !sameSpan(d, ref.coll.Shards[ref.index]) {
		return false
	}
	if len(cs.Learners) > 0 || len(cs.VotersOutgoing) > 0 || len(cs.Voters) != len(target) {
		return false
	}
	for _, id := range target {
		if !contains(cs.Voters, id) {
			return false
		}
	}
	return true
}

// replicaLeftGroup reports whether replica rid of shardID is no longer in
// the group's configuration as its leader (or, failing that, this replica)
// knows it.
func (n *Node) replicaLeftGroup(shardID, rid uint64) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, id := range n.shardNodes(shardID) {
		if id == n.id {
			continue
		}
		var resp confResponse
		nd, ok := n.nodeDesc(id)
		if !ok {
			continue
		}
		c, err := n.peers.conn(nd.PeerAddr)
		if err != nil {
			continue
		}
		if err := c.Invoke(ctx, "/"+movesService+"/Conf", &confRequest{Shard: shardID}, &resp); err != nil || !resp.Leader {
			continue
		}
		return !contains(resp.Voters, rid) && !contains(resp.Learners, rid)
	}
	cs, ok := n.host.ConfState(shardID)
	return ok && !contains(cs.Voters, rid) && !contains(cs.Learners, rid)
}

// clearReplica deletes a moved-away replica: its raft state, its
// node-local record and exactly the keys the shard owns.
func (n *Node) clearReplica(r localReplica) error {
	b := n.eng.DB.NewBatch()
	defer b.Close()
	if err := shard.ClearShard(b, n.eng.DB, r.Desc); err != nil {
		return err
	}
	s, e := storage.RaftSpan(r.Desc.ShardID)
	if err := b.DeleteRange(s, e, nil); err != nil {
		return err
	}
	if err := b.Delete(replicaKey(r.Desc.ShardID), nil); err != nil {
		return err
	}
	if err := n.commitDropping(b); err != nil {
		return err
	}
	n.log.Info("removed a replica that moved away", "shard", r.Desc.ShardID, "replica", r.ReplicaID)
	return nil
}

// conformShards runs on every node: for each data shard it leads, it takes
// one step bringing the group's configuration to the catalog's target.
func (n *Node) conformShards() {
	n.mu.RLock()
	ids := make([]uint64, 0, len(n.mu.replicas))
	for id := range n.mu.replicas {
		if id != cluster.MetaShardID {
			ids = append(ids, id)
		}
	}
	n.mu.RUnlock()
	for _, id := range ids {
		if !n.host.Ready(id) {
			continue
		}
		if err := n.splitPending(id); err != nil {
			n.log.Warn("splitting a shard failed; retrying", "shard", id, "err", err)
		}
		if err := n.mergePending(id); err != nil {
			n.log.Warn("merging a shard failed; retrying", "shard", id, "err", err)
		}
		if err := n.conformShard(id); err != nil {
			n.log.Warn("changing a shard's replicas failed; retrying", "shard", id, "err", err)
		}
	}
}

func (n *Node) conformShard(id uint64) error {
	target, ok := n.target(id)
	if !ok {
		return nil
	}
	cs, ok := n.host.ConfState(id)
	if !ok || len(cs.VotersOutgoing) > 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	change := func(t raftpb.ConfChangeType, rid uint64) error {
		return n.host.ProposeConfChange(ctx, id, raftpb.ConfChangeV2{Changes: []raftpb.ConfChangeSingle{{Type: t, NodeID: rid}}})
	}
	match, last, _ := n.host.Progress(id)
	for _, rid := range target {
		if !contains(cs.Voters, rid) && !contains(cs.Learners, rid) {
			n.log.Info("adding a replica as learner", "shard", id, "replica", rid)
			return change(raftpb.ConfChangeAddLearnerNode, rid)
		}
	}
	for _, rid := range target {
		if contains(cs.Learners, rid) {
			if match[rid]+8 < last {
				return nil // still catching up
			}
			n.log.Info("promoting a replica to voter", "shard", id, "replica", rid)
			return change(raftpb.ConfChangeAddNode, rid)
		}
	}
	self := n.host.Leader(id)
	for _, rid := range append(append([]uint64(nil), cs.Voters...), cs.Learners...) {
		if contains(target, rid) {
			continue
		}
		if rid == self {
			// Leaving: hand leadership to a caught-up target voter first.
			for _, t := range target {
				if match[t] >= last {
					n.host.TransferLeadership(id, t)
					return nil
				}
			}
			return nil
		}
		n.log.Info("removing a replica that moved away", "shard", id, "replica", rid)
		return change(raftpb.ConfChangeRemoveNode, rid)
	}
	return nil
}

// shardsSettled asks the leader of every data shard whether its
// configuration matches its target.
func (n *Node) shardsSettled(ctx context.Context) bool {
	n.mu.RLock()
	type sh struct {
		id    uint64
		nodes []uint64
	}
	var all []sh
	for _, c := range n.mu.catalog {
		for _, s := range c.Shards {
			var nodes []uint64
			for _, r := range s.Replicas {
				nodes = append(nodes, r.Node)
			}
			all = append(all, sh{s.ID, nodes})
		}
	}
	n.mu.RUnlock()
	for _, s := range all {
		settled := false
		for _, id := range s.nodes {
			var resp confResponse
			if id == n.id {
				if n.host.Ready(s.id) {
					cs, _ := n.host.ConfState(s.id)
					resp = confResponse{Leader: true, Settled: n.settled(s.id, cs)}
				}
			} else if nd, ok := n.nodeDesc(id); ok {
				c, err := n.peers.conn(nd.PeerAddr)
				if err != nil || c.Invoke(ctx, "/"+movesService+"/Conf", &confRequest{Shard: s.id}, &resp) != nil {
					continue
				}
			}
			if resp.Leader {
				settled = resp.Settled
				break
			}
		}
		if !settled {
			return false
		}
	}
	return true
}

// Rebalancing moves at most this many replicas, and changes at most this
// many preferred leaders, per round: a round starts only once every
// shard's configuration matches its target, and a few moves of different
// shards at once keep a new node's fill-up within seconds without
// snapshotting every shard onto it at the same time.
const (
	maxMovesPerRound   = 3
	maxLeadersPerRound = 4
)

// rebalance runs on the meta shard's leader, once every shard's
// configuration matches its target: it moves single shard replicas off
// draining nodes, then from the most to the least loaded node (replicas of
// every shard of every collection) while they differ by more than one,
// and, when no replica needs to move, spreads the preferred leaders the
// same way (cluster.PlanMoves, cluster.PlanLeaders).
func (n *Node) rebalance() {
	n.mu.RLock()
	members := make(map[uint64]bool, len(n.mu.nodes))
	for id, d := range n.mu.nodes {
		members[id] = d.Draining
	}
	catalog := make([]*cluster.CollectionDesc, 0, len(n.mu.catalog))
	for _, c := range n.mu.catalog {
		catalog = append(catalog, c)
	}
	n.mu.RUnlock()
	shards := cluster.Placements(catalog)
	moves := cluster.PlanMoves(shards, members, maxMovesPerRound)
	var prefs []cluster.Prefer
	if len(moves) == 0 {
		prefs = cluster.PlanLeaders(shards, members, maxLeadersPerRound)
	}
	if len(moves) == 0 && len(prefs) == 0 {
		return // balanced: no need to ask the shards' leaders
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if !n.shardsSettled(ctx) {
		return
	}
	if len(moves) > 0 {
		for _, m := range moves {
			res, err := n.propose(ctx, cluster.MetaShardID, shard.EncodeMoveShardReplica(m.Collection, m.Shard, m.From, m.To))
			if err == nil && res.Err != nil {
				err = res.Err
			}
			if err != nil {
				n.log.Warn("moving a replica failed", "collection", m.Collection, "shard", m.Shard, "from", m.From, "to", m.To, "err", err)
				return
			}
			n.log.Info("moving a replica", "collection", m.Collection, "shard", m.Shard, "from", m.From, "to", m.To)
		}
		return
	}
	for _, p := range prefs {
		res, err := n.propose(ctx, cluster.MetaShardID, shard.EncodeSetPreferred(p.Collection, p.Shard, p.Node))
		if err == nil && res.Err != nil {
			err = res.Err
		}
		if err != nil {
			n.log.Warn("moving a preferred leader failed", "shard", p.Shard, "to", p.Node, "err", err)
			return
		}
		n.log.Info("preferred leader moved", "shard", p.Shard, "to", p.Node)
	}
}

// Decommission marks node id as draining (or, with draining false, takes
// the mark back): its replicas move to other nodes, it gets no new ones,
// and it gives up its meta shard vote. Once ClusterStatus shows it holding
// no replica it can be stopped.
func (n *Node) Decommission(ctx context.Context, id uint64, draining bool) error {
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return err
	}
	defer done()
	if _, ok := n.nodeDesc(id); !ok {
		return kv.Errorf(kv.CodeNotFound, "node %d is not a member", id)
	}
	res, err := n.propose(ctx, cluster.MetaShardID, shard.EncodeSetDraining(id, draining))
	if err == nil && res.Err != nil {
		err = res.Err
	}
	return err
}
