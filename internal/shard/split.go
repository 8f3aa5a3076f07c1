package shard

import (
	"encoding/binary"
	"encoding/json"

	"github.com/cockroachdb/pebble/v2"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/storage"
)

// Splits. The catalog changes first (KindSplitShard, meta shard): the
// shard keeps the lower part of its span and a new shard takes the upper
// part. The parent's leader then proposes KindSplitTrigger to the parent's
// own log: at that index every replica narrows the parent's span and writes
// the child's initial state — its span, highest version and GC threshold
// as of the split — in the same batch (the replication layer adds the
// child's raft state there), so that all replicas start the child from the
// same state. The records need no copying: a node's shards share one
// Pebble key space, and ownership follows the span.
const (
	KindSplitShard   CommandKind = 13
	KindSplitTrigger CommandKind = 14
)

const stateSpan = "span" // JSON persistedSpan, once a split changed the span

type persistedSpan struct {
	Start       []byte `json:"start,omitempty"`
	End         []byte `json:"end,omitempty"`
	BucketStart uint32 `json:"bucket_start"`
	BucketEnd   uint32 `json:"bucket_end"`
}

// SplitCmd is the body of KindSplitShard (Collection, Shard, Key, Bucket)
// and KindSplitTrigger (Child, Key, Bucket).
type SplitCmd struct {
	Collection string
	Shard      uint64
	Child      uint64
	Key        []byte
	Bucket     uint32
}

// SplitResult is what a KindSplitTrigger left: the child's descriptor and
// the state it starts from.
type SplitResult struct {
	Child       Desc
	MaxVersion  uint64
	GCThreshold uint64
	// Existing: a replica of the child already ran on this node when the
	// split was applied here (it was placed here, and filled by a snapshot,
	// before this parent replica caught up); its state was left alone.
	Existing bool
}

// SetChildHere sets the check a split trigger makes for a child replica
// already running on this node.
func (s *Shard) SetChildHere(fn func(shard uint64) bool) { s.childHere = fn }

// EncodeSplitShard encodes the catalog change splitting shard of
// collection at key (range) or bucket (hash, tag; 0: the middle).
func EncodeSplitShard(collection string, shard uint64, key []byte, bucket uint32) []byte {
	b := appendBytes([]byte{byte(KindSplitShard)}, []byte(collection))
	b = binary.AppendUvarint(b, shard)
	b = appendBytes(b, key)
	return binary.AppendUvarint(b, uint64(bucket))
}

// EncodeSplitTrigger encodes the split of a shard, in its own log, into
// itself and child from key or bucket.
func EncodeSplitTrigger(child uint64, key []byte, bucket uint32) []byte {
	b := binary.AppendUvarint([]byte{byte(KindSplitTrigger)}, child)
	b = appendBytes(b, key)
	return binary.AppendUvarint(b, uint64(bucket))
}

func decodeSplit(d *decoder, kind CommandKind) SplitCmd {
	var c SplitCmd
	if kind == KindSplitShard {
		c.Collection = string(d.bytes())
		c.Shard = d.uvarint()
	} else {
		c.Child = d.uvarint()
	}
	c.Key = d.bytes()
	if b := d.uvarint(); b <= kv.NumBuckets {
		c.Bucket = uint32(b)
	} else {
		d.err = ErrCorruptCommand
	}
	return c
}

func (s *Shard) applySplitShard(b *pebble.Batch, c SplitCmd) (Result, error) {
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
	next, err := storage.GetUint64(b, storage.CatalogKey(catalogNextShard))
	if err != nil {
		return Result{}, err
	}
	if next == 0 {
		next = cluster.MetaShardID + 1
	}
	if _, err := desc.Split(c.Shard, next, c.Key, c.Bucket); err != nil {
		return Result{Err: kv.Errorf(kv.CodeInvalidArgument, "splitting %q: %v", c.Collection, err)}, nil
	}
	if err := b.Set(key, desc.Encode(), nil); err != nil {
		return Result{}, err
	}
	if err := storage.PutUint64(b, storage.CatalogKey(catalogNextShard), next+1); err != nil {
		return Result{}, err
	}
	return Result{Desc: desc}, nil
}

func (s *Shard) applySplitTrigger(b *pebble.Batch, c SplitCmd) (Result, error) {
	d := s.desc
	if d.IsMeta() || c.Child == 0 || c.Child == d.ShardID {
		return Result{Err: kv.Errorf(kv.CodeInvalidArgument, "shard %d cannot split into shard %d", d.ShardID, c.Child)}, nil
	}
	if s.holdsGroups() {
		return Result{Err: kv.Errorf(kv.CodeUnavailable, "shard %d holds key groups or keys of one; it splits once they are deleted", d.ShardID)}, nil
	}
	child := d
	child.ShardID = c.Child
	if d.Partitioning == kv.PartitionRange {
		if len(c.Key) == 0 || string(c.Key) <= string(d.Start) || (d.End != nil && string(c.Key) >= string(d.End)) {
			return Result{Err: kv.Errorf(kv.CodeInvalidArgument, "split key %q is outside shard %d", c.Key, d.ShardID)}, nil
		}
		child.Start, child.End = append([]byte(nil), c.Key...), d.End
		d.End = child.Start
	} else {
		if c.Bucket <= d.BucketStart || c.Bucket >= d.BucketEnd {
			return Result{Err: kv.Errorf(kv.CodeInvalidArgument, "split bucket %d is outside shard %d", c.Bucket, d.ShardID)}, nil
		}
		child.BucketStart = c.Bucket
		d.BucketEnd = c.Bucket
	}
	if err := writeSpan(b, d); err != nil {
		return Result{}, err
	}
	s.desc = d
	s.recs.reload(d)
	s.txns.held = nil // the child resolves the intents it took, from storage
	if s.childHere != nil && s.childHere(child.ShardID) {
		return Result{Split: &SplitResult{Child: child, Existing: true}}, nil
	}
	if err := writeSpan(b, child); err != nil {
		return Result{}, err
	}
	s.gcView.Raise(child.ShardID, s.gcThreshold) // before the batch commits
	if err := storage.PutUint64(b, storage.ShardStateKey(child.ShardID, stateGCThreshold), s.gcThreshold); err != nil {
		return Result{}, err
	}
	if s.freedKnown {
		// The child's keys may have been freed here.
		if err := storage.PutUint64(b, storage.ShardStateKey(child.ShardID, stateFreedAbove), s.freedStored); err != nil {
			return Result{}, err
		}
	}
	if err := s.inheritPrepared(b, child); err != nil {
		return Result{}, err
	}
	return Result{Split: &SplitResult{Child: child, MaxVersion: s.maxVersion, GCThreshold: s.gcThreshold}}, nil
}

func writeSpan(b *pebble.Batch, d Desc) error {
	data, err := json.Marshal(persistedSpan{Start: d.Start, End: d.End, BucketStart: d.BucketStart, BucketEnd: d.BucketEnd})
	if err != nil {
		return err
	}
	return b.Set(storage.ShardStateKey(d.ShardID, stateSpan), data, nil)
}

// loadSpan applies a span a split persisted to desc.
func loadSpan(r pebble.Reader, desc Desc) (Desc, error) {
	v, ok, err := storage.GetValue(r, storage.ShardStateKey(desc.ShardID, stateSpan))
	if err != nil || !ok {
		return desc, err
	}
	var sp persistedSpan
	if err := json.Unmarshal(v, &sp); err != nil {
		return desc, err
	}
	desc.Start, desc.End, desc.BucketStart, desc.BucketEnd = sp.Start, sp.End, sp.BucketStart, sp.BucketEnd
	if len(desc.Start) == 0 {
		desc.Start = nil
	}
	return desc, nil
}

// WriteChildState writes into b the applied position and highest version
// a split child starts from (the replication layer's bootstrap position).
func WriteChildState(b *pebble.Batch, child uint64, index, term, maxVersion uint64) error {
	if err := b.Set(storage.ShardStateKey(child, stateApplied), binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, index), term), nil); err != nil {
		return err
	}
	return storage.PutUint64(b, storage.ShardStateKey(child, stateMaxVersion), maxVersion)
}

// MiddleKey returns the user key in the middle of a range shard's live and
// dead keys (by count of latest-version pointers), to split it at; nil
// when the shard holds fewer than two keys.
func MiddleKey(r pebble.Reader, d Desc) ([]byte, error) {
	if d.Partitioning != kv.PartitionRange {
		return nil, nil
	}
	start := storage.LatestKey(nil, d.Collection, d.Start)
	_, end := storage.LatestSpan(d.Collection)
	if d.End != nil {
		end = storage.LatestKey(nil, d.Collection, d.End)
	}
	count := 0
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: start, UpperBound: end})
	if err != nil {
		return nil, err
	}
	for valid := it.First(); valid; valid = it.Next() {
		count++
	}
	if err := it.Close(); err != nil {
		return nil, err
	}
	if count < 2 {
		return nil, nil
	}
	it, err = r.NewIter(&pebble.IterOptions{LowerBound: start, UpperBound: end})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	i := 0
	for valid := it.First(); valid; valid = it.Next() {
		if i == count/2 {
			return decodeCollectionKey(append([]byte(nil), it.Key()...), storage.LatestKey(nil, d.Collection, nil))
		}
		i++
	}
	return nil, it.Error()
}
