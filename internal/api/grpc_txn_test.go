package api

import (
	"context"
	"errors"
	"fmt"
	"net"
	"reflect"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/groupkv/groupkv/internal/kv"
	pb "github.com/groupkv/groupkv/proto/groupkvpb"
)

// These tests check the transaction and Key Groups RPCs (grpc_txn.go) and
// their client (TxnClient) against the fakes of the HTTP forms' tests
// (txnFake, groupFake), which record what the backend was called with and
// answer what the test set up.

// grpcTxnServe serves the gRPC service of b on a port of 127.0.0.1 until
// the test ends and answers a bare client of it and a TxnClient over it.
func grpcTxnServe(t *testing.T, b kv.Backend, opts ...grpc.ServerOption) (pb.GroupKVClient, *TxnClient) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewGRPCServer(b, opts...)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		srv.Stop()
		<-done
	})
	c := pb.NewGroupKVClient(conn)
	return c, NewTxnClient(c, nil)
}

func newGRPCGroupFake(t *testing.T) (*groupFake, pb.GroupKVClient, *TxnClient) {
	gf := &groupFake{txnFake: newTxnFake()}
	c, tc := grpcTxnServe(t, gf)
	return gf, c, tc
}

func TestGRPCTxnRoundTrip(t *testing.T) {
	ctx := context.Background()
	gf, _, tc := newGRPCGroupFake(t)
	tf := gf.txnFake

	for i, tc2 := range []struct {
		opts, want kv.TxnOptions
	}{
		{kv.TxnOptions{}, kv.TxnOptions{Isolation: kv.IsolationSerializable}},
		{kv.TxnOptions{Isolation: kv.IsolationSerializable, RetryOf: "t9"}, kv.TxnOptions{Isolation: kv.IsolationSerializable, RetryOf: "t9"}},
		{kv.TxnOptions{Isolation: kv.IsolationSnapshot, RetryOf: "a-b_c", ReadOnly: true}, kv.TxnOptions{Isolation: kv.IsolationSnapshot, RetryOf: "a-b_c", ReadOnly: true}},
		{kv.TxnOptions{ReadOnly: true}, kv.TxnOptions{Isolation: kv.IsolationSerializable, ReadOnly: true}},
	} {
		id, err := tc.BeginTxn(ctx, tc2.opts)
		if err != nil || id != fmt.Sprintf("t%d", i+1) {
			t.Fatalf("BeginTxn(%+v) = %q, %v", tc2.opts, id, err)
		}
		wantCall(t, tf, "BeginTxn", "", tc2.want)
	}

	key := []byte{0, 'k', 0xff}
	tf.rec, tf.found = kv.Record{Key: key, Value: []byte{0xde, 0xad, 0}, Tags: []string{"a", "ünï"}, Version: 7}, true
	rec, found, err := tc.TxnGet(ctx, "t-1_x", kv.KeyRef{Collection: "c", Key: key})
	if err != nil || !found || !reflect.DeepEqual(rec, tf.rec) {
		t.Fatalf("TxnGet = %+v, %v, %v; want %+v", rec, found, err, tf.rec)
	}
	wantCall(t, tf, "TxnGet", "t-1_x", kv.KeyRef{Collection: "c", Key: key})
	rec, found, err = tc.TxnGetForUpdate(ctx, "t1", kv.KeyRef{Collection: "c", Key: key})
	if err != nil || !found || !reflect.DeepEqual(rec, tf.rec) {
		t.Fatalf("TxnGetForUpdate = %+v, %v, %v; want %+v", rec, found, err, tf.rec)
	}
	wantCall(t, tf, "TxnGetForUpdate", "t1", kv.KeyRef{Collection: "c", Key: key})
	tf.rec, tf.found = kv.Record{}, false
	if rec, found, err := tc.TxnGet(ctx, "t1", kv.KeyRef{Collection: "c", Key: []byte("absent")}); err != nil || found || !reflect.DeepEqual(rec, kv.Record{}) {
		t.Fatalf("TxnGet of an absent key = %+v, %v, %v", rec, found, err)
	}

	item := kv.PutItem{Collection: "c", Key: key, Value: []byte{1, 0, 2}, Tags: []string{"x", "y"}}
	if err := tc.TxnPut(ctx, "t1", item); err != nil {
		t.Fatal(err)
	}
	wantCall(t, tf, "TxnPut", "t1", item)
	if err := tc.TxnPut(ctx, "t1", kv.PutItem{Collection: "c", Key: []byte("k")}); err != nil {
		t.Fatal(err)
	}
	wantCall(t, tf, "TxnPut", "t1", kv.PutItem{Collection: "c", Key: []byte("k")})
	if err := tc.TxnDelete(ctx, "t1", kv.KeyRef{Collection: "c", Key: key}); err != nil {
		t.Fatal(err)
	}
	wantCall(t, tf, "TxnDelete", "t1", kv.KeyRef{Collection: "c", Key: key})

	tf.page = kv.ScanResult{Items: []kv.Record{{Key: []byte("a"), Value: []byte("1"), Tags: []string{"t"}, Version: 3}, {Key: []byte("b"), Value: []byte("2"), Version: 4}},
		NextPage: "next", Version: 9}
	page, err := tc.TxnScan(ctx, "t1", kv.ScanRequest{Collection: "c", Start: []byte("a"), End: []byte("m"), Limit: 10, Reverse: true, Page: "p1"})
	if err != nil || !reflect.DeepEqual(page, tf.page) {
		t.Fatalf("TxnScan = %+v, %v; want %+v", page, err, tf.page)
	}
	wantCall(t, tf, "TxnScan", "t1", kv.ScanRequest{Collection: "c", Start: []byte("a"), End: []byte("m"), Limit: 10, Reverse: true, Page: "p1"})
	if _, err := tc.TxnScan(ctx, "t1", kv.ScanRequest{Collection: "c"}); err != nil {
		t.Fatal(err)
	}
	wantCall(t, tf, "TxnScan", "t1", kv.ScanRequest{Collection: "c"})
	if _, err := tc.TxnGetByTags(ctx, "t1", kv.TagQuery{Collection: "c", Any: []string{"a", "b"}, Limit: 5, Page: "p"}); err != nil {
		t.Fatal(err)
	}
	wantCall(t, tf, "TxnGetByTags", "t1", kv.TagQuery{Collection: "c", Any: []string{"a", "b"}, Limit: 5, Page: "p"})

	tf.commitV = 42
	if v, err := tc.CommitTxn(ctx, "t1"); err != nil || v != 42 {
		t.Fatalf("CommitTxn = %d, %v", v, err)
	}
	wantCall(t, tf, "CommitTxn", "t1", nil)
	if err := tc.AbortTxn(ctx, "t2"); err != nil {
		t.Fatal(err)
	}
	wantCall(t, tf, "AbortTxn", "t2", nil)

	req := kv.ExecRequest{
		If: []kv.Compare{
			{Collection: "c", Key: []byte("a"), Version: 7},
			{Collection: "c", Key: []byte("b"), Version: 0},
			{Collection: "c", Key: []byte{0xff}, HasValue: true, Value: []byte{0}},
			{Collection: "c", Key: []byte("e"), HasValue: true, Value: []byte{}},
		},
		Then: []kv.TxnOp{
			{Op: kv.TxnOpPut, Collection: "c", Key: []byte("a"), Value: []byte("1"), Tags: []string{"t"}},
			{Op: kv.TxnOpDelete, Collection: "c", Key: []byte("d")},
			{Op: kv.TxnOpGet, Collection: "c", Key: []byte("e")},
		},
		Else: []kv.TxnOp{{Op: kv.TxnOpGet, Collection: "c", Key: []byte("a")}},
	}
	tf.execRes = kv.ExecResult{Succeeded: true, Version: 42, Results: []kv.TxnOpResult{
		{Version: 42}, {Version: 42}, {Found: true, Value: []byte{0xfe}, Tags: []string{"x"}, Version: 40},
	}}
	res, err := tc.ExecTxn(ctx, req)
	if err != nil || !reflect.DeepEqual(res, tf.execRes) {
		t.Fatalf("ExecTxn = %+v, %v; want %+v", res, err, tf.execRes)
	}
	wantCall(t, tf, "ExecTxn", "", req)
	// A compare of the empty value stays one: the oneof keeps the value's
	// presence where a plain bytes field would not.
	if got := tf.lastCall(t).arg.(kv.ExecRequest).If[3]; !got.HasValue || len(got.Value) != 0 {
		t.Fatalf("compare of an empty value arrived as %+v", got)
	}
}

func TestGRPCGroupRoundTrip(t *testing.T) {
	ctx := context.Background()
	gf, _, tc := newGRPCGroupFake(t)
	tf := gf.txnFake

	gf.created = kv.GroupCreated{ID: "g1", Joined: []kv.KeyRef{ref("c", "k0"), {Collection: "d", Key: []byte{0xff}}},
		Refused: []kv.GroupRefusal{{KeyRef: ref("c", "k2"), Reason: "locked"}}}
	spec := kv.GroupSpec{ID: "g1", Leader: ref("c", "k0"), Members: []kv.KeyRef{ref("c", "k0"), {Collection: "d", Key: []byte{0xff}}, ref("c", "k2")},
		Mode: kv.GroupBestEffort}
	created, err := tc.CreateGroup(ctx, spec)
	if err != nil || !reflect.DeepEqual(created, gf.created) {
		t.Fatalf("CreateGroup = %+v, %v; want %+v", created, err, gf.created)
	}
	wantCall(t, tf, "CreateGroup", "", spec)
	// Mode defaults to atomic; no members is an empty list, as over HTTP.
	gf.created = kv.GroupCreated{ID: "g2", Joined: []kv.KeyRef{ref("c", "k0")}}
	created, err = tc.CreateGroup(ctx, kv.GroupSpec{ID: "g2", Leader: ref("c", "k0")})
	if err != nil || created.Refused == nil || len(created.Refused) != 0 {
		t.Fatalf("CreateGroup = %#v, %v; want no refusal (an empty list)", created, err)
	}
	wantCall(t, tf, "CreateGroup", "", kv.GroupSpec{ID: "g2", Leader: ref("c", "k0"), Members: []kv.KeyRef{}, Mode: kv.GroupAtomic})

	gf.info = kv.GroupInfo{ID: "g/1 ü", Leader: ref("c", "k0"), Members: []kv.KeyRef{ref("c", "k0"), ref("c", "k1")}, Mode: kv.GroupAtomic,
		LeaderNode: 3, State: kv.GroupActive, ShipperLag: 12}
	info, err := tc.DescribeGroup(ctx, "g/1 ü")
	if err != nil || !reflect.DeepEqual(info, gf.info) {
		t.Fatalf("DescribeGroup = %+v, %v; want %+v", info, err, gf.info)
	}
	wantCall(t, tf, "DescribeGroup", "g/1 ü", nil)
	gf.info.Mode = "" // an empty mode is atomic
	if info, err := tc.DescribeGroup(ctx, "g/1 ü"); err != nil || info.Mode != kv.GroupAtomic {
		t.Fatalf("DescribeGroup of a group of no mode = %+v, %v", info, err)
	}

	infos, err := tc.ListGroups(ctx)
	if err != nil || infos == nil || len(infos) != 0 {
		t.Fatalf("ListGroups of none = %#v, %v; want an empty list", infos, err)
	}
	gf.infos = []kv.GroupInfo{
		{ID: "a", Leader: ref("c", "k0"), Members: []kv.KeyRef{ref("c", "k0")}, Mode: kv.GroupAtomic, LeaderNode: 1, State: kv.GroupCreating},
		{ID: "b", Leader: ref("c", "k5"), Members: []kv.KeyRef{ref("c", "k5"), ref("c", "k6")}, Mode: kv.GroupBestEffort, LeaderNode: 2, State: kv.GroupDeleting, ShipperLag: 1},
	}
	if infos, err := tc.ListGroups(ctx); err != nil || !reflect.DeepEqual(infos, gf.infos) {
		t.Fatalf("ListGroups = %+v, %v; want %+v", infos, err, gf.infos)
	}

	if err := tc.DeleteGroup(ctx, "g1"); err != nil {
		t.Fatal(err)
	}
	wantCall(t, tf, "DeleteGroup", "g1", nil)

	id, err := tc.BeginGroupTxn(ctx, "g1", kv.TxnOptions{RetryOf: "g7"})
	if err != nil || !strings.HasPrefix(id, "g") {
		t.Fatalf("BeginGroupTxn = %q, %v", id, err)
	}
	wantCall(t, tf, "BeginGroupTxn", "g1", kv.TxnOptions{Isolation: kv.IsolationSerializable, RetryOf: "g7"})
	// The attempt is operated on with the transaction RPCs.
	if err := tc.TxnPut(ctx, id, kv.PutItem{Collection: "c", Key: []byte("k1"), Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	wantCall(t, tf, "TxnPut", id, kv.PutItem{Collection: "c", Key: []byte("k1"), Value: []byte("v")})

	req := kv.ExecRequest{If: []kv.Compare{{Collection: "c", Key: []byte("k1"), Version: 3}},
		Then: []kv.TxnOp{{Op: kv.TxnOpPut, Collection: "c", Key: []byte("k1"), Value: []byte("w")}}}
	tf.execRes = kv.ExecResult{Succeeded: false, Version: 5, Results: []kv.TxnOpResult{}}
	res, err := tc.ExecGroupTxn(ctx, "g1", req)
	if err != nil || !reflect.DeepEqual(res, tf.execRes) {
		t.Fatalf("ExecGroupTxn = %#v, %v; want %#v", res, err, tf.execRes)
	}
	wantCall(t, tf, "ExecGroupTxn", "g1", req)
}

// grpcTxnCodes are the codes a transaction or Key Groups call may answer,
// with the gRPC code that carries each.
var grpcTxnCodes = []struct {
	kv   kv.Code
	grpc codes.Code
}{
	{kv.CodeInvalidArgument, codes.InvalidArgument},
	{kv.CodeNotFound, codes.NotFound},
	{kv.CodeCollectionNotFound, codes.NotFound},
	{kv.CodeAlreadyExists, codes.AlreadyExists},
	{kv.CodeTxnAborted, codes.Aborted},
	{kv.CodeKeyInGroup, codes.Aborted},
	{kv.CodeGroupRefused, codes.Aborted},
	{kv.CodePlacementTagChanged, codes.Aborted},
	{kv.CodeConditionFailed, codes.FailedPrecondition},
	{kv.CodeTooLarge, codes.ResourceExhausted},
	{kv.CodeUnavailable, codes.Unavailable},
	{kv.CodeNotLeader, codes.Unavailable},
	{kv.CodeCommitUnknown, codes.Unknown},
	{kv.CodeUnimplemented, codes.Unimplemented},
	{kv.CodeInternal, codes.Internal},
}

// grpcTxnCalls makes one call of each method of kv.TxnBackend and
// kv.GroupBackend through tc, with valid arguments, and answers each
// method's error.
func grpcTxnCalls(tc *TxnClient) map[string]error {
	ctx := context.Background()
	k := kv.KeyRef{Collection: "c", Key: []byte("k")}
	exec := kv.ExecRequest{Then: []kv.TxnOp{{Op: kv.TxnOpPut, Collection: "c", Key: []byte("k"), Value: []byte("v")}}}
	errs := map[string]error{}
	_, errs["BeginTxn"] = tc.BeginTxn(ctx, kv.TxnOptions{})
	_, _, errs["TxnGet"] = tc.TxnGet(ctx, "t1", k)
	errs["TxnPut"] = tc.TxnPut(ctx, "t1", kv.PutItem{Collection: "c", Key: []byte("k"), Value: []byte("v")})
	errs["TxnDelete"] = tc.TxnDelete(ctx, "t1", k)
	_, errs["TxnScan"] = tc.TxnScan(ctx, "t1", kv.ScanRequest{Collection: "c"})
	_, errs["TxnGetByTags"] = tc.TxnGetByTags(ctx, "t1", kv.TagQuery{Collection: "c", All: []string{"a"}})
	_, errs["CommitTxn"] = tc.CommitTxn(ctx, "t1")
	errs["AbortTxn"] = tc.AbortTxn(ctx, "t1")
	_, errs["ExecTxn"] = tc.ExecTxn(ctx, exec)
	_, errs["CreateGroup"] = tc.CreateGroup(ctx, kv.GroupSpec{ID: "g1", Leader: k})
	_, errs["DescribeGroup"] = tc.DescribeGroup(ctx, "g1")
	_, errs["ListGroups"] = tc.ListGroups(ctx)
	errs["DeleteGroup"] = tc.DeleteGroup(ctx, "g1")
	_, errs["BeginGroupTxn"] = tc.BeginGroupTxn(ctx, "g1", kv.TxnOptions{})
	_, errs["ExecGroupTxn"] = tc.ExecGroupTxn(ctx, "g1", exec)
	return errs
}

// TestGRPCTxnErrorCodes checks that every error of the backend reaches the
// client as it left, code and message, from every method, and that the
// status on the wire has the gRPC code, detail and trailer of its code.
func TestGRPCTxnErrorCodes(t *testing.T) {
	gf, c, tc := newGRPCGroupFake(t)
	for _, code := range grpcTxnCodes {
		want := &kv.Error{Code: code.kv, Message: "fake " + string(code.kv) + `: "quoted", ünï, a newline` + "\nhere"}
		for m := range grpcTxnCalls(tc) {
			gf.errs[m] = want
		}
		for m, err := range grpcTxnCalls(tc) {
			if !reflect.DeepEqual(err, want) {
				t.Errorf("%s answering %s: got %#v, want %#v", m, code.kv, err, want)
			}
		}

		var trailer metadata.MD
		_, err := c.CommitTxn(context.Background(), &pb.CommitTxnRequest{Txn: "t1"}, grpc.Trailer(&trailer))
		st := status.Convert(err)
		if st.Code() != code.grpc || st.Message() != want.Message {
			t.Errorf("%s: status %v %q, want %v", code.kv, st.Code(), st.Message(), code.grpc)
		}
		if d := st.Details(); len(d) != 1 || d[0].(*pb.ErrorDetail).GetCode() != string(code.kv) {
			t.Errorf("%s: details %v", code.kv, d)
		}
		if got := trailer.Get(CodeTrailer); len(got) != 1 || got[0] != string(code.kv) {
			t.Errorf("%s: trailer %s = %q", code.kv, CodeTrailer, got)
		}
	}

	// The three outcomes of a commit a client must tell apart.
	for code, is := range map[kv.Code]error{
		kv.CodeTxnAborted:    &kv.Error{Code: kv.CodeTxnAborted},
		kv.CodeCommitUnknown: kv.ErrCommitUnknown,
		kv.CodeUnavailable:   kv.ErrUnavailable,
	} {
		gf.errs["CommitTxn"] = kv.Errorf(code, "x")
		_, err := tc.CommitTxn(context.Background(), "t1")
		if kv.CodeOf(err) != code || !errors.Is(err, is) {
			t.Errorf("commit answering %s: %v", code, err)
		}
	}
}

// TestGRPCTxnTransportErrors checks the errors of calls that reach no
// server: unavailable, even for a commit, which was not sent.
func TestGRPCTxnTransportErrors(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for m, err := range grpcTxnCalls(NewTxnClient(pb.NewGroupKVClient(conn), nil)) {
		if kv.CodeOf(err) != kv.CodeUnavailable {
			t.Errorf("%s on a dead server: %v, want unavailable", m, err)
		}
	}
}

// TestGRPCTxnBadInput checks that bad requests are refused with
// INVALID_ARGUMENT (code invalid_argument), saying what was wrong, before
// they reach the backend.
func TestGRPCTxnBadInput(t *testing.T) {
	ctx := context.Background()
	gf, c, _ := newGRPCGroupFake(t)
	key := []byte("k")
	put := &pb.TxnOp{Op: "put", Collection: "c", Key: key, Value: []byte("v")}
	for _, tc := range []struct {
		name  string
		call  func() error
		words string
	}{
		{"begin, unknown isolation", func() error {
			_, err := c.BeginTxn(ctx, &pb.BeginTxnRequest{Isolation: "linearizable"})
			return err
		}, "isolation"},
		{"begin, isolation in capitals", func() error {
			_, err := c.BeginTxn(ctx, &pb.BeginTxnRequest{Isolation: "Snapshot"})
			return err
		}, "isolation"},
		{"get, no txn", func() error {
			_, err := c.TxnGet(ctx, &pb.TxnGetRequest{Collection: "c", Key: key})
			return err
		}, "no transaction"},
		{"get, bad collection", func() error {
			_, err := c.TxnGet(ctx, &pb.TxnGetRequest{Txn: "t1", Collection: "Bad Name", Key: key})
			return err
		}, "collection"},
		{"get, no key", func() error {
			_, err := c.TxnGet(ctx, &pb.TxnGetRequest{Txn: "t1", Collection: "c"})
			return err
		}, "key"},
		{"put, bad tag", func() error {
			_, err := c.TxnPut(ctx, &pb.TxnPutRequest{Txn: "t1", Collection: "c", Key: key, Tags: []string{"a,b"}})
			return err
		}, "tag"},
		{"put, no txn", func() error {
			_, err := c.TxnPut(ctx, &pb.TxnPutRequest{Collection: "c", Key: key})
			return err
		}, "no transaction"},
		{"delete, no key", func() error {
			_, err := c.TxnDelete(ctx, &pb.TxnDeleteRequest{Txn: "t1", Collection: "c"})
			return err
		}, "key"},
		{"scan, empty range", func() error {
			_, err := c.TxnScan(ctx, &pb.TxnScanRequest{Txn: "t1", Collection: "c", Start: []byte("m"), End: []byte("a")})
			return err
		}, "not below end"},
		{"scan, limit", func() error {
			_, err := c.TxnScan(ctx, &pb.TxnScanRequest{Txn: "t1", Collection: "c", Limit: kv.MaxPageSize + 1})
			return err
		}, "page size"},
		{"scan, negative limit", func() error {
			_, err := c.TxnScan(ctx, &pb.TxnScanRequest{Txn: "t1", Collection: "c", Limit: -1})
			return err
		}, "page size"},
		{"tags, all and any", func() error {
			_, err := c.TxnGetByTags(ctx, &pb.TxnTagQuery{Txn: "t1", Collection: "c", All: []string{"a"}, Any: []string{"b"}})
			return err
		}, "exactly one"},
		{"tags, none", func() error {
			_, err := c.TxnGetByTags(ctx, &pb.TxnTagQuery{Txn: "t1", Collection: "c"})
			return err
		}, "exactly one"},
		{"tags, bad tag", func() error {
			_, err := c.TxnGetByTags(ctx, &pb.TxnTagQuery{Txn: "t1", Collection: "c", Any: []string{"a\x01"}})
			return err
		}, "any"},
		{"commit, no txn", func() error {
			_, err := c.CommitTxn(ctx, &pb.CommitTxnRequest{})
			return err
		}, "no transaction"},
		{"abort, no txn", func() error {
			_, err := c.AbortTxn(ctx, &pb.AbortTxnRequest{})
			return err
		}, "no transaction"},
		{"exec, no operations", func() error {
			_, err := c.ExecTxn(ctx, &pb.ExecTxnRequest{Compares: []*pb.Compare{{Collection: "c", Key: key, Condition: &pb.Compare_Version{Version: 1}}}})
			return err
		}, "no operations"},
		{"exec, unknown op", func() error {
			_, err := c.ExecTxn(ctx, &pb.ExecTxnRequest{ThenOps: []*pb.TxnOp{put, {Op: "increment", Collection: "c", Key: key}}})
			return err
		}, "then_ops[1]"},
		{"exec, no op", func() error {
			_, err := c.ExecTxn(ctx, &pb.ExecTxnRequest{ElseOps: []*pb.TxnOp{{Collection: "c", Key: key}}})
			return err
		}, "else_ops[0]"},
		{"exec, get with a value", func() error {
			_, err := c.ExecTxn(ctx, &pb.ExecTxnRequest{ThenOps: []*pb.TxnOp{{Op: "get", Collection: "c", Key: key, Value: []byte("v")}}})
			return err
		}, "only a put"},
		{"exec, delete with tags", func() error {
			_, err := c.ExecTxn(ctx, &pb.ExecTxnRequest{ThenOps: []*pb.TxnOp{{Op: "delete", Collection: "c", Key: key, Tags: []string{"t"}}}})
			return err
		}, "only a put"},
		{"exec, put with a bad tag", func() error {
			_, err := c.ExecTxn(ctx, &pb.ExecTxnRequest{ThenOps: []*pb.TxnOp{{Op: "put", Collection: "c", Key: key, Tags: []string{""}}}})
			return err
		}, "then_ops[0]"},
		{"exec, compare without condition", func() error {
			_, err := c.ExecTxn(ctx, &pb.ExecTxnRequest{Compares: []*pb.Compare{{Collection: "c", Key: key}}, ThenOps: []*pb.TxnOp{put}})
			return err
		}, "no condition"},
		{"exec, compare of no key", func() error {
			_, err := c.ExecTxn(ctx, &pb.ExecTxnRequest{Compares: []*pb.Compare{{Collection: "c", Condition: &pb.Compare_Version{}}}, ThenOps: []*pb.TxnOp{put}})
			return err
		}, "compares[0]"},
		{"create, no id", func() error {
			_, err := c.CreateGroup(ctx, &pb.CreateGroupRequest{Leader: &pb.KeyRef{Collection: "c", Key: key}})
			return err
		}, "group id"},
		{"create, id with a control character", func() error {
			_, err := c.CreateGroup(ctx, &pb.CreateGroupRequest{Id: "g\n1", Leader: &pb.KeyRef{Collection: "c", Key: key}})
			return err
		}, "control character"},
		{"create, no leader", func() error {
			_, err := c.CreateGroup(ctx, &pb.CreateGroupRequest{Id: "g1"})
			return err
		}, "no leader"},
		{"create, leader of no key", func() error {
			_, err := c.CreateGroup(ctx, &pb.CreateGroupRequest{Id: "g1", Leader: &pb.KeyRef{Collection: "c"}})
			return err
		}, "leader"},
		{"create, unknown mode", func() error {
			_, err := c.CreateGroup(ctx, &pb.CreateGroupRequest{Id: "g1", Leader: &pb.KeyRef{Collection: "c", Key: key}, Mode: "all_or_nothing"})
			return err
		}, "mode"},
		{"create, member twice", func() error {
			_, err := c.CreateGroup(ctx, &pb.CreateGroupRequest{Id: "g1", Leader: &pb.KeyRef{Collection: "c", Key: key},
				Members: []*pb.KeyRef{{Collection: "c", Key: []byte("a")}, {Collection: "d", Key: []byte("a")}, {Collection: "c", Key: []byte("a")}}})
			return err
		}, "members[2] is members[0] again"},
		{"create, bad member", func() error {
			_, err := c.CreateGroup(ctx, &pb.CreateGroupRequest{Id: "g1", Leader: &pb.KeyRef{Collection: "c", Key: key},
				Members: []*pb.KeyRef{{Collection: "c", Key: []byte("a")}, {Collection: "C", Key: []byte("b")}}})
			return err
		}, "members[1]"},
		{"describe, no id", func() error {
			_, err := c.DescribeGroup(ctx, &pb.DescribeGroupRequest{})
			return err
		}, "group id"},
		{"delete, no id", func() error {
			_, err := c.DeleteGroup(ctx, &pb.DeleteGroupRequest{})
			return err
		}, "group id"},
		{"group begin, snapshot", func() error {
			_, err := c.BeginGroupTxn(ctx, &pb.BeginGroupTxnRequest{Group: "g1", Isolation: "snapshot"})
			return err
		}, "serializable"},
		{"group begin, no group", func() error {
			_, err := c.BeginGroupTxn(ctx, &pb.BeginGroupTxnRequest{})
			return err
		}, "group id"},
		{"group exec, no group", func() error {
			_, err := c.ExecGroupTxn(ctx, &pb.ExecGroupTxnRequest{ThenOps: []*pb.TxnOp{put}})
			return err
		}, "group id"},
		{"group exec, no operations", func() error {
			_, err := c.ExecGroupTxn(ctx, &pb.ExecGroupTxnRequest{Group: "g1"})
			return err
		}, "no operations"},
	} {
		n := gf.numCalls()
		err := tc.call()
		st := status.Convert(err)
		if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), tc.words) {
			t.Errorf("%s: %v %q, want INVALID_ARGUMENT saying %q", tc.name, st.Code(), st.Message(), tc.words)
		}
		if kv.CodeOf(ErrorFromStatus(err, false)) != kv.CodeInvalidArgument {
			t.Errorf("%s: %v is not invalid_argument", tc.name, ErrorFromStatus(err, false))
		}
		if gf.numCalls() != n {
			t.Errorf("%s: the bad request reached the backend", tc.name)
		}
	}

	// The client refuses what it knows the server would, without a call.
	tcl := NewTxnClient(c, nil)
	n := gf.numCalls()
	for name, err := range map[string]error{
		"conditional put": tcl.TxnPut(ctx, "t1", kv.PutItem{Collection: "c", Key: key, IfVersion: new(uint64)}),
		"scan at a version": func() error {
			_, err := tcl.TxnScan(ctx, "t1", kv.ScanRequest{Collection: "c", Version: 3})
			return err
		}(),
		"tags at a version": func() error {
			_, err := tcl.TxnGetByTags(ctx, "t1", kv.TagQuery{Collection: "c", All: []string{"a"}, Version: 3})
			return err
		}(),
	} {
		if kv.CodeOf(err) != kv.CodeInvalidArgument {
			t.Errorf("%s: %v, want invalid_argument", name, err)
		}
	}
	if gf.numCalls() != n {
		t.Error("refused requests reached the backend")
	}
}

// TestGRPCTxnUnimplemented checks the answer of a server whose backend
// lacks transactions or Key Groups, and of a server that predates the
// RPCs: UNIMPLEMENTED, code unimplemented.
func TestGRPCTxnUnimplemented(t *testing.T) {
	txnMethods := []string{"BeginTxn", "TxnGet", "TxnPut", "TxnDelete", "TxnScan", "TxnGetByTags", "CommitTxn", "AbortTxn", "ExecTxn"}
	wantUnimplemented := func(t *testing.T, what string, err error, words string) {
		t.Helper()
		if kv.CodeOf(err) != kv.CodeUnimplemented || !strings.Contains(err.Error(), words) {
			t.Errorf("%s: %v, want unimplemented saying %q", what, err, words)
		}
	}

	t.Run("plain backend", func(t *testing.T) {
		c, tc := grpcTxnServe(t, newHTTPFakeBackend())
		for m, err := range grpcTxnCalls(tc) {
			wantUnimplemented(t, m, err, "does not serve")
		}
		_, err := c.BeginTxn(context.Background(), &pb.BeginTxnRequest{})
		if st := status.Convert(err); st.Code() != codes.Unimplemented {
			t.Errorf("status %v, want UNIMPLEMENTED", st.Code())
		}
	})

	t.Run("no key groups", func(t *testing.T) {
		tf := newTxnFake()
		_, tc := grpcTxnServe(t, tf)
		errs := grpcTxnCalls(tc)
		for _, m := range txnMethods {
			if errs[m] != nil {
				t.Errorf("%s: %v", m, errs[m])
			}
			delete(errs, m)
		}
		for m, err := range errs {
			wantUnimplemented(t, m, err, "key groups")
		}
	})

	t.Run("older server", func(t *testing.T) {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := grpc.NewServer()
		pb.RegisterGroupKVServer(srv, pb.UnimplementedGroupKVServer{})
		go srv.Serve(lis)
		defer srv.Stop()
		conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		for m, err := range grpcTxnCalls(NewTxnClient(pb.NewGroupKVClient(conn), nil)) {
			wantUnimplemented(t, m, err, "not implemented")
		}
	})
}

// TestGRPCTxnMetrics checks that the transaction and Key Groups RPCs are
// counted under the op labels of their HTTP forms.
func TestGRPCTxnMetrics(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]kv.Code{}
	obs := func(op string, code kv.Code, _ float64) {
		mu.Lock()
		defer mu.Unlock()
		seen[op] = code
	}
	gf := &groupFake{txnFake: newTxnFake()}
	gf.errs["CommitTxn"] = kv.Errorf(kv.CodeTxnAborted, "wounded")
	_, tc := grpcTxnServe(t, gf, grpc.ChainUnaryInterceptor(GRPCMetricsInterceptor(obs)))
	grpcTxnCalls(tc)
	want := map[string]kv.Code{
		opTxnBegin: "", opTxnGet: "", opTxnPut: "", opTxnDelete: "", opTxnScan: "", opTxnTags: "",
		opTxnCommit: kv.CodeTxnAborted, opTxnAbort: "", opTxnExec: "",
		opGroupCreate: "", opGroupDescribe: "", opGroupList: "", opGroupDelete: "", opGroupTxnBegin: "", opGroupTxnExec: "",
	}
	mu.Lock()
	defer mu.Unlock()
	if !reflect.DeepEqual(seen, want) {
		t.Fatalf("observed %v\nwant %v", seen, want)
	}
}
