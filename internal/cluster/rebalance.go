package cluster

import "sort"

// Rebalancing plans (pure: the catalog in, changes out). The meta shard's
// leader proposes what they return, a few changes per round, once every
// shard's configuration matches its target.

// ShardPlace is where one shard's replicas are.
type ShardPlace struct {
	Collection string
	Shard      uint64
	// Nodes hold the shard's replicas, its preferred leader first.
	Nodes []uint64
}

// Move replaces the replica of one shard on From by one on To.
type Move struct {
	Collection string
	Shard      uint64
	From, To   uint64
}

// Prefer makes Node the preferred leader of one shard.
type Prefer struct {
	Collection string
	Shard      uint64
	Node       uint64
}

// Placements lists the shards of catalog, by shard id.
func Placements(catalog []*CollectionDesc) []ShardPlace {
	var out []ShardPlace
	for _, c := range catalog {
		for _, s := range c.Shards {
			p := ShardPlace{Collection: c.Name, Shard: s.ID}
			for _, r := range s.Replicas {
				p.Nodes = append(p.Nodes, r.Node)
			}
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Shard < out[j].Shard })
	return out
}

func holds(nodes []uint64, id uint64) bool {
	for _, n := range nodes {
		if n == id {
			return true
		}
	}
	return false
}

// byCount orders ids by count (ascending, or descending with desc), ties
// by id.
func byCount(ids []uint64, count map[uint64]int, desc bool) {
	sort.Slice(ids, func(i, j int) bool {
		a, b := count[ids[i]], count[ids[j]]
		if a != b && desc {
			return a > b
		}
		if a != b {
			return a < b
		}
		return ids[i] < ids[j]
	})
}

// PlanMoves returns at most max replica moves, each of a different shard.
// members maps every node to whether it is draining. Replicas on draining
// nodes move first, each to the non-draining node without a replica of
// its shard that holds the fewest replicas; then replicas move from the
// node holding the most replicas (of every shard of every collection) to
// the one holding the fewest while they differ by more than one. A
// replica that is not its shard's preferred leader moves first (no
// leadership transfer). Counts include the moves planned.
func PlanMoves(shards []ShardPlace, members map[uint64]bool, max int) []Move {
	load := map[uint64]int{}
	var live []uint64
	for id, draining := range members {
		load[id] = 0
		if !draining {
			live = append(live, id)
		}
	}
	for _, s := range shards {
		for _, id := range s.Nodes {
			load[id]++
		}
	}
	moved := map[uint64]bool{}
	var out []Move
	apply := func(s *ShardPlace, i int, to uint64) {
		out = append(out, Move{Collection: s.Collection, Shard: s.Shard, From: s.Nodes[i], To: to})
		load[s.Nodes[i]]--
		load[to]++
		moved[s.Shard] = true
	}
	// Off draining nodes.
	for si := range shards {
		s := &shards[si]
		for i, from := range s.Nodes {
			if len(out) >= max || moved[s.Shard] || !members[from] {
				continue
			}
			byCount(live, load, false)
			for _, to := range live {
				if !holds(s.Nodes, to) {
					apply(s, i, to)
					break
				}
			}
		}
	}
	// From the most to the least loaded.
	for len(out) < max {
		byCount(live, load, false)
		src := append([]uint64(nil), live...)
		byCount(src, load, true)
		found := false
	pairs:
		for _, from := range src {
			for _, to := range live {
				if load[from]-load[to] < 2 {
					break
				}
				// A follower replica first, then a preferred leader.
				for _, leaderToo := range []bool{false, true} {
					for si := range shards {
						s := &shards[si]
						if moved[s.Shard] || holds(s.Nodes, to) {
							continue
						}
						for i, id := range s.Nodes {
							if id == from && (i > 0 || leaderToo) {
								apply(s, i, to)
								found = true
								break pairs
							}
						}
					}
				}
			}
		}
		if !found {
			break
		}
	}
	return out
}

// PlanLeaders returns about max changes of preferred leaders, each of a
// different shard, moving them from the non-draining node preferred by the
// most shards to one preferred by the fewest while they differ by more
// than one. When no shard preferring the first has a replica on the
// second, it moves along a chain: a shard preferring the first to a node
// that prefers another shard with a replica on the second, and so on; the
// nodes between keep their counts.
func PlanLeaders(shards []ShardPlace, members map[uint64]bool, max int) []Prefer {
	pref := map[uint64]int{}
	var live []uint64
	for id, draining := range members {
		if !draining {
			pref[id] = 0
			live = append(live, id)
		}
	}
	for _, s := range shards {
		if len(s.Nodes) > 0 {
			if _, ok := pref[s.Nodes[0]]; ok {
				pref[s.Nodes[0]]++
			}
		}
	}
	changed := map[uint64]bool{}
	// path finds shards moving one preference from `from` to `to`: a
	// breadth-first search over "a shard preferring a has a replica on b".
	path := func(from, to uint64) []Prefer {
		type step struct {
			prev uint64
			p    Prefer
		}
		via := map[uint64]step{from: {}}
		queue := []uint64{from}
		for len(queue) > 0 {
			a := queue[0]
			queue = queue[1:]
			for _, s := range shards {
				if changed[s.Shard] || len(s.Nodes) == 0 || s.Nodes[0] != a {
					continue
				}
				for _, b := range s.Nodes[1:] {
					if _, seen := via[b]; seen {
						continue
					}
					if _, ok := pref[b]; !ok {
						continue // draining
					}
					via[b] = step{a, Prefer{Collection: s.Collection, Shard: s.Shard, Node: b}}
					if b == to {
						var out []Prefer
						for n := to; n != from; n = via[n].prev {
							out = append(out, via[n].p)
						}
						return out
					}
					queue = append(queue, b)
				}
			}
		}
		return nil
	}
	var out []Prefer
	for len(out) < max {
		byCount(live, pref, false)
		src := append([]uint64(nil), live...)
		byCount(src, pref, true)
		found := false
	pairs:
		for _, from := range src {
			for _, to := range live {
				if pref[from]-pref[to] < 2 {
					break
				}
				if p := path(from, to); p != nil {
					for _, c := range p {
						changed[c.Shard] = true
					}
					out = append(out, p...)
					pref[from]--
					pref[to]++
					found = true
					break pairs
				}
			}
		}
		if !found {
			break
		}
	}
	return out
}
