package node

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/elle"
	"github.com/groupkv/groupkv/internal/kv"
)

// TestGroupListAppendStrictSerializable runs list-append transactions on
// three nodes over eight keys, four of them held by a Key Group: group
// transactions append to the group's keys, general serializable ones to
// the others, and read-only transactions read any of them, the group's
// keys at their timestamps in their own shards (where each group write is
// stored at the version its group committed it, once shipped), while the
// leaderships of the group's leader shard and of the members' shards
// move. The history of every attempt must be strictly serializable;
// after the group's deletion, every key must hold every committed append.
func TestGroupListAppendStrictSerializable(t *testing.T) {
	seed := clusterSeed(t)
	t.Logf("seed %d (GROUPKV_SEED=%d replays the clients' and the faults' choices)", seed, seed)
	c := startCluster(t, 3, func(o *Options) { o.TxnTimeout = 2 * time.Second })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c.createTxnCollections(ctx)
	keys := txnKeys(8)
	grouped, plain := []elleKey{}, []elleKey{}
	var members []kv.KeyRef
	for i, k := range keys {
		if i%2 == 0 {
			grouped = append(grouped, k)
			members = append(members, k.ref())
		} else {
			plain = append(plain, k)
		}
	}
	n1 := c.node(1).n
	c.eventually(60*time.Second, "the group is created", func() error {
		_, err := n1.CreateGroup(ctx, kv.GroupSpec{ID: "g", Leader: kv.KeyRef{Collection: "r", Key: []byte("lead")}, Members: members})
		return err
	})

	pool, rec := newNodePool(c), &elle.Recorder{}
	workloads := []*appendWorkload{
		{pool: pool, rec: rec, keys: grouped, maxOps: 4, group: "g", txnTimeout: 30 * time.Second},
		{pool: pool, rec: rec, keys: plain, maxOps: 4, txnTimeout: 30 * time.Second},
		{pool: pool, rec: rec, keys: keys, readOnlyEvery: 1, txnTimeout: 30 * time.Second},
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	for cl := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			workloads[cl%3].run(ctx, cl, rand.New(rand.NewPCG(seed, uint64(cl))), &stop)
		}()
	}
	frng := rand.New(rand.NewPCG(seed, 1000))
	shards := append(c.shardIDs("h", "r"), c.shardIDs("r")...) // the group's leader shard ("r", "lead") twice as likely
	for range 6 {
		time.Sleep(700 * time.Millisecond)
		id := shards[frng.IntN(len(shards))]
		if from, to := c.transferLeader(id, frng); from != 0 {
			t.Logf("moving the leadership of shard %d from node %d to node %d", id, from, to)
		}
	}
	time.Sleep(500 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	for _, w := range workloads {
		if errp := w.firstErr.Load(); errp != nil {
			t.Fatalf("seed %d: %v", seed, *errp)
		}
		t.Logf("seed %d: %s", seed, w.summary())
	}
	if workloads[0].committed.Load() < 10 || workloads[1].committed.Load() < 10 || workloads[2].readOnlyCommitted.Load() < 10 {
		t.Errorf("seed %d: too few transactions committed to check anything", seed)
	}
	c.eventually(60*time.Second, "the group is deleted", func() error { return n1.DeleteGroup(ctx, "g") })
	all := workloads[2] // its keys are all of them, and the history is shared
	all.finalRead(t, c, c.node(2).n, seed)
	all.check(t, seed)
}
