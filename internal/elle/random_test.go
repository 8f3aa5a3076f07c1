package elle

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"
)

// testSeed returns the seed of a randomized test: $GROUPKV_SEED, or the
// clock. The caller logs it so that a failure can be replayed.
func testSeed(t *testing.T) (seed uint64, fixed bool) {
	t.Helper()
	if s := os.Getenv("GROUPKV_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("GROUPKV_SEED=%q is not an unsigned integer: %v", s, err)
		}
		return v, true
	}
	return uint64(time.Now().UnixNano()), false
}

// genConfig shapes a generated history.
type genConfig struct {
	txns, keys, maxOps int
}

// generate returns the history of a serial execution of random
// transactions over an in-memory list store, in shuffled order. Transaction
// i takes effect at time 100*i, inside its interval [Invoke, Complete],
// which overlaps a few neighbours'. Some transactions fail (no effect),
// some end unknown (Info: half of them take effect). A last transaction,
// which the mutations leave alone, reads every key; its ID is returned.
func generate(rng *rand.Rand, cfg genConfig) (h History, finalID int) {
	store := map[string][]int{}
	next := 0
	for i := range cfg.txns + 1 {
		s := int64(100 * (i + 1))
		t := Txn{ID: i, Process: i % 7, Invoke: s - rng.Int64N(300), Complete: s + rng.Int64N(300), Outcome: OK}
		switch r := rng.IntN(100); {
		case i == cfg.txns:
		case r < 8:
			t.Outcome = Fail
		case r < 15:
			t.Outcome = Info
		}
		applied := t.Outcome == OK || (t.Outcome == Info && rng.IntN(2) == 0)
		if i == cfg.txns {
			for k := range cfg.keys {
				t.Ops = append(t.Ops, Read(fmt.Sprint("k", k)))
			}
		} else {
			for range 1 + rng.IntN(cfg.maxOps) {
				k := fmt.Sprint("k", rng.IntN(cfg.keys))
				if rng.IntN(2) == 0 {
					t.Ops = append(t.Ops, Read(k))
				} else {
					next++
					t.Ops = append(t.Ops, Append(k, next))
				}
			}
		}
		if applied {
			for j, o := range t.Ops {
				if o.Kind == OpRead {
					t.Ops[j].Values = slices.Clone(store[o.Key])
				} else {
					store[o.Key] = append(store[o.Key], o.Value)
				}
			}
		}
		h = append(h, t)
	}
	rng.Shuffle(len(h), func(i, j int) { h[i], h[j] = h[j], h[i] })
	return h, cfg.txns
}

// mutable returns a copy of h in which the ops of h[is...] may be mutated.
func mutable(h History, is ...int) History {
	c := slices.Clone(h)
	for _, i := range is {
		c[i].Ops = cloneOps(c[i].Ops)
	}
	return c
}

// dropElement removes an element other than the last from a read of two
// or more elements by an OK transaction other than finalID, whose read
// covers the position: the read is then incompatible with it. It reports
// false if there is no such read.
func dropElement(rng *rand.Rand, h History, finalID int) (History, string, bool) {
	type ref struct{ t, o int }
	var cands []ref
	for i, t := range h {
		for j, o := range t.Ops {
			if t.Outcome == OK && t.ID != finalID && o.Kind == OpRead && len(o.Values) >= 2 {
				cands = append(cands, ref{i, j})
			}
		}
	}
	if len(cands) == 0 {
		return nil, "", false
	}
	r := cands[rng.IntN(len(cands))]
	h = mutable(h, r.t)
	o := &h[r.t].Ops[r.o]
	p := rng.IntN(len(o.Values) - 1)
	desc := fmt.Sprintf("T%d: read(%s) %v loses element %d", h[r.t].ID, o.Key, o.Values, p)
	o.Values = slices.Delete(o.Values, p, p+1)
	return h, desc, true
}

// swapReads swaps the results of two external reads of one key, A's and
// B's, where A completed before B was invoked and read a shorter list. Then
// A sees an append w made after it (w -wr-> A), B misses an append u that
// it saw (B -rw-> u), u comes no later than w (u -ww*-> w), and A precedes
// B in real time: a cycle under strict serializability. It reports false
// if there are no such reads.
func swapReads(rng *rand.Rand, h History) (History, string, bool) {
	type ref struct{ t, o int }
	byKey := map[string][]ref{}
	for i, t := range h {
		if t.Outcome != OK {
			continue
		}
		touched := map[string]bool{}
		for j, o := range t.Ops {
			if o.Kind == OpRead && !touched[o.Key] {
				byKey[o.Key] = append(byKey[o.Key], ref{i, j})
			}
			touched[o.Key] = true
		}
	}
	// Look at the keys in random order, enumerating the pairs of one key
	// at a time: all pairs of a large history are too many.
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	rng.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	var pairs [][2]ref
	for _, k := range keys {
		refs := byKey[k]
		for _, a := range refs {
			for _, b := range refs {
				ta, tb := h[a.t], h[b.t]
				if ta.Complete < tb.Invoke && len(ta.Ops[a.o].Values) < len(tb.Ops[b.o].Values) {
					pairs = append(pairs, [2]ref{a, b})
				}
			}
		}
		if len(pairs) > 0 {
			break
		}
	}
	if len(pairs) == 0 {
		return nil, "", false
	}
	p := pairs[rng.IntN(len(pairs))]
	h = mutable(h, p[0].t, p[1].t)
	a, b := &h[p[0].t].Ops[p[0].o], &h[p[1].t].Ops[p[1].o]
	desc := fmt.Sprintf("T%d's read(%s) %v swapped with T%d's %v", h[p[0].t].ID, a.Key, a.Values, h[p[1].t].ID, b.Values)
	a.Values, b.Values = b.Values, a.Values
	return h, desc, true
}

func TestRandomHistories(t *testing.T) {
	seed, fixed := testSeed(t)
	runs := 100
	if fixed {
		runs = 1
	}
	t.Logf("seeds %d to %d (GROUPKV_SEED=<seed> replays one)", seed, seed+uint64(runs)-1)
	for run := range runs {
		s := seed + uint64(run)
		rng := rand.New(rand.NewPCG(s, 0))
		cfg := genConfig{txns: 20 + rng.IntN(200), keys: 1 + rng.IntN(5), maxOps: 1 + rng.IntN(5)}
		h, finalID := generate(rng, cfg)
		for _, m := range []Model{StrictSerializable, Serializable, SnapshotIsolation} {
			res, err := Check(h, Options{Model: m})
			if err != nil {
				t.Fatalf("seed %d: %v", s, err)
			}
			if !res.Valid || len(res.Allowed) > 0 {
				t.Fatalf("seed %d: a serial history is not valid under %v: %v", s, m, res)
			}
		}
		for _, mutate := range []struct {
			name   string
			f      func() (History, string, bool)
			models []Model
		}{
			{"drop", func() (History, string, bool) { return dropElement(rng, h, finalID) },
				[]Model{StrictSerializable, Serializable, SnapshotIsolation}},
			{"swap", func() (History, string, bool) { return swapReads(rng, h) },
				[]Model{StrictSerializable}},
		} {
			bad, desc, ok := mutate.f()
			if !ok {
				t.Logf("seed %d: no read to %s", s, mutate.name)
				continue
			}
			for _, m := range mutate.models {
				res, err := Check(bad, Options{Model: m})
				if err != nil {
					t.Fatalf("seed %d: %v", s, err)
				}
				if res.Valid {
					t.Fatalf("seed %d: %s: not flagged under %v: %v", s, desc, m, res)
				}
				if run == 0 {
					t.Logf("seed %d: %s: %v", s, desc, res)
				}
			}
		}
	}
}

// TestLargeHistory checks that a history of 10k transactions is checked in
// seconds, valid and mutated.
func TestLargeHistory(t *testing.T) {
	seed, _ := testSeed(t)
	t.Logf("seed %d (GROUPKV_SEED=%d replays it)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	h, _ := generate(rng, genConfig{txns: 10_000, keys: 100, maxOps: 6})
	start := time.Now()
	res, err := Check(h, Options{})
	if err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(start)
	t.Logf("valid history: %v in %v", res, elapsed)
	if !res.Valid {
		t.Fatalf("seed %d: %v", seed, res)
	}
	// Many swaps make large strongly connected components.
	bad := h
	for range 50 {
		if m, _, ok := swapReads(rng, bad); ok {
			bad = m
		}
	}
	start = time.Now()
	res, err = Check(bad, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("mutated history: %d anomalies (%v) in %v", len(res.Anomalies), res.Types(), time.Since(start))
	if res.Valid {
		t.Fatalf("seed %d: 50 swapped reads not flagged", seed)
	}
	if d := max(elapsed, time.Since(start)); d > 20*time.Second {
		t.Fatalf("seed %d: a check of 10k transactions took %v", seed, d)
	}
}
