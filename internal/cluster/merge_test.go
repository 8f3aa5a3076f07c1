package cluster

import (
	"errors"
	"testing"

	"github.com/groupkv/groupkv/internal/kv"
)

func TestMergeRange(t *testing.T) {
	d := NewCollectionDesc(kv.CollectionOptions{Name: "r", Partitioning: kv.PartitionRange, Shards: 3,
		SplitPoints: [][]byte{[]byte("g"), []byte("p")}}, 1, 2, []uint64{1, 2, 3}, Load{})
	right, err := d.Merge(2)
	if err != nil {
		t.Fatal(err)
	}
	if right.ID != 3 || len(d.Shards) != 2 || string(d.Shards[0].End) != "p" || d.Shards[0].Start != nil {
		t.Fatalf("after the merge: right %+v, shards %+v", right, d.Shards)
	}
	if len(d.SplitPoints) != 1 || string(d.SplitPoints[0]) != "p" {
		t.Fatalf("split points %q", d.SplitPoints)
	}
	if len(d.Merged) != 1 || d.Merged[0].ID != 3 || d.Merged[0].MergedInto != 2 {
		t.Fatalf("merged %+v", d.Merged)
	}
	// Routing follows: "h" was shard 3's, now shard 2's.
	if _, i := d.Route([]byte("h"), ""); d.Shards[i].ID != 2 {
		t.Fatalf("h routes to shard %d", d.Shards[i].ID)
	}
	// The last shard has no right neighbour.
	if _, err := d.Merge(4); err == nil {
		t.Fatal("merged the last shard")
	}
	if _, err := d.Merge(3); err == nil {
		t.Fatal("merged a shard that is gone")
	}
	// Again into the last shard: one shard owning everything.
	if _, err := d.Merge(2); err != nil || len(d.Shards) != 1 || d.Shards[0].End != nil || len(d.SplitPoints) != 0 {
		t.Fatalf("second merge: %v, %+v", err, d.Shards)
	}
}

func TestMergeHashRefusesOtherNodes(t *testing.T) {
	d := NewCollectionDesc(kv.CollectionOptions{Name: "h", Partitioning: kv.PartitionHash, Shards: 4}, 1, 2, []uint64{1, 2, 3}, Load{})
	if _, err := d.Merge(2); err != nil || d.Shards[0].BucketEnd != kv.NumBuckets/2 || len(d.Shards) != 3 {
		t.Fatalf("hash merge: %v, %+v", err, d.Shards)
	}
	// A replica joining on the same node (a node back with an empty disk).
	if !d.Shards[1].RenewReplica(1) {
		t.Fatal("renew")
	}
	if _, err := d.Merge(2); !errors.Is(err, ErrMergeReplicas) {
		t.Fatalf("merge with a replica joining: %v", err)
	}
	// Replicas on other nodes (a move).
	if !d.Shards[1].MoveReplica(1, 4) {
		t.Fatal("move")
	}
	for i := range d.Shards[1].Replicas {
		d.Shards[1].Replicas[i].Joining = false
	}
	if _, err := d.Merge(2); !errors.Is(err, ErrMergeReplicas) {
		t.Fatalf("merge of shards on other nodes: %v", err)
	}
}
