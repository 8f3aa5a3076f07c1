package node

import (
	"context"

	"github.com/groupkv/groupkv/internal/kv"
)

// System collections. Collections whose names begin with '_' belong to
// groupkv itself (the registry of key groups, _groups): anyone may read
// them, but only the node writes, creates or drops them — a user's put
// into _groups would forge a group's registration, a drop would orphan
// every group. The node's own calls carry systemContext.

type systemKey struct{}

// systemContext marks ctx as the node's own: its writes may go to system
// collections.
func systemContext(ctx context.Context) context.Context {
	return context.WithValue(ctx, systemKey{}, true)
}

// checkWritable refuses a user's write, creation or drop of the system
// collection name.
func checkWritable(ctx context.Context, name string) error {
	if !kv.SystemCollection(name) || ctx.Value(systemKey{}) != nil {
		return nil
	}
	return kv.Errorf(kv.CodeInvalidArgument, "collection %q is groupkv's own (names beginning with '_' are reserved): it can be read, not written, created or dropped", name)
}
