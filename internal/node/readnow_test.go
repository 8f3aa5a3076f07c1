package node

import (
	"context"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
)

// TestReadNowSeesCommittedBeforeResolve: a scan and a batch get of shards
// a committed transaction prepared in, but whose resolves have not been
// applied yet, see the transaction's writes, although its commit
// timestamp (the version of its record's shard, in another collection, not
// read) is above every version those shards applied: a read at the present
// of shards holding prepared transactions takes its version from the
// oracle.
func TestReadNowSeesCommittedBeforeResolve(t *testing.T) {
	n := mtOpen(t, t.TempDir(), Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	mtCreate(t, n, kv.CollectionOptions{Name: "c", Partitioning: kv.PartitionRange, SplitPoints: [][]byte{[]byte("m"), []byte("t")}})
	mtCreate(t, n, kv.CollectionOptions{Name: "r", Partitioning: kv.PartitionRange})
	for _, k := range []string{"a0", "n0", "z0"} {
		if _, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte(k), Value: []byte(k)}); err != nil {
			t.Fatal(err)
		}
	}
	// The resolves of the shards other than the record's wait this long.
	n.knobs.resolveGather.Store(int64(5 * time.Second))
	id, err := n.BeginTxn(ctx, kv.TxnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The first key written anchors the record: in r's shard, which
	// commits last, at a version above the others' prepares.
	for _, k := range []kv.KeyRef{{Collection: "r", Key: []byte("r1")}, {Collection: "c", Key: []byte("n1")}, {Collection: "c", Key: []byte("z1")}} {
		if err := n.TxnPut(ctx, id, kv.PutItem{Collection: k.Collection, Key: k.Key, Value: k.Key}); err != nil {
			t.Fatal(err)
		}
	}
	commitTS, err := n.CommitTxn(ctx, id)
	if err != nil {
		t.Fatal(err)
	}

	res, err := n.Scan(ctx, kv.ScanRequest{Collection: "c", Start: []byte("m")})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range res.Items {
		got = append(got, string(r.Key))
	}
	if len(got) != 4 || got[0] != "n0" || got[1] != "n1" || got[2] != "z0" || got[3] != "z1" {
		t.Fatalf("scan from m after the commit at %d reads %v at version %d; want [n0 n1 z0 z1]", commitTS, got, res.Version)
	}
	if res.Version < commitTS {
		t.Fatalf("scan after the commit at %d read at version %d", commitTS, res.Version)
	}
	bg, err := n.BatchGet(ctx, []kv.KeyRef{{Collection: "c", Key: []byte("n1")}, {Collection: "c", Key: []byte("z1")}})
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range bg.Items {
		if !it.Found || string(it.Value) != string(it.Key) {
			t.Fatalf("batch get after the commit at %d: %s found %v value %q at version %d", commitTS, it.Key, it.Found, it.Value, bg.Version)
		}
	}

	// Once resolved, the shards read at the highest version they applied,
	// above the commit's: their resolves came after it.
	d, err := n.collection("c")
	if err != nil {
		t.Fatal(err)
	}
	_, nShard := n.route(d, []byte("n1"))
	_, zShard := n.route(d, []byte("z1"))
	deadline := time.Now().Add(30 * time.Second)
	for n.host.StateMachine(nShard).MinPrepared() != 0 || n.host.StateMachine(zShard).MinPrepared() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the transaction's resolves were not applied")
		}
		time.Sleep(10 * time.Millisecond)
	}
	res, err = n.Scan(ctx, kv.ScanRequest{Collection: "c", Start: []byte("m")})
	if err != nil || len(res.Items) != 4 || res.Version < commitTS {
		t.Fatalf("scan from m after the resolves: %d records at version %d (%v); want 4 at or above %d", len(res.Items), res.Version, err, commitTS)
	}
}
