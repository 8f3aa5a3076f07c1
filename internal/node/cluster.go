package node

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/group"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/replication"
	"github.com/groupkv/groupkv/internal/shard"
	"github.com/groupkv/groupkv/internal/transport"
)

// Cluster behaviour of a node (see ARCHITECTURE.md, "Cluster"):
//
//   - Membership records, the catalog and the TSO live in the meta shard.
//     The first node bootstraps it as a one-voter group; a node started
//     with Join asks a member to add it. The meta shard's leader gives the
//     first three nodes a meta replica each, added as a learner and
//     promoted to voter once it has caught up.
//   - Every shard's replicas are placed on distinct nodes, the least
//     loaded over every collection, when its collection is created; every
//     node creates the replicas the catalog gives it (reconcile), all from
//     the same initial state, and the first replica of each shard
//     campaigns at once, so leaders spread.
//   - A write goes to its shard's leader: proposed here when this node
//     leads, else forwarded over the peer service.
//   - A read is served from this node's replica once raft's ReadIndex —
//     answered by the leader after a heartbeat round to a quorum — has been
//     applied here; a snapshot read asks the leader to fence the version
//     first. A read of shards not held here is forwarded whole to a node
//     holding them all, or read in parts on nodes holding them and merged
//     (spread.go).
//   - Write versions come from the oracle on the meta shard's leader; other
//     nodes fetch them in windows, each used only by proposals queued
//     before the fetch started, so versions follow real time.

// clusterInterval is the period of the membership loop.
const clusterInterval = 250 * time.Millisecond

// nodeDesc returns the membership record of node id.
func (n *Node) nodeDesc(id uint64) (cluster.NodeDesc, bool) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	d, ok := n.mu.nodes[id]
	return d, ok
}

// reloadMeta reloads the membership and the catalog from the applied
// state of the meta shard (after a snapshot replaced it).
func (n *Node) reloadMeta() error {
	nodes, err := shard.LoadNodes(n.eng.DB)
	if err != nil {
		return err
	}
	catalog, err := shard.LoadCatalog(n.eng.DB)
	if err != nil {
		return err
	}
	n.mu.Lock()
	for _, d := range nodes {
		n.mu.nodes[d.ID] = d
	}
	n.mu.catalog = make(map[string]*cluster.CollectionDesc, len(catalog))
	for _, d := range catalog {
		n.mu.catalog[d.Name] = d
	}
	n.indexShardsLocked()
	n.mu.Unlock()
	n.triggerReconcile()
	return nil
}

// indexShardsLocked rebuilds the shard index from the catalog.
func (n *Node) indexShardsLocked() {
	n.mu.shards = make(map[uint64]shardRef)
	n.mu.merged = make(map[uint64]cluster.ShardDesc)
	for _, c := range n.mu.catalog {
		for i := range c.Shards {
			n.mu.shards[c.Shards[i].ID] = shardRef{coll: c, index: i}
		}
		for _, m := range c.Merged {
			n.mu.merged[m.ID] = m
		}
	}
}

// shardRef locates a shard in the catalog.
type shardRef struct {
	coll  *cluster.CollectionDesc
	index int
}

// replicaNode returns the node of replica rid of shardID.
func (n *Node) replicaNode(shardID, rid uint64) (uint64, bool) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.replicaNodeLocked(shardID, rid)
}

func (n *Node) replicaNodeLocked(shardID, rid uint64) (uint64, bool) {
	if rid == 0 {
		return 0, false
	}
	if shardID == cluster.MetaShardID {
		for _, d := range n.mu.nodes {
			if d.MetaReplica == rid {
				return d.ID, true
			}
		}
		return 0, false
	}
	ref, ok := n.mu.shards[shardID]
	if !ok {
		// A merged shard's replicas still talk until they applied the
		// merge.
		if m, ok := n.mu.merged[shardID]; ok {
			return m.ReplicaNode(rid)
		}
		return 0, false
	}
	return ref.coll.Shards[ref.index].ReplicaNode(rid)
}

// shardCut names a shard whose raft messages to or from a node are
// dropped (knobs.cutShard).
type shardCut struct{ shard, node uint64 }

// resolve is the transport's Resolver.
func (n *Node) resolve(shardID, rid uint64) (uint64, string, bool) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	id, ok := n.replicaNodeLocked(shardID, rid)
	if !ok {
		return 0, "", false
	}
	if cut := n.knobs.cutShard.Load(); cut != nil && cut.shard == shardID && (cut.node == id || cut.node == n.id) {
		return 0, "", false
	}
	d, ok := n.mu.nodes[id]
	if !ok || d.PeerAddr == "" {
		return 0, "", false
	}
	return id, d.PeerAddr, true
}

// shardNodes returns the nodes holding replicas of shardID.
func (n *Node) shardNodes(shardID uint64) []uint64 {
	n.mu.RLock()
	defer n.mu.RUnlock()
	var out []uint64
	if shardID == cluster.MetaShardID {
		for _, d := range n.mu.nodes {
			if d.MetaReplica != 0 {
				out = append(out, d.ID)
			}
		}
		sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
		return out
	}
	if ref, ok := n.mu.shards[shardID]; ok {
		for _, r := range ref.coll.Shards[ref.index].Replicas {
			out = append(out, r.Node)
		}
	}
	return out
}

// leaderOf returns the node that leads shardID as far as this node knows
// (0: unknown).
func (n *Node) leaderOf(shardID uint64) uint64 {
	rid := n.host.Leader(shardID)
	if id, ok := n.replicaNode(shardID, rid); ok {
		return id
	}
	return 0
}

// localLeaders maps every shard held here to its known leader node.
func (n *Node) localLeaders() map[uint64]uint64 {
	n.mu.RLock()
	ids := make([]uint64, 0, len(n.mu.replicas))
	for id := range n.mu.replicas {
		ids = append(ids, id)
	}
	n.mu.RUnlock()
	out := make(map[uint64]uint64, len(ids))
	for _, id := range ids {
		out[id] = n.leaderOf(id)
	}
	return out
}

func (n *Node) hasReplica(shardID uint64) bool {
	n.mu.RLock()
	defer n.mu.RUnlock()
	_, ok := n.mu.replicas[shardID]
	return ok
}

// retryable reports whether an operation refused for err may succeed on
// another try shortly: the shard has no (known) leader, or it moved.
func retryable(err error) bool {
	if _, failed := errors.AsType[*replication.StorageFailedError](err); failed {
		return false // this node stopped: no retry here will get through
	}
	if refused(err) {
		return false // refused until the disk has room: no retry will get through soon
	}
	switch kv.CodeOf(err) {
	case kv.CodeNotLeader, kv.CodeUnavailable:
		return true
	}
	return false
}

// backoff waits before attempt+1 of an operation, or fails when ctx ends
// or the attempts ran past deadline.
func backoff(ctx context.Context, attempt int, deadline time.Time, last error) error {
	d := min(time.Duration(1<<min(attempt, 6))*5*time.Millisecond, 200*time.Millisecond)
	d = d/2 + rand.N(d/2+1)
	if time.Now().Add(d).After(deadline) {
		return last
	}
	select {
	case <-ctx.Done():
		return last
	case <-time.After(d):
		return nil
	}
}

// retryWindow bounds how long an operation looks for a shard's leader: a
// few election timeouts, so that a failover is ridden out while a node cut
// off from its quorum answers unavailable soon.
func (n *Node) retryWindow() time.Duration {
	return 30 * n.opts.TickInterval
}

// ghostWindow bounds a write's wait for keys held by a group that no
// longer exists (a late join its leader undoes): the group protocol frees
// them at its next retry, every few ticks of its own (groupTick), however
// short the node's tick; the window spans ten such retries at least.
func (n *Node) ghostWindow() time.Duration {
	return max(n.retryWindow(), 10*time.Duration(group.Options{}.EnsureDefaults().RetryTicks)*groupTick)
}

// leaderSearch bounds a retry loop's search for a shard's leader to
// retryWindow of refusals and backoffs. The time each try waited is not
// counted: a proposal whose leader persisted it before losing leadership
// is answered not applied only once a new leader's entry took its index,
// which may take several election timeouts, and is then retried as surely
// as one refused at once; a lock request waits for locks; and a call to a
// leader that stopped answering waits to be abandoned (callLeader).
type leaderSearch struct {
	deadline time.Time
	tried    time.Time // when the try underway began
}

func (n *Node) leaderSearch() *leaderSearch {
	now := time.Now()
	return &leaderSearch{deadline: now.Add(n.retryWindow()), tried: now}
}

// try marks the start of a try.
func (s *leaderSearch) try() { s.tried = time.Now() }

// backoff waits before the next try (see backoff), the window extended by
// the time the failed try took; it returns last once the window is spent.
func (s *leaderSearch) backoff(ctx context.Context, attempt int, last error) error {
	s.deadline = s.deadline.Add(time.Since(s.tried))
	return backoff(ctx, attempt, s.deadline, last)
}

// electionTimeout is the raft election timeout of the node's shards (the
// replication host's default of 10 ticks).
func (n *Node) electionTimeout() time.Duration {
	return 10 * n.opts.TickInterval
}

// propose hands cmd to shardID's leader — here, or on the node that leads
// it — and waits until it is applied.
func (n *Node) propose(ctx context.Context, shardID uint64, cmd []byte) (shard.Result, error) {
	return n.proposeHops(ctx, shardID, cmd, 0)
}

func (n *Node) proposeHops(ctx context.Context, shardID uint64, cmd []byte, hops int) (shard.Result, error) {
	search := n.leaderSearch()
	for attempt := 0; ; attempt++ {
		search.try()
		res, err := n.proposeOnce(ctx, shardID, cmd, hops)
		if err == nil || !retryable(err) || n.isMergedAway(shardID) && !n.hasReplica(shardID) {
			// A shard merged away does not come back: the caller routes
			// the command again (writeRouted).
			return res, err
		}
		if berr := search.backoff(ctx, attempt, err); berr != nil {
			return shard.Result{}, berr
		}
	}
}

func (n *Node) proposeOnce(ctx context.Context, shardID uint64, cmd []byte, hops int) (shard.Result, error) {
	// A replica here that moved away (not readable: the catalog lists
	// the shard on other nodes only) may be out of its group already, its
	// leader a node that no longer holds the shard either: unless it
	// still leads, the nodes the catalog names are asked instead.
	if n.hasReplica(shardID) && (n.host.Ready(shardID) || n.readable(shardID)) {
		leader := n.leaderOf(shardID)
		if leader == n.id || leader == 0 || n.host.Ready(shardID) {
			release, err := n.plainLocks(ctx, shardID, cmd) // txn_leader.go
			if err != nil {
				return shard.Result{}, err
			}
			// Released once the command is out of raft's hands, not when
			// ctx ends: a write applied after its locks went could land
			// under a transaction's lock, after its read.
			res, err := n.host.ProposeThen(ctx, shardID, cmd, release)
			if kv.CodeOf(err) != kv.CodeNotLeader {
				return res, err
			}
			if leader = n.leaderOf(shardID); leader == 0 || leader == n.id {
				return res, kv.Errorf(kv.CodeUnavailable, "shard %d has no leader", shardID)
			}
		}
		if hops >= maxHops {
			return shard.Result{}, kv.Errorf(kv.CodeUnavailable, "shard %d: forwarded too often", shardID)
		}
		return n.proposeRemote(ctx, leader, shardID, cmd, hops+1)
	}
	// No replica here: any replica's node knows the leader.
	target := n.otherHolder(shardID, rand.N(1<<20))
	if target == 0 {
		return shard.Result{}, kv.Errorf(kv.CodeUnavailable, "shard %d is not in this node's catalog yet", shardID)
	}
	if hops >= maxHops {
		return shard.Result{}, kv.Errorf(kv.CodeUnavailable, "shard %d: forwarded too often", shardID)
	}
	return n.proposeRemote(ctx, target, shardID, cmd, hops+1)
}

// readBarrier makes a read of shardID's replica here linearizable.
func (n *Node) readBarrier(ctx context.Context, shardID uint64) error {
	if !n.hasReplica(shardID) {
		return kv.Errorf(kv.CodeUnavailable, "node %d holds no replica of shard %d; ask a node that does", n.id, shardID)
	}
	deadline := time.Now().Add(n.retryWindow())
	for attempt := 0; ; attempt++ {
		err := n.host.ReadBarrier(ctx, shardID)
		if err == nil || !retryable(err) || ctx.Err() != nil || !n.hasReplica(shardID) {
			return err
		}
		if berr := backoff(ctx, attempt, deadline, err); berr != nil {
			return berr
		}
	}
}

// leaderRead prepares a read of shardID's replica here at version ts (a
// snapshot read) or, with ts 0, returns the shard's resolved timestamp.
func (n *Node) leaderRead(ctx context.Context, shardID, ts, now uint64) (uint64, error) {
	if !n.hasReplica(shardID) {
		return 0, kv.Errorf(kv.CodeUnavailable, "node %d holds no replica of shard %d; ask a node that does", n.id, shardID)
	}
	search := n.leaderSearch()
	for attempt := 0; ; attempt++ {
		search.try()
		resolved, err := n.leaderReadOnce(ctx, shardID, ts, now)
		if err == nil || !retryable(err) || ctx.Err() != nil || !n.hasReplica(shardID) {
			return resolved, err
		}
		if berr := search.backoff(ctx, attempt, err); berr != nil {
			return 0, berr
		}
	}
}

func (n *Node) leaderReadOnce(ctx context.Context, shardID, ts, now uint64) (uint64, error) {
	if n.host.Ready(shardID) {
		if ts != 0 {
			return 0, n.host.SnapshotRead(ctx, shardID, ts)
		}
		return n.resolvedAsLeader(ctx, shardID, now)
	}
	leader := n.leaderOf(shardID)
	if leader == 0 || leader == n.id {
		return 0, kv.Errorf(kv.CodeUnavailable, "shard %d has no leader", shardID)
	}
	var resp leaderReadResponse
	if _, err := n.callLeader(ctx, shardID, leader, "LeaderRead", &leaderReadRequest{Shard: shardID, SnapshotTS: ts, Now: now}, &resp); err != nil {
		return 0, err
	}
	if err := resp.Error.err(); err != nil {
		return 0, err
	}
	return resp.Resolved, n.host.WaitApplied(ctx, shardID, resp.AppliedIndex)
}

// resolved returns shardID's resolved timestamp as known here: everything
// at or below it is applied on this node's replica and no write at or below
// it will come. On a follower it is the leader's, once this replica has
// applied as far as the leader had.
func (n *Node) resolved(ctx context.Context, shardID, now uint64) (uint64, error) {
	if n.host.Ready(shardID) {
		if r, err := n.resolvedAsLeader(ctx, shardID, now); err == nil {
			return r, nil
		}
	}
	return n.leaderRead(ctx, shardID, 0, now)
}

// resolvedAsLeader is the resolved timestamp of shardID, led here, once a
// read barrier confirmed the leadership: a leader deposed without knowing
// it yet would answer now while its successor applies writes below it.
// (A successor's versions are above a timestamp it took once elected,
// after the confirmation, so above now.) A one-voter shard confirms for
// free.
func (n *Node) resolvedAsLeader(ctx context.Context, shardID, now uint64) (uint64, error) {
	if err := n.host.ReadBarrier(ctx, shardID); err != nil {
		return 0, err
	}
	if !n.host.Ready(shardID) {
		return 0, kv.Errorf(kv.CodeNotLeader, "node %d no longer leads shard %d", n.id, shardID)
	}
	return n.host.Resolved(shardID, now), nil
}

// oracleTerm returns the term of this node's ready leadership of the meta
// shard, whose oracle answers; ok is false when it does not lead it.
// Taken before a timestamp is drawn, it is what confirmOracle confirms.
func (n *Node) oracleTerm() (term uint64, ok bool) {
	term, ok = n.host.LeaderTerm(cluster.MetaShardID)
	return term, ok && n.oracle.Active()
}

// confirmOracle confirms, after this node's oracle answered a timestamp,
// that the node still leads the meta shard in term, the leadership it had
// before the timestamp was drawn: a leader cut off from the others goes on
// believing it leads until its term ends, and its oracle would answer
// timestamps below those a new leader's oracle has issued since (a
// snapshot read at one would miss writes that committed before it began).
//
// A read barrier alone does not confirm it: a replica that has just become
// a follower asks the new leader for the read index, and that answer says
// nothing of this node's leadership. The barrier is answered only after a
// step down has been noted (ready cleared, the oracle deactivated), so a
// leadership still ready in the same term after the barrier is one that a
// quorum confirmed after the draw, when no newer oracle can have issued
// anything yet. One voter confirms at once.
func (n *Node) confirmOracle(ctx context.Context, term uint64) error {
	if err := n.host.ReadBarrier(ctx, cluster.MetaShardID); err != nil {
		return err
	}
	if now, ok := n.oracleTerm(); !ok || now != term {
		return kv.Errorf(kv.CodeNotLeader, "node %d no longer leads the meta shard (led in term %d): its oracle's timestamp may be stale", n.id, term)
	}
	return nil
}

// oracleUnavailable is the answer of a caller that could not get a
// timestamp: a not_leader of the meta shard (its leader moving, or cut off
// from its quorum) says unavailable to the caller, which addressed no
// shard and has no leader to ask.
func oracleUnavailable(err error) error {
	if kv.CodeOf(err) == kv.CodeNotLeader {
		return kv.Errorf(kv.CodeUnavailable, "no timestamp: the timestamp oracle is moving to another node (%v); retry", err)
	}
	return err
}

// uniqueTimestamp returns a timestamp the oracle issues to this caller
// alone, above every timestamp Latest answered before.
func (n *Node) uniqueTimestamp(ctx context.Context) (uint64, error) {
	deadline := time.Now().Add(n.retryWindow())
	for attempt := 0; ; attempt++ {
		var err error
		if term, active := n.oracleTerm(); active {
			ts, ok := n.oracle.TryNext(0)
			if !ok {
				err = kv.Errorf(kv.CodeUnavailable, "the timestamp oracle is renewing its window")
			} else if err = n.confirmOracle(ctx, term); err == nil {
				return ts, nil
			}
		} else {
			var resp timestampsResponse
			err = n.callOracle(ctx, &timestampsRequest{Count: 1}, &resp)
			if err == nil {
				err = resp.Error.err()
			}
			if err == nil {
				return resp.First, nil
			}
		}
		if !retryable(err) || ctx.Err() != nil {
			return 0, oracleUnavailable(err)
		}
		if berr := backoff(ctx, attempt, deadline, err); berr != nil {
			return 0, oracleUnavailable(berr)
		}
	}
}

// latest returns a timestamp at or above every write version acknowledged
// before the call.
func (n *Node) latest(ctx context.Context) (uint64, error) {
	if term, ok := n.oracleTerm(); ok {
		if ts := n.oracle.Latest(); n.confirmOracle(ctx, term) == nil {
			return ts, nil
		}
	}
	deadline := time.Now().Add(n.retryWindow())
	for attempt := 0; ; attempt++ {
		var resp timestampsResponse
		err := n.callOracle(ctx, &timestampsRequest{}, &resp)
		if err == nil {
			err = resp.Error.err()
		}
		if err == nil {
			return max(resp.Latest, n.versions.seen()), nil
		}
		if term, ok := n.oracleTerm(); ok {
			if ts := n.oracle.Latest(); n.confirmOracle(ctx, term) == nil {
				return ts, nil
			}
		}
		if !retryable(err) || ctx.Err() != nil {
			return 0, oracleUnavailable(err)
		}
		if berr := backoff(ctx, attempt, deadline, err); berr != nil {
			return 0, oracleUnavailable(berr)
		}
	}
}

// callOracle asks the meta shard's leader, the timestamp oracle, for
// timestamps. It gives up on a leader that does not answer within about an
// election timeout (at least a second) — one stopped, say, while another
// took over — with unavailable, so that its caller's retry asks whoever
// leads then. Asking for timestamps changes nothing: an answer that comes
// too late is only wasted.
func (n *Node) callOracle(ctx context.Context, req *timestampsRequest, resp *timestampsResponse) error {
	wait := max(10*n.opts.TickInterval, time.Second)
	actx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	err := n.callMetaLeader(actx, "Timestamps", req, resp)
	if err != nil && ctx.Err() == nil && actx.Err() != nil {
		return kv.Errorf(kv.CodeUnavailable, "the timestamp oracle (the meta shard's leader) did not answer within %v: %v", wait, err)
	}
	return err
}

// callMetaLeader invokes a peer method on the meta shard's leader.
func (n *Node) callMetaLeader(ctx context.Context, method string, req, resp any) error {
	leader := n.leaderOf(cluster.MetaShardID)
	if leader == 0 {
		return kv.Errorf(kv.CodeUnavailable, "the meta shard has no known leader")
	}
	if leader == n.id {
		return kv.Errorf(kv.CodeNotLeader, "the meta shard's leader here is not ready yet")
	}
	return n.callNode(ctx, leader, method, req, resp)
}

// versionSource gives the Host write versions: from the oracle when this
// node leads the meta shard, else from windows fetched from its leader.
//
// A proposal may only use a window fetched after it was queued: an older
// one could hold timestamps below one the oracle issued meanwhile, say for
// a snapshot read that must not see the write. So a proposal queued while
// a fetch is in flight needs the next one. Up to maxFetches fetches run at
// once, so that such a proposal waits for one fetch begun after it came,
// not for the one in flight to end and then for its own.
type versionSource struct {
	// fetchSize is the number of timestamps a window holds.
	fetchSize int
	// local is this node's oracle, used while it is active.
	local interface {
		Active() bool
		TryNext(floor uint64) (uint64, bool)
	}
	// proposalSeq is the Host's ProposalSeq, signal its Signal.
	proposalSeq func() uint64
	signal      func()
	// fetchWindow asks the oracle for count timestamps above floor and
	// returns the first.
	fetchWindow func(ctx context.Context, count int, floor uint64) (uint64, error)
	stop        <-chan struct{}

	mu struct {
		sync.Mutex
		// next..last is the window; seq is the Host's proposal number when
		// its fetch started: only proposals numbered up to seq may use it.
		next, last, seq uint64
		// fetching is the number of fetches in flight; fetchSeq the
		// highest proposal number one of them serves (at least).
		fetching int
		fetchSeq uint64
		// floor is the highest floor asked for since the last fetch.
		floor uint64
		// high is the highest timestamp received.
		high uint64
	}
}

// maxFetches bounds the window fetches a versionSource runs at once.
const maxFetches = 2

var _ replication.SequencedVersionSource = (*versionSource)(nil)

func (v *versionSource) TryNext(floor uint64) (uint64, bool) {
	return v.TryNextAfter(floor, 0)
}

func (v *versionSource) TryNextAfter(floor, seq uint64) (uint64, bool) {
	if v.local.Active() {
		return v.local.TryNext(floor)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if seq <= v.mu.seq && v.mu.next <= v.mu.last && floor < v.mu.last {
		ts := max(v.mu.next, floor+1)
		v.mu.next = ts + 1
		return ts, true
	}
	v.mu.floor = max(v.mu.floor, floor)
	if v.mu.fetching == 0 || v.mu.fetching < maxFetches && seq > v.mu.fetchSeq {
		v.mu.fetching++
		v.mu.fetchSeq = max(v.mu.fetchSeq, seq)
		go v.fetch()
	}
	return 0, false
}

func (v *versionSource) seen() uint64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.mu.high
}

func (v *versionSource) fetch() {
	seq := v.proposalSeq()
	v.mu.Lock()
	floor := v.mu.floor
	v.mu.fetchSeq = max(v.mu.fetchSeq, seq)
	v.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	first, err := v.fetchWindow(ctx, v.fetchSize, floor)
	cancel()
	v.mu.Lock()
	if err == nil {
		last := first + uint64(v.fetchSize) - 1
		// A window serves the proposals queued before its fetch began:
		// one that began earlier than the window held (it ended later)
		// serves fewer, and is dropped.
		if seq >= v.mu.seq || v.mu.next > v.mu.last {
			v.mu.next, v.mu.last, v.mu.seq = first, last, seq
		}
		v.mu.high = max(v.mu.high, last)
	}
	v.mu.Unlock()
	if err != nil {
		select {
		case <-v.stop:
		case <-time.After(20 * time.Millisecond):
		}
	}
	v.mu.Lock()
	v.mu.fetching--
	v.mu.Unlock()
	v.signal()
}

// fetchWindow asks the meta shard's leader for count timestamps above
// floor (versionSource.fetchWindow).
func (n *Node) fetchWindow(ctx context.Context, count int, floor uint64) (uint64, error) {
	var resp timestampsResponse
	if err := n.callMetaLeader(ctx, "Timestamps", &timestampsRequest{Count: count, Floor: floor}, &resp); err != nil {
		return 0, err
	}
	if err := resp.Error.err(); err != nil {
		return 0, err
	}
	return resp.First, nil
}

// registerTransport registers the raft transport's receiving side.
func (n *Node) registerTransport(s grpc.ServiceRegistrar) {
	transport.Register(s, n.host.Deliver)
}

// Serve starts the node's cluster work once its ports are bound: addr and
// peerAddr are the client and peer addresses other nodes and clients use.
func (n *Node) Serve(addr, peerAddr string) {
	n.mu.Lock()
	n.mu.self = cluster.NodeDesc{ID: n.id, Addr: addr, PeerAddr: peerAddr}
	n.mu.Unlock()
	n.bg.Add(1)
	go n.clusterLoop()
	n.startConsistency()
	n.bg.Add(1)
	go n.splitLoop()
}

func (n *Node) self() cluster.NodeDesc {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.mu.self
}

// clusterLoop joins the cluster if needed, keeps this node's membership
// record current and, on the meta shard's leader, gives new nodes their
// meta replicas.
func (n *Node) clusterLoop() {
	defer n.bg.Done()
	t := time.NewTicker(clusterInterval)
	defer t.Stop()
	for i := 0; ; i++ {
		if !n.hasReplica(cluster.MetaShardID) {
			if err := n.join(); err != nil {
				n.log.Warn("joining the cluster failed; retrying", "join", n.opts.Join, "err", err)
			}
		} else {
			n.registerSelf()
			if n.host.Ready(cluster.MetaShardID) {
				n.growMeta()
			}
			if i%8 == 7 {
				n.returnLeadership()
			}
			n.conformShards()
			if i%4 == 3 {
				n.triggerReconcile() // replicas that moved away are collected
			}
			if i%4 == 3 && n.host.Ready(cluster.MetaShardID) {
				n.rebalance()
			}
		}
		if !n.awaitTick(t.C) {
			return
		}
	}
}

// Split and merge steps (splitPending, mergePending) wait on one another
// across nodes: a merge's trigger waits for the right shard to be frozen
// on every node, which waits for the catalog's merge. Each is taken by a
// shard's leader in the cluster loop; at its pace alone a merge would keep
// the right shard frozen (refusing writes, records and resolves) for one
// or two intervals. So the catalog's split or merge and a freeze applied
// here wake the loop (kickSteps), which then takes the shards' steps every
// stepRetryInterval for stepRetries rounds: a step that waited for another
// node's follows within milliseconds.
const (
	stepRetryInterval = 20 * time.Millisecond
	stepRetries       = 10
)

// kickSteps wakes the cluster loop to take split and merge steps now.
func (n *Node) kickSteps() {
	select {
	case n.stepKick <- struct{}{}:
	default:
	}
}

// awaitTick waits for the loop's next tick, taking split and merge steps
// in between when kicked (see stepRetryInterval); false once the node
// stops.
func (n *Node) awaitTick(tick <-chan time.Time) bool {
	var retry <-chan time.Time
	retries := 0
	for {
		select {
		case <-n.stop:
			return false
		case <-tick:
			return true
		case <-n.stepKick:
			retries = stepRetries
		case <-retry:
		}
		if n.hasReplica(cluster.MetaShardID) {
			n.conformShards()
		}
		retry = nil
		if retries > 0 {
			retries--
			retry = time.After(stepRetryInterval)
		}
	}
}

// join asks a member to add this node and creates its (empty) meta replica.
func (n *Node) join() error {
	if len(n.opts.Join) == 0 {
		return errors.New("no meta replica and no --join address")
	}
	self := n.self()
	var lastErr error
	for _, addr := range n.opts.Join {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var resp joinResponse
		err := n.call(ctx, addr, "Join", &joinRequest{Node: self}, &resp)
		cancel()
		if err == nil {
			err = resp.Error.err()
		}
		if err != nil {
			lastErr = err
			continue
		}
		n.mu.Lock()
		for _, d := range resp.Nodes {
			n.mu.nodes[d.ID] = d
		}
		n.mu.nodes[resp.Node.ID] = resp.Node
		n.mu.Unlock()
		if resp.Node.MetaReplica == 0 {
			return fmt.Errorf("node %s answered the join without a meta replica id", addr)
		}
		lr := localReplica{ReplicaID: resp.Node.MetaReplica, Desc: shard.MetaDesc}
		if err := n.host.CreateEmpty(cluster.MetaShardID, func(b *pebble.Batch) error { return n.writeReplica(b, lr) }); err != nil {
			return err
		}
		if err := n.host.AddGroup(lr.Desc, lr.ReplicaID); err != nil {
			return err
		}
		n.mu.Lock()
		n.mu.replicas[cluster.MetaShardID] = lr
		n.mu.Unlock()
		n.log.Info("joined the cluster", "node", n.id, "via", addr, "meta_replica", lr.ReplicaID)
		return nil
	}
	return lastErr
}

func (n *Node) handleJoin(ctx context.Context, req *joinRequest) (*joinResponse, error) {
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return &joinResponse{Error: toPeerError(err)}, nil
	}
	defer done()
	if req.Node.ID == 0 || req.Node.Addr == "" || req.Node.PeerAddr == "" {
		return &joinResponse{Error: toPeerError(kv.Errorf(kv.CodeInvalidArgument, "a joining node needs an id, an address and a peer address"))}, nil
	}
	cmd := shard.EncodeAddNode(req.Node, true)
	if d, ok := n.nodeDesc(req.Node.ID); ok && d.MetaReplica != 0 {
		// A member asks to join: it lost its disk (a member that restarts
		// on its data directory does not join). Its replicas get new raft
		// ids — ids are never reused — and the old ones are replaced.
		n.log.Warn("a member joins again with an empty disk: replacing its replicas", "node", d.ID)
		cmd = shard.EncodeRejoinNode(req.Node)
	}
	res, err := n.propose(ctx, cluster.MetaShardID, cmd)
	if err == nil && res.Err != nil {
		err = res.Err
	}
	if err != nil {
		return &joinResponse{Error: toPeerError(err)}, nil
	}
	n.mu.RLock()
	nodes := make([]cluster.NodeDesc, 0, len(n.mu.nodes))
	for _, d := range n.mu.nodes {
		nodes = append(nodes, d)
	}
	n.mu.RUnlock()
	return &joinResponse{Node: *res.Node, Nodes: nodes}, nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func contains(ids []uint64, id uint64) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// registerSelf keeps this node's membership record current.
func (n *Node) registerSelf() {
	self := n.self()
	if self.Addr == "" {
		return
	}
	cur, ok := n.nodeDesc(n.id)
	if ok && cur.Addr == self.Addr && cur.PeerAddr == self.PeerAddr {
		return
	}
	n.mu.RLock()
	self.MetaReplica = n.mu.replicas[cluster.MetaShardID].ReplicaID
	n.mu.RUnlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := n.propose(ctx, cluster.MetaShardID, shard.EncodeAddNode(self, false))
	if err == nil && res.Err != nil {
		err = res.Err
	}
	if err != nil {
		n.log.Debug("registering the node failed; retrying", "err", err)
	}
}

// growMeta runs on the meta shard's leader: every member's meta replica
// that is not in the group's configuration is added as a learner; a
// learner that caught up is promoted to voter while the group has fewer
// than cluster.MetaReplicas voters on nodes that are not draining; and a
// voter on a draining node is demoted to learner (it keeps the catalog
// until it leaves) once another voter can take its place.
func (n *Node) growMeta() {
	cs, ok := n.host.ConfState(cluster.MetaShardID)
	if !ok {
		return
	}
	n.mu.RLock()
	var want []uint64
	draining := map[uint64]bool{}
	for _, d := range n.mu.nodes {
		if d.MetaReplica != 0 {
			want = append(want, d.MetaReplica)
			draining[d.MetaReplica] = d.Draining
		}
	}
	n.mu.RUnlock()
	sort.Slice(want, func(i, j int) bool { return want[i] < want[j] })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	change := func(t raftpb.ConfChangeType, rid uint64, what string) {
		err := n.host.ProposeConfChange(ctx, cluster.MetaShardID, raftpb.ConfChangeV2{
			Changes: []raftpb.ConfChangeSingle{{Type: t, NodeID: rid}}})
		if err != nil {
			n.log.Warn("changing the meta shard's replicas failed", "change", what, "replica", rid, "err", err)
		} else {
			n.log.Info("meta shard replica changed", "change", what, "replica", rid)
		}
	}
	// Every missing learner in one change (learners do not count for
	// quorum), then every caught-up learner needed as voter in one change
	// (joint consensus, left automatically): the window in which the
	// group has fewer voters than it will have stays one round short.
	var add []raftpb.ConfChangeSingle
	for _, rid := range want {
		if !contains(cs.Voters, rid) && !contains(cs.Learners, rid) {
			add = append(add, raftpb.ConfChangeSingle{Type: raftpb.ConfChangeAddLearnerNode, NodeID: rid})
		}
	}
	if len(add) > 0 {
		if err := n.host.ProposeConfChange(ctx, cluster.MetaShardID, raftpb.ConfChangeV2{Changes: add}); err != nil {
			n.log.Warn("adding meta shard learners failed", "learners", len(add), "err", err)
		} else {
			n.log.Info("meta shard learners added", "learners", len(add))
		}
		return
	}
	for _, rid := range append(append([]uint64(nil), cs.Voters...), cs.Learners...) {
		if !contains(want, rid) {
			// No member holds it any more (its node came back with an
			// empty disk and a new replica id).
			change(raftpb.ConfChangeRemoveNode, rid, "removed: no member holds it")
			return
		}
	}
	live := 0
	for _, v := range cs.Voters {
		if !draining[v] {
			live++
		}
	}
	match, last, _ := n.host.Progress(cluster.MetaShardID)
	if live < cluster.MetaReplicas {
		var promote []raftpb.ConfChangeSingle
		for _, rid := range cs.Learners {
			if live+len(promote) < cluster.MetaReplicas && !draining[rid] && contains(want, rid) && match[rid]+8 >= last {
				promote = append(promote, raftpb.ConfChangeSingle{Type: raftpb.ConfChangeAddNode, NodeID: rid})
			}
		}
		if len(promote) > 0 {
			if err := n.host.ProposeConfChange(ctx, cluster.MetaShardID, raftpb.ConfChangeV2{Changes: promote}); err != nil {
				n.log.Warn("promoting meta shard learners failed", "voters", len(promote), "err", err)
			} else {
				n.log.Info("meta shard learners promoted to voters", "voters", len(promote))
			}
			return
		}
	}
	if live >= min(cluster.MetaReplicas, len(cs.Voters)) {
		self := n.host.Leader(cluster.MetaShardID)
		for _, v := range cs.Voters {
			if !draining[v] {
				continue
			}
			if live == 0 {
				return
			}
			if v == self {
				for _, o := range cs.Voters {
					if !draining[o] && match[o] >= last {
						n.host.TransferLeadership(cluster.MetaShardID, o)
						return
					}
				}
				return
			}
			change(raftpb.ConfChangeAddLearnerNode, v, "draining voter demoted to learner")
			return
		}
	}
}

// returnLeadership hands the shards this node leads but is not the
// preferred leader of (their first replica, spread over the nodes at
// creation) back to the preferred replica once it has caught up, so that
// leaders spread again after a node failed and returned.
func (n *Node) returnLeadership() {
	n.mu.RLock()
	type move struct{ shard, to uint64 }
	var moves []move
	for id := range n.mu.replicas {
		ref, ok := n.mu.shards[id]
		if !ok {
			continue
		}
		pref := ref.coll.Shards[ref.index].Replicas[0]
		if pref.Node != n.id {
			moves = append(moves, move{id, pref.ID})
		}
	}
	n.mu.RUnlock()
	for _, m := range moves {
		if !n.host.Ready(m.shard) {
			continue
		}
		match, last, ok := n.host.Progress(m.shard)
		if !ok || match[m.to] < last {
			continue
		}
		n.host.TransferLeadership(m.shard, m.to)
	}
}

// handOffLeadership transfers the leadership of every shard led here to its
// most caught-up follower before the node stops, so that a clean shutdown
// costs no election timeout. It waits at most about a second.
func (n *Node) handOffLeadership() {
	n.mu.RLock()
	ids := make([]uint64, 0, len(n.mu.replicas))
	for id := range n.mu.replicas {
		ids = append(ids, id)
	}
	n.mu.RUnlock()
	var moved []uint64
	for _, id := range ids {
		if !n.host.Ready(id) {
			continue
		}
		match, last, ok := n.host.Progress(id)
		if !ok {
			continue
		}
		self := n.host.Leader(id)
		var best, bestMatch uint64
		for rid, m := range match {
			if rid != self && m > bestMatch {
				best, bestMatch = rid, m
			}
		}
		cs, _ := n.host.ConfState(id)
		if best == 0 || !contains(cs.Voters, best) || bestMatch+64 < last {
			continue
		}
		n.host.TransferLeadership(id, best)
		moved = append(moved, id)
	}
	deadline := time.Now().Add(time.Second)
	for _, id := range moved {
		for n.host.Ready(id) && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// waitRemoteShard waits until a node holding a replica of shardID (none
// here) reports a leader for it.
func (n *Node) waitRemoteShard(ctx context.Context, shardID uint64) error {
	for {
		if n.hasReplica(shardID) {
			// It came here meanwhile (a split applied in a parent replica
			// here): the caller reads it here.
			return kv.Errorf(kv.CodeUnavailable, "shard %d now has a replica here", shardID)
		}
		for _, id := range n.shardNodes(shardID) {
			// Each node is given a short while: one that stopped with its
			// connections open would hold the wait until ctx ends.
			sctx, cancel := context.WithTimeout(ctx, max(5*n.opts.TickInterval, 500*time.Millisecond))
			var resp statusResponse
			err := n.callNode(sctx, id, "Status", &statusRequest{}, &resp)
			cancel()
			if err == nil && resp.Leaders[shardID] != 0 {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return kv.Errorf(kv.CodeUnavailable, "shard %d has no leader yet: %v", shardID, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// voterNodes returns the node ids of shardID's voters as this node's
// replica knows them (nil when it holds none), and while a change of them
// is under way (a joint configuration) those before it.
func (n *Node) voterNodes(shardID uint64) (voters, outgoing []uint64) {
	cs, ok := n.host.ConfState(shardID)
	if !ok {
		return nil, nil
	}
	return n.replicaNodes(shardID, cs.Voters), n.replicaNodes(shardID, cs.VotersOutgoing)
}

// replicaNodes returns the node ids of replicas rids of shardID, sorted.
func (n *Node) replicaNodes(shardID uint64, rids []uint64) []uint64 {
	var out []uint64
	for _, rid := range rids {
		if id, ok := n.replicaNode(shardID, rid); ok {
			out = append(out, id)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// members returns the membership, by id.
func (n *Node) members() []cluster.NodeDesc {
	n.mu.RLock()
	defer n.mu.RUnlock()
	out := make([]cluster.NodeDesc, 0, len(n.mu.nodes))
	for _, d := range n.mu.nodes {
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// placementNodes orders the members for a new collection: fewest replicas
// first, then by id.
func (n *Node) placementNodes() []uint64 {
	n.mu.RLock()
	load := make(map[uint64]int, len(n.mu.nodes))
	for id, d := range n.mu.nodes {
		if !d.Draining {
			load[id] = 0
		}
	}
	for _, c := range n.mu.catalog {
		for _, s := range c.Shards {
			for _, r := range s.Replicas {
				if _, ok := load[r.Node]; ok {
					load[r.Node]++
				}
			}
		}
	}
	n.mu.RUnlock()
	if len(load) == 0 {
		return []uint64{n.id}
	}
	ids := make([]uint64, 0, len(load))
	for id := range load {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool {
		if load[ids[i]] != load[ids[j]] {
			return load[ids[i]] < load[ids[j]]
		}
		return ids[i] < ids[j]
	})
	return ids
}

// sortedCollections returns the collections of the catalog here, by name.
func (n *Node) sortedCollections() []*cluster.CollectionDesc {
	n.mu.RLock()
	colls := make([]*cluster.CollectionDesc, 0, len(n.mu.catalog))
	for _, c := range n.mu.catalog {
		colls = append(colls, c)
	}
	n.mu.RUnlock()
	sort.Slice(colls, func(i, j int) bool { return colls[i].Name < colls[j].Name })
	return colls
}

// ClusterStatus describes the cluster as this node sees it: members and
// their health, and every shard with its replicas and leader.
func (n *Node) ClusterStatus(ctx context.Context) (kv.ClusterStatus, error) {
	members := n.members()
	var st kv.ClusterStatus
	leaders := n.localLeaders()
	type answer struct {
		id   uint64
		resp *statusResponse
	}
	answers := make(chan answer, len(members))
	for _, m := range members {
		if m.ID == n.id {
			continue
		}
		go func(m cluster.NodeDesc) {
			ctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			var resp statusResponse
			if err := n.call(ctx, m.PeerAddr, "Status", &statusRequest{}, &resp); err != nil {
				answers <- answer{m.ID, nil}
				return
			}
			answers <- answer{m.ID, &resp}
		}(m)
	}
	healthy := map[uint64]bool{n.id: true}
	holds := map[uint64]int{n.id: len(leaders) - btoi(n.hasReplica(cluster.MetaShardID))}
	for range len(members) - 1 {
		a := <-answers
		if a.resp == nil {
			continue
		}
		healthy[a.id] = true
		_, meta := a.resp.Leaders[cluster.MetaShardID]
		holds[a.id] = len(a.resp.Leaders) - btoi(meta)
		for s, l := range a.resp.Leaders {
			if _, ok := leaders[s]; !ok || leaders[s] == 0 {
				leaders[s] = l
			}
		}
	}
	if len(members) == 0 {
		self := n.self()
		members = []cluster.NodeDesc{self}
	}
	held := map[uint64]int{}
	n.mu.RLock()
	for _, c := range n.mu.catalog {
		for _, s := range c.Shards {
			for _, r := range s.Replicas {
				held[r.Node]++
			}
		}
	}
	n.mu.RUnlock()
	for _, m := range members {
		st.Nodes = append(st.Nodes, kv.NodeStatus{ID: m.ID, Addr: m.Addr, PeerAddr: m.PeerAddr, Healthy: healthy[m.ID],
			Draining: m.Draining, Replicas: held[m.ID], Held: -1})
		if h, ok := holds[m.ID]; ok {
			st.Nodes[len(st.Nodes)-1].Held = h
		}
		if err := n.host.WritesRefused(); (m.ID == n.id || m.ID == 0) && err != nil { // 0: self, not yet a member
			st.Nodes[len(st.Nodes)-1].WritesRefused = err.Err.Message
		}
	}
	meta := kv.ShardStatus{Collection: "", Shard: cluster.MetaShardID, Replicas: n.shardNodes(cluster.MetaShardID), Leader: leaders[cluster.MetaShardID]}
	meta.Voters, meta.VotersOutgoing = n.voterNodes(cluster.MetaShardID)
	st.Shards = append(st.Shards, meta)
	for _, c := range n.sortedCollections() {
		for _, s := range c.Shards {
			ss := kv.ShardStatus{Collection: c.Name, Shard: s.ID, Leader: leaders[s.ID]}
			ss.Voters, ss.VotersOutgoing = n.voterNodes(s.ID)
			for _, r := range s.Replicas {
				ss.Replicas = append(ss.Replicas, r.Node)
			}
			st.Shards = append(st.Shards, ss)
		}
	}
	n.fillConsistency(st.Shards)
	return st, nil
}
