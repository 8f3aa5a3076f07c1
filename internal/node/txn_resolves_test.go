package node

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/shard"
)

// TestTxnResolvesGathered: the resolves of transactions that commit close
// together are proposed to each shard as one batch, which resolves every
// one of them: their writes read as committed, and no intent is left for
// a plain write to meet.
func TestTxnResolvesGathered(t *testing.T) {
	n := mtOpen(t, t.TempDir(), Options{})
	// Wide enough for the commits below to fall in one gathering even
	// on a loaded machine.
	n.knobs.resolveGather.Store(int64(2 * time.Second))
	ctx := context.Background()
	d := mtCreate(t, n, kv.CollectionOptions{Name: "c", Partitioning: kv.PartitionRange, SplitPoints: [][]byte{[]byte("m")}})
	const txns = 4
	for i := range txns {
		id, err := n.BeginTxn(ctx, kv.TxnOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// One key in each shard: a two-phase commit, a resolve for each.
		for _, k := range []string{fmt.Sprintf("a%d", i), fmt.Sprintf("z%d", i)} {
			if err := n.TxnPut(ctx, id, kv.PutItem{Collection: "c", Key: []byte(k), Value: []byte(k)}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := n.CommitTxn(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for testutil.ToFloat64(n.metrics.resolvesBatched) < 2*txns {
		if time.Now().After(deadline) {
			t.Fatalf("%v resolves went in %v batches, want all %d in batches", testutil.ToFloat64(n.metrics.resolvesBatched), testutil.ToFloat64(n.metrics.resolveBatches), 2*txns)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if b := testutil.ToFloat64(n.metrics.resolveBatches); b < 2 {
		t.Fatalf("%v batches for resolves in two shards", b)
	}
	for i := range txns {
		for _, k := range []string{fmt.Sprintf("a%d", i), fmt.Sprintf("z%d", i)} {
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			rec, err := n.Get(pctx, kv.GetRequest{Collection: "c", Key: []byte(k)})
			cancel()
			if err != nil || string(rec.Value) != k {
				t.Fatalf("%s = %q (%v)", k, rec.Value, err)
			}
			if _, held, err := shard.ReadIntent(n.eng.DB, d.ID, []byte(k)); held || err != nil {
				t.Fatalf("%s still holds an intent (%v)", k, err)
			}
		}
	}
}
