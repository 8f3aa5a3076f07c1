package shard

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"

	"github.com/cockroachdb/pebble/v2"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/storage"
)

// Merges join two adjacent shards of a collection, left and right, into
// left. Like a split, no record moves: a node's shards share one Pebble
// key space and ownership follows the span. Three commands, in order:
//
//  1. KindMergeShards (meta shard) changes the catalog: left takes the
//     span of right, which moves to CollectionDesc.Merged.
//  2. KindFreeze, in right's own log: from that index on, right changes
//     nothing more — writes, deletes, placements and splits are refused
//     with unavailable (retry: the catalog already routes them to left),
//     GC is skipped. The freeze is versioned like a write, so its version
//     is above every version right applied and every snapshot timestamp
//     its leader served; the frozen state (FrozenState: the freeze's
//     index, right's highest version and GC threshold) is persisted.
//  3. KindMergeTrigger, in left's log, proposed by left's leader only once
//     the right replica on every node of the group has applied the freeze
//     (it asks each node). Every replica applying the trigger therefore
//     has right's final records in its Pebble already: Apply widens left's
//     span and takes the max of both shards' highest versions and GC
//     thresholds from the command, so it reads nothing of right's replica
//     and is deterministic. The replication layer then removes right's
//     raft group and state on that node in the same batch.
//
// Left's leader proposes nothing conditional on time: a node that is down
// holds the merge up (right refuses writes) until it is back.
const (
	KindMergeShards  CommandKind = 15
	KindFreeze       CommandKind = 16
	KindMergeTrigger CommandKind = 17
)

const stateFrozen = "frozen" // JSON FrozenState, once a freeze was applied

// FrozenState is what a shard frozen for a merge keeps: it changes no more.
type FrozenState struct {
	// Into is the shard it is merged into.
	Into uint64 `json:"into"`
	// Index is the log index of the freeze.
	Index       uint64 `json:"index"`
	MaxVersion  uint64 `json:"max_version"`
	GCThreshold uint64 `json:"gc_threshold"`
}

// MergeCmd is the body of KindMergeShards (Collection, Shard: the left
// shard), KindFreeze (Into) and KindMergeTrigger (Right, its span and its
// Frozen state).
type MergeCmd struct {
	Collection string
	Shard      uint64
	Into       uint64
	Right      uint64
	// Start and End (nil: unbounded) of a range right shard; BucketStart
	// and BucketEnd of a hash or tag one.
	Start, End             []byte
	BucketStart, BucketEnd uint32
	Frozen                 FrozenState
}

// MergeResult is what a KindMergeTrigger left: the removed right shard
// and the widened left descriptor.
type MergeResult struct {
	Right uint64
	Desc  Desc
}

// EncodeMergeShards encodes the catalog change merging shard left of
// collection with its right neighbour.
func EncodeMergeShards(collection string, left uint64) []byte {
	b := appendBytes([]byte{byte(KindMergeShards)}, []byte(collection))
	return binary.AppendUvarint(b, left)
}

// EncodeFreeze encodes the freeze of a shard merged into shard into, with
// version 0: it is versioned like a write (SetVersion).
func EncodeFreeze(into uint64) []byte {
	b := make([]byte, 1+8, 1+8+10)
	b[0] = byte(KindFreeze)
	return binary.AppendUvarint(b, into)
}

// EncodeMergeTrigger encodes the merge, in the left shard's log, of the
// frozen shard right (span and frozen state as its replicas applied them).
func EncodeMergeTrigger(right Desc, f FrozenState) []byte {
	b := binary.AppendUvarint([]byte{byte(KindMergeTrigger)}, right.ShardID)
	b = appendBytes(b, right.Start)
	if right.End == nil {
		b = append(b, 0)
	} else {
		b = appendBytes(append(b, 1), right.End)
	}
	b = binary.AppendUvarint(b, uint64(right.BucketStart))
	b = binary.AppendUvarint(b, uint64(right.BucketEnd))
	b = binary.AppendUvarint(b, f.Into)
	b = binary.AppendUvarint(b, f.Index)
	b = binary.AppendUvarint(b, f.MaxVersion)
	return binary.AppendUvarint(b, f.GCThreshold)
}

func decodeMerge(d *decoder, kind CommandKind) MergeCmd {
	var c MergeCmd
	switch kind {
	case KindMergeShards:
		c.Collection = string(d.bytes())
		c.Shard = d.uvarint()
	case KindFreeze:
		c.Into = d.uvarint()
	case KindMergeTrigger:
		c.Right = d.uvarint()
		c.Start = d.bytes()
		switch d.byte() {
		case 0:
		case 1:
			c.End = d.bytes()
		default:
			d.err = ErrCorruptCommand
		}
		bs, be := d.uvarint(), d.uvarint()
		if bs > kv.NumBuckets || be > kv.NumBuckets {
			d.err = ErrCorruptCommand
		}
		c.BucketStart, c.BucketEnd = uint32(bs), uint32(be)
		c.Frozen.Into = d.uvarint()
		c.Frozen.Index = d.uvarint()
		c.Frozen.MaxVersion = d.uvarint()
		c.Frozen.GCThreshold = d.uvarint()
	}
	return c
}

// Frozen returns the shard's frozen state, nil unless a freeze was applied.
func (s *Shard) Frozen() *FrozenState { return s.frozen }

// FrozenInto returns the shard a freeze for a merge names (0: not frozen).
// Unlike Frozen it may be called from any goroutine.
func (s *Shard) FrozenInto() uint64 { return s.frozenInto.Load() }

// ReadFrozen reads shardID's frozen state from r (nil: not frozen).
func ReadFrozen(r pebble.Reader, shardID uint64) (*FrozenState, error) {
	v, ok, err := storage.GetValue(r, storage.ShardStateKey(shardID, stateFrozen))
	if err != nil || !ok {
		return nil, err
	}
	var f FrozenState
	if err := json.Unmarshal(v, &f); err != nil {
		return nil, errors.Join(ErrCorruptCommand, err)
	}
	return &f, nil
}

// frozenRefusal refuses a command that would change a frozen shard.
func (s *Shard) frozenRefusal() Result {
	return Result{Err: kv.Errorf(kv.CodeUnavailable, "shard %d is being merged into shard %d; retry", s.desc.ShardID, s.frozen.Into)}
}

func (s *Shard) applyMergeShards(b *pebble.Batch, c MergeCmd) (Result, error) {
	if !s.desc.IsMeta() {
		return Result{Err: kv.Errorf(kv.CodeInternal, "catalog command proposed to shard %d", s.desc.ShardID)}, nil
	}
	key := storage.CatalogKey(catalogCollection + c.Collection)
	v, ok, err := storage.GetValue(b, key)
	if err != nil {
		return Result{}, err
	}
	if !ok {
		return Result{Err: kv.Errorf(kv.CodeCollectionNotFound, "collection %q not found", c.Collection)}, nil
	}
	desc, err := cluster.DecodeCollectionDesc(v)
	if err != nil {
		return Result{}, err
	}
	if _, err := desc.Merge(c.Shard); err != nil {
		code := kv.CodeInvalidArgument
		if errors.Is(err, cluster.ErrMergeReplicas) {
			code = kv.CodeConditionFailed
		}
		return Result{Err: kv.Errorf(code, "merging shard %d of %q: %v", c.Shard, c.Collection, err)}, nil
	}
	if err := b.Set(key, desc.Encode(), nil); err != nil {
		return Result{}, err
	}
	return Result{Desc: desc}, nil
}

// applyFreeze freezes the shard at index. A second freeze changes nothing
// and answers the first one's state.
func (s *Shard) applyFreeze(b *pebble.Batch, index uint64, cmd Command) (Result, error) {
	if s.desc.IsMeta() || cmd.Merge.Into == 0 || cmd.Merge.Into == s.desc.ShardID {
		return Result{Err: kv.Errorf(kv.CodeInvalidArgument, "shard %d cannot be merged into shard %d", s.desc.ShardID, cmd.Merge.Into)}, nil
	}
	if s.frozen != nil {
		return Result{Freeze: s.frozen}, nil
	}
	if err := s.checkVersion(cmd.Version); err != nil {
		return Result{Err: err}, nil
	}
	if s.holdsGroups() {
		return Result{Err: kv.Errorf(kv.CodeUnavailable, "shard %d holds key groups or keys of one; it merges once they are deleted", s.desc.ShardID)}, nil
	}
	if err := s.setMaxVersion(b, cmd.Version); err != nil {
		return Result{}, err
	}
	f := &FrozenState{Into: cmd.Merge.Into, Index: index, MaxVersion: cmd.Version, GCThreshold: s.gcThreshold}
	data, err := json.Marshal(f)
	if err != nil {
		return Result{}, err
	}
	if err := b.Set(storage.ShardStateKey(s.desc.ShardID, stateFrozen), data, nil); err != nil {
		return Result{}, err
	}
	s.frozen = f
	s.frozenInto.Store(f.Into)
	return Result{Version: cmd.Version, Freeze: f}, nil
}

// applyMergeTrigger widens the shard over the frozen right shard of c.
// The proposer guarantees that every replica's node holds right's frozen
// records (see the comment on the kinds above); nothing of right is read
// here.
func (s *Shard) applyMergeTrigger(b *pebble.Batch, c MergeCmd) (Result, error) {
	d := s.desc
	if d.IsMeta() || c.Right == 0 || c.Right == d.ShardID || c.Frozen.Into != d.ShardID {
		return Result{Err: kv.Errorf(kv.CodeInvalidArgument, "shard %d cannot take in shard %d", d.ShardID, c.Right)}, nil
	}
	if d.Partitioning == kv.PartitionRange {
		if d.End == nil || !bytes.Equal(d.End, c.Start) || (c.End != nil && bytes.Compare(c.End, c.Start) <= 0) {
			return Result{Err: kv.Errorf(kv.CodeInvalidArgument, "shard %d ending at %q is not next to shard %d starting at %q", d.ShardID, d.End, c.Right, c.Start)}, nil
		}
		d.End = append([]byte(nil), c.End...)
		if c.End == nil {
			d.End = nil
		}
	} else {
		if d.BucketEnd != c.BucketStart || c.BucketEnd <= c.BucketStart {
			return Result{Err: kv.Errorf(kv.CodeInvalidArgument, "shard %d ending at bucket %d is not next to shard %d's buckets [%d, %d)", d.ShardID, d.BucketEnd, c.Right, c.BucketStart, c.BucketEnd)}, nil
		}
		d.BucketEnd = c.BucketEnd
	}
	if err := writeSpan(b, d); err != nil {
		return Result{}, err
	}
	// The right shard's keys may carry tags.
	s.untagged = false
	if c.Frozen.MaxVersion > s.maxVersion {
		if err := s.setMaxVersion(b, c.Frozen.MaxVersion); err != nil {
			return Result{}, err
		}
	}
	s.blindWrite = s.maxVersion
	if c.Frozen.GCThreshold > s.gcThreshold {
		s.gcThreshold = c.Frozen.GCThreshold
		s.gcView.Raise(d.ShardID, s.gcThreshold) // before the batch commits
		if err := storage.PutUint64(b, storage.ShardStateKey(d.ShardID, stateGCThreshold), s.gcThreshold); err != nil {
			return Result{}, err
		}
	}
	// The right shard's keys freed there: its FreedAbove, or, if it has
	// none stored, its highest version (it may have freed keys before
	// FreedAbove was stored).
	rightFreed, ok, err := readFreedAbove(b, c.Right)
	if err != nil {
		return Result{}, err
	}
	if !ok {
		rightFreed = c.Frozen.MaxVersion
	}
	if err := s.raiseFreedAbove(b, rightFreed); err != nil {
		return Result{}, err
	}
	if err := s.inheritMergedPrepared(b, c.Right); err != nil {
		return Result{}, err
	}
	s.desc = d
	s.recs.reload(d)
	s.txns.held = nil // intents the right shard resolved may be held here
	return Result{Merge: &MergeResult{Right: c.Right, Desc: d}}, nil
}
