// Package groupkv is the Go client of groupkv, a sharded, raft-replicated
// key-value store with consistent access to groups of keys.
//
// One interface, DB, is served two ways: Open runs a node in this process on
// a data directory (no network), Dial talks to a running server over gRPC.
//
//	db, err := groupkv.Dial("127.0.0.1:7070")
//	if err != nil { ... }
//	defer db.Close()
//	v, err := db.Put(ctx, groupkv.PutRequest{Collection: "users", Key: []byte("u1"), Value: []byte("ada")})
package groupkv

import (
	"context"
	"io"

	"github.com/groupkv/groupkv/internal/kv"
)

// DB is a handle on groupkv, embedded or remote. It is safe for concurrent
// use. Errors are *Error values with a stable Code (see CodeOf), or context
// errors.
type DB interface {
	kv.Backend
	io.Closer

	// Transact runs fn in a transaction and commits it when fn returns
	// nil. Each run of fn is an attempt with a Tx of its own; when an
	// operation or the commit answers ErrTxnAborted (a conflict), Transact
	// begins a new attempt that keeps the first one's priority and runs fn
	// again, after a short random backoff, until one commits: fn must be
	// safe to run more than once, and should have no effects outside tx.
	// It returns
	//   - nil when an attempt committed;
	//   - fn's own error, untouched, after aborting the attempt, when fn
	//     fails;
	//   - a *TxnContextError (matching ctx's error under errors.Is) after
	//     aborting the attempt, when ctx ends before a commit;
	//   - a *CommitUnknownError (matching ErrCommitUnknown) when the commit
	//     may or may not have been applied; it is never retried;
	//   - an ErrKeyInGroup-coded error, after aborting the attempt, when
	//     an operation or the commit answered one: a key of the
	//     transaction belongs to a key group (use the group's Transact).
	//     It is never retried, and is returned even if fn went on;
	//     fn's own error, if it returned one, is returned instead;
	//   - the error of a begin or a commit that was refused otherwise
	//     (ErrUnavailable: nothing was applied).
	// A serializable transaction (the default) that is retried commits in
	// the end; a Snapshot one is retried too but may lose every time to
	// other writers of its keys, so bound it with ctx.
	//
	// A remote DB runs the transaction on the node it dialed, over the
	// transaction RPCs of its gRPC connection.
	Transact(ctx context.Context, fn func(tx *Tx) error, opts ...TxnOption) error
	// Exec runs a one-shot transaction: if every condition of req.If
	// holds, the operations of req.Then, else those of req.Else, in one
	// transaction that the server retries on conflict. Its error may be
	// ErrCommitUnknown-coded, as a write's.
	Exec(ctx context.Context, req ExecRequest) (ExecResult, error)

	// CreateGroup creates a key group: ownership of spec.Members (and of
	// spec.Leader, listed among them or not) moves to the leader of
	// spec.Leader's shard. It answers once the creation is over:
	// GroupCreated.Joined lists every key of the group, the leader
	// included, and, for a GroupBestEffort group, Refused the keys that
	// would not join and why. An atomic group (the default) that cannot
	// take every key fails with ErrGroupRefused, its keys released; an id
	// in use fails with ErrAlreadyExists.
	CreateGroup(ctx context.Context, spec GroupSpec) (GroupCreated, error)
	// DescribeGroup describes a group; an unknown id is ErrNotFound.
	DescribeGroup(ctx context.Context, id string) (GroupInfo, error)
	// ListGroups describes every group.
	ListGroups(ctx context.Context) ([]GroupInfo, error)
	// DeleteGroup deletes a group and answers once every write of the
	// group has been applied to its key's own shard and every key is
	// owned by its shard again; an unknown id is ErrNotFound.
	DeleteGroup(ctx context.Context, id string) error
	// Group returns a handle on the group of id, for its transactions
	// (Group.Transact, Group.Exec). It does not check that the group
	// exists.
	Group(id string) *Group
}

// Shared types; see their documentation in the kv package.
type (
	CollectionOptions = kv.CollectionOptions
	CollectionInfo    = kv.CollectionInfo
	ShardInfo         = kv.ShardInfo
	Partitioning      = kv.Partitioning
	Record            = kv.Record
	PutRequest        = kv.PutRequest
	GetRequest        = kv.GetRequest
	DeleteRequest     = kv.DeleteRequest
	Error             = kv.Error
	Code              = kv.Code

	KeyRef             = kv.KeyRef
	BatchGetItem       = kv.BatchGetItem
	BatchGetResult     = kv.BatchGetResult
	PutItem            = kv.PutItem
	WriteResult        = kv.WriteResult
	BatchError         = kv.BatchError
	DeleteRangeRequest = kv.DeleteRangeRequest
	DeleteRangeResult  = kv.DeleteRangeResult
	ScanRequest        = kv.ScanRequest
	ScanResult         = kv.ScanResult
	TagQuery           = kv.TagQuery
	Event              = kv.Event
	WatchRequest       = kv.WatchRequest
)

// Event types of a watch.
const (
	EventPut      = kv.EventPut
	EventDelete   = kv.EventDelete
	EventProgress = kv.EventProgress
)

// Partitionings.
const (
	PartitionHash  = kv.PartitionHash
	PartitionRange = kv.PartitionRange
	PartitionTag   = kv.PartitionTag
)

// Error codes and sentinels for errors.Is.
const (
	CodeInvalidArgument    = kv.CodeInvalidArgument
	CodeNotFound           = kv.CodeNotFound
	CodeCollectionNotFound = kv.CodeCollectionNotFound
	CodeConditionFailed    = kv.CodeConditionFailed
	CodeCompacted          = kv.CodeCompacted
	CodeTooLarge           = kv.CodeTooLarge
	CodeUnavailable        = kv.CodeUnavailable
	CodeTxnAborted         = kv.CodeTxnAborted
	CodeAlreadyExists      = kv.CodeAlreadyExists
	CodeKeyInGroup         = kv.CodeKeyInGroup
	CodeGroupRefused       = kv.CodeGroupRefused
	CodeCommitUnknown      = kv.CodeCommitUnknown
	CodeUnimplemented      = kv.CodeUnimplemented
	// CodePermissionDenied: the client's role (the server's roles file)
	// does not allow the operation.
	CodePermissionDenied = kv.CodePermissionDenied
	// CodePlacementTagChanged: a put would change the placement tag (the
	// first tag) of a live record of a tag collection, or of a key a group
	// holds.
	CodePlacementTagChanged = kv.CodePlacementTagChanged
)

var (
	ErrNotFound           = kv.ErrNotFound
	ErrCollectionNotFound = kv.ErrCollectionNotFound
	ErrConditionFailed    = kv.ErrConditionFailed
	ErrCompacted          = kv.ErrCompacted
	ErrUnavailable        = kv.ErrUnavailable
)

// CodeOf returns the stable code of err.
func CodeOf(err error) Code { return kv.CodeOf(err) }

// Version returns a pointer to v, for PutRequest.IfVersion and
// DeleteRequest.IfVersion.
func Version(v uint64) *uint64 { return &v }
