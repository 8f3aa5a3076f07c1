package shard

import (
	"bytes"
	"encoding/binary"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/groupkv/groupkv/internal/group"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/storage"
)

// TestGroupRecords applies the records of a group's life in one shard
// (leader and follower at once): the group and the yield are replicated
// state that a reload finds; a plain write of the member is refused with
// key_in_group while it is yielded; a group write is validated and
// versioned; the shipped write lands in the key's data; a split is
// refused while the shard holds group state.
func TestGroupRecords(t *testing.T) {
	db := memDB(t)
	desc := Desc{ShardID: 5, Collection: 7, Partitioning: kv.PartitionRange}
	s, err := Load(db, desc)
	if err != nil {
		t.Fatal(err)
	}
	apply := func(cmd []byte) Result {
		t.Helper()
		return applyOne(t, db, s, cmd)
	}
	version := uint64(100)
	versioned := func(cmd []byte) []byte {
		version++
		SetVersion(cmd, version)
		return cmd
	}
	put := func(key, value string, tags ...string) Result {
		return apply(versioned(EncodeWrite([]Op{{Type: OpPut, Key: []byte(key), Value: []byte(value), Tags: tags}})))
	}
	if res := put("k", "v0", "a"); res.Err != nil {
		t.Fatal(res.Err)
	}
	k := group.Key{Collection: 7, Key: "k"}
	res := apply(EncodeGroupRecord(group.Record{Kind: group.RecCreate, Group: group.Ref{ID: "g", Leader: 5}, Mode: group.Atomic, Key: k,
		Members: []group.Member{{Key: k, Shard: 5}}}))
	var ref group.Ref
	for _, e := range res.Group {
		if snd, ok := e.(group.Send); ok && snd.Msg.Type == group.MsgJ {
			ref = snd.Msg.Group
		}
	}
	if ref.Inc == 0 {
		t.Fatalf("create: effects %v, want a J", res.Group)
	}
	res = apply(EncodeGroupRecord(group.Record{Kind: group.RecYield, Group: ref, Key: k, Value: []byte("v0"), Version: 101}))
	var ja group.Message
	for _, e := range res.Group {
		if snd, ok := e.(group.Send); ok && snd.Msg.Type == group.MsgJA {
			ja = snd.Msg
		}
	}
	if ja.Yield == 0 {
		t.Fatalf("yield: effects %v, want a JA", res.Group)
	}
	if ja.Tags.Keep || !slices.Equal(ja.Tags.List, []string{"a"}) {
		t.Fatalf("the JA carries tags %v, want the key's [a]", ja.Tags)
	}
	if res := put("k", "plain"); kv.CodeOf(res.Err) != kv.CodeKeyInGroup {
		t.Fatalf("plain write of a yielded key: %v, want key_in_group", res.Err)
	}
	res = apply(EncodeGroupRecord(group.Record{Kind: group.RecJoin, Group: ref, Key: k, Yield: ja.Yield, Value: ja.Value, Tags: ja.Tags, Version: ja.Version, Shard: 5}))
	created := false
	for _, e := range res.Group {
		if r, ok := e.(group.Reply); ok && r.Op == group.OpCreate && r.Err == nil {
			created = true
		}
	}
	if !created {
		t.Fatalf("join: effects %v, want the creation's reply", res.Group)
	}
	if r := apply(EncodeSplitTrigger(6, []byte("m"), 0)); kv.CodeOf(r.Err) != kv.CodeUnavailable {
		t.Fatalf("split of a shard holding a group: %v, want unavailable", r.Err)
	}
	// A write that read k at its join version commits; one that read an
	// older version does not.
	write := func(reads []group.Read) group.Reply {
		t.Helper()
		res := apply(versioned(EncodeGroupRecord(group.Record{Kind: group.RecWrite, Group: ref,
			Writes: []group.Write{{Key: k, Value: []byte("v1"), Tags: group.Tags{List: []string{"b", "c"}}}}, Reads: reads})))
		if res.Err != nil {
			t.Fatal(res.Err)
		}
		for _, e := range res.Group {
			if r, ok := e.(group.Reply); ok && r.Op == group.OpWrite {
				return r
			}
		}
		t.Fatalf("write: effects %v, want a reply", res.Group)
		return group.Reply{}
	}
	if r := write([]group.Read{{Key: k, Version: 101}}); r.Err != nil {
		t.Fatalf("write: %v", r.Err)
	}
	if r := write([]group.Read{{Key: k, Version: 101}}); r.Err == nil {
		t.Fatal("a write that read a stale version committed")
	}

	// The state is replicated: a reload finds it.
	s2, err := Load(db, desc)
	if err != nil {
		t.Fatal(err)
	}
	committed := version - 1 // the version of the write that committed
	s2.WithGroups(func(l *group.Leader, f *group.Follower) {
		g, ok := l.Group("g")
		if !ok || g.State != group.Active || string(g.Members[0].Value) != "v1" || g.Members[0].Version != committed {
			t.Fatalf("reloaded group: %+v", g)
		}
		if y, ok := f.Key(k); !ok || y.Yield != ja.Yield {
			t.Fatalf("reloaded yield: %+v %v", y, ok)
		}
	})

	// The shipped write lands in the key's data at the version its group
	// committed it, logged in the change log at the ship's, once the
	// follower has logged the JAA of its join (a follower applies a
	// group's writes only to a key whose join is confirmed).
	if res := apply(EncodeGroupRecord(group.Record{Kind: group.RecConfirm, Group: ref, Key: k, Yield: ja.Yield})); res.Err != nil {
		t.Fatal(res.Err)
	}
	var entries []group.Entry // the leader's shipment
	s.WithGroups(func(l *group.Leader, _ *group.Follower) {
		for _, e := range l.ShipNew("g") {
			if s, ok := e.(group.Send); ok && s.Msg.Type == group.MsgShip {
				entries = s.Msg.Entries
			}
		}
	})
	res = apply(versioned(EncodeGroupRecord(group.Record{Kind: group.RecApplyShip, Group: ref, Entries: entries})))
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	val, v, found, err := ReadRecord(db, 7, []byte("k"), Latest)
	if err != nil || !found || string(val.Value) != "v1" || v != committed || !slices.Equal(val.Tags, []string{"b", "c"}) {
		t.Fatalf("shipped write: %q@%d tags %v found %v err %v, want v1@%d", val.Value, v, val.Tags, found, err, committed)
	}
	if val, v, _, err := ReadRecord(db, 7, []byte("k"), committed-1); err != nil || string(val.Value) != "v0" || v >= committed {
		t.Fatalf("below the group's write: %q@%d (err %v), want v0", val.Value, v, err)
	}
	var logged []uint64
	if err := Changes(db, 7, committed, version, nil, func(c Change) bool { logged = append(logged, c.Version); return true }); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(logged, []uint64{version}) {
		t.Fatalf("change log between the group's write and its shipment: %v, want [%d] (the shipment's)", logged, version)
	}
	// The tag index follows: k is under b and c, no longer under a.
	for tag, want := range map[string]bool{"a": false, "b": true, "c": true} {
		var keys []string
		if err := TagKeys(db, 7, tag, Latest, nil, nil, func(key []byte) bool { keys = append(keys, string(key)); return true }); err != nil {
			t.Fatal(err)
		}
		if got := slices.Contains(keys, "k"); got != want {
			t.Errorf("tag %q lists %v after the shipped write; want k listed: %v", tag, keys, want)
		}
	}
	// A shipped write of a build that kept the key's tags keeps them.
	res = apply(versioned(EncodeGroupRecord(group.Record{Kind: group.RecApplyShip, Group: ref,
		Entries: []group.Entry{{Seq: entries[len(entries)-1].Seq + 1, Write: group.Write{Key: k, Value: []byte("v2"), Tags: group.Tags{Keep: true}}}}})))
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	if val, _, _, err := ReadRecord(db, 7, []byte("k"), Latest); err != nil || string(val.Value) != "v2" || !slices.Equal(val.Tags, []string{"b", "c"}) {
		t.Fatalf("a write keeping tags stored %q tags %v (err %v), want v2 tags [b c]", val.Value, val.Tags, err)
	}
}

// groupShard applies group records to a shard of collection 7 on an
// in-memory engine, and delivers the messages of its group state machines
// to itself (every member of its groups is in it).
type groupShard struct {
	tb      testing.TB
	db      *pebble.DB
	desc    Desc
	s       *Shard
	version uint64
	// value is the value of every key at its yield.
	value []byte
	// batchBytes is the size of the last batch committed.
	batchBytes int
	// batched: run applies the records logged by each round of effects
	// together, as few commands as EncodeGroupRecords makes of them, after
	// it has delivered the round's messages (as a node does with the
	// messages it gets together); commands counts those applied.
	batched  bool
	commands int
	// writeBatches counts the versioned batches applied.
	writeBatches int
}

func newGroupShard(tb testing.TB) *groupShard {
	eng, err := storage.Open("/d", storage.Options{FS: vfs.NewMem()})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { eng.Close() })
	g := &groupShard{tb: tb, db: eng.DB, desc: Desc{ShardID: 5, Collection: 7, Partitioning: kv.PartitionRange}, version: 100, value: []byte("v0")}
	g.reload()
	return g
}

func (g *groupShard) reload() {
	g.tb.Helper()
	s, err := Load(g.db, g.desc)
	if err != nil {
		g.tb.Fatal(err)
	}
	g.s = s
}

// apply applies recs in one batch, one command each, and returns the
// effects of the last.
func (g *groupShard) apply(recs ...group.Record) []group.Effect {
	g.tb.Helper()
	cmds := make([][]byte, len(recs))
	for i, rec := range recs {
		cmds[i] = EncodeGroupRecord(rec)
	}
	effs := g.applyCommands(cmds)
	return effs[len(effs)-1]
}

// run applies the records effs log and delivers the messages they send,
// and those of theirs, until none is left; after every record it calls
// check.
func (g *groupShard) run(effs []group.Effect, check func()) {
	g.tb.Helper()
	for len(effs) > 0 {
		var next []group.Effect
		var logs []group.Record
		for _, e := range effs {
			switch e := e.(type) {
			case group.Log:
				if g.batched {
					logs = append(logs, e.Record)
					continue
				}
				next = append(next, g.apply(e.Record)...)
				check()
			case group.Send:
				g.s.WithGroups(func(l *group.Leader, f *group.Follower) {
					switch m := e.Msg; m.Type {
					case group.MsgJ:
						next = append(next, f.OnJ(m, group.KeyCheck{Value: g.value, Version: 1})...)
					case group.MsgJA:
						next = append(next, l.OnJA(m)...)
					case group.MsgJAA:
						next = append(next, f.OnJAA(m)...)
					case group.MsgD:
						next = append(next, f.OnD(m)...)
					case group.MsgDA:
						next = append(next, l.OnDA(m)...)
					case group.MsgShip:
						next = append(next, f.OnShip(m)...)
					case group.MsgShipAck:
						next = append(next, l.OnShipAck(m)...)
					}
				})
			}
		}
		if len(logs) > 0 {
			for _, e := range g.applyCommands(EncodeGroupRecords(logs)) {
				next = append(next, e...)
			}
			check()
		}
		effs = next
	}
}

// applyCommands applies group commands in one batch, versioning those
// that need it, and returns the effects of each.
func (g *groupShard) applyCommands(cmds [][]byte) [][]group.Effect {
	g.tb.Helper()
	b := g.db.NewIndexedBatch()
	defer b.Close()
	var effs [][]group.Effect
	for _, cmd := range cmds {
		if IsWrite(cmd) {
			g.version++
			SetVersion(cmd, g.version)
		}
		index, _ := g.s.Applied()
		res, err := g.s.Apply(b, index+1, 1, cmd)
		if err != nil {
			g.tb.Fatal(err)
		}
		if res.Err != nil {
			g.tb.Fatalf("command of kind %d: %v", cmd[0], res.Err)
		}
		g.commands++
		if CommandKind(cmd[0]) == KindGroupWriteBatch {
			g.writeBatches++
		}
		effs = append(effs, res.Group)
	}
	if err := g.s.FinishBatch(b); err != nil {
		g.tb.Fatal(err)
	}
	g.batchBytes = b.Len()
	if err := b.Commit(pebble.NoSync); err != nil {
		g.tb.Fatal(err)
	}
	g.s.Committed()
	return effs
}

// tick ticks the group state machines until their retries have run.
func (g *groupShard) tick(check func()) {
	for range 6 {
		var effs []group.Effect
		g.s.WithGroups(func(l *group.Leader, f *group.Follower) { effs = append(l.Tick(), f.Tick()...) })
		g.run(effs, check)
	}
}

// states returns the encodings of the shard's group states.
func (g *groupShard) states() (leader, follower []byte) {
	g.s.WithGroups(func(l *group.Leader, f *group.Follower) { leader, follower = l.Encode(), f.Encode() })
	return leader, follower
}

// stateItems returns the names of the shard's state items that begin with
// "group".
func (g *groupShard) stateItems() []string {
	g.tb.Helper()
	lo := storage.ShardStateKey(g.desc.ShardID, "group")
	it, err := g.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: storage.PrefixEnd(lo)})
	if err != nil {
		g.tb.Fatal(err)
	}
	defer it.Close()
	var names []string
	prefix := len(storage.ShardStateKey(g.desc.ShardID, ""))
	for ok := it.First(); ok; ok = it.Next() {
		names = append(names, string(it.Key()[prefix:]))
	}
	return names
}

func (g *groupShard) create(id string, mode group.Mode, keys ...string) []group.Effect {
	g.tb.Helper()
	req := group.CreateRequest{ID: id, Mode: mode, Leader: group.Key{Collection: 7, Key: keys[0]}}
	for _, k := range keys[1:] {
		req.Members = append(req.Members, group.Member{Key: group.Key{Collection: 7, Key: k}, Shard: 5})
	}
	var effs []group.Effect
	var err error
	g.s.WithGroups(func(l *group.Leader, _ *group.Follower) { effs, err = l.Create(req) })
	if err != nil {
		g.tb.Fatal(err)
	}
	return effs
}

// groupItems returns the names of the state items of the parts of group id
// of shard 5 whose members, keys of collection 7, are in shard 5: the
// group's, its members' (keys, sorted) and its outbox's.
func groupItems(id string, keys ...string) []string {
	g := "group/l/g/" + id + "\x00\x01"
	items := []string{g}
	for _, k := range keys {
		items = append(items, g+"m\x00\x00\x00\x07"+k)
	}
	return append(items, g+"o\x00\x00\x00\x00\x00\x00\x00\x05")
}

// groupItemsEntries is groupItems with entries 1 to n in the outbox.
func groupItemsEntries(id string, n int, keys ...string) []string {
	items := groupItems(id, keys...)
	o := items[len(items)-1]
	for seq := 1; seq <= n; seq++ {
		items = append(items, o+string(binary.BigEndian.AppendUint64(nil, uint64(seq))))
	}
	return items
}

// TestGroupStateReload runs the life of groups through a shard and, after
// every record, reloads the shard from its storage and checks that it has
// the same group states; the states are stored in parts, per group one for
// the group, for each member and for its outbox, one per yielded key, and a
// group deleted, or a key freed, leaves none.
func TestGroupStateReload(t *testing.T) {
	g := newGroupShard(t)
	records := 0
	check := func() {
		t.Helper()
		records++
		l, f := g.states()
		g.reload()
		if l2, f2 := g.states(); !bytes.Equal(l2, l) || !bytes.Equal(f2, f) {
			t.Fatalf("after record %d, the reloaded group states differ:\nleader   %x\nreloaded %x\nfollower %x\nreloaded %x", records, l, l2, f, f2)
		}
	}
	g.run(g.create("a", group.Atomic, "a1", "a2", "a3"), check)
	g.run(g.create("b", group.BestEffort, "b1", "b\x002"), check)
	g.run(g.create("c", group.Atomic, "c1"), check)
	var write []group.Effect
	var err error
	g.s.WithGroups(func(l *group.Leader, _ *group.Follower) {
		write, err = l.Write("a", []group.Write{{Key: group.Key{Collection: 7, Key: "a2"}, Value: []byte("v1")},
			{Key: group.Key{Collection: 7, Key: "a3"}, Delete: true}}, nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	g.run(write, check)
	g.tick(check) // ships the write
	want := slices.Concat([]string{"group/f/h", "group/f/k/\x00\x00\x00\x07a1", "group/f/k/\x00\x00\x00\x07a2", "group/f/k/\x00\x00\x00\x07a3",
		"group/f/k/\x00\x00\x00\x07b\x002", "group/f/k/\x00\x00\x00\x07b1", "group/f/k/\x00\x00\x00\x07c1"},
		groupItems("a", "a1", "a2", "a3"), groupItems("b", "b\x002", "b1"), groupItems("c", "c1"), []string{"group/l/h"})
	if got := g.stateItems(); !slices.Equal(got, want) {
		t.Fatalf("group state items:\n%q\nwant\n%q", got, want)
	}
	val, _, found, err := ReadRecord(g.db, 7, []byte("a2"), Latest)
	if err != nil || !found || string(val.Value) != "v1" {
		t.Fatalf("shipped write: %q found %v err %v", val.Value, found, err)
	}

	var del []group.Effect
	g.s.WithGroups(func(l *group.Leader, _ *group.Follower) { del, err = l.Delete("a") })
	if err != nil {
		t.Fatal(err)
	}
	g.run(del, check)
	want = slices.DeleteFunc(want, func(n string) bool {
		return strings.HasPrefix(n, "group/f/k/\x00\x00\x00\x07a") || strings.HasPrefix(n, "group/l/g/a\x00")
	})
	if got := g.stateItems(); !slices.Equal(got, want) {
		t.Fatalf("group state items after deleting a:\n%q\nwant\n%q", got, want)
	}
	if records < 25 {
		t.Fatalf("only %d records applied", records)
	}
}

// TestGroupStateWholeValue loads group states stored as one value each
// (group.Leader.Encode, as shards stored them before parts), with a stale
// part beside: the shard has the states of the values; the first record
// applied to each state replaces its value, and the stale parts, by its
// parts, which a reload finds.
func TestGroupStateWholeValue(t *testing.T) {
	g := newGroupShard(t)
	g.run(g.create("a", group.Atomic, "a1", "a2"), func() {})
	g.run(g.create("b", group.BestEffort, "b1", "b2"), func() {})
	g.run(g.create("c", group.BestEffort, "c1"), func() {})
	l, f := g.states()

	// Store the states whole, as a shard did before parts, and a part of a
	// group the whole value does not have.
	b := g.db.NewBatch()
	for _, pfx := range []string{stateGroupLeaderParts, stateGroupFollowerParts} {
		lo := storage.ShardStateKey(g.desc.ShardID, pfx)
		if err := b.DeleteRange(lo, storage.PrefixEnd(lo), nil); err != nil {
			t.Fatal(err)
		}
	}
	for name, v := range map[string][]byte{stateGroupLeader: l, stateGroupFollower: f,
		stateGroupLeaderParts + "g/stale": []byte("stale")} {
		if err := b.Set(storage.ShardStateKey(g.desc.ShardID, name), v, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Commit(pebble.Sync); err != nil {
		t.Fatal(err)
	}
	g.reload()
	if l2, f2 := g.states(); !bytes.Equal(l2, l) || !bytes.Equal(f2, f) {
		t.Fatal("the states loaded from whole values differ")
	}
	items := []string{"group/follower", "group/l/g/stale", "group/leader"}
	if got := g.stateItems(); !slices.Equal(got, items) {
		t.Fatalf("group state items: %q, want %q", got, items)
	}

	// A record of the leader (a write to one group) stores every group.
	var effs []group.Effect
	var err error
	g.s.WithGroups(func(l *group.Leader, _ *group.Follower) {
		effs, err = l.Write("b", []group.Write{{Key: group.Key{Collection: 7, Key: "b1"}, Value: []byte("v1")}}, nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	g.run(effs, func() {})
	l, f = g.states()
	leaderItems := slices.Concat(groupItems("a", "a1", "a2"), groupItemsEntries("b", 1, "b1", "b2"), groupItems("c", "c1"), []string{"group/l/h"})
	items = append([]string{"group/follower"}, leaderItems...)
	if got := g.stateItems(); !slices.Equal(got, items) {
		t.Fatalf("group state items after a leader record: %q, want %q", got, items)
	}
	g.reload()
	if l2, f2 := g.states(); !bytes.Equal(l2, l) || !bytes.Equal(f2, f) {
		t.Fatal("the states reloaded after a leader record differ")
	}

	// A record of the follower (the application of the write) stores every
	// yielded key; the acknowledgment deletes the entry.
	g.tick(func() {})
	l, f = g.states()
	leaderItems = slices.Concat(groupItems("a", "a1", "a2"), groupItems("b", "b1", "b2"), groupItems("c", "c1"), []string{"group/l/h"})
	items = append([]string{"group/f/h", "group/f/k/\x00\x00\x00\x07a1", "group/f/k/\x00\x00\x00\x07a2", "group/f/k/\x00\x00\x00\x07b1",
		"group/f/k/\x00\x00\x00\x07b2", "group/f/k/\x00\x00\x00\x07c1"}, leaderItems...)
	if got := g.stateItems(); !slices.Equal(got, items) {
		t.Fatalf("group state items after a follower record: %q, want %q", got, items)
	}
	g.reload()
	if l2, f2 := g.states(); !bytes.Equal(l2, l) || !bytes.Equal(f2, f) {
		t.Fatal("the states reloaded after a follower record differ")
	}
	g.s.WithGroups(func(l *group.Leader, f *group.Follower) {
		if len(l.Groups()) != 3 || len(f.Keys()) != 5 {
			t.Fatalf("reloaded: %d groups, %d keys", len(l.Groups()), len(f.Keys()))
		}
		if y, _ := f.Key(group.Key{Collection: 7, Key: "b1"}); y.Shipped != 1 {
			t.Fatalf("b1 not shipped: %+v", y)
		}
	})
}

// formatTwoParts returns the parts of l in format 2, as shards stored them
// before the members of a group had parts of their own: the header, and per
// group the part "g/" + id, the group whole. The whole encoding (Encode)
// of a leader of one group is its header's fields, the number of groups
// (1), then the group whole; the parts of that group and l's header make
// that leader.
func formatTwoParts(tb testing.TB, l *group.Leader) []group.Part {
	tb.Helper()
	parts := l.Parts()
	h := parts[0]
	out := []group.Part{{Name: h.Name, Value: append([]byte{2}, h.Value[1:]...)}}
	for _, gr := range l.Groups() {
		name := "g/" + gr.Ref.ID + "\x00\x01"
		one := []group.Part{h}
		for _, p := range parts[1:] {
			if strings.HasPrefix(p.Name, name) {
				one = append(one, p)
			}
		}
		l1, err := group.DecodeLeaderParts(one, group.Options{})
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, group.Part{Name: "g/" + gr.Ref.ID, Value: l1.Encode()[len(h.Value)+1:]})
	}
	return out
}

// TestGroupStateFormatTwo loads a leader state stored in parts of format 2
// (a whole group per part): the shard has the state they hold; a record of
// the follower leaves them; the first record applied to the leader
// replaces them by the parts of the current format, which a reload finds.
func TestGroupStateFormatTwo(t *testing.T) {
	g := newGroupShard(t)
	g.run(g.create("a", group.Atomic, "a1", "a2"), func() {})
	g.run(g.create("b", group.BestEffort, "b1", "b2"), func() {})
	g.run(g.create("c", group.BestEffort, "c1"), func() {})
	write := func(id, key string) {
		t.Helper()
		var effs []group.Effect
		var err error
		g.s.WithGroups(func(l *group.Leader, _ *group.Follower) {
			effs, err = l.Write(id, []group.Write{{Key: group.Key{Collection: 7, Key: key}, Value: []byte("v1")}}, nil)
		})
		if err != nil {
			t.Fatal(err)
		}
		g.run(effs, func() {})
	}
	write("b", "b1") // not shipped: an outbox entry
	l, f := g.states()

	var old []group.Part
	g.s.WithGroups(func(l *group.Leader, _ *group.Follower) { old = formatTwoParts(t, l) })
	b := g.db.NewBatch()
	lo := storage.ShardStateKey(g.desc.ShardID, stateGroupLeaderParts)
	if err := b.DeleteRange(lo, storage.PrefixEnd(lo), nil); err != nil {
		t.Fatal(err)
	}
	for _, p := range old {
		if err := b.Set(storage.ShardStateKey(g.desc.ShardID, stateGroupLeaderParts+p.Name), p.Value, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Commit(pebble.Sync); err != nil {
		t.Fatal(err)
	}
	g.reload()
	if l2, f2 := g.states(); !bytes.Equal(l2, l) || !bytes.Equal(f2, f) {
		t.Fatal("the states loaded from parts of format 2 differ")
	}
	followerItems := []string{"group/f/h", "group/f/k/\x00\x00\x00\x07a1", "group/f/k/\x00\x00\x00\x07a2",
		"group/f/k/\x00\x00\x00\x07b1", "group/f/k/\x00\x00\x00\x07b2", "group/f/k/\x00\x00\x00\x07c1"}
	oldItems := append(slices.Clone(followerItems), "group/l/g/a", "group/l/g/b", "group/l/g/c", "group/l/h")
	if got := g.stateItems(); !slices.Equal(got, oldItems) {
		t.Fatalf("group state items: %q, want %q", got, oldItems)
	}

	// A record of the follower (the free of a key it does not hold).
	g.apply(group.Record{Kind: group.RecFree, Group: group.Ref{ID: "x", Leader: 5, Inc: 9}, Key: group.Key{Collection: 7, Key: "x"}, Yield: 1})
	if got := g.stateItems(); !slices.Equal(got, oldItems) {
		t.Fatalf("group state items after a follower record: %q, want %q", got, oldItems)
	}

	// A record of the leader (a write to one group) stores every part.
	write("c", "c1")
	l, f = g.states()
	items := slices.Concat(followerItems, groupItems("a", "a1", "a2"), groupItemsEntries("b", 1, "b1", "b2"), groupItemsEntries("c", 1, "c1"), []string{"group/l/h"})
	if got := g.stateItems(); !slices.Equal(got, items) {
		t.Fatalf("group state items after a leader record:\n%q\nwant\n%q", got, items)
	}
	g.reload()
	if l2, f2 := g.states(); !bytes.Equal(l2, l) || !bytes.Equal(f2, f) {
		t.Fatal("the states reloaded after a leader record differ")
	}

	// The writes ship and are acknowledged, the parts stored after each.
	g.tick(func() {})
	l, f = g.states()
	g.reload()
	if l2, f2 := g.states(); !bytes.Equal(l2, l) || !bytes.Equal(f2, f) {
		t.Fatal("the states reloaded after the ships differ")
	}
	g.s.WithGroups(func(l *group.Leader, f *group.Follower) {
		for _, gr := range l.Groups() {
			if len(gr.Outboxes[0].Entries) != 0 {
				t.Fatalf("group %s: outbox %+v", gr.Ref, gr.Outboxes[0])
			}
		}
		if y, _ := f.Key(group.Key{Collection: 7, Key: "c1"}); y.Shipped != 1 {
			t.Fatalf("c1 not shipped: %+v", y)
		}
	})
}

// formatThreeParts returns the parts of l in format 3, as shards stored
// them before outbox entries had parts of their own: an outbox's part held
// its next sequence number and its entries, each its sequence number and
// write. The current format's outbox part holds the next sequence number
// and the number of entries, and each entry part (the outbox's name and
// the entry's sequence number in 8 bytes) the write.
func formatThreeParts(l *group.Leader) []group.Part {
	parts := l.Parts()
	var out []group.Part
	for i, p := range parts {
		if i == 0 {
			out = append(out, group.Part{Name: p.Name, Value: append([]byte{3}, p.Value[1:]...)})
			continue
		}
		if len(out) > 0 && strings.HasPrefix(p.Name, out[len(out)-1].Name) && len(p.Name) == len(out[len(out)-1].Name)+8 &&
			strings.Contains(out[len(out)-1].Name, "\x00\x01o") {
			// An entry of the outbox just written.
			o := &out[len(out)-1]
			o.Value = binary.AppendUvarint(o.Value, binary.BigEndian.Uint64([]byte(p.Name[len(o.Name):])))
			o.Value = append(o.Value, p.Value...)
			continue
		}
		out = append(out, group.Part{Name: p.Name, Value: slices.Clone(p.Value)})
	}
	return out
}

// TestGroupStateFormatThree loads a leader state stored in parts of format
// 3 (a whole outbox per part, its entries in it): the shard has the state
// they hold, and the first record applied to the leader replaces them by
// the parts of the current format, each entry in a part of its own.
func TestGroupStateFormatThree(t *testing.T) {
	g := newGroupShard(t)
	g.run(g.create("a", group.Atomic, "a1", "a2"), func() {})
	g.run(g.create("b", group.BestEffort, "b1", "b2"), func() {})
	write := func(id, key, v string) {
		t.Helper()
		var effs []group.Effect
		var err error
		g.s.WithGroups(func(l *group.Leader, _ *group.Follower) {
			effs, err = l.Write(id, []group.Write{{Key: group.Key{Collection: 7, Key: key}, Value: []byte(v)}}, nil)
		})
		if err != nil {
			t.Fatal(err)
		}
		g.run(effs, func() {})
	}
	write("b", "b1", "v1") // not shipped: outbox entries
	write("b", "b2", "v2")
	l, f := g.states()

	var old []group.Part
	g.s.WithGroups(func(l *group.Leader, _ *group.Follower) { old = formatThreeParts(l) })
	b := g.db.NewBatch()
	lo := storage.ShardStateKey(g.desc.ShardID, stateGroupLeaderParts)
	if err := b.DeleteRange(lo, storage.PrefixEnd(lo), nil); err != nil {
		t.Fatal(err)
	}
	var oldItems []string
	for _, p := range old {
		if err := b.Set(storage.ShardStateKey(g.desc.ShardID, stateGroupLeaderParts+p.Name), p.Value, nil); err != nil {
			t.Fatal(err)
		}
		oldItems = append(oldItems, stateGroupLeaderParts+p.Name)
	}
	if err := b.Commit(pebble.Sync); err != nil {
		t.Fatal(err)
	}
	g.reload()
	if l2, f2 := g.states(); !bytes.Equal(l2, l) || !bytes.Equal(f2, f) {
		t.Fatal("the states loaded from parts of format 3 differ")
	}
	leaderItems := func() []string {
		var items []string
		for _, it := range g.stateItems() {
			if strings.HasPrefix(it, stateGroupLeaderParts) {
				items = append(items, it)
			}
		}
		return items
	}
	slices.Sort(oldItems)
	if got := leaderItems(); !slices.Equal(got, oldItems) {
		t.Fatalf("leader state items: %q, want %q", got, oldItems)
	}

	// A record of the leader (a write to a) stores every part.
	write("a", "a1", "v3")
	l, f = g.states()
	items := slices.Concat(groupItemsEntries("a", 1, "a1", "a2"), groupItemsEntries("b", 2, "b1", "b2"), []string{"group/l/h"})
	if got := leaderItems(); !slices.Equal(got, items) {
		t.Fatalf("leader state items after a leader record:\n%q\nwant\n%q", got, items)
	}
	g.reload()
	if l2, f2 := g.states(); !bytes.Equal(l2, l) || !bytes.Equal(f2, f) {
		t.Fatal("the states reloaded after a leader record differ")
	}
}

// TestGroupYieldReadsValueAtApply: a yield takes the key's value as of its
// place in the log, not the one its record carries (read by the J's
// handler, which may miss writes applied before it and not visible yet):
// a write earlier in the same batch, or a stale value in the record, does
// not make the group start from an old value.
func TestGroupYieldReadsValueAtApply(t *testing.T) {
	g := newGroupShard(t)
	k := group.Key{Collection: 7, Key: "k"}
	put := func(b *pebble.Batch, value string) {
		t.Helper()
		g.version++
		cmd := EncodeWrite([]Op{{Type: OpPut, Key: []byte("k"), Value: []byte(value)}})
		SetVersion(cmd, g.version)
		index, _ := g.s.Applied()
		if res, err := g.s.Apply(b, index+1, 1, cmd); err != nil || res.Err != nil {
			t.Fatal(err, res.Err)
		}
	}
	b := g.db.NewIndexedBatch()
	put(b, "v0")
	if err := g.s.FinishBatch(b); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(pebble.Sync); err != nil {
		t.Fatal(err)
	}
	b.Close()
	g.s.Committed()
	var ref group.Ref
	for _, e := range g.apply(group.Record{Kind: group.RecCreate, Group: group.Ref{ID: "g", Leader: 5}, Mode: group.Atomic, Key: k, Members: []group.Member{{Key: k, Shard: 5}}}) {
		if snd, ok := e.(group.Send); ok && snd.Msg.Type == group.MsgJ {
			ref = snd.Msg.Group
		}
	}
	if ref.Inc == 0 {
		t.Fatal("create sent no J")
	}
	// In one batch: a write of v1, then the yield, whose record carries
	// the value before it.
	b = g.db.NewIndexedBatch()
	defer b.Close()
	put(b, "v1")
	wrote := g.version
	index, _ := g.s.Applied()
	res, err := g.s.Apply(b, index+1, 1, EncodeGroupRecord(group.Record{Kind: group.RecYield, Group: ref, Key: k, Value: []byte("v0"), Version: wrote - 1}))
	if err != nil || res.Err != nil {
		t.Fatal(err, res.Err)
	}
	var ja *group.Message
	for _, e := range res.Group {
		if snd, ok := e.(group.Send); ok && snd.Msg.Type == group.MsgJA {
			ja = &snd.Msg
		}
	}
	if ja == nil {
		t.Fatalf("the yield sent no JA: %v", res.Group)
	}
	if string(ja.Value) != "v1" || ja.Version != wrote || ja.Absent {
		t.Fatalf("the JA carries %q at version %d (absent %v), want v1 at %d", ja.Value, ja.Version, ja.Absent, wrote)
	}
}
