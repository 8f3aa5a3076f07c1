package node

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/group"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/replication"
	"github.com/groupkv/groupkv/internal/shard"
	"github.com/groupkv/groupkv/internal/storage"
	"github.com/groupkv/groupkv/internal/transport"
	"github.com/groupkv/groupkv/internal/txn"
	"github.com/groupkv/groupkv/internal/workpool"
)

// Node-local metadata items (storage.NodeKey).
const (
	metaNodeID  = "node_id"
	metaReplica = "replica/" // + 16 hex digits of the shard id -> localReplica JSON
)

// localReplica is the node-local record of a shard replica held here.
type localReplica struct {
	ReplicaID uint64     `json:"replica_id"`
	Desc      shard.Desc `json:"desc"`
}

// Node is one groupkv node. It implements kv.Backend.
type Node struct {
	opts    Options
	id      uint64
	eng     *storage.Engine
	host    *replication.Host
	oracle  *cluster.Oracle
	metrics *metrics
	log     *slog.Logger

	// locks serialize the writes of a key of a tag collection (placement).
	locks keyLocks

	// reconcileMu serializes reconcile runs.
	reconcileMu sync.Mutex
	// silent are the nodes whose calls were abandoned lately (peer.go).
	silent silentNodes
	// childMu orders the two starts of a split's child replica: by the
	// split applied in the parent replica here (onSplit, in the raft loop)
	// and by reconcile (see startChild).
	childMu sync.Mutex

	mu struct {
		sync.RWMutex
		// catalog mirrors the meta shard's applied catalog.
		catalog map[string]*cluster.CollectionDesc
		// replicas are the shard replicas held by this node.
		replicas map[uint64]localReplica
		// nodes mirrors the membership records of the meta shard.
		nodes map[uint64]cluster.NodeDesc
		// shards indexes the catalog's shards by id.
		shards map[uint64]shardRef
		// self is this node's record as it should be (addresses from Serve).
		self cluster.NodeDesc
		// merged indexes the catalog's merged shards (CollectionDesc.Merged)
		// by id.
		merged map[uint64]cluster.ShardDesc
		// mergedAway maps the shards whose replica here a merge removed to
		// the shard that took them in, for requests routed by a catalog
		// that has not caught up (merge.go).
		mergedAway map[uint64]uint64
		// splitAt is when a split of, or into, a shard was applied here
		// (size-based merges leave such shards alone for a while).
		splitAt map[uint64]time.Time
	}

	// ltabs are the lock tables of the shards this node leads; txns the
	// transaction attempts it coordinates (txn_leader.go, txn_coord.go);
	// outcomes how the session attempts it coordinated ended
	// (txn_outcomes.go); forgetter the records of finished transactions
	// it removes once their retention passed (txn_forget.go).
	ltabs        lockTables
	txns         txnSessions
	outcomes     txnOutcomes
	forgetter    *recordForgetter
	groups       groupState
	plainCounter atomic.Uint64

	tr       *transport.GRPC
	peers    peers
	cstate   *consistencyState
	versions *versionSource

	// opsMu is held shared by every client operation for its whole run and
	// exclusively by Close, so that the engine is never closed under one.
	opsMu sync.RWMutex

	// confirmed are the frozen states nodes reported for merges this
	// node's left shards lead (mergePending); guarded by confirmMu.
	confirmMu sync.Mutex
	confirmed map[confirmKey]shard.FrozenState

	// knobs change the node's behaviour in tests only.
	knobs struct {
		// holdMergeTrigger keeps leaders here from proposing merge
		// triggers: a merge stays with its right shard frozen.
		holdMergeTrigger atomic.Bool
		// skipResolves keeps coordinators here from resolving their
		// committed attempts' intents (and so from marking their
		// records), as if they stopped right after the commit point.
		skipResolves atomic.Bool
		// beforeLast, when set, runs in a commit after every other
		// participant prepared and before the record's shard commits
		// last.
		beforeLast atomic.Pointer[func()]
		// lockedRead, when set, runs on a shard's leader after a
		// transaction read keys under its locks there, before the locks
		// are checked again.
		lockedRead atomic.Pointer[func(shardID uint64)]
		// beforePendingCheck, when set, runs before a transaction's scan
		// or tag query confirms its record is still PENDING.
		beforePendingCheck atomic.Pointer[func(txn.Meta)]
		// resolveGather, when not 0, replaces resolveGather (a
		// duration).
		resolveGather atomic.Int64
		// cutShard, when set, drops the raft messages of one shard
		// between this node and one node (both ways if set on both).
		cutShard atomic.Pointer[shardCut]
		// atMerge, when set, runs in the raft loop once a merge trigger's
		// apply was committed here (not synced), before the node records
		// the merge.
		atMerge atomic.Pointer[func()]
	}

	stop chan struct{}
	bg   sync.WaitGroup
	// workers run the fan-outs of transactions (prepares, resolves) on
	// goroutines that keep their stacks.
	workers *workpool.Pool
	// resolves gathers the resolves sent to each shard (txn_resolves.go).
	resolves resolveQueue
	// latestCache caches keys' newest versions for reads (nil: none).
	latestCache *shard.LatestCache
	// gcThresholds is the node's view of its shards' GC thresholds, which
	// reads check after they read (checkRetained).
	gcThresholds *shard.GCThresholds

	// endOps is n.opsMu.RUnlock as a function value, made once: beginAsync
	// returns it on every async put and every GetNow.
	endOps func()

	closeMu sync.Mutex
	closed  bool
	// closeDone is closed when close has returned closeErr (Close may
	// have stopped waiting for it).
	closeDone chan struct{}
	closeErr  error
	reconcil  chan struct{}
	// stepKick wakes the cluster loop to take the next step of a split or
	// a merge now instead of at its next tick (kickSteps).
	stepKick chan struct{}
}

var _ kv.Backend = (*Node)(nil)
var _ kv.ConsistencyChecker = (*Node)(nil)

// Open opens the node stored in opts.DataDir, creating it if needed, and
// starts its raft groups. It returns before the shards have leaders; see
// Ready and WaitReady.
func Open(opts Options) (*Node, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	eng, err := storage.Open(opts.DataDir, storage.Options{FS: opts.FS, Logger: opts.Logger, BackgroundFailureLimit: opts.StorageFailureLimit, MemTableSize: opts.MemTableSize, MinFreeBytes: opts.MinFreeBytes, OpenLow: len(opts.Join) == 0})
	if err != nil {
		return nil, err
	}
	n := &Node{opts: opts, eng: eng, log: opts.Logger, stop: make(chan struct{}), closeDone: make(chan struct{}), workers: workpool.New(), reconcil: make(chan struct{}, 1), stepKick: make(chan struct{}, 1)}
	n.endOps = n.opsMu.RUnlock
	n.initGroups()
	n.mu.catalog = make(map[string]*cluster.CollectionDesc)
	n.mu.replicas = make(map[uint64]localReplica)
	n.mu.nodes = make(map[uint64]cluster.NodeDesc)
	n.mu.shards = make(map[uint64]shardRef)
	n.mu.merged = make(map[uint64]cluster.ShardDesc)
	n.mu.mergedAway = make(map[uint64]uint64)
	n.mu.splitAt = make(map[uint64]time.Time)
	n.confirmed = make(map[confirmKey]shard.FrozenState)
	if err := n.start(); err != nil {
		if n.host != nil {
			if n.host.HasFailed() {
				// What stopped the start is the storage failure (a low
				// disk found as it started), not the step that met it.
				err = n.failedError()
			}
			n.host.Stop()
		}
		eng.Close()
		return nil, err
	}
	return n, nil
}

func (n *Node) start() error {
	id, err := storage.GetUint64(n.eng.DB, storage.NodeKey(metaNodeID))
	if err != nil {
		return err
	}
	switch {
	case id == 0:
		id = n.opts.NodeID
		if id == 0 {
			id = 1
		}
		if err := n.eng.Set(storage.NodeKey(metaNodeID), binary.BigEndian.AppendUint64(nil, id), pebble.Sync); err != nil {
			return err
		}
	case n.opts.NodeID != 0 && n.opts.NodeID != id:
		return fmt.Errorf("node: data directory %s belongs to node %d, not node %d; pass --node-id %d or use another --data-dir",
			n.opts.DataDir, id, n.opts.NodeID, id)
	}
	n.id = id
	n.metrics = newMetrics(n.opts.Registry, n.eng)
	n.cstate = newConsistencyState(n)
	n.forgetter = newRecordForgetter(n.opts.Registry)
	n.oracle = cluster.NewOracle(n.opts.Clock, n.persistTSO)
	n.versions = &versionSource{fetchSize: 256, local: n.oracle, fetchWindow: n.fetchWindow, stop: n.stop,
		proposalSeq: func() uint64 { return n.host.ProposalSeq() }, signal: func() { n.host.Signal() }}
	n.peers.dialOptions = n.dialOptions
	n.tr = transport.NewGRPC(transport.Options{Resolver: n.resolve, Logger: n.log,
		SnapshotSent: func(shardID, to uint64, ok bool) { n.host.ReportSnapshot(shardID, to, ok) },
		DialOptions: func(addr string) []grpc.DialOption {
			return n.dialOptions(addr, grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(maxPeerMessage)))
		}})
	if n.opts.LatestCacheBytes >= 0 {
		n.latestCache = shard.NewLatestCache(cmp.Or(n.opts.LatestCacheBytes, 64<<20))
	}
	n.gcThresholds = shard.NewGCThresholds()
	n.host = replication.NewHost(replication.Config{
		LatestCache:   n.latestCache,
		GCThresholds:  n.gcThresholds,
		NodeID:        id,
		Engine:        n.eng,
		Versions:      n.versions,
		Unversioned:   func(id uint64) bool { return id == cluster.MetaShardID },
		Transport:     n.tr,
		TickInterval:  n.opts.TickInterval,
		TruncateAfter: n.opts.TruncateAfter,
		ChecksumRate:  n.opts.ConsistencyRate,
		Metrics:       n.metrics.repl,
		Logger:        n.log,
		MergeBatch: func(b *pebble.Batch, right uint64) error {
			return b.Delete(replicaKey(right), nil)
		},
		Hooks: replication.Hooks{
			Applied:         n.onApplied,
			LeaderReady:     n.onLeaderReady,
			LeaderLost:      n.onLeaderLost,
			SnapshotApplied: n.onSnapshotApplied,
		},
	})

	// Data found damaged on disk stops the node: its replicas elsewhere
	// hold good copies, and a node that went on would answer errors for
	// what it lost while it kept leading the shards (see Failed). So do
	// flushes or compactions failing for good: writes would wait, without
	// an error, once the memtables are full.
	n.eng.OnFatal(n.host.Fail)

	replicas, err := n.loadReplicas()
	if err != nil {
		return err
	}
	if _, ok := replicas[cluster.MetaShardID]; !ok && len(n.opts.Join) == 0 {
		// A new node: bootstrap the meta shard as a one-voter group. (A
		// new node with Join gets its meta replica from the cluster.)
		lr := localReplica{ReplicaID: 1, Desc: shard.MetaDesc}
		if err := n.host.Bootstrap(cluster.MetaShardID, []uint64{1}, func(b *pebble.Batch) error {
			return n.writeReplica(b, lr)
		}); err != nil {
			return err
		}
		replicas[cluster.MetaShardID] = lr
		n.log.Info("bootstrapped a new node", "node", id, "dir", n.opts.DataDir)
	}
	n.mu.Lock()
	n.mu.replicas = replicas
	n.mu.Unlock()
	if err := n.reloadMeta(); err != nil {
		return err
	}
	// A low disk: with the membership known, the node decides whether it
	// goes on refusing writes (onLowSpace).
	n.eng.OnLowSpace(n.onLowSpace)
	registerCounter(n.opts.Registry, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "groupkv_writes_refused",
		Help: "1 while the node refuses the writes that add data because its disk has less than --min-free-space free, else 0.",
	}, func() float64 {
		if n.host.WritesRefused() != nil {
			return 1
		}
		return 0
	}))

	// Every replica's group is added before the loop starts: a left
	// shard replaying a merge trigger whose apply a crash lost removes its
	// right neighbour's replica, which must be running by then (or the
	// removal would find no group, and this loop a replica with no state).
	for _, r := range replicas {
		if err := n.host.AddGroup(r.Desc, r.ReplicaID); err != nil {
			return err
		}
	}
	n.host.Start()
	// Replicas the catalog names but this node lacks (a crash between a
	// catalog change and its reconcile) and the reverse are fixed now.
	if err := n.reconcile(); err != nil {
		return err
	}
	n.startGroups()
	n.bg.Add(5)
	go n.reconcileLoop()
	go n.gcLoop()
	go func() {
		defer n.bg.Done()
		n.every(n.opts.TxnIdleTimeout/4, n.expireSessions)
	}()
	go func() {
		defer n.bg.Done()
		n.every(n.markInterval(), n.forgetTick)
	}()
	go func() {
		defer n.bg.Done()
		n.every(n.opts.TxnTimeout/2, n.settleOrphanedPrepares)
	}()
	return nil
}

func replicaKey(shardID uint64) []byte {
	return storage.NodeKey(fmt.Sprintf("%s%016x", metaReplica, shardID))
}

func (n *Node) writeReplica(b *pebble.Batch, r localReplica) error {
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return b.Set(replicaKey(r.Desc.ShardID), data, nil)
}

func (n *Node) loadReplicas() (map[uint64]localReplica, error) {
	start, end := storage.NodeSpan(metaReplica)
	it, err := n.eng.DB.NewIter(&pebble.IterOptions{LowerBound: start, UpperBound: end})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	out := make(map[uint64]localReplica)
	for valid := it.First(); valid; valid = it.Next() {
		var r localReplica
		if err := json.Unmarshal(it.Value(), &r); err != nil {
			return nil, fmt.Errorf("node: corrupt replica record %q: %w", it.Key(), err)
		}
		out[r.Desc.ShardID] = r
	}
	return out, it.Error()
}

// ID returns the node's id.
func (n *Node) ID() uint64 { return n.id }

// Close stops the node and releases its data directory. On a node whose
// storage failed (Failed) it waits at most Options.FailedCloseWait: a write
// that Pebble stalls behind flushes that cannot succeed holds the node
// until the disk takes writes again, and so would Close. It then returns an
// error; the node finishes closing, and releases its data directory, if
// the write ever ends.
func (n *Node) Close() error {
	n.closeMu.Lock()
	defer n.closeMu.Unlock()
	if n.closed {
		return nil
	}
	n.closed = true
	go func() {
		n.closeErr = n.close()
		close(n.closeDone)
	}()
	select {
	case <-n.closeDone:
		return n.closeErr
	case <-n.host.Failed():
	}
	select {
	case <-n.closeDone:
		return n.closeErr
	case <-time.After(n.opts.FailedCloseWait):
		return fmt.Errorf("node %d: its storage failed (%v) and it did not stop within %v: a write it holds has not ended; it releases its data directory if the write ends", n.id, n.host.Failure(), n.opts.FailedCloseWait)
	}
}

// close is Close's work.
func (n *Node) close() error {
	n.handOffLeadership()
	close(n.stop)
	n.opsMu.Lock() // wait out operations in flight (watches end on stop)
	defer n.opsMu.Unlock()
	n.bg.Wait()
	n.host.Stop()
	n.tr.Close()
	n.peers.close()
	n.reconcileMu.Lock() // wait out a reconcile started by a request
	defer n.reconcileMu.Unlock()
	return n.eng.Close()
}

// persistTSO proposes a new TSO high-water mark. It is called by the oracle
// with its lock held, possibly from the Host loop, so it must not block.
func (n *Node) persistTSO(hwm uint64) {
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := n.host.Propose(ctx, cluster.MetaShardID, shard.EncodeTSO(hwm)); err != nil {
			n.log.Warn("persisting the TSO high-water mark failed", "hwm", hwm, "err", err)
		}
	}()
}

func (n *Node) onSnapshotApplied(shardID uint64, sm *shard.Shard) {
	if shardID != cluster.MetaShardID {
		// The snapshot may carry a split or merge this replica skipped:
		// the node's records follow its span, and reconcile removes a
		// merged replica it now covers (dropCovered).
		n.mu.Lock()
		if lr, ok := n.mu.replicas[shardID]; ok {
			lr.Desc = sm.Desc()
			n.mu.replicas[shardID] = lr
		}
		n.mu.Unlock()
		n.triggerReconcile()
		return
	}
	// The meta shard's state was replaced: membership and catalog with it.
	if err := n.reloadMeta(); err != nil {
		n.log.Error("reloading the catalog after a snapshot failed", "err", err)
	}
}

func (n *Node) onApplied(shardID uint64, kind shard.CommandKind, res shard.Result) {
	n.noteChecksum(shardID, res) // consistency.go
	if len(res.Group) > 0 {
		n.onGroupApplied(shardID, res.Group) // group.go
		return
	}
	if res.Txn != nil || len(res.Resolved) > 0 {
		n.onTxnApplied(shardID, kind, res) // txn_leader.go
		return
	}
	if kind == shard.KindSplitTrigger && res.Split != nil {
		n.onSplit(shardID, res.Split)
		return
	}
	if kind == shard.KindMergeTrigger && res.Merge != nil {
		n.onMerge(shardID, res.Merge)
		return
	}
	if kind == shard.KindFreeze && res.Err == nil {
		// The left shard's leader, if here, may find it frozen on every
		// node now.
		n.kickSteps()
		return
	}
	if shardID != cluster.MetaShardID || res.Err != nil {
		return
	}
	switch kind {
	case shard.KindAddNode:
		// A node that rejoined with an empty disk changed the catalog too.
		if err := n.reloadMeta(); err != nil {
			n.log.Error("reloading the catalog failed", "err", err)
		}
	case shard.KindSetDraining:
		n.mu.Lock()
		n.mu.nodes[res.Node.ID] = *res.Node
		n.mu.Unlock()
	case shard.KindMoveReplicas, shard.KindMoveShardReplica, shard.KindSetPreferred, shard.KindSplitShard, shard.KindMergeShards:
		n.mu.Lock()
		n.mu.catalog[res.Desc.Name] = res.Desc
		n.indexShardsLocked()
		n.mu.Unlock()
		n.triggerReconcile()
		if kind == shard.KindSplitShard || kind == shard.KindMergeShards {
			n.kickSteps() // the shard's leader, if here, splits or freezes it
		}
	case shard.KindTSO:
		n.oracle.OnPersisted(res.Version)
	case shard.KindCreateCollection:
		n.mu.Lock()
		n.mu.catalog[res.Desc.Name] = res.Desc
		n.indexShardsLocked()
		n.mu.Unlock()
		n.triggerReconcile()
	case shard.KindDropCollection:
		n.mu.Lock()
		if d := n.mu.catalog[res.Desc.Name]; d != nil && d.ID == res.Desc.ID {
			delete(n.mu.catalog, res.Desc.Name)
		}
		n.indexShardsLocked()
		n.mu.Unlock()
		n.triggerReconcile()
	}
}

func (n *Node) onLeaderReady(shardID uint64, sm *shard.Shard) {
	if shardID == cluster.MetaShardID {
		n.oracle.Activate(sm.TSOHighWater())
	}
	n.openLockTable(shardID, sm)
}

func (n *Node) onLeaderLost(shardID uint64) {
	if shardID == cluster.MetaShardID {
		n.oracle.Deactivate()
	}
	n.closeLockTable(shardID)
}

func (n *Node) triggerReconcile() {
	select {
	case n.reconcil <- struct{}{}:
	default:
	}
}

func (n *Node) reconcileLoop() {
	defer n.bg.Done()
	for {
		select {
		case <-n.stop:
			return
		case <-n.reconcil:
			if err := n.reconcile(); err != nil {
				n.log.Error("reconciling replicas with the catalog failed", "err", err)
			}
		}
	}
}

// reconcile makes the replicas held here match the catalog: it creates the
// replicas the catalog places on this node and removes (with their data) the
// replicas of collections that no longer exist.
func (n *Node) reconcile() error {
	n.reconcileMu.Lock()
	defer n.reconcileMu.Unlock()
	if err := n.dropCovered(); err != nil {
		return err
	}
	type wanted struct {
		lr        localReplica
		voters    []uint64
		campaign  bool
		joining   bool
		splitFrom uint64
	}
	n.mu.RLock()
	want := make(map[uint64]wanted)
	for _, c := range n.mu.catalog {
		for _, s := range c.Shards {
			for j, r := range s.Replicas {
				if r.Node != n.id {
					continue
				}
				voters := make([]uint64, len(s.Replicas))
				for k, o := range s.Replicas {
					voters[k] = o.ID
				}
				// The first replica is the preferred leader: it campaigns
				// at once, so leaders spread over the nodes.
				want[s.ID] = wanted{localReplica{ReplicaID: r.ID, Desc: shard.DescFor(c, s)}, voters, j == 0, r.Joining, s.SplitFrom}
			}
		}
	}
	have := make(map[uint64]localReplica, len(n.mu.replicas))
	for id, r := range n.mu.replicas {
		have[id] = r
	}
	n.mu.RUnlock()

	for id, w := range want {
		if old, ok := have[id]; ok {
			if old.ReplicaID == w.lr.ReplicaID {
				continue
			}
			// The shard moved away and back: the old replica (another raft
			// id) goes first, once the group no longer holds it.
			if !n.replicaLeftGroup(id, old.ReplicaID) {
				continue
			}
			n.host.RemoveGroup(id)
			n.host.WaitRemoved(id)
			if err := n.clearReplica(old); err != nil {
				return err
			}
			n.mu.Lock()
			delete(n.mu.replicas, id)
			n.mu.Unlock()
			delete(have, id)
		}
		if _, ok := have[w.splitFrom]; ok && w.splitFrom != 0 && !w.joining && n.spanCovers(w.splitFrom, w.lr.Desc) {
			continue // the split, applied in the parent's log here, creates it
		}
		r := w.lr
		if w.splitFrom != 0 {
			w.joining = true // no parent here: filled by a snapshot
		}
		if w.joining {
			// Added to a running group: created empty, filled by a
			// snapshot from the leader.
			err := n.host.CreateEmpty(id, func(b *pebble.Batch) error { return n.writeReplica(b, r) })
			if errors.Is(err, replication.ErrReplicaExists) && w.splitFrom != 0 {
				// The split was applied in the parent replica here after
				// the checks above: the child starts from its state.
				if err := n.startChild(r, false); err != nil {
					return err
				}
				continue
			}
			if err != nil {
				return err
			}
			w.campaign = false
		} else if err := n.host.Bootstrap(id, w.voters, func(b *pebble.Batch) error {
			return n.writeReplica(b, r)
		}); err != nil {
			return err
		}
		if err := n.host.AddGroupWith(r.Desc, r.ReplicaID, replication.GroupOptions{Campaign: w.campaign && len(w.voters) > 1}); err != nil {
			return err
		}
		n.mu.Lock()
		n.mu.replicas[id] = r
		n.mu.Unlock()
	}
	for id, r := range have {
		if _, ok := want[id]; ok || id == cluster.MetaShardID {
			continue
		}
		if n.mergingHere(r) {
			continue // applying the merge in its left neighbour's log removes it
		}
		moved := n.shardInCatalog(id)
		if moved && !n.replicaLeftGroup(id, r.ReplicaID) {
			// Moved away: the replica stays a member until the leader has
			// removed it from the group's configuration; the next
			// reconcile looks again.
			continue
		}
		n.host.RemoveGroup(id)
		n.host.WaitRemoved(id)
		var err error
		if moved {
			err = n.clearReplica(r)
		} else {
			err = n.destroyReplica(r)
		}
		if err != nil {
			return err
		}
		n.mu.Lock()
		delete(n.mu.replicas, id)
		n.mu.Unlock()
	}
	return nil
}

// destroyReplica deletes every key of a removed replica in one batch.
func (n *Node) destroyReplica(r localReplica) error {
	b := n.eng.DB.NewBatch()
	defer b.Close()
	// The collection is gone: its records, tag index, change log and
	// placement index go with its replicas.
	spans := [][2][]byte{}
	coll := r.Desc.Collection
	for _, span := range []func(uint32) ([]byte, []byte){storage.CollectionSpan, storage.TagIndexSpan, storage.PlacementSpan, storage.ChangeSpanAll, storage.LatestSpan} {
		s, e := span(coll)
		spans = append(spans, [2][]byte{s, e})
	}
	s, e := storage.RaftSpan(r.Desc.ShardID)
	spans = append(spans, [2][]byte{s, e})
	s, e = storage.ShardStateSpan(r.Desc.ShardID)
	spans = append(spans, [2][]byte{s, e})
	for _, sp := range spans {
		if err := b.DeleteRange(sp[0], sp[1], nil); err != nil {
			return err
		}
	}
	if err := b.Delete(replicaKey(r.Desc.ShardID), nil); err != nil {
		return err
	}
	return n.commitDropping(b)
}

// commitDropping commits b, which deletes keys wholesale (a replica
// cleared, a collection dropped), with the cache of newest versions
// cleared before (no read begun before fills it) and after (none filled
// before stays).
func (n *Node) commitDropping(b *pebble.Batch) error {
	if n.latestCache != nil {
		n.latestCache.Clear()
		defer n.latestCache.Clear()
	}
	return n.eng.Commit(b, pebble.Sync)
}

func (n *Node) gcLoop() {
	defer n.bg.Done()
	n.every(n.opts.GCInterval, func() { n.RunGC(context.Background()) })
}

// every calls fn every d until the node stops.
func (n *Node) every(d time.Duration, fn func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-n.stop:
			return
		case <-t.C:
			fn()
		}
	}
}

// RunGC asks every shard led here to drop versions older than the retention
// window.
func (n *Node) RunGC(ctx context.Context) {
	threshold := cluster.TimestampFromTime(n.opts.Clock().Add(-n.opts.Retention))
	n.mu.RLock()
	var ids []uint64
	for id := range n.mu.replicas {
		if id != cluster.MetaShardID {
			ids = append(ids, id)
		}
	}
	n.mu.RUnlock()
	for _, id := range ids {
		// In chunks of gcChunkEntries entries, each its own proposal, so
		// that no Apply walks a whole large shard while every other
		// shard's entries wait for the loop.
		chunk := &shard.GCChunk{Limit: gcChunkEntries}
		for chunk != nil && n.host.Ready(id) {
			ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			res, err := n.host.Propose(ctx, id, shard.EncodeGCChunk(threshold, *chunk))
			cancel()
			if err != nil {
				n.log.Warn("garbage collection of old versions failed", "shard", id, "err", err)
				break
			}
			chunk = res.GCNext
		}
	}
}

// gcChunkEntries bounds the entries one GC proposal visits (well under a
// millisecond of Apply).
const gcChunkEntries = 500

// Failed is closed when the node stopped serving on its own because its
// storage failed: a write or read of its Pebble instance failed while
// applying, or a read found data damaged on disk. Rather than go on from
// state it could not read or write, the node stops applying, answers
// every request unavailable, and should be restarted, which applies again
// what its log holds (damaged data needs the node's replicas replaced).
// Failure says what failed. Close does not close it.
func (n *Node) Failed() <-chan struct{} { return n.host.Failed() }

// Failure is the storage failure that stopped the node, or nil.
func (n *Node) Failure() error { return n.host.Failure() }

// onLowSpace answers the engine's low disk (low nil: room again). A node
// alone, which no other replica can stand in for, goes on refusing what
// would add data (Host.RefuseWrites) and serving reads, so that what it
// holds can still be read, backed up or moved; it stops if the disk
// falls to half the floor. A node with peers stops: its shards' other
// replicas take over (and a node that went on would still fill its disk
// with the writes its peers lead).
func (n *Node) onLowSpace(low *storage.LowSpaceError) bool {
	if low == nil {
		n.host.RefuseWrites(nil)
		n.log.Info("storage: the disk has room again; writes are taken again")
		return true
	}
	n.mu.RLock()
	peers := len(n.mu.nodes) > 1
	n.mu.RUnlock()
	if peers || len(n.opts.Join) > 0 {
		return false
	}
	err := kv.Errorf(kv.CodeUnavailable, "node %d refuses writes: the disk holding %s has %s free, less than the %s it keeps free to write safely (--min-free-space); it serves reads, and takes writes again once the disk has %s free",
		n.id, low.Dir, storage.MiB(low.Free), storage.MiB(low.Floor), storage.MiB(low.Floor+low.Floor/4))
	n.host.RefuseWrites(err)
	n.log.Warn("storage: " + err.Message)
	return true
}

// WritesRefused is why the node refuses writes while it serves reads (its
// disk is low), or nil.
func (n *Node) WritesRefused() error {
	if err := n.host.WritesRefused(); err != nil {
		return err.Err
	}
	return nil
}

// failedError answers a request to a node its storage failure stopped.
func (n *Node) failedError() error {
	return &replication.StorageFailedError{Err: kv.Errorf(kv.CodeUnavailable,
		"node %d stopped serving: its storage failed (%v); restart it", n.id, n.host.Failure())}
}

// Ready reports whether the node serves requests: the meta shard and every
// local shard have a ready leader and the oracle issues timestamps.
func (n *Node) Ready() error {
	if n.host.HasFailed() {
		return n.failedError()
	}
	n.mu.RLock()
	ids := make([]uint64, 0, len(n.mu.replicas))
	for id := range n.mu.replicas {
		ids = append(ids, id)
	}
	n.mu.RUnlock()
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	if len(ids) == 0 {
		return kv.Errorf(kv.CodeUnavailable, "node %d is joining the cluster", n.id)
	}
	if self := n.self(); self.Addr != "" {
		if _, ok := n.nodeDesc(n.id); !ok {
			return kv.Errorf(kv.CodeUnavailable, "node %d is not a member yet", n.id)
		}
	}
	for _, id := range ids {
		switch leader := n.leaderOf(id); {
		case leader == 0 && n.host.Leader(id) == 0:
			return kv.Errorf(kv.CodeUnavailable, "shard %d has no leader yet", id)
		case leader == n.id && !n.host.Ready(id):
			return kv.Errorf(kv.CodeUnavailable, "shard %d's leader is not ready yet", id)
		}
	}
	if !n.oracle.Active() {
		if l := n.leaderOf(cluster.MetaShardID); l == 0 || l == n.id {
			return kv.Errorf(kv.CodeUnavailable, "the timestamp oracle is not running yet")
		}
	}
	return nil
}

// WaitReady waits until Ready answers nil or ctx ends.
func (n *Node) WaitReady(ctx context.Context) error {
	for {
		err := n.Ready()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("node: not ready: %w", err)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// begin starts a client operation: it bounds ctx by the request timeout
// and keeps Close from closing the engine until end is called. It fails
// once the node is closing, and when ctx has ended.
func (n *Node) begin(ctx context.Context) (context.Context, func(), error) {
	if err := n.admit(ctx); err != nil {
		return nil, nil, err
	}
	if _, ok := ctx.Deadline(); ok {
		return ctx, n.opsMu.RUnlock, nil
	}
	ctx, cancel := context.WithTimeout(ctx, n.opts.RequestTimeout)
	return ctx, func() { cancel(); n.opsMu.RUnlock() }, nil
}

// beginCancel is begin for an operation that another request may cut
// short: it answers ctx's cancel too.
func (n *Node) beginCancel(ctx context.Context) (context.Context, context.CancelFunc, func(), error) {
	if err := n.admit(ctx); err != nil {
		return nil, nil, nil, err
	}
	var cancel context.CancelFunc
	if _, ok := ctx.Deadline(); ok {
		ctx, cancel = context.WithCancel(ctx)
	} else {
		ctx, cancel = context.WithTimeout(ctx, n.opts.RequestTimeout)
	}
	return ctx, cancel, func() { cancel(); n.opsMu.RUnlock() }, nil
}

// admit takes n.opsMu for reading, unless the node is closing or failed,
// or ctx has ended (nothing is done: kv.CodeOf answers unavailable, and
// errors.Is finds the context's error).
func (n *Node) admit(ctx context.Context) error {
	n.opsMu.RLock()
	select {
	case <-n.stop:
		n.opsMu.RUnlock()
		return kv.Errorf(kv.CodeUnavailable, "node is shutting down")
	default:
	}
	if n.host.HasFailed() {
		n.opsMu.RUnlock()
		return n.failedError()
	}
	if err := ctx.Err(); err != nil {
		n.opsMu.RUnlock()
		return err
	}
	return nil
}

// beginAsync is begin for an operation that ends on another goroutine:
// it holds Close off until the function it returns is called; ok is false
// when the node is stopping.
func (n *Node) beginAsync() (end func(), ok bool) {
	n.opsMu.RLock()
	select {
	case <-n.stop:
		n.opsMu.RUnlock()
		return nil, false
	default:
	}
	return n.endOps, true
}

func (n *Node) collection(name string) (*cluster.CollectionDesc, error) {
	if err := kv.ValidateCollectionName(name); err != nil {
		return nil, err
	}
	n.mu.RLock()
	d := n.mu.catalog[name]
	n.mu.RUnlock()
	if d == nil {
		return nil, kv.Errorf(kv.CodeCollectionNotFound, "collection %q not found", name)
	}
	return d, nil
}

func (n *Node) leaderNode(d *cluster.CollectionDesc) func(uint64) uint64 {
	return func(shardID uint64) uint64 {
		rid := n.host.Leader(shardID)
		for _, s := range d.Shards {
			if s.ID != shardID {
				continue
			}
			for _, r := range s.Replicas {
				if r.ID == rid {
					return r.Node
				}
			}
		}
		return 0
	}
}

// CreateCollection implements kv.Backend. It answers once every shard of
// the new collection accepts writes.
func (n *Node) CreateCollection(ctx context.Context, opts kv.CollectionOptions) (kv.CollectionInfo, error) {
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return kv.CollectionInfo{}, err
	}
	defer done()
	if err := kv.ValidateCollectionOptions(&opts); err != nil {
		return kv.CollectionInfo{}, err
	}
	if err := checkWritable(ctx, opts.Name); err != nil {
		return kv.CollectionInfo{}, err
	}
	nodes := n.placementNodes()
	if opts.Replicas == 0 {
		opts.Replicas = cluster.DefaultReplicas(len(nodes))
	}
	res, err := n.propose(ctx, cluster.MetaShardID, shard.EncodeCreateCollection(opts, nodes))
	if err != nil {
		return kv.CollectionInfo{}, err
	}
	if res.Err != nil {
		return kv.CollectionInfo{}, res.Err
	}
	if err := n.waitCatalog(ctx, res.Desc.Name, res.Desc.ID, true); err != nil {
		return kv.CollectionInfo{}, err
	}
	if err := n.reconcile(); err != nil {
		return kv.CollectionInfo{}, kv.Errorf(kv.CodeUnavailable, "collection %q was created but its shards could not start here: %v", opts.Name, err)
	}
	for _, s := range res.Desc.Shards {
		if !n.hasReplica(s.ID) {
			err := n.waitRemoteShard(ctx, s.ID)
			if err == nil {
				continue
			}
			if !n.hasReplica(s.ID) {
				return kv.CollectionInfo{}, err
			}
			// Created here meanwhile: wait for it here.
		}
		// The first election of a new shard may take a few timeouts (its
		// peers create their replicas when the catalog reaches them).
		for {
			err := n.readBarrier(ctx, s.ID)
			if err == nil {
				break
			}
			if !retryable(err) || ctx.Err() != nil {
				return kv.CollectionInfo{}, err
			}
		}
	}
	return res.Desc.Info(n.leaderNode(res.Desc)), nil
}

// ListCollections implements kv.Backend.
func (n *Node) ListCollections(ctx context.Context) ([]kv.CollectionInfo, error) {
	descs := n.sortedCollections()
	out := make([]kv.CollectionInfo, 0, len(descs))
	for _, d := range descs {
		out = append(out, d.Info(n.leaderNode(d)))
	}
	return out, nil
}

// DescribeCollection implements kv.Backend.
func (n *Node) DescribeCollection(ctx context.Context, name string) (kv.CollectionInfo, error) {
	d, err := n.collection(name)
	if err != nil {
		return kv.CollectionInfo{}, err
	}
	return d.Info(n.leaderNode(d)), nil
}

// DropCollection implements kv.Backend. It answers once the collection's
// replicas and data are gone from this node.
func (n *Node) DropCollection(ctx context.Context, name string) error {
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return err
	}
	defer done()
	if err := kv.ValidateCollectionName(name); err != nil {
		return err
	}
	if err := checkWritable(ctx, name); err != nil {
		return err
	}
	res, err := n.propose(ctx, cluster.MetaShardID, shard.EncodeDropCollection(name))
	if err != nil {
		return err
	}
	if res.Err != nil {
		return res.Err
	}
	if err := n.waitCatalog(ctx, res.Desc.Name, res.Desc.ID, false); err != nil {
		return err
	}
	return n.reconcile()
}

// waitCatalog waits until this node's copy of the catalog has (present) or
// no longer has collection name with id.
func (n *Node) waitCatalog(ctx context.Context, name string, id uint32, present bool) error {
	for {
		n.mu.RLock()
		d := n.mu.catalog[name]
		n.mu.RUnlock()
		if (d != nil && d.ID == id) == present {
			return nil
		}
		select {
		case <-ctx.Done():
			return kv.Errorf(kv.CodeUnavailable, "the catalog change of %q has not reached node %d: %v", name, n.id, ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
}

func (n *Node) route(d *cluster.CollectionDesc, key []byte) (uint16, uint64) {
	bucket, i := d.Route(key, "")
	return bucket, n.localOwner(d.ID, d.Shards[i].ID, bucket, key)
}

// localOwner corrects a shard found in this node's copy of the catalog by
// what this node's replicas have applied: when the shard's replica here no
// longer owns the key (a split applied before the catalog caught up) or is
// gone (merged into its left neighbour), the local replica that does is
// the owner.
func (n *Node) localOwner(coll uint32, id uint64, bucket uint16, key []byte) uint64 {
	desc, ok := n.host.Desc(id)
	if ok && desc.Owns(bucket, key) {
		return id
	}
	if !ok && !n.isMergedAway(id) {
		return id
	}
	for _, other := range n.localShardsOf(coll) {
		if d, ok := n.host.Desc(other); ok && d.Owns(bucket, key) {
			return other
		}
	}
	return id
}

// localShardsOf returns the shards of collection coll held here, but for
// replicas that moved away (see readable).
func (n *Node) localShardsOf(coll uint32) []uint64 {
	n.mu.RLock()
	var ids []uint64
	for id, r := range n.mu.replicas {
		if id != cluster.MetaShardID && r.Desc.Collection == coll && n.readableLocked(id) {
			ids = append(ids, id)
		}
	}
	n.mu.RUnlock()
	slices.Sort(ids)
	return ids
}

// expandLocal adds to shards the other shards held here of their
// collections (see withLocalShards).
func (n *Node) expandLocal(shards []uint64) []uint64 {
	shards = n.liveShards(shards)
	var colls []uint32 // nearly always one
	n.mu.RLock()
	for _, id := range shards {
		var c uint32
		if r, ok := n.mu.replicas[id]; ok {
			c = r.Desc.Collection
		} else if ref, ok := n.mu.shards[id]; ok {
			c = ref.coll.ID
		} else {
			continue
		}
		if !slices.Contains(colls, c) {
			colls = append(colls, c)
		}
	}
	n.mu.RUnlock()
	out := shards
	for _, c := range colls {
		out = n.withLocalShards(c, out)
	}
	return out
}

// withLocalShards adds to shards, all of collection coll, the other shards
// of coll held here: a shard split here before this node's catalog knew
// must be read too.
func (n *Node) withLocalShards(coll uint32, shards []uint64) []uint64 {
	out := append([]uint64(nil), shards...)
	for _, id := range n.localShardsOf(coll) {
		if !contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}

func condOf(v *uint64) (bool, uint64) {
	if v == nil {
		return false, 0
	}
	return true, *v
}

// Put implements kv.Backend.
func (n *Node) Put(ctx context.Context, req kv.PutRequest) (uint64, error) {
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return 0, err
	}
	defer done()
	if err := checkWritable(ctx, req.Collection); err != nil {
		return 0, err
	}
	d, err := n.collection(req.Collection)
	if err != nil {
		return 0, err
	}
	if err := n.validatePut(req); err != nil {
		return 0, err
	}
	var (
		bucket  uint16
		shardID uint64
	)
	if d.Partitioning == kv.PartitionTag {
		unlock := n.locks.lock([]lockRef{{d.ID, req.Key}})
		defer unlock()
		if bucket, shardID, err = n.placeForPut(ctx, d, req.Key, req.Tags); err != nil {
			if kv.CodeOf(err) == kv.CodeKeyInGroup {
				return n.groupPlainWrite(ctx, shardID, kv.KeyRef{Collection: req.Collection, Key: req.Key}, req.Value, req.Tags, false, req.IfVersion, false)
			}
			return 0, err
		}
	} else {
		bucket, shardID = n.route(d, req.Key)
	}
	hasCond, cond := condOf(req.IfVersion)
	cmd := shard.EncodeWrite([]shard.Op{{Type: shard.OpPut, Bucket: bucket, Key: req.Key, Value: req.Value, Tags: req.Tags, HasCond: hasCond, CondVersion: cond}})
	ref := kv.KeyRef{Collection: req.Collection, Key: req.Key}
	return n.plainOrGroupWrite(ctx, func() (uint64, error) {
		return n.writeRouted(ctx, shardID, n.rerouter(d, bucket, req.Key), cmd)
	}, func() (uint64, error) {
		// A member of a group: written by the group's leader (group_txn.go).
		return n.groupPlainWrite(ctx, shardID, ref, req.Value, req.Tags, false, req.IfVersion, false)
	})
}

// plainOrGroupWrite runs plain, the plain write of one key; when its shard
// answers that the key belongs to a group, it runs grp, the same write by
// the group's leader. When that finds the key in no group or in one that
// no longer exists (a late join of a group refused or deleted meanwhile,
// which the group protocol undoes within a few messages), the plain write
// runs again, after a backoff, within the ghost window (ghostWindow).
func (n *Node) plainOrGroupWrite(ctx context.Context, plain, grp func() (uint64, error)) (uint64, error) {
	deadline := time.Now().Add(n.ghostWindow())
	for attempt := 0; ; attempt++ {
		v, err := plain()
		if kv.CodeOf(err) != kv.CodeKeyInGroup {
			return v, err
		}
		v, err = grp()
		if _, gone := errors.AsType[*groupGoneError](err); !gone {
			return v, err
		}
		if berr := backoff(ctx, attempt, deadline, err); berr != nil {
			return 0, berr
		}
	}
}

// validatePut checks the key, value and tags of a put.
func (n *Node) validatePut(req kv.PutRequest) error {
	if err := kv.ValidateKey(req.Key); err != nil {
		return err
	}
	if len(req.Value) > n.opts.MaxValueSize {
		return kv.Errorf(kv.CodeTooLarge, "value is %d bytes, the limit is %d", len(req.Value), n.opts.MaxValueSize)
	}
	return kv.ValidateTags(req.Tags)
}

// PutAsync starts req as Put would, where it can without waiting: a key of
// a hash collection whose shard this node leads, ready, with no
// transaction taking or holding locks in it. It then returns true, and
// done is called once with what Put would return: from the loop that
// applies the shard's commands, or, when ctx ends first, at once with
// commit unknown (as Put answers then; the write may still be applied),
// or, should the write have to be routed or retried, from a goroutine
// running Put. done must not block. PutAsync returns false, having
// started nothing, for every other request; the caller runs Put. (Without
// a deadline in ctx, the wait is not bounded by Options.RequestTimeout,
// as Put's is: raft answers a proposal its leader lost as commit unknown.)
func (n *Node) PutAsync(ctx context.Context, req kv.PutRequest, done func(uint64, error)) bool {
	if checkWritable(ctx, req.Collection) != nil || n.validatePut(req) != nil {
		return false // Put says what is wrong
	}
	hasCond, cond := condOf(req.IfVersion)
	op := shard.Op{Type: shard.OpPut, Key: req.Key, Value: req.Value, Tags: req.Tags, HasCond: hasCond, CondVersion: cond}
	return n.writeAsync(ctx, req.Collection, op, &asyncWrite{n: n, ctx: ctx, put: req, done: done})
}

// DeleteAsync is PutAsync for a delete: done gets what Delete would return.
func (n *Node) DeleteAsync(ctx context.Context, req kv.DeleteRequest, done func(uint64, error)) bool {
	if checkWritable(ctx, req.Collection) != nil || kv.ValidateKey(req.Key) != nil {
		return false // Delete says what is wrong
	}
	hasCond, cond := condOf(req.IfVersion)
	op := shard.Op{Type: shard.OpDelete, Key: req.Key, HasCond: hasCond, CondVersion: cond, MustExist: true}
	return n.writeAsync(ctx, req.Collection, op, &asyncWrite{n: n, ctx: ctx, del: req, isDelete: true, done: done})
}

// asyncWrite is a put or delete started by PutAsync or DeleteAsync, from
// its proposal to its answer: one allocation for what its callbacks share.
type asyncWrite struct {
	n        *Node
	ctx      context.Context
	put      kv.PutRequest
	del      kv.DeleteRequest
	isDelete bool
	done     func(uint64, error)
	answered atomic.Bool
	release  func() // the write's locks
	end      func() // the node's operation
	stop     func() bool
}

// answer calls done, once.
func (w *asyncWrite) answer(v uint64, err error) {
	if w.answered.CompareAndSwap(false, true) {
		w.done(v, err)
	}
}

// again runs the write the usual way (Put, Delete), when it must be routed
// again or retried, and answers what that returns.
func (w *asyncWrite) again() {
	if w.isDelete {
		w.answer(w.n.Delete(w.ctx, w.del))
	} else {
		w.answer(w.n.Put(w.ctx, w.put))
	}
}

// ended answers a write whose request ended before it was applied.
func (w *asyncWrite) ended() {
	w.answer(0, kv.Errorf(kv.CodeCommitUnknown, "the write was proposed but not applied before the request ended (%v); it may or may not take effect", w.ctx.Err()))
}

// applied answers a write raft is done with.
func (w *asyncWrite) applied(res shard.Result, err error) {
	// The locks go once the command is out of raft's hands, whether or not
	// ctx ended: until then it may still be applied.
	w.release()
	w.end()
	if !w.stop() {
		return // answered when ctx ended
	}
	if err == nil && res.Err != nil {
		err = res.Err
	}
	if err != nil && (retryable(err) || kv.CodeOf(err) == kv.CodeKeyInGroup) {
		// Not applied: the usual way routes it again, retries, or hands it
		// to its Key Group's leader.
		go w.again()
		return
	}
	w.answer(res.Version, err)
}

// writeAsync proposes op, a valid plain write of one key of collection
// coll, for PutAsync and DeleteAsync; w answers it.
func (n *Node) writeAsync(ctx context.Context, coll string, op shard.Op, w *asyncWrite) bool {
	d, err := n.collection(coll)
	if err != nil || d.Partitioning == kv.PartitionTag {
		return false
	}
	bucket, shardID := n.route(d, op.Key)
	if !n.hasReplica(shardID) || !n.host.Ready(shardID) {
		return false
	}
	release, ok := n.tryPlainLocks(shardID)
	if !ok {
		return false
	}
	end, ok := n.beginAsync()
	if !ok {
		release()
		return false
	}
	w.release, w.end = release, end
	w.stop = context.AfterFunc(ctx, w.ended)
	op.Bucket = bucket
	cmd := shard.EncodeWrite([]shard.Op{op})
	if err := n.host.ProposeAsync(shardID, cmd, w.applied); err != nil {
		w.stop()
		release()
		end()
		return false
	}
	return true
}

// Delete implements kv.Backend.
func (n *Node) Delete(ctx context.Context, req kv.DeleteRequest) (uint64, error) {
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return 0, err
	}
	defer done()
	if err := checkWritable(ctx, req.Collection); err != nil {
		return 0, err
	}
	d, err := n.collection(req.Collection)
	if err != nil {
		return 0, err
	}
	if err := kv.ValidateKey(req.Key); err != nil {
		return 0, err
	}
	bucket, shardID := n.route(d, req.Key)
	if d.Partitioning == kv.PartitionTag {
		unlock := n.locks.lock([]lockRef{{d.ID, req.Key}})
		defer unlock()
		tag, ok, err := n.placementOf(ctx, d, req.Key)
		if err != nil {
			return 0, err
		}
		if !ok {
			return 0, kv.Errorf(kv.CodeNotFound, "key %q not found", req.Key)
		}
		b, i := d.Route(req.Key, tag)
		bucket, shardID = b, d.Shards[i].ID
	}
	hasCond, cond := condOf(req.IfVersion)
	cmd := shard.EncodeWrite([]shard.Op{{Type: shard.OpDelete, Bucket: bucket, Key: req.Key, HasCond: hasCond, CondVersion: cond, MustExist: true}})
	ref := kv.KeyRef{Collection: req.Collection, Key: req.Key}
	return n.plainOrGroupWrite(ctx, func() (uint64, error) {
		return n.writeRouted(ctx, shardID, n.rerouter(d, bucket, req.Key), cmd)
	}, func() (uint64, error) {
		return n.groupPlainWrite(ctx, shardID, ref, nil, nil, true, req.IfVersion, true)
	})
}

func (n *Node) write(ctx context.Context, shardID uint64, cmd []byte) (uint64, error) {
	res, err := n.propose(ctx, shardID, cmd)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			return 0, kv.Errorf(kv.CodeCommitUnknown, "the write was proposed but not applied before the request ended (%v); it may or may not take effect", err)
		}
		return 0, err
	}
	if res.Err != nil {
		return 0, res.Err
	}
	return res.Version, nil
}

// readKey reads key of collection id as of asOf from this node's
// committed state, the latest value through the cache of newest versions.
// The caller made the read linearizable (or stable, at asOf) first.
func (n *Node) readKey(id uint32, key []byte, asOf uint64) (storage.MVCCValue, uint64, bool, error) {
	if asOf == shard.Latest {
		return shard.ReadLatestCached(n.latestCache, n.eng.DB, id, key)
	}
	return shard.ReadRecord(n.eng.DB, id, key, asOf)
}

// Get implements kv.Backend.
func (n *Node) Get(ctx context.Context, req kv.GetRequest) (kv.Record, error) {
	if err := ctx.Err(); err != nil {
		return kv.Record{}, err
	}
	if rec, err, ok := n.GetNow(req); ok {
		rec.Value, rec.Tags = bytes.Clone(rec.Value), slices.Clone(rec.Tags) // the caller's
		return rec, err
	}
	return n.get(ctx, req, false)
}

// txnGetAt is Get at req.Version for a transaction that reads at a
// timestamp (read-only or snapshot): a key a Key Group holds is refused
// with key_in_group, as a locking transaction's read of it is, instead of
// read in its shard, which stores the group's writes only as they are
// shipped, later than their versions.
func (n *Node) txnGetAt(ctx context.Context, req kv.GetRequest) (kv.Record, error) {
	if req.Version == 0 {
		return kv.Record{}, errNoTimestamp()
	}
	return n.get(ctx, req, true)
}

// GetNow answers, as Get would, a get that needs no wait: the latest
// version of a key of a hash collection whose shard is served here by its
// only voter, ready, not frozen for a merge, with no Key Group holding
// the key and no prepared transaction's intent that may be on it. For any
// other get it answers nothing and reports false: Get serves it. The
// Pipeline stream serves such gets on the goroutine that reads requests.
// The record's value and tags may be the node's cache's: the caller must
// not modify them.
func (n *Node) GetNow(req kv.GetRequest) (rec kv.Record, err error, ok bool) {
	if req.Version != 0 || kv.ValidateKey(req.Key) != nil {
		return kv.Record{}, nil, false
	}
	end, ok := n.beginAsync() // holds Close off, as begin does, without a context
	if !ok {
		return kv.Record{}, nil, false
	}
	defer end()
	d, err := n.collection(req.Collection)
	if err != nil || d.Partitioning == kv.PartitionTag {
		return kv.Record{}, nil, false
	}
	bucket, shardID := n.route(d, req.Key)
	if !n.readable(shardID) || !n.host.ReadableNow(shardID) ||
		n.localOwner(d.ID, shardID, bucket, req.Key) != shardID || n.frozenInto(shardID) != 0 {
		return kv.Record{}, nil, false
	}
	if !n.noGroupHolds(shardID, d.ID, req.Key) {
		return kv.Record{}, nil, false
	}
	if n.host.MinPrepared(shardID) != 0 && n.host.MayHoldIntent(shardID, req.Key) {
		return kv.Record{}, nil, false
	}
	val, version, found, err := shard.ReadLatestShared(n.latestCache, n.eng.DB, d.ID, req.Key)
	if err != nil {
		return kv.Record{}, kv.Errorf(kv.CodeInternal, "reading %q: %v", req.Key, err), true
	}
	if !found {
		return kv.Record{}, kv.Errorf(kv.CodeNotFound, "key %q not found", req.Key), true
	}
	return kv.Record{Key: req.Key, Value: val.Value, Tags: val.Tags, Version: version}, nil, true
}

// get is Get for a get that GetNow did not answer; noMembers refuses a
// key a Key Group holds (txnGetAt).
func (n *Node) get(ctx context.Context, req kv.GetRequest, noMembers bool) (kv.Record, error) {
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return kv.Record{}, err
	}
	defer done()
	d, err := n.collection(req.Collection)
	if err != nil {
		return kv.Record{}, err
	}
	if err := kv.ValidateKey(req.Key); err != nil {
		return kv.Record{}, err
	}
	bucket, shardID := n.route(d, req.Key)
	shards := []uint64{shardID}
	if d.Partitioning == kv.PartitionTag {
		shards = shardsOf(d)
	}
	op := "get"
	if noMembers {
		op = "txn_get_at"
	}
	switch route, fwd, err := routeReadAs[kv.Record](n, ctx, shards, op, req); route {
	case routeForward:
		return fwd, err
	case routeSpread:
		check := checkNone
		if noMembers {
			check = checkAtTimestamp
		}
		return n.getSpread(ctx, d, shards, req, check)
	}
	shards = []uint64{shardID}
	if d.Partitioning == kv.PartitionTag {
		tag, ok, err := n.placementOf(ctx, d, req.Key)
		if err != nil {
			return kv.Record{}, err
		}
		if !ok {
			return kv.Record{}, kv.Errorf(kv.CodeNotFound, "key %q not found", req.Key)
		}
		_, i := d.Route(req.Key, tag)
		shards = []uint64{d.Shards[i].ID}
		if req.Version != 0 {
			// At an older version the key may have been placed elsewhere.
			shards = shardsOf(d)
		}
	}
	asOf := shard.Latest
	if req.Version != 0 {
		if err := n.snapshotRead(ctx, shards, req.Version); err != nil {
			return kv.Record{}, err
		}
		asOf = req.Version
		check := checkNone
		if noMembers {
			check = checkAtTimestamp
		}
		if err := n.checkGroups(ctx, check, n.expandLocal(shards), d.ID, req.Key, keyEnd(req.Key), req.Version); err != nil {
			return kv.Record{}, err
		}
	} else {
		for _, id := range shards {
			if err := n.readBarrier(ctx, id); err != nil {
				if d.Partitioning == kv.PartitionTag || !n.isMergedAway(id) || n.hasReplica(id) {
					return kv.Record{}, err
				}
				// Merged away while the barrier waited: read the shard
				// that took it in (below).
			}
		}
		// A split or merge applied while the barrier waited moves the key
		// to another shard: read after that shard's barrier instead.
		intoChecked := false
		for tries := 0; d.Partitioning != kv.PartitionTag && tries < 4; tries++ {
			owner := n.localOwner(d.ID, shards[0], bucket, req.Key)
			if owner == shards[0] {
				into := n.frozenInto(owner)
				if into == 0 || intoChecked {
					break
				}
				// Frozen for a merge: once the merge is applied in the
				// shard it goes into, the key is written there, perhaps
				// before this node applied the merge. That shard's barrier
				// applies here whatever it committed, the merge among it;
				// if the merge is not through, the frozen state is the
				// key's current one.
				intoChecked = true
				if err := n.readBarrier(ctx, into); err != nil {
					return kv.Record{}, err
				}
				continue
			}
			shards = []uint64{owner}
			if err := n.readBarrier(ctx, owner); err != nil {
				return kv.Record{}, err
			}
		}
	}
	if asOf == shard.Latest {
		// A member of a group is read from the group's leader.
		rec, ok, err := n.groupGet(ctx, shards[0], kv.KeyRef{Collection: req.Collection, Key: req.Key}, group.Key{Collection: d.ID, Key: string(req.Key)})
		if ok || err != nil {
			return rec, err
		}
	}
	if err := n.settleIntents(ctx, shards, d.ID, req.Key, keyEnd(req.Key), asOf); err != nil {
		return kv.Record{}, err
	}
	val, version, found, err := n.readKey(d.ID, req.Key, asOf)
	if err != nil {
		return kv.Record{}, kv.Errorf(kv.CodeInternal, "reading %q: %v", req.Key, err)
	}
	if req.Version != 0 {
		if err := n.checkRetained(shards, req.Version); err != nil {
			return kv.Record{}, err
		}
	}
	if !found {
		return kv.Record{}, kv.Errorf(kv.CodeNotFound, "key %q not found", req.Key)
	}
	return kv.Record{Key: req.Key, Value: val.Value, Tags: val.Tags, Version: version}, nil
}

// getSpread serves a get whose shards (every shard of a tag collection)
// no one node holds: the key is read at one version in every part, the
// newest version found wins.
func (n *Node) getSpread(ctx context.Context, d *cluster.CollectionDesc, shards []uint64, req kv.GetRequest, check groupCheck) (kv.Record, error) {
	version := req.Version
	if version == 0 {
		// A member of a group is read from the group's leader.
		p, err := n.placementPinOf(ctx, d, req.Key)
		if err != nil {
			return kv.Record{}, err
		}
		if p.Pin != "" {
			_, i := d.Route(req.Key, p.Tag)
			rec, ok, err := n.groupGetRemote(ctx, d.Shards[i].ID, kv.KeyRef{Collection: req.Collection, Key: req.Key}, group.Key{Collection: d.ID, Key: string(req.Key)})
			if ok || err != nil {
				return rec, err
			}
		}
		if version, err = n.latest(ctx); err != nil {
			return kv.Record{}, err
		}
	}
	recs, err := n.readRecords(ctx, d, shards, [][]byte{req.Key}, version, check)
	if err != nil {
		return kv.Record{}, err
	}
	if !recs[0].Found {
		return kv.Record{}, kv.Errorf(kv.CodeNotFound, "key %q not found", req.Key)
	}
	return kv.Record{Key: req.Key, Value: recs[0].Value, Tags: recs[0].Tags, Version: recs[0].Version}, nil
}

// snapshotRead prepares a read of shards at version: the version must not
// be in the future, and every shard must have applied every write at or
// below it (and will not accept more).
func (n *Node) snapshotRead(ctx context.Context, shards []uint64, version uint64) error {
	latest, err := n.latest(ctx)
	if err != nil {
		return err
	}
	if version > latest {
		return kv.Errorf(kv.CodeInvalidArgument, "version %d is in the future (the latest timestamp is %d)", version, latest)
	}
	return n.fenceShards(ctx, shards, version)
}

// readNow picks the version of a read of shards at the present, and
// prepares the read there as snapshotRead does: the highest version the
// shards applied, when all of them are led here and hold no prepared
// transaction (no wait for the writes in flight; Host.ReadNow), else a
// timestamp from the oracle, with a wait for the writes in flight below it.
// A version older than half the retention window is not used: the GC
// could pass it while the read runs, and fail a read of the present.
func (n *Node) readNow(ctx context.Context, shards []uint64) (uint64, error) {
	version, ok, err := n.host.ReadNow(ctx, n.expandLocal(shards))
	if err != nil {
		return 0, err
	}
	if ok && version >= cluster.TimestampFromTime(n.opts.Clock().Add(-n.opts.Retention/2)) {
		return version, nil
	}
	if version, err = n.latest(ctx); err != nil {
		return 0, err
	}
	return version, n.fenceShards(ctx, shards, version)
}

// fenceShards is snapshotRead for a version known not to be in the future.
func (n *Node) fenceShards(ctx context.Context, shards []uint64, version uint64) error {
	for _, id := range n.expandLocal(shards) {
		if _, err := n.leaderRead(ctx, id, version, 0); err != nil {
			if n.isMergedAway(id) && !n.hasReplica(id) {
				// Merged while the read waited: the shard that took it
				// in, held here too, is fenced by this loop, and the
				// merge was applied here only after every write of the
				// merged shard had been.
				continue
			}
			return err
		}
	}
	return nil
}

// checkRetained fails with compacted if any of shards may have dropped
// versions needed to read at version. It is checked after the read: a GC
// applied before the read raised its threshold before the read could see
// its effect.
func (n *Node) checkRetained(shards []uint64, version uint64) error {
	for _, id := range n.withMerging(shards) {
		gc, err := n.gcThresholds.Get(n.eng.DB, id)
		if err != nil {
			return kv.Errorf(kv.CodeInternal, "reading the GC threshold: %v", err)
		}
		if version < gc {
			return kv.Errorf(kv.CodeCompacted, "version %d is older than the retention window (versions below %d are compacted)", version, gc)
		}
	}
	return nil
}
