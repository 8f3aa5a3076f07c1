package shard

import (
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/groupkv/groupkv/internal/group"
	"github.com/groupkv/groupkv/internal/storage"
)

// TestFreedAbove: a free of a group's key raises the shard's FreedAbove to
// the highest version applied (the shipments before it were stored up to
// there), as replicated state that a reload finds; a shard that yielded
// keys but has none stored counts the highest version applied; a split
// child inherits the stored value, and a merge takes the right shard's
// (its highest version when it has none).
func TestFreedAbove(t *testing.T) {
	g := newGroupShard(t)
	nop := func() {}
	g.run(g.create("a", group.Atomic, "a1", "a2"), nop)
	var write []group.Effect
	var err error
	g.s.WithGroups(func(l *group.Leader, _ *group.Follower) {
		write, err = l.Write("a", []group.Write{{Key: group.Key{Collection: 7, Key: "a2"}, Value: []byte("v1")}}, nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	g.run(write, nop)
	g.tick(nop) // ships the write
	shipped := g.s.MaxVersion()
	if f := g.s.FreedAbove(); f != 0 {
		t.Fatalf("FreedAbove %d before any free", f)
	}
	var del []group.Effect
	g.s.WithGroups(func(l *group.Leader, _ *group.Follower) { del, err = l.Delete("a") })
	if err != nil {
		t.Fatal(err)
	}
	g.run(del, nop)
	freed := g.s.FreedAbove()
	if freed < shipped {
		t.Fatalf("FreedAbove %d after the free, below the shipment's version %d", freed, shipped)
	}
	g.reload()
	if f := g.s.FreedAbove(); f != freed {
		t.Fatalf("FreedAbove %d after a reload, want %d", f, freed)
	}
	if g.s.holdsGroups() {
		t.Fatal("the shard still holds group state")
	}

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
