package node

import (
	"context"
	"fmt"
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
	// Every replica must know itself a voter: one that has not applied
	// its promotion yet cannot stand for election.
	c.eventually(30*time.Second, "every node sees three meta voters", func() error {
		for _, tn := range c.nodes {
			if cs, ok := tn.n.host.ConfState(cluster.MetaShardID); !ok || len(cs.Voters) != 3 {
				return fmt.Errorf("node %d sees %d meta voters", tn.id, len(cs.Voters))
			}
		}
		return nil
	})
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
