package node

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/shard"
	"github.com/groupkv/groupkv/internal/txn"
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
	d := mtCreate(t, n, kv.CollectionOptions{Name: "c", Partitioning: kv.PartitionRange, SplitPoints: [][]byte{[]byte("m"), []byte("t")}})
	const txns = 4
	for i := range txns {
		id, err := n.BeginTxn(ctx, kv.TxnOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// One key in each shard: a two-phase commit whose record's shard
		// (a's) commits last, and a resolve for each of the two others.
		for _, k := range []string{fmt.Sprintf("a%d", i), fmt.Sprintf("n%d", i), fmt.Sprintf("z%d", i)} {
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
		for _, k := range []string{fmt.Sprintf("a%d", i), fmt.Sprintf("n%d", i), fmt.Sprintf("z%d", i)} {
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

// TestCommitLastAboveOthers: the commit of a record's shard as the last
// participant is proposed at a version above its MinCommit, even one
// ahead of every version the node handed out.
func TestCommitLastAboveOthers(t *testing.T) {
	n := mtOpen(t, t.TempDir(), Options{})
	ctx := context.Background()
	d := mtCreate(t, n, kv.CollectionOptions{Name: "c", Partitioning: kv.PartitionRange})
	v, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte("k"), Value: []byte("old")})
	if err != nil {
		t.Fatal(err)
	}
	term, ok := n.host.LeaderTerm(d.Shards[0].ID)
	if !ok {
		t.Fatal("the shard has no leader here")
	}
	minCommit := v + 1<<30 // far above anything handed out
	key := []byte("a")
	bucket, _ := n.route(d, key)
	m := txn.Meta{ID: txn.NewID(v, 1), Priority: v, Attempt: 1, Start: v, Anchor: txn.Anchor{Collection: d.ID, Bucket: bucket, Key: key}}
	res, err := n.host.Propose(ctx, d.Shards[0].ID, shard.EncodeTxnPrepare(&shard.TxnPrepareCmd{Meta: m, LockTerm: term, OnePhase: true,
		Last: true, MinCommit: minCommit, Participants: []uint64{99}, Writes: []shard.Op{{Type: shard.OpPut, Bucket: bucket, Key: key, Value: []byte("v")}}}))
	if err != nil || res.Err != nil {
		t.Fatalf("commit: %v %v", err, res.Err)
	}
	if res.Version <= minCommit {
		t.Fatalf("committed at %d, not above %d", res.Version, minCommit)
	}
	rec, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: key})
	if err != nil || string(rec.Value) != "v" || rec.Version != res.Version {
		t.Fatalf("a = %q@%d (%v), want v@%d", rec.Value, rec.Version, err, res.Version)
	}
}
