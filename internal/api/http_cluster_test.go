package api

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
)

// clusterFake adds the cluster methods to the HTTP fake backend and records
// their arguments.
type clusterFake struct {
	*httpFakeBackend
	status     kv.ClusterStatus
	decomm     []any
	decommErr  error
	split      []any
	splitInfo  kv.CollectionInfo
	splitError error
	checked    [][]uint64
	checks     []kv.ConsistencyCheck
	checkErr   error
}

func (f *clusterFake) CheckConsistency(ctx context.Context, shards []uint64) ([]kv.ConsistencyCheck, error) {
	f.checked = append(f.checked, shards)
	return f.checks, f.checkErr
}

func (f *clusterFake) ClusterStatus(ctx context.Context) (kv.ClusterStatus, error) {
	return f.status, nil
}

func (f *clusterFake) Decommission(ctx context.Context, id uint64, draining bool) error {
	f.decomm = []any{id, draining}
	return f.decommErr
}

func (f *clusterFake) SplitShard(ctx context.Context, coll string, key []byte, shard uint64) (kv.CollectionInfo, error) {
	f.split = []any{coll, string(key), key == nil, shard}
	return f.splitInfo, f.splitError
}

func TestHTTPClusterForms(t *testing.T) {
	f := &clusterFake{httpFakeBackend: newHTTPFakeBackend()}
	f.status = kv.ClusterStatus{
		Nodes: []kv.NodeStatus{{ID: 1, Addr: "h:7070", PeerAddr: "h:7071", Healthy: true, Replicas: 2, Held: 2}},
		Shards: []kv.ShardStatus{{Collection: "", Shard: 1, Replicas: []uint64{1}, Leader: 1, Voters: []uint64{1}},
			{Collection: "c", Shard: 2, Replicas: []uint64{1, 2}, Leader: 1, Voters: []uint64{1, 2}, VotersOutgoing: []uint64{1}}},
	}
	f.splitInfo = kv.CollectionInfo{Name: "r", ID: 2, Partitioning: kv.PartitionRange}
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

	// GET /v1/cluster: the shape, ids as integers.
	code, out := do("GET", "/v1/cluster", "")
	want := map[string]any{
		"nodes": []any{map[string]any{"id": 1.0, "addr": "h:7070", "peer_addr": "h:7071", "healthy": true, "replicas": 2.0, "held": 2.0}},
		"shards": []any{map[string]any{"collection": "", "shard": 1.0, "replicas": []any{1.0}, "leader": 1.0, "voters": []any{1.0}},
			map[string]any{"collection": "c", "shard": 2.0, "replicas": []any{1.0, 2.0}, "leader": 1.0, "voters": []any{1.0, 2.0}, "voters_outgoing": []any{1.0}}},
	}
	if code != 200 || !reflect.DeepEqual(out, want) {
		t.Fatalf("GET /v1/cluster: %d %v", code, out)
	}
	if code, _ := do("POST", "/v1/cluster", ""); code != 405 {
		t.Fatalf("POST /v1/cluster: %d, want 405", code)
	}

	// POST /v1/nodes/{id}/decommission, with and without a body.
	if code, out := do("POST", "/v1/nodes/3/decommission", ""); code != 200 || out["id"] != 3.0 || out["draining"] != true || !reflect.DeepEqual(f.decomm, []any{uint64(3), true}) {
		t.Fatalf("decommission: %d %v, backend got %v", code, out, f.decomm)
	}
	if code, out := do("POST", "/v1/nodes/3/decommission", `{"draining": false}`); code != 200 || out["draining"] != false || !reflect.DeepEqual(f.decomm, []any{uint64(3), false}) {
		t.Fatalf("undo: %d %v, backend got %v", code, out, f.decomm)
	}
	for _, bad := range []struct{ method, path, body string }{
		{"POST", "/v1/nodes/x/decommission", ""},
		{"POST", "/v1/nodes/0/decommission", ""},
		{"POST", "/v1/nodes/3/decommission", `{"drain": true}`},
	} {
		if code, out := do(bad.method, bad.path, bad.body); code != 400 || errCode(out) != "invalid_argument" {
			t.Fatalf("%s %s %s: %d %v, want 400 invalid_argument", bad.method, bad.path, bad.body, code, out)
		}
	}
	if code, _ := do("GET", "/v1/nodes/3/decommission", ""); code != 405 {
		t.Fatalf("GET decommission: %d, want 405", code)
	}
	f.decommErr = kv.Errorf(kv.CodeNotFound, "node 9 is not a member")
	if code, out := do("POST", "/v1/nodes/9/decommission", ""); code != 404 || errCode(out) != "not_found" {
		t.Fatalf("decommission of a stranger: %d %v", code, out)
	}

	// POST /v1/collections/{name}/split.
	if code, out := do("POST", "/v1/collections/r/split", `{"key": "m"}`); code != 200 || out["name"] != "r" || !reflect.DeepEqual(f.split, []any{"r", "m", false, uint64(0)}) {
		t.Fatalf("split at a key: %d %v, backend got %v", code, out, f.split)
	}
	if code, _ := do("POST", "/v1/collections/h/split", `{"shard": 7}`); code != 200 || !reflect.DeepEqual(f.split, []any{"h", "", true, uint64(7)}) {
		t.Fatalf("split of a shard: %d, backend got %v", code, f.split)
	}
	for _, body := range []string{`{"key": "m", "shard": 7}`, `{}`, `{"at": "m"}`} {
		if code, out := do("POST", "/v1/collections/r/split", body); code != 400 || errCode(out) != "invalid_argument" {
			t.Fatalf("split %s: %d %v, want 400 invalid_argument", body, code, out)
		}
	}
	f.splitError = kv.Errorf(kv.CodeCollectionNotFound, "collection \"nope\" not found")
	if code, out := do("POST", "/v1/collections/nope/split", `{"key": "m"}`); code != 404 || errCode(out) != "collection_not_found" {
		t.Fatalf("split of a missing collection: %d %v", code, out)
	}

	// POST /v1/cluster/check: the shards named, or none (every shard).
	at := time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC)
	f.checks = []kv.ConsistencyCheck{
		{Shard: 1, ID: 7, Index: 40, Status: kv.ConsistencyOK, Replicas: []uint64{1, 2}, Sums: map[uint64]string{1: "aa", 2: "aa"}, By: 1, At: at},
		{Shard: 3, Collection: "c", ID: 9, Index: 12, Status: kv.ConsistencyMismatch, Replicas: []uint64{1, 2, 3},
			Sums: map[uint64]string{1: "aa", 2: "aa", 3: "bb"}, Mismatched: []uint64{3}, By: 1, At: at},
	}
	code, out = do("POST", "/v1/cluster/check", `{"shards": [3, 1]}`)
	wantCheck := map[string]any{"ok": false, "checks": []any{
		map[string]any{"shard": 1.0, "id": 7.0, "index": 40.0, "status": "ok", "replicas": []any{1.0, 2.0},
			"sums": map[string]any{"1": "aa", "2": "aa"}, "by": 1.0, "at": "2026-12-06T09:00:00Z"},
		map[string]any{"shard": 3.0, "collection": "c", "id": 9.0, "index": 12.0, "status": "mismatch", "replicas": []any{1.0, 2.0, 3.0},
			"sums": map[string]any{"1": "aa", "2": "aa", "3": "bb"}, "mismatched": []any{3.0}, "by": 1.0, "at": "2026-12-06T09:00:00Z"},
	}}
	if code != 200 || !reflect.DeepEqual(out, wantCheck) || !reflect.DeepEqual(f.checked, [][]uint64{{3, 1}}) {
		t.Fatalf("check of shards 3 and 1: %d %v, backend got %v", code, out, f.checked)
	}
	f.checks = f.checks[:1]
	for _, body := range []string{"", `{}`, `{"shards": []}`} {
		f.checked = nil
		code, out := do("POST", "/v1/cluster/check", body)
		if code != 200 || out["ok"] != true || len(f.checked) != 1 || len(f.checked[0]) != 0 {
			t.Fatalf("check with body %q: %d %v, backend got %v, want every shard checked", body, code, out, f.checked)
		}
	}
	f.checked = nil
	for _, body := range []string{`{"shards": [0]}`, `{"shards": [-1]}`, `{"shards": "3"}`, `{"shard": 3}`, `[3]`} {
		if code, out := do("POST", "/v1/cluster/check", body); code != 400 || errCode(out) != "invalid_argument" {
			t.Fatalf("check %s: %d %v, want 400 invalid_argument", body, code, out)
		}
	}
	if f.checked != nil {
		t.Fatalf("the backend was asked %v after bad requests", f.checked)
	}
	if code, _ := do("GET", "/v1/cluster/check", ""); code != 405 {
		t.Fatalf("GET /v1/cluster/check: %d, want 405", code)
	}
	f.checkErr = kv.Errorf(kv.CodeNotFound, "shard 99 not found")
	if code, out := do("POST", "/v1/cluster/check", `{"shards": [99]}`); code != 404 || errCode(out) != "not_found" {
		t.Fatalf("check of an unknown shard: %d %v", code, out)
	}

	// A backend that is not a cluster node answers 404 for all of these.
	plain := httptest.NewServer(NewHTTPHandler(newHTTPFakeBackend(), HTTPConfig{}))
	defer plain.Close()
	for _, r := range []struct{ method, path string }{{"GET", "/v1/cluster"}, {"POST", "/v1/nodes/1/decommission"}, {"POST", "/v1/cluster/check"}} {
		req, _ := http.NewRequest(r.method, plain.URL+r.path, nil)
		resp, err := plain.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 404 {
			t.Fatalf("%s %s on a plain backend: %d, want 404", r.method, r.path, resp.StatusCode)
		}
	}
}
