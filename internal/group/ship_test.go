package group

import (
	"errors"
	"reflect"
	"slices"
	"testing"
)

// TestShipTicks: with ShipTicks 3 a committed write leaves its outbox at
// the third tick, not before, unless ShipNew ships it at once.
func TestShipTicks(t *testing.T) {
	opts := Options{RetryTicks: 100, ShipTicks: 3}
	l, f := NewLeader(1, opts), NewFollower(2, opts)
	effs, err := l.Create(CreateRequest{ID: "g", Mode: Atomic, Leader: Key{Key: "a"}, Members: []Member{{Key: Key{Key: "b"}, Shard: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	runJoin(l, f, effs)
	ships := func(effs []Effect) int {
		n := 0
		for _, e := range effs {
			if s, ok := e.(Send); ok && s.Msg.Type == MsgShip {
				n++
			}
		}
		return n
	}
	write := func(v string) {
		t.Helper()
		effs, err := l.Write("g", []Write{{Key: Key{Key: "b"}, Value: []byte(v)}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range effs {
			if lg, ok := e.(Log); ok {
				if n := ships(l.Apply(lg.Record)); n != 0 {
					t.Fatalf("the write's application shipped %d messages", n)
				}
			}
		}
	}
	// Align on a shipping tick.
	for l.ticks%3 != 0 {
		l.Tick()
	}
	write("v1")
	write("v2")
	for i := 1; i <= 3; i++ {
		n := ships(l.Tick())
		if want := map[bool]int{true: 1, false: 0}[i == 3]; n != want {
			t.Fatalf("tick %d after the writes: %d ships, want %d", i, n, want)
		}
	}
	write("v3")
	if n := ships(l.ShipNew("g")); n != 1 {
		t.Fatalf("ShipNew: %d ships, want 1", n)
	}
	if n := ships(l.Tick()) + ships(l.Tick()) + ships(l.Tick()); n != 0 {
		t.Fatalf("%d ships of writes ShipNew had shipped", n)
	}
}

// TestDeletingStoredWithJoined: a build that released a deleting group's
// joined members only once its outboxes were empty stored such groups
// deleting with joined members and unacknowledged entries. Loaded by this
// build, the group goes on shipping; the acknowledgment releases the
// joined members with D carrying what is still in the outbox, and the
// deletion finishes with the follower holding the last write.
func TestDeletingStoredWithJoined(t *testing.T) {
	opts := Options{RetryTicks: 3, ShipTicks: 1}
	l, f := NewLeader(1, opts), NewFollower(2, opts)
	b := Key{Key: "b"}
	effs, err := l.Create(CreateRequest{ID: "g", Mode: Atomic, Leader: Key{Key: "a"}, Members: []Member{{Key: b, Shard: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	runJoin(l, f, effs)
	for _, v := range []string{"v1", "v2"} {
		effs, err := l.Write("g", []Write{{Key: b, Value: []byte(v)}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		l.Apply(effs[0].(Log).Record)
	}
	// The earlier build's state: deleting, members still joined.
	g := l.groups["g"]
	g.State, g.DeleteAsked = Deleting, true
	l2, err := DecodeLeaderParts(l.Parts(), opts)
	if err != nil {
		t.Fatal(err)
	}
	var ship *Message
	for _, e := range l2.Tick() {
		if s, ok := e.(Send); ok && s.Msg.Type == MsgShip && s.Msg.To == 2 {
			ship = &s.Msg
		}
	}
	if ship == nil || len(ship.Entries) != 1 || string(ship.Entries[0].Value) != "v2" {
		t.Fatalf("the deleting group with joined members did not ship b's last write: %v", ship)
	}
	// Only the first entry is acknowledged: b's D carries the second, the
	// last write.
	effs = l2.OnShipAck(Message{Type: MsgShipAck, From: 2, To: 1, Group: g.Ref, Seq: 1})
	if len(effs) != 1 {
		t.Fatalf("OnShipAck: %v", effs)
	}
	var d *Message
	for _, e := range l2.Apply(effs[0].(Log).Record) {
		if s, ok := e.(Send); ok && s.Msg.Type == MsgD && s.Msg.Key == b {
			d = &s.Msg
		}
	}
	if d == nil || len(d.Entries) != 1 || string(d.Entries[0].Value) != "v2" {
		t.Fatalf("the acknowledgment sent b no D with its last write: %v", d)
	}
	if mem := l2.groups["g"].member(b); mem.Status != Releasing {
		t.Fatalf("b is %v after its D, want releasing", mem.Status)
	}
	var stored []string
	for _, e := range f.OnD(*d) {
		for _, e := range f.Apply(e.(Log).Record) {
			if st, ok := e.(Store); ok {
				stored = append(stored, string(st.Write.Value))
			}
		}
	}
	if len(stored) != 1 || stored[0] != "v2" {
		t.Fatalf("the follower stored %v, want [v2]", stored)
	}
	if _, ok := f.Key(b); ok {
		t.Fatal("b is still yielded after its D")
	}
}

// TestTagsTravel: a key's tags go with its value through the protocol:
// from the yield to the member (JA), from a group write to the member, and
// with the value in a Ship and in the D that releases the key, so that the
// follower stores the tags the group's last write set.
func TestTagsTravel(t *testing.T) {
	opts := Options{RetryTicks: 100, ShipTicks: 100}
	l, f := NewLeader(1, opts), NewFollower(2, opts)
	b, c := Key{Key: "b"}, Key{Key: "c"}
	effs, err := l.Create(CreateRequest{ID: "g", Mode: Atomic, Leader: Key{Key: "a"}, Members: []Member{{Key: b, Shard: 2}, {Key: c, Shard: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	runJoinWith(l, f, effs, KeyCheck{Value: []byte("v0"), Tags: Tags{List: []string{"p"}}, Version: 1})
	g, _ := l.Group("g")
	if g.State != Active {
		t.Fatalf("group is %v", g.State)
	}
	for _, m := range g.Members {
		if m.Key != (Key{Key: "a"}) && !slices.Equal(m.Tags.List, []string{"p"}) {
			t.Fatalf("member %s joined with tags %v, want [p]", m.Key, m.Tags)
		}
	}
	write := func(ws ...Write) {
		t.Helper()
		effs, err := l.Write("g", ws, nil)
		if err != nil {
			t.Fatal(err)
		}
		l.Apply(effs[0].(Log).Record)
	}
	// stored applies the messages of effs to the follower and returns what
	// it stores: key=value tags.
	stored := func(effs []Effect) map[Key]string {
		t.Helper()
		out := map[Key]string{}
		for _, e := range effs {
			s, ok := e.(Send)
			if !ok || s.Msg.To != 2 {
				continue
			}
			var logs []Effect
			switch s.Msg.Type {
			case MsgShip:
				logs = f.OnShip(s.Msg)
			case MsgD:
				logs = f.OnD(s.Msg)
			}
			for _, lg := range logs {
				if lg, ok := lg.(Log); ok {
					for _, e := range f.Apply(lg.Record) {
						if st, ok := e.(Store); ok {
							out[st.Write.Key] = string(st.Write.Value) + st.Write.Tags.String()
						}
					}
				}
			}
		}
		return out
	}
	write(Write{Key: b, Value: []byte("v1"), Tags: Tags{List: []string{"q", "r"}}}, Write{Key: c, Value: []byte("w1")})
	if g, _ := l.Group("g"); !slices.Equal(g.Members[1].Tags.List, []string{"q", "r"}) || g.Members[2].Tags.List != nil {
		t.Fatalf("members after the write: %+v", g.Members)
	}
	got := stored(l.ShipNew("g"))
	if want := (map[Key]string{b: "v1 tags=q,r", c: "w1"}); !reflect.DeepEqual(got, want) {
		t.Fatalf("the ship stored %v, want %v", got, want)
	}
	write(Write{Key: b, Value: []byte("v2"), Tags: Tags{List: []string{"s"}}})
	effs, err = l.Delete("g")
	if err != nil {
		t.Fatal(err)
	}
	got = stored(l.Apply(effs[0].(Log).Record))
	if want := (map[Key]string{b: "v2 tags=s"}); !reflect.DeepEqual(got, want) {
		t.Fatalf("the deletion's Ds stored %v, want %v", got, want)
	}
}

// TestOutboxBound: a group write that would take the outbox of a key's
// shard past MaxOutboxEntries or MaxOutboxBytes is refused, ErrBacklogged,
// and changes nothing; writes to keys of other shards go on; once the
// shard acknowledges the writes waiting for it, writes to its keys are
// taken again. The outbox's size is counted again when it is decoded.
func TestOutboxBound(t *testing.T) {
	opts := Options{RetryTicks: 100, ShipTicks: 100, MaxOutboxEntries: 3, MaxOutboxBytes: 10}
	l, f := NewLeader(1, opts), NewFollower(2, opts)
	b, c := Key{Key: "b"}, Key{Key: "c"}
	effs, err := l.Create(CreateRequest{ID: "g", Mode: Atomic, Leader: Key{Key: "a"}, Members: []Member{{Key: b, Shard: 2}, {Key: c, Shard: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	runJoin(l, f, effs)
	write := func(k Key, v string) error {
		t.Helper()
		effs, err := l.Write("g", []Write{{Key: k, Value: []byte(v)}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range l.Apply(effs[0].(Log).Record) {
			if r, ok := e.(Reply); ok {
				return r.Err
			}
		}
		t.Fatal("a write without a reply")
		return nil
	}
	for i, v := range []string{"1", "2", "3"} {
		if err := write(b, v); err != nil {
			t.Fatalf("write %d of b: %v", i, err)
		}
	}
	if err := write(b, "4"); !errors.Is(err, ErrBacklogged) {
		t.Fatalf("a fourth write waiting for s2: %v, want ErrBacklogged", err)
	}
	if g, _ := l.Group("g"); string(g.Members[1].Value) != "3" {
		t.Fatalf("the refused write changed b to %q", g.Members[1].Value)
	}
	if err := write(c, "0123456789"); err != nil {
		t.Fatalf("a write of c, whose shard takes its writes: %v", err)
	}
	if err := write(c, "x"); !errors.Is(err, ErrBacklogged) {
		t.Fatalf("a write past 10 bytes waiting for s1: %v, want ErrBacklogged", err)
	}
	// The outbox's size survives a reload.
	l2, err := DecodeLeaderParts(l.Parts(), opts)
	if err != nil {
		t.Fatal(err)
	}
	g, _ := l.Group("g")
	g2, _ := l2.Group("g")
	for i := range g.Outboxes {
		if g.Outboxes[i].size != g2.Outboxes[i].size {
			t.Fatalf("outbox to s%d: %d bytes live, %d decoded", g.Outboxes[i].Shard, g.Outboxes[i].size, g2.Outboxes[i].size)
		}
	}
	// s2 takes and acknowledges them: b is written again.
	for _, e := range l.ShipNew("g") {
		s, ok := e.(Send)
		if !ok || s.Msg.To != 2 {
			continue
		}
		for _, lg := range f.OnShip(s.Msg) {
			for _, ack := range f.Apply(lg.(Log).Record) {
				if a, ok := ack.(Send); ok && a.Msg.Type == MsgShipAck {
					for _, rec := range l.OnShipAck(a.Msg) {
						l.Apply(rec.(Log).Record)
					}
				}
			}
		}
	}
	if err := write(b, "4"); err != nil {
		t.Fatalf("a write of b once s2 took the others: %v", err)
	}
}
