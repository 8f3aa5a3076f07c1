package elle

import (
	"fmt"
	"slices"
	"sort"
)

// writeRef is the append of a value to a key.
type writeRef struct {
	txn int // index in the history
	// final reports that it is the transaction's last append to the key.
	final bool
}

// readRef is a read of a key by an OK transaction.
type readRef struct {
	txn    int // index in the history
	values []int
	// external reports that it is the transaction's first read of the key
	// and came before any append of its own to the key: it shows the state
	// other transactions left. Only external reads give wr and rw edges.
	external bool
	// usable reports that it holds no duplicate and no garbage and so can
	// take part in the version order.
	usable bool
}

// keyState is what the history says about one key.
type keyState struct {
	writes map[int]writeRef // by value
	reads  []readRef
	// order is the key's version order: the longest usable read.
	order []int
	// pos[v] is the index of v in order.
	pos map[int]int
}

// checker holds the state of one Check.
type checker struct {
	h    History
	opts Options
	keys map[string]*keyState
	// sortedKeys are the keys of keys, sorted, for a deterministic report.
	sortedKeys []string
	// inGraph[i] reports that h[i] is a node of the dependency graph: it is
	// OK, or it is Info and some OK read observed one of its appends.
	inGraph []bool
	g       *graph
	found   []Anomaly
}

func (c *checker) key(k string) *keyState {
	ks, ok := c.keys[k]
	if !ok {
		ks = &keyState{writes: make(map[int]writeRef)}
		c.keys[k] = ks
	}
	return ks
}

func (c *checker) report(a Anomaly) { c.found = append(c.found, a) }

// name is the name of h[i] in explanations.
func (c *checker) name(i int) string { return fmt.Sprintf("T%d", c.h[i].ID) }

// indexOps records every append and every read of an OK transaction, and
// checks each OK transaction's reads against its own earlier ops.
func (c *checker) indexOps() {
	for i, t := range c.h {
		last := map[string]int{} // key -> index in t.Ops of t's last append
		for j, o := range t.Ops {
			if o.Kind == OpAppend {
				last[o.Key] = j
			}
		}
		for j, o := range t.Ops {
			if o.Kind == OpAppend {
				c.key(o.Key).writes[o.Value] = writeRef{txn: i, final: last[o.Key] == j}
			}
		}
		if t.Outcome == OK {
			c.internal(i)
		}
	}
}

// internal checks the reads of OK transaction h[i] against its own earlier
// ops and records them, marking the external ones.
func (c *checker) internal(i int) {
	t := c.h[i]
	// view is what t knows of a key so far.
	type view struct {
		// read reports that t has read the key; then expected is the list
		// its next read must return.
		read     bool
		expected []int
		// appended are t's appends to the key since its last read.
		appended []int
	}
	views := map[string]*view{}
	for _, o := range t.Ops {
		v := views[o.Key]
		if v == nil {
			v = &view{}
			views[o.Key] = v
		}
		switch o.Kind {
		case OpAppend:
			if v.read && slices.Contains(v.expected, o.Value) {
				c.report(Anomaly{
					Type: Internal, Txns: []int{t.ID}, Keys: []string{o.Key},
					Explanation: fmt.Sprintf("internal: %s appended %d to %s after reading %s=%s, which already held it",
						c.name(i), o.Value, o.Key, o.Key, formatList(v.expected)),
				})
			}
			if v.read {
				v.expected = append(v.expected, o.Value)
			} else {
				v.appended = append(v.appended, o.Value)
			}
		case OpRead:
			ok := true
			var want string
			switch {
			case v.read:
				ok = slices.Equal(o.Values, v.expected)
				want = fmt.Sprintf("%s, from its earlier read and appends", formatList(v.expected))
			case len(v.appended) > 0:
				n := len(o.Values) - len(v.appended)
				ok = n >= 0 && slices.Equal(o.Values[n:], v.appended)
				want = fmt.Sprintf("a list ending in its own appends %s", formatList(v.appended))
			}
			if !ok {
				c.report(Anomaly{
					Type: Internal, Txns: []int{t.ID}, Keys: []string{o.Key},
					Explanation: fmt.Sprintf("internal: %s read %s=%s, expected %s",
						c.name(i), o.Key, formatList(o.Values), want),
				})
			}
			c.key(o.Key).reads = append(c.key(o.Key).reads, readRef{
				txn: i, values: o.Values, external: !v.read && len(v.appended) == 0,
			})
			v.read, v.expected, v.appended = true, slices.Clone(o.Values), nil
		}
	}
}

// checkReads looks at each read alone: duplicates, garbage and aborted
// reads. It marks the reads fit for the version order.
func (c *checker) checkReads(k string, ks *keyState) {
	type pair struct{ reader, writer int }
	aborted := map[pair]bool{}
	for ri := range ks.reads {
		r := &ks.reads[ri]
		r.usable = true
		seen := make(map[int]bool, len(r.values))
		dup, garbage := false, false
		for _, v := range r.values {
			if seen[v] && !dup {
				dup = true
				c.report(Anomaly{
					Type: DuplicateElements, Txns: []int{c.h[r.txn].ID}, Keys: []string{k},
					Explanation: fmt.Sprintf("duplicate-elements: %s read %s=%s, with %d more than once",
						c.name(r.txn), k, formatList(r.values), v),
				})
			}
			seen[v] = true
			w, ok := ks.writes[v]
			if !ok {
				if !garbage {
					garbage = true
					c.report(Anomaly{
						Type: GarbageRead, Txns: []int{c.h[r.txn].ID}, Keys: []string{k},
						Explanation: fmt.Sprintf("garbage-read: %s read %s=%s, but no transaction appended %d to %s",
							c.name(r.txn), k, formatList(r.values), v, k),
					})
				}
				continue
			}
			if c.h[w.txn].Outcome == Fail && !aborted[pair{r.txn, w.txn}] {
				aborted[pair{r.txn, w.txn}] = true
				c.report(Anomaly{
					Type: G1a, Txns: []int{c.h[r.txn].ID, c.h[w.txn].ID}, Keys: []string{k},
					Explanation: fmt.Sprintf("G1a: %s read %s=%s, holding %d appended by %s, which failed",
						c.name(r.txn), k, formatList(r.values), v, c.name(w.txn)),
				})
			}
		}
		r.usable = !dup && !garbage
	}
}

// versionOrder sets the key's version order to its longest usable read and
// reports the reads that are not prefixes of it; those are left out of the
// inference (usable false).
func (c *checker) versionOrder(k string, ks *keyState) {
	longest := -1
	for ri, r := range ks.reads {
		if r.usable && (longest < 0 || len(r.values) > len(ks.reads[longest].values)) {
			longest = ri
		}
	}
	if longest >= 0 {
		ks.order = ks.reads[longest].values
	}
	ks.pos = make(map[int]int, len(ks.order))
	for p, v := range ks.order {
		ks.pos[v] = p
	}
	bad, first := 0, -1
	for ri := range ks.reads {
		r := &ks.reads[ri]
		if !r.usable || isPrefix(r.values, ks.order) {
			continue
		}
		r.usable = false
		if bad == 0 {
			first = ri
		}
		bad++
	}
	if bad == 0 {
		return
	}
	r, l := ks.reads[first], ks.reads[longest]
	more := ""
	if bad > 1 {
		more = fmt.Sprintf(" (and %d more reads of %s are not)", bad-1, k)
	}
	c.report(Anomaly{
		Type: IncompatibleOrder, Txns: []int{c.h[r.txn].ID, c.h[l.txn].ID}, Keys: []string{k},
		Explanation: fmt.Sprintf("incompatible-order: %s read %s=%s, which is not a prefix of %s read by %s%s",
			c.name(r.txn), k, formatList(r.values), formatList(l.values), c.name(l.txn), more),
	})
}

func isPrefix(p, l []int) bool { return len(p) <= len(l) && slices.Equal(p, l[:len(p)]) }

// chooseNodes puts in the graph the OK transactions and the Info ones with
// an append that some usable or unusable OK read observed.
func (c *checker) chooseNodes() int {
	c.inGraph = make([]bool, len(c.h))
	n := 0
	for i, t := range c.h {
		if t.Outcome == OK {
			c.inGraph[i] = true
			n++
		}
	}
	for _, k := range c.sortedKeys {
		ks := c.keys[k]
		for _, r := range ks.reads {
			for _, v := range r.values {
				if w, ok := ks.writes[v]; ok && !c.inGraph[w.txn] && c.h[w.txn].Outcome == Info {
					c.inGraph[w.txn] = true
					n++
				}
			}
		}
	}
	return n
}

// dependencies adds the ww, wr and rw edges that key k gives, and reports
// its intermediate reads.
//
// The version order is taken to be the key's longest usable read, followed,
// in some unknown order, by the OK appends that no read observed: in a
// serializable history every read is a prefix of the final list, which holds
// every committed append. Hence:
//   - ww: from the writer of each element of the order to the writer of the
//     next, and from the writer of the last to each writer of an unobserved
//     OK append;
//   - wr: from the writer of the last element of an external read to the
//     reader;
//   - rw: from the reader of an external read to the writer of the element
//     that follows it in the order or, if it read the whole order, to each
//     writer of an unobserved OK append.
//
// Elements appended by transactions outside the graph (failed ones: G1a is
// reported) are skipped.
func (c *checker) dependencies(k string, ks *keyState) {
	// writers[p] is the writer of order[p], or -1 outside the graph.
	writers := make([]int, len(ks.order))
	for p, v := range ks.order {
		writers[p] = -1
		if w := ks.writes[v]; c.inGraph[w.txn] {
			writers[p] = w.txn
		}
	}
	// next[p] is the first writer in the graph at p or after (-1: none).
	next := make([]int, len(ks.order)+1)
	next[len(ks.order)] = -1
	for p := len(ks.order) - 1; p >= 0; p-- {
		next[p] = next[p+1]
		if writers[p] >= 0 {
			next[p] = writers[p]
		}
	}
	prev := -1
	for _, w := range writers {
		if w < 0 {
			continue
		}
		if prev >= 0 {
			c.g.add(prev, w, WW, k)
		}
		prev = w
	}
	// unobserved are the writers of OK appends missing from the order, in
	// history order.
	var unobserved []int
	seen := map[int]bool{}
	for v, w := range ks.writes {
		if _, ok := ks.pos[v]; !ok && c.h[w.txn].Outcome == OK && !seen[w.txn] {
			seen[w.txn] = true
			unobserved = append(unobserved, w.txn)
		}
	}
	sort.Ints(unobserved)
	if prev >= 0 {
		for _, u := range unobserved {
			c.g.add(prev, u, WW, k)
		}
	}
	for _, r := range ks.reads {
		if !r.external || !r.usable {
			continue
		}
		if n := len(r.values); n > 0 {
			v := r.values[n-1]
			w := ks.writes[v]
			if c.inGraph[w.txn] && w.txn != r.txn {
				c.g.add(w.txn, r.txn, WR, k)
				if !w.final {
					c.report(Anomaly{
						Type: G1b, Txns: []int{c.h[r.txn].ID, c.h[w.txn].ID}, Keys: []string{k},
						Explanation: fmt.Sprintf("G1b: %s read %s=%s, ending in %d, which %s appended to %s before appending more",
							c.name(r.txn), k, formatList(r.values), v, c.name(w.txn), k),
					})
				}
			}
		}
		if w := next[len(r.values)]; w >= 0 {
			c.g.add(r.txn, w, RW, k)
		} else {
			for _, u := range unobserved {
				c.g.add(r.txn, u, RW, k)
			}
		}
	}
}

// realtime adds an rt edge from each transaction of the graph that
// completed to each that was invoked later, less those implied by
// transitivity: a transaction invoked at time t gets an edge from each
// member of the frontier at t, the transactions that completed before t
// and precede no other transaction that also did. Info transactions have
// no completion, so no edges leave them.
func (c *checker) realtime() {
	type event struct {
		at     int64
		invoke bool
		txn    int
	}
	var events []event
	for i, t := range c.h {
		if !c.inGraph[i] {
			continue
		}
		events = append(events, event{at: t.Invoke, invoke: true, txn: i})
		if t.Outcome == OK {
			events = append(events, event{at: t.Complete, txn: i})
		}
	}
	// At equal times invocations come first: precedence needs a completion
	// strictly before the invocation.
	sort.Slice(events, func(a, b int) bool {
		ea, eb := events[a], events[b]
		if ea.at != eb.at {
			return ea.at < eb.at
		}
		if ea.invoke != eb.invoke {
			return ea.invoke
		}
		return ea.txn < eb.txn
	})
	var frontier []int
	preds := map[int][]int{}
	for _, e := range events {
		if e.invoke {
			preds[e.txn] = slices.Clone(frontier)
			for _, p := range frontier {
				c.g.add(p, e.txn, RT, "")
			}
			continue
		}
		implied := map[int]bool{}
		for _, p := range preds[e.txn] {
			implied[p] = true
		}
		delete(preds, e.txn)
		kept := frontier[:0]
		for _, f := range frontier {
			if !implied[f] {
				kept = append(kept, f)
			}
		}
		frontier = append(kept, e.txn)
	}
}
