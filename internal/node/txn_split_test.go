package node

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/shard"
	"github.com/groupkv/groupkv/internal/txn"
)

// TestTxnPreparedAcrossSplit: a transaction prepared in a shard that
// splits before its intents are resolved. The coordinator resolves in the
// shard it prepared in; the intent now in the child is resolved too, and
// the committed write is visible there.
func TestTxnPreparedAcrossSplit(t *testing.T) {
	c := startCluster(t, 1, func(o *Options) {
		o.TxnRecordRetention, o.TxnTimeout, o.MaxTxnDuration = time.Hour, time.Minute, time.Minute
	})
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
	n.knobs.skipResolves.Store(true)
	if _, _, err := transact(ctx, n, kv.TxnOptions{}, func(id string) error {
		for _, w := range []kv.PutItem{{Collection: "r", Key: []byte("a"), Value: []byte("va")}, {Collection: "r", Key: []byte("m"), Value: []byte("vm")}, {Collection: "o", Key: []byte("x"), Value: []byte("vx")}} {
			if err := n.TxnPut(ctx, id, w); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	n.knobs.skipResolves.Store(false)
	var id string
	var rec txn.Record
	eachTxnRecord(t, n, d.ID, func(i string, r txn.Record) { id, rec = i, r })
	if id == "" {
		od, _ := n.collection("o")
		eachTxnRecord(t, n, od.ID, func(i string, r txn.Record) { id, rec = i, r })
	}
	if rec.Status != txn.Committed {
		t.Fatalf("record %s: %+v, want COMMITTED", id, rec)
	}
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
	sweep := func() bool {
		t.Helper()
		n.eachLed(func(sid uint64, _ *shard.Shard) {
			if sd, ok := n.host.Desc(sid); ok {
				n.sweepUnmarkedBefore(sid, sd, math.MaxUint64, 0)
			}
		})
		found := false
		for _, c := range []uint32{d.ID, od.ID} {
			eachTxnRecord(t, n, c, func(i string, _ txn.Record) { found = found || i == id })
		}
		return found
	}
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
	opts := Options{Logger: quietLogger(), TickInterval: 20 * time.Millisecond,
		TxnRecordRetention: time.Hour, TxnTimeout: time.Minute, MaxTxnDuration: time.Minute}
	n := openTest(t, dir, opts)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	defer func() { n.Close() }()
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "h", Partitioning: kv.PartitionHash, Shards: 2}); err != nil {
		t.Fatal(err)
	}
	d, _ := n.collection("h")
	keys := commitUnresolved(ctx, t, n, "h")
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

// commitUnresolved commits, on n, one transaction writing "v"+key to two
// keys of hash collection coll that live in two shards, and leaves its
// intents unresolved and its record unmarked, as a coordinator that
// stopped right after the commit point would. It returns the keys.
func commitUnresolved(ctx context.Context, t *testing.T, n *Node, coll string) []string {
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
	n.knobs.skipResolves.Store(true)
	defer n.knobs.skipResolves.Store(false)
	if _, _, err := transact(ctx, n, kv.TxnOptions{}, func(id string) error {
		for _, k := range keys {
			if err := n.TxnPut(ctx, id, kv.PutItem{Collection: coll, Key: []byte(k), Value: []byte("v" + k)}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return keys
}

// TestTxnPreparedAcrossMerge: a transaction prepared in two shards that
// merge before its intents are resolved. The merged shard takes the right
// shard's prepared entry over (one entry with both shards' writes), and
// the committed writes are visible.
func TestTxnPreparedAcrossMerge(t *testing.T) {
	c := startCluster(t, 1, func(o *Options) {
		o.TxnRecordRetention, o.TxnTimeout, o.MaxTxnDuration = time.Hour, time.Minute, time.Minute
	})
	n := c.node(1).n
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "r", Partitioning: kv.PartitionRange, SplitPoints: [][]byte{[]byte("k")}}); err != nil {
		t.Fatal(err)
	}
	d, _ := n.collection("r")
	left, right := d.Shards[0].ID, d.Shards[1].ID
	n.knobs.skipResolves.Store(true)
	if _, _, err := transact(ctx, n, kv.TxnOptions{}, func(id string) error {
		for _, k := range []string{"a", "m"} {
			if err := n.TxnPut(ctx, id, kv.PutItem{Collection: "r", Key: []byte(k), Value: []byte("v" + k)}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	n.knobs.skipResolves.Store(false)
	var id string
	eachTxnRecord(t, n, d.ID, func(i string, r txn.Record) {
		if r.Status == txn.Committed {
			id = i
		}
	})
	if id == "" {
		t.Fatal("no committed record")
	}
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
	for _, k := range []string{"a", "m"} {
		r, err := n.Get(ctx, kv.GetRequest{Collection: "r", Key: []byte(k)})
		if err != nil || string(r.Value) != "v"+k {
			t.Errorf("%s after the merge: %q %v, want v%s", k, r.Value, err, k)
		}
	}
}
