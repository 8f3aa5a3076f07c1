package shard

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/group"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/storage"
)

// Names of replicated shard state items (storage.ShardStateKey).
const (
	stateApplied     = "applied"      // index(8) term(8)
	stateMaxVersion  = "max_version"  // uint64
	stateGCThreshold = "gc_threshold" // uint64
	stateFreedAbove  = "freed_above"  // uint64 (Shard.FreedAbove)
)

// Names of catalog items (storage.CatalogKey), meta shard only.
const (
	catalogCollection     = "c/" // + name -> CollectionDesc
	catalogNextCollection = "next_collection"
	catalogNextShard      = "next_shard"
	catalogTSO            = "tso_hwm"
	catalogNode           = "n/" // + 16 hex digits of the node id -> NodeDesc
	catalogNextMeta       = "next_meta_replica"
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

// Span is the span of the collection's data keys that may hold the
// shard's records: all of the collection for hash and tag shards (their
// records interleave with other shards' in key order), the shard's key range
// for range shards.
func (d Desc) Span() (start, end []byte) {
	start, end = storage.CollectionSpan(d.Collection)
	if d.Partitioning == kv.PartitionRange {
		start = storage.DataKeyStart(d.Collection, d.Start)
		if d.End != nil {
			end = storage.DataKeyStart(d.Collection, d.End)
		}
	}
	return start, end
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
	// Count is the number of keys a delete-range deleted.
	Count int
	// Held is the key a group holds that made a delete-range answer
	// key_in_group.
	Held []byte
	// Node is the membership record a KindAddNode left.
	Node *cluster.NodeDesc
	// Txn is what a transaction command left.
	Txn *TxnResult
	// Resolved are the transactions a KindTxnResolveBatch resolved.
	Resolved []string
	// Split is what a KindSplitTrigger left.
	Split *SplitResult
	// Freeze is the frozen state a KindFreeze left; Merge what a
	// KindMergeTrigger left (merge.go).
	Freeze *FrozenState
	Merge  *MergeResult
	// Checksum is the replica's checksum of its state at a KindChecksum,
	// to be computed off the apply loop (checksum.go).
	Checksum *ChecksumJob
	// Group are the effects of a group record (group.go): Send and Reply
	// effects for the raft leader replica to act on.
	Group []group.Effect
	// GCNext is where the next chunk of a garbage collection done in
	// chunks (EncodeGCChunk) starts; nil once it is done.
	GCNext *GCChunk
	// TruncateLog is the raft log index up to which a KindTruncateLog lets
	// the replica drop its log.
	TruncateLog uint64
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
	// frozen is set once a freeze for a merge was applied: the shard
	// changes nothing more (merge.go).
	frozen *FrozenState
	// frozenInto is frozen.Into (0: not frozen), for readers outside the
	// apply loop. It is set when the freeze is applied, a little before
	// the batch that writes it is visible in the engine.
	frozenInto atomic.Uint64

	txns txnState

	// groups is the shard's Key Grouping state (group.go).
	groups groupState

	// freedAbove is FreedAbove; freedStored its stored value
	// (stateFreedAbove: replicated, the same on every replica), which
	// freedAbove may exceed on a replica that loaded a shard that yielded
	// keys before it was stored.
	freedAbove  atomic.Uint64
	freedStored uint64
	freedKnown  bool // freedStored is stored

	// childHere reports whether a replica of the given shard already runs
	// on this node (set by the replication layer): a split trigger applied
	// late then leaves that child's state alone (split.go).
	childHere func(shard uint64) bool

	// untagged: no key of the collection had a tag on this node when the
	// shard was loaded, and the shard has written none since (nor taken
	// in another shard's keys): a put of a key without a condition then
	// need not read the key's newest version for its tags (untaggedPut).
	// The flag only saves reads: a replica with it set writes what one
	// without it writes.
	untagged bool
	// latestCache, when set, is the node's cache of newest versions,
	// which the shard invalidates for every latest pointer it writes (or
	// deletes): at once; then, once the batch is committed (Committed),
	// it fills the cache with the version each write left (or invalidates
	// again, for a pointer deleted), in the order of latestDirty.
	latestCache *LatestCache
	latestDirty []latestWrite
	// gcView, when set, is the node's view of GC thresholds for readers,
	// raised with every threshold the shard writes (GCThresholds).
	gcView *GCThresholds
	// recs lists the transaction records written since the shard was
	// loaded (NoTxnRecord).
	recs txnRecords
	// blindWrite is the highest version at which the shard wrote keys
	// without first looking for their intents (delete ranges, group
	// writes) or took in keys whose history it does not know (Load, a
	// merge). Every other write refuses a key holding an intent, and
	// versions only grow, so the key of an intent prepared above
	// blindWrite holds no version above the prepare until the intent is
	// resolved (resolveNeedsLatest).
	blindWrite uint64

	scratch []byte
	// valueBuf holds the latest pointer writeVersion writes.
	valueBuf []byte
	// changes holds the change log entries written since the last
	// FinishBatch, not yet in the batch.
	changes *ChangeBuffer
	// dirty: applied or maxVersion changed since the last FinishBatch.
	dirty bool
}

// latest reads the newest version of key through the batch being applied
// (an indexed batch: its point lookups see the writes of earlier commands).
func (s *Shard) latest(b *pebble.Batch, key []byte) (storage.MVCCValue, uint64, bool, error) {
	return readLatest(b, s.desc.Collection, key)
}

// EndBatch releases what the shard holds of the batch it applied into; the
// caller calls it before closing a batch it does not commit. The change
// log entries held for it are dropped, and the versions the batch wrote
// are not filled into the cache of newest versions: their keys are only
// invalidated again at the next Committed (once more is harmless).
func (s *Shard) EndBatch() {
	s.changes.reset()
	for i := range s.latestDirty {
		s.latestDirty[i].encoded = nil
	}
}

// SetChangeBuffer makes the shard keep its change log entries in c, which
// the other shards applying into the same batches share.
func (s *Shard) SetChangeBuffer(c *ChangeBuffer) { s.changes = c }

// SetLatestCache makes the shard invalidate c's keys as it writes their
// latest pointers (see LatestCache).
func (s *Shard) SetLatestCache(c *LatestCache) { s.latestCache = c }

// SetGCThresholds publishes the shard's GC threshold in t, and makes the
// shard raise it there as it raises its own.
func (s *Shard) SetGCThresholds(t *GCThresholds) {
	s.gcView = t
	t.Loaded(s.desc.ShardID, s.gcThreshold)
}

// latestWrite is a latest pointer written into the batch being applied:
// the key, and the version and encoded value it now points to (encoded
// nil for a pointer deleted, or a value too large to cache).
type latestWrite struct {
	key     string
	version uint64
	encoded []byte
}

// latestWritten marks key's cached newest version pending, and
// invalidates it once the batch is committed.
func (s *Shard) latestWritten(key []byte) {
	if s.latestCache == nil {
		return
	}
	s.latestCache.pend(s.desc.Collection, key)
	s.latestDirty = append(s.latestDirty, latestWrite{key: string(key)})
}

// latestSet marks key's cached newest version pending now, and once the
// batch is committed fills the cache with version, whose encoded value
// the batch wrote: the next read of the key (often the next operation
// on a hot key) finds it there.
func (s *Shard) latestSet(key []byte, version uint64, encoded []byte) {
	if s.latestCache == nil {
		return
	}
	s.latestCache.pend(s.desc.Collection, key)
	w := latestWrite{key: string(key), version: version}
	if len(encoded) <= maxCachedValue+64 {
		w.encoded = slices.Clone(encoded)
	}
	s.latestDirty = append(s.latestDirty, w)
}

// Load returns the state machine of desc as persisted in r.
func Load(r pebble.Reader, desc Desc) (*Shard, error) {
	desc, err := loadSpan(r, desc)
	if err != nil {
		return nil, fmt.Errorf("shard %d: corrupt span: %w", desc.ShardID, err)
	}
	s := &Shard{desc: desc, changes: &ChangeBuffer{}}
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
	s.blindWrite = s.maxVersion
	s.recs.reload(desc)
	if err := s.loadPrepared(r); err != nil {
		return nil, err
	}
	if err := s.loadGroups(r); err != nil {
		return nil, err
	}
	freed, ok, err := readFreedAbove(r, desc.ShardID)
	switch {
	case err != nil:
		return nil, err
	case ok:
		s.freedStored, s.freedKnown = freed, true
		s.freedAbove.Store(freed)
	case s.groups.follower.LastYield() > 0:
		// Yielded keys, and freed them before FreedAbove was stored:
		// any free may have been at the highest version applied.
		s.freedAbove.Store(s.maxVersion)
	}
	if desc.IsMeta() {
		if s.tsoHWM, err = storage.GetUint64(r, storage.CatalogKey(catalogTSO)); err != nil {
			return nil, err
		}
	}
	if s.frozen, err = ReadFrozen(r, desc.ShardID); err != nil {
		return nil, fmt.Errorf("shard %d: corrupt frozen state: %w", desc.ShardID, err)
	}
	if s.frozen != nil {
		s.frozenInto.Store(s.frozen.Into)
	}
	if !desc.IsMeta() {
		if s.untagged, err = noTagIndex(r, desc.Collection); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// noTagIndex reports whether r holds no tag index entry of collection.
func noTagIndex(r pebble.Reader, collection uint32) (bool, error) {
	start, end := storage.TagIndexSpan(collection)
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: start, UpperBound: end})
	if err != nil {
		return false, err
	}
	empty := !it.First()
	if err := it.Close(); err != nil {
		return false, err
	}
	return empty, nil
}

// untaggedPut reports whether op, a put, reads the key's newest version
// only for its tags, and the shard knows the key has none (untagged).
func (s *Shard) untaggedPut(op *Op) bool {
	return s.untagged && op.Type == OpPut && !op.HasCond && !op.MustExist && s.desc.Partitioning != kv.PartitionTag
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
// command (an empty entry or a configuration change). Like Apply, it is
// persisted into the batch by FinishBatch.
func (s *Shard) SetApplied(b *pebble.Batch, index, term uint64) error {
	s.applied, s.appliedTerm = index, term
	s.dirty = true
	return nil
}

// FinishBatch writes into b the change log entries still held
// (ChangeBuffer), the applied index and the highest version of the
// entries applied into it since the last FinishBatch. The caller calls
// it, for every shard that applied entries into b, before committing b:
// then the applied index is persisted in the same batch as the state it
// describes.
func (s *Shard) FinishBatch(b *pebble.Batch) error {
	if err := s.changes.write(b); err != nil {
		return err
	}
	if !s.dirty {
		return nil
	}
	s.dirty = false
	var buf [16]byte
	binary.BigEndian.PutUint64(buf[:], s.applied)
	binary.BigEndian.PutUint64(buf[8:], s.appliedTerm)
	if err := b.Set(storage.ShardStateKey(s.desc.ShardID, stateApplied), buf[:], nil); err != nil {
		return err
	}
	if s.desc.IsMeta() {
		return nil
	}
	return storage.PutUint64(b, storage.ShardStateKey(s.desc.ShardID, stateMaxVersion), s.maxVersion)
}

// Apply applies the command of the committed entry at index/term, writing
// its effects into b, an indexed batch (FinishBatch adds the new applied
// index before b is committed; reads
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
	if !defersChanges(cmd.Kind) {
		if err := s.changes.write(b); err != nil {
			return Result{}, err
		}
	}
	var res Result
	if s.frozen != nil {
		switch cmd.Kind {
		case KindWrite, KindDeleteRange, KindPlace, KindSplitTrigger, KindMergeTrigger, KindTxnPrepare, KindTxnForget, KindTxnRecord, KindTxnResolve, KindTxnResolveBatch:
			return s.frozenRefusal(), s.SetApplied(b, index, term)
		case KindGC, KindGCChunk:
			return Result{}, s.SetApplied(b, index, term)
		}
	}
	switch cmd.Kind {
	case KindWrite:
		res, err = s.applyWrite(b, cmd)
	case KindGC, KindGCChunk:
		res.GCNext, err = s.applyGC(b, cmd.Threshold, cmd.GC)
	case KindTSO:
		err = s.applyTSO(b, cmd.Threshold)
		res.Version = s.tsoHWM
	case KindCreateCollection:
		res, err = s.applyCreate(b, cmd)
	case KindDropCollection:
		res, err = s.applyDrop(b, cmd.Collection.Name)
	case KindDeleteRange:
		res, err = s.applyDeleteRange(b, cmd)
	case KindPlace:
		res, err = s.applyPlace(b, cmd.Place)
	case KindMoveReplicas, KindMoveShardReplica:
		res, err = s.applyMove(b, cmd.Move)
	case KindSetDraining:
		res, err = s.applyDrain(b, cmd.Drain)
	case KindSetPreferred:
		res, err = s.applyPrefer(b, cmd.Prefer)
	case KindSplitShard:
		res, err = s.applySplitShard(b, cmd.Split)
	case KindSplitTrigger:
		res, err = s.applySplitTrigger(b, cmd.Split)
	case KindMergeShards:
		res, err = s.applyMergeShards(b, cmd.Merge)
	case KindFreeze:
		res, err = s.applyFreeze(b, index, cmd)
	case KindMergeTrigger:
		res, err = s.applyMergeTrigger(b, cmd.Merge)
	case KindAddNode:
		res, err = s.applyAddNode(b, cmd)
	case KindChecksum:
		res.Checksum = s.applyChecksum(b, index, cmd.ChecksumID)
	case KindTruncateLog:
		res.TruncateLog = cmd.LogIndex
	case KindTxnRecord:
		res, err = s.applyTxnRecord(b, cmd.TxnRecord)
	case KindTxnPrepare:
		res, err = s.applyTxnPrepare(b, cmd.Version, term, cmd.TxnPrepare)
	case KindTxnResolve:
		res, err = s.applyTxnResolve(b, cmd.Version, cmd.TxnResolve)
	case KindTxnResolveBatch:
		res, err = s.applyTxnResolveBatch(b, cmd.Version, cmd.TxnResolves)
	case KindTxnForget:
		res, err = s.applyTxnForget(b, cmd.TxnForget)
	case KindGroup, KindGroupWrite, KindGroupBatch, KindGroupWriteBatch:
		res, err = s.applyGroup(b, index, cmd.Kind, cmd.GroupBody)
	}
	if err != nil {
		return Result{}, err
	}
	return res, s.SetApplied(b, index, term)
}

// checkVersion refuses a write whose version is not above every version the
// shard applied. A correct leader never proposes one; refusing keeps versions
// monotonic even if one did.
func (s *Shard) checkVersion(v uint64) *kv.Error {
	if s.desc.IsMeta() {
		return kv.Errorf(kv.CodeInternal, "write proposed to the meta shard")
	}
	if v <= s.maxVersion {
		return kv.Errorf(kv.CodeUnavailable, "version %d is not above the shard's last version %d; retry", v, s.maxVersion)
	}
	return nil
}

func (s *Shard) setMaxVersion(b *pebble.Batch, v uint64) error {
	s.maxVersion = v
	s.dirty = true
	return nil
}

func (s *Shard) applyWrite(b *pebble.Batch, cmd Command) (Result, error) {
	if err := s.checkVersion(cmd.Version); err != nil {
		return Result{Err: err}, nil
	}
	// Check every op before writing anything: a write is atomic.
	cur := make([]storage.MVCCValue, len(cmd.Ops))
	found := make([]bool, len(cmd.Ops))
	seen := make(map[string]struct{}, len(cmd.Ops))
	for i := range cmd.Ops {
		op := &cmd.Ops[i]
		if !s.desc.Owns(op.Bucket, op.Key) {
			return Result{Err: kv.Errorf(kv.CodeUnavailable, "shard %d does not own key %q; retry", s.desc.ShardID, op.Key)}, nil
		}
		if y, ok := s.inGroup(op.Key); ok {
			return Result{Err: keyInGroupError(op.Key, y)}, nil
		}
		if _, dup := seen[string(op.Key)]; dup {
			return Result{Err: kv.Errorf(kv.CodeInvalidArgument, "key %q appears twice in one write", op.Key)}, nil
		}
		seen[string(op.Key)] = struct{}{}
		if s.txns.mayHold(op.Key) {
			// The leader's locks keep plain writes off keys of prepared
			// transactions; this holds even if they did not.
			if _, ok, err := ReadIntent(b, s.desc.Collection, op.Key); err != nil {
				return Result{}, err
			} else if ok {
				return Result{Err: kv.Errorf(kv.CodeUnavailable, "key %q holds an intent of a prepared transaction; retry", op.Key)}, nil
			}
		}
		if s.untaggedPut(op) {
			continue // nothing to check, no tags to replace
		}
		val, version, ok, err := s.latest(b, op.Key)
		if err != nil {
			return Result{}, err
		}
		cur[i], found[i] = val, ok
		curVersion := version
		if !ok {
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
		if op.MustExist && !ok {
			return Result{Err: kv.Errorf(kv.CodeNotFound, "key %q not found", op.Key)}, nil
		}
		if op.Type == OpPut && ok && s.desc.Partitioning == kv.PartitionTag && val.Bucket != op.Bucket {
			return Result{Err: kv.Errorf(kv.CodePlacementTagChanged, "key %q was placed by another placement tag; delete it before placing it by a new one", op.Key)}, nil
		}
	}
	for i := range cmd.Ops {
		op := &cmd.Ops[i]
		var oldTags []string
		if found[i] {
			oldTags = cur[i].Tags
		}
		if op.Type == OpDelete && !found[i] {
			continue // deleting an absent key changes nothing
		}
		if err := s.writeVersion(b, op.Key, op.Bucket, cmd.Version, op.Type == OpDelete, op.Tags, op.Value, oldTags); err != nil {
			return Result{}, err
		}
	}
	if err := s.setMaxVersion(b, cmd.Version); err != nil {
		return Result{}, err
	}
	return Result{Version: cmd.Version}, nil
}

// writeVersion writes one version of a record with its tag index and change
// log entries. oldTags are the tags of the key's live version, if any.
func (s *Shard) writeVersion(b *pebble.Batch, key []byte, bucket uint16, version uint64, tombstone bool, tags []string, value []byte, oldTags []string) error {
	return s.writeVersionLogged(b, key, bucket, version, version, tombstone, tags, value, oldTags)
}

// writeVersionLogged is writeVersion with the write's change log entry at
// logged, not at version: a Key Group's write, stored at the version its
// group committed it, logged at the version of the record that stores it
// (a watcher may have passed the first).
func (s *Shard) writeVersionLogged(b *pebble.Batch, key []byte, bucket uint16, version, logged uint64, tombstone bool, tags []string, value []byte, oldTags []string) error {
	coll := s.desc.Collection
	s.scratch = storage.DataKey(s.scratch[:0], coll, key, version)
	mv := storage.MVCCValue{Tombstone: tombstone, Bucket: bucket, Tags: tags, Value: value}
	if tombstone {
		mv.Tags, mv.Value = nil, nil
	}
	if len(mv.Tags) > 0 {
		s.untagged = false
	}
	// The pointer carries the encoded value after its version and bucket;
	// the value is encoded once, into the pointer's buffer. (Set copies.)
	s.valueBuf = storage.EncodeLatest(s.valueBuf[:0], version, bucket, nil)
	s.valueBuf = storage.EncodeValue(s.valueBuf, mv)
	ptr := s.valueBuf
	if err := b.Set(s.scratch, ptr[10:], nil); err != nil {
		return err
	}
	s.scratch = storage.LatestKey(s.scratch[:0], coll, key)
	if err := b.Set(s.scratch, ptr, nil); err != nil {
		return err
	}
	s.latestSet(key, version, ptr[10:])
	// Tag index: an entry for every tag added, a removal for every tag gone.
	for _, t := range mv.Tags {
		if !contains(oldTags, t) {
			s.scratch = storage.TagIndexKey(s.scratch[:0], coll, t, key, version)
			if err := b.Set(s.scratch, tagEntry(true, bucket), nil); err != nil {
				return err
			}
		}
	}
	for _, t := range oldTags {
		if !contains(mv.Tags, t) {
			s.scratch = storage.TagIndexKey(s.scratch[:0], coll, t, key, version)
			if err := b.Set(s.scratch, tagEntry(false, bucket), nil); err != nil {
				return err
			}
		}
	}
	s.changes.add(coll, logged, key, bucket)
	return nil
}

// ChangeBuffer holds the change log entries of the batch being applied
// until FinishBatch (or a command that may read the change log) writes
// them into it, one after the other. Written in version order, together,
// each lands next to the one before in Pebble's memtable, where the
// inserter's cached position finds its place at once; interleaved with
// each write's data key and latest pointer, as they were, each cost a
// search from the top of the memtable's skiplist.
//
// The shards that apply into one batch share one buffer
// (SetChangeBuffer), so that a command that reads or replaces the change
// log, in whichever shard, finds every entry written before it in the
// batch. It belongs to the loop that applies; a shard loaded alone has
// its own.
type ChangeBuffer struct {
	keys []byte // the entries' keys, one after the other
	ends []int  // where each key ends in keys
	vals []byte // the entries' values, 2 bytes each (the bucket)
}

func (p *ChangeBuffer) add(coll uint32, version uint64, key []byte, bucket uint16) {
	p.keys = storage.ChangeKey(p.keys, coll, version, key)
	p.ends = append(p.ends, len(p.keys))
	p.vals = append(p.vals, byte(bucket>>8), byte(bucket))
}

// write writes the pending entries into b, in the order they were added.
// (A Shard not loaded, which only writes its applied index, has no
// buffer.)
func (p *ChangeBuffer) write(b *pebble.Batch) error {
	if p == nil {
		return nil
	}
	start := 0
	for i, end := range p.ends {
		if err := b.Set(p.keys[start:end], p.vals[2*i:2*i+2], nil); err != nil {
			return err
		}
		start = end
	}
	p.reset()
	return nil
}

func (p *ChangeBuffer) reset() {
	if p == nil {
		return
	}
	p.keys, p.ends, p.vals = p.keys[:0], p.ends[:0], p.vals[:0]
}

// defersChanges reports whether a command of kind k neither reads the
// change log nor replaces the shard's keys wholesale, so that the change
// log entries of the commands before it may wait for FinishBatch.
func defersChanges(k CommandKind) bool {
	switch k {
	case KindWrite, KindTSO, KindTxnRecord, KindTxnPrepare, KindTxnResolve, KindTxnResolveBatch, KindTxnForget, KindTruncateLog:
		return true
	}
	return false
}

func contains(tags []string, t string) bool {
	for _, u := range tags {
		if u == t {
			return true
		}
	}
	return false
}

// applyDeleteRange writes a tombstone, at the command's version, for every
// live key of [cmd.Start, cmd.End) owned by the shard.
func (s *Shard) applyDeleteRange(b *pebble.Batch, cmd Command) (Result, error) {
	if err := s.checkVersion(cmd.Version); err != nil {
		return Result{Err: err}, nil
	}
	type victim struct {
		key    []byte
		bucket uint16
		tags   []string
	}
	var victims []victim
	start, end := cmd.Start, cmd.End
	if len(end) == 0 {
		end = nil
	}
	if k, y, ok := s.groupHolds(start, end); ok {
		return Result{Err: keyInGroupError(k, y), Held: k}, nil
	}
	if s.desc.Partitioning == kv.PartitionRange {
		if bytes.Compare(start, s.desc.Start) < 0 {
			start = s.desc.Start
		}
		if s.desc.End != nil && (end == nil || bytes.Compare(end, s.desc.End) > 0) {
			end = s.desc.End
		}
		if end != nil && bytes.Compare(start, end) >= 0 {
			return Result{Version: cmd.Version}, s.setMaxVersion(b, cmd.Version)
		}
	}
	err := Scan(b, ScanOptions{Collection: s.desc.Collection, Start: start, End: end, AsOf: Latest,
		Owned: func(bucket uint16) bool { return s.desc.Partitioning == kv.PartitionRange || s.desc.OwnsBucket(bucket) }},
		func(r ScanRecord) bool {
			victims = append(victims, victim{append([]byte(nil), r.Key...), r.Bucket, append([]string(nil), r.Tags...)})
			return true
		})
	if err != nil {
		return Result{}, err
	}
	s.blindWrite = cmd.Version
	for _, v := range victims {
		if err := s.writeVersion(b, v.key, v.bucket, cmd.Version, true, nil, nil, v.tags); err != nil {
			return Result{}, err
		}
	}
	if err := s.setMaxVersion(b, cmd.Version); err != nil {
		return Result{}, err
	}
	return Result{Version: cmd.Version, Count: len(victims)}, nil
}

// applyPlace changes the placement tag of a key homed in this shard if its
// current placement is the expected one.
func (s *Shard) applyPlace(b *pebble.Batch, p Placement) (Result, error) {
	if s.desc.IsMeta() || s.desc.Partitioning != kv.PartitionTag || !s.desc.OwnsBucket(p.Bucket) {
		return Result{Err: kv.Errorf(kv.CodeUnavailable, "shard %d is not the home of key %q; retry", s.desc.ShardID, p.Key)}, nil
	}
	key := storage.PlacementKey(s.desc.Collection, p.Key)
	raw, ok, err := storage.GetValue(b, key)
	if err != nil {
		return Result{}, err
	}
	cur, pin := splitPlacement(raw)
	if p.Op == PlaceUnpin {
		if !ok || pin != p.Pin {
			return Result{}, nil // not pinned by it (any more)
		}
		return Result{}, b.Set(key, []byte(cur), nil)
	}
	if ok != p.HasOld || ok && cur != p.Old {
		return Result{Err: kv.Errorf(kv.CodeConditionFailed, "the placement of key %q changed concurrently; retry", p.Key)}, nil
	}
	if pin != "" && pin != p.Pin {
		return Result{Err: kv.Errorf(kv.CodeKeyInGroup, "key %q belongs to a group (%s): its placement stays until the group is deleted", p.Key, pin)}, nil
	}
	switch p.Op {
	case PlacePin:
		if ok && p.New != cur {
			return Result{Err: kv.Errorf(kv.CodeInvalidArgument, "a pin keeps the placement of key %q (%q), it cannot move it to %q", p.Key, cur, p.New)}, nil
		}
		return Result{}, b.Set(key, joinPlacement(p.New, p.Pin), nil)
	case PlaceSet:
		return Result{}, b.Set(key, []byte(p.New), nil)
	}
	return Result{}, fmt.Errorf("%w: placement op %d", ErrCorruptCommand, p.Op)
}

// A placement entry's value is the placement tag, then, while a Key Group
// holds the key, a zero byte and the group's pin (tags hold no control
// characters).
func splitPlacement(raw []byte) (tag, pin string) {
	if i := bytes.IndexByte(raw, 0); i >= 0 {
		return string(raw[:i]), string(raw[i+1:])
	}
	return string(raw), ""
}

func joinPlacement(tag, pin string) []byte {
	return append(append([]byte(tag), 0), pin...)
}

// ReadPlacement reads the placement tag of key in a tag collection.
func ReadPlacement(r pebble.Reader, collection uint32, key []byte) (tag string, ok bool, err error) {
	tag, _, ok, err = ReadPlacementPin(r, collection, key)
	return tag, ok, err
}

// ReadPlacementPin reads the placement tag of key in a tag collection and
// the pin of the Key Group holding it ("": none).
func ReadPlacementPin(r pebble.Reader, collection uint32, key []byte) (tag, pin string, ok bool, err error) {
	v, ok, err := storage.GetValue(r, storage.PlacementKey(collection, key))
	if err != nil || !ok {
		return "", "", ok, err
	}
	tag, pin = splitPlacement(v)
	return tag, pin, true, nil
}

// OwnsBucket reports whether a hash or tag shard owns bucket.
func (d Desc) OwnsBucket(bucket uint16) bool {
	return uint32(bucket) >= d.BucketStart && uint32(bucket) < d.BucketEnd
}

// owns reports whether the shard owns a stored version with bucket and key.
func (d Desc) ownsStored(bucket uint16, key []byte) bool {
	if d.Partitioning == kv.PartitionRange {
		return bytes.Compare(key, d.Start) >= 0 && (d.End == nil || bytes.Compare(key, d.End) < 0)
	}
	return d.OwnsBucket(bucket)
}

// GC phases (GCChunk.Phase).
const (
	gcPhaseData uint8 = iota
	gcPhaseTags
	gcPhaseChanges
)

// applyGC drops, for every key, the versions that no read at or above
// threshold can see: everything below the newest version at or below
// threshold, and that version too when it is a tombstone. It does the same
// for tag index entries, and drops change log entries below threshold.
//
// With chunk nil it does all of it. Else it does chunk's part: about
// chunk.Limit entries visited from chunk's phase and key (whole keys: a
// key's versions are never split between chunks), and answers where the
// next chunk starts, nil once the collection is done, so that no Apply
// walks a whole large shard while the others' entries wait. The first
// chunk (no key) raises the shard's GC threshold before it drops
// anything, so that no read below the threshold meets a collection half
// done; later chunks of the same threshold go on with it.
func (s *Shard) applyGC(b *pebble.Batch, threshold uint64, chunk *GCChunk) (*GCChunk, error) {
	if s.desc.IsMeta() || threshold == 0 {
		return nil, nil
	}
	var limit uint64
	phase, from := gcPhaseData, []byte(nil)
	if chunk != nil {
		limit, phase, from = chunk.Limit, chunk.Phase, chunk.Key
	}
	if len(from) == 0 {
		if threshold <= s.gcThreshold {
			return nil, nil
		}
		s.gcThreshold = threshold
		s.gcView.Raise(s.desc.ShardID, threshold) // before the batch commits
		if err := storage.PutUint64(b, storage.ShardStateKey(s.desc.ShardID, stateGCThreshold), threshold); err != nil {
			return nil, err
		}
		// Every version, tag index entry and tombstone is written with a
		// change log entry at its version (writeVersion), which GC drops
		// only below its threshold: when the collection's change log has
		// nothing at or below threshold, no write the earlier collections
		// left can be shadowed or dead at threshold, and there is nothing
		// to walk (a shard written only within the retention window).
		lo, hi := storage.ChangeSpan(s.desc.Collection, 0, threshold)
		it, err := b.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
		if err != nil {
			return nil, err
		}
		collectable := it.First()
		if err := it.Close(); err != nil {
			return nil, err
		}
		if !collectable {
			return nil, nil
		}
	} else if threshold > s.gcThreshold {
		// The chunk that raised the threshold is not in this replica's
		// state (it cannot be: it precedes this one in the log, and a
		// snapshot carries the threshold); collect nothing.
		return nil, nil
	}
	var toDelete [][]byte
	var visited uint64
	var next []byte
	var err error
	for ; phase <= gcPhaseChanges && next == nil && err == nil; phase, from = phase+1, nil {
		switch phase {
		case gcPhaseData:
			start, end := s.desc.Span()
			dropLatest := func(k []byte) {
				if dk, err := storage.DecodeDataKey(k); err == nil {
					toDelete = append(toDelete, storage.LatestKey(nil, s.desc.Collection, dk.UserKey))
					s.latestWritten(dk.UserKey)
				}
			}
			next, err = s.gcVersions(b, maxKey(start, from), end, threshold, dropLatest, func(k, raw []byte) (prefix []byte, owned, dead bool, err error) {
				dk, err := storage.DecodeDataKey(k)
				if err != nil {
					return nil, false, false, err
				}
				bucket, err := storage.ValueBucket(raw)
				if err != nil {
					return nil, false, false, err
				}
				return k[:len(k)-8], s.desc.ownsStored(bucket, dk.UserKey), storage.IsTombstone(raw), nil
			}, &toDelete, limit, &visited)
		case gcPhaseTags:
			start, end := storage.TagIndexSpan(s.desc.Collection)
			next, err = s.gcVersions(b, maxKey(start, from), end, threshold, nil, func(k, raw []byte) (prefix []byte, owned, dead bool, err error) {
				_, _, key, _, err := storage.DecodeTagIndexKey(k)
				if err != nil {
					return nil, false, false, err
				}
				return k[:len(k)-8], s.desc.ownsStored(tagEntryBucket(raw), key), !tagEntryPresent(raw), nil
			}, &toDelete, limit, &visited)
		case gcPhaseChanges:
			next, err = s.gcChanges(b, from, threshold, &toDelete, limit, &visited)
		}
	}
	if err != nil {
		return nil, err
	}
	for _, k := range toDelete {
		if err := b.Delete(k, nil); err != nil {
			return nil, err
		}
	}
	if next == nil {
		return nil, nil
	}
	return &GCChunk{Phase: phase - 1, Key: next, Limit: limit}, nil
}

// maxKey answers the greater of a and b (nil is the least).
func maxKey(a, b []byte) []byte {
	if bytes.Compare(a, b) < 0 {
		return b
	}
	return a
}

// gcChanges collects the change log entries below threshold the shard
// owns, from key from (nil: the first), counting each entry visited in
// *visited; past limit (0: none) it stops and answers the key to go on
// from.
func (s *Shard) gcChanges(b *pebble.Batch, from []byte, threshold uint64, out *[][]byte, limit uint64, visited *uint64) ([]byte, error) {
	lower, upper := storage.ChangeSpan(s.desc.Collection, 0, threshold-1)
	it, err := b.NewIter(&pebble.IterOptions{LowerBound: maxKey(lower, from), UpperBound: upper})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	for valid := it.First(); valid; valid = it.Next() {
		if limit > 0 && *visited >= limit {
			return bytes.Clone(it.Key()), nil
		}
		*visited++
		_, _, key, err := storage.DecodeChangeKey(it.Key())
		if err != nil {
			return nil, err
		}
		raw := it.Value()
		var bucket uint16
		if len(raw) == 2 {
			bucket = uint16(raw[0])<<8 | uint16(raw[1])
		}
		if s.desc.ownsStored(bucket, key) {
			*out = append(*out, bytes.Clone(it.Key()))
		}
	}
	return nil, it.Error()
}

// gcVersions walks versioned entries (prefix + ^version, newest first per
// prefix) in [start, end) and collects the ones GC drops. dropNewest, when
// set, is called for a prefix whose newest version is dropped (nothing of
// it is left). It counts each entry visited in *visited; past limit (0:
// none) it stops before a new prefix and answers its first key, to go on
// from.
func (s *Shard) gcVersions(b *pebble.Batch, start, end []byte, threshold uint64, dropNewest func(k []byte),
	classify func(k, raw []byte) (prefix []byte, owned, dead bool, err error), out *[][]byte, limit uint64, visited *uint64) ([]byte, error) {
	it, err := b.NewIter(&pebble.IterOptions{LowerBound: start, UpperBound: end})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	var (
		cur     []byte
		keptOne bool // the newest owned version <= threshold of cur was seen
	)
	for valid := it.First(); valid; valid = it.Next() {
		k := it.Key()
		if len(k) < 8 {
			return nil, storage.ErrCorruptKey
		}
		version := ^binary.BigEndian.Uint64(k[len(k)-8:])
		raw, err := it.ValueAndErr()
		if err != nil {
			return nil, err
		}
		prefix, owned, dead, err := classify(k, raw)
		if err != nil {
			return nil, err
		}
		newest := false
		if cur == nil || !bytes.Equal(prefix, cur) {
			if limit > 0 && *visited >= limit {
				return bytes.Clone(k), nil
			}
			cur = append(cur[:0], prefix...)
			keptOne = false
			newest = true
		}
		*visited++
		if !owned || version > threshold {
			continue
		}
		// A tombstone at exactly the threshold stays: a watcher resuming
		// from threshold-1 still reads the delete it records.
		if keptOne || dead && version < threshold {
			*out = append(*out, append([]byte(nil), k...))
			if newest && dropNewest != nil {
				dropNewest(k)
			}
		}
		keptOne = true
	}
	return nil, it.Error()
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
	if len(cmd.Nodes) == 0 {
		return Result{Err: kv.Errorf(kv.CodeUnavailable, "no node to place the collection on")}, nil
	}
	if opts.Replicas > len(cmd.Nodes) {
		return Result{Err: kv.Errorf(kv.CodeInvalidArgument, "replicas is %d but the cluster has %d nodes", opts.Replicas, len(cmd.Nodes))}, nil
	}
	// Each shard goes to the nodes holding the fewest replicas of every
	// collection, counted from the catalog as this entry applies.
	catalog, err := LoadCatalog(b)
	if err != nil {
		return Result{}, err
	}
	desc := cluster.NewCollectionDesc(opts, uint32(nextColl), nextShard, cmd.Nodes, cluster.CatalogLoad(catalog))
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

func (s *Shard) applyAddNode(b *pebble.Batch, cmd Command) (Result, error) {
	if !s.desc.IsMeta() {
		return Result{Err: kv.Errorf(kv.CodeInternal, "membership command proposed to shard %d", s.desc.ShardID)}, nil
	}
	in := cmd.Node
	if in.ID == 0 || in.Addr == "" || in.PeerAddr == "" {
		return Result{Err: kv.Errorf(kv.CodeInvalidArgument, "a node needs an id, an address and a peer address")}, nil
	}
	nodes, err := LoadNodes(b)
	if err != nil {
		return Result{}, err
	}
	rec, known := in, false
	for _, n := range nodes {
		if n.ID == in.ID {
			rec, known = n, true
			rec.Addr, rec.PeerAddr = in.Addr, in.PeerAddr
		}
	}
	if cmd.Rejoin && known {
		// Back with an empty disk: every replica it held is replaced by
		// a new one with a new raft id.
		rec.MetaReplica = 0
		if err := s.renewReplicas(b, rec.ID); err != nil {
			return Result{}, err
		}
	}
	if cmd.AssignMeta && rec.MetaReplica == 0 {
		next, err := storage.GetUint64(b, storage.CatalogKey(catalogNextMeta))
		if err != nil {
			return Result{}, err
		}
		if next == 0 {
			next = 2 // replica 1 is the first node's, from bootstrap
		}
		rec.MetaReplica = next
		if err := storage.PutUint64(b, storage.CatalogKey(catalogNextMeta), next+1); err != nil {
			return Result{}, err
		}
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return Result{}, err
	}
	if err := b.Set(storage.CatalogKey(fmt.Sprintf("%s%016x", catalogNode, rec.ID)), data, nil); err != nil {
		return Result{}, err
	}
	return Result{Node: &rec}, nil
}

// renewReplicas gives every replica of node a new raft id (joining) in
// every collection's descriptor.
func (s *Shard) renewReplicas(b *pebble.Batch, node uint64) error {
	colls, err := LoadCatalog(b)
	if err != nil {
		return err
	}
	for _, c := range colls {
		changed := false
		for i := range c.Shards {
			changed = c.Shards[i].RenewReplica(node) || changed
		}
		if changed {
			if err := b.Set(storage.CatalogKey(catalogCollection+c.Name), c.Encode(), nil); err != nil {
				return err
			}
		}
	}
	return nil
}

// LoadNodes reads every membership record in r, by node id.
func LoadNodes(r pebble.Reader) ([]cluster.NodeDesc, error) {
	start, end := storage.CatalogSpan(catalogNode)
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: start, UpperBound: end})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	var out []cluster.NodeDesc
	for valid := it.First(); valid; valid = it.Next() {
		var n cluster.NodeDesc
		if err := json.Unmarshal(it.Value(), &n); err != nil {
			return nil, fmt.Errorf("shard: corrupt membership record %q: %w", it.Key(), err)
		}
		out = append(out, n)
	}
	return out, it.Error()
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
	s.desc.Collection = 1 // any data shard: only the applied index is written
	if err := s.SetApplied(b, index, term); err != nil {
		return err
	}
	return s.FinishBatch(b)
}

// ReadGCThreshold reads a shard's applied GC threshold from r.
func ReadGCThreshold(r pebble.Reader, shardID uint64) (uint64, error) {
	return storage.GetUint64(r, storage.ShardStateKey(shardID, stateGCThreshold))
}
