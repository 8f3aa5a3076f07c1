package node

import (
	"context"
	"maps"
	"strconv"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
)

// TestTxnAtTimestampReadsGroupMembersFourNodes is
// TestTxnAtTimestampReadsGroupMembers on four nodes and shards of one
// replica: gets forwarded to the key's node, scans and tag queries read
// in parts. Read-only attempts on every node read the group's keys at
// their timestamps, while the group holds them and after its deletion:
// attempts begun before a run of transfers read the balances before it,
// in every read they make, and attempts begun after read every transfer.
func TestTxnAtTimestampReadsGroupMembersFourNodes(t *testing.T) {
	c := startCluster(t, 4, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n1 := c.node(1).n
	for _, o := range []kv.CollectionOptions{{Name: "acct", Partitioning: kv.PartitionHash, Shards: 4, Replicas: 1}, {Name: "l", Partitioning: kv.PartitionRange, Replicas: 1},
		{Name: "t", Partitioning: kv.PartitionTag, Shards: 4, Replicas: 1}} {
		if _, err := n1.CreateCollection(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	for _, coll := range []string{"acct", "t"} {
		d, _ := n1.collection(coll)
		for _, tn := range c.nodes {
			all := true
			for _, s := range d.Shards {
				all = all && tn.n.hasReplica(s.ID)
			}
			if all {
				t.Fatalf("node %d holds every shard of %s: its reads are not read in parts", tn.n.id, coll)
			}
		}
	}
	members := putMembers(ctx, c, n1, "acct", func(int) []string { return []string{"acct"} })
	// A key of a tag collection, which every node reads in parts (its
	// placement is not known from the key).
	tagged := putMembers(ctx, c, n1, "t", func(i int) []string { return []string{"p" + strconv.Itoa(i%4)} })[0]
	c.eventually(60*time.Second, "the group is created", func() error {
		_, err := n1.CreateGroup(ctx, kv.GroupSpec{ID: "g", Leader: kv.KeyRef{Collection: "l", Key: []byte("lead")}, Members: append(members[:4:4], tagged)})
		return err
	})
	initial := map[string]string{"k0": "5", "k1": "5", "k2": "5", "k3": "5", "k4": "5", "k5": "5", "k6": "5", "k7": "5"}
	// The transfers k0→k1, k1→k2, k2→k3, k3→k0, k0→k1, k1→k2.
	transferred := map[string]string{"k0": "4", "k1": "5", "k2": "6", "k3": "5", "k4": "5", "k5": "5", "k6": "5", "k7": "5"}
	ro := kv.TxnOptions{ReadOnly: true}
	// reads makes every kind of read in attempt tx on n and checks it
	// finds want, and the tagged key's value taggedWant.
	reads := func(n *Node, tx string, want map[string]string, taggedWant string) {
		t.Helper()
		if rec, _, err := n.TxnGet(ctx, tx, members[0]); err != nil || string(rec.Value) != want["k0"] {
			t.Fatalf("node %d, get of k0: %+v, %v; want %s", n.id, rec, err, want["k0"])
		}
		if rec, _, err := n.TxnGet(ctx, tx, tagged); err != nil || string(rec.Value) != taggedWant {
			t.Fatalf("node %d, get of the tagged key: %+v, %v; want %s", n.id, rec, err, taggedWant)
		}
		items, err := n.TxnBatchGet(ctx, tx, []kv.KeyRef{members[5], members[2]}, false)
		if err != nil || len(items) != 2 || string(items[0].Value) != want["k5"] || string(items[1].Value) != want["k2"] {
			t.Fatalf("node %d, batch get of k5, k2: %+v, %v; want %s, %s", n.id, items, err, want["k5"], want["k2"])
		}
		page, err := n.TxnScan(ctx, tx, kv.ScanRequest{Collection: "acct"})
		if err != nil {
			t.Fatalf("node %d, scan: %v", n.id, err)
		}
		tags, err := n.TxnGetByTags(ctx, tx, kv.TagQuery{Collection: "acct", All: []string{"acct"}})
		if err != nil {
			t.Fatalf("node %d, tag query: %v", n.id, err)
		}
		for what, items := range map[string][]kv.Record{"scan": page.Items, "tag query": tags.Items} {
			got := map[string]string{}
			for _, r := range items {
				got[string(r.Key)] = string(r.Value)
			}
			if !maps.Equal(got, want) {
				t.Fatalf("node %d, %s read %v, want %v", n.id, what, got, want)
			}
		}
	}
	for _, tn := range c.nodes {
		n := tn.n
		tx, err := n.BeginTxn(ctx, ro)
		if err != nil {
			t.Fatal(err)
		}
		reads(n, tx, initial, "5")
		if _, err := n.CommitTxn(ctx, tx); err != nil {
			t.Fatal(err)
		}
		// A locking transaction's scan and tag query are refused.
		tx, err = n.BeginTxn(ctx, kv.TxnOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := n.TxnScan(ctx, tx, kv.ScanRequest{Collection: "acct"}); kv.CodeOf(err) != kv.CodeKeyInGroup {
			t.Fatalf("node %d, a serializable scan of the group's keys: %v, want key_in_group", n.id, err)
		}
		if _, err := n.TxnGetByTags(ctx, tx, kv.TagQuery{Collection: "acct", Any: []string{"acct"}}); kv.CodeOf(err) != kv.CodeKeyInGroup {
			t.Fatalf("node %d, a serializable tag query of the group's keys: %v, want key_in_group", n.id, err)
		}
		n.AbortTxn(ctx, tx)
	}
	// Read-only attempts begun before the transfers and the deletion.
	early := make([]string, len(c.nodes))
	for i, tn := range c.nodes {
		var err error
		if early[i], err = tn.n.BeginTxn(ctx, ro); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 6 {
		if err := groupTransfer(ctx, n1, "g", members[i%4], members[(i+1)%4]); err != nil {
			t.Fatalf("transfer %d: %v", i, err)
		}
	}
	// The tagged key written by the group (its value and tags again).
	if _, _, err := groupTransact(ctx, n1, "g", func(at string) error {
		return n1.TxnPut(ctx, at, kv.PutItem{Collection: "t", Key: tagged.Key, Value: []byte("6"), Tags: []string{"p0"}})
	}); err != nil {
		t.Fatal(err)
	}
	for i, tn := range c.nodes {
		reads(tn.n, early[i], initial, "5")
		tx, err := tn.n.BeginTxn(ctx, ro)
		if err != nil {
			t.Fatal(err)
		}
		reads(tn.n, tx, transferred, "6")
		if _, err := tn.n.CommitTxn(ctx, tx); err != nil {
			t.Fatal(err)
		}
	}
	c.eventually(60*time.Second, "the group is deleted", func() error { return n1.DeleteGroup(ctx, "g") })
	for i, tn := range c.nodes {
		reads(tn.n, early[i], initial, "5")
		if _, err := tn.n.CommitTxn(ctx, early[i]); err != nil {
			t.Fatalf("node %d, commit of a read-only attempt begun before the transfers: %v", tn.n.id, err)
		}
		tx, err := tn.n.BeginTxn(ctx, ro)
		if err != nil {
			t.Fatal(err)
		}
		reads(tn.n, tx, transferred, "6")
		if _, err := tn.n.CommitTxn(ctx, tx); err != nil {
			t.Fatal(err)
		}
	}
}
