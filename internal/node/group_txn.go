package node

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/group"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/shard"
)

// Group transactions: optimistic, at the group's leader. An attempt lives
// on the node that began it; its first operation reads the whole group
// from the leader of the group's leader shard, linearizably (one
// snapshot); reads are served from it and recorded with the versions
// read, writes are buffered; the commit sends both to the leader, which
// logs a group write whose Apply validates the reads (group.Leader). An
// attempt that wrote nothing commits without validation. A retry (RetryOf)
// runs with priority: it takes the group's priority token at its first
// read, and until it commits no other attempt of the group does, so it
// cannot fail validation again but for a change of the group's leader.

// groupAttemptPrefix starts the ids of group transaction attempts.
const groupAttemptPrefix = "g-"

func isGroupAttempt(id string) bool { return strings.HasPrefix(id, groupAttemptPrefix) }

// groupTxn is a group transaction attempt.
type groupTxn struct {
	mu       sync.Mutex
	id       string
	group    string
	reg      groupRegistration
	shard    uint64
	priority bool
	readOnly bool
	// used is when the attempt was last used (Unix nanoseconds); the
	// group tick reads it without the attempt's lock.
	used atomic.Int64

	// snap is the group as of the attempt's first operation (nil before).
	snap    *groupReadResponse
	members map[group.Key]memberWire
	reads   map[group.Key]uint64
	writes  []group.Write
	// cached: reads of the attempt came from a snapshot its client kept
	// from an earlier transaction (TxnGroupCachedReads): they are
	// validated even when the attempt writes nothing.
	cached bool
	// done: committed (err nil, at version) or not (err says why).
	done    bool
	err     error
	version uint64
	// client: the attempt's id was answered to a client
	// (BeginGroupTxn), which may send its commit again: its outcome is
	// remembered when it ends.
	client bool
}

// BeginGroupTxn implements kv.GroupBackend.
func (n *Node) BeginGroupTxn(ctx context.Context, id string, opts kv.TxnOptions) (string, error) {
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return "", err
	}
	defer done()
	s, err := n.beginGroupTxn(ctx, id, opts, true)
	if err != nil {
		return "", err
	}
	return s.id, nil
}

// beginGroupTxn begins an attempt of group id; client says whether its id
// goes to a client, as for beginSession.
func (n *Node) beginGroupTxn(ctx context.Context, id string, opts kv.TxnOptions, client bool) (*groupTxn, error) {
	switch opts.Isolation {
	case "", kv.IsolationSerializable, kv.IsolationSnapshot:
		// Group transactions are serializable; snapshot asks for less.
	default:
		return nil, kv.Errorf(kv.CodeInvalidArgument, "isolation %q is not serializable or snapshot", opts.Isolation)
	}
	if opts.RetryOf != "" && !isGroupAttempt(opts.RetryOf) {
		return nil, kv.Errorf(kv.CodeInvalidArgument, "retry_of %q is not a group transaction attempt", opts.RetryOf)
	}
	if err := kv.ValidateGroupID(id); err != nil {
		return nil, err
	}
	reg, err := n.knownRegistration(ctx, id)
	if err != nil {
		return nil, err
	}
	_, shardID, err := n.groupKey(ctx, kv.KeyRef{Collection: reg.Collection, Key: reg.Key})
	if err != nil {
		return nil, err
	}
	var b [12]byte
	_, _ = rand.Read(b[:])
	s := &groupTxn{id: groupAttemptPrefix + hex.EncodeToString(b[:]), group: id, reg: reg, shard: shardID,
		priority: opts.RetryOf != "", readOnly: opts.ReadOnly,
		reads: make(map[group.Key]uint64), client: client}
	s.used.Store(time.Now().UnixNano())
	n.groups.mu.Lock()
	n.groups.mu.sessions[s.id] = s
	n.groups.mu.Unlock()
	return s, nil
}

// findGroupSession looks attempt id up, as findSession does: the
// attempt, locked, while it runs; its outcome once it ended and while
// this node remembers it; neither when the node does not know it.
func (n *Node) findGroupSession(id string) (*groupTxn, *txnOutcome) {
	n.groups.mu.Lock()
	s := n.groups.mu.sessions[id]
	n.groups.mu.Unlock()
	if s != nil {
		s.mu.Lock()
		if s.done {
			o := txnOutcome{version: s.version, err: s.err}
			s.mu.Unlock()
			return nil, &o
		}
		s.used.Store(time.Now().UnixNano())
		return s, nil
	}
	if o, ok := n.rememberedOutcome(id); ok {
		return nil, &o
	}
	return nil, nil
}

// groupSession returns attempt id, locked, or the error an operation
// (other than a commit) of it answers.
func (n *Node) groupSession(id string) (*groupTxn, error) {
	s, o := n.findGroupSession(id)
	switch {
	case o != nil && o.err == nil:
		return nil, kv.Errorf(kv.CodeInvalidArgument, "group transaction %s has committed (at version %d); it takes no more operations", id, o.version)
	case o != nil:
		return nil, o.err
	case s == nil:
		return nil, kv.TxnUnknown(kv.Errorf(kv.CodeTxnAborted, "group transaction %s is not known to node %d (it finished, expired or was begun elsewhere); retry it", id, n.id))
	}
	return s, nil
}

// endGroupTxn ends attempt s: committed at version v when err is nil,
// else not. Its outcome is remembered, if its client may ask for it,
// before it leaves the sessions. s.mu is held.
func (n *Node) endGroupTxn(s *groupTxn, v uint64, err error) {
	s.done, s.err, s.version = true, err, v
	if s.client {
		n.rememberOutcome(s.id, txnOutcome{version: v, err: err})
	}
	n.groups.mu.Lock()
	delete(n.groups.mu.sessions, s.id)
	n.groups.mu.Unlock()
}

// load reads the group's snapshot at the attempt's first operation.
func (s *groupTxn) load(ctx context.Context, n *Node) error {
	return s.loadBarrier(ctx, n, true)
}

// loadBarrier is load, without the leader's read barrier unless barrier
// (the snapshot may then lag the group's last commits, if the leader
// replica it is read from was deposed).
func (s *groupTxn) loadBarrier(ctx context.Context, n *Node, barrier bool) error {
	if s.snap != nil {
		return nil
	}
	prio := ""
	if s.priority {
		prio = s.id
	}
	snap, err := n.readGroupOpts(ctx, s.group, s.reg, groupReadRequest{Priority: prio, NoBarrier: !barrier})
	if err != nil {
		if kv.CodeOf(err) == kv.CodeNotFound {
			return kv.Errorf(kv.CodeTxnAborted, "group %q is gone", s.group)
		}
		return err
	}
	if group.State(snap.State) != group.Active {
		return kv.Errorf(kv.CodeUnavailable, "group %q is not active (it is being created or deleted); retry", s.group)
	}
	s.snap = snap
	s.members = make(map[group.Key]memberWire, len(snap.Members))
	for _, m := range snap.Members {
		if group.MemberStatus(m.Status) == group.Joined {
			s.members[m.Key.key()] = m
		}
	}
	return nil
}

func (s *groupTxn) member(n *Node, ref kv.KeyRef) (group.Key, memberWire, error) {
	d, err := n.collection(ref.Collection)
	if err != nil {
		return group.Key{}, memberWire{}, err
	}
	if err := kv.ValidateKey(ref.Key); err != nil {
		return group.Key{}, memberWire{}, err
	}
	k := group.Key{Collection: d.ID, Key: string(ref.Key)}
	m, ok := s.members[k]
	if !ok {
		return k, m, kv.Errorf(kv.CodeInvalidArgument, "key %q of collection %q is not a member of group %q; a group transaction touches only its members", ref.Key, ref.Collection, s.group)
	}
	return k, m, nil
}

func (s *groupTxn) get(ctx context.Context, n *Node, ref kv.KeyRef) (kv.Record, bool, error) {
	if err := s.load(ctx, n); err != nil {
		return kv.Record{}, false, err
	}
	k, m, err := s.member(n, ref)
	if err != nil {
		return kv.Record{}, false, err
	}
	for i := len(s.writes) - 1; i >= 0; i-- {
		if w := s.writes[i]; w.Key == k {
			if w.Delete {
				return kv.Record{}, false, nil
			}
			return kv.Record{Key: ref.Key, Value: w.Value, Tags: slices.Clone(w.Tags.List)}, true, nil
		}
	}
	s.reads[k] = m.Version
	if m.Absent {
		return kv.Record{}, false, nil
	}
	// m.Value may be the leader's own (a local read): the caller gets a copy.
	return kv.Record{Key: ref.Key, Value: bytes.Clone(m.Value), Tags: m.tags(nil), Version: m.Version}, true, nil
}

// write buffers a put of value with tags (as a plain put, they replace the
// key's), or a deletion (del).
func (s *groupTxn) write(ctx context.Context, n *Node, ref kv.KeyRef, value []byte, tags []string, del bool) error {
	if s.readOnly {
		return kv.Errorf(kv.CodeInvalidArgument, "group transaction %s is read-only", s.id)
	}
	if len(value) > n.opts.MaxValueSize {
		return kv.Errorf(kv.CodeTooLarge, "value is %d bytes, the limit is %d", len(value), n.opts.MaxValueSize)
	}
	if err := kv.ValidateTags(tags); err != nil {
		return err
	}
	if del {
		tags = nil
	}
	if err := s.load(ctx, n); err != nil {
		return err
	}
	k, _, err := s.member(n, ref)
	if err != nil {
		return err
	}
	if err := keepsPlacement(ctx, n, ref, tags, del); err != nil {
		return err
	}
	for i := range s.writes {
		if s.writes[i].Key == k {
			s.writes[i] = group.Write{Key: k, Value: bytes.Clone(value), Delete: del, Tags: group.Tags{List: slices.Clone(tags)}}
			return nil
		}
	}
	if len(s.writes) >= kv.DefaultMaxTxnOps {
		return kv.Errorf(kv.CodeTooLarge, "a transaction writes at most %d keys", kv.DefaultMaxTxnOps)
	}
	s.writes = append(s.writes, group.Write{Key: k, Value: bytes.Clone(value), Delete: del, Tags: group.Tags{List: slices.Clone(tags)}})
	return nil
}

// keepsPlacement checks that a group's put of a key of a tag collection
// keeps its placement: the group pinned it (pinForGroup), so that the
// record stays in the shard that yielded it; its first tag (none: the key
// is placed by its key) is the placement tag.
func keepsPlacement(ctx context.Context, n *Node, ref kv.KeyRef, tags []string, del bool) error {
	d, err := n.collection(ref.Collection)
	if err != nil || del || d.Partitioning != kv.PartitionTag {
		return err
	}
	p, err := n.placementPinOf(ctx, d, ref.Key)
	if err != nil {
		return err
	}
	want := ""
	if len(tags) > 0 {
		want = tags[0]
	}
	if want == p.Tag {
		return nil
	}
	if p.Tag == "" {
		return kv.Errorf(kv.CodePlacementTagChanged, "key %q is placed by its key (it joined its group never put, or put without tags): a write in the group carries no tags", ref.Key)
	}
	return kv.Errorf(kv.CodePlacementTagChanged, "key %q is placed by tag %q: a write in its group keeps it as the first tag", ref.Key, p.Tag)
}

// commit sends the attempt to the group's leader. Once begun, it runs to
// its end whatever becomes of the request, as a general transaction's
// commit does (txnSession.commit), bounded by a timeout of its own. With
// snap, it also answers the group's joined members as its leader holds
// them once the commit applied (for an attempt that wrote nothing, as its
// snapshot has them), nil when it cannot tell.
func (s *groupTxn) commit(ctx context.Context, n *Node, snap bool) (uint64, []memberWire, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), n.opts.RequestTimeout)
	defer cancel()
	if s.snap == nil && len(s.writes) == 0 {
		return 0, nil, nil // it did nothing
	}
	req := &groupCommitRequest{Shard: s.shard, ID: s.group, Attempt: s.id, Snapshot: snap}
	for _, w := range s.writes {
		req.Writes = append(req.Writes, writeWire{Key: groupKeyWire{Collection: w.Key.Collection, Key: []byte(w.Key.Key)}, Value: w.Value, Delete: w.Delete, Tags: w.Tags.List})
	}
	for k, v := range s.reads {
		req.Reads = append(req.Reads, readWire{Key: groupKeyWire{Collection: k.Collection, Key: []byte(k.Key)}, Version: v})
	}
	if len(s.writes) == 0 {
		if s.priority {
			n.releasePriorityAt(ctx, s)
		}
		var v uint64
		for _, m := range s.members {
			v = max(v, m.Version)
		}
		var members []memberWire
		if snap {
			members = joinedMembers(s.snap.Members)
		}
		return v, members, nil
	}
	out, err := n.atGroupLeader(ctx, s.shard, "GroupCommit", req, func(ctx context.Context) (any, error) {
		return n.groupCommitHere(ctx, req)
	})
	if err != nil {
		return 0, nil, err
	}
	resp := out.(*groupCommitResponse)
	return resp.Version, resp.Members, nil
}

// joinedMembers answers the joined members of ms.
func joinedMembers(ms []memberWire) []memberWire {
	out := make([]memberWire, 0, len(ms))
	for _, m := range ms {
		if group.MemberStatus(m.Status) == group.Joined {
			out = append(out, m)
		}
	}
	return out
}

// releasePriorityAt gives back s's priority token (an empty commit).
func (n *Node) releasePriorityAt(ctx context.Context, s *groupTxn) {
	req := &groupCommitRequest{Shard: s.shard, ID: s.group, Attempt: s.id, Release: true}
	_, _ = n.atGroupLeader(ctx, s.shard, "GroupCommit", req, func(ctx context.Context) (any, error) {
		return n.groupCommitHere(ctx, req)
	})
}

type readWire struct {
	Key     groupKeyWire `json:"key"`
	Version uint64       `json:"version"`
}

// groupCommitRequest commits a group transaction attempt on the leader of
// the group's leader shard; Release only gives back its priority token.
type groupCommitRequest struct {
	Shard   uint64      `json:"shard"`
	ID      string      `json:"id"`
	Attempt string      `json:"attempt"`
	Writes  []writeWire `json:"writes,omitempty"`
	Reads   []readWire  `json:"reads,omitempty"`
	Release bool        `json:"release,omitempty"`
	// Snapshot asks for the group's joined members once the commit
	// applied (groupCommitResponse.Members).
	Snapshot bool `json:"snapshot,omitempty"`
}

type writeWire struct {
	Key    groupKeyWire `json:"key"`
	Value  []byte       `json:"value,omitempty"`
	Delete bool         `json:"delete,omitempty"`
	Tags   []string     `json:"tags,omitempty"`
}

type groupCommitResponse struct {
	Version uint64       `json:"version,omitempty"`
	Members []memberWire `json:"members,omitempty"`
	Error   *peerError   `json:"error,omitempty"`
}

func (n *Node) handleGroupCommit(ctx context.Context, req *groupCommitRequest) (*groupCommitResponse, error) {
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return &groupCommitResponse{Error: toPeerError(err)}, nil
	}
	defer done()
	out, err := n.groupCommitHere(ctx, req)
	if err != nil {
		return &groupCommitResponse{Error: toPeerError(err)}, nil
	}
	return out, nil
}

func (n *Node) groupCommitHere(ctx context.Context, req *groupCommitRequest) (*groupCommitResponse, error) {
	if !n.host.Ready(req.Shard) {
		return nil, kv.Errorf(kv.CodeNotLeader, "node %d does not lead shard %d", n.id, req.Shard)
	}
	if req.Release {
		n.releasePriority(req.ID, req.Attempt)
		return &groupCommitResponse{}, nil
	}
	defer n.releasePriority(req.ID, req.Attempt)
	done, ok := n.beginCommit(req.ID, req.Attempt)
	if !ok {
		return nil, kv.Errorf(kv.CodeTxnAborted, "group %q runs a retried transaction with priority; retry this one (with retry_of) after it", req.ID)
	}
	defer done()
	sm := n.host.StateMachine(req.Shard)
	if sm == nil {
		return nil, kv.Errorf(kv.CodeNotLeader, "node %d holds no replica of shard %d", n.id, req.Shard)
	}
	reads := make([]group.Read, len(req.Reads))
	for i, r := range req.Reads {
		reads[i] = group.Read{Key: r.Key.key(), Version: r.Version}
	}
	writes := make([]group.Write, len(req.Writes))
	for i, w := range req.Writes {
		writes[i] = group.Write{Key: w.Key.key(), Value: w.Value, Delete: w.Delete, Tags: group.Tags{List: w.Tags}}
	}
	var effs []group.Effect
	var err error
	sm.WithGroups(func(l *group.Leader, _ *group.Follower) { effs, err = l.Write(req.ID, writes, reads) })
	if err != nil {
		return nil, groupError(err, req.ID)
	}
	var rec group.Record
	for _, e := range effs {
		if l, ok := e.(group.Log); ok {
			rec = l.Record
		}
	}
	res, err := n.host.Propose(ctx, req.Shard, shard.EncodeGroupRecord(rec))
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || kv.CodeOf(err) == kv.CodeCommitUnknown {
			return nil, kv.Errorf(kv.CodeCommitUnknown, "group %q: the commit was proposed but not applied before the request ended (%v)", req.ID, err)
		}
		return nil, err
	}
	if res.Err != nil {
		return nil, res.Err
	}
	for _, e := range res.Group {
		if r, ok := e.(group.Reply); ok && r.Op == group.OpWrite && r.Err != nil {
			return nil, groupError(r.Err, req.ID)
		}
	}
	out := &groupCommitResponse{Version: res.Version}
	if req.Snapshot {
		// The group as applied now: this commit and whatever applied
		// before it or since, one state of the group.
		sm.WithGroups(func(l *group.Leader, _ *group.Follower) {
			g, ok := l.Group(req.ID)
			if !ok {
				return
			}
			for _, m := range g.Members {
				if m.Status == group.Joined {
					out.Members = append(out.Members, memberWire{Key: groupKeyWire{Collection: m.Key.Collection, Key: []byte(m.Key.Key), Shard: uint64(m.Shard)},
						Status: uint8(m.Status), Value: m.Value, Absent: m.Absent, Tags: m.Tags.List, KeepTags: m.Tags.Keep, Version: m.Version})
				}
			}
		})
	}
	return out, nil
}

// groupTxnGet reads ref in group attempt id. A read for update reads as a
// get does (the group's leader validates the attempt's reads at its
// commit), but not in a read-only attempt, as in any other.
func (n *Node) groupTxnGet(ctx context.Context, id string, ref kv.KeyRef, forUpdate bool) (kv.Record, bool, error) {
	s, err := n.groupSession(id)
	if err != nil {
		return kv.Record{}, false, err
	}
	defer s.mu.Unlock()
	if forUpdate && s.readOnly {
		return kv.Record{}, false, kv.Errorf(kv.CodeInvalidArgument, "group transaction %s is read-only: it reads for update nothing it could write", id)
	}
	rec, found, err := s.get(ctx, n, ref)
	if kv.CodeOf(err) == kv.CodeTxnAborted {
		n.endGroupTxn(s, 0, err)
	}
	return rec, found, err
}

// TxnGroupSnapshot implements kv.GroupSnapshotter. The values answered
// are the snapshot's own: read-only.
func (n *Node) TxnGroupSnapshot(ctx context.Context, txn string, maxBytes int) ([]kv.BatchGetItem, bool, error) {
	if !isGroupAttempt(txn) {
		return nil, false, nil
	}
	s, err := n.groupSession(txn)
	if err != nil {
		return nil, false, err
	}
	defer s.mu.Unlock()
	if s.snap == nil || len(s.writes) > 0 {
		return nil, false, nil
	}
	items, ok := n.snapshotItems(joinedMembers(s.snap.Members), maxBytes)
	return items, ok, nil
}

// snapshotItems answers members as BatchGetItems (the version also of a
// member absent), or ok false when their keys, values and tags pass
// maxBytes. The values are the members' own: read-only.
func (n *Node) snapshotItems(members []memberWire, maxBytes int) ([]kv.BatchGetItem, bool) {
	size := 0
	items := make([]kv.BatchGetItem, 0, len(members))
	for _, m := range members {
		ref := n.keyRef(m.Key.key())
		r := kv.BatchGetItem{Collection: ref.Collection, Key: ref.Key, Found: !m.Absent, Version: m.Version}
		if r.Found {
			r.Value, r.Tags = m.Value, m.tags(nil)
		}
		size += len(ref.Collection) + len(ref.Key) + len(r.Value)
		for _, t := range r.Tags {
			size += len(t)
		}
		if size > maxBytes {
			return nil, false
		}
		items = append(items, r)
	}
	return items, true
}

// TxnGroupCommit implements kv.GroupSnapshotter.
func (n *Node) TxnGroupCommit(ctx context.Context, txn string, maxBytes int) (uint64, []kv.BatchGetItem, error) {
	if !isGroupAttempt(txn) {
		v, err := n.CommitTxn(ctx, txn)
		return v, nil, err
	}
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return 0, nil, err
	}
	defer done()
	v, members, err := n.groupTxnCommitSnapshot(ctx, txn, true)
	if err != nil || members == nil {
		return v, nil, err
	}
	items, _ := n.snapshotItems(members, maxBytes)
	return v, items, nil
}

// TxnGroupCachedReads implements kv.GroupSnapshotter. The attempt reads
// the group (its snapshot, if it has none yet) and compares: a read whose
// version is no longer the member's fails the attempt at once, as its
// commit's validation would. With writes, the snapshot is the group as
// its leader replica here has applied it, without a read barrier (a
// quorum round in a cluster): the commit's validation in Apply is what
// decides, and a stale snapshot (a leader deposed) costs at worst an
// attempt run again.
func (n *Node) TxnGroupCachedReads(ctx context.Context, txn string, reads []kv.BatchGetItem, writes bool) error {
	if len(reads) == 0 {
		return nil
	}
	if !isGroupAttempt(txn) {
		return kv.Errorf(kv.CodeInvalidArgument, "transaction %s is not a group transaction: it cannot have read from a snapshot of a group", txn)
	}
	s, err := n.groupSession(txn)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	if err := s.loadBarrier(ctx, n, !writes); err != nil {
		if kv.CodeOf(err) == kv.CodeTxnAborted {
			n.endGroupTxn(s, 0, err)
		}
		return err
	}
	for _, r := range reads {
		k, m, err := s.member(n, kv.KeyRef{Collection: r.Collection, Key: r.Key})
		if err != nil {
			return err
		}
		if m.Version != r.Version || m.Absent == r.Found {
			err := kv.Errorf(kv.CodeTxnAborted, "group transaction %s read key %q of collection %q at version %d from a snapshot its client kept; the group has it at version %d now: retry it", txn, r.Key, r.Collection, r.Version, m.Version)
			n.endGroupTxn(s, 0, err)
			return err
		}
		s.reads[k] = r.Version
	}
	s.cached = true
	return nil
}

// TxnGroupReads implements kv.GroupSnapshotter. An attempt that ended is
// left as it is: its commit, which follows, answers its outcome.
func (n *Node) TxnGroupReads(ctx context.Context, txn string, refs []kv.KeyRef) error {
	if len(refs) == 0 {
		return nil
	}
	if !isGroupAttempt(txn) {
		return kv.Errorf(kv.CodeInvalidArgument, "transaction %s is not a group transaction: it has no snapshot to have read from", txn)
	}
	s, _ := n.findGroupSession(txn)
	if s == nil {
		return nil
	}
	defer s.mu.Unlock()
	if s.snap == nil {
		return kv.Errorf(kv.CodeInvalidArgument, "group transaction %s read nothing yet: it has no snapshot to have read from", txn)
	}
	for _, ref := range refs {
		k, m, err := s.member(n, ref)
		if err != nil {
			return err
		}
		s.reads[k] = m.Version
	}
	return nil
}

func (n *Node) groupTxnWrite(ctx context.Context, id string, ref kv.KeyRef, value []byte, tags []string, del bool) error {
	s, err := n.groupSession(id)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	err = s.write(ctx, n, ref, value, tags, del)
	if kv.CodeOf(err) == kv.CodeTxnAborted {
		n.endGroupTxn(s, 0, err)
	}
	return err
}

func (n *Node) groupTxnCommit(ctx context.Context, id string) (uint64, error) {
	v, _, err := n.groupTxnCommitSnapshot(ctx, id, false)
	return v, err
}

// groupTxnCommitSnapshot commits group attempt id and, with snap,
// answers the group's joined members after the commit (groupTxn.commit).
func (n *Node) groupTxnCommitSnapshot(ctx context.Context, id string, snap bool) (uint64, []memberWire, error) {
	s, o := n.findGroupSession(id)
	switch {
	case o != nil:
		// It ended: a commit sent again answers what the first one did.
		v, err := o.answer()
		return v, nil, err
	case s == nil:
		return 0, nil, kv.Errorf(kv.CodeCommitUnknown, "group transaction %s is not known to node %d: it was begun elsewhere, or it ended more than %v ago and the node no longer remembers whether it committed; read what it wrote before running it again", id, n.id, n.opts.TxnIdleTimeout)
	}
	defer s.mu.Unlock()
	v, members, err := s.commit(ctx, n, snap)
	if err != nil && kv.CodeOf(err) != kv.CodeTxnAborted && kv.CodeOf(err) != kv.CodeCommitUnknown {
		// Not committed (the group leader refused before proposing, or
		// was unreachable): the client may retry the attempt afresh.
		if c := kv.CodeOf(err); c == kv.CodeUnavailable || c == kv.CodeNotLeader {
			err = kv.Errorf(kv.CodeTxnAborted, "group transaction %s did not commit: %v; retry it", id, err)
		}
	}
	n.endGroupTxn(s, v, err)
	return v, members, err
}

func (n *Node) groupTxnAbort(ctx context.Context, id string) error {
	n.groups.mu.Lock()
	s := n.groups.mu.sessions[id]
	n.groups.mu.Unlock()
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.done {
		if s.priority && s.snap != nil {
			n.releasePriorityAt(ctx, s)
		}
		n.endGroupTxn(s, 0, kv.Errorf(kv.CodeTxnAborted, "group transaction %s was aborted by its client", id))
	}
	return nil
}

// ExecGroupTxn implements kv.GroupBackend.
func (n *Node) ExecGroupTxn(ctx context.Context, id string, req kv.ExecRequest) (kv.ExecResult, error) {
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return kv.ExecResult{}, err
	}
	defer done()
	if err := validateExec(ctx, req); err != nil {
		return kv.ExecResult{}, err
	}
	var retryOf string
	for attempt := 0; ; attempt++ {
		s, err := n.beginGroupTxn(ctx, id, kv.TxnOptions{RetryOf: retryOf}, false)
		if err != nil {
			return kv.ExecResult{}, err
		}
		s.mu.Lock()
		res, err := s.exec(ctx, n, req)
		if err != nil && !s.done {
			if s.priority && s.snap != nil {
				n.releasePriorityAt(ctx, s)
			}
			n.endGroupTxn(s, 0, err)
		}
		s.mu.Unlock()
		if kv.CodeOf(err) != kv.CodeTxnAborted || ctx.Err() != nil {
			return res, err
		}
		retryOf = s.id
		d := min(time.Duration(1<<min(attempt, 6))*time.Millisecond, 50*time.Millisecond)
		select {
		case <-ctx.Done():
			return kv.ExecResult{}, err
		case <-time.After(d):
		}
	}
}

func (s *groupTxn) exec(ctx context.Context, n *Node, req kv.ExecRequest) (kv.ExecResult, error) {
	return runExec(ctx, groupExec{s, n}, req)
}

type groupExec struct {
	s *groupTxn
	n *Node
}

func (e groupExec) get(ctx context.Context, ref kv.KeyRef) (kv.Record, bool, error) {
	return e.s.get(ctx, e.n, ref)
}

// getForUpdate reads as get: the group's leader validates the reads at
// the commit.
func (e groupExec) getForUpdate(ctx context.Context, ref kv.KeyRef) (kv.Record, bool, error) {
	return e.s.get(ctx, e.n, ref)
}

// batchGet reads each key as get does.
func (e groupExec) batchGet(ctx context.Context, refs []kv.KeyRef, _ bool, _ func(int) string) ([]kv.BatchGetItem, error) {
	items := make([]kv.BatchGetItem, len(refs))
	for i, ref := range refs {
		rec, found, err := e.s.get(ctx, e.n, ref)
		if err != nil {
			return nil, err
		}
		items[i] = batchItem(ref, rec, found)
	}
	return items, nil
}

func (e groupExec) put(ctx context.Context, op kv.TxnOp) error {
	return e.s.write(ctx, e.n, kv.KeyRef{Collection: op.Collection, Key: op.Key}, op.Value, op.Tags, false)
}

func (e groupExec) del(ctx context.Context, ref kv.KeyRef) error {
	return e.s.write(ctx, e.n, ref, nil, nil, true)
}

func (e groupExec) commit(ctx context.Context) (uint64, error) {
	v, _, err := e.s.commit(ctx, e.n, false)
	e.n.endGroupTxn(e.s, v, err)
	return v, err
}

// groupOwnerRequest asks a key's home shard which group holds it.
type groupOwnerRequest struct {
	Shard uint64       `json:"shard"`
	Key   groupKeyWire `json:"key"`
	// Unpin: a key of a tag collection that no group holds here loses
	// the pin of its placement, if it has one (a pin outliving its group).
	Unpin bool `json:"unpin,omitempty"`
}

type groupOwnerResponse struct {
	Group  string `json:"group,omitempty"`
	Leader uint64 `json:"leader,omitempty"`
	// Inc is the incarnation of the group at its leader shard.
	Inc   uint64     `json:"inc,omitempty"`
	Error *peerError `json:"error,omitempty"`
}

// groupOwnerHere answers, on the home shard's leader, the group a key is
// yielded to ("" for none).
func (n *Node) groupOwnerHere(ctx context.Context, req *groupOwnerRequest) (*groupOwnerResponse, error) {
	if !n.host.Ready(req.Shard) {
		return nil, kv.Errorf(kv.CodeNotLeader, "node %d does not lead shard %d", n.id, req.Shard)
	}
	if err := n.host.ReadBarrier(ctx, req.Shard); err != nil {
		return nil, err
	}
	out := n.localGroupOwner(req.Shard, req.Key.key())
	if out.Group == "" && req.Unpin {
		if d := n.collectionByID(req.Key.Collection); d != nil && d.Partitioning == kv.PartitionTag {
			if err := n.unpin(ctx, d, req.Shard, req.Key.Key, ""); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// groupsVisible waits until what shardID's group state shows is in its
// storage too. The state changes while a cycle's batch is built, storage
// when the batch is committed: a reader that found a key free of groups,
// and then reads the key, must not read it before the free that stored
// the group's last writes is visible.
func (n *Node) groupsVisible(ctx context.Context, shardID uint64) error {
	sm := n.host.StateMachine(shardID)
	if sm == nil {
		return nil
	}
	return n.host.WaitApplied(ctx, shardID, sm.GroupsIndex())
}

// errNoTimestamp refuses a read of a transaction reading at a timestamp
// that names none.
func errNoTimestamp() error {
	return kv.Errorf(kv.CodeInvalidArgument, "a transaction's read at a timestamp needs the timestamp")
}

// groupCheck is what a transaction's read checks of the Key Groups
// holding keys it reads (checkGroups).
type groupCheck uint8

const (
	// checkNone: a read outside a transaction.
	checkNone groupCheck = iota
	// checkMembers: a locking transaction's scan or tag query, whose
	// span's members its locks do not hold off (group writes take no
	// locks): refused, as its prepare would refuse them.
	checkMembers
	// checkAtTimestamp: a read-only or snapshot transaction's read, at
	// its timestamp: refused for shards that freed a key above the
	// timestamp with a write stored above its version.
	checkAtTimestamp
)

// groupCheckOf is the check of a forwarded transaction's read by its op
// ("txn_scan_at", "txn_scan_locked", ...).
func groupCheckOf(op string) groupCheck {
	if strings.HasSuffix(op, "_at") {
		return checkAtTimestamp
	}
	return checkMembers
}

// checkGroups prepares a read at version of the keys of collection in
// [start, end) (end nil: unbounded) in this node's replicas of shards,
// which have applied every write at or below the version (a read of the
// present: every write before the read began), for the Key Groups
// holding keys there.
//
// For checkMembers a key a group holds is refused, key_in_group; the
// attempt aborts instead if the group exists no more, as its key is about
// to be freed. Otherwise the read waits until every group write committed
// at or below the version to a key of the span is stored in its shard
// (awaitShipped), at its version: it then reads members at the version as
// it reads every key. For checkAtTimestamp, if a key was freed there
// above the version with a group write stored above the version it was
// committed at (Shard.FreedAbove: by an older build), the attempt aborts,
// and the next reads at a later timestamp.
func (n *Node) checkGroups(ctx context.Context, check groupCheck, shards []uint64, collection uint32, start, end []byte, version uint64) error {
	if check != checkMembers {
		if version != 0 {
			if err := n.awaitShipped(ctx, collection, shards, start, end, version); err != nil {
				return err
			}
		}
		if check == checkAtTimestamp {
			for _, id := range shards {
				if sm := n.host.StateMachine(id); sm != nil && version < sm.FreedAbove() {
					return kv.Errorf(kv.CodeTxnAborted, "a Key Group released keys of shard %d after version %d, at which the transaction reads, with writes stored above the versions they were committed at; retry the transaction", id, version)
				}
			}
		}
		return nil
	}
	for _, id := range shards {
		sm := n.host.StateMachine(id)
		if sm == nil {
			continue
		}
		var key []byte
		var holder string
		sm.WithGroups(func(_ *group.Leader, f *group.Follower) {
			if f.Yielded() == 0 {
				return
			}
			if oneKey(start, end) {
				// One key.
				key, holder = start, f.Holder(group.Key{Collection: collection, Key: string(start)})
				return
			}
			if k, g, ok := f.YieldedIn(collection, string(start), string(end), end != nil); ok {
				key, holder = []byte(k.Key), g
			}
		})
		if holder != "" {
			if n.groupGone(ctx, holder) {
				// A group being deleted, or a late join's ghost: its
				// leader frees the key within a few messages.
				return kv.Errorf(kv.CodeTxnAborted, "key %q is held by group %q, which no longer exists, until the group's leader releases it; retry the transaction", key, holder)
			}
			return kv.Errorf(kv.CodeKeyInGroup, "key %q belongs to group %q; use a transaction of the group", key, holder)
		}
	}
	return nil
}

// noGroupHolds reports whether no Key Group holds k in the replica of
// shardID here, as applied, with every group change the shard knows of
// applied: what groupGet answers without waiting when it reads the key's
// shard.
func (n *Node) noGroupHolds(shardID uint64, collection uint32, key []byte) bool {
	sm := n.host.StateMachine(shardID)
	if sm == nil {
		return false
	}
	if applied, ok := n.host.AppliedIndex(shardID); !ok || applied < sm.GroupsIndex() {
		return false
	}
	return n.groupHolding(shardID, collection, key) == ""
}

// groupHolding returns the id of the Key Group key of collection is
// yielded to in the replica of shardID here, as applied, or "" for none
// (without copying the key while no key is yielded).
func (n *Node) groupHolding(shardID uint64, collection uint32, key []byte) (id string) {
	if sm := n.host.StateMachine(shardID); sm != nil {
		sm.WithGroups(func(_ *group.Leader, f *group.Follower) {
			if f.Yielded() > 0 {
				id = f.Holder(group.Key{Collection: collection, Key: string(key)})
			}
		})
	}
	return id
}

// localGroupOwner reads the group a key is yielded to in the replica of
// shardID here, as applied.
func (n *Node) localGroupOwner(shardID uint64, k group.Key) *groupOwnerResponse {
	out := &groupOwnerResponse{}
	if sm := n.host.StateMachine(shardID); sm != nil {
		sm.WithGroups(func(_ *group.Leader, f *group.Follower) {
			if y, ok := f.Key(k); ok {
				out.Group, out.Leader, out.Inc = y.Group.ID, uint64(y.Group.Leader), y.Group.Inc
			}
		})
	}
	return out
}

func (n *Node) handleGroupOwner(ctx context.Context, req *groupOwnerRequest) (*groupOwnerResponse, error) {
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return &groupOwnerResponse{Error: toPeerError(err)}, nil
	}
	defer done()
	out, err := n.groupOwnerHere(ctx, req)
	if err != nil {
		return &groupOwnerResponse{Error: toPeerError(err)}, nil
	}
	return out, nil
}

// groupPlainWrite writes one member key, refused by its home shard with
// key_in_group, through its group: a one-key group transaction, which
// reads the key first when the write is conditional.
// groupGone reports whether group id is known to exist no more: its
// registration is gone. A key yielded to it is a late join's, which the
// group's leader undoes.
func (n *Node) groupGone(ctx context.Context, id string) bool {
	_, err := n.knownRegistration(ctx, id)
	return kv.CodeOf(err) == kv.CodeNotFound
}

// heldByGhosts reports, for a write of refs to shardID refused because one
// belongs to a group, whether every one of them a group holds is held by
// a group that no longer exists (a late join its leader undoes), or none
// is held any more (freed since the refusal): the write is then to be
// tried again. It asks the shard's leader who holds each key.
func (n *Node) heldByGhosts(ctx context.Context, shardID uint64, refs []kv.KeyRef) bool {
	for _, ref := range refs {
		d, err := n.collection(ref.Collection)
		if err != nil {
			return false
		}
		oreq := &groupOwnerRequest{Shard: shardID, Key: groupKeyWire{Collection: d.ID, Key: ref.Key}}
		out, err := n.atGroupLeader(ctx, shardID, "GroupOwner", oreq, func(ctx context.Context) (any, error) {
			return n.groupOwnerHere(ctx, oreq)
		})
		if err != nil {
			return false
		}
		if g := out.(*groupOwnerResponse).Group; g != "" && !n.groupGone(ctx, g) {
			return false
		}
	}
	return true
}

// groupGoneError is an answer of groupPlainWrite: the key is in no group
// any more, or in one that no longer exists; the plain write is to be
// tried again (plainOrGroupWrite). Its Err is unavailable.
type groupGoneError struct{ Err *kv.Error }

func (e *groupGoneError) Error() string { return e.Err.Error() }
func (e *groupGoneError) Unwrap() error { return e.Err }

func (n *Node) groupPlainWrite(ctx context.Context, homeShard uint64, ref kv.KeyRef, value []byte, tags []string, del bool, ifVersion *uint64, mustExist bool) (uint64, error) {
	k, _, err := n.groupKey(ctx, ref)
	if err != nil {
		return 0, err
	}
	// (A key of a tag collection that no group holds any more loses its
	// placement's pin, which sent the write here, on the way.)
	oreq := &groupOwnerRequest{Shard: homeShard, Key: groupKeyWire{Collection: k.Collection, Key: ref.Key}, Unpin: true}
	out, err := n.atGroupLeader(ctx, homeShard, "GroupOwner", oreq, func(ctx context.Context) (any, error) {
		return n.groupOwnerHere(ctx, oreq)
	})
	if err != nil {
		return 0, err
	}
	owner := out.(*groupOwnerResponse)
	if owner.Group == "" {
		return 0, &groupGoneError{kv.Errorf(kv.CodeUnavailable, "key %q left its group while being written; retry", ref.Key)}
	}
	var retryOf string
	for attempt := 0; ; attempt++ {
		s, err := n.beginGroupTxn(ctx, owner.Group, kv.TxnOptions{RetryOf: retryOf}, false)
		if kv.CodeOf(err) == kv.CodeNotFound && attempt == 0 {
			// The key is yielded to a group that no longer exists: a late
			// join of a group refused or deleted, which its leader undoes.
			return 0, &groupGoneError{kv.Errorf(kv.CodeUnavailable, "key %q is held by group %q, which no longer exists, until the group's leader releases it; retry", ref.Key, owner.Group)}
		}
		if err != nil {
			return 0, err
		}
		s.mu.Lock()
		v, err := func() (uint64, error) {
			if ifVersion != nil || mustExist {
				rec, found, err := s.get(ctx, n, ref)
				if err != nil {
					return 0, err
				}
				cur := uint64(0)
				if found {
					cur = rec.Version
				}
				if mustExist && !found {
					return 0, kv.Errorf(kv.CodeNotFound, "key %q not found", ref.Key)
				}
				if ifVersion != nil && cur != *ifVersion {
					return 0, kv.Errorf(kv.CodeConditionFailed, "key %q is at version %d, the condition wants version %d", ref.Key, cur, *ifVersion)
				}
			}
			if err := s.write(ctx, n, ref, value, tags, del); err != nil {
				return 0, err
			}
			v, _, err := s.commit(ctx, n, false)
			return v, err
		}()
		if !s.done {
			if err != nil && s.priority && s.snap != nil {
				n.releasePriorityAt(ctx, s)
			}
			n.endGroupTxn(s, v, err)
		}
		s.mu.Unlock()
		if kv.CodeOf(err) != kv.CodeTxnAborted || ctx.Err() != nil {
			return v, err
		}
		retryOf = s.id
	}
}

// overlayGroups replaces, in a batch get read here, the values of keys a
// group holds by the group's (its writes may not be shipped to the keys'
// shards yet); the batch's version rises to theirs. held says which keys a
// group held before the batch was read (groupHeld): one freed since is
// read again, once its free is in storage.
func (n *Node) overlayGroups(ctx context.Context, descs []*cluster.CollectionDesc, keyShards [][]uint64, held []uint64, res *kv.BatchGetResult) error {
	snaps := map[string]*groupReadResponse{}
	for i := range res.Items {
		it := &res.Items[i]
		k := group.Key{Collection: descs[i].ID, Key: string(it.Key)}
		_, owner := n.yieldedIn(keyShards[i], k)
		if owner.Group == "" {
			if held[i] != 0 {
				if err := n.rereadFreed(ctx, held[i], descs[i].ID, it, res); err != nil {
					return err
				}
			}
			continue
		}
		snap, ok := snaps[owner.Group]
		if !ok {
			var err error
			snap, err = n.readGroupAt(ctx, owner.Group, owner.Leader)
			if err != nil && kv.CodeOf(err) != kv.CodeNotFound {
				return err
			}
			if snap != nil && snap.Ref.Inc != owner.Inc {
				snap = nil // another group of the id
			}
			snaps[owner.Group] = snap
		}
		if snap == nil {
			continue
		}
		for _, m := range snap.Members {
			if m.Key.key() == k && m.groupsValue() {
				tags := it.Tags // as its shard stores them, for a group that keeps them
				it.Found, it.Value, it.Tags, it.Version = !m.Absent, nil, nil, m.Version
				if !m.Absent {
					it.Value = bytes.Clone(m.Value) // maybe the leader's own
					it.Tags = m.tags(tags)
				}
				res.Version = max(res.Version, m.Version)
			}
		}
	}
	return nil
}

// awaitShippedFor is awaitShipped for a scan or tag query of shards
// served as route says: one read in parts waits on every node reading a
// part, for the keys that part reads.
func (n *Node) awaitShippedFor(ctx context.Context, route readRoute, d *cluster.CollectionDesc, shards []uint64, start, end []byte) error {
	if route != routeSpread {
		return n.awaitShipped(ctx, d.ID, n.expandLocal(shards), start, end, 0)
	}
	_, err := runParts(ctx, n, shards, func(ctx context.Context, p readPart) (*shardReadResponse, error) {
		return n.readPart(ctx, p, shardReadRequest{Op: "shipped", Start: start, End: end}, d)
	})
	return err
}

// awaitShipped waits until every group write to a key of [start, end)
// (empty: unbounded) yielded by a replica of shards here is applied to
// it, so that a read there reflects the groups' committed writes:
//
//   - at 0: before a scan or tag query of the present picks its version,
//     every write its group committed before the wait began; the read,
//     at a version picked after, then reflects every group write
//     committed before it began;
//   - at a version (a read at it, its shards fenced at it): every write
//     its group committed at or below it. Each is stored at the version
//     its group committed it, so the read finds the key's value at the
//     version, as every other read at it does, however late the
//     shipment. Shards holding such keys are fenced again after the
//     wait, so that what the leaders of their shards applied before it
//     (a shipment that the group's leader has dropped from its outbox as
//     acknowledged, a free) is applied here too.
//
// The group's read asks its leader to ship at once, so the wait is short;
// a shard without yielded keys costs a lookup.
func (n *Node) awaitShipped(ctx context.Context, coll uint32, shards []uint64, start, end []byte, at uint64) error {
	type yielded struct {
		shard  uint64
		key    group.Key
		leader uint64 // the group's leader shard
	}
	byGroup := map[string][]yielded{}
	var held []uint64 // the shards holding yielded keys
	for _, id := range shards {
		sm := n.host.StateMachine(id)
		if sm == nil {
			continue
		}
		found := false
		sm.WithGroups(func(_ *group.Leader, f *group.Follower) {
			if f.Yielded() == 0 {
				return
			}
			add := func(k group.Key) {
				if y, ok := f.Key(k); ok {
					byGroup[y.Group.ID] = append(byGroup[y.Group.ID], yielded{id, k, uint64(y.Group.Leader)})
					found = true
				}
			}
			if oneKey(start, end) {
				add(group.Key{Collection: coll, Key: string(start)}) // one key
				return
			}
			for _, k := range f.Keys() {
				if k.Collection == coll && k.Key >= string(start) && (len(end) == 0 || k.Key < string(end)) {
					add(k)
				}
			}
		})
		if found {
			held = append(held, id)
		}
	}
	for id, keys := range byGroup {
		// At the leader shard the yields name: a group being deleted has
		// no registration any more, and its Ds carry writes still to come.
		snap, err := n.readGroupReq(ctx, &groupReadRequest{Shard: keys[0].leader, ID: id, Ship: true, At: at})
		if kv.CodeOf(err) == kv.CodeNotFound {
			// Forgotten: its keys were freed, with its writes, before.
			continue
		}
		if err != nil {
			return err
		}
		pending := map[group.Key]uint64{}
		for _, m := range snap.Members {
			if m.Pending > 0 {
				pending[m.Key.key()] = m.Pending
			}
		}
		for _, y := range keys {
			seq := pending[y.key]
			if seq == 0 {
				continue
			}
			for {
				caught := true
				if sm := n.host.StateMachine(y.shard); sm != nil {
					sm.WithGroups(func(_ *group.Leader, f *group.Follower) {
						if cur, ok := f.Key(y.key); ok && cur.Group.ID == id && cur.Shipped < seq {
							caught = false
						}
					})
				}
				if caught {
					break
				}
				select {
				case <-ctx.Done():
					return kv.Errorf(kv.CodeUnavailable, "waiting for group %q's writes to reach their keys: %v", id, ctx.Err())
				case <-time.After(5 * time.Millisecond):
				}
			}
		}
	}
	if at != 0 && len(held) > 0 {
		if err := n.fenceShards(ctx, held, at); err != nil {
			return err
		}
	}
	// What the waits saw applied (a ship, a free) is in storage before
	// the read.
	for _, id := range shards {
		if err := n.groupsVisible(ctx, id); err != nil {
			return err
		}
	}
	return nil
}

// groupGet reads a member key (yielded by shardID, read here after a
// barrier) from its group, when the group holds it; ok false: read the
// key's own shard.
func (n *Node) groupGet(ctx context.Context, shardID uint64, ref kv.KeyRef, k group.Key) (kv.Record, bool, error) {
	owner := n.localGroupOwner(shardID, k)
	rec, ok, err := n.ownersValue(ctx, owner, ref, k)
	if ok || err != nil {
		return rec, ok, err
	}
	// The caller reads the key's shard: what freed the key is there.
	return kv.Record{}, false, n.groupsVisible(ctx, shardID)
}

// ownersValue reads a member key from owner, the group its shard yielded
// it to ("": none), if the group's value is the key's (ok).
func (n *Node) ownersValue(ctx context.Context, owner *groupOwnerResponse, ref kv.KeyRef, k group.Key) (kv.Record, bool, error) {
	if owner.Group == "" {
		return kv.Record{}, false, nil
	}
	snap, err := n.readGroupAt(ctx, owner.Group, owner.Leader)
	if err != nil {
		if kv.CodeOf(err) == kv.CodeNotFound {
			// Gone: the key is freed, or about to be (a ghost's).
			return kv.Record{}, false, nil
		}
		return kv.Record{}, false, err
	}
	if snap.Ref.Inc != owner.Inc {
		// Another group of the id: the one the key is yielded to is gone.
		return kv.Record{}, false, nil
	}
	for _, m := range snap.Members {
		if m.Key.key() == k && m.groupsValue() {
			if m.Absent {
				return kv.Record{}, true, kv.Errorf(kv.CodeNotFound, "key %q not found", ref.Key)
			}
			return kv.Record{Key: ref.Key, Value: bytes.Clone(m.Value), Tags: m.tags(nil), Version: m.Version}, true, nil // maybe the leader's own
		}
	}
	// Joining (its value is the shard's) or released (shipped).
	return kv.Record{}, false, nil
}

// groupGetRemote is groupGet for a key of a tag collection whose record's
// shard, shardID, may have no replica here: its leader names the group;
// ok false, the caller reads the shard. (A member whose tags its group
// does not know, KeepTags, joined under a build before tags travelled
// with group writes; it is answered without tags here.)
func (n *Node) groupGetRemote(ctx context.Context, shardID uint64, ref kv.KeyRef, k group.Key) (kv.Record, bool, error) {
	oreq := &groupOwnerRequest{Shard: shardID, Key: groupKeyWire{Collection: k.Collection, Key: ref.Key}}
	out, err := n.atGroupLeader(ctx, shardID, "GroupOwner", oreq, func(ctx context.Context) (any, error) {
		return n.groupOwnerHere(ctx, oreq)
	})
	if err != nil {
		return kv.Record{}, false, err
	}
	return n.ownersValue(ctx, out.(*groupOwnerResponse), ref, k)
}

// groupsValue reports whether the group's value of member m is the key's,
// not its shard's: m is joined, or being released with writes its shard
// has not acknowledged (the D carries them; its shard may not have stored
// them yet).
func (m memberWire) groupsValue() bool {
	st := group.MemberStatus(m.Status)
	return st == group.Joined || st == group.Releasing && m.Pending > 0
}

// tags returns a copy of the group's tags of member m's value, or stored,
// the tags its shard stores, if the group keeps them (KeepTags).
func (m memberWire) tags(stored []string) []string {
	if m.KeepTags {
		return stored
	}
	return slices.Clone(m.Tags)
}

// groupHeld reports, for each key of a batch get read here, the shard
// whose replica here has it yielded to a group now (0: none).
func (n *Node) groupHeld(descs []*cluster.CollectionDesc, keys []kv.KeyRef, keyShards [][]uint64) []uint64 {
	held := make([]uint64, len(keys))
	for i, k := range keys {
		held[i], _ = n.yieldedIn(keyShards[i], group.Key{Collection: descs[i].ID, Key: string(k.Key)})
	}
	return held
}

// yieldedIn finds, among shards (the key's shard, or every shard of a tag
// collection: the one of its placement yields it), the replica here that
// has k yielded to a group, and the group (Group "": none).
func (n *Node) yieldedIn(shards []uint64, k group.Key) (uint64, *groupOwnerResponse) {
	for _, id := range shards {
		if o := n.localGroupOwner(id, k); o.Group != "" {
			return id, o
		}
	}
	return 0, &groupOwnerResponse{}
}

// rereadFreed reads again, for a batch get, a key its group freed (in
// shardID) while the batch was read: once the free (which stores the
// group's last writes) is in storage, its newest version; the batch's
// version rises to it.
func (n *Node) rereadFreed(ctx context.Context, shardID uint64, coll uint32, it *kv.BatchGetItem, res *kv.BatchGetResult) error {
	if err := n.groupsVisible(ctx, shardID); err != nil {
		return err
	}
	val, v, found, err := shard.ReadRecord(n.eng.DB, coll, it.Key, shard.Latest)
	if err != nil {
		return kv.Errorf(kv.CodeInternal, "reading %q: %v", it.Key, err)
	}
	it.Found, it.Value, it.Tags, it.Version = found, nil, nil, 0
	if found {
		it.Value, it.Tags, it.Version = val.Value, val.Tags, v
		res.Version = max(res.Version, v)
	}
	return nil
}
