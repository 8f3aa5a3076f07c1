package elle

import (
	"fmt"
	"strings"
)

// AnomalyType names a kind of anomaly, after Adya's phenomena and Elle's
// additions for list-append histories.
type AnomalyType string

// Anomalies found without a cycle, by looking at single reads and
// transactions.
const (
	// G1a (aborted read): an OK transaction read a value appended by a
	// transaction that failed.
	G1a AnomalyType = "G1a"
	// G1b (intermediate read): an OK transaction read a list ending in a
	// value that another transaction appended to that key before appending
	// more.
	G1b AnomalyType = "G1b"
	// Internal: a transaction's read does not reflect its own earlier ops
	// on the key (its appends, or what it read before), or holds a value
	// that the transaction appends only afterwards.
	Internal AnomalyType = "internal"
	// IncompatibleOrder: two reads of one key are not prefixes of one list,
	// so no version order explains them.
	IncompatibleOrder AnomalyType = "incompatible-order"
	// DuplicateElements: a read observed one value twice in a list.
	DuplicateElements AnomalyType = "duplicate-elements"
	// GarbageRead: a read observed a value that no transaction of the
	// history appended to that key.
	GarbageRead AnomalyType = "garbage-read"
)

// Anomalies found as cycles in the dependency graph, named by the edges of
// the cycle reported.
const (
	// G0 (write cycle): ww edges only.
	G0 AnomalyType = "G0"
	// G1c (circular information flow): ww and wr edges, at least one wr.
	G1c AnomalyType = "G1c"
	// GSingle (read skew, lost update): exactly one rw edge.
	GSingle AnomalyType = "G-single"
	// GNonadjacent: two or more rw edges, no two of them consecutive in
	// the cycle. Snapshot isolation forbids it.
	GNonadjacent AnomalyType = "G-nonadjacent"
	// G2Item (write skew and other anti-dependency cycles): two or more rw
	// edges, some consecutive. Snapshot isolation allows it.
	G2Item AnomalyType = "G2-item"

	// The same through at least one real-time edge: the cycle exists only
	// because of real-time order, so the history may be serializable but is
	// not strictly serializable.
	G0Realtime           AnomalyType = "G0-realtime"
	G1cRealtime          AnomalyType = "G1c-realtime"
	GSingleRealtime      AnomalyType = "G-single-realtime"
	GNonadjacentRealtime AnomalyType = "G-nonadjacent-realtime"
	G2ItemRealtime       AnomalyType = "G2-item-realtime"
)

// EdgeType is the type of a dependency between two transactions.
type EdgeType uint8

// The types of dependency edges, from T1 to T2.
const (
	// WW (write dependency): T2 appended to a key right after T1 did, in the
	// key's version order.
	WW EdgeType = 1 << iota
	// WR (read dependency): T2 read a list ending in T1's append.
	WR
	// RW (anti-dependency): T1 read a list that T2's append extended.
	RW
	// RT (real-time): T1 completed before T2 was invoked.
	RT
)

// String returns "ww", "wr", "rw" or "rt".
func (e EdgeType) String() string {
	switch e {
	case WW:
		return "ww"
	case WR:
		return "wr"
	case RW:
		return "rw"
	case RT:
		return "rt"
	default:
		return fmt.Sprintf("EdgeType(%d)", uint8(e))
	}
}

// Edge is one step of a cycle.
type Edge struct {
	// From and To are transaction IDs.
	From, To int
	Type     EdgeType
	// Key is the key that gives a ww, wr or rw edge; empty for rt.
	Key string
}

// String returns the edge's label, as in -rw(x)->.
func (e Edge) String() string {
	if e.Type == RT {
		return "-rt->"
	}
	return fmt.Sprintf("-%v(%s)->", e.Type, e.Key)
}

// Anomaly is one anomaly found in a history.
type Anomaly struct {
	Type AnomalyType
	// Txns are the IDs of the transactions involved: for a cycle, in cycle
	// order starting anywhere; otherwise the reader first.
	Txns []int
	// Keys are the keys involved, each once.
	Keys []string
	// Cycle holds the edges of a cycle anomaly, Cycle[i].To ==
	// Cycle[i+1].From and the last edge returning to Cycle[0].From; it is
	// nil for the others.
	Cycle []Edge
	// Explanation says what was observed, naming transactions and keys, as
	// in "G-single: T12 -rw(x)-> T7 -wr(y)-> T12".
	Explanation string
}

// String returns the explanation.
func (a Anomaly) String() string { return a.Explanation }

// Result is the verdict of Check.
type Result struct {
	// Valid reports that no anomaly forbidden by Model was found.
	Valid bool
	Model Model
	// Anomalies are the anomalies found that Model forbids.
	Anomalies []Anomaly
	// Allowed are the anomalies found that Model allows (G2-item under
	// snapshot isolation).
	Allowed []Anomaly
	// Txns and Edges count the dependency graph: the OK transactions, the
	// Info ones whose appends were observed, and the edges between them
	// (edges of several types between the same two transactions count once).
	Txns, Edges int
	// Incomplete reports that a G-single search ran out of
	// Options.SearchBudget (see there).
	Incomplete bool
}

// String summarises the result, one anomaly per line.
func (r Result) String() string {
	var b strings.Builder
	if r.Valid {
		fmt.Fprintf(&b, "valid under %v: %d transactions, %d edges", r.Model, r.Txns, r.Edges)
	} else {
		fmt.Fprintf(&b, "%d anomalies forbidden under %v among %d transactions, %d edges", len(r.Anomalies), r.Model, r.Txns, r.Edges)
	}
	for _, a := range r.Anomalies {
		fmt.Fprintf(&b, "\n  %s", a.Explanation)
	}
	for _, a := range r.Allowed {
		fmt.Fprintf(&b, "\n  allowed: %s", a.Explanation)
	}
	if r.Incomplete {
		b.WriteString("\n  (a G-single search ran out of its budget)")
	}
	return b.String()
}

// Types returns the distinct types of the forbidden anomalies, in order of
// first appearance.
func (r Result) Types() []AnomalyType {
	var ts []AnomalyType
	seen := map[AnomalyType]bool{}
	for _, a := range r.Anomalies {
		if !seen[a.Type] {
			seen[a.Type] = true
			ts = append(ts, a.Type)
		}
	}
	return ts
}
