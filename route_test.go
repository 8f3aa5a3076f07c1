package groupkv_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	groupkv "github.com/groupkv/groupkv"
	"github.com/groupkv/groupkv/internal/node"
	"github.com/groupkv/groupkv/internal/server"
)

// startServers starts a cluster of three in-process servers on 127.0.0.1;
// configure, when given, changes node i's configuration (1-based) first.
func startServers(t *testing.T, configure ...func(i int, cfg *server.Config)) ([]*server.Server, []*prometheus.Registry) {
	t.Helper()
	var (
		servers []*server.Server
		regs    []*prometheus.Registry
		join    []string
	)
	for i := 1; i <= 3; i++ {
		reg := prometheus.NewRegistry()
		cfg := server.Config{
			Node: node.Options{DataDir: t.TempDir(), NodeID: uint64(i), Join: join, Registry: reg,
				TickInterval: 20 * time.Millisecond},
			Listen: "127.0.0.1:0", PeerListen: "127.0.0.1:0",
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		}
		for _, c := range configure {
			c(i, &cfg)
		}
		s, err := server.Start(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close(context.Background()) })
		if join == nil {
			join = []string{s.PeerAddr()}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := s.Node.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
		servers = append(servers, s)
		regs = append(regs, reg)
	}
	return servers, regs
}

// requests counts the requests a node served whose op label op accepts.
func requests(reg *prometheus.Registry, op func(string) bool) float64 {
	mfs, _ := reg.Gather()
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "groupkv_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "op" && op(l.GetValue()) {
					total += m.GetCounter().GetValue()
				}
			}
		}
	}
	return total
}

// puts counts the puts a node served.
func puts(reg *prometheus.Registry) float64 {
	return requests(reg, func(op string) bool { return op == "put" })
}

// wantRoutedPuts puts into collection c through db, dialed to node 1,
// until nodes 2 and 3 (of regs) have served some of the puts directly:
// the first calls may go through the dialed node while the shard map
// loads.
func wantRoutedPuts(t *testing.T, db groupkv.DB, regs []*prometheus.Registry) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; puts(regs[1])+puts(regs[2]) == 0; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("after %d puts through node 1, nodes 2 and 3 served none directly", i)
		}
		if _, err := db.Put(context.Background(), groupkv.PutRequest{Collection: "c", Key: []byte(fmt.Sprint("k", i)), Value: []byte("v")}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestDialRoutesToLeaders checks that a client dialed to one node sends
// single-key writes straight to the other nodes that lead their shards, and
// keeps working when a node it routes to goes away.
func TestDialRoutesToLeaders(t *testing.T) {
	servers, regs := startServers(t)
	db, err := groupkv.Dial(servers[0].Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if _, err := db.CreateCollection(ctx, groupkv.CollectionOptions{Name: "c", Shards: 6}); err != nil {
		t.Fatal(err)
	}
	wantRoutedPuts(t, db, regs)
	_ = testutil.ToFloat64 // keep the import honest if metrics change shape
	for i := 0; i < 50; i++ {
		k := []byte(fmt.Sprint("x", i))
		if _, err := db.Put(ctx, groupkv.PutRequest{Collection: "c", Key: k, Value: k}); err != nil {
			t.Fatal(err)
		}
		r, err := db.Get(ctx, groupkv.GetRequest{Collection: "c", Key: k})
		if err != nil || string(r.Value) != string(k) {
			t.Fatalf("get %s: %q, %v", k, r.Value, err)
		}
	}
	// A node the client routes to goes away: calls fall back and re-route.
	if err := servers[2].Close(ctx); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 50; i++ {
		k := []byte(fmt.Sprint("y", i))
		var err error
		for try := 0; try < 200; try++ {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, err = db.Put(cctx, groupkv.PutRequest{Collection: "c", Key: k, Value: k})
			cancel()
			// A leadership change answers unavailable (not written) or
			// commit_unknown (perhaps written); the put is idempotent, so
			// both are retried.
			if c := groupkv.CodeOf(err); err == nil || c != groupkv.CodeUnavailable && c != groupkv.CodeCommitUnknown {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("put %s after node 3 stopped: %v", k, err)
		}
		var r groupkv.Record
		for try := 0; try < 200; try++ {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			r, err = db.Get(cctx, groupkv.GetRequest{Collection: "c", Key: k})
			cancel()
			if err == nil || groupkv.CodeOf(err) != groupkv.CodeUnavailable {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil || string(r.Value) != string(k) {
			t.Fatalf("get %s after node 3 stopped: %q, %v", k, r.Value, err)
		}
	}
}

// txnOps counts the transaction requests a node served (every op label
// that begins with "txn_").
func txnOps(reg *prometheus.Registry) float64 {
	return requests(reg, func(op string) bool { return strings.HasPrefix(op, "txn_") })
}

// TestDialRoutesGroupTransactions checks that a client dialed to one node
// runs the transactions of a group led by another node on that node (the
// dialed node serves none of their requests), and that they still add up.
func TestDialRoutesGroupTransactions(t *testing.T) {
	servers, regs := startServers(t)
	db, err := groupkv.Dial(servers[0].Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := db.CreateCollection(ctx, groupkv.CollectionOptions{Name: "p", Shards: 6}); err != nil {
		t.Fatal(err)
	}
	key := func(i int) []byte { return []byte(fmt.Sprint("p", i)) }
	for i := range 40 {
		if err := whileUnavailable(func() error {
			_, err := db.Put(ctx, groupkv.PutRequest{Collection: "p", Key: key(i), Value: []byte("10")})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	// A group led by a key whose shard another node leads.
	var id string
	var a, b []byte
	// create creates group gid of keys lead and member, and describes it.
	create := func(gid string, lead, member []byte) groupkv.GroupInfo {
		t.Helper()
		if err := whileUnavailable(func() error {
			_, err := db.CreateGroup(ctx, groupkv.GroupSpec{ID: gid, Leader: groupkv.KeyRef{Collection: "p", Key: lead},
				Members: []groupkv.KeyRef{{Collection: "p", Key: member}}})
			if groupkv.CodeOf(err) == groupkv.CodeAlreadyExists {
				return nil // an unavailable answer whose creation went on
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		info, err := db.DescribeGroup(ctx, gid)
		if err != nil {
			t.Fatal(err)
		}
		return info
	}
	for i := 0; id == "" && i < 40; i += 2 {
		gid := fmt.Sprint("g", i)
		if info := create(gid, key(i), key(i+1)); info.LeaderNode != 1 {
			id, a, b = gid, key(i), key(i+1)
		}
	}
	if id == "" {
		t.Fatal("node 1 leads the shards of all 20 groups' leader keys")
	}
	transfer := func() error {
		return db.Group(id).Transact(ctx, func(tx *groupkv.Tx) error {
			x, err := tx.Get(ctx, groupkv.GetRequest{Collection: "p", Key: a})
			if err != nil {
				return err
			}
			n, _ := strconv.Atoi(string(x.Value))
			if err := tx.Put(ctx, groupkv.PutRequest{Collection: "p", Key: a, Value: []byte(strconv.Itoa(n - 1))}); err != nil {
				return err
			}
			y, err := tx.Get(ctx, groupkv.GetRequest{Collection: "p", Key: b})
			if err != nil {
				return err
			}
			m, _ := strconv.Atoi(string(y.Value))
			return tx.Put(ctx, groupkv.PutRequest{Collection: "p", Key: b, Value: []byte(strconv.Itoa(m + 1))})
		})
	}
	done := 0
	// The client's shard map loads in the background; a leadership may
	// move meanwhile: measure again (a bounded number of times) until ten
	// transactions ran while one node led the group throughout.
	for try := 0; ; try++ {
		before, err := db.DescribeGroup(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		dialed := txnOps(regs[0])
		for range 10 {
			if err := whileUnavailable(transfer); err != nil {
				t.Fatal(err)
			}
			done++
		}
		after, err := db.DescribeGroup(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		served := txnOps(regs[0]) - dialed
		if served == 0 && before.LeaderNode == after.LeaderNode && after.LeaderNode != 1 {
			break
		}
		if try == 20 {
			t.Fatalf("the dialed node served %v requests of ten transactions of a group led by node %d (node %d before)", served, after.LeaderNode, before.LeaderNode)
		}
		time.Sleep(100 * time.Millisecond)
	}
	x, err := db.Get(ctx, groupkv.GetRequest{Collection: "p", Key: a})
	if err != nil {
		t.Fatal(err)
	}
	y, err := db.Get(ctx, groupkv.GetRequest{Collection: "p", Key: b})
	if err != nil {
		t.Fatal(err)
	}
	if string(x.Value) != strconv.Itoa(10-done) || string(y.Value) != strconv.Itoa(10+done) {
		t.Fatalf("after %d transfers: %s=%s %s=%s", done, a, x.Value, b, y.Value)
	}

	// Creations and deletions go to the node leading the leader key's
	// shard too, not through the dialed node.
	groupOps := func() float64 {
		return requests(regs[0], func(op string) bool { return op == "group_create" || op == "group_delete" })
	}
	if err := db.DeleteGroup(ctx, id); err != nil {
		t.Fatal(err)
	}
	for try := 0; ; try++ {
		gid := fmt.Sprint("again", try)
		dialed := groupOps()
		info := create(gid, a, b)
		if err := whileUnavailable(func() error { return db.DeleteGroup(ctx, gid) }); err != nil {
			t.Fatal(err)
		}
		served := groupOps() - dialed
		if served == 0 && info.LeaderNode != 1 {
			break
		}
		if try == 20 {
			t.Fatalf("the dialed node served %v creations and deletions of a group led by node %d", served, info.LeaderNode)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
