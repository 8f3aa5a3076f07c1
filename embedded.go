package groupkv

import (
	"context"
	"time"

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
	return embedded{n}, nil
}

// embedded is a DB served by a node in this process.
type embedded struct{ *node.Node }

func (e embedded) Close() error { return e.Node.Close() }
