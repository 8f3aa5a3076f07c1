package node

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
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

// TestForwardedToFrozenLeader: a shard's leader stops answering with its
// connections open (as a stopped process), and the other two elect
// another. A write, a linearizable read, a transaction, a Key Group's
// description, a group transaction's commit, a group's deletion and a
// group's creation, each sent through a follower as the leader stops, end soon after the election instead of
// waiting for the stopped node until the request's deadline. (The
// deadline is generous: it only catches a wait for the stopped node.)
func TestForwardedToFrozenLeader(t *testing.T) {
	c := startCluster(t, 3, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d := c.txnCollectionH(ctx)
	shardID := d.Shards[0].ID
	// The shard's leader must not run the timestamp oracle, which has its
	// own bound (each round moves it away).
	c.waitVoters(3, cluster.MetaShardID, shardID)
	rng := rand.New(rand.NewPCG(clusterSeed(t), 0))
	key := c.keyIn(d, shardID, "k")
	if _, err := c.node(1).n.Put(ctx, kv.PutRequest{Collection: "h", Key: key, Value: []byte("0")}); err != nil {
		t.Fatal(err)
	}
	// Each round stops the shard's leader and runs one operation through
	// a follower at once, while it still takes the stopped node for the
	// leader.
	round := func(what string, unknownOK bool, before func(via *testNode), f func(ctx context.Context, via *testNode) error) {
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
		if before != nil {
			before(via)
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
	round("a put", true, nil, func(ctx context.Context, via *testNode) error {
		_, err := via.n.Put(ctx, kv.PutRequest{Collection: "h", Key: key, Value: []byte("1")})
		return err
	})
	round("a get", false, nil, func(ctx context.Context, via *testNode) error {
		_, err := via.n.Get(ctx, kv.GetRequest{Collection: "h", Key: key})
		return err
	})
	round("a transaction", false, nil, func(ctx context.Context, via *testNode) error {
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
	// A Key Group led by a key of the shard: its description is read on
	// the shard's leader.
	member := c.keyIn(d, d.Shards[1].ID, "m")
	c.eventually(30*time.Second, "the group is created", func() error {
		_, err := c.node(1).n.CreateGroup(ctx, kv.GroupSpec{ID: "g", Leader: kv.KeyRef{Collection: "h", Key: key},
			Members: []kv.KeyRef{{Collection: "h", Key: member}}})
		return err
	})
	round("a group's description", false, nil, func(ctx context.Context, via *testNode) error {
		info, err := via.n.DescribeGroup(ctx, "g")
		if err == nil && len(info.Members) == 0 {
			return fmt.Errorf("described with no members: %+v", info)
		}
		return err
	})
	// A group transaction's commit runs on the group's leader: the one
	// sent there as it stops may have applied, so it answers its version
	// or commit_unknown, never a retry's verdict.
	var attempt string
	round("a group transaction's commit", true, func(via *testNode) {
		c.eventually(30*time.Second, "a group transaction writes", func() error {
			var err error
			if attempt, err = via.n.BeginGroupTxn(ctx, "g", kv.TxnOptions{}); err != nil {
				return err
			}
			if _, _, err := via.n.TxnGet(ctx, attempt, kv.KeyRef{Collection: "h", Key: member}); err != nil {
				return err
			}
			return via.n.TxnPut(ctx, attempt, kv.PutItem{Collection: "h", Key: member, Value: []byte("in group")})
		})
	}, func(ctx context.Context, via *testNode) error {
		_, err := via.n.CommitTxn(ctx, attempt)
		return err
	})
	// A group's deletion and creation run on the leader of its leader
	// key's shard too; asked again of the new leader, each finishes.
	round("a group's deletion", false, nil, func(ctx context.Context, via *testNode) error {
		return via.n.DeleteGroup(ctx, "g")
	})
	round("a group's creation", false, nil, func(ctx context.Context, via *testNode) error {
		created, err := via.n.CreateGroup(ctx, kv.GroupSpec{ID: "g2", Leader: kv.KeyRef{Collection: "h", Key: key},
			Members: []kv.KeyRef{{Collection: "h", Key: member}}})
		if err == nil && len(created.Refused) > 0 {
			return fmt.Errorf("created with keys refused: %+v", created)
		}
		return err
	})
	if _, err := c.node(1).n.DescribeGroup(ctx, "g"); kv.CodeOf(err) != kv.CodeNotFound {
		t.Fatalf("group g after its deletion: %v, want not_found", err)
	}
	info, err := c.node(1).n.DescribeGroup(ctx, "g2")
	if err != nil || len(info.Members) == 0 {
		t.Fatalf("group g2 after its creation: %+v, %v", info, err)
	}
}

// TestForwardedToFrozenNodeWithoutReplica: a node holding no replica of a
// shard sends its reads and writes to a node that does; when that node
// stops answering with its connections open, each request still ends soon
// (served through another replica, commit_unknown for a write that may
// have reached the stopped node, or unavailable) instead of at its
// deadline. The node has no replica to learn of a new leader from: it
// pings the one it waits for over a connection of its own.
func TestForwardedToFrozenNodeWithoutReplica(t *testing.T) {
	c := startCluster(t, 4, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d := c.txnCollectionH(ctx)
	c.waitVoters(3, cluster.MetaShardID)
	c.waitVoters(3, c.shardIDs("h")...)
	// A shard with a node, via, that holds no replica of it. The node
	// frozen is the one via sends a read of the shard to first
	// (readTarget); it does not run the timestamp oracle.
	var (
		shardID     uint64
		via, frozen *testNode
	)
	oracle := c.leader(cluster.MetaShardID)
	without := c.withoutReplica(d)
	for _, s := range d.Shards {
		for _, tn := range without[s.ID] {
			if f := c.node(tn.n.shardNodes(s.ID)[0]); f != oracle {
				shardID, via, frozen = s.ID, tn, f
			}
		}
		if via != nil {
			break
		}
	}
	if via == nil {
		t.Fatalf("no shard of %v has a node without a replica and a first holder other than the oracle's node %d", d.Shards, oracle.id)
	}
	key := c.keyIn(d, shardID, "k")
	if _, err := via.n.Put(ctx, kv.PutRequest{Collection: "h", Key: key, Value: []byte("before")}); err != nil {
		t.Fatal(err)
	}
	t.Logf("freezing node %d (shard %d's leader: %v); reading and writing through node %d, which holds no replica of it",
		frozen.id, shardID, c.leader(shardID) == frozen, via.id)
	c.net.freeze(frozen.id)
	defer c.net.thaw()
	// Reads: the first goes to the stopped node.
	for i := 0; ; i++ {
		octx, ocancel := context.WithTimeout(ctx, 20*time.Second)
		start := time.Now()
		r, err := via.n.Get(octx, kv.GetRequest{Collection: "h", Key: key})
		t.Logf("get %d: %q, %v after %v", i, r.Value, err, time.Since(start).Round(time.Millisecond))
		if octx.Err() != nil {
			ocancel()
			t.Fatalf("get %d waited for the stopped node until its deadline: %v", i, err)
		}
		ocancel()
		if err == nil {
			if string(r.Value) != "before" {
				t.Fatalf("get %d read %q, want %q", i, r.Value, "before")
			}
			break
		}
		if code := kv.CodeOf(err); code != kv.CodeUnavailable && code != kv.CodeNotLeader || i == 7 {
			t.Fatalf("get %d: %v", i, err)
		}
	}
	// The values the key may hold after the puts: the last acknowledged
	// one's and those of puts answered commit_unknown after it.
	may := []string{"before"}
	// Each write goes to a replica's node picked at random, one not found
	// silent lately first: forgotten here, the stopped one is as likely
	// as the others until a put finds it silent again.
	via.n.silent.mu.Lock()
	clear(via.n.silent.at)
	via.n.silent.mu.Unlock()
	for i := range 8 {
		octx, ocancel := context.WithTimeout(ctx, 20*time.Second)
		start := time.Now()
		v := fmt.Sprint(i)
		_, err := via.n.Put(octx, kv.PutRequest{Collection: "h", Key: key, Value: []byte(v)})
		t.Logf("put %d: %v after %v", i, err, time.Since(start).Round(time.Millisecond))
		switch {
		case octx.Err() != nil:
			t.Fatalf("put %d waited for the stopped node until its deadline: %v", i, err)
		case err == nil:
			may = []string{v}
		case kv.CodeOf(err) == kv.CodeCommitUnknown:
			may = append(may, v)
		default:
			t.Fatalf("put %d: %v", i, err)
		}
		ocancel()
	}
	r, err := via.n.Get(ctx, kv.GetRequest{Collection: "h", Key: key})
	if err != nil {
		t.Fatalf("get after the puts: %v", err)
	}
	// A put answered commit_unknown before the last acknowledged one
	// applies before it, if at all (a new leader commits its
	// predecessors' entries first); none lands after it while the node
	// stays stopped.
	if !slices.Contains(may, string(r.Value)) {
		t.Fatalf("read %q; the key may hold only one of %q", r.Value, may)
	}
}

// TestCreateCollectionWithFrozenNode: a collection created while a node
// stands stopped with its connections open (before the others noticed)
// is answered once its shards elected leaders: the creating node asks the
// nodes holding each shard it has no replica of for a leader, and does
// not wait on the stopped one.
func TestCreateCollectionWithFrozenNode(t *testing.T) {
	c := startCluster(t, 4, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c.waitVoters(3, cluster.MetaShardID)
	oracle := c.leader(cluster.MetaShardID)
	var via, frozen *testNode
	for _, tn := range c.nodes {
		switch {
		case tn == oracle:
		case via == nil:
			via = tn
		case frozen == nil:
			frozen = tn
		}
	}
	t.Logf("freezing node %d; creating through node %d (the oracle's node is %d)", frozen.id, via.id, oracle.id)
	c.net.freeze(frozen.id)
	defer c.net.thaw()
	octx, ocancel := context.WithTimeout(ctx, 30*time.Second)
	defer ocancel()
	start := time.Now()
	info, err := via.n.CreateCollection(octx, kv.CollectionOptions{Name: "p", Partitioning: kv.PartitionHash, Shards: 8})
	t.Logf("created: %v after %v", err, time.Since(start).Round(time.Millisecond))
	if octx.Err() != nil {
		t.Fatalf("the creation waited for the stopped node until its deadline: %v", err)
	}
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if len(info.Shards) != 8 {
		t.Fatalf("created with %d shards, want 8", len(info.Shards))
	}
}

// TestWatchForwardedToFrozenNode: a watch through a node without a
// replica of the watched shard runs on a node that holds one; that node
// stops answering with its connections open (as a stopped process). The
// watch goes on from another holder, after the last change it delivered:
// a write made after the stop is delivered, nothing is delivered twice,
// and the watch does not end. (The deadline is generous: it only catches
// a watch left waiting for the stopped node.)
func TestWatchForwardedToFrozenNode(t *testing.T) {
	c := startCluster(t, 4, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := c.node(1).n.CreateCollection(ctx, kv.CollectionOptions{Name: "w", Shards: 1, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	d, err := c.node(1).n.collection("w")
	if err != nil {
		t.Fatal(err)
	}
	shardID := d.Shards[0].ID
	c.waitVoters(3, shardID)
	via := c.withoutReplica(d)[shardID][0]
	c.eventually(30*time.Second, "the node without a replica knows the shard's holders", func() error {
		if got := via.n.shardNodes(shardID); len(got) != 3 {
			return fmt.Errorf("node %d knows holders %v", via.id, got)
		}
		return nil
	})
	// The watch runs on the first holder via knows (readTarget); it must
	// not run the timestamp oracle, which has its own failover.
	target := c.node(via.n.shardNodes(shardID)[0])
	c.eventually(30*time.Second, "another node than the watch's runs the oracle", func() error {
		if c.leader(cluster.MetaShardID) != target {
			return nil
		}
		cs, _ := target.n.host.ConfState(cluster.MetaShardID)
		self := target.n.host.Leader(cluster.MetaShardID)
		for _, v := range cs.Voters {
			if v != self {
				target.n.host.TransferLeadership(cluster.MetaShardID, v)
				break
			}
		}
		return fmt.Errorf("node %d leads the meta shard", target.id)
	})
	var writer *testNode
	for _, tn := range c.nodes {
		if tn != via && tn != target {
			writer = tn
		}
	}
	put := func(key, value string) {
		t.Helper()
		c.eventually(30*time.Second, "put "+key, func() error {
			_, err := writer.n.Put(ctx, kv.PutRequest{Collection: "w", Key: []byte(key), Value: []byte(value)})
			return err
		})
	}
	put("k0", "0")
	w := startTestWatch(t, ctx, via.n, kv.WatchRequest{Collection: "w"})
	next := func(key string) { t.Helper(); w.next(key, 20*time.Second) }
	next("k0")
	t.Logf("freezing node %d, which serves the watch through node %d; writing through node %d", target.id, via.id, writer.id)
	c.net.freeze(target.id)
	defer c.net.thaw()
	start := time.Now()
	put("k1", "1")
	next("k1")
	t.Logf("k1 delivered %v after the freeze", time.Since(start).Round(time.Millisecond))
	put("k2", "2")
	next("k2")
}
