package replication

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"

	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/shard"
	"github.com/groupkv/groupkv/internal/storage"
	"github.com/groupkv/groupkv/internal/txn"
)

// Config configures a Host. The zero value of every optional field means its
// default.
type Config struct {
	// NodeID is this node's id (required).
	NodeID uint64
	// Engine is the node's storage (required).
	Engine *storage.Engine
	// Versions issues timestamps for write versions (required).
	Versions VersionSource
	// TickInterval is the wall time of one raft tick; 0 means 100ms.
	TickInterval time.Duration
	// ElectionTicks and HeartbeatTicks: 0 means 10 and 1.
	ElectionTicks, HeartbeatTicks int
	// TruncateAfter is the number of applied entries a log keeps before it is
	// truncated while some replica may still need them; 0 means 10,000 (a
	// few MiB of small writes per shard). A log that every replica has is
	// truncated sooner (see truncateIndex).
	TruncateAfter uint64
	// ChecksumRate is how many bytes per second a consistency checksum
	// reads (shard.ChecksumJob.Run); 0 or less: as fast as it can.
	ChecksumRate int64
	// Unversioned reports the groups that never take versioned writes (the
	// meta shard, where the oracle itself lives): their leaders need no
	// timestamp to become ready. nil means none.
	Unversioned func(shardID uint64) bool
	// Hooks observe applied commands; nil fields are skipped.
	Hooks Hooks
	// MergeBatch, if set, writes into the apply batch of a merge the
	// node's own records of the right replica it removes (the raft state
	// and shard state are removed by the Host), so that they go with it
	// atomically. It is called from the Host loop and must not block.
	MergeBatch func(b *pebble.Batch, right uint64) error
	// Transport carries raft messages to the replicas of other nodes; nil
	// on a single node, whose groups have one voter and send nothing.
	Transport Transport
	// LatestCache, when set, is the node's cache of newest versions: the
	// shards invalidate it as they write, and a restored snapshot clears
	// it (see shard.LatestCache).
	LatestCache *shard.LatestCache
	// GCThresholds, when set, is the node's view of its shards' GC
	// thresholds: the shards raise it as they apply, and a restored
	// snapshot holds its shard there over the commit that replaces the
	// threshold (see shard.GCThresholds).
	GCThresholds *shard.GCThresholds
	// Metrics may be nil.
	Metrics *Metrics
	Logger  *slog.Logger
}

// VersionSource issues timestamps above every one issued before and above
// floor. TryNext must not block; false means "not now, ask again next
// cycle".
type VersionSource interface {
	TryNext(floor uint64) (uint64, bool)
}

// SequencedVersionSource is a VersionSource that can promise real-time
// order: TryNextAfter issues a timestamp only if it was obtained after the
// proposal numbered seq (see Host.ProposalSeq) arrived, so a write that
// starts after another one ended gets a higher version even when
// timestamps come from another node in batches.
type SequencedVersionSource interface {
	VersionSource
	TryNextAfter(floor, seq uint64) (uint64, bool)
}

// Message is a raft message of one shard's group; Msg.To and Msg.From are
// replica ids within that group.
type Message struct {
	ShardID uint64
	Msg     raftpb.Message
}

// Transport carries raft messages between Hosts. Send is called from the
// Host loop after the cycle's entries are persisted; it must not block and
// may drop messages (raft retries). The receiving side hands each message to
// its Host's Deliver.
type Transport interface {
	Send(msgs []Message)
}

// Hooks are called from the Host loop after a cycle's applied state is
// committed. They must not block and must not call back into the Host
// synchronously.
type Hooks struct {
	// Applied is called for every applied command with its result.
	Applied func(shardID uint64, cmd shard.CommandKind, res shard.Result)
	// LeaderReady is called when a group's leader on this node has applied
	// an entry of its own term and may propose.
	LeaderReady func(shardID uint64, sm *shard.Shard)
	// LeaderLost is called when this node stops leading a group.
	LeaderLost func(shardID uint64)
	// ConfChanged is called when a group applied a configuration change.
	ConfChanged func(shardID uint64, cs raftpb.ConfState)
	// SnapshotApplied is called when a group's state was replaced by a
	// snapshot from its leader.
	SnapshotApplied func(shardID uint64, sm *shard.Shard)
}

func (c *Config) ensureDefaults() {
	if c.TickInterval == 0 {
		c.TickInterval = 100 * time.Millisecond
	}
	if c.ElectionTicks == 0 {
		c.ElectionTicks = 10
	}
	if c.HeartbeatTicks == 0 {
		c.HeartbeatTicks = 1
	}
	if c.TruncateAfter == 0 {
		c.TruncateAfter = 10000
	}
	if c.Metrics == nil {
		c.Metrics = NewMetrics(nil)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// proposal is a command waiting to be proposed, then applied.
type proposal struct {
	id    uint64
	shard uint64
	cmd   []byte
	// conf is a configuration change (cmd is nil then).
	conf *raftpb.ConfChangeV2
	// done receives exactly one outcome; buffered. A proposal made with
	// ProposeAsync has notify instead (done is nil): see answer.
	done   chan outcome
	notify func(shard.Result, error)
	// index is the log index of the proposal's entry, once persisted here
	// (0 before); orphanedAt the tick this replica stopped leading while
	// the entry waited to be applied (0: it still leads).
	index, orphanedAt uint64
}

type outcome struct {
	res shard.Result
	err error
}

// answer hands p its outcome: on done, or to notify, which runs on the
// goroutine answering (the loop, or the one stopping the host).
func (p *proposal) answer(o outcome) {
	if p.notify != nil {
		p.notify(o.res, o.err)
		return
	}
	p.done <- o
}

// group is one raft group replica on this node. Fields without a lock are
// owned by the Host loop.
type group struct {
	id        uint64
	replicaID uint64
	rn        *raft.RawNode
	storage   *raftStorage
	sm        *shard.Shard
	// smRef is sm, for readers outside the loop (MinPrepared).
	smRef atomic.Pointer[shard.Shard]
	// waiting holds proposals that cannot be proposed yet (no ready leader,
	// or no timestamp this cycle), in arrival order.
	waiting []*proposal
	// inflight maps proposal ids to proposals handed to raft.
	inflight map[uint64]*proposal
	// orphans maps the log indexes of inflight proposals whose leader
	// stepped down to them: the entry applied at that index tells whether
	// the new leader committed the proposal (see orphanInflight).
	orphans  map[uint64]*proposal
	term     uint64
	isLeader bool
	// singleVoter: the group has one voter (this replica) and no learner,
	// so a ready leader's applied state holds every acknowledged write
	// without asking anyone. Updated by configuration changes.
	singleVoter atomic.Bool
	// ahead is the last log index applied ahead of its commit (see
	// markAhead): raft delivers it, committed, in a later cycle, where it
	// is not applied again (loop-owned).
	ahead uint64
	// caughtUp is the highest log index a KindTruncateLog applied here
	// named: every replica had appended the log up to it when the leader
	// proposed it, so a follower may drop its entries up to there
	// (loop-owned; see truncateIndex).
	caughtUp uint64
	// reads maps read-index request ids to their waiters (loop-owned).
	reads map[uint64]*readRequest
	// snapSent maps replica ids to the tick a snapshot was sent to them;
	// a snapshot not acknowledged within snapshotTimeoutTicks is reported
	// failed so that raft sends another (loop-owned).
	snapSent map[uint64]uint64
	// restored is the descriptor of the snapshot being restored
	// (loop-owned).
	restored shard.Desc
	// campaigns left for a new group's preferred leader: its first
	// campaign may reach peers that have not created the group yet, so it
	// campaigns again every few ticks while no leader is known (loop-owned).
	campaigns int

	mu struct {
		sync.Mutex
		// ready: this replica leads and has applied an entry of its term.
		ready bool
		// readyTerm is the term of the leadership ready is about.
		readyTerm uint64
		// leader is the replica id of the known leader (0: unknown).
		leader uint64
		// lastAssigned is the highest version handed to a proposal.
		lastAssigned uint64
		// unapplied are the versions handed to proposals and not applied
		// yet, in increasing order (the loop assigns them in order, and
		// they are applied in order); a version lost with its proposal to
		// a change of leader stays until the next leadership is ready.
		unapplied []uint64
		// readWatermark is the highest snapshot timestamp served; every
		// later proposal gets a version above it.
		readWatermark uint64
		// appliedVersion is the version of the last applied write (accepted
		// or refused). Invariant: proposals are applied in version order, so
		// every proposal with a version <= appliedVersion has been applied.
		appliedVersion uint64
		// appliedIndex is the last applied raft index, published after the
		// apply batch is committed.
		appliedIndex uint64
		// changed is closed and replaced when ready or appliedVersion change.
		changed chan struct{}
		removed bool
		// match is, on a leader, the match index of every replica, and
		// lastIndex the leader's last log index (refreshed every tick).
		match     map[uint64]uint64
		lastIndex uint64
		// confState is the applied configuration.
		confState raftpb.ConfState
		// desc is the shard's descriptor as of the applied index (a split
		// narrows it).
		desc shard.Desc
	}
}

// Host runs every raft group of a node.
type Host struct {
	cfg Config
	db  *pebble.DB
	// createMu orders CreateEmpty against the apply of a batch, which may
	// create a split's child replica (see CreateEmpty).
	createMu sync.Mutex

	// groupsView is a copy of mu.groups, replaced whenever it changes,
	// for the lookups of every read and write (group) without the lock
	// the proposal queue takes.
	groupsView atomic.Pointer[map[uint64]*group]
	mu         struct {
		sync.Mutex
		groups  map[uint64]*group
		queue   []*proposal
		readQ   []*readRequest
		inbox   []Message
		removes []uint64
		// snapReports are snapshot outcomes for raft.
		snapReports []snapReport
		// transfers are leadership transfers asked for: shard -> replica.
		transfers map[uint64]uint64
		nextID    uint64
		stopped   bool
		// started is set by Start: Stop of a host whose loop never ran
		// has no loop to wait for.
		started bool
		// applied is closed and replaced after every cycle that applied a
		// write to any shard.
		applied chan struct{}
	}
	// changes holds the change log entries of the batch being applied,
	// for all its shards (shard.ChangeBuffer; loop-owned).
	changes *shard.ChangeBuffer
	// lastAnswered is the number of proposals the last cycle answered
	// (loop-owned).
	lastAnswered int
	// readyScratch is processReady's list of the groups with a Ready, and
	// applyScratch applyReady's lists, kept from one cycle to the next,
	// emptied (loop-owned).
	readyScratch []readyGroup
	applyScratch applyLists
	// ticks counts the loop's raft ticks (loop-owned).
	ticks uint64
	// seqVersions is Versions when it is sequenced (else nil).
	seqVersions SequencedVersionSource
	// pendingSnaps are the Pebble snapshots of raft snapshots handed to raft
	// and not yet sent, by token (loop-owned).
	pendingSnaps map[uint64]pendingSnap
	snapSeq      uint64
	// snapBuilds are the goroutines reading snapshots (to send one, or to
	// sum a shard for a consistency check); Stop waits for them.
	snapBuilds sync.WaitGroup
	// sumMu lets one consistency checksum run at a time.
	sumMu sync.Mutex
	// checksumGate, when set (by tests), holds every checksum job until it
	// receives.
	checksumGate chan struct{}
	wake         chan struct{}
	stop         chan struct{}
	done         chan struct{}
	// failed is closed when the loop stops because storage failed.
	failed   chan struct{}
	failOnce sync.Once
	// failure is why: the node's storage failed (nil: it did not, or not
	// yet). Its mutex is taken after h.mu, never before, and Fail takes
	// no other: Pebble may call Fail from a read under any lock.
	failure struct {
		sync.Mutex
		err error
	}
	// hasFailed is failure.err != nil, for a check on every request.
	hasFailed atomic.Bool
	// refusal, when set, is the answer to every proposal that adds data
	// (RefuseWrites).
	refusal atomic.Pointer[WritesRefusedError]
}

// NewHost returns a Host with no groups; Start runs its loop.
func NewHost(cfg Config) *Host {
	cfg.ensureDefaults()
	h := &Host{cfg: cfg, db: cfg.Engine.DB, changes: &shard.ChangeBuffer{}, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}), failed: make(chan struct{})}
	h.seqVersions, _ = cfg.Versions.(SequencedVersionSource)
	h.pendingSnaps = make(map[uint64]pendingSnap)
	h.mu.groups = make(map[uint64]*group)
	h.mu.applied = make(chan struct{})
	return h
}

// Bootstrap writes the initial state of a new group (shard) whose voters are
// the given replica ids, together with extra writes, in one synced batch.
func (h *Host) Bootstrap(shardID uint64, voters []uint64, extra func(b *pebble.Batch) error) error {
	b := h.db.NewBatch()
	defer b.Close()
	if err := bootstrapGroup(b, shardID, voters); err != nil {
		return err
	}
	if err := (&shard.Shard{}).SetAppliedFor(b, shardID, bootstrapIndex, bootstrapTerm); err != nil {
		return err
	}
	if extra != nil {
		if err := extra(b); err != nil {
			return err
		}
	}
	return h.cfg.Engine.Commit(b, pebble.Sync)
}

// ErrReplicaExists is returned by CreateEmpty when the shard already has
// raft state here: a split applied in a parent replica here created it.
var ErrReplicaExists = errors.New("replication: the shard already has a replica here")

// CreateEmpty writes the raft state of a replica that joins an existing
// group: no configuration and an empty log, so that its leader sends it a
// snapshot. extra writes go in the same synced batch. It refuses, with
// ErrReplicaExists, a shard whose raft state exists here; it and the apply
// of a split (which writes its child's state) exclude each other, so a
// child is created by exactly one of them.
func (h *Host) CreateEmpty(shardID uint64, extra func(b *pebble.Batch) error) error {
	h.createMu.Lock()
	defer h.createMu.Unlock()
	if _, ok, err := storage.GetValue(h.db, storage.RaftTruncatedKey(shardID)); err != nil {
		return err
	} else if ok {
		return fmt.Errorf("%w: shard %d", ErrReplicaExists, shardID)
	}
	b := h.db.NewBatch()
	defer b.Close()
	if err := b.Set(storage.RaftTruncatedKey(shardID), encodeTruncated(0, 0), nil); err != nil {
		return err
	}
	if extra != nil {
		if err := extra(b); err != nil {
			return err
		}
	}
	return h.cfg.Engine.Commit(b, pebble.Sync)
}

// GroupOptions are the options of AddGroup.
type GroupOptions struct {
	// Campaign starts an election at once: the preferred leader of a new
	// group, so that leaders spread without waiting for a timeout.
	Campaign bool
}

// childHere reports whether shardID has a replica here, running or
// created by CreateEmpty (see shard.SetChildHere). Called from the loop's
// apply, which holds createMu.
func (h *Host) childHere(shardID uint64) bool {
	if h.group(shardID) != nil {
		return true
	}
	_, ok, err := storage.GetValue(h.db, storage.RaftTruncatedKey(shardID))
	return ok || err != nil
}

// AddGroup starts the raft group of a bootstrapped shard replica.
func (h *Host) AddGroup(desc shard.Desc, replicaID uint64) error {
	return h.AddGroupWith(desc, replicaID, GroupOptions{})
}

// AddGroupWith is AddGroup with options.
func (h *Host) AddGroupWith(desc shard.Desc, replicaID uint64, opts GroupOptions) error {
	rs, err := loadRaftStorage(h.db, desc.ShardID)
	if err != nil {
		return err
	}
	sm, err := shard.Load(h.db, desc)
	if err != nil {
		return err
	}
	sm.SetChildHere(h.childHere)
	sm.SetLatestCache(h.cfg.LatestCache)
	sm.SetGCThresholds(h.cfg.GCThresholds)
	sm.SetChangeBuffer(h.changes)
	applied, _ := sm.Applied()
	rn, err := raft.NewRawNode(&raft.Config{
		ID:                        replicaID,
		ElectionTick:              h.cfg.ElectionTicks,
		HeartbeatTick:             h.cfg.HeartbeatTicks,
		Storage:                   rs,
		Applied:                   applied,
		MaxSizePerMsg:             1 << 20,
		MaxCommittedSizePerReady:  64 << 20,
		MaxInflightMsgs:           256,
		CheckQuorum:               true,
		PreVote:                   true,
		DisableProposalForwarding: true,
		Logger:                    raftLogger{h.cfg.Logger.With("shard", desc.ShardID)},
	})
	if err != nil {
		return fmt.Errorf("replication: starting shard %d: %w", desc.ShardID, err)
	}
	g := &group{id: desc.ShardID, replicaID: replicaID, rn: rn, storage: rs, sm: sm, inflight: make(map[uint64]*proposal), orphans: make(map[uint64]*proposal),
		reads: make(map[uint64]*readRequest), snapSent: make(map[uint64]uint64)}
	g.smRef.Store(sm)
	rs.snapshot = func() (raftpb.Snapshot, error) {
		// Called by raft from the loop, between cycles: Pebble holds the
		// state machine exactly as of its applied index. Only a Pebble
		// snapshot is taken here; the data are read from it off the loop
		// when the message is sent (see send), so a large shard does not
		// stall the node's other shards.
		index, term := g.sm.Applied()
		h.snapSeq++
		h.pendingSnaps[h.snapSeq] = pendingSnap{snap: h.db.NewSnapshot(), desc: g.sm.Desc()}
		return raftpb.Snapshot{Data: encodeSnapToken(h.snapSeq),
			Metadata: raftpb.SnapshotMetadata{Index: index, Term: term, ConfState: g.storage.confState}}, nil
	}
	g.singleVoter.Store(isSingleVoter(rs.confState, replicaID))
	g.mu.appliedIndex = applied
	g.mu.changed = make(chan struct{})
	g.mu.appliedVersion = sm.MaxVersion()
	g.mu.lastAssigned = sm.MaxVersion()
	g.mu.confState = rs.confState
	g.mu.desc = sm.Desc()
	if opts.Campaign {
		g.campaigns = 5
	}
	if g.singleVoter.Load() || opts.Campaign {
		// A single voter elects itself at once rather than after an
		// election timeout; so does a new group's preferred leader.
		if err := rn.Campaign(); err != nil {
			return err
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.mu.stopped {
		return errStopped
	}
	if _, ok := h.mu.groups[desc.ShardID]; ok {
		return fmt.Errorf("replication: shard %d already running", desc.ShardID)
	}
	h.mu.groups[desc.ShardID] = g
	h.publishGroupsLocked()
	h.signal()
	return nil
}

func isSingleVoter(cs raftpb.ConfState, replicaID uint64) bool {
	return len(cs.Voters) == 1 && cs.Voters[0] == replicaID && len(cs.Learners) == 0 && len(cs.VotersOutgoing) == 0
}

// RemoveGroup stops a group; its pending proposals fail. The caller removes
// the replica's data afterwards.
func (h *Host) RemoveGroup(shardID uint64) {
	h.mu.Lock()
	h.mu.removes = append(h.mu.removes, shardID)
	h.mu.Unlock()
	h.signal()
}

// WaitRemoved waits until a RemoveGroup of shardID has been carried out by
// the loop (or the loop stopped), so the group writes nothing more.
func (h *Host) WaitRemoved(shardID uint64) {
	for {
		h.mu.Lock()
		_, ok := h.mu.groups[shardID]
		stopped := h.mu.stopped
		h.mu.Unlock()
		if !ok || stopped {
			return
		}
		select {
		case <-h.done:
			return
		case <-time.After(time.Millisecond):
		}
	}
}

func (h *Host) signal() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

func (h *Host) group(shardID uint64) *group {
	if m := h.groupsView.Load(); m != nil {
		return (*m)[shardID]
	}
	return nil
}

// publishGroupsLocked replaces groupsView by a copy of mu.groups; h.mu is
// held.
func (h *Host) publishGroupsLocked() {
	m := maps.Clone(h.mu.groups)
	h.groupsView.Store(&m)
}

// Propose hands cmd to shardID's raft group and waits until it is applied.
// A write command gets its version at proposal. Errors: kv unavailable when
// the shard is not served here or the host stops; the context's error.
// After the context ends the command may still be applied.
func (h *Host) Propose(ctx context.Context, shardID uint64, cmd []byte) (shard.Result, error) {
	return h.ProposeThen(ctx, shardID, cmd, nil)
}

// ProposeThen is Propose, and calls then (unless nil) once the proposal's
// outcome is known: when it returns, or, when ctx ends first, later, once
// the command was applied or failed (or the node stopped). A proposer
// that holds locks for its command releases them in then: a command whose
// proposer gave up may still be applied, and until it is, others must
// not take its keys.
func (h *Host) ProposeThen(ctx context.Context, shardID uint64, cmd []byte, then func()) (shard.Result, error) {
	p := &proposal{shard: shardID, cmd: cmd, done: make(chan outcome, 1)}
	if err := h.enqueue(p); err != nil {
		if then != nil {
			then()
		}
		return shard.Result{}, err
	}
	answered := func(o outcome) (shard.Result, error) {
		if then != nil {
			then()
		}
		return o.res, o.err
	}
	// thenLater has then called once the outcome comes, for a caller
	// that stops waiting for it.
	thenLater := func() {
		if then != nil {
			go func() {
				<-p.done
				then()
			}()
		}
	}
	select {
	case o := <-p.done:
		return answered(o)
	case <-ctx.Done():
		thenLater()
		return shard.Result{}, ctx.Err()
	case <-h.failed:
		// The loop may be stuck in storage that no longer takes writes
		// (a write stall no flush will end): the outcome is not waited
		// for, unless it is here.
		select {
		case o := <-p.done:
			return answered(o)
		default:
		}
		thenLater()
		return shard.Result{}, failedUnknown()
	}
}

// failedUnknown answers a proposal whose host's storage failed before its
// outcome was known.
func failedUnknown() *kv.Error {
	return kv.Errorf(kv.CodeCommitUnknown, "the node's storage failed before the write was applied; it may or may not have been")
}

// ProposeAsync hands cmd to shardID's raft group as Propose does, and
// returns at once: done is called exactly once with what Propose would
// return, from the host's loop (or, when the host stops, the goroutine
// stopping it), so it must not block. An error returned means done will
// not be called (the host stops).
func (h *Host) ProposeAsync(shardID uint64, cmd []byte, done func(shard.Result, error)) error {
	return h.enqueue(&proposal{shard: shardID, cmd: cmd, notify: done})
}

// RefuseWrites has every proposal that adds data (shard.AddsData)
// answered err from now on, before it is queued; nil takes them again. A
// node whose disk is low refuses them, and goes on serving reads and
// finishing the work it accepted.
func (h *Host) RefuseWrites(err *kv.Error) {
	if err == nil {
		h.refusal.Store(nil)
		return
	}
	h.refusal.Store(&WritesRefusedError{err})
}

// WritesRefused is what RefuseWrites set, or nil.
func (h *Host) WritesRefused() *WritesRefusedError { return h.refusal.Load() }

// WritesRefusedError is the answer to a proposal a Host refused
// (RefuseWrites): nothing of it was done, and a retry is refused the same
// way until the node takes writes again.
type WritesRefusedError struct{ Err *kv.Error }

func (e *WritesRefusedError) Error() string { return e.Err.Error() }
func (e *WritesRefusedError) Unwrap() error { return e.Err }

// enqueue numbers p and queues it for the loop.
func (h *Host) enqueue(p *proposal) error {
	if err := h.refusal.Load(); err != nil && shard.AddsData(p.cmd) {
		return err
	}
	h.mu.Lock()
	if h.mu.stopped {
		h.mu.Unlock()
		return h.stoppedError()
	}
	h.mu.nextID++
	p.id = h.mu.nextID
	h.mu.queue = append(h.mu.queue, p)
	h.mu.Unlock()
	h.signal()
	return nil
}

// ProposeConfChange proposes a configuration change of shardID's group on
// its leader here and waits until it is applied. raft refuses a change
// while another is pending: the proposer then waits out its context.
func (h *Host) ProposeConfChange(ctx context.Context, shardID uint64, cc raftpb.ConfChangeV2) error {
	p := &proposal{shard: shardID, conf: &cc, done: make(chan outcome, 1)}
	if err := h.enqueue(p); err != nil {
		return err
	}
	select {
	case o := <-p.done:
		if o.err != nil {
			return o.err
		}
		if o.res.Err != nil {
			return o.res.Err
		}
		return nil
	case <-ctx.Done():
		return kv.Errorf(kv.CodeUnavailable, "shard %d: configuration change not applied: %v", shardID, ctx.Err())
	case <-h.failed:
		return h.stoppedError()
	}
}

// TransferLeadership asks shardID's leader here to hand leadership to
// replica to (raft's leader transfer: the target is caught up first, then
// campaigns at once). It does not wait; nothing happens if this replica does
// not lead.
func (h *Host) TransferLeadership(shardID, to uint64) {
	h.mu.Lock()
	if h.mu.transfers == nil {
		h.mu.transfers = make(map[uint64]uint64)
	}
	h.mu.transfers[shardID] = to
	h.mu.Unlock()
	h.signal()
}

// ProposalSeq returns the number of the last proposal queued: a proposal
// queued later has a higher number (see SequencedVersionSource).
func (h *Host) ProposalSeq() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.mu.nextID
}

// Signal wakes the loop, say because timestamps became available.
func (h *Host) Signal() { h.signal() }

// ConfState returns shardID's applied configuration.
func (h *Host) ConfState(shardID uint64) (raftpb.ConfState, bool) {
	g := h.group(shardID)
	if g == nil {
		return raftpb.ConfState{}, false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.mu.confState, true
}

// Progress returns, on the leader of shardID, the match index of every
// replica and the leader's last index, as of the last tick.
func (h *Host) Progress(shardID uint64) (match map[uint64]uint64, lastIndex uint64, ok bool) {
	g := h.group(shardID)
	if g == nil {
		return nil, 0, false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.mu.ready {
		return nil, 0, false
	}
	match = make(map[uint64]uint64, len(g.mu.match))
	for id, m := range g.mu.match {
		match[id] = m
	}
	return match, g.mu.lastIndex, true
}

// Desc returns shardID's descriptor as of its applied index on this node.
func (h *Host) Desc(shardID uint64) (shard.Desc, bool) {
	g := h.group(shardID)
	if g == nil {
		return shard.Desc{}, false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.mu.desc, true
}

// AppliedIndex returns shardID's applied raft index on this node.
func (h *Host) AppliedIndex(shardID uint64) (uint64, bool) {
	g := h.group(shardID)
	if g == nil {
		return 0, false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.mu.appliedIndex, true
}

// AppliedVersion returns the version of the last write shardID applied on
// this node (published after it applied): every write applied later has a
// greater version.
func (h *Host) AppliedVersion(shardID uint64) (uint64, bool) {
	g := h.group(shardID)
	if g == nil {
		return 0, false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.mu.appliedVersion, true
}

// WaitApplied waits until shardID has applied index on this node.
func (h *Host) WaitApplied(ctx context.Context, shardID, index uint64) error {
	g := h.group(shardID)
	if g == nil {
		return kv.Errorf(kv.CodeUnavailable, "shard %d is not served by this node", shardID)
	}
	for {
		g.mu.Lock()
		done, removed, ch := g.mu.appliedIndex >= index, g.mu.removed, g.mu.changed
		g.mu.Unlock()
		if done {
			return nil
		}
		if removed {
			return kv.Errorf(kv.CodeUnavailable, "shard %d was removed", shardID)
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return kv.Errorf(kv.CodeUnavailable, "shard %d did not catch up to index %d: %v", shardID, index, ctx.Err())
		case <-h.failed:
			return h.stoppedError()
		}
	}
}

// Deliver hands a raft message from another node to its group. It does not
// block; messages of groups not served here are dropped.
func (h *Host) Deliver(m Message) {
	h.mu.Lock()
	if h.mu.stopped {
		h.mu.Unlock()
		return
	}
	h.mu.inbox = append(h.mu.inbox, m)
	h.mu.Unlock()
	h.signal()
}

// readRequest is a linearizable read waiting for its read index.
type readRequest struct {
	id    uint64
	shard uint64
	// tick is the loop tick the request was handed to raft at.
	tick uint64
	// more are the requests of the same group and cycle that share this
	// one's read index: one heartbeat round confirms them all.
	more []*readRequest
	// done receives the read index, or 0 when the read must be retried
	// elsewhere; buffered.
	done chan uint64
}

// answer answers r and the requests that share its read index.
func (r *readRequest) answer(index uint64) {
	r.done <- index
	for _, m := range r.more {
		m.done <- index
	}
}

// ReadBarrier returns once a read of shardID's applied state on this node
// is linearizable: everything committed before the call has been applied
// here. A one-voter group needs nothing more than a ready leader; a larger
// one confirms leadership with raft's ReadIndex (a heartbeat round to a
// quorum) — asked of the leader when this replica is a follower — and waits
// until the read index is applied, so a leader cut off from its quorum
// serves no stale read and a follower serves no read it has not caught up to.
func (h *Host) ReadBarrier(ctx context.Context, shardID uint64) error {
	g := h.group(shardID)
	if g == nil {
		return kv.Errorf(kv.CodeUnavailable, "shard %d is not served by this node", shardID)
	}
	if g.singleVoter.Load() {
		return h.WaitReady(ctx, shardID)
	}
	r := &readRequest{shard: shardID, done: make(chan uint64, 1)}
	h.mu.Lock()
	if h.mu.stopped {
		h.mu.Unlock()
		return h.stoppedError()
	}
	h.mu.nextID++
	r.id = h.mu.nextID
	h.mu.readQ = append(h.mu.readQ, r)
	h.mu.Unlock()
	h.signal()
	var index uint64
	select {
	case index = <-r.done:
	case <-ctx.Done():
		return kv.Errorf(kv.CodeUnavailable, "shard %d could not confirm its leadership: %v", shardID, ctx.Err())
	case <-h.failed:
		return h.stoppedError()
	}
	if index == 0 {
		return kv.Errorf(kv.CodeUnavailable, "shard %d has no reachable leader to confirm a read; retry", shardID)
	}
	return h.WaitApplied(ctx, shardID, index)
}

// WaitReady waits until shardID has a ready leader on this node.
func (h *Host) WaitReady(ctx context.Context, shardID uint64) error {
	for {
		g := h.group(shardID)
		if g == nil {
			return kv.Errorf(kv.CodeUnavailable, "shard %d is not served by this node", shardID)
		}
		g.mu.Lock()
		ready, removed, ch := g.mu.ready, g.mu.removed, g.mu.changed
		g.mu.Unlock()
		if removed {
			return kv.Errorf(kv.CodeUnavailable, "shard %d was removed", shardID)
		}
		if ready {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return kv.Errorf(kv.CodeUnavailable, "shard %d has no ready leader: %v", shardID, ctx.Err())
		case <-h.failed:
			return h.stoppedError()
		}
	}
}

// Ready reports whether shardID has a ready leader on this node.
func (h *Host) Ready(shardID uint64) bool {
	g := h.group(shardID)
	if g == nil {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.mu.ready
}

// ReadableNow reports whether a read of shardID here needs no barrier:
// the replica is the group's only voter and its ready leader, so that
// everything committed is applied here (ReadBarrier would not wait). A
// host whose storage failed serves no read, even in the moment before its
// loop has stopped.
func (h *Host) ReadableNow(shardID uint64) bool {
	g := h.group(shardID)
	if g == nil || !g.singleVoter.Load() || h.hasFailed.Load() {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.mu.ready && !g.mu.removed
}

// LeaderTerm returns the term of this replica's ready leadership of
// shardID; ok is false when it is not a ready leader.
func (h *Host) LeaderTerm(shardID uint64) (term uint64, ok bool) {
	g := h.group(shardID)
	if g == nil {
		return 0, false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.mu.readyTerm, g.mu.ready
}

// Leader returns the replica id of shardID's known leader (0: unknown).
func (h *Host) Leader(shardID uint64) uint64 {
	g := h.group(shardID)
	if g == nil {
		return 0
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.mu.leader
}

// SnapshotRead prepares a read of shardID at timestamp ts: it raises the
// shard's read watermark to ts, so that no later proposal gets a version at
// or below ts, and waits until every proposal with a version <= ts has been
// applied. Afterwards a read of applied state at ts is stable.
func (h *Host) SnapshotRead(ctx context.Context, shardID, ts uint64) error {
	if err := h.ReadBarrier(ctx, shardID); err != nil {
		return err
	}
	g := h.group(shardID)
	if g == nil {
		return kv.Errorf(kv.CodeUnavailable, "shard %d is not served by this node", shardID)
	}
	return g.fence(ctx, ts)
}

// dropAppliedLocked forgets the unapplied versions at or below the
// applied version. g.mu is held.
func (g *group) dropAppliedLocked() {
	n := 0
	for n < len(g.mu.unapplied) && g.mu.unapplied[n] <= g.mu.appliedVersion {
		n++
	}
	if n > 0 {
		g.mu.unapplied = append(g.mu.unapplied[:0], g.mu.unapplied[n:]...)
	}
}

// fence raises g's read watermark to ts, so that no later proposal gets a
// version at or below it, and waits until every proposal with a version
// <= ts has been applied. g must be a ready leader here.
func (g *group) fence(ctx context.Context, ts uint64) error {
	g.mu.Lock()
	if !g.mu.ready {
		g.mu.Unlock()
		return kv.Errorf(kv.CodeNotLeader, "shard %d is not led by this node", g.id)
	}
	if ts > g.mu.readWatermark {
		g.mu.readWatermark = ts
	}
	g.mu.Unlock()
	for {
		g.mu.Lock()
		done := len(g.mu.unapplied) == 0 || g.mu.unapplied[0] > ts
		ready, removed, ch := g.mu.ready, g.mu.removed, g.mu.changed
		g.mu.Unlock()
		if done {
			return nil
		}
		if removed {
			return kv.Errorf(kv.CodeUnavailable, "shard %d was removed", g.id)
		}
		if !ready {
			// The writes awaited may have gone with the leadership.
			return kv.Errorf(kv.CodeNotLeader, "shard %d is no longer led by this node", g.id)
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// ReadNow prepares a linearizable read of shardIDs, each led here, at one
// version without waiting for the writes in flight, as SnapshotRead at a
// timestamp from the oracle would: the version is the highest any of them
// applied (or fenced), and on return every write at or below it has been
// applied in each of them, and none will come there. A write acknowledged
// before the call was applied, so it is at or below that version; one in
// flight was not acknowledged, and a read may or may not see it.
//
// That holds while no shard holds a prepared transaction: one committed
// and acknowledged may have its commit timestamp above every version its
// participants applied, until their resolves are, which are proposed after
// the commit, at versions above its timestamp (a version source gives a
// proposal a version above every one issued before the proposal was
// queued). When a shard holds one, or is not a ready leader here, ok is
// false: the caller reads at a timestamp from the oracle instead; so it
// is on any other failure. err is the context's, once it ended.
func (h *Host) ReadNow(ctx context.Context, shardIDs []uint64) (version uint64, ok bool, err error) {
	groups := make([]*group, 0, len(shardIDs))
	for _, id := range shardIDs {
		g := h.group(id)
		if g == nil || !h.Ready(id) {
			return 0, false, nil
		}
		if err := h.ReadBarrier(ctx, id); err != nil {
			return 0, false, ctx.Err()
		}
		groups = append(groups, g)
	}
	for _, g := range groups {
		sm := g.smRef.Load()
		// Prepared first, then the versions: the loop publishes a
		// resolve's version before the shard stops counting it prepared.
		if sm == nil || sm.MinPrepared() != 0 {
			return 0, false, nil
		}
		g.mu.Lock()
		ready, v := g.mu.ready, max(g.mu.readWatermark, g.mu.appliedVersion)
		g.mu.Unlock()
		if !ready {
			return 0, false, nil
		}
		version = max(version, v)
	}
	if version == 0 {
		return 0, false, nil
	}
	for _, g := range groups {
		if err := g.fence(ctx, version); err != nil {
			return 0, false, ctx.Err()
		}
	}
	return version, true, nil
}

// Resolved returns the shard's resolved timestamp: no write at or below it
// is still to be applied, and none will be proposed. now is a timestamp at
// or above every one the oracle issued (Oracle.Latest); when nothing is in
// flight the shard's read watermark is raised to it, so the answer is now.
// On a shard that is not served here it answers 0.
func (h *Host) Resolved(shardID, now uint64) uint64 {
	g := h.group(shardID)
	if g == nil {
		return 0
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	// A prepared transaction commits at or above its prepare version,
	// possibly below versions applied since: nothing at or above it is
	// resolved until the transaction is.
	limit := ^uint64(0)
	if sm := g.smRef.Load(); sm != nil {
		if p := sm.MinPrepared(); p != 0 {
			limit = p - 1
		}
	}
	if !g.mu.ready || g.mu.lastAssigned > g.mu.appliedVersion {
		// Versions are assigned and applied in order: everything at or
		// below appliedVersion is applied, everything pending is above it.
		return min(g.mu.appliedVersion, limit)
	}
	if now > g.mu.readWatermark {
		g.mu.readWatermark = now
	}
	return min(max(g.mu.readWatermark, g.mu.appliedVersion), limit)
}

// StateMachine returns the state machine of shardID's replica here (nil
// if it is not served here), for readers outside the loop of its parts
// that guard themselves (shard.Shard.WithGroups). A snapshot replaces it.
func (h *Host) StateMachine(shardID uint64) *shard.Shard {
	g := h.group(shardID)
	if g == nil {
		return nil
	}
	return g.smRef.Load()
}

// MinPrepared returns the lowest prepare version of the transactions
// prepared in the replica of shardID here (0: none, or not served here).
func (h *Host) MinPrepared(shardID uint64) uint64 {
	g := h.group(shardID)
	if g == nil {
		return 0
	}
	if sm := g.smRef.Load(); sm != nil {
		return sm.MinPrepared()
	}
	return 0
}

// MayHoldIntent reports whether key, of shardID's collection, may hold
// the intent of a transaction prepared in the shard here (true when the
// shard is not here: the caller looks).
func (h *Host) MayHoldIntent(shardID uint64, key []byte) bool {
	g := h.group(shardID)
	if g == nil {
		return true
	}
	if sm := g.smRef.Load(); sm != nil {
		return sm.MayHoldIntent(key)
	}
	return true
}

// NoTxnRecord reports whether the replica of shardID here knows that
// transaction m, begun at load number epoch, has no record
// (shard.Shard.NoTxnRecord); false means look it up.
func (h *Host) NoTxnRecord(shardID uint64, m *txn.Meta, epoch uint64) bool {
	g := h.group(shardID)
	if g == nil {
		return false
	}
	if sm := g.smRef.Load(); sm != nil {
		return sm.NoTxnRecord(m, epoch)
	}
	return false
}

// AppliedNotify returns a channel that is closed after the next cycle that
// applies a write to any shard.
func (h *Host) AppliedNotify() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.mu.applied
}

// Start runs the loop until Stop.
func (h *Host) Start() {
	h.mu.Lock()
	h.mu.started = true
	h.mu.Unlock()
	go h.run()
}

// Stop stops the loop; pending proposals fail with unavailable. It returns
// once the loop has exited.
func (h *Host) Stop() {
	h.mu.Lock()
	stopped, started := h.mu.stopped, h.mu.started
	h.mu.stopped = true
	h.mu.Unlock()
	if !stopped {
		close(h.stop)
	}
	if started {
		<-h.done
	}
}

// Failed is closed when the loop stopped on its own because the node's
// storage failed (Failure says how); Stop does not close it.
func (h *Host) Failed() <-chan struct{} { return h.failed }

// Fail stops the loop because the node's storage failed outside it (a
// read found its data damaged on disk), as a cycle that fails stops it:
// every request is answered unavailable from then on. Failed is closed at
// once; the loop stops soon after. Fail does not block, and may be called
// from the loop and under any lock.
func (h *Host) Fail(err error) {
	if !h.setFailure(err) {
		return
	}
	h.cfg.Logger.Error("storage failed; stopping the node's raft groups", "err", err)
	go func() {
		h.mu.Lock()
		stopped := h.mu.stopped
		h.mu.stopped = true
		h.mu.Unlock()
		if !stopped {
			close(h.stop)
		}
	}()
}

// setFailure records err as the storage failure, unless one was, and
// closes Failed; it reports whether err was the first.
func (h *Host) setFailure(err error) bool {
	h.failure.Lock()
	first := h.failure.err == nil
	if first {
		h.failure.err = err
		h.hasFailed.Store(true)
	}
	h.failure.Unlock()
	h.failOnce.Do(func() { close(h.failed) })
	return first
}

// HasFailed reports whether a storage failure stopped the loop (Failure).
func (h *Host) HasFailed() bool { return h.hasFailed.Load() }

// Failure is the storage failure that stopped the loop, or nil.
func (h *Host) Failure() error {
	h.failure.Lock()
	defer h.failure.Unlock()
	return h.failure.err
}

// StorageFailedError is the answer of a Host stopped by a storage failure:
// unavailable (errors.As finds Err), and not worth retrying here.
type StorageFailedError struct {
	Err *kv.Error
}

func (e *StorageFailedError) Error() string { return e.Err.Error() }
func (e *StorageFailedError) Unwrap() error { return e.Err }

// stoppedError is the answer to a request the stopped loop will not serve
// (h.mu held).
func (h *Host) stoppedError() error {
	if f := h.Failure(); f != nil {
		return &StorageFailedError{kv.Errorf(kv.CodeUnavailable, "node stopped serving: its storage failed (%v); it serves again once restarted", f)}
	}
	return kv.Errorf(kv.CodeUnavailable, "node is shutting down")
}

// gatherWait bounds how long a cycle waits for the clients it just answered
// to send their next proposals: about a tenth of an fsync, so that under
// load an fsync carries most of the proposals in flight instead of half of
// them, while a lone client waits at most this long.
const gatherWait = 200 * time.Microsecond

// gather waits, after a cycle that answered proposals, until about as many
// new proposals are queued as were answered, or gatherWait passes.
func (h *Host) gather() {
	want := h.lastAnswered / 2
	if want < 2 {
		return
	}
	deadline := time.Now().Add(gatherWait)
	for {
		h.mu.Lock()
		n := len(h.mu.queue)
		h.mu.Unlock()
		if n >= want || time.Now().After(deadline) {
			return
		}
		select {
		case <-h.wake:
		case <-time.After(time.Until(deadline)):
		}
	}
}

func (h *Host) run() {
	defer close(h.done)
	ticker := time.NewTicker(h.cfg.TickInterval)
	defer ticker.Stop()
	busy := true
	for {
		tick := false
		if !busy {
			select {
			case <-h.stop:
				h.shutdown()
				return
			case <-ticker.C:
				tick = true
			case <-h.wake:
			}
		} else {
			select {
			case <-h.stop:
				h.shutdown()
				return
			case <-ticker.C:
				tick = true
			default:
			}
			h.gather()
		}
		var err error
		busy, err = h.cycle(tick)
		if err != nil {
			// The node's storage failed: it cannot go on without risking
			// acknowledged writes. Stop serving.
			h.cfg.Logger.Error("replication cycle failed; stopping the node's raft groups", "err", err)
			h.setFailure(err)
			h.mu.Lock()
			h.mu.stopped = true
			h.mu.Unlock()
			h.shutdown()
			return
		}
	}
}

func (h *Host) shutdown() {
	for id, p := range h.pendingSnaps {
		p.snap.Close()
		delete(h.pendingSnaps, id)
	}
	h.snapBuilds.Wait()
	h.mu.Lock()
	queue := h.mu.queue
	h.mu.queue = nil
	groups := h.mu.groups
	h.mu.Unlock()
	fail := outcome{err: h.stoppedError()}
	unknown := kv.Errorf(kv.CodeCommitUnknown, "node shut down before the write was applied; it may or may not have been")
	if h.Failure() != nil {
		unknown = failedUnknown()
	}
	for _, p := range queue {
		p.answer(fail)
	}
	h.mu.Lock()
	readQ := h.mu.readQ
	h.mu.readQ = nil
	h.mu.Unlock()
	for _, r := range readQ {
		r.done <- 0
	}
	for _, g := range groups {
		for _, p := range g.waiting {
			p.answer(fail)
		}
		g.waiting = nil
		for id, r := range g.reads {
			r.answer(0)
			delete(g.reads, id)
		}
		for _, p := range g.inflight {
			// The entry may still commit at a later start: its outcome is unknown.
			p.answer(outcome{err: unknown})
		}
		g.inflight = map[uint64]*proposal{}
		g.mu.Lock()
		g.mu.removed = true
		close(g.mu.changed)
		g.mu.changed = make(chan struct{})
		g.mu.Unlock()
	}
}

type readyGroup struct {
	g  *group
	rd raft.Ready
	// sentEarly: the messages that need nothing persisted were sent while
	// the cycle's fsync ran; late holds the others.
	sentEarly bool
	late      []raftpb.Message
	// hs is the hard state written for rd (rd.HardState with its commit
	// index raised past the entries applied ahead; empty: nothing to
	// write).
	hs raftpb.HardState
	// ahead are the entries of rd.Entries applied in this cycle, before
	// raft commits them (markAhead).
	ahead []raftpb.Entry
}

// cycle runs one iteration of the loop. It reports whether more work may be
// pending right away.
func (h *Host) cycle(tick bool) (bool, error) {
	h.mu.Lock()
	queue := h.mu.queue
	h.mu.queue = nil
	removes := h.mu.removes
	h.mu.removes = nil
	inbox := h.mu.inbox
	h.mu.inbox = nil
	readQ := h.mu.readQ
	h.mu.readQ = nil
	transfers := h.mu.transfers
	h.mu.transfers = nil
	snapReports := h.mu.snapReports
	h.mu.snapReports = nil
	groups := make([]*group, 0, len(h.mu.groups))
	for _, g := range h.mu.groups {
		groups = append(groups, g)
	}
	h.mu.Unlock()

	for _, id := range removes {
		h.removeGroup(id)
	}
	for _, p := range queue {
		g := h.group(p.shard)
		if g == nil {
			p.answer(outcome{err: kv.Errorf(kv.CodeUnavailable, "shard %d is not served by this node", p.shard)})
			h.cfg.Metrics.ProposalFails.Inc()
			continue
		}
		g.waiting = append(g.waiting, p)
	}
	for _, m := range inbox {
		// A message for another replica id of the shard (one this node
		// held before it lost its disk, or that moved away and back) is
		// not this replica's: raft does not check the destination.
		if g := h.group(m.ShardID); g != nil && m.Msg.To == g.replicaID {
			// An error means a message raft does not take (say, from a
			// removed replica); raft recovers by itself.
			_ = g.rn.Step(m.Msg)
		}
	}
	if tick {
		h.ticks++
	}
	for _, r := range snapReports {
		if g := h.group(r.shard); g != nil {
			g.rn.ReportSnapshot(r.to, r.status)
			delete(g.snapSent, r.to)
		}
	}
	for id, to := range transfers {
		if g := h.group(id); g != nil && g.isLeader {
			g.rn.TransferLeader(to)
		}
	}
	var carriers map[*group]*readRequest
	for _, r := range readQ {
		g := h.group(r.shard)
		if g == nil || (!g.isLeader && g.rn.BasicStatus().Lead == 0) {
			r.done <- 0
			continue
		}
		if c, ok := carriers[g]; ok {
			c.more = append(c.more, r)
			continue
		}
		if carriers == nil {
			carriers = make(map[*group]*readRequest)
		}
		carriers[g] = r
		r.tick = h.ticks
		g.reads[r.id] = r
		g.rn.ReadIndex(binary.BigEndian.AppendUint64(nil, r.id))
	}
	for _, g := range groups {
		if g.isLeader && !g.readyLocked() {
			h.maybeReady(g)
		}
		if len(g.waiting) > 0 {
			h.proposeWaiting(g)
		}
		if tick {
			g.rn.Tick()
			h.onTick(g)
		}
	}

	// A single voter commits an entry once it is persisted: the second
	// round takes what the first one persisted, now committed, without
	// another fsync (skipping what the first round applied ahead, and
	// applying what it could not: see markAhead).
	busy := false
	for round := 0; round < 2; round++ {
		if round == 1 && h.queued() {
			// Proposals came while the first round's fsync ran: the next
			// cycle persists them at once, and takes what this one
			// persisted while it does.
			busy = true
			h.lastAnswered = 0
			break
		}
		did, err := h.processReady(groups)
		if err != nil {
			return false, err
		}
		if !did {
			break
		}
		busy = true
	}
	return busy, nil
}

// queued reports whether proposals wait for the next cycle.
func (h *Host) queued() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.mu.queue) > 0
}

// processReady persists, sends and applies the Ready of every group that
// has one. It reports whether there was any.
func (h *Host) processReady(groups []*group) (bool, error) {
	// Persist: one batch, one fsync, for every group's entries. The list
	// is kept from one cycle to the next (a Ready is a few hundred bytes).
	rgs := h.readyScratch[:0]
	defer func() {
		clear(rgs) // no Ready outlives its cycle
		h.readyScratch = rgs[:0]
	}()
	for _, g := range groups {
		if g.isRemoved() {
			continue // a merge removed it in an earlier round of the cycle
		}
		if g.rn.HasReady() {
			rgs = append(rgs, readyGroup{g: g, rd: g.rn.Ready()})
		}
	}
	if len(rgs) == 0 {
		return false, nil
	}
	ahead := markAhead(rgs)
	for i := range rgs {
		r := &rgs[i]
		r.hs = r.rd.HardState
		if len(r.ahead) > 0 && raft.IsEmptyHardState(r.hs) {
			r.hs = r.g.storage.hardState
		}
		if raft.IsEmptyHardState(r.hs) {
			continue
		}
		// The commit index written never goes back below one raised for
		// entries applied ahead; a hard state that changes nothing is not
		// written again.
		r.hs.Commit = max(r.hs.Commit, r.g.storage.hardState.Commit)
		if n := len(r.ahead); n > 0 {
			r.hs.Commit = max(r.hs.Commit, r.ahead[n-1].Index)
		}
		if r.hs == r.g.storage.hardState {
			r.hs = raftpb.HardState{}
		}
	}
	wb := h.db.NewBatch()
	nents := 0
	mustSync := false
	var snaps []readyGroup
	for _, r := range rgs {
		if !raft.IsEmptySnap(r.rd.Snapshot) {
			// The snapshot's state goes first: the entries follow it.
			if err := h.restoreSnapshot(wb, r.g, r.rd.Snapshot); err != nil {
				wb.Close()
				return false, err
			}
		}
		// A new commit index alone need not be durable: raft recovers it.
		mustSync = mustSync || raft.MustSync(r.rd.HardState, r.g.storage.hardState, len(r.rd.Entries))
		if err := r.g.storage.append(wb, r.rd.Entries, r.hs); err != nil {
			wb.Close()
			return false, err
		}
		nents += len(r.rd.Entries)
	}
	for _, r := range rgs {
		if !raft.IsEmptySnap(r.rd.Snapshot) {
			snaps = append(snaps, r)
		}
	}
	if len(snaps) > 0 {
		// A snapshot replaces the shard's state: it is made durable (with
		// the cycle's entries, which follow it) before anything is applied
		// on top of it.
		if err := h.persistWithSnapshots(wb, rgs, snaps); err != nil {
			wb.Close()
			return false, err
		}
		mustSync = false
	}
	// The fsync runs while this cycle's committed entries are applied into
	// a batch; that batch is committed (made visible) only once the fsync
	// is done, so no read sees a write that could still be lost.
	syncing := false
	syncStart := time.Now()
	if len(snaps) == 0 && !wb.Empty() {
		var err error
		if mustSync {
			err = h.cfg.Engine.ApplyNoSyncWait(wb, pebble.Sync)
			syncing = err == nil
		} else {
			err = h.cfg.Engine.Commit(wb, pebble.NoSync)
		}
		if err != nil {
			wb.Close()
			return false, err
		}
	}
	if syncing {
		h.sendEarly(rgs)
	}
	waitSync := func() error {
		if !syncing {
			return nil
		}
		syncing = false
		if err := wb.SyncWait(); err != nil {
			return err
		}
		h.cfg.Metrics.FsyncSeconds.Observe(time.Since(syncStart).Seconds())
		h.cfg.Metrics.CycleEntries.Observe(float64(nents))
		return nil
	}
	defer wb.Close()
	defer waitSync() // on error paths: never leave the WAL write behind

	// Apply: one batch for every group's committed entries. When they
	// were all made durable by earlier cycles (under a steady load: the
	// entries the previous cycle persisted, while this one persists the
	// proposals queued meanwhile), they are applied and answered without
	// waiting for this cycle's fsync.
	early := syncing && !ahead && committedDurable(rgs)
	res, err := h.applyReady(rgs, waitSync, early)
	if err != nil {
		return false, err
	}
	_ = res
	return true, nil
}

// committedDurable reports whether every committed entry of rgs was
// persisted by an earlier cycle: none is past a group's durable log, nor
// among (or after) the entries this cycle writes.
func committedDurable(rgs []readyGroup) bool {
	for _, r := range rgs {
		ce := r.rd.CommittedEntries
		if len(ce) == 0 {
			continue
		}
		last := ce[len(ce)-1].Index
		if last > r.g.storage.lastIndex {
			return false
		}
		if len(r.rd.Entries) > 0 && r.rd.Entries[0].Index <= last {
			return false
		}
	}
	return true
}

// markAhead sets, for each group that is its only voter and leads, the
// entries of its Ready that are applied in this cycle rather than once raft
// has committed them (r.ahead). A single voter commits an entry as soon as
// it is persisted, so the cycle's apply batch may hold its effects: the
// batch is committed (made visible) and the proposers answered only after
// the cycle's fsync, which persists the entries and a commit index raised
// past them (so that a restart never finds a state applied past the
// commit). Without this, an entry persisted in one cycle was applied and
// answered in the next, a whole cycle later.
//
// Only plain commands are applied ahead (writes, transaction records,
// prepares and resolves, timestamps), from the first entry after the last
// one applied: no configuration change, split, merge or log truncation,
// whose effects on the host follow the cycle's order. A cycle in which any
// group applies something else, or restores a snapshot, applies nothing
// ahead. It reports whether any group applies entries ahead.
func markAhead(rgs []readyGroup) bool {
	for i := range rgs {
		r := &rgs[i]
		if !raft.IsEmptySnap(r.rd.Snapshot) {
			return false
		}
		for j := range r.rd.CommittedEntries {
			e := &r.rd.CommittedEntries[j]
			if e.Index <= r.g.ahead {
				continue
			}
			if e.Type != raftpb.EntryNormal || (len(e.Data) > 0 && !appliesAhead(e)) {
				return false
			}
		}
	}
	any := false
	for i := range rgs {
		r := &rgs[i]
		g := r.g
		if !g.singleVoter.Load() || !g.isLeader || len(r.rd.Entries) == 0 {
			continue
		}
		next, _ := g.sm.Applied()
		next = max(next, g.ahead)
		if n := len(r.rd.CommittedEntries); n > 0 {
			next = max(next, r.rd.CommittedEntries[n-1].Index)
		}
		if r.rd.Entries[0].Index != next+1 {
			continue
		}
		n := 0
		for n < len(r.rd.Entries) && appliesAhead(&r.rd.Entries[n]) {
			n++
		}
		if n > 0 {
			r.ahead = r.rd.Entries[:n]
			any = true
		}
	}
	return any
}

// appliesAhead reports whether e holds a command markAhead may apply ahead
// of its commit.
func appliesAhead(e *raftpb.Entry) bool {
	if e.Type != raftpb.EntryNormal || len(e.Data) < 9 {
		return false
	}
	switch shard.CommandKind(e.Data[8]) {
	case shard.KindWrite, shard.KindTSO, shard.KindTxnRecord, shard.KindTxnPrepare,
		shard.KindTxnResolve, shard.KindTxnResolveBatch, shard.KindTxnForget:
		return true
	}
	return false
}

// restoreSnapshot writes into b the replacement of g's state by snap: the
// shard's replicated state, an empty log after the snapshot's position, and
// its configuration.
func (h *Host) restoreSnapshot(b *pebble.Batch, g *group, snap raftpb.Snapshot) error {
	if err := shard.RestoreSnapshot(b, h.db, g.sm.Desc(), snap.Data); err != nil {
		return fmt.Errorf("replication: shard %d: restoring a snapshot at %d: %w", g.id, snap.Metadata.Index, err)
	}
	// The snapshot's span is the shard's from now on: the sender may have
	// applied a split or merge this replica skips.
	desc, err := shard.SnapshotDesc(snap.Data)
	if err != nil {
		return err
	}
	g.restored = desc
	if err := saveConfState(b, g.id, snap.Metadata.ConfState); err != nil {
		return err
	}
	start, end := storage.RaftLogSpan(g.id, 0, ^uint64(0))
	if err := b.DeleteRange(start, end, nil); err != nil {
		return err
	}
	return b.Set(storage.RaftTruncatedKey(g.id), encodeTruncated(snap.Metadata.Index, snap.Metadata.Term), nil)
}

// persistWithSnapshots commits and syncs b, which restores snapshots, and
// reloads the state machines the snapshots replaced.
func (h *Host) persistWithSnapshots(b *pebble.Batch, rgs, snaps []readyGroup) error {
	// The snapshots replace keys wholesale: no read begun before the
	// commit fills the cache, and none filled before it stays (cleared
	// again before the restored shards publish their applied index).
	if c := h.cfg.LatestCache; c != nil {
		c.Clear()
	}
	// Readers of a restored shard's GC threshold read it from storage
	// until the shard is loaded again (released below; a commit that
	// fails leaves them reading storage).
	for _, r := range snaps {
		h.cfg.GCThresholds.Hold(r.g.id)
	}
	if err := h.cfg.Engine.Commit(b, pebble.Sync); err != nil {
		return err
	}
	if c := h.cfg.LatestCache; c != nil {
		c.Clear()
	}
	for _, r := range snaps {
		g, meta := r.g, r.rd.Snapshot.Metadata
		for idx, p := range g.orphans {
			if idx <= meta.Index {
				// Its index is never applied here: no answer to wait for.
				h.orphanInDoubt(g, p, "a snapshot replaced the log here")
			}
		}
		g.storage.restored(meta)
		sm, err := shard.Load(h.db, g.restored)
		if err != nil {
			return fmt.Errorf("replication: shard %d: loading a restored snapshot: %w", g.id, err)
		}
		sm.SetChildHere(h.childHere)
		sm.SetLatestCache(h.cfg.LatestCache)
		sm.SetGCThresholds(h.cfg.GCThresholds)
		sm.SetChangeBuffer(h.changes)
		h.cfg.GCThresholds.Release(g.id, sm.GCThreshold())
		g.sm = sm
		g.smRef.Store(sm)
		g.singleVoter.Store(isSingleVoter(meta.ConfState, g.replicaID))
		g.mu.Lock()
		g.mu.appliedIndex = meta.Index
		g.mu.appliedVersion = max(g.mu.appliedVersion, sm.MaxVersion())
		g.dropAppliedLocked()
		g.mu.lastAssigned = max(g.mu.lastAssigned, sm.MaxVersion())
		g.mu.confState = meta.ConfState
		g.mu.desc = sm.Desc()
		g.mu.Unlock()
		h.cfg.Metrics.SnapshotsApplied.Inc()
		h.cfg.Logger.Info("applied a snapshot", "shard", g.id, "index", meta.Index, "bytes", len(r.rd.Snapshot.Data))
		if h.cfg.Hooks.SnapshotApplied != nil {
			h.cfg.Hooks.SnapshotApplied(g.id, sm)
		}
	}
	return nil
}

// sendAndAppended finishes persistence of the Readys: the raft storage's
// view and the messages, which must follow the fsync.
func (h *Host) sendAndAppended(rgs []readyGroup) {
	for _, r := range rgs {
		r.g.storage.appended(r.rd.Entries, r.hs)
		if len(r.g.inflight) > 0 {
			for i := range r.rd.Entries {
				e := &r.rd.Entries[i]
				if e.Type != raftpb.EntryNormal || len(e.Data) < 8 {
					continue
				}
				if p, ok := r.g.inflight[binary.BigEndian.Uint64(e.Data)]; ok {
					p.index = e.Index
				}
			}
		}
		msgs := r.rd.Messages
		if r.sentEarly {
			msgs = r.late
		}
		h.send(r.g, msgs)
	}
}

func (h *Host) send(g *group, msgs []raftpb.Message) {
	if len(msgs) == 0 {
		return
	}
	if h.cfg.Transport == nil {
		for _, m := range msgs {
			h.dropSnapshot(m)
		}
		h.cfg.Logger.Warn("dropping raft messages: no transport on a single node", "shard", g.id, "n", len(msgs))
		return
	}
	out := make([]Message, 0, len(msgs))
	for _, m := range msgs {
		if m.Type == raftpb.MsgSnap {
			g.snapSent[m.To] = h.ticks
			h.sendSnapshot(g.id, m)
			continue
		}
		out = append(out, Message{ShardID: g.id, Msg: m})
	}
	if len(out) > 0 {
		h.cfg.Transport.Send(out)
	}
}

// pendingSnap is a raft snapshot's state, to be read when it is sent.
type pendingSnap struct {
	snap *pebble.Snapshot
	desc shard.Desc
}

const snapTokenMagic = "groupkv-snapshot-token\x00"

func encodeSnapToken(id uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte(snapTokenMagic), id)
}

func decodeSnapToken(data []byte) (uint64, bool) {
	if len(data) != len(snapTokenMagic)+8 || string(data[:len(snapTokenMagic)]) != snapTokenMagic {
		return 0, false
	}
	return binary.BigEndian.Uint64(data[len(snapTokenMagic):]), true
}

// dropSnapshot releases the Pebble snapshot of a MsgSnap that is not sent.
func (h *Host) dropSnapshot(m raftpb.Message) {
	if m.Type != raftpb.MsgSnap || m.Snapshot == nil {
		return
	}
	if id, ok := decodeSnapToken(m.Snapshot.Data); ok {
		if p, ok := h.pendingSnaps[id]; ok {
			p.snap.Close()
			delete(h.pendingSnaps, id)
		}
	}
}

// sendSnapshot reads a MsgSnap's state from its Pebble snapshot off the
// loop, then sends it. A snapshot that cannot be built is reported failed
// to raft, which tries again.
func (h *Host) sendSnapshot(shardID uint64, m raftpb.Message) {
	id, ok := decodeSnapToken(m.Snapshot.Data)
	p, found := h.pendingSnaps[id]
	if !ok || !found {
		h.cfg.Transport.Send([]Message{{ShardID: shardID, Msg: m}})
		h.cfg.Metrics.SnapshotsSent.Inc()
		return
	}
	delete(h.pendingSnaps, id)
	h.snapBuilds.Add(1)
	go func() {
		defer h.snapBuilds.Done()
		data, err := shard.SnapshotData(p.snap, p.desc)
		p.snap.Close()
		if err != nil {
			h.cfg.Logger.Error("building a snapshot failed", "shard", shardID, "err", err)
			h.reportSnapshot(shardID, m.To, raft.SnapshotFailure)
			return
		}
		snap := *m.Snapshot
		snap.Data = data
		m.Snapshot = &snap
		h.cfg.Transport.Send([]Message{{ShardID: shardID, Msg: m}})
		h.cfg.Metrics.SnapshotsSent.Inc()
	}()
}

// ReportSnapshot tells shardID's raft how sending a snapshot to replica to
// went (a transport that knows calls it; raft otherwise waits for the
// follower's answer or a timeout).
func (h *Host) ReportSnapshot(shardID, to uint64, ok bool) {
	status := raft.SnapshotFinish
	if !ok {
		status = raft.SnapshotFailure
	}
	h.reportSnapshot(shardID, to, status)
}

// reportSnapshot tells raft, from the loop, how sending a snapshot went.
func (h *Host) reportSnapshot(shardID, to uint64, status raft.SnapshotStatus) {
	h.mu.Lock()
	h.mu.snapReports = append(h.mu.snapReports, snapReport{shardID, to, status})
	h.mu.Unlock()
	h.signal()
}

type snapReport struct {
	shard, to uint64
	status    raft.SnapshotStatus
}

// sendEarly sends, while the cycle's fsync runs, the messages whose sender
// promises nothing that fsync makes durable: a leader's appends and
// heartbeats (the raft thesis, 10.2.1: a leader may write its log in
// parallel with replicating it; it counts its own copy only in a later
// cycle, after the fsync), heartbeat and read-index answers. A follower's
// append and vote answers wait for the fsync. When a Ready changes the term
// or the vote, everything waits: a heartbeat answer acknowledges the term.
func (h *Host) sendEarly(rgs []readyGroup) {
	for i := range rgs {
		r := &rgs[i]
		if len(r.rd.Messages) == 0 {
			continue
		}
		hs, old := r.rd.HardState, r.g.storage.hardState
		if !raft.IsEmptyHardState(hs) && (hs.Term != old.Term || hs.Vote != old.Vote) {
			continue
		}
		var early []raftpb.Message
		for _, m := range r.rd.Messages {
			switch m.Type {
			case raftpb.MsgApp, raftpb.MsgHeartbeat, raftpb.MsgHeartbeatResp, raftpb.MsgReadIndex,
				raftpb.MsgReadIndexResp, raftpb.MsgSnap, raftpb.MsgTimeoutNow:
				early = append(early, m)
			default:
				r.late = append(r.late, m)
			}
		}
		r.sentEarly = true
		h.send(r.g, early)
	}
}

// applyLists are what applyReady gathers of a batch as it applies it, to
// act on once the batch is committed.
type applyLists struct {
	// dones are the proposals of this node the batch answers.
	dones []appliedProposal
	// applieds are the results of every command applied, for the Applied hook.
	applieds []appliedCommand
	// versions are the writes' versions, published once the batch is committed.
	versions []appliedWrite
}

type appliedProposal struct {
	p   *proposal
	res shard.Result
}

type appliedCommand struct {
	shardID uint64
	kind    shard.CommandKind
	res     shard.Result
}

type appliedWrite struct {
	g       *group
	version uint64
}

type confApplied struct {
	g  *group
	cs raftpb.ConfState
}

// maxKeptApplied bounds the entries of the lists a cycle keeps for the
// next: a cycle that applied many more gives its long lists back.
const maxKeptApplied = 4096

// keep keeps the lists of a cycle, emptied and cleared of what their
// entries referred to, for the next cycle to append to.
func (l *applyLists) keep(dones []appliedProposal, applieds []appliedCommand, versions []appliedWrite) {
	clear(dones)
	clear(applieds)
	clear(versions)
	*l = applyLists{}
	if cap(dones) <= maxKeptApplied {
		l.dones = dones[:0]
	}
	if cap(applieds) <= maxKeptApplied {
		l.applieds = applieds[:0]
	}
	if cap(versions) <= maxKeptApplied {
		l.versions = versions[:0]
	}
}

// runChecksums computes the consistency checksums applied in a cycle, off
// the loop, one at a time on the Host, reading snap (which it closes).
func (h *Host) runChecksums(jobs []*shard.ChecksumJob, snap *pebble.Snapshot) {
	h.snapBuilds.Add(1)
	go func() {
		defer h.snapBuilds.Done()
		defer snap.Close()
		if h.checksumGate != nil {
			select {
			case <-h.checksumGate:
			case <-h.stop:
			}
		}
		h.sumMu.Lock()
		defer h.sumMu.Unlock()
		for _, j := range jobs {
			start := time.Now()
			j.Run(snap, h.stop, h.cfg.ChecksumRate)
			if err := j.Err(); err != nil {
				select {
				case <-h.stop:
					continue // ended by Stop
				default:
				}
				h.cfg.Logger.Warn("summing a shard for a consistency check failed", "shard", j.ShardID(), "index", j.Index, "err", err)
				continue
			}
			took := time.Since(start)
			h.cfg.Metrics.ChecksumSeconds.Observe(took.Seconds())
			h.cfg.Logger.Debug("summed a shard for a consistency check", "shard", j.ShardID(), "index", j.Index, "pairs", j.Pairs, "took", took)
		}
	}()
}

// applyReady applies the committed entries of every group into one batch,
// commits it, answers the proposers and advances the groups. It waits for
// the cycle's fsync (waitSync) before it commits the batch, or, when early
// (every committed entry was persisted by an earlier cycle) and the batch
// holds no merge or configuration change, after it has answered them.
func (h *Host) applyReady(rgs []readyGroup, waitSync func() error, early bool) (bool, error) {
	start := time.Now()
	ab := h.db.NewIndexedBatch()
	h.createMu.Lock()
	locked := true
	unlock := func() {
		if locked {
			locked = false
			h.createMu.Unlock()
		}
	}
	var dones []appliedProposal
	abort := func() {
		// Proposals taken off inflight are answered here, or never: the
		// host stops after this.
		for _, d := range dones {
			d.p.answer(outcome{err: kv.Errorf(kv.CodeCommitUnknown, "the node's storage failed before the write was applied; it may or may not have been")})
		}
		for _, r := range rgs {
			r.g.sm.EndBatch()
		}
		ab.Close()
		unlock()
	}
	dones = h.applyScratch.dones[:0]
	applieds, versions := h.applyScratch.applieds[:0], h.applyScratch.versions[:0]
	var confs []confApplied
	// sums are the consistency checksums of this batch: computed off the
	// loop from a snapshot taken before the batch is committed.
	var sums []*shard.ChecksumJob
	// merged are the right shards of merges applied in this batch: their
	// replicas are removed here (shard/merge.go).
	var merged []uint64
	for _, r := range rgs {
		g := r.g
		for i, n := 0, len(r.rd.CommittedEntries)+len(r.ahead); i < n; i++ {
			var e *raftpb.Entry
			if i < len(r.rd.CommittedEntries) {
				e = &r.rd.CommittedEntries[i]
				if e.Index <= g.ahead {
					continue // applied ahead in an earlier cycle
				}
			} else {
				e = &r.ahead[i-len(r.rd.CommittedEntries)]
			}
			if o, ok := g.orphans[e.Index]; ok {
				delete(g.orphans, e.Index)
				if e.Type != raftpb.EntryNormal || len(e.Data) < 8 || binary.BigEndian.Uint64(e.Data) != o.id {
					// Another entry took the orphan's place: it was not
					// committed, and never will be.
					delete(g.inflight, o.id)
					o.answer(outcome{err: kv.Errorf(kv.CodeNotLeader, "shard %d changed leader before the write was committed; it was not applied", g.id)})
					h.cfg.Metrics.Orphans.WithLabelValues("not_applied").Inc()
				} else {
					h.cfg.Metrics.Orphans.WithLabelValues("applied").Inc() // answered below
				}
			}
			switch {
			case e.Type == raftpb.EntryNormal && len(e.Data) >= 8:
				id := binary.BigEndian.Uint64(e.Data)
				cmd := e.Data[8:]
				res, err := g.sm.Apply(ab, e.Index, e.Term, cmd)
				if err != nil {
					abort()
					return false, err
				}
				g.caughtUp = max(g.caughtUp, res.TruncateLog)
				if res.Split != nil && !res.Split.Existing {
					// The child group starts, on every replica, from the
					// same state: written in this batch, atomically with
					// the split.
					if err := bootstrapGroup(ab, res.Split.Child.ShardID, g.storage.confState.Voters); err != nil {
						abort()
						return false, err
					}
					if err := shard.WriteChildState(ab, res.Split.Child.ShardID, bootstrapIndex, bootstrapTerm, res.Split.MaxVersion); err != nil {
						abort()
						return false, err
					}
				}
				if res.Merge != nil {
					merged = append(merged, res.Merge.Right)
				}
				if res.Checksum != nil {
					sums = append(sums, res.Checksum)
				}
				if p, ok := g.inflight[id]; ok {
					delete(g.inflight, id)
					dones = append(dones, appliedProposal{p, res})
				}
				if shard.IsWrite(cmd) {
					// Published only after the batch is committed, so that
					// a reader that sees appliedVersion sees the write.
					versions = append(versions, appliedWrite{g, binary.BigEndian.Uint64(cmd[1:9])})
				}
				applieds = append(applieds, appliedCommand{g.id, shard.CommandKind(cmd[0]), res})
			case e.Type == raftpb.EntryConfChange || e.Type == raftpb.EntryConfChangeV2:
				cc, err := decodeConfChange(e)
				if err != nil {
					abort()
					return false, fmt.Errorf("replication: shard %d: %w", g.id, err)
				}
				cs := g.rn.ApplyConfChange(cc)
				if err := saveConfState(ab, g.id, *cs); err != nil {
					abort()
					return false, err
				}
				if err := g.sm.SetApplied(ab, e.Index, e.Term); err != nil {
					abort()
					return false, err
				}
				confs = append(confs, confApplied{g, *cs})
				if ctx := cc.AsV2().Context; len(ctx) == 8 {
					if p, ok := g.inflight[binary.BigEndian.Uint64(ctx)]; ok {
						delete(g.inflight, p.id)
						dones = append(dones, appliedProposal{p, shard.Result{}})
					}
				}
			default:
				if err := g.sm.SetApplied(ab, e.Index, e.Term); err != nil {
					abort()
					return false, err
				}
			}
		}
	}
	for _, r := range rgs {
		if len(r.rd.CommittedEntries) > 0 || len(r.ahead) > 0 {
			if err := r.g.sm.FinishBatch(ab); err != nil {
				abort()
				return false, err
			}
		}
	}
	// Last in the batch, after anything the right groups applied or
	// appended in this cycle: the removal of merged right replicas' raft
	// and shard state (not their records, which the left shard now owns).
	for _, right := range merged {
		if err := h.writeMergeRemoval(ab, right); err != nil {
			abort()
			return false, err
		}
	}
	// A merge or a configuration change is applied in the cycle's order:
	// persisted, sent, then applied.
	early = early && len(merged) == 0 && len(confs) == 0
	applying := time.Since(start) // the wait for the fsync is not counted
	if !early {
		if err := waitSync(); err != nil {
			abort()
			return false, err
		}
		h.sendAndAppended(rgs)
	}
	var sumSnap *pebble.Snapshot
	if len(sums) > 0 {
		// The state the batch was built on: the loop is the only writer of
		// shard state, and since the batch began it committed nothing but
		// raft log entries (keys outside every shard's summed spans).
		sumSnap = h.db.NewSnapshot()
	}
	if !ab.Empty() {
		committing := time.Now()
		if err := h.cfg.Engine.Commit(ab, pebble.NoSync); err != nil {
			if sumSnap != nil {
				sumSnap.Close()
			}
			abort()
			return false, err
		}
		h.cfg.Metrics.ApplySeconds.Observe((applying + time.Since(committing)).Seconds())
	}
	if sumSnap != nil {
		h.runChecksums(sums, sumSnap)
	}
	unlock()
	ab.Close()
	for _, r := range rgs {
		if n := len(r.ahead); n > 0 {
			r.g.ahead = r.ahead[n-1].Index
		}
	}
	for _, right := range merged {
		// Its state is gone: the group stops at once and writes nothing
		// more (the loop below skips it).
		h.removeGroup(right)
	}
	for _, r := range rgs {
		r.g.sm.Published()
		applied, _ := r.g.sm.Applied()
		r.g.mu.Lock()
		r.g.mu.desc = r.g.sm.Desc()
		r.g.mu.appliedIndex = applied
		if mv := r.g.sm.MaxVersion(); mv > r.g.mu.appliedVersion {
			// A merge raised the highest version to the right shard's:
			// proposals at or below it are refused when applied, and
			// new ones are assigned above it.
			r.g.mu.appliedVersion = mv
			r.g.dropAppliedLocked()
			r.g.mu.lastAssigned = max(r.g.mu.lastAssigned, mv)
		}
		r.g.mu.Unlock()
		for _, rs := range r.rd.ReadStates {
			if len(rs.RequestCtx) != 8 {
				continue
			}
			id := binary.BigEndian.Uint64(rs.RequestCtx)
			if req, ok := r.g.reads[id]; ok {
				delete(r.g.reads, id)
				req.answer(max(rs.Index, 1))
			}
		}
	}
	for _, c := range confs {
		c.g.storage.confState = c.cs
		c.g.singleVoter.Store(isSingleVoter(c.cs, c.g.replicaID))
		c.g.mu.Lock()
		c.g.mu.confState = c.cs
		c.g.mu.Unlock()
		if h.cfg.Hooks.ConfChanged != nil {
			h.cfg.Hooks.ConfChanged(c.g.id, c.cs)
		}
	}
	for _, w := range versions {
		w.g.mu.Lock()
		w.g.mu.appliedVersion = max(w.g.mu.appliedVersion, w.version)
		w.g.dropAppliedLocked()
		w.g.mu.Unlock()
	}
	// After the versions: a reader that finds a shard with nothing
	// prepared (ReadNow) then finds the versions of the resolves that
	// emptied it.
	for _, r := range rgs {
		r.g.sm.ReleaseResolved()
	}
	if len(versions) > 0 {
		h.mu.Lock()
		close(h.mu.applied)
		h.mu.applied = make(chan struct{})
		h.mu.Unlock()
	}
	// Hooks first: a proposer that is answered sees what they did (the
	// catalog of a created collection, say).
	if h.cfg.Hooks.Applied != nil {
		for _, a := range applieds {
			h.cfg.Hooks.Applied(a.shardID, a.kind, a.res)
		}
	}
	for _, d := range dones {
		d.p.answer(outcome{res: d.res})
	}
	h.lastAnswered = len(dones)
	h.applyScratch.keep(dones, applieds, versions)
	if early {
		if err := waitSync(); err != nil {
			return false, err
		}
		h.sendAndAppended(rgs)
	}
	for _, r := range rgs {
		g := r.g
		if contains(merged, g.id) {
			continue
		}
		g.rn.Advance(r.rd)
		h.updateLeadership(g, r.rd)
		g.mu.Lock()
		close(g.mu.changed)
		g.mu.changed = make(chan struct{})
		g.mu.Unlock()
		if err := h.maybeTruncate(g); err != nil {
			return false, err
		}
	}
	return true, nil
}

// proposeWaiting hands g's waiting proposals to raft, assigning versions to
// writes, as long as g is a ready leader and timestamps are available.
func (h *Host) proposeWaiting(g *group) {
	g.mu.Lock()
	ready := g.mu.ready
	g.mu.Unlock()
	if !ready {
		if g.isLeader || g.singleVoter.Load() {
			return // wait: a new leader proposes nothing yet
		}
		// A follower: the caller asks the leader instead.
		for _, p := range g.waiting {
			p.answer(outcome{err: kv.Errorf(kv.CodeNotLeader, "shard %d is not led by this node", g.id)})
		}
		g.waiting = g.waiting[:0]
		return
	}
	// The commands go to raft in batches, one message of several entries
	// (one step, one append to the unstable log, one self-acknowledgement)
	// rather than one message per command; a configuration change ends a
	// batch.
	var (
		batch    []raftpb.Entry
		batchPs  []*proposal
		assigned bool   // some command of the batch got a version
		prev     uint64 // lastAssigned before the batch's first version
		prevN    int    // len(g.mu.unapplied) before it
	)
	flush := func() {
		if len(batch) == 0 {
			return
		}
		err := g.rn.Step(raftpb.Message{Type: raftpb.MsgProp, From: g.replicaID, Entries: batch})
		if err != nil {
			if assigned {
				// The versions will never be applied; nothing was assigned
				// after them (this loop is the only assigner), so take them
				// back lest a snapshot read wait for them.
				g.mu.Lock()
				g.mu.lastAssigned = prev
				g.mu.unapplied = g.mu.unapplied[:prevN]
				g.mu.Unlock()
			}
			for _, p := range batchPs {
				p.answer(outcome{err: kv.Errorf(kv.CodeUnavailable, "shard %d refused the proposal: %v", g.id, err)})
			}
			h.cfg.Metrics.ProposalFails.Add(float64(len(batchPs)))
		} else {
			for _, p := range batchPs {
				g.inflight[p.id] = p
			}
			h.cfg.Metrics.Proposals.Add(float64(len(batchPs)))
		}
		clear(batchPs)
		batch, batchPs, assigned = nil, batchPs[:0], false
	}
	// Once a write gets no version this cycle, the commands after it wait
	// with it, in their order (rest), but for those that may take any
	// version (shard.AnyVersion): they go ahead, on the timestamps at
	// hand, while it waits for a timestamp issued after it was queued.
	// Commands waiting together come from requests under way at once,
	// which no order binds; versions still grow along the log.
	var rest []*proposal
	for i, p := range g.waiting {
		anyVersion := p.conf == nil && shard.AnyVersion(p.cmd)
		if len(rest) > 0 && !anyVersion {
			rest = append(rest, p)
			continue
		}
		if p.conf != nil {
			flush()
			cc := *p.conf
			cc.Context = binary.BigEndian.AppendUint64(nil, p.id)
			if err := g.rn.ProposeConfChange(cc); err != nil {
				p.answer(outcome{err: kv.Errorf(kv.CodeUnavailable, "shard %d refused the configuration change: %v", g.id, err)})
			} else {
				g.inflight[p.id] = p
			}
			continue
		}
		if shard.IsWrite(p.cmd) {
			g.mu.Lock()
			floor := max(g.mu.lastAssigned, g.mu.readWatermark, shard.MinVersion(p.cmd))
			g.mu.Unlock()
			var (
				v  uint64
				ok bool
			)
			if h.seqVersions != nil {
				seq := p.id
				if anyVersion {
					seq = 0 // any window
				}
				v, ok = h.seqVersions.TryNextAfter(floor, seq)
			} else {
				v, ok = h.cfg.Versions.TryNext(floor)
			}
			if !ok {
				rest = append(rest, p)
				continue
			}
			g.mu.Lock()
			if v <= g.mu.readWatermark {
				// A snapshot read raised the watermark between the two
				// locks; this timestamp is too low. Try again next cycle.
				g.mu.Unlock()
				h.signal()
				rest = append(rest, p)
				continue
			}
			if !assigned {
				assigned, prev, prevN = true, g.mu.lastAssigned, len(g.mu.unapplied)
			}
			g.mu.lastAssigned = v
			g.mu.unapplied = append(g.mu.unapplied, v)
			g.mu.Unlock()
			shard.SetVersion(p.cmd, v)
		}
		data := make([]byte, 8+len(p.cmd))
		binary.BigEndian.PutUint64(data, p.id)
		copy(data[8:], p.cmd)
		if batch == nil {
			batch = make([]raftpb.Entry, 0, len(g.waiting)-i)
		}
		batch = append(batch, raftpb.Entry{Data: data})
		batchPs = append(batchPs, p)
	}
	flush()
	g.waiting = append(g.waiting[:0], rest...)
}

func (h *Host) updateLeadership(g *group, rd raft.Ready) {
	st := g.rn.BasicStatus()
	g.mu.Lock()
	g.mu.leader = st.Lead
	g.mu.Unlock()
	isLeader := st.RaftState == raft.StateLeader
	if !isLeader && g.isLeader {
		g.isLeader = false
		g.mu.Lock()
		g.mu.ready = false
		g.mu.Unlock()
		h.orphanInflight(g)
		for id, r := range g.reads {
			r.answer(0)
			delete(g.reads, id)
		}
		if h.cfg.Hooks.LeaderLost != nil {
			h.cfg.Hooks.LeaderLost(g.id)
		}
		return
	}
	if !isLeader {
		return
	}
	g.isLeader = true
	h.maybeReady(g)
}

// orphanElections bounds, in election timeouts, how long a proposal whose
// leader stepped down waits to learn whether the new leader committed its
// entry: long enough for an election and for this replica to hear from
// the new leader.
const orphanElections = 5

// orphanInflight keeps, when g's replica stops leading, the proposals
// whose entries it persisted: the new leader commits each entry or
// replaces it, and the entry this replica applies at that index answers
// the proposer (its result, or a retryable error: not applied). The others
// (not persisted here, configuration changes) are in doubt at once.
func (h *Host) orphanInflight(g *group) {
	for id, p := range g.inflight {
		if p.index == 0 || p.conf != nil {
			delete(g.inflight, id)
			p.answer(outcome{err: kv.Errorf(kv.CodeCommitUnknown, "shard %d lost leadership before the write was applied; it may or may not have been", g.id)})
			continue
		}
		if p.orphanedAt == 0 {
			p.orphanedAt = max(h.ticks, 1)
			g.orphans[p.index] = p
		}
	}
}

// expireOrphans answers the orphans of g that waited orphanElections
// election timeouts: in doubt.
func (h *Host) expireOrphans(g *group) {
	for _, p := range g.orphans {
		if h.ticks-p.orphanedAt > uint64(orphanElections*h.cfg.ElectionTicks) {
			h.orphanInDoubt(g, p, "its fate was not learnt in time")
		}
	}
}

// orphanInDoubt answers orphan p of g commit_unknown, because of why.
func (h *Host) orphanInDoubt(g *group, p *proposal, why string) {
	delete(g.orphans, p.index)
	delete(g.inflight, p.id)
	h.cfg.Metrics.Orphans.WithLabelValues("unknown").Inc()
	p.answer(outcome{err: kv.Errorf(kv.CodeCommitUnknown, "shard %d lost leadership before the write was applied (%s); it may or may not have been", g.id, why)})
}

func (g *group) isRemoved() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.mu.removed
}

func (g *group) readyLocked() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.mu.ready
}

// maybeReady makes a leader ready once it has applied an entry of its own
// term and has seeded its read watermark with a timestamp fetched after
// the election, so that its writes land above reads served by any earlier
// leader. Without a timestamp it tries again next cycle.
func (h *Host) maybeReady(g *group) {
	st := g.rn.BasicStatus()
	_, appliedTerm := g.sm.Applied()
	if st.RaftState != raft.StateLeader || appliedTerm != st.Term {
		return
	}
	g.mu.Lock()
	if g.mu.ready {
		g.mu.Unlock()
		return
	}
	var (
		ts uint64
		ok bool
	)
	switch {
	case h.cfg.Unversioned != nil && h.cfg.Unversioned(g.id):
		ts, ok = g.mu.readWatermark, true
	case h.seqVersions != nil:
		g.mu.Unlock()
		seq := h.ProposalSeq()
		ts, ok = h.seqVersions.TryNextAfter(0, seq)
		g.mu.Lock()
	default:
		ts, ok = h.cfg.Versions.TryNext(g.mu.readWatermark)
	}
	if !ok || g.mu.ready {
		g.mu.Unlock()
		return
	}
	g.mu.readWatermark = max(g.mu.readWatermark, ts)
	if mv := g.sm.MaxVersion(); mv > g.mu.lastAssigned {
		g.mu.lastAssigned = mv
	}
	// Every entry of earlier terms is applied (one of this term is): a
	// version not applied went with its proposal.
	g.mu.unapplied = g.mu.unapplied[:0]
	g.mu.ready = true
	g.mu.readyTerm = st.Term
	close(g.mu.changed)
	g.mu.changed = make(chan struct{})
	g.mu.Unlock()
	if h.cfg.Hooks.LeaderReady != nil {
		h.cfg.Hooks.LeaderReady(g.id, g.sm)
	}
	if len(g.waiting) > 0 {
		h.signal()
	}
}

// snapshotTimeoutTicks is how long a leader waits for a follower to
// acknowledge a snapshot before raft is told it failed and sends another.
const snapshotTimeoutTicks = 100

// onTick does a group's per-tick housekeeping: it fails read-index requests
// that got no answer within an election timeout (the leader may have lost
// them), retries snapshots that got no answer, and refreshes a leader's
// view of its followers' progress.
func (h *Host) onTick(g *group) {
	if len(g.orphans) > 0 {
		h.expireOrphans(g)
	}
	if g.campaigns > 0 && h.ticks%3 == 0 {
		g.campaigns--
		if st := g.rn.BasicStatus(); st.Lead == 0 && st.RaftState != raft.StateLeader {
			_ = g.rn.Campaign()
		}
	}
	for id, r := range g.reads {
		if h.ticks-r.tick > uint64(h.cfg.ElectionTicks) {
			r.answer(0)
			delete(g.reads, id)
		}
	}
	for to, at := range g.snapSent {
		if h.ticks-at > snapshotTimeoutTicks {
			g.rn.ReportSnapshot(to, raft.SnapshotFailure)
			delete(g.snapSent, to)
		}
	}
	if !g.isLeader || g.singleVoter.Load() {
		return
	}
	st := g.rn.Status()
	match := make(map[uint64]uint64, len(st.Progress))
	for id, pr := range st.Progress {
		match[id] = pr.Match
		if pr.State == tracker.StateReplicate {
			delete(g.snapSent, id)
		}
	}
	last := g.storage.lastIndex
	g.mu.Lock()
	g.mu.match = match
	g.mu.lastIndex = last
	g.mu.Unlock()
}

// caughtUpTruncateStep is how many entries a log whose every replica has
// them (see truncateIndex) grows by before it is truncated again: each
// truncation is a range deletion, and a few hundred entries are a small
// part of a memtable.
const caughtUpTruncateStep = 256

// truncateIndex returns the index up to which g's log may be truncated
// now; at or below the index it was last truncated at, it keeps its log.
// caughtUp reports that every replica had the log up to the index.
//
// A log keeps TruncateAfter applied entries for replicas that fall behind:
// they catch up from the log rather than a snapshot. When no replica needs
// them — a group of one voter, or a leader whose every replica has
// appended everything this one applied — the entries are truncated as
// soon as caughtUpTruncateStep of them are applied: a log kept longer
// than the memtable holds it is flushed and compacted to be deleted later,
// which cost transactions about a quarter of their disk writes (see
// docs/benchmarks.md, "Raft logs truncated once every replica has them").
// A follower cannot tell what the others have, and may have to lead them:
// it truncates where its leader told it every replica had the log (a
// KindTruncateLog it applied, which the leader proposes when it truncates
// at such an index), and otherwise keeps TruncateAfter entries.
func (h *Host) truncateIndex(g *group) (index uint64, caughtUp bool) {
	applied, _ := g.sm.Applied()
	if g.ahead > 0 {
		// Raft reads the entries applied ahead from the log when it
		// delivers them committed: they stay until it has.
		applied = min(applied, g.rn.BasicStatus().Applied)
	}
	if applied >= g.storage.truncIndex+2*h.cfg.TruncateAfter {
		index = applied - h.cfg.TruncateAfter
	}
	caught := uint64(0)
	switch {
	case g.singleVoter.Load():
		caught = applied
	case g.isLeader:
		caught = applied
		g.rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) {
			caught = min(caught, pr.Match)
		})
	default:
		caught = min(g.caughtUp, applied)
	}
	if caught >= g.storage.truncIndex+caughtUpTruncateStep && caught > index {
		return caught, true
	}
	return index, false
}

func (h *Host) maybeTruncate(g *group) error {
	index, caughtUp := h.truncateIndex(g)
	if index <= g.storage.truncIndex {
		return nil
	}
	b := h.db.NewBatch()
	defer b.Close()
	term, err := g.storage.truncate(b, index)
	if err != nil {
		return err
	}
	if err := h.cfg.Engine.Commit(b, pebble.NoSync); err != nil {
		return err
	}
	g.storage.truncated(index, term)
	h.cfg.Metrics.Truncations.Inc()
	if caughtUp && g.isLeader && !g.singleVoter.Load() {
		// The followers drop theirs up to the same index when they apply
		// this (an entry of its own, every caughtUpTruncateStep entries
		// or more; nobody waits for it).
		p := &proposal{shard: g.id, cmd: shard.EncodeTruncateLog(index), done: make(chan outcome, 1)}
		if err := h.enqueue(p); err != nil {
			return nil // stopping
		}
	}
	return nil
}

// writeMergeRemoval writes into b the removal of the replica of right, a
// shard merged into its left neighbour: its raft state, its shard state
// and the node's records of it (Config.MergeBatch).
func (h *Host) writeMergeRemoval(b *pebble.Batch, right uint64) error {
	for _, span := range []func(uint64) ([]byte, []byte){storage.RaftSpan, storage.ShardStateSpan} {
		start, end := span(right)
		if err := b.DeleteRange(start, end, nil); err != nil {
			return err
		}
	}
	if h.cfg.MergeBatch != nil {
		return h.cfg.MergeBatch(b, right)
	}
	return nil
}

func contains(ids []uint64, id uint64) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

func (h *Host) removeGroup(id uint64) {
	h.mu.Lock()
	g := h.mu.groups[id]
	delete(h.mu.groups, id)
	h.publishGroupsLocked()
	h.mu.Unlock()
	if g == nil {
		return
	}
	fail := outcome{err: kv.Errorf(kv.CodeUnavailable, "shard %d was removed", id)}
	for _, p := range g.waiting {
		p.answer(fail)
	}
	for rid, r := range g.reads {
		r.answer(0)
		delete(g.reads, rid)
	}
	for _, p := range g.inflight {
		if p.orphanedAt != 0 {
			// Its entry waited for another leader to commit it or not.
			h.orphanInDoubt(g, p, "the replica was removed")
			continue
		}
		p.answer(fail)
	}
	g.mu.Lock()
	g.mu.removed = true
	g.mu.ready = false
	close(g.mu.changed)
	g.mu.changed = make(chan struct{})
	g.mu.Unlock()
}

type raftLogger struct{ l *slog.Logger }

func (r raftLogger) Debug(v ...any)                   {}
func (r raftLogger) Debugf(format string, v ...any)   {}
func (r raftLogger) Info(v ...any)                    { r.l.Debug(fmt.Sprint(v...)) }
func (r raftLogger) Infof(format string, v ...any)    { r.l.Debug(fmt.Sprintf(format, v...)) }
func (r raftLogger) Warning(v ...any)                 { r.l.Warn(fmt.Sprint(v...)) }
func (r raftLogger) Warningf(format string, v ...any) { r.l.Warn(fmt.Sprintf(format, v...)) }
func (r raftLogger) Error(v ...any)                   { r.l.Error(fmt.Sprint(v...)) }
func (r raftLogger) Errorf(format string, v ...any)   { r.l.Error(fmt.Sprintf(format, v...)) }
func (r raftLogger) Fatal(v ...any)                   { r.l.Error(fmt.Sprint(v...)); panic(fmt.Sprint(v...)) }
func (r raftLogger) Fatalf(format string, v ...any) {
	r.l.Error(fmt.Sprintf(format, v...))
	panic(fmt.Sprintf(format, v...))
}
func (r raftLogger) Panic(v ...any)                 { panic(fmt.Sprint(v...)) }
func (r raftLogger) Panicf(format string, v ...any) { panic(fmt.Sprintf(format, v...)) }
