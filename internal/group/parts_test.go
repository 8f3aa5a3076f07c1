package group

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
)

// partsHarness runs a leader and a follower of shard 1 (every member's
// shard), delivering every message at once, and stores their parts as a
// node does: after every Apply, those PartsAfter returns.
type partsHarness struct {
	t                          *testing.T
	l                          *Leader
	f                          *Follower
	leaderParts, followerParts map[string][]byte
}

func newPartsHarness(t *testing.T) *partsHarness {
	h := &partsHarness{t: t, l: NewLeader(1, Options{}), f: NewFollower(1, Options{}),
		leaderParts: map[string][]byte{}, followerParts: map[string][]byte{}}
	return h
}

// storeParts stores parts into stored as the node does: a part with a nil
// Value is deleted.
func storeParts(stored map[string][]byte, parts []Part) {
	for _, p := range parts {
		if p.Value == nil {
			delete(stored, p.Name)
		} else {
			stored[p.Name] = p.Value
		}
	}
}

func partsOf(stored map[string][]byte) []Part {
	var parts []Part
	for name, v := range stored {
		parts = append(parts, Part{Name: name, Value: v})
	}
	return parts
}

func (h *partsHarness) run(effs []Effect) {
	for len(effs) > 0 {
		var next []Effect
		for _, e := range effs {
			switch e := e.(type) {
			case Log:
				if e.Record.Kind.ForLeader() {
					next = append(next, h.l.Apply(e.Record)...)
					storeParts(h.leaderParts, h.l.PartsAfter(e.Record))
				} else {
					next = append(next, h.f.Apply(e.Record)...)
					storeParts(h.followerParts, h.f.PartsAfter(e.Record))
				}
			case Send:
				switch m := e.Msg; m.Type {
				case MsgJ:
					next = append(next, h.f.OnJ(m, KeyCheck{Value: []byte("v0"), Version: 1})...)
				case MsgJA:
					next = append(next, h.l.OnJA(m)...)
				case MsgJAA:
					next = append(next, h.f.OnJAA(m)...)
				case MsgD:
					next = append(next, h.f.OnD(m)...)
				case MsgDA:
					next = append(next, h.l.OnDA(m)...)
				case MsgShip:
					next = append(next, h.f.OnShip(m)...)
				case MsgShipAck:
					next = append(next, h.l.OnShipAck(m)...)
				}
			}
		}
		effs = next
	}
}

func (h *partsHarness) do(effs []Effect, err error) {
	h.t.Helper()
	if err != nil {
		h.t.Fatal(err)
	}
	h.run(effs)
	for range 2 * h.l.opts.RetryTicks {
		h.run(h.l.Tick())
		h.run(h.f.Tick())
	}
}

// check checks that the stored parts, and the parts of the whole state,
// decode to states that encode as the live ones.
func (h *partsHarness) check() {
	h.t.Helper()
	for _, parts := range [][]Part{partsOf(h.leaderParts), h.l.Parts()} {
		l, err := DecodeLeaderParts(parts, Options{})
		if err != nil || !bytes.Equal(l.Encode(), h.l.Encode()) {
			h.t.Fatalf("leader parts do not round-trip: %v", err)
		}
	}
	for _, parts := range [][]Part{partsOf(h.followerParts), h.f.Parts()} {
		f, err := DecodeFollowerParts(parts, Options{})
		if err != nil || !bytes.Equal(f.Encode(), h.f.Encode()) {
			h.t.Fatalf("follower parts do not round-trip: %v", err)
		}
	}
	if len(h.leaderParts) != len(h.l.Parts()) || len(h.followerParts) != len(h.f.Parts()) {
		h.t.Fatalf("%d leader and %d follower parts stored, the state has %d and %d",
			len(h.leaderParts), len(h.followerParts), len(h.l.Parts()), len(h.f.Parts()))
	}
	for _, parts := range [][]Part{h.l.Parts(), h.f.Parts()} {
		names := make([]string, len(parts))
		for i, p := range parts {
			names[i] = p.Name
		}
		if names[0] != partHeader || !sort.StringsAreSorted(names[1:]) || len(slices.Compact(slices.Clone(names))) != len(names) {
			h.t.Fatalf("part names not the header, then sorted and unique: %q", names)
		}
	}
}

// TestPartsRoundTrip drives a leader and a follower through the life of
// two groups, storing their parts as PartsAfter returns them, and checks
// after each step that the stored parts, and those of Parts, decode to
// the live states; that an empty state is its header alone; and that a
// group forgotten after its deletion, and the keys it freed, leave no
// part.
func TestPartsRoundTrip(t *testing.T) {
	h := newPartsHarness(t)
	if lp, fp := h.l.Parts(), h.f.Parts(); len(lp) != 1 || len(fp) != 1 || lp[0].Name != partHeader || fp[0].Name != partHeader {
		t.Fatalf("parts of empty states: %q %q", lp, fp)
	}
	storeParts(h.leaderParts, h.l.Parts())
	storeParts(h.followerParts, h.f.Parts())
	h.check()

	// Keys whose names sort in the order of keys: collections compare
	// first, as numbers; a key may hold any byte.
	a, b := Key{Collection: 7, Key: "k\x00ey"}, Key{Collection: 7, Key: "k\xffey"}
	c, d := Key{Collection: 256, Key: ""}, Key{Collection: 1<<32 - 1, Key: "a"}
	h.do(h.l.Create(CreateRequest{ID: "g", Mode: Atomic, Leader: a, Members: []Member{{Key: c, Shard: 1}}}))
	h.check()
	h.do(h.l.Create(CreateRequest{ID: "g\x00/h", Mode: BestEffort, Leader: b, Members: []Member{{Key: d, Shard: 1}}}))
	h.check()
	if g, _ := h.l.Group("g\x00/h"); g.State != Active || len(h.f.Keys()) != 4 {
		t.Fatalf("groups not active: %+v, keys %v", g, h.f.Keys())
	}
	// A write stays in the outbox until the ship is acknowledged (no tick
	// in between), then the follower has applied it.
	effs, err := h.l.Write("g", []Write{{Key: c, Value: []byte("v1")}, {Key: a, Delete: true}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	h.run(effs)
	h.check()
	h.do(nil, nil)
	h.check()
	if y, _ := h.f.Key(c); y.Shipped == 0 {
		t.Fatalf("write not shipped: %+v", y)
	}
	if _, ok := h.leaderParts[groupName("g")]; !ok {
		t.Fatal("no part for group g")
	}

	h.do(h.l.Delete("g"))
	h.check()
	if _, ok := h.l.Group("g"); ok {
		t.Fatal("group g not forgotten")
	}
	for name := range h.leaderParts {
		if strings.HasPrefix(name, groupName("g")) {
			t.Fatalf("part %q of a forgotten group is still stored", name)
		}
	}
	for _, k := range []Key{a, c} {
		if _, ok := h.followerParts[keyPartName(k)]; ok {
			t.Fatalf("the part of freed key %s is still stored", k)
		}
	}
	// The headers keep the last incarnation and the last yield id, which
	// are never reused.
	l, err := DecodeLeaderParts(partsOf(h.leaderParts), Options{})
	if err != nil || l.nextInc != 2 {
		t.Fatalf("decoded leader: nextInc %d, %v", l.nextInc, err)
	}
	h.do(h.l.Delete("g\x00/h"))
	h.check()
	if len(h.leaderParts) != 1 || len(h.followerParts) != 1 {
		t.Fatalf("parts left after every group was deleted: %d, %d", len(h.leaderParts), len(h.followerParts))
	}
	f, err := DecodeFollowerParts(partsOf(h.followerParts), Options{})
	if err != nil || f.lastYield != 4 {
		t.Fatalf("decoded follower: lastYield %d, %v", f.lastYield, err)
	}

	// Records of the other side change nothing.
	if p := h.l.PartsAfter(Record{Kind: RecYield, Key: a}); p != nil {
		t.Errorf("leader parts after a follower record: %q", p)
	}
	if p := h.f.PartsAfter(Record{Kind: RecCreate, Group: Ref{ID: "g"}}); p != nil {
		t.Errorf("follower parts after a leader record: %q", p)
	}
}

// TestPartsAfterWrite checks on a group of 40 members on 4 shards, with
// 765-byte values, that a write of two members rewrites their parts and
// those of their outboxes only, and its acknowledgment the part of its
// outbox only, whatever the group's size; that a deletion leaves no part
// of the group; and that the parts stored through PartsAfter decode to
// the live state after every record.
func TestPartsAfterWrite(t *testing.T) {
	l := NewLeader(1, Options{})
	stored := map[string][]byte{}
	storeParts(stored, l.Parts())
	// apply applies r and stores the parts PartsAfter returns; it returns
	// their names, sorted, and the size of their values.
	apply := func(r Record) ([]string, int) {
		t.Helper()
		l.Apply(r)
		parts := l.PartsAfter(r)
		storeParts(stored, parts)
		got, err := DecodeLeaderParts(partsOf(stored), Options{})
		if err != nil || !bytes.Equal(got.Encode(), l.Encode()) {
			t.Fatalf("after %s, the stored parts do not decode to the live state: %v", r, err)
		}
		var names []string
		size := 0
		for _, p := range parts {
			names = append(names, p.Name)
			size += len(p.Value)
		}
		sort.Strings(names)
		return names, size
	}
	value := bytes.Repeat([]byte("v"), 765)
	var members []Member
	for i := range 40 {
		members = append(members, Member{Key: Key{Collection: 7, Key: fmt.Sprintf("m%02d", i)}, Shard: ShardID(1 + i%4)})
	}
	effs, err := l.Create(CreateRequest{ID: "g/40", Mode: Atomic, Leader: members[0].Key, Members: members[1:]})
	if err != nil {
		t.Fatal(err)
	}
	apply(effs[0].(Log).Record)
	g, _ := l.Group("g/40")
	for i, m := range g.Members {
		apply(Record{Kind: RecJoin, Group: g.Ref, Key: m.Key, Yield: uint64(i + 1), Value: value, Version: 1, Shard: m.Shard})
	}
	if g, _ = l.Group("g/40"); g.State != Active {
		t.Fatalf("group %s", g.State)
	}
	if n := len(l.Parts()); n != 1+1+40+4 || len(stored) != n {
		t.Fatalf("%d parts, %d stored; want the header, the group's, 40 members' and 4 outboxes'", n, len(stored))
	}

	gn := groupName("g/40")
	a, b := members[5], members[10]
	effs, err = l.Write("g/40", []Write{{Key: a.Key, Value: value}, {Key: b.Key, Delete: true}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := effs[0].(Log).Record
	rec.Version = 2
	oa, ob := outboxPartName(gn, a.Shard), outboxPartName(gn, b.Shard)
	want := []string{memberPartName(gn, a.Key), memberPartName(gn, b.Key), oa, entryPartName(oa, 1), ob, entryPartName(ob, 1)}
	sort.Strings(want)
	names, size := apply(rec)
	if !slices.Equal(names, want) {
		t.Fatalf("parts after a write of two members:\n%q\nwant\n%q", names, want)
	}
	// The member's value, and the outbox entry that carries it.
	if size > 2*len(value)+100 {
		t.Fatalf("a write of two members stores %d bytes", size)
	}
	// A write stores its own entry, not the outbox's earlier ones.
	for i := range 20 {
		effs, err := l.Write("g/40", []Write{{Key: a.Key, Value: value}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		rec := effs[0].(Log).Record
		rec.Version = uint64(3 + i)
		names, size := apply(rec)
		if want := []string{memberPartName(gn, a.Key), oa, entryPartName(oa, uint64(2+i))}; !slices.Equal(names, want) {
			t.Fatalf("parts after write %d to an outbox of %d entries:\n%q\nwant\n%q", i, i+1, names, want)
		}
		if size > 2*len(value)+100 {
			t.Fatalf("write %d to an outbox of %d entries stores %d bytes", i, i+1, size)
		}
	}
	// An acknowledgment deletes the entries it covers.
	names, size = apply(Record{Kind: RecShipped, Group: g.Ref, Shard: a.Shard, Seq: 15})
	want = []string{oa}
	for seq := range uint64(15) {
		want = append(want, entryPartName(oa, seq+1))
	}
	if !slices.Equal(names, want) || size > 20 {
		t.Fatalf("parts after an acknowledgment (%d bytes): %q\nwant %q", size, names, want)
	}

	// Deleting releases every member; the last release forgets the group,
	// with the entries still in its outboxes.
	apply(Record{Kind: RecDelete, Group: Ref{ID: "g/40", Leader: 1}})
	apply(Record{Kind: RecShipped, Group: g.Ref, Shard: b.Shard, Seq: 1})
	apply(Record{Kind: RecShipped, Group: g.Ref, Shard: a.Shard, Seq: 18})
	for i, m := range g.Members {
		apply(Record{Kind: RecRelease, Group: g.Ref, Key: m.Key, Yield: uint64(i + 1)})
	}
	if _, ok := l.Group("g/40"); ok || len(stored) != 1 {
		t.Fatalf("after deleting the group, %d parts stored (live: %v)", len(stored), ok)
	}
}

// TestGroupNames checks that the names of groups decode to their ids and
// sort as them, each group's parts between its name and the next group's,
// and that no group's name begins another's.
func TestGroupNames(t *testing.T) {
	ids := []string{"", "\x00", "\x00\x00", "\x00\x01", "\x00\xff", "\x01", "a", "a\x00", "a\x00\x01", "a\x00b",
		"a\x01", "a/", "a/b", "a\xff", "ab", "\xff", "\xff\x00"}
	sort.Strings(ids)
	last := func(n string) string { return outboxPartName(n, 1<<64-1) }
	for i, id := range ids {
		n := groupName(id)
		for _, suffix := range []string{"", memberPartName("", Key{Collection: 1, Key: "\x00\x01"}), outboxPartName("", 2)} {
			if got, rest, ok := groupOfPart(n + suffix); !ok || got != id || rest != suffix {
				t.Errorf("groupOfPart(%q) = %q, %q, %v; want %q, %q", n+suffix, got, rest, ok, id, suffix)
			}
		}
		for j, o := range ids {
			on := groupName(o)
			if j != i && strings.HasPrefix(on, n) {
				t.Errorf("the name of %q begins with that of %q", o, id)
			}
			if i < j && !(last(n) < on) {
				t.Errorf("a part of %q sorts after the name of %q", id, o)
			}
		}
	}
	for _, name := range []string{"", "g", "g/", "g/a", "g/a\x00", "g/a\x00\x02", "g/a\x00\x00\x01", "h/a\x00\x01", "k/a\x00\x01"} {
		if id, rest, ok := groupOfPart(name); ok {
			t.Errorf("groupOfPart(%q) = %q, %q", name, id, rest)
		}
	}
}

// formatTwoParts returns l's parts in format 2, as shards stored them
// before the members of a group had parts of their own: the header, and
// per group the part "g/" + id, the group whole as in Encode.
func formatTwoParts(l *Leader) []Part {
	h := l.header()
	h.Value[0] = leaderPartsFormatGroups
	parts := []Part{h}
	for _, id := range l.ids() {
		var e encoder
		e.group(l.groups[id])
		parts = append(parts, Part{Name: partGroup + id, Value: e.b})
	}
	return parts
}

// TestPartsFormatTwo checks that leader parts of format 2 decode to the
// state that wrote them, and that OldLeaderParts tells them from the
// current format.
func TestPartsFormatTwo(t *testing.T) {
	h := newPartsHarness(t)
	a, b, c := Key{Collection: 1, Key: "a"}, Key{Collection: 1, Key: "b"}, Key{Collection: 1, Key: "c"}
	h.do(h.l.Create(CreateRequest{ID: "g", Mode: Atomic, Leader: a, Members: []Member{{Key: b, Shard: 1}}}))
	h.do(h.l.Create(CreateRequest{ID: "g/x", Mode: BestEffort, Leader: c}))
	effs, err := h.l.Write("g", []Write{{Key: b, Value: []byte("v1")}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	h.run(effs[:1]) // applied, not shipped: an outbox entry
	if g, _ := h.l.Group("g"); len(g.Outboxes[0].Entries) != 1 {
		t.Fatalf("outboxes: %+v", g.Outboxes)
	}
	old := formatTwoParts(h.l)
	l, err := DecodeLeaderParts(old, Options{})
	if err != nil || !bytes.Equal(l.Encode(), h.l.Encode()) {
		t.Fatalf("parts of format 2 do not decode to the state: %v", err)
	}
	if !OldLeaderParts(old) || OldLeaderParts(h.l.Parts()) || OldLeaderParts(nil) {
		t.Fatal("OldLeaderParts does not tell the formats apart")
	}
	slices.Reverse(old)
	if _, err := DecodeLeaderParts(old, Options{}); err != nil {
		t.Fatalf("parts of format 2 in reverse order: %v", err)
	}
}

// formatThreeParts returns l's parts in format 3, as shards stored them
// before outbox entries had parts of their own: each outbox whole, its
// entries in its part.
func formatThreeParts(l *Leader) []Part {
	var parts []Part
	for _, p := range l.Parts() {
		id, rest, ok := groupOfPart(p.Name)
		switch {
		case p.Name == partHeader:
			p.Value[0] = leaderPartsFormatOutboxes
		case ok && len(rest) == 17:
			continue // an entry
		case ok && len(rest) == 9 && rest[0] == partOutbox:
			var e encoder
			e.outboxFields(*l.groups[id].outbox(ShardID(binary.BigEndian.Uint64([]byte(rest[1:])))))
			p.Value = e.b
		}
		parts = append(parts, p)
	}
	return parts
}

// entriesHarness is a harness whose group "g" has two entries not
// shipped in its outbox to shard 1.
func entriesHarness(t *testing.T) *partsHarness {
	h := newPartsHarness(t)
	a, b := Key{Collection: 1, Key: "a"}, Key{Collection: 1, Key: "b"}
	h.do(h.l.Create(CreateRequest{ID: "g", Mode: Atomic, Leader: a, Members: []Member{{Key: b, Shard: 1}}}))
	for _, v := range []string{"v1", "v2"} {
		effs, err := h.l.Write("g", []Write{{Key: b, Value: []byte(v)}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		h.run(effs[:1]) // applied, not shipped: an outbox entry
	}
	if g, _ := h.l.Group("g"); len(g.Outboxes[0].Entries) != 2 {
		t.Fatalf("outboxes: %+v", g.Outboxes)
	}
	return h
}

// TestPartsFormatThree checks that leader parts of format 3 decode to the
// state that wrote them, and that OldLeaderParts tells them from the
// current format.
func TestPartsFormatThree(t *testing.T) {
	h := entriesHarness(t)
	old := formatThreeParts(h.l)
	if len(old) != len(h.l.Parts())-2 {
		t.Fatalf("format 3: %q", old)
	}
	l, err := DecodeLeaderParts(old, Options{})
	if err != nil || !bytes.Equal(l.Encode(), h.l.Encode()) {
		t.Fatalf("parts of format 3 do not decode to the state: %v", err)
	}
	if !OldLeaderParts(old) {
		t.Fatal("OldLeaderParts does not tell format 3 from the current one")
	}
	slices.Reverse(old)
	if _, err := DecodeLeaderParts(old, Options{}); err != nil {
		t.Fatalf("parts of format 3 in reverse order: %v", err)
	}
}

// TestPartsEntriesCorrupt checks that outbox entries that Parts could not
// have written are refused with ErrCorrupt.
func TestPartsEntriesCorrupt(t *testing.T) {
	h := entriesHarness(t)
	lp := h.l.Parts()
	o := outboxPartName(groupName("g"), 1)
	var e1, e2 Part
	var rest []Part // every part but the entries
	for _, p := range lp {
		switch p.Name {
		case entryPartName(o, 1):
			e1 = p
		case entryPartName(o, 2):
			e2 = p
		default:
			rest = append(rest, p)
		}
	}
	if e1.Value == nil || e2.Value == nil {
		t.Fatalf("no entry parts in %q", lp)
	}
	with := func(ps ...Part) []Part { return append(slices.Clone(rest), ps...) }
	named := func(p Part, name string) Part { return Part{Name: name, Value: p.Value} }
	cases := map[string][]Part{
		"entry missing":         with(e2),
		"entry not counted":     with(e1, e2, named(e2, entryPartName(o, 3))),
		"entry twice":           with(e1, e2, e2),
		"entries not in a row":  with(e1, named(e2, entryPartName(o, 5))),
		"entry of no outbox":    with(e1, e2, named(e2, entryPartName(outboxPartName(groupName("g"), 9), 1))),
		"entry truncated":       with(e1, Part{Name: e2.Name, Value: e2.Value[:len(e2.Value)-1]}),
		"entry trailing":        with(e1, Part{Name: e2.Name, Value: append(slices.Clone(e2.Value), 0)}),
		"entry name long":       with(e1, named(e2, e2.Name+"\x00")),
		"format 3, entry parts": append(formatThreeParts(h.l), e1),
	}
	for name, parts := range cases {
		if _, err := DecodeLeaderParts(parts, Options{}); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
	}
	if _, err := DecodeLeaderParts(with(e2, e1), Options{}); err != nil {
		t.Fatalf("the parts themselves: %v", err)
	}
}

// TestPartsCorrupt checks that parts that Parts could not have written
// (nor a shard that stored format 2) are refused with ErrCorrupt.
func TestPartsCorrupt(t *testing.T) {
	h := newPartsHarness(t)
	k, m := Key{Collection: 1, Key: "a"}, Key{Collection: 1, Key: "b"}
	h.do(h.l.Create(CreateRequest{ID: "g", Mode: Atomic, Leader: k, Members: []Member{{Key: m, Shard: 1}}}))
	lp, fp := h.l.Parts(), h.f.Parts()
	if len(lp) != 5 || len(fp) != 3 {
		t.Fatalf("parts: %q %q", lp, fp)
	}
	if y, _ := h.f.Key(m); y.Yield != 2 || fp[2].Name != keyPartName(m) {
		t.Fatalf("yield of %s: %+v", m, y)
	}
	gn := groupName("g")
	lh, lg, lk, lm, lo := lp[0], lp[1], lp[2], lp[3], lp[4]
	if lg.Name != gn || lk.Name != memberPartName(gn, k) || lm.Name != memberPartName(gn, m) || lo.Name != outboxPartName(gn, 1) {
		t.Fatalf("leader parts: %q", lp)
	}
	fh, fk := fp[0], fp[1]
	other := NewLeader(2, Options{})
	other.nextInc = 1
	otherHeader := other.header()
	unknownFormat := Part{Name: partHeader, Value: slices.Clone(lh.Value)}
	unknownFormat.Value[0] = leaderPartsFormat + 1
	named := func(p Part, name string) Part { return Part{Name: name, Value: p.Value} }
	// renamed returns parts, those of group g named after group h.
	renamed := func(parts ...Part) []Part {
		var out []Part
		for _, p := range parts {
			out = append(out, named(p, groupName("h")+strings.TrimPrefix(p.Name, gn)))
		}
		return out
	}

	old := formatTwoParts(h.l)
	oh, og := old[0], old[1]
	var e encoder
	g := h.l.groups["g"].clone()
	g.Members[0], g.Members[1] = g.Members[1], g.Members[0]
	e.group(&g)
	unsorted := e.b

	f2 := NewFollower(1, Options{})
	f2.lastYield = 1
	lowHeader := f2.header()
	zero := *h.f.keys[k]
	zero.Yield = 0
	e = encoder{}
	e.yielded(&zero)
	zeroYield := e.b

	leaderCases := map[string][]Part{
		"no parts":                   nil,
		"no header":                  {lg, lk, lm, lo},
		"two headers":                {lh, lh, lg, lk, lm, lo},
		"empty header":               {{Name: partHeader}},
		"header trailing":            {{Name: partHeader, Value: append(slices.Clone(lh.Value), 0)}},
		"unknown format":             {unknownFormat},
		"whole encoding":             {{Name: partHeader, Value: h.l.Encode()}},
		"unknown name":               {lh, named(lg, "x")},
		"name of no group":           {lh, named(lg, "g/g")},
		"bad escape":                 {lh, named(lg, "g/g\x00\x02")},
		"misnamed group":             append([]Part{lh}, renamed(lg, lk, lm, lo)...),
		"group twice":                {lh, lg, lg, lk, lm, lo},
		"group truncated":            {lh, {Name: lg.Name, Value: lg.Value[:len(lg.Value)-1]}, lk, lm, lo},
		"group of shard 2":           {otherHeader, lg, lk, lm, lo},
		"orphan member":              {lh, lk},
		"orphan outbox":              {lh, lo},
		"member missing":             {lh, lg, lk, lo},
		"member of another group":    {lh, lg, lk, lm, lo, renamed(lm)[0]},
		"member not counted":         {lh, lg, lk, lm, lo, named(lm, memberPartName(gn, Key{Collection: 1, Key: "c"}))},
		"member twice":               {lh, lg, lk, lk, lo},
		"member name short":          {lh, lg, lk, named(lm, gn+"m\x00\x00\x01"), lo},
		"member truncated":           {lh, lg, lk, {Name: lm.Name, Value: lm.Value[:len(lm.Value)-1]}, lo},
		"member trailing":            {lh, lg, lk, {Name: lm.Name, Value: append(slices.Clone(lm.Value), 0)}, lo},
		"outbox missing":             {lh, lg, lk, lm},
		"outbox twice":               {lh, lg, lk, lm, lo, lo},
		"outbox name long":           {lh, lg, lk, lm, named(lo, lo.Name+"\x00")},
		"unknown group part":         {lh, lg, lk, lm, named(lo, gn+"x")},
		"format 2, format 4 parts":   {oh, lg, lk, lm, lo},
		"format 4, format 2 parts":   {lh, og},
		"format 2, misnamed group":   {oh, named(og, partGroup+"h")},
		"format 2, members unsorted": {oh, {Name: og.Name, Value: unsorted}},
		"follower parts":             fp,
	}
	for name, parts := range leaderCases {
		if _, err := DecodeLeaderParts(parts, Options{}); !errors.Is(err, ErrCorrupt) {
			t.Errorf("leader, %s: %v, want ErrCorrupt", name, err)
		}
	}
	followerCases := map[string][]Part{
		"no parts":         nil,
		"no header":        {fk},
		"two headers":      {fh, fh},
		"whole encoding":   {{Name: partHeader, Value: h.f.Encode()}},
		"unknown name":     {fh, {Name: "g/a", Value: fk.Value}},
		"short name":       {fh, {Name: partKey + "\x00\x00\x01", Value: fk.Value}},
		"key twice":        {fh, fk, fk},
		"value trailing":   {fh, {Name: fk.Name, Value: append(slices.Clone(fk.Value), 0)}},
		"yield 0":          {fh, {Name: fk.Name, Value: zeroYield}},
		"yield above last": {lowHeader, fp[2]},
		"leader parts":     lp,
	}
	for name, parts := range followerCases {
		if _, err := DecodeFollowerParts(parts, Options{}); !errors.Is(err, ErrCorrupt) {
			t.Errorf("follower, %s: %v, want ErrCorrupt", name, err)
		}
	}
	// The good parts decode, in any order.
	if _, err := DecodeLeaderParts([]Part{lo, lm, lg, lk, lh}, Options{}); err != nil {
		t.Errorf("leader parts in reverse order: %v", err)
	}
	if _, err := DecodeFollowerParts([]Part{fp[2], fh, fk}, Options{}); err != nil {
		t.Errorf("follower parts out of order: %v", err)
	}
}

// encodeParts frames parts for the fuzzer: a count, then each name and
// value.
func encodeParts(parts []Part) []byte {
	var e encoder
	e.uint(uint64(len(parts)))
	for _, p := range parts {
		e.str(p.Name)
		e.bytes(p.Value)
	}
	return e.b
}

func decodeParts(b []byte) ([]Part, bool) {
	d := decoder{b: b}
	var parts []Part
	for range d.count(2) {
		parts = append(parts, Part{Name: d.str(), Value: d.bytes()})
	}
	return parts, d.done() == nil
}

// partsFuzzCheck checks that parts fail with ErrCorrupt or decode to a
// state whose parts are the same, in any order (parts are canonical).
func partsFuzzCheck[T any](t *testing.T, parts []Part, dec func([]Part) (T, error), enc func(T) []Part) {
	v, err := dec(parts)
	if err != nil {
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("decode(%q): %v is not ErrCorrupt", parts, err)
		}
		return
	}
	byName := func(ps []Part) []Part {
		ps = slices.Clone(ps)
		sort.Slice(ps, func(i, j int) bool { return ps[i].Name < ps[j].Name })
		return ps
	}
	if got, want := byName(enc(v)), byName(parts); !reflect.DeepEqual(got, want) {
		t.Fatalf("parts(decode(%q)) = %q", want, got)
	}
}

// FuzzDecodeParts: the same as FuzzDecodeState for states in parts; leader
// parts of format 2 decode to a state whose parts of format 2 are the same,
// and whose parts decode to it.
func FuzzDecodeParts(f *testing.F) {
	l := NewLeader(1, Options{})
	f.Add(encodeParts(l.Parts()))
	effs, _ := l.Create(CreateRequest{ID: "g", Mode: BestEffort, Leader: Key{Key: "a"}, Members: []Member{{Key: Key{Collection: 2, Key: "b"}, Shard: 3}}})
	l.Apply(effs[0].(Log).Record)
	f.Add(encodeParts(l.Parts()))
	g, _ := l.Group("g")
	l.Apply(Record{Kind: RecJoin, Group: g.Ref, Key: Key{Key: "a"}, Yield: 1, Value: []byte("v"), Version: 1, Shard: 1})
	l.Apply(Record{Kind: RecJoin, Group: g.Ref, Key: Key{Collection: 2, Key: "b"}, Yield: 4, Absent: true, Version: 2, Shard: 3})
	l.Apply(Record{Kind: RecWrite, Group: g.Ref, Writes: []Write{{Key: Key{Collection: 2, Key: "b"}, Value: []byte("w")}}, Version: 3})
	effs, _ = l.Create(CreateRequest{ID: "g\x00/h", Mode: Atomic, Leader: Key{Key: "c"}})
	l.Apply(effs[0].(Log).Record)
	f.Add(encodeParts(l.Parts()))
	f.Add(encodeParts(formatTwoParts(l)))
	f.Add(encodeParts(formatThreeParts(l)))
	fl := NewFollower(1, Options{})
	f.Add(encodeParts(fl.Parts()))
	fl.Apply(Record{Kind: RecYield, Group: Ref{ID: "g", Leader: 1, Inc: 1}, Key: Key{Key: "a"}, Value: []byte("v")})
	fl.Apply(Record{Kind: RecYield, Group: Ref{ID: "g", Leader: 1, Inc: 1}, Key: Key{Collection: 9, Key: strings.Repeat("b", 3)}})
	f.Add(encodeParts(fl.Parts()))
	decodeLeader := func(p []Part) (*Leader, error) { return DecodeLeaderParts(p, Options{}) }
	f.Fuzz(func(t *testing.T, b []byte) {
		parts, ok := decodeParts(b)
		if !ok {
			return
		}
		if OldLeaderParts(parts) {
			old := formatTwoParts
			if parts[slices.IndexFunc(parts, func(p Part) bool { return p.Name == partHeader })].Value[0] == leaderPartsFormatOutboxes {
				old = formatThreeParts
			}
			partsFuzzCheck(t, parts, decodeLeader, old)
			if l, err := decodeLeader(parts); err == nil {
				if l2, err := decodeLeader(l.Parts()); err != nil || !bytes.Equal(l2.Encode(), l.Encode()) {
					t.Fatalf("the parts of the state of old format parts %q do not decode to it: %v", parts, err)
				}
			}
		} else {
			partsFuzzCheck(t, parts, decodeLeader, (*Leader).Parts)
		}
		partsFuzzCheck(t, parts, func(p []Part) (*Follower, error) { return DecodeFollowerParts(p, Options{}) }, (*Follower).Parts)
	})
}
