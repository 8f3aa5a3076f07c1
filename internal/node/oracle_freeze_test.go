package node

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/kv"
)

// TestOracleLeaderFrozen: the node leading the meta shard, the timestamp
// oracle, stops answering with its connections open (as a stopped
// process); the others elect another, and a transaction begun through
// one of them gets its timestamp from the new oracle instead of waiting
// for the stopped one. (Each try answers unavailable at worst, which a
// client retries; the deadline only catches a wait for the stopped
// node.)
func TestOracleLeaderFrozen(t *testing.T) {
	c := startCluster(t, 3, nil)
	c.waitVoters(3, cluster.MetaShardID)
	old := c.leader(cluster.MetaShardID)
	var via *testNode
	for _, tn := range c.nodes {
		if tn != old {
			via = tn
			break
		}
	}
	t.Logf("freezing node %d, the oracle; beginning through node %d", old.id, via.id)
	c.net.freeze(old.id)
	defer c.net.thaw()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for tries := 1; ; tries++ {
		id, err := via.n.BeginTxn(ctx, kv.TxnOptions{})
		if err == nil {
			t.Logf("began %s after %d tries", id, tries)
			break
		}
		if ctx.Err() != nil || kv.CodeOf(err) != kv.CodeUnavailable {
			t.Fatalf("try %d: %v", tries, err)
		}
	}
}

// TestTxnAbortReleasesWhileRecordShardFrozen: an attempt whose record's
// shard has a stopped leader (frozen, its connections open) is aborted
// by its client; the record cannot be aborted until that shard elects
// another leader, but the attempt's locks in other shards are released
// at once, not when its record expires (TxnTimeout, long here): a plain
// write of a key it locked elsewhere goes through.
func TestTxnAbortReleasesWhileRecordShardFrozen(t *testing.T) {
	c := startCluster(t, 3, func(o *Options) { o.TxnTimeout = time.Minute })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d := c.txnCollectionH(ctx)
	// The record's shard A and the second key's shard B, led by another
	// node.
	shardA, shardB := d.Shards[0].ID, d.Shards[1].ID
	frozen := c.leader(shardA)
	rng := rand.New(rand.NewPCG(clusterSeed(t), 0))
	c.eventually(30*time.Second, "shard B led by another node than shard A", func() error {
		if c.leader(shardB) != frozen {
			return nil
		}
		c.transferLeader(shardB, rng)
		return fmt.Errorf("node %d leads both", frozen.id)
	})
	var via *testNode
	for _, tn := range c.nodes {
		if tn != frozen {
			via = tn
		}
	}
	ka, kb := c.keyIn(d, shardA, "a"), c.keyIn(d, shardB, "b")
	id, err := via.n.BeginTxn(ctx, kv.TxnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range [][]byte{ka, kb} { // a first: the record's anchor
		if _, _, err := via.n.TxnGetForUpdate(ctx, id, kv.KeyRef{Collection: "h", Key: k}); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("freezing node %d, leader of shard %d (the record's); aborting through node %d", frozen.id, shardA, via.id)
	c.net.freeze(frozen.id)
	defer c.net.thaw()
	if err := via.n.AbortTxn(ctx, id); err != nil {
		t.Fatal(err)
	}
	// A generous deadline, well below the record's expiry, that only
	// catches a wait for it.
	pctx, pcancel := context.WithTimeout(ctx, 20*time.Second)
	defer pcancel()
	if _, err := via.n.Put(pctx, kv.PutRequest{Collection: "h", Key: kb, Value: []byte("after")}); err != nil {
		t.Fatalf("a plain put of a key the aborted attempt had locked: %v", err)
	}
}
