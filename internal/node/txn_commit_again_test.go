package node

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/txn"
)

// Tests of a commit sent again (its client lost the first answer), of a
// commit of an attempt the node does not know, and of a commit whose
// request's context ends while it runs.

// keysK returns n keys k0, k1…
func keysK(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("k%d", i)
	}
	return out
}

// TestTxnCommitAgain: a commit of an attempt that committed answers the
// same version however often it is sent, applies nothing again (a key
// overwritten since keeps its new value) and survives an abort; one of an
// attempt that aborted answers txn_aborted every time; one of an attempt
// the node does not know answers commit_unknown.
func TestTxnCommitAgain(t *testing.T) {
	n := openTest(t, t.TempDir(), Options{Logger: quietLogger(), TickInterval: 20 * time.Millisecond})
	defer n.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "c", Partitioning: kv.PartitionHash, Shards: 3}); err != nil {
		t.Fatal(err)
	}
	ref := func(k string) kv.KeyRef { return kv.KeyRef{Collection: "c", Key: []byte(k)} }
	for _, k := range keysK(6) {
		if _, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte(k), Value: []byte("init")}); err != nil {
			t.Fatal(err)
		}
	}

	for _, tc := range []struct {
		name string
		opts kv.TxnOptions
		keys []string // written, or read when the attempt is read-only
	}{
		{"two phases", kv.TxnOptions{}, keysK(6)},
		{"one phase", kv.TxnOptions{}, keysK(1)},
		{"serializable read", kv.TxnOptions{}, nil},
		{"read only", kv.TxnOptions{ReadOnly: true}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, err := n.BeginTxn(ctx, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err := n.TxnGet(ctx, id, ref("k0")); err != nil {
				t.Fatal(err)
			}
			for _, k := range tc.keys {
				if err := n.TxnPut(ctx, id, kv.PutItem{Collection: "c", Key: []byte(k), Value: []byte(tc.name)}); err != nil {
					t.Fatal(err)
				}
			}
			v, err := n.CommitTxn(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			// Another writer overwrites what it wrote: a commit sent
			// again must not write it back.
			var after uint64
			for _, k := range tc.keys {
				pv, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte(k), Value: []byte("after")})
				if err != nil {
					t.Fatal(err)
				}
				after = pv
			}
			for i := range 3 {
				if got, err := n.CommitTxn(ctx, id); err != nil || got != v {
					t.Fatalf("commit %d sent again answered %d, %v; the first answered %d", i+1, got, err, v)
				}
			}
			// An abort changes nothing of a committed attempt.
			if err := n.AbortTxn(ctx, id); err != nil {
				t.Fatalf("abort after the commit: %v", err)
			}
			if got, err := n.CommitTxn(ctx, id); err != nil || got != v {
				t.Fatalf("commit sent again after an abort answered %d, %v; the first answered %d", got, err, v)
			}
			if _, _, err := n.TxnGet(ctx, id, ref("k0")); kv.CodeOf(err) != kv.CodeInvalidArgument {
				t.Fatalf("a get after the commit: %v, want invalid_argument", err)
			}
			for _, k := range tc.keys {
				r, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte(k)})
				if err != nil || string(r.Value) != "after" || r.Version > after {
					t.Fatalf("%s = %q@%d (%v) after the commits sent again, want %q at or below %d", k, r.Value, r.Version, err, "after", after)
				}
			}
		})
	}

	t.Run("aborted by its client", func(t *testing.T) {
		id, err := n.BeginTxn(ctx, kv.TxnOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := n.TxnPut(ctx, id, kv.PutItem{Collection: "c", Key: []byte("k1"), Value: []byte("lost")}); err != nil {
			t.Fatal(err)
		}
		if err := n.AbortTxn(ctx, id); err != nil {
			t.Fatal(err)
		}
		for i := range 2 {
			if _, err := n.CommitTxn(ctx, id); kv.CodeOf(err) != kv.CodeTxnAborted || kv.IsTxnUnknown(err) {
				t.Fatalf("commit %d of an aborted attempt: %v, want txn_aborted", i, err)
			}
		}
	})

	t.Run("aborted by a conflict", func(t *testing.T) {
		older, younger := beginOlderYounger(t, n)
		if err := n.TxnPut(ctx, younger, kv.PutItem{Collection: "c", Key: []byte("k2"), Value: []byte("younger")}); err != nil {
			t.Fatal(err)
		}
		// The older one wounds the younger one for its lock.
		if err := n.TxnPut(ctx, older, kv.PutItem{Collection: "c", Key: []byte("k2"), Value: []byte("older")}); err != nil {
			t.Fatal(err)
		}
		if _, err := n.CommitTxn(ctx, older); err != nil {
			t.Fatal(err)
		}
		_, first := n.CommitTxn(ctx, younger)
		if kv.CodeOf(first) != kv.CodeTxnAborted {
			t.Fatalf("the wounded attempt's commit: %v, want txn_aborted", first)
		}
		if _, err := n.CommitTxn(ctx, younger); kv.CodeOf(err) != kv.CodeTxnAborted || err.Error() != first.Error() {
			t.Fatalf("the wounded attempt's commit sent again: %v, want %v", err, first)
		}
		if r, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte("k2")}); err != nil || string(r.Value) != "older" {
			t.Fatalf("k2 = %q (%v), want %q", r.Value, err, "older")
		}
	})

	t.Run("unknown", func(t *testing.T) {
		id := txn.NewID(12345, 1) // never begun here
		if _, err := n.CommitTxn(ctx, id); kv.CodeOf(err) != kv.CodeCommitUnknown {
			t.Fatalf("commit of an unknown attempt: %v, want commit_unknown", err)
		}
		if _, _, err := n.TxnGet(ctx, id, ref("k0")); kv.CodeOf(err) != kv.CodeTxnAborted || !kv.IsTxnUnknown(err) {
			t.Fatalf("get in an unknown attempt: %v, want txn_aborted marked unknown", err)
		}
		if err := n.TxnPut(ctx, id, kv.PutItem{Collection: "c", Key: []byte("k0"), Value: []byte("x")}); kv.CodeOf(err) != kv.CodeTxnAborted || !kv.IsTxnUnknown(err) {
			t.Fatalf("put in an unknown attempt: %v, want txn_aborted marked unknown", err)
		}
		if err := n.AbortTxn(ctx, id); err != nil {
			t.Fatalf("abort of an unknown attempt: %v", err)
		}
		if _, err := n.CommitTxn(ctx, "g-0123456789abcdef01234567"); kv.CodeOf(err) != kv.CodeCommitUnknown {
			t.Fatalf("commit of an unknown group attempt: %v, want commit_unknown", err)
		}
		if _, err := n.CommitTxn(ctx, "nope"); kv.CodeOf(err) != kv.CodeNotFound {
			t.Fatalf("commit of a malformed id: %v, want not_found", err)
		}
	})

	// One-shot transactions and batches leave no outcome behind: no
	// client knows their attempts' ids.
	if _, err := n.ExecTxn(ctx, kv.ExecRequest{Then: []kv.TxnOp{{Op: kv.TxnOpPut, Collection: "c", Key: []byte("k3"), Value: []byte("x")}}}); err != nil {
		t.Fatal(err)
	}
	if got, want := n.outcomes.len(), 7; got != want {
		t.Errorf("%d outcomes remembered, want %d (one per attempt begun by BeginTxn)", got, want)
	}
}

// TestTxnCommitAgainForgotten: outcomes are remembered for TxnIdleTimeout
// and MaxTxnOutcomes at most; a commit of one forgotten answers
// commit_unknown, and an attempt that expired answers txn_aborted while
// remembered.
func TestTxnCommitAgainForgotten(t *testing.T) {
	const idle = time.Second
	n := openTest(t, t.TempDir(), Options{Logger: quietLogger(), TickInterval: 20 * time.Millisecond, TxnIdleTimeout: idle, MaxTxnOutcomes: 3})
	defer n.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "c", Partitioning: kv.PartitionHash, Shards: 2}); err != nil {
		t.Fatal(err)
	}
	commit := func(k string) (string, uint64) {
		t.Helper()
		id, err := n.BeginTxn(ctx, kv.TxnOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := n.TxnPut(ctx, id, kv.PutItem{Collection: "c", Key: []byte(k), Value: []byte("v")}); err != nil {
			t.Fatal(err)
		}
		v, err := n.CommitTxn(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return id, v
	}
	var ids []string
	var versions []uint64
	for _, k := range keysK(5) {
		id, v := commit(k)
		ids, versions = append(ids, id), append(versions, v)
	}
	for i, id := range ids {
		v, err := n.CommitTxn(ctx, id)
		if i < 2 {
			if kv.CodeOf(err) != kv.CodeCommitUnknown {
				t.Errorf("commit %d sent again, past MaxTxnOutcomes: %d, %v; want commit_unknown", i, v, err)
			}
		} else if err != nil || v != versions[i] {
			t.Errorf("commit %d sent again: %d, %v; want %d", i, v, err, versions[i])
		}
	}

	// An attempt left idle expires; its commit answers txn_aborted while
	// the node remembers it, then commit_unknown.
	id, err := n.BeginTxn(ctx, kv.TxnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.TxnPut(ctx, id, kv.PutItem{Collection: "c", Key: []byte("idle"), Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		n.txns.mu.Lock()
		_, live := n.txns.m[id]
		n.txns.mu.Unlock()
		if !live {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the idle attempt did not expire")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := n.CommitTxn(ctx, id); kv.CodeOf(err) != kv.CodeTxnAborted {
		t.Fatalf("commit of an expired attempt: %v, want txn_aborted", err)
	}
	time.Sleep(idle + 100*time.Millisecond)
	if _, err := n.CommitTxn(ctx, id); kv.CodeOf(err) != kv.CodeCommitUnknown {
		t.Fatalf("commit of an attempt that expired more than TxnIdleTimeout ago: %v, want commit_unknown", err)
	}
	if _, err := n.CommitTxn(ctx, ids[4]); kv.CodeOf(err) != kv.CodeCommitUnknown {
		t.Fatalf("commit of an attempt that committed more than TxnIdleTimeout ago: %v, want commit_unknown", err)
	}
}

// TestTxnCommitContextCancelled: a commit whose request's context ends
// (its client went away) before or while it runs still runs to its end:
// with nothing in its way it commits, a commit sent again answers its
// version, and no lock stays held (a plain write goes through at once,
// though locks of a silent coordinator would only expire after
// TxnTimeout).
func TestTxnCommitContextCancelled(t *testing.T) {
	n := openTest(t, t.TempDir(), Options{Logger: quietLogger(), TickInterval: 20 * time.Millisecond, TxnTimeout: time.Minute})
	defer n.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "c", Partitioning: kv.PartitionHash, Shards: 3}); err != nil {
		t.Fatal(err)
	}
	delays := []time.Duration{-1, 0, 20 * time.Microsecond, 100 * time.Microsecond, 500 * time.Microsecond, time.Millisecond, 3 * time.Millisecond, 10 * time.Millisecond}
	for _, keys := range []int{1, 6} {
		for _, d := range delays {
			name := fmt.Sprintf("%d keys, cancelled %v after the commit began", keys, d)
			if d < 0 {
				name = fmt.Sprintf("%d keys, cancelled before the commit", keys)
			}
			t.Run(name, func(t *testing.T) {
				id, err := n.BeginTxn(ctx, kv.TxnOptions{})
				if err != nil {
					t.Fatal(err)
				}
				for _, k := range keysK(keys) {
					if _, _, err := n.TxnGet(ctx, id, kv.KeyRef{Collection: "c", Key: []byte(k)}); err != nil {
						t.Fatal(err)
					}
					if err := n.TxnPut(ctx, id, kv.PutItem{Collection: "c", Key: []byte(k), Value: []byte(name)}); err != nil {
						t.Fatal(err)
					}
				}
				cctx, ccancel := context.WithCancel(ctx)
				if d < 0 {
					ccancel()
				} else {
					time.AfterFunc(d, ccancel)
				}
				v, err := n.CommitTxn(cctx, id)
				ccancel()
				if err != nil {
					t.Fatalf("the commit answered %v; with nothing in its way it must commit", err)
				}
				if again, err := n.CommitTxn(ctx, id); err != nil || again != v {
					t.Fatalf("the commit sent again answered %d, %v; want %d", again, err, v)
				}
				for _, k := range keysK(keys) {
					r, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte(k)})
					if err != nil || string(r.Value) != name || r.Version != v {
						t.Fatalf("%s = %q@%d (%v), want %q@%d", k, r.Value, r.Version, err, name, v)
					}
					wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
					_, err = n.Put(wctx, kv.PutRequest{Collection: "c", Key: []byte(k), Value: []byte("plain")})
					wcancel()
					if err != nil {
						t.Fatalf("a plain put of %s after the commit: %v (a lock stayed held?)", k, err)
					}
				}
			})
		}
	}
}

// TestGroupTxnCommitAgain: a group transaction's commit sent again
// answers the same version, as does one whose request's context ended
// (it runs to its end); one of an aborted attempt, txn_aborted.
func TestGroupTxnCommitAgain(t *testing.T) {
	n := openTest(t, t.TempDir(), Options{Logger: quietLogger(), TickInterval: 20 * time.Millisecond})
	defer n.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "c", Partitioning: kv.PartitionHash, Shards: 2}); err != nil {
		t.Fatal(err)
	}
	a, b := kv.KeyRef{Collection: "c", Key: []byte("a")}, kv.KeyRef{Collection: "c", Key: []byte("b")}
	if _, err := n.CreateGroup(ctx, kv.GroupSpec{ID: "g", Leader: a, Members: []kv.KeyRef{b}}); err != nil {
		t.Fatal(err)
	}
	id, err := n.BeginGroupTxn(ctx, "g", kv.TxnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := n.TxnGet(ctx, id, b); err != nil {
		t.Fatal(err)
	}
	if err := n.TxnPut(ctx, id, kv.PutItem{Collection: "c", Key: b.Key, Value: []byte("1")}); err != nil {
		t.Fatal(err)
	}
	v, err := n.CommitTxn(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if got, err := n.CommitTxn(ctx, id); err != nil || got != v {
			t.Fatalf("group commit %d sent again answered %d, %v; want %d", i+1, got, err, v)
		}
	}
	if err := n.TxnPut(ctx, id, kv.PutItem{Collection: "c", Key: b.Key, Value: []byte("2")}); kv.CodeOf(err) != kv.CodeInvalidArgument {
		t.Fatalf("a put after the commit: %v, want invalid_argument", err)
	}

	// A commit whose request's context ended still runs to its end.
	cut, err := n.BeginGroupTxn(ctx, "g", kv.TxnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.TxnPut(ctx, cut, kv.PutItem{Collection: "c", Key: b.Key, Value: []byte("1")}); err != nil {
		t.Fatal(err)
	}
	ended, end := context.WithCancel(ctx)
	end()
	v, err = n.CommitTxn(ended, cut)
	if err != nil {
		t.Fatalf("a group commit whose context ended: %v; with nothing in its way it must commit", err)
	}
	if got, err := n.CommitTxn(ctx, cut); err != nil || got != v {
		t.Fatalf("that commit sent again answered %d, %v; want %d", got, err, v)
	}

	aborted, err := n.BeginGroupTxn(ctx, "g", kv.TxnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.TxnPut(ctx, aborted, kv.PutItem{Collection: "c", Key: b.Key, Value: []byte("lost")}); err != nil {
		t.Fatal(err)
	}
	if err := n.AbortTxn(ctx, aborted); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if _, err := n.CommitTxn(ctx, aborted); kv.CodeOf(err) != kv.CodeTxnAborted {
			t.Fatalf("commit %d of an aborted group attempt: %v, want txn_aborted", i, err)
		}
	}
	if r, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: b.Key}); err != nil || string(r.Value) != "1" {
		t.Fatalf("b = %q (%v), want %q", r.Value, err, "1")
	}
}

// TestTxnOutcomes checks the outcome store alone: the oldest go first,
// past the bound or the time to live, and a replaced outcome keeps its
// place by its latest addition.
func TestTxnOutcomes(t *testing.T) {
	var o txnOutcomes
	now := time.Unix(1000, 0)
	const ttl = time.Minute
	for i := range 10 {
		o.add(fmt.Sprint(i), txnOutcome{version: uint64(i)}, now.Add(time.Duration(i)*time.Second), ttl, 4)
	}
	if o.len() != 4 {
		t.Fatalf("%d remembered, want 4", o.len())
	}
	for i := range 10 {
		got, ok := o.get(fmt.Sprint(i), now.Add(10*time.Second), ttl)
		if ok != (i >= 6) || ok && got.version != uint64(i) {
			t.Errorf("outcome %d: %+v, %v", i, got, ok)
		}
	}
	// 6 again, later: 7 is now the oldest.
	o.add("6", txnOutcome{version: 66}, now.Add(10*time.Second), ttl, 4)
	o.add("10", txnOutcome{version: 10}, now.Add(11*time.Second), ttl, 4)
	if _, ok := o.get("7", now.Add(11*time.Second), ttl); ok {
		t.Error("7 is remembered past the bound")
	}
	if got, ok := o.get("6", now.Add(11*time.Second), ttl); !ok || got.version != 66 {
		t.Errorf("6: %+v, %v; want version 66", got, ok)
	}
	// Time to live: 8, added at 8 s, is remembered until 68 s.
	if _, ok := o.get("8", now.Add(67*time.Second), ttl); !ok {
		t.Error("8 is forgotten before its time")
	}
	o.prune(now.Add(67*time.Second), ttl, 4)
	if _, ok := o.get("8", now.Add(67*time.Second), ttl); !ok {
		t.Error("8 is pruned before its time")
	}
	if _, ok := o.get("8", now.Add(68*time.Second+time.Millisecond), ttl); ok {
		t.Error("8 is remembered past its time")
	}
	o.prune(now.Add(68*time.Second+time.Millisecond), ttl, 4)
	if o.len() != 3 {
		t.Errorf("%d remembered after the prune, want 3", o.len())
	}
	o.prune(now.Add(time.Hour), ttl, 4)
	if o.len() != 0 || len(o.order) != 0 {
		t.Errorf("%d remembered, %d references after every time to live passed", o.len(), len(o.order))
	}
}
