package elle

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
)

// tx builds a hand-made transaction. Its times make every transaction of a
// history concurrent with every other unless the test sets them.
func tx(id int, out Outcome, ops ...Op) Txn {
	return Txn{ID: id, Process: id, Invoke: 0, Complete: 1000, Outcome: out, Ops: ops}
}

// at sets the times of t.
func at(t Txn, invoke, complete int64) Txn {
	t.Invoke, t.Complete = invoke, complete
	return t
}

// typesOf returns the sorted distinct types of as.
func typesOf(as []Anomaly) []AnomalyType {
	var ts []AnomalyType
	for _, a := range as {
		if !slices.Contains(ts, a.Type) {
			ts = append(ts, a.Type)
		}
	}
	slices.Sort(ts)
	return ts
}

func TestCheck(t *testing.T) {
	all := []Model{StrictSerializable, Serializable, SnapshotIsolation}
	type want struct {
		models  []Model
		types   []AnomalyType // forbidden anomalies expected, exactly
		allowed []AnomalyType // allowed anomalies expected, exactly
	}
	for _, tc := range []struct {
		name  string
		h     History
		wants []want
	}{
		{
			name: "serial",
			h: History{
				at(tx(1, OK, Append("x", 1), Read("y")), 0, 10),
				at(tx(2, OK, Read("x", 1), Append("x", 2), Append("y", 1)), 20, 30),
				at(tx(3, OK, Read("x", 1, 2), Read("y", 1), Append("y", 2), Read("y", 1, 2)), 40, 50),
				at(tx(4, Fail, Append("x", 3)), 41, 45),
				at(tx(5, OK, Read("x", 1, 2), Read("z")), 60, 70),
			},
			wants: []want{{models: all}},
		},
		{
			name: "concurrent and serializable",
			h: History{
				tx(1, OK, Append("x", 1)),
				tx(2, OK, Read("x"), Append("y", 1)),
				tx(3, OK, Read("y", 1), Read("x", 1)),
			},
			wants: []want{{models: all}},
		},
		{
			// T1 and T2 each write x and y; the orders of x and y disagree.
			name: "G0 write cycle",
			h: History{
				tx(1, OK, Append("x", 1), Append("y", 1)),
				tx(2, OK, Append("x", 2), Append("y", 2)),
				tx(3, OK, Read("x", 1, 2), Read("y", 2, 1)),
			},
			wants: []want{{models: all, types: []AnomalyType{G0}}},
		},
		{
			name: "G1a aborted read",
			h: History{
				tx(1, Fail, Append("x", 1)),
				tx(2, OK, Read("x", 1)),
			},
			wants: []want{{models: all, types: []AnomalyType{G1a}}},
		},
		{
			// T2 saw T1's first append to x but not its second, which
			// also makes a cycle T1 -wr-> T2 -rw-> T1.
			name: "G1b intermediate read",
			h: History{
				tx(1, OK, Append("x", 1), Append("x", 2)),
				tx(2, OK, Read("x", 1)),
			},
			wants: []want{{models: all, types: []AnomalyType{G1b, GSingle}}},
		},
		{
			name: "G1c circular information flow",
			h: History{
				tx(1, OK, Append("x", 1), Read("y", 1)),
				tx(2, OK, Append("y", 1), Read("x", 1)),
			},
			wants: []want{{models: all, types: []AnomalyType{G1c}}},
		},
		{
			name: "G-single read skew",
			h: History{
				tx(1, OK, Append("x", 1), Append("y", 1)),
				tx(2, OK, Read("x"), Read("y", 1)),
			},
			wants: []want{{models: all, types: []AnomalyType{GSingle}}},
		},
		{
			// Both read x empty and appended: one update is lost to the
			// other's read.
			name: "G-single lost update",
			h: History{
				tx(1, OK, Read("x"), Append("x", 1)),
				tx(2, OK, Read("x"), Append("x", 2)),
				tx(3, OK, Read("x", 1, 2)),
			},
			wants: []want{{models: all, types: []AnomalyType{GSingle}}},
		},
		{
			// No read ever shows the appends: the checker places them
			// after the reads that missed them.
			name: "G2-item write skew",
			h: History{
				tx(1, OK, Read("x"), Read("y"), Append("x", 1)),
				tx(2, OK, Read("x"), Read("y"), Append("y", 1)),
			},
			wants: []want{
				{models: []Model{StrictSerializable, Serializable}, types: []AnomalyType{G2Item}},
				{models: []Model{SnapshotIsolation}, allowed: []AnomalyType{G2Item}},
			},
		},
		{
			// T1 -rw(a)-> T2 -wr(b)-> T3 -rw(c)-> T4 -wr(d)-> T1.
			name: "G-nonadjacent",
			h: History{
				tx(1, OK, Read("a"), Read("d", 1)),
				tx(2, OK, Append("a", 1), Append("b", 1)),
				tx(3, OK, Read("b", 1), Read("c")),
				tx(4, OK, Append("c", 1), Append("d", 1)),
			},
			wants: []want{{models: all, types: []AnomalyType{GNonadjacent}}},
		},
		{
			// T2 began after T1 was acknowledged, yet missed its append.
			name: "stale read: serializable, not strictly",
			h: History{
				at(tx(1, OK, Append("x", 1)), 0, 10),
				at(tx(2, OK, Read("x")), 20, 30),
			},
			wants: []want{
				{models: []Model{StrictSerializable}, types: []AnomalyType{GSingleRealtime}},
				{models: []Model{Serializable, SnapshotIsolation}},
			},
		},
		{
			// Two appends acknowledged one after the other, read in the
			// opposite order.
			name: "write order against real time",
			h: History{
				at(tx(1, OK, Append("x", 1)), 0, 10),
				at(tx(2, OK, Append("x", 2)), 20, 30),
				at(tx(3, OK, Read("x", 2, 1)), 40, 50),
			},
			wants: []want{
				{models: []Model{StrictSerializable}, types: []AnomalyType{G0Realtime}},
				{models: []Model{Serializable, SnapshotIsolation}},
			},
		},
		{
			// Completion and invocation at the same instant do not order.
			name: "touching intervals are concurrent",
			h: History{
				at(tx(1, OK, Append("x", 1)), 0, 10),
				at(tx(2, OK, Read("x")), 10, 30),
			},
			wants: []want{{models: all}},
		},
		{
			name: "incompatible orders",
			h: History{
				tx(1, OK, Append("x", 1)),
				tx(2, OK, Append("x", 2)),
				tx(3, OK, Read("x", 1, 2)),
				tx(4, OK, Read("x", 2, 1)),
			},
			wants: []want{{models: all, types: []AnomalyType{IncompatibleOrder}}},
		},
		{
			name: "incompatible orders of different lengths",
			h: History{
				tx(1, OK, Append("x", 1)),
				tx(2, OK, Append("x", 2)),
				tx(3, OK, Append("x", 3)),
				tx(4, OK, Read("x", 1, 2, 3)),
				tx(5, OK, Read("x", 1, 3)),
			},
			wants: []want{{models: all, types: []AnomalyType{IncompatibleOrder}}},
		},
		{
			name: "duplicate elements",
			h: History{
				tx(1, OK, Append("x", 1)),
				tx(2, OK, Read("x", 1, 1)),
			},
			wants: []want{{models: all, types: []AnomalyType{DuplicateElements}}},
		},
		{
			name: "garbage read",
			h: History{
				tx(1, OK, Append("x", 1)),
				tx(2, OK, Read("x", 1, 7)),
			},
			wants: []want{{models: all, types: []AnomalyType{GarbageRead}}},
		},
		{
			name: "internal: read misses own append",
			h: History{
				tx(1, OK, Append("x", 1), Read("x")),
			},
			wants: []want{{models: all, types: []AnomalyType{Internal}}},
		},
		{
			name: "internal: second read differs",
			h: History{
				tx(1, OK, Append("x", 1)),
				tx(2, OK, Read("x", 1), Append("x", 2), Read("x", 1)),
			},
			wants: []want{{models: all, types: []AnomalyType{Internal}}},
		},
		{
			name: "internal: read of an own later append",
			h: History{
				tx(1, OK, Read("x", 1), Append("x", 1)),
			},
			wants: []want{{models: all, types: []AnomalyType{Internal}}},
		},
		{
			// T1's outcome is unknown, but T2 saw its append to x: T1
			// committed, and T3's read of y missed it.
			name: "Info observed is a writer",
			h: History{
				tx(1, Info, Append("x", 1), Append("y", 1)),
				tx(2, OK, Read("x", 1), Append("z", 1)),
				tx(3, OK, Read("z", 1), Read("y")),
				tx(4, OK, Read("y", 1)),
			},
			wants: []want{{models: all, types: []AnomalyType{GSingle}}},
		},
		{
			// Nobody saw T1's append: it may not have committed. Its read
			// is ignored, and its completion orders nothing.
			name: "Info unobserved is ignored",
			h: History{
				at(tx(1, Info, Append("x", 1), Read("y", 99)), 0, 10),
				at(tx(2, OK, Read("x")), 20, 30),
			},
			wants: []want{{models: all}},
		},
		{
			// Observed, so committed, but with no completion: it may have
			// taken effect after T2's read.
			name: "Info observed after a read that missed it",
			h: History{
				at(tx(1, Info, Append("x", 1)), 0, 10),
				at(tx(2, OK, Read("x")), 20, 30),
				at(tx(3, OK, Read("x", 1)), 40, 50),
			},
			wants: []want{{models: all}},
		},
		{
			// The same with T1 acknowledged.
			name: "OK missed by a later read",
			h: History{
				at(tx(1, OK, Append("x", 1)), 0, 10),
				at(tx(2, OK, Read("x")), 20, 30),
				at(tx(3, OK, Read("x", 1)), 40, 50),
			},
			wants: []want{
				{models: []Model{StrictSerializable}, types: []AnomalyType{GSingleRealtime}},
				{models: []Model{Serializable, SnapshotIsolation}},
			},
		},
		{
			name: "Fail reads are ignored",
			h: History{
				tx(1, Fail, Read("x", 5), Append("x", 1)),
				tx(2, OK, Read("x")),
			},
			wants: []want{{models: all}},
		},
	} {
		for _, w := range tc.wants {
			for _, m := range w.models {
				t.Run(tc.name+"/"+m.String(), func(t *testing.T) {
					res, err := Check(tc.h, Options{Model: m})
					if err != nil {
						t.Fatal(err)
					}
					got, gotAllowed := typesOf(res.Anomalies), typesOf(res.Allowed)
					slices.Sort(w.types)
					slices.Sort(w.allowed)
					if !slices.Equal(got, w.types) || !slices.Equal(gotAllowed, w.allowed) {
						t.Fatalf("got anomalies %v, allowed %v; want %v, allowed %v\n%v", got, gotAllowed, w.types, w.allowed, res)
					}
					if res.Valid != (len(w.types) == 0) {
						t.Fatalf("Valid = %v with anomalies %v", res.Valid, got)
					}
					for _, a := range append(res.Anomalies, res.Allowed...) {
						if !strings.HasPrefix(a.Explanation, string(a.Type)+": ") {
							t.Errorf("explanation %q does not start with its type %s", a.Explanation, a.Type)
						}
						checkCycle(t, a)
					}
					t.Log(res)
				})
			}
		}
	}
}

// checkCycle fails t unless a cycle anomaly's edges form a cycle over its
// transactions.
func checkCycle(t *testing.T, a Anomaly) {
	t.Helper()
	if a.Cycle == nil {
		return
	}
	if len(a.Cycle) < 2 || len(a.Txns) != len(a.Cycle) {
		t.Fatalf("%s: cycle of %d edges over %d transactions", a, len(a.Cycle), len(a.Txns))
	}
	for i, e := range a.Cycle {
		next := a.Cycle[(i+1)%len(a.Cycle)]
		if e.To != next.From || e.From != a.Txns[i] {
			t.Fatalf("%s: edges %v and %v do not chain", a, e, next)
		}
	}
}

func TestExplanation(t *testing.T) {
	res, err := Check(History{
		tx(12, OK, Read("x"), Read("y", 1)),
		tx(7, OK, Append("x", 1), Append("y", 1)),
	}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Anomalies) != 1 {
		t.Fatalf("want one anomaly, got %v", res)
	}
	a := res.Anomalies[0]
	// The cycle may start at either transaction.
	wants := []string{"G-single: T12 -rw(x)-> T7 -wr(y)-> T12", "G-single: T7 -wr(y)-> T12 -rw(x)-> T7"}
	if !slices.Contains(wants, a.Explanation) {
		t.Fatalf("explanation %q, want one of %q", a.Explanation, wants)
	}
	if !slices.Equal(a.Keys, []string{"x", "y"}) && !slices.Equal(a.Keys, []string{"y", "x"}) {
		t.Fatalf("keys %v", a.Keys)
	}
}

func TestMalformedHistory(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    History
		want string
	}{
		{"duplicate ID", History{tx(1, OK), tx(1, OK)}, "share the ID 1"},
		{"duplicate append", History{tx(1, Fail, Append("x", 1)), tx(2, OK, Append("x", 1))}, "both append 1 to x"},
		{"completes before invoked", History{at(tx(1, OK), 10, 5)}, "completes at 5 before its invocation at 10"},
		{"op kind", History{tx(1, OK, Op{Key: "x"})}, "invalid op kind"},
		{"outcome", History{tx(1, Outcome(9))}, "invalid outcome"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Check(tc.h, Options{})
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("err = %v, want ErrMalformed", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.want)
			}
		})
	}
	// The same value may be appended to different keys.
	if _, err := Check(History{tx(1, OK, Append("x", 1), Append("y", 1))}, Options{}); err != nil {
		t.Fatal(err)
	}
}

func TestInvalidOptions(t *testing.T) {
	err := Options{Model: 7, SearchBudget: -1}.Validate()
	if !errors.Is(err, ErrInvalidOptions) {
		t.Fatalf("err = %v", err)
	}
	for _, want := range []string{"Model(7)", "SearchBudget -1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("err = %v, want it to mention %q", err, want)
		}
	}
	if _, err := Check(nil, Options{Model: 7}); !errors.Is(err, ErrInvalidOptions) {
		t.Fatalf("Check: err = %v", err)
	}
	var o Options
	o.EnsureDefaults()
	if o.Model != StrictSerializable || o.SearchBudget != DefaultSearchBudget {
		t.Fatalf("defaults: %+v", o)
	}
}

// TestRecorder runs transactions from concurrent clients against a list
// store behind one mutex, which is strictly serializable, and checks the
// recorded history.
func TestRecorder(t *testing.T) {
	var (
		rec   Recorder
		mu    sync.Mutex
		store = map[string][]int{}
		next  = map[string]int{}
		wg    sync.WaitGroup
	)
	keys := []string{"a", "b", "c"}
	for client := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				k1, k2 := keys[(client+i)%3], keys[(client+2*i)%3]
				mu.Lock()
				next[k2]++
				v := next[k2]
				mu.Unlock()
				ops := []Op{Read(k1), Append(k2, v), Read(k2)}
				p := rec.Invoke(client, ops)
				if i%10 == 9 {
					p.Complete(nil, Fail) // aborted before touching the store
					continue
				}
				mu.Lock()
				ops[0].Values = append([]int(nil), store[k1]...)
				store[k2] = append(store[k2], v)
				ops[2].Values = append([]int(nil), store[k2]...)
				mu.Unlock()
				p.Complete(ops, OK)
			}
		}()
	}
	wg.Wait()
	// A transaction whose client never heard back: Info.
	rec.Invoke(99, []Op{Append("a", 1000)})
	h := rec.History()
	if len(h) != 8*50+1 || h[len(h)-1].Outcome != Info {
		t.Fatalf("history of %d, last %v", len(h), h[len(h)-1])
	}
	res := rec.Check(t, 0, Options{})
	if res.Txns != 8*45 {
		t.Fatalf("%d transactions in the graph, want %d", res.Txns, 8*45)
	}
	// Complete twice panics.
	p := rec.Invoke(0, nil)
	p.Complete(nil, Fail)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("second Complete did not panic")
			}
		}()
		p.Complete(nil, OK)
	}()
}
