package shard

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"sync"

	"github.com/cockroachdb/pebble/v2"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/group"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/storage"
)

// Key Groups (internal/group, docs/groups.md). Every shard keeps a
// group.Leader (the groups whose leader key it holds) and a group.Follower
// (its keys yielded to groups) as replicated state, changed only by the
// records of the Key Grouping protocol applied from its log:
//
//   - KindGroup: a record without a version (create, join, refuse,
//     delete, release, shipped; yield, confirm, free).
//   - KindGroupWrite: a record with a version, assigned like a write's:
//     a group transaction's commit at the leader (validated in Apply
//     against the versions it read), and the application of shipped group
//     writes at a follower, which stores them as versions of the keys.
//   - KindGroupBatch and KindGroupWriteBatch: several records, applied in
//     order in one Apply (EncodeGroupRecords), those of a batch of
//     protocol messages that one shard handles together.
//
// Both states are kept in the shard's state span, in parts (group.Part):
// under stateGroupLeaderParts, a header and, per group, an item for the
// group, one per member, one per outbox and one per outbox entry; under
// stateGroupFollowerParts, a header and one item per yielded key. After a
// record, the shard writes the parts its Apply may have changed
// (PartsAfter), so a record costs what it touched, not the whole state (a
// group write, the members it wrote, their outboxes' counts and its
// entries, not the value of every member nor the outboxes' earlier
// entries); the parts ride
// snapshots (the whole state span) and survive log truncation. A key the
// follower holds yielded is owned by its group: plain writes, intents and
// delete-ranges of it are refused with key_in_group.
//
// Older formats load, and the first record applied to the state then
// replaces them by every part, on every replica alike (the format stored
// is replicated state): shards that stored each state as one value
// (group.Leader.Encode, under stateGroupLeader and stateGroupFollower),
// and shards that stored the leader's parts a whole group, or a whole
// outbox, per part (group.OldLeaderParts).

// Command kinds of Key Groups.
// groupOptions are the protocol's options in a shard. The node ticks the
// protocol every 100 ms; committed group writes ship every third tick
// (300 ms), so that a shipment carries a group's writes of that time to a
// follower shard in one proposal there and one acknowledgment at the
// leader. A deletion, or a scan that must reflect them, ships at once.
var groupOptions = group.Options{ShipTicks: 3}

const (
	KindGroup      CommandKind = 23
	KindGroupWrite CommandKind = 24
	// KindGroupBatch carries several group records, applied in order in
	// one Apply as if each were its own command (EncodeGroupRecords): what
	// a node's handler of a batch of protocol messages logs in one shard,
	// one proposal instead of one per message. KindGroupWriteBatch is the
	// same with a version, which the records that store writes share
	// (their keys apart, as a write's keys).
	KindGroupBatch      CommandKind = 32
	KindGroupWriteBatch CommandKind = 33
)

// maxGroupBatchBytes bounds the records EncodeGroupRecords puts in one
// command (a single larger record goes alone).
const maxGroupBatchBytes = 1 << 20

// Names of the group state items (storage.ShardStateKey). The part
// prefixes are not prefixes of the names of the whole states, nor these of
// them, so no iteration of a prefix mixes the two formats.
const (
	// The states in parts: prefix + group.Part.Name.
	stateGroupLeaderParts   = "group/l/"
	stateGroupFollowerParts = "group/f/"
	// The states as one value each (group.Leader.Encode,
	// group.Follower.Encode), as shards stored them before parts: read,
	// then deleted by the first record applied.
	stateGroupLeader   = "group/leader"
	stateGroupFollower = "group/follower"
)

// groupState is a shard's Key Grouping state. mu guards it against the
// node's readers (handlers on the raft leader); Apply, its only writer,
// holds it while it changes it.
type groupState struct {
	mu       sync.Mutex
	leader   *group.Leader
	follower *group.Follower
	// oldLeader (oldFollower): the state was loaded from an older format,
	// still stored: its value under stateGroupLeader (stateGroupFollower),
	// or leader parts of an older format; the next record applied to it
	// deletes them and stores every part. Apply only.
	oldLeader, oldFollower bool
	// index is the log index of the last group record applied to the
	// state: what the state shows may not be visible in storage before
	// that index is (the batch that applied it is committed after).
	index uint64
}

// EncodeGroupRecord encodes rec as a command: KindGroupWrite, with room for
// a version, for a group write or an application of shipped writes;
// KindGroup otherwise.
func EncodeGroupRecord(rec group.Record) []byte {
	if storesWrites(rec) {
		return groupCommand(KindGroupWrite, group.EncodeRecord(rec))
	}
	return groupCommand(KindGroup, group.EncodeRecord(rec))
}

// EncodeGroupRecords encodes recs, to be applied in their order, as few
// commands as it can: one per record (EncodeGroupRecord) when they are
// alone, else batches (KindGroupBatch, KindGroupWriteBatch) of at most
// maxGroupBatchBytes in which no two records that store writes touch the
// same key (they share the batch's version). Proposed one after the
// other, the commands apply as the records would, one command each.
func EncodeGroupRecords(recs []group.Record) [][]byte {
	var out [][]byte
	var batch [][]byte
	var size int
	var writes bool
	stored := make(map[group.Key]bool)
	flush := func() {
		switch len(batch) {
		case 0:
		case 1:
			kind := KindGroup
			if writes {
				kind = KindGroupWrite
			}
			out = append(out, groupCommand(kind, batch[0]))
		default:
			kind := KindGroupBatch
			if writes {
				kind = KindGroupWriteBatch
			}
			body := binary.AppendUvarint(nil, uint64(len(batch)))
			for _, r := range batch {
				body = appendBytes(body, r)
			}
			out = append(out, groupCommand(kind, body))
		}
		batch, size, writes = nil, 0, false
		clear(stored)
	}
	for _, rec := range recs {
		body := group.EncodeRecord(rec)
		keys := storedKeys(rec)
		clash := false
		for _, k := range keys {
			clash = clash || stored[k]
		}
		if clash || len(batch) > 0 && size+len(body) > maxGroupBatchBytes {
			flush()
		}
		batch = append(batch, body)
		size += len(body)
		writes = writes || storesWrites(rec)
		for _, k := range keys {
			stored[k] = true
		}
	}
	flush()
	return out
}

// groupCommand makes a command of kind from body, with room for a version
// if kind is versioned.
func groupCommand(kind CommandKind, body []byte) []byte {
	if kind == KindGroupWrite || kind == KindGroupWriteBatch {
		b := make([]byte, 9, 9+len(body))
		b[0] = byte(kind)
		return append(b, body...)
	}
	return append([]byte{byte(kind)}, body...)
}

// storedKeys returns the keys whose writes rec may store (none if it
// stores none).
func storedKeys(rec group.Record) []group.Key {
	if !storesWrites(rec) {
		return nil
	}
	var keys []group.Key
	for _, w := range rec.Writes {
		keys = append(keys, w.Key)
	}
	for _, e := range rec.Entries {
		keys = append(keys, e.Key)
	}
	return keys
}

// decodeGroupBatch splits the body of a batch (past its version) into its
// records' encodings.
func decodeGroupBatch(body []byte) ([][]byte, error) {
	d := decoder{b: body}
	n := d.uvarint()
	if d.err != nil || n < 2 || n > uint64(len(body)) {
		return nil, ErrCorruptCommand
	}
	recs := make([][]byte, 0, n)
	for range n {
		recs = append(recs, d.bytes())
	}
	if d.err != nil || len(d.b) != 0 {
		return nil, ErrCorruptCommand
	}
	return recs, nil
}

// storesWrites reports whether rec stores writes, at a version: a group
// write, an application of shipped writes, a release (free) that carries
// the key's last writes.
func storesWrites(rec group.Record) bool {
	return rec.Kind == group.RecWrite || rec.Kind == group.RecApplyShip || rec.Kind == group.RecFree && len(rec.Entries) > 0
}

// GroupEffects are what applying a group record asks of the node (sends
// and replies, acted on by the raft leader replica only).
type GroupEffects []group.Effect

func (s *Shard) loadGroups(r pebble.Reader) error {
	id := group.ShardID(s.desc.ShardID)
	s.groups.leader, s.groups.follower = group.NewLeader(id, groupOptions), group.NewFollower(id, groupOptions)
	whole, parts, err := readGroupState(r, s.desc.ShardID, stateGroupLeader, stateGroupLeaderParts)
	if err != nil {
		return err
	}
	s.groups.oldLeader = whole != nil || group.OldLeaderParts(parts)
	if whole != nil {
		s.groups.leader, err = group.DecodeLeader(whole, groupOptions)
	} else if len(parts) > 0 {
		s.groups.leader, err = group.DecodeLeaderParts(parts, groupOptions)
	}
	if err != nil {
		return fmt.Errorf("shard %d: group leader state: %w", s.desc.ShardID, err)
	}
	whole, parts, err = readGroupState(r, s.desc.ShardID, stateGroupFollower, stateGroupFollowerParts)
	if err != nil {
		return err
	}
	s.groups.oldFollower = whole != nil
	if whole != nil {
		s.groups.follower, err = group.DecodeFollower(whole, groupOptions)
	} else if len(parts) > 0 {
		s.groups.follower, err = group.DecodeFollowerParts(parts, groupOptions)
	}
	if err != nil {
		return fmt.Errorf("shard %d: group follower state: %w", s.desc.ShardID, err)
	}
	return nil
}

// readGroupState reads a group state of shard: its value under the name
// whole if there is one (parts under prefix are then stale: the value was
// written since, by a build that did not know parts, and the next record
// deletes them), else its parts under prefix (none: the state is empty).
func readGroupState(r pebble.Reader, shard uint64, whole, prefix string) ([]byte, []group.Part, error) {
	if v, ok, err := storage.GetValue(r, storage.ShardStateKey(shard, whole)); err != nil || ok {
		return v, nil, err
	}
	lo := storage.ShardStateKey(shard, prefix)
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: storage.PrefixEnd(lo)})
	if err != nil {
		return nil, nil, err
	}
	defer it.Close()
	var parts []group.Part
	for ok := it.First(); ok; ok = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			return nil, nil, err
		}
		parts = append(parts, group.Part{Name: string(it.Key()[len(lo):]), Value: bytes.Clone(v)})
	}
	return nil, parts, it.Error()
}

// writeGroupParts writes into b the parts of a group state (a nil Value
// deletes the part), under prefix. If the state is stored in an older
// format (*old), parts must be every part of the state: they replace the
// value under wholeName and whatever parts are stored.
func (s *Shard) writeGroupParts(b *pebble.Batch, prefix, wholeName string, old *bool, parts []group.Part) error {
	if *old {
		lo := storage.ShardStateKey(s.desc.ShardID, prefix)
		if err := b.DeleteRange(lo, storage.PrefixEnd(lo), nil); err != nil {
			return err
		}
		if err := b.Delete(storage.ShardStateKey(s.desc.ShardID, wholeName), nil); err != nil {
			return err
		}
		*old = false
	}
	key := storage.ShardStateKey(s.desc.ShardID, prefix)
	n := len(key)
	for _, p := range parts {
		key = append(key[:n], p.Name...) // b copies it
		var err error
		if p.Value == nil {
			err = b.Delete(key, nil)
		} else {
			err = b.Set(key, p.Value, nil)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// WithGroups runs fn with the shard's group state, which it must not keep
// or change except through the methods that return effects (Create, OnJA,
// Tick...; their Log effects are proposed, not applied).
func (s *Shard) WithGroups(fn func(l *group.Leader, f *group.Follower)) {
	s.groups.mu.Lock()
	defer s.groups.mu.Unlock()
	fn(s.groups.leader, s.groups.follower)
}

// GroupsIndex returns the log index of the last group record applied to
// the group state. A reader that saw the state and then reads storage
// waits until that index is applied there (the state changes while a
// cycle's batch is built; storage when it is committed).
func (s *Shard) GroupsIndex() uint64 {
	s.groups.mu.Lock()
	defer s.groups.mu.Unlock()
	return s.groups.index
}

// holdsGroups reports whether the shard leads a group or has a key yielded
// to one (Apply only): its span cannot change then (a split or merge
// would carry keys away from the state that protects them).
func (s *Shard) holdsGroups() bool {
	return s.groups.leader != nil && len(s.groups.leader.Groups()) > 0 ||
		s.groups.follower != nil && len(s.groups.follower.Keys()) > 0
}

// HoldsGroups is holdsGroups for readers outside the loop.
func (s *Shard) HoldsGroups() bool {
	s.groups.mu.Lock()
	defer s.groups.mu.Unlock()
	return s.holdsGroups()
}

// inGroup reports whether key is yielded to a group (Apply only).
func (s *Shard) inGroup(key []byte) (group.Yielded, bool) {
	if s.groups.follower == nil {
		return group.Yielded{}, false
	}
	return s.groups.follower.Key(group.Key{Collection: s.desc.Collection, Key: string(key)})
}

// keyInGroupError is the refusal of a write to a key a group owns.
func keyInGroupError(key []byte, y group.Yielded) *kv.Error {
	return kv.Errorf(kv.CodeKeyInGroup, "key %q belongs to group %q; write it in a transaction of the group", key, y.Group.ID)
}

// groupHolds reports a key in [start, end) yielded to a group (Apply only).
func (s *Shard) groupHolds(start, end []byte) ([]byte, group.Yielded, bool) {
	if s.groups.follower == nil {
		return nil, group.Yielded{}, false
	}
	for _, k := range s.groups.follower.Keys() {
		if k.Collection != s.desc.Collection {
			continue
		}
		kb := []byte(k.Key)
		if string(kb) >= string(start) && (len(end) == 0 || string(kb) < string(end)) {
			y, _ := s.groups.follower.Key(k)
			return kb, y, true
		}
	}
	return nil, group.Yielded{}, false
}

func (s *Shard) applyGroup(b *pebble.Batch, index uint64, kind CommandKind, body []byte) (Result, error) {
	var version uint64
	versioned := kind == KindGroupWrite || kind == KindGroupWriteBatch
	if versioned {
		if len(body) < 8 {
			return Result{}, ErrCorruptCommand
		}
		version, body = binary.BigEndian.Uint64(body), body[8:]
	}
	bodies := [][]byte{body}
	if kind == KindGroupBatch || kind == KindGroupWriteBatch {
		var err error
		if bodies, err = decodeGroupBatch(body); err != nil {
			return Result{}, err
		}
	}
	recs := make([]group.Record, len(bodies))
	writes := false
	for i, body := range bodies {
		rec, err := group.DecodeRecord(body)
		if err != nil {
			return Result{}, fmt.Errorf("%w: %v", ErrCorruptCommand, err)
		}
		if kind == KindGroup || kind == KindGroupWrite {
			if versioned != storesWrites(rec) {
				return Result{}, fmt.Errorf("%w: group record %s in a command of kind %d", ErrCorruptCommand, rec.Kind, kind)
			}
		} else if storesWrites(rec) && !versioned {
			return Result{}, fmt.Errorf("%w: group record %s in a command of kind %d", ErrCorruptCommand, rec.Kind, kind)
		}
		writes = writes || storesWrites(rec)
		recs[i] = rec
	}
	if versioned && !writes {
		return Result{}, fmt.Errorf("%w: a group command of kind %d stores no write", ErrCorruptCommand, kind)
	}
	if versioned {
		if err := s.checkVersion(version); err != nil {
			return Result{Err: err}, nil
		}
	}
	s.groups.mu.Lock()
	defer s.groups.mu.Unlock()
	s.groups.index = index
	var effs []group.Effect
	for _, rec := range recs {
		var v uint64
		if storesWrites(rec) {
			rec.Version, v = version, version
		}
		e, err := s.applyGroupRecord(b, rec, v)
		if err != nil {
			return Result{}, err
		}
		effs = append(effs, e...)
	}
	if versioned {
		if err := s.setMaxVersion(b, version); err != nil {
			return Result{}, err
		}
	}
	return Result{Version: version, Group: effs}, nil
}

// FreedAbove is the highest version at which this shard stored a Key
// Group's write above the version its group committed it (a write of an
// older build, which shipped no versions; older builds also raised it to
// the highest version applied at every free), or the same of a shard it
// split from or took in. A read at a lower version may lack group writes
// committed below it. It is replicated state
// (stateFreedAbove, stored from a shard's first yield on); a shard that
// yielded keys and has none stored counts as FreedAbove the highest
// version applied when it was loaded, and a shard that takes in one
// without it counts that one's highest version.
func (s *Shard) FreedAbove() uint64 { return s.freedAbove.Load() }

// readFreedAbove reads the stored FreedAbove of shard; ok false: none
// stored.
func readFreedAbove(r pebble.Reader, shard uint64) (v uint64, ok bool, err error) {
	b, ok, err := storage.GetValue(r, storage.ShardStateKey(shard, stateFreedAbove))
	if err != nil || !ok {
		return 0, false, err
	}
	if len(b) != 8 {
		return 0, false, fmt.Errorf("%w: shard %d's %s is %d bytes", storage.ErrCorruptValue, shard, stateFreedAbove, len(b))
	}
	return binary.BigEndian.Uint64(b), true, nil
}

// raiseFreedAbove raises FreedAbove, and its stored value in b, to v,
// and stores it if it is not yet.
func (s *Shard) raiseFreedAbove(b *pebble.Batch, v uint64) error {
	if v > s.freedAbove.Load() {
		s.freedAbove.Store(v)
	}
	if v <= s.freedStored && s.freedKnown {
		return nil
	}
	s.freedStored, s.freedKnown = max(s.freedStored, v), true
	return storage.PutUint64(b, storage.ShardStateKey(s.desc.ShardID, stateFreedAbove), s.freedStored)
}

// applyGroupRecord applies one group record (s.groups.mu held): to the
// leader's or the follower's state, whose changed parts it writes, and
// the writes it stores at version.
func (s *Shard) applyGroupRecord(b *pebble.Batch, rec group.Record, version uint64) ([]group.Effect, error) {
	var effs []group.Effect
	var parts []group.Part
	var err error
	if rec.Kind.ForLeader() {
		l := s.groups.leader
		effs = l.Apply(rec)
		if s.groups.oldLeader {
			parts = l.Parts()
		} else {
			parts = l.PartsAfter(rec)
		}
		err = s.writeGroupParts(b, stateGroupLeaderParts, stateGroupLeader, &s.groups.oldLeader, parts)
	} else {
		f := s.groups.follower
		if rec.Kind == group.RecYield && rec.Key.Collection == s.desc.Collection {
			// The yielded value is the key's as of this record in the log,
			// read through the batch: the value the J's handler read may
			// miss writes applied before it but not visible yet (a free
			// storing the last group's writes, applied in the same cycle).
			val, version, found, err := s.latest(b, []byte(rec.Key.Key))
			if err != nil {
				return nil, err
			}
			rec.Value, rec.Version, rec.Absent, rec.Tags = nil, 0, !found, group.Tags{}
			if found {
				rec.Value, rec.Version, rec.Tags.List = val.Value, version, val.Tags
			}
		}
		if rec.Kind == group.RecYield || rec.Kind == group.RecFree {
			// From its first yield on FreedAbove is stored: a shard that
			// loads with yields and without it yielded keys under an older
			// build (Load).
			if err := s.raiseFreedAbove(b, 0); err != nil {
				return nil, err
			}
		}
		effs = f.Apply(rec)
		if s.groups.oldFollower {
			parts = f.Parts()
		} else {
			parts = f.PartsAfter(rec)
		}
		err = s.writeGroupParts(b, stateGroupFollowerParts, stateGroupFollower, &s.groups.oldFollower, parts)
	}
	if err != nil {
		return nil, err
	}
	for _, e := range effs {
		st, ok := e.(group.Store)
		if !ok {
			continue
		}
		if err := s.storeGroupWrite(b, st.Write, st.Version, version); err != nil {
			return nil, err
		}
	}
	return effs, nil
}

// storeGroupWrite writes a shipped group write into the key's data (a
// Store effect) at committed, the version of the group write record that
// committed it, logged in the change log at version, that of the record
// applied here. Nothing else writes a key while its group holds it, so
// the key's history here is the group's: a read at any version finds the
// group's write of that version, once shipped. A write of an older build
// (committed 0), and one whose version is not between the key's newest
// here and version (which the clocks rule out), is stored at version.
func (s *Shard) storeGroupWrite(b *pebble.Batch, w group.Write, committed, version uint64) error {
	if version == 0 || w.Key.Collection != s.desc.Collection {
		return fmt.Errorf("%w: a group write of %s at version %d in shard %d", ErrCorruptCommand, w.Key, version, s.desc.ShardID)
	}
	s.blindWrite = max(s.blindWrite, version)
	key := []byte(w.Key.Key)
	val, newest, found, err := s.latest(b, key)
	if err != nil {
		return err
	}
	if committed == 0 || committed > version || committed <= newest {
		// Stored above the version it was committed at, perhaps: reads at
		// a timestamp below this one may miss it.
		committed = version
		if err := s.raiseFreedAbove(b, version); err != nil {
			return err
		}
	}
	if w.Delete && !found {
		return nil
	}
	var oldTags []string
	if found {
		oldTags = val.Tags
	}
	tags := w.Tags.List
	if w.Tags.Keep {
		tags = oldTags // a write of a build whose group writes kept the key's tags
	}
	var bucket uint16
	switch {
	case s.desc.Partitioning == kv.PartitionRange:
	case s.desc.Partitioning == kv.PartitionTag && w.Delete:
		bucket = val.Bucket // the live record's
	case s.desc.Partitioning == kv.PartitionTag && len(tags) > 0:
		// The group kept the key's placement (pinned in its home shard):
		// its first tag.
		bucket = cluster.Bucket([]byte(tags[0]))
	default:
		bucket = cluster.Bucket(key)
	}
	return s.writeVersionLogged(b, key, bucket, committed, version, w.Delete, tags, w.Value, oldTags)
}
