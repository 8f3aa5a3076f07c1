package node

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/shard"
	"github.com/groupkv/groupkv/internal/txn"
)

// TestTxnPreparedAcrossSplit: a transaction prepared in a shard that
// splits before its intents are resolved. The coordinator resolves in the
// shard it prepared in; the intent now in the child is resolved too, and
// the committed write is visible there.
func TestTxnPreparedAcrossSplit(t *testing.T) {
	c := startCluster(t, 1, unsweptOptions)
	n := c.node(1).n
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, o := range []kv.CollectionOptions{{Name: "r", Partitioning: kv.PartitionRange}, {Name: "o", Partitioning: kv.PartitionRange}} {
		if _, err := n.CreateCollection(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	d, _ := n.collection("r")
	parent := d.Shards[0].ID
	// Two participants (two collections): a two-phase commit, whose
	// resolves the coordinator leaves undone here.
	id, rec := commitUnresolved(ctx, t, n, "r", []string{"a", "m"}, kv.PutItem{Collection: "o", Key: []byte("x"), Value: []byte("vx")})
	info, err := n.SplitShard(ctx, "r", []byte("k"), 0)
	if err != nil {
		t.Fatal(err)
	}
	child := info.Shards[1].ID
	t.Logf("shard %d split into %d at k", parent, child)
	// The child holds the transaction prepared, with the write it owns.
	var inherited []txn.Target
	if err := shard.EachPrepared(n.eng.DB, child, func(m txn.Meta, _ uint64, w, _ []txn.Target) error {
		if m.ID == id {
			inherited = w
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(inherited) != 1 || string(inherited[0].Key) != "m" || n.host.MinPrepared(child) == 0 {
		t.Fatalf("the child holds %v prepared (min prepared %d), want m", inherited, n.host.MinPrepared(child))
	}
	// The coordinator's resolve, to the shard it prepared in.
	res := shard.TxnResult{ID: id, Status: txn.Committed, CommitTS: rec.CommitTS}
	if err := n.resolvePrepared(ctx, parent, id, res); err != nil {
		t.Fatal(err)
	}
	// The other participant resolves too; the record stays while the
	// child holds the transaction prepared.
	od, _ := n.collection("o")
	if err := n.resolvePrepared(ctx, od.Shards[0].ID, id, res); err != nil {
		t.Fatal(err)
	}
	sweep := func() bool { return sweptRecordStays(t, n, id, anchorCollection(ctx, t, n).ID) }
	if !sweep() {
		t.Fatal("the record was removed while the split child held the transaction prepared")
	}
	for _, k := range []string{"a", "m"} {
		r, err := n.Get(ctx, kv.GetRequest{Collection: "r", Key: []byte(k)})
		if err != nil || string(r.Value) != "v"+k {
			t.Errorf("%s after the split and the resolve: %q %v, want v%s", k, r.Value, err, k)
		}
	}
	// The read settled the child's intent, and its prepare with it.
	if sweep() {
		t.Fatal("the record stays once no shard holds the transaction prepared")
	}
}

// TestTxnPreparedAcrossRestart: a committed transaction whose intents are
// not resolved when its node stops (the coordinator with it). After the
// restart the shards hold the prepares again: reads settle the intents
// from the record, and the committed writes are visible.
func TestTxnPreparedAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	var opts Options
	unsweptOptions(&opts)
	n := openTest(t, dir, opts)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	defer func() { n.Close() }()
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "h", Partitioning: kv.PartitionHash, Shards: 2}); err != nil {
		t.Fatal(err)
	}
	d, _ := n.collection("h")
	keys := keysInTwoShards(t, n, "h")
	commitUnresolved(ctx, t, n, "h", keys)
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	n = openTest(t, dir, opts)
	for _, s := range d.Shards {
		if n.host.MinPrepared(s.ID) == 0 {
			t.Errorf("shard %d holds no prepared transaction after the restart", s.ID)
		}
	}
	for _, k := range keys {
		r, err := n.Get(ctx, kv.GetRequest{Collection: "h", Key: []byte(k)})
		if err != nil || string(r.Value) != "v"+k {
			t.Errorf("%s after the restart: %q %v, want v%s", k, r.Value, err, k)
		}
	}
}

// unsweptOptions are the options of a node on which no background sweep
// of records or settlement of prepares acts while a test does: a long
// retention, timeout and duration.
func unsweptOptions(o *Options) {
	o.Logger, o.TickInterval = quietLogger(), 20*time.Millisecond
	o.TxnRecordRetention, o.TxnTimeout, o.MaxTxnDuration = time.Hour, time.Minute, time.Minute
}

// keysInTwoShards returns two keys of collection coll that live in two
// shards.
func keysInTwoShards(t *testing.T, n *Node, coll string) []string {
	t.Helper()
	d, err := n.collection(coll)
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{"k0"}
	_, first := n.route(d, []byte("k0"))
	for i := 1; len(keys) < 2; i++ {
		k := fmt.Sprintf("k%d", i)
		if _, s := n.route(d, []byte(k)); s != first {
			keys = append(keys, k)
		}
	}
	return keys
}

// commitUnresolved commits, on n, one transaction writing "v"+key to each
// of keys of collection coll (of others) and leaves its intents unresolved
// and its record unmarked, as a coordinator that stopped right after the
// commit point would. The record is anchored in a collection of its own
// (anchorCollection), whose shard commits as the last participant: every
// shard of coll and of others holds the transaction prepared. It returns
// the attempt's id and record.
func commitUnresolved(ctx context.Context, t *testing.T, n *Node, coll string, keys []string, others ...kv.PutItem) (string, txn.Record) {
	t.Helper()
	ad := anchorCollection(ctx, t, n)
	n.knobs.skipResolves.Store(true)
	defer n.knobs.skipResolves.Store(false)
	items := []kv.PutItem{{Collection: ad.Name, Key: []byte("anchor"), Value: []byte("v")}} // first: the record is anchored there
	for _, k := range keys {
		items = append(items, kv.PutItem{Collection: coll, Key: []byte(k), Value: []byte("v" + k)})
	}
	items = append(items, others...)
	if _, _, err := transact(ctx, n, kv.TxnOptions{}, func(id string) error {
		for _, it := range items {
			if err := n.TxnPut(ctx, id, it); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var id string
	var rec txn.Record
	// In a cluster, n's replica of the record's shard may apply the
	// commit a little after its leader answered.
	for deadline := time.Now().Add(30 * time.Second); id == ""; time.Sleep(10 * time.Millisecond) {
		eachTxnRecord(t, n, ad.ID, func(i string, r txn.Record) {
			if r.Status == txn.Committed && r.ForgetAfter == 0 {
				id, rec = i, r
			}
		})
		if id == "" && time.Now().After(deadline) {
			t.Fatalf("no committed record in %q\n%s", ad.Name, describeTxnRecords(t, n, ad.ID))
		}
	}
	return id, rec
}

// anchorCollection is the collection, one shard, that commitUnresolved
// anchors records in; it creates it on first use.
func anchorCollection(ctx context.Context, t *testing.T, n *Node) *cluster.CollectionDesc {
	t.Helper()
	const name = "txn-anchor"
	if d, err := n.collection(name); err == nil {
		return d
	}
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: name, Partitioning: kv.PartitionRange}); err != nil {
		t.Fatal(err)
	}
	d, err := n.collection(name)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestTxnPreparedAcrossMerge: a transaction prepared in two shards that
// merge before its intents are resolved. The merged shard takes the right
// shard's prepared entry over (one entry with both shards' writes), and
// the committed writes are visible.
func TestTxnPreparedAcrossMerge(t *testing.T) {
	c := startCluster(t, 1, unsweptOptions)
	n := c.node(1).n
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "r", Partitioning: kv.PartitionRange, SplitPoints: [][]byte{[]byte("k")}}); err != nil {
		t.Fatal(err)
	}
	d, _ := n.collection("r")
	left, right := d.Shards[0].ID, d.Shards[1].ID
	id, _ := commitUnresolved(ctx, t, n, "r", []string{"a", "m"})
	if _, err := n.MergeShards(ctx, "r", left); err != nil {
		t.Fatal(err)
	}
	var writes []string
	if err := shard.EachPrepared(n.eng.DB, left, func(m txn.Meta, _ uint64, w, _ []txn.Target) error {
		if m.ID == id {
			for _, x := range w {
				writes = append(writes, string(x.Key))
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(writes)
	if !slices.Equal(writes, []string{"a", "m"}) || n.host.MinPrepared(left) == 0 {
		t.Fatalf("shard %d holds %v of the transaction prepared after taking in shard %d (min prepared %d), want [a m]", left, writes, right, n.host.MinPrepared(left))
	}
	// The record lists both shards as its participants; the right one is
	// gone, its prepare the left one's: the record stays while the left
	// one holds the transaction prepared, and goes once it does not.
	sweep := func() bool { return sweptRecordStays(t, n, id, anchorCollection(ctx, t, n).ID) }
	if !sweep() {
		t.Fatal("the record was removed while the merged shard held the transaction prepared")
	}
	for _, k := range []string{"a", "m"} {
		r, err := n.Get(ctx, kv.GetRequest{Collection: "r", Key: []byte(k)})
		if err != nil || string(r.Value) != "v"+k {
			t.Errorf("%s after the merge: %q %v, want v%s", k, r.Value, err, k)
		}
	}
	// The reads settled the intents, and the prepare with them.
	if sweep() {
		t.Fatalf("the record of a transaction no shard holds prepared stays: its participant %d was merged away", right)
	}
}

// sweptRecordStays runs the sweep of unmarked records, every record old
// enough, on every shard n leads, and reports whether the record of
// transaction id is still in one of collections colls.
func sweptRecordStays(t *testing.T, n *Node, id string, colls ...uint32) bool {
	t.Helper()
	n.eachLed(func(sid uint64, _ *shard.Shard) {
		if sd, ok := n.host.Desc(sid); ok {
			n.sweepUnmarkedBefore(sid, sd, math.MaxUint64, 0)
		}
	})
	found := false
	for _, c := range colls {
		eachTxnRecord(t, n, c, func(i string, _ txn.Record) { found = found || i == id })
	}
	return found
}
