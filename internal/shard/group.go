package shard

import (
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
//
// Both states are encoded into the shard's state span after every record,
// so they ride snapshots and survive log truncation. A key the follower
// holds yielded is owned by its group: plain writes, intents and
// delete-ranges of it are refused with key_in_group.

// Command kinds of Key Groups.
const (
	KindGroup      CommandKind = 23
	KindGroupWrite CommandKind = 24
)

const (
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
}

// EncodeGroupRecord encodes rec as a command: KindGroupWrite, with room for
// a version, for a group write or an application of shipped writes;
// KindGroup otherwise.
func EncodeGroupRecord(rec group.Record) []byte {
	body := group.EncodeRecord(rec)
	if rec.Kind == group.RecWrite || rec.Kind == group.RecApplyShip {
		b := make([]byte, 9, 9+len(body))
		b[0] = byte(KindGroupWrite)
		return append(b, body...)
	}
	return append([]byte{byte(KindGroup)}, body...)
}

// GroupEffects are what applying a group record asks of the node (sends
// and replies, acted on by the raft leader replica only).
type GroupEffects []group.Effect

func (s *Shard) loadGroups(r pebble.Reader) error {
	id := group.ShardID(s.desc.ShardID)
	s.groups.leader, s.groups.follower = group.NewLeader(id, group.Options{}), group.NewFollower(id, group.Options{})
	if v, ok, err := storage.GetValue(r, storage.ShardStateKey(s.desc.ShardID, stateGroupLeader)); err != nil {
		return err
	} else if ok {
		l, err := group.DecodeLeader(v, group.Options{})
		if err != nil {
			return fmt.Errorf("shard %d: group leader state: %w", s.desc.ShardID, err)
		}
		s.groups.leader = l
	}
	if v, ok, err := storage.GetValue(r, storage.ShardStateKey(s.desc.ShardID, stateGroupFollower)); err != nil {
		return err
	} else if ok {
		f, err := group.DecodeFollower(v, group.Options{})
		if err != nil {
			return fmt.Errorf("shard %d: group follower state: %w", s.desc.ShardID, err)
		}
		s.groups.follower = f
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

func (s *Shard) applyGroup(b *pebble.Batch, kind CommandKind, body []byte) (Result, error) {
	var version uint64
	if kind == KindGroupWrite {
		if len(body) < 8 {
			return Result{}, ErrCorruptCommand
		}
		version, body = binary.BigEndian.Uint64(body), body[8:]
	}
	rec, err := group.DecodeRecord(body)
	if err != nil {
		return Result{}, fmt.Errorf("%w: %v", ErrCorruptCommand, err)
	}
	if (kind == KindGroupWrite) != (rec.Kind == group.RecWrite || rec.Kind == group.RecApplyShip) {
		return Result{}, fmt.Errorf("%w: group record %s in a command of kind %d", ErrCorruptCommand, rec.Kind, kind)
	}
	if kind == KindGroupWrite {
		if err := s.checkVersion(version); err != nil {
			return Result{Err: err}, nil
		}
		rec.Version = version
	}
	s.groups.mu.Lock()
	defer s.groups.mu.Unlock()
	var effs []group.Effect
	var stateKey string
	var state []byte
	if rec.Kind.ForLeader() {
		effs = s.groups.leader.Apply(rec)
		stateKey, state = stateGroupLeader, s.groups.leader.Encode()
	} else {
		effs = s.groups.follower.Apply(rec)
		stateKey, state = stateGroupFollower, s.groups.follower.Encode()
	}
	for _, e := range effs {
		st, ok := e.(group.Store)
		if !ok {
			continue
		}
		if err := s.storeGroupWrite(b, st.Write, version); err != nil {
			return Result{}, err
		}
	}
	if err := b.Set(storage.ShardStateKey(s.desc.ShardID, stateKey), state, nil); err != nil {
		return Result{}, err
	}
	if kind == KindGroupWrite {
		if err := s.setMaxVersion(b, version); err != nil {
			return Result{}, err
		}
	}
	return Result{Version: version, Group: effs}, nil
}

// storeGroupWrite writes a shipped group write into the key's data at
// version (a Store effect).
func (s *Shard) storeGroupWrite(b *pebble.Batch, w group.Write, version uint64) error {
	if version == 0 || w.Key.Collection != s.desc.Collection {
		return fmt.Errorf("%w: a group write of %s at version %d in shard %d", ErrCorruptCommand, w.Key, version, s.desc.ShardID)
	}
	key := []byte(w.Key.Key)
	var bucket uint16
	if s.desc.Partitioning != kv.PartitionRange {
		bucket = cluster.Bucket(key)
	}
	val, _, found, err := s.latest(b, key)
	if err != nil {
		return err
	}
	if w.Delete && !found {
		return nil
	}
	var oldTags, tags []string
	if found {
		oldTags = val.Tags
		tags = val.Tags // a group write keeps the key's tags
	}
	return s.writeVersion(b, key, bucket, version, w.Delete, tags, w.Value, oldTags)
}
