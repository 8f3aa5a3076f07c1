package shard

import (
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/groupkv/groupkv/internal/group"
	"github.com/groupkv/groupkv/internal/storage"
)

// TestFreedAbove: a group write shipped with its version is stored at it
// and leaves FreedAbove where it was; a yield or a free stores
// FreedAbove, as replicated state that a reload finds; a write of an older build (no
// version), stored at the version of the record that applies it, raises
// FreedAbove to that version. A shard that yielded keys but has none
// stored counts the highest version applied; a split child inherits the
// stored value, and a merge takes the right shard's (its highest version
// when it has none).
func TestFreedAbove(t *testing.T) {
	g := newGroupShard(t)
	nop := func() {}
	write := func(id, key, value string) {
		t.Helper()
		var effs []group.Effect
		var err error
		g.s.WithGroups(func(l *group.Leader, _ *group.Follower) {
			effs, err = l.Write(id, []group.Write{{Key: group.Key{Collection: 7, Key: key}, Value: []byte(value)}}, nil)
		})
		if err != nil {
			t.Fatal(err)
		}
		g.run(effs, nop)
	}
	deleteGroup := func(id string) {
		t.Helper()
		var effs []group.Effect
		var err error
		g.s.WithGroups(func(l *group.Leader, _ *group.Follower) { effs, err = l.Delete(id) })
		if err != nil {
			t.Fatal(err)
		}
		g.run(effs, nop)
	}
	g.run(g.create("a", group.Atomic, "a1", "a2"), nop)
	// Stored from the first yield on: a reload of the shard holding
	// yielded keys reads it, 0.
	if v, ok, err := readFreedAbove(g.db, 5); err != nil || !ok || v != 0 {
		t.Fatalf("stored FreedAbove after the yields: %d, %v, %v; want 0 stored", v, ok, err)
	}
	g.reload()
	if f := g.s.FreedAbove(); f != 0 {
		t.Fatalf("FreedAbove %d after a reload of a shard holding yielded keys, want 0", f)
	}
	write("a", "a2", "v1")
	g.tick(nop) // ships the write
	if f := g.s.FreedAbove(); f != 0 {
		t.Fatalf("FreedAbove %d after a shipment with versions", f)
	}
	deleteGroup("a")
	if f := g.s.FreedAbove(); f != 0 {
		t.Fatalf("FreedAbove %d after a free of writes stored at their versions", f)
	}
	if v, ok, err := readFreedAbove(g.db, 5); err != nil || !ok || v != 0 {
		t.Fatalf("stored FreedAbove after the free: %d, %v, %v; want 0 stored", v, ok, err)
	}
	g.reload()
	if f := g.s.FreedAbove(); f != 0 {
		t.Fatalf("FreedAbove %d after a reload, want 0", f)
	}

	// A shipment of an older build: its entry has no version.
	g.run(g.create("b", group.Atomic, "b1"), nop)
	write("b", "b1", "v2")
	var entries []group.Entry
	var ref group.Ref
	g.s.WithGroups(func(l *group.Leader, _ *group.Follower) {
		for _, e := range l.ShipNew("b") {
			if s, ok := e.(group.Send); ok && s.Msg.Type == group.MsgShip {
				entries, ref = s.Msg.Entries, s.Msg.Group
			}
		}
	})
	if len(entries) != 1 || entries[0].Version == 0 {
		t.Fatalf("the shipment %v, want one entry with a version", entries)
	}
	entries[0].Version = 0
	g.apply(group.Record{Kind: group.RecApplyShip, Group: ref, Entries: entries})
	freed := g.s.FreedAbove()
	if freed != g.version {
		t.Fatalf("FreedAbove %d after a write stored without its version, want the shipment's %d", freed, g.version)
	}
	deleteGroup("b")
	if f := g.s.FreedAbove(); f != freed {
		t.Fatalf("FreedAbove %d after the free, want %d", f, freed)
	}
	g.reload()
	if f := g.s.FreedAbove(); f != freed {
		t.Fatalf("FreedAbove %d after a reload, want %d", f, freed)
	}
	if g.s.holdsGroups() {
		t.Fatal("the shard still holds group state")
	}
	var err error

	setFreed := func(shard uint64, v uint64, present bool) {
		t.Helper()
		b := g.db.NewBatch()
		defer b.Close()
		key := storage.ShardStateKey(shard, stateFreedAbove)
		if present {
			err = storage.PutUint64(b, key, v)
		} else {
			err = b.Delete(key, nil)
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Commit(pebble.NoSync); err != nil {
			t.Fatal(err)
		}
	}
	trigger := func(cmd []byte) {
		t.Helper()
		if res := applyOne(t, g.db, g.s, cmd); res.Err != nil {
			t.Fatal(res.Err)
		}
	}
	// Splits: children 9 [m, ∞) and 10 [g, m) inherit the stored value.
	trigger(EncodeSplitTrigger(9, []byte("m"), 0))
	trigger(EncodeSplitTrigger(10, []byte("g"), 0))
	for _, child := range []uint64{9, 10} {
		if v, err := storage.GetUint64(g.db, storage.ShardStateKey(child, stateFreedAbove)); err != nil || v != freed {
			t.Fatalf("child %d's stored FreedAbove %d (%v), want %d", child, v, err, freed)
		}
	}
	// Merges: 10 with a stored value above the left's, then 9 with none.
	setFreed(10, freed+500, true)
	trigger(EncodeMergeTrigger(Desc{ShardID: 10, Start: []byte("g"), End: []byte("m")}, FrozenState{Into: 5, Index: 1, MaxVersion: g.s.MaxVersion()}))
	if f := g.s.FreedAbove(); f != freed+500 {
		t.Fatalf("FreedAbove %d after taking in shard 10, want its %d", f, freed+500)
	}
	setFreed(9, 0, false)
	trigger(EncodeMergeTrigger(Desc{ShardID: 9, Start: []byte("m")}, FrozenState{Into: 5, Index: 1, MaxVersion: freed + 900}))
	if f := g.s.FreedAbove(); f != freed+900 {
		t.Fatalf("FreedAbove %d after taking in shard 9, which stored none, want its highest version %d", f, freed+900)
	}
	g.reload()
	if f := g.s.FreedAbove(); f != freed+900 {
		t.Fatalf("FreedAbove %d after a reload, want %d", f, freed+900)
	}
	// A shard that yielded keys before FreedAbove was stored.
	setFreed(5, 0, false)
	g.reload()
	if f, m := g.s.FreedAbove(), g.s.MaxVersion(); f != m {
		t.Fatalf("FreedAbove %d of a shard that yielded keys and stored none, want its highest version %d", f, m)
	}
}
