package shard

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/storage"
)

// Names of replicated shard state items (storage.ShardStateKey).
const (
	stateApplied     = "applied"      // index(8) term(8)
	stateMaxVersion  = "max_version"  // uint64
	stateGCThreshold = "gc_threshold" // uint64
)

// Names of catalog items (storage.CatalogKey), meta shard only.
const (
	catalogCollection     = "c/" // + name -> CollectionDesc
	catalogNextCollection = "next_collection"
	catalogNextShard      = "next_shard"
	catalogTSO            = "tso_hwm"
)

// Desc is what a shard replica knows of its own identity and span.
type Desc struct {
	ShardID uint64
	// Collection is 0 for the meta shard.
	Collection   uint32
	Partitioning kv.Partitioning
	BucketStart  uint32
	BucketEnd    uint32
	Start, End   []byte
}

// DescFor returns the Desc of shard s of collection c.
func DescFor(c *cluster.CollectionDesc, s cluster.ShardDesc) Desc {
	return Desc{ShardID: s.ID, Collection: c.ID, Partitioning: c.Partitioning,
		BucketStart: s.BucketStart, BucketEnd: s.BucketEnd, Start: s.Start, End: s.End}
}

// MetaDesc is the Desc of the meta shard.
var MetaDesc = Desc{ShardID: cluster.MetaShardID}

// IsMeta reports whether the shard is the meta shard.
func (d Desc) IsMeta() bool { return d.ShardID == cluster.MetaShardID }

// Owns reports whether the shard owns the key stored under bucket.
func (d Desc) Owns(bucket uint16, key []byte) bool {
	if d.IsMeta() {
		return false
	}
	if d.Partitioning == kv.PartitionRange {
		return bucket == 0 && bytes.Compare(key, d.Start) >= 0 && (d.End == nil || bytes.Compare(key, d.End) < 0)
	}
	return uint32(bucket) >= d.BucketStart && uint32(bucket) < d.BucketEnd
}

// DataSpan is the span of the shard's data keys.
func (d Desc) DataSpan() (start, end []byte) {
	if d.Partitioning == kv.PartitionRange {
		start = storage.DataKeyStart(d.Collection, 0, d.Start)
		if d.End == nil {
			_, end = storage.BucketSpan(d.Collection, 0, 1)
		} else {
			end = storage.DataKeyStart(d.Collection, 0, d.End)
		}
		return start, end
	}
	return storage.BucketSpan(d.Collection, d.BucketStart, d.BucketEnd)
}

// Result is the outcome of applying one command, handed to its proposer.
type Result struct {
	// Version is the version a write was applied at.
	Version uint64
	// Err is the deterministic refusal of the command (condition failed, not
	// found, not owned); nothing of the command was applied.
	Err *kv.Error
	// Desc is the created or dropped collection (catalog commands).
	Desc *cluster.CollectionDesc
}

// Shard is the state machine of one shard replica. It is not safe for
// concurrent use: the replication loop owns it. Its exported read-only
// accessors are safe to call from the owner only.
type Shard struct {
	desc Desc
	// applied is the index and term of the last applied entry.
	// Invariant: persisted in the same batch as the state it describes.
	applied, appliedTerm uint64
	// maxVersion is the highest version applied. Invariant: every write
	// applied after it has a greater version.
	maxVersion uint64
	// gcThreshold: versions below it may have been garbage-collected.
	gcThreshold uint64
	// tsoHWM is the TSO's persisted high-water mark (meta shard only).
	tsoHWM uint64

	scratch []byte
}

// Load returns the state machine of desc as persisted in r.
func Load(r pebble.Reader, desc Desc) (*Shard, error) {
	s := &Shard{desc: desc}
	v, ok, err := storage.GetValue(r, storage.ShardStateKey(desc.ShardID, stateApplied))
	if err != nil {
		return nil, err
	}
	if ok {
		if len(v) != 16 {
			return nil, fmt.Errorf("shard %d: corrupt applied state", desc.ShardID)
		}
		s.applied, s.appliedTerm = binary.BigEndian.Uint64(v), binary.BigEndian.Uint64(v[8:])
	}
	if s.maxVersion, err = storage.GetUint64(r, storage.ShardStateKey(desc.ShardID, stateMaxVersion)); err != nil {
		return nil, err
	}
	if s.gcThreshold, err = storage.GetUint64(r, storage.ShardStateKey(desc.ShardID, stateGCThreshold)); err != nil {
		return nil, err
	}
	if desc.IsMeta() {
		if s.tsoHWM, err = storage.GetUint64(r, storage.CatalogKey(catalogTSO)); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Desc returns the shard's descriptor.
func (s *Shard) Desc() Desc { return s.desc }

// Applied returns the index and term of the last applied entry.
func (s *Shard) Applied() (index, term uint64) { return s.applied, s.appliedTerm }

// MaxVersion returns the highest version applied.
func (s *Shard) MaxVersion() uint64 { return s.maxVersion }

// GCThreshold returns the version below which reads answer compacted.
func (s *Shard) GCThreshold() uint64 { return s.gcThreshold }

// TSOHighWater returns the persisted TSO high-water mark (meta shard).
func (s *Shard) TSOHighWater() uint64 { return s.tsoHWM }

// SetApplied records that the entry at index/term was applied without a
// command (an empty entry or a configuration change). It writes into b.
func (s *Shard) SetApplied(b *pebble.Batch, index, term uint64) error {
	s.applied, s.appliedTerm = index, term
	var buf [16]byte
	binary.BigEndian.PutUint64(buf[:], index)
	binary.BigEndian.PutUint64(buf[8:], term)
	return b.Set(storage.ShardStateKey(s.desc.ShardID, stateApplied), buf[:], nil)
}

// Apply applies the command of the committed entry at index/term, writing
// its effects and the new applied index into b, an indexed batch (reads
// through it see the effects of earlier commands of the same cycle). An error
// means the batch cannot be committed (a storage failure or a corrupt log);
// a refusal of the command itself is in Result.Err.
func (s *Shard) Apply(b *pebble.Batch, index, term uint64, data []byte) (Result, error) {
	if index != s.applied+1 {
		return Result{}, fmt.Errorf("shard %d: applying index %d after %d", s.desc.ShardID, index, s.applied)
	}
	cmd, err := DecodeCommand(data)
	if err != nil {
		return Result{}, fmt.Errorf("shard %d: entry %d: %w", s.desc.ShardID, index, err)
	}
	var res Result
	switch cmd.Kind {
	case KindWrite:
		res, err = s.applyWrite(b, cmd)
	case KindGC:
		err = s.applyGC(b, cmd.Threshold)
	case KindTSO:
		err = s.applyTSO(b, cmd.Threshold)
		res.Version = s.tsoHWM
	case KindCreateCollection:
		res, err = s.applyCreate(b, cmd)
	case KindDropCollection:
		res, err = s.applyDrop(b, cmd.Collection.Name)
	}
	if err != nil {
		return Result{}, err
	}
	return res, s.SetApplied(b, index, term)
}

func (s *Shard) applyWrite(b *pebble.Batch, cmd Command) (Result, error) {
	if s.desc.IsMeta() {
		return Result{Err: kv.Errorf(kv.CodeInternal, "write proposed to the meta shard")}, nil
	}
	if cmd.Version <= s.maxVersion {
		// A correct leader never proposes this; refusing keeps versions
		// monotonic even if one did.
		return Result{Err: kv.Errorf(kv.CodeUnavailable, "version %d is not above the shard's last version %d; retry", cmd.Version, s.maxVersion)}, nil
	}
	// Check every condition before writing anything: a write is atomic.
	for i := range cmd.Ops {
		op := &cmd.Ops[i]
		if !s.desc.Owns(op.Bucket, op.Key) {
			return Result{Err: kv.Errorf(kv.CodeUnavailable, "shard %d does not own key %q; retry", s.desc.ShardID, op.Key)}, nil
		}
		if !op.HasCond && !op.MustExist {
			continue
		}
		_, cur, found, err := ReadRecord(b, s.desc.Collection, op.Bucket, op.Key, Latest)
		if err != nil {
			return Result{}, err
		}
		curVersion := cur
		if !found {
			curVersion = 0
		}
		if op.HasCond && curVersion != op.CondVersion {
			if op.CondVersion == 0 {
				return Result{Err: kv.Errorf(kv.CodeConditionFailed, "key %q exists at version %d, the condition wants it absent", op.Key, curVersion)}, nil
			}
			if curVersion == 0 {
				return Result{Err: kv.Errorf(kv.CodeConditionFailed, "key %q is absent, the condition wants version %d", op.Key, op.CondVersion)}, nil
			}
			return Result{Err: kv.Errorf(kv.CodeConditionFailed, "key %q is at version %d, the condition wants version %d", op.Key, curVersion, op.CondVersion)}, nil
		}
		if op.MustExist && !found {
			return Result{Err: kv.Errorf(kv.CodeNotFound, "key %q not found", op.Key)}, nil
		}
	}
	for i := range cmd.Ops {
		op := &cmd.Ops[i]
		s.scratch = storage.DataKey(s.scratch[:0], s.desc.Collection, op.Bucket, op.Key, cmd.Version)
		key := s.scratch
		mv := storage.MVCCValue{Tombstone: op.Type == OpDelete, Tags: op.Tags, Value: op.Value}
		vb := storage.EncodeValue(make([]byte, 0, len(op.Value)+16), mv)
		if err := b.Set(key, vb, nil); err != nil {
			return Result{}, err
		}
	}
	s.maxVersion = cmd.Version
	if err := storage.PutUint64(b, storage.ShardStateKey(s.desc.ShardID, stateMaxVersion), s.maxVersion); err != nil {
		return Result{}, err
	}
	return Result{Version: cmd.Version}, nil
}

// applyGC drops, for every key, the versions that no read at or above
// threshold can see: everything below the newest version at or below
// threshold, and that version too when it is a tombstone.
func (s *Shard) applyGC(b *pebble.Batch, threshold uint64) error {
	if threshold <= s.gcThreshold || s.desc.IsMeta() {
		return nil
	}
	start, end := s.desc.DataSpan()
	it, err := b.NewIter(&pebble.IterOptions{LowerBound: start, UpperBound: end})
	if err != nil {
		return err
	}
	var (
		curKey   []byte
		keptOne  bool // the newest version <= threshold of curKey was seen
		toDelete [][]byte
	)
	for valid := it.First(); valid; valid = it.Next() {
		dk, err := storage.DecodeDataKey(it.Key())
		if err != nil {
			it.Close()
			return err
		}
		if curKey == nil || !bytes.Equal(dk.UserKey, curKey) {
			curKey = append(curKey[:0], dk.UserKey...)
			keptOne = false
		}
		if dk.Version > threshold {
			continue
		}
		if keptOne {
			toDelete = append(toDelete, append([]byte(nil), it.Key()...))
			continue
		}
		keptOne = true
		raw, err := it.ValueAndErr()
		if err != nil {
			it.Close()
			return err
		}
		if len(raw) > 0 && raw[0]&1 != 0 { // tombstone: nothing to keep
			toDelete = append(toDelete, append([]byte(nil), it.Key()...))
		}
	}
	if err := it.Close(); err != nil {
		return err
	}
	for _, k := range toDelete {
		if err := b.Delete(k, nil); err != nil {
			return err
		}
	}
	s.gcThreshold = threshold
	return storage.PutUint64(b, storage.ShardStateKey(s.desc.ShardID, stateGCThreshold), threshold)
}

func (s *Shard) applyTSO(b *pebble.Batch, hwm uint64) error {
	if !s.desc.IsMeta() || hwm <= s.tsoHWM {
		return nil
	}
	s.tsoHWM = hwm
	return storage.PutUint64(b, storage.CatalogKey(catalogTSO), hwm)
}

func (s *Shard) applyCreate(b *pebble.Batch, cmd Command) (Result, error) {
	if !s.desc.IsMeta() {
		return Result{Err: kv.Errorf(kv.CodeInternal, "catalog command proposed to shard %d", s.desc.ShardID)}, nil
	}
	opts := cmd.Collection
	if err := kv.ValidateCollectionOptions(&opts); err != nil {
		return Result{Err: kv.AsError(err)}, nil
	}
	key := storage.CatalogKey(catalogCollection + opts.Name)
	if _, ok, err := storage.GetValue(b, key); err != nil {
		return Result{}, err
	} else if ok {
		return Result{Err: kv.Errorf(kv.CodeAlreadyExists, "collection %q already exists", opts.Name)}, nil
	}
	nextColl, err := storage.GetUint64(b, storage.CatalogKey(catalogNextCollection))
	if err != nil {
		return Result{}, err
	}
	nextShard, err := storage.GetUint64(b, storage.CatalogKey(catalogNextShard))
	if err != nil {
		return Result{}, err
	}
	if nextColl == 0 {
		nextColl = 1
	}
	if nextShard == 0 {
		nextShard = cluster.MetaShardID + 1
	}
	if nextColl > 1<<32-1 {
		return Result{Err: kv.Errorf(kv.CodeInvalidArgument, "collection ids are exhausted")}, nil
	}
	desc := cluster.NewCollectionDesc(opts, uint32(nextColl), nextShard, cmd.Nodes)
	if err := b.Set(key, desc.Encode(), nil); err != nil {
		return Result{}, err
	}
	if err := storage.PutUint64(b, storage.CatalogKey(catalogNextCollection), nextColl+1); err != nil {
		return Result{}, err
	}
	if err := storage.PutUint64(b, storage.CatalogKey(catalogNextShard), nextShard+uint64(len(desc.Shards))); err != nil {
		return Result{}, err
	}
	return Result{Desc: desc}, nil
}

func (s *Shard) applyDrop(b *pebble.Batch, name string) (Result, error) {
	if !s.desc.IsMeta() {
		return Result{Err: kv.Errorf(kv.CodeInternal, "catalog command proposed to shard %d", s.desc.ShardID)}, nil
	}
	key := storage.CatalogKey(catalogCollection + name)
	v, ok, err := storage.GetValue(b, key)
	if err != nil {
		return Result{}, err
	}
	if !ok {
		return Result{Err: kv.Errorf(kv.CodeCollectionNotFound, "collection %q not found", name)}, nil
	}
	desc, err := cluster.DecodeCollectionDesc(v)
	if err != nil {
		return Result{}, err
	}
	if err := b.Delete(key, nil); err != nil {
		return Result{}, err
	}
	return Result{Desc: desc}, nil
}

// LoadCatalog reads every collection descriptor of the catalog in r.
func LoadCatalog(r pebble.Reader) ([]*cluster.CollectionDesc, error) {
	start, end := storage.CatalogSpan(catalogCollection)
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: start, UpperBound: end})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	var out []*cluster.CollectionDesc
	for valid := it.First(); valid; valid = it.Next() {
		d, err := cluster.DecodeCollectionDesc(it.Value())
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, it.Error()
}

// ErrShardRemoved is returned for operations on a shard whose replica has
// been removed from this node.
var ErrShardRemoved = errors.New("shard: replica removed")

// SetAppliedFor writes the applied index of a shard that has no state
// machine loaded yet (bootstrap).
func (s *Shard) SetAppliedFor(b *pebble.Batch, shardID, index, term uint64) error {
	s.desc.ShardID = shardID
	return s.SetApplied(b, index, term)
}

// ReadGCThreshold reads a shard's applied GC threshold from r.
func ReadGCThreshold(r pebble.Reader, shardID uint64) (uint64, error) {
	return storage.GetUint64(r, storage.ShardStateKey(shardID, stateGCThreshold))
}
