package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/linearizability"
	"github.com/groupkv/groupkv/internal/shard"
)

// faultNet is the network between in-process test nodes: every peer
// connection is dialed and accepted through it, so a node can be cut off
// (its open connections closed, new ones refused) and healed.
type faultNet struct {
	mu sync.Mutex
	// addrNode maps the nodes' listening addresses, and the local
	// addresses of the connections they dialed, to the nodes.
	addrNode map[string]uint64
	cut      map[uint64]bool
	conns    []*faultConn
	// frozen nodes (freeze) send and receive nothing, their connections
	// open: a write on one waits until thawed is closed.
	frozen map[uint64]bool
	thawed chan struct{}
}

// faultConn is one end of a connection between nodes: from writes on it
// to to. (An accepted connection learns to, the node that dialed it, at
// its first write.)
type faultConn struct {
	net.Conn
	f        *faultNet
	from, to uint64
}

// Write waits while either end is frozen, as a stopped process's peers
// wait for it.
func (c *faultConn) Write(b []byte) (int, error) {
	for {
		c.f.mu.Lock()
		if c.to == 0 {
			c.to = c.f.addrNode[c.RemoteAddr().String()]
		}
		frozen, thawed := c.f.frozen[c.from] || c.f.frozen[c.to], c.f.thawed
		c.f.mu.Unlock()
		if !frozen {
			return c.Conn.Write(b)
		}
		<-thawed
	}
}

// freeze makes node id stop talking to the others, as a stopped (SIGSTOP)
// process does: its connections stay open and deliver nothing, until
// thaw.
func (f *faultNet) freeze(id uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.frozen == nil {
		f.frozen = map[uint64]bool{}
	}
	if len(f.frozen) == 0 {
		f.thawed = make(chan struct{})
	}
	f.frozen[id] = true
}

// thaw ends every freeze.
func (f *faultNet) thaw() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.frozen) > 0 {
		clear(f.frozen)
		close(f.thawed)
	}
}

func newFaultNet() *faultNet {
	return &faultNet{addrNode: map[string]uint64{}, cut: map[uint64]bool{}}
}

func (f *faultNet) dialer(from uint64) func(context.Context, string) (net.Conn, error) {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		f.mu.Lock()
		to := f.addrNode[addr]
		blocked := f.cut[from] || f.cut[to]
		f.mu.Unlock()
		if blocked {
			return nil, fmt.Errorf("faultnet: node %d cannot reach node %d (partitioned)", from, to)
		}
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		fc := &faultConn{Conn: c, f: f, from: from, to: to}
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.cut[from] || f.cut[to] {
			c.Close()
			return nil, fmt.Errorf("faultnet: node %d cannot reach node %d (partitioned)", from, to)
		}
		f.addrNode[c.LocalAddr().String()] = from
		f.conns = append(f.conns, fc)
		return fc, nil
	}
}

// listen wraps node id's peer listener: the connections it accepts are
// frozen and cut with id, as those it dials are.
func (f *faultNet) listen(id uint64, l net.Listener) net.Listener {
	return &faultListener{Listener: l, f: f, id: id}
}

type faultListener struct {
	net.Listener
	f  *faultNet
	id uint64
}

func (l *faultListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	fc := &faultConn{Conn: c, f: l.f, from: l.id}
	l.f.mu.Lock()
	defer l.f.mu.Unlock()
	if l.f.cut[l.id] {
		c.Close()
		// A listener that fails Accept stops serving: hand out a closed
		// connection instead.
		return fc, nil
	}
	l.f.conns = append(l.f.conns, fc)
	return fc, nil
}

// isolate cuts node id off from every other node.
func (f *faultNet) isolate(id uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cut[id] = true
	kept := f.conns[:0]
	for _, c := range f.conns {
		if c.to == 0 {
			c.to = f.addrNode[c.RemoteAddr().String()]
		}
		if c.from == id || c.to == id {
			c.Close()
			continue
		}
		kept = append(kept, c)
	}
	f.conns = kept
}

func (f *faultNet) heal(id uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.cut, id)
}

type testNode struct {
	id  uint64
	n   *Node
	srv *grpc.Server
	// peer is the node's peer address.
	peer string
}

type testCluster struct {
	t     testing.TB
	net   *faultNet
	nodes []*testNode
	tweak func(*Options)
	join  string
}

// addNode starts one more node, joined to the first, and waits until it
// serves.
func (c *testCluster) addNode() *testNode {
	t := c.t
	t.Helper()
	id := uint64(len(c.nodes) + 1)
	var join []string
	if c.join != "" {
		join = []string{c.join}
	}
	tn := c.startNode(id, t.TempDir(), join, "127.0.0.1:0")
	c.nodes = append(c.nodes, tn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := tn.n.WaitReady(ctx); err != nil {
		t.Fatalf("node %d: %v", id, err)
	}
	return tn
}

// startNode opens node id on dir with its peer service on a new loopback
// port and starts its cluster work; the first node started is the one
// others join.
func (c *testCluster) startNode(id uint64, dir string, join []string, listen string) *testNode {
	t := c.t
	t.Helper()
	opts := Options{DataDir: dir, NodeID: id, TickInterval: 20 * time.Millisecond,
		Dialer: c.net.dialer(id), Logger: quietLogger(), Join: join}
	if c.tweak != nil {
		c.tweak(&opts)
	}
	n, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", listen)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	n.RegisterPeer(srv)
	go srv.Serve(c.net.listen(id, l))
	c.net.mu.Lock()
	c.net.addrNode[l.Addr().String()] = id
	c.net.mu.Unlock()
	n.Serve(fmt.Sprintf("127.0.0.1:%d", 40000+id), l.Addr().String())
	tn := &testNode{id: id, n: n, srv: srv, peer: l.Addr().String()}
	t.Cleanup(func() {
		tn.srv.Stop()
		tn.n.Close()
	})
	if c.join == "" {
		c.join = l.Addr().String()
	}
	return tn
}

func startCluster(t testing.TB, size int, tweak func(*Options)) *testCluster {
	t.Helper()
	c := &testCluster{t: t, net: newFaultNet(), tweak: tweak}
	for i := 1; i <= size; i++ {
		c.addNode()
	}
	// Every node must see every other as a member before the test goes on.
	c.eventually(30*time.Second, "all members known everywhere", func() error {
		for _, tn := range c.nodes {
			if len(tn.n.members()) != size {
				return fmt.Errorf("node %d knows %d members", tn.id, len(tn.n.members()))
			}
		}
		return nil
	})
	// ... and its voters, out of the joint configuration that promoted
	// them: a test that stops the first node at once would otherwise stop
	// the only voter of the configuration being left.
	c.waitVoters(min(size, cluster.MetaReplicas), cluster.MetaShardID)
	return c
}

func quietLogger() *slog.Logger {
	switch os.Getenv("GROUPKV_TEST_LOG") {
	case "":
	case "debug":
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	default:
		return slog.Default()
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func (c *testCluster) node(id uint64) *testNode { return c.nodes[id-1] }

// eventually retries f until it succeeds or the generous deadline (which
// only catches hangs) passes.
func (c *testCluster) eventually(d time.Duration, what string, f func() error) {
	c.t.Helper()
	deadline := time.Now().Add(d)
	var err error
	for time.Now().Before(deadline) {
		if err = f(); err == nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	dumpCluster(c.t, c)
	c.t.Fatalf("%s: not within %v: %v", what, d, err)
}

// leader returns the node leading shardID, as the leader itself says.
func (c *testCluster) leader(shardID uint64) *testNode {
	c.t.Helper()
	var out *testNode
	c.eventually(30*time.Second, fmt.Sprintf("shard %d has a leader", shardID), func() error {
		for _, tn := range c.nodes {
			if tn.n.host.Ready(shardID) {
				out = tn
				return nil
			}
		}
		return fmt.Errorf("no ready leader")
	})
	return out
}

func clusterSeed(t *testing.T) uint64 {
	if s := os.Getenv("GROUPKV_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	return uint64(time.Now().UnixNano())
}

// record runs op through the recorder, classifying its outcome: refused
// (unavailable, not leader) drops it; an ended context, a lost connection
// or commit_unknown make it unknown.
func recordPut(rec *linearizability.Recorder, client int, n *Node, key, value string) error {
	p := rec.Begin(client, linearizability.Put(key, value))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	v, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte(key), Value: []byte(value)})
	switch {
	case err == nil:
		p.End(linearizability.PutOK(v))
	case kv.CodeOf(err) == kv.CodeUnavailable && ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded),
		kv.CodeOf(err) == kv.CodeNotLeader:
		p.Fail()
	default:
		p.End(linearizability.Unknown())
	}
	return err
}

func recordGet(rec *linearizability.Recorder, client int, n *Node, key string) error {
	p := rec.Begin(client, linearizability.Get(key))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	r, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte(key)})
	switch {
	case err == nil:
		p.End(linearizability.GetOK(string(r.Value), r.Version))
	case kv.CodeOf(err) == kv.CodeNotFound:
		p.End(linearizability.NotFound())
	default:
		p.Fail() // a read that failed constrains nothing
	}
	return err
}

// TestClusterPartition cuts the leader of a shard away from the others
// under concurrent clients: the majority elects a new leader and serves,
// the cut-off node refuses linearizable reads and writes, and after the
// heal it catches up. The whole history is checked for linearizability.
func TestClusterPartition(t *testing.T) {
	seed := clusterSeed(t)
	t.Logf("seed %d (GROUPKV_SEED=%d reproduces the schedule of clients)", seed, seed)
	c := startCluster(t, 3, nil)
	ctx := context.Background()
	info, err := c.node(2).n.CreateCollection(ctx, kv.CollectionOptions{Name: "c", Shards: 1, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	shardID := info.Shards[0].ID
	for _, tn := range c.nodes {
		if !tn.n.hasReplica(shardID) {
			t.Fatalf("node %d holds no replica of shard %d", tn.id, shardID)
		}
	}

	rec := &linearizability.Recorder{}
	keys := []string{"a", "b", "c"}
	var stop atomic.Bool
	var wg sync.WaitGroup
	var ops atomic.Int64
	for cl := 0; cl < 6; cl++ {
		wg.Add(1)
		go func(cl int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(cl)))
			for i := 0; !stop.Load(); i++ {
				tn := c.nodes[rng.IntN(len(c.nodes))]
				key := keys[rng.IntN(len(keys))]
				if rng.IntN(2) == 0 {
					recordPut(rec, cl, tn.n, key, fmt.Sprintf("c%d-%d", cl, i))
				} else {
					recordGet(rec, cl, tn.n, key)
				}
				ops.Add(1)
				time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
			}
		}(cl)
	}
	time.Sleep(300 * time.Millisecond)

	old := c.leader(shardID)
	t.Logf("isolating node %d, leader of shard %d", old.id, shardID)
	c.net.isolate(old.id)
	var majority []*testNode
	for _, tn := range c.nodes {
		if tn != old {
			majority = append(majority, tn)
		}
	}
	// The majority elects a new leader and serves writes and reads.
	c.eventually(30*time.Second, "the majority serves a write", func() error {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := majority[0].n.Put(cctx, kv.PutRequest{Collection: "c", Key: []byte("m"), Value: []byte("majority")})
		return err
	})
	if !majority[0].n.host.Ready(shardID) && !majority[1].n.host.Ready(shardID) {
		t.Fatalf("the majority served a write of shard %d without a leader among them", shardID)
	}
	// The cut-off node refuses: no write applies there, no read is served.
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err = old.n.Put(cctx, kv.PutRequest{Collection: "c", Key: []byte("m"), Value: []byte("minority")})
	cancel()
	if code := kv.CodeOf(err); code != kv.CodeUnavailable && code != kv.CodeCommitUnknown {
		t.Fatalf("a write through the isolated node answered %v, want unavailable or commit_unknown", err)
	}
	cctx, cancel = context.WithTimeout(ctx, 5*time.Second)
	_, err = old.n.Get(cctx, kv.GetRequest{Collection: "c", Key: []byte("m")})
	cancel()
	if kv.CodeOf(err) != kv.CodeUnavailable {
		t.Fatalf("a linearizable read through the isolated node answered %v, want unavailable", err)
	}
	for _, tn := range majority {
		r, err := tn.n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte("m")})
		if err != nil || string(r.Value) != "majority" {
			t.Fatalf("node %d reads m = %q, %v; want majority", tn.id, r.Value, err)
		}
	}
	time.Sleep(300 * time.Millisecond)

	t.Logf("healing node %d", old.id)
	c.net.heal(old.id)
	c.eventually(30*time.Second, "the healed node catches up", func() error {
		r, err := old.n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte("m")})
		if err != nil {
			return err
		}
		if string(r.Value) != "majority" {
			return fmt.Errorf("reads %q", r.Value)
		}
		return nil
	})
	time.Sleep(300 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	t.Logf("%d client operations", ops.Load())
	rec.Check(t, int64(seed))
}

// TestClusterFollowerCatchesUpBySnapshot cuts a follower off while the
// leader writes past its truncated log: after the heal the follower gets a
// snapshot and serves every write.
func TestClusterFollowerCatchesUpBySnapshot(t *testing.T) {
	c := startCluster(t, 3, func(o *Options) { o.TruncateAfter = 20 })
	ctx := context.Background()
	info, err := c.node(1).n.CreateCollection(ctx, kv.CollectionOptions{Name: "c", Shards: 2, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	leader := c.leader(info.Shards[0].ID)
	var follower *testNode
	for _, tn := range c.nodes {
		if tn != leader && tn.n.leaderOf(cluster.MetaShardID) != tn.id {
			follower = tn
		}
	}
	if follower == nil {
		for _, tn := range c.nodes {
			if tn != leader {
				follower = tn
			}
		}
	}
	c.net.isolate(follower.id)
	writer := leader
	const keys = 300
	for i := 0; i < keys; i++ {
		c.eventually(30*time.Second, "a write while a follower is away", func() error {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			// 8 KiB values: the snapshot is megabytes, streamed in chunks.
			_, err := writer.n.Put(cctx, kv.PutRequest{Collection: "c", Key: []byte(fmt.Sprintf("k%03d", i)), Value: bigValue(i)})
			return err
		})
	}
	// A GC while the follower is away: the snapshot carries the new
	// threshold, which the follower's readers must then check against.
	leader.n.RunGC(ctx)
	gcShard := info.Shards[0].ID
	threshold, err := shard.ReadGCThreshold(leader.n.eng.DB, gcShard)
	if err != nil || threshold == 0 {
		t.Fatalf("shard %d's GC threshold on its leader: %d (%v)", gcShard, threshold, err)
	}
	c.net.heal(follower.id)
	c.eventually(60*time.Second, "the follower serves every write", func() error {
		for i := 0; i < keys; i++ {
			r, err := follower.n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte(fmt.Sprintf("k%03d", i))})
			if err != nil {
				return err
			}
			if !bytes.Equal(r.Value, bigValue(i)) {
				return fmt.Errorf("k%03d holds %d bytes, not the value written", i, len(r.Value))
			}
		}
		return nil
	})
	if got := testutil.ToFloat64(follower.n.metrics.repl.SnapshotsApplied); got == 0 {
		t.Fatalf("the follower caught up without a snapshot; the test does not exercise snapshots")
	}
	if got, err := follower.n.gcThresholds.Get(follower.n.eng.DB, gcShard); err != nil || got < threshold {
		t.Fatalf("after catching up, the follower checks reads of shard %d against GC threshold %d (%v), want %d", gcShard, got, err, threshold)
	}
	var streamed uint64
	for _, tn := range c.nodes {
		streamed += tn.n.tr.SnapshotsStreamed()
	}
	if streamed == 0 {
		t.Fatalf("no snapshot went in chunks; the test does not exercise snapshot streams")
	}
}

func bigValue(i int) []byte {
	return bytes.Repeat([]byte(fmt.Sprintf("%07d,", i)), 1024)
}

// TestClusterSurvivesLossOfFirstNode stops the node that bootstrapped the
// cluster (it led the meta shard and ran the oracle): the others elect a
// new meta leader, versions keep increasing, and collections can still be
// created and written.
func TestClusterSurvivesLossOfFirstNode(t *testing.T) {
	c := startCluster(t, 3, nil)
	ctx := context.Background()
	if _, err := c.node(1).n.CreateCollection(ctx, kv.CollectionOptions{Name: "c", Shards: 3}); err != nil {
		t.Fatal(err)
	}
	v1, err := c.node(2).n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte("k"), Value: []byte("before")})
	if err != nil {
		t.Fatal(err)
	}
	first := c.node(1)
	first.srv.Stop()
	c.net.isolate(1)
	if err := first.n.Close(); err != nil {
		t.Fatal(err)
	}
	var v2 uint64
	c.eventually(30*time.Second, "a write after the first node is gone", func() error {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		v, err := c.node(3).n.Put(cctx, kv.PutRequest{Collection: "c", Key: []byte("k"), Value: []byte("after")})
		v2 = v
		return err
	})
	if v2 <= v1 {
		t.Fatalf("version went from %d to %d", v1, v2)
	}
	c.eventually(30*time.Second, "creating a collection without the first node", func() error {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := c.node(2).n.CreateCollection(cctx, kv.CollectionOptions{Name: "d", Shards: 2})
		if kv.CodeOf(err) == kv.CodeAlreadyExists {
			return nil
		}
		return err
	})
	r, err := c.node(2).n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte("k")})
	if err != nil || string(r.Value) != "after" || r.Version != v2 {
		t.Fatalf("read %q@%d, %v; want after@%d", r.Value, r.Version, err, v2)
	}
}

// dumpCluster logs what every node knows of leaders and timestamps.
func dumpCluster(t testing.TB, c *testCluster) {
	for _, tn := range c.nodes {
		n := tn.n
		s := fmt.Sprintf("node %d oracle=%v ready=%v:", tn.id, n.oracle.Active(), n.Ready())
		for id := range n.localLeaders() {
			cs, _ := n.host.ConfState(id)
			s += fmt.Sprintf(" [shard %d leader=%d hostready=%v voters=%v]", id, n.leaderOf(id), n.host.Ready(id), cs.Voters)
		}
		v := n.versions
		v.mu.Lock()
		s += fmt.Sprintf(" window=%d..%d seq=%d fetching=%v", v.mu.next, v.mu.last, v.mu.seq, v.mu.fetching)
		v.mu.Unlock()
		t.Log(s)
	}
}

// TestClusterNodesWithoutReplicas runs four nodes (the fourth holds a
// learner replica of the meta shard) and a collection of four shards of
// one replica each, one per node: every node answers writes and reads of
// every key, forwarding what it holds no replica of, and scans and
// watches through every node merge the shards of all four nodes.
func TestClusterNodesWithoutReplicas(t *testing.T) {
	c := startCluster(t, 4, nil)
	ctx := context.Background()
	if cs, _ := c.node(1).n.host.ConfState(cluster.MetaShardID); len(cs.Voters) != 3 || len(cs.Learners) != 1 {
		t.Fatalf("meta shard configuration %+v, want 3 voters and 1 learner", cs)
	}
	info, err := c.node(4).n.CreateCollection(ctx, kv.CollectionOptions{Name: "c", Shards: 4, Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.node(4).n.CreateCollection(ctx, kv.CollectionOptions{Name: "big", Shards: 4, Replicas: 1}); err != nil {
		t.Fatal(err)
	}
	holders := map[uint64]int{}
	for _, tn := range c.nodes {
		for _, s := range info.Shards {
			if tn.n.hasReplica(s.ID) {
				holders[tn.id]++
			}
		}
	}
	if len(holders) != 4 {
		t.Fatalf("replicas per node %v, want one shard on each node", holders)
	}
	// Watches start below the first write (a watch from version 1 would
	// be compacted once garbage collection ran: versions are timestamps).
	before, err := c.node(1).n.latest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range c.nodes {
		for i := 0; i < 8; i++ {
			k := []byte(fmt.Sprintf("n%d-k%d", w.id, i))
			c.eventually(30*time.Second, "a write through any node", func() error {
				_, err := w.n.Put(ctx, kv.PutRequest{Collection: "c", Key: k, Value: k})
				return err
			})
		}
	}
	for _, r := range c.nodes {
		for _, w := range c.nodes {
			for i := 0; i < 8; i++ {
				k := []byte(fmt.Sprintf("n%d-k%d", w.id, i))
				got, err := r.n.Get(ctx, kv.GetRequest{Collection: "c", Key: k})
				if err != nil || string(got.Value) != string(k) {
					t.Fatalf("node %d reads %s: %q, %v", r.id, k, got.Value, err)
				}
			}
		}
	}
	// A scan needs every shard: each node reads its own and asks the
	// others for theirs.
	for _, r := range c.nodes {
		res, err := r.n.Scan(ctx, kv.ScanRequest{Collection: "c", Limit: 1000})
		if err != nil || len(res.Items) != 32 {
			t.Fatalf("node %d scans %d records, %v; want 32", r.id, len(res.Items), err)
		}
	}
	// Parts larger than gRPC's default message limit: 40 values of 512 KiB
	// are about 5 MiB per node.
	big := bytes.Repeat([]byte("v"), 512<<10)
	for i := 0; i < 40; i++ {
		if _, err := c.nodes[i%4].n.Put(ctx, kv.PutRequest{Collection: "big", Key: []byte(fmt.Sprintf("b%02d", i)), Value: big}); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range c.nodes {
		res, err := r.n.Scan(ctx, kv.ScanRequest{Collection: "big", Limit: 1000})
		if err != nil || len(res.Items) != 40 {
			t.Fatalf("node %d scans %d large records, %v; want 40", r.id, len(res.Items), err)
		}
	}
	// So does a watch: the parts' events merge in version order.
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	type got struct {
		node uint64
		ev   kv.Event
	}
	events := make(chan got, 256)
	for _, tn := range c.nodes {
		go tn.n.Watch(wctx, kv.WatchRequest{Collection: "c", FromVersion: before}, func(ev kv.Event) error {
			if ev.Type != kv.EventProgress {
				events <- got{tn.id, ev}
			}
			return nil
		})
	}
	seen := map[uint64]map[string]bool{}
	last := map[uint64]uint64{}
	check := func(g got) {
		if g.ev.Type != kv.EventPut || !bytes.Equal(g.ev.Value, g.ev.Key) {
			t.Fatalf("watch through node %d: unexpected event %+v", g.node, g.ev)
		}
		if g.ev.Version <= last[g.node] {
			t.Fatalf("watch through node %d: version %d after %d", g.node, g.ev.Version, last[g.node])
		}
		last[g.node] = g.ev.Version
		if seen[g.node] == nil {
			seen[g.node] = map[string]bool{}
		}
		seen[g.node][string(g.ev.Key)] = true
	}
	for total := 0; total < 4*32; total++ {
		select {
		case g := <-events:
			check(g)
		case <-wctx.Done():
			t.Fatalf("the watches delivered %v of 32 records each", seen)
		}
	}
	if _, err := c.node(1).n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte("late"), Value: []byte("late")}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		select {
		case g := <-events:
			check(g)
			if string(g.ev.Key) != "late" {
				t.Fatalf("after the put the watch through node %d delivered %+v", g.node, g.ev)
			}
		case <-wctx.Done():
			t.Fatal("a watch did not deliver a new write")
		}
	}
}

// TestClusterLeadershipReturns cuts off the preferred leader of a shard,
// lets another replica take over, heals it, and expects leadership back on
// the preferred replica: leaders spread again after a failure.
func TestClusterLeadershipReturns(t *testing.T) {
	c := startCluster(t, 3, nil)
	ctx := context.Background()
	if _, err := c.node(1).n.CreateCollection(ctx, kv.CollectionOptions{Name: "c", Shards: 3}); err != nil {
		t.Fatal(err)
	}
	d, err := c.node(1).n.collection("c")
	if err != nil {
		t.Fatal(err)
	}
	s := d.Shards[1]
	pref := c.node(s.Replicas[0].Node)
	c.leader(s.ID)
	c.net.isolate(pref.id)
	c.eventually(30*time.Second, "another replica leads", func() error {
		for _, tn := range c.nodes {
			if tn != pref && tn.n.host.Ready(s.ID) {
				return nil
			}
		}
		return fmt.Errorf("no other leader yet")
	})
	c.net.heal(pref.id)
	c.eventually(30*time.Second, "leadership back on the preferred replica", func() error {
		if !pref.n.host.Ready(s.ID) {
			return fmt.Errorf("node %d does not lead shard %d", pref.id, s.ID)
		}
		return nil
	})
}

// putRiding puts req through n, riding out elections: a put that answers
// unavailable (not performed) or commit_unknown (perhaps performed) is
// sent again, which only an idempotent put (a fixed value) may be. It
// gives up after a generous deadline that only catches hangs.
func putRiding(ctx context.Context, n *Node, req kv.PutRequest) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := n.Put(ctx, req)
		if c := kv.CodeOf(err); err == nil || c != kv.CodeUnavailable && c != kv.CodeCommitUnknown || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// getRiding reads req through n, riding out elections (unavailable),
// until a generous deadline that only catches hangs.
func getRiding(ctx context.Context, n *Node, req kv.GetRequest) (kv.Record, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, err := n.Get(ctx, req)
		if err == nil || kv.CodeOf(err) != kv.CodeUnavailable || time.Now().After(deadline) {
			return r, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestOracleConfirmationNeedsTheSameLeadership checks that a node whose
// oracle drew a timestamp confirms it only while it still leads the meta
// shard in the term it led when it drew: once the leadership has moved, a
// read barrier still succeeds on the node (its replica asks the new leader
// for the read index), but the timestamp may be below what the new
// leader's oracle has issued, and must not be answered.
func TestOracleConfirmationNeedsTheSameLeadership(t *testing.T) {
	c := startCluster(t, 3, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	old := c.leader(cluster.MetaShardID)
	var term uint64
	c.eventually(30*time.Second, "the oracle is active on the meta leader", func() error {
		var ok bool
		if term, ok = old.n.oracleTerm(); !ok {
			return errors.New("not yet")
		}
		return nil
	})
	if err := old.n.confirmOracle(ctx, term); err != nil {
		t.Fatalf("the meta leader could not confirm its oracle: %v", err)
	}
	cs, ok := old.n.host.ConfState(cluster.MetaShardID)
	if !ok {
		t.Fatal("the meta leader has no meta replica")
	}
	self := old.n.host.Leader(cluster.MetaShardID)
	c.eventually(30*time.Second, "another node leads the meta shard", func() error {
		if _, ok := old.n.oracleTerm(); ok {
			for _, v := range cs.Voters {
				if v != self {
					old.n.host.TransferLeadership(cluster.MetaShardID, v)
					break
				}
			}
			return errors.New("node still leads it")
		}
		for _, tn := range c.nodes {
			if _, ok := tn.n.oracleTerm(); ok {
				return nil
			}
		}
		return errors.New("no oracle is active")
	})
	if err := old.n.readBarrier(ctx, cluster.MetaShardID); err != nil {
		t.Fatalf("a read barrier on the former leader: %v", err)
	}
	if err := old.n.confirmOracle(ctx, term); err == nil {
		t.Fatalf("node %d confirmed its oracle of term %d after the meta shard's leadership had moved", old.id, term)
	}
	// Timestamps asked of the former leader are the new oracle's.
	issued, err := c.leader(cluster.MetaShardID).n.uniqueTimestamp(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if latest, err := old.n.latest(ctx); err != nil || latest < issued {
		t.Fatalf("latest on the former leader answered %d (%v), below the timestamp %d issued before", latest, err, issued)
	}
}
