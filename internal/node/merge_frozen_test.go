package node

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/shard"
	"github.com/groupkv/groupkv/internal/txn"
)

// frozenMerge is a merge of range collection "r" held with its right shard
// frozen on every node, one node (lag, not the right shard's leader)
// hearing nothing of the right shard any more.
type frozenMerge struct {
	c           *testCluster
	left, right uint64
	lead, lag   *testNode
	merged      chan error
}

// holdFrozenMerge creates "r" on c's three nodes, split at "m", runs
// before, then merges the shards and holds the merge once the right shard
// is frozen everywhere, and cuts lag off from the right shard.
func holdFrozenMerge(ctx context.Context, t *testing.T, c *testCluster, before func(left, right uint64)) *frozenMerge {
	t.Helper()
	info, err := c.node(1).n.CreateCollection(ctx, kv.CollectionOptions{Name: "r", Partitioning: kv.PartitionRange, Replicas: 3,
		SplitPoints: [][]byte{[]byte("m")}})
	if err != nil {
		t.Fatal(err)
	}
	f := &frozenMerge{c: c, left: info.Shards[0].ID, right: info.Shards[1].ID, merged: make(chan error, 1)}
	for _, k := range []string{"b", "x"} {
		c.eventually(30*time.Second, "a write", func() error {
			_, err := c.node(1).n.Put(ctx, kv.PutRequest{Collection: "r", Key: []byte(k), Value: []byte("v")})
			return err
		})
	}
	before(f.left, f.right)
	for _, tn := range c.nodes {
		tn.n.knobs.holdMergeTrigger.Store(true)
	}
	go func() {
		_, err := c.node(1).n.MergeShards(ctx, "r", f.left)
		f.merged <- err
	}()
	c.eventually(60*time.Second, "the right shard frozen on every node", func() error {
		for _, tn := range c.nodes {
			if into := tn.n.frozenInto(f.right); into != f.left {
				return fmt.Errorf("node %d: shard %d frozen into %d", tn.id, f.right, into)
			}
		}
		return nil
	})
	c.eventually(30*time.Second, "a leader of the right shard", func() error {
		for _, tn := range c.nodes {
			if _, ok := tn.n.host.LeaderTerm(f.right); ok {
				f.lead = tn
				return nil
			}
		}
		return fmt.Errorf("no leader of shard %d", f.right)
	})
	for _, tn := range c.nodes {
		if tn != f.lead {
			f.lag = tn
			break
		}
	}
	for _, tn := range c.nodes {
		tn.n.knobs.cutShard.Store(&shardCut{shard: f.right, node: f.lag.id})
	}
	return f
}

// finish lets the merge through, heals the cut, and asserts that the
// replicas of the merged shard agree.
func (f *frozenMerge) finish(ctx context.Context, t *testing.T) {
	t.Helper()
	for _, tn := range f.c.nodes {
		tn.n.knobs.holdMergeTrigger.Store(false)
	}
	if err := <-f.merged; err != nil {
		t.Fatal(err)
	}
	f.c.eventually(60*time.Second, "the merged shard is gone everywhere", func() error { return f.c.checkMergedAway(f.right) })
	for _, tn := range f.c.nodes {
		tn.n.knobs.cutShard.Store(nil)
	}
	f.c.eventually(60*time.Second, "the replicas of the merged shard agree", func() error {
		cr, err := f.lead.n.CheckShard(ctx, f.left)
		if err != nil {
			return err
		}
		if cr.Status != kv.ConsistencyOK {
			t.Fatalf("consistency of shard %d: %+v", f.left, cr)
		}
		return nil
	})
}

// TestClusterMergeFrozenRecordLagging proposes a transaction record to the
// right shard of a merge after it froze, while one replica of it gets
// none of its raft messages: a frozen shard must refuse the record (as it
// refuses writes), or the replicas that applied it and the one that did
// not would each bring their own state into the left shard when the
// trigger applies, and the merged shard's replicas would disagree on the
// transaction's outcome.
func TestClusterMergeFrozenRecordLagging(t *testing.T) {
	c := startCluster(t, 3, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f := holdFrozenMerge(ctx, t, c, func(uint64, uint64) {})
	d, err := f.lead.n.collection("r")
	if err != nil {
		t.Fatal(err)
	}
	bucket, _ := f.lead.n.route(d, []byte("x"))
	now := cluster.TimestampFromTime(time.Now())
	m := txn.Meta{ID: txn.NewID(now, 1), Priority: now, Attempt: 1, Start: now, Anchor: txn.Anchor{Collection: d.ID, Bucket: bucket, Key: []byte("x")}}
	for _, op := range []txn.RecordOp{txn.OpHeartbeat, txn.OpCommit} {
		res, err := f.lead.n.host.Propose(ctx, f.right, shard.EncodeTxnRecord(txn.RecordCmd{Op: op, Meta: m, TS: now + 1}))
		if err != nil {
			t.Fatalf("proposing record op %d to the frozen shard: %v", op, err)
		}
		if res.Err == nil {
			t.Errorf("the frozen shard %d applied record op %d of %s: %+v", f.right, op, m.ID, res.Txn)
		}
	}
	f.finish(ctx, t)
}

// TestClusterMergeFrozenResolveLagging is the same with the resolve of a
// transaction committed, and prepared in the right shard, before the
// freeze: applied on some replicas of the frozen shard and not on the
// other, it would leave the merged shard's replicas with different
// intents and values.
func TestClusterMergeFrozenResolveLagging(t *testing.T) {
	c := startCluster(t, 3, unsweptOptions)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var id string
	var rec txn.Record
	f := holdFrozenMerge(ctx, t, c, func(_, right uint64) {
		// The right shard prepares x (the record is kept in a
		// collection of its own: commitUnresolved); coordinated by the
		// right shard's leader.
		var coord *testNode
		c.eventually(30*time.Second, "a leader of the right shard", func() error {
			for _, tn := range c.nodes {
				if _, ok := tn.n.host.LeaderTerm(right); ok {
					coord = tn
					return nil
				}
			}
			return fmt.Errorf("no leader of shard %d", right)
		})
		id, rec = commitUnresolved(ctx, t, coord.n, "r", []string{"x", "b"})
	})
	res, err := f.lead.n.host.Propose(ctx, f.right, shard.EncodeTxnResolve(&shard.TxnResolveCmd{ID: id, Commit: true, CommitTS: rec.CommitTS, Keys: []shard.TxnKey{{Key: []byte("x")}}}))
	if err != nil {
		t.Fatalf("proposing the resolve of %s to the frozen shard: %v", id, err)
	}
	if res.Err == nil {
		t.Errorf("the frozen shard %d applied the resolve of %s: %+v", f.right, id, res.Txn)
	}
	f.finish(ctx, t)
	// The transaction's writes are there, resolved by the merged shard.
	for _, k := range []string{"x", "b"} {
		c.eventually(60*time.Second, "a read of the transaction's write", func() error {
			r, err := f.lag.n.Get(ctx, kv.GetRequest{Collection: "r", Key: []byte(k)})
			if err != nil || string(r.Value) != "v"+k {
				return fmt.Errorf("node %d reads %s = %q, %v", f.lag.id, k, r.Value, err)
			}
			return nil
		})
	}
}
