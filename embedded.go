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
// transactions call the backend's kv.TxnBackend directly.
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
	return transact(ctx, tb, fn, opts)
}

func (e embedded) Exec(ctx context.Context, req ExecRequest) (ExecResult, error) {
	tb, err := txnBackendOf(e.Backend)
	if err != nil {
		return ExecResult{}, err
	}
	return execTxn(ctx, tb, req)
}
