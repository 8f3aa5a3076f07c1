package api

import (
	"bytes"
	"context"
	"reflect"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/groupkv/groupkv/internal/kv"
	pb "github.com/groupkv/groupkv/proto/groupkvpb"
)

// These tests check the forms of the transaction RPCs that save round
// trips (TxnBegin in place of txn, TxnWrite, CommitTxnRequest.writes) and
// the client attempt that uses them (TxnAttempt), against the fakes of
// grpc_txn_test.go: the backend must see exactly the calls of the
// one-RPC-per-step form.

// rpcCounter counts the RPCs a server received, by method name.
type rpcCounter struct {
	mu sync.Mutex
	n  []string
}

func (c *rpcCounter) interceptor() grpc.ServerOption {
	return grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		c.mu.Lock()
		c.n = append(c.n, info.FullMethod[strings.LastIndexByte(info.FullMethod, '/')+1:])
		c.mu.Unlock()
		return h(ctx, req)
	})
}

// take returns the RPCs received since the last take.
func (c *rpcCounter) take() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.n
	c.n = nil
	return n
}

// takeCalls returns the backend's calls since the last take.
func takeCalls(tf *txnFake) []txnCall {
	tf.mu.Lock()
	defer tf.mu.Unlock()
	c := tf.calls
	tf.calls = nil
	return c
}

func wantCalls(t *testing.T, tf *txnFake, want ...txnCall) {
	t.Helper()
	if got := takeCalls(tf); !reflect.DeepEqual(got, want) {
		t.Fatalf("backend calls\n got %#v\nwant %#v", got, want)
	}
}

func TestGRPCTxnBeginForms(t *testing.T) {
	ctx := context.Background()
	gf, c, _ := newGRPCGroupFake(t)
	tf := gf.txnFake
	snapRetry := &pb.TxnBegin{Isolation: "snapshot", RetryOf: "t0", ReadOnly: true}
	wantOpts := kv.TxnOptions{Isolation: kv.IsolationSnapshot, RetryOf: "t0", ReadOnly: true}
	ref := kv.KeyRef{Collection: "c", Key: []byte("k")}

	tf.rec, tf.found = kv.Record{Value: []byte("v"), Version: 3}, true
	g, err := c.TxnGet(ctx, &pb.TxnGetRequest{Begin: snapRetry, Collection: "c", Key: []byte("k")})
	if err != nil || g.GetTxn() != "t1" || !g.GetFound() || string(g.GetValue()) != "v" || g.GetVersion() != 3 {
		t.Fatalf("TxnGet with begin = %v, %v", g, err)
	}
	wantCalls(t, tf, txnCall{"BeginTxn", "", wantOpts}, txnCall{"TxnGet", "t1", ref})
	// Without begin, no txn in the answer.
	if g, err := c.TxnGet(ctx, &pb.TxnGetRequest{Txn: "t1", Collection: "c", Key: []byte("k")}); err != nil || g.GetTxn() != "" {
		t.Fatalf("TxnGet = %v, %v", g, err)
	}
	wantCalls(t, tf, txnCall{"TxnGet", "t1", ref})

	s, err := c.TxnScan(ctx, &pb.TxnScanRequest{Begin: &pb.TxnBegin{}, Collection: "c", Start: []byte("a"), Limit: 5})
	if err != nil || s.GetTxn() != "t2" {
		t.Fatalf("TxnScan with begin = %v, %v", s, err)
	}
	wantCalls(t, tf, txnCall{"BeginTxn", "", kv.TxnOptions{Isolation: kv.IsolationSerializable}},
		txnCall{"TxnScan", "t2", kv.ScanRequest{Collection: "c", Start: []byte("a"), Limit: 5}})

	q, err := c.TxnGetByTags(ctx, &pb.TxnTagQuery{Begin: &pb.TxnBegin{}, Collection: "c", Any: []string{"x"}})
	if err != nil || q.GetTxn() != "t3" {
		t.Fatalf("TxnGetByTags with begin = %v, %v", q, err)
	}
	wantCalls(t, tf, txnCall{"BeginTxn", "", kv.TxnOptions{Isolation: kv.IsolationSerializable}},
		txnCall{"TxnGetByTags", "t3", kv.TagQuery{Collection: "c", Any: []string{"x"}}})

	writes := []*pb.TxnOp{
		{Op: "put", Collection: "c", Key: []byte("a"), Value: []byte{0, 1}, Tags: []string{"t"}},
		{Op: "delete", Collection: "d", Key: []byte("b")},
		{Op: "put", Collection: "c", Key: []byte("a"), Value: []byte("2")},
	}
	wantWrites := []txnCall{
		{"TxnPut", "t9", kv.PutItem{Collection: "c", Key: []byte("a"), Value: []byte{0, 1}, Tags: []string{"t"}}},
		{"TxnDelete", "t9", kv.KeyRef{Collection: "d", Key: []byte("b")}},
		{"TxnPut", "t9", kv.PutItem{Collection: "c", Key: []byte("a"), Value: []byte("2")}},
	}
	w, err := c.TxnWrite(ctx, &pb.TxnWriteRequest{Txn: "t9", Writes: writes})
	if err != nil || w.GetTxn() != "" {
		t.Fatalf("TxnWrite = %v, %v", w, err)
	}
	wantCalls(t, tf, wantWrites...)

	// A commit that begins, writes in order, and commits: one RPC.
	tf.commitV = 42
	tf.beginIDs = []string{"", "", "", "t9"}
	cm, err := c.CommitTxn(ctx, &pb.CommitTxnRequest{Begin: &pb.TxnBegin{}, Writes: writes})
	if err != nil || cm.GetTxn() != "t9" || cm.GetVersion() != 42 {
		t.Fatalf("CommitTxn with begin and writes = %v, %v", cm, err)
	}
	wantCalls(t, tf, append(append([]txnCall{{"BeginTxn", "", kv.TxnOptions{Isolation: kv.IsolationSerializable}}}, wantWrites...),
		txnCall{"CommitTxn", "t9", nil})...)
	// The plain commit is unchanged.
	if cm, err := c.CommitTxn(ctx, &pb.CommitTxnRequest{Txn: "t9"}); err != nil || cm.GetTxn() != "" || cm.GetVersion() != 42 {
		t.Fatalf("CommitTxn = %v, %v", cm, err)
	}
	wantCalls(t, tf, txnCall{"CommitTxn", "t9", nil})

	// A begin that names a group begins a group attempt.
	g, err = c.TxnGet(ctx, &pb.TxnGetRequest{Begin: &pb.TxnBegin{Group: "g 1", RetryOf: "g4"}, Collection: "c", Key: []byte("k")})
	if err != nil || g.GetTxn() != "g5" {
		t.Fatalf("TxnGet with a group begin = %v, %v", g, err)
	}
	wantCalls(t, tf, txnCall{"BeginGroupTxn", "g 1", kv.TxnOptions{Isolation: kv.IsolationSerializable, RetryOf: "g4"}}, txnCall{"TxnGet", "g5", ref})
}

func TestGRPCTxnBeginBadInput(t *testing.T) {
	ctx := context.Background()
	gf, c, _ := newGRPCGroupFake(t)
	tf := gf.txnFake
	for name, call := range map[string]func() error{
		"get with txn and begin": func() error {
			_, err := c.TxnGet(ctx, &pb.TxnGetRequest{Txn: "t1", Begin: &pb.TxnBegin{}, Collection: "c", Key: []byte("k")})
			return err
		},
		"get with neither": func() error {
			_, err := c.TxnGet(ctx, &pb.TxnGetRequest{Collection: "c", Key: []byte("k")})
			return err
		},
		"get with a bad key": func() error {
			_, err := c.TxnGet(ctx, &pb.TxnGetRequest{Begin: &pb.TxnBegin{}, Collection: "c"})
			return err
		},
		"begin with a bad isolation": func() error {
			_, err := c.TxnGet(ctx, &pb.TxnGetRequest{Begin: &pb.TxnBegin{Isolation: "dirty"}, Collection: "c", Key: []byte("k")})
			return err
		},
		"group begin with snapshot": func() error {
			_, err := c.TxnGet(ctx, &pb.TxnGetRequest{Begin: &pb.TxnBegin{Group: "g", Isolation: "snapshot"}, Collection: "c", Key: []byte("k")})
			return err
		},
		"scan with both": func() error {
			_, err := c.TxnScan(ctx, &pb.TxnScanRequest{Txn: "t1", Begin: &pb.TxnBegin{}, Collection: "c"})
			return err
		},
		"tags with neither": func() error {
			_, err := c.TxnGetByTags(ctx, &pb.TxnTagQuery{Collection: "c", All: []string{"a"}})
			return err
		},
		"write of a get": func() error {
			_, err := c.TxnWrite(ctx, &pb.TxnWriteRequest{Txn: "t1", Writes: []*pb.TxnOp{{Op: "get", Collection: "c", Key: []byte("k")}}})
			return err
		},
		"write with bad tags": func() error {
			_, err := c.TxnWrite(ctx, &pb.TxnWriteRequest{Begin: &pb.TxnBegin{}, Writes: []*pb.TxnOp{{Op: "put", Collection: "c", Key: []byte("k"), Tags: []string{"a,b"}}}})
			return err
		},
		"commit with a delete carrying a value": func() error {
			_, err := c.CommitTxn(ctx, &pb.CommitTxnRequest{Begin: &pb.TxnBegin{}, Writes: []*pb.TxnOp{{Op: "delete", Collection: "c", Key: []byte("k"), Value: []byte("v")}}})
			return err
		},
		"commit with neither": func() error {
			_, err := c.CommitTxn(ctx, &pb.CommitTxnRequest{})
			return err
		},
	} {
		if err := ErrorFromStatus(call(), false); kv.CodeOf(err) != kv.CodeInvalidArgument {
			t.Errorf("%s: %v, want invalid_argument", name, err)
		}
	}
	if n := tf.numCalls(); n != 0 {
		t.Fatalf("bad requests reached the backend: %+v", tf.calls)
	}
}

// TestGRPCTxnBeginFailure checks that an operation that began its attempt
// and failed names the attempt in its trailer, and that a failed begin
// names none.
func TestGRPCTxnBeginFailure(t *testing.T) {
	ctx := context.Background()
	gf, c, _ := newGRPCGroupFake(t)
	tf := gf.txnFake
	tf.errs["TxnGet"] = kv.Errorf(kv.CodeTxnAborted, "wounded")
	var md metadata.MD
	_, err := c.TxnGet(ctx, &pb.TxnGetRequest{Begin: &pb.TxnBegin{}, Collection: "c", Key: []byte("k")}, grpc.Trailer(&md))
	if kv.CodeOf(ErrorFromStatus(err, false)) != kv.CodeTxnAborted || !reflect.DeepEqual(md.Get(TxnTrailer), []string{"t1"}) {
		t.Fatalf("TxnGet = %v, trailer %v", err, md)
	}
	delete(tf.errs, "TxnGet")
	takeCalls(tf)

	tf.errs["BeginTxn"] = kv.Errorf(kv.CodeUnavailable, "no oracle")
	md = nil
	_, err = c.CommitTxn(ctx, &pb.CommitTxnRequest{Begin: &pb.TxnBegin{}, Writes: []*pb.TxnOp{{Op: "put", Collection: "c", Key: []byte("k")}}}, grpc.Trailer(&md))
	if kv.CodeOf(ErrorFromStatus(err, false)) != kv.CodeUnavailable || len(md.Get(TxnTrailer)) != 0 || len(md.Get(CodeTrailer)) != 1 {
		t.Fatalf("CommitTxn = %v, trailer %v", err, md)
	}
	wantCalls(t, tf, txnCall{"BeginTxn", "", kv.TxnOptions{Isolation: kv.IsolationSerializable}})
	delete(tf.errs, "BeginTxn")
}

// TestGRPCCommitWritesFail checks that a write of a commit that fails
// fails the commit with its code and aborts the attempt, before any
// commit.
func TestGRPCCommitWritesFail(t *testing.T) {
	ctx := context.Background()
	gf, c, _ := newGRPCGroupFake(t)
	tf := gf.txnFake
	writes := []*pb.TxnOp{{Op: "put", Collection: "c", Key: []byte("a")}, {Op: "delete", Collection: "c", Key: []byte("b")}}
	tf.errs["TxnDelete"] = kv.Errorf(kv.CodeTooLarge, "transaction t1 has more than 1 operations")
	var md metadata.MD
	_, err := c.CommitTxn(ctx, &pb.CommitTxnRequest{Begin: &pb.TxnBegin{}, Writes: writes}, grpc.Trailer(&md))
	if err := ErrorFromStatus(err, true); kv.CodeOf(err) != kv.CodeTooLarge || !strings.Contains(err.Error(), "more than 1") {
		t.Fatalf("CommitTxn = %v, want too_large", err)
	}
	if !reflect.DeepEqual(md.Get(TxnTrailer), []string{"t1"}) {
		t.Fatalf("trailer %v", md)
	}
	wantCalls(t, tf, txnCall{"BeginTxn", "", kv.TxnOptions{Isolation: kv.IsolationSerializable}},
		txnCall{"TxnPut", "t1", kv.PutItem{Collection: "c", Key: []byte("a")}},
		txnCall{"TxnDelete", "t1", kv.KeyRef{Collection: "c", Key: []byte("b")}},
		txnCall{"AbortTxn", "t1", nil})

	// An aborted write: the attempt is over already, no abort is sent.
	tf.errs["TxnDelete"] = kv.Errorf(kv.CodeTxnAborted, "wounded")
	_, err = c.CommitTxn(ctx, &pb.CommitTxnRequest{Txn: "t7", Writes: writes})
	if kv.CodeOf(ErrorFromStatus(err, true)) != kv.CodeTxnAborted {
		t.Fatalf("CommitTxn = %v, want txn_aborted", err)
	}
	wantCalls(t, tf, txnCall{"TxnPut", "t7", kv.PutItem{Collection: "c", Key: []byte("a")}},
		txnCall{"TxnDelete", "t7", kv.KeyRef{Collection: "c", Key: []byte("b")}})
	delete(tf.errs, "TxnDelete")

	// A write refused because the backend does not know the attempt: it
	// may have committed (this may be its commit sent again), so the
	// commit's answer is commit_unknown, not txn_aborted.
	tf.errs["TxnPut"] = kv.TxnUnknown(kv.Errorf(kv.CodeTxnAborted, "transaction t8 is not known to node 1"))
	_, err = c.CommitTxn(ctx, &pb.CommitTxnRequest{Txn: "t8", Writes: writes})
	if st, _ := status.FromError(err); st.Code() != codes.Unknown || kv.CodeOf(ErrorFromStatus(err, true)) != kv.CodeCommitUnknown || !strings.Contains(st.Message(), "not known") {
		t.Fatalf("CommitTxn of an unknown attempt with writes = %v, want commit_unknown", err)
	}
	wantCalls(t, tf, txnCall{"TxnPut", "t8", kv.PutItem{Collection: "c", Key: []byte("a")}})
	delete(tf.errs, "TxnPut")
}

// TestTxnAttempt checks the client attempt: its round trips, its
// read-your-writes from the writes it keeps, and the calls the backend
// sees.
func TestTxnAttempt(t *testing.T) {
	ctx := context.Background()
	var rpcs rpcCounter
	gf := &groupFake{txnFake: newTxnFake()}
	_, tc := grpcTxnServe(t, gf, rpcs.interceptor())
	tf := gf.txnFake
	ser := kv.TxnOptions{Isolation: kv.IsolationSerializable}
	wantRPCs := func(want ...string) {
		t.Helper()
		if got := rpcs.take(); !reflect.DeepEqual(got, want) {
			t.Fatalf("RPCs %q, want %q", got, want)
		}
	}

	// Read, modify, write: a get that begins, and the commit with the
	// writes.
	a := tc.NewAttempt("", ser)
	tf.rec, tf.found = kv.Record{Value: []byte("1"), Version: 5}, true
	if rec, found, err := a.Get(ctx, kv.KeyRef{Collection: "c", Key: []byte("a")}); err != nil || !found || string(rec.Value) != "1" || string(rec.Key) != "a" || a.ID() != "t1" {
		t.Fatalf("Get = %+v, %v, %v (id %q)", rec, found, err, a.ID())
	}
	val := []byte("2")
	if err := a.Put(ctx, kv.PutItem{Collection: "c", Key: []byte("a"), Value: val, Tags: []string{"x"}}); err != nil {
		t.Fatal(err)
	}
	val[0] = '9' // the attempt keeps its own copy
	if err := a.Put(ctx, kv.PutItem{Collection: "c", Key: []byte("b")}); err != nil {
		t.Fatal(err)
	}
	if err := a.Delete(ctx, kv.KeyRef{Collection: "c", Key: []byte("d")}); err != nil {
		t.Fatal(err)
	}
	// Reads of keys written answer what the server would, without it.
	rec, found, err := a.Get(ctx, kv.KeyRef{Collection: "c", Key: []byte("a")})
	if err != nil || !found || !reflect.DeepEqual(rec, kv.Record{Key: []byte("a"), Value: []byte("2"), Tags: []string{"x"}}) {
		t.Fatalf("Get of a key put = %+v, %v, %v", rec, found, err)
	}
	rec.Value[0] = 'z' // nor does the caller's change of an answer reach it
	if rec, found, err := a.Get(ctx, kv.KeyRef{Collection: "c", Key: []byte("b")}); err != nil || !found || rec.Value != nil || rec.Tags != nil || rec.Version != 0 {
		t.Fatalf("Get of a key put empty = %#v, %v, %v", rec, found, err)
	}
	if _, found, err := a.Get(ctx, kv.KeyRef{Collection: "c", Key: []byte("d")}); err != nil || found {
		t.Fatalf("Get of a key deleted = %v, %v", found, err)
	}
	// Put then delete of one key reads as absent; delete then put as put.
	if err := a.Put(ctx, kv.PutItem{Collection: "c", Key: []byte("e"), Value: []byte("e")}); err != nil {
		t.Fatal(err)
	}
	if err := a.Delete(ctx, kv.KeyRef{Collection: "c", Key: []byte("e")}); err != nil {
		t.Fatal(err)
	}
	if _, found, err := a.Get(ctx, kv.KeyRef{Collection: "c", Key: []byte("e")}); err != nil || found {
		t.Fatalf("Get of a key put then deleted = %v, %v", found, err)
	}
	// The same key in another collection is not the key written.
	if _, _, err := a.Get(ctx, kv.KeyRef{Collection: "c2", Key: []byte("a")}); err != nil {
		t.Fatal(err)
	}
	wantRPCs("TxnGet", "TxnGet")
	takeCalls(tf)
	tf.commitV = 11
	if v, err := a.Commit(ctx); err != nil || v != 11 {
		t.Fatalf("Commit = %d, %v", v, err)
	}
	wantRPCs("CommitTxn")
	wantCalls(t, tf,
		txnCall{"TxnPut", "t1", kv.PutItem{Collection: "c", Key: []byte("a"), Value: []byte("2"), Tags: []string{"x"}}},
		txnCall{"TxnPut", "t1", kv.PutItem{Collection: "c", Key: []byte("b")}},
		txnCall{"TxnDelete", "t1", kv.KeyRef{Collection: "c", Key: []byte("d")}},
		txnCall{"TxnPut", "t1", kv.PutItem{Collection: "c", Key: []byte("e"), Value: []byte("e")}},
		txnCall{"TxnDelete", "t1", kv.KeyRef{Collection: "c", Key: []byte("e")}},
		txnCall{"CommitTxn", "t1", nil})

	// Writes only: one RPC.
	a = tc.NewAttempt("", kv.TxnOptions{Isolation: kv.IsolationSnapshot, RetryOf: "t1"})
	if err := a.Put(ctx, kv.PutItem{Collection: "c", Key: []byte("w")}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Commit(ctx); err != nil || a.ID() != "t2" {
		t.Fatalf("Commit = %v (id %q)", err, a.ID())
	}
	wantRPCs("CommitTxn")
	wantCalls(t, tf, txnCall{"BeginTxn", "", kv.TxnOptions{Isolation: kv.IsolationSnapshot, RetryOf: "t1"}},
		txnCall{"TxnPut", "t2", kv.PutItem{Collection: "c", Key: []byte("w")}}, txnCall{"CommitTxn", "t2", nil})

	// Put then scan: the writes go first, so that the scan sees them.
	a = tc.NewAttempt("", ser)
	if err := a.Put(ctx, kv.PutItem{Collection: "c", Key: []byte("s")}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Scan(ctx, kv.ScanRequest{Collection: "c"}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.GetByTags(ctx, kv.TagQuery{Collection: "c", All: []string{"x"}}); err != nil {
		t.Fatal(err)
	}
	wantRPCs("TxnWrite", "TxnScan", "TxnGetByTags")
	wantCalls(t, tf, txnCall{"BeginTxn", "", ser}, txnCall{"TxnPut", "t3", kv.PutItem{Collection: "c", Key: []byte("s")}},
		txnCall{"TxnScan", "t3", kv.ScanRequest{Collection: "c"}}, txnCall{"TxnGetByTags", "t3", kv.TagQuery{Collection: "c", All: []string{"x"}}})
	// A flushed write is the server's to answer.
	if _, _, err := a.Get(ctx, kv.KeyRef{Collection: "c", Key: []byte("s")}); err != nil {
		t.Fatal(err)
	}
	wantRPCs("TxnGet")
	if err := a.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	wantRPCs("AbortTxn")
	takeCalls(tf)

	// A value over 1 MiB is sent at once, begun if need be.
	a = tc.NewAttempt("", ser)
	big := bytes.Repeat([]byte("v"), kv.DefaultMaxValueSize+1)
	if err := a.Put(ctx, kv.PutItem{Collection: "c", Key: []byte("big"), Value: big}); err != nil {
		t.Fatal(err)
	}
	wantRPCs("TxnWrite")
	// An attempt that sent nothing is not aborted remotely.
	a2 := tc.NewAttempt("", ser)
	_ = a2.Put(ctx, kv.PutItem{Collection: "c", Key: []byte("x")})
	if err := a2.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	wantRPCs()
	takeCalls(tf)

	// Begin begins with no write.
	a = tc.NewAttempt("", ser)
	if id, err := a.Begin(ctx); err != nil || id != "t5" {
		t.Fatalf("Begin = %q, %v", id, err)
	}
	if id, err := a.Begin(ctx); err != nil || id != "t5" {
		t.Fatalf("second Begin = %q, %v", id, err)
	}
	wantRPCs("TxnWrite")
	wantCalls(t, tf, txnCall{"BeginTxn", "", ser})

	// An attempt aborted at its first get learns its id for the retry.
	tf.errs["TxnGet"] = kv.Errorf(kv.CodeTxnAborted, "wounded")
	a = tc.NewAttempt("", ser)
	if _, _, err := a.Get(ctx, kv.KeyRef{Collection: "c", Key: []byte("k")}); kv.CodeOf(err) != kv.CodeTxnAborted || a.ID() != "t6" {
		t.Fatalf("Get = %v (id %q), want txn_aborted in t6", err, a.ID())
	}
	delete(tf.errs, "TxnGet")
	takeCalls(tf)
	rpcs.take()

	// A group attempt begins a group transaction.
	a = tc.NewAttempt("g1", kv.TxnOptions{RetryOf: "g3"})
	if err := a.Put(ctx, kv.PutItem{Collection: "c", Key: []byte("m")}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Commit(ctx); err != nil || a.ID() != "g7" {
		t.Fatalf("group Commit = %v (id %q)", err, a.ID())
	}
	wantCalls(t, tf, txnCall{"BeginGroupTxn", "g1", kv.TxnOptions{Isolation: kv.IsolationSerializable, RetryOf: "g3"}},
		txnCall{"TxnPut", "g7", kv.PutItem{Collection: "c", Key: []byte("m")}}, txnCall{"CommitTxn", "g7", nil})
	wantRPCs("CommitTxn")

	// A read for update is a TxnGet with for_update (TxnGetForUpdate on
	// the server); a read-only attempt refuses it without an RPC.
	a = tc.NewAttempt("", ser)
	tf.rec, tf.found = kv.Record{Value: []byte("3"), Version: 6}, true
	if rec, found, err := a.GetForUpdate(ctx, kv.KeyRef{Collection: "c", Key: []byte("u")}); err != nil || !found || string(rec.Value) != "3" || string(rec.Key) != "u" {
		t.Fatalf("GetForUpdate = %+v, %v, %v", rec, found, err)
	}
	wantRPCs("TxnGet")
	wantCalls(t, tf, txnCall{"BeginTxn", "", ser}, txnCall{"TxnGetForUpdate", a.ID(), kv.KeyRef{Collection: "c", Key: []byte("u")}})
	if err := a.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	rpcs.take()
	takeCalls(tf)
	ro := tc.NewAttempt("", kv.TxnOptions{Isolation: kv.IsolationSerializable, ReadOnly: true})
	if _, _, err := ro.GetForUpdate(ctx, kv.KeyRef{Collection: "c", Key: []byte("u")}); kv.CodeOf(err) != kv.CodeInvalidArgument {
		t.Fatalf("GetForUpdate in a read-only attempt = %v, want invalid_argument", err)
	}
	wantRPCs()
}

// TestTxnAttemptChecksWrites checks that a bad write fails at Put or
// Delete, with the code the server would answer, and sends nothing.
func TestTxnAttemptChecksWrites(t *testing.T) {
	ctx := context.Background()
	var rpcs rpcCounter
	gf := &groupFake{txnFake: newTxnFake()}
	_, tc := grpcTxnServe(t, gf, rpcs.interceptor())
	a := tc.NewAttempt("", kv.TxnOptions{})
	ro := tc.NewAttempt("", kv.TxnOptions{ReadOnly: true})
	g := tc.NewAttempt("g", kv.TxnOptions{})
	for _, c := range []struct {
		name string
		err  error
		want kv.Code
	}{
		{"empty key", a.Put(ctx, kv.PutItem{Collection: "c"}), kv.CodeInvalidArgument},
		{"long key", a.Put(ctx, kv.PutItem{Collection: "c", Key: make([]byte, kv.MaxKeySize+1)}), kv.CodeTooLarge},
		{"bad collection", a.Put(ctx, kv.PutItem{Collection: "C!", Key: []byte("k")}), kv.CodeInvalidArgument},
		{"bad tags", a.Put(ctx, kv.PutItem{Collection: "c", Key: []byte("k"), Tags: []string{"a", "a"}}), kv.CodeInvalidArgument},
		{"if_version", a.Put(ctx, kv.PutItem{Collection: "c", Key: []byte("k"), IfVersion: new(uint64)}), kv.CodeInvalidArgument},
		{"delete of an empty key", a.Delete(ctx, kv.KeyRef{Collection: "c"}), kv.CodeInvalidArgument},
		{"read-only put", ro.Put(ctx, kv.PutItem{Collection: "c", Key: []byte("k")}), kv.CodeInvalidArgument},
		{"read-only delete", ro.Delete(ctx, kv.KeyRef{Collection: "c", Key: []byte("k")}), kv.CodeInvalidArgument},
		{"group put with bad tags", g.Put(ctx, kv.PutItem{Collection: "c", Key: []byte("k"), Tags: []string{"t", "t"}}), kv.CodeInvalidArgument},
	} {
		if kv.CodeOf(c.err) != c.want {
			t.Errorf("%s: %v, want %s", c.name, c.err, c.want)
		}
	}
	if got := rpcs.take(); len(got) != 0 {
		t.Fatalf("bad writes were sent: %q", got)
	}
	// Nothing bad was kept: the commit carries no write.
	if _, err := a.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, gf.txnFake, txnCall{"BeginTxn", "", kv.TxnOptions{Isolation: kv.IsolationSerializable}}, txnCall{"CommitTxn", "t1", nil})
}

// TestTxnAttemptBatchGet: a batch get answers the keys the attempt wrote
// from the writes kept and asks the server for the others in one TxnGet
// (with the begin when it is the attempt's first request); the items
// come back in the order asked.
func TestTxnAttemptBatchGet(t *testing.T) {
	ctx := context.Background()
	var rpcs rpcCounter
	gf := &groupFake{txnFake: newTxnFake()}
	_, tc := grpcTxnServe(t, gf, rpcs.interceptor())
	tf := gf.txnFake
	tf.rec, tf.found = kv.Record{Value: []byte("s"), Version: 5}, true
	ref := func(k string) kv.KeyRef { return kv.KeyRef{Collection: "c", Key: []byte(k)} }

	a := tc.NewAttempt("", kv.TxnOptions{Isolation: kv.IsolationSerializable})
	items, err := a.BatchGet(ctx, []kv.KeyRef{ref("x"), ref("y")}, true)
	if err != nil || len(items) != 2 || string(items[1].Key) != "y" || !items[1].Found || string(items[1].Value) != "s" || items[1].Version != 5 || a.ID() != "t1" {
		t.Fatalf("the first batch get = %+v, %v (id %q)", items, err, a.ID())
	}
	if got := rpcs.take(); !reflect.DeepEqual(got, []string{"TxnGet"}) {
		t.Fatalf("RPCs %q, want one TxnGet", got)
	}
	wantCalls(t, tf,
		txnCall{"BeginTxn", "", kv.TxnOptions{Isolation: kv.IsolationSerializable}},
		txnCall{"TxnBatchGet", "t1", []kv.KeyRef{ref("x"), ref("y")}})

	if err := a.Put(ctx, kv.PutItem{Collection: "c", Key: []byte("a"), Value: []byte("mine"), Tags: []string{"t"}}); err != nil {
		t.Fatal(err)
	}
	if err := a.Delete(ctx, ref("d")); err != nil {
		t.Fatal(err)
	}
	items, err = a.BatchGet(ctx, []kv.KeyRef{ref("a"), ref("z"), ref("d"), ref("x")}, false)
	if err != nil || len(items) != 4 {
		t.Fatalf("batch get = %+v, %v", items, err)
	}
	want := []kv.BatchGetItem{
		{Collection: "c", Key: []byte("a"), Found: true, Value: []byte("mine"), Tags: []string{"t"}},
		{Collection: "c", Key: []byte("z"), Found: true, Value: []byte("s"), Version: 5},
		{Collection: "c", Key: []byte("d")},
		{Collection: "c", Key: []byte("x"), Found: true, Value: []byte("s"), Version: 5},
	}
	for i := range want {
		if !reflect.DeepEqual(items[i].Key, want[i].Key) || items[i].Found != want[i].Found || !bytes.Equal(items[i].Value, want[i].Value) ||
			items[i].Version != want[i].Version || strings.Join(items[i].Tags, ",") != strings.Join(want[i].Tags, ",") {
			t.Errorf("item %d = %+v, want %+v", i, items[i], want[i])
		}
	}
	if got := rpcs.take(); !reflect.DeepEqual(got, []string{"TxnGet"}) {
		t.Fatalf("RPCs %q, want one TxnGet", got)
	}
	wantCalls(t, tf, txnCall{"TxnBatchGet", "t1", []kv.KeyRef{ref("z"), ref("x")}})

	// Keys the attempt wrote only: nothing is sent.
	if _, err := a.BatchGet(ctx, []kv.KeyRef{ref("a"), ref("d")}, false); err != nil {
		t.Fatal(err)
	}
	if got := rpcs.take(); len(got) != 0 {
		t.Fatalf("a batch get of written keys sent %q", got)
	}
	// A read-only attempt refuses a batch get for update at once.
	ro := tc.NewAttempt("", kv.TxnOptions{ReadOnly: true})
	if _, err := ro.BatchGet(ctx, []kv.KeyRef{ref("a")}, true); kv.CodeOf(err) != kv.CodeInvalidArgument {
		t.Fatalf("a read-only attempt's batch get for update: %v", err)
	}
	if got := rpcs.take(); len(got) != 0 {
		t.Fatalf("a refused batch get sent %q", got)
	}
}
