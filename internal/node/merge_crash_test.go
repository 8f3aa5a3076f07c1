package node

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/groupkv/groupkv/internal/kv"
)

// TestCrashDuringMerge merges the two shards of a range collection on one
// node and crashes it — unsynced writes dropped — with the right shard
// frozen, right after the merge, and after writes to the merged shard:
// every acknowledged write is read back after each restart, and the merge
// completes (the merged shard holds both spans, the right one is gone).
// "applied" crashes the moment the trigger's apply was committed, before
// anything synced it: the left shard replays the trigger on restart, and
// the node opens from that state several times, because the replicas open
// in map order and the replay must find the right one whichever came first.
// A node that does not Serve runs no cluster loop: the test takes its
// merge steps (conformShards) itself.
func TestCrashDuringMerge(t *testing.T) {
	for _, at := range []string{"frozen", "merged", "applied", "written"} {
		t.Run(at, func(t *testing.T) {
			ctx := context.Background()
			fs := vfs.NewCrashableMem()
			crashMakeDir(t, fs, "/data")
			opts := Options{DataDir: "/data", FS: fs, TickInterval: 10 * time.Millisecond, Logger: crashLogger()}
			opsCtx, cancelOps := context.WithCancel(ctx)
			defer cancelOps()
			n := crashOpen(t, 0, opts)
			stop := mergeDriver(n)
			info := crashCreate(t, 0, n, kv.CollectionOptions{Name: "r", Partitioning: kv.PartitionRange, SplitPoints: [][]byte{[]byte("m")}})
			left, right := info.Shards[0].ID, info.Shards[1].ID
			acked := map[string]uint64{}
			put := func(n *Node, k string) {
				t.Helper()
				v, err := n.Put(ctx, kv.PutRequest{Collection: "r", Key: []byte(k), Value: []byte(k)})
				if err != nil {
					t.Fatalf("put %s: %v", k, err)
				}
				acked[k] = v
			}
			for i := 0; i < 20; i++ {
				put(n, fmt.Sprintf("%c%d", 'a'+i, i))
			}
			if at == "frozen" {
				n.knobs.holdMergeTrigger.Store(true)
				go func() {
					n.MergeShards(opsCtx, "r", left) // held: ends when cancelled
				}()
				deadline := time.Now().Add(30 * time.Second)
				for n.frozenInto(right) != left {
					if time.Now().After(deadline) {
						t.Fatal("the right shard did not freeze")
					}
					time.Sleep(5 * time.Millisecond)
				}
				n.frozenHere(right) // what the left leader asks: durable from here
			}
			// The state at the merge's apply, taken in the raft loop (which
			// may run the hook after MergeShards returned).
			applied := make(chan *vfs.MemFS, 1)
			if at != "frozen" {
				var once sync.Once
				if at == "applied" {
					f := func() { once.Do(func() { applied <- fs.CrashClone(vfs.CrashCloneCfg{}) }) }
					n.knobs.atMerge.Store(&f)
				}
				if _, err := n.MergeShards(ctx, "r", left); err != nil {
					t.Fatal(err)
				}
			}
			var atApply *vfs.MemFS
			if at == "applied" {
				select {
				case atApply = <-applied:
				case <-time.After(30 * time.Second):
					t.Fatal("the merge was not applied here")
				}
			}
			if at == "written" {
				for i := 0; i < 20; i++ {
					put(n, fmt.Sprintf("%c%d-after", 'a'+i, i))
				}
			}
			crashed := fs.CrashClone(vfs.CrashCloneCfg{})
			cancelOps()
			stop()
			n.Close()
			restarts := 1
			if at == "applied" {
				crashed, restarts = atApply, 8
			}
			for i := 0; i < restarts; i++ {
				opts.FS = crashed.CrashClone(vfs.CrashCloneCfg{})
				restart(t, opts, left, right, acked, put)
			}
		})
	}
}

// restart opens the crashed node of TestCrashDuringMerge and checks that
// the merge completes and every acknowledged write is there.
func restart(t *testing.T, opts Options, left, right uint64, acked map[string]uint64, put func(*Node, string)) {
	t.Helper()
	ctx := context.Background()
	n := crashOpen(t, 0, opts)
	defer n.Close()
	defer mergeDriver(n)()
	deadline := time.Now().Add(30 * time.Second)
	for n.hasReplica(right) {
		if time.Now().After(deadline) {
			t.Fatal("the merge did not complete after the restart")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if d, ok := n.host.Desc(left); !ok || d.End != nil {
		t.Fatalf("the merged shard after the restart: %+v", d)
	}
	for k, v := range acked {
		r, err := n.Get(ctx, kv.GetRequest{Collection: "r", Key: []byte(k)})
		if err != nil || r.Version != v {
			t.Fatalf("acknowledged put of %s at %d after the crash: %+v, %v", k, v, r, err)
		}
	}
	res, err := n.Scan(ctx, kv.ScanRequest{Collection: "r", Limit: 1000})
	if err != nil || len(res.Items) != len(acked) {
		t.Fatalf("scan after the crash: %d records, want %d, %v", len(res.Items), len(acked), err)
	}
	put(n, "z-new")
	delete(acked, "z-new")
}

// mergeDriver takes a merge's steps on n (conformShards) every 20ms until
// the returned function is called.
func mergeDriver(n *Node) (stop func()) {
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		for {
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
				n.conformShards()
			}
		}
	}()
	return func() { close(done); <-exited }
}
