package elle

import (
	"fmt"
	"slices"
	"strings"
)

// searchCycles reports a cycle in each strongly connected component of the
// dependency graph, the most specific one found. Each component is searched
// in this order, stopping at the first search that finds something:
//
//  1. G0: a cycle of ww edges;
//  2. G1c: a cycle of ww and wr edges;
//  3. G-single: an rw edge closed by a path of ww and wr edges;
//  4. any cycle of ww, wr and rw edges (G-nonadjacent or G2-item).
//
// and then, when real-time edges are in the graph, the same four with rt
// edges allowed in the paths (the -realtime anomalies). A search that finds
// cycles reports one for each strongly connected component of its subgraph
// (the G-single search: one in all).
func (c *checker) searchCycles(realtime bool) (incomplete bool) {
	all := WW | WR | RW
	if realtime {
		all |= RT
	}
	var nodes []int32
	for i, in := range c.inGraph {
		if in {
			nodes = append(nodes, int32(i))
		}
	}
	// member[n] is the mark of the component being searched that n is in.
	member := make([]int32, len(c.h))
	everywhere := int32(1)
	for i := range member {
		if c.inGraph[i] {
			member[i] = everywhere
		}
	}
	mark := everywhere
	for _, comp := range c.g.sccs(nodes, member, everywhere, all) {
		mark++
		for _, n := range comp {
			member[n] = mark
		}
		extras := []EdgeType{0}
		if realtime {
			extras = append(extras, RT)
		}
		for _, rt := range extras {
			found, out := c.searchComponent(comp, member, mark, rt)
			incomplete = incomplete || out
			if found {
				break
			}
		}
	}
	return incomplete
}

// searchComponent runs the searches of searchCycles over comp, the nodes
// with member[n] == mark, with extra (0 or RT) added to every edge mask. It
// reports what it finds and whether the G-single search ran out of budget.
func (c *checker) searchComponent(comp []int32, member []int32, mark int32, extra EdgeType) (found, outOfBudget bool) {
	for _, mask := range []EdgeType{WW, WW | WR} {
		if c.cyclesIn(comp, member, mark, mask|extra) {
			return true, false
		}
	}
	budget := c.opts.SearchBudget
	if cycle := c.singleRW(comp, member, mark, (WW|WR)|extra, &budget); cycle != nil {
		c.reportCycle(cycle)
		return true, false
	}
	return c.cyclesIn(comp, member, mark, WW|WR|RW|extra), budget <= 0
}

// cyclesIn reports a shortest cycle through the first node of each
// strongly connected component of the subgraph of comp with edges in mask,
// and whether there was any.
func (c *checker) cyclesIn(comp []int32, member []int32, mark int32, mask EdgeType) bool {
	subs := c.g.sccs(comp, member, mark, mask)
	for _, sub := range subs {
		// Mark the sub-component so that the search stays inside it, then
		// restore the marks of comp.
		sm := mark + 1<<30
		for _, n := range sub {
			member[n] = sm
		}
		c.reportCycle(c.g.shortestPath(sub[0], sub[0], member, sm, mask, nil))
		for _, n := range sub {
			member[n] = mark
		}
	}
	return len(subs) > 0
}

// singleRW returns a cycle of comp made of one rw edge and a path of edges
// in pathMask back from its target to its source, or nil. The rw edges whose
// ends share a strongly connected component of the pathMask subgraph are
// tried first: they are sure to close. Each target is searched once.
func (c *checker) singleRW(comp []int32, member []int32, mark int32, pathMask EdgeType, budget *int) []step {
	sub := map[int32]int{} // node -> its component of the pathMask subgraph
	for i, s := range c.g.sccs(comp, member, mark, pathMask) {
		for _, n := range s {
			sub[n] = i + 1
		}
	}
	type rwEdge struct{ from, to int32 }
	var sure, others []rwEdge
	for _, n := range comp {
		for _, ei := range c.g.out[n] {
			e := &c.g.edges[ei]
			if e.types&RW == 0 || member[e.to] != mark {
				continue
			}
			if s := sub[e.from]; s != 0 && s == sub[e.to] {
				sure = append(sure, rwEdge{e.from, e.to})
			} else {
				others = append(others, rwEdge{e.from, e.to})
			}
		}
	}
	if len(sure) > 0 {
		e := sure[0]
		path := c.g.shortestPath(e.to, e.from, member, mark, pathMask, nil)
		_, key := c.g.edges[c.g.index[uint64(e.from)<<32|uint64(uint32(e.to))]].label(RW)
		return append([]step{{from: e.from, to: e.to, t: RW, key: key}}, path...)
	}
	// sources[b] are the sources of the rw edges into b.
	sources := map[int32][]int32{}
	var targets []int32
	for _, e := range others {
		if _, ok := sources[e.to]; !ok {
			targets = append(targets, e.to)
		}
		sources[e.to] = append(sources[e.to], e.from)
	}
	for _, b := range targets {
		for _, a := range sources[b] {
			if *budget <= 0 {
				return nil
			}
			path := c.g.shortestPath(b, a, member, mark, pathMask, budget)
			if path == nil {
				continue
			}
			_, key := c.g.edges[c.g.index[uint64(a)<<32|uint64(uint32(b))]].label(RW)
			return append([]step{{from: a, to: b, t: RW, key: key}}, path...)
		}
	}
	return nil
}

// reportCycle classifies a cycle by its edges and reports it.
func (c *checker) reportCycle(cycle []step) {
	if len(cycle) == 0 {
		return
	}
	var count [RT + 1]int
	adjacentRW := false
	for i, s := range cycle {
		count[s.t]++
		if s.t == RW && cycle[(i+1)%len(cycle)].t == RW {
			adjacentRW = true
		}
	}
	var t AnomalyType
	switch {
	case count[RW] == 0 && count[WR] == 0:
		t = G0
	case count[RW] == 0:
		t = G1c
	case count[RW] == 1:
		t = GSingle
	case !adjacentRW:
		t = GNonadjacent
	default:
		t = G2Item
	}
	if count[RT] > 0 {
		t += "-realtime"
	}
	a := Anomaly{Type: t}
	steps := make([]string, len(cycle))
	for i, s := range cycle {
		e := Edge{From: c.h[s.from].ID, To: c.h[s.to].ID, Type: s.t, Key: s.key}
		a.Cycle = append(a.Cycle, e)
		a.Txns = append(a.Txns, e.From)
		if s.key != "" && !slices.Contains(a.Keys, s.key) {
			a.Keys = append(a.Keys, s.key)
		}
		steps[i] = fmt.Sprintf(" %v %s", e, c.name(int(s.to)))
	}
	// A cycle can be thousands of edges long; Anomaly.Cycle has them all.
	const head, tail = 24, 8
	if len(steps) > head+tail+1 {
		elided := fmt.Sprintf(" … (%d more edges) …", len(steps)-head-tail)
		steps = append(append(steps[:head:head], elided), steps[len(steps)-tail:]...)
	}
	a.Explanation = fmt.Sprintf("%s: %s%s", t, c.name(int(cycle[0].from)), strings.Join(steps, ""))
	c.report(a)
}
