package shard

import (
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
	eng, err := storage.Open("/d", storage.Options{FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	db := eng.DB
	desc := Desc{ShardID: 5, Collection: 7, Partitioning: kv.PartitionRange}
	s, err := Load(db, desc)
	if err != nil {
		t.Fatal(err)
	}
	apply := func(cmd []byte) Result {
		t.Helper()
		b := db.NewIndexedBatch()
		defer b.Close()
		index, _ := s.Applied()
		res, err := s.Apply(b, index+1, 1, cmd)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.FinishBatch(b); err != nil {
			t.Fatal(err)
		}
		if err := b.Commit(pebble.Sync); err != nil {
			t.Fatal(err)
		}
		s.Committed()
		return res
	}
	version := uint64(100)
	versioned := func(cmd []byte) []byte {
		version++
		SetVersion(cmd, version)
		return cmd
	}
	put := func(key, value string) Result {
		return apply(versioned(EncodeWrite([]Op{{Type: OpPut, Key: []byte(key), Value: []byte(value)}})))
	}
	if res := put("k", "v0"); res.Err != nil {
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
	if res := put("k", "plain"); kv.CodeOf(res.Err) != kv.CodeKeyInGroup {
		t.Fatalf("plain write of a yielded key: %v, want key_in_group", res.Err)
	}
	res = apply(EncodeGroupRecord(group.Record{Kind: group.RecJoin, Group: ref, Key: k, Yield: ja.Yield, Value: ja.Value, Version: ja.Version, Shard: 5}))
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
			Writes: []group.Write{{Key: k, Value: []byte("v1")}}, Reads: reads})))
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
	s2.WithGroups(func(l *group.Leader, f *group.Follower) {
		g, ok := l.Group("g")
		if !ok || g.State != group.Active || string(g.Members[0].Value) != "v1" || g.Members[0].Version != version-1 {
			t.Fatalf("reloaded group: %+v", g)
		}
		if y, ok := f.Key(k); !ok || y.Yield != ja.Yield {
			t.Fatalf("reloaded yield: %+v %v", y, ok)
		}
	})

	// The shipped write lands in the key's data at the ship's version, once
	// the follower has logged the JAA of its join (a follower applies a
	// group's writes only to a key whose join is confirmed).
	if res := apply(EncodeGroupRecord(group.Record{Kind: group.RecConfirm, Group: ref, Key: k, Yield: ja.Yield})); res.Err != nil {
		t.Fatal(res.Err)
	}
	var entries []group.Entry
	s.WithGroups(func(l *group.Leader, _ *group.Follower) {
		g, _ := l.Group("g")
		entries = g.Outboxes[0].Entries
	})
	res = apply(versioned(EncodeGroupRecord(group.Record{Kind: group.RecApplyShip, Group: ref, Entries: entries})))
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	val, v, found, err := ReadRecord(db, 7, []byte("k"), Latest)
	if err != nil || !found || string(val.Value) != "v1" || v != version {
		t.Fatalf("shipped write: %q@%d found %v err %v", val.Value, v, found, err)
	}
}
