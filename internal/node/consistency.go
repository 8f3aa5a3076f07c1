package node

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/shard"
)

// Replica consistency checks.
//
// A check of a shard proposes a KindChecksum entry named by a random id.
// Every replica that applies it sums its replicated state as of that log
// index (shard.Checksum; see internal/shard/checksum.go for what the sum
// covers) and keeps the last few sums of each shard in memory, filled from
// the Host's Applied hook. The node that runs the check then asks the node
// of every replica in the shard's configuration for its sum of that id
// over the peer port (service groupkv.peer.v1.Consistency), waiting a
// bounded time for it to apply the entry, and compares the answers:
//
//   - ok: every replica answered with the same sum;
//   - mismatch: two replicas answered with different sums. The replicas
//     outside the largest group of equal sums, if it is a strict majority
//     of the answers, are named as diverged (else every replica is), the
//     counter groupkv_replica_checksum_mismatches_total goes up and an
//     error is logged with the shard, index, replicas and sums;
//   - incomplete: the answers agree but a replica did not answer (down,
//     behind, or past the entry through a raft snapshot).
//
// The outcome is kept on the node that ran the check and sent to every
// other member, so that cluster status on any node shows the last outcome
// it knows of each shard. The leader of each shard checks it every
// Options.ConsistencyInterval; CheckShard and CheckConsistency run checks
// on demand from any node.

// DefaultConsistencyRate is how many bytes per second a replica reads
// when it sums its shard for a consistency check, unless
// Options.ConsistencyRate says otherwise.
const DefaultConsistencyRate = 8 << 20

const (
	consistencyService = "groupkv.peer.v1.Consistency"

	// checksumApplyWait bounds how long a check waits for a replica to
	// apply its entry; checksumWait, how long for it to apply the entry and
	// sum its shard (off its apply loop, at Options.ConsistencyRate: a
	// minute for 512 MiB at 8 MiB/s).
	checksumApplyWait = 5 * time.Second
	checksumWait      = 5 * time.Minute
	// checksumsKept is how many sums of each shard a replica keeps.
	checksumsKept = 8
	// skippedGrace is how long a replica that applied past a check's index
	// without its sum is waited for before it is deemed to have skipped
	// the entry (a raft snapshot).
	skippedGrace = 500 * time.Millisecond
	// consistencyCheckTimeout bounds one periodic check.
	consistencyCheckTimeout = 6 * time.Minute
	// reportTimeout bounds sending an outcome to the other members.
	reportTimeout = time.Second
)

func sortIDs(ids []uint64) { sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] }) }

// consistencyState is a node's consistency check state: the sums its
// replicas computed and the last outcome it knows of each shard.
type consistencyState struct {
	mismatches prometheus.Counter
	checks     *prometheus.CounterVec

	mu struct {
		sync.Mutex
		// sums are the last checksums applied here, by shard, oldest
		// first; each is computed off the apply loop (ChecksumJob.Done).
		sums map[uint64][]*shard.ChecksumJob
		// changed is closed and replaced when a checksum is added.
		changed chan struct{}
		// results are the last outcomes known here, by shard.
		results map[uint64]kv.ConsistencyCheck
	}
}

// consistency returns n's consistency state.
func (n *Node) consistency() *consistencyState { return n.cstate }

// newConsistencyState returns a node's consistency state and registers its
// metrics.
func newConsistencyState(n *Node) *consistencyState {
	st := &consistencyState{
		mismatches: registerCounter(n.opts.Registry, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "groupkv_replica_checksum_mismatches_total",
			Help: "Consistency checks run by this node that found replicas of a shard with different checksums at the same log index.",
		})).(prometheus.Counter),
		checks: registerCounter(n.opts.Registry, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "groupkv_replica_consistency_checks_total",
			Help: "Consistency checks run by this node, by outcome (ok, mismatch, incomplete).",
		}, []string{"result"})).(*prometheus.CounterVec),
	}
	st.mu.sums = make(map[uint64][]*shard.ChecksumJob)
	st.mu.changed = make(chan struct{})
	st.mu.results = make(map[uint64]kv.ConsistencyCheck)
	return st
}

// registerCounter registers c on reg, or returns the collector already
// registered under its name.
// counter registers (or finds, when registered before) the counter name.
func counter(reg *prometheus.Registry, name, help string) prometheus.Counter {
	return registerCounter(reg, prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})).(prometheus.Counter)
}

func registerCounter(reg *prometheus.Registry, c prometheus.Collector) prometheus.Collector {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			return are.ExistingCollector
		}
		panic(err)
	}
	return c
}

// noteChecksum records the sum of an applied KindChecksum (called from the
// Host's Applied hook for every applied command; it must not block).
func (n *Node) noteChecksum(shardID uint64, res shard.Result) {
	if res.Checksum == nil {
		return
	}
	st := n.consistency()
	st.mu.Lock()
	defer st.mu.Unlock()
	sums := st.mu.sums[shardID]
	for _, c := range sums {
		if c.ID == res.Checksum.ID {
			return // the same check applied twice (a retried proposal)
		}
	}
	if len(sums) >= checksumsKept {
		sums = append(sums[:0], sums[1:]...)
	}
	st.mu.sums[shardID] = append(sums, res.Checksum)
	close(st.mu.changed)
	st.mu.changed = make(chan struct{})
}

// localChecksum waits until this node's replica of shardID has applied
// check id and computed its sum, and returns it. index, when not 0, is the
// check's log index: a replica that applied past it without the check (it
// was restored from a snapshot) fails soon after.
func (n *Node) localChecksum(ctx context.Context, shardID, id, index uint64) (shard.Checksum, error) {
	if !n.hasReplica(shardID) {
		return shard.Checksum{}, kv.Errorf(kv.CodeUnavailable, "node %d holds no replica of shard %d", n.id, shardID)
	}
	st := n.consistency()
	var past time.Time // when the replica was first seen past index
	applyBy := time.Now().Add(checksumApplyWait)
	for {
		st.mu.Lock()
		for _, j := range st.mu.sums[shardID] {
			if j.ID == id {
				st.mu.Unlock()
				return n.awaitChecksum(ctx, shardID, j)
			}
		}
		changed := st.mu.changed
		st.mu.Unlock()
		if index != 0 {
			// The Applied hook runs a little after the applied index is
			// published: a replica past the index gets a grace period.
			if applied, ok := n.host.AppliedIndex(shardID); ok && applied >= index {
				if past.IsZero() {
					past = time.Now()
				} else if time.Since(past) > skippedGrace {
					return shard.Checksum{}, kv.Errorf(kv.CodeUnavailable, "node %d applied shard %d past index %d without computing check %d (restored from a snapshot)", n.id, shardID, index, id)
				}
			}
		}
		if time.Now().After(applyBy) {
			applied, _ := n.host.AppliedIndex(shardID)
			return shard.Checksum{}, kv.Errorf(kv.CodeUnavailable, "node %d did not apply check %d of shard %d within %v (applied index %d)", n.id, id, shardID, checksumApplyWait, applied)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			applied, _ := n.host.AppliedIndex(shardID)
			return shard.Checksum{}, kv.Errorf(kv.CodeUnavailable, "node %d did not apply check %d of shard %d in time (applied index %d): %v", n.id, id, shardID, applied, ctx.Err())
		case <-n.stop:
			return shard.Checksum{}, kv.Errorf(kv.CodeUnavailable, "node %d is shutting down", n.id)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// awaitChecksum waits for j, applied here, to be computed.
func (n *Node) awaitChecksum(ctx context.Context, shardID uint64, j *shard.ChecksumJob) (shard.Checksum, error) {
	select {
	case <-j.Done():
	case <-ctx.Done():
		return shard.Checksum{}, kv.Errorf(kv.CodeUnavailable, "node %d did not finish summing shard %d for check %d in time: %v", n.id, shardID, j.ID, ctx.Err())
	case <-n.stop:
		return shard.Checksum{}, kv.Errorf(kv.CodeUnavailable, "node %d is shutting down", n.id)
	}
	if err := j.Err(); err != nil {
		return shard.Checksum{}, kv.Errorf(kv.CodeUnavailable, "node %d: %v", n.id, err)
	}
	return j.Checksum, nil
}

// CheckConsistency runs a consistency check of each of shards now, one
// after the other, or of every shard of the cluster (the meta shard first,
// then the collections' by name) when shards is empty
// (kv.ConsistencyChecker). An unknown or repeated shard fails the call
// before any check runs; a check that could not be started is answered as
// incomplete with the reason in its Errors.
func (n *Node) CheckConsistency(ctx context.Context, shards []uint64) ([]kv.ConsistencyCheck, error) {
	all, colls := n.shardsByCollection()
	if len(shards) == 0 {
		shards = all
	}
	seen := make(map[uint64]bool, len(shards))
	for _, id := range shards {
		if _, ok := colls[id]; !ok {
			return nil, kv.Errorf(kv.CodeNotFound, "shard %d not found: this node knows of shards %s", id, idRanges(all))
		}
		if seen[id] {
			return nil, kv.Errorf(kv.CodeInvalidArgument, "shard %d is named twice", id)
		}
		seen[id] = true
	}
	out := make([]kv.ConsistencyCheck, 0, len(shards))
	for _, id := range shards {
		r, err := n.CheckShard(ctx, id)
		if err != nil {
			r = kv.ConsistencyCheck{Shard: id, Status: kv.ConsistencyIncomplete, By: n.id, At: time.Now(),
				Errors: []string{"the check could not be run: " + err.Error()}}
		}
		r.Collection = colls[id]
		out = append(out, r)
	}
	return out, nil
}

// shardsByCollection returns the ids of the cluster's shards as the catalog
// here has them, the meta shard first and then each collection's in the
// order of its name and its shards, and the collection of each ("" for the
// meta shard).
func (n *Node) shardsByCollection() ([]uint64, map[uint64]string) {
	ids := []uint64{cluster.MetaShardID}
	colls := map[uint64]string{cluster.MetaShardID: ""}
	for _, c := range n.sortedCollections() {
		for _, s := range c.Shards {
			ids = append(ids, s.ID)
			colls[s.ID] = c.Name
		}
	}
	return ids, colls
}

// idRanges writes sorted ids compactly: "1, 3-6, 9".
func idRanges(ids []uint64) string {
	ids = slices.Clone(ids)
	slices.Sort(ids)
	var b strings.Builder
	for i := 0; i < len(ids); {
		j := i
		for j+1 < len(ids) && ids[j+1] == ids[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		if j > i {
			fmt.Fprintf(&b, "%d-%d", ids[i], ids[j])
		} else {
			fmt.Fprintf(&b, "%d", ids[i])
		}
		i = j + 1
	}
	return b.String()
}

// CheckShard runs a consistency check of shardID now: the replicas sum
// their state at one log index and the sums are compared. An error means
// the check could not be started (no leader, unknown shard); a check that
// ran reports its outcome in the result, which is also recorded for
// cluster status.
func (n *Node) CheckShard(ctx context.Context, shardID uint64) (kv.ConsistencyCheck, error) {
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return kv.ConsistencyCheck{}, err
	}
	defer done()
	// A check in flight ends when the node stops: Close waits for it.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-n.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	if shardID != cluster.MetaShardID {
		n.mu.RLock()
		_, ok := n.mu.shards[shardID]
		n.mu.RUnlock()
		if !ok {
			return kv.ConsistencyCheck{}, kv.Errorf(kv.CodeNotFound, "shard %d not found", shardID)
		}
	}
	id := rand.Uint64() | 1 // never 0
	res, err := n.propose(ctx, shardID, shard.EncodeChecksum(id))
	if err != nil {
		return kv.ConsistencyCheck{}, err
	}
	if res.Err != nil {
		return kv.ConsistencyCheck{}, res.Err
	}
	var index uint64
	if res.Checksum != nil {
		index = res.Checksum.Index // proposed here; unknown when forwarded
	}
	targets, unknown := n.checksumTargets(shardID)
	out := kv.ConsistencyCheck{Shard: shardID, ID: id, Replicas: targets, By: n.id, Errors: unknown}

	type answer struct {
		node uint64
		sum  shard.Checksum
		err  error
	}
	wctx, wcancel := context.WithTimeout(ctx, checksumWait)
	defer wcancel()
	answers := make(chan answer, len(targets))
	for _, node := range targets {
		go func(node uint64) {
			if node == n.id {
				c, err := n.localChecksum(wctx, shardID, id, index)
				answers <- answer{node, c, err}
				return
			}
			var resp checksumResponse
			err := n.callConsistency(wctx, node, "Checksum", &checksumRequest{Shard: shardID, ID: id, Index: index}, &resp)
			if err == nil {
				err = resp.Error.err()
			}
			if err == nil && resp.Checksum == nil {
				err = kv.Errorf(kv.CodeInternal, "node %d answered without a checksum", node)
			}
			a := answer{node: node, err: err}
			if err == nil {
				a.sum = *resp.Checksum
			}
			answers <- a
		}(node)
	}
	sums := map[uint64]shard.Checksum{}
	for range targets {
		a := <-answers
		if a.err != nil {
			out.Missing = append(out.Missing, a.node)
			out.Errors = append(out.Errors, fmt.Sprintf("node %d: %v", a.node, a.err))
			continue
		}
		sums[a.node] = a.sum
	}
	sortIDs(out.Missing)
	sort.Strings(out.Errors)
	compareChecksums(&out, sums)
	out.At = time.Now()

	st := n.consistency()
	st.checks.WithLabelValues(out.Status).Inc()
	switch out.Status {
	case kv.ConsistencyMismatch:
		st.mismatches.Inc()
		n.log.Error("replica consistency check failed: replicas of a shard differ at the same log index",
			"shard", shardID, "index", out.Index, "replicas", out.Replicas, "mismatched", out.Mismatched,
			"sums", out.Sums, "summary", out.Summary())
	case kv.ConsistencyIncomplete:
		n.log.Warn("replica consistency check incomplete", "shard", shardID, "index", out.Index,
			"replicas", out.Replicas, "missing", out.Missing, "errors", out.Errors)
	default:
		n.log.Debug("replica consistency check ok", "shard", shardID, "index", out.Index, "replicas", out.Replicas)
	}
	n.recordConsistency(out)
	n.reportConsistency(ctx, out)
	return out, nil
}

// compareChecksums fills out's index, sums and status from the answers.
func compareChecksums(out *kv.ConsistencyCheck, sums map[uint64]shard.Checksum) {
	out.Sums = make(map[uint64]string, len(sums))
	groups := map[string][]uint64{}
	for node, c := range sums {
		// The index is in the sum: sums at different indexes differ.
		key := fmt.Sprintf("%d/%x", c.Index, c.Sum)
		groups[key] = append(groups[key], node)
		out.Sums[node] = hex.EncodeToString(c.Sum)
		out.Index = max(out.Index, c.Index)
	}
	switch {
	case len(groups) > 1:
		out.Status = kv.ConsistencyMismatch
		var major []uint64
		for _, g := range groups {
			if 2*len(g) > len(sums) {
				major = g
			}
		}
		for node := range sums {
			if !contains(major, node) {
				out.Mismatched = append(out.Mismatched, node)
			}
		}
		sortIDs(out.Mismatched)
	case len(out.Missing) > 0 || len(sums) == 0 || len(out.Errors) > 0:
		out.Status = kv.ConsistencyIncomplete
	default:
		out.Status = kv.ConsistencyOK
	}
}

// checksumTargets returns the nodes of shardID's replicas: those of its raft
// configuration when this node holds a replica, else the catalog's. unknown
// describes replicas whose node is not known.
func (n *Node) checksumTargets(shardID uint64) (nodes []uint64, unknown []string) {
	cs, ok := n.host.ConfState(shardID)
	if !ok {
		nodes = n.shardNodes(shardID)
		sortIDs(nodes)
		return nodes, nil
	}
	seen := map[uint64]bool{}
	for _, set := range [][]uint64{cs.Voters, cs.Learners, cs.VotersOutgoing, cs.LearnersNext} {
		for _, rid := range set {
			node, ok := n.replicaNode(shardID, rid)
			switch {
			case !ok:
				unknown = append(unknown, fmt.Sprintf("replica %d of shard %d: its node is not known here", rid, shardID))
			case !seen[node]:
				seen[node] = true
				nodes = append(nodes, node)
			}
		}
	}
	sortIDs(nodes)
	return nodes, unknown
}

// recordConsistency keeps r as the last outcome known here of its shard,
// unless a check at a later index is known already.
func (n *Node) recordConsistency(r kv.ConsistencyCheck) {
	st := n.consistency()
	st.mu.Lock()
	defer st.mu.Unlock()
	if old, ok := st.mu.results[r.Shard]; ok && r.Index != 0 && r.Index < old.Index {
		return
	}
	st.mu.results[r.Shard] = r
}

// LastConsistency returns the last outcome of a check of shardID known
// here.
func (n *Node) LastConsistency(shardID uint64) (kv.ConsistencyCheck, bool) {
	st := n.consistency()
	st.mu.Lock()
	defer st.mu.Unlock()
	r, ok := st.mu.results[shardID]
	return r, ok
}

// fillConsistency sets the Consistency of every shard of a cluster status
// to the last outcome known here.
func (n *Node) fillConsistency(shards []kv.ShardStatus) {
	st := n.consistency()
	st.mu.Lock()
	defer st.mu.Unlock()
	for i := range shards {
		if r, ok := st.mu.results[shards[i].Shard]; ok {
			shards[i].Consistency = r.Summary()
		}
	}
}

// reportConsistency sends r to every other member, best effort.
func (n *Node) reportConsistency(ctx context.Context, r kv.ConsistencyCheck) {
	ctx, cancel := context.WithTimeout(ctx, reportTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for _, m := range n.members() {
		if m.ID == n.id {
			continue
		}
		wg.Add(1)
		go func(id uint64) {
			defer wg.Done()
			var resp consistencyReportResponse
			if err := n.callConsistency(ctx, id, "Report", &consistencyReport{Result: r}, &resp); err != nil {
				n.log.Debug("sending a consistency check outcome failed", "node", id, "shard", r.Shard, "err", err)
			}
		}(m.ID)
	}
	wg.Wait()
}

// startConsistency starts the periodic checks of the shards led here (from
// Serve).
func (n *Node) startConsistency() {
	n.consistency() // the metrics exist from the start
	n.bg.Add(1)
	go n.consistencyLoop()
}

func (n *Node) consistencyLoop() {
	defer n.bg.Done()
	if n.opts.ConsistencyInterval < 0 {
		return
	}
	n.every(n.opts.ConsistencyInterval, n.checkLedShards)
}

// checkLedShards checks every shard this node leads, one at a time.
func (n *Node) checkLedShards() {
	n.mu.RLock()
	ids := make([]uint64, 0, len(n.mu.replicas))
	for id := range n.mu.replicas {
		ids = append(ids, id)
	}
	n.mu.RUnlock()
	sortIDs(ids)
	for _, id := range ids {
		if !n.host.Ready(id) {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), consistencyCheckTimeout)
		if _, err := n.CheckShard(ctx, id); err != nil {
			n.log.Warn("could not run a replica consistency check", "shard", id, "err", err)
		}
		cancel()
		select {
		case <-n.stop:
			return
		default:
		}
	}
}

// Peer service.

type checksumRequest struct {
	Shard uint64 `json:"shard"`
	ID    uint64 `json:"id"`
	// Index is the check's log index, 0 when the asking node does not
	// know it.
	Index uint64 `json:"index,omitempty"`
}

type checksumResponse struct {
	Checksum *shard.Checksum `json:"checksum,omitempty"`
	Error    *peerError      `json:"error,omitempty"`
}

type consistencyReport struct {
	Result kv.ConsistencyCheck `json:"result"`
}

type consistencyReportResponse struct{}

// registerConsistency registers the consistency check service on s (from
// RegisterPeer).
func (n *Node) registerConsistency(s grpc.ServiceRegistrar) {
	s.RegisterService(&grpc.ServiceDesc{
		ServiceName: consistencyService,
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{
			{MethodName: "Checksum", Handler: unary(n.handleChecksum)},
			{MethodName: "Report", Handler: unary(n.handleConsistencyReport)},
		},
	}, n)
}

func (n *Node) handleChecksum(ctx context.Context, req *checksumRequest) (*checksumResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, checksumWait)
	defer cancel()
	c, err := n.localChecksum(ctx, req.Shard, req.ID, req.Index)
	if err != nil {
		return &checksumResponse{Error: toPeerError(err)}, nil
	}
	return &checksumResponse{Checksum: &c}, nil
}

func (n *Node) handleConsistencyReport(_ context.Context, req *consistencyReport) (*consistencyReportResponse, error) {
	n.recordConsistency(req.Result)
	return &consistencyReportResponse{}, nil
}

// callConsistency invokes a method of the consistency service on node id.
func (n *Node) callConsistency(ctx context.Context, id uint64, method string, req, resp any) error {
	nd, ok := n.nodeDesc(id)
	if !ok || nd.PeerAddr == "" {
		return kv.Errorf(kv.CodeUnavailable, "node %d is not a known member", id)
	}
	c, err := n.peers.conn(nd.PeerAddr)
	if err != nil {
		return kv.Errorf(kv.CodeUnavailable, "connecting to node %d: %v", id, err)
	}
	if err := c.Invoke(ctx, "/"+consistencyService+"/"+method, req, resp); err != nil {
		return kv.Errorf(kv.CodeUnavailable, "node %d: %s: %v", id, method, err)
	}
	return nil
}
