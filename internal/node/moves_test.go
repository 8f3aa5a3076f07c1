package node

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/linearizability"
)

// settledEverywhere checks that every shard of collection name has its
// catalog's target replicas as its voters, and that every node holds
// exactly the replicas the catalog gives it.
func (c *testCluster) settledEverywhere(name string) error {
	d, err := c.nodes[0].n.collection(name)
	if err != nil {
		return err
	}
	for _, s := range d.Shards {
		var leader *testNode
		for _, tn := range c.nodes {
			if tn.n.host.Ready(s.ID) {
				leader = tn
			}
		}
		if leader == nil {
			return fmt.Errorf("shard %d has no leader", s.ID)
		}
		cs, _ := leader.n.host.ConfState(s.ID)
		if !leader.n.settled(s.ID, cs) {
			return fmt.Errorf("shard %d: configuration %v, target %+v", s.ID, cs, s.Replicas)
		}
		for _, tn := range c.nodes {
			want := false
			for _, r := range s.Replicas {
				want = want || r.Node == tn.id
			}
			if tn.n.hasReplica(s.ID) != want {
				return fmt.Errorf("node %d holds shard %d: %v, want %v", tn.id, s.ID, !want, want)
			}
		}
	}
	return nil
}

func metaReplicaID(n *Node) uint64 {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.mu.replicas[cluster.MetaShardID].ReplicaID
}

// runClients runs clients of puts and gets on collection c through random
// nodes until stop is closed, recording the history.
func runClients(c *testCluster, rec *linearizability.Recorder, seed uint64, clients int, stop *atomic.Bool, wg *sync.WaitGroup) {
	keys := []string{"a", "b", "c", "d"}
	for cl := 0; cl < clients; cl++ {
		wg.Add(1)
		go func(cl int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(cl)))
			for i := 0; !stop.Load(); i++ {
				tn := c.nodes[rng.IntN(len(c.nodes))]
				key := keys[rng.IntN(len(keys))]
				if rng.IntN(2) == 0 {
					recordPut(rec, cl, tn.n, key, fmt.Sprintf("c%d-%d", cl, i))
				} else {
					recordGet(rec, cl, tn.n, key)
				}
				time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
			}
		}(cl)
	}
}

// TestClusterDecommission drains a node holding a collection's replicas
// under concurrent clients: the replicas move, shard by shard, to the other
// nodes (learner, snapshot, voter, then the old replica is removed), the
// drained node
// holds nothing and gives up its meta vote, and the history stays
// linearizable.
func TestClusterDecommission(t *testing.T) {
	seed := clusterSeed(t)
	t.Logf("seed %d", seed)
	c := startCluster(t, 4, nil)
	ctx := context.Background()
	info, err := c.node(1).n.CreateCollection(ctx, kv.CollectionOptions{Name: "c", Shards: 3, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	d, _ := c.node(1).n.collection("c")
	holders := map[uint64]bool{}
	for _, r := range d.Shards[0].Replicas {
		holders[r.Node] = true
	}
	var spare, drained uint64
	for _, tn := range c.nodes {
		if !holders[tn.id] {
			spare = tn.id
		}
	}
	// Drain a holder that votes in the meta shard, so its vote moves too.
	cs, _ := c.node(1).n.host.ConfState(cluster.MetaShardID)
	for _, r := range d.Shards[0].Replicas {
		for _, tn := range c.nodes {
			if tn.id == r.Node && contains(cs.Voters, metaReplicaID(tn.n)) {
				drained = r.Node
			}
		}
	}
	if spare == 0 || drained == 0 {
		t.Fatalf("no spare (%d) or drainable (%d) node; holders %v", spare, drained, holders)
	}
	t.Logf("collection on %v; draining node %d, spare node %d", holders, drained, spare)

	rec := &linearizability.Recorder{}
	var stop atomic.Bool
	var wg sync.WaitGroup
	runClients(c, rec, seed, 4, &stop, &wg)
	time.Sleep(200 * time.Millisecond)
	if err := c.node(2).n.Decommission(ctx, drained, true); err != nil {
		t.Fatal(err)
	}
	c.eventually(60*time.Second, "the replicas moved off the drained node", func() error {
		d, _ := c.node(1).n.collection("c")
		for _, s := range d.Shards {
			for _, r := range s.Replicas {
				if r.Node == drained {
					return fmt.Errorf("shard %d still targets node %d", s.ID, drained)
				}
			}
		}
		return c.settledEverywhere("c")
	})
	c.eventually(30*time.Second, "the drained node gave up its meta vote", func() error {
		rid := metaReplicaID(c.node(drained).n)
		for _, tn := range c.nodes {
			if tn.n.host.Ready(cluster.MetaShardID) {
				cs, _ := tn.n.host.ConfState(cluster.MetaShardID)
				if contains(cs.Voters, rid) || len(cs.Voters) != 3 {
					return fmt.Errorf("meta voters %v still hold replica %d", cs.Voters, rid)
				}
				return nil
			}
		}
		return fmt.Errorf("no meta leader")
	})
	time.Sleep(200 * time.Millisecond)
	// The drained node can stop: everything keeps working without it.
	dn := c.node(drained)
	dn.srv.Stop()
	c.net.isolate(drained)
	time.Sleep(300 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	for _, tn := range c.nodes {
		if tn.id == drained {
			continue
		}
		c.eventually(30*time.Second, "a write after the drained node stopped", func() error {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			_, err := tn.n.Put(cctx, kv.PutRequest{Collection: "c", Key: []byte("after"), Value: []byte("x")})
			return err
		})
	}
	_ = info
	rec.Check(t, int64(seed))
}

// balanced checks, over GET /v1/cluster as node via reports it, that
// every shard has a leader and its replicas are its voters (as far as via
// knows them: it knows the voters of the shards it holds), and that per
// node the replicas and the leaders of every shard of every collection
// differ by at most one.
func (c *testCluster) balanced(via *testNode, shards int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	st, err := via.n.ClusterStatus(ctx)
	if err != nil {
		return err
	}
	replicas, leaders := map[uint64]int{}, map[uint64]int{}
	for _, ns := range st.Nodes {
		if !ns.Healthy || ns.Held != ns.Replicas {
			return fmt.Errorf("node %d: healthy %v, holds %d of its %d replicas", ns.ID, ns.Healthy, ns.Held, ns.Replicas)
		}
		replicas[ns.ID], leaders[ns.ID] = 0, 0
	}
	n := 0
	for _, s := range st.Shards {
		if s.Collection == "" {
			continue
		}
		n++
		if s.Leader == 0 || len(s.Voters) > 0 && fmt.Sprint(sorted(s.Replicas)) != fmt.Sprint(s.Voters) {
			return fmt.Errorf("shard %d: leader %d, replicas %v, voters %v", s.Shard, s.Leader, s.Replicas, s.Voters)
		}
		for _, r := range s.Replicas {
			replicas[r]++
		}
		leaders[s.Leader]++
	}
	if n != shards {
		return fmt.Errorf("%d shards, want %d", n, shards)
	}
	spread := func(m map[uint64]int) int {
		lo, hi := 1<<30, 0
		for _, v := range m {
			lo, hi = min(lo, v), max(hi, v)
		}
		return hi - lo
	}
	if spread(replicas) > 1 || spread(leaders) > 1 {
		return fmt.Errorf("replicas per node %v, leaders per node %v", replicas, leaders)
	}
	return nil
}

func sorted(ids []uint64) []uint64 {
	out := append([]uint64(nil), ids...)
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// TestClusterRebalanceOntoNewNode adds a fourth node to a cluster of three
// holding three collections of four shards at three replicas: single shard
// replicas and then preferred leaders move until, per node, replicas and
// leaders differ by at most one, within a minute; every record stays
// readable through every node, and a scan through every node returns the
// whole collection although no node holds all of its shards.
func TestClusterRebalanceOntoNewNode(t *testing.T) {
	c := startCluster(t, 3, nil)
	ctx := context.Background()
	names := []string{"a", "b", "r"}
	for _, name := range names {
		opts := kv.CollectionOptions{Name: name, Shards: 4, Replicas: 3}
		if name == "r" {
			opts = kv.CollectionOptions{Name: name, Partitioning: kv.PartitionRange, Replicas: 3,
				SplitPoints: [][]byte{[]byte("k1"), []byte("k3"), []byte("k6")}}
		}
		if _, err := c.node(1).n.CreateCollection(ctx, opts); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 50; i++ {
			if _, err := c.node(1).n.Put(ctx, kv.PutRequest{Collection: name, Key: []byte(fmt.Sprintf("k%02d", i)), Value: []byte(name)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	start := time.Now()
	n4 := c.addNode()
	c.eventually(60*time.Second, "replicas and leaders balanced within one per node", func() error {
		if err := c.balanced(c.node(2), 12); err != nil {
			return err
		}
		for _, name := range names {
			if err := c.settledEverywhere(name); err != nil {
				return err
			}
		}
		return nil
	})
	t.Logf("balanced %v after adding node 4", time.Since(start).Round(time.Millisecond))
	for _, name := range names {
		full := 0
		for _, tn := range c.nodes {
			d, _ := tn.n.collection(name)
			all := true
			for _, s := range d.Shards {
				all = all && tn.n.hasReplica(s.ID)
			}
			full += btoi(all)
		}
		t.Logf("collection %s: %d of 4 nodes hold all its shards", name, full)
	}
	for _, tn := range c.nodes {
		for _, name := range names {
			for i := 0; i < 50; i++ {
				r, err := getRiding(ctx, tn.n, kv.GetRequest{Collection: name, Key: []byte(fmt.Sprintf("k%02d", i))})
				if err != nil || string(r.Value) != name {
					t.Fatalf("node %d reads %s/k%02d = %q, %v", tn.id, name, i, r.Value, err)
				}
			}
			res, err := tn.n.Scan(ctx, kv.ScanRequest{Collection: name, Limit: 1000})
			if err != nil || len(res.Items) != 50 {
				t.Fatalf("node %d scans %d records of %s, %v; want 50", tn.id, len(res.Items), name, err)
			}
		}
	}
	_ = n4
}

// replaceNode stops node id and starts it again on an empty data directory
// (a lost disk), joining through the first node.
func (c *testCluster) replaceNode(id uint64) *testNode {
	t := c.t
	t.Helper()
	old := c.node(id)
	old.srv.Stop()
	if err := old.n.Close(); err != nil {
		t.Fatal(err)
	}
	tn := c.startNode(id, t.TempDir(), []string{c.join}, "127.0.0.1:0")
	c.nodes[id-1] = tn
	return tn
}

// TestClusterNodeReturnsWithEmptyDisk loses a node's disk: started again
// with its id on an empty directory, it gets new replica ids (ids are never
// reused) in the meta shard and in every shard it held, the old replicas
// are removed from their groups, and it serves every write again.
func TestClusterNodeReturnsWithEmptyDisk(t *testing.T) {
	c := startCluster(t, 3, nil)
	ctx := context.Background()
	if _, err := c.node(1).n.CreateCollection(ctx, kv.CollectionOptions{Name: "c", Shards: 2, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 40; i++ {
		if _, err := c.node(1).n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte(fmt.Sprint("k", i)), Value: []byte(fmt.Sprint(i))}); err != nil {
			t.Fatal(err)
		}
	}
	d, _ := c.node(1).n.collection("c")
	oldIDs := map[uint64]uint64{}
	for _, s := range d.Shards {
		for _, r := range s.Replicas {
			if r.Node == 3 {
				oldIDs[s.ID] = r.ID
			}
		}
	}
	oldMeta := metaReplicaID(c.node(3).n)
	n3 := c.replaceNode(3)
	c.eventually(60*time.Second, "the node with a new disk holds its shards again", func() error {
		if err := c.settledEverywhere("c"); err != nil {
			return err
		}
		d, _ := c.node(1).n.collection("c")
		for _, s := range d.Shards {
			for _, r := range s.Replicas {
				if r.Node == 3 && r.ID == oldIDs[s.ID] {
					return fmt.Errorf("shard %d still names replica %d of node 3", s.ID, r.ID)
				}
			}
		}
		return nil
	})
	c.eventually(30*time.Second, "the meta shard replaced the lost replica", func() error {
		newMeta := metaReplicaID(n3.n)
		if newMeta == 0 || newMeta == oldMeta {
			return fmt.Errorf("node 3's meta replica is %d (was %d)", newMeta, oldMeta)
		}
		for _, tn := range c.nodes {
			if tn.n.host.Ready(cluster.MetaShardID) {
				cs, _ := tn.n.host.ConfState(cluster.MetaShardID)
				if contains(cs.Voters, oldMeta) || contains(cs.Learners, oldMeta) || !contains(cs.Voters, newMeta) {
					return fmt.Errorf("meta configuration %v", cs)
				}
				return nil
			}
		}
		return fmt.Errorf("no meta leader")
	})
	for i := 0; i < 40; i++ {
		r, err := n3.n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte(fmt.Sprint("k", i))})
		if err != nil || string(r.Value) != fmt.Sprint(i) {
			t.Fatalf("node 3 reads k%d = %q, %v", i, r.Value, err)
		}
	}
}

// TestClusterLeadersBalanced creates collections whose preferred leaders
// pile up on the first nodes: the rebalancer moves preferred leaders until
// per-node counts differ by at most one, and leadership follows.
func TestClusterLeadersBalanced(t *testing.T) {
	c := startCluster(t, 3, nil)
	ctx := context.Background()
	for _, name := range []string{"a", "b", "c"} {
		if _, err := c.node(1).n.CreateCollection(ctx, kv.CollectionOptions{Name: name, Shards: 8, Replicas: 3}); err != nil {
			t.Fatal(err)
		}
	}
	c.eventually(60*time.Second, "leaders spread within one", func() error {
		led := map[uint64]int{}
		for _, tn := range c.nodes {
			tn.n.mu.RLock()
			var ids []uint64
			for id := range tn.n.mu.replicas {
				if id != cluster.MetaShardID {
					ids = append(ids, id)
				}
			}
			tn.n.mu.RUnlock()
			for _, id := range ids {
				if tn.n.host.Ready(id) {
					led[tn.id]++
				}
			}
		}
		lo, hi := 1<<30, 0
		total := 0
		for _, tn := range c.nodes {
			lo, hi = min(lo, led[tn.id]), max(hi, led[tn.id])
			total += led[tn.id]
		}
		if total != 24 || hi-lo > 1 {
			return fmt.Errorf("leaders per node %v", led)
		}
		return nil
	})
}
