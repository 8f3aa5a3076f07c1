package node

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
)

// openHashTxn opens a node with a hash collection "c" of four shards.
func openHashTxn(t *testing.T) (*Node, context.Context) {
	t.Helper()
	n := openTest(t, t.TempDir(), Options{Logger: quietLogger(), TickInterval: 20 * time.Millisecond})
	t.Cleanup(func() { n.Close() })
	ctx := context.Background()
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "c", Partitioning: kv.PartitionHash, Shards: 4}); err != nil {
		t.Fatal(err)
	}
	return n, ctx
}

func refsOf(keys ...string) []kv.KeyRef {
	refs := make([]kv.KeyRef, len(keys))
	for i, k := range keys {
		refs[i] = kv.KeyRef{Collection: "c", Key: []byte(k)}
	}
	return refs
}

// TestTxnBatchGetAnswersAsGets reads keys of several shards in one batch:
// stored, absent, written and deleted by the attempt, one asked twice;
// each item answers what a TxnGet of it answers.
func TestTxnBatchGetAnswersAsGets(t *testing.T) {
	n, ctx := openHashTxn(t)
	versions := map[string]uint64{}
	for i := range 12 {
		k := fmt.Sprintf("%c%02d", 'a'+i, i)
		v, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte(k), Value: []byte("v" + k), Tags: []string{"t" + k}})
		if err != nil {
			t.Fatal(err)
		}
		versions[k] = v
	}
	if ids := shardsOfKeys(n, "c", refsOf("a00", "b01", "c02", "d03", "e04", "f05", "g06", "h07", "i08", "j09")); len(ids) < 2 {
		d, _ := n.collection("c")
		t.Fatalf("the keys read fall in %d shards; the test needs several (%+v)", len(ids), d)
	}
	for _, forUpdate := range []bool{false, true} {
		t.Run(fmt.Sprintf("for_update=%v", forUpdate), func(t *testing.T) {
			id, err := n.BeginTxn(ctx, kv.TxnOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer n.AbortTxn(ctx, id)
			if err := n.TxnPut(ctx, id, kv.PutItem{Collection: "c", Key: []byte("k10"), Value: []byte("mine"), Tags: []string{"m"}}); err != nil {
				t.Fatal(err)
			}
			if err := n.TxnDelete(ctx, id, kv.KeyRef{Collection: "c", Key: []byte("l11")}); err != nil {
				t.Fatal(err)
			}
			keys := []string{"a00", "b01", "c02", "absent", "d03", "k10", "l11", "e04", "f05", "b01", "g06", "h07", "i08", "j09"}
			items, err := n.TxnBatchGet(ctx, id, refsOf(keys...), forUpdate)
			if err != nil {
				t.Fatal(err)
			}
			if len(items) != len(keys) {
				t.Fatalf("%d items for %d keys", len(items), len(keys))
			}
			for i, k := range keys {
				it := items[i]
				if it.Collection != "c" || string(it.Key) != k {
					t.Errorf("item %d is %q of %q, want %q of c", i, it.Key, it.Collection, k)
				}
				var want kv.BatchGetItem
				switch k {
				case "absent", "l11":
					want = kv.BatchGetItem{Found: false}
				case "k10":
					want = kv.BatchGetItem{Found: true, Value: []byte("mine"), Tags: []string{"m"}}
				default:
					want = kv.BatchGetItem{Found: true, Value: []byte("v" + k), Tags: []string{"t" + k}, Version: versions[k]}
				}
				if it.Found != want.Found || string(it.Value) != string(want.Value) || it.Version != want.Version ||
					strings.Join(it.Tags, ",") != strings.Join(want.Tags, ",") {
					t.Errorf("%s: found %v %q %v @%d, want found %v %q %v @%d", k, it.Found, it.Value, it.Tags, it.Version,
						want.Found, want.Value, want.Tags, want.Version)
				}
			}
			// Its reads count as the attempt's: a write of them commits.
			if err := n.TxnPut(ctx, id, kv.PutItem{Collection: "c", Key: []byte("a00"), Value: []byte("next")}); err != nil {
				t.Fatal(err)
			}
			if _, err := n.CommitTxn(ctx, id); err != nil {
				t.Fatal(err)
			}
			if r, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte("a00")}); err != nil || string(r.Value) != "next" {
				t.Fatalf("after the commit, a00 = %q, %v", r.Value, err)
			}
			if v, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte("a00"), Value: []byte("va00"), Tags: []string{"ta00"}}); err != nil {
				t.Fatal(err)
			} else {
				versions["a00"] = v
			}
			if v, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte("k10"), Value: []byte("vk10"), Tags: []string{"tk10"}}); err != nil {
				t.Fatal(err)
			} else {
				versions["k10"] = v
			}
			if v, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte("l11"), Value: []byte("vl11"), Tags: []string{"tl11"}}); err != nil {
				t.Fatal(err)
			} else {
				versions["l11"] = v
			}
		})
	}
}

// shardsOfKeys answers the shards refs route to.
func shardsOfKeys(n *Node, coll string, refs []kv.KeyRef) map[uint64]bool {
	d, err := n.collection(coll)
	if err != nil {
		return nil
	}
	ids := map[uint64]bool{}
	for _, r := range refs {
		_, id := n.route(d, r.Key)
		ids[id] = true
	}
	return ids
}

// TestTxnBatchGetRefusesBadKeysFirst: a batch with a bad key, or too
// many, fails before anything is locked, and says which key.
func TestTxnBatchGetRefusesBadKeysFirst(t *testing.T) {
	n, ctx := openHashTxn(t)
	id, err := n.BeginTxn(ctx, kv.TxnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer n.AbortTxn(ctx, id)
	refs := refsOf("a", "b", "c")
	refs[1].Key = nil
	_, err = n.TxnBatchGet(ctx, id, refs, true)
	if kv.CodeOf(err) != kv.CodeInvalidArgument || !strings.Contains(err.Error(), "keys[1]") {
		t.Fatalf("a batch with an empty key answered %v; want invalid_argument naming keys[1]", err)
	}
	refs = refsOf("a", "b")
	refs[1].Collection = "nope"
	if _, err = n.TxnBatchGet(ctx, id, refs, true); kv.CodeOf(err) != kv.CodeCollectionNotFound || !strings.Contains(err.Error(), "keys[1]") {
		t.Fatalf("a batch with a key of an unknown collection answered %v; want not_found naming keys[1]", err)
	}
	many := make([]string, kv.DefaultMaxBatchKeys+1)
	for i := range many {
		many[i] = fmt.Sprint(i)
	}
	if _, err = n.TxnBatchGet(ctx, id, refsOf(many...), false); kv.CodeOf(err) != kv.CodeTooLarge {
		t.Fatalf("a batch of %d keys answered %v; want too_large", len(many), err)
	}
	// Key "a" was not locked: a plain put of it (which waits for any
	// transaction's lock) is applied while the attempt lives. The
	// deadline only catches a hang.
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := n.Put(pctx, kv.PutRequest{Collection: "c", Key: []byte("a"), Value: []byte("x")}); err != nil {
		t.Fatalf("a plain put of a key of the refused batch: %v", err)
	}
	// The attempt goes on.
	if items, err := n.TxnBatchGet(ctx, id, refsOf("a"), true); err != nil || !items[0].Found || string(items[0].Value) != "x" {
		t.Fatalf("a batch get after the refusals: %v %+v", err, items)
	}
	if _, err := n.CommitTxn(ctx, id); err != nil {
		t.Fatal(err)
	}
}

// TestTxnBatchGetWounds: an older attempt's batch get wounds a younger
// one holding one of its keys, reads once the lock is its own, and the
// younger one's next operation answers txn_aborted; a younger attempt's
// batch get meeting an older one's lock waits for its commit and reads
// what it wrote.
func TestTxnBatchGetWounds(t *testing.T) {
	n, ctx := openHashTxn(t)
	for _, k := range []string{"a", "b", "c", "d"} {
		if _, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte(k), Value: []byte("0")}); err != nil {
			t.Fatal(err)
		}
	}
	older, younger := beginOlderYounger(t, n)
	if _, err := n.TxnBatchGet(ctx, younger, refsOf("b"), true); err != nil {
		t.Fatal(err)
	}
	items, err := n.TxnBatchGet(ctx, older, refsOf("a", "b", "c", "d"), true)
	if err != nil {
		t.Fatalf("the older attempt's batch get: %v", err)
	}
	for i, it := range items {
		if !it.Found || string(it.Value) != "0" {
			t.Fatalf("item %d: %+v", i, it)
		}
	}
	if _, err := n.TxnBatchGet(ctx, younger, refsOf("e", "f"), false); kv.CodeOf(err) != kv.CodeTxnAborted {
		t.Fatalf("the wounded attempt's next batch get answered %v; want txn_aborted", err)
	}
	n.AbortTxn(ctx, younger)

	// A younger attempt waits for the older one's locks.
	third, err := n.BeginTxn(ctx, kv.TxnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer n.AbortTxn(ctx, third)
	got := make(chan []kv.BatchGetItem, 1)
	go func() {
		items, err := n.TxnBatchGet(ctx, third, refsOf("d", "c"), false)
		if err != nil {
			t.Errorf("the younger attempt's batch get: %v", err)
		}
		got <- items
	}()
	for _, k := range []string{"c", "d"} {
		if err := n.TxnPut(ctx, older, kv.PutItem{Collection: "c", Key: []byte(k), Value: []byte("1")}); err != nil {
			t.Fatal(err)
		}
	}
	v, err := n.CommitTxn(ctx, older)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case items := <-got:
		for i, it := range items {
			if !it.Found || string(it.Value) != "1" || it.Version != v {
				t.Fatalf("after the older commit at %d, item %d is %+v", v, i, it)
			}
		}
	case <-time.After(time.Minute): // catches a hang only
		t.Fatal("the younger attempt's batch get never answered")
	}
}

// TestTxnBatchGetSnapshot: a read-only or snapshot attempt's batch get
// reads at the attempt's timestamp, not what was written since; a
// snapshot attempt's own writes are answered; a read-only one refuses a
// batch get for update.
func TestTxnBatchGetSnapshot(t *testing.T) {
	n, ctx := openHashTxn(t)
	keys := []string{"a00", "b01", "c02", "d03", "e04"}
	for _, k := range keys {
		if _, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte(k), Value: []byte("old")}); err != nil {
			t.Fatal(err)
		}
	}
	ro, err := n.BeginTxn(ctx, kv.TxnOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer n.AbortTxn(ctx, ro)
	si, err := n.BeginTxn(ctx, kv.TxnOptions{Isolation: kv.IsolationSnapshot})
	if err != nil {
		t.Fatal(err)
	}
	defer n.AbortTxn(ctx, si)
	for _, k := range keys {
		if _, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte(k), Value: []byte("new")}); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.TxnPut(ctx, si, kv.PutItem{Collection: "c", Key: []byte("b01"), Value: []byte("mine")}); err != nil {
		t.Fatal(err)
	}
	asked := append(append([]string{}, keys...), "absent", "a00")
	for _, tc := range []struct {
		id   string
		want map[string]string
	}{
		{ro, map[string]string{}},
		{si, map[string]string{"b01": "mine"}},
	} {
		items, err := n.TxnBatchGet(ctx, tc.id, refsOf(asked...), false)
		if err != nil {
			t.Fatal(err)
		}
		for i, k := range asked {
			want, ok := tc.want[k]
			if !ok {
				want = "old"
			}
			if k == "absent" {
				if items[i].Found {
					t.Errorf("%s: absent found: %+v", tc.id, items[i])
				}
				continue
			}
			if !items[i].Found || string(items[i].Value) != want || string(items[i].Key) != k {
				t.Errorf("%s: item %d = %+v, want %s = %q", tc.id, i, items[i], k, want)
			}
		}
	}
	if _, err := n.TxnBatchGet(ctx, ro, refsOf("a00"), true); kv.CodeOf(err) != kv.CodeInvalidArgument {
		t.Fatalf("a read-only attempt's batch get for update: %v", err)
	}
}

// TestLockUnreachable: a lock request that found no leader in its retries
// answers the transaction's client unavailable, not not_leader (it named
// no shard: TestEndToEndTxnBankWithKill met one after a paused leader);
// other errors pass as they are.
func TestLockUnreachable(t *testing.T) {
	err := lockUnreachable(5, kv.Errorf(kv.CodeNotLeader, "node 1 does not lead shard 5"))
	if kv.CodeOf(err) != kv.CodeUnavailable || !strings.Contains(err.Error(), "shard 5") || !strings.Contains(err.Error(), "node 1 does not lead shard 5") {
		t.Fatalf("not_leader became %v", err)
	}
	for _, c := range []kv.Code{kv.CodeTxnAborted, kv.CodeUnavailable, kv.CodeKeyInGroup} {
		in := kv.Errorf(c, "x")
		if out := lockUnreachable(5, in); out != in {
			t.Fatalf("%s became %v", c, out)
		}
	}
}
