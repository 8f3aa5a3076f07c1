package groupkv

import (
	"context"

	"github.com/groupkv/groupkv/internal/kv"
)

// Key Groups.
//
// A key group is a set of keys, of any collections and shards, whose
// ownership moves to one leader while the group lives, so that
// transactions on them run at that leader with optimistic concurrency
// control and no distributed commit:
//
//	_, err := db.CreateGroup(ctx, groupkv.GroupSpec{
//		ID:      "match-17",
//		Leader:  groupkv.KeyRef{Collection: "matches", Key: []byte("17")},
//		Members: []groupkv.KeyRef{{Collection: "players", Key: []byte("ada")}, {Collection: "players", Key: []byte("bob")}},
//	})
//	...
//	err = db.Group("match-17").Transact(ctx, func(tx *groupkv.Tx) error {
//		... // tx.Get, tx.Put and tx.Delete on members of the group only
//	})
//	...
//	err = db.DeleteGroup(ctx, "match-17")
//
// While a key is in a group, a general transaction (DB.Transact, DB.Exec)
// or a batch write that touches it fails with an ErrKeyInGroup-coded
// error.

// Shared Key Groups types; see their documentation in the kv package.
type (
	GroupSpec    = kv.GroupSpec
	GroupMode    = kv.GroupMode
	GroupCreated = kv.GroupCreated
	GroupRefusal = kv.GroupRefusal
	GroupInfo    = kv.GroupInfo
)

// Modes of a group's creation (GroupSpec.Mode).
const (
	// GroupAtomic, the default: every key joins, or the creation fails
	// with ErrGroupRefused and no key stays taken.
	GroupAtomic = kv.GroupAtomic
	// GroupBestEffort: the group keeps the keys that joined;
	// GroupCreated.Refused lists the others.
	GroupBestEffort = kv.GroupBestEffort
)

// States of a group (GroupInfo.State).
const (
	GroupCreating = kv.GroupCreating
	GroupActive   = kv.GroupActive
	GroupDeleting = kv.GroupDeleting
)

// Errors of Key Groups.
var (
	// ErrKeyInGroup matches the error of an operation on a key that
	// belongs to a key group, outside it (code key_in_group). Transact
	// returns it and does not retry: a retry would meet the group again.
	ErrKeyInGroup = &kv.Error{Code: kv.CodeKeyInGroup}
	// ErrGroupRefused matches the error of the creation of an atomic
	// group that could not take every key (code group_refused); its
	// message names the keys and why. No key stays in the group.
	ErrGroupRefused = &kv.Error{Code: kv.CodeGroupRefused}
	// ErrAlreadyExists matches the error of the creation of a group (or a
	// collection) whose name is in use (code already_exists).
	ErrAlreadyExists = kv.ErrAlreadyExists
)

// Group is a handle on the key group of an id, as DB.Group returns it. It
// holds no state of the group: a group that does not exist shows up as an
// ErrNotFound-coded error of its first call. It is safe for concurrent use.
type Group struct {
	id string
	// backends answers the backends of the group's transactions: tb
	// operates on attempts, gb begins them; err (unimplemented, or a
	// closed DB) when there are none.
	backends func() (tb kv.TxnBackend, gb kv.GroupBackend, err error)
	// start, when not nil, starts the attempts of the group's
	// transactions in place of gb.BeginGroupTxn (a remote DB's, which
	// their first request begins).
	start func(id string) startFunc
	// exec, when not nil, runs Exec in place of gb.ExecGroupTxn.
	exec func(ctx context.Context, req ExecRequest) (ExecResult, error)
}

// ID returns the id of the group.
func (g *Group) ID() string { return g.id }

// Transact runs fn in a transaction on the members of the group, with the
// retry loop of DB.Transact: when an operation or the commit answers
// ErrTxnAborted (the group's leader found a conflict when it validated
// the attempt), Transact begins a new attempt that keeps the first one's
// priority and runs fn again, until one commits. It returns what
// DB.Transact returns. An operation on a key that is not a member of the
// group fails with code invalid_argument; an unknown group is
// ErrNotFound.
//
// A group transaction is serializable: WithIsolation(Snapshot) is refused
// with code invalid_argument.
//
// A remote DB runs the transaction over the transaction RPCs of its gRPC
// connections, on the node that leads the group when it knows it (see
// Dial), else on the node it dialed, with the round trips of
// DB.Transact, but that its first read brings the group's snapshot (when
// its values total at most 64 KiB) from which its other reads of members
// are answered: a transaction that reads two members and writes one costs
// two (the first read, and the commit that carries the write and names
// the other read, which the group's leader validates as any read).
func (g *Group) Transact(ctx context.Context, fn func(tx *Tx) error, opts ...TxnOption) error {
	var o kv.TxnOptions
	for _, opt := range opts {
		opt(&o)
	}
	if o.Isolation != "" && o.Isolation != kv.IsolationSerializable {
		return kv.Errorf(kv.CodeInvalidArgument,
			"isolation %q: a group transaction is serializable (optimistic, validated at commit by the group's leader): leave out WithIsolation", o.Isolation)
	}
	tb, gb, err := g.backends()
	if err != nil {
		return err
	}
	if g.start != nil {
		return transact(ctx, g.start(g.id), fn, opts)
	}
	begin := func(ctx context.Context, opts kv.TxnOptions) (string, error) {
		return gb.BeginGroupTxn(ctx, g.id, opts)
	}
	return transact(ctx, backendStart(tb, begin), fn, opts)
}

// Exec runs a one-shot transaction on members of the group, as DB.Exec
// does on any keys.
func (g *Group) Exec(ctx context.Context, req ExecRequest) (ExecResult, error) {
	_, gb, err := g.backends()
	if err != nil {
		return ExecResult{}, err
	}
	if g.exec != nil {
		return g.exec(ctx, req)
	}
	return gb.ExecGroupTxn(ctx, g.id, req)
}

// backendsOf returns the backends of b's group transactions; a backend
// without Key Groups answers unimplemented.
func backendsOf(b kv.Backend) (kv.TxnBackend, kv.GroupBackend, error) {
	gb, err := groupBackendOf(b)
	if err != nil {
		return nil, nil, err
	}
	tb, err := txnBackendOf(b)
	if err != nil {
		return nil, nil, err
	}
	return tb, gb, nil
}

// groupBackendOf returns the kv.GroupBackend of b; a backend without Key
// Groups answers unimplemented.
func groupBackendOf(b kv.Backend) (kv.GroupBackend, error) {
	if gb, ok := b.(kv.GroupBackend); ok {
		return gb, nil
	}
	return nil, kv.Errorf(kv.CodeUnimplemented, "this node does not serve key groups")
}
