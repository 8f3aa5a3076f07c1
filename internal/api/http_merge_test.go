package api

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/groupkv/groupkv/internal/kv"
)

// mergeFake adds MergeShards to the HTTP fake backend and records its
// arguments.
type mergeFake struct {
	*httpFakeBackend
	got  []any
	info kv.CollectionInfo
	err  error
}

func (f *mergeFake) MergeShards(ctx context.Context, coll string, shard uint64) (kv.CollectionInfo, error) {
	f.got = []any{coll, shard}
	return f.info, f.err
}

// TestHTTPMerge checks POST /v1/collections/{name}/merge: its form, its
// answer (the collection, as a split answers it) and its bad input.
func TestHTTPMerge(t *testing.T) {
	f := &mergeFake{httpFakeBackend: newHTTPFakeBackend()}
	f.info = kv.CollectionInfo{Name: "r", ID: 2, Partitioning: kv.PartitionRange,
		SplitPoints: [][]byte{[]byte("p")},
		Shards:      []kv.ShardInfo{{ID: 7, End: []byte("p"), Leader: 1}, {ID: 9, Start: []byte("p"), Leader: 2}}}
	srv := httptest.NewServer(NewHTTPHandler(f, HTTPConfig{}))
	defer srv.Close()
	do := func(method, path, body string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}
	errCode := func(out map[string]any) any {
		e, _ := out["error"].(map[string]any)
		return e["code"]
	}

	code, out := do("POST", "/v1/collections/r/merge", `{"shard": 7}`)
	if code != 200 || !reflect.DeepEqual(f.got, []any{"r", uint64(7)}) {
		t.Fatalf("merge: %d %v, backend got %v", code, out, f.got)
	}
	want := map[string]any{"name": "r", "id": float64(2), "partitioning": "range", "split_points": []any{"p"},
		"shards": []any{
			map[string]any{"id": float64(7), "start": "", "end": "p", "leader": float64(1)},
			map[string]any{"id": float64(9), "start": "p", "end": "", "leader": float64(2)},
		}}
	if !reflect.DeepEqual(out, want) {
		t.Fatalf("merge answered\n%v\nwant\n%v", out, want)
	}
	if code, _ := do("POST", "/v1/collections/a%2Fb/merge", `{"shard": 3}`); code != 200 || !reflect.DeepEqual(f.got, []any{"a/b", uint64(3)}) {
		t.Fatalf("merge of an escaped name: %d, backend got %v", code, f.got)
	}

	f.got = nil
	for _, body := range []string{`{}`, `{"shard": 0}`, `{"shard": 7, "key": "m"}`, `{"shard": "7"}`, `{"shard": -1}`, `shard=7`, `{"shard": 7} {}`, ``} {
		if code, out := do("POST", "/v1/collections/r/merge", body); code != 400 || errCode(out) != "invalid_argument" {
			t.Fatalf("merge %q: %d %v, want 400 invalid_argument", body, code, out)
		}
	}
	if f.got != nil {
		t.Fatalf("bad input reached the backend: %v", f.got)
	}
	if code, _ := do("GET", "/v1/collections/r/merge", ""); code != 405 {
		t.Fatalf("GET merge: %d, want 405", code)
	}

	// The backend's refusals keep their codes.
	for _, tc := range []struct {
		err    error
		status int
		code   string
	}{
		{kv.Errorf(kv.CodeInvalidArgument, "shard 9 is the last shard of \"r\": it has no right neighbour to merge with"), 400, "invalid_argument"},
		{kv.Errorf(kv.CodeCollectionNotFound, "collection \"nope\" not found"), 404, "collection_not_found"},
		{kv.Errorf(kv.CodeConditionFailed, "shards 7 and 9 are not on the same nodes"), 412, "condition_failed"},
		{kv.Errorf(kv.CodeUnavailable, "the merge is under way"), 503, "unavailable"},
	} {
		f.err = tc.err
		if code, out := do("POST", "/v1/collections/r/merge", `{"shard": 9}`); code != tc.status || errCode(out) != tc.code {
			t.Fatalf("backend error %v: %d %v, want %d %s", tc.err, code, out, tc.status, tc.code)
		}
	}

	// A backend that cannot merge answers 404.
	plain := httptest.NewServer(NewHTTPHandler(newHTTPFakeBackend(), HTTPConfig{}))
	defer plain.Close()
	resp, err := plain.Client().Post(plain.URL+"/v1/collections/r/merge", "application/json", strings.NewReader(`{"shard": 7}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Fatalf("merge on a backend without merges: %d", resp.StatusCode)
	}
}
