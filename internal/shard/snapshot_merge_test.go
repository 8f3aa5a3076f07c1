package shard

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/groupkv/groupkv/internal/kv"
)

// TestSnapshotAcrossMerge restores, into a replica that has not applied a
// merge, a snapshot its leader took after it: the replica takes the
// snapshot's span, and its state is the leader's, keys of the merged span
// included (a version the follower has and the leader garbage-collected
// goes too).
func TestSnapshotAcrossMerge(t *testing.T) {
	leftDesc := Desc{ShardID: 2, Collection: 1, Partitioning: kv.PartitionRange, End: []byte("g")}
	rightDesc := Desc{ShardID: 3, Collection: 1, Partitioning: kv.PartitionRange, Start: []byte("g")}
	apply := func(db *pebble.DB, s *Shard, cmd []byte) Result {
		t.Helper()
		return applyOne(t, db, s, cmd)
	}
	put := func(key string, version uint64) []byte {
		cmd := EncodeWrite([]Op{{Type: OpPut, Key: []byte(key), Value: []byte(fmt.Sprint(key, version))}})
		SetVersion(cmd, version)
		return cmd
	}
	freeze := EncodeFreeze(2)
	SetVersion(freeze, 30)
	// Both replicas: the same history up to the freeze.
	var lefts [2]*Shard
	dbs := [2]*pebble.DB{memDB(t), memDB(t)}
	for i, db := range dbs {
		l, err := Load(db, leftDesc)
		if err != nil {
			t.Fatal(err)
		}
		r, err := Load(db, rightDesc)
		if err != nil {
			t.Fatal(err)
		}
		for _, cmd := range [][]byte{put("a", 10), put("b", 11)} {
			if res := apply(db, l, cmd); res.Err != nil {
				t.Fatal(res.Err)
			}
		}
		for _, cmd := range [][]byte{put("h", 20), put("h", 21), put("z", 22), freeze} {
			if res := apply(db, r, cmd); res.Err != nil {
				t.Fatal(res.Err)
			}
		}
		lefts[i] = l
	}
	// The leader merges, writes and garbage-collects; the follower lags.
	leader, db := lefts[0], dbs[0]
	f, err := ReadFrozen(db, 3)
	if err != nil || f == nil {
		t.Fatalf("frozen state: %+v, %v", f, err)
	}
	for _, cmd := range [][]byte{EncodeMergeTrigger(rightDesc, *f), put("h", 31), put("c", 32), EncodeGC(25)} {
		if res := apply(db, leader, cmd); res.Err != nil {
			t.Fatal(res.Err)
		}
	}
	data := snapshotOf(t, db, leader.Desc())
	sd, err := SnapshotDesc(data)
	if err != nil || sd.End != nil || sd.Start != nil || sd.ShardID != 2 {
		t.Fatalf("the snapshot's descriptor: %+v, %v", sd, err)
	}
	restore(t, dbs[1], lefts[1].Desc(), data)
	follower, err := Load(dbs[1], sd)
	if err != nil {
		t.Fatal(err)
	}
	if d := follower.Desc(); d.End != nil || follower.MaxVersion() != leader.MaxVersion() || follower.GCThreshold() != 25 {
		t.Fatalf("the follower after the snapshot: %+v max-version %d gc %d", d, follower.MaxVersion(), follower.GCThreshold())
	}
	if got, want := snapshotOf(t, dbs[1], sd), data; !bytes.Equal(got, want) {
		t.Fatal("the follower's state differs from the leader's snapshot")
	}
	// h@20 was garbage-collected by the leader: gone from the follower too.
	if _, v, found, err := ReadRecord(dbs[1], 1, []byte("h"), 20); err != nil || found && v == 20 {
		t.Fatalf("h@20 after the snapshot: found %v at %d, %v", found, v, err)
	}
	for key, version := range map[string]uint64{"a": 10, "c": 32, "h": 31, "z": 22} {
		_, v, found, err := ReadRecord(dbs[1], 1, []byte(key), Latest)
		if err != nil || !found || v != version {
			t.Fatalf("%s after the snapshot: found %v at %d, %v; want %d", key, found, v, err, version)
		}
	}
}
