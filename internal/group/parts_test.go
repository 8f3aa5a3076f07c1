package group

import (
	"bytes"
	"errors"
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
	if _, ok := h.leaderParts[groupPartName("g")]; !ok {
		t.Fatal("no part for group g")
	}

	h.do(h.l.Delete("g"))
	h.check()
	if _, ok := h.l.Group("g"); ok {
		t.Fatal("group g not forgotten")
	}
	if _, ok := h.leaderParts[groupPartName("g")]; ok {
		t.Fatal("the part of a forgotten group is still stored")
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

// TestPartsCorrupt checks that parts that Parts could not have written are
// refused with ErrCorrupt.
func TestPartsCorrupt(t *testing.T) {
	h := newPartsHarness(t)
	k, m := Key{Collection: 1, Key: "a"}, Key{Collection: 1, Key: "b"}
	h.do(h.l.Create(CreateRequest{ID: "g", Mode: Atomic, Leader: k, Members: []Member{{Key: m, Shard: 1}}}))
	lp, fp := h.l.Parts(), h.f.Parts()
	if len(lp) != 2 || len(fp) != 3 {
		t.Fatalf("parts: %q %q", lp, fp)
	}
	if y, _ := h.f.Key(m); y.Yield != 2 || fp[2].Name != keyPartName(m) {
		t.Fatalf("yield of %s: %+v", m, y)
	}
	lh, lg := lp[0], lp[1]
	fh, fk := fp[0], fp[1]
	other := NewLeader(2, Options{})
	other.nextInc = 1
	otherHeader := other.header()
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
		"no parts":           nil,
		"no header":          {lg},
		"two headers":        {lh, lh, lg},
		"empty header":       {{Name: partHeader}},
		"header trailing":    {{Name: partHeader, Value: append(slices.Clone(lh.Value), 0)}},
		"whole encoding":     {{Name: partHeader, Value: h.l.Encode()}},
		"unknown name":       {lh, {Name: "x", Value: lg.Value}},
		"misnamed group":     {lh, {Name: groupPartName("h"), Value: lg.Value}},
		"group twice":        {lh, lg, lg},
		"group truncated":    {lh, {Name: lg.Name, Value: lg.Value[:len(lg.Value)-1]}},
		"group of a shard 2": {otherHeader, lg},
		"members unsorted":   {lh, {Name: lg.Name, Value: unsorted}},
		"follower parts":     fp,
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
	if _, err := DecodeLeaderParts([]Part{lg, lh}, Options{}); err != nil {
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

// FuzzDecodeParts: the same as FuzzDecodeState for states in parts.
func FuzzDecodeParts(f *testing.F) {
	l := NewLeader(1, Options{})
	f.Add(encodeParts(l.Parts()))
	effs, _ := l.Create(CreateRequest{ID: "g", Mode: BestEffort, Leader: Key{Key: "a"}, Members: []Member{{Key: Key{Collection: 2, Key: "b"}, Shard: 3}}})
	l.Apply(effs[0].(Log).Record)
	f.Add(encodeParts(l.Parts()))
	fl := NewFollower(1, Options{})
	f.Add(encodeParts(fl.Parts()))
	fl.Apply(Record{Kind: RecYield, Group: Ref{ID: "g", Leader: 1, Inc: 1}, Key: Key{Key: "a"}, Value: []byte("v")})
	fl.Apply(Record{Kind: RecYield, Group: Ref{ID: "g", Leader: 1, Inc: 1}, Key: Key{Collection: 9, Key: strings.Repeat("b", 3)}})
	f.Add(encodeParts(fl.Parts()))
	f.Fuzz(func(t *testing.T, b []byte) {
		parts, ok := decodeParts(b)
		if !ok {
			return
		}
		partsFuzzCheck(t, parts, func(p []Part) (*Leader, error) { return DecodeLeaderParts(p, Options{}) }, (*Leader).Parts)
		partsFuzzCheck(t, parts, func(p []Part) (*Follower, error) { return DecodeFollowerParts(p, Options{}) }, (*Follower).Parts)
	})
}
