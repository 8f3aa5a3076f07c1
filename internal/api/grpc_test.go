package api_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	groupkv "github.com/groupkv/groupkv"
	"github.com/groupkv/groupkv/internal/api"
	"github.com/groupkv/groupkv/internal/kv"
	pb "github.com/groupkv/groupkv/proto/groupkvpb"
)

// grpcFake is an in-memory kv.Backend for testing the gRPC layer only: it
// keeps every version of every key and validates input with the kv package,
// so that what the client sends and what the server answers can be checked
// end to end. Two collections behave specially:
//   - "fail": every record call fails with the error named by its key (see
//     grpcFakeErr);
//   - "block": Put and Get signal on blocked and wait for their context.
type grpcFake struct {
	blocked chan struct{} // one send per blocked call

	mu struct {
		sync.Mutex
		ready   error
		nextID  uint32
		version uint64 // last version given
		colls   map[string]kv.CollectionInfo
		// recs[collection][key] holds the key's versions, oldest first; a
		// tombstone has a nil Tags and Value and deleted set.
		recs map[string]map[string][]grpcFakeVersion
	}
}

type grpcFakeVersion struct {
	rec     kv.Record
	deleted bool
}

var _ kv.Backend = (*grpcFake)(nil)

func newGRPCFake() *grpcFake {
	f := &grpcFake{blocked: make(chan struct{}, 16)}
	f.mu.colls = map[string]kv.CollectionInfo{}
	f.mu.recs = map[string]map[string][]grpcFakeVersion{}
	return f
}

// grpcFakeMessage is the message of the errors of the "fail" collection: it
// has characters that a careless encoding would mangle.
func grpcFakeMessage(code kv.Code) string {
	return fmt.Sprintf("fake %s: \"quoted\", ünïcödé, a newline\nand a colon: here", code)
}

// grpcFakeErr is the error a call on the "fail" collection answers for key.
func grpcFakeErr(key []byte) error {
	switch k := string(key); k {
	case "ctx-canceled":
		return fmt.Errorf("waiting for shard 3: %w", context.Canceled)
	case "ctx-deadline":
		return context.DeadlineExceeded
	case "plain":
		return errors.New("disk on fire")
	case "wrapped":
		return fmt.Errorf("shard 3: %w", kv.Errorf(kv.CodeNotFound, "inner message"))
	default:
		return &kv.Error{Code: kv.Code(k), Message: grpcFakeMessage(kv.Code(k))}
	}
}

func (f *grpcFake) CreateCollection(_ context.Context, opts kv.CollectionOptions) (kv.CollectionInfo, error) {
	if err := kv.ValidateCollectionOptions(&opts); err != nil {
		return kv.CollectionInfo{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.mu.colls[opts.Name]; ok {
		return kv.CollectionInfo{}, kv.Errorf(kv.CodeAlreadyExists, "collection %q exists", opts.Name)
	}
	f.mu.nextID++
	info := kv.CollectionInfo{Name: opts.Name, ID: f.mu.nextID, Partitioning: opts.Partitioning, SplitPoints: opts.SplitPoints}
	for i := 0; i < opts.Shards; i++ {
		s := kv.ShardInfo{ID: uint64(100*f.mu.nextID) + uint64(i), Leader: uint64(i%3 + 1)}
		if opts.Partitioning == kv.PartitionRange {
			if i > 0 {
				s.Start = opts.SplitPoints[i-1]
			}
			if i < len(opts.SplitPoints) {
				s.End = opts.SplitPoints[i]
			}
		} else {
			s.BucketStart = uint32(i * kv.NumBuckets / opts.Shards)
			s.BucketEnd = uint32((i + 1) * kv.NumBuckets / opts.Shards)
		}
		info.Shards = append(info.Shards, s)
	}
	f.mu.colls[opts.Name] = info
	f.mu.recs[opts.Name] = map[string][]grpcFakeVersion{}
	return info, nil
}

func (f *grpcFake) ListCollections(context.Context) ([]kv.CollectionInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []kv.CollectionInfo
	for _, c := range f.mu.colls {
		out = append(out, c)
	}
	return out, nil
}

func (f *grpcFake) DescribeCollection(_ context.Context, name string) (kv.CollectionInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.mu.colls[name]
	if !ok {
		return kv.CollectionInfo{}, kv.Errorf(kv.CodeCollectionNotFound, "collection %q does not exist", name)
	}
	return c, nil
}

func (f *grpcFake) DropCollection(_ context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.mu.colls[name]; !ok {
		return kv.Errorf(kv.CodeCollectionNotFound, "collection %q does not exist", name)
	}
	delete(f.mu.colls, name)
	delete(f.mu.recs, name)
	return nil
}

// special handles the "fail" and "block" collections; ok is false for any
// other collection.
func (f *grpcFake) special(ctx context.Context, coll string, key []byte) (err error, ok bool) {
	switch coll {
	case "fail":
		return grpcFakeErr(key), true
	case "block":
		f.blocked <- struct{}{}
		<-ctx.Done()
		return ctx.Err(), true
	}
	return nil, false
}

// versionsLocked answers the versions of key, or a collection_not_found
// error.
func (f *grpcFake) versionsLocked(coll string, key []byte) ([]grpcFakeVersion, error) {
	recs, ok := f.mu.recs[coll]
	if !ok {
		return nil, kv.Errorf(kv.CodeCollectionNotFound, "collection %q does not exist", coll)
	}
	return recs[string(key)], nil
}

// checkLocked applies a conditional write's IfVersion to the key's versions.
func checkLocked(vs []grpcFakeVersion, ifVersion *uint64) error {
	if ifVersion == nil {
		return nil
	}
	var cur uint64
	if n := len(vs); n > 0 && !vs[n-1].deleted {
		cur = vs[n-1].rec.Version
	}
	if cur != *ifVersion {
		return kv.Errorf(kv.CodeConditionFailed, "key is at version %d, not %d", cur, *ifVersion)
	}
	return nil
}

func (f *grpcFake) Put(ctx context.Context, req kv.PutRequest) (uint64, error) {
	if err, ok := f.special(ctx, req.Collection, req.Key); ok {
		return 0, err
	}
	if err := kv.ValidateKey(req.Key); err != nil {
		return 0, err
	}
	if err := kv.ValidateTags(req.Tags); err != nil {
		return 0, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	vs, err := f.versionsLocked(req.Collection, req.Key)
	if err != nil {
		return 0, err
	}
	if err := checkLocked(vs, req.IfVersion); err != nil {
		return 0, err
	}
	f.mu.version++
	rec := kv.Record{Key: bytes.Clone(req.Key), Value: bytes.Clone(req.Value), Tags: req.Tags, Version: f.mu.version}
	f.mu.recs[req.Collection][string(req.Key)] = append(vs, grpcFakeVersion{rec: rec})
	return f.mu.version, nil
}

func (f *grpcFake) Get(ctx context.Context, req kv.GetRequest) (kv.Record, error) {
	if err, ok := f.special(ctx, req.Collection, req.Key); ok {
		return kv.Record{}, err
	}
	if err := kv.ValidateKey(req.Key); err != nil {
		return kv.Record{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	vs, err := f.versionsLocked(req.Collection, req.Key)
	if err != nil {
		return kv.Record{}, err
	}
	for i := len(vs) - 1; i >= 0; i-- {
		if req.Version != 0 && vs[i].rec.Version > req.Version {
			continue
		}
		if vs[i].deleted {
			break
		}
		return vs[i].rec, nil
	}
	return kv.Record{}, kv.Errorf(kv.CodeNotFound, "key %q not found", req.Key)
}

func (f *grpcFake) Delete(ctx context.Context, req kv.DeleteRequest) (uint64, error) {
	if err, ok := f.special(ctx, req.Collection, req.Key); ok {
		return 0, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	vs, err := f.versionsLocked(req.Collection, req.Key)
	if err != nil {
		return 0, err
	}
	if err := checkLocked(vs, req.IfVersion); err != nil {
		return 0, err
	}
	f.mu.version++
	tomb := grpcFakeVersion{rec: kv.Record{Key: bytes.Clone(req.Key), Version: f.mu.version}, deleted: true}
	f.mu.recs[req.Collection][string(req.Key)] = append(vs, tomb)
	return f.mu.version, nil
}

func (f *grpcFake) Ready() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mu.ready
}

func (f *grpcFake) setReady(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mu.ready = err
}

// grpcServe serves b on a fresh loopback port and answers its address and
// server; the server stops when the test ends.
func grpcServe(t *testing.T, b kv.Backend, opts ...grpc.ServerOption) (string, *grpc.Server) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := api.NewGRPCServer(b, opts...)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return lis.Addr().String(), srv
}

// grpcDial dials addr with groupkv.Dial and closes the DB when the test ends.
func grpcDial(t *testing.T, addr string, opts ...groupkv.DialOption) groupkv.DB {
	t.Helper()
	db, err := groupkv.Dial(addr, opts...)
	if err != nil {
		t.Fatalf("Dial(%q): %v", addr, err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// grpcStart serves a fresh grpcFake and dials it.
func grpcStart(t *testing.T, opts ...grpc.ServerOption) (*grpcFake, groupkv.DB) {
	t.Helper()
	f := newGRPCFake()
	addr, _ := grpcServe(t, f, opts...)
	return f, grpcDial(t, addr)
}

// wantCode fails the test unless err is a *kv.Error with code.
func wantCode(t *testing.T, what string, err error, code kv.Code) *kv.Error {
	t.Helper()
	var e *kv.Error
	if !errors.As(err, &e) {
		t.Fatalf("%s: error %v (%T) is not a *kv.Error with code %s", what, err, err, code)
	}
	if e.Code != code {
		t.Fatalf("%s: code %s (error %v), want %s", what, e.Code, err, code)
	}
	return e
}

func TestGRPCRecordRoundTrip(t *testing.T) {
	ctx := context.Background()
	_, db := grpcStart(t)
	if _, err := db.CreateCollection(ctx, kv.CollectionOptions{Name: "users"}); err != nil {
		t.Fatal(err)
	}

	key := []byte{0, 'u', 0xff, '1'}
	val := []byte{0xde, 0xad, 0, 0xbe, 0xef}
	tags := []string{"team:ada", "ünïcode tag", "x"}
	v1, err := db.Put(ctx, kv.PutRequest{Collection: "users", Key: key, Value: val, Tags: tags})
	if err != nil {
		t.Fatal(err)
	}
	if v1 == 0 {
		t.Fatal("Put answered version 0")
	}
	rec, err := db.Get(ctx, kv.GetRequest{Collection: "users", Key: key})
	if err != nil {
		t.Fatal(err)
	}
	want := kv.Record{Key: key, Value: val, Tags: tags, Version: v1}
	if !reflect.DeepEqual(rec, want) {
		t.Fatalf("Get = %+v, want %+v", rec, want)
	}

	// IfVersion keeps its presence: a pointer to 0 means "only if absent",
	// which fails on a present key where no condition at all succeeds.
	_, err = db.Put(ctx, kv.PutRequest{Collection: "users", Key: key, Value: []byte("x"), IfVersion: groupkv.Version(0)})
	wantCode(t, "put if absent on a present key", err, kv.CodeConditionFailed)
	if !errors.Is(err, groupkv.ErrConditionFailed) {
		t.Fatalf("errors.Is(%v, ErrConditionFailed) is false", err)
	}
	_, err = db.Put(ctx, kv.PutRequest{Collection: "users", Key: key, Value: []byte("x"), IfVersion: groupkv.Version(v1 + 7)})
	wantCode(t, "put at a wrong version", err, kv.CodeConditionFailed)

	v2, err := db.Put(ctx, kv.PutRequest{Collection: "users", Key: key, Value: []byte("second"), IfVersion: groupkv.Version(v1)})
	if err != nil {
		t.Fatalf("put at the right version: %v", err)
	}
	if v2 <= v1 {
		t.Fatalf("second put answered version %d, not above %d", v2, v1)
	}
	if _, err := db.Put(ctx, kv.PutRequest{Collection: "users", Key: []byte("new"), Value: []byte{}, IfVersion: groupkv.Version(0)}); err != nil {
		t.Fatalf("put if absent on an absent key: %v", err)
	}
	empty, err := db.Get(ctx, kv.GetRequest{Collection: "users", Key: []byte("new")})
	if err != nil || len(empty.Value) != 0 || len(empty.Tags) != 0 {
		t.Fatalf("Get of an empty value = %+v, %v", empty, err)
	}

	// The version of a get selects an older version.
	old, err := db.Get(ctx, kv.GetRequest{Collection: "users", Key: key, Version: v1})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(old.Value, val) || old.Version != v1 {
		t.Fatalf("Get at version %d = %+v, want value %x", v1, old, val)
	}
	cur, err := db.Get(ctx, kv.GetRequest{Collection: "users", Key: key})
	if err != nil || string(cur.Value) != "second" || cur.Version != v2 || cur.Tags != nil {
		t.Fatalf("Get latest = %+v, %v; want value second at %d with no tags", cur, err, v2)
	}

	_, err = db.Delete(ctx, kv.DeleteRequest{Collection: "users", Key: key, IfVersion: groupkv.Version(v1)})
	wantCode(t, "delete at a wrong version", err, kv.CodeConditionFailed)
	v3, err := db.Delete(ctx, kv.DeleteRequest{Collection: "users", Key: key, IfVersion: groupkv.Version(v2)})
	if err != nil {
		t.Fatal(err)
	}
	if v3 <= v2 {
		t.Fatalf("delete answered version %d, not above %d", v3, v2)
	}
	_, err = db.Get(ctx, kv.GetRequest{Collection: "users", Key: key})
	if !errors.Is(err, groupkv.ErrNotFound) {
		t.Fatalf("Get after delete: %v, want ErrNotFound", err)
	}
	if v4, err := db.Delete(ctx, kv.DeleteRequest{Collection: "users", Key: []byte("new")}); err != nil || v4 <= v3 {
		t.Fatalf("unconditional delete = %d, %v; want a version above %d", v4, err, v3)
	}

	// Input the server validates comes back with the server's exact error.
	_, err = db.Put(ctx, kv.PutRequest{Collection: "users", Key: key, Tags: []string{"a,b"}})
	if want := kv.ValidateTags([]string{"a,b"}); !reflect.DeepEqual(err, want) {
		t.Fatalf("put with a bad tag: %#v, want %#v", err, want)
	}
	_, err = db.Get(ctx, kv.GetRequest{Collection: "users"})
	if want := kv.ValidateKey(nil); !reflect.DeepEqual(err, want) {
		t.Fatalf("get of an empty key: %#v, want %#v", err, want)
	}
}

func TestGRPCCollections(t *testing.T) {
	ctx := context.Background()
	_, db := grpcStart(t)

	hash, err := db.CreateCollection(ctx, kv.CollectionOptions{Name: "h", Shards: 3})
	if err != nil {
		t.Fatal(err)
	}
	if hash.Partitioning != kv.PartitionHash || len(hash.Shards) != 3 ||
		hash.Shards[2].BucketEnd != kv.NumBuckets || hash.Shards[1].BucketStart == 0 || hash.Shards[1].Leader != 2 {
		t.Fatalf("hash collection = %+v", hash)
	}
	splits := [][]byte{[]byte("g"), {'p', 0, 0xff}}
	rng, err := db.CreateCollection(ctx, kv.CollectionOptions{Name: "r", Partitioning: kv.PartitionRange, SplitPoints: splits})
	if err != nil {
		t.Fatal(err)
	}
	wantRange := kv.CollectionInfo{
		Name: "r", ID: 2, Partitioning: kv.PartitionRange, SplitPoints: splits,
		Shards: []kv.ShardInfo{
			{ID: 200, End: splits[0], Leader: 1},
			{ID: 201, Start: splits[0], End: splits[1], Leader: 2},
			{ID: 202, Start: splits[1], Leader: 3},
		},
	}
	if !reflect.DeepEqual(rng, wantRange) {
		t.Fatalf("CreateCollection = %+v\nwant %+v", rng, wantRange)
	}
	desc, err := db.DescribeCollection(ctx, "r")
	if err != nil || !reflect.DeepEqual(desc, wantRange) {
		t.Fatalf("DescribeCollection = %+v, %v\nwant %+v", desc, err, wantRange)
	}

	list, err := db.ListCollections(ctx)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]kv.CollectionInfo{}
	for _, c := range list {
		byName[c.Name] = c
	}
	if len(list) != 2 || !reflect.DeepEqual(byName["r"], wantRange) || !reflect.DeepEqual(byName["h"], hash) {
		t.Fatalf("ListCollections = %+v", list)
	}

	_, err = db.CreateCollection(ctx, kv.CollectionOptions{Name: "r"})
	wantCode(t, "create twice", err, kv.CodeAlreadyExists)

	// Options the server rejects come back with the server's exact error,
	// including a shard count that would not fit a narrower integer.
	for _, opts := range []kv.CollectionOptions{
		{Name: "Bad Name"},
		{Name: "neg", Shards: -5},
		{Name: "huge", Shards: math.MaxInt},
		{Name: "unsorted", Partitioning: kv.PartitionRange, SplitPoints: [][]byte{[]byte("b"), []byte("a")}},
	} {
		_, err := db.CreateCollection(ctx, opts)
		local := opts
		want := kv.ValidateCollectionOptions(&local)
		if want == nil || !reflect.DeepEqual(err, want) {
			t.Fatalf("CreateCollection(%+v): %#v, want %#v", opts, err, want)
		}
	}

	if err := db.DropCollection(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	_, err = db.DescribeCollection(ctx, "r")
	if !errors.Is(err, groupkv.ErrCollectionNotFound) {
		t.Fatalf("describe after drop: %v, want ErrCollectionNotFound", err)
	}
	err = db.DropCollection(ctx, "r")
	wantCode(t, "drop twice", err, kv.CodeCollectionNotFound)
	if list, err := db.ListCollections(ctx); err != nil || len(list) != 1 || list[0].Name != "h" {
		t.Fatalf("ListCollections after drop = %+v, %v", list, err)
	}
}

// grpcCodes lists every kv.Code with the gRPC code that must carry it, as
// documented in proto/groupkv.proto.
var grpcCodes = []struct {
	kv   kv.Code
	grpc codes.Code
}{
	{kv.CodeInvalidArgument, codes.InvalidArgument},
	{kv.CodeNotFound, codes.NotFound},
	{kv.CodeCollectionNotFound, codes.NotFound},
	{kv.CodeAlreadyExists, codes.AlreadyExists},
	{kv.CodeTxnAborted, codes.Aborted},
	{kv.CodeKeyInGroup, codes.Aborted},
	{kv.CodePlacementTagChanged, codes.Aborted},
	{kv.CodeCompacted, codes.OutOfRange},
	{kv.CodeConditionFailed, codes.FailedPrecondition},
	{kv.CodeTooLarge, codes.ResourceExhausted},
	{kv.CodeUnavailable, codes.Unavailable},
	{kv.CodeCommitUnknown, codes.Unknown},
	{kv.CodeInternal, codes.Internal},
}

func TestGRPCErrorCodesRoundTrip(t *testing.T) {
	ctx := context.Background()
	f, db := grpcStart(t)
	for _, c := range grpcCodes {
		want := &kv.Error{Code: c.kv, Message: grpcFakeMessage(c.kv)}
		key := []byte(c.kv)
		_, putErr := db.Put(ctx, kv.PutRequest{Collection: "fail", Key: key})
		_, getErr := db.Get(ctx, kv.GetRequest{Collection: "fail", Key: key})
		_, delErr := db.Delete(ctx, kv.DeleteRequest{Collection: "fail", Key: key})
		f.setReady(want)
		readyErr := db.Ready()
		for name, err := range map[string]error{"put": putErr, "get": getErr, "delete": delErr, "ready": readyErr} {
			if !reflect.DeepEqual(err, want) {
				t.Errorf("%s %s: got %#v, want %#v", name, c.kv, err, want)
			}
			if !errors.Is(err, &kv.Error{Code: c.kv}) {
				t.Errorf("%s %s: errors.Is with the code's sentinel is false", name, c.kv)
			}
		}
	}
	_, err := db.Get(ctx, kv.GetRequest{Collection: "fail", Key: []byte("not_found")})
	if !errors.Is(err, groupkv.ErrNotFound) {
		t.Error("errors.Is(remote not_found, groupkv.ErrNotFound) is false")
	}
	f.setReady(nil)
	if err := db.Ready(); err != nil {
		t.Errorf("Ready of a ready server: %v", err)
	}
}

// TestGRPCWireErrors checks the status on the wire with a bare gRPC client:
// the gRPC code, the message, the ErrorDetail and the trailer.
func TestGRPCWireErrors(t *testing.T) {
	addr, _ := grpcServe(t, newGRPCFake())
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := pb.NewGroupKVClient(conn)
	for _, tc := range grpcCodes {
		var trailer metadata.MD
		_, err := c.Get(context.Background(), &pb.GetRequest{Collection: "fail", Key: []byte(tc.kv)}, grpc.Trailer(&trailer))
		st := status.Convert(err)
		if st.Code() != tc.grpc || st.Message() != grpcFakeMessage(tc.kv) {
			t.Errorf("%s: status %v %q, want %v %q", tc.kv, st.Code(), st.Message(), tc.grpc, grpcFakeMessage(tc.kv))
		}
		if got := trailer.Get(api.CodeTrailer); len(got) != 1 || got[0] != string(tc.kv) {
			t.Errorf("%s: trailer %s = %q", tc.kv, api.CodeTrailer, got)
		}
		if d := st.Details(); len(d) != 1 || d[0].(*pb.ErrorDetail).GetCode() != string(tc.kv) {
			t.Errorf("%s: details %v", tc.kv, d)
		}
	}
	// A context error has no kv code: no detail, no trailer.
	var trailer metadata.MD
	_, err = c.Get(context.Background(), &pb.GetRequest{Collection: "fail", Key: []byte("ctx-deadline")}, grpc.Trailer(&trailer))
	if st := status.Convert(err); st.Code() != codes.DeadlineExceeded || len(st.Details()) != 0 || len(trailer.Get(api.CodeTrailer)) != 0 {
		t.Errorf("context error on the wire: %v, details %v, trailer %v", st, st.Details(), trailer)
	}
}

func TestGRPCOtherErrors(t *testing.T) {
	ctx := context.Background()
	_, db := grpcStart(t)
	get := func(key string) error {
		_, err := db.Get(ctx, kv.GetRequest{Collection: "fail", Key: []byte(key)})
		return err
	}

	if err := get("ctx-canceled"); !errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("server-side cancel: %v, want context.Canceled", err)
	}
	if err := get("ctx-deadline"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("server-side deadline: %v, want context.DeadlineExceeded", err)
	}
	if err, want := get("plain"), (&kv.Error{Code: kv.CodeInternal, Message: "disk on fire"}); !reflect.DeepEqual(err, want) {
		t.Errorf("plain error: %#v, want %#v", err, want)
	}
	if err, want := get("wrapped"), (&kv.Error{Code: kv.CodeNotFound, Message: "inner message"}); !reflect.DeepEqual(err, want) {
		t.Errorf("wrapped error: %#v, want %#v", err, want)
	}

	// The caller's own deadline ends a call the server would block on.
	dctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := db.Get(dctx, kv.GetRequest{Collection: "block", Key: []byte("k")}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("client deadline: %v, want context.DeadlineExceeded", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := db.Put(cctx, kv.PutRequest{Collection: "x", Key: []byte("k")}); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled context: %v, want context.Canceled", err)
	}
}

// TestGRPCLargeValue sends a value above gRPC's default 4 MiB limit and
// above the largest configurable value size, in both directions.
func TestGRPCLargeValue(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 34 MiB through loopback")
	}
	ctx := context.Background()
	_, db := grpcStart(t)
	if _, err := db.CreateCollection(ctx, kv.CollectionOptions{Name: "big"}); err != nil {
		t.Fatal(err)
	}
	val := bytes.Repeat([]byte("0123456789abcdef"), (16<<20+64<<10)/16)
	if _, err := db.Put(ctx, kv.PutRequest{Collection: "big", Key: []byte("k"), Value: val}); err != nil {
		t.Fatalf("put of %d bytes: %v", len(val), err)
	}
	rec, err := db.Get(ctx, kv.GetRequest{Collection: "big", Key: []byte("k")})
	if err != nil || !bytes.Equal(rec.Value, val) {
		t.Fatalf("get of %d bytes: %d bytes, %v", len(val), len(rec.Value), err)
	}
	// Past MaxMessageSize the client refuses before sending.
	huge := make([]byte, api.MaxMessageSize+1)
	_, err = db.Put(ctx, kv.PutRequest{Collection: "big", Key: []byte("h"), Value: huge})
	wantCode(t, "put past the message limit", err, kv.CodeTooLarge)
}

func TestGRPCTransportErrors(t *testing.T) {
	ctx := context.Background()

	// A port where nothing listens.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := lis.Addr().String()
	lis.Close()
	db := grpcDial(t, deadAddr)
	_, err = db.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte("k")})
	wantCode(t, "get from a dead server", err, kv.CodeUnavailable)
	if !errors.Is(err, groupkv.ErrUnavailable) {
		t.Errorf("errors.Is(%v, ErrUnavailable) is false", err)
	}
	// A write that never reached a server was not applied.
	_, err = db.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte("k")})
	wantCode(t, "put to a dead server", err, kv.CodeUnavailable)
	if err := db.Ready(); kv.CodeOf(err) != kv.CodeUnavailable {
		t.Errorf("Ready of a dead server: %v", err)
	}
	if _, err := groupkv.Dial(deadAddr, groupkv.WithDialTimeout(200*time.Millisecond)); kv.CodeOf(err) != kv.CodeUnavailable {
		t.Errorf("Dial with timeout to a dead server: %v, want unavailable", err)
	}

	// A write whose connection breaks while the server handles it may have
	// been applied; a read in the same spot may simply be retried.
	f := newGRPCFake()
	addr, srv := grpcServe(t, f)
	live := grpcDial(t, addr, groupkv.WithDialTimeout(5*time.Second))
	errc := make(chan error, 2)
	go func() {
		_, err := live.Put(ctx, kv.PutRequest{Collection: "block", Key: []byte("k")})
		errc <- err
	}()
	go func() {
		_, err := live.Get(ctx, kv.GetRequest{Collection: "block", Key: []byte("k")})
		errc <- err
	}()
	<-f.blocked
	<-f.blocked
	srv.Stop()
	var got []kv.Code
	for range 2 {
		got = append(got, kv.CodeOf(<-errc))
	}
	if !(got[0] == kv.CodeCommitUnknown && got[1] == kv.CodeUnavailable ||
		got[1] == kv.CodeCommitUnknown && got[0] == kv.CodeUnavailable) {
		t.Errorf("codes of a put and a get cut off by a server stop: %v, want commit_unknown and unavailable", got)
	}
}

func TestGRPCDialAndClose(t *testing.T) {
	for _, addr := range []string{"http://127.0.0.1:7070", "grpc://h:1", "127.0.0.1", "host:", ""} {
		if db, err := groupkv.Dial(addr); kv.CodeOf(err) != kv.CodeInvalidArgument {
			t.Errorf("Dial(%q) = %v, %v; want invalid_argument", addr, db, err)
		}
	}

	_, db := grpcStart(t)
	ctx := context.Background()
	if _, err := db.ListCollections(ctx); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	_, err := db.ListCollections(ctx)
	e := wantCode(t, "call after Close", err, kv.CodeUnavailable)
	if !strings.Contains(e.Message, "closed") {
		t.Errorf("call after Close: %q does not say the DB is closed", e.Message)
	}
	if err := db.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestGRPCMetricsInterceptor(t *testing.T) {
	type obs struct {
		op   string
		code kv.Code
	}
	var mu sync.Mutex
	var got []obs
	record := func(op string, code kv.Code, seconds float64) {
		if seconds < 0 {
			t.Errorf("%s: negative duration %v", op, seconds)
		}
		mu.Lock()
		defer mu.Unlock()
		got = append(got, obs{op, code})
	}
	_, db := grpcStart(t, grpc.ChainUnaryInterceptor(api.GRPCMetricsInterceptor(record)))

	ctx := context.Background()
	_, _ = db.CreateCollection(ctx, kv.CollectionOptions{Name: "c"})
	_, _ = db.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte("k")})
	_, _ = db.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte("absent")})
	_, _ = db.Get(ctx, kv.GetRequest{Collection: "fail", Key: []byte("ctx-canceled")})
	_, _ = db.ListCollections(ctx)
	_ = db.Ready()

	want := []obs{
		{"create_collection", ""},
		{"put", ""},
		{"get", kv.CodeNotFound},
		{"get", kv.CodeUnavailable},
		{"list_collections", ""},
		{"ready", ""},
	}
	mu.Lock()
	defer mu.Unlock()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("observed %v, want %v", got, want)
	}
}
