package shard

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/storage"
)

// Replica consistency checks.
//
// A KindChecksum entry makes every replica that applies it sum its shard's
// replicated state as of the entry's log index, reading through the apply
// batch (so the effects of the earlier entries of the same cycle count and
// nothing later does). Replicas that applied the same log must produce the
// same sum; the node compares them.
//
// The sum covers the pairs SnapshotData would ship (the same spans and
// ownership rules, snapshotSpans and eachOwned), except what legitimately
// differs between correct replicas at the same index:
//
//   - the "applied" and "max_version" items of the shard-state span:
//     FinishBatch writes them once per batch, so a read through the batch
//     sees them as of the replica's last batch boundary, which depends on
//     how its entries were grouped into cycles. The sum takes the index of
//     the entry and the in-memory max version (exact at every entry)
//     instead.
//   - for a tag collection, the latest-version pointers: a key moved to
//     another placement tag has versions in two shards that share one
//     pointer, and which shard's version it names at a given index of one
//     shard depends on how far the other shard's log was applied on that
//     node.
//
// Everything else is in: the shard's descriptor (the snapshot header), the
// GC threshold, the raft configuration (conf state, which configuration
// changes write into the same apply batch), the catalog and TSO mark of the
// meta shard, and a data shard's versions, tag index, change log,
// placement entries and (hash, range) latest pointers.

// checksumVersion is the first byte summed, so that a change of what the sum
// covers never compares equal to the old one.
const checksumVersion byte = 1

// Checksum is one replica's checksum of its shard's replicated state.
type Checksum struct {
	// ID names the check (EncodeChecksum).
	ID uint64 `json:"id"`
	// Index is the log index of the KindChecksum entry: the state summed is
	// the one every entry before it left.
	Index uint64 `json:"index"`
	// Sum is the SHA-256 of the state.
	Sum []byte `json:"sum"`
	// Pairs is the number of key/value pairs summed.
	Pairs int `json:"pairs"`
}

// applyChecksum sums the shard's replicated state as of the entry at index,
// read through b. It writes nothing.
func (s *Shard) applyChecksum(b *pebble.Batch, index, id uint64) (*Checksum, error) {
	sum, pairs, err := checksumState(b, s.desc, index, s.maxVersion)
	if err != nil {
		return nil, fmt.Errorf("shard %d: checksum at %d: %w", s.desc.ShardID, index, err)
	}
	return &Checksum{ID: id, Index: index, Sum: sum, Pairs: pairs}, nil
}

// checksumSpans are the spans summed: snapshotSpans but the latest pointers
// of a tag collection.
func checksumSpans(d Desc) []snapSpan {
	spans := snapshotSpans(d)
	if d.Partitioning != kv.PartitionTag {
		return spans
	}
	out := spans[:0]
	for _, sp := range spans {
		if sp.kind != spanLatest {
			out = append(out, sp)
		}
	}
	return out
}

// checksumState sums the state of shard d in r at index, with maxVersion
// the shard's highest applied version (see the top of this file).
func checksumState(r pebble.Reader, d Desc, index, maxVersion uint64) ([]byte, int, error) {
	skipApplied := storage.ShardStateKey(d.ShardID, stateApplied)
	skipMaxVersion := storage.ShardStateKey(d.ShardID, stateMaxVersion)
	h := sha256.New()
	buf := append(make([]byte, 0, 256), checksumVersion)
	buf = appendSnapshotHeader(buf, d)
	buf = binary.AppendUvarint(buf, index)
	buf = binary.AppendUvarint(buf, maxVersion)
	h.Write(buf)
	pairs := 0
	for _, sp := range checksumSpans(d) {
		err := eachOwned(r, sp, func(k, v []byte) error {
			if sp.kind == spanState && (bytes.Equal(k, skipApplied) || bytes.Equal(k, skipMaxVersion)) {
				return nil
			}
			h.Write(binary.AppendUvarint(buf[:0], uint64(len(k))))
			h.Write(k)
			h.Write(binary.AppendUvarint(buf[:0], uint64(len(v))))
			h.Write(v)
			pairs++
			return nil
		})
		if err != nil {
			return nil, 0, err
		}
	}
	// The end of the pairs: no key is empty.
	h.Write([]byte{0})
	return h.Sum(nil), pairs, nil
}
