package groupkv

import (
	"context"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/node"
)

// Open runs a groupkv node in this process on the data directory dir and
// returns it as a DB; no network port is opened. It returns once the node
// serves requests. Close stops the node and releases the directory, which
// no other process may use meanwhile.
func Open(dir string) (DB, error) {
	n, err := node.Open(node.Options{DataDir: dir})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := n.WaitReady(ctx); err != nil {
		n.Close()
		return nil, err
	}
	return embedded{Backend: n, close: n.Close}, nil
}

// embedded is a DB served by a backend in this process, a node: its
// transactions and groups call the backend's kv.TxnBackend and
// kv.GroupBackend directly; a backend that is not one answers
// unimplemented.
type embedded struct {
	kv.Backend
	close func() error
}

func (e embedded) Close() error { return e.close() }

func (e embedded) Transact(ctx context.Context, fn func(tx *Tx) error, opts ...TxnOption) error {
	tb, err := txnBackendOf(e.Backend)
	if err != nil {
		return err
	}
	return transact(ctx, backendStart(tb, tb.BeginTxn), fn, opts)
}

func (e embedded) Exec(ctx context.Context, req ExecRequest) (ExecResult, error) {
	tb, err := txnBackendOf(e.Backend)
	if err != nil {
		return ExecResult{}, err
	}
	return execTxn(ctx, tb, req)
}

func (e embedded) CreateGroup(ctx context.Context, spec GroupSpec) (GroupCreated, error) {
	gb, err := groupBackendOf(e.Backend)
	if err != nil {
		return GroupCreated{}, err
	}
	return gb.CreateGroup(ctx, spec)
}

func (e embedded) DescribeGroup(ctx context.Context, id string) (GroupInfo, error) {
	gb, err := groupBackendOf(e.Backend)
	if err != nil {
		return GroupInfo{}, err
	}
	return gb.DescribeGroup(ctx, id)
}

func (e embedded) ListGroups(ctx context.Context) ([]GroupInfo, error) {
	gb, err := groupBackendOf(e.Backend)
	if err != nil {
		return nil, err
	}
	return gb.ListGroups(ctx)
}

func (e embedded) DeleteGroup(ctx context.Context, id string) error {
	gb, err := groupBackendOf(e.Backend)
	if err != nil {
		return err
	}
	return gb.DeleteGroup(ctx, id)
}

// Group returns a handle whose transactions call the backend's
// kv.GroupBackend and kv.TxnBackend directly.
func (e embedded) Group(id string) *Group {
	return &Group{id: id, backends: func() (kv.TxnBackend, kv.GroupBackend, error) { return backendsOf(e.Backend) }}
}
