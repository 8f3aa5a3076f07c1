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
//	leader:   "h"               format, shard, nextInc
//	          G                 a live group's header: the group but its
//	                            members and outboxes, then their numbers
//	          G + "m" + c + k   a member of the group: its fields but its
//	                            key; c is the key's collection in 4 bytes
//	                            big-endian, k its key
//	          G + "o" + s       an outbox of the group: its next sequence
//	                            number and how many entries it holds; s is
//	                            its shard, in 8 bytes big-endian
//	          G + "o" + s + q   entry q of that outbox: the key it wrote (the
//	                            value is the member's); q is the entry's
//	                            sequence number, in 8 bytes big-endian
//	follower: "h"               format, shard, lastYield
//	          "k/" + c + k      one yielded key: its Yielded fields
//
// where G, the group's name, is "g/", then the group's id with each 0 byte
// written 0, 0xff, then 0, 1. So a group write rewrites the members it
// wrote and adds its entries to their outboxes, not the value of every
// member nor the outboxes' earlier entries; an acknowledgment deletes
// the entries it covers.
//
// Names are unique and deterministic and decode one way: no group's name
// is a prefix of another's, as an escaped id holds no 0, 1. They sort as
// what they name: the groups by id, each group's header first, then its
// members by key, then its outboxes by shard, each followed by its
// entries in order (the keys by collection, then key); so a caller may
// keep each part under a key made of a common prefix
// and the name and read them back, in any order, by iterating the prefix.
// Values are canonical like Encode's: parts that decode give back the same
// parts.

// Part is one named part of a leader's or a follower's state. A nil Value
// (only in what PartsAfter returns) means that the part no longer exists.
type Part struct {
	Name  string
	Value []byte
}

// Formats of the headers: the format of the whole encoding (Encode) of the
// same state plus one or more, so that a whole state is never taken for a
// header.
const (
	leaderPartsFormat   = 4
	followerPartsFormat = 2
	// leaderPartsFormatGroups is the format of the leader parts of shards
	// that stored each group whole, in one part named "g/" + id (the group
	// as in Encode). DecodeLeaderParts reads it; see OldLeaderParts.
	leaderPartsFormatGroups = 2
	// leaderPartsFormatOutboxes is the format of the leader parts of
	// shards that stored each outbox whole, its entries in its part (as
	// encoder.outboxFields writes it). DecodeLeaderParts reads it; see
	// OldLeaderParts.
	leaderPartsFormatOutboxes = 3
)

const (
	partHeader = "h"
	partGroup  = "g/"
	partKey    = "k/"
	// What follows a group's name in the names of the parts of its members
	// and outboxes.
	partMember = 'm'
	partOutbox = 'o'
)

// groupName returns the name of group id: the name of its header part,
// which begins the names of its other parts.
func groupName(id string) string {
	b := make([]byte, 0, len(partGroup)+len(id)+2)
	b = append(b, partGroup...)
	for i := 0; i < len(id); i++ {
		b = append(b, id[i])
		if id[i] == 0 {
			b = append(b, 0xff)
		}
	}
	return string(append(b, 0, 1))
}

// memberPartName returns the name of the part of member k of the group
// named g.
func memberPartName(g string, k Key) string {
	b := make([]byte, 0, len(g)+5+len(k.Key))
	b = append(append(b, g...), partMember)
	b = binary.BigEndian.AppendUint32(b, k.Collection)
	return string(append(b, k.Key...))
}

// outboxPartName returns the name of the part of the outbox to shard s of
// the group named g.
func outboxPartName(g string, s ShardID) string {
	b := make([]byte, 0, len(g)+9)
	b = append(append(b, g...), partOutbox)
	return string(binary.BigEndian.AppendUint64(b, uint64(s)))
}

// entryPartName returns the name of the part of entry seq of the outbox
// named o.
func entryPartName(o string, seq uint64) string {
	b := make([]byte, 0, len(o)+8)
	return string(binary.BigEndian.AppendUint64(append(b, o...), seq))
}

// groupOfPart splits the name of a part of a group into the group's id and
// what follows the group's name: "" in the name of its header part.
func groupOfPart(name string) (id, rest string, ok bool) {
	if len(name) < len(partGroup) || name[:len(partGroup)] != partGroup {
		return "", "", false
	}
	var b []byte
	for i := len(partGroup); i+1 < len(name); i++ {
		if name[i] != 0 {
			b = append(b, name[i])
			continue
		}
		switch name[i+1] {
		case 0xff:
			b = append(b, 0)
			i++
		case 1:
			return string(b), name[i+2:], true
		default:
			return "", "", false
		}
	}
	return "", "", false
}

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

// groupParts makes the parts of group g, whose name is n: with a nil Value
// unless live.
type groupParts struct {
	g    *Group
	n    string
	live bool
}

func (p groupParts) header() Part {
	part := Part{Name: p.n}
	if p.live {
		var e encoder
		e.groupFields(p.g)
		e.uint(uint64(len(p.g.Members)))
		e.uint(uint64(len(p.g.Outboxes)))
		part.Value = e.b
	}
	return part
}

func (p groupParts) member(m *Member) Part {
	part := Part{Name: memberPartName(p.n, m.Key)}
	if p.live {
		var e encoder
		e.memberFields(*m)
		part.Value = e.b
	}
	return part
}

func (p groupParts) outbox(ob *Outbox) Part {
	part := Part{Name: outboxPartName(p.n, ob.Shard)}
	if p.live {
		var e encoder
		e.uint(ob.Next)
		e.uint(uint64(len(ob.Entries)))
		part.Value = e.b
	}
	return part
}

// entry is the part of entry x of the outbox to shard s: with a nil
// Value unless live.
func (p groupParts) entry(s ShardID, x *Entry) Part {
	part := Part{Name: entryPartName(outboxPartName(p.n, s), x.Seq)}
	if p.live {
		var e encoder
		e.entryBody(*x)
		part.Value = e.b
	}
	return part
}

// outboxAll appends the parts of outbox ob and of its entries to parts.
func (p groupParts) outboxAll(parts []Part, ob *Outbox) []Part {
	parts = append(parts, p.outbox(ob))
	for i := range ob.Entries {
		parts = append(parts, p.entry(ob.Shard, &ob.Entries[i]))
	}
	return parts
}

// members appends the parts of every member to parts.
func (p groupParts) members(parts []Part) []Part {
	for i := range p.g.Members {
		parts = append(parts, p.member(&p.g.Members[i]))
	}
	return parts
}

// all appends every part of the group to parts, in name order.
func (p groupParts) all(parts []Part) []Part {
	parts = p.members(append(parts, p.header()))
	for i := range p.g.Outboxes {
		parts = p.outboxAll(parts, &p.g.Outboxes[i])
	}
	return parts
}

// Parts returns the leader's replicated state in parts: the header, then
// the parts of every live group, in name order. DecodeLeaderParts reads
// them back.
func (l *Leader) Parts() []Part {
	parts := []Part{l.header()}
	for _, id := range l.ids() {
		parts = groupParts{g: l.groups[id], n: groupName(id), live: true}.all(parts)
	}
	return parts
}

// PartsAfter returns, after Apply(r), the parts that Apply(r) may have
// changed, with a nil Value for those it deleted; r must be the record
// applied last. Storing them over the parts of the state before Apply(r)
// gives the parts of the state after it. A record of a follower changes
// nothing: none.
//
// What changes of group r.Group.ID (any incarnation): with a write, the
// members it wrote and their outboxes; with an acknowledgment, its outbox;
// with a join or a refusal, the group's header (its state) and the
// member; with a release, the member. Deleting changes every member (each
// pending or joined one is released): a deletion changes the header and
// every member, and so may a refusal that fails an atomic creation; an
// acknowledgment that empties the last outbox of a deleting group changes
// every member (the joined ones are released then). A creation makes every
// part, and changes the leader's header (the last incarnation), which
// nothing else changes; a group forgotten (its members released) loses
// every part.
func (l *Leader) PartsAfter(r Record) []Part {
	if !r.Kind.ForLeader() {
		return nil
	}
	var parts []Part
	if r.Kind == RecCreate {
		parts = append(parts, l.header())
	}
	if g := l.forgotten; g != nil && g.Ref.ID == r.Group.ID {
		return groupParts{g: g, n: groupName(g.Ref.ID)}.all(parts)
	}
	g := l.groups[r.Group.ID]
	if g == nil {
		return parts
	}
	p := groupParts{g: g, n: groupName(g.Ref.ID), live: true}
	member := func(k Key) {
		if m := g.member(k); m != nil {
			parts = append(parts, p.member(m))
		}
	}
	switch r.Kind {
	case RecCreate:
		return p.all(parts)
	case RecJoin:
		parts = append(parts, p.header())
		member(r.Key)
	case RecRefuse:
		parts = append(parts, p.header())
		if m := g.member(r.Key); g.State == Deleting && m != nil && m.Status == Refused {
			// The refusal may have failed an atomic creation.
			return p.members(parts)
		}
		member(r.Key)
	case RecDelete:
		return p.members(append(parts, p.header()))
	case RecRelease:
		member(r.Key)
	case RecWrite:
		if !l.wrote {
			return parts
		}
		// Each write appended one entry to the outbox of its member's
		// shard: per shard, the last entries.
		var shards []ShardID
		for _, w := range r.Writes {
			m := g.member(w.Key)
			parts = append(parts, p.member(m))
			shards = append(shards, m.Shard)
		}
		sort.Slice(shards, func(i, j int) bool { return shards[i] < shards[j] })
		for i := 0; i < len(shards); {
			j := i
			for j < len(shards) && shards[j] == shards[i] {
				j++
			}
			ob := g.outbox(shards[i])
			parts = append(parts, p.outbox(ob))
			for k := len(ob.Entries) - (j - i); k < len(ob.Entries); k++ {
				parts = append(parts, p.entry(ob.Shard, &ob.Entries[k]))
			}
			i = j
		}
	case RecShipped:
		if ob := g.outbox(r.Shard); ob != nil {
			parts = append(parts, p.outbox(ob))
			dead := groupParts{g: g, n: p.n}
			for i := range l.trimmed {
				parts = append(parts, dead.entry(ob.Shard, &l.trimmed[i]))
			}
		}
		if g.State == Deleting {
			// It may have released joined members (releaseJoined).
			parts = p.members(parts)
		}
	}
	return parts
}

// OldLeaderParts reports whether the parts of a leader are of a format
// older than Parts writes: 2 (a whole group per part) or 3 (a whole
// outbox per part). DecodeLeaderParts
// reads them, but PartsAfter names the parts of the current format: a
// store of such parts must replace them all by the Parts of the state they
// decode to before it stores what PartsAfter returns.
func OldLeaderParts(parts []Part) bool {
	for _, p := range parts {
		if p.Name == partHeader {
			return len(p.Value) > 0 && (p.Value[0] == leaderPartsFormatGroups || p.Value[0] == leaderPartsFormatOutboxes)
		}
	}
	return false
}

// DecodeLeaderParts decodes a leader state from the parts that Parts or
// PartsAfter wrote (those with a Value), in any order, or from parts of
// format 2 (a whole group per part). It refuses, with ErrCorrupt, parts
// that these could not have written: no header or two, an unknown name, a
// value that does not decode, a group of another shard or named after
// another id, a part of a member or an outbox without its group's header
// part, a group with fewer or more parts than its header counts, a group
// that breaks the leader's invariants.
func DecodeLeaderParts(parts []Part, opts Options) (*Leader, error) {
	var l *Leader
	var format uint8
	for _, p := range parts {
		if p.Name != partHeader {
			continue
		}
		if l != nil {
			return nil, fmt.Errorf("%w: two leader headers", ErrCorrupt)
		}
		d := decoder{b: p.Value}
		if format = d.byte(); d.err == nil && format != leaderPartsFormat && format != leaderPartsFormatGroups && format != leaderPartsFormatOutboxes {
			return nil, fmt.Errorf("%w: unknown leader parts format %d", ErrCorrupt, format)
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
	if format == leaderPartsFormatGroups {
		return decodeWholeGroups(l, parts)
	}
	// Each group as its parts come, in any order: its header part, with
	// the numbers of members and outboxes it counts, and the others.
	type assembly struct {
		g                 *Group
		members, outboxes uint64
		ms                []Member
		obs               []Outbox
		// counts: per outbox, the entries its part counts (format 4);
		// entries, the entry parts, by outbox.
		counts  map[ShardID]uint64
		entries map[ShardID][]Entry
	}
	groups := map[string]*assembly{}
	for _, p := range parts {
		if p.Name == partHeader {
			continue
		}
		id, rest, ok := groupOfPart(p.Name)
		if !ok {
			return nil, fmt.Errorf("%w: leader part %q", ErrCorrupt, p.Name)
		}
		a := groups[id]
		if a == nil {
			a = &assembly{}
			groups[id] = a
		}
		d := decoder{b: p.Value}
		switch {
		case rest == "":
			if a.g != nil {
				d.fail()
				break
			}
			a.g = d.groupFields()
			a.members, a.outboxes = d.uint(), d.uint()
			if a.g.Ref.ID != id || a.g.Ref.Leader != l.shard {
				d.fail()
			}
		case rest[0] == partMember && len(rest) >= 5:
			k := Key{Collection: binary.BigEndian.Uint32([]byte(rest[1:5])), Key: rest[5:]}
			a.ms = append(a.ms, d.memberFields(k))
		case rest[0] == partOutbox && len(rest) == 9 && format == leaderPartsFormatOutboxes:
			a.obs = append(a.obs, d.outboxFields(ShardID(binary.BigEndian.Uint64([]byte(rest[1:])))))
		case rest[0] == partOutbox && len(rest) == 9:
			s := ShardID(binary.BigEndian.Uint64([]byte(rest[1:])))
			a.obs = append(a.obs, Outbox{Shard: s, Next: d.uint()})
			if a.counts == nil {
				a.counts = map[ShardID]uint64{}
			}
			a.counts[s] = d.uint()
		case rest[0] == partOutbox && len(rest) == 17 && format == leaderPartsFormat:
			s := ShardID(binary.BigEndian.Uint64([]byte(rest[1:9])))
			if a.entries == nil {
				a.entries = map[ShardID][]Entry{}
			}
			x := d.entryBody()
			x.Seq = binary.BigEndian.Uint64([]byte(rest[9:]))
			a.entries[s] = append(a.entries[s], x)
		default:
			d.fail()
		}
		if err := d.done(); err != nil {
			return nil, fmt.Errorf("%w: leader part %q", err, p.Name)
		}
	}
	for id, a := range groups {
		if a.g == nil || uint64(len(a.ms)) != a.members || uint64(len(a.obs)) != a.outboxes {
			return nil, fmt.Errorf("%w: group %q: not the parts its header counts", ErrCorrupt, id)
		}
		sort.Slice(a.ms, func(i, j int) bool { return a.ms[i].Key.less(a.ms[j].Key) })
		sort.Slice(a.obs, func(i, j int) bool { return a.obs[i].Shard < a.obs[j].Shard })
		if format == leaderPartsFormat {
			for s := range a.entries {
				if _, ok := a.counts[s]; !ok {
					return nil, fmt.Errorf("%w: group %q: entries of an outbox to s%d it does not have", ErrCorrupt, id, s)
				}
			}
			for i := range a.obs {
				ob := &a.obs[i]
				es := a.entries[ob.Shard]
				if uint64(len(es)) != a.counts[ob.Shard] {
					return nil, fmt.Errorf("%w: group %q: outbox to s%d: not the entries its part counts", ErrCorrupt, id, ob.Shard)
				}
				sort.Slice(es, func(i, j int) bool { return es[i].Seq < es[j].Seq })
				ob.Entries = es
			}
		}
		a.g.Members, a.g.Outboxes = a.ms, a.obs
		if !validGroup(a.g) {
			return nil, fmt.Errorf("%w: group %q", ErrCorrupt, id)
		}
		a.g.countOutboxes()
		l.groups[id] = a.g
	}
	return l, nil
}

// decodeWholeGroups decodes into l the groups of leader parts of format 2:
// each whole, in the part "g/" + id.
func decodeWholeGroups(l *Leader, parts []Part) (*Leader, error) {
	for _, p := range parts {
		if p.Name == partHeader {
			continue
		}
		d := decoder{b: p.Value}
		g := d.group()
		if err := d.done(); err != nil {
			return nil, fmt.Errorf("%w: leader part %q", err, p.Name)
		}
		if p.Name != partGroup+g.Ref.ID || l.groups[g.Ref.ID] != nil || g.Ref.Leader != l.shard || !validGroup(g) {
			return nil, fmt.Errorf("%w: leader part %q", ErrCorrupt, p.Name)
		}
		g.countOutboxes()
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
