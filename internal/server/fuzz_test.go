package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
)

// fuzzPaths are the HTTP forms whose JSON bodies FuzzHTTPBodies sends,
// and whether each may write.
var fuzzPaths = []struct {
	path   string
	writes bool
}{
	{"/v1/txn/exec", true},
	{"/v1/batch/put", true},
	{"/v1/batch/delete", true},
	{"/v1/delete_range", true},
	{"/v1/batch/get", false},
	{"/v1/txn", false},
	{"/v1/collections", true},
	// A session transaction's steps: each in a transaction begun for it,
	// committed after it.
	{"/v1/txn/{id}/put", true},
	{"/v1/txn/{id}/delete", true},
	{"/v1/txn/{id}/get", false},
	{"/v1/txn/{id}/scan", false},
	{"/v1/txn/{id}/tags", false},
	{"/v1/txn/{id}/batch_get", false},
}

// FuzzHTTPBodies sends JSON bodies, valid and not, to a real node's HTTP
// forms that take them. Whatever the body: the node answers (no panic),
// never with a server error (5xx) — bad input is the client's error —,
// every error is JSON naming a code and saying what was wrong, and a
// refused write leaves the collection as it was (nothing half-written) —
// for a step of a session transaction, even once the transaction has
// committed.
// `go test` runs the seeds; `go test -fuzz FuzzHTTPBodies ./internal/server`
// explores.
func FuzzHTTPBodies(f *testing.F) {
	seeds := []struct {
		path int
		body string
	}{
		{0, `{"if": [{"collection": "c", "key": "a", "version": 0}], "then": [{"op": "put", "collection": "c", "key": "a", "value": "1", "tags": ["t"]}], "else": [{"op": "get", "collection": "c", "key": "a"}]}`},
		{0, `{"if": [{"collection": "c", "key": "a", "value": "1"}], "then": [{"op": "delete", "collection": "c", "key": "a"}, {"op": "get", "collection": "c", "key": "b"}]}`},
		{0, `{"then": [{"op": "put", "collection": "c", "key": "x", "value_base64": "AAE="}, {"op": "put", "collection": "nope", "key": "y", "value": "2"}]}`},
		{0, `{"then": [{"op": "put", "collection": "c", "key": "", "value": "2"}]}`},
		{0, `{"then": [{"op": "frob", "collection": "c", "key": "k"}]}`},
		{0, `{"if": [{"collection": "c", "key": "a", "version": 7, "value": "x"}], "then": []}`},
		{1, `{"items": [{"collection": "c", "key": "k1", "value": "v1", "tags": ["a", "b"]}, {"collection": "c", "key": "k2", "value_base64": "/w=="}]}`},
		{1, `{"items": [{"collection": "c", "key": "k1", "value": "v1"}, {"collection": "c", "key": "k1", "value": "v2"}]}`},
		{1, `{"items": [{"collection": "c", "key": "k3", "value": "v", "value_base64": "AA=="}]}`},
		{2, `{"keys": [{"collection": "c", "key": "k1"}, {"collection": "c", "key": "zz"}]}`},
		{3, `{"collection": "c", "start": "k", "end": "l"}`},
		{3, `{"collection": "c", "start": "l", "end": "k"}`},
		{4, `{"keys": [{"collection": "c", "key": "k1"}], "version": 1}`},
		{5, `{"isolation": "snapshot"}`},
		{5, `{"isolation": "serializable", "retry_of": "not-an-id"}`},
		{6, `{"name": "d", "partitioning": "range"}`},
		{6, `{"name": "", "shards": -1}`},
		{0, `{"if": [`},
		{1, `[]`},
		{2, `null`},
		{7, `{"collection": "c", "key": "s1", "value": "v", "tags": ["t"]}`},
		{7, `{"collection": "c", "key": "s1", "value": "v", "tags": [""]}`},
		{8, `{"collection": "c", "key": "s1"}`},
		{9, `{"collection": "c", "key": "a"}`},
		{10, `{"collection": "c", "start": "a", "end": "z", "limit": 5}`},
		{11, `{"collection": "c", "all": ["t"]}`},
		{11, `{"collection": "c", "all": ["t"], "any": ["u"]}`},
		{12, `{"keys": [{"collection": "c", "key": "k1"}, {"collection": "c", "key_base64": "/w=="}], "for_update": true}`},
		{12, `{"keys": [{"collection": "c", "key": "k1"}, {"collection": "nope", "key": "k2"}]}`},
		{12, `{"keys": [{"collection": "c", "key": ""}]}`},
		{12, `{"keys": []}`},
	}
	for _, s := range seeds {
		f.Add(uint8(s.path), []byte(s.body))
	}
	srv := startBench(f)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := srv.Node.CreateCollection(ctx, kv.CollectionOptions{Name: "c", Partitioning: kv.PartitionRange}); err != nil {
		f.Fatal(err)
	}
	h := srv.httpSrv.Handler
	f.Fuzz(func(t *testing.T, which uint8, body []byte) {
		p := fuzzPaths[int(which)%len(fuzzPaths)]
		before := collectionState(t, srv)
		path, txnID := p.path, ""
		if strings.Contains(path, "{id}") {
			txnID = beginFuzzTxn(t, h)
			path = strings.Replace(path, "{id}", txnID, 1)
		}
		req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("POST %s %q: %d %s: a server error for a client's body", p.path, body, rec.Code, rec.Body.Bytes())
		}
		if txnID != "" {
			// The step's transaction commits (what it wrote, if the step
			// was taken) or is known aborted; never a server error.
			crec := httptest.NewRecorder()
			h.ServeHTTP(crec, httptest.NewRequest(http.MethodPost, "/v1/txn/"+txnID+"/commit", nil))
			if crec.Code != http.StatusOK && crec.Code != http.StatusConflict {
				t.Fatalf("commit after POST %s %q (%d %s): %d %s", p.path, body, rec.Code, rec.Body.Bytes(), crec.Code, crec.Body.Bytes())
			}
		}
		if rec.Code < 400 {
			if p.path == "/v1/txn" {
				// Abort the transaction begun, so that its locks (none yet)
				// and session do not pile up.
				var begun struct {
					Txn string `json:"txn"`
				}
				if err := json.Unmarshal(rec.Body.Bytes(), &begun); err != nil || begun.Txn == "" {
					t.Fatalf("POST /v1/txn %q: 200 %s, not a transaction id (%v)", body, rec.Body.Bytes(), err)
				}
				arec := httptest.NewRecorder()
				h.ServeHTTP(arec, httptest.NewRequest(http.MethodPost, "/v1/txn/"+begun.Txn+"/abort", nil))
				if arec.Code != http.StatusOK {
					t.Fatalf("abort of %s: %d %s", begun.Txn, arec.Code, arec.Body.Bytes())
				}
			}
			if p.path == "/v1/collections" {
				// Keep the catalog small: drop what was created.
				var created struct {
					Name string `json:"name"`
				}
				if json.Unmarshal(rec.Body.Bytes(), &created) == nil && created.Name != "" && created.Name != "c" && created.Name != "bench" {
					if err := srv.Node.DropCollection(context.Background(), created.Name); err != nil {
						t.Fatalf("dropping %q: %v", created.Name, err)
					}
				}
			}
			return
		}
		var e struct {
			Error struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Error.Code == "" || e.Error.Message == "" {
			t.Fatalf("POST %s %q: %d with %q: not a JSON error with a code and a message (%v)", p.path, body, rec.Code, rec.Body.Bytes(), err)
		}
		if p.writes {
			if after := collectionState(t, srv); after != before {
				t.Fatalf("POST %s %q: refused (%d %s) but the collection changed:\nbefore %s\nafter  %s", p.path, body, rec.Code, rec.Body.Bytes(), before, after)
			}
		}
	})
}

// beginFuzzTxn begins a serializable session transaction through h.
func beginFuzzTxn(t *testing.T, h http.Handler) string {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/txn", strings.NewReader(`{"isolation": "serializable"}`)))
	var begun struct {
		Txn string `json:"txn"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &begun); rec.Code != http.StatusOK || err != nil || begun.Txn == "" {
		t.Fatalf("POST /v1/txn: %d %s", rec.Code, rec.Body.Bytes())
	}
	return begun.Txn
}

// collectionState is every record of collection "c", keys, values, tags
// and versions, as a string.
func collectionState(t *testing.T, srv *Server) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var b bytes.Buffer
	req := kv.ScanRequest{Collection: "c", Limit: kv.MaxPageSize}
	for {
		res, err := srv.Node.Scan(ctx, req)
		if err != nil {
			t.Fatalf("scanning c: %v", err)
		}
		for _, r := range res.Items {
			fmt.Fprintf(&b, "%q=%q%v@%d ", r.Key, r.Value, r.Tags, r.Version)
		}
		if res.NextPage == "" {
			return b.String()
		}
		req.Page = res.NextPage
	}
}
