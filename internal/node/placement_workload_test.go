package node

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/linearizability"
)

// TestClusterPlacementUnderLoad changes placement twice under concurrent
// clients: a fourth node joins a cluster of three holding two collections
// and the rebalancer moves shard replicas onto it; then a node holding
// replicas of the clients' collection is decommissioned and drained. The
// clients' puts and gets of collection "c" go through random nodes (the new
// node as soon as it serves, the draining node until the end) and are
// recorded; the history, closed by a read of every key through every node
// that stays, must be linearizable, and those final reads must agree. A
// writer of distinct keys of collection "d" checks that every put it got
// acknowledged is readable afterwards through every node that stays.
func TestClusterPlacementUnderLoad(t *testing.T) {
	seed := clusterSeed(t)
	t.Logf("seed %d (GROUPKV_SEED=%d reproduces the schedule of clients)", seed, seed)
	c := startCluster(t, 3, nil)
	ctx := context.Background()
	colls := []string{"c", "d"}
	for _, name := range colls {
		if _, err := c.node(1).n.CreateCollection(ctx, kv.CollectionOptions{Name: name, Shards: 3, Replicas: 3}); err != nil {
			t.Fatal(err)
		}
	}

	// The clients pick nodes from a snapshot of c.nodes replaced after
	// addNode, so that they never read c.nodes while it grows.
	var nodes atomic.Pointer[[]*testNode]
	snapshotNodes := func() {
		ns := append([]*testNode(nil), c.nodes...)
		nodes.Store(&ns)
	}
	snapshotNodes()
	pick := func(rng *rand.Rand) *testNode {
		ns := *nodes.Load()
		return ns[rng.IntN(len(ns))]
	}

	rec := &linearizability.Recorder{}
	const clients = 6
	keys := []string{"a", "b", "c", "d"}
	var stop atomic.Bool
	var wg sync.WaitGroup
	var ops atomic.Int64
	for cl := 0; cl < clients; cl++ {
		wg.Add(1)
		go func(cl int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(cl)))
			for i := 0; !stop.Load(); i++ {
				tn := pick(rng)
				key := keys[rng.IntN(len(keys))]
				if rng.IntN(2) == 0 {
					recordPut(rec, cl, tn.n, key, fmt.Sprintf("c%d-%d", cl, i))
				} else {
					recordGet(rec, cl, tn.n, key)
				}
				ops.Add(1)
				time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
			}
		}(cl)
	}
	// The writer of "d": distinct keys, each written once; the acknowledged
	// ones must all be readable at the end.
	var ackMu sync.Mutex
	var acked []string
	var unacked atomic.Int64
	var unackedErr atomic.Value
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(seed, clients))
		for i := 0; !stop.Load(); i++ {
			key := fmt.Sprintf("w%05d", i)
			cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			tn := pick(rng)
			_, err := tn.n.Put(cctx, kv.PutRequest{Collection: "d", Key: []byte(key), Value: []byte(key + "-v")})
			cancel()
			if err != nil {
				unacked.Add(1)
				unackedErr.CompareAndSwap(nil, fmt.Sprintf("put d/%s through node %d at %v: %v", key, tn.id, time.Now().Format("15:04:05.000"), err))
			} else {
				ackMu.Lock()
				acked = append(acked, key)
				ackMu.Unlock()
			}
			time.Sleep(time.Duration(rng.IntN(5)) * time.Millisecond)
		}
	}()
	time.Sleep(300 * time.Millisecond)

	// A fourth node joins: the rebalancer moves single shard replicas onto
	// it (loads 6/6/6/0 become 5/5/4/4 or so).
	start := time.Now()
	n4 := c.addNode()
	snapshotNodes()
	moved := 0
	c.eventually(60*time.Second, "replicas moved onto the new node and settled", func() error {
		moved = 0
		for _, name := range colls {
			d, err := c.node(1).n.collection(name)
			if err != nil {
				return err
			}
			for _, s := range d.Shards {
				for _, r := range s.Replicas {
					if r.Node == n4.id {
						moved++
					}
				}
			}
		}
		if moved < 4 {
			return fmt.Errorf("node %d holds %d replicas yet", n4.id, moved)
		}
		for _, name := range colls {
			if err := c.settledEverywhere(name); err != nil {
				return fmt.Errorf("collection %s: %w", name, err)
			}
		}
		return nil
	})
	t.Logf("%d replicas moved onto node %d; settled %v after adding it", moved, n4.id, time.Since(start).Round(time.Millisecond))

	// Split the clients' collection's first shard (its buckets in half)
	// while they run.
	cd, _ := c.node(1).n.collection("c")
	if _, err := c.node(2).n.SplitShard(ctx, "c", nil, cd.Shards[0].ID); err != nil {
		t.Fatalf("splitting a shard of c: %v", err)
	}
	c.eventually(60*time.Second, "the split settled", func() error { return c.settledEverywhere("c") })
	t.Logf("split shard %d of c", cd.Shards[0].ID)

	// Decommission the node holding the most replicas among those holding
	// collection "c" (not the new node): both collections move off it.
	load := map[uint64]int{}
	holdsC := map[uint64]bool{}
	for _, name := range colls {
		d, _ := c.node(1).n.collection(name)
		for _, s := range d.Shards {
			for _, r := range s.Replicas {
				load[r.Node]++
				if name == "c" {
					holdsC[r.Node] = true
				}
			}
		}
	}
	var drained *testNode
	for _, tn := range c.nodes {
		if tn == n4 || !holdsC[tn.id] {
			continue
		}
		if drained == nil || load[tn.id] > load[drained.id] {
			drained = tn
		}
	}
	if drained == nil {
		t.Fatalf("no node but the new one holds collection c; loads %v", load)
	}
	var via *testNode
	for _, tn := range c.nodes {
		if tn != drained {
			via = tn
		}
	}
	t.Logf("loads %v; decommissioning node %d through node %d at %v", load, drained.id, via.id, time.Now().Format("15:04:05.000"))
	start = time.Now()
	if err := via.n.Decommission(ctx, drained.id, true); err != nil {
		t.Fatal(err)
	}
	c.eventually(60*time.Second, "the decommissioned node holds no replica and everything settled", func() error {
		for _, name := range colls {
			d, err := c.node(1).n.collection(name)
			if err != nil {
				return err
			}
			for _, s := range d.Shards {
				for _, r := range s.Replicas {
					if r.Node == drained.id {
						return fmt.Errorf("shard %d of %s still targets node %d", s.ID, name, drained.id)
					}
				}
				if drained.n.hasReplica(s.ID) {
					return fmt.Errorf("node %d still holds shard %d of %s", drained.id, s.ID, name)
				}
			}
			if err := c.settledEverywhere(name); err != nil {
				return fmt.Errorf("collection %s: %w", name, err)
			}
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		st, err := via.n.ClusterStatus(cctx)
		if err != nil {
			return err
		}
		for _, ns := range st.Nodes {
			if ns.ID == drained.id && (!ns.Draining || ns.Replicas != 0 || ns.Held != 0) {
				return fmt.Errorf("cluster status of node %d: %+v", drained.id, ns)
			}
		}
		return nil
	})
	t.Logf("node %d drained at %v; settled %v after the decommission", drained.id, time.Now().Format("15:04:05.000"), time.Since(start).Round(time.Millisecond))
	time.Sleep(300 * time.Millisecond)
	stop.Store(true)
	wg.Wait()

	// Close the history with a read of every key through every node that
	// stays; the reads of one key must agree.
	var remaining []*testNode
	for _, tn := range c.nodes {
		if tn != drained {
			remaining = append(remaining, tn)
		}
	}
	for _, key := range keys {
		type seen struct {
			found   bool
			value   string
			version uint64
		}
		var first *seen
		firstNode := uint64(0)
		for _, tn := range remaining {
			var got seen
			c.eventually(30*time.Second, fmt.Sprintf("a final read of %q through node %d", key, tn.id), func() error {
				p := rec.Begin(clients, linearizability.Get(key))
				cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
				defer cancel()
				r, err := tn.n.Get(cctx, kv.GetRequest{Collection: "c", Key: []byte(key)})
				switch {
				case err == nil:
					p.End(linearizability.GetOK(string(r.Value), r.Version))
					got = seen{true, string(r.Value), r.Version}
					return nil
				case kv.CodeOf(err) == kv.CodeNotFound:
					p.End(linearizability.NotFound())
					got = seen{}
					return nil
				default:
					p.Fail()
					return err
				}
			})
			if first == nil {
				first, firstNode = &got, tn.id
			} else if got != *first {
				t.Fatalf("final reads of %q disagree: node %d reads %+v, node %d reads %+v", key, firstNode, *first, tn.id, got)
			}
		}
		t.Logf("final %q: %+v", key, *first)
	}

	// Every acknowledged put of "d" is readable through every node that
	// stays.
	for _, tn := range remaining {
		for lo := 0; lo < len(acked); lo += 500 {
			var refs []kv.KeyRef
			for _, key := range acked[lo:min(lo+500, len(acked))] {
				refs = append(refs, kv.KeyRef{Collection: "d", Key: []byte(key)})
			}
			res, err := tn.n.BatchGet(ctx, refs)
			if err != nil {
				t.Fatalf("node %d: a batch get of acknowledged keys of d: %v", tn.id, err)
			}
			for i, it := range res.Items {
				if key := string(refs[i].Key); !it.Found || string(it.Value) != key+"-v" {
					t.Fatalf("node %d reads d/%s = %q (found %v); the put was acknowledged", tn.id, key, it.Value, it.Found)
				}
			}
		}
	}
	t.Logf("%d client operations on c; %d acknowledged puts on d all readable (%d not acknowledged, first: %v)",
		ops.Load(), len(acked), unacked.Load(), unackedErr.Load())
	rec.Check(t, int64(seed))
}
