package node

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/groupkv/groupkv/internal/kv"
)

// leaderLoss is a three-node cluster with collection "w" of one shard,
// whose leader (old) is being cut off from its followers.
type leaderLoss struct {
	c         *testCluster
	shardID   uint64
	old       *testNode
	followers []*testNode
	healed    bool
}

type putResult struct {
	version uint64
	err     error
}

// startLeaderLoss makes the cluster and cuts the shard's raft messages
// from the followers to the leader, and with both, from the leader too.
func startLeaderLoss(t *testing.T, both bool) *leaderLoss {
	c := startCluster(t, 3, nil)
	ctx := context.Background()
	if _, err := c.node(1).n.CreateCollection(ctx, kv.CollectionOptions{Name: "w", Shards: 1, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	l := &leaderLoss{c: c, shardID: c.shardIDs("w")[0]}
	c.eventually(30*time.Second, "a first write", func() error {
		_, err := c.node(1).n.Put(ctx, kv.PutRequest{Collection: "w", Key: []byte("first"), Value: []byte("v")})
		return err
	})
	l.old = c.leader(l.shardID)
	for _, tn := range c.nodes {
		if tn != l.old {
			l.followers = append(l.followers, tn)
		}
		if tn != l.old || both {
			tn.n.knobs.cutShard.Store(&shardCut{shard: l.shardID, node: l.old.id})
		}
	}
	t.Cleanup(l.heal)
	return l
}

func (l *leaderLoss) heal() {
	if !l.healed {
		l.healed = true
		for _, tn := range l.c.nodes {
			tn.n.knobs.cutShard.Store(nil)
		}
	}
}

// putOnOld puts key=value through the old leader's node.
func (l *leaderLoss) putOnOld(key, value string) <-chan putResult {
	done := make(chan putResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		v, err := l.old.n.Put(ctx, kv.PutRequest{Collection: "w", Key: []byte(key), Value: []byte(value)})
		done <- putResult{v, err}
	}()
	return done
}

// newLeader waits for a follower to lead the shard and returns it.
func (l *leaderLoss) newLeader() *testNode {
	var next *testNode
	l.c.eventually(30*time.Second, "a follower leads the shard", func() error {
		for _, f := range l.followers {
			if f.n.host.Ready(l.shardID) {
				next = f
				return nil
			}
		}
		return fmt.Errorf("no follower leads shard %d yet", l.shardID)
	})
	return next
}

// healAndWait checks that the put was not answered while the old leader
// was cut off, heals, and waits for the put's answer.
func (l *leaderLoss) healAndWait(t *testing.T, done <-chan putResult) putResult {
	t.Helper()
	select {
	case r := <-done:
		t.Fatalf("the write was answered (%d, %v) before its old leader heard from the new one", r.version, r.err)
	default:
	}
	l.heal()
	select {
	case r := <-done:
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("the write was not answered 30s after the partition healed")
		return putResult{}
	}
}

// TestClusterWriteOutlivesItsLeader proposes a write on a shard's leader
// that hears nothing from its followers (its messages reach them, theirs
// are dropped): the followers persist the entry, the leader cannot commit
// it and steps down (check quorum), and a follower elected in its place
// commits it. Once the old leader hears from the new one again it applies
// the entry and answers the write: it succeeded, it is not in doubt
// (commit_unknown).
func TestClusterWriteOutlivesItsLeader(t *testing.T) {
	l := startLeaderLoss(t, false)
	done := l.putOnOld("k", "after")
	next := l.newLeader()
	t.Logf("node %d led shard %d, node %d leads it now", l.old.id, l.shardID, next.id)
	r := l.healAndWait(t, done)
	if r.err != nil {
		t.Fatalf("the write failed (%s): %v", kv.CodeOf(r.err), r.err)
	}
	got, err := next.n.Get(context.Background(), kv.GetRequest{Collection: "w", Key: []byte("k")})
	if err != nil || string(got.Value) != "after" || got.Version != r.version {
		t.Fatalf("k reads %q at %d, %v; the write answered version %d", got.Value, got.Version, err, r.version)
	}
	if n := testutil.ToFloat64(l.old.n.metrics.repl.Orphans.WithLabelValues("applied")); n < 1 {
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
	ctx := context.Background()
	l := startLeaderLoss(t, true)
	done := l.putOnOld("k", "lost")
	next := l.newLeader()
	// Writes of the new term take the index of the old leader's entry.
	if _, err := next.n.Put(ctx, kv.PutRequest{Collection: "w", Key: []byte("other"), Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	r := l.healAndWait(t, done)
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
	if n := testutil.ToFloat64(l.old.n.metrics.repl.Orphans.WithLabelValues("not_applied")); n < 1 {
		t.Errorf("groupkv_raft_orphaned_proposals_total{outcome=\"not_applied\"} is %v on the old leader", n)
	}
}

// TestClusterWriteLostLateIsRetried is TestClusterWriteLostWithItsLeader
// with the partition healed later than the window in which a write looks
// for a leader (30 ticks from its first attempt), though before its
// orphaned entry is given up (5 election timeouts after the old leader
// stepped down): the write's attempt waited on its entry all that time,
// and once the entry is known replaced the write is retried, not
// refused.
func TestClusterWriteLostLateIsRetried(t *testing.T) {
	l := startLeaderLoss(t, true)
	start := time.Now()
	done := l.putOnOld("k", "late")
	next := l.newLeader()
	if _, err := next.n.Put(context.Background(), kv.PutRequest{Collection: "w", Key: []byte("other"), Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	tick := l.old.n.opts.TickInterval
	time.Sleep(time.Until(start.Add(40 * tick)))
	r := l.healAndWait(t, done)
	if r.err != nil {
		t.Fatalf("the write failed (%s) though its entry was known not applied: %v", kv.CodeOf(r.err), r.err)
	}
	got, err := next.n.Get(context.Background(), kv.GetRequest{Collection: "w", Key: []byte("k")})
	if err != nil || string(got.Value) != "late" || got.Version != r.version {
		t.Fatalf("k reads %q at %d, %v; the write answered version %d", got.Value, got.Version, err, r.version)
	}
	if n := testutil.ToFloat64(l.old.n.metrics.repl.Orphans.WithLabelValues("not_applied")); n < 1 {
		t.Errorf("groupkv_raft_orphaned_proposals_total{outcome=\"not_applied\"} is %v on the old leader", n)
	}
}
