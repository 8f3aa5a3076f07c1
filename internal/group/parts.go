package group

import (
	"encoding/binary"
	"fmt"
	"sort"
)

// A state in parts. Encode writes a whole state as one value, so the node
// that stores it after every record rewrites every group of the shard (or
// every yielded key) to record a change of one. Parts split a state so that
// a record rewrites only what it changed:
//
//	leader:   "h"          format, shard, nextInc
//	          "g/" + id    one group (as in Leader.Encode), one per live group
//	follower: "h"          format, shard, lastYield
//	          "k/" + c + k one yielded key: its Yielded fields; c is the
//	                       key's collection in 4 bytes big-endian, k its key
//
// Names are unique and deterministic, and the names of groups (keys) sort
// as the groups by id (the keys by collection, then key), so a caller may
// keep each part under a key made of a common prefix and the name and read
// them back, in any order, by iterating the prefix. Values are canonical
// like Encode's: parts that decode give back the same parts.

// Part is one named part of a leader's or a follower's state. A nil Value
// (only in what PartsAfter returns) means that the part no longer exists.
type Part struct {
	Name  string
	Value []byte
}

// Formats of the headers: the format of the whole encoding (Encode) of the
// same state plus one, so that a whole state is never taken for a header.
const (
	leaderPartsFormat   = 2
	followerPartsFormat = 2
)

const (
	partHeader = "h"
	partGroup  = "g/"
	partKey    = "k/"
)

func groupPartName(id string) string { return partGroup + id }

func keyPartName(k Key) string {
	b := make([]byte, 0, len(partKey)+4+len(k.Key))
	b = append(b, partKey...)
	b = binary.BigEndian.AppendUint32(b, k.Collection)
	return string(append(b, k.Key...))
}

// keyOfPart returns the key part name names.
func keyOfPart(name string) (Key, bool) {
	if len(name) < len(partKey)+4 || name[:len(partKey)] != partKey {
		return Key{}, false
	}
	name = name[len(partKey):]
	return Key{Collection: binary.BigEndian.Uint32([]byte(name[:4])), Key: name[4:]}, true
}

func (l *Leader) header() Part {
	e := encoder{b: make([]byte, 0, 1+2*binary.MaxVarintLen64)}
	e.byte(leaderPartsFormat)
	e.uint(uint64(l.shard))
	e.uint(l.nextInc)
	return Part{Name: partHeader, Value: e.b}
}

// groupPart returns group id's part, with a nil Value if the group is not
// live.
func (l *Leader) groupPart(id string) Part {
	p := Part{Name: groupPartName(id)}
	if g := l.groups[id]; g != nil {
		var e encoder
		e.group(g)
		p.Value = e.b
	}
	return p
}

// Parts returns the leader's replicated state in parts: the header, then
// one part per live group, in name order. DecodeLeaderParts reads them back.
func (l *Leader) Parts() []Part {
	parts := []Part{l.header()}
	for _, id := range l.ids() {
		parts = append(parts, l.groupPart(id))
	}
	return parts
}

// PartsAfter returns, after Apply(r), the parts that Apply(r) may have
// changed: the header and the part of group r.Group.ID (any incarnation),
// with a nil Value if the group is not live (forgotten, or never created).
// Storing them over the parts of the state before Apply(r) gives the parts
// of the state after it. A record of a follower changes nothing: none.
func (l *Leader) PartsAfter(r Record) []Part {
	if !r.Kind.ForLeader() {
		return nil
	}
	return []Part{l.header(), l.groupPart(r.Group.ID)}
}

// DecodeLeaderParts decodes a leader state from the parts that Parts or
// PartsAfter wrote (those with a Value), in any order. It refuses, with
// ErrCorrupt, parts that Parts could not have written: no header or two,
// an unknown name, a value that does not decode, a group of another shard
// or named after another id, a group that breaks the leader's invariants.
func DecodeLeaderParts(parts []Part, opts Options) (*Leader, error) {
	var l *Leader
	for _, p := range parts {
		if p.Name != partHeader {
			continue
		}
		if l != nil {
			return nil, fmt.Errorf("%w: two leader headers", ErrCorrupt)
		}
		d := decoder{b: p.Value}
		if v := d.byte(); d.err == nil && v != leaderPartsFormat {
			return nil, fmt.Errorf("%w: unknown leader parts format %d", ErrCorrupt, v)
		}
		l = NewLeader(ShardID(d.uint()), opts)
		l.nextInc = d.uint()
		if err := d.done(); err != nil {
			return nil, fmt.Errorf("%w: leader header", err)
		}
	}
	if l == nil {
		return nil, fmt.Errorf("%w: no leader header", ErrCorrupt)
	}
	for _, p := range parts {
		if p.Name == partHeader {
			continue
		}
		d := decoder{b: p.Value}
		g := d.group()
		if err := d.done(); err != nil {
			return nil, fmt.Errorf("%w: leader part %q", err, p.Name)
		}
		if p.Name != groupPartName(g.Ref.ID) || l.groups[g.Ref.ID] != nil || g.Ref.Leader != l.shard || !validGroup(g) {
			return nil, fmt.Errorf("%w: leader part %q", ErrCorrupt, p.Name)
		}
		l.groups[g.Ref.ID] = g
	}
	return l, nil
}

func (f *Follower) header() Part {
	e := encoder{b: make([]byte, 0, 1+2*binary.MaxVarintLen64)}
	e.byte(followerPartsFormat)
	e.uint(uint64(f.shard))
	e.uint(f.lastYield)
	return Part{Name: partHeader, Value: e.b}
}

// keyPart returns k's part, with a nil Value if k is not yielded.
func (f *Follower) keyPart(k Key) Part {
	p := Part{Name: keyPartName(k)}
	if y := f.keys[k]; y != nil {
		var e encoder
		e.yielded(y)
		p.Value = e.b
	}
	return p
}

// Parts returns the follower's replicated state in parts: the header, then
// one part per yielded key, in name order. DecodeFollowerParts reads them
// back.
func (f *Follower) Parts() []Part {
	parts := []Part{f.header()}
	for _, k := range f.Keys() {
		parts = append(parts, f.keyPart(k))
	}
	return parts
}

// PartsAfter returns, after Apply(r), the parts that Apply(r) may have
// changed: the header, and the part of r.Key (yield, confirm, free: a nil
// Value if the key is not yielded) or, for an application of shipped
// entries, the parts of the keys of r.Entries that are yielded to r.Group
// (it changes no other key, and yields or frees none). Storing them over
// the parts of the state before Apply(r) gives the parts of the state after
// it. A record of a leader changes nothing: none.
func (f *Follower) PartsAfter(r Record) []Part {
	parts := []Part{f.header()}
	switch r.Kind {
	case RecYield, RecConfirm, RecFree:
		parts = append(parts, f.keyPart(r.Key))
	case RecApplyShip:
		var keys []Key
		for _, e := range r.Entries {
			if y := f.keys[e.Key]; y != nil && y.Group == r.Group {
				keys = append(keys, e.Key)
			}
		}
		sort.Slice(keys, func(i, j int) bool { return keys[i].less(keys[j]) })
		for i, k := range keys {
			if i == 0 || keys[i-1] != k {
				parts = append(parts, f.keyPart(k))
			}
		}
	default:
		return nil
	}
	return parts
}

// DecodeFollowerParts decodes a follower state from the parts that Parts or
// PartsAfter wrote (those with a Value), in any order. It refuses, with
// ErrCorrupt, parts that Parts could not have written: no header or two,
// an unknown name, a value that does not decode, a key twice, a yield id
// of 0 or above the last one assigned.
func DecodeFollowerParts(parts []Part, opts Options) (*Follower, error) {
	var f *Follower
	for _, p := range parts {
		if p.Name != partHeader {
			continue
		}
		if f != nil {
			return nil, fmt.Errorf("%w: two follower headers", ErrCorrupt)
		}
		d := decoder{b: p.Value}
		if v := d.byte(); d.err == nil && v != followerPartsFormat {
			return nil, fmt.Errorf("%w: unknown follower parts format %d", ErrCorrupt, v)
		}
		f = NewFollower(ShardID(d.uint()), opts)
		f.lastYield = d.uint()
		if err := d.done(); err != nil {
			return nil, fmt.Errorf("%w: follower header", err)
		}
	}
	if f == nil {
		return nil, fmt.Errorf("%w: no follower header", ErrCorrupt)
	}
	for _, p := range parts {
		if p.Name == partHeader {
			continue
		}
		k, ok := keyOfPart(p.Name)
		if !ok {
			return nil, fmt.Errorf("%w: follower part %q", ErrCorrupt, p.Name)
		}
		d := decoder{b: p.Value}
		y := d.yielded()
		if err := d.done(); err != nil {
			return nil, fmt.Errorf("%w: follower part %q", err, p.Name)
		}
		if f.keys[k] != nil || y.Yield == 0 || y.Yield > f.lastYield {
			return nil, fmt.Errorf("%w: follower part %q", ErrCorrupt, p.Name)
		}
		f.keys[k] = y
	}
	return f, nil
}
