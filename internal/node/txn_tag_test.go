package node

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
)

func openTagTest(t *testing.T) *Node {
	t.Helper()
	n := openTest(t, t.TempDir(), Options{Logger: quietLogger(), TickInterval: 20 * time.Millisecond})
	if _, err := n.CreateCollection(context.Background(), kv.CollectionOptions{Name: "tc", Partitioning: kv.PartitionTag, Shards: 4}); err != nil {
		t.Fatal(err)
	}
	return n
}

// commitTxn runs fn in one attempt and commits it.
func commitTxn(ctx context.Context, n *Node, fn func(id string) error) error {
	id, err := n.BeginTxn(ctx, kv.TxnOptions{})
	if err != nil {
		return err
	}
	if err := fn(id); err != nil {
		n.AbortTxn(ctx, id)
		return err
	}
	_, err = n.CommitTxn(ctx, id)
	return err
}

func sortedKeys(res kv.ScanResult) []string {
	var out []string
	for _, r := range res.Items {
		out = append(out, string(r.Key))
	}
	slices.Sort(out)
	return out
}

// TestTxnTagCollection: transactions read and write keys of a tag
// collection — placing new keys by their first tag, moving a deleted key
// to another, refusing to move a live one — and plain reads, tag queries
// and placements agree with what they committed.
func TestTxnTagCollection(t *testing.T) {
	n := openTagTest(t)
	defer n.Close()
	ctx := context.Background()
	put := func(id, k string, tags ...string) error {
		return n.TxnPut(ctx, id, kv.PutItem{Collection: "tc", Key: []byte(k), Value: []byte("v-" + k), Tags: tags})
	}
	if err := commitTxn(ctx, n, func(id string) error {
		for _, p := range []struct {
			k    string
			tags []string
		}{{"k1", []string{"team-a", "x"}}, {"k2", []string{"team-a"}}, {"k3", []string{"team-b"}}} {
			if err := put(id, p.k, p.tags...); err != nil {
				return err
			}
		}
		// Its own writes, before the commit.
		r, found, err := n.TxnGet(ctx, id, kv.KeyRef{Collection: "tc", Key: []byte("k1")})
		if err != nil || !found || string(r.Value) != "v-k1" {
			return fmt.Errorf("reading its own put of k1: %q %v %v", r.Value, found, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	d, err := n.collection("tc")
	if err != nil {
		t.Fatal(err)
	}
	shardOf := func(k string) uint64 {
		tag, ok, err := n.placementOf(ctx, d, []byte(k))
		if err != nil || !ok {
			t.Fatalf("placement of %s: %q %v %v", k, tag, ok, err)
		}
		_, i := d.Route([]byte(k), tag)
		return d.Shards[i].ID
	}
	if shardOf("k1") != shardOf("k2") {
		t.Fatalf("k1 and k2 share the placement tag team-a, yet live in shards %d and %d", shardOf("k1"), shardOf("k2"))
	}
	if r, err := n.Get(ctx, kv.GetRequest{Collection: "tc", Key: []byte("k1")}); err != nil || string(r.Value) != "v-k1" || !slices.Equal(r.Tags, []string{"team-a", "x"}) {
		t.Fatalf("plain get of k1: %+v %v", r, err)
	}
	if res, err := n.GetByTags(ctx, kv.TagQuery{Collection: "tc", Any: []string{"team-a"}}); err != nil || !slices.Equal(sortedKeys(res), []string{"k1", "k2"}) {
		t.Fatalf("tag query team-a: %v %v", sortedKeys(res), err)
	}

	// Reads: a key present, one never put; a tag query and a scan.
	if err := commitTxn(ctx, n, func(id string) error {
		if r, found, err := n.TxnGet(ctx, id, kv.KeyRef{Collection: "tc", Key: []byte("k3")}); err != nil || !found || string(r.Value) != "v-k3" {
			return fmt.Errorf("k3: %q %v %v", r.Value, found, err)
		}
		if _, found, err := n.TxnGet(ctx, id, kv.KeyRef{Collection: "tc", Key: []byte("never")}); err != nil || found {
			return fmt.Errorf("a key never put: found %v, %v", found, err)
		}
		res, err := n.TxnGetByTags(ctx, id, kv.TagQuery{Collection: "tc", Any: []string{"team-b"}})
		if err != nil || !slices.Equal(sortedKeys(res), []string{"k3"}) {
			return fmt.Errorf("tag query team-b: %v %v", sortedKeys(res), err)
		}
		res, err = n.TxnScan(ctx, id, kv.ScanRequest{Collection: "tc"})
		if err != nil || !slices.Equal(sortedKeys(res), []string{"k1", "k2", "k3"}) {
			return fmt.Errorf("scan: %v %v", sortedKeys(res), err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// A live record keeps its placement tag.
	err = commitTxn(ctx, n, func(id string) error { return put(id, "k1", "team-b") })
	if kv.CodeOf(err) != kv.CodePlacementTagChanged {
		t.Fatalf("moving live k1 to team-b: %v, want placement_tag_changed", err)
	}
	// Deleted, it moves with its next put, in another transaction.
	if err := commitTxn(ctx, n, func(id string) error {
		return n.TxnDelete(ctx, id, kv.KeyRef{Collection: "tc", Key: []byte("k3")})
	}); err != nil {
		t.Fatal(err)
	}
	if err := commitTxn(ctx, n, func(id string) error { return put(id, "k3", "team-a") }); err != nil {
		t.Fatal(err)
	}
	if shardOf("k3") != shardOf("k1") {
		t.Fatalf("k3, put again with team-a, lives in shard %d, not with k1 in %d", shardOf("k3"), shardOf("k1"))
	}
	if res, err := n.GetByTags(ctx, kv.TagQuery{Collection: "tc", Any: []string{"team-b"}}); err != nil || len(res.Items) != 0 {
		t.Fatalf("tag query team-b after k3 moved: %v %v", sortedKeys(res), err)
	}
	// Placed and moved within one transaction (not live in between): only
	// the last placement holds the record.
	if err := commitTxn(ctx, n, func(id string) error {
		if err := put(id, "k4", "t1"); err != nil {
			return err
		}
		return put(id, "k4", "t2")
	}); err != nil {
		t.Fatal(err)
	}
	if r, err := n.Get(ctx, kv.GetRequest{Collection: "tc", Key: []byte("k4")}); err != nil || !slices.Equal(r.Tags, []string{"t2"}) {
		t.Fatalf("k4: %+v %v", r, err)
	}
	if res, err := n.GetByTags(ctx, kv.TagQuery{Collection: "tc", Any: []string{"t1"}}); err != nil || len(res.Items) != 0 {
		t.Fatalf("tag query t1: %v %v", sortedKeys(res), err)
	}
	// A delete of a key never put deletes nothing.
	if err := commitTxn(ctx, n, func(id string) error {
		return n.TxnDelete(ctx, id, kv.KeyRef{Collection: "tc", Key: []byte("nothing")})
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Get(ctx, kv.GetRequest{Collection: "tc", Key: []byte("nothing")}); kv.CodeOf(err) != kv.CodeNotFound {
		t.Fatalf("get of a key deleted but never put: %v", err)
	}
}

// TestTxnTagPlacementLocked: a transaction that read a key of a tag
// collection as absent (never placed) holds it: a plain put of the key —
// which must place it first — waits until the transaction ends.
func TestTxnTagPlacementLocked(t *testing.T) {
	n := openTagTest(t)
	defer n.Close()
	ctx := context.Background()
	id, err := n.BeginTxn(ctx, kv.TxnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, found, err := n.TxnGet(ctx, id, kv.KeyRef{Collection: "tc", Key: []byte("new")}); err != nil || found {
		t.Fatalf("get: found %v, %v", found, err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := n.Put(ctx, kv.PutRequest{Collection: "tc", Key: []byte("new"), Value: []byte("plain"), Tags: []string{"t"}})
		done <- err
	}()
	// Not a timing assertion: however long it takes, the put must not
	// land while the transaction that read the key absent runs.
	select {
	case err := <-done:
		t.Fatalf("the plain put landed (%v) while a transaction held the key read as absent", err)
	case <-time.After(300 * time.Millisecond):
	}
	if _, found, err := n.TxnGet(ctx, id, kv.KeyRef{Collection: "tc", Key: []byte("new")}); err != nil || found {
		t.Fatalf("get again: found %v, %v", found, err)
	}
	if _, err := n.CommitTxn(ctx, id); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second): // only catches a hang
		t.Fatal("the plain put did not land 30 s after the transaction committed")
	}
	if r, err := n.Get(ctx, kv.GetRequest{Collection: "tc", Key: []byte("new")}); err != nil || string(r.Value) != "plain" {
		t.Fatalf("after the put: %q %v", r.Value, err)
	}
}

// TestTxnTagBank: transfers between accounts of a tag collection placed by
// team (so most transfers span shards), from several clients, with
// serializable audits that read every team by a tag query: every audit and
// the end see the same total.
func TestTxnTagBank(t *testing.T) {
	n := openTagTest(t)
	defer n.Close()
	tagBank(t, []*Node{n})
}

// TestTxnTagBankCluster is TestTxnTagBank on three nodes, each client and
// the auditor coordinating through a node of its own: placements are read,
// and changed, on home shards led elsewhere.
func TestTxnTagBankCluster(t *testing.T) {
	c := startCluster(t, 3, func(o *Options) { o.TxnTimeout = 2 * time.Second })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.node(1).n.CreateCollection(ctx, kv.CollectionOptions{Name: "tc", Partitioning: kv.PartitionTag, Shards: 4}); err != nil {
		t.Fatal(err)
	}
	var nodes []*Node
	for _, tn := range c.nodes {
		c.eventually(30*time.Second, "collection tc everywhere", func() error {
			_, err := tn.n.DescribeCollection(ctx, "tc")
			return err
		})
		nodes = append(nodes, tn.n)
	}
	for _, id := range c.shardIDs("tc") {
		c.leader(id)
	}
	tagBank(t, nodes)
}

// tagBank runs the transfers of TestTxnTagBank, client i through
// nodes[i mod len(nodes)].
func tagBank(t *testing.T, nodes []*Node) {
	const accounts, teams, clients, rounds = 9, 3, 4, 15
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	team := func(i int) string { return "team-" + strconv.Itoa(i%teams) }
	acct := func(i int) string { return "acct-" + strconv.Itoa(i) }
	var wg sync.WaitGroup
	errs := make(chan error, clients+1)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := nodes[c%len(nodes)]
			for r := range rounds {
				from, to := (c+r)%accounts, (c+2*r+1)%accounts
				if from == to {
					to = (to + 1) % accounts
				}
				_, _, err := transact(ctx, n, kv.TxnOptions{}, func(id string) error {
					for _, i := range []int{from, to} {
						rec, found, err := n.TxnGet(ctx, id, kv.KeyRef{Collection: "tc", Key: []byte(acct(i))})
						if err != nil {
							return err
						}
						v := 0
						if found {
							v, _ = strconv.Atoi(string(rec.Value))
						}
						if i == from {
							v -= 7
						} else {
							v += 7
						}
						if err := n.TxnPut(ctx, id, kv.PutItem{Collection: "tc", Key: []byte(acct(i)), Value: []byte(strconv.Itoa(v)), Tags: []string{team(i)}}); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	audits := 0
	wg.Add(1)
	go func() {
		defer wg.Done()
		n := nodes[len(nodes)-1]
		for range 10 {
			_, _, err := transact(ctx, n, kv.TxnOptions{}, func(id string) error {
				sum := 0
				for tm := range teams {
					res, err := n.TxnGetByTags(ctx, id, kv.TagQuery{Collection: "tc", Any: []string{team(tm)}})
					if err != nil {
						return err
					}
					for _, r := range res.Items {
						v, _ := strconv.Atoi(string(r.Value))
						sum += v
					}
				}
				if sum != 0 {
					return fmt.Errorf("an audit summed %d, not 0", sum)
				}
				return nil
			})
			if err != nil {
				errs <- err
				return
			}
			audits++
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	n := nodes[0]
	sum := 0
	d, err := n.collection("tc")
	if err != nil {
		t.Fatal(err)
	}
	for i := range accounts {
		rec, err := n.Get(ctx, kv.GetRequest{Collection: "tc", Key: []byte(acct(i))})
		if kv.CodeOf(err) == kv.CodeNotFound {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(rec.Tags, []string{team(i)}) {
			t.Fatalf("%s has tags %v, want [%s]", acct(i), rec.Tags, team(i))
		}
		v, _ := strconv.Atoi(string(rec.Value))
		sum += v
		// It lives with its team.
		tag, ok, err := n.placementOf(ctx, d, []byte(acct(i)))
		if err != nil || !ok || tag != team(i) {
			t.Fatalf("%s is placed by %q (%v %v), want %s", acct(i), tag, ok, err, team(i))
		}
	}
	if sum != 0 {
		t.Fatalf("the accounts sum to %d at the end, not 0", sum)
	}
	t.Logf("%d transfers, %d audits", clients*rounds, audits)
}
