package node

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/storage"
)

// statusConsistency returns the Consistency of every shard in node n's
// cluster status.
func statusConsistency(t *testing.T, n *Node) map[uint64]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := n.ClusterStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[uint64]string{}
	for _, s := range st.Shards {
		out[s.Shard] = s.Consistency
	}
	return out
}

// createCheckedCollection creates collection "c" of two shards and three
// replicas through n and returns it with the ids of the shards a check
// covers: the meta shard and the collection's.
func createCheckedCollection(ctx context.Context, t *testing.T, n *Node) (*cluster.CollectionDesc, []uint64) {
	t.Helper()
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "c", Shards: 2, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	d, err := n.collection("c")
	if err != nil {
		t.Fatal(err)
	}
	shards := []uint64{cluster.MetaShardID}
	for _, s := range d.Shards {
		shards = append(shards, s.ID)
	}
	return d, shards
}

const mismatchMetric = "groupkv_replica_checksum_mismatches_total"

// TestConsistencyCheck checks the replicas of every shard of a three-node
// cluster after writes (ok, run from every node, shown in cluster status
// everywhere), then corrupts one follower's copy of a record behind raft's
// back and checks that the check names that replica, counts the mismatch
// and shows it in status; and that a check with a node cut off is
// incomplete.
func TestConsistencyCheck(t *testing.T) {
	c := startCluster(t, 3, func(o *Options) { o.ConsistencyInterval = -1 })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n1 := c.node(1).n
	d, shards := createCheckedCollection(ctx, t, n1)
	versions := map[string]uint64{}
	for i := 0; i < 40; i++ {
		key := fmt.Sprintf("k%02d", i)
		v, err := c.nodes[i%3].n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte(key), Value: []byte("v" + key), Tags: []string{"t"}})
		if err != nil {
			t.Fatal(err)
		}
		versions[key] = v
	}
	all := []uint64{1, 2, 3}

	// Every replica agrees, whichever node runs the check.
	for _, id := range shards {
		for _, tn := range c.nodes {
			res, err := tn.n.CheckShard(ctx, id)
			if err != nil {
				t.Fatalf("node %d: shard %d: %v", tn.id, id, err)
			}
			if res.Status != kv.ConsistencyOK || !slices.Equal(res.Replicas, all) || len(res.Sums) != 3 || res.Index == 0 || res.By != tn.id {
				t.Fatalf("node %d: shard %d: %+v, want ok from nodes 1-3", tn.id, id, res)
			}
		}
	}
	for _, tn := range c.nodes {
		got := statusConsistency(t, tn.n)
		for _, id := range shards {
			if got[id] != "ok" {
				t.Errorf("node %d: status of shard %d: consistency %q, want ok", tn.id, id, got[id])
			}
		}
		if v := gatherValue(t, tn.n.opts.Registry, mismatchMetric); v != 0 {
			t.Errorf("node %d: %s = %v before any corruption", tn.id, mismatchMetric, v)
		}
	}

	// Corrupt a follower's copy of a record of a shard.
	key := "k07"
	bucket, shardID := n1.route(d, []byte(key))
	leader := c.leader(shardID)
	var victim *testNode
	for _, tn := range c.nodes {
		if tn != leader {
			victim = tn
			break
		}
	}
	t.Logf("corrupting %q of shard %d on node %d (leader: node %d)", key, shardID, victim.id, leader.id)
	dk := storage.DataKey(nil, d.ID, []byte(key), versions[key])
	bad := storage.EncodeValue(nil, storage.MVCCValue{Bucket: bucket, Tags: []string{"t"}, Value: []byte("corrupted")})
	if err := victim.n.eng.DB.Set(dk, bad, pebble.Sync); err != nil {
		t.Fatal(err)
	}

	before := gatherValue(t, leader.n.opts.Registry, mismatchMetric)
	res, err := leader.n.CheckShard(ctx, shardID)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != kv.ConsistencyMismatch || !slices.Equal(res.Mismatched, []uint64{victim.id}) {
		t.Fatalf("after the corruption: %+v, want a mismatch of node %d", res, victim.id)
	}
	summary := res.Summary()
	if !strings.HasPrefix(summary, "mismatch: ") || !strings.Contains(summary, fmt.Sprintf("node %d differs", victim.id)) {
		t.Errorf("summary %q does not name node %d", summary, victim.id)
	}
	if after := gatherValue(t, leader.n.opts.Registry, mismatchMetric); after != before+1 {
		t.Errorf("%s on node %d went from %v to %v, want +1", mismatchMetric, leader.id, before, after)
	}
	for _, tn := range c.nodes {
		got := statusConsistency(t, tn.n)
		if got[shardID] != summary {
			t.Errorf("node %d: status of shard %d: consistency %q, want %q", tn.id, shardID, got[shardID], summary)
		}
		for _, id := range shards {
			if id != shardID && got[id] != "ok" {
				t.Errorf("node %d: status of shard %d: consistency %q, want ok", tn.id, id, got[id])
			}
		}
	}
	// From another node, too.
	res, err = victim.n.CheckShard(ctx, shardID)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != kv.ConsistencyMismatch || !slices.Equal(res.Mismatched, []uint64{victim.id}) {
		t.Fatalf("run on node %d: %+v, want a mismatch of node %d", victim.id, res, victim.id)
	}

	// A node cut off does not answer: incomplete.
	other := shards[0]
	if other == shardID {
		other = shards[1]
	}
	l := c.leader(other)
	var cut *testNode
	for _, tn := range c.nodes {
		if tn != l {
			cut = tn
			break
		}
	}
	c.net.isolate(cut.id)
	res, err = l.n.CheckShard(ctx, other)
	c.net.heal(cut.id)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != kv.ConsistencyIncomplete || !slices.Equal(res.Missing, []uint64{cut.id}) || len(res.Sums) != 2 {
		t.Fatalf("with node %d cut off: %+v, want incomplete", cut.id, res)
	}
	if got := statusConsistency(t, l.n)[other]; got != "incomplete" {
		t.Errorf("status of shard %d: consistency %q, want incomplete", other, got)
	}
}

// TestCheckConsistencyOfShards checks CheckConsistency, the on-demand
// check of several shards: every shard of the cluster in the order of its
// collection's name when none is named, the named ones in their order,
// refusals of unknown and repeated shards before anything runs, and a
// check that cannot be run (a node cut off from the others) answered as
// incomplete with the reason.
func TestCheckConsistencyOfShards(t *testing.T) {
	c := startCluster(t, 3, func(o *Options) { o.ConsistencyInterval = -1 })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n2 := c.node(2).n
	// "c" is created first, "b" second: the answer follows the names.
	_, cShards := createCheckedCollection(ctx, t, c.node(1).n)
	if _, err := n2.CreateCollection(ctx, kv.CollectionOptions{Name: "b", Shards: 1, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	b, err := n2.collection("b")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ {
		for _, coll := range []string{"b", "c"} {
			if _, err := c.nodes[i%3].n.Put(ctx, kv.PutRequest{Collection: coll, Key: []byte(fmt.Sprint("k", i)), Value: []byte("v")}); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := []uint64{cluster.MetaShardID, b.Shards[0].ID, cShards[1], cShards[2]}
	wantColl := []string{"", "b", "c", "c"}
	c.eventually(30*time.Second, "node 2 knows both collections", func() error {
		if ids, _ := n2.shardsByCollection(); !slices.Equal(ids, want) {
			return fmt.Errorf("shards %v, want %v", ids, want)
		}
		return nil
	})

	res, err := n2.CheckConsistency(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != len(want) {
		t.Fatalf("%d outcomes, want %d: %+v", len(res), len(want), res)
	}
	for i, r := range res {
		if r.Shard != want[i] || r.Collection != wantColl[i] || r.Status != kv.ConsistencyOK || len(r.Sums) != 3 || r.Index == 0 || r.By != 2 {
			t.Errorf("outcome %d: %+v, want shard %d of %q ok with 3 sums, run by node 2", i, r, want[i], wantColl[i])
		}
	}

	res, err = n2.CheckConsistency(ctx, []uint64{cShards[2], cluster.MetaShardID})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 2 || res[0].Shard != cShards[2] || res[1].Shard != cluster.MetaShardID || res[0].Collection != "c" ||
		res[0].Status != kv.ConsistencyOK || res[1].Status != kv.ConsistencyOK {
		t.Fatalf("named shards: %+v, want shard %d of c then the meta shard, both ok", res, cShards[2])
	}

	for _, tc := range []struct {
		shards []uint64
		code   kv.Code
		msg    string
	}{
		{[]uint64{cShards[1], 999}, kv.CodeNotFound, "shard 999 not found"},
		{[]uint64{cShards[1], cShards[1]}, kv.CodeInvalidArgument, "named twice"},
	} {
		before := gatherValue(t, n2.opts.Registry, "groupkv_replica_consistency_checks_total")
		_, err := n2.CheckConsistency(ctx, tc.shards)
		if err == nil {
			t.Errorf("shards %v: no error, want %s saying %q", tc.shards, tc.code, tc.msg)
		} else if e := kv.AsError(err); e.Code != tc.code || !strings.Contains(e.Message, tc.msg) {
			t.Errorf("shards %v: error %v, want %s saying %q", tc.shards, err, tc.code, tc.msg)
		}
		if after := gatherValue(t, n2.opts.Registry, "groupkv_replica_consistency_checks_total"); after != before {
			t.Errorf("shards %v: %v checks ran before the refusal", tc.shards, after-before)
		}
	}

	// Cut off, node 3 cannot get a check through raft: each shard's
	// outcome is incomplete and says why.
	c.net.isolate(3)
	defer c.net.heal(3)
	short, cancelShort := context.WithTimeout(ctx, 2*time.Second)
	defer cancelShort()
	res, err = c.node(3).n.CheckConsistency(short, []uint64{cShards[1], cShards[2]})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 2 {
		t.Fatalf("cut off: %+v, want 2 outcomes", res)
	}
	for i, r := range res {
		if r.Shard != cShards[1+i] || r.Status != kv.ConsistencyIncomplete || len(r.Errors) == 0 ||
			!strings.HasPrefix(r.Errors[0], "the check could not be run: ") || r.Collection != "c" {
			t.Errorf("cut off: outcome %d: %+v, want incomplete: the check could not be run", i, r)
		}
	}
}

// TestConsistencyPeriodic checks that the leader checks its shards every
// ConsistencyInterval without being asked.
func TestConsistencyPeriodic(t *testing.T) {
	c := startCluster(t, 1, func(o *Options) { o.ConsistencyInterval = 50 * time.Millisecond })
	n := c.node(1).n
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	info, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "c", Shards: 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte("k"), Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	c.eventually(30*time.Second, "every shard checked", func() error {
		got := statusConsistency(t, n)
		for _, id := range []uint64{cluster.MetaShardID, info.Shards[0].ID, info.Shards[1].ID} {
			if got[id] != "ok" {
				return fmt.Errorf("shard %d: consistency %q", id, got[id])
			}
		}
		return nil
	})
	if v := gatherValue(t, n.opts.Registry, "groupkv_replica_consistency_checks_total"); v < 3 {
		t.Errorf("%v checks counted", v)
	}
}

// TestConsistencyUnderWrites runs checks of every shard of a three-node
// cluster, from every node, while clients write: puts, deletes, batches
// across shards and range deletes, so that a checksum entry lands in apply
// batches that hold other writes before and after it, grouped differently
// on each replica, and the replicas sum slowly while more writes are
// applied. Every check must find the replicas equal.
func TestConsistencyUnderWrites(t *testing.T) {
	// Slow sums, so that the writes go on while a replica sums.
	c := startCluster(t, 3, func(o *Options) { o.ConsistencyInterval, o.ConsistencyRate = -1, 128<<10 })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, shards := createCheckedCollection(ctx, t, c.node(1).n)
	wctx, stopWriters := context.WithCancel(ctx)
	defer stopWriters()
	writers := make(chan error, 4)
	for w := 0; w < 4; w++ {
		go func(w int) {
			nd := c.nodes[w%3].n
			key := func(i int) []byte { return fmt.Appendf(nil, "k%03d", (i*7+w)%200) }
			var err error
			for i := 0; wctx.Err() == nil; i++ {
				switch i % 5 {
				case 0, 1:
					_, err = nd.Put(wctx, kv.PutRequest{Collection: "c", Key: key(i), Value: fmt.Appendf(nil, "v%d-%d", w, i), Tags: []string{"t"}})
				case 2:
					_, err = nd.Delete(wctx, kv.DeleteRequest{Collection: "c", Key: key(i)})
					if kv.CodeOf(err) == kv.CodeNotFound {
						err = nil
					}
				case 3:
					_, err = nd.BatchPut(wctx, []kv.PutItem{
						{Collection: "c", Key: key(i), Value: []byte("b")},
						{Collection: "c", Key: key(i + 1), Value: []byte("b")},
						{Collection: "c", Key: key(i + 2), Value: []byte("b")},
					})
				case 4:
					if i%25 == 4 {
						_, err = nd.DeleteRange(wctx, kv.DeleteRangeRequest{Collection: "c", Start: key(i), End: append(key(i), '~')})
					}
				}
				if err != nil && wctx.Err() == nil {
					writers <- fmt.Errorf("writer %d, op %d: %w", w, i, err)
					return
				}
			}
			writers <- nil
		}(w)
	}
	checks := 0
	for round := 0; round < 4; round++ {
		for _, id := range shards {
			tn := c.nodes[(round+int(id))%3]
			res, err := tn.n.CheckShard(ctx, id)
			if err != nil {
				t.Fatalf("node %d: shard %d: %v", tn.id, id, err)
			}
			if res.Status != kv.ConsistencyOK || len(res.Sums) != 3 {
				t.Fatalf("node %d: shard %d under writes: %+v, want ok from 3 replicas", tn.id, id, res)
			}
			checks++
		}
	}
	stopWriters()
	for w := 0; w < 4; w++ {
		if err := <-writers; err != nil {
			t.Error(err)
		}
	}
	t.Logf("%d checks agreed under writes", checks)
}
