package node

import (
	"context"
	"maps"
	"strconv"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
)

// TestTxnAtTimestampRefusesGroupMembersFourNodes is
// TestTxnAtTimestampRefusesGroupMembers on four nodes and shards of one
// replica: gets forwarded to the key's node, scans and tag queries read
// in parts. Read-only attempts on every node are refused the group's keys
// while it holds them; begun before the group's deletion, they abort at
// their read after it, and their retries read every transfer.
func TestTxnAtTimestampRefusesGroupMembersFourNodes(t *testing.T) {
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
	ro := kv.TxnOptions{ReadOnly: true}
	for _, tn := range c.nodes {
		n := tn.n
		for read, try := range map[string]func(tx string) error{
			"get":             func(tx string) error { _, _, err := n.TxnGet(ctx, tx, members[0]); return err },
			"get of a tagged": func(tx string) error { _, _, err := n.TxnGet(ctx, tx, tagged); return err },
			"batch get": func(tx string) error {
				_, err := n.TxnBatchGet(ctx, tx, []kv.KeyRef{members[5], members[1]}, false)
				return err
			},
			"scan": func(tx string) error { _, err := n.TxnScan(ctx, tx, kv.ScanRequest{Collection: "acct"}); return err },
			"tag query": func(tx string) error {
				_, err := n.TxnGetByTags(ctx, tx, kv.TagQuery{Collection: "acct", All: []string{"acct"}})
				return err
			},
		} {
			tx, err := n.BeginTxn(ctx, ro)
			if err != nil {
				t.Fatal(err)
			}
			if err := try(tx); kv.CodeOf(err) != kv.CodeKeyInGroup {
				t.Fatalf("node %d, a read-only %s of the group's keys: %v, want key_in_group", n.id, read, err)
			}
			n.AbortTxn(ctx, tx)
		}
		// A locking transaction's scan and tag query are refused too.
		tx, err := n.BeginTxn(ctx, kv.TxnOptions{})
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
		// A key in no group is read.
		tx, err = n.BeginTxn(ctx, ro)
		if err != nil {
			t.Fatal(err)
		}
		if rec, _, err := n.TxnGet(ctx, tx, members[6]); err != nil || string(rec.Value) != "5" {
			t.Fatalf("node %d, a key in no group: %+v %v", n.id, rec, err)
		}
		n.AbortTxn(ctx, tx)
	}
	// Read-only attempts begun before transfers and the deletion.
	early := make([]string, len(c.nodes))
	earlyTagged := make([]string, len(c.nodes))
	for i, tn := range c.nodes {
		tx, err := tn.n.BeginTxn(ctx, ro)
		if err != nil {
			t.Fatal(err)
		}
		early[i] = tx
		if earlyTagged[i], err = tn.n.BeginTxn(ctx, ro); err != nil {
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
	c.eventually(60*time.Second, "the group is deleted", func() error { return n1.DeleteGroup(ctx, "g") })
	for i, tn := range c.nodes {
		n := tn.n
		if rec, _, err := n.TxnGet(ctx, earlyTagged[i], tagged); kv.CodeOf(err) != kv.CodeTxnAborted {
			t.Fatalf("node %d, a read-only get of the tagged key begun before the deletion: %+v, %v; want txn_aborted", n.id, rec, err)
		}
		retried, err := n.BeginTxn(ctx, kv.TxnOptions{ReadOnly: true, RetryOf: earlyTagged[i]})
		if err != nil {
			t.Fatal(err)
		}
		if rec, _, err := n.TxnGet(ctx, retried, tagged); err != nil || string(rec.Value) != "6" {
			t.Fatalf("node %d, the retried get of the tagged key: %+v, %v; want the group's 6", n.id, rec, err)
		}
		n.AbortTxn(ctx, retried)
		page, err := n.TxnScan(ctx, early[i], kv.ScanRequest{Collection: "acct"})
		if kv.CodeOf(err) != kv.CodeTxnAborted {
			t.Fatalf("node %d, a read-only scan begun before the deletion: %+v, %v; want txn_aborted", n.id, page, err)
		}
		tx, err := n.BeginTxn(ctx, kv.TxnOptions{ReadOnly: true, RetryOf: early[i]})
		if err != nil {
			t.Fatal(err)
		}
		page, err = n.TxnScan(ctx, tx, kv.ScanRequest{Collection: "acct"})
		if err != nil {
			t.Fatalf("node %d, the retry's scan: %v", n.id, err)
		}
		sum := 0
		vals := map[string]string{}
		for _, r := range page.Items {
			x, _ := strconv.Atoi(string(r.Value))
			sum += x
			vals[string(r.Key)] = string(r.Value)
		}
		// The transfers k0→k1, k1→k2, k2→k3, k3→k0, k0→k1, k1→k2.
		want := map[string]string{"k0": "4", "k1": "5", "k2": "6", "k3": "5", "k4": "5", "k5": "5", "k6": "5", "k7": "5"}
		if sum != 40 || !maps.Equal(vals, want) {
			t.Fatalf("node %d, the retry read %v (total %d), want %v", n.id, vals, sum, want)
		}
		if _, err := n.CommitTxn(ctx, tx); err != nil {
			t.Fatal(err)
		}
	}
}
