// Package elle checks histories of list-append transactions against groupkv
// for transactional anomalies, after Elle (Kingsbury and Alvaro, "Elle:
// Inferring Isolation Anomalies from Experimental Observations", VLDB 2020)
// and Adya's phenomena.
//
// The package owns three things:
//
//   - The history model: transactions (Txn) of micro-operations (Op) that
//     append an integer to the list stored at a key or read that list, each
//     with an outcome — OK (committed), Fail (definitely not committed) or
//     Info (unknown) — and the times its client invoked it and learned its
//     outcome.
//   - Recording: a Recorder, shared by the clients of a test, stamps each
//     transaction's invocation and completion with a strictly increasing
//     clock.
//   - Checking: Check infers a dependency graph and reports anomalies for a
//     consistency model (Options.Model): strict serializability (the
//     default), serializability or snapshot isolation.
//
// # Inference
//
// Appends make each key's list a record of its version order. For each key
// the longest read is taken as the order; every other read must be a prefix
// of it (else incompatible-order), and OK appends that no read observed come
// after it. From the order and the reads Check infers ww edges (consecutive
// appends), wr edges (a read ending in another transaction's append) and rw
// edges (a read that a later append extended), and, for strict
// serializability, rt edges (a transaction completed before another was
// invoked; only the edges not implied by others). Strongly connected
// components of the graph (Tarjan) are then searched for a short cycle
// (breadth-first), which names the anomaly: G0 (ww only), G1c (ww and wr),
// G-single (one rw), G-nonadjacent and G2-item (several rw, never or
// sometimes consecutive), each with a -realtime variant when the cycle needs
// an rt edge. Reads are also checked alone: G1a (aborted read), G1b
// (intermediate read), internal (a read that ignores the transaction's own
// earlier ops), duplicate-elements and garbage-read (a value nobody
// appended).
//
// Info transactions are nodes of the graph only if some OK read observed one
// of their appends; no rt edge leaves them (they have no completion) and
// their reads are ignored, as are those of Fail transactions.
//
// # The caller's obligations
//
// Every append of a history appends a value that no other append, in any
// transaction, appends to the same key: retries use fresh values. Reads
// report the whole list. Times of all transactions come from one clock on
// which a later event has a greater reading (a Recorder guarantees it).
//
// # Limits
//
// The checker is sound, not complete: every anomaly it reports is real
// (given the obligations above), but it may miss some.
//
//   - It reports one cycle per strongly connected component (per component
//     of the subgraph of the first search that finds one), the most specific
//     it finds; other cycles of the component, even of other types, are not
//     reported.
//   - Cycles are shortest through one node, not globally shortest, and
//     G-nonadjacent is recognised only when the cycle found happens to have
//     no adjacent rw edges: under snapshot isolation a component whose
//     reported cycle is G2-item may hide a G-nonadjacent one.
//   - The G-single search is bounded by Options.SearchBudget.
//   - Only list-append is modelled (no registers, counters or sets), and no
//     process order is inferred, so session guarantees are not checked.
//   - Reads that are not prefixes of the longest read are reported and then
//     left out of the inference; a key whose longest read is itself wrong
//     (for example it lost an element) makes the other reads look wrong.
//
// # Usage
//
//	var rec elle.Recorder
//	// in each client, for each transaction:
//	p := rec.Invoke(client, ops)
//	p.Complete(observedOps, elle.OK) // or elle.Fail, elle.Info
//	// at the end of the test:
//	rec.Check(t, seed, elle.Options{})
//
// or, with a history from elsewhere:
//
//	res, err := elle.Check(h, elle.Options{Model: elle.SnapshotIsolation})
//	if err != nil { ... } // a malformed history: no verdict
//	for _, a := range res.Anomalies {
//		fmt.Println(a.Explanation) // G-single: T12 -rw(x)-> T7 -wr(y)-> T12
//	}
//
// The package checks client-observable behaviour only and imports nothing
// from groupkv.
package elle
