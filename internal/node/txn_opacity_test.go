package node

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/kv"
)

// TestTxnReadAfterLocksLostAborts: a transaction reads a key in one shard,
// the shard's leadership moves (its read lock, volatile, is lost), and
// another transaction writes that key and a key of a second shard
// together; the first transaction's read of the second key must not
// answer the new value next to the old one it read — it answers
// txn_aborted — in a get, a batch get and a scan. While the locks are
// held, reads of other shards are answered.
func TestTxnReadAfterLocksLostAborts(t *testing.T) {
	seed := clusterSeed(t)
	t.Logf("seed %d", seed)
	c := startCluster(t, 3, func(o *Options) { o.TxnTimeout = 2 * time.Second })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c.createTxnCollections(ctx)
	rng := rand.New(rand.NewPCG(seed, 0))
	d, err := c.node(1).n.collection("h")
	if err != nil {
		t.Fatal(err)
	}
	shardA, shardB := d.Shards[0].ID, d.Shards[1].ID
	for _, read := range []string{"get", "batch get", "scan"} {
		t.Run(read, func(t *testing.T) {
			n := c.nodes[rng.IntN(len(c.nodes))].n
			ka, kb := c.keyIn(d, shardA, "a-"+read), c.keyIn(d, shardB, "b-"+read)
			calm := c.keyIn(d, shardB, "calm-"+read)
			collB := "h"
			if read == "scan" {
				// A scan of a hash collection locks every shard, a's
				// too (whose new term then says the locks were lost): b
				// is in range collection r, whose span locks its shard.
				collB, kb = "r", []byte("k5-"+read)
			}
			for _, k := range []kv.KeyRef{{Collection: "h", Key: ka}, {Collection: collB, Key: kb}, {Collection: "h", Key: calm}} {
				if _, err := n.Put(ctx, kv.PutRequest{Collection: k.Collection, Key: k.Key, Value: []byte("0")}); err != nil {
					t.Fatal(err)
				}
			}
			id, err := n.BeginTxn(ctx, kv.TxnOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if rec, _, err := n.TxnGet(ctx, id, kv.KeyRef{Collection: "h", Key: ka}); err != nil || string(rec.Value) != "0" {
				t.Fatalf("read of a: %q, %v", rec.Value, err)
			}
			// Locks held: a read of another shard is answered (whether or
			// not its lock in a's shard was asked about).
			if rec, _, err := n.TxnGet(ctx, id, kv.KeyRef{Collection: "h", Key: calm}); err != nil || string(rec.Value) != "0" {
				t.Fatalf("read of another shard's key: %q, %v", rec.Value, err)
			}
			c.moveLeader(shardA, rng)
			// Another transaction writes both keys: nothing holds a.
			other := c.nodes[rng.IntN(len(c.nodes))].n
			res, err := other.ExecTxn(ctx, kv.ExecRequest{Then: []kv.TxnOp{
				{Op: kv.TxnOpPut, Collection: "h", Key: ka, Value: []byte("1")},
				{Op: kv.TxnOpPut, Collection: collB, Key: kb, Value: []byte("1")},
			}})
			if err != nil || !res.Succeeded {
				t.Fatalf("the other transaction: %+v, %v", res, err)
			}
			asked := testutil.ToFloat64(n.metrics.readValidations)
			var got string
			switch read {
			case "get":
				var rec kv.Record
				rec, _, err = n.TxnGet(ctx, id, kv.KeyRef{Collection: "h", Key: kb})
				got = string(rec.Value)
			case "batch get":
				var items []kv.BatchGetItem
				items, err = n.TxnBatchGet(ctx, id, []kv.KeyRef{{Collection: "h", Key: kb}, {Collection: "h", Key: calm}}, false)
				if err == nil {
					got = string(items[0].Value)
				}
			case "scan":
				var page kv.ScanResult
				page, err = n.TxnScan(ctx, id, kv.ScanRequest{Collection: collB, Start: kb, End: append(append([]byte{}, kb...), 0)})
				if err == nil && len(page.Items) == 1 {
					got = string(page.Items[0].Value)
				}
			}
			if kv.CodeOf(err) != kv.CodeTxnAborted {
				t.Fatalf("after reading a = 0 under a lock since lost, the %s of b answered %q, %v; want txn_aborted", read, got, err)
			}
			t.Logf("the %s answered: %v", read, err)
			if v := testutil.ToFloat64(n.metrics.readValidations); v <= asked {
				t.Fatalf("groupkv_txn_read_validations_total went from %v to %v: the %s asked a's shard nothing", asked, v, read)
			}
			if _, err := n.CommitTxn(ctx, id); kv.CodeOf(err) != kv.CodeTxnAborted {
				t.Fatalf("the commit of the aborted attempt answered %v", err)
			}
		})
	}
}

// keyIn returns a key of collection d that shard id holds: prefix and a
// number.
func (c *testCluster) keyIn(d *cluster.CollectionDesc, id uint64, prefix string) []byte {
	for i := 0; ; i++ {
		k := []byte(fmt.Sprintf("%s%d", prefix, i))
		if _, sid := c.node(1).n.route(d, k); sid == id {
			return k
		}
	}
}

// moveLeader hands shardID's leadership from its leader to another
// replica (picked with rng) and waits until another node leads it.
func (c *testCluster) moveLeader(shardID uint64, rng *rand.Rand) (from, to uint64) {
	c.t.Helper()
	old := c.leader(shardID)
	if from, to = c.transferLeader(shardID, rng); from == 0 {
		c.t.Fatalf("shard %d has no leader to move", shardID)
	}
	asked := time.Now()
	c.eventually(30*time.Second, "another leader", func() error {
		if old.n.host.Ready(shardID) {
			// A transfer raft gave up (its target not caught up within an
			// election timeout, as on a loaded machine) is asked again.
			if time.Since(asked) > time.Second {
				c.transferLeader(shardID, rng)
				asked = time.Now()
			}
			return fmt.Errorf("node %d still leads shard %d", old.id, shardID)
		}
		for _, tn := range c.nodes {
			if tn != old && tn.n.host.Ready(shardID) {
				return nil
			}
		}
		return fmt.Errorf("no new leader of shard %d yet", shardID)
	})
	return from, to
}
