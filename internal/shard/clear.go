package shard

import (
	"github.com/cockroachdb/pebble/v2"
)

// ClearShard writes into b the deletion of every replicated key shard desc
// owns, read through r — the same selection as SnapshotData — and nothing
// of the other shards that share its collection's key spans. The caller
// removes the shard's raft state and node-local records itself.
func ClearShard(b *pebble.Batch, r pebble.Reader, desc Desc) error {
	for _, sp := range snapshotSpans(desc) {
		if sp.owned == nil {
			if err := b.DeleteRange(sp.start, sp.end, nil); err != nil {
				return err
			}
			continue
		}
		if err := eachOwned(r, sp, func(k, _ []byte) error {
			return b.Delete(k, nil)
		}); err != nil {
			return err
		}
	}
	return nil
}
