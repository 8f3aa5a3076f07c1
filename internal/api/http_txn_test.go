package api

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/groupkv/groupkv/internal/kv"
)

// txnFake is a kv.Backend and kv.TxnBackend for testing the transaction
// forms: the plain methods are httpFakeBackend's; the transactional ones
// record what they were called with and answer what the test set up.
type txnFake struct {
	*httpFakeBackend

	mu    sync.Mutex
	calls []txnCall // in order

	// Answers. errs, by method name ("TxnGet", "CommitTxn", ...), is
	// answered instead when set.
	nextID   int
	rec      kv.Record
	found    bool
	page     kv.ScanResult
	commitV  uint64
	execRes  kv.ExecResult
	errs     map[string]error
	beginIDs []string // ids BeginTxn answers in turn; "t<n>" after them
}

// txnCall is one call of a kv.TxnBackend method: its name, the attempt it
// named ("" for BeginTxn and ExecTxn) and its argument.
type txnCall struct {
	method string
	txn    string
	arg    any
}

var _ kv.TxnBackend = (*txnFake)(nil)

func newTxnFake() *txnFake {
	return &txnFake{httpFakeBackend: newHTTPFakeBackend(), errs: map[string]error{}}
}

func (f *txnFake) record(method, txn string, arg any) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, txnCall{method: method, txn: txn, arg: arg})
	return f.errs[method]
}

// lastCall returns the last call, failing unless there is one.
func (f *txnFake) lastCall(t *testing.T) txnCall {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.calls) == 0 {
		t.Fatal("the backend was not called")
	}
	return f.calls[len(f.calls)-1]
}

func (f *txnFake) numCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

func (f *txnFake) BeginTxn(_ context.Context, opts kv.TxnOptions) (string, error) {
	if err := f.record("BeginTxn", "", opts); err != nil {
		return "", err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextID++
	if f.nextID <= len(f.beginIDs) {
		return f.beginIDs[f.nextID-1], nil
	}
	return fmt.Sprintf("t%d", f.nextID), nil
}

func (f *txnFake) TxnGet(_ context.Context, txn string, ref kv.KeyRef) (kv.Record, bool, error) {
	if err := f.record("TxnGet", txn, ref); err != nil {
		return kv.Record{}, false, err
	}
	return f.rec, f.found, nil
}

func (f *txnFake) TxnGetForUpdate(_ context.Context, txn string, ref kv.KeyRef) (kv.Record, bool, error) {
	if err := f.record("TxnGetForUpdate", txn, ref); err != nil {
		return kv.Record{}, false, err
	}
	return f.rec, f.found, nil
}

func (f *txnFake) TxnBatchGet(_ context.Context, txn string, refs []kv.KeyRef, forUpdate bool) ([]kv.BatchGetItem, error) {
	if err := f.record("TxnBatchGet", txn, refs); err != nil {
		return nil, err
	}
	items := make([]kv.BatchGetItem, len(refs))
	for i, ref := range refs {
		items[i] = kv.BatchGetItem{Collection: ref.Collection, Key: ref.Key, Found: f.found}
		if f.found {
			items[i].Value, items[i].Tags, items[i].Version = f.rec.Value, f.rec.Tags, f.rec.Version
		}
	}
	return items, nil
}

func (f *txnFake) TxnPut(_ context.Context, txn string, item kv.PutItem) error {
	return f.record("TxnPut", txn, item)
}

func (f *txnFake) TxnDelete(_ context.Context, txn string, ref kv.KeyRef) error {
	return f.record("TxnDelete", txn, ref)
}

func (f *txnFake) TxnScan(_ context.Context, txn string, req kv.ScanRequest) (kv.ScanResult, error) {
	if err := f.record("TxnScan", txn, req); err != nil {
		return kv.ScanResult{}, err
	}
	return f.page, nil
}

func (f *txnFake) TxnGetByTags(_ context.Context, txn string, q kv.TagQuery) (kv.ScanResult, error) {
	if err := f.record("TxnGetByTags", txn, q); err != nil {
		return kv.ScanResult{}, err
	}
	return f.page, nil
}

func (f *txnFake) CommitTxn(_ context.Context, txn string) (uint64, error) {
	if err := f.record("CommitTxn", txn, nil); err != nil {
		return 0, err
	}
	return f.commitV, nil
}

func (f *txnFake) AbortTxn(_ context.Context, txn string) error {
	return f.record("AbortTxn", txn, nil)
}

func (f *txnFake) ExecTxn(_ context.Context, req kv.ExecRequest) (kv.ExecResult, error) {
	if err := f.record("ExecTxn", "", req); err != nil {
		return kv.ExecResult{}, err
	}
	return f.execRes, nil
}

// newTxnTester serves the HTTP handler over a txnFake.
func newTxnTester(t *testing.T) (*httpTester, *txnFake) {
	t.Helper()
	tf := newTxnFake()
	srv := httptest.NewServer(NewHTTPHandler(tf, HTTPConfig{Metrics: NewMetrics(nil)}))
	t.Cleanup(srv.Close)
	return &httpTester{t: t, fb: tf.httpFakeBackend, srv: srv}, tf
}

// wantCall fails unless the last call of the backend is method on txn with
// arg.
func wantCall(t *testing.T, tf *txnFake, method, txn string, arg any) {
	t.Helper()
	got := tf.lastCall(t)
	want := txnCall{method: method, txn: txn, arg: arg}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("backend call\n got %#v\nwant %#v", got, want)
	}
}

func TestHTTPTxnBegin(t *testing.T) {
	ht, tf := newTxnTester(t)
	for _, tc := range []struct {
		body string
		want kv.TxnOptions
	}{
		{``, kv.TxnOptions{Isolation: kv.IsolationSerializable}},
		{`{}`, kv.TxnOptions{Isolation: kv.IsolationSerializable}},
		{`{"isolation": "serializable"}`, kv.TxnOptions{Isolation: kv.IsolationSerializable}},
		{`{"isolation": "snapshot"}`, kv.TxnOptions{Isolation: kv.IsolationSnapshot}},
		{`{"isolation": "serializable", "retry_of": "t9"}`, kv.TxnOptions{Isolation: kv.IsolationSerializable, RetryOf: "t9"}},
		{`{"read_only": true}`, kv.TxnOptions{Isolation: kv.IsolationSerializable, ReadOnly: true}},
		{`{"isolation": "snapshot", "retry_of": "a-b_c", "read_only": true}`, kv.TxnOptions{Isolation: kv.IsolationSnapshot, RetryOf: "a-b_c", ReadOnly: true}},
	} {
		n := tf.numCalls()
		resp, body := ht.post("/v1/txn", tc.body)
		wantBody(t, resp, body, http.StatusOK, fmt.Sprintf(`{"txn":"t%d"}`, n+1))
		wantCall(t, tf, "BeginTxn", "", tc.want)
	}

	n := tf.numCalls()
	for _, tc := range []struct{ body, words string }{
		{`{"isolation": "linearizable"}`, "isolation"},
		{`{"isolation": "Snapshot"}`, "isolation"},
		{`{"priority": 3}`, "unknown field"},
		{`{"read_only": "yes"}`, "read_only"},
		{`[]`, "object"},
		{`{} {}`, "more than one"},
	} {
		resp, body := ht.post("/v1/txn", tc.body)
		wantError(t, resp, body, http.StatusBadRequest, kv.CodeInvalidArgument, tc.words)
	}
	resp, body := ht.do("GET", "/v1/txn", nil)
	wantError(t, resp, body, http.StatusMethodNotAllowed, kv.CodeInvalidArgument)
	if got := resp.Header.Get("Allow"); got != "POST" {
		t.Errorf("Allow %q, want POST", got)
	}
	resp, body = ht.post("/v1/txn?isolation=snapshot", "")
	wantError(t, resp, body, http.StatusBadRequest, kv.CodeInvalidArgument, "unknown query parameter")
	if tf.numCalls() != n {
		t.Fatalf("bad requests reached the backend: %d calls", tf.numCalls()-n)
	}

	tf.errs["BeginTxn"] = kv.Errorf(kv.CodeUnavailable, "no leader")
	resp, body = ht.post("/v1/txn", "")
	wantError(t, resp, body, http.StatusServiceUnavailable, kv.CodeUnavailable, "no leader")
}

func TestHTTPTxnGet(t *testing.T) {
	ht, tf := newTxnTester(t)
	tf.rec, tf.found = kv.Record{Key: []byte("k"), Value: []byte("v1"), Tags: []string{"a", "b"}, Version: 7}, true
	resp, body := ht.post("/v1/txn/t-1_x/get", `{"collection": "c", "key": "k"}`)
	wantBody(t, resp, body, http.StatusOK, `{"found":true,"value":"v1","version":7,"tags":["a","b"]}`)
	wantCall(t, tf, "TxnGet", "t-1_x", kv.KeyRef{Collection: "c", Key: []byte("k")})

	// A value that is not UTF-8 comes in base64, as the plain GET's JSON
	// forms do; no tags are [].
	tf.rec = kv.Record{Key: []byte("k"), Value: []byte{0xff, 0x00}, Version: 9}
	resp, body = ht.post("/v1/txn/t1/get", `{"collection": "c", "key_base64": "/w=="}`)
	wantBody(t, resp, body, http.StatusOK, `{"found":true,"value_base64":"/wA=","version":9,"tags":[]}`)
	wantCall(t, tf, "TxnGet", "t1", kv.KeyRef{Collection: "c", Key: []byte{0xff}})

	tf.rec = kv.Record{Key: []byte("k"), Value: []byte{}, Version: 3}
	resp, body = ht.post("/v1/txn/t1/get", `{"collection": "c", "key": "k"}`)
	wantBody(t, resp, body, http.StatusOK, `{"found":true,"value":"","version":3,"tags":[]}`)

	tf.rec, tf.found = kv.Record{}, false
	resp, body = ht.post("/v1/txn/t1/get", `{"collection": "c", "key": "nope"}`)
	wantBody(t, resp, body, http.StatusOK, `{"found":false}`)

	// for_update reads through TxnGetForUpdate; false is a plain read.
	tf.rec, tf.found = kv.Record{Key: []byte("k"), Value: []byte("v2"), Version: 8}, true
	resp, body = ht.post("/v1/txn/t1/get", `{"collection": "c", "key": "k", "for_update": true}`)
	wantBody(t, resp, body, http.StatusOK, `{"found":true,"value":"v2","version":8,"tags":[]}`)
	wantCall(t, tf, "TxnGetForUpdate", "t1", kv.KeyRef{Collection: "c", Key: []byte("k")})
	resp, body = ht.post("/v1/txn/t1/get", `{"collection": "c", "key": "k", "for_update": false}`)
	wantBody(t, resp, body, http.StatusOK, `{"found":true,"value":"v2","version":8,"tags":[]}`)
	wantCall(t, tf, "TxnGet", "t1", kv.KeyRef{Collection: "c", Key: []byte("k")})

	tf.errs["TxnGet"] = kv.Errorf(kv.CodeTxnAborted, "wounded by an older transaction")
	resp, body = ht.post("/v1/txn/t1/get", `{"collection": "c", "key": "k"}`)
	wantError(t, resp, body, http.StatusConflict, kv.CodeTxnAborted, "wounded")
}

func TestHTTPTxnBatchGet(t *testing.T) {
	ht, tf := newTxnTester(t)
	tf.rec, tf.found = kv.Record{Value: []byte("v1"), Tags: []string{"a"}, Version: 7}, true
	resp, body := ht.post("/v1/txn/t1/batch_get", `{"keys": [{"collection": "c", "key": "k"}, {"collection": "d", "key_base64": "/w=="}]}`)
	wantBody(t, resp, body, http.StatusOK,
		`{"items":[{"collection":"c","key":"k","found":true,"value":"v1","version":7,"tags":["a"]},`+
			`{"collection":"d","key_base64":"/w==","found":true,"value":"v1","version":7,"tags":["a"]}]}`)
	wantCall(t, tf, "TxnBatchGet", "t1", []kv.KeyRef{{Collection: "c", Key: []byte("k")}, {Collection: "d", Key: []byte{0xff}}})

	tf.found = false
	resp, body = ht.post("/v1/txn/t1/batch_get", `{"keys": [{"collection": "c", "key": "nope"}], "for_update": true}`)
	wantBody(t, resp, body, http.StatusOK, `{"items":[{"collection":"c","key":"nope","found":false,"version":0,"tags":[]}]}`)

	n := tf.numCalls()
	for _, tc := range []struct{ body, words string }{
		{`{}`, "no keys"},
		{`{"keys": []}`, "no keys"},
		{`{"keys": [{"collection": "c"}]}`, "keys[0]"},
		{`{"keys": [{"collection": "c", "key": "a"}, {"collection": "Bad", "key": "k"}]}`, "keys[1]"},
		{`{"keys": [{"collection": "c", "key": "a", "value": "v"}]}`, "unknown field"},
		{`{"keys": [{"collection": "c", "key": "a"}], "for_update": "yes"}`, "for_update"},
		{`{"collection": "c", "key": "a"}`, "unknown field"},
	} {
		resp, body := ht.post("/v1/txn/t1/batch_get", tc.body)
		wantError(t, resp, body, http.StatusBadRequest, kv.CodeInvalidArgument, tc.words)
	}
	if tf.numCalls() != n {
		t.Fatalf("bad requests reached the backend: %d calls", tf.numCalls()-n)
	}
	tf.errs["TxnBatchGet"] = kv.Errorf(kv.CodeTxnAborted, "wounded by an older transaction")
	resp, body = ht.post("/v1/txn/t1/batch_get", `{"keys": [{"collection": "c", "key": "k"}]}`)
	wantError(t, resp, body, http.StatusConflict, kv.CodeTxnAborted, "wounded")
}

func TestHTTPTxnPut(t *testing.T) {
	ht, tf := newTxnTester(t)
	resp, body := ht.post("/v1/txn/t1/put", `{"collection": "c", "key": "k", "value": "hello", "tags": ["t", "u"]}`)
	wantBody(t, resp, body, http.StatusOK, `{}`)
	wantCall(t, tf, "TxnPut", "t1", kv.PutItem{Collection: "c", Key: []byte("k"), Value: []byte("hello"), Tags: []string{"t", "u"}})

	resp, body = ht.post("/v1/txn/t2/put", `{"collection": "c", "key": "k", "value_base64": "AP8="}`)
	wantBody(t, resp, body, http.StatusOK, `{}`)
	wantCall(t, tf, "TxnPut", "t2", kv.PutItem{Collection: "c", Key: []byte("k"), Value: []byte{0x00, 0xff}})

	resp, body = ht.post("/v1/txn/t2/put", `{"collection": "c", "key": "k", "value": ""}`)
	wantBody(t, resp, body, http.StatusOK, `{}`)
	wantCall(t, tf, "TxnPut", "t2", kv.PutItem{Collection: "c", Key: []byte("k"), Value: []byte{}})

	tf.errs["TxnPut"] = kv.Errorf(kv.CodeTxnAborted, "aborted")
	resp, body = ht.post("/v1/txn/t2/put", `{"collection": "c", "key": "k", "value": "x"}`)
	wantError(t, resp, body, http.StatusConflict, kv.CodeTxnAborted)
}

func TestHTTPTxnDelete(t *testing.T) {
	ht, tf := newTxnTester(t)
	resp, body := ht.post("/v1/txn/t1/delete", `{"collection": "c", "key": "k"}`)
	wantBody(t, resp, body, http.StatusOK, `{}`)
	wantCall(t, tf, "TxnDelete", "t1", kv.KeyRef{Collection: "c", Key: []byte("k")})

	tf.errs["TxnDelete"] = kv.Errorf(kv.CodeTxnAborted, "aborted")
	resp, body = ht.post("/v1/txn/t1/delete", `{"collection": "c", "key": "k"}`)
	wantError(t, resp, body, http.StatusConflict, kv.CodeTxnAborted)
}

// TestHTTPTxnBadBodies checks that the session forms refuse bad bodies with
// 400 invalid_argument before they reach the backend.
func TestHTTPTxnBadBodies(t *testing.T) {
	ht, tf := newTxnTester(t)
	for _, tc := range []struct{ path, body, words string }{
		{"get", ``, "empty"},
		{"get", `{"collection": "c"}`, "no key"},
		{"get", `{"key": "k"}`, "collection name"},
		{"get", `{"collection": "c", "key": ""}`, "key is empty"},
		{"get", `{"collection": "c", "key": "k", "version": 3}`, "unknown field"},
		{"get", `{"collection": "c", "key": "k", "key_base64": "aw=="}`, "not both"},
		{"get", `{"collection": "c", "key_base64": "!!"}`, "base64"},
		{"get", `{"collection": "c", "key": "k", "for_update": "yes"}`, "for_update"},
		{"delete", `{"collection": "c"}`, "no key"},
		{"delete", `{"collection": "Bad", "key": "k"}`, "collection name"},
		{"put", `{"collection": "c", "key": "k"}`, "no value"},
		{"put", `{"key": "k", "value": "v"}`, "collection name"},
		{"put", `{"collection": "c", "value": "v"}`, "no key"},
		{"put", `{"collection": "c", "key": "k", "value": "v", "value_base64": "dg=="}`, "not both"},
		{"put", `{"collection": "c", "key": "k", "value_base64": "not base64!"}`, "value_base64"},
		{"put", `{"collection": "c", "key": "k", "value": "v", "if_version": 3}`, "unknown field"},
		{"put", `{"collection": "c", "key": "k", "value": "v", "tags": ["a,b"]}`, "tag"},
		{"put", `{"collection": "c", "key": "k", "value": "v", "tags": "a"}`, "tags"},
		{"scan", `{}`, "collection name"},
		{"scan", `{"collection": "c", "version": 5}`, "unknown field"},
		{"scan", `{"collection": "c", "start": "b", "end": "a"}`, "not below"},
		{"scan", `{"collection": "c", "limit": 5000}`, "limit"},
		{"scan", `{"collection": "c", "start": "a", "start_base64": "YQ=="}`, "not both"},
		{"tags", `{"collection": "c"}`, "exactly one"},
		{"tags", `{"collection": "c", "all": ["a"], "any": ["b"]}`, "exactly one"},
		{"tags", `{"collection": "c", "all": [""]}`, "all"},
		{"tags", `{"collection": "c", "any": ["a"], "limit": -1}`, "limit"},
		{"commit", `{"version": 3}`, "unknown field"},
	} {
		resp, body := ht.post("/v1/txn/t1/"+tc.path, tc.body)
		wantError(t, resp, body, http.StatusBadRequest, kv.CodeInvalidArgument, tc.words)
	}
	if n := tf.numCalls(); n != 0 {
		t.Fatalf("bad requests reached the backend: %+v", tf.calls)
	}
}

func TestHTTPTxnScanAndTags(t *testing.T) {
	ht, tf := newTxnTester(t)
	tf.page = kv.ScanResult{
		Items:    []kv.Record{{Key: []byte("a"), Value: []byte("1"), Tags: []string{"x"}, Version: 4}, {Key: []byte{0xfe}, Value: []byte{0xff}, Version: 5}},
		NextPage: "p2",
		Version:  6,
	}
	const page = `{"items":[{"key":"a","value":"1","version":4,"tags":["x"]},{"key_base64":"/g==","value_base64":"/w==","version":5,"tags":[]}],"next_page":"p2","version":6}`

	resp, body := ht.post("/v1/txn/t1/scan", `{"collection": "c", "start": "a", "end_base64": "/w==", "limit": 10, "reverse": true, "page": "p1"}`)
	wantBody(t, resp, body, http.StatusOK, page)
	wantCall(t, tf, "TxnScan", "t1", kv.ScanRequest{Collection: "c", Start: []byte("a"), End: []byte{0xff}, Limit: 10, Reverse: true, Page: "p1"})

	resp, body = ht.post("/v1/txn/t1/scan", `{"collection": "c"}`)
	wantBody(t, resp, body, http.StatusOK, page)
	wantCall(t, tf, "TxnScan", "t1", kv.ScanRequest{Collection: "c"})

	resp, body = ht.post("/v1/txn/t2/tags", `{"collection": "c", "all": ["x", "y"], "limit": 2, "page": "p1"}`)
	wantBody(t, resp, body, http.StatusOK, page)
	wantCall(t, tf, "TxnGetByTags", "t2", kv.TagQuery{Collection: "c", All: []string{"x", "y"}, Limit: 2, Page: "p1"})

	resp, body = ht.post("/v1/txn/t2/tags", `{"collection": "c", "any": ["x"]}`)
	wantBody(t, resp, body, http.StatusOK, page)
	wantCall(t, tf, "TxnGetByTags", "t2", kv.TagQuery{Collection: "c", Any: []string{"x"}})

	tf.errs["TxnScan"] = kv.Errorf(kv.CodeTxnAborted, "aborted")
	resp, body = ht.post("/v1/txn/t1/scan", `{"collection": "c"}`)
	wantError(t, resp, body, http.StatusConflict, kv.CodeTxnAborted)
}

func TestHTTPTxnCommitAbort(t *testing.T) {
	ht, tf := newTxnTester(t)
	tf.commitV = 42
	resp, body := ht.post("/v1/txn/t1/commit", "")
	wantBody(t, resp, body, http.StatusOK, `{"committed":true,"version":42}`)
	wantCall(t, tf, "CommitTxn", "t1", nil)
	resp, body = ht.post("/v1/txn/t2/commit", "{}")
	wantBody(t, resp, body, http.StatusOK, `{"committed":true,"version":42}`)
	wantCall(t, tf, "CommitTxn", "t2", nil)

	tf.errs["CommitTxn"] = kv.Errorf(kv.CodeTxnAborted, "a conflicting transaction committed first")
	resp, body = ht.post("/v1/txn/t1/commit", "")
	wantError(t, resp, body, http.StatusConflict, kv.CodeTxnAborted, "conflicting")

	tf.errs["CommitTxn"] = kv.Errorf(kv.CodeCommitUnknown, "the coordinator lost its lease")
	resp, body = ht.post("/v1/txn/t1/commit", "")
	wantError(t, resp, body, http.StatusServiceUnavailable, kv.CodeCommitUnknown, "lease")

	for _, id := range []string{"t1", "t1", "never-begun"} {
		resp, body = ht.post("/v1/txn/"+id+"/abort", "")
		wantBody(t, resp, body, http.StatusOK, `{}`)
		wantCall(t, tf, "AbortTxn", id, nil)
	}
	// An abort takes no fields, and aborts whatever its body holds.
	for _, b := range []string{"{}", `{"x": 1}`, "garbage", "[1]"} {
		resp, body = ht.post("/v1/txn/t3/abort", b)
		wantBody(t, resp, body, http.StatusOK, `{}`)
		wantCall(t, tf, "AbortTxn", "t3", nil)
	}
}

// execBody is the one-shot transaction of the API's documentation.
const execBody = `{"if": [{"collection": "c", "key": "a", "version": 7}, {"collection": "c", "key": "b", "version": 0}, {"collection": "c", "key": "d", "value": "x"}],
  "then": [{"op": "put", "collection": "c", "key": "a", "value": "1", "tags": ["t"]}, {"op": "delete", "collection": "c", "key": "d"}, {"op": "get", "collection": "c", "key": "e"}],
  "else": [{"op": "get", "collection": "c", "key": "a"}]}`

func TestHTTPTxnExec(t *testing.T) {
	ht, tf := newTxnTester(t)
	wantReq := kv.ExecRequest{
		If: []kv.Compare{
			{Collection: "c", Key: []byte("a"), Version: 7},
			{Collection: "c", Key: []byte("b"), Version: 0},
			{Collection: "c", Key: []byte("d"), HasValue: true, Value: []byte("x")},
		},
		Then: []kv.TxnOp{
			{Op: kv.TxnOpPut, Collection: "c", Key: []byte("a"), Value: []byte("1"), Tags: []string{"t"}},
			{Op: kv.TxnOpDelete, Collection: "c", Key: []byte("d")},
			{Op: kv.TxnOpGet, Collection: "c", Key: []byte("e")},
		},
		Else: []kv.TxnOp{{Op: kv.TxnOpGet, Collection: "c", Key: []byte("a")}},
	}

	tf.execRes = kv.ExecResult{Succeeded: true, Version: 42, Results: []kv.TxnOpResult{
		{Version: 42}, {Version: 42}, {Found: true, Value: []byte("..."), Version: 40},
	}}
	resp, body := ht.post("/v1/txn/exec", execBody)
	wantBody(t, resp, body, http.StatusOK, `{"succeeded":true,"version":42,"results":[{"version":42},{"version":42},{"found":true,"value":"...","version":40}]}`)
	wantCall(t, tf, "ExecTxn", "", wantReq)

	// The else branch ran: its results, in its order; an absent key.
	tf.execRes = kv.ExecResult{Succeeded: false, Version: 41, Results: []kv.TxnOpResult{{Found: false}}}
	resp, body = ht.post("/v1/txn/exec", execBody)
	wantBody(t, resp, body, http.StatusOK, `{"succeeded":false,"version":41,"results":[{"found":false}]}`)

	// Base64 both ways, tags of a record read, a branch left out.
	tf.execRes = kv.ExecResult{Succeeded: true, Version: 50, Results: []kv.TxnOpResult{
		{Found: true, Value: []byte{0xff}, Tags: []string{"p", "q"}, Version: 49}, {Version: 50},
	}}
	resp, body = ht.post("/v1/txn/exec", `{"if": [{"collection": "c", "key_base64": "/w==", "value_base64": "AA=="}],
		"then": [{"op": "get", "collection": "c", "key": "g"}, {"op": "put", "collection": "c", "key": "p", "value_base64": "/wA="}]}`)
	wantBody(t, resp, body, http.StatusOK, `{"succeeded":true,"version":50,"results":[{"found":true,"value_base64":"/w==","version":49,"tags":["p","q"]},{"version":50}]}`)
	wantCall(t, tf, "ExecTxn", "", kv.ExecRequest{
		If:   []kv.Compare{{Collection: "c", Key: []byte{0xff}, HasValue: true, Value: []byte{0}}},
		Then: []kv.TxnOp{{Op: kv.TxnOpGet, Collection: "c", Key: []byte("g")}, {Op: kv.TxnOpPut, Collection: "c", Key: []byte("p"), Value: []byte{0xff, 0}}},
	})

	// No conditions: then runs unconditionally.
	tf.execRes = kv.ExecResult{Succeeded: true, Version: 51, Results: []kv.TxnOpResult{{Version: 51}}}
	resp, body = ht.post("/v1/txn/exec", `{"then": [{"op": "delete", "collection": "c", "key": "z"}]}`)
	wantBody(t, resp, body, http.StatusOK, `{"succeeded":true,"version":51,"results":[{"version":51}]}`)
	wantCall(t, tf, "ExecTxn", "", kv.ExecRequest{If: []kv.Compare{}, Then: []kv.TxnOp{{Op: kv.TxnOpDelete, Collection: "c", Key: []byte("z")}}})

	n := tf.numCalls()
	for _, tc := range []struct{ body, words string }{
		{``, "empty"},
		{`{}`, "no operations"},
		{`{"if": [{"collection": "c", "key": "a", "version": 1}]}`, "no operations"},
		{`{"if": [{"collection": "c", "key": "a"}], "then": [{"op": "get", "collection": "c", "key": "a"}]}`, "if[0]: no condition"},
		{`{"if": [{"collection": "c", "key": "a", "version": 1, "value": "v"}], "then": [{"op": "get", "collection": "c", "key": "a"}]}`, "if[0]: give version or value"},
		{`{"if": [{"collection": "c", "key": "a", "value": "v", "value_base64": "dg=="}], "then": [{"op": "get", "collection": "c", "key": "a"}]}`, "not both"},
		{`{"if": [{"collection": "c", "key": "a", "value_base64": "?"}], "then": [{"op": "get", "collection": "c", "key": "a"}]}`, "base64"},
		{`{"if": [{"collection": "c", "version": 1}], "then": [{"op": "get", "collection": "c", "key": "a"}]}`, "no key"},
		{`{"if": [{"collection": "c", "key": "a", "version": -1}], "then": [{"op": "get", "collection": "c", "key": "a"}]}`, "version"},
		{`{"if": [{"collection": "c", "key": "a", "version": 1, "op": "eq"}], "then": [{"op": "get", "collection": "c", "key": "a"}]}`, "if[0] has unknown field"},
		{`{"then": [{"op": "increment", "collection": "c", "key": "a"}]}`, "then[0]: op \"increment\""},
		{`{"then": [{"collection": "c", "key": "a"}]}`, "no op"},
		{`{"then": [{"op": "get", "collection": "c", "key": "a"}], "else": [{"op": "put", "collection": "c", "key": "a"}]}`, "else[0]: no value"},
		{`{"then": [{"op": "get", "collection": "c", "key": "a", "value": "v"}]}`, "no value and no tags"},
		{`{"then": [{"op": "delete", "collection": "c", "key": "a", "tags": ["t"]}]}`, "no value and no tags"},
		{`{"then": [{"op": "put", "collection": "c", "key": "a", "value": "v", "value_base64": "dg=="}]}`, "not both"},
		{`{"then": [{"op": "put", "collection": "C", "key": "a", "value": "v"}]}`, "collection name"},
		{`{"then": [{"op": "put", "collection": "c", "key": "a", "value": "v", "tags": [""]}]}`, "tag"},
		{`{"then": [], "finally": []}`, "unknown field"},
	} {
		resp, body := ht.post("/v1/txn/exec", tc.body)
		wantError(t, resp, body, http.StatusBadRequest, kv.CodeInvalidArgument, tc.words)
	}
	if tf.numCalls() != n {
		t.Fatalf("bad requests reached the backend: %d calls", tf.numCalls()-n)
	}

	tf.errs["ExecTxn"] = kv.Errorf(kv.CodeCommitUnknown, "lost the coordinator")
	resp, body = ht.post("/v1/txn/exec", execBody)
	wantError(t, resp, body, http.StatusServiceUnavailable, kv.CodeCommitUnknown)
}

// TestHTTPTxnExecLimits checks that a list over MaxTxnOps is too_large and
// decoded no further.
func TestHTTPTxnExecLimits(t *testing.T) {
	tf := newTxnFake()
	srv := httptest.NewServer(NewHTTPHandler(tf, HTTPConfig{MaxTxnOps: 2}))
	defer srv.Close()
	ht := &httpTester{t: t, fb: tf.httpFakeBackend, srv: srv}
	op := `{"op": "get", "collection": "c", "key": "a"}`
	resp, body := ht.post("/v1/txn/exec", `{"then": [`+op+`, `+op+`, `+op+`]}`)
	wantError(t, resp, body, http.StatusRequestEntityTooLarge, kv.CodeTooLarge, "more than 2")
	resp, body = ht.post("/v1/txn/exec", `{"then": [`+op+`, `+op+`]}`)
	wantStatus(t, resp, body, http.StatusOK)
}

func TestHTTPTxnPaths(t *testing.T) {
	ht, tf := newTxnTester(t)
	for _, p := range []string{"/v1/txn/", "/v1/txn/t1", "/v1/txn/t1/", "/v1/txn/t1/rollback", "/v1/txn//get", "/v1/txn/t1/get/x", "/v1/txn/exec/x"} {
		resp, body := ht.post(p, `{}`)
		wantError(t, resp, body, http.StatusNotFound, kv.CodeNotFound, "/v1/txn/{id}")
	}
	for _, p := range []string{"/v1/txn/t1/get", "/v1/txn/t1/commit", "/v1/txn/exec"} {
		resp, body := ht.do("PUT", p, nil)
		wantError(t, resp, body, http.StatusMethodNotAllowed, kv.CodeInvalidArgument)
	}
	if n := tf.numCalls(); n != 0 {
		t.Fatalf("the backend was called: %+v", tf.calls)
	}
}

// TestHTTPTxnUnimplemented checks that a backend that is not a
// kv.TxnBackend makes every transaction form answer 501.
func TestHTTPTxnUnimplemented(t *testing.T) {
	ht := newHTTPTester(t, HTTPConfig{})
	for _, p := range []string{"/v1/txn", "/v1/txn/exec", "/v1/txn/t1/get", "/v1/txn/t1/put", "/v1/txn/t1/delete",
		"/v1/txn/t1/scan", "/v1/txn/t1/tags", "/v1/txn/t1/commit", "/v1/txn/t1/abort"} {
		resp, body := ht.post(p, `{}`)
		wantError(t, resp, body, http.StatusNotImplemented, kv.CodeUnimplemented, "does not serve transactions")
	}
}

func TestHTTPTxnMetrics(t *testing.T) {
	tf := newTxnFake()
	m := NewMetrics(nil)
	srv := httptest.NewServer(NewHTTPHandler(tf, HTTPConfig{Metrics: m}))
	defer srv.Close()
	ht := &httpTester{t: t, fb: tf.httpFakeBackend, srv: srv}
	ht.post("/v1/txn", "")
	tf.errs["CommitTxn"] = kv.Errorf(kv.CodeTxnAborted, "aborted")
	ht.post("/v1/txn/t1/commit", "")
	if got := testutil.ToFloat64(m.requests.WithLabelValues(opTxnBegin, codeOK)); got != 1 {
		t.Errorf("txn_begin ok = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.requests.WithLabelValues(opTxnCommit, string(kv.CodeTxnAborted))); got != 1 {
		t.Errorf("txn_commit txn_aborted = %v, want 1", got)
	}
}
