package group

import (
	"encoding/binary"
	"fmt"
)

// Encodings are deterministic (maps are written in key order) and
// canonical: a byte string that decodes encodes back to itself, so
// replicas that hold the same state hold the same bytes. Each encoding of
// a state begins with a format version; a decoder refuses versions it does
// not know.

const (
	leaderFormat   = 1
	followerFormat = 1
)

type encoder struct{ b []byte }

func (e *encoder) uint(v uint64) { e.b = binary.AppendUvarint(e.b, v) }
func (e *encoder) byte(v uint8)  { e.b = append(e.b, v) }
func (e *encoder) bool(v bool) {
	if v {
		e.b = append(e.b, 1)
	} else {
		e.b = append(e.b, 0)
	}
}
func (e *encoder) bytes(p []byte) { e.uint(uint64(len(p))); e.b = append(e.b, p...) }
func (e *encoder) str(s string)   { e.uint(uint64(len(s))); e.b = append(e.b, s...) }
func (e *encoder) key(k Key)      { e.uint(uint64(k.Collection)); e.str(k.Key) }
func (e *encoder) ref(r Ref)      { e.str(r.ID); e.uint(uint64(r.Leader)); e.uint(r.Inc) }
func (e *encoder) write(w Write)  { e.key(w.Key); e.bytes(w.Value); e.absentTags(w.Delete, w.Tags) }

// absentTags writes a value's absence (or a write's deletion) and its tags
// in one byte and what follows: bit 0 absent, bit 1 tags known, then, if
// known, their number and each tag. States and messages of builds without
// tags wrote the byte as a bool, 0 or 1: they read as tags to keep.
func (e *encoder) absentTags(absent bool, t Tags) {
	var b uint8
	if absent {
		b = 1
	}
	if !t.Keep {
		b |= 2
	}
	e.byte(b)
	if t.Keep {
		return
	}
	e.uint(uint64(len(t.List)))
	for _, s := range t.List {
		e.str(s)
	}
}
func (e *encoder) entries(es []Entry) {
	e.uint(uint64(len(es)))
	for _, x := range es {
		e.uint(x.Seq)
		e.entryBody(x)
	}
}

// entryBody writes an entry but its sequence number: its write, whose
// absent-and-tags byte has bit 2 set when a Version follows (an entry of
// an older build has none: the byte is as a write's).
func (e *encoder) entryBody(x Entry) {
	e.key(x.Key)
	e.bytes(x.Value)
	at := len(e.b)
	e.absentTags(x.Delete, x.Tags)
	if x.Version > 0 {
		e.b[at] |= 4
		e.uint(x.Version)
	}
}

// decoder reads what encoder wrote; the first failure sticks in err and
// every later read returns zero values.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail() { d.err, d.b = ErrCorrupt, nil }

func (d *decoder) uint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 || n > 1 && d.b[n-1] == 0 {
		// Only the minimal encoding is valid: one value, one encoding.
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) uintMax(limit uint64) uint64 {
	v := d.uint()
	if v > limit {
		d.fail()
		return 0
	}
	return v
}

func (d *decoder) byte() uint8 {
	if d.err != nil || len(d.b) == 0 {
		d.fail()
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) bool() bool {
	switch d.byte() {
	case 0:
		return false
	case 1:
		return true
	}
	d.fail()
	return false
}

// bytes returns a copy, nil if empty.
func (d *decoder) bytes() []byte {
	n := d.uint()
	if d.err != nil || n > uint64(len(d.b)) {
		d.fail()
		return nil
	}
	if n == 0 {
		return nil
	}
	p := append([]byte(nil), d.b[:n]...)
	d.b = d.b[n:]
	return p
}

func (d *decoder) str() string { return string(d.bytes()) }

// absentTags reads what encoder.absentTags wrote. Tags{Keep: true} has no
// list, and a known list is nil when empty, so that they encode back the
// same.
func (d *decoder) absentTags() (bool, Tags) { return d.absentTagsFrom(d.byte()) }

// absentTagsFrom is absentTags with its byte, b, read.
func (d *decoder) absentTagsFrom(b uint8) (bool, Tags) {
	if d.err != nil || b > 3 {
		d.fail()
		return false, Tags{}
	}
	t := Tags{Keep: b&2 == 0}
	if !t.Keep {
		for range d.count(1) {
			t.List = append(t.List, d.str())
		}
	}
	return b&1 != 0, t
}

// count reads a slice length, each element taking at least min bytes.
func (d *decoder) count(min int) int {
	n := d.uint()
	if d.err != nil || n > uint64(len(d.b)/min) {
		d.fail()
		return 0
	}
	return int(n)
}

func (d *decoder) key() Key {
	return Key{Collection: uint32(d.uintMax(1<<32 - 1)), Key: d.str()}
}
func (d *decoder) ref() Ref { return Ref{ID: d.str(), Leader: ShardID(d.uint()), Inc: d.uint()} }
func (d *decoder) write() Write {
	w := Write{Key: d.key(), Value: d.bytes()}
	w.Delete, w.Tags = d.absentTags()
	return w
}
func (d *decoder) entries() []Entry {
	n := d.count(5)
	var es []Entry
	for range n {
		seq := d.uint()
		x := d.entryBody()
		x.Seq = seq
		es = append(es, x)
	}
	return es
}

// entryBody reads what encoder.entryBody wrote.
func (d *decoder) entryBody() Entry {
	x := Entry{Write: Write{Key: d.key(), Value: d.bytes()}}
	b := d.byte()
	x.Delete, x.Tags = d.absentTagsFrom(b &^ 4)
	if b&4 != 0 {
		if x.Version = d.uint(); x.Version == 0 {
			d.fail() // canonical: no version is written as none
		}
	}
	return x
}

func (d *decoder) done() error {
	if d.err == nil && len(d.b) != 0 {
		d.fail()
	}
	return d.err
}

func (e *encoder) member(m Member) {
	e.key(m.Key)
	e.memberFields(m)
}

// memberFields writes m but its key.
func (e *encoder) memberFields(m Member) {
	e.uint(uint64(m.Shard))
	e.byte(uint8(m.Status))
	e.uint(m.Yield)
	e.bytes(m.Value)
	e.absentTags(m.Absent, m.Tags)
	e.uint(m.Version)
	e.str(m.Reason)
}

func (d *decoder) member() Member {
	return d.memberFields(d.key())
}

// memberFields reads what encoder.memberFields wrote, of the member of key k.
func (d *decoder) memberFields(k Key) Member {
	m := Member{Key: k, Shard: ShardID(d.uint()), Status: MemberStatus(d.byte()), Yield: d.uint(), Value: d.bytes()}
	m.Absent, m.Tags = d.absentTags()
	m.Version, m.Reason = d.uint(), d.str()
	return m
}

// EncodeRecord encodes r. Every field is written whatever the kind, so the
// encoding is canonical.
func EncodeRecord(r Record) []byte {
	var e encoder
	e.byte(uint8(r.Kind))
	e.ref(r.Group)
	e.byte(uint8(r.Mode))
	e.key(r.Key)
	e.uint(uint64(len(r.Members)))
	for _, m := range r.Members {
		e.member(m)
	}
	e.uint(r.Yield)
	e.bytes(r.Value)
	e.absentTags(r.Absent, r.Tags)
	e.str(r.Reason)
	e.uint(uint64(r.Shard))
	e.uint(r.Seq)
	e.uint(uint64(len(r.Writes)))
	for _, w := range r.Writes {
		e.write(w)
	}
	e.entries(r.Entries)
	e.uint(r.Version)
	e.uint(uint64(len(r.Reads)))
	for _, rd := range r.Reads {
		e.key(rd.Key)
		e.uint(rd.Version)
	}
	return e.b
}

// DecodeRecord decodes a record; its slices are copies.
func DecodeRecord(b []byte) (Record, error) {
	d := decoder{b: b}
	r := Record{Kind: RecordKind(d.byte()), Group: d.ref(), Mode: Mode(d.byte()), Key: d.key()}
	for range d.count(8) {
		r.Members = append(r.Members, d.member())
	}
	r.Yield, r.Value = d.uint(), d.bytes()
	r.Absent, r.Tags = d.absentTags()
	r.Reason = d.str()
	r.Shard, r.Seq = ShardID(d.uint()), d.uint()
	for range d.count(4) {
		r.Writes = append(r.Writes, d.write())
	}
	r.Entries = d.entries()
	r.Version = d.uint()
	for range d.count(2) {
		r.Reads = append(r.Reads, Read{Key: d.key(), Version: d.uint()})
	}
	if err := d.done(); err != nil {
		return Record{}, err
	}
	if !r.Kind.valid() {
		return Record{}, fmt.Errorf("%w: record kind %d", ErrCorrupt, r.Kind)
	}
	return r, nil
}

// EncodeMessage encodes m for the transport.
func EncodeMessage(m Message) []byte {
	var e encoder
	e.byte(uint8(m.Type))
	e.uint(uint64(m.From))
	e.uint(uint64(m.To))
	e.ref(m.Group)
	e.key(m.Key)
	e.uint(m.Yield)
	e.bytes(m.Value)
	e.absentTags(m.Absent, m.Tags)
	e.uint(m.Version)
	e.str(m.Refused)
	e.bool(m.Probe)
	e.entries(m.Entries)
	e.uint(m.Seq)
	return e.b
}

// DecodeMessage decodes a message; its slices are copies.
func DecodeMessage(b []byte) (Message, error) {
	d := decoder{b: b}
	m := Message{Type: MsgType(d.byte()), From: ShardID(d.uint()), To: ShardID(d.uint()), Group: d.ref(),
		Key: d.key(), Yield: d.uint(), Value: d.bytes()}
	m.Absent, m.Tags = d.absentTags()
	m.Version, m.Refused, m.Probe = d.uint(), d.str(), d.bool()
	m.Entries, m.Seq = d.entries(), d.uint()
	if err := d.done(); err != nil {
		return Message{}, err
	}
	if m.Type < MsgJ || m.Type > MsgShipAck {
		return Message{}, fmt.Errorf("%w: message type %d", ErrCorrupt, m.Type)
	}
	return m, nil
}

// Encode encodes the leader's replicated state (not its volatile retry
// state): it is kept in the shard's storage and carried by raft snapshots.
func (l *Leader) Encode() []byte {
	var e encoder
	e.byte(leaderFormat)
	e.uint(uint64(l.shard))
	e.uint(l.nextInc)
	ids := l.ids()
	e.uint(uint64(len(ids)))
	for _, id := range ids {
		e.group(l.groups[id])
	}
	return e.b
}

func (e *encoder) group(g *Group) {
	e.groupFields(g)
	e.uint(uint64(len(g.Members)))
	for _, m := range g.Members {
		e.member(m)
	}
	e.uint(uint64(len(g.Outboxes)))
	for _, ob := range g.Outboxes {
		e.uint(uint64(ob.Shard))
		e.outboxFields(ob)
	}
}

// groupFields writes g but its members and outboxes.
func (e *encoder) groupFields(g *Group) {
	e.ref(g.Ref)
	e.byte(uint8(g.Mode))
	e.byte(uint8(g.State))
	e.key(g.Leader)
	e.bool(g.Failed)
	e.bool(g.DeleteAsked)
}

// outboxFields writes ob but its shard.
func (e *encoder) outboxFields(ob Outbox) {
	e.uint(ob.Next)
	e.entries(ob.Entries)
}

func (d *decoder) group() *Group {
	g := d.groupFields()
	for range d.count(8) {
		g.Members = append(g.Members, d.member())
	}
	for range d.count(3) {
		g.Outboxes = append(g.Outboxes, d.outboxFields(ShardID(d.uint())))
	}
	return g
}

// groupFields reads what encoder.groupFields wrote.
func (d *decoder) groupFields() *Group {
	return &Group{Ref: d.ref(), Mode: Mode(d.byte()), State: State(d.byte()), Leader: d.key(),
		Failed: d.bool(), DeleteAsked: d.bool()}
}

// outboxFields reads what encoder.outboxFields wrote, of the outbox to
// shard s.
func (d *decoder) outboxFields(s ShardID) Outbox {
	return Outbox{Shard: s, Next: d.uint(), Entries: d.entries()}
}

// DecodeLeader decodes a leader state that Encode wrote.
func DecodeLeader(b []byte, opts Options) (*Leader, error) {
	d := decoder{b: b}
	if v := d.byte(); d.err == nil && v != leaderFormat {
		return nil, fmt.Errorf("%w: unknown leader format %d", ErrCorrupt, v)
	}
	l := NewLeader(ShardID(d.uint()), opts)
	l.nextInc = d.uint()
	prev := ""
	for i := range d.count(8) {
		g := d.group()
		if d.err != nil {
			break
		}
		if i > 0 && g.Ref.ID <= prev || g.Ref.Leader != l.shard || !validGroup(g) {
			d.fail()
			break
		}
		prev = g.Ref.ID
		g.countOutboxes()
		l.groups[g.Ref.ID] = g
	}
	if err := d.done(); err != nil {
		return nil, err
	}
	return l, nil
}

// validGroup checks what the leader's code relies on: known enums, members
// sorted and unique, outboxes sorted and unique, consecutive entries.
func validGroup(g *Group) bool {
	if g.Mode != Atomic && g.Mode != BestEffort || g.State < Creating || g.State > Deleting {
		return false
	}
	for i, m := range g.Members {
		if m.Status < Pending || m.Status > Released || i > 0 && !g.Members[i-1].Key.less(m.Key) {
			return false
		}
	}
	for i, ob := range g.Outboxes {
		if i > 0 && g.Outboxes[i-1].Shard >= ob.Shard {
			return false
		}
		for j, e := range ob.Entries {
			if e.Seq != ob.Next-uint64(len(ob.Entries)-j) {
				return false
			}
		}
	}
	return true
}

// Encode encodes the follower's replicated state (not its volatile tick
// count): it is kept in the shard's storage and carried by raft snapshots.
func (f *Follower) Encode() []byte {
	var e encoder
	e.byte(followerFormat)
	e.uint(uint64(f.shard))
	e.uint(f.lastYield)
	keys := f.Keys()
	e.uint(uint64(len(keys)))
	for _, k := range keys {
		e.key(k)
		e.yielded(f.keys[k])
	}
	return e.b
}

func (e *encoder) yielded(y *Yielded) {
	e.ref(y.Group)
	e.uint(y.Yield)
	e.bool(y.Confirmed)
	e.bytes(y.Value)
	e.absentTags(y.Absent, y.Tags)
	e.uint(y.Version)
	e.uint(y.Shipped)
}

func (d *decoder) yielded() *Yielded {
	y := &Yielded{Group: d.ref(), Yield: d.uint(), Confirmed: d.bool(), Value: d.bytes()}
	y.Absent, y.Tags = d.absentTags()
	y.Version, y.Shipped = d.uint(), d.uint()
	return y
}

// DecodeFollower decodes a follower state that Encode wrote.
func DecodeFollower(b []byte, opts Options) (*Follower, error) {
	d := decoder{b: b}
	if v := d.byte(); d.err == nil && v != followerFormat {
		return nil, fmt.Errorf("%w: unknown follower format %d", ErrCorrupt, v)
	}
	f := NewFollower(ShardID(d.uint()), opts)
	f.lastYield = d.uint()
	var prev Key
	for i := range d.count(10) {
		k := d.key()
		y := d.yielded()
		if d.err != nil {
			break
		}
		if i > 0 && !prev.less(k) || y.Yield == 0 || y.Yield > f.lastYield {
			d.fail()
			break
		}
		prev = k
		f.keys[k] = y
	}
	if err := d.done(); err != nil {
		return nil, err
	}
	return f, nil
}
