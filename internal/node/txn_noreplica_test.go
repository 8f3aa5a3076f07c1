package node

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/kv"
)

// TestTxnThroughNodeWithoutReplicas: every kind of transaction works when
// the node that coordinates it holds no replica of some of the shards it
// touches (four nodes, three replicas per shard): serializable and
// snapshot attempts, read-only ones, scans and tag queries inside them, a
// one-shot transaction and an atomic batch put.
func TestTxnThroughNodeWithoutReplicas(t *testing.T) {
	c := startCluster(t, 4, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d := c.txnCollectionH(ctx)
	// The node lacking the most shards of h.
	missing := map[uint64][]uint64{}
	for id, nodes := range c.withoutReplica(d) {
		for _, tn := range nodes {
			missing[tn.id] = append(missing[tn.id], id)
		}
	}
	var via *testNode
	for _, tn := range c.nodes {
		if via == nil || len(missing[tn.id]) > len(missing[via.id]) {
			via = tn
		}
	}
	if len(missing[via.id]) == 0 {
		t.Fatalf("every node holds every shard of %v", d.Shards)
	}
	n := via.n
	t.Logf("through node %d, which holds no replica of shards %v", via.id, missing[via.id])
	// One key in every shard of h.
	var keys [][]byte
	for i, s := range d.Shards {
		keys = append(keys, c.keyIn(d, s.ID, fmt.Sprintf("s%d-", i)))
	}
	ref := func(k []byte) kv.KeyRef { return kv.KeyRef{Collection: "h", Key: k} }
	var items []kv.PutItem
	for _, k := range keys {
		items = append(items, kv.PutItem{Collection: "h", Key: k, Value: []byte("0"), Tags: []string{"t"}})
	}
	if _, err := n.BatchPut(ctx, items); err != nil {
		t.Fatalf("batch put: %v", err)
	}
	for _, iso := range []kv.Isolation{kv.IsolationSerializable, kv.IsolationSnapshot} {
		_, _, err := transact(ctx, n, kv.TxnOptions{Isolation: iso}, func(id string) error {
			for _, k := range keys {
				rec, found, err := n.TxnGet(ctx, id, ref(k))
				if err != nil {
					return err
				}
				if !found {
					return fmt.Errorf("%s missing", k)
				}
				if err := n.TxnPut(ctx, id, kv.PutItem{Collection: "h", Key: k, Value: append(rec.Value, '+'), Tags: []string{"t"}}); err != nil {
					return err
				}
			}
			res, err := n.TxnScan(ctx, id, kv.ScanRequest{Collection: "h"})
			if err != nil {
				return fmt.Errorf("scan: %w", err)
			}
			if len(res.Items) != len(keys) {
				return fmt.Errorf("scan found %d records, want %d", len(res.Items), len(keys))
			}
			tagged, err := n.TxnGetByTags(ctx, id, kv.TagQuery{Collection: "h", All: []string{"t"}})
			if err != nil {
				return fmt.Errorf("tag query: %w", err)
			}
			if len(tagged.Items) != len(keys) {
				return fmt.Errorf("tag query found %d records, want %d", len(tagged.Items), len(keys))
			}
			return nil
		})
		if err != nil {
			t.Fatalf("%s transaction: %v", iso, err)
		}
	}
	_, _, err := transact(ctx, n, kv.TxnOptions{ReadOnly: true}, func(id string) error {
		for _, k := range keys {
			rec, _, err := n.TxnGet(ctx, id, ref(k))
			if err != nil {
				return err
			}
			if string(rec.Value) != "0++" {
				return fmt.Errorf("%s holds %q, want %q", k, rec.Value, "0++")
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("read-only transaction: %v", err)
	}
	var exec kv.ExecRequest
	for _, k := range keys {
		exec.If = append(exec.If, kv.Compare{Collection: "h", Key: k, HasValue: true, Value: []byte("0++")})
		exec.Then = append(exec.Then, kv.TxnOp{Op: kv.TxnOpPut, Collection: "h", Key: k, Value: []byte("exec")})
	}
	res, err := n.ExecTxn(ctx, exec)
	if err != nil || !res.Succeeded {
		t.Fatalf("one-shot transaction: %+v, %v", res, err)
	}
	for _, k := range keys {
		rec, err := c.node(1).n.Get(ctx, kv.GetRequest{Collection: "h", Key: k})
		if err != nil || string(rec.Value) != "exec" {
			t.Fatalf("%s after the one-shot transaction: %q, %v", k, rec.Value, err)
		}
	}
}

// withoutReplica maps each shard of d to the nodes that hold no replica of
// it, in node order (shards every node holds are left out).
func (c *testCluster) withoutReplica(d *cluster.CollectionDesc) map[uint64][]*testNode {
	out := map[uint64][]*testNode{}
	for _, s := range d.Shards {
		for _, tn := range c.nodes {
			if !slices.ContainsFunc(s.Replicas, func(r cluster.Replica) bool { return r.Node == tn.id }) {
				out[s.ID] = append(out[s.ID], tn)
			}
		}
	}
	return out
}
