package cluster

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/groupkv/groupkv/internal/kv"
)

// layout creates collections of shards×rf on nodes the way the meta shard
// does (NewCollectionDesc, counting the catalog so far).
func layout(t *testing.T, nodes []uint64, colls, shards, rf int) []*CollectionDesc {
	t.Helper()
	var catalog []*CollectionDesc
	next := uint64(2)
	for i := 0; i < colls; i++ {
		opts := kv.CollectionOptions{Name: fmt.Sprint("c", i), Shards: shards, Replicas: rf}
		if err := kv.ValidateCollectionOptions(&opts); err != nil {
			t.Fatal(err)
		}
		d := NewCollectionDesc(opts, uint32(i+1), next, nodes, CatalogLoad(catalog))
		next += uint64(shards)
		catalog = append(catalog, d)
	}
	return catalog
}

// spread returns max-min of replicas and of preferred leaders over the
// non-draining members, and checks every shard's replicas are distinct.
func spread(t *testing.T, shards []ShardPlace, members map[uint64]bool) (replicas, leaders int) {
	t.Helper()
	r, l := map[uint64]int{}, map[uint64]int{}
	for _, s := range shards {
		seen := map[uint64]bool{}
		for i, id := range s.Nodes {
			if seen[id] {
				t.Fatalf("shard %d has two replicas on node %d: %v", s.Shard, id, s.Nodes)
			}
			seen[id] = true
			r[id]++
			if i == 0 {
				l[id]++
			}
		}
	}
	rlo, rhi, llo, lhi := 1<<30, 0, 1<<30, 0
	for id, draining := range members {
		if draining {
			continue
		}
		rlo, rhi = min(rlo, r[id]), max(rhi, r[id])
		llo, lhi = min(llo, l[id]), max(lhi, l[id])
	}
	return rhi - rlo, lhi - llo
}

// settle applies the plans round by round until they are empty, like the
// rebalancer, and returns the rounds taken.
func settle(t *testing.T, shards []ShardPlace, members map[uint64]bool) int {
	t.Helper()
	for round := 0; round < 1000; round++ {
		moves := PlanMoves(shards, members, 3)
		var prefs []Prefer
		if len(moves) == 0 {
			prefs = PlanLeaders(shards, members, 4)
		}
		if len(moves) == 0 && len(prefs) == 0 {
			return round
		}
		for _, m := range moves {
			for i := range shards {
				if shards[i].Shard != m.Shard {
					continue
				}
				at := -1
				for j, id := range shards[i].Nodes {
					if id == m.To {
						t.Fatalf("move %+v onto a node of the shard %v", m, shards[i].Nodes)
					}
					if id == m.From {
						at = j
					}
				}
				if at < 0 {
					t.Fatalf("move %+v from a node without a replica: %v", m, shards[i].Nodes)
				}
				shards[i].Nodes = append([]uint64(nil), shards[i].Nodes...)
				shards[i].Nodes[at] = m.To
			}
		}
		for _, p := range prefs {
			for i := range shards {
				if shards[i].Shard != p.Shard {
					continue
				}
				d := ShardDesc{}
				for _, id := range shards[i].Nodes {
					d.Replicas = append(d.Replicas, Replica{Node: id})
				}
				if !d.Prefer(p.Node) {
					t.Fatalf("prefer %+v: not a replica of %v", p, shards[i].Nodes)
				}
				shards[i].Nodes = nil
				for _, r := range d.Replicas {
					shards[i].Nodes = append(shards[i].Nodes, r.Node)
				}
			}
		}
	}
	t.Fatal("the plans did not converge in 1000 rounds")
	return 0
}

func TestNewCollectionDescSpreadsShards(t *testing.T) {
	nodes := []uint64{1, 2, 3, 4}
	catalog := layout(t, nodes, 3, 4, 3)
	members := map[uint64]bool{1: false, 2: false, 3: false, 4: false}
	r, l := spread(t, Placements(catalog), members)
	if r > 1 || l > 1 {
		t.Fatalf("new collections spread replicas within %d and leaders within %d, want 1: %+v", r, l, Placements(catalog))
	}
	if moves := PlanMoves(Placements(catalog), members, 3); len(moves) != 0 {
		t.Fatalf("a balanced layout plans moves %+v", moves)
	}
}

func TestPlanMovesAddNode(t *testing.T) {
	catalog := layout(t, []uint64{1, 2, 3}, 3, 4, 3)
	members := map[uint64]bool{1: false, 2: false, 3: false, 4: false}
	shards := Placements(catalog)
	if r, _ := spread(t, shards, members); r != 12 {
		t.Fatalf("before: replicas spread %d, want 12 (the new node holds none)", r)
	}
	rounds := settle(t, shards, members)
	r, l := spread(t, shards, members)
	if r > 1 || l > 1 {
		t.Fatalf("after %d rounds: replicas within %d, leaders within %d: %+v", rounds, r, l, shards)
	}
	// 36 replicas, 9 per node: 9 moves, 3 per round, then the leaders.
	if rounds > 6 {
		t.Fatalf("%d rounds to balance", rounds)
	}
}

func TestPlanMovesDrain(t *testing.T) {
	catalog := layout(t, []uint64{1, 2, 3, 4}, 2, 5, 3)
	members := map[uint64]bool{1: false, 2: true, 3: false, 4: false}
	shards := Placements(catalog)
	settle(t, shards, members)
	for _, s := range shards {
		if holds(s.Nodes, 2) {
			t.Fatalf("shard %d still on the draining node: %v", s.Shard, s.Nodes)
		}
	}
	if r, l := spread(t, shards, members); r > 1 || l > 1 {
		t.Fatalf("replicas within %d, leaders within %d: %+v", r, l, shards)
	}
}

// TestPlanMovesRandom balances random layouts of random clusters.
func TestPlanMovesRandom(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	for iter := 0; iter < 200; iter++ {
		n := 2 + rng.IntN(6)
		members := map[uint64]bool{}
		var nodes []uint64
		for i := 1; i <= n; i++ {
			members[uint64(i)] = false
			nodes = append(nodes, uint64(i))
		}
		rf := 1 + rng.IntN(min(n, 3))
		var shards []ShardPlace
		for s := 0; s < 1+rng.IntN(30); s++ {
			p := ShardPlace{Collection: "c", Shard: uint64(s + 2)}
			for _, j := range rng.Perm(n)[:rf] {
				p.Nodes = append(p.Nodes, nodes[j])
			}
			shards = append(shards, p)
		}
		if n > rf && rng.IntN(3) == 0 {
			members[nodes[rng.IntN(n)]] = true
		}
		settle(t, shards, members)
		if r, l := spread(t, shards, members); r > 1 || l > 1 {
			t.Fatalf("seed %d iteration %d: replicas within %d, leaders within %d: %+v (members %v)", seed, iter, r, l, shards, members)
		}
		for _, s := range shards {
			for _, id := range s.Nodes {
				if members[id] {
					t.Fatalf("seed %d iteration %d: shard %d still on draining node %d", seed, iter, s.Shard, id)
				}
			}
		}
	}
}
