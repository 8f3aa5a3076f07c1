package node

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/groupkv/groupkv/internal/kv"
)

// TestClusterWriteOutlivesItsLeader proposes a write on a shard's leader
// that hears nothing from its followers (its messages reach them, theirs
// are dropped): the followers persist the entry, the leader cannot commit
// it and steps down (check quorum), and a follower elected in its place
// commits it. Once the old leader hears from the new one again it applies
// the entry and answers the write: it succeeded, it is not in doubt
// (commit_unknown).
func TestClusterWriteOutlivesItsLeader(t *testing.T) {
	c := startCluster(t, 3, nil)
	ctx := context.Background()
	if _, err := c.node(1).n.CreateCollection(ctx, kv.CollectionOptions{Name: "w", Shards: 1, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	shardID := c.shardIDs("w")[0]
	c.eventually(30*time.Second, "a first write", func() error {
		_, err := c.node(1).n.Put(ctx, kv.PutRequest{Collection: "w", Key: []byte("first"), Value: []byte("v")})
		return err
	})
	old := c.leader(shardID)
	var followers []*testNode
	for _, tn := range c.nodes {
		if tn != old {
			followers = append(followers, tn)
		}
	}
	for _, f := range followers {
		f.n.knobs.cutShard.Store(&shardCut{shard: shardID, node: old.id})
	}
	healed := false
	heal := func() {
		if !healed {
			healed = true
			for _, f := range followers {
				f.n.knobs.cutShard.Store(nil)
			}
		}
	}
	defer heal()

	type result struct {
		version uint64
		err     error
	}
	done := make(chan result, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		v, err := old.n.Put(wctx, kv.PutRequest{Collection: "w", Key: []byte("k"), Value: []byte("after")})
		done <- result{v, err}
	}()
	var next *testNode
	c.eventually(30*time.Second, "a follower leads the shard", func() error {
		for _, f := range followers {
			if f.n.host.Ready(shardID) {
				next = f
				return nil
			}
		}
		return fmt.Errorf("no follower leads shard %d yet", shardID)
	})
	select {
	case r := <-done:
		t.Fatalf("the write was answered (%d, %v) before its old leader heard from the new one", r.version, r.err)
	default:
	}
	t.Logf("node %d led shard %d, node %d leads it now", old.id, shardID, next.id)
	heal()
	var r result
	select {
	case r = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the write was not answered 30s after the partition healed")
	}
	if r.err != nil {
		t.Fatalf("the write failed (%s): %v", kv.CodeOf(r.err), r.err)
	}
	got, err := next.n.Get(ctx, kv.GetRequest{Collection: "w", Key: []byte("k")})
	if err != nil || string(got.Value) != "after" || got.Version != r.version {
		t.Fatalf("k reads %q at %d, %v; the write answered version %d", got.Value, got.Version, err, r.version)
	}
	if n := testutil.ToFloat64(old.n.metrics.repl.Orphans.WithLabelValues("applied")); n < 1 {
		t.Errorf("groupkv_raft_orphaned_proposals_total{outcome=\"applied\"} is %v on the old leader", n)
	}
}

// TestClusterWriteLostWithItsLeader proposes a write on a shard's leader
// cut off from its followers both ways: the entry stays in the old
// leader's log only, the followers elect a new leader that writes other
// entries at its index, and once the partition heals the old leader's
// entry is replaced. The write is then known not to have been applied: it
// is retried through the new leader, or refused as not_leader, never left
// in doubt (commit_unknown); and it is applied at most once.
func TestClusterWriteLostWithItsLeader(t *testing.T) {
	c := startCluster(t, 3, nil)
	ctx := context.Background()
	if _, err := c.node(1).n.CreateCollection(ctx, kv.CollectionOptions{Name: "w", Shards: 1, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	shardID := c.shardIDs("w")[0]
	c.eventually(30*time.Second, "a first write", func() error {
		_, err := c.node(1).n.Put(ctx, kv.PutRequest{Collection: "w", Key: []byte("first"), Value: []byte("v")})
		return err
	})
	old := c.leader(shardID)
	var followers []*testNode
	for _, tn := range c.nodes {
		tn.n.knobs.cutShard.Store(&shardCut{shard: shardID, node: old.id})
		if tn != old {
			followers = append(followers, tn)
		}
	}
	healed := false
	heal := func() {
		if !healed {
			healed = true
			for _, tn := range c.nodes {
				tn.n.knobs.cutShard.Store(nil)
			}
		}
	}
	defer heal()

	type result struct {
		version uint64
		err     error
	}
	done := make(chan result, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		v, err := old.n.Put(wctx, kv.PutRequest{Collection: "w", Key: []byte("k"), Value: []byte("lost")})
		done <- result{v, err}
	}()
	var next *testNode
	c.eventually(30*time.Second, "a follower leads the shard", func() error {
		for _, f := range followers {
			if f.n.host.Ready(shardID) {
				next = f
				return nil
			}
		}
		return fmt.Errorf("no follower leads shard %d yet", shardID)
	})
	// Writes of the new term take the index of the old leader's entry.
	if _, err := next.n.Put(ctx, kv.PutRequest{Collection: "w", Key: []byte("other"), Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		t.Fatalf("the write was answered (%d, %v) before its old leader heard from the new one", r.version, r.err)
	default:
	}
	heal()
	var r result
	select {
	case r = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the write was not answered 30s after the partition healed")
	}
	got, err := next.n.Get(ctx, kv.GetRequest{Collection: "w", Key: []byte("k")})
	switch code := kv.CodeOf(r.err); {
	case r.err == nil:
		if err != nil || string(got.Value) != "lost" || got.Version != r.version {
			t.Fatalf("k reads %q at %d, %v; the write (retried) answered version %d", got.Value, got.Version, err, r.version)
		}
	case code == kv.CodeNotLeader || code == kv.CodeUnavailable:
		if err == nil {
			t.Fatalf("the write was refused (%v), yet k reads %q at %d", r.err, got.Value, got.Version)
		}
	default:
		t.Fatalf("the write ended %s, not in success or a refusal: %v", code, r.err)
	}
	t.Logf("the write: version %d, %v", r.version, r.err)
	if n := testutil.ToFloat64(old.n.metrics.repl.Orphans.WithLabelValues("not_applied")); n < 1 {
		t.Errorf("groupkv_raft_orphaned_proposals_total{outcome=\"not_applied\"} is %v on the old leader", n)
	}
}
