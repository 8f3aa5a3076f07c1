package node

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/linearizability"
)

// TestClusterSplit splits a range shard at a key and a hash shard in the
// middle of its buckets, on three nodes, while clients write and read: the
// new shards start on every replica from the parent's state, serve every
// record written before, take new writes, and the history stays
// linearizable.
func TestClusterSplit(t *testing.T) {
	seed := clusterSeed(t)
	t.Logf("seed %d", seed)
	c := startCluster(t, 3, nil)
	ctx := context.Background()
	if _, err := c.node(1).n.CreateCollection(ctx, kv.CollectionOptions{Name: "c", Partitioning: kv.PartitionRange, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.node(1).n.CreateCollection(ctx, kv.CollectionOptions{Name: "h", Shards: 2, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	// Keys a-d are the clients' (the history starts with them absent).
	for i := 0; i < 26; i++ {
		k := []byte{byte('a' + i)}
		for _, coll := range []string{"c", "h"} {
			if coll == "c" && i < 4 {
				continue
			}
			if _, err := c.node(1+uint64(i%3)).n.Put(ctx, kv.PutRequest{Collection: coll, Key: k, Value: k}); err != nil {
				t.Fatal(err)
			}
		}
	}
	rec := &linearizability.Recorder{}
	var stop atomic.Bool
	var wg sync.WaitGroup
	runClients(c, rec, seed, 4, &stop, &wg) // keys a-d of "c": both sides stay busy
	time.Sleep(200 * time.Millisecond)

	info, err := c.node(2).n.SplitShard(ctx, "c", []byte("c"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(info.Shards) != 2 || string(info.Shards[1].Start) != "c" {
		t.Fatalf("after the split: %+v", info.Shards)
	}
	d, _ := c.node(1).n.collection("h")
	hinfo, err := c.node(3).n.SplitShard(ctx, "h", nil, d.Shards[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(hinfo.Shards) != 3 {
		t.Fatalf("after the hash split: %+v", hinfo.Shards)
	}
	time.Sleep(300 * time.Millisecond)
	stop.Store(true)
	wg.Wait()

	for _, coll := range []string{"c", "h"} {
		c.eventually(30*time.Second, "every replica of every shard is in place", func() error {
			return c.settledEverywhere(coll)
		})
		for _, tn := range c.nodes {
			for i := 4; i < 26; i++ {
				k := []byte{byte('a' + i)}
				r, err := tn.n.Get(ctx, kv.GetRequest{Collection: coll, Key: k})
				if err != nil || string(r.Value) != string(k) {
					t.Fatalf("node %d reads %s/%s = %q, %v", tn.id, coll, k, r.Value, err)
				}
			}
			res, err := tn.n.Scan(ctx, kv.ScanRequest{Collection: coll, Limit: 100})
			if err != nil || len(res.Items) < 22 {
				t.Fatalf("node %d scans %d records of %s, %v", tn.id, len(res.Items), coll, err)
			}
		}
	}
	// New writes land in the new shards and are read back everywhere.
	for i := 0; i < 10; i++ {
		k := []byte(fmt.Sprint("z", i))
		if _, err := c.node(1).n.Put(ctx, kv.PutRequest{Collection: "c", Key: k, Value: k}); err != nil {
			t.Fatal(err)
		}
		for _, tn := range c.nodes {
			c.eventually(10*time.Second, "a new write read back", func() error {
				r, err := tn.n.Get(ctx, kv.GetRequest{Collection: "c", Key: k})
				if err != nil || string(r.Value) != string(k) {
					return fmt.Errorf("node %d reads %s = %q, %v", tn.id, k, r.Value, err)
				}
				return nil
			})
		}
	}
	rec.Check(t, int64(seed))
}

// TestClusterSplitsBySize lets a range shard and a hash shard grow past
// the split size: their leaders split them (the range shard at its middle
// key, the hash shard in the middle of its buckets), and every record
// stays readable.
func TestClusterSplitsBySize(t *testing.T) {
	c := startCluster(t, 3, func(o *Options) {
		o.SplitBytes = 200 << 10
		o.SplitCheckInterval = 100 * time.Millisecond
	})
	ctx := context.Background()
	colls := []kv.CollectionOptions{
		{Name: "r", Partitioning: kv.PartitionRange, Replicas: 3},
		{Name: "h", Partitioning: kv.PartitionHash, Shards: 1, Replicas: 3},
	}
	value := make([]byte, 1024)
	for _, o := range colls {
		if _, err := c.node(1).n.CreateCollection(ctx, o); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 300; i++ {
			if _, err := c.node(1).n.Put(ctx, kv.PutRequest{Collection: o.Name, Key: []byte(fmt.Sprintf("k%04d", i)), Value: value}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tn := range c.nodes {
		if err := tn.n.eng.DB.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	for _, o := range colls {
		c.eventually(60*time.Second, "collection "+o.Name+" split by size", func() error {
			d, err := c.node(2).n.collection(o.Name)
			if err != nil {
				return err
			}
			if len(d.Shards) < 2 {
				return fmt.Errorf("%d shard(s)", len(d.Shards))
			}
			return c.settledEverywhere(o.Name)
		})
		for _, tn := range c.nodes {
			// Further splits may be under way: a scan meeting one mid-way
			// answers unavailable, to be retried.
			c.eventually(30*time.Second, "a scan of every record", func() error {
				res, err := tn.n.Scan(ctx, kv.ScanRequest{Collection: o.Name, Limit: 1000})
				if err != nil {
					if kv.CodeOf(err) == kv.CodeUnavailable {
						return err
					}
					t.Fatalf("node %d: %s: %v", tn.id, o.Name, err)
				}
				if len(res.Items) != 300 {
					t.Fatalf("node %d scans %d records of %s, want 300", tn.id, len(res.Items), o.Name)
				}
				return nil
			})
		}
	}
}

// TestClusterSplitSurvivesRestart splits a shard, restarts every node on
// its data directory, and reads every record through every node.
func TestClusterSplitSurvivesRestart(t *testing.T) {
	c := startCluster(t, 3, nil)
	ctx := context.Background()
	if _, err := c.node(1).n.CreateCollection(ctx, kv.CollectionOptions{Name: "r", Partitioning: kv.PartitionRange, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 40; i++ {
		k := []byte(fmt.Sprintf("k%02d", i))
		if _, err := c.node(1).n.Put(ctx, kv.PutRequest{Collection: "r", Key: k, Value: k}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.node(2).n.SplitShard(ctx, "r", []byte("k20"), 0); err != nil {
		t.Fatal(err)
	}
	c.eventually(30*time.Second, "the split settled", func() error { return c.settledEverywhere("r") })
	dirs := make([]string, len(c.nodes))
	peers := make([]string, len(c.nodes))
	for i, tn := range c.nodes {
		dirs[i], peers[i] = tn.n.opts.DataDir, tn.peer
		tn.srv.Stop()
		if err := tn.n.Close(); err != nil {
			t.Fatal(err)
		}
	}
	for i := range c.nodes {
		c.nodes[i] = c.startNode(uint64(i+1), dirs[i], nil, peers[i])
	}
	for _, tn := range c.nodes {
		c.eventually(30*time.Second, "every record after the restart", func() error {
			res, err := tn.n.Scan(ctx, kv.ScanRequest{Collection: "r", Limit: 100})
			if err != nil {
				return err
			}
			if len(res.Items) != 40 {
				return fmt.Errorf("node %d scans %d records", tn.id, len(res.Items))
			}
			for _, k := range []string{"k05", "k20", "k39"} {
				r, err := tn.n.Get(ctx, kv.GetRequest{Collection: "r", Key: []byte(k)})
				if err != nil || string(r.Value) != k {
					return fmt.Errorf("node %d reads %s = %q, %v", tn.id, k, r.Value, err)
				}
			}
			return nil
		})
	}
	// Writes on both sides of the split still work.
	for _, k := range []string{"a", "zz"} {
		c.eventually(30*time.Second, "a write after the restart", func() error {
			_, err := c.node(3).n.Put(ctx, kv.PutRequest{Collection: "r", Key: []byte(k), Value: []byte(k)})
			return err
		})
	}
	if err := c.settledEverywhere("r"); err != nil {
		t.Fatal(err)
	}
}
