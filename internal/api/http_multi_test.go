package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/groupkv/groupkv/internal/kv"
)

// post sends body to path with POST.
func (ht *httpTester) post(path, body string) (*http.Response, []byte) {
	ht.t.Helper()
	return ht.do("POST", path, strings.NewReader(body))
}

// put stores a record through the fake backend directly.
func (ht *httpTester) put(coll, key, value string, tags ...string) uint64 {
	ht.t.Helper()
	v, err := ht.fb.Put(context.Background(), kv.PutRequest{Collection: coll, Key: []byte(key), Value: []byte(value), Tags: tags})
	if err != nil {
		ht.t.Fatal(err)
	}
	return v
}

func (ht *httpTester) createCollection(name string) {
	ht.t.Helper()
	if _, err := ht.fb.CreateCollection(context.Background(), kv.CollectionOptions{Name: name}); err != nil {
		ht.t.Fatal(err)
	}
}

// multiCalls is the number of multi-record calls the backend saw.
func (ht *httpTester) multiCalls() int {
	return ht.fb.lastMultiReqs().calls
}

// wantBody fails unless resp is a JSON answer with status whose body is
// exactly want (plus the final newline).
func wantBody(t *testing.T, resp *http.Response, body []byte, status int, want string) {
	t.Helper()
	wantStatus(t, resp, body, status)
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	if got := string(body); got != want+"\n" {
		t.Fatalf("%s %s: body\n got %s\nwant %s", resp.Request.Method, resp.Request.URL.Path, strings.TrimSpace(got), want)
	}
}

// wantBatchError fails unless resp is the error answer of a batch write:
// {"error": {"code", "message"}, "applied": [...]} with status, code, the
// applied list exactly applied (compact JSON) and a message holding words.
func wantBatchError(t *testing.T, resp *http.Response, body []byte, status int, code kv.Code, applied string, words ...string) {
	t.Helper()
	wantStatus(t, resp, body, status)
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("error Content-Type %q, want application/json", ct)
	}
	var e struct {
		Error struct {
			Code    kv.Code `json:"code"`
			Message string  `json:"message"`
		} `json:"error"`
		Applied json.RawMessage `json:"applied"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		t.Fatalf("batch error body %q is not {\"error\", \"applied\"}: %v", body, err)
	}
	if e.Error.Code != code || e.Error.Message == "" {
		t.Errorf("error code %q message %q, want code %q", e.Error.Code, e.Error.Message, code)
	}
	if string(e.Applied) != applied {
		t.Errorf("applied %s, want %s (body %s)", e.Applied, applied, body)
	}
	for _, w := range words {
		if !strings.Contains(e.Error.Message, w) {
			t.Errorf("error message %q does not mention %q", e.Error.Message, w)
		}
	}
}

func TestHTTPBatchGet(t *testing.T) {
	ht := newHTTPTester(t, HTTPConfig{})
	ht.createCollection("d")
	ht.put("c", "a", "va", "x", "y")
	ht.put("c", "bin", "\xff\x00")
	ht.put("c", "\xfe", "")
	ht.put("d", "a", "vd")

	resp, body := ht.post("/v1/batch/get", `{"keys": [
		{"collection": "c", "key": "a"},
		{"collection": "c", "key": "missing"},
		{"collection": "c", "key": "bin"},
		{"collection": "c", "key_base64": "/g=="},
		{"collection": "d", "key": "a"}]}`)
	wantBody(t, resp, body, http.StatusOK, `{"items":[`+
		`{"collection":"c","key":"a","found":true,"value":"va","version":1,"tags":["x","y"]},`+
		`{"collection":"c","key":"missing","found":false,"version":0,"tags":[]},`+
		`{"collection":"c","key":"bin","found":true,"value_base64":"/wA=","version":2,"tags":[]},`+
		`{"collection":"c","key_base64":"/g==","found":true,"value":"","version":3,"tags":[]},`+
		`{"collection":"d","key":"a","found":true,"value":"vd","version":4,"tags":[]}],"version":4}`)
	got := ht.fb.lastMultiReqs().batchGet
	var want []kv.KeyRef
	for _, k := range [][2]string{{"c", "a"}, {"c", "missing"}, {"c", "bin"}, {"c", "\xfe"}, {"d", "a"}} {
		want = append(want, kv.KeyRef{Collection: k[0], Key: []byte(k[1])})
	}
	if !slices.EqualFunc(got, want, func(a, b kv.KeyRef) bool { return a.Collection == b.Collection && bytes.Equal(a.Key, b.Key) }) {
		t.Fatalf("backend got %q, want %q", got, want)
	}

	// The same key twice is answered twice, in request order.
	resp, body = ht.post("/v1/batch/get", `{"keys": [{"collection": "d", "key": "a"}, {"collection": "c", "key": "a"}, {"collection": "d", "key": "a"}]}`)
	wantStatus(t, resp, body, http.StatusOK)
	var r struct {
		Items []struct {
			Collection string `json:"collection"`
		} `json:"items"`
	}
	if err := json.Unmarshal(body, &r); err != nil || len(r.Items) != 3 || r.Items[0].Collection != "d" || r.Items[1].Collection != "c" {
		t.Fatalf("order: %s", body)
	}

	resp, body = ht.post("/v1/batch/get", `{"keys": [{"collection": "nope", "key": "a"}]}`)
	wantError(t, resp, body, http.StatusNotFound, kv.CodeCollectionNotFound) // and no "applied"
}

func TestHTTPBatchPut(t *testing.T) {
	ht := newHTTPTester(t, HTTPConfig{})
	ht.createCollection("d")

	resp, body := ht.post("/v1/batch/put", `{"items": [
		{"collection": "c", "key": "a", "value": "va", "tags": ["x", "y"]},
		{"collection": "c", "key_base64": "/w==", "value_base64": "AAE=", "if_version": 0},
		{"collection": "d", "key": "a", "value": ""}]}`)
	wantBody(t, resp, body, http.StatusOK, `{"items":[`+
		`{"collection":"c","key":"a","version":1},`+
		`{"collection":"c","key_base64":"/w==","version":1},`+
		`{"collection":"d","key":"a","version":2}]}`)
	items := ht.fb.lastMultiReqs().batchPut
	if len(items) != 3 ||
		items[0].Collection != "c" || string(items[0].Key) != "a" || string(items[0].Value) != "va" || !slices.Equal(items[0].Tags, []string{"x", "y"}) || items[0].IfVersion != nil ||
		string(items[1].Key) != "\xff" || !bytes.Equal(items[1].Value, []byte{0, 1}) || items[1].Tags != nil || items[1].IfVersion == nil || *items[1].IfVersion != 0 ||
		items[2].Collection != "d" || items[2].Value == nil || len(items[2].Value) != 0 {
		t.Fatalf("backend got %+v", items)
	}

	// A condition that fails before anything is applied: applied is [].
	// if_version keeps all 64 bits.
	resp, body = ht.post("/v1/batch/put", `{"items": [{"collection": "c", "key": "a", "value": "v", "if_version": 18446744073709551615}]}`)
	wantBatchError(t, resp, body, http.StatusPreconditionFailed, kv.CodeConditionFailed, `[]`)
	if ifv := ht.fb.lastMultiReqs().batchPut[0].IfVersion; ifv == nil || *ifv != 18446744073709551615 {
		t.Fatalf("if_version reached the backend as %v", ifv)
	}

	// A batch over two collections (two shards of the fake) whose second
	// part fails: applied lists exactly the first part.
	resp, body = ht.post("/v1/batch/put", `{"items": [
		{"collection": "c", "key": "b", "value": "vb"},
		{"collection": "d", "key": "a", "value": "x", "if_version": 99},
		{"collection": "c", "key_base64": "/w==", "value": "vff"}]}`)
	wantBatchError(t, resp, body, http.StatusPreconditionFailed, kv.CodeConditionFailed,
		`[{"collection":"c","key":"b","version":3},{"collection":"c","key_base64":"/w==","version":3}]`)
	if rec, err := ht.fb.Get(context.Background(), kv.GetRequest{Collection: "c", Key: []byte("b")}); err != nil || string(rec.Value) != "vb" {
		t.Fatalf("the applied part is not there: %v %v", rec, err)
	}

	// Errors of the backend: a *kv.BatchError lists its records, anything
	// else has applied [].
	for _, tc := range []struct {
		err     error
		status  int
		code    kv.Code
		applied string
	}{
		{&kv.BatchError{Err: kv.Errorf(kv.CodeCommitUnknown, "shard 7 timed out"), Applied: []kv.WriteResult{{Collection: "c", Key: []byte("\xff"), Version: 7}, {Collection: "d", Key: []byte("k"), Version: 8}}},
			503, kv.CodeCommitUnknown, `[{"collection":"c","key_base64":"/w==","version":7},{"collection":"d","key":"k","version":8}]`},
		{fmt.Errorf("routing: %w", &kv.BatchError{Err: kv.Errorf(kv.CodeUnavailable, "no leader"), Applied: []kv.WriteResult{{Collection: "c", Key: []byte("a"), Version: 9}}}),
			503, kv.CodeUnavailable, `[{"collection":"c","key":"a","version":9}]`},
		{&kv.BatchError{Err: kv.Errorf(kv.CodeUnavailable, "no leader")}, 503, kv.CodeUnavailable, `[]`},
		{&kv.BatchError{Applied: []kv.WriteResult{{Collection: "c", Key: []byte("a"), Version: 9}}}, 500, kv.CodeInternal, `[{"collection":"c","key":"a","version":9}]`},
		{kv.Errorf(kv.CodeUnavailable, "no leader"), 503, kv.CodeUnavailable, `[]`},
		{context.DeadlineExceeded, 503, kv.CodeUnavailable, `[]`},
	} {
		ht.fb.setFail(tc.err)
		resp, body = ht.post("/v1/batch/put", `{"items": [{"collection": "c", "key": "a", "value": "v"}]}`)
		wantBatchError(t, resp, body, tc.status, tc.code, tc.applied)
		resp, body = ht.post("/v1/batch/delete", `{"keys": [{"collection": "c", "key": "a"}]}`)
		wantBatchError(t, resp, body, tc.status, tc.code, tc.applied)
	}
}

func TestHTTPBatchDelete(t *testing.T) {
	ht := newHTTPTester(t, HTTPConfig{})
	ht.put("c", "a", "1")
	ht.put("c", "b", "2")
	ht.put("c", "\xff", "3")

	resp, body := ht.post("/v1/batch/delete", `{"keys": [{"collection": "c", "key": "a"}, {"collection": "c", "key": "missing"}, {"collection": "c", "key_base64": "/w=="}]}`)
	wantBody(t, resp, body, http.StatusOK, `{"items":[`+
		`{"collection":"c","key":"a","version":4},{"collection":"c","key":"missing","version":4},{"collection":"c","key_base64":"/w==","version":4}]}`)
	if got := ht.fb.lastMultiReqs().batchDelete; len(got) != 3 || string(got[2].Key) != "\xff" {
		t.Fatalf("backend got %q", got)
	}
	if _, err := ht.fb.Get(context.Background(), kv.GetRequest{Collection: "c", Key: []byte("a")}); kv.CodeOf(err) != kv.CodeNotFound {
		t.Fatalf("a not deleted: %v", err)
	}

	// The second collection does not exist: the first part stays applied.
	resp, body = ht.post("/v1/batch/delete", `{"keys": [{"collection": "c", "key": "b"}, {"collection": "nope", "key": "x"}]}`)
	wantBatchError(t, resp, body, http.StatusNotFound, kv.CodeCollectionNotFound, `[{"collection":"c","key":"b","version":5}]`)
}

func TestHTTPBatchBadRequests(t *testing.T) {
	ht := newHTTPTester(t, HTTPConfig{MaxValueSize: 10})
	longKey := strings.Repeat("k", kv.MaxKeySize+1)
	type tc struct {
		body   string
		status int
		code   kv.Code
		words  []string
	}
	keysCases := []tc{
		{``, 400, kv.CodeInvalidArgument, []string{"empty"}},
		{`{}`, 400, kv.CodeInvalidArgument, []string{"no keys"}},
		{`{"keys": []}`, 400, kv.CodeInvalidArgument, []string{"no keys"}},
		{`{"keys": null}`, 400, kv.CodeInvalidArgument, []string{"no keys"}},
		{`{"keys": "a"}`, 400, kv.CodeInvalidArgument, []string{"keys", "array"}},
		{`{"keys": {}}`, 400, kv.CodeInvalidArgument, []string{"keys", "array"}},
		{`{"keys": ["a"]}`, 400, kv.CodeInvalidArgument, []string{"keys[0]", "JSON object", "string"}},
		{`{"keys": [{"collection": "c", "key": "a", "value": "x"}]}`, 400, kv.CodeInvalidArgument, []string{"keys[0]", "unknown field", "value", "key_base64"}},
		{`{"keys": [{"collection": "c", "key": "a"}, {"collection": "c", "key": 1}]}`, 400, kv.CodeInvalidArgument, []string{"keys[1]", `"key"`, "string", "number"}},
		{`{"keys": [{"collection": "c"}]}`, 400, kv.CodeInvalidArgument, []string{"keys[0]", "no key"}},
		{`{"keys": [{"collection": "c", "key": null}]}`, 400, kv.CodeInvalidArgument, []string{"keys[0]", "no key"}},
		{`{"keys": [{"collection": "c", "key": "a", "key_base64": "YQ=="}]}`, 400, kv.CodeInvalidArgument, []string{"keys[0]", "not both"}},
		{`{"keys": [{"collection": "c", "key_base64": "!"}]}`, 400, kv.CodeInvalidArgument, []string{"keys[0]", "key_base64", "base64"}},
		{`{"keys": [{"collection": "c", "key": ""}]}`, 400, kv.CodeInvalidArgument, []string{"keys[0]", "empty"}},
		{`{"keys": [{"key": "a"}]}`, 400, kv.CodeInvalidArgument, []string{"keys[0]", "collection name"}},
		{`{"keys": [{"collection": "C", "key": "a"}]}`, 400, kv.CodeInvalidArgument, []string{"keys[0]", `"C"`}},
		{`{"keys": [{"collection": "c", "key": "a"}, {"collection": "c", "key": "` + longKey + `"}]}`, 413, kv.CodeTooLarge, []string{"keys[1]", "4096"}},
		{`{"kyes": []}`, 400, kv.CodeInvalidArgument, []string{"unknown field", "kyes", "keys"}},
		{`{"keys": [{"collection": "c", "key": "a"}]} {}`, 400, kv.CodeInvalidArgument, []string{"more than one"}},
		{`{"keys": [{"collection": "c", "key": "a"}`, 400, kv.CodeInvalidArgument, []string{"middle"}},
	}
	itemsCases := []tc{
		{`{}`, 400, kv.CodeInvalidArgument, []string{"no items"}},
		{`{"keys": [{"collection": "c", "key": "a"}]}`, 400, kv.CodeInvalidArgument, []string{"unknown field", "keys", "items"}},
		{`{"items": [{"collection": "c", "key": "a"}]}`, 400, kv.CodeInvalidArgument, []string{"items[0]", "no value"}},
		{`{"items": [{"collection": "c", "key": "a", "value": "x", "value_base64": "eA=="}]}`, 400, kv.CodeInvalidArgument, []string{"items[0]", "not both"}},
		{`{"items": [{"collection": "c", "key": "a", "value_base64": "e"}]}`, 400, kv.CodeInvalidArgument, []string{"items[0]", "value_base64", "base64"}},
		{`{"items": [{"collection": "c", "key": "a", "value": "x", "tags": ["t", "t"]}]}`, 400, kv.CodeInvalidArgument, []string{"items[0]", "twice"}},
		{`{"items": [{"collection": "c", "key": "a", "value": "x", "tags": ["a,b"]}]}`, 400, kv.CodeInvalidArgument, []string{"items[0]", "comma"}},
		{`{"items": [{"collection": "c", "key": "a", "value": "x", "tags": "t"}]}`, 400, kv.CodeInvalidArgument, []string{"items[0]", "tags", "array"}},
		{`{"items": [{"collection": "c", "key": "a", "value": "x", "if_version": -1}]}`, 400, kv.CodeInvalidArgument, []string{"items[0]", "if_version", "integer"}},
		{`{"items": [{"collection": "c", "key": "a", "value": "x", "if_version": "1"}]}`, 400, kv.CodeInvalidArgument, []string{"items[0]", "if_version"}},
		{`{"items": [{"collection": "c", "key": "a", "value": "x", "ttl": 5}]}`, 400, kv.CodeInvalidArgument, []string{"items[0]", "unknown field", "ttl", "if_version"}},
		{`{"items": [{"collection": "c", "key": "a", "value": "01234567890"}]}`, 413, kv.CodeTooLarge, []string{"items[0]", "11 bytes", "10"}},
		{`{"items": [{"collection": "c", "key": "` + longKey + `", "value": "x"}]}`, 413, kv.CodeTooLarge, []string{"items[0]", "4096"}},
	}
	for _, c := range keysCases {
		for _, path := range []string{"/v1/batch/get", "/v1/batch/delete"} {
			resp, body := ht.post(path, c.body)
			if path == "/v1/batch/get" {
				wantError(t, resp, body, c.status, c.code, c.words...)
			} else {
				wantBatchError(t, resp, body, c.status, c.code, `[]`, c.words...)
			}
		}
	}
	for _, c := range itemsCases {
		resp, body := ht.post("/v1/batch/put", c.body)
		wantBatchError(t, resp, body, c.status, c.code, `[]`, c.words...)
	}
	// The value limit itself is fine.
	resp, body := ht.post("/v1/batch/put", `{"items": [{"collection": "c", "key": "a", "value": "0123456789"}]}`)
	wantStatus(t, resp, body, http.StatusOK)
	if n := ht.multiCalls(); n != 1 {
		t.Fatalf("bad requests reached the backend: %d calls", n-1)
	}

	// These forms take no query parameters.
	for _, path := range []string{"/v1/batch/get?x=1", "/v1/batch/put?if_version=1", "/v1/batch/delete?x=1", "/v1/delete_range?x=1"} {
		resp, body := ht.post(path, `{}`)
		if strings.HasPrefix(path, "/v1/batch/put") || strings.HasPrefix(path, "/v1/batch/delete") {
			wantBatchError(t, resp, body, http.StatusBadRequest, kv.CodeInvalidArgument, `[]`, "unknown query parameter")
		} else {
			wantError(t, resp, body, http.StatusBadRequest, kv.CodeInvalidArgument, "unknown query parameter")
		}
	}
}

// batchBody returns a body of n keys (field "keys") or items.
func batchBody(field string, n int) string {
	var b strings.Builder
	b.WriteString(`{"` + field + `": [`)
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"collection": "c", "key": "k%d"`, i)
		if field == "items" {
			b.WriteString(`, "value": "v"`)
		}
		b.WriteString("}")
	}
	b.WriteString("]}")
	return b.String()
}

func TestHTTPBatchLimits(t *testing.T) {
	ht := newHTTPTester(t, HTTPConfig{MaxBatchKeys: 3})
	for _, tc := range []struct{ path, field string }{
		{"/v1/batch/get", "keys"}, {"/v1/batch/put", "items"}, {"/v1/batch/delete", "keys"},
	} {
		resp, body := ht.post(tc.path, batchBody(tc.field, 3))
		wantStatus(t, resp, body, http.StatusOK)
		resp, body = ht.post(tc.path, batchBody(tc.field, 4))
		if tc.field == "items" || tc.path == "/v1/batch/delete" {
			wantBatchError(t, resp, body, http.StatusRequestEntityTooLarge, kv.CodeTooLarge, `[]`, tc.field, "limit", "3")
		} else {
			wantError(t, resp, body, http.StatusRequestEntityTooLarge, kv.CodeTooLarge, tc.field, "limit", "3")
		}
		// Elements beyond the limit are not even decoded.
		resp, body = ht.post(tc.path, strings.TrimSuffix(batchBody(tc.field, 3), "]}")+`, {"key": 5}]}`)
		wantStatus(t, resp, body, http.StatusRequestEntityTooLarge)
	}
	if n := ht.multiCalls(); n != 3 {
		t.Fatalf("%d backend calls, want 3", n)
	}

	// The default is kv.DefaultMaxBatchKeys.
	ht = newHTTPTester(t, HTTPConfig{})
	resp, body := ht.post("/v1/batch/get", batchBody("keys", kv.DefaultMaxBatchKeys))
	wantStatus(t, resp, body, http.StatusOK)
	resp, body = ht.post("/v1/batch/get", batchBody("keys", kv.DefaultMaxBatchKeys+1))
	wantError(t, resp, body, http.StatusRequestEntityTooLarge, kv.CodeTooLarge, fmt.Sprint(kv.DefaultMaxBatchKeys))

	// A body over MaxBodySize, with a Content-Length and without.
	ht = newHTTPTester(t, HTTPConfig{MaxBodySize: 200})
	big := batchBody("items", 10)
	for _, r := range []io.Reader{strings.NewReader(big), io.MultiReader(strings.NewReader(big))} {
		resp, body := ht.do("POST", "/v1/batch/put", r)
		wantBatchError(t, resp, body, http.StatusRequestEntityTooLarge, kv.CodeTooLarge, `[]`, "200")
	}
	resp, body = ht.post("/v1/delete_range", `{"collection": "c", "start": "`+strings.Repeat("a", 200)+`"}`)
	wantError(t, resp, body, http.StatusRequestEntityTooLarge, kv.CodeTooLarge, "200")
	if n := ht.multiCalls(); n != 0 {
		t.Fatalf("%d backend calls, want 0", n)
	}
}

func TestHTTPDeleteRange(t *testing.T) {
	ht := newHTTPTester(t, HTTPConfig{})
	for _, k := range []string{"a", "b", "c", "d", "e", "\xff"} {
		ht.put("c", k, "v")
	}
	for _, tc := range []struct {
		body       string
		start, end string
		deleted    int
	}{
		{`{"collection": "c", "start": "b", "end": "d"}`, "b", "d", 2},
		{`{"collection": "c", "start": "", "end": "b"}`, "", "b", 1},
		{`{"collection": "c", "start_base64": "/w=="}`, "\xff", "", 1},
		{`{"collection": "c", "start": "e", "end": ""}`, "e", "", 1},
		{`{"collection": "c", "start": "", "end_base64": "/w=="}`, "", "\xff", 1},
		{`{"collection": "c", "start": ""}`, "", "", 0},
	} {
		resp, body := ht.post("/v1/delete_range", tc.body)
		wantBody(t, resp, body, http.StatusOK, fmt.Sprintf(`{"deleted":%d}`, tc.deleted))
		got := ht.fb.lastMultiReqs().deleteRange
		if got.Collection != "c" || string(got.Start) != tc.start || string(got.End) != tc.end {
			t.Errorf("%s: backend got %+v", tc.body, got)
		}
		if (tc.start == "") != (got.Start == nil) || (tc.end == "") != (got.End == nil) {
			t.Errorf("%s: an empty bound reached the backend as %q %q, want nil", tc.body, got.Start, got.End)
		}
	}
	calls := ht.multiCalls()
	for _, tc := range []struct {
		body   string
		status int
		code   kv.Code
		words  []string
	}{
		{`{"collection": "c"}`, 400, kv.CodeInvalidArgument, []string{"no start"}},
		{`{"collection": "c", "end": "b"}`, 400, kv.CodeInvalidArgument, []string{"no start"}},
		{`{"collection": "c", "start": "a", "start_base64": "YQ=="}`, 400, kv.CodeInvalidArgument, []string{"not both"}},
		{`{"collection": "c", "start": "a", "end": "b", "end_base64": "Yg=="}`, 400, kv.CodeInvalidArgument, []string{"not both"}},
		{`{"collection": "c", "start": "a", "end_base64": "%"}`, 400, kv.CodeInvalidArgument, []string{"end_base64"}},
		{`{"collection": "c", "start": "b", "end": "a"}`, 400, kv.CodeInvalidArgument, []string{"not below"}},
		{`{"collection": "c", "start": "b", "end": "b"}`, 400, kv.CodeInvalidArgument, []string{"not below"}},
		{`{"collection": "c", "start": "` + strings.Repeat("s", kv.MaxKeySize+1) + `"}`, 413, kv.CodeTooLarge, []string{"start", "4096"}},
		{`{"start": "a"}`, 400, kv.CodeInvalidArgument, []string{"collection name"}},
		{`{"collection": "c", "start": "a", "limit": 5}`, 400, kv.CodeInvalidArgument, []string{"unknown field", "limit", "start_base64"}},
		{`{"collection": "c", "start": 1}`, 400, kv.CodeInvalidArgument, []string{"start", "string"}},
	} {
		resp, body := ht.post("/v1/delete_range", tc.body)
		wantError(t, resp, body, tc.status, tc.code, tc.words...)
	}
	if n := ht.multiCalls(); n != calls {
		t.Fatalf("bad requests reached the backend: %d calls", n-calls)
	}
	resp, body := ht.post("/v1/delete_range", `{"collection": "nope", "start": ""}`)
	wantError(t, resp, body, http.StatusNotFound, kv.CodeCollectionNotFound)
}

func TestHTTPScan(t *testing.T) {
	ht := newHTTPTester(t, HTTPConfig{})
	ht.put("c", "a", "1", "t")
	ht.put("c", "b", "")
	ht.put("c", "\xff", "\xfe")

	all := `{"items":[` +
		`{"key":"a","value":"1","version":1,"tags":["t"]},` +
		`{"key":"b","value":"","version":2,"tags":[]},` +
		`{"key_base64":"/w==","value_base64":"/g==","version":3,"tags":[]}],"next_page":"","version":3}`
	resp, body := ht.do("GET", "/v1/scan/c", nil)
	wantBody(t, resp, body, http.StatusOK, all)
	if got := ht.fb.lastMultiReqs().scan; got.Collection != "c" || got.Start != nil || got.End != nil || got.Limit != 0 || got.Reverse || got.Page != "" || got.Version != 0 {
		t.Fatalf("backend got %+v", got)
	}
	// Empty parameters are absent ones; the collection is percent-decoded.
	resp, body = ht.do("GET", "/v1/scan/%63?start=&end=&page=", nil)
	wantBody(t, resp, body, http.StatusOK, all)

	// Paging: the token is passed on as it is, and fixes the version.
	resp, body = ht.do("GET", "/v1/scan/c?limit=2", nil)
	wantBody(t, resp, body, http.StatusOK, `{"items":[`+
		`{"key":"a","value":"1","version":1,"tags":["t"]},`+
		`{"key":"b","value":"","version":2,"tags":[]}],"next_page":"p~3_62","version":3}`)
	ht.put("c", "c", "new")
	resp, body = ht.do("GET", "/v1/scan/c?limit=2&page=p~3_62", nil)
	wantBody(t, resp, body, http.StatusOK, `{"items":[`+
		`{"key_base64":"/w==","value_base64":"/g==","version":3,"tags":[]}],"next_page":"","version":3}`)
	if got := ht.fb.lastMultiReqs().scan; got.Page != "p~3_62" || got.Limit != 2 {
		t.Fatalf("backend got %+v", got)
	}

	// Bounds are percent-decoded bytes; reverse walks the same span down.
	resp, body = ht.do("GET", "/v1/scan/c?start=b&end=%FF&reverse=true&version=4", nil)
	wantBody(t, resp, body, http.StatusOK, `{"items":[`+
		`{"key":"c","value":"new","version":4,"tags":[]},`+
		`{"key":"b","value":"","version":2,"tags":[]}],"next_page":"","version":4}`)
	if got := ht.fb.lastMultiReqs().scan; string(got.Start) != "b" || string(got.End) != "\xff" || !got.Reverse || got.Version != 4 {
		t.Fatalf("backend got %+v", got)
	}
	for _, rev := range []struct {
		param string
		want  bool
	}{{"true", true}, {"1", true}, {"false", false}, {"0", false}} {
		resp, body = ht.do("GET", "/v1/scan/c?reverse="+rev.param, nil)
		wantStatus(t, resp, body, http.StatusOK)
		if got := ht.fb.lastMultiReqs().scan.Reverse; got != rev.want {
			t.Errorf("reverse=%s: backend got %v", rev.param, got)
		}
	}
	resp, body = ht.do("GET", fmt.Sprintf("/v1/scan/c?limit=%d", kv.MaxPageSize), nil)
	wantStatus(t, resp, body, http.StatusOK)

	// HEAD: the headers of GET without the body.
	resp, body = ht.do("HEAD", "/v1/scan/c", nil)
	wantStatus(t, resp, body, http.StatusOK)
	if len(body) != 0 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("HEAD: body %q, Content-Type %q", body, resp.Header.Get("Content-Type"))
	}

	ht.fb.mu.Lock()
	ht.fb.compactedBelow = 2
	ht.fb.mu.Unlock()
	resp, body = ht.do("GET", "/v1/scan/c?version=1", nil)
	wantError(t, resp, body, http.StatusGone, kv.CodeCompacted)
	resp, body = ht.do("GET", "/v1/scan/nope", nil)
	wantError(t, resp, body, http.StatusNotFound, kv.CodeCollectionNotFound)
}

func TestHTTPScanBadQuery(t *testing.T) {
	ht := newHTTPTester(t, HTTPConfig{})
	long := strings.Repeat("k", kv.MaxKeySize+1)
	for _, tc := range []struct {
		query  string
		status int
		words  []string
	}{
		{"x=1", 400, []string{"unknown query parameter", `"x"`, "start, end, limit, reverse, page, version"}},
		{"from_version=1", 400, []string{"unknown query parameter", "from_version"}},
		{"all=a", 400, []string{"unknown query parameter", "all"}},
		{"limit=0", 400, []string{"limit", "1 to 1000", "100"}},
		{"limit=-1", 400, []string{"limit"}},
		{"limit=abc", 400, []string{"limit", "abc"}},
		{"limit=", 400, []string{"limit"}},
		{"limit=1001", 400, []string{"limit=1001", "1000"}},
		{"limit=1&limit=2", 400, []string{"limit", "2 times"}},
		{"reverse=yes", 400, []string{"reverse", "yes", "true, false, 1 or 0"}},
		{"reverse=TRUE", 400, []string{"reverse"}},
		{"reverse=", 400, []string{"reverse"}},
		{"version=0", 400, []string{"version", "omit it"}},
		{"version=abc", 400, []string{"version"}},
		{"start=b&end=a", 400, []string{"not below"}},
		{"start=b&end=b", 400, []string{"not below"}},
		{"start=" + long, 413, []string{"start", "4096"}},
		{"end=" + long, 413, []string{"end", "4096"}},
		{"start=%zz", 400, []string{"malformed"}},
	} {
		resp, body := ht.do("GET", "/v1/scan/c?"+tc.query, nil)
		code := kv.CodeInvalidArgument
		if tc.status == 413 {
			code = kv.CodeTooLarge
		}
		wantError(t, resp, body, tc.status, code, tc.words...)
	}
	if n := ht.multiCalls(); n != 0 {
		t.Fatalf("bad requests reached the backend: %d calls", n)
	}
}

func TestHTTPGetByTags(t *testing.T) {
	ht := newHTTPTester(t, HTTPConfig{})
	ht.put("c", "a", "va", "x", "y")
	ht.put("c", "b", "vb", "x")
	ht.put("c", "c", "vc", "y", "z")
	ht.put("c", "d", "vd")

	resp, body := ht.do("GET", "/v1/tags/c?all=x,y", nil)
	wantBody(t, resp, body, http.StatusOK, `{"items":[{"key":"a","value":"va","version":1,"tags":["x","y"]}],"next_page":"","version":4}`)
	if q := ht.fb.lastMultiReqs().tags; q.Collection != "c" || !slices.Equal(q.All, []string{"x", "y"}) || q.Any != nil || q.Limit != 0 || q.Page != "" || q.Version != 0 {
		t.Fatalf("backend got %+v", q)
	}

	resp, body = ht.do("GET", "/v1/tags/c?any=x,z&limit=2", nil)
	wantBody(t, resp, body, http.StatusOK, `{"items":[`+
		`{"key":"a","value":"va","version":1,"tags":["x","y"]},`+
		`{"key":"b","value":"vb","version":2,"tags":["x"]}],"next_page":"p~4_62","version":4}`)
	if q := ht.fb.lastMultiReqs().tags; !slices.Equal(q.Any, []string{"x", "z"}) || q.All != nil || q.Limit != 2 {
		t.Fatalf("backend got %+v", q)
	}
	resp, body = ht.do("GET", "/v1/tags/c?any=x,z&limit=2&page=p~4_62", nil)
	wantBody(t, resp, body, http.StatusOK, `{"items":[{"key":"c","value":"vc","version":3,"tags":["y","z"]}],"next_page":"","version":4}`)

	resp, body = ht.do("GET", "/v1/tags/c?any=y&version=2", nil)
	wantBody(t, resp, body, http.StatusOK, `{"items":[{"key":"a","value":"va","version":1,"tags":["x","y"]}],"next_page":"","version":2}`)
	// A tag with a space, an escaped comma's neighbour '+', and UTF-8.
	resp, body = ht.do("GET", "/v1/tags/%63?all=a+b,c%2Bd,%C3%A9", nil)
	wantStatus(t, resp, body, http.StatusOK)
	if q := ht.fb.lastMultiReqs().tags; !slices.Equal(q.All, []string{"a b", "c+d", "é"}) {
		t.Fatalf("backend got %q", q.All)
	}

	calls := ht.multiCalls()
	for _, tc := range []struct {
		query string
		words []string
	}{
		{"", []string{"exactly one", "all=", "any="}},
		{"limit=5", []string{"exactly one"}},
		{"all=x&any=y", []string{"exactly one"}},
		{"all=", []string{"all=", "no tag"}},
		{"any=", []string{"any=", "no tag"}},
		{"all=a,,b", []string{"all", "empty"}},
		{"any=a,a", []string{"any", "twice"}},
		{"all=a%01", []string{"control"}},
		{"all=a&all=b", []string{"all", "2 times"}},
		{"all=a&start=b", []string{"unknown query parameter", "start"}},
		{"all=a&limit=1001", []string{"limit", "1000"}},
		{"all=a&limit=0", []string{"limit"}},
		{"all=a&version=0", []string{"version"}},
		{"all=a&reverse=true", []string{"unknown query parameter", "reverse"}},
	} {
		resp, body := ht.do("GET", "/v1/tags/c?"+tc.query, nil)
		wantError(t, resp, body, http.StatusBadRequest, kv.CodeInvalidArgument, tc.words...)
	}
	if n := ht.multiCalls(); n != calls {
		t.Fatalf("bad requests reached the backend: %d calls", n-calls)
	}
	resp, body = ht.do("GET", "/v1/tags/nope?all=x", nil)
	wantError(t, resp, body, http.StatusNotFound, kv.CodeCollectionNotFound)
}

// stream is a watch being read, event by event, from a real server.
type stream struct {
	t      *testing.T
	resp   *http.Response
	r      *bufio.Reader
	cancel context.CancelFunc
}

// watch starts GET path with the Accept header accept ("" for none); it
// fails the test if the stream is not read to its end in 10s.
func (ht *httpTester) watch(path, accept string) *stream {
	ht.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	ht.t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, "GET", ht.srv.URL+path, nil)
	if err != nil {
		ht.t.Fatal(err)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := ht.srv.Client().Do(req)
	if err != nil {
		ht.t.Fatal(err)
	}
	ht.t.Cleanup(func() { resp.Body.Close() })
	return &stream{t: ht.t, resp: resp, r: bufio.NewReader(resp.Body), cancel: cancel}
}

// line reads the next line, its newline included.
func (s *stream) line() string {
	s.t.Helper()
	l, err := s.r.ReadString('\n')
	if err != nil {
		s.t.Fatalf("reading the stream after %q: %v", l, err)
	}
	return l
}

// wantLines reads the next lines and fails unless they are want.
func (s *stream) wantLines(want ...string) {
	s.t.Helper()
	for _, w := range want {
		if got := s.line(); got != w {
			s.t.Fatalf("stream line %q, want %q", got, w)
		}
	}
}

// wantEOF fails unless the stream ends cleanly.
func (s *stream) wantEOF() {
	s.t.Helper()
	if l, err := s.r.ReadString('\n'); l != "" || err != io.EOF {
		s.t.Fatalf("after the stream: %q, %v; want a clean end", l, err)
	}
}

// watchReturned waits for the fake's Watch to return and answers its error.
func (ht *httpTester) watchReturned() error {
	ht.t.Helper()
	select {
	case err := <-ht.fb.watchDone:
		return err
	case <-time.After(10 * time.Second):
		ht.t.Fatal("Watch did not return")
		return nil
	}
}

// send has the fake's watch emit ev.
func (ht *httpTester) send(ev kv.Event) {
	ht.t.Helper()
	select {
	case ht.fb.watchCh <- ev:
	case <-time.After(10 * time.Second):
		ht.t.Fatal("the watch does not take events")
	}
}

var watchEvents = []kv.Event{
	{Type: kv.EventPut, Key: []byte("a"), Value: []byte("v1"), Tags: []string{"t"}, Version: 5},
	{Type: kv.EventDelete, Key: []byte("b"), Version: 6},
	{Type: kv.EventProgress, Version: 7},
	{Type: kv.EventPut, Key: []byte("\xff"), Value: []byte("\xfe"), Version: 8},
}

var watchLines = []string{
	`{"type":"put","key":"a","value":"v1","version":5,"tags":["t"]}`,
	`{"type":"delete","key":"b","version":6,"tags":[]}`,
	`{"type":"progress","version":7}`,
	`{"type":"put","key_base64":"/w==","value_base64":"/g==","version":8,"tags":[]}`,
}

// waitCount waits until groupkv_requests_total{op,code} of m is n: a
// stream's request is counted after its handler returns.
func waitCount(t *testing.T, m *Metrics, op, code string, n float64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for testutil.ToFloat64(m.requests.WithLabelValues(op, code)) != n {
		if time.Now().After(deadline) {
			t.Fatalf("groupkv_requests_total{op=%q,code=%q} = %v, want %v", op, code, testutil.ToFloat64(m.requests.WithLabelValues(op, code)), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestHTTPWatchNDJSON(t *testing.T) {
	m := NewMetrics(nil)
	ht := newHTTPTester(t, HTTPConfig{Metrics: m})
	ht.fb.watchEvents = watchEvents

	s := ht.watch("/v1/watch/%63?from_version=4&start=a&end=%FF&after_key=a%00", "")
	wantStatus(t, s.resp, nil, http.StatusOK)
	if ct := s.resp.Header.Get("Content-Type"); ct != "application/x-ndjson" {
		t.Fatalf("Content-Type %q, want application/x-ndjson", ct)
	}
	for _, l := range watchLines {
		s.wantLines(l + "\n")
	}
	req := ht.fb.lastMultiReqs().watch
	if req.Collection != "c" || req.FromVersion != 4 || string(req.Start) != "a" || string(req.End) != "\xff" || string(req.AfterKey) != "a\x00" {
		t.Fatalf("backend got %+v", req)
	}

	// Each event is flushed as it comes: the fake emits the next one only
	// after the client has read this one.
	for i := 0; i < 3; i++ {
		ht.send(kv.Event{Type: kv.EventPut, Key: []byte("k"), Value: []byte(fmt.Sprint(i)), Version: uint64(10 + i)})
		s.wantLines(fmt.Sprintf(`{"type":"put","key":"k","value":"%d","version":%d,"tags":[]}`+"\n", i, 10+i))
		ht.send(kv.Event{Type: kv.EventProgress, Version: uint64(20 + i)})
		s.wantLines(fmt.Sprintf(`{"type":"progress","version":%d}`+"\n", 20+i))
	}

	// The client going away ends the watch, which counts as a success.
	s.cancel()
	if err := ht.watchReturned(); err == nil {
		t.Fatal("Watch returned nil after the client went away")
	}
	waitCount(t, m, "watch", "ok", 1)

	// Without from_version resumption, the default: no after_key, no bounds.
	s = ht.watch("/v1/watch/c?from_version=0&start=&end=&after_key=", "application/json")
	s.wantLines(watchLines[0] + "\n")
	if req := ht.fb.lastMultiReqs().watch; req.FromVersion != 0 || req.Start != nil || req.End != nil || req.AfterKey != nil {
		t.Fatalf("backend got %+v", req)
	}
	if ct := s.resp.Header.Get("Content-Type"); ct != "application/x-ndjson" {
		t.Fatalf("Accept: application/json: Content-Type %q", ct)
	}
	s.cancel()
	ht.watchReturned()
}

func TestHTTPWatchSSE(t *testing.T) {
	ht := newHTTPTester(t, HTTPConfig{})
	ht.fb.watchEvents = watchEvents

	for _, accept := range []string{"text/event-stream", "text/html, Text/Event-Stream;q=0.9", "application/json;q=0.5,text/event-stream"} {
		s := ht.watch("/v1/watch/c?from_version=4", accept)
		wantStatus(t, s.resp, nil, http.StatusOK)
		if ct := s.resp.Header.Get("Content-Type"); ct != "text/event-stream" {
			t.Fatalf("Accept %q: Content-Type %q, want text/event-stream", accept, ct)
		}
		if cc := s.resp.Header.Get("Cache-Control"); cc != "no-cache" {
			t.Errorf("Cache-Control %q, want no-cache", cc)
		}
		for _, l := range watchLines {
			s.wantLines("data: "+l+"\n", "\n")
		}
		ht.send(kv.Event{Type: kv.EventDelete, Key: []byte("z"), Version: 30})
		s.wantLines(`data: {"type":"delete","key":"z","version":30,"tags":[]}`+"\n", "\n")
		s.cancel()
		ht.watchReturned()
	}

	// text/event-stream refused with q=0 is not asked for.
	s := ht.watch("/v1/watch/c?from_version=4", "text/event-stream;q=0, application/x-ndjson")
	if ct := s.resp.Header.Get("Content-Type"); ct != "application/x-ndjson" {
		t.Fatalf("q=0: Content-Type %q", ct)
	}
	s.cancel()
	ht.watchReturned()
}

func TestHTTPWatchErrors(t *testing.T) {
	m := NewMetrics(nil)
	ht := newHTTPTester(t, HTTPConfig{Metrics: m})
	ht.fb.watchEvents = watchEvents
	long := strings.Repeat("k", kv.MaxKeySize+1)

	// Errors found before the first event are JSON answers with their
	// status, whatever the client accepts.
	for _, accept := range []string{"", "text/event-stream"} {
		for _, tc := range []struct {
			path   string
			status int
			code   kv.Code
			words  []string
		}{
			{"/v1/watch/c", 400, kv.CodeInvalidArgument, []string{"from_version", "required"}},
			{"/v1/watch/c?from_version=", 400, kv.CodeInvalidArgument, []string{"from_version"}},
			{"/v1/watch/c?from_version=abc", 400, kv.CodeInvalidArgument, []string{"from_version", "abc"}},
			{"/v1/watch/c?from_version=-1", 400, kv.CodeInvalidArgument, []string{"from_version"}},
			{"/v1/watch/c?from_version=1&limit=5", 400, kv.CodeInvalidArgument, []string{"unknown query parameter", "limit", "after_key"}},
			{"/v1/watch/c?from_version=1&from_version=2", 400, kv.CodeInvalidArgument, []string{"2 times"}},
			{"/v1/watch/c?from_version=1&start=b&end=a", 400, kv.CodeInvalidArgument, []string{"not below"}},
			{"/v1/watch/c?from_version=1&after_key=" + long, 413, kv.CodeTooLarge, []string{"after_key", "4096"}},
			{"/v1/watch/c?from_version=1&start=" + long, 413, kv.CodeTooLarge, []string{"start"}},
			{"/v1/watch/Bad?from_version=1", 400, kv.CodeInvalidArgument, []string{"Bad"}},
			{"/v1/watch/nope?from_version=1", 404, kv.CodeCollectionNotFound, nil},
		} {
			req, _ := http.NewRequest("GET", ht.srv.URL+tc.path, nil)
			if accept != "" {
				req.Header.Set("Accept", accept)
			}
			resp, err := ht.srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			wantError(t, resp, body, tc.status, tc.code, tc.words...)
		}
	}
	ht.fb.mu.Lock()
	ht.fb.compactedBelow = 10
	ht.fb.mu.Unlock()
	for _, accept := range []string{"", "text/event-stream"} {
		s := ht.watch("/v1/watch/c?from_version=5", accept)
		body, _ := io.ReadAll(s.r)
		wantError(t, s.resp, body, http.StatusGone, kv.CodeCompacted)
		ht.watchReturned()
	}
	ht.fb.setFail(kv.Errorf(kv.CodeInvalidArgument, "after_key is outside [start, end)"))
	resp, body := ht.do("GET", "/v1/watch/c?from_version=50", nil)
	wantError(t, resp, body, http.StatusBadRequest, kv.CodeInvalidArgument, "after_key")
	ht.watchReturned()
	ht.fb.setFail(nil)
	waitCount(t, m, "watch", "compacted", 2)

	// An error after the first event ends the stream; an SSE stream tells
	// it in an "error" event first.
	ht.fb.mu.Lock()
	ht.fb.watchEvents = watchEvents[:1]
	ht.fb.watchErrAfter = kv.Errorf(kv.CodeUnavailable, "shard 3 lost its leader")
	ht.fb.mu.Unlock()
	s := ht.watch("/v1/watch/c?from_version=50", "")
	s.wantLines(watchLines[0] + "\n")
	s.wantEOF()
	ht.watchReturned()
	s = ht.watch("/v1/watch/c?from_version=50", "text/event-stream")
	s.wantLines("data: "+watchLines[0]+"\n", "\n",
		"event: error\n", `data: {"error":{"code":"unavailable","message":"shard 3 lost its leader"}}`+"\n", "\n")
	s.wantEOF()
	ht.watchReturned()
	waitCount(t, m, "watch", "unavailable", 2)
}

func TestHTTPMultiPaths(t *testing.T) {
	ht := newHTTPTester(t, HTTPConfig{})
	for _, tc := range []struct {
		method, path string
		status       int
		code         kv.Code
		words        []string
	}{
		{"GET", "/v1/scan", 400, kv.CodeInvalidArgument, []string{"no collection", "/v1/scan/{collection}"}},
		{"GET", "/v1/scan/", 400, kv.CodeInvalidArgument, []string{"no collection"}},
		{"GET", "/v1/tags/", 400, kv.CodeInvalidArgument, []string{"no collection", "/v1/tags/{collection}"}},
		{"GET", "/v1/watch", 400, kv.CodeInvalidArgument, []string{"no collection", "/v1/watch/{collection}"}},
		{"GET", "/v1/scan/Bad", 400, kv.CodeInvalidArgument, []string{"Bad"}},
		{"GET", "/v1/scan/c%2Fd", 400, kv.CodeInvalidArgument, []string{"c/d"}},
		{"GET", "/v1/scan/c/x", 404, kv.CodeNotFound, []string{"unknown path", "/v1/scan/{collection}"}},
		{"GET", "/v1/scan/c/", 404, kv.CodeNotFound, []string{"unknown path"}},
		{"GET", "/v1/scanx/c", 404, kv.CodeNotFound, []string{"unknown path"}},
		{"POST", "/v1/batch", 404, kv.CodeNotFound, []string{"unknown path", "/v1/batch/{get,put,delete}"}},
		{"POST", "/v1/batch/", 404, kv.CodeNotFound, []string{"unknown path"}},
		{"POST", "/v1/batch/nope", 404, kv.CodeNotFound, []string{"unknown path"}},
		{"POST", "/v1/batch/get/x", 404, kv.CodeNotFound, []string{"unknown path"}},
		{"POST", "/v1/delete_range/c", 404, kv.CodeNotFound, []string{"unknown path"}},
	} {
		resp, body := ht.raw(tc.method, tc.path, nil)
		wantError(t, resp, body, tc.status, tc.code, tc.words...)
	}
	for _, tc := range []struct{ method, path, allow string }{
		{"GET", "/v1/batch/get", "POST"},
		{"PUT", "/v1/batch/put", "POST"},
		{"DELETE", "/v1/batch/delete", "POST"},
		{"GET", "/v1/delete_range", "POST"},
		{"POST", "/v1/scan/c", "GET, HEAD"},
		{"DELETE", "/v1/tags/c", "GET, HEAD"},
		{"POST", "/v1/watch/c", "GET"},
		{"HEAD", "/v1/watch/c", "GET"},
	} {
		resp, body := ht.do(tc.method, tc.path, nil)
		if tc.method == "HEAD" {
			wantStatus(t, resp, body, http.StatusMethodNotAllowed)
		} else {
			wantError(t, resp, body, http.StatusMethodNotAllowed, kv.CodeInvalidArgument, tc.method, tc.allow)
		}
		if got := resp.Header.Get("Allow"); got != tc.allow {
			t.Errorf("%s %s: Allow %q, want %q", tc.method, tc.path, got, tc.allow)
		}
	}
	if n := ht.multiCalls(); n != 0 {
		t.Fatalf("bad paths reached the backend: %d calls", n)
	}
}

func TestHTTPMultiBackendErrors(t *testing.T) {
	ht := newHTTPTester(t, HTTPConfig{})
	for _, tc := range []struct {
		err    error
		status int
		code   kv.Code
	}{
		{kv.Errorf(kv.CodeInvalidArgument, "m"), 400, kv.CodeInvalidArgument},
		{kv.Errorf(kv.CodeCollectionNotFound, "m"), 404, kv.CodeCollectionNotFound},
		{kv.Errorf(kv.CodeKeyInGroup, "m"), 409, kv.CodeKeyInGroup},
		{kv.Errorf(kv.CodeCompacted, "m"), 410, kv.CodeCompacted},
		{kv.Errorf(kv.CodeConditionFailed, "m"), 412, kv.CodeConditionFailed},
		{kv.Errorf(kv.CodeTooLarge, "m"), 413, kv.CodeTooLarge},
		{kv.Errorf(kv.CodeUnavailable, "m"), 503, kv.CodeUnavailable},
		{kv.Errorf(kv.CodeCommitUnknown, "m"), 503, kv.CodeCommitUnknown},
		{fmt.Errorf("wrapped: %w", kv.Errorf(kv.CodeInternal, "m")), 500, kv.CodeInternal},
		{context.DeadlineExceeded, 503, kv.CodeUnavailable},
	} {
		ht.fb.setFail(tc.err)
		for _, req := range []struct{ method, path, body string }{
			{"POST", "/v1/batch/get", `{"keys": [{"collection": "c", "key": "a"}]}`},
			{"POST", "/v1/delete_range", `{"collection": "c", "start": "a"}`},
			{"GET", "/v1/scan/c", ""},
			{"GET", "/v1/tags/c?any=t", ""},
			{"GET", "/v1/watch/c?from_version=1", ""},
		} {
			resp, body := ht.do(req.method, req.path, strings.NewReader(req.body))
			wantError(t, resp, body, tc.status, tc.code)
		}
		ht.watchReturned()
		for _, req := range []struct{ path, body string }{
			{"/v1/batch/put", `{"items": [{"collection": "c", "key": "a", "value": "v"}]}`},
			{"/v1/batch/delete", `{"keys": [{"collection": "c", "key": "a"}]}`},
		} {
			resp, body := ht.post(req.path, req.body)
			wantBatchError(t, resp, body, tc.status, tc.code, `[]`)
		}
	}
}

func TestHTTPMultiMetrics(t *testing.T) {
	m := NewMetrics(nil)
	ht := newHTTPTester(t, HTTPConfig{Metrics: m})
	ht.post("/v1/batch/get", `{"keys": [{"collection": "c", "key": "a"}]}`)
	ht.post("/v1/batch/put", `{"items": [{"collection": "c", "key": "a", "value": "v"}]}`)
	ht.post("/v1/batch/put", `{"items": [{"collection": "c", "key": "a", "value": "v", "if_version": 0}]}`)
	ht.post("/v1/batch/delete", `{"keys": [{"collection": "c", "key": "a"}]}`)
	ht.post("/v1/batch/delete", `{"keys": []}`)
	ht.post("/v1/delete_range", `{"collection": "c", "start": ""}`)
	ht.do("GET", "/v1/scan/c", nil)
	ht.do("GET", "/v1/scan/c?limit=0", nil)
	ht.do("GET", "/v1/tags/c?all=x", nil)
	ht.do("GET", "/v1/tags/nope?all=x", nil)
	ht.do("GET", "/v1/watch/c", nil)
	ht.do("GET", "/v1/batch/get", nil)

	for _, tc := range []struct {
		op, code string
		n        float64
	}{
		{"batch_get", "ok", 1},
		{"batch_put", "ok", 1},
		{"batch_put", "condition_failed", 1},
		{"batch_delete", "ok", 1},
		{"batch_delete", "invalid_argument", 1},
		{"delete_range", "ok", 1},
		{"scan", "ok", 1},
		{"scan", "invalid_argument", 1},
		{"get_by_tags", "ok", 1},
		{"get_by_tags", "collection_not_found", 1},
		{"watch", "invalid_argument", 1},
		{"unknown", "invalid_argument", 1},
	} {
		if got := testutil.ToFloat64(m.requests.WithLabelValues(tc.op, tc.code)); got != tc.n {
			t.Errorf("groupkv_requests_total{op=%q,code=%q} = %v, want %v", tc.op, tc.code, got, tc.n)
		}
	}
}
