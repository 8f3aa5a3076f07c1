package node

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/linearizability"
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

// TestReadNowLinearizable runs plain puts and deletes, transactions (each
// anchored in another collection, so that its record's shard is not
// read, and its resolves kept a while) and scans and batch gets of a hash
// collection's shards on one node, and checks the history: a scan or a
// batch get is recorded as a get of every key it covers, each over the
// read's whole span.
func TestReadNowLinearizable(t *testing.T) {
	seed := clusterSeed(t)
	t.Logf("seed %d (GROUPKV_SEED=%d reproduces the schedule of clients)", seed, seed)
	n := mtOpen(t, t.TempDir(), Options{})
	mtCreate(t, n, kv.CollectionOptions{Name: "h", Partitioning: kv.PartitionHash, Shards: 4})
	mtCreate(t, n, kv.CollectionOptions{Name: "r", Partitioning: kv.PartitionRange})
	n.knobs.resolveGather.Store(int64(50 * time.Millisecond))
	keys := []string{"k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"}
	rec := &linearizability.Recorder{}
	ended := func(p *linearizability.Pending, err error, ok linearizability.Outcome) {
		switch {
		case err == nil:
			p.End(ok)
		case kv.CodeOf(err) == kv.CodeTxnAborted:
			p.Fail()
		default:
			p.End(linearizability.Unknown())
		}
	}
	const writers, readers, ops = 4, 2, 150
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			for i := range ops {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				k := keys[rng.IntN(len(keys))]
				value := fmt.Sprintf("w%d-%d", w, i)
				switch r := rng.IntN(10); {
				case r < 2:
					p := rec.Begin(w, linearizability.Put(k, value))
					v, err := n.Put(ctx, kv.PutRequest{Collection: "h", Key: []byte(k), Value: []byte(value)})
					ended(p, err, linearizability.PutOK(v))
				case r < 3:
					p := rec.Begin(w, linearizability.Delete(k))
					v, err := n.Delete(ctx, kv.DeleteRequest{Collection: "h", Key: []byte(k)})
					if kv.CodeOf(err) == kv.CodeNotFound {
						p.End(linearizability.NotFound())
					} else {
						ended(p, err, linearizability.DeleteOK(v))
					}
				default:
					k2 := keys[rng.IntN(len(keys))]
					if k2 == k {
						k2 = keys[(slices.Index(keys, k)+1)%len(keys)]
					}
					id, err := n.BeginTxn(ctx, kv.TxnOptions{})
					if err == nil {
						err = n.TxnPut(ctx, id, kv.PutItem{Collection: "r", Key: []byte(fmt.Sprint("anchor", w)), Value: []byte(value)})
					}
					for _, key := range []string{k, k2} {
						if err == nil {
							err = n.TxnPut(ctx, id, kv.PutItem{Collection: "h", Key: []byte(key), Value: []byte(value)})
						}
					}
					if err != nil {
						_ = n.AbortTxn(ctx, id)
						cancel()
						continue
					}
					p1, p2 := rec.Begin(w, linearizability.Put(k, value)), rec.Begin(w, linearizability.Put(k2, value))
					v, err := n.CommitTxn(ctx, id)
					ended(p1, err, linearizability.PutOK(v))
					ended(p2, err, linearizability.PutOK(v))
				}
				cancel()
			}
		}()
	}
	for r := range readers {
		client := writers + r
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(client)))
			for range ops {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				read := keys
				if rng.IntN(2) == 0 {
					read = []string{keys[rng.IntN(len(keys))], keys[rng.IntN(len(keys))]}
				}
				pending := make([]*linearizability.Pending, len(read))
				for i, k := range read {
					pending[i] = rec.Begin(client, linearizability.Get(k))
				}
				found := map[string]kv.Record{}
				var err error
				if len(read) == len(keys) {
					var res kv.ScanResult
					res, err = n.Scan(ctx, kv.ScanRequest{Collection: "h", Limit: 100})
					for _, it := range res.Items {
						found[string(it.Key)] = it
					}
				} else {
					refs := []kv.KeyRef{{Collection: "h", Key: []byte(read[0])}, {Collection: "h", Key: []byte(read[1])}}
					var res kv.BatchGetResult
					res, err = n.BatchGet(ctx, refs)
					for _, it := range res.Items {
						if it.Found {
							found[string(it.Key)] = kv.Record{Key: it.Key, Value: it.Value, Version: it.Version}
						}
					}
				}
				for i, k := range read {
					switch it, ok := found[k]; {
					case err != nil:
						pending[i].Fail()
					case ok:
						pending[i].End(linearizability.GetOK(string(it.Value), it.Version))
					default:
						pending[i].End(linearizability.NotFound())
					}
				}
				cancel()
			}
		}()
	}
	wg.Wait()
	rec.Check(t, int64(seed))
}
