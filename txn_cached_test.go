package groupkv_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/groupkv/groupkv"
	"github.com/groupkv/groupkv/internal/api"
	pb "github.com/groupkv/groupkv/proto/groupkvpb"
)

// rpcCounter counts a remote DB's requests by the name of their unary
// RPC: the unary RPCs, and the messages of the Pipeline stream as the RPC
// that would serve them (api.PipelineMethod).
type rpcCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *rpcCounter) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	c.add(method[strings.LastIndex(method, "/")+1:])
	return invoker(ctx, method, req, reply, cc, opts...)
}

func (c *rpcCounter) add(method string) {
	c.mu.Lock()
	c.n[method]++
	c.mu.Unlock()
}

// interceptStream counts the requests sent on a Pipeline stream.
func (c *rpcCounter) interceptStream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return nil, err
	}
	return countedStream{s, c}, nil
}

type countedStream struct {
	grpc.ClientStream
	c *rpcCounter
}

func (s countedStream) SendMsg(m any) error {
	if r, ok := m.(*pb.PipelineRequest); ok {
		for _, q := range append(r.GetBatch(), r) {
			if name := api.PipelineMethod(q); name != "" {
				s.c.add(name)
			}
		}
	}
	return s.ClientStream.SendMsg(m)
}

// take answers the counts so far and starts again.
func (c *rpcCounter) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.n
	c.n = map[string]int{}
	return n
}

// startCachedGroup starts a server with collection g holding m0, m1, m2
// ("1" each; m3 absent) and group room of the four, and answers it with a
// remote DB whose RPCs c counts.
func startCachedGroup(t *testing.T, ctx context.Context) (groupkv.DB, groupkv.DB, *rpcCounter, string) {
	t.Helper()
	s := startTxnServer(t, 0)
	c := &rpcCounter{n: map[string]int{}}
	remote, err := groupkv.Dial(s.Addr(), groupkv.WithGRPCDialOptions(grpc.WithChainUnaryInterceptor(c.intercept), grpc.WithChainStreamInterceptor(c.interceptStream)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { remote.Close() })
	if _, err := remote.CreateCollection(ctx, groupkv.CollectionOptions{Name: "g", Shards: 2}); err != nil {
		t.Fatal(err)
	}
	var members []groupkv.KeyRef
	for i := range 4 {
		k := []byte(fmt.Sprintf("m%d", i))
		members = append(members, groupkv.KeyRef{Collection: "g", Key: k})
		if i == 3 {
			continue
		}
		if err := whileUnavailable(func() error {
			_, err := remote.Put(ctx, groupkv.PutRequest{Collection: "g", Key: k, Value: []byte("1")})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := whileUnavailable(func() error {
		_, err := remote.CreateGroup(ctx, groupkv.GroupSpec{ID: "room", Leader: members[0], Members: members[1:]})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return remote, groupkv.EmbeddedForTest(s.Node), c, s.Addr()
}

func getString(ctx context.Context, tx *groupkv.Tx, key string) (string, error) {
	rec, err := tx.Get(ctx, groupkv.GetRequest{Collection: "g", Key: []byte(key)})
	if errors.Is(err, groupkv.ErrNotFound) {
		return "absent", nil
	}
	return string(rec.Value), err
}

// TestGroupTransactCachedSnapshot: with WithCachedSnapshot, a remote
// group transaction reads from the snapshot the previous commit brought
// back and sends only its commit; the commit validates those reads, so
// that a member changed by another client since makes the function run
// again on the new value — a transaction that only reads too, which
// would otherwise answer a stale value.
func TestGroupTransactCachedSnapshot(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	remote, embedded, rpcs, _ := startCachedGroup(t, ctx)
	cached := groupkv.WithCachedSnapshot()
	transact := func(fn func(tx *groupkv.Tx) error) (int, map[string]int) {
		t.Helper()
		rpcs.take()
		runs := 0
		if err := remote.Group("room").Transact(ctx, func(tx *groupkv.Tx) error { runs++; return fn(tx) }, cached); err != nil {
			t.Fatal(err)
		}
		return runs, rpcs.take()
	}
	put := func(tx *groupkv.Tx, key, value string) error {
		return tx.Put(ctx, groupkv.PutRequest{Collection: "g", Key: []byte(key), Value: []byte(value)})
	}

	// No snapshot kept yet: the first get brings one, the commit another.
	_, n := transact(func(tx *groupkv.Tx) error {
		m1, err := getString(ctx, tx, "m1")
		if err != nil {
			return err
		}
		return put(tx, "m0", m1+"+a")
	})
	if n["TxnGet"] != 1 || n["CommitTxn"] != 1 || len(n) != 2 {
		t.Fatalf("first transaction sent %v, want one TxnGet and one CommitTxn", n)
	}
	// From the snapshot kept, which has the first commit's write: the
	// commit alone.
	var saw []string
	_, n = transact(func(tx *groupkv.Tx) error {
		saw = nil
		for _, k := range []string{"m0", "m3", "m2"} {
			v, err := getString(ctx, tx, k)
			if err != nil {
				return err
			}
			saw = append(saw, v)
		}
		return put(tx, "m2", "2")
	})
	if n["CommitTxn"] != 1 || len(n) != 1 {
		t.Fatalf("transaction on the snapshot kept sent %v, want its commit alone", n)
	}
	if got := strings.Join(saw, " "); got != "1+a absent 1" {
		t.Fatalf("read %q from the snapshot kept, want %q", got, "1+a absent 1")
	}

	// Another client changes m1: a transaction reading it from the
	// snapshot kept fails validation and runs again on the new value.
	if err := embedded.Group("room").Transact(ctx, func(tx *groupkv.Tx) error { return put(tx, "m1", "5") }); err != nil {
		t.Fatal(err)
	}
	runs, _ := transact(func(tx *groupkv.Tx) error {
		m1, err := getString(ctx, tx, "m1")
		if err != nil {
			return err
		}
		return put(tx, "m0", m1+"+b")
	})
	if runs != 2 {
		t.Fatalf("a transaction that read a member changed since the snapshot kept ran %d times, want 2", runs)
	}
	if rec, err := remote.Get(ctx, groupkv.GetRequest{Collection: "g", Key: []byte("m0")}); err != nil || string(rec.Value) != "5+b" {
		t.Fatalf("m0 = %q, %v, want 5+b", rec.Value, err)
	}

	// The same for a transaction that writes nothing: it must not answer
	// the stale value.
	if err := embedded.Group("room").Transact(ctx, func(tx *groupkv.Tx) error { return put(tx, "m2", "7") }); err != nil {
		t.Fatal(err)
	}
	var m2 string
	runs, _ = transact(func(tx *groupkv.Tx) error {
		var err error
		m2, err = getString(ctx, tx, "m2")
		return err
	})
	if runs != 2 || m2 != "7" {
		t.Fatalf("a read-only transaction on a stale snapshot ran %d times and read m2 = %q, want 2 runs and 7", runs, m2)
	}
	// Read-only on a current snapshot: one commit, one run.
	runs, n = transact(func(tx *groupkv.Tx) error {
		var err error
		m2, err = getString(ctx, tx, "m2")
		return err
	})
	if runs != 1 || m2 != "7" || n["CommitTxn"] != 1 || len(n) != 1 {
		t.Fatalf("a read-only transaction on a current snapshot ran %d times, read %q, sent %v", runs, m2, n)
	}

	// A get the snapshot cannot answer (not a member) runs the function
	// again on the server's snapshot, which answers invalid_argument.
	runs = 0
	err := remote.Group("room").Transact(ctx, func(tx *groupkv.Tx) error {
		runs++
		_, err := getString(ctx, tx, "stranger")
		return err
	}, cached)
	if groupkv.CodeOf(err) != groupkv.CodeInvalidArgument || runs != 2 {
		t.Fatalf("a get of a non-member from the snapshot kept: %v after %d runs, want invalid_argument after 2", err, runs)
	}

	// Without the option nothing is read from a snapshot kept.
	rpcs.take()
	if err := remote.Group("room").Transact(ctx, func(tx *groupkv.Tx) error {
		_, err := getString(ctx, tx, "m1")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if n := rpcs.take(); n["TxnGet"] != 1 {
		t.Fatalf("a transaction without the option sent %v, want a TxnGet", n)
	}
}

// TestGroupTransactCachedSnapshotBank: clients each keeping their own
// snapshot of one group move amounts between its members. Every run of
// every function, including those that fail validation after, reads
// members that sum to the total (a snapshot kept is one state of the
// group), and the total holds at the end.
func TestGroupTransactCachedSnapshotBank(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	remote, _, _, addr := startCachedGroup(t, ctx)
	// Members m0..m2 hold 1 each, m3 is absent: a total of 3, read as
	// numbers (absent is 0).
	num := func(tx *groupkv.Tx, key string) (int, error) {
		v, err := getString(ctx, tx, key)
		if err != nil || v == "absent" {
			return 0, err
		}
		return strconv.Atoi(v)
	}
	const clients, moves, total = 3, 25, 3
	dbs := []groupkv.DB{remote}
	for len(dbs) < clients {
		db, err := groupkv.Dial(addr)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		dbs = append(dbs, db)
	}
	var bad atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for c, db := range dbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range moves {
				from, to := fmt.Sprintf("m%d", (c+i)%4), fmt.Sprintf("m%d", (c+i+1)%4)
				err := db.Group("room").Transact(ctx, func(tx *groupkv.Tx) error {
					sum := 0
					vals := map[string]int{}
					for _, k := range []string{"m0", "m1", "m2", "m3"} {
						v, err := num(tx, k)
						if err != nil {
							return err
						}
						vals[k] = v
						sum += v
					}
					if sum != total {
						bad.Add(1)
					}
					if vals[from] == 0 {
						return nil
					}
					if err := tx.Put(ctx, groupkv.PutRequest{Collection: "g", Key: []byte(from), Value: []byte(strconv.Itoa(vals[from] - 1))}); err != nil {
						return err
					}
					return tx.Put(ctx, groupkv.PutRequest{Collection: "g", Key: []byte(to), Value: []byte(strconv.Itoa(vals[to] + 1))})
				}, groupkv.WithCachedSnapshot())
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := bad.Load(); n != 0 {
		t.Fatalf("%d runs read members that do not sum to %d", n, total)
	}
	sum := 0
	for _, k := range []string{"m0", "m1", "m2", "m3"} {
		rec, err := remote.Get(ctx, groupkv.GetRequest{Collection: "g", Key: []byte(k)})
		if errors.Is(err, groupkv.ErrNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		v, err := strconv.Atoi(string(rec.Value))
		if err != nil {
			t.Fatal(err)
		}
		sum += v
	}
	if sum != total {
		t.Fatalf("the members sum to %d at the end, want %d", sum, total)
	}
}

// TestGroupCachedReadsRefused: cached_reads with snapshot_reads, in a
// general transaction, naming a non-member or an invalid key are refused
// with invalid_argument saying so, and the commit's write is not applied;
// a stale one answers txn_aborted and applies nothing either.
func TestGroupCachedReadsRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	remote, _, _, addr := startCachedGroup(t, ctx)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := pb.NewGroupKVClient(conn)
	// A commit that asks for the snapshot brings the members' versions.
	m, err := c.CommitTxn(ctx, &pb.CommitTxnRequest{Begin: &pb.TxnBegin{Group: "room"}, GroupSnapshot: true,
		Writes: []*pb.TxnOp{{Op: "put", Collection: "g", Key: []byte("m0"), Value: []byte("2")}}})
	if err != nil {
		t.Fatal(err)
	}
	versions := map[string]*pb.BatchGetItem{}
	for _, it := range m.GetSnapshot() {
		versions[string(it.GetKey())] = it
	}
	if len(versions) != 4 || string(versions["m0"].GetValue()) != "2" || versions["m0"].GetVersion() != m.GetVersion() || versions["m3"].GetFound() {
		t.Fatalf("the commit's snapshot: %v (commit version %d)", m.GetSnapshot(), m.GetVersion())
	}
	read := func(key string, version uint64, found bool) *pb.BatchGetItem {
		return &pb.BatchGetItem{Collection: "g", Key: []byte(key), Version: version, Found: found}
	}
	cur := func(key string) *pb.BatchGetItem {
		it := versions[key]
		return read(key, it.GetVersion(), it.GetFound())
	}
	put := []*pb.TxnOp{{Op: "put", Collection: "g", Key: []byte("m0"), Value: []byte("lost")}}
	general, err := c.BeginTxn(ctx, &pb.BeginTxnRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// groupAttempt begins a group attempt by a get that asks for the
	// group's snapshot.
	groupAttempt := func() string {
		m, err := c.TxnGet(ctx, &pb.TxnGetRequest{Begin: &pb.TxnBegin{Group: "room"}, Collection: "g", Key: []byte("m0"), GroupSnapshot: true})
		if err != nil {
			t.Fatal(err)
		}
		return m.GetTxn()
	}
	for _, tc := range []struct {
		name string
		req  *pb.CommitTxnRequest
		code codes.Code
		want string
	}{
		{"with snapshot_reads", &pb.CommitTxnRequest{Txn: groupAttempt(), Writes: put, CachedReads: []*pb.BatchGetItem{cur("m1")},
			SnapshotReads: []*pb.KeyRef{{Collection: "g", Key: []byte("m1")}}}, codes.InvalidArgument, "not both"},
		{"not a group transaction", &pb.CommitTxnRequest{Txn: general.GetTxn(), Writes: put, CachedReads: []*pb.BatchGetItem{cur("m1")}}, codes.InvalidArgument, "not a group transaction"},
		{"not a member", &pb.CommitTxnRequest{Begin: &pb.TxnBegin{Group: "room"}, Writes: put, CachedReads: []*pb.BatchGetItem{cur("m1"), read("stranger", 1, true)}}, codes.InvalidArgument, "not a member"},
		{"an invalid key", &pb.CommitTxnRequest{Begin: &pb.TxnBegin{Group: "room"}, Writes: put, CachedReads: []*pb.BatchGetItem{read("", 1, true)}}, codes.InvalidArgument, "cached_reads[0]"},
		{"stale", &pb.CommitTxnRequest{Begin: &pb.TxnBegin{Group: "room"}, Writes: put, CachedReads: []*pb.BatchGetItem{read("m0", versions["m0"].GetVersion()-1, true)}}, codes.Aborted, "at version"},
		{"absent read found", &pb.CommitTxnRequest{Begin: &pb.TxnBegin{Group: "room"}, Writes: put, CachedReads: []*pb.BatchGetItem{read("m3", versions["m3"].GetVersion(), true)}}, codes.Aborted, "at version"},
	} {
		_, err := c.CommitTxn(ctx, tc.req)
		if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.want) {
			t.Errorf("%s: CommitTxn = %v, want %v saying %q", tc.name, err, tc.code, tc.want)
		}
	}
	if rec, err := remote.Get(ctx, groupkv.GetRequest{Collection: "g", Key: []byte("m0")}); err != nil || string(rec.Value) != "2" {
		t.Fatalf("m0 = %q, %v after refused commits; want 2", rec.Value, err)
	}
	// Current cached reads commit, in one request that begins the attempt.
	if _, err := c.CommitTxn(ctx, &pb.CommitTxnRequest{Begin: &pb.TxnBegin{Group: "room"}, Writes: put, CachedReads: []*pb.BatchGetItem{cur("m0"), cur("m3")}}); err != nil {
		t.Fatalf("a commit with current cached reads: %v", err)
	}
}
