package shard

import (
	"fmt"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/groupkv/groupkv/internal/kv"
)

// TestUntaggedPutsKeepTheTagIndex: a put without a condition skips reading
// the key's newest version while no key of the collection has a tag
// (Shard.untagged). Every way a key of the shard can come to carry a tag
// must end that, or a later put without the tag leaves the key in the
// tag's index: a tagged put here, a tagged key found when the shard is
// loaded (a restart), a merge that takes in a shard with tagged keys.
func TestUntaggedPutsKeepTheTagIndex(t *testing.T) {
	leftDesc := Desc{ShardID: 2, Collection: 1, Partitioning: kv.PartitionRange, End: []byte("g")}
	rightDesc := Desc{ShardID: 3, Collection: 1, Partitioning: kv.PartitionRange, Start: []byte("g")}
	version := uint64(10)
	put := func(key string, tags ...string) []byte {
		version++
		cmd := EncodeWrite([]Op{{Type: OpPut, Key: []byte(key), Value: []byte(fmt.Sprint(key, version)), Tags: tags}})
		SetVersion(cmd, version)
		return cmd
	}
	tagged := func(db *pebble.DB, tag string) []string {
		t.Helper()
		var keys []string
		if err := TagKeys(db, 1, tag, Latest, nil, nil, func(k []byte) bool { keys = append(keys, string(k)); return true }); err != nil {
			t.Fatal(err)
		}
		return keys
	}
	apply := func(db *pebble.DB, s *Shard, cmd []byte) {
		t.Helper()
		if res := applyOne(t, db, s, cmd); res.Err != nil {
			t.Fatal(res.Err)
		}
	}
	load := func(db *pebble.DB, d Desc) *Shard {
		t.Helper()
		s, err := Load(db, d)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}

	t.Run("tagged put", func(t *testing.T) {
		db := memDB(t)
		s := load(db, leftDesc)
		if !s.untagged {
			t.Fatal("a shard of a collection without tags loaded with untagged unset")
		}
		apply(db, s, put("a"))
		apply(db, s, put("b", "t"))
		apply(db, s, put("b"))
		if got := tagged(db, "t"); len(got) != 0 {
			t.Fatalf("tag t lists %q after b's tag was dropped", got)
		}
	})
	t.Run("restart", func(t *testing.T) {
		db := memDB(t)
		apply(db, load(db, leftDesc), put("b", "t"))
		s := load(db, leftDesc) // the node restarted
		apply(db, s, put("b"))
		if got := tagged(db, "t"); len(got) != 0 {
			t.Fatalf("tag t lists %q after b's tag was dropped by a put after a restart", got)
		}
	})
	t.Run("merge", func(t *testing.T) {
		db := memDB(t)
		l, r := load(db, leftDesc), load(db, rightDesc)
		apply(db, r, put("h", "t"))
		freeze := EncodeFreeze(2)
		version++
		SetVersion(freeze, version)
		apply(db, r, freeze)
		f, err := ReadFrozen(db, 3)
		if err != nil || f == nil {
			t.Fatalf("frozen state: %+v, %v", f, err)
		}
		apply(db, l, EncodeMergeTrigger(rightDesc, *f))
		if got := tagged(db, "t"); !slices.Equal(got, []string{"h"}) {
			t.Fatalf("tag t lists %q after the merge, want [h]", got)
		}
		apply(db, l, put("h"))
		if got := tagged(db, "t"); len(got) != 0 {
			t.Fatalf("tag t lists %q after h's tag was dropped in the merged shard", got)
		}
	})
}
