package api

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/groupkv/groupkv/internal/kv"
)

// groupFake is a kv.Backend, a kv.TxnBackend (txnFake's) and a
// kv.GroupBackend for testing the Key Groups forms: the group methods
// record their calls in the txnFake's list, the group id in place of the
// attempt, and answer what the test set up (or errs[method]).
type groupFake struct {
	*txnFake

	created kv.GroupCreated
	info    kv.GroupInfo
	infos   []kv.GroupInfo
}

var _ kv.GroupBackend = (*groupFake)(nil)

func (f *groupFake) CreateGroup(_ context.Context, spec kv.GroupSpec) (kv.GroupCreated, error) {
	if err := f.record("CreateGroup", "", spec); err != nil {
		return kv.GroupCreated{}, err
	}
	return f.created, nil
}

func (f *groupFake) DescribeGroup(_ context.Context, id string) (kv.GroupInfo, error) {
	if err := f.record("DescribeGroup", id, nil); err != nil {
		return kv.GroupInfo{}, err
	}
	return f.info, nil
}

func (f *groupFake) ListGroups(context.Context) ([]kv.GroupInfo, error) {
	if err := f.record("ListGroups", "", nil); err != nil {
		return nil, err
	}
	return f.infos, nil
}

func (f *groupFake) DeleteGroup(_ context.Context, id string) error {
	return f.record("DeleteGroup", id, nil)
}

func (f *groupFake) BeginGroupTxn(_ context.Context, id string, opts kv.TxnOptions) (string, error) {
	if err := f.record("BeginGroupTxn", id, opts); err != nil {
		return "", err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextID++
	return fmt.Sprintf("g%d", f.nextID), nil
}

func (f *groupFake) ExecGroupTxn(_ context.Context, id string, req kv.ExecRequest) (kv.ExecResult, error) {
	if err := f.record("ExecGroupTxn", id, req); err != nil {
		return kv.ExecResult{}, err
	}
	return f.execRes, nil
}

// newGroupTester serves the HTTP handler over a groupFake.
func newGroupTester(t *testing.T, cfg HTTPConfig) (*httpTester, *groupFake) {
	t.Helper()
	gf := &groupFake{txnFake: newTxnFake()}
	srv := httptest.NewServer(NewHTTPHandler(gf, cfg))
	t.Cleanup(srv.Close)
	return &httpTester{t: t, fb: gf.httpFakeBackend, srv: srv}, gf
}

func ref(coll, key string) kv.KeyRef { return kv.KeyRef{Collection: coll, Key: []byte(key)} }

func TestHTTPGroupCreate(t *testing.T) {
	ht, gf := newGroupTester(t, HTTPConfig{})
	gf.created = kv.GroupCreated{ID: "g1", Joined: []kv.KeyRef{ref("c", "k0"), ref("c", "k1"), {Collection: "d", Key: []byte{0xff}}}}
	resp, body := ht.post("/v1/groups", `{"id": "g1", "leader": {"collection": "c", "key": "k0"},
		"members": [{"collection": "c", "key": "k1"}, {"collection": "d", "key_base64": "/w=="}], "mode": "atomic"}`)
	wantBody(t, resp, body, http.StatusOK,
		`{"id":"g1","joined":[{"collection":"c","key":"k0"},{"collection":"c","key":"k1"},{"collection":"d","key_base64":"/w=="}],"refused":[]}`)
	wantCall(t, gf.txnFake, "CreateGroup", "", kv.GroupSpec{ID: "g1", Leader: ref("c", "k0"),
		Members: []kv.KeyRef{ref("c", "k1"), {Collection: "d", Key: []byte{0xff}}}, Mode: kv.GroupAtomic})

	// Mode defaults to atomic; the leader may be listed among the
	// members; refusals of a best_effort group carry their reason.
	resp, body = ht.post("/v1/groups", `{"id": "g2", "leader": {"collection": "c", "key": "k0"}, "members": [{"collection": "c", "key": "k0"}]}`)
	wantStatus(t, resp, body, http.StatusOK)
	wantCall(t, gf.txnFake, "CreateGroup", "", kv.GroupSpec{ID: "g2", Leader: ref("c", "k0"), Members: []kv.KeyRef{ref("c", "k0")}, Mode: kv.GroupAtomic})
	resp, body = ht.post("/v1/groups", `{"id": "g3", "leader": {"collection": "c", "key": "k0"}}`)
	wantStatus(t, resp, body, http.StatusOK)
	wantCall(t, gf.txnFake, "CreateGroup", "", kv.GroupSpec{ID: "g3", Leader: ref("c", "k0"), Members: []kv.KeyRef{}, Mode: kv.GroupAtomic})

	gf.created = kv.GroupCreated{ID: "g4", Joined: []kv.KeyRef{ref("c", "k0")},
		Refused: []kv.GroupRefusal{{KeyRef: ref("c", "k1"), Reason: "locked"}, {KeyRef: ref("c", "k2"), Reason: "in_group"}}}
	resp, body = ht.post("/v1/groups", `{"id": "g4", "leader": {"collection": "c", "key": "k0"},
		"members": [{"collection": "c", "key": "k1"}, {"collection": "c", "key": "k2"}], "mode": "best_effort"}`)
	wantBody(t, resp, body, http.StatusOK,
		`{"id":"g4","joined":[{"collection":"c","key":"k0"}],"refused":[{"collection":"c","key":"k1","reason":"locked"},{"collection":"c","key":"k2","reason":"in_group"}]}`)
	wantCall(t, gf.txnFake, "CreateGroup", "", kv.GroupSpec{ID: "g4", Leader: ref("c", "k0"),
		Members: []kv.KeyRef{ref("c", "k1"), ref("c", "k2")}, Mode: kv.GroupBestEffort})

	const ok = `{"id": "g5", "leader": {"collection": "c", "key": "k0"}, "members": [{"collection": "c", "key": "k1"}]}`
	gf.errs["CreateGroup"] = kv.Errorf(kv.CodeGroupRefused, `key "k1" of collection "c": locked`)
	resp, body = ht.post("/v1/groups", ok)
	wantError(t, resp, body, http.StatusConflict, kv.CodeGroupRefused, "locked")
	gf.errs["CreateGroup"] = kv.Errorf(kv.CodeAlreadyExists, "group g5 exists")
	resp, body = ht.post("/v1/groups", ok)
	wantError(t, resp, body, http.StatusConflict, kv.CodeAlreadyExists)
	gf.errs["CreateGroup"] = kv.Errorf(kv.CodeKeyInGroup, `key "k1" of collection "c" is in group g0`)
	resp, body = ht.post("/v1/groups", ok)
	wantError(t, resp, body, http.StatusConflict, kv.CodeKeyInGroup)
}

// TestHTTPGroupCreateBadBodies checks that a bad creation is refused with
// 400 invalid_argument, saying what was wrong, before it reaches the
// backend.
func TestHTTPGroupCreateBadBodies(t *testing.T) {
	ht, gf := newGroupTester(t, HTTPConfig{MaxBatchKeys: 3})
	const leader = `"leader": {"collection": "c", "key": "k0"}`
	for _, tc := range []struct{ body, words string }{
		{``, "empty"},
		{`[]`, "object"},
		{`{` + leader + `}`, "no group id"},
		{`{"id": "", ` + leader + `}`, "no group id"},
		{`{"id": "` + strings.Repeat("g", MaxGroupIDSize+1) + `", ` + leader + `}`, "group id is 257 bytes"},
		{`{"id": "a\u0007b", ` + leader + `}`, "control character"},
		{`{"id": "g1"}`, "no leader"},
		{`{"id": "g1", "leader": {"collection": "c"}}`, "leader: no key"},
		{`{"id": "g1", "leader": {"collection": "C", "key": "k"}}`, "leader: collection name"},
		{`{"id": "g1", "leader": {"collection": "c", "key": "k", "key_base64": "aw=="}}`, "not both"},
		{`{"id": "g1", "leader": "c/k0"}`, `"leader"`},
		{`{"id": "g1", ` + leader + `, "mode": "all_or_nothing"}`, `mode "all_or_nothing" is not known`},
		{`{"id": "g1", ` + leader + `, "mode": "Atomic"}`, "mode"},
		{`{"id": 7, ` + leader + `}`, `field "id" of the request body must be a string`},
		{`{"id": "g1", ` + leader + `, "members": {"collection": "c", "key": "k1"}}`, `field "members" of the request body must be an array`},
		{`{"id": "g1", ` + leader + `, "members": [{"collection": "c", "key": "k1"}, {"collection": "c"}]}`, "members[1]: no key"},
		{`{"id": "g1", ` + leader + `, "members": [{"collection": "c", "key": "k1", "version": 3}]}`, "members[0] has unknown field"},
		{`{"id": "g1", ` + leader + `, "members": [{"collection": "c", "key": "k1"}, {"collection": "c", "key": "k2"}, {"collection": "c", "key": "k1"}]}`,
			"members[2] is members[0] again"},
		{`{"id": "g1", ` + leader + `, "atomic": true}`, "unknown field \"atomic\": the fields are id, leader, members, mode"},
		{`{"id": "g1", ` + leader + `} {}`, "more than one"},
	} {
		resp, body := ht.post("/v1/groups", tc.body)
		wantError(t, resp, body, http.StatusBadRequest, kv.CodeInvalidArgument, tc.words)
	}
	k := `{"collection": "c", "key": "k"}`
	resp, body := ht.post("/v1/groups", `{"id": "g1", `+leader+`, "members": [`+k+`, `+k+`, `+k+`, `+k+`]}`)
	wantError(t, resp, body, http.StatusRequestEntityTooLarge, kv.CodeTooLarge, "more than 3 members", "at most 3")
	resp, body = ht.post("/v1/groups?mode=atomic", `{"id": "g1", `+leader+`}`)
	wantError(t, resp, body, http.StatusBadRequest, kv.CodeInvalidArgument, "unknown query parameter")
	if n := gf.numCalls(); n != 0 {
		t.Fatalf("bad requests reached the backend: %+v", gf.calls)
	}
}

func TestHTTPGroupDescribeListDelete(t *testing.T) {
	ht, gf := newGroupTester(t, HTTPConfig{})
	gf.info = kv.GroupInfo{ID: "a/b c", Leader: ref("c", "k0"), Members: []kv.KeyRef{ref("c", "k0"), {Collection: "d", Key: []byte{0xfe}}},
		Mode: kv.GroupBestEffort, LeaderNode: 3, State: kv.GroupActive, ShipperLag: 12}
	const info = `{"id":"a/b c","leader":{"collection":"c","key":"k0"},"members":[{"collection":"c","key":"k0"},{"collection":"d","key_base64":"/g=="}],` +
		`"mode":"best_effort","leader_node":3,"state":"active","shipper_lag":12}`
	resp, body := ht.do("GET", "/v1/groups/a%2Fb%20c", nil)
	wantBody(t, resp, body, http.StatusOK, info)
	wantCall(t, gf.txnFake, "DescribeGroup", "a/b c", nil)
	resp, body = ht.do("HEAD", "/v1/groups/g1", nil)
	wantStatus(t, resp, body, http.StatusOK)
	wantCall(t, gf.txnFake, "DescribeGroup", "g1", nil)

	// A backend that leaves the mode empty means atomic.
	gf.info = kv.GroupInfo{ID: "g2", Leader: ref("c", "x"), Members: []kv.KeyRef{ref("c", "x")}, LeaderNode: 1, State: kv.GroupCreating}
	const info2 = `{"id":"g2","leader":{"collection":"c","key":"x"},"members":[{"collection":"c","key":"x"}],"mode":"atomic","leader_node":1,"state":"creating","shipper_lag":0}`
	resp, body = ht.do("GET", "/v1/groups/g2", nil)
	wantBody(t, resp, body, http.StatusOK, info2)

	gf.errs["DescribeGroup"] = kv.Errorf(kv.CodeNotFound, "no group g9")
	resp, body = ht.do("GET", "/v1/groups/g9", nil)
	wantError(t, resp, body, http.StatusNotFound, kv.CodeNotFound, "no group g9")

	resp, body = ht.do("GET", "/v1/groups", nil)
	wantBody(t, resp, body, http.StatusOK, `{"groups":[]}`)
	gf.infos = []kv.GroupInfo{gf.info, {ID: "a/b c", Leader: ref("c", "k0"), Members: []kv.KeyRef{ref("c", "k0"), {Collection: "d", Key: []byte{0xfe}}},
		Mode: kv.GroupBestEffort, LeaderNode: 3, State: kv.GroupActive, ShipperLag: 12}}
	resp, body = ht.do("GET", "/v1/groups", nil)
	wantBody(t, resp, body, http.StatusOK, `{"groups":[`+info2+`,`+info+`]}`)
	wantCall(t, gf.txnFake, "ListGroups", "", nil)

	resp, body = ht.do("DELETE", "/v1/groups/g1", nil)
	wantBody(t, resp, body, http.StatusOK, `{}`)
	wantCall(t, gf.txnFake, "DeleteGroup", "g1", nil)
	resp, body = ht.do("DELETE", "/v1/groups/%C3%A9t%C3%A9", nil)
	wantBody(t, resp, body, http.StatusOK, `{}`)
	wantCall(t, gf.txnFake, "DeleteGroup", "été", nil)
	gf.errs["DeleteGroup"] = kv.Errorf(kv.CodeNotFound, "no group g9")
	resp, body = ht.do("DELETE", "/v1/groups/g9", nil)
	wantError(t, resp, body, http.StatusNotFound, kv.CodeNotFound)

	n := gf.numCalls()
	for _, tc := range []struct{ method, path, words string }{
		{"DELETE", "/v1/groups/a%07", "control character"},
		{"GET", "/v1/groups/" + strings.Repeat("g", MaxGroupIDSize+1), "group id is"},
		{"GET", "/v1/groups/g1?verbose=1", "unknown query parameter"},
		{"GET", "/v1/groups?limit=3", "unknown query parameter"},
	} {
		resp, body := ht.do(tc.method, tc.path, nil)
		wantError(t, resp, body, http.StatusBadRequest, kv.CodeInvalidArgument, tc.words)
	}
	if gf.numCalls() != n {
		t.Fatalf("bad requests reached the backend: %d calls", gf.numCalls()-n)
	}
}

// TestHTTPGroupTxn checks that a group attempt begins at
// /v1/groups/{id}/txn and is then operated on with the transaction forms.
func TestHTTPGroupTxn(t *testing.T) {
	ht, gf := newGroupTester(t, HTTPConfig{})
	for _, tc := range []struct {
		body string
		want kv.TxnOptions
	}{
		{``, kv.TxnOptions{Isolation: kv.IsolationSerializable}},
		{`{}`, kv.TxnOptions{Isolation: kv.IsolationSerializable}},
		{`{"isolation": "serializable", "retry_of": "g1"}`, kv.TxnOptions{Isolation: kv.IsolationSerializable, RetryOf: "g1"}},
		{`{"read_only": true}`, kv.TxnOptions{Isolation: kv.IsolationSerializable, ReadOnly: true}},
	} {
		n := gf.numCalls()
		resp, body := ht.post("/v1/groups/room%2F7/txn", tc.body)
		wantBody(t, resp, body, http.StatusOK, fmt.Sprintf(`{"txn":"g%d"}`, n+1))
		wantCall(t, gf.txnFake, "BeginGroupTxn", "room/7", tc.want)
	}
	gf.commitV = 9
	resp, body := ht.post("/v1/txn/g1/put", `{"collection": "c", "key": "k", "value": "v"}`)
	wantBody(t, resp, body, http.StatusOK, `{}`)
	wantCall(t, gf.txnFake, "TxnPut", "g1", kv.PutItem{Collection: "c", Key: []byte("k"), Value: []byte("v")})
	resp, body = ht.post("/v1/txn/g1/commit", "")
	wantBody(t, resp, body, http.StatusOK, `{"committed":true,"version":9}`)

	n := gf.numCalls()
	for _, tc := range []struct{ body, words string }{
		{`{"isolation": "snapshot"}`, "serializable"},
		{`{"isolation": "linearizable"}`, "isolation"},
		{`{"priority": 1}`, "unknown field"},
	} {
		resp, body := ht.post("/v1/groups/g1/txn", tc.body)
		wantError(t, resp, body, http.StatusBadRequest, kv.CodeInvalidArgument, tc.words)
	}
	if gf.numCalls() != n {
		t.Fatalf("bad requests reached the backend: %d calls", gf.numCalls()-n)
	}

	gf.errs["BeginGroupTxn"] = kv.Errorf(kv.CodeNotFound, "no group g9")
	resp, body = ht.post("/v1/groups/g9/txn", "")
	wantError(t, resp, body, http.StatusNotFound, kv.CodeNotFound, "no group g9")
}

func TestHTTPGroupExec(t *testing.T) {
	ht, gf := newGroupTester(t, HTTPConfig{MaxTxnOps: 3})
	gf.execRes = kv.ExecResult{Succeeded: true, Version: 42, Results: []kv.TxnOpResult{
		{Version: 42}, {Version: 42}, {Found: true, Value: []byte("..."), Version: 40},
	}}
	resp, body := ht.post("/v1/groups/g1/exec", execBody)
	wantBody(t, resp, body, http.StatusOK, `{"succeeded":true,"version":42,"results":[{"version":42},{"version":42},{"found":true,"value":"...","version":40}]}`)
	wantCall(t, gf.txnFake, "ExecGroupTxn", "g1", kv.ExecRequest{
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
	})

	n := gf.numCalls()
	op := `{"op": "get", "collection": "c", "key": "a"}`
	resp, body = ht.post("/v1/groups/g1/exec", `{}`)
	wantError(t, resp, body, http.StatusBadRequest, kv.CodeInvalidArgument, "no operations")
	resp, body = ht.post("/v1/groups/g1/exec", `{"then": [{"op": "increment", "collection": "c", "key": "a"}]}`)
	wantError(t, resp, body, http.StatusBadRequest, kv.CodeInvalidArgument, `then[0]: op "increment"`)
	resp, body = ht.post("/v1/groups/g1/exec", `{"then": [`+op+`, `+op+`, `+op+`, `+op+`]}`)
	wantError(t, resp, body, http.StatusRequestEntityTooLarge, kv.CodeTooLarge)
	if gf.numCalls() != n {
		t.Fatalf("bad requests reached the backend: %d calls", gf.numCalls()-n)
	}

	gf.errs["ExecGroupTxn"] = kv.Errorf(kv.CodeInvalidArgument, `key "z" of collection "c" is not a member of group g1`)
	resp, body = ht.post("/v1/groups/g1/exec", execBody)
	wantError(t, resp, body, http.StatusBadRequest, kv.CodeInvalidArgument, "not a member")
}

func TestHTTPGroupPaths(t *testing.T) {
	ht, gf := newGroupTester(t, HTTPConfig{})
	for _, p := range []string{"/v1/groups/", "/v1/groups//txn", "/v1/groups/g1/", "/v1/groups/g1/commit", "/v1/groups/g1/txn/x", "/v1/groups/g1/exec/"} {
		resp, body := ht.post(p, `{}`)
		wantError(t, resp, body, http.StatusNotFound, kv.CodeNotFound, "/v1/groups/{id}")
	}
	resp, body := ht.do("GET", "/v1/groupsx", nil)
	wantError(t, resp, body, http.StatusNotFound, kv.CodeNotFound, "/v1/groups[/...]")
	for _, tc := range []struct{ method, path, allow string }{
		{"PUT", "/v1/groups", "GET, HEAD, POST"},
		{"DELETE", "/v1/groups", "GET, HEAD, POST"},
		{"POST", "/v1/groups/g1", "GET, HEAD, DELETE"},
		{"PUT", "/v1/groups/g1", "GET, HEAD, DELETE"},
		{"GET", "/v1/groups/g1/txn", "POST"},
		{"DELETE", "/v1/groups/g1/exec", "POST"},
	} {
		resp, body := ht.do(tc.method, tc.path, nil)
		wantError(t, resp, body, http.StatusMethodNotAllowed, kv.CodeInvalidArgument)
		if got := resp.Header.Get("Allow"); got != tc.allow {
			t.Errorf("%s %s: Allow %q, want %q", tc.method, tc.path, got, tc.allow)
		}
	}
	if n := gf.numCalls(); n != 0 {
		t.Fatalf("the backend was called: %+v", gf.calls)
	}
}

// TestHTTPGroupUnimplemented checks that a backend that is not a
// kv.GroupBackend makes every Key Groups form answer 501.
func TestHTTPGroupUnimplemented(t *testing.T) {
	ht, _ := newTxnTester(t) // transactions, but no groups
	for _, tc := range []struct{ method, path, body string }{
		{"POST", "/v1/groups", `{"id": "g1", "leader": {"collection": "c", "key": "k"}}`},
		{"GET", "/v1/groups", ``},
		{"GET", "/v1/groups/g1", ``},
		{"DELETE", "/v1/groups/g1", ``},
		{"POST", "/v1/groups/g1/txn", ``},
		{"POST", "/v1/groups/g1/exec", execBody},
	} {
		resp, body := ht.do(tc.method, tc.path, strings.NewReader(tc.body))
		wantError(t, resp, body, http.StatusNotImplemented, kv.CodeUnimplemented, "does not serve key groups")
	}
}

func TestHTTPGroupMetrics(t *testing.T) {
	m := NewMetrics(nil)
	ht, gf := newGroupTester(t, HTTPConfig{Metrics: m})
	ht.post("/v1/groups", `{"id": "g1", "leader": {"collection": "c", "key": "k"}}`)
	ht.do("GET", "/v1/groups", nil)
	ht.do("GET", "/v1/groups/g1", nil)
	ht.do("DELETE", "/v1/groups/g1", nil)
	ht.post("/v1/groups/g1/txn", "")
	ht.post("/v1/groups/g1/exec", execBody)
	gf.errs["CreateGroup"] = kv.Errorf(kv.CodeGroupRefused, "locked")
	ht.post("/v1/groups", `{"id": "g1", "leader": {"collection": "c", "key": "k"}}`)
	for _, tc := range []struct {
		op, code string
		want     float64
	}{
		{opGroupCreate, codeOK, 1},
		{opGroupCreate, string(kv.CodeGroupRefused), 1},
		{opGroupList, codeOK, 1},
		{opGroupDescribe, codeOK, 1},
		{opGroupDelete, codeOK, 1},
		{opGroupTxnBegin, codeOK, 1},
		{opGroupTxnExec, codeOK, 1},
	} {
		if got := testutil.ToFloat64(m.requests.WithLabelValues(tc.op, tc.code)); got != tc.want {
			t.Errorf("%s %s = %v, want %v", tc.op, tc.code, got, tc.want)
		}
	}
}
