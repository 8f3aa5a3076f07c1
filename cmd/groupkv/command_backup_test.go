package main

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/kv"
)

// TestRestoreShardOf: the shard a restore groups a record under is the
// one the node routes it to, for hash, range and tag collections.
func TestRestoreShardOf(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, opts := range []kv.CollectionOptions{
		{Name: "h", Partitioning: kv.PartitionHash, Shards: 7},
		{Name: "r", Partitioning: kv.PartitionRange, Shards: 4, SplitPoints: [][]byte{[]byte("d"), []byte("k"), []byte("k\x00")}},
		{Name: "t", Partitioning: kv.PartitionTag, Shards: 5},
	} {
		d := cluster.NewCollectionDesc(opts, 1, 10, []uint64{1}, cluster.Load{Replicas: map[uint64]int{}, Leaders: map[uint64]int{}})
		info := d.Info(nil)
		for i := range 2000 {
			key := []byte(fmt.Sprintf("%c%d", 'a'+rng.IntN(26), i))
			var tags []string
			placement := ""
			if i%3 > 0 {
				placement = fmt.Sprintf("user%d", rng.IntN(50))
				tags = []string{placement, "other"}
			}
			if opts.Partitioning != kv.PartitionTag {
				placement = ""
			}
			_, want := d.Route(key, placement)
			if got := shardOf(info, key, tags); got != want {
				t.Fatalf("%s: key %q tags %v: shard %d, the node routes it to %d", opts.Name, key, tags, got, want)
			}
		}
	}
	if got := shardOf(kv.CollectionInfo{}, []byte("k"), nil); got != -1 {
		t.Errorf("no shards: %d, want -1", got)
	}
}
