package replication

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/groupkv/groupkv/internal/storage"
)

// confStateKey names a shard's raft configuration in its replicated state.
const confStateKey = "conf_state"

// Raft log positions of a freshly bootstrapped group: the log starts empty
// after a synthetic snapshot at this index and term.
const (
	bootstrapIndex = 10
	bootstrapTerm  = 5
)

// entryCacheMax bounds the entries kept in memory per group: enough to apply
// a cycle's committed entries without reading them back from Pebble.
const entryCacheMax = 4096

// raftStorage implements raft.Storage for one group over Pebble. It is used
// only from the Host loop (raft calls it from RawNode methods), so it needs no
// locking.
type raftStorage struct {
	db    *pebble.DB
	shard uint64

	hardState raftpb.HardState
	confState raftpb.ConfState
	// truncIndex/truncTerm: the last entry removed from the log.
	// Invariant: entries (truncIndex, lastIndex] are in Pebble.
	truncIndex, truncTerm uint64
	lastIndex             uint64
	// cache holds entries [cache[0].Index, lastIndex], contiguous.
	cache []raftpb.Entry
	// snapshot builds a snapshot of the shard's applied state.
	snapshot func() (raftpb.Snapshot, error)
}

var _ raft.Storage = (*raftStorage)(nil)

func encodeTruncated(index, term uint64) []byte {
	b := binary.BigEndian.AppendUint64(nil, index)
	return binary.BigEndian.AppendUint64(b, term)
}

// bootstrapGroup writes the initial raft state of a new group with the given
// voters into b: an empty log after a synthetic snapshot.
func bootstrapGroup(b *pebble.Batch, shard uint64, voters []uint64) error {
	cs := raftpb.ConfState{Voters: voters}
	csb, err := cs.Marshal()
	if err != nil {
		return err
	}
	hs := raftpb.HardState{Term: bootstrapTerm, Commit: bootstrapIndex}
	hsb, err := hs.Marshal()
	if err != nil {
		return err
	}
	if err := b.Set(storage.ShardStateKey(shard, confStateKey), csb, nil); err != nil {
		return err
	}
	if err := b.Set(storage.RaftHardStateKey(shard), hsb, nil); err != nil {
		return err
	}
	return b.Set(storage.RaftTruncatedKey(shard), encodeTruncated(bootstrapIndex, bootstrapTerm), nil)
}

// loadRaftStorage reads a group's raft state from Pebble.
func loadRaftStorage(db *pebble.DB, shard uint64) (*raftStorage, error) {
	s := &raftStorage{db: db, shard: shard}
	if v, ok, err := storage.GetValue(db, storage.RaftHardStateKey(shard)); err != nil {
		return nil, err
	} else if ok {
		if err := s.hardState.Unmarshal(v); err != nil {
			return nil, fmt.Errorf("replication: shard %d hard state: %w", shard, err)
		}
	}
	if v, ok, err := storage.GetValue(db, storage.ShardStateKey(shard, confStateKey)); err != nil {
		return nil, err
	} else if ok {
		if err := s.confState.Unmarshal(v); err != nil {
			return nil, fmt.Errorf("replication: shard %d conf state: %w", shard, err)
		}
	}
	v, ok, err := storage.GetValue(db, storage.RaftTruncatedKey(shard))
	if err != nil {
		return nil, err
	}
	if !ok || len(v) != 16 {
		return nil, fmt.Errorf("replication: shard %d has no raft state", shard)
	}
	s.truncIndex, s.truncTerm = binary.BigEndian.Uint64(v), binary.BigEndian.Uint64(v[8:])
	s.lastIndex = s.truncIndex
	// Find the last log entry.
	start, end := storage.RaftLogSpan(shard, 0, ^uint64(0))
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: start, UpperBound: end})
	if err != nil {
		return nil, err
	}
	if it.Last() {
		k := it.Key()
		s.lastIndex = binary.BigEndian.Uint64(k[len(k)-8:])
	}
	if err := it.Close(); err != nil {
		return nil, err
	}
	if s.lastIndex < s.truncIndex {
		s.lastIndex = s.truncIndex
	}
	return s, nil
}

func (s *raftStorage) InitialState() (raftpb.HardState, raftpb.ConfState, error) {
	return s.hardState, s.confState, nil
}

func (s *raftStorage) FirstIndex() (uint64, error) { return s.truncIndex + 1, nil }
func (s *raftStorage) LastIndex() (uint64, error)  { return s.lastIndex, nil }

func (s *raftStorage) Term(i uint64) (uint64, error) {
	if i == s.truncIndex {
		return s.truncTerm, nil
	}
	if i < s.truncIndex {
		return 0, raft.ErrCompacted
	}
	if i > s.lastIndex {
		return 0, raft.ErrUnavailable
	}
	if len(s.cache) > 0 && i >= s.cache[0].Index {
		return s.cache[i-s.cache[0].Index].Term, nil
	}
	e, err := s.readEntry(i)
	if err != nil {
		return 0, err
	}
	return e.Term, nil
}

func (s *raftStorage) readEntry(i uint64) (raftpb.Entry, error) {
	var e raftpb.Entry
	v, ok, err := storage.GetValue(s.db, storage.RaftLogKey(s.shard, i))
	if err != nil {
		return e, err
	}
	if !ok {
		return e, fmt.Errorf("replication: shard %d: log entry %d missing", s.shard, i)
	}
	return e, e.Unmarshal(v)
}

func (s *raftStorage) Entries(lo, hi, maxSize uint64) ([]raftpb.Entry, error) {
	if lo <= s.truncIndex {
		return nil, raft.ErrCompacted
	}
	if hi > s.lastIndex+1 {
		return nil, fmt.Errorf("replication: shard %d: entries [%d,%d) beyond last index %d", s.shard, lo, hi, s.lastIndex)
	}
	if len(s.cache) > 0 && lo >= s.cache[0].Index {
		off := s.cache[0].Index
		ents := s.cache[lo-off : hi-off]
		return limitSize(ents, maxSize), nil
	}
	start, end := storage.RaftLogSpan(s.shard, lo, hi)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: start, UpperBound: end})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	var (
		out  []raftpb.Entry
		size uint64
	)
	for valid := it.First(); valid; valid = it.Next() {
		var e raftpb.Entry
		if err := e.Unmarshal(it.Value()); err != nil {
			return nil, err
		}
		if e.Index != lo+uint64(len(out)) {
			return nil, fmt.Errorf("replication: shard %d: log gap at %d", s.shard, lo+uint64(len(out)))
		}
		size += uint64(e.Size())
		if len(out) > 0 && size > maxSize {
			break
		}
		out = append(out, e)
	}
	if err := it.Error(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, raft.ErrUnavailable
	}
	return out, nil
}

func limitSize(ents []raftpb.Entry, maxSize uint64) []raftpb.Entry {
	if len(ents) == 0 {
		return ents
	}
	size := uint64(ents[0].Size())
	for i := 1; i < len(ents); i++ {
		size += uint64(ents[i].Size())
		if size > maxSize {
			return ents[:i]
		}
	}
	return ents
}

func (s *raftStorage) Snapshot() (raftpb.Snapshot, error) {
	if s.snapshot == nil {
		return raftpb.Snapshot{}, raft.ErrSnapshotTemporarilyUnavailable
	}
	return s.snapshot()
}

// restored updates the in-memory view after a snapshot was persisted: the
// log is empty after the snapshot's position.
func (s *raftStorage) restored(meta raftpb.SnapshotMetadata) {
	s.truncIndex, s.truncTerm = meta.Index, meta.Term
	s.lastIndex = meta.Index
	s.cache = s.cache[:0]
	s.confState = meta.ConfState
}

// append writes entries and the hard state of a Ready into b. Entries
// replace any existing suffix of the log from their first index.
func (s *raftStorage) append(b *pebble.Batch, ents []raftpb.Entry, hs raftpb.HardState) error {
	if !raft.IsEmptyHardState(hs) {
		data, err := hs.Marshal()
		if err != nil {
			return err
		}
		if err := b.Set(storage.RaftHardStateKey(s.shard), data, nil); err != nil {
			return err
		}
	}
	if len(ents) == 0 {
		return nil
	}
	for i := range ents {
		data, err := ents[i].Marshal()
		if err != nil {
			return err
		}
		if err := b.Set(storage.RaftLogKey(s.shard, ents[i].Index), data, nil); err != nil {
			return err
		}
	}
	if last := ents[len(ents)-1].Index; last < s.lastIndex {
		start, end := storage.RaftLogSpan(s.shard, last+1, s.lastIndex+1)
		if err := b.DeleteRange(start, end, nil); err != nil {
			return err
		}
	}
	return nil
}

// appended updates the in-memory view after the batch of append committed.
func (s *raftStorage) appended(ents []raftpb.Entry, hs raftpb.HardState) {
	if !raft.IsEmptyHardState(hs) {
		s.hardState = hs
	}
	if len(ents) == 0 {
		return
	}
	first := ents[0].Index
	if len(s.cache) > 0 && first >= s.cache[0].Index && first <= s.cache[0].Index+uint64(len(s.cache)) {
		s.cache = s.cache[:first-s.cache[0].Index]
	} else {
		s.cache = s.cache[:0]
	}
	s.cache = append(s.cache, ents...)
	if n := len(s.cache); n > entryCacheMax {
		s.cache = append(s.cache[:0:0], s.cache[n-entryCacheMax/2:]...)
	}
	s.lastIndex = ents[len(ents)-1].Index
}

// truncate removes log entries up to and including index (which must be
// applied) by writing into b; truncated finishes once b committed.
func (s *raftStorage) truncate(b *pebble.Batch, index uint64) (term uint64, err error) {
	term, err = s.Term(index)
	if err != nil {
		return 0, err
	}
	if err := b.Set(storage.RaftTruncatedKey(s.shard), encodeTruncated(index, term), nil); err != nil {
		return 0, err
	}
	start, end := storage.RaftLogSpan(s.shard, s.truncIndex+1, index+1)
	return term, b.DeleteRange(start, end, nil)
}

func (s *raftStorage) truncated(index, term uint64) {
	s.truncIndex, s.truncTerm = index, term
	if len(s.cache) > 0 && s.cache[0].Index <= index {
		drop := index + 1 - s.cache[0].Index
		if drop >= uint64(len(s.cache)) {
			s.cache = s.cache[:0]
		} else {
			s.cache = s.cache[drop:]
		}
	}
}

var errStopped = errors.New("replication: host stopped")

// decodeConfChange decodes the configuration change of a committed entry.
func decodeConfChange(e *raftpb.Entry) (raftpb.ConfChangeI, error) {
	if e.Type == raftpb.EntryConfChange {
		var cc raftpb.ConfChange
		if err := cc.Unmarshal(e.Data); err != nil {
			return nil, fmt.Errorf("decoding configuration change at %d: %w", e.Index, err)
		}
		return cc, nil
	}
	var cc raftpb.ConfChangeV2
	if err := cc.Unmarshal(e.Data); err != nil {
		return nil, fmt.Errorf("decoding configuration change at %d: %w", e.Index, err)
	}
	return cc, nil
}

// saveConfState writes a shard's configuration into its replicated state.
func saveConfState(b *pebble.Batch, shard uint64, cs raftpb.ConfState) error {
	data, err := cs.Marshal()
	if err != nil {
		return err
	}
	return b.Set(storage.ShardStateKey(shard, confStateKey), data, nil)
}
