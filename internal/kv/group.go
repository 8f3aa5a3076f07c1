package kv

import "context"

// GroupMode is how a group's creation treats a key that will not join.
type GroupMode string

const (
	// GroupAtomic: creation fails (conflict) unless every key joins; the
	// keys taken are released before the failure is answered.
	GroupAtomic GroupMode = "atomic"
	// GroupBestEffort: the group keeps the keys that joined.
	GroupBestEffort GroupMode = "best_effort"
)

// Group states, as DescribeGroup reports them.
const (
	GroupCreating = "creating"
	GroupActive   = "active"
	GroupDeleting = "deleting"
)

// GroupSpec asks for a group: ownership of Members (Leader among them,
// listed or not) moves to the leader of Leader's shard.
type GroupSpec struct {
	ID      string
	Leader  KeyRef
	Members []KeyRef
	// Mode is GroupAtomic when empty.
	Mode GroupMode
}

// GroupRefusal is a key that would not join a group, and why ("intent",
// "locked", "in_group").
type GroupRefusal struct {
	KeyRef
	Reason string
}

// GroupCreated is the outcome of a creation: Joined lists every member key
// the group holds, the leader included; Refused (best_effort) the others.
type GroupCreated struct {
	ID      string
	Joined  []KeyRef
	Refused []GroupRefusal
}

// GroupInfo describes a group.
type GroupInfo struct {
	ID     string
	Leader KeyRef
	// Members are the keys the group holds or is taking (creating) or
	// giving back (deleting), the leader key included.
	Members []KeyRef
	Mode    GroupMode
	// LeaderNode is the node leading the group's leader shard.
	LeaderNode uint64
	// State is GroupCreating, GroupActive or GroupDeleting.
	State string
	// ShipperLag is the number of committed group writes not yet applied
	// to their keys' own shards.
	ShipperLag int
}

// GroupBackend is the Key Groups part of the service. A group transaction
// attempt, begun by BeginGroupTxn, is operated on with the TxnBackend
// methods (TxnGet, TxnPut, TxnDelete, CommitTxn, AbortTxn) like any other;
// it may touch only the group's members (else invalid_argument). Batch
// writes and general transactions that touch a member key fail with
// CodeKeyInGroup.
type GroupBackend interface {
	// CreateGroup answers once creation has finished. An atomic group that
	// cannot take every key answers CodeGroupRefused (409, its
	// message naming the keys and reasons) once every key it took is
	// released; an id in use answers CodeAlreadyExists.
	CreateGroup(ctx context.Context, spec GroupSpec) (GroupCreated, error)
	// DescribeGroup answers CodeNotFound for an unknown id.
	DescribeGroup(ctx context.Context, id string) (GroupInfo, error)
	ListGroups(ctx context.Context) ([]GroupInfo, error)
	// DeleteGroup answers once every group write has been applied to its
	// key's own shard and every key is owned by its shard again.
	DeleteGroup(ctx context.Context, id string) error
	// BeginGroupTxn begins a group transaction attempt (optimistic: it
	// reads one snapshot of the group, taken at its first read, and is
	// validated at commit by the group's leader). opts.Isolation must be
	// serializable or empty; RetryOf names an attempt that failed
	// validation, whose retry runs with priority.
	BeginGroupTxn(ctx context.Context, id string, opts TxnOptions) (string, error)
	// ExecGroupTxn runs a one-shot transaction on members of the group.
	ExecGroupTxn(ctx context.Context, id string, req ExecRequest) (ExecResult, error)
}

// GroupSnapshotter is implemented by a TxnBackend whose group transaction
// attempts can hand their snapshot of the group to a remote client, which
// then answers the attempt's gets of members itself instead of asking the
// backend for each: a transaction that reads several members and writes
// costs two round trips (the first get, the commit).
type GroupSnapshotter interface {
	// TxnGroupSnapshot answers the snapshot of group transaction attempt
	// txn, taken at its first read, which has happened: every member as
	// a get of it in the attempt answers it. ok is false, and nothing is
	// answered, when txn is not a group attempt, when it has writes (the
	// snapshot is of the group before them), or when the members' keys,
	// values and tags pass maxBytes.
	// Each member is a BatchGetItem (its collection, key and version,
	// and when Found its value and tags).
	TxnGroupSnapshot(ctx context.Context, txn string, maxBytes int) (members []BatchGetItem, ok bool, err error)
	// TxnGroupReads records that group attempt txn read refs from its
	// snapshot: its commit validates them as reads by TxnGet. A key that
	// is not a member answers invalid_argument.
	TxnGroupReads(ctx context.Context, txn string, refs []KeyRef) error
	// TxnGroupCachedReads records that group attempt txn read reads (each
	// a member's key, Found and Version) from a snapshot its client kept
	// from an earlier transaction of the group (TxnGroupCommit): they are
	// validated as reads at those versions, at once against the group's
	// current state and again by the commit, even when the attempt
	// writes nothing. A read no longer current fails the attempt with
	// txn_aborted; a key that is not a member answers invalid_argument.
	// With writes (the commit that follows writes, so that the group's
	// leader validates the reads in Apply), the comparison at once may use
	// the group's state as this node has it, without first confirming
	// with a quorum that it still leads: it only saves a doomed commit.
	TxnGroupCachedReads(ctx context.Context, txn string, reads []BatchGetItem, writes bool) error
	// TxnGroupCommit commits txn as TxnBackend.CommitTxn does and, for a
	// group attempt, answers a snapshot of the group once the commit
	// applied (as TxnGroupSnapshot answers one: nil when it passes
	// maxBytes or cannot be told), from which a later transaction of the
	// group may read (TxnGroupCachedReads).
	TxnGroupCommit(ctx context.Context, txn string, maxBytes int) (version uint64, members []BatchGetItem, err error)
}
