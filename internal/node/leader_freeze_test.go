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

// TestForwardedToFrozenLeader: a shard's leader stops answering with its
// connections open (as a stopped process), and the other two elect
// another. A write, a linearizable read and a transaction, each sent
// through a follower as the leader stops, end soon after the election
// instead of waiting for the stopped node until the request's deadline.
// (The deadline is generous: it only catches a wait for the stopped
// node.)
func TestForwardedToFrozenLeader(t *testing.T) {
	c := startCluster(t, 3, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c.createTxnCollections(ctx)
	d, err := c.node(1).n.collection("h")
	if err != nil {
		t.Fatal(err)
	}
	shardID := d.Shards[0].ID
	// Every replica must know itself a voter (one that has not applied
	// its promotion cannot stand for election), and the shard's leader
	// must not run the timestamp oracle, which has its own bound.
	c.eventually(30*time.Second, "every node sees three voters", func() error {
		for _, tn := range c.nodes {
			for _, id := range []uint64{cluster.MetaShardID, shardID} {
				if cs, ok := tn.n.host.ConfState(id); !ok || len(cs.Voters) != 3 {
					return fmt.Errorf("node %d sees %d voters of shard %d", tn.id, len(cs.Voters), id)
				}
			}
		}
		return nil
	})
	rng := rand.New(rand.NewPCG(clusterSeed(t), 0))
	key := c.keyIn(d, shardID, "k")
	if _, err := c.node(1).n.Put(ctx, kv.PutRequest{Collection: "h", Key: key, Value: []byte("0")}); err != nil {
		t.Fatal(err)
	}
	// Each round stops the shard's leader and runs one operation through
	// a follower at once, while it still takes the stopped node for the
	// leader.
	round := func(what string, unknownOK bool, f func(ctx context.Context, via *testNode) error) {
		t.Helper()
		if c.leader(shardID) == c.leader(cluster.MetaShardID) {
			c.moveLeader(shardID, rng)
		}
		frozen := c.leader(shardID)
		var via *testNode
		for _, tn := range c.nodes {
			if tn != frozen {
				via = tn
				break
			}
		}
		t.Logf("%s: freezing node %d, leader of shard %d; through node %d", what, frozen.id, shardID, via.id)
		c.net.freeze(frozen.id)
		defer c.net.thaw()
		octx, ocancel := context.WithTimeout(ctx, 20*time.Second)
		defer ocancel()
		start := time.Now()
		err := f(octx, via)
		t.Logf("%s: %v after %v", what, err, time.Since(start).Round(time.Millisecond))
		switch {
		case octx.Err() != nil:
			t.Fatalf("%s waited for the stopped leader until its deadline: %v", what, err)
		case err == nil, unknownOK && kv.CodeOf(err) == kv.CodeCommitUnknown:
		default:
			t.Fatalf("%s: %v", what, err)
		}
	}
	// A write may have reached the stopped leader: it answers its
	// version or commit_unknown.
	round("a put", true, func(ctx context.Context, via *testNode) error {
		_, err := via.n.Put(ctx, kv.PutRequest{Collection: "h", Key: key, Value: []byte("1")})
		return err
	})
	round("a get", false, func(ctx context.Context, via *testNode) error {
		_, err := via.n.Get(ctx, kv.GetRequest{Collection: "h", Key: key})
		return err
	})
	round("a transaction", false, func(ctx context.Context, via *testNode) error {
		id, err := via.n.BeginTxn(ctx, kv.TxnOptions{})
		if err != nil {
			return err
		}
		if _, _, err := via.n.TxnGetForUpdate(ctx, id, kv.KeyRef{Collection: "h", Key: key}); err != nil {
			return err
		}
		if err := via.n.TxnPut(ctx, id, kv.PutItem{Collection: "h", Key: key, Value: []byte("txn")}); err != nil {
			return err
		}
		_, err = via.n.CommitTxn(ctx, id)
		return err
	})
	r, err := c.node(1).n.Get(ctx, kv.GetRequest{Collection: "h", Key: key})
	if err != nil || string(r.Value) != "txn" {
		t.Fatalf("after the rounds: %q, %v; want the transaction's write", r.Value, err)
	}
}
