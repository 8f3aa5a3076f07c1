package elle

import "slices"

// graph is the dependency graph over the transactions of a history, nodes
// being indices into the history. Edges of several types between the same
// two nodes share one edge record.
type graph struct {
	// out[n] are the indices in edges of the edges leaving n, in the order
	// they were added.
	out   [][]int32
	edges []edge
	// index finds the edge from a node to another: from<<32 | to.
	index map[uint64]int32

	// Scratch space of sccs and shortestPath, by node, valid for node n
	// only when stamp[n] == gen: each search starts by incrementing gen,
	// so that it need not clear what earlier searches left.
	gen   uint32
	stamp []uint32
	// order and low are Tarjan's discovery index and low link; parent is
	// the edge that reached a node in a breadth-first search.
	order, low, parent []int32
	onStack            []bool
}

// edge is every dependency from one transaction to another.
type edge struct {
	from, to int32
	// types is a set of EdgeType bits.
	types EdgeType
	// keys[i] is the first key that gave the edge type 1<<i (ww, wr, rw).
	keys [3]string
}

func newGraph(n int) *graph {
	return &graph{
		out: make([][]int32, n), index: make(map[uint64]int32),
		stamp: make([]uint32, n), order: make([]int32, n), low: make([]int32, n),
		parent: make([]int32, n), onStack: make([]bool, n),
	}
}

// add adds a dependency of type t (with its key, empty for RT) from a to b;
// dependencies of a node on itself are dropped.
func (g *graph) add(a, b int, t EdgeType, key string) {
	if a == b {
		return
	}
	k := uint64(a)<<32 | uint64(uint32(b))
	i, ok := g.index[k]
	if !ok {
		i = int32(len(g.edges))
		g.edges = append(g.edges, edge{from: int32(a), to: int32(b)})
		g.index[k] = i
		g.out[a] = append(g.out[a], i)
	}
	e := &g.edges[i]
	if e.types&t == 0 && t != RT {
		e.keys[typeSlot(t)] = key
	}
	e.types |= t
}

// typeSlot is the index in edge.keys of a ww, wr or rw edge type.
func typeSlot(t EdgeType) int {
	switch t {
	case WW:
		return 0
	case WR:
		return 1
	default:
		return 2
	}
}

// label picks the type under which a cycle uses e, among those in mask: the
// one that makes the least severe claim about the cycle, ww before wr before
// rt before rw, so that a cycle is reported as the most specific anomaly.
func (e *edge) label(mask EdgeType) (EdgeType, string) {
	for _, t := range [...]EdgeType{WW, WR, RT, RW} {
		if e.types&mask&t != 0 {
			if t == RT {
				return t, ""
			}
			return t, e.keys[typeSlot(t)]
		}
	}
	panic("elle: edge has no type in mask")
}

// sccs returns the strongly connected components of more than one node of
// the subgraph of g induced by nodes (where member[n] == mark) and by the
// edges with a type in mask. Components come out in Tarjan's order, their
// nodes in discovery order of the component's root first.
func (g *graph) sccs(nodes []int32, member []int32, mark int32, mask EdgeType) [][]int32 {
	g.gen++
	gen := g.gen
	var stack []int32
	var comps [][]int32
	next := int32(0)

	// frame is a node whose edges are being explored, iteratively: the
	// recursion of Tarjan's algorithm is as deep as the graph is long.
	type frame struct {
		n int32
		i int // next index in g.out[n]
	}
	visit := func(n int32) {
		g.stamp[n] = gen
		g.order[n], g.low[n] = next, next
		next++
		stack = append(stack, n)
		g.onStack[n] = true
	}
	var call []frame
	for _, root := range nodes {
		if g.stamp[root] == gen {
			continue
		}
		visit(root)
		call = append(call[:0], frame{n: root})
		for len(call) > 0 {
			f := &call[len(call)-1]
			n := f.n
			if f.i < len(g.out[n]) {
				e := &g.edges[g.out[n][f.i]]
				f.i++
				m := e.to
				if e.types&mask == 0 || member[m] != mark {
					continue
				}
				if g.stamp[m] != gen {
					visit(m)
					call = append(call, frame{n: m})
				} else if g.onStack[m] {
					g.low[n] = min(g.low[n], g.order[m])
				}
				continue
			}
			// n is done: pop it, and close its component if it is a root.
			call = call[:len(call)-1]
			if len(call) > 0 {
				p := call[len(call)-1].n
				g.low[p] = min(g.low[p], g.low[n])
			}
			if g.low[n] != g.order[n] {
				continue
			}
			j := len(stack) - 1
			for stack[j] != n {
				j--
			}
			comp := stack[j:]
			for _, m := range comp {
				g.onStack[m] = false
			}
			if len(comp) > 1 {
				comps = append(comps, append([]int32(nil), comp...))
			}
			stack = stack[:j]
		}
	}
	return comps
}

// step is one edge of a cycle: e used as type t (with key).
type step struct {
	from, to int32
	t        EdgeType
	key      string
}

// shortestPath returns the edges of a shortest path from a to b (a cycle if
// a == b) over nodes n with member[n] == mark and edges with a type in mask,
// or nil if there is none. It visits at most *budget edges (no limit if
// budget is nil), decrementing it, and returns nil when it runs out.
func (g *graph) shortestPath(a, b int32, member []int32, mark int32, mask EdgeType, budget *int) []step {
	g.gen++
	gen := g.gen
	g.stamp[a] = gen // a has no parent edge
	queue := []int32{a}
	for len(queue) > 0 {
		n := queue[0]
		queue = queue[1:]
		for _, ei := range g.out[n] {
			if budget != nil {
				if *budget <= 0 {
					return nil
				}
				*budget--
			}
			e := &g.edges[ei]
			m := e.to
			if e.types&mask == 0 || member[m] != mark {
				continue
			}
			if m == b {
				return g.unwind(a, ei, mask)
			}
			if g.stamp[m] == gen {
				continue
			}
			g.stamp[m], g.parent[m] = gen, ei
			queue = append(queue, m)
		}
	}
	return nil
}

// unwind returns the path from a that the breadth-first search recorded in
// parent, ending with edge last.
func (g *graph) unwind(a int32, last int32, mask EdgeType) []step {
	var path []step
	for ei := last; ; {
		e := &g.edges[ei]
		t, key := e.label(mask)
		path = append(path, step{from: e.from, to: e.to, t: t, key: key})
		if e.from == a {
			break
		}
		ei = g.parent[e.from]
	}
	slices.Reverse(path)
	return path
}
