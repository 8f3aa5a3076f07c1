package elle

import (
	"fmt"
	"strings"
	"testing"
)

// twoChains returns a history whose only cycles hold two adjacent rw edges,
// with m rw edges that each need a search along a chain of m ww edges to
// rule out a G-single: T0..T(m-1) append to a in order and Tm..T(2m-1) to
// b; Ti reads key ci before T(m+i) appends to it (Ti -rw-> T(m+i)); the
// last of b's chain reads d before T0 appends to it, closing the cycle.
func twoChains(m int) History {
	var h History
	var order []int
	for i := range m {
		h = append(h, tx(i, OK, Append("a", i), Read(fmt.Sprint("c", i))))
		order = append(order, i)
	}
	for i := range m {
		h = append(h, tx(m+i, OK, Append("b", i), Append(fmt.Sprint("c", i), i)))
	}
	h[2*m-1].Ops = append(h[2*m-1].Ops, Read("d"))
	h[0].Ops = append(h[0].Ops, Append("d", 1))
	return append(h, tx(2*m, OK, Read("a", order...), Read("b", order...)))
}

func TestSearchBudget(t *testing.T) {
	const m = 2000
	h := twoChains(m)
	for _, tc := range []struct {
		budget     int
		incomplete bool
	}{
		{budget: 0, incomplete: false},     // the default suffices
		{budget: 10_000, incomplete: true}, // gives up on G-single
	} {
		t.Run(fmt.Sprint(tc.budget), func(t *testing.T) {
			res, err := Check(h, Options{Model: SnapshotIsolation, SearchBudget: tc.budget})
			if err != nil {
				t.Fatal(err)
			}
			if !res.Valid || len(res.Allowed) != 1 || res.Allowed[0].Type != G2Item || res.Incomplete != tc.incomplete {
				t.Fatalf("want one allowed G2-item, Incomplete %v; got %v", tc.incomplete, res)
			}
			a := res.Allowed[0]
			checkCycle(t, a)
			if len(a.Cycle) != m+1 {
				t.Fatalf("cycle of %d edges, want %d", len(a.Cycle), m+1)
			}
			if !strings.Contains(a.Explanation, fmt.Sprintf("… (%d more edges) …", m+1-32)) || len(a.Explanation) > 1000 {
				t.Fatalf("explanation not elided: %.2000s", a.Explanation)
			}
		})
	}
	res, err := Check(h, Options{Model: Serializable})
	if err != nil {
		t.Fatal(err)
	}
	if res.Valid || res.Types()[0] != G2Item {
		t.Fatalf("want G2-item under serializable, got %v", res)
	}
}
