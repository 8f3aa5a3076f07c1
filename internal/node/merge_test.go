package node

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/linearizability"
	"github.com/groupkv/groupkv/internal/storage"
)

// runCollectionClients is runClients on collection coll; failed counts
// the operations refused (unavailable, not leader), which a merge should
// not cause.
func runCollectionClients(c *testCluster, coll string, rec *linearizability.Recorder, seed uint64, clients int, stop *atomic.Bool, wg *sync.WaitGroup, failed *atomic.Int64) {
	keys := []string{"a", "b", "c", "d"}
	for cl := 0; cl < clients; cl++ {
		wg.Add(1)
		go func(cl int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(cl)))
			for i := 0; !stop.Load(); i++ {
				tn := c.nodes[rng.IntN(len(c.nodes))]
				key := keys[rng.IntN(len(keys))]
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				if rng.IntN(2) == 0 {
					value := fmt.Sprintf("c%d-%d", cl, i)
					p := rec.Begin(cl, linearizability.Put(key, value))
					v, err := tn.n.Put(ctx, kv.PutRequest{Collection: coll, Key: []byte(key), Value: []byte(value)})
					switch {
					case err == nil:
						p.End(linearizability.PutOK(v))
					case kv.CodeOf(err) == kv.CodeUnavailable && ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded),
						kv.CodeOf(err) == kv.CodeNotLeader:
						p.Fail()
						failed.Add(1)
					default:
						p.End(linearizability.Unknown())
					}
				} else {
					p := rec.Begin(cl, linearizability.Get(key))
					r, err := tn.n.Get(ctx, kv.GetRequest{Collection: coll, Key: []byte(key)})
					switch {
					case err == nil:
						p.End(linearizability.GetOK(string(r.Value), r.Version))
					case kv.CodeOf(err) == kv.CodeNotFound:
						p.End(linearizability.NotFound())
					default:
						p.Fail()
						failed.Add(1)
					}
				}
				cancel()
				time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
			}
		}(cl)
	}
}

// checkMergedAway asserts that no node holds shard id any more: no
// replica, no raft group, no raft or shard state left in Pebble.
func (c *testCluster) checkMergedAway(id uint64) error {
	for _, tn := range c.nodes {
		if tn.n.hasReplica(id) {
			return fmt.Errorf("node %d still holds shard %d", tn.id, id)
		}
		if _, ok := tn.n.host.Desc(id); ok {
			return fmt.Errorf("node %d still runs shard %d's group", tn.id, id)
		}
		for _, span := range []func(uint64) ([]byte, []byte){storage.RaftSpan, storage.ShardStateSpan} {
			start, end := span(id)
			it, err := tn.n.eng.DB.NewIter(&pebble.IterOptions{LowerBound: start, UpperBound: end})
			if err != nil {
				return err
			}
			left := it.First()
			it.Close()
			if left {
				return fmt.Errorf("node %d keeps state of shard %d", tn.id, id)
			}
		}
	}
	return nil
}

// TestClusterMerge merges range shards and hash shards, on three nodes,
// while clients write and read keys on both sides of each merge: every
// record written before is read through every node afterwards, scans cross
// the former boundaries, the merged shards are gone from every node, the
// replicas agree, and the histories stay linearizable.
func TestClusterMerge(t *testing.T) {
	seed := clusterSeed(t)
	t.Logf("seed %d", seed)
	c := startCluster(t, 3, nil)
	ctx := context.Background()
	// Keys a-d are the clients': each range shard holds one of them.
	if _, err := c.node(1).n.CreateCollection(ctx, kv.CollectionOptions{Name: "r", Partitioning: kv.PartitionRange, Replicas: 3,
		SplitPoints: [][]byte{[]byte("b"), []byte("c"), []byte("d")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.node(1).n.CreateCollection(ctx, kv.CollectionOptions{Name: "h", Shards: 4, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	preload := func(i int) []byte { return []byte(fmt.Sprintf("%c%d", 'a'+i%26, i)) }
	for i := 0; i < 60; i++ {
		for _, coll := range []string{"r", "h"} {
			if _, err := c.node(1+uint64(i%3)).n.Put(ctx, kv.PutRequest{Collection: coll, Key: preload(i), Value: preload(i)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	recs := map[string]*linearizability.Recorder{"r": {}, "h": {}}
	var stop atomic.Bool
	var wg sync.WaitGroup
	var failed atomic.Int64
	for _, coll := range []string{"r", "h"} {
		runCollectionClients(c, coll, recs[coll], seed, 3, &stop, &wg, &failed)
	}
	time.Sleep(200 * time.Millisecond) // let the clients get going

	var gone []uint64
	merge := func(tn *testNode, coll string, at int, wantShards int) kv.CollectionInfo {
		t.Helper()
		d, err := tn.n.collection(coll)
		if err != nil {
			t.Fatal(err)
		}
		left, right := d.Shards[at], d.Shards[at+1]
		info, err := tn.n.MergeShards(ctx, coll, left.ID)
		if err != nil {
			t.Fatalf("merging shard %d of %s: %v", left.ID, coll, err)
		}
		if len(info.Shards) != wantShards || info.Shards[at].ID != left.ID {
			t.Fatalf("after merging shard %d of %s: %+v", left.ID, coll, info.Shards)
		}
		if d.Partitioning == kv.PartitionRange {
			if string(info.Shards[at].End) != string(right.End) {
				t.Fatalf("merged range shard ends at %q, want %q", info.Shards[at].End, right.End)
			}
		} else if info.Shards[at].BucketEnd != right.BucketEnd {
			t.Fatalf("merged hash shard ends at bucket %d, want %d", info.Shards[at].BucketEnd, right.BucketEnd)
		}
		gone = append(gone, right.ID)
		return info
	}
	// Range: [-, b) + [b, c), then [c, d) + [d, -); hash: the first two
	// bucket spans, then the last two. Through different nodes.
	merge(c.node(2), "r", 0, 3)
	merge(c.node(3), "h", 0, 3)
	merge(c.node(1), "r", 1, 2)
	merge(c.node(2), "h", 1, 2)
	time.Sleep(300 * time.Millisecond) // the clients go on over the merged shards
	stop.Store(true)
	wg.Wait()
	t.Logf("%d operations were refused during the merges", failed.Load())

	for _, coll := range []string{"r", "h"} {
		c.eventually(60*time.Second, "every replica of every shard is in place", func() error {
			return c.settledEverywhere(coll)
		})
	}
	for _, id := range gone {
		c.eventually(60*time.Second, "the merged shards are gone everywhere", func() error { return c.checkMergedAway(id) })
	}
	for _, coll := range []string{"r", "h"} {
		for _, tn := range c.nodes {
			for i := 0; i < 60; i++ {
				r, err := tn.n.Get(ctx, kv.GetRequest{Collection: coll, Key: preload(i)})
				if err != nil || string(r.Value) != string(preload(i)) {
					t.Fatalf("node %d reads %s/%s = %q, %v", tn.id, coll, preload(i), r.Value, err)
				}
			}
			res, err := tn.n.Scan(ctx, kv.ScanRequest{Collection: coll, Limit: 1000})
			if err != nil || len(res.Items) < 60 {
				t.Fatalf("node %d scans %d records of %s, %v", tn.id, len(res.Items), coll, err)
			}
		}
		// A range scan across the former boundaries at b and d.
		res, err := c.node(3).n.Scan(ctx, kv.ScanRequest{Collection: "r", Start: []byte("a5"), End: []byte("d9")})
		if err != nil {
			t.Fatal(err)
		}
		if first, last := string(res.Items[0].Key), string(res.Items[len(res.Items)-1].Key); first > "b" || last < "d" {
			t.Fatalf("a scan over the former boundaries reads %q..%q", first, last)
		}
		d, _ := c.node(1).n.collection(coll)
		for _, s := range d.Shards {
			cr, err := c.node(1).n.CheckShard(ctx, s.ID)
			if err != nil || cr.Status != kv.ConsistencyOK {
				t.Fatalf("consistency of shard %d: %+v, %v", s.ID, cr, err)
			}
		}
	}
	// New writes on both sides of the former boundaries are read back.
	for _, k := range []string{"a-new", "b-new", "c-new", "z-new"} {
		for _, coll := range []string{"r", "h"} {
			if _, err := c.node(2).n.Put(ctx, kv.PutRequest{Collection: coll, Key: []byte(k), Value: []byte(k)}); err != nil {
				t.Fatal(err)
			}
			for _, tn := range c.nodes {
				r, err := tn.n.Get(ctx, kv.GetRequest{Collection: coll, Key: []byte(k)})
				if err != nil || string(r.Value) != k {
					t.Fatalf("node %d reads %s/%s = %q, %v", tn.id, coll, k, r.Value, err)
				}
			}
		}
	}
	for coll, rec := range recs {
		t.Logf("checking the history of %s", coll)
		rec.Check(t, int64(seed))
	}
}

// TestClusterMergeSurvivesRestart merges two shards, restarts every node
// on its data directory, and reads every record through every node; the
// merged shard does not come back. Merges that cannot be are refused.
func TestClusterMergeSurvivesRestart(t *testing.T) {
	c := startCluster(t, 3, nil)
	ctx := context.Background()
	info, err := c.node(1).n.CreateCollection(ctx, kv.CollectionOptions{Name: "r", Partitioning: kv.PartitionRange, Replicas: 3,
		SplitPoints: [][]byte{[]byte("k20")}})
	if err != nil {
		t.Fatal(err)
	}
	left, right := info.Shards[0].ID, info.Shards[1].ID
	for i := 0; i < 40; i++ {
		k := []byte(fmt.Sprintf("k%02d", i))
		if _, err := c.node(1).n.Put(ctx, kv.PutRequest{Collection: "r", Key: k, Value: k}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		coll  string
		shard uint64
		code  kv.Code
	}{
		{"r", right, kv.CodeInvalidArgument}, // the last shard
		{"r", 0, kv.CodeInvalidArgument},
		{"r", 999, kv.CodeInvalidArgument},
		{"nope", left, kv.CodeCollectionNotFound},
	} {
		if _, err := c.node(2).n.MergeShards(ctx, tc.coll, tc.shard); kv.CodeOf(err) != tc.code {
			t.Fatalf("merging shard %d of %s: %v, want %s", tc.shard, tc.coll, err, tc.code)
		}
	}
	if _, err := c.node(2).n.MergeShards(ctx, "r", left); err != nil {
		t.Fatal(err)
	}
	c.eventually(60*time.Second, "the merge settled", func() error {
		if err := c.settledEverywhere("r"); err != nil {
			return err
		}
		return c.checkMergedAway(right)
	})
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
		c.eventually(60*time.Second, "every record after the restart", func() error {
			res, err := tn.n.Scan(ctx, kv.ScanRequest{Collection: "r", Limit: 100})
			if err != nil {
				return err
			}
			if len(res.Items) != 40 {
				return fmt.Errorf("node %d scans %d records", tn.id, len(res.Items))
			}
			for _, k := range []string{"k05", "k19", "k20", "k39"} {
				r, err := tn.n.Get(ctx, kv.GetRequest{Collection: "r", Key: []byte(k)})
				if err != nil || string(r.Value) != k {
					return fmt.Errorf("node %d reads %s = %q, %v", tn.id, k, r.Value, err)
				}
			}
			return nil
		})
	}
	for _, k := range []string{"a", "k30", "zz"} {
		c.eventually(60*time.Second, "a write after the restart", func() error {
			_, err := c.node(3).n.Put(ctx, kv.PutRequest{Collection: "r", Key: []byte(k), Value: []byte(k)})
			return err
		})
	}
	if err := c.settledEverywhere("r"); err != nil {
		t.Fatal(err)
	}
	if err := c.checkMergedAway(right); err != nil {
		t.Fatal(err)
	}
	d, _ := c.node(1).n.collection("r")
	if len(d.Shards) != 1 || d.Shards[0].ID != left || d.Shards[0].End != nil {
		t.Fatalf("after the restart: %+v", d.Shards)
	}
}

// TestClusterMergesBySize splits a range shard and a hash shard twice by
// request and lets the leaders merge the small shards back by themselves
// once the splits are Options.MergeQuiet old; the split points a
// collection was created with stay.
func TestClusterMergesBySize(t *testing.T) {
	const quiet = 2 * time.Second
	c := startCluster(t, 3, func(o *Options) {
		o.MergeBytes = 64 << 20
		o.MergeQuiet = quiet
		o.SplitCheckInterval = 100 * time.Millisecond
	})
	ctx := context.Background()
	if _, err := c.node(1).n.CreateCollection(ctx, kv.CollectionOptions{Name: "r", Partitioning: kv.PartitionRange, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.node(1).n.CreateCollection(ctx, kv.CollectionOptions{Name: "q", Partitioning: kv.PartitionRange, Replicas: 3,
		SplitPoints: [][]byte{[]byte("m")}}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 26; i++ {
		k := []byte{byte('a' + i)}
		for _, coll := range []string{"r", "q"} {
			if err := putRiding(ctx, c.node(1+uint64(i%3)).n, kv.PutRequest{Collection: coll, Key: k, Value: k}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A hash collection too: its shard splits in the middle of its
	// buckets and merges back the same way.
	if _, err := c.node(1).n.CreateCollection(ctx, kv.CollectionOptions{Name: "h", Partitioning: kv.PartitionHash, Shards: 1, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 26; i++ {
		k := []byte{byte('a' + i)}
		if err := putRiding(ctx, c.node(1).n, kv.PutRequest{Collection: "h", Key: k, Value: k}); err != nil {
			t.Fatal(err)
		}
	}
	splitStart := time.Now()
	for _, at := range []string{"g", "p"} {
		if _, err := c.node(2).n.SplitShard(ctx, "r", []byte(at), 0); err != nil {
			t.Fatal(err)
		}
		d, err := c.node(2).n.collection("h")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.node(2).n.SplitShard(ctx, "h", nil, d.Shards[0].ID); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"r", "h"} {
		c.eventually(60*time.Second, "the shards of "+name+" merged by size", func() error {
			d, err := c.node(2).n.collection(name)
			if err != nil {
				return err
			}
			if len(d.Shards) != 1 {
				return fmt.Errorf("%d shards", len(d.Shards))
			}
			return c.settledEverywhere(name)
		})
	}
	if since := time.Since(splitStart); since < quiet {
		t.Fatalf("the shards merged %v after their split, before %v", since, quiet)
	}
	if d, _ := c.node(1).n.collection("q"); len(d.Shards) != 2 {
		t.Fatalf("the split point q was created with was merged away: %+v", d.Shards)
	}
	for _, tn := range c.nodes {
		for _, name := range []string{"r", "h"} {
			c.eventually(30*time.Second, "a scan of every record", func() error {
				res, err := tn.n.Scan(ctx, kv.ScanRequest{Collection: name, Limit: 100})
				if err != nil {
					return err
				}
				if len(res.Items) != 26 {
					t.Fatalf("node %d scans %d records of %s, want 26", tn.id, len(res.Items), name)
				}
				return nil
			})
		}
	}
}

// TestClusterMergeHoldsWrites holds a merge with its right shard frozen:
// the left shard keeps serving its keys, reads of the right shard's keys
// answer its frozen state, and writes to them wait — routed again, not
// refused — and complete once the merge is through.
func TestClusterMergeHoldsWrites(t *testing.T) {
	c := startCluster(t, 3, nil)
	ctx := context.Background()
	info, err := c.node(1).n.CreateCollection(ctx, kv.CollectionOptions{Name: "r", Partitioning: kv.PartitionRange, Replicas: 3,
		SplitPoints: [][]byte{[]byte("m")}})
	if err != nil {
		t.Fatal(err)
	}
	left, right := info.Shards[0].ID, info.Shards[1].ID
	before := map[string]uint64{}
	for _, k := range []string{"b", "x"} {
		v, err := c.node(1).n.Put(ctx, kv.PutRequest{Collection: "r", Key: []byte(k), Value: []byte("old")})
		if err != nil {
			t.Fatal(err)
		}
		before[k] = v
	}
	for _, tn := range c.nodes {
		tn.n.knobs.holdMergeTrigger.Store(true)
	}
	merged := make(chan error, 1)
	go func() {
		_, err := c.node(2).n.MergeShards(ctx, "r", left)
		merged <- err
	}()
	c.eventually(60*time.Second, "the right shard frozen on every node", func() error {
		for _, tn := range c.nodes {
			if into := tn.n.frozenInto(right); into != left {
				return fmt.Errorf("node %d: shard %d frozen into %d", tn.id, right, into)
			}
		}
		return nil
	})
	type result struct {
		node    uint64
		version uint64
		err     error
	}
	held := make(chan result, len(c.nodes))
	for _, tn := range c.nodes {
		go func(tn *testNode) {
			wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			defer cancel()
			v, err := tn.n.Put(wctx, kv.PutRequest{Collection: "r", Key: []byte("x"), Value: []byte(fmt.Sprint("new", tn.id))})
			held <- result{tn.id, v, err}
		}(tn)
	}
	// Meanwhile the left shard serves its keys, and the right shard's keys
	// read as frozen.
	for _, tn := range c.nodes {
		if _, err := tn.n.Put(ctx, kv.PutRequest{Collection: "r", Key: []byte("b"), Value: []byte(fmt.Sprint("b", tn.id))}); err != nil {
			t.Fatalf("node %d writes b during the merge: %v", tn.id, err)
		}
		r, err := tn.n.Get(ctx, kv.GetRequest{Collection: "r", Key: []byte("x")})
		if err != nil || string(r.Value) != "old" || r.Version != before["x"] {
			t.Fatalf("node %d reads x during the merge: %q@%d, %v", tn.id, r.Value, r.Version, err)
		}
	}
	select {
	case r := <-held:
		t.Fatalf("a write of x through node %d ended while the merge was held: %d, %v", r.node, r.version, r.err)
	case err := <-merged:
		t.Fatalf("the merge ended while held: %v", err)
	default:
	}
	for _, tn := range c.nodes {
		tn.n.knobs.holdMergeTrigger.Store(false)
	}
	if err := <-merged; err != nil {
		t.Fatal(err)
	}
	var last result
	for range c.nodes {
		r := <-held
		if r.err != nil || r.version <= before["x"] {
			t.Fatalf("the held write of x through node %d: %d, %v", r.node, r.version, r.err)
		}
		if r.version > last.version {
			last = r
		}
	}
	for _, tn := range c.nodes {
		r, err := tn.n.Get(ctx, kv.GetRequest{Collection: "r", Key: []byte("x")})
		if err != nil || r.Version != last.version || string(r.Value) != fmt.Sprint("new", last.node) {
			t.Fatalf("node %d reads x = %q@%d, %v; want the last write, through node %d at %d", tn.id, r.Value, r.Version, err, last.node, last.version)
		}
	}
	c.eventually(60*time.Second, "the merged shard is gone everywhere", func() error { return c.checkMergedAway(right) })
}

// TestClusterMergeSnapshotToLaggingNode cuts a node off once it confirmed
// the right shard frozen, lets the merge and many writes go on without it
// until the left shard's log is truncated past the merge, and heals it:
// the node gets a snapshot of the merged shard, takes its span, drops its
// frozen right replica, and serves every record.
func TestClusterMergeSnapshotToLaggingNode(t *testing.T) {
	c := startCluster(t, 3, func(o *Options) { o.TruncateAfter = 20 })
	ctx := context.Background()
	info, err := c.node(1).n.CreateCollection(ctx, kv.CollectionOptions{Name: "r", Partitioning: kv.PartitionRange, Replicas: 3,
		SplitPoints: [][]byte{[]byte("m")}})
	if err != nil {
		t.Fatal(err)
	}
	left, right := info.Shards[0].ID, info.Shards[1].ID
	want := map[string]string{}
	put := func(tn *testNode, k, v string) {
		t.Helper()
		c.eventually(30*time.Second, "a write", func() error {
			_, err := tn.n.Put(ctx, kv.PutRequest{Collection: "r", Key: []byte(k), Value: []byte(v)})
			return err
		})
		want[k] = v
	}
	for i := 0; i < 10; i++ {
		put(c.node(1), fmt.Sprintf("b%02d", i), "before")
		put(c.node(1), fmt.Sprintf("x%02d", i), "before")
	}
	for _, tn := range c.nodes {
		tn.n.knobs.holdMergeTrigger.Store(true)
	}
	lead := c.leader(left)
	merged := make(chan error, 1)
	go func() {
		mctx, cancel := context.WithTimeout(ctx, 120*time.Second)
		defer cancel()
		_, err := lead.n.MergeShards(mctx, "r", left)
		merged <- err
	}()
	c.eventually(60*time.Second, "every node confirmed the right shard frozen", func() error {
		lead.n.confirmMu.Lock()
		defer lead.n.confirmMu.Unlock()
		nodes := map[uint64]bool{}
		for k := range lead.n.confirmed {
			if k.right == right {
				nodes[k.node] = true
			}
		}
		if len(nodes) != 3 {
			return fmt.Errorf("confirmed by %v", nodes)
		}
		return nil
	})
	var lag *testNode
	for _, tn := range c.nodes {
		if tn != lead && tn != c.leader(cluster.MetaShardID) {
			lag = tn
		}
	}
	c.net.isolate(lag.id)
	lagApplied, _ := lag.n.host.AppliedIndex(left)
	for _, tn := range c.nodes {
		tn.n.knobs.holdMergeTrigger.Store(false)
	}
	if err := <-merged; err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 60; i++ {
		put(lead, fmt.Sprintf("b%02d", i%20), fmt.Sprint("after", i))
		put(lead, fmt.Sprintf("x%02d", i%20), fmt.Sprint("after", i))
	}
	c.eventually(60*time.Second, "the left shard's log truncated past the lagging node", func() error {
		if truncated, _ := raftLogBounds(t, lead.n.eng.DB, left); truncated <= lagApplied+1 {
			return fmt.Errorf("truncated at %d, the lagging node applied %d", truncated, lagApplied)
		}
		return nil
	})
	if d, _ := lag.n.host.Desc(left); d.End == nil {
		t.Fatal("the cut-off node applied the merge")
	}
	c.net.heal(lag.id)
	c.eventually(60*time.Second, "the lagging node merged by a snapshot", func() error {
		if d, ok := lag.n.host.Desc(left); !ok || d.End != nil {
			return fmt.Errorf("node %d: shard %d spans %+v", lag.id, left, d)
		}
		return c.checkMergedAway(right)
	})
	for k, v := range want {
		c.eventually(30*time.Second, "a record read through the healed node", func() error {
			r, err := lag.n.Get(ctx, kv.GetRequest{Collection: "r", Key: []byte(k)})
			if err != nil || string(r.Value) != v {
				return fmt.Errorf("node %d reads %s = %q, %v; want %q", lag.id, k, r.Value, err, v)
			}
			return nil
		})
	}
	c.eventually(60*time.Second, "the replicas of the merged shard agree", func() error {
		cr, err := lead.n.CheckShard(ctx, left)
		if err != nil || cr.Status != kv.ConsistencyOK {
			return fmt.Errorf("consistency of shard %d: %+v, %v", left, cr, err)
		}
		return nil
	})
}

// TestClusterSplitSnapshotToLaggingNode is the split's counterpart: a node
// cut off before a split gets a snapshot of the narrowed parent once the
// parent's log is truncated past the split, and creates its replica of the
// new shard, filled by a snapshot of its own.
func TestClusterSplitSnapshotToLaggingNode(t *testing.T) {
	c := startCluster(t, 3, func(o *Options) { o.TruncateAfter = 20 })
	ctx := context.Background()
	info, err := c.node(1).n.CreateCollection(ctx, kv.CollectionOptions{Name: "r", Partitioning: kv.PartitionRange, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	parent := info.Shards[0].ID
	lead := c.leader(parent)
	var lag *testNode
	for _, tn := range c.nodes {
		if tn != lead && tn != c.leader(cluster.MetaShardID) {
			lag = tn
		}
	}
	c.net.isolate(lag.id)
	lagApplied, _ := lag.n.host.AppliedIndex(parent)
	split, err := lead.n.SplitShard(ctx, "r", []byte("m"), 0)
	if err != nil {
		t.Fatal(err)
	}
	child := split.Shards[1].ID
	want := map[string]string{}
	for i := 0; i < 60; i++ {
		k := fmt.Sprintf("b%02d", i%20)
		c.eventually(30*time.Second, "a write", func() error {
			_, err := lead.n.Put(ctx, kv.PutRequest{Collection: "r", Key: []byte(k), Value: []byte(fmt.Sprint(i))})
			return err
		})
		want[k] = fmt.Sprint(i)
	}
	c.eventually(60*time.Second, "the parent's log truncated past the lagging node", func() error {
		if truncated, _ := raftLogBounds(t, lead.n.eng.DB, parent); truncated <= lagApplied+1 {
			return fmt.Errorf("truncated at %d, the lagging node applied %d", truncated, lagApplied)
		}
		return nil
	})
	c.net.heal(lag.id)
	c.eventually(60*time.Second, "the lagging node holds both shards", func() error {
		if d, ok := lag.n.host.Desc(parent); !ok || string(d.End) != "m" {
			return fmt.Errorf("node %d: shard %d spans %+v", lag.id, parent, d)
		}
		return c.settledEverywhere("r")
	})
	if !lag.n.hasReplica(child) {
		t.Fatalf("node %d holds no replica of shard %d", lag.id, child)
	}
	for k, v := range want {
		c.eventually(30*time.Second, "a record read through the healed node", func() error {
			r, err := lag.n.Get(ctx, kv.GetRequest{Collection: "r", Key: []byte(k)})
			if err != nil || string(r.Value) != v {
				return fmt.Errorf("node %d reads %s = %q, %v; want %q", lag.id, k, r.Value, err, v)
			}
			return nil
		})
	}
	for _, k := range []string{"n", "z"} {
		c.eventually(30*time.Second, "a write to the new shard", func() error {
			_, err := lag.n.Put(ctx, kv.PutRequest{Collection: "r", Key: []byte(k), Value: []byte(k)})
			return err
		})
	}
	for _, id := range []uint64{parent, child} {
		c.eventually(60*time.Second, "the replicas agree", func() error {
			cr, err := lead.n.CheckShard(ctx, id)
			if err != nil || cr.Status != kv.ConsistencyOK {
				return fmt.Errorf("consistency of shard %d: %+v, %v", id, cr, err)
			}
			return nil
		})
	}
}
