package node

import (
	"context"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
)

// BenchmarkClusterMerge measures how long a merge takes, from the call to
// the merged shard serving, and a split back: three in-process nodes
// (real gRPC on 127.0.0.1, 20 ms raft ticks), a range collection of two
// shards with three replicas and a few keys, merged and split again at the
// same key b.N times. A merge's steps (the catalog, the right shard's
// freeze, the trigger in the left shard once every node holds the right
// one frozen) are taken by the shards' leaders, each waiting for the one
// before on every node; the right shard refuses writes from its freeze to
// the trigger. It reports the mean merge and split times (ms/merge,
// ms/split).
func BenchmarkClusterMerge(b *testing.B) {
	c := startCluster(b, 3, nil)
	ctx := context.Background()
	n := c.node(1).n
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "r", Partitioning: kv.PartitionRange, Replicas: 3,
		SplitPoints: [][]byte{[]byte("m")}}); err != nil {
		b.Fatal(err)
	}
	for _, k := range []string{"a", "b", "x", "y"} {
		c.eventually(30*time.Second, "a write", func() error {
			_, err := n.Put(ctx, kv.PutRequest{Collection: "r", Key: []byte(k), Value: []byte("v")})
			return err
		})
	}
	c.eventually(60*time.Second, "every replica is in place", func() error { return c.settledEverywhere("r") })
	var merging, splitting time.Duration
	b.ResetTimer()
	for range b.N {
		d, err := n.collection("r")
		if err != nil {
			b.Fatal(err)
		}
		left := d.Shards[0].ID
		t0 := time.Now()
		c.eventually(60*time.Second, "a merge", func() error {
			_, err := n.MergeShards(ctx, "r", left)
			return err
		})
		t1 := time.Now()
		c.eventually(60*time.Second, "a split", func() error {
			_, err := n.SplitShard(ctx, "r", []byte("m"), left)
			return err
		})
		t2 := time.Now()
		merging += t1.Sub(t0)
		splitting += t2.Sub(t1)
	}
	b.ReportMetric(float64(merging.Milliseconds())/float64(b.N), "ms/merge")
	b.ReportMetric(float64(splitting.Milliseconds())/float64(b.N), "ms/split")
}
