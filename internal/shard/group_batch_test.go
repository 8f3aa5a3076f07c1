package shard

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/groupkv/groupkv/internal/group"
)

// TestEncodeGroupRecords: one record is the command EncodeGroupRecord
// makes; several make one batch, versioned if one stores writes; two
// records that store writes of the same key, or a batch past
// maxGroupBatchBytes, are split; every command decodes.
func TestEncodeGroupRecords(t *testing.T) {
	ref := group.Ref{ID: "g", Leader: 5, Inc: 1}
	key := func(k string) group.Key { return group.Key{Collection: 7, Key: k} }
	yield := func(k string) group.Record { return group.Record{Kind: group.RecYield, Group: ref, Key: key(k)} }
	free := func(k string, value string) group.Record {
		r := group.Record{Kind: group.RecFree, Group: ref, Key: key(k), Yield: 3}
		if value != "" {
			r.Entries = []group.Entry{{Seq: 1, Write: group.Write{Key: key(k), Value: []byte(value)}}}
		}
		return r
	}
	kinds := func(cmds [][]byte) string {
		var out []string
		for _, c := range cmds {
			dc, err := DecodeCommand(c)
			if err != nil {
				t.Fatalf("command %x does not decode: %v", c, err)
			}
			out = append(out, fmt.Sprint(dc.Kind))
		}
		return strings.Join(out, " ")
	}
	for _, tc := range []struct {
		name string
		recs []group.Record
		want string
	}{
		{"one", []group.Record{yield("a")}, fmt.Sprint(KindGroup)},
		{"one storing", []group.Record{free("a", "v")}, fmt.Sprint(KindGroupWrite)},
		{"yields", []group.Record{yield("a"), yield("b"), yield("c")}, fmt.Sprint(KindGroupBatch)},
		{"frees", []group.Record{free("a", "v"), free("b", ""), free("c", "w")}, fmt.Sprint(KindGroupWriteBatch)},
		{"same key stored twice", []group.Record{free("a", "v"), free("b", "w"), free("a", "x")},
			fmt.Sprint(KindGroupWriteBatch, " ", KindGroupWrite)},
		{"same key, one storing", []group.Record{free("a", "v"), free("a", "")}, fmt.Sprint(KindGroupWriteBatch)},
		// A record of a kind that stores writes is versioned even with
		// none to store, as EncodeGroupRecord makes it.
		{"shipment of nothing", []group.Record{{Kind: group.RecApplyShip, Group: ref}}, fmt.Sprint(KindGroupWrite)},
		{"shipment of nothing and a yield", []group.Record{{Kind: group.RecApplyShip, Group: ref}, yield("a")}, fmt.Sprint(KindGroupWriteBatch)},
	} {
		cmds := EncodeGroupRecords(tc.recs)
		if got := kinds(cmds); got != tc.want {
			t.Errorf("%s: kinds %s, want %s", tc.name, got, tc.want)
		}
	}
	if cmds := EncodeGroupRecords([]group.Record{yield("a")}); !bytes.Equal(cmds[0], EncodeGroupRecord(yield("a"))) {
		t.Errorf("one record: %x, want %x", cmds[0], EncodeGroupRecord(yield("a")))
	}
	big := bytes.Repeat([]byte("x"), maxGroupBatchBytes/3)
	var recs []group.Record
	for i := range 7 {
		r := yield(fmt.Sprint(i))
		r.Value = big
		recs = append(recs, r)
	}
	cmds := EncodeGroupRecords(recs)
	if len(cmds) < 3 {
		t.Fatalf("7 records of a third of the bound each make %d commands", len(cmds))
	}
	n := 0
	for _, c := range cmds {
		if len(c) > maxGroupBatchBytes+1024 {
			t.Errorf("a command of %d bytes", len(c))
		}
		dc, _ := DecodeCommand(c)
		if dc.Kind == KindGroupBatch {
			bodies, err := decodeGroupBatch(dc.GroupBody)
			if err != nil {
				t.Fatal(err)
			}
			n += len(bodies)
		} else {
			n++
		}
	}
	if n != len(recs) {
		t.Fatalf("the commands hold %d records, want %d", n, len(recs))
	}
	for _, bad := range [][]byte{
		{byte(KindGroupBatch)},
		{byte(KindGroupBatch), 1, 0},       // one record: not a batch
		{byte(KindGroupBatch), 2, 1, 'x'},  // a record missing
		{byte(KindGroupBatch), 2, 0, 0, 9}, // trailing bytes
		{byte(KindGroupWriteBatch), 0, 0, 0},
	} {
		if c, err := DecodeCommand(bad); err == nil {
			t.Errorf("%x decoded as %+v", bad, c)
		}
	}
}

// TestGroupRecordBatches runs the life of groups through two shards, one
// applying each record as its own command and one applying the records
// of each round of messages together (EncodeGroupRecords): after each
// step both have the same group states and the same values, and the
// batches take fewer commands. The deletion ships a write in its Ds, so
// that the frees that store it go in a versioned batch.
func TestGroupRecordBatches(t *testing.T) {
	one, batched := newGroupShard(t), newGroupShard(t)
	batched.batched = true
	shards := []*groupShard{one, batched}
	keys := []string{"a1", "a2", "a3", "a4", "a5", "a6"}
	same := func(step string) {
		t.Helper()
		l1, f1 := one.states()
		l2, f2 := batched.states()
		if !bytes.Equal(l1, l2) || !bytes.Equal(f1, f2) {
			t.Fatalf("%s: the group states differ:\nleader   %x\nbatched  %x\nfollower %x\nbatched  %x", step, l1, l2, f1, f2)
		}
		for _, k := range append(keys, "b1", "b2") {
			v1, _, ok1, err1 := ReadRecord(one.db, 7, []byte(k), Latest)
			v2, _, ok2, err2 := ReadRecord(batched.db, 7, []byte(k), Latest)
			if err1 != nil || err2 != nil || ok1 != ok2 || !bytes.Equal(v1.Value, v2.Value) {
				t.Fatalf("%s: %s is %q (%v, %v) one by one, %q (%v, %v) batched", step, k, v1.Value, ok1, err1, v2.Value, ok2, err2)
			}
		}
	}
	for _, g := range shards {
		g.run(g.create("a", group.Atomic, keys...), func() {})
		g.run(g.create("b", group.BestEffort, "b1", "b2"), func() {})
	}
	same("created")
	for _, g := range shards {
		var effs []group.Effect
		var err error
		g.s.WithGroups(func(l *group.Leader, _ *group.Follower) {
			effs, err = l.Write("a", []group.Write{{Key: group.Key{Collection: 7, Key: "a2"}, Value: []byte("v1")},
				{Key: group.Key{Collection: 7, Key: "a5"}, Value: []byte("v5")}}, nil)
		})
		if err != nil {
			t.Fatal(err)
		}
		g.run(effs, func() {})
	}
	same("written")
	for _, g := range shards {
		var effs []group.Effect
		var err error
		g.s.WithGroups(func(l *group.Leader, _ *group.Follower) { effs, err = l.Delete("a") })
		if err != nil {
			t.Fatal(err)
		}
		g.run(effs, func() {})
		g.tick(func() {})
	}
	same("deleted")
	for _, k := range []string{"a2", "a5"} {
		if v, _, ok, err := ReadRecord(batched.db, 7, []byte(k), Latest); err != nil || !ok || len(v.Value) == 0 {
			t.Fatalf("%s after the deletion: %q %v %v", k, v.Value, ok, err)
		}
	}
	if _, f := batched.states(); bytes.Contains(f, []byte("a1")) {
		t.Fatal("a1 is still yielded after the deletion")
	}
	if batched.writeBatches == 0 {
		t.Fatal("the frees that store the deleted group's last writes were not batched")
	}
	if batched.commands*2 > one.commands {
		t.Fatalf("batched: %d commands, one by one: %d", batched.commands, one.commands)
	}
	t.Logf("%d commands one by one, %d batched", one.commands, batched.commands)
}
