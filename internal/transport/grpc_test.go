package transport

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"reflect"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/replication"
	"github.com/groupkv/groupkv/internal/shard"
	"github.com/groupkv/groupkv/internal/storage"
	"github.com/groupkv/groupkv/proto/transportpb"
)

// testDesc is a hash collection's only shard, owning every bucket.
var testDesc = shard.Desc{ShardID: 7, Collection: 1, Partitioning: kv.PartitionHash, BucketStart: 0, BucketEnd: kv.NumBuckets}

// sharedVersions is one oracle for every host of a test.
type sharedVersions struct {
	mu   sync.Mutex
	last uint64
}

func (v *sharedVersions) TryNext(floor uint64) (uint64, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.last = max(v.last+1, floor+1)
	return v.last, true
}

func testLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

func putCmd(key, value string) []byte {
	return shard.EncodeWrite([]shard.Op{{Type: shard.OpPut, Bucket: cluster.Bucket([]byte(key)), Key: []byte(key), Value: []byte(value)}})
}

// serve starts a gRPC server with the raft service on a free local port.
func serve(t *testing.T, deliver func(replication.Message)) (*grpc.Server, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	Register(s, deliver)
	go s.Serve(lis)
	return s, lis.Addr().String()
}

// TestGRPCThreeReplicas runs one shard as a three-voter raft group over
// three Hosts that talk through gRPC: a leader is elected, writes reach every
// replica, and after the leader's server and Host stop the other two elect a
// new leader that takes more writes.
func TestGRPCThreeReplicas(t *testing.T) {
	seed := rand.Uint64()
	if s := os.Getenv("GROUPKV_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d", seed)
	vs := &sharedVersions{}
	type node struct {
		host    *replication.Host
		eng     *storage.Engine
		srv     *grpc.Server
		tr      *GRPC
		stopped bool
	}
	nodes := map[uint64]*node{}
	// The Host is created after its server, whose deliver must find it.
	var hostsMu sync.Mutex
	addrs := map[uint64]string{}
	for id := uint64(1); id <= 3; id++ {
		n := &node{}
		nodes[id] = n
		srv, addr := serve(t, func(m replication.Message) {
			hostsMu.Lock()
			h := n.host
			hostsMu.Unlock()
			if h != nil {
				h.Deliver(m)
			}
		})
		n.srv = srv
		addrs[id] = addr
	}
	resolve := func(shardID, replicaID uint64) (uint64, string, bool) {
		addr, ok := addrs[replicaID]
		return replicaID, addr, ok && shardID == testDesc.ShardID
	}
	for id := uint64(1); id <= 3; id++ {
		n := nodes[id]
		eng, err := storage.Open("/data", storage.Options{FS: vfs.NewMem(), Logger: testLogger()})
		if err != nil {
			t.Fatal(err)
		}
		n.eng = eng
		n.tr = NewGRPC(Options{Resolver: resolve, Logger: testLogger()})
		h := replication.NewHost(replication.Config{NodeID: id, Engine: eng, Versions: vs, Transport: n.tr,
			TickInterval: 5 * time.Millisecond, Logger: testLogger(),
			ElectionTicks: 10 + rand.New(rand.NewPCG(seed, id)).IntN(10)})
		if err := h.Bootstrap(testDesc.ShardID, []uint64{1, 2, 3}, nil); err != nil {
			t.Fatal(err)
		}
		hostsMu.Lock()
		n.host = h
		hostsMu.Unlock()
	}
	for id, n := range nodes {
		n.host.Start()
		if err := n.host.AddGroup(testDesc, id); err != nil {
			t.Fatal(err)
		}
	}
	stop := func(n *node) {
		if n.stopped {
			return
		}
		n.stopped = true
		n.srv.Stop()
		n.host.Stop()
		n.tr.Close()
	}
	defer func() {
		for _, n := range nodes {
			stop(n)
		}
		for _, n := range nodes {
			n.eng.Close()
		}
	}()

	leader := func(except uint64) uint64 {
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			for id, n := range nodes {
				if id != except && n.host.Ready(testDesc.ShardID) {
					return id
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Fatalf("seed %d: no leader elected within 20s", seed)
		return 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	acked := map[string]uint64{}
	write := func(h *replication.Host, n int, prefix string) {
		for i := range n {
			key := prefix + strconv.Itoa(i)
			res, err := h.Propose(ctx, testDesc.ShardID, putCmd(key, "v"+key))
			if err != nil || res.Err != nil {
				t.Fatalf("seed %d: put %s: %v %v", seed, key, err, res.Err)
			}
			acked[key] = res.Version
		}
	}
	// converge waits until every replica in ids applied every acked write.
	converge := func(ids ...uint64) {
		deadline := time.Now().Add(20 * time.Second)
		for _, id := range ids {
			for key, version := range acked {
				for {
					val, v, found, err := shard.ReadRecord(nodes[id].eng.DB, testDesc.Collection, []byte(key), shard.Latest)
					if err != nil {
						t.Fatal(err)
					}
					if found && v == version && string(val.Value) == "v"+key {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("seed %d: replica %d lacks %s@%d (found %v at %d)", seed, id, key, version, found, v)
					}
					time.Sleep(5 * time.Millisecond)
				}
			}
		}
	}
	first := leader(0)
	write(nodes[first].host, 100, "a")
	converge(1, 2, 3)

	stop(nodes[first])
	second := leader(first)
	write(nodes[second].host, 50, "b")
	var rest []uint64
	for id := range nodes {
		if id != first {
			rest = append(rest, id)
		}
	}
	converge(rest...)
}

// TestSendNeverBlocks sends to a node nobody listens on: every Send returns
// at once and what cannot be delivered is counted as dropped.
func TestSendNeverBlocks(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	tr := NewGRPC(Options{
		Resolver: func(shardID, replicaID uint64) (uint64, string, bool) {
			return replicaID, addr, replicaID != 9
		},
		QueueLen: 8,
		Logger:   testLogger(),
	})
	defer tr.Close()
	const n = 10000
	start := time.Now()
	for i := range n {
		tr.Send([]replication.Message{{ShardID: uint64(i % 3), Msg: raftpb.Message{Type: raftpb.MsgHeartbeat, From: 1, To: 2, Term: 1}}})
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("%d Sends took %v", n, d)
	}
	if tr.Dropped() == 0 {
		t.Fatalf("no drops after %d messages to an unreachable node with a queue of 8", n)
	}
	// An unresolvable replica is dropped too.
	before := tr.Dropped()
	tr.Send([]replication.Message{{ShardID: 1, Msg: raftpb.Message{Type: raftpb.MsgHeartbeat, From: 1, To: 9}}})
	if got := tr.Dropped(); got < before+1 {
		t.Fatalf("unresolvable message not counted: dropped %d, was %d", got, before)
	}
	// Eventually everything queued is dropped: nothing is stuck.
	deadline := time.Now().Add(20 * time.Second)
	for tr.Dropped() < n+1 {
		if time.Now().After(deadline) {
			t.Fatalf("dropped %d of %d undeliverable messages", tr.Dropped(), n+1)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Sends after Close return at once and drop.
	tr.Close()
	tr.Send([]replication.Message{{ShardID: 1, Msg: raftpb.Message{Type: raftpb.MsgHeartbeat, From: 1, To: 2}}})
	if got := tr.Dropped(); got != n+2 {
		t.Fatalf("dropped %d after Close, want %d", got, n+2)
	}
}

// testMessages returns raft messages of several shards and kinds.
func testMessages() []replication.Message {
	return []replication.Message{
		{ShardID: 1, Msg: raftpb.Message{Type: raftpb.MsgApp, From: 1, To: 2, Term: 3, LogTerm: 3, Index: 10, Commit: 9,
			Entries: []raftpb.Entry{{Term: 3, Index: 11, Type: raftpb.EntryNormal, Data: []byte("put a")}, {Term: 3, Index: 12, Data: []byte("put b")}}}},
		{ShardID: 2, Msg: raftpb.Message{Type: raftpb.MsgHeartbeat, From: 1, To: 2, Term: 5, Commit: 40}},
		{ShardID: 3, Msg: raftpb.Message{Type: raftpb.MsgVote, From: 1, To: 2, Term: 8, LogTerm: 7, Index: 100}},
		{ShardID: 1, Msg: raftpb.Message{Type: raftpb.MsgAppResp, From: 1, To: 2, Term: 3, Index: 12, Reject: true, RejectHint: 5}},
	}
}

// collector is a fake deliver that records what it is given.
type collector struct {
	mu   sync.Mutex
	msgs []replication.Message
}

func (c *collector) deliver(m replication.Message) {
	c.mu.Lock()
	c.msgs = append(c.msgs, m)
	c.mu.Unlock()
}

func (c *collector) wait(t *testing.T, n int) []replication.Message {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		c.mu.Lock()
		got := append([]replication.Message(nil), c.msgs...)
		c.mu.Unlock()
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("received %d of %d messages", len(got), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestServerBatch sends one RaftBatch of messages of several shards over a
// raw client stream; the server delivers each intact and in order.
func TestServerBatch(t *testing.T) {
	c := &collector{}
	srv, addr := serve(t, c.deliver)
	defer srv.Stop()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := transportpb.NewRaftTransportClient(conn).Raft(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := testMessages()
	batch := &transportpb.RaftBatch{}
	for _, m := range want {
		b, err := m.Msg.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		batch.Envelopes = append(batch.Envelopes, &transportpb.Envelope{ShardId: m.ShardID, Msg: b})
	}
	if err := stream.Send(batch); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.CloseAndRecv(); err != nil {
		t.Fatal(err)
	}
	if got := c.wait(t, len(want)); !reflect.DeepEqual(got, want) {
		t.Fatalf("delivered\n%+v\nwant\n%+v", got, want)
	}
}

// TestGRPCSendDelivers sends messages of several shards through the
// transport to one node; they arrive intact and in order.
func TestGRPCSendDelivers(t *testing.T) {
	c := &collector{}
	srv, addr := serve(t, c.deliver)
	defer srv.Stop()
	tr := NewGRPC(Options{
		Resolver: func(shardID, replicaID uint64) (uint64, string, bool) { return replicaID, addr, true },
		Logger:   testLogger(),
	})
	defer tr.Close()
	want := testMessages()
	for _, m := range want {
		tr.Send([]replication.Message{m})
	}
	if got := c.wait(t, len(want)); !reflect.DeepEqual(got, want) {
		t.Fatalf("delivered\n%+v\nwant\n%+v", got, want)
	}
	if d := tr.Dropped(); d != 0 {
		t.Fatalf("dropped %d", d)
	}
}

// TestSnapshotStreamsInChunks sends a raft snapshot far larger than a batch:
// it travels on a stream of its own in chunks and arrives whole, and the
// sender is told it went through.
func TestSnapshotStreamsInChunks(t *testing.T) {
	c := &collector{}
	srv, addr := serve(t, c.deliver)
	defer srv.Stop()
	sent := make(chan bool, 1)
	tr := NewGRPC(Options{
		Resolver:      func(shardID, replicaID uint64) (uint64, string, bool) { return replicaID, addr, true },
		MaxBatchBytes: 64 << 10,
		SnapshotSent:  func(shardID, to uint64, ok bool) { sent <- ok },
		Logger:        testLogger(),
	})
	defer tr.Close()
	data := make([]byte, 3<<20+12345)
	for i := range data {
		data[i] = byte(i * 7)
	}
	m := replication.Message{ShardID: 42, Msg: raftpb.Message{Type: raftpb.MsgSnap, From: 1, To: 2, Term: 7,
		Snapshot: &raftpb.Snapshot{Data: data, Metadata: raftpb.SnapshotMetadata{Index: 100, Term: 6,
			ConfState: raftpb.ConfState{Voters: []uint64{1, 2, 3}}}}}}
	tr.Send([]replication.Message{m})
	got := c.wait(t, 1)
	if !reflect.DeepEqual(got[0], m) {
		t.Fatalf("the snapshot arrived changed: shard %d, %d bytes, metadata %+v", got[0].ShardID, len(got[0].Msg.Snapshot.Data), got[0].Msg.Snapshot.Metadata)
	}
	select {
	case ok := <-sent:
		if !ok {
			t.Fatal("the sender was told the snapshot failed")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the sender was not told how the snapshot went")
	}
	// A snapshot to an address that does not answer is reported failed.
	tr2 := NewGRPC(Options{
		Resolver:      func(shardID, replicaID uint64) (uint64, string, bool) { return replicaID, "127.0.0.1:1", true },
		MaxBatchBytes: 64 << 10,
		SnapshotSent:  func(shardID, to uint64, ok bool) { sent <- ok },
		Logger:        testLogger(),
	})
	defer tr2.Close()
	tr2.Send([]replication.Message{m})
	select {
	case ok := <-sent:
		if ok {
			t.Fatal("a snapshot to a dead address was reported sent")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a snapshot to a dead address was never reported")
	}
}
