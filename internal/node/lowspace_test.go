package node

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/txn"
)

// lowDisk is a node's disk whose free space the test sets.
type lowDisk struct{ *vfs.MemFS }

func (d lowDisk) free(bytes uint64) {
	d.TestingSetDiskUsage(vfs.DiskUsage{AvailBytes: bytes, TotalBytes: 1 << 30, UsedBytes: 1<<30 - bytes})
}

// openOnDisk opens a node on a new disk with 200 MiB free that keeps 64
// MiB free (tweak changes the options), with a collection of four
// shards, coll; the caller closes it.
func openOnDisk(t *testing.T, ctx context.Context, coll string, tweak func(*Options)) (*Node, lowDisk, Options) {
	t.Helper()
	disk := lowDisk{vfs.NewMem()}
	disk.free(200 << 20)
	opts := Options{DataDir: "/data", FS: disk, MinFreeBytes: 64 << 20, TickInterval: 10 * time.Millisecond, Logger: quietLogger()}
	if tweak != nil {
		tweak(&opts)
	}
	n := openReady(t, ctx, opts)
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: coll, Shards: 4}); err != nil {
		n.Close()
		t.Fatal(err)
	}
	return n, disk, opts
}

// openReady opens a node and waits until it is ready.
func openReady(t *testing.T, ctx context.Context, opts Options) *Node {
	t.Helper()
	n, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.WaitReady(ctx); err != nil {
		n.Close()
		t.Fatal(err)
	}
	return n
}

// TestLowDiskRefusesWrites: a node alone whose disk has less than its
// floor free refuses every write that adds data (plain, batch,
// transaction, Key Group, new collection) unavailable, saying why, with
// nothing half-written; it serves reads, takes deletes and finishes what
// it accepted (a group's deletion ships the group's writes); it takes
// writes again once the disk has room, and stops once the disk falls to
// half the floor.
func TestLowDiskRefusesWrites(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n, disk, _ := openOnDisk(t, ctx, "c", nil)
	defer n.Close()
	key := func(i int) []byte { return fmt.Appendf(nil, "k%02d", i) }
	for i := range 20 {
		if _, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: key(i), Value: []byte("v0")}); err != nil {
			t.Fatal(err)
		}
	}
	members := []kv.KeyRef{{Collection: "c", Key: key(10)}, {Collection: "c", Key: key(11)}, {Collection: "c", Key: key(12)}}
	if _, err := n.CreateGroup(ctx, kv.GroupSpec{ID: "g", Leader: members[0], Members: members}); err != nil {
		t.Fatal(err)
	}
	groupWrite := kv.ExecRequest{Then: []kv.TxnOp{
		{Op: kv.TxnOpPut, Collection: "c", Key: key(10), Value: []byte("g1")},
		{Op: kv.TxnOpPut, Collection: "c", Key: key(12), Value: []byte("g1")},
	}}
	if _, err := n.ExecGroupTxn(ctx, "g", groupWrite); err != nil {
		t.Fatal(err)
	}

	disk.free(40 << 20)
	refused := func(what string, err error) {
		t.Helper()
		if kv.CodeOf(err) != kv.CodeUnavailable || !strings.Contains(err.Error(), "refuses writes") || !strings.Contains(err.Error(), "--min-free-space") {
			t.Fatalf("%s on a low disk: %v, want unavailable saying why", what, err)
		}
	}
	deadline := time.Now().Add(time.Minute) // liveness only: the disk is looked at every 100 ms
	late := 0                               // puts taken before the node saw the low disk
	for ; ; late++ {
		_, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: fmt.Appendf(nil, "late%d", late), Value: []byte("x")})
		if err != nil {
			refused("a put", err)
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("puts are still taken a minute after the disk went low")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n.WritesRefused() == nil || n.Ready() != nil {
		t.Fatalf("WritesRefused %v, Ready %v: want writes refused, the node ready", n.WritesRefused(), n.Ready())
	}
	if st, err := n.ClusterStatus(ctx); err != nil || len(st.Nodes) != 1 || !strings.Contains(st.Nodes[0].WritesRefused, "refuses writes") {
		t.Fatalf("cluster status on a low disk: %+v %v, want the node's refusal", st, err)
	}
	var items []kv.PutItem
	for i := range 10 { // not the group's keys
		items = append(items, kv.PutItem{Collection: "c", Key: key(i), Value: []byte("batch")})
	}
	_, err := n.BatchPut(ctx, items)
	refused("a batch put over four shards", err)
	_, err = n.ExecTxn(ctx, kv.ExecRequest{Then: []kv.TxnOp{{Op: kv.TxnOpPut, Collection: "c", Key: key(1), Value: []byte("t")}, {Op: kv.TxnOpPut, Collection: "c", Key: key(2), Value: []byte("t")}}})
	refused("a transaction", err)
	_, err = n.ExecGroupTxn(ctx, "g", kv.ExecRequest{Then: []kv.TxnOp{{Op: kv.TxnOpPut, Collection: "c", Key: key(11), Value: []byte("g2")}}})
	refused("a group transaction", err)
	_, err = n.CreateCollection(ctx, kv.CollectionOptions{Name: "d"})
	refused("a new collection", err)

	// Reads: every key as it was, nothing of the refused writes.
	want := func(i int) string {
		switch i {
		case 10, 12:
			return "g1"
		}
		return "v0"
	}
	check := func(when string) {
		t.Helper()
		res, err := n.Scan(ctx, kv.ScanRequest{Collection: "c", Limit: 100})
		if err != nil {
			t.Fatalf("%s: scan: %v", when, err)
		}
		if len(res.Items) != 20+late {
			t.Fatalf("%s: scan found %d records, want %d", when, len(res.Items), 20+late)
		}
		for i := range 20 {
			rec, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: key(i)})
			if err != nil || string(rec.Value) != want(i) {
				t.Fatalf("%s: get %s: %q %v, want %q", when, key(i), rec.Value, err, want(i))
			}
		}
		if _, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: fmt.Appendf(nil, "late%d", late)}); kv.CodeOf(err) != kv.CodeNotFound {
			t.Fatalf("%s: the refused put: %v, want not found", when, err)
		}
	}
	check("writes refused")
	got, err := n.ExecTxn(ctx, kv.ExecRequest{Then: []kv.TxnOp{{Op: kv.TxnOpGet, Collection: "c", Key: key(3)}}})
	if err != nil || len(got.Results) != 1 || string(got.Results[0].Value) != "v0" {
		t.Fatalf("a read-only transaction on a low disk: %+v %v", got, err)
	}
	// What was accepted finishes: the group's deletion stores its writes
	// in their keys' shards.
	if err := n.DeleteGroup(ctx, "g"); err != nil {
		t.Fatalf("deleting a group on a low disk: %v", err)
	}
	check("the group deleted")
	// A delete is taken: a tombstone, and room once the GC drops the key.
	if _, err := n.Delete(ctx, kv.DeleteRequest{Collection: "c", Key: key(0)}); err != nil {
		t.Fatalf("a delete on a low disk: %v", err)
	}
	if _, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: key(0)}); kv.CodeOf(err) != kv.CodeNotFound {
		t.Fatalf("a key deleted on a low disk: %v, want not found", err)
	}

	disk.free(100 << 20)
	deadline = time.Now().Add(time.Minute)
	for {
		_, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: key(1), Value: []byte("v1")})
		if err == nil {
			break
		}
		refused("a put as the disk has room again", err)
		if time.Now().After(deadline) {
			t.Fatal("puts are still refused a minute after the disk had room")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n.WritesRefused() != nil {
		t.Fatalf("WritesRefused %v with room", n.WritesRefused())
	}
	if st, err := n.ClusterStatus(ctx); err != nil || st.Nodes[0].WritesRefused != "" {
		t.Fatalf("cluster status with room: %+v %v", st, err)
	}
	if _, err := n.BatchPut(ctx, items); err != nil {
		t.Fatalf("a batch put with room: %v", err)
	}

	disk.free(20 << 20) // under half the floor
	select {
	case <-n.Failed():
		if !strings.Contains(n.Failure().Error(), "--min-free-space") {
			t.Fatalf("stopped for %v, want the low disk", n.Failure())
		}
	case <-time.After(time.Minute): // liveness only
		t.Fatal("the node still runs a minute after its disk fell under half its floor")
	}
}

// TestLowDiskStopsANodeWithPeers: a node whose shards have replicas on
// other nodes stops on a low disk, as on any storage failure: they take
// over. So does the node that began the cluster, restarted on a low disk.
func TestLowDiskStopsANodeWithPeers(t *testing.T) {
	disks := map[uint64]lowDisk{1: {vfs.NewMem()}, 2: {vfs.NewMem()}}
	for _, d := range disks {
		d.free(1 << 30)
	}
	c := startCluster(t, 2, func(o *Options) {
		o.FS, o.MinFreeBytes = disks[o.NodeID], 64<<20
	})
	stopped := func(n *Node, what string) {
		t.Helper()
		select {
		case <-n.Failed():
			if !strings.Contains(n.Failure().Error(), "--min-free-space") {
				t.Fatalf("%s stopped for %v, want the low disk", what, n.Failure())
			}
		case <-time.After(time.Minute): // liveness only
			t.Fatalf("%s still runs a minute after its disk went low", what)
		}
	}
	disks[2].free(40 << 20)
	stopped(c.node(2).n, "node 2")
	if c.node(1).n.WritesRefused() != nil {
		t.Fatal("node 1, on a disk with room, refuses writes")
	}

	// Node 1 began the cluster (no --join): restarted on a disk below the
	// floor (above half of it), it opens, finds its peer, and stops.
	opts := c.node(1).n.opts
	opts.Registry = nil // a new one
	c.node(1).srv.Stop()
	if err := c.node(1).n.Close(); err != nil {
		t.Fatal(err)
	}
	disks[1].free(40 << 20)
	n, err := Open(opts)
	if err != nil {
		if !strings.Contains(err.Error(), "--min-free-space") {
			t.Fatalf("node 1 restarted on a low disk: %v, want the low disk named", err)
		}
		return
	}
	defer n.Close()
	stopped(n, "node 1 restarted")
}

// TestLowDiskKeepsTransactionsWhole moves money between accounts with
// transactions, in a collection of four shards (distributed commits) and
// one of one shard (one-proposal commits), while the disk goes low and has room again at
// random: every transaction is whole or not at all (audits, and the end,
// add up; a refusal answers unavailable, never commit_unknown), and
// exactly the transfers acknowledged are there after a restart (each
// worker counts its own in the same transactions). (A transfer
// wounded by one that was then refused waits, before its retry, for the
// wounder's retry, up to a quarter of the transaction timeout.)
func TestLowDiskKeepsTransactionsWhole(t *testing.T) {
	seed := crashSeed(t)
	t.Logf("seed %d (replay with GROUPKV_SEED=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n, disk, opts := openOnDisk(t, ctx, "bank", nil)
	// bank has four shards (its transfers commit across shards), purse
	// one (its transfers commit in one proposal).
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "purse", Shards: 1}); err != nil {
		t.Fatal(err)
	}
	colls := []string{"bank", "purse"}
	const accounts, initial = 16, 1000
	acct := func(i int) []byte { return fmt.Appendf(nil, "acct%02d", i) }
	for i := range accounts {
		for _, c := range colls {
			if _, err := n.Put(ctx, kv.PutRequest{Collection: c, Key: acct(i), Value: []byte(strconv.Itoa(initial))}); err != nil {
				t.Fatal(err)
			}
		}
	}
	balance := func(v []byte) int {
		b, err := strconv.Atoi(string(v))
		if err != nil {
			t.Errorf("balance %q: %v", v, err)
		}
		return b
	}

	// Each worker counts its transfers in a key of its own, in the same
	// transactions: the count is exactly the transfers acknowledged.
	counter := func(w int) []byte { return fmt.Appendf(nil, "count%d", w) }
	const workers = 4
	var acked [workers]int
	stop := make(chan struct{})
	var (
		wg                  sync.WaitGroup
		committed, refusals atomic.Int64
	)
	// The disk: low and room again, at random, about every 150 ms.
	wg.Go(func() {
		low := false
		for {
			select {
			case <-stop:
				disk.free(200 << 20)
				return
			case <-time.After(time.Duration(50+rng.IntN(200)) * time.Millisecond):
			}
			low = !low
			if low {
				disk.free(40 << 20)
			} else {
				disk.free(200 << 20)
			}
		}
	})
	for w := range workers {
		wrng := rand.New(rand.NewPCG(seed, uint64(w)+2))
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				from, to := wrng.IntN(accounts), wrng.IntN(accounts)
				if from == to {
					continue
				}
				coll := colls[w%2]
				get := []kv.TxnOp{{Op: kv.TxnOpGet, Collection: coll, Key: acct(from)}, {Op: kv.TxnOpGet, Collection: coll, Key: acct(to)}, {Op: kv.TxnOpGet, Collection: coll, Key: counter(w)}}
				read, err := n.ExecTxn(ctx, kv.ExecRequest{Then: get})
				if err != nil {
					t.Errorf("reading two accounts: %v", err)
					return
				}
				a, b := balance(read.Results[0].Value), balance(read.Results[1].Value)
				done := 0
				if read.Results[2].Found {
					done = balance(read.Results[2].Value)
				}
				amount := wrng.IntN(10)
				cond := []kv.Compare{{Collection: coll, Key: acct(from), Version: read.Results[0].Version}, {Collection: coll, Key: acct(to), Version: read.Results[1].Version},
					{Collection: coll, Key: counter(w), Version: read.Results[2].Version}}
				puts := []kv.TxnOp{
					{Op: kv.TxnOpPut, Collection: coll, Key: acct(from), Value: []byte(strconv.Itoa(a - amount))},
					{Op: kv.TxnOpPut, Collection: coll, Key: acct(to), Value: []byte(strconv.Itoa(b + amount))},
					{Op: kv.TxnOpPut, Collection: coll, Key: counter(w), Value: []byte(strconv.Itoa(done + 1))},
				}
				res, err := n.ExecTxn(ctx, kv.ExecRequest{If: cond, Then: puts})
				switch {
				case err == nil && res.Succeeded:
					committed.Add(1)
					acked[w]++
				case err == nil: // a condition failed: another transfer came first
				case kv.CodeOf(err) == kv.CodeUnavailable && strings.Contains(err.Error(), "refuses writes"):
					refusals.Add(1)
				default:
					t.Errorf("a transfer: %v", err)
					return
				}
			}
		})
	}
	audit := func(when string) {
		t.Helper()
		var get []kv.TxnOp
		for _, c := range colls {
			for i := range accounts {
				get = append(get, kv.TxnOp{Op: kv.TxnOpGet, Collection: c, Key: acct(i)})
			}
		}
		res, err := n.ExecTxn(ctx, kv.ExecRequest{Then: get})
		if err != nil {
			t.Fatalf("%s: audit: %v", when, err)
		}
		for j, c := range colls {
			sum := 0
			for _, r := range res.Results[j*accounts : (j+1)*accounts] {
				sum += balance(r.Value)
			}
			if sum != accounts*initial {
				t.Fatalf("%s: the accounts of %s hold %d, want %d (seed %d)", when, c, sum, accounts*initial, seed)
			}
		}
	}
	deadline := time.Now().Add(4 * time.Second)
	for time.Now().Before(deadline) && !t.Failed() {
		audit("during the run")
		time.Sleep(50 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	audit("at the end")
	t.Logf("%d transfers committed, %d refused for the low disk", committed.Load(), refusals.Load())
	if refusals.Load() == 0 || committed.Load() == 0 {
		t.Fatalf("%d committed, %d refused: the run did not exercise both", committed.Load(), refusals.Load())
	}
	var want []kv.Record // the accounts of bank, then of purse
	for _, c := range colls {
		for i := range accounts {
			rec, err := n.Get(ctx, kv.GetRequest{Collection: c, Key: acct(i)})
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, rec)
		}
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	n = openReady(t, ctx, opts)
	defer n.Close()
	for j, w := range want {
		c, i := colls[j/accounts], j%accounts
		rec, err := n.Get(ctx, kv.GetRequest{Collection: c, Key: acct(i)})
		if err != nil || rec.Version != w.Version || string(rec.Value) != string(w.Value) {
			t.Fatalf("%s of %s after a restart: %q at %d (%v), want %q at %d", acct(i), c, rec.Value, rec.Version, err, w.Value, w.Version)
		}
	}
	audit("after a restart")
	for w := range workers {
		got := 0
		rec, err := n.Get(ctx, kv.GetRequest{Collection: colls[w%2], Key: counter(w)})
		switch {
		case err == nil:
			got = balance(rec.Value)
		case kv.CodeOf(err) != kv.CodeNotFound:
			t.Fatal(err)
		}
		if got != acked[w] {
			t.Fatalf("worker %d: %d transfers acknowledged, its count says %d (seed %d)", w, acked[w], got, seed)
		}
	}
}

// TestGivenUpTransactionEndsTheWait: a one-shot transaction that answers
// an error other than an abort (here a write refused for a low disk) is
// not retried, and says so: a retry waiting for it (the wait of a
// transaction it wounded) ends at once, not after the grace a transaction
// whose client may retry it gets.
func TestGivenUpTransactionEndsTheWait(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, disk, _ := openOnDisk(t, ctx, "c", func(o *Options) { o.TxnTimeout = time.Minute })
	defer n.Close()
	ended := func(id string) *txn.Meta {
		t.Helper()
		n.txns.mu.Lock()
		defer n.txns.mu.Unlock()
		e, ok := n.txns.ended[id]
		if !ok {
			t.Fatalf("attempt %s: no record of its end", id)
		}
		return &e.meta
	}

	// An attempt aborted by its client, who may retry it: a wait for it
	// lasts the grace (a quarter of TxnTimeout, 15 s), here cut by its
	// context.
	id, err := n.BeginTxn(ctx, kv.TxnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.TxnPut(ctx, id, kv.PutItem{Collection: "c", Key: []byte("a"), Value: []byte("1")}); err != nil {
		t.Fatal(err)
	}
	if err := n.AbortTxn(ctx, id); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, time.Second)
	if err := n.awaitTxnEnd(wctx, ended(id)); err == nil {
		t.Fatal("a wait for an attempt its client may retry ended before the grace")
	}
	wcancel()

	// A one-shot transaction refused for the low disk gives up.
	disk.free(40 << 20)
	waitUntil := time.Now().Add(time.Minute) // liveness only
	for n.WritesRefused() == nil {
		if time.Now().After(waitUntil) {
			t.Fatal("writes not refused a minute after the disk went low")
		}
		time.Sleep(10 * time.Millisecond)
	}
	_, err = n.ExecTxn(ctx, kv.ExecRequest{Then: []kv.TxnOp{
		{Op: kv.TxnOpPut, Collection: "c", Key: []byte("a"), Value: []byte("2")},
		{Op: kv.TxnOpPut, Collection: "c", Key: []byte("b"), Value: []byte("2")},
	}})
	if !refused(err) {
		t.Fatalf("a transaction on a low disk: %v, want refused", err)
	}
	n.txns.mu.Lock()
	var given []string
	for g := range n.txns.gaveUp {
		given = append(given, g)
	}
	n.txns.mu.Unlock()
	if len(given) != 1 {
		t.Fatalf("attempts given up: %v, want the refused one", given)
	}
	wctx, wcancel = context.WithTimeout(ctx, 5*time.Second)
	defer wcancel()
	if err := n.awaitTxnEnd(wctx, ended(given[0])); err != nil {
		t.Fatalf("a wait for a transaction that gave up: %v, want its end at once", err)
	}
}
