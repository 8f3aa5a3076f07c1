package groupkv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"reflect"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/groupkv/groupkv/internal/api"
	"github.com/groupkv/groupkv/internal/kv"
	pb "github.com/groupkv/groupkv/proto/groupkvpb"
)

// These tests run Transact and Exec against txnFake, an in-memory
// kv.TxnBackend that records its calls and fails where a test tells it
// to, through each DB of dbKinds: embedded (the fake called directly) and
// remote (a Dial'ed DB talking to the api gRPC server over the fake on
// 127.0.0.1, which serves no HTTP: every call of the remote DB goes over
// gRPC, as unary RPCs or on the Pipeline stream).

// txnFake is a kv.Backend (whose plain methods panic: the embedded
// interface is nil) and a kv.TxnBackend with a committed map of records.
// Attempts buffer their writes and apply them at commit, at one new
// version; reads see the attempt's own writes.
type txnFake struct {
	kv.Backend

	mu       sync.Mutex
	calls    []fakeCall
	data     map[string]kv.Record // by fakeKey
	version  uint64
	attempts map[string]*fakeAttempt
	begun    int
	// fail, when set, is asked before every call: a non-nil error is
	// answered instead of doing it. n is the number of the attempt the
	// call belongs to (1 for the first BeginTxn or BeginGroupTxn), 0 for
	// ExecTxn and the group methods.
	fail    func(method string, n int) error
	execRes kv.ExecResult
}

type fakeCall struct {
	method string
	txn    string
	arg    any
}

type fakeAttempt struct {
	n      int
	opts   kv.TxnOptions
	writes map[string]*kv.Record // nil record: deleted
	done   bool
}

var _ kv.TxnBackend = (*txnFake)(nil)

func newTxnFake() *txnFake {
	return &txnFake{data: map[string]kv.Record{}, attempts: map[string]*fakeAttempt{}}
}

func fakeKey(coll string, key []byte) string { return coll + "\x00" + string(key) }

// enter records a call and answers the attempt it names and the error to
// answer, if any. f.mu is held on return.
func (f *txnFake) enter(method, txn string, arg any) (*fakeAttempt, error) {
	f.mu.Lock()
	f.calls = append(f.calls, fakeCall{method, txn, arg})
	a := f.attempts[txn]
	n := 0
	if a != nil {
		n = a.n
	} else if method == "BeginTxn" || method == "BeginGroupTxn" {
		n = f.begun + 1
	}
	if f.fail != nil {
		if err := f.fail(method, n); err != nil {
			return a, err
		}
	}
	if strings.HasPrefix(method, "Txn") || method == "CommitTxn" { // an operation of an attempt
		if a == nil || a.done {
			return a, kv.Errorf(kv.CodeTxnAborted, "transaction %s is not running", txn)
		}
	}
	return a, nil
}

// callsOf returns the calls of method, in order.
func (f *txnFake) callsOf(method string) []fakeCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []fakeCall
	for _, c := range f.calls {
		if c.method == method {
			out = append(out, c)
		}
	}
	return out
}

func (f *txnFake) BeginTxn(_ context.Context, opts kv.TxnOptions) (string, error) {
	_, err := f.enter("BeginTxn", "", opts)
	defer f.mu.Unlock()
	if err != nil {
		return "", err
	}
	return f.begin(opts), nil
}

// begin starts an attempt and answers its id; f.mu is held.
func (f *txnFake) begin(opts kv.TxnOptions) string {
	f.begun++
	id := fmt.Sprintf("t%d", f.begun)
	f.attempts[id] = &fakeAttempt{n: f.begun, opts: opts, writes: map[string]*kv.Record{}}
	return id
}

func (f *txnFake) TxnGet(_ context.Context, txn string, ref kv.KeyRef) (kv.Record, bool, error) {
	return f.get("TxnGet", txn, ref)
}

func (f *txnFake) TxnGetForUpdate(_ context.Context, txn string, ref kv.KeyRef) (kv.Record, bool, error) {
	return f.get("TxnGetForUpdate", txn, ref)
}

func (f *txnFake) TxnBatchGet(_ context.Context, txn string, refs []kv.KeyRef, forUpdate bool) ([]kv.BatchGetItem, error) {
	op := "TxnGet"
	if forUpdate {
		op = "TxnGetForUpdate"
	}
	items := make([]kv.BatchGetItem, len(refs))
	for i, ref := range refs {
		rec, found, err := f.get(op, txn, ref)
		if err != nil {
			return nil, err
		}
		items[i] = kv.BatchGetItem{Collection: ref.Collection, Key: ref.Key, Found: found, Value: rec.Value, Tags: rec.Tags, Version: rec.Version}
	}
	return items, nil
}

func (f *txnFake) get(op, txn string, ref kv.KeyRef) (kv.Record, bool, error) {
	a, err := f.enter(op, txn, ref)
	defer f.mu.Unlock()
	if err != nil {
		return kv.Record{}, false, err
	}
	k := fakeKey(ref.Collection, ref.Key)
	if w, ok := a.writes[k]; ok {
		if w == nil {
			return kv.Record{}, false, nil
		}
		return *w, true, nil
	}
	rec, ok := f.data[k]
	return rec, ok, nil
}

func (f *txnFake) TxnPut(_ context.Context, txn string, item kv.PutItem) error {
	a, err := f.enter("TxnPut", txn, item)
	defer f.mu.Unlock()
	if err != nil {
		return err
	}
	if a.opts.ReadOnly {
		return kv.Errorf(kv.CodeInvalidArgument, "read-only")
	}
	a.writes[fakeKey(item.Collection, item.Key)] = &kv.Record{Key: item.Key, Value: item.Value, Tags: item.Tags}
	return nil
}

func (f *txnFake) TxnDelete(_ context.Context, txn string, ref kv.KeyRef) error {
	a, err := f.enter("TxnDelete", txn, ref)
	defer f.mu.Unlock()
	if err != nil {
		return err
	}
	a.writes[fakeKey(ref.Collection, ref.Key)] = nil
	return nil
}

// page answers the committed records of coll that pass keep, in key
// order, all on one page.
func (f *txnFake) page(coll string, keep func(kv.Record) bool) kv.ScanResult {
	res := kv.ScanResult{Items: []kv.Record{}, Version: f.version}
	for k, rec := range f.data {
		if strings.HasPrefix(k, coll+"\x00") && keep(rec) {
			res.Items = append(res.Items, rec)
		}
	}
	sort.Slice(res.Items, func(i, j int) bool { return bytes.Compare(res.Items[i].Key, res.Items[j].Key) < 0 })
	return res
}

func (f *txnFake) TxnScan(_ context.Context, txn string, req kv.ScanRequest) (kv.ScanResult, error) {
	_, err := f.enter("TxnScan", txn, req)
	defer f.mu.Unlock()
	if err != nil {
		return kv.ScanResult{}, err
	}
	return f.page(req.Collection, func(r kv.Record) bool {
		return bytes.Compare(r.Key, req.Start) >= 0 && (len(req.End) == 0 || bytes.Compare(r.Key, req.End) < 0)
	}), nil
}

func (f *txnFake) TxnGetByTags(_ context.Context, txn string, q kv.TagQuery) (kv.ScanResult, error) {
	_, err := f.enter("TxnGetByTags", txn, q)
	defer f.mu.Unlock()
	if err != nil {
		return kv.ScanResult{}, err
	}
	return f.page(q.Collection, func(r kv.Record) bool {
		for _, t := range r.Tags {
			for _, want := range append(append([]string{}, q.All...), q.Any...) {
				if t == want {
					return true
				}
			}
		}
		return false
	}), nil
}

func (f *txnFake) CommitTxn(_ context.Context, txn string) (uint64, error) {
	a, err := f.enter("CommitTxn", txn, nil)
	defer f.mu.Unlock()
	if a != nil {
		a.done = true
	}
	if err != nil {
		return 0, err
	}
	f.version++
	for k, w := range a.writes {
		if w == nil {
			delete(f.data, k)
			continue
		}
		rec := *w
		rec.Version = f.version
		f.data[k] = rec
	}
	return f.version, nil
}

func (f *txnFake) AbortTxn(_ context.Context, txn string) error {
	a, err := f.enter("AbortTxn", txn, nil)
	defer f.mu.Unlock()
	if a != nil {
		a.done = true
	}
	return err
}

func (f *txnFake) ExecTxn(_ context.Context, req kv.ExecRequest) (kv.ExecResult, error) {
	_, err := f.enter("ExecTxn", "", req)
	defer f.mu.Unlock()
	if err != nil {
		return kv.ExecResult{}, err
	}
	return f.execRes, nil
}

// record answers the committed record of coll and key.
func (f *txnFake) record(coll, key string) (kv.Record, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	rec, ok := f.data[fakeKey(coll, []byte(key))]
	return rec, ok
}

// dbKinds are the DBs a test runs against, over a backend: embedded, and
// remote with its transactions' gets and commits as unary RPCs or as
// messages of the Pipeline stream (opened before the test, so that its
// first requests go on it too).
var dbKinds = []struct {
	name string
	open func(t *testing.T, b kv.Backend) DB
}{
	{"embedded", func(t *testing.T, b kv.Backend) DB {
		return embedded{Backend: b, close: func() error { return nil }}
	}},
	{"remote", func(t *testing.T, b kv.Backend) DB {
		addr, _ := serveGRPC(t, b, nil)
		db := dialTest(t, addr)
		db.(*remoteDB).txn.UsePipeline(nil)
		return db
	}},
	{"remote-piped", func(t *testing.T, b kv.Backend) DB {
		addr, _ := serveGRPC(t, b, nil)
		db := dialTest(t, addr)
		if err := db.(*remoteDB).pipe.Open(context.Background()); err != nil {
			t.Fatal(err)
		}
		return db
	}},
}

// serveGRPC serves the gRPC service of b (api.NewGRPCServer, with opts) on
// a port of 127.0.0.1 until the test ends and answers its address and
// server; conns, when not nil, counts the connections accepted.
func serveGRPC(t *testing.T, b kv.Backend, conns *atomic.Int64, opts ...grpc.ServerOption) (string, *grpc.Server) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := api.NewGRPCServer(b, opts...)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(countingListener{Listener: l, n: conns})
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return l.Addr().String(), srv
}

// countingListener counts the connections it accepts in n, when not nil.
type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil && l.n != nil {
		l.n.Add(1)
	}
	return c, err
}

func dialTest(t *testing.T, addr string) DB {
	t.Helper()
	db, err := Dial(addr, WithoutShardRouting())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// isRemote reports whether db is a Dial'ed DB, whose attempts are begun
// by their first request to the server (see api.TxnAttempt): an attempt
// whose function sent nothing is not begun, and is not aborted.
func isRemote(db DB) bool {
	_, ok := db.(*remoteDB)
	return ok
}

func forEachDB(t *testing.T, test func(t *testing.T, f *txnFake, db DB)) {
	for _, k := range dbKinds {
		t.Run(k.name, func(t *testing.T) {
			f := newTxnFake()
			test(t, f, k.open(t, f))
		})
	}
}

func TestTransactCommits(t *testing.T) {
	forEachDB(t, func(t *testing.T, f *txnFake, db DB) {
		ctx := context.Background()
		bin := []byte{0xff, 0x00, 0xfe}
		err := db.Transact(ctx, func(tx *Tx) error {
			if _, err := tx.Get(ctx, GetRequest{Collection: "c", Key: []byte("a")}); !errors.Is(err, ErrNotFound) {
				return fmt.Errorf("get of an absent key: %v, want ErrNotFound", err)
			}
			if err := tx.Put(ctx, PutRequest{Collection: "c", Key: []byte("a"), Value: []byte("1"), Tags: []string{"t", "u"}}); err != nil {
				return err
			}
			if err := tx.Put(ctx, PutRequest{Collection: "c", Key: bin, Value: bin}); err != nil {
				return err
			}
			rec, err := tx.Get(ctx, GetRequest{Collection: "c", Key: bin})
			if err != nil || !bytes.Equal(rec.Value, bin) || !bytes.Equal(rec.Key, bin) {
				return fmt.Errorf("own write read back as %+v, %v", rec, err)
			}
			return tx.Delete(ctx, DeleteRequest{Collection: "c", Key: []byte("gone")})
		})
		if err != nil {
			t.Fatal(err)
		}
		if rec, ok := f.record("c", "a"); !ok || string(rec.Value) != "1" || !reflect.DeepEqual(rec.Tags, []string{"t", "u"}) || rec.Version != 1 {
			t.Fatalf("committed a = %+v %v", rec, ok)
		}
		if rec, ok := f.record("c", string(bin)); !ok || !bytes.Equal(rec.Value, bin) {
			t.Fatalf("committed binary record = %+v %v", rec, ok)
		}
		begins := f.callsOf("BeginTxn")
		if len(begins) != 1 || !reflect.DeepEqual(begins[0].arg, kv.TxnOptions{Isolation: kv.IsolationSerializable}) {
			t.Fatalf("begins %+v", begins)
		}
		wantPuts := []fakeCall{
			{"TxnPut", "t1", kv.PutItem{Collection: "c", Key: []byte("a"), Value: []byte("1"), Tags: []string{"t", "u"}}},
			{"TxnPut", "t1", kv.PutItem{Collection: "c", Key: bin, Value: bin}},
		}
		if got := f.callsOf("TxnPut"); !reflect.DeepEqual(got, wantPuts) {
			t.Fatalf("puts\n got %#v\nwant %#v", got, wantPuts)
		}
		if got := f.callsOf("TxnDelete"); !reflect.DeepEqual(got, []fakeCall{{"TxnDelete", "t1", kv.KeyRef{Collection: "c", Key: []byte("gone")}}}) {
			t.Fatalf("deletes %#v", got)
		}
		if got := f.callsOf("CommitTxn"); len(got) != 1 || got[0].txn != "t1" {
			t.Fatalf("commits %+v", got)
		}
		if got := f.callsOf("AbortTxn"); len(got) != 0 {
			t.Fatalf("a committed transaction was aborted: %+v", got)
		}

		// Reads of ranges and tags in a read-only snapshot transaction.
		var scan, tagged ScanResult
		err = db.Transact(ctx, func(tx *Tx) error {
			var err error
			if scan, err = tx.Scan(ctx, ScanRequest{Collection: "c", Start: []byte("a"), End: []byte{0xff, 0xff}, Limit: 5, Reverse: true, Page: "p"}); err != nil {
				return err
			}
			tagged, err = tx.GetByTags(ctx, TagQuery{Collection: "c", Any: []string{"u"}, Limit: 3})
			return err
		}, WithIsolation(Snapshot), ReadOnly())
		if err != nil {
			t.Fatal(err)
		}
		if len(scan.Items) != 2 || string(scan.Items[0].Key) != "a" || !bytes.Equal(scan.Items[1].Value, bin) || scan.Version != 1 {
			t.Fatalf("scan %+v", scan)
		}
		if len(tagged.Items) != 1 || string(tagged.Items[0].Key) != "a" || !reflect.DeepEqual(tagged.Items[0].Tags, []string{"t", "u"}) {
			t.Fatalf("tag query %+v", tagged)
		}
		begins = f.callsOf("BeginTxn")
		if !reflect.DeepEqual(begins[1].arg, kv.TxnOptions{Isolation: kv.IsolationSnapshot, ReadOnly: true}) {
			t.Fatalf("begin of the read-only snapshot transaction: %+v", begins[1].arg)
		}
		wantScan := kv.ScanRequest{Collection: "c", Start: []byte("a"), End: []byte{0xff, 0xff}, Limit: 5, Reverse: true, Page: "p"}
		if got := f.callsOf("TxnScan"); !reflect.DeepEqual(got, []fakeCall{{"TxnScan", "t2", wantScan}}) {
			t.Fatalf("scans %#v", got)
		}
		if got := f.callsOf("TxnGetByTags"); !reflect.DeepEqual(got, []fakeCall{{"TxnGetByTags", "t2", kv.TagQuery{Collection: "c", Any: []string{"u"}, Limit: 3}}}) {
			t.Fatalf("tag queries %#v", got)
		}

		// A write in a read-only transaction fails; fn's error comes back.
		err = db.Transact(ctx, func(tx *Tx) error {
			return tx.Put(ctx, PutRequest{Collection: "c", Key: []byte("x"), Value: []byte("1")})
		}, ReadOnly())
		if kv.CodeOf(err) != kv.CodeInvalidArgument {
			t.Fatalf("write in a read-only transaction: %v", err)
		}
	})
}

// TestTransactRetries checks that an attempt aborted by an operation or by
// its commit is run again in a new attempt that names the aborted one, so
// it keeps its priority, with the same options.
// TestTransactGetForUpdate: Tx.GetForUpdate reaches the backend as a
// read for update (TxnGetForUpdate), embedded and remote, and reads like
// Get: an absent key is ErrNotFound, a key written answers the write.
func TestTransactGetForUpdate(t *testing.T) {
	forEachDB(t, func(t *testing.T, f *txnFake, db DB) {
		ctx := context.Background()
		err := db.Transact(ctx, func(tx *Tx) error {
			if _, err := tx.GetForUpdate(ctx, GetRequest{Collection: "c", Key: []byte("x")}); !errors.Is(err, ErrNotFound) {
				return fmt.Errorf("read for update of an absent key: %v, want ErrNotFound", err)
			}
			if err := tx.Put(ctx, PutRequest{Collection: "c", Key: []byte("x"), Value: []byte("1")}); err != nil {
				return err
			}
			rec, err := tx.GetForUpdate(ctx, GetRequest{Collection: "c", Key: []byte("x")})
			if err != nil || string(rec.Value) != "1" {
				return fmt.Errorf("read for update of a key written: %+v, %v", rec, err)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if got := f.callsOf("TxnGetForUpdate"); len(got) == 0 || !reflect.DeepEqual(got[0], fakeCall{"TxnGetForUpdate", "t1", kv.KeyRef{Collection: "c", Key: []byte("x")}}) {
			t.Fatalf("reads for update reached the backend as %+v", got)
		}
		if got := f.callsOf("TxnGet"); len(got) != 0 {
			t.Fatalf("plain reads reached the backend: %+v", got)
		}
	})
}

func TestTransactRetries(t *testing.T) {
	forEachDB(t, func(t *testing.T, f *txnFake, db DB) {
		ctx := context.Background()
		aborted := kv.Errorf(kv.CodeTxnAborted, "wounded by an older transaction")
		f.fail = func(method string, n int) error {
			switch {
			case method == "TxnGet" && n == 1, // fn returns it
				method == "TxnPut" && n == 2, // fn wraps it
				method == "TxnGet" && n == 3, // fn swallows it
				method == "CommitTxn" && n == 4:
				return aborted
			}
			return nil
		}
		runs := 0
		err := db.Transact(ctx, func(tx *Tx) error {
			runs++
			_, err := tx.Get(ctx, GetRequest{Collection: "c", Key: []byte("k")})
			switch {
			case runs == 3 && !errors.Is(err, ErrTxnAborted):
				return fmt.Errorf("run 3: get answered %v, want ErrTxnAborted", err)
			case runs == 3:
				// Swallowed: later operations answer it again at once.
				if err := tx.Put(ctx, PutRequest{Collection: "c", Key: []byte("k"), Value: []byte("v")}); !errors.Is(err, ErrTxnAborted) {
					return fmt.Errorf("put after an aborted get: %v", err)
				}
				return nil
			case err != nil && !errors.Is(err, ErrNotFound):
				return err
			}
			if err := tx.Put(ctx, PutRequest{Collection: "c", Key: []byte("k"), Value: []byte(fmt.Sprint(runs))}); err != nil {
				return fmt.Errorf("put: %w", err)
			}
			return nil
		}, WithIsolation(Snapshot))
		if err != nil {
			t.Fatal(err)
		}
		if runs != 5 {
			t.Fatalf("fn ran %d times, want 5", runs)
		}
		var retryOf []string
		for _, c := range f.callsOf("BeginTxn") {
			opts := c.arg.(kv.TxnOptions)
			if opts.Isolation != kv.IsolationSnapshot || opts.ReadOnly {
				t.Fatalf("attempt options %+v", opts)
			}
			retryOf = append(retryOf, opts.RetryOf)
		}
		if want := []string{"", "t1", "t2", "t3", "t4"}; !reflect.DeepEqual(retryOf, want) {
			t.Fatalf("retry_of of the attempts %q, want %q", retryOf, want)
		}
		if rec, _ := f.record("c", "k"); string(rec.Value) != "5" {
			t.Fatalf("committed %+v, want the fifth run's write", rec)
		}
		if got := f.callsOf("AbortTxn"); len(got) != 0 {
			t.Fatalf("aborted attempts were aborted again: %+v", got)
		}
		if got := f.callsOf("TxnPut"); len(got) != 3 { // runs 2, 4 and 5; run 3's put was not sent
			t.Fatalf("puts sent: %+v", got)
		}
	})
}

func TestTransactBackoff(t *testing.T) {
	for n := 1; n < 40; n++ {
		d := txnBackoff(n)
		hi := min(txnBackoffMin<<min(n-1, 20), txnBackoffMax)
		if d < hi/2 || d >= hi {
			t.Fatalf("backoff %d = %v, want in [%v, %v)", n, d, hi/2, hi)
		}
	}
}

var errMine = errors.New("mine")

// TestTransactFnError checks that fn's own error comes back untouched after
// the attempt is aborted, and is not retried.
func TestTransactFnError(t *testing.T) {
	forEachDB(t, func(t *testing.T, f *txnFake, db DB) {
		ctx := context.Background()
		var kept *Tx
		err := db.Transact(ctx, func(tx *Tx) error {
			kept = tx
			if _, err := tx.Get(ctx, GetRequest{Collection: "c", Key: []byte("k")}); !errors.Is(err, ErrNotFound) {
				return err
			}
			if err := tx.Put(ctx, PutRequest{Collection: "c", Key: []byte("k"), Value: []byte("v")}); err != nil {
				return err
			}
			return errMine
		})
		if err != errMine {
			t.Fatalf("Transact = %v, want fn's error itself", err)
		}
		if got := f.callsOf("AbortTxn"); len(got) != 1 || got[0].txn != "t1" {
			t.Fatalf("aborts %+v", got)
		}
		if n := len(f.callsOf("CommitTxn")) + len(f.callsOf("BeginTxn")); n != 1 {
			t.Fatalf("%d begins and commits, want the one begin", n)
		}
		if _, ok := f.record("c", "k"); ok {
			t.Fatal("the write of a failed transaction was applied")
		}
		if isRemote(db) {
			// Its write was kept in the client, never sent.
			if n := len(f.callsOf("TxnPut")); n != 0 {
				t.Fatalf("the write of a failed remote transaction was sent: %d puts", n)
			}
			// An attempt that sent nothing is not begun, and not aborted.
			calls := len(f.calls)
			err := db.Transact(ctx, func(tx *Tx) error {
				if err := tx.Delete(ctx, DeleteRequest{Collection: "c", Key: []byte("k")}); err != nil {
					return err
				}
				return errMine
			})
			if err != errMine || len(f.calls) != calls {
				t.Fatalf("Transact = %v after %d calls, want fn's error and none", err, len(f.calls)-calls)
			}
		}
		// The Tx of a finished call refuses to work.
		if _, err := kept.Get(ctx, GetRequest{Collection: "c", Key: []byte("k")}); err != ErrTxnEnded {
			t.Fatalf("get on a finished Tx: %v", err)
		}
		// An error of the server that is not an abort is fn's to return.
		f.fail = func(method string, n int) error {
			if method == "TxnGet" {
				return kv.Errorf(kv.CodeCollectionNotFound, "no collection c")
			}
			return nil
		}
		err = db.Transact(ctx, func(tx *Tx) error {
			_, err := tx.Get(ctx, GetRequest{Collection: "c", Key: []byte("k")})
			return err
		})
		if !errors.Is(err, ErrCollectionNotFound) || len(f.callsOf("BeginTxn")) != 2 {
			t.Fatalf("Transact = %v after %d begins", err, len(f.callsOf("BeginTxn")))
		}
	})
}

func TestTransactContext(t *testing.T) {
	forEachDB(t, func(t *testing.T, f *txnFake, db DB) {
		// Canceled inside fn: the attempt is aborted, nothing committed.
		ctx, cancel := context.WithCancel(context.Background())
		err := db.Transact(ctx, func(tx *Tx) error {
			if err := tx.Put(ctx, PutRequest{Collection: "c", Key: []byte("k"), Value: []byte("v")}); err != nil {
				return err
			}
			cancel()
			_, err := tx.Get(ctx, GetRequest{Collection: "c", Key: []byte("k")})
			return err
		})
		var ce *TxnContextError
		if !errors.As(err, &ce) || !errors.Is(err, context.Canceled) || ce.Attempts != 1 {
			t.Fatalf("Transact = %#v, want a *TxnContextError matching context.Canceled", err)
		}
		if isRemote(db) {
			// The put was kept, the get (which would have begun the
			// attempt) failed at once in the client: nothing began.
			if ce.Txn != "" || len(f.callsOf("TxnPut")) != 0 {
				t.Fatalf("Transact = %#v after %d puts, want no attempt", err, len(f.callsOf("TxnPut")))
			}
		} else if got := f.callsOf("AbortTxn"); ce.Txn != "t1" || len(got) != 1 || got[0].txn != "t1" {
			t.Fatalf("Transact = %#v, aborts %+v", err, got)
		}
		if len(f.callsOf("CommitTxn")) != 0 {
			t.Fatal("a canceled transaction was committed")
		}

		// fn returns nil after the context ended: no commit either.
		ctx, cancel = context.WithCancel(context.Background())
		err = db.Transact(ctx, func(tx *Tx) error { cancel(); return nil })
		if !errors.As(err, &ce) || !errors.Is(err, context.Canceled) || len(f.callsOf("CommitTxn")) != 0 {
			t.Fatalf("Transact = %v, %d commits", err, len(f.callsOf("CommitTxn")))
		}

		// Aborted until the deadline: retried meanwhile, then a
		// *TxnContextError matching context.DeadlineExceeded. The deadline
		// passes while the next attempt begins, so that it cannot fall in
		// the middle of a commit (whose outcome would be unknown): fn
		// reads, so that a remote attempt is begun by its get, not by its
		// commit.
		ctx, cancel = context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		begins := len(f.callsOf("BeginTxn"))
		f.fail = func(method string, n int) error {
			switch {
			case method == "CommitTxn":
				return kv.Errorf(kv.CodeTxnAborted, "lost again")
			case method == "BeginTxn" && n == begins+5:
				deadline, _ := ctx.Deadline()
				time.Sleep(time.Until(deadline) + 10*time.Millisecond)
			}
			return nil
		}
		err = db.Transact(ctx, func(tx *Tx) error {
			if _, err := tx.Get(ctx, GetRequest{Collection: "c", Key: []byte("x")}); err != nil && !errors.Is(err, ErrNotFound) {
				return err
			}
			return nil
		})
		if !errors.As(err, &ce) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Transact = %#v (ctx %v), want a *TxnContextError matching context.DeadlineExceeded", err, ctx.Err())
		}
		if n := len(f.callsOf("BeginTxn")) - begins; n != 5 || ce.Attempts < 4 || ce.Txn != fmt.Sprintf("t%d", begins+4) && ce.Txn != fmt.Sprintf("t%d", begins+5) {
			t.Fatalf("%d attempts begun, the error says %d and %q", n, ce.Attempts, ce.Txn)
		}
		if CodeOf(err) != kv.CodeUnavailable {
			t.Fatalf("code of a context error %q", CodeOf(err))
		}
		if ce.Last == nil || !strings.Contains(ce.Last.Error(), "lost again") || !strings.Contains(err.Error(), "lost again") {
			t.Fatalf("the error does not say what aborted the last attempt: %v (Last %v)", err, ce.Last)
		}

		// A context that ended before Transact: no attempt at all.
		begins = len(f.callsOf("BeginTxn"))
		err = db.Transact(ctx, func(tx *Tx) error { t.Fatal("fn ran"); return nil })
		if !errors.As(err, &ce) || ce.Attempts != 0 || len(f.callsOf("BeginTxn")) != begins {
			t.Fatalf("Transact on an ended context = %v", err)
		}
	})
}

// TestTransactCommitUnknown checks that a commit of unknown outcome comes
// back as a *CommitUnknownError and is never retried.
func TestTransactCommitUnknown(t *testing.T) {
	forEachDB(t, func(t *testing.T, f *txnFake, db DB) {
		f.fail = func(method string, n int) error {
			if method == "CommitTxn" {
				return kv.Errorf(kv.CodeCommitUnknown, "the coordinator lost its lease")
			}
			return nil
		}
		err := db.Transact(context.Background(), func(tx *Tx) error { return nil })
		var cu *CommitUnknownError
		if !errors.As(err, &cu) || !errors.Is(err, ErrCommitUnknown) || cu.Txn != "t1" || CodeOf(err) != kv.CodeCommitUnknown {
			t.Fatalf("Transact = %#v, want a *CommitUnknownError", err)
		}
		if !strings.Contains(err.Error(), "lost its lease") {
			t.Errorf("error %q lost the server's message", err)
		}
		if n := len(f.callsOf("BeginTxn")); n != 1 {
			t.Fatalf("%d attempts, want 1", n)
		}
		if n := len(f.callsOf("AbortTxn")); n != 0 {
			t.Fatalf("a commit in doubt was aborted")
		}

		// Refused, not in doubt: returned as it is.
		f.fail = func(method string, n int) error {
			if method == "CommitTxn" {
				return kv.Errorf(kv.CodeUnavailable, "no leader")
			}
			return nil
		}
		err = db.Transact(context.Background(), func(tx *Tx) error { return nil })
		if !errors.Is(err, ErrUnavailable) || errors.As(err, &cu) {
			t.Fatalf("Transact = %v, want ErrUnavailable", err)
		}
	})
}

// TestTransactCommitConnectionLost checks that a remote commit whose
// connection breaks after it was sent is a *CommitUnknownError: the server
// commits, then stops (closing every connection) before it answers.
func TestTransactCommitConnectionLost(t *testing.T) {
	for _, piped := range []bool{false, true} {
		t.Run(fmt.Sprintf("piped=%v", piped), func(t *testing.T) { testTransactCommitConnectionLost(t, piped) })
	}
}

// testTransactCommitConnectionLost: the server commits, then stops before
// its answer reaches the client (a unary CommitTxn, or a commit on the
// Pipeline stream): the outcome is unknown to the client.
func testTransactCommitConnectionLost(t *testing.T, piped bool) {
	f := newTxnFake()
	var srv *grpc.Server
	stopped := make(chan struct{})
	var stopOnce sync.Once
	stop := func(ctx context.Context) {
		stopOnce.Do(func() {
			go func() {
				srv.Stop()
				close(stopped)
			}()
		})
		<-ctx.Done() // Stop ends the call before it answers
	}
	dropCommitAnswer := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if !strings.HasSuffix(info.FullMethod, "/CommitTxn") {
			return handler(ctx, req)
		}
		resp, err := handler(ctx, req) // the commit happens, its answer is lost
		stop(ctx)
		return resp, err
	}
	dropPipedCommitAnswer := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		return h(srv, sendHook{ss, func(m any) bool {
			r, ok := m.(*pb.PipelineResponse)
			if !ok {
				return false
			}
			for _, q := range append(r.GetBatch(), r) {
				if q.GetCommitTxn() != nil {
					stop(ss.Context())
					return true
				}
			}
			return false
		}})
	}
	addr, s := serveGRPC(t, f, nil, grpc.ChainUnaryInterceptor(dropCommitAnswer), grpc.ChainStreamInterceptor(dropPipedCommitAnswer))
	srv = s
	db := dialTest(t, addr)
	if piped {
		if err := db.(*remoteDB).pipe.Open(context.Background()); err != nil {
			t.Fatal(err)
		}
	} else {
		db.(*remoteDB).txn.UsePipeline(nil)
	}
	err := db.Transact(context.Background(), func(tx *Tx) error {
		return tx.Put(context.Background(), PutRequest{Collection: "c", Key: []byte("k"), Value: []byte("v")})
	})
	<-stopped
	var cu *CommitUnknownError
	if !errors.As(err, &cu) || !errors.Is(err, ErrCommitUnknown) {
		t.Fatalf("Transact = %v, want a *CommitUnknownError", err)
	}
	if n := len(f.callsOf("BeginTxn")); n != 1 {
		t.Fatalf("%d attempts, want 1", n)
	}
	if _, ok := f.record("c", "k"); !ok {
		t.Fatal("the commit did not happen on the server")
	}
}

// sendHook is a server stream whose SendMsg first asks drop whether to
// send the message: a message it drops is not sent, and SendMsg fails.
type sendHook struct {
	grpc.ServerStream
	drop func(m any) bool
}

func (s sendHook) SendMsg(m any) error {
	if s.drop(m) {
		return errors.New("dropped by the test")
	}
	return s.ServerStream.SendMsg(m)
}

// TestTransactPipedBeginAbandoned: a transaction's first request (a get,
// or a commit), carrying the begin on the Pipeline stream, whose context
// ends while the server still serves it (the stream does not cancel it
// there, as a unary RPC's end would): when its answer comes, the client
// aborts the attempt it began (a committed one stays committed), so that
// the attempt's locks are not held until it expires. The answer coming
// after the caller returned must not touch what the caller read (-race).
func TestTransactPipedBeginAbandoned(t *testing.T) {
	for _, op := range []string{"TxnGet", "CommitTxn"} {
		t.Run(op, func(t *testing.T) { testTransactPipedBeginAbandoned(t, op) })
	}
}

func testTransactPipedBeginAbandoned(t *testing.T, op string) {
	f := &blockingFake{txnFake: newTxnFake(), op: op, entered: make(chan struct{}), release: make(chan struct{})}
	var c serverOps
	addr, _ := serveGRPC(t, f, nil, grpc.ChainUnaryInterceptor(c.unary), grpc.ChainStreamInterceptor(c.stream))
	db := dialTest(t, addr)
	if err := db.(*remoteDB).pipe.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-f.entered
		cancel()
	}()
	err := db.Transact(ctx, func(tx *Tx) error {
		if op == "CommitTxn" {
			return tx.Put(ctx, PutRequest{Collection: "c", Key: []byte("k"), Value: []byte("v")})
		}
		_, err := tx.Get(ctx, GetRequest{Collection: "c", Key: []byte("k")})
		return err
	})
	var cu *CommitUnknownError
	switch {
	case op == "TxnGet" && !errors.Is(err, context.Canceled):
		t.Fatalf("Transact = %v, want the context's end", err)
	case op == "CommitTxn" && !errors.As(err, &cu):
		t.Fatalf("Transact = %v, want a *CommitUnknownError", err)
	}
	if _, piped := c.take(); !reflect.DeepEqual(piped, []string{op}) {
		t.Fatalf("requests on the Pipeline stream %q, want the %s", piped, op)
	}
	if n := len(f.callsOf("AbortTxn")); n != 0 {
		t.Fatalf("%d aborts before the request was answered", n)
	}
	close(f.release)
	deadline := time.Now().Add(30 * time.Second) // catches a hang only
	for len(f.callsOf("AbortTxn")) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the attempt the abandoned request began was never aborted")
		}
		time.Sleep(time.Millisecond)
	}
	if got := f.callsOf("AbortTxn"); len(got) != 1 || got[0].txn != "t1" {
		t.Fatalf("aborts %+v, want one of t1", got)
	}
}

// blockingFake is a txnFake whose TxnGet or CommitTxn (op), once
// entered, waits for release.
type blockingFake struct {
	*txnFake
	op               string
	entered, release chan struct{}
}

func (f *blockingFake) TxnGet(ctx context.Context, txn string, ref kv.KeyRef) (kv.Record, bool, error) {
	f.block("TxnGet")
	return f.txnFake.TxnGet(ctx, txn, ref)
}

func (f *blockingFake) CommitTxn(ctx context.Context, txn string) (uint64, error) {
	f.block("CommitTxn")
	return f.txnFake.CommitTxn(ctx, txn)
}

func (f *blockingFake) block(op string) {
	if op == f.op {
		close(f.entered)
		<-f.release
	}
}

func TestTxOperationChecks(t *testing.T) {
	forEachDB(t, func(t *testing.T, f *txnFake, db DB) {
		ctx := context.Background()
		err := db.Transact(ctx, func(tx *Tx) error {
			if _, err := tx.Get(ctx, GetRequest{Collection: "c", Key: []byte("k"), Version: 3}); kv.CodeOf(err) != kv.CodeInvalidArgument {
				return fmt.Errorf("get at a version: %v", err)
			}
			if err := tx.Put(ctx, PutRequest{Collection: "c", Key: []byte("k"), IfVersion: Version(0)}); kv.CodeOf(err) != kv.CodeInvalidArgument {
				return fmt.Errorf("conditional put: %v", err)
			}
			if err := tx.Delete(ctx, DeleteRequest{Collection: "c", Key: []byte("k"), IfVersion: Version(1)}); kv.CodeOf(err) != kv.CodeInvalidArgument {
				return fmt.Errorf("conditional delete: %v", err)
			}
			if _, err := tx.Scan(ctx, ScanRequest{Collection: "c", Version: 2}); kv.CodeOf(err) != kv.CodeInvalidArgument {
				return fmt.Errorf("scan at a version: %v", err)
			}
			if _, err := tx.GetByTags(ctx, TagQuery{Collection: "c", All: []string{"a"}, Version: 2}); kv.CodeOf(err) != kv.CodeInvalidArgument {
				return fmt.Errorf("tag query at a version: %v", err)
			}
			if tx.ID() != "t1" {
				return fmt.Errorf("ID %q", tx.ID())
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if n := len(f.calls); n != 2 { // begin and commit
			t.Fatalf("refused operations reached the backend: %+v", f.calls)
		}
	})
}

func TestExec(t *testing.T) {
	forEachDB(t, func(t *testing.T, f *txnFake, db DB) {
		req := ExecRequest{
			If: []Compare{
				{Collection: "c", Key: []byte("a"), Version: 7},
				{Collection: "c", Key: []byte("b"), Version: 0},
				{Collection: "c", Key: []byte{0xff}, HasValue: true, Value: []byte{0x00}},
			},
			Then: []TxnOp{
				{Op: TxnOpPut, Collection: "c", Key: []byte("a"), Value: []byte("1"), Tags: []string{"t"}},
				{Op: TxnOpDelete, Collection: "c", Key: []byte("d")},
				{Op: TxnOpGet, Collection: "c", Key: []byte("e")},
			},
			Else: []TxnOp{{Op: TxnOpGet, Collection: "c", Key: []byte("a")}},
		}
		f.execRes = ExecResult{Succeeded: true, Version: 42, Results: []TxnOpResult{
			{Version: 42}, {Version: 42}, {Found: true, Value: []byte{0xfe}, Tags: []string{"x"}, Version: 40},
		}}
		res, err := db.Exec(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(res, f.execRes) {
			t.Fatalf("Exec answered\n %+v\nwant %+v", res, f.execRes)
		}
		if got := f.callsOf("ExecTxn"); len(got) != 1 || !reflect.DeepEqual(got[0].arg, req) {
			t.Fatalf("the backend got\n %#v\nwant %#v", got, req)
		}

		f.fail = func(string, int) error { return kv.Errorf(kv.CodeCommitUnknown, "in doubt") }
		if _, err := db.Exec(context.Background(), req); !errors.Is(err, ErrCommitUnknown) {
			t.Fatalf("Exec = %v, want ErrCommitUnknown", err)
		}
		f.fail = nil

		// Refused alike, embedded or remote, before the backend sees them.
		calls := len(f.callsOf("ExecTxn"))
		for _, bad := range []struct {
			req   ExecRequest
			words string
		}{
			{ExecRequest{}, "no operations"},
			{ExecRequest{If: req.If}, "no operations"},
			{ExecRequest{Then: []TxnOp{{Op: TxnOpGet, Collection: "c", Key: []byte("a"), Value: []byte("v")}}}, "takes no value"},
			{ExecRequest{Then: []TxnOp{{Op: "upsert", Collection: "c", Key: []byte("a")}}}, "upsert"},
			{ExecRequest{If: []Compare{{Collection: "c"}}, Then: req.Then}, "key"},
		} {
			if _, err := db.Exec(context.Background(), bad.req); CodeOf(err) != kv.CodeInvalidArgument || !strings.Contains(err.Error(), bad.words) {
				t.Errorf("Exec(%+v) = %v, want invalid_argument saying %q", bad.req, err, bad.words)
			}
		}
		if n := len(f.callsOf("ExecTxn")); n != calls {
			t.Fatalf("%d refused requests reached the backend", n-calls)
		}
	})
}

// noTxnBackend is a kv.Backend that is not a kv.TxnBackend.
type noTxnBackend struct{ kv.Backend }

func TestTransactUnimplemented(t *testing.T) {
	for _, k := range dbKinds {
		t.Run(k.name, func(t *testing.T) {
			db := k.open(t, noTxnBackend{})
			ran := false
			err := db.Transact(context.Background(), func(tx *Tx) error { ran = true; return nil })
			if CodeOf(err) != kv.CodeUnimplemented {
				t.Fatalf("Transact = %v, want unimplemented", err)
			}
			// A remote attempt is begun by its first request, after fn.
			if ran != isRemote(db) {
				t.Fatalf("fn ran: %v", ran)
			}
			if _, err := db.Exec(context.Background(), ExecRequest{Then: []TxnOp{{Op: TxnOpGet, Collection: "c", Key: []byte("k")}}}); CodeOf(err) != kv.CodeUnimplemented {
				t.Fatalf("Exec = %v, want unimplemented", err)
			}
		})
	}
}

// TestTransactRemoteReusesConnections checks that the transactions of a
// remote DB share its one gRPC connection.
func TestTransactRemoteReusesConnections(t *testing.T) {
	f := newTxnFake()
	var conns atomic.Int64
	addr, _ := serveGRPC(t, f, &conns)
	db := dialTest(t, addr)
	ctx := context.Background()
	for i := 0; i < 20; i++ {
		err := db.Transact(ctx, func(tx *Tx) error {
			if _, err := tx.Get(ctx, GetRequest{Collection: "c", Key: []byte("k")}); err != nil && !errors.Is(err, ErrNotFound) {
				return err
			}
			return tx.Put(ctx, PutRequest{Collection: "c", Key: []byte("k"), Value: []byte(fmt.Sprint(i))})
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("20 transactions opened %d connections, want 1", n)
	}
	if calls := len(f.calls); calls != 80 {
		t.Fatalf("%d calls, want 80", calls)
	}
}

func TestTransactPanic(t *testing.T) {
	forEachDB(t, func(t *testing.T, f *txnFake, db DB) {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v, want the panic of fn", r)
			}
			if got := f.callsOf("AbortTxn"); len(got) != 1 || got[0].txn != "t1" {
				t.Fatalf("aborts %+v", got)
			}
		}()
		_ = db.Transact(context.Background(), func(tx *Tx) error {
			_, _ = tx.Get(context.Background(), GetRequest{Collection: "c", Key: []byte("k")}) // begins a remote attempt
			panic("boom")
		})
	})
}

// TestTransactRemoteRoundTrips counts the requests of remote transactions:
// the first request begins the attempt and the writes go with the commit.
// The gets and commits go as messages of the Pipeline stream, or as unary
// RPCs with a client that sends them so (the same requests either way).
func TestTransactRemoteRoundTrips(t *testing.T) {
	for _, piped := range []bool{true, false} {
		t.Run(fmt.Sprintf("piped=%v", piped), func(t *testing.T) { testTransactRemoteRoundTrips(t, piped) })
	}
}

func testTransactRemoteRoundTrips(t *testing.T, piped bool) {
	f := newTxnFake()
	var c serverOps
	addr, _ := serveGRPC(t, f, nil, grpc.ChainUnaryInterceptor(c.unary), grpc.ChainStreamInterceptor(c.stream))
	db := dialTest(t, addr)
	ctx := context.Background()
	if piped {
		if err := db.(*remoteDB).pipe.Open(ctx); err != nil {
			t.Fatal(err)
		}
	} else {
		db.(*remoteDB).txn.UsePipeline(nil)
	}
	keys := []string{"a", "b", "c"}
	rmw := func(tx *Tx) error {
		for _, k := range keys {
			if _, err := tx.Get(ctx, GetRequest{Collection: "c", Key: []byte(k)}); err != nil && !errors.Is(err, ErrNotFound) {
				return err
			}
		}
		for _, k := range keys {
			if err := tx.Put(ctx, PutRequest{Collection: "c", Key: []byte(k), Value: []byte("v")}); err != nil {
				return err
			}
			if _, err := tx.Get(ctx, GetRequest{Collection: "c", Key: []byte(k)}); err != nil { // its own write
				return err
			}
		}
		return nil
	}
	for _, tc := range []struct {
		name string
		fn   func(tx *Tx) error
		want []string
	}{
		{"read-modify-write of 3 keys", rmw, []string{"TxnGet", "TxnGet", "TxnGet", "CommitTxn"}},
		{"writes only", func(tx *Tx) error {
			return tx.Delete(ctx, DeleteRequest{Collection: "c", Key: []byte("a")})
		}, []string{"CommitTxn"}},
		{"nothing", func(tx *Tx) error { return nil }, []string{"CommitTxn"}},
		{"put then scan", func(tx *Tx) error {
			if err := tx.Put(ctx, PutRequest{Collection: "c", Key: []byte("s"), Value: []byte("v")}); err != nil {
				return err
			}
			_, err := tx.Scan(ctx, ScanRequest{Collection: "c"})
			return err
		}, []string{"TxnWrite", "TxnScan", "CommitTxn"}},
	} {
		if err := db.Transact(ctx, tc.fn); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got, gotPiped := c.take()
		if !reflect.DeepEqual(got, tc.want) {
			t.Fatalf("%s: requests %q, want %q", tc.name, got, tc.want)
		}
		var wantPiped []string
		for _, m := range tc.want {
			if piped && (m == "TxnGet" || m == "CommitTxn") {
				wantPiped = append(wantPiped, m)
			}
		}
		if !reflect.DeepEqual(gotPiped, wantPiped) {
			t.Fatalf("%s: requests on the Pipeline stream %q, want %q", tc.name, gotPiped, wantPiped)
		}
	}
	// The backend saw the calls of the long form.
	if got := len(f.callsOf("BeginTxn")); got != 4 {
		t.Fatalf("%d begins, want 4", got)
	}
	if rec, ok := f.record("c", "s"); !ok || string(rec.Value) != "v" {
		t.Fatalf("s = %+v, %v", rec, ok)
	}
}

// serverOps records the requests a gRPC server receives, in order, by the
// name of the unary RPC that serves them: the unary RPCs, and the messages
// of Pipeline streams (api.PipelineMethod), which it also records apart.
type serverOps struct {
	mu         sync.Mutex
	ops, piped []string
}

func (c *serverOps) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	c.add(info.FullMethod[strings.LastIndexByte(info.FullMethod, '/')+1:], false)
	return h(ctx, req)
}

func (c *serverOps) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	return h(srv, opsStream{ss, c})
}

func (c *serverOps) add(method string, piped bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ops = append(c.ops, method)
	if piped {
		c.piped = append(c.piped, method)
	}
}

// take answers the requests recorded, and those of them that came on a
// Pipeline stream, and starts again.
func (c *serverOps) take() (ops, piped []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ops, piped = c.ops, c.piped
	c.ops, c.piped = nil, nil
	return ops, piped
}

type opsStream struct {
	grpc.ServerStream
	c *serverOps
}

func (s opsStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if r, ok := m.(*pb.PipelineRequest); ok && err == nil {
		for _, q := range append(r.GetBatch(), r) {
			if name := api.PipelineMethod(q); name != "" {
				s.c.add(name, true)
			}
		}
	}
	return err
}

// TestTransactCommitRefused checks that a remote commit that could not be
// sent (no server) is unavailable, not in doubt.
func TestTransactCommitRefused(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	db := dialTest(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = db.Transact(ctx, func(tx *Tx) error {
		return tx.Put(ctx, PutRequest{Collection: "c", Key: []byte("k"), Value: []byte("v")})
	})
	var cu *CommitUnknownError
	if !errors.Is(err, ErrUnavailable) || errors.As(err, &cu) {
		t.Fatalf("Transact = %v, want ErrUnavailable", err)
	}
}
