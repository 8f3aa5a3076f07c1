package groupkv_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/groupkv/groupkv"
	"github.com/groupkv/groupkv/internal/node"
	"github.com/groupkv/groupkv/internal/server"
	pb "github.com/groupkv/groupkv/proto/groupkvpb"
)

// These tests run transactions of a remote DB, whose attempts keep their
// writes in the client until the commit (api.TxnAttempt), against a real
// node, next to the same transactions run embedded, where every write
// reaches the node at once: what fn sees and what the store holds after
// must be the same.

// startTxnNode starts one node with MaxTxnOps maxOps (0: the default)
// and answers a DB dialed to it and one that calls it in this process.
func startTxnNode(t *testing.T, maxOps int) (remote, embedded groupkv.DB) {
	t.Helper()
	s := startTxnServer(t, maxOps)
	remote, err := groupkv.Dial(s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { remote.Close() })
	return remote, groupkv.EmbeddedForTest(s.Node)
}

// startTxnServer starts one node with MaxTxnOps maxOps (0: the default),
// serving HTTP and gRPC at its Addr, and waits until it is ready.
func startTxnServer(t *testing.T, maxOps int) *server.Server {
	t.Helper()
	s, err := server.Start(server.Config{
		Node:   node.Options{DataDir: t.TempDir(), TickInterval: 20 * time.Millisecond, MaxTxnOps: maxOps},
		Listen: "127.0.0.1:0", PeerListen: "127.0.0.1:0",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Node.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

// seen is what a transaction's function saw, versions of committed
// records replaced by 1 (two collections' versions differ).
type seen []any

func (s *seen) rec(rec groupkv.Record, err error) {
	if rec.Version != 0 {
		rec.Version = 1
	}
	*s = append(*s, rec, groupkv.CodeOf(err))
}

func (s *seen) page(res groupkv.ScanResult, err error) {
	for i := range res.Items {
		if res.Items[i].Version != 0 {
			res.Items[i].Version = 1
		}
	}
	*s = append(*s, res.Items, groupkv.CodeOf(err))
}

func (s *seen) items(items []groupkv.BatchGetItem, err error) {
	items = slices.Clone(items)
	for i := range items {
		items[i].Collection = "" // the two DBs' collections differ
		if items[i].Version != 0 {
			items[i].Version = 1
		}
	}
	*s = append(*s, items, groupkv.CodeOf(err))
}

// checkBatch checks a transaction's batch get of keys against want, the
// value of each key found ("-": absent).
func checkBatch(items []groupkv.BatchGetItem, err error, coll string, keys, want []string) error {
	if err != nil {
		return err
	}
	if len(items) != len(keys) {
		return fmt.Errorf("a batch get of %d keys answered %d items", len(keys), len(items))
	}
	for i, it := range items {
		got := "-"
		if it.Found {
			got = string(it.Value)
		}
		if it.Collection != coll || string(it.Key) != keys[i] || got != want[i] {
			return fmt.Errorf("batch get item %d: %s/%s = %q, want %s/%s = %q", i, it.Collection, it.Key, got, coll, keys[i], want[i])
		}
	}
	return nil
}

func TestTransactRemoteKeepsWrites(t *testing.T) {
	for _, p := range []groupkv.Partitioning{groupkv.PartitionHash, groupkv.PartitionTag} {
		t.Run(string(p), func(t *testing.T) { transactRemoteKeepsWrites(t, p) })
	}
}

func transactRemoteKeepsWrites(t *testing.T, partitioning groupkv.Partitioning) {
	remote, embedded := startTxnNode(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A put keeps a live record's placement tag (its first tag) in a tag
	// collection; a hash collection lets the tags change.
	aTags, bTags := []string{"t1", "t2"}, []string(nil)
	if partitioning == groupkv.PartitionTag {
		aTags, bTags = []string{"old", "t2"}, []string{"old"}
	}
	var saw [2]seen
	var after [2]seen
	for i, db := range []groupkv.DB{remote, embedded} {
		coll := []string{"r", "e"}[i]
		if _, err := db.CreateCollection(ctx, groupkv.CollectionOptions{Name: coll, Partitioning: partitioning, Shards: 2}); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"a", "b", "c"} {
			if err := whileUnavailable(func() error {
				_, err := db.Put(ctx, groupkv.PutRequest{Collection: coll, Key: []byte(k), Value: []byte("old-" + k), Tags: []string{"old"}})
				return err
			}); err != nil {
				t.Fatal(err)
			}
		}
		get := func(tx *groupkv.Tx, k string) {
			saw[i].rec(tx.Get(ctx, groupkv.GetRequest{Collection: coll, Key: []byte(k)}))
		}
		err := db.Transact(ctx, func(tx *groupkv.Tx) error {
			saw[i] = nil
			get(tx, "a")
			if err := tx.Put(ctx, groupkv.PutRequest{Collection: coll, Key: []byte("a"), Value: []byte("new-a"), Tags: aTags}); err != nil {
				return err
			}
			if err := tx.Delete(ctx, groupkv.DeleteRequest{Collection: coll, Key: []byte("b")}); err != nil {
				return err
			}
			if err := tx.Put(ctx, groupkv.PutRequest{Collection: coll, Key: []byte("d"), Value: nil}); err != nil {
				return err
			}
			get(tx, "a") // put then get
			get(tx, "b") // delete then get
			get(tx, "d") // an empty value
			get(tx, "c") // not written
			// A batch get: the writes kept and the keys asked of the
			// server, in order, one twice, one absent.
			keys := []string{"c", "a", "b", "x", "d", "c"}
			refs := make([]groupkv.KeyRef, len(keys))
			for j, k := range keys {
				refs[j] = groupkv.KeyRef{Collection: coll, Key: []byte(k)}
			}
			items, err := tx.BatchGet(ctx, refs)
			if err := checkBatch(items, err, coll, keys, []string{"old-c", "new-a", "-", "-", "", "old-c"}); err != nil {
				t.Errorf("%s: %v", coll, err)
			}
			saw[i].items(items, err)
			items, err = tx.BatchGetForUpdate(ctx, refs[:1])
			saw[i].items(items, err)
			if err := tx.Put(ctx, groupkv.PutRequest{Collection: coll, Key: []byte("b"), Value: []byte("again"), Tags: bTags}); err != nil {
				return err
			}
			get(tx, "b") // delete then put then get
			if err := tx.Put(ctx, groupkv.PutRequest{Collection: coll, Key: []byte("e"), Value: []byte("new-e")}); err != nil {
				return err
			}
			if err := tx.Delete(ctx, groupkv.DeleteRequest{Collection: coll, Key: []byte("c")}); err != nil {
				return err
			}
			// Put then scan: the scan sees the writes.
			saw[i].page(tx.Scan(ctx, groupkv.ScanRequest{Collection: coll}))
			saw[i].page(tx.Scan(ctx, groupkv.ScanRequest{Collection: coll, Start: []byte("b"), End: []byte("e")}))
			get(tx, "e") // written before the scan, read after it
			return nil
		})
		if err != nil {
			t.Fatalf("%s: %v", coll, err)
		}
		res, err := db.Scan(ctx, groupkv.ScanRequest{Collection: coll})
		after[i].page(res, err)
	}
	if !reflect.DeepEqual(saw[0], saw[1]) {
		t.Fatalf("the remote transaction saw\n%#v\nthe embedded one\n%#v", saw[0], saw[1])
	}
	if !reflect.DeepEqual(after[0], after[1]) {
		t.Fatalf("after the remote transaction\n%#v\nafter the embedded one\n%#v", after[0], after[1])
	}
	if n := len(after[0][0].([]groupkv.Record)); n != 4 { // a, b, d, e
		t.Fatalf("committed %#v", after[0])
	}
}

// TestTransactRemoteTooLarge checks that writes kept in the client count
// against the node's MaxTxnOps as if sent one by one: the commit fails
// with too_large, nothing is applied, and the attempt is aborted (its
// locks free: a transaction on the same keys commits at once).
func TestTransactRemoteTooLarge(t *testing.T) {
	const maxOps = 8
	remote, embedded := startTxnNode(t, maxOps)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := remote.CreateCollection(ctx, groupkv.CollectionOptions{Name: "c", Shards: 2}); err != nil {
		t.Fatal(err)
	}
	for name, db := range map[string]groupkv.DB{"remote": remote, "embedded": embedded} {
		key := func(i int) []byte { return []byte(fmt.Sprintf("%s%d", name, i)) }
		if err := whileUnavailable(func() error {
			_, err := db.Put(ctx, groupkv.PutRequest{Collection: "c", Key: key(0), Value: []byte("old")})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		runs := 0
		err := db.Transact(ctx, func(tx *groupkv.Tx) error {
			runs++
			if _, err := tx.Get(ctx, groupkv.GetRequest{Collection: "c", Key: key(0)}); err != nil {
				return err
			}
			for i := range maxOps { // one operation too many
				if err := tx.Put(ctx, groupkv.PutRequest{Collection: "c", Key: key(i), Value: []byte("new")}); err != nil {
					return err
				}
			}
			return nil
		})
		if groupkv.CodeOf(err) != groupkv.CodeTooLarge || runs != 1 {
			t.Fatalf("%s: Transact = %v after %d runs, want too_large after one", name, err, runs)
		}
		if rec, err := db.Get(ctx, groupkv.GetRequest{Collection: "c", Key: key(0)}); err != nil || string(rec.Value) != "old" {
			t.Fatalf("%s: key 0 = %q, %v after a failed transaction", name, rec.Value, err)
		}
		if _, err := db.Get(ctx, groupkv.GetRequest{Collection: "c", Key: key(1)}); !errors.Is(err, groupkv.ErrNotFound) {
			t.Fatalf("%s: key 1: %v, want not found", name, err)
		}
		// The failed attempt holds no lock: this one commits well within
		// the transaction timeout.
		qctx, qcancel := context.WithTimeout(ctx, 3*time.Second)
		err = db.Transact(qctx, func(tx *groupkv.Tx) error {
			if err := tx.Put(qctx, groupkv.PutRequest{Collection: "c", Key: key(0), Value: []byte(name)}); err != nil {
				return err
			}
			return tx.Put(qctx, groupkv.PutRequest{Collection: "c", Key: key(1), Value: []byte(name)})
		})
		qcancel()
		if err != nil {
			t.Fatalf("%s: a transaction after the failed one: %v", name, err)
		}
	}
}

// TestGroupTransactRemoteKeepsWrites runs group transactions whose writes
// are kept in the client: they commit, read their own writes, and a write
// of a key that is not a member fails the commit with invalid_argument
// and applies nothing.
func TestGroupTransactRemoteKeepsWrites(t *testing.T) {
	remote, embedded := startTxnNode(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := remote.CreateCollection(ctx, groupkv.CollectionOptions{Name: "g", Shards: 2}); err != nil {
		t.Fatal(err)
	}
	var members []groupkv.KeyRef
	for i := range 3 {
		k := []byte(fmt.Sprintf("m%d", i))
		if err := whileUnavailable(func() error {
			_, err := remote.Put(ctx, groupkv.PutRequest{Collection: "g", Key: k, Value: []byte("0")})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		members = append(members, groupkv.KeyRef{Collection: "g", Key: k})
	}
	if err := whileUnavailable(func() error {
		_, err := remote.CreateGroup(ctx, groupkv.GroupSpec{ID: "room", Leader: members[0], Members: members[1:]})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var saw [2]seen
	for i, db := range []groupkv.DB{remote, embedded} {
		v := []byte(fmt.Sprint(i + 1))
		err := db.Group("room").Transact(ctx, func(tx *groupkv.Tx) error {
			saw[i] = nil
			if err := tx.Put(ctx, groupkv.PutRequest{Collection: "g", Key: []byte("m1"), Value: v}); err != nil {
				return err
			}
			rec, err := tx.Get(ctx, groupkv.GetRequest{Collection: "g", Key: []byte("m1")})
			rec.Value = nil // differs between the two runs
			saw[i].rec(rec, err)
			if err := tx.Delete(ctx, groupkv.DeleteRequest{Collection: "g", Key: []byte("m2")}); err != nil {
				return err
			}
			saw[i].rec(tx.Get(ctx, groupkv.GetRequest{Collection: "g", Key: []byte("m2")}))
			// A batch get of members: its writes, and m0 as stored.
			items, err := tx.BatchGetForUpdate(ctx, []groupkv.KeyRef{members[2], members[0], members[1]})
			if err == nil && (len(items) != 3 || items[0].Found || !items[1].Found || string(items[2].Value) != string(v)) {
				t.Errorf("a group transaction's batch get of m2 (deleted), m0, m1 (put %q): %+v", v, items)
			}
			for j := range items {
				// Differ between the two runs (the first one's writes).
				items[j].Value, items[j].Tags, items[j].Version = nil, nil, 0
			}
			saw[i].items(items, err)
			if err := tx.Put(ctx, groupkv.PutRequest{Collection: "g", Key: []byte("m2"), Value: []byte("back")}); err != nil {
				return err
			}
			// A group write sets tags as a plain put does (docs/groups.md).
			err = tx.Put(ctx, groupkv.PutRequest{Collection: "g", Key: []byte("m0"), Value: v, Tags: []string{"t"}})
			saw[i] = append(saw[i], groupkv.CodeOf(err))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if rec, err := db.Get(ctx, groupkv.GetRequest{Collection: "g", Key: []byte("m1")}); err != nil || string(rec.Value) != string(v) {
			t.Fatalf("m1 = %q, %v after the group transaction", rec.Value, err)
		}
	}
	if !reflect.DeepEqual(saw[0], saw[1]) {
		t.Fatalf("the remote group transaction saw\n%#v\nthe embedded one\n%#v", saw[0], saw[1])
	}

	// A key that is not a member: the commit fails with invalid_argument
	// (embedded: the put), is not retried, and applies nothing.
	for name, db := range map[string]groupkv.DB{"remote": remote, "embedded": embedded} {
		runs := 0
		err := db.Group("room").Transact(ctx, func(tx *groupkv.Tx) error {
			runs++
			if err := tx.Put(ctx, groupkv.PutRequest{Collection: "g", Key: []byte("m1"), Value: []byte("lost")}); err != nil {
				return err
			}
			return tx.Put(ctx, groupkv.PutRequest{Collection: "g", Key: []byte("stranger"), Value: []byte("x")})
		})
		if groupkv.CodeOf(err) != groupkv.CodeInvalidArgument || runs != 1 {
			t.Fatalf("%s: Transact = %v after %d runs, want invalid_argument", name, err, runs)
		}
		if rec, err := db.Get(ctx, groupkv.GetRequest{Collection: "g", Key: []byte("m1")}); err != nil || string(rec.Value) == "lost" {
			t.Fatalf("%s: m1 = %q, %v: a failed group transaction was applied", name, rec.Value, err)
		}
	}
}

// TestGroupTransactRemoteSnapshotReads checks that a remote group
// transaction reads the group's members after its first get from the
// snapshot that get answered, without a request each, as the embedded
// one does on the node; and that the commit validates those reads: a
// member read so and changed by another transaction before the commit
// fails validation, and the function runs again on the new value.
func TestGroupTransactRemoteSnapshotReads(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	remote, embedded, rpcs, _ := startCachedGroup(t, ctx)
	get := func(tx *groupkv.Tx, key string) (string, error) { return getString(ctx, tx, key) }

	// The same reads, remote and embedded, see the same.
	var saw [2][]string
	for i, db := range []groupkv.DB{remote, embedded} {
		rpcs.take()
		err := db.Group("room").Transact(ctx, func(tx *groupkv.Tx) error {
			saw[i] = nil
			for _, k := range []string{"m0", "m1", "m3", "m2", "m1"} {
				v, err := get(tx, k)
				if err != nil {
					return err
				}
				saw[i] = append(saw[i], v)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if n := rpcs.take()["TxnGet"]; i == 0 && n != 1 {
			t.Fatalf("a remote group transaction reading 5 members sent %d TxnGet, want 1 (the rest from its snapshot)", n)
		}
	}
	if !reflect.DeepEqual(saw[0], saw[1]) {
		t.Fatalf("the remote group transaction saw %q, the embedded one %q", saw[0], saw[1])
	}

	// m0 := m1 + m2, with m1 changed by another transaction between the
	// read (from the snapshot) and the commit, in the first run only.
	runs := 0
	err := remote.Group("room").Transact(ctx, func(tx *groupkv.Tx) error {
		runs++
		if _, err := get(tx, "m2"); err != nil { // the first get: the snapshot
			return err
		}
		m1, err := get(tx, "m1")
		if err != nil {
			return err
		}
		if runs == 1 {
			if err := embedded.Group("room").Transact(ctx, func(tx *groupkv.Tx) error {
				return tx.Put(ctx, groupkv.PutRequest{Collection: "g", Key: []byte("m1"), Value: []byte("5")})
			}); err != nil {
				return err
			}
		}
		return tx.Put(ctx, groupkv.PutRequest{Collection: "g", Key: []byte("m0"), Value: []byte(m1 + "+1")})
	})
	if err != nil {
		t.Fatal(err)
	}
	if runs != 2 {
		t.Fatalf("the transaction ran %d times, want 2: a member read from the snapshot and changed before the commit must fail validation", runs)
	}
	if rec, err := remote.Get(ctx, groupkv.GetRequest{Collection: "g", Key: []byte("m0")}); err != nil || string(rec.Value) != "5+1" {
		t.Fatalf("m0 = %q, %v, want 5+1", rec.Value, err)
	}

	// A group whose values pass the snapshot's bound is read one get at
	// a time, and reads the same.
	big := bytes.Repeat([]byte("b"), 70<<10)
	if _, err := remote.Put(ctx, groupkv.PutRequest{Collection: "g", Key: []byte("big"), Value: big}); err != nil {
		t.Fatal(err)
	}
	if _, err := remote.CreateGroup(ctx, groupkv.GroupSpec{ID: "hall", Leader: groupkv.KeyRef{Collection: "g", Key: []byte("big")},
		Members: []groupkv.KeyRef{{Collection: "g", Key: []byte("h1")}, {Collection: "g", Key: []byte("h2")}}}); err != nil {
		t.Fatal(err)
	}
	rpcs.take()
	err = remote.Group("hall").Transact(ctx, func(tx *groupkv.Tx) error {
		for _, k := range []string{"h1", "big", "h2"} {
			v, err := get(tx, k)
			if err != nil {
				return err
			}
			if want := map[string]string{"h1": "absent", "h2": "absent", "big": string(big)}[k]; v != want {
				return fmt.Errorf("%s reads %d bytes, want %d", k, len(v), len(want))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := rpcs.take()["TxnGet"]; n != 3 {
		t.Fatalf("a group past the snapshot's bound: 3 reads sent %d TxnGet, want 3", n)
	}
}

// TestGroupSnapshotReadsRefused sends the snapshot forms of the gRPC
// service bad input, with a bare client: snapshot_reads in a commit that
// begins its attempt, in a transaction that is not a group's, naming a
// key that is not a member, or an invalid key. Each is refused with
// invalid_argument saying what was wrong, and the commit's write is not
// applied.
func TestGroupSnapshotReadsRefused(t *testing.T) {
	s := startTxnServer(t, 0)
	remote, err := groupkv.Dial(s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer remote.Close()
	conn, err := grpc.NewClient(s.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := pb.NewGroupKVClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := remote.CreateCollection(ctx, groupkv.CollectionOptions{Name: "g", Shards: 2}); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"m0", "m1"} {
		if err := whileUnavailable(func() error {
			_, err := remote.Put(ctx, groupkv.PutRequest{Collection: "g", Key: []byte(k), Value: []byte("0")})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := remote.CreateGroup(ctx, groupkv.GroupSpec{ID: "room", Leader: groupkv.KeyRef{Collection: "g", Key: []byte("m0")},
		Members: []groupkv.KeyRef{{Collection: "g", Key: []byte("m1")}}}); err != nil {
		t.Fatal(err)
	}
	put := []*pb.TxnOp{{Op: "put", Collection: "g", Key: []byte("m0"), Value: []byte("lost")}}
	reads := func(keys ...string) []*pb.KeyRef {
		var out []*pb.KeyRef
		for _, k := range keys {
			out = append(out, &pb.KeyRef{Collection: "g", Key: []byte(k)})
		}
		return out
	}
	// groupAttempt begins a group attempt by a get that asks for the
	// snapshot, and checks that it came.
	groupAttempt := func() string {
		m, err := c.TxnGet(ctx, &pb.TxnGetRequest{Begin: &pb.TxnBegin{Group: "room"}, Collection: "g", Key: []byte("m0"), GroupSnapshot: true})
		if err != nil {
			t.Fatal(err)
		}
		if len(m.GetSnapshot()) != 2 {
			t.Fatalf("the snapshot holds %d members, want 2", len(m.GetSnapshot()))
		}
		return m.GetTxn()
	}
	general, err := c.BeginTxn(ctx, &pb.BeginTxnRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		req  *pb.CommitTxnRequest
		want string
	}{
		{"begun by its commit", &pb.CommitTxnRequest{Begin: &pb.TxnBegin{Group: "room"}, Writes: put, SnapshotReads: reads("m1")}, "begun by its commit"},
		{"not a group transaction", &pb.CommitTxnRequest{Txn: general.GetTxn(), Writes: put, SnapshotReads: reads("m1")}, "not a group transaction"},
		{"not a member", &pb.CommitTxnRequest{Txn: groupAttempt(), Writes: put, SnapshotReads: reads("m1", "stranger")}, "not a member"},
		{"an invalid key", &pb.CommitTxnRequest{Txn: groupAttempt(), Writes: put, SnapshotReads: reads("")}, "snapshot_reads[0]"},
	} {
		_, err := c.CommitTxn(ctx, tc.req)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.want) {
			t.Errorf("%s: CommitTxn = %v, want invalid_argument saying %q", tc.name, err, tc.want)
		}
	}
	if rec, err := remote.Get(ctx, groupkv.GetRequest{Collection: "g", Key: []byte("m0")}); err != nil || string(rec.Value) != "0" {
		t.Fatalf("m0 = %q, %v after refused commits; want 0", rec.Value, err)
	}
}

// TestTransactContextEndsInFn: a function that ends its transaction's
// context and goes on reading gets the context's error from the read, and
// Transact a *TxnContextError, with nothing written, remote and embedded
// alike (the node refuses an operation whose context ended).
func TestTransactContextEndsInFn(t *testing.T) {
	remote, embedded := startTxnNode(t, 0)
	bg, cancelAll := context.WithTimeout(context.Background(), time.Minute)
	defer cancelAll()
	for i, db := range []groupkv.DB{remote, embedded} {
		coll := []string{"r", "e"}[i]
		if _, err := db.CreateCollection(bg, groupkv.CollectionOptions{Name: coll, Shards: 2}); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(bg)
		var readErr error
		err := db.Transact(ctx, func(tx *groupkv.Tx) error {
			if err := tx.Put(ctx, groupkv.PutRequest{Collection: coll, Key: []byte("a"), Value: []byte("1")}); err != nil {
				return err
			}
			cancel()
			_, readErr = tx.Get(ctx, groupkv.GetRequest{Collection: coll, Key: []byte("b")})
			return readErr
		})
		var ce *groupkv.TxnContextError
		if !errors.As(err, &ce) || !errors.Is(err, context.Canceled) {
			t.Fatalf("%s: Transact = %v (the read answered %v), want a *TxnContextError matching context.Canceled", coll, err, readErr)
		}
		if !errors.Is(readErr, context.Canceled) {
			t.Fatalf("%s: the read after the context ended answered %v, want its error", coll, readErr)
		}
		if _, err := db.Get(bg, groupkv.GetRequest{Collection: coll, Key: []byte("a")}); !errors.Is(err, groupkv.ErrNotFound) {
			t.Fatalf("%s: the abandoned transaction's write: %v, want not found", coll, err)
		}
	}
}
