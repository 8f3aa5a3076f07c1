package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/groupkv/groupkv/internal/kv"
)

// httpFakeBackend is an in-memory kv.Backend for testing the HTTP layer: it
// keeps every version of every key, answers the errors of the kv contract,
// and records the last request of each kind so tests can check what the
// layer passed down.
type httpFakeBackend struct {
	mu             sync.Mutex
	colls          map[string]kv.CollectionInfo
	data           map[string]map[string][]httpFakeVersion // collection → key → versions, oldest first
	lastVersion    uint64
	compactedBelow uint64 // versions below are gone
	nextID         uint32

	ready error // answered by Ready
	fail  error // when set, answered by every data and catalog method

	lastPut    kv.PutRequest
	lastGet    kv.GetRequest
	lastDelete kv.DeleteRequest
	lastMulti  httpFakeMulti

	// A watch emits watchEvents, then ends with watchErrAfter if it is set,
	// else emits what watchCh yields until its context ends. watchDone
	// receives what each Watch returns.
	watchEvents   []kv.Event
	watchErrAfter error
	watchCh       chan kv.Event
	watchDone     chan error
}

// httpFakeMulti holds the last request of each multi-record method, and
// how many multi-record calls were made.
type httpFakeMulti struct {
	calls       int
	batchGet    []kv.KeyRef
	batchPut    []kv.PutItem
	batchDelete []kv.KeyRef
	deleteRange kv.DeleteRangeRequest
	scan        kv.ScanRequest
	tags        kv.TagQuery
	watch       kv.WatchRequest
}

type httpFakeVersion struct {
	version uint64
	value   []byte
	tags    []string
	deleted bool
}

var _ kv.Backend = (*httpFakeBackend)(nil)

func newHTTPFakeBackend() *httpFakeBackend {
	return &httpFakeBackend{
		colls:     map[string]kv.CollectionInfo{},
		data:      map[string]map[string][]httpFakeVersion{},
		watchCh:   make(chan kv.Event),
		watchDone: make(chan error, 16),
	}
}

func (f *httpFakeBackend) CreateCollection(_ context.Context, opts kv.CollectionOptions) (kv.CollectionInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return kv.CollectionInfo{}, f.fail
	}
	if err := kv.ValidateCollectionOptions(&opts); err != nil {
		return kv.CollectionInfo{}, err
	}
	if _, ok := f.colls[opts.Name]; ok {
		return kv.CollectionInfo{}, kv.Errorf(kv.CodeAlreadyExists, "collection %q exists", opts.Name)
	}
	f.nextID++
	info := kv.CollectionInfo{Name: opts.Name, ID: f.nextID, Partitioning: opts.Partitioning, SplitPoints: opts.SplitPoints}
	for i := 0; i < opts.Shards; i++ {
		s := kv.ShardInfo{ID: uint64(100*f.nextID) + uint64(i), Leader: 1}
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
	f.colls[opts.Name] = info
	f.data[opts.Name] = map[string][]httpFakeVersion{}
	return info, nil
}

func (f *httpFakeBackend) ListCollections(context.Context) ([]kv.CollectionInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return nil, f.fail
	}
	var infos []kv.CollectionInfo
	for _, info := range f.colls {
		infos = append(infos, info)
	}
	sort.Slice(infos, func(i, j int) bool { return infos[i].Name < infos[j].Name })
	return infos, nil
}

func (f *httpFakeBackend) DescribeCollection(_ context.Context, name string) (kv.CollectionInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return kv.CollectionInfo{}, f.fail
	}
	info, ok := f.colls[name]
	if !ok {
		return kv.CollectionInfo{}, kv.Errorf(kv.CodeCollectionNotFound, "collection %q does not exist", name)
	}
	return info, nil
}

func (f *httpFakeBackend) DropCollection(_ context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return f.fail
	}
	if _, ok := f.colls[name]; !ok {
		return kv.Errorf(kv.CodeCollectionNotFound, "collection %q does not exist", name)
	}
	delete(f.colls, name)
	delete(f.data, name)
	return nil
}

// current returns the live latest version of key, nil when absent. f.mu is
// held.
func (f *httpFakeBackend) current(coll string, key []byte) (map[string][]httpFakeVersion, *httpFakeVersion, error) {
	keys, ok := f.data[coll]
	if !ok {
		return nil, nil, kv.Errorf(kv.CodeCollectionNotFound, "collection %q does not exist", coll)
	}
	vs := keys[string(key)]
	if len(vs) == 0 || vs[len(vs)-1].deleted {
		return keys, nil, nil
	}
	return keys, &vs[len(vs)-1], nil
}

func checkIfVersion(cur *httpFakeVersion, ifVersion *uint64) error {
	if ifVersion == nil {
		return nil
	}
	var have uint64
	if cur != nil {
		have = cur.version
	}
	if have != *ifVersion {
		return kv.Errorf(kv.CodeConditionFailed, "key is at version %d, not %d", have, *ifVersion)
	}
	return nil
}

func (f *httpFakeBackend) Put(_ context.Context, req kv.PutRequest) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lastPut = req
	if f.fail != nil {
		return 0, f.fail
	}
	keys, cur, err := f.current(req.Collection, req.Key)
	if err != nil {
		return 0, err
	}
	if err := checkIfVersion(cur, req.IfVersion); err != nil {
		return 0, err
	}
	f.lastVersion++
	keys[string(req.Key)] = append(keys[string(req.Key)], httpFakeVersion{version: f.lastVersion, value: req.Value, tags: req.Tags})
	return f.lastVersion, nil
}

func (f *httpFakeBackend) Get(_ context.Context, req kv.GetRequest) (kv.Record, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lastGet = req
	if f.fail != nil {
		return kv.Record{}, f.fail
	}
	keys, cur, err := f.current(req.Collection, req.Key)
	if err != nil {
		return kv.Record{}, err
	}
	if req.Version != 0 {
		if req.Version < f.compactedBelow {
			return kv.Record{}, kv.Errorf(kv.CodeCompacted, "version %d is compacted", req.Version)
		}
		cur = nil
		for i, v := range keys[string(req.Key)] {
			if v.version <= req.Version {
				cur = &keys[string(req.Key)][i]
			}
		}
		if cur != nil && cur.deleted {
			cur = nil
		}
	}
	if cur == nil {
		return kv.Record{}, kv.Errorf(kv.CodeNotFound, "key %q not found", req.Key)
	}
	return kv.Record{Key: req.Key, Value: cur.value, Tags: cur.tags, Version: cur.version}, nil
}

func (f *httpFakeBackend) Delete(_ context.Context, req kv.DeleteRequest) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lastDelete = req
	if f.fail != nil {
		return 0, f.fail
	}
	keys, cur, err := f.current(req.Collection, req.Key)
	if err != nil {
		return 0, err
	}
	if cur == nil {
		return 0, kv.Errorf(kv.CodeNotFound, "key %q not found", req.Key)
	}
	if err := checkIfVersion(cur, req.IfVersion); err != nil {
		return 0, err
	}
	f.lastVersion++
	keys[string(req.Key)] = append(keys[string(req.Key)], httpFakeVersion{version: f.lastVersion, deleted: true})
	return f.lastVersion, nil
}

func (f *httpFakeBackend) Ready() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ready
}

func (f *httpFakeBackend) lastPutReq() kv.PutRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastPut
}

func (f *httpFakeBackend) lastGetReq() kv.GetRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastGet
}

func (f *httpFakeBackend) lastDeleteReq() kv.DeleteRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastDelete
}

// writes is the number of puts and deletes applied.
func (f *httpFakeBackend) writes() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastVersion
}

func (f *httpFakeBackend) splitPoints(coll string) [][]byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.colls[coll].SplitPoints
}

func (f *httpFakeBackend) setFail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail = err
}

func (f *httpFakeBackend) lastMultiReqs() httpFakeMulti {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastMulti
}

// The multi-record part of the fake treats each collection as one shard: a
// batch is applied collection by collection, in the order the collections
// first appear in it, each collection's part at one version.

// visible returns the version of vs a read at version at sees, nil when the
// key is absent then.
func visible(vs []httpFakeVersion, at uint64) *httpFakeVersion {
	var cur *httpFakeVersion
	for i := range vs {
		if vs[i].version <= at {
			cur = &vs[i]
		}
	}
	if cur == nil || cur.deleted {
		return nil
	}
	return cur
}

func collNotFound(coll string) *kv.Error {
	return kv.Errorf(kv.CodeCollectionNotFound, "collection %q does not exist", coll)
}

// partial is the error of a batch that failed with err after applying
// applied.
func partial(applied []kv.WriteResult, err error) error {
	if len(applied) == 0 {
		return err
	}
	return &kv.BatchError{Err: kv.AsError(err), Applied: applied}
}

func (f *httpFakeBackend) BatchGet(_ context.Context, keys []kv.KeyRef) (kv.BatchGetResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lastMulti.calls++
	f.lastMulti.batchGet = keys
	if f.fail != nil {
		return kv.BatchGetResult{}, f.fail
	}
	res := kv.BatchGetResult{Version: f.lastVersion}
	for _, k := range keys {
		data, ok := f.data[k.Collection]
		if !ok {
			return kv.BatchGetResult{}, collNotFound(k.Collection)
		}
		item := kv.BatchGetItem{Collection: k.Collection, Key: k.Key}
		if v := visible(data[string(k.Key)], f.lastVersion); v != nil {
			item.Found, item.Value, item.Tags, item.Version = true, v.value, v.tags, v.version
		}
		res.Items = append(res.Items, item)
	}
	return res, nil
}

// batchWrite applies n records, record i in collection coll(i), with key
// key(i): check(i, cur) fails a collection's part, write(i, cur, version)
// applies record i. It answers the results in request order.
func (f *httpFakeBackend) batchWrite(n int, coll func(int) string, key func(int) []byte,
	check func(int, *httpFakeVersion) error, write func(i int, cur *httpFakeVersion, version uint64)) ([]kv.WriteResult, error) {
	var order []string
	groups := map[string][]int{}
	for i := 0; i < n; i++ {
		if _, ok := groups[coll(i)]; !ok {
			order = append(order, coll(i))
		}
		groups[coll(i)] = append(groups[coll(i)], i)
	}
	results := make([]kv.WriteResult, n)
	var applied []kv.WriteResult
	for _, c := range order {
		if _, ok := f.data[c]; !ok {
			return nil, partial(applied, collNotFound(c))
		}
		for _, i := range groups[c] {
			_, cur, _ := f.current(c, key(i))
			if err := check(i, cur); err != nil {
				return nil, partial(applied, err)
			}
		}
		f.lastVersion++
		for _, i := range groups[c] {
			_, cur, _ := f.current(c, key(i))
			write(i, cur, f.lastVersion)
			results[i] = kv.WriteResult{Collection: c, Key: key(i), Version: f.lastVersion}
			applied = append(applied, results[i])
		}
	}
	return results, nil
}

func (f *httpFakeBackend) BatchPut(_ context.Context, items []kv.PutItem) ([]kv.WriteResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lastMulti.calls++
	f.lastMulti.batchPut = items
	if f.fail != nil {
		return nil, f.fail
	}
	return f.batchWrite(len(items),
		func(i int) string { return items[i].Collection },
		func(i int) []byte { return items[i].Key },
		func(i int, cur *httpFakeVersion) error { return checkIfVersion(cur, items[i].IfVersion) },
		func(i int, _ *httpFakeVersion, version uint64) {
			it := items[i]
			keys := f.data[it.Collection]
			keys[string(it.Key)] = append(keys[string(it.Key)], httpFakeVersion{version: version, value: it.Value, tags: it.Tags})
		})
}

func (f *httpFakeBackend) BatchDelete(_ context.Context, refs []kv.KeyRef) ([]kv.WriteResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lastMulti.calls++
	f.lastMulti.batchDelete = refs
	if f.fail != nil {
		return nil, f.fail
	}
	return f.batchWrite(len(refs),
		func(i int) string { return refs[i].Collection },
		func(i int) []byte { return refs[i].Key },
		func(int, *httpFakeVersion) error { return nil },
		func(i int, cur *httpFakeVersion, version uint64) {
			if cur == nil {
				return // absent: a no-op
			}
			keys := f.data[refs[i].Collection]
			keys[string(refs[i].Key)] = append(keys[string(refs[i].Key)], httpFakeVersion{version: version, deleted: true})
		})
}

// sortedKeys returns the keys of coll in ascending order, or descending.
func (f *httpFakeBackend) sortedKeys(coll string, reverse bool) []string {
	var keys []string
	for k := range f.data[coll] {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if reverse {
		slices.Reverse(keys)
	}
	return keys
}

func inSpan(key string, start, end []byte) bool {
	return key >= string(start) && (len(end) == 0 || key < string(end))
}

func (f *httpFakeBackend) DeleteRange(_ context.Context, req kv.DeleteRangeRequest) (kv.DeleteRangeResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lastMulti.calls++
	f.lastMulti.deleteRange = req
	if f.fail != nil {
		return kv.DeleteRangeResult{}, f.fail
	}
	data, ok := f.data[req.Collection]
	if !ok {
		return kv.DeleteRangeResult{}, collNotFound(req.Collection)
	}
	var n int
	for _, k := range f.sortedKeys(req.Collection, false) {
		if inSpan(k, req.Start, req.End) && visible(data[k], f.lastVersion) != nil {
			if n == 0 {
				f.lastVersion++
			}
			data[k] = append(data[k], httpFakeVersion{version: f.lastVersion, deleted: true})
			n++
		}
	}
	return kv.DeleteRangeResult{Deleted: n}, nil
}

// page reads one page of the records of coll that match, in key order. Its
// page tokens are "p~{version}_{hex of the last key}": URL-safe as they are,
// with characters a client might be tempted to escape.
func (f *httpFakeBackend) page(coll string, limit int, reverse bool, page string, version uint64,
	match func(key string, v *httpFakeVersion) bool) (kv.ScanResult, error) {
	data, ok := f.data[coll]
	if !ok {
		return kv.ScanResult{}, collNotFound(coll)
	}
	if limit == 0 {
		limit = kv.DefaultPageSize
	}
	var after string
	if page != "" {
		vs, hexKey, ok := strings.Cut(strings.TrimPrefix(page, "p~"), "_")
		v, err := strconv.ParseUint(vs, 10, 64)
		k, herr := hex.DecodeString(hexKey)
		if !ok || err != nil || herr != nil || !strings.HasPrefix(page, "p~") {
			return kv.ScanResult{}, kv.Errorf(kv.CodeInvalidArgument, "page %q is not a page token", page)
		}
		version, after = v, string(k)
	}
	switch {
	case version == 0:
		version = f.lastVersion
	case version < f.compactedBelow:
		return kv.ScanResult{}, kv.Errorf(kv.CodeCompacted, "version %d is compacted", version)
	}
	res := kv.ScanResult{Version: version}
	for _, k := range f.sortedKeys(coll, reverse) {
		if page != "" && ((!reverse && k <= after) || (reverse && k >= after)) {
			continue
		}
		v := visible(data[k], version)
		if v == nil || !match(k, v) {
			continue
		}
		if len(res.Items) == limit {
			last := res.Items[len(res.Items)-1].Key
			res.NextPage = fmt.Sprintf("p~%d_%x", version, last)
			break
		}
		res.Items = append(res.Items, kv.Record{Key: []byte(k), Value: v.value, Tags: v.tags, Version: v.version})
	}
	return res, nil
}

func (f *httpFakeBackend) Scan(_ context.Context, req kv.ScanRequest) (kv.ScanResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lastMulti.calls++
	f.lastMulti.scan = req
	if f.fail != nil {
		return kv.ScanResult{}, f.fail
	}
	return f.page(req.Collection, req.Limit, req.Reverse, req.Page, req.Version, func(k string, _ *httpFakeVersion) bool {
		return inSpan(k, req.Start, req.End)
	})
}

func (f *httpFakeBackend) GetByTags(_ context.Context, q kv.TagQuery) (kv.ScanResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lastMulti.calls++
	f.lastMulti.tags = q
	if f.fail != nil {
		return kv.ScanResult{}, f.fail
	}
	return f.page(q.Collection, q.Limit, false, q.Page, q.Version, func(_ string, v *httpFakeVersion) bool {
		for _, t := range q.All {
			if !slices.Contains(v.tags, t) {
				return false
			}
		}
		for _, t := range q.Any {
			if slices.Contains(v.tags, t) {
				return true
			}
		}
		return len(q.Any) == 0
	})
}

func (f *httpFakeBackend) Watch(ctx context.Context, req kv.WatchRequest, fn func(kv.Event) error) (err error) {
	f.mu.Lock()
	f.lastMulti.calls++
	f.lastMulti.watch = req
	fail, events, errAfter, ch := f.fail, f.watchEvents, f.watchErrAfter, f.watchCh
	_, collOK := f.data[req.Collection]
	compacted := req.FromVersion < f.compactedBelow
	f.mu.Unlock()
	defer func() { f.watchDone <- err }()
	switch {
	case fail != nil:
		return fail
	case !collOK:
		return collNotFound(req.Collection)
	case compacted:
		return kv.Errorf(kv.CodeCompacted, "version %d is older than the retention window", req.FromVersion)
	}
	for _, ev := range events {
		if err := fn(ev); err != nil {
			return err
		}
	}
	if errAfter != nil {
		return errAfter
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ev := <-ch:
			if err := fn(ev); err != nil {
				return err
			}
		}
	}
}

// httpTester is a real HTTP server over NewHTTPHandler and a fake backend.
type httpTester struct {
	t   *testing.T
	fb  *httpFakeBackend
	srv *httptest.Server
}

func newHTTPTester(t *testing.T, cfg HTTPConfig) *httpTester {
	t.Helper()
	fb := newHTTPFakeBackend()
	if _, err := fb.CreateCollection(context.Background(), kv.CollectionOptions{Name: "c"}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(NewHTTPHandler(fb, cfg))
	t.Cleanup(srv.Close)
	return &httpTester{t: t, fb: fb, srv: srv}
}

// do sends method on path (escaped as given, query included) with body and
// returns the response with its body read.
func (ht *httpTester) do(method, path string, body io.Reader) (*http.Response, []byte) {
	ht.t.Helper()
	req, err := http.NewRequest(method, ht.srv.URL+path, body)
	if err != nil {
		ht.t.Fatal(err)
	}
	resp, err := ht.srv.Client().Do(req)
	if err != nil {
		ht.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		ht.t.Fatal(err)
	}
	return resp, b
}

// raw sends a request line and headers exactly as given over a fresh TCP
// connection, so nothing between the test and the server rewrites the path.
func (ht *httpTester) raw(method, target string, body []byte) (*http.Response, []byte) {
	ht.t.Helper()
	c, err := net.Dial("tcp", ht.srv.Listener.Addr().String())
	if err != nil {
		ht.t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nConnection: close\r\n\r\n", method, target, len(body))
	c.Write(body)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		ht.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		ht.t.Fatal(err)
	}
	return resp, b
}

// wantStatus fails unless resp has status.
func wantStatus(t *testing.T, resp *http.Response, body []byte, status int) {
	t.Helper()
	if resp.StatusCode != status {
		t.Fatalf("%s %s: status %d, want %d; body %s", resp.Request.Method, resp.Request.URL, resp.StatusCode, status, body)
	}
}

// wantError fails unless resp is an error answer with status and code whose
// message contains each of words, and returns the message.
func wantError(t *testing.T, resp *http.Response, body []byte, status int, code kv.Code, words ...string) string {
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
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		t.Fatalf("error body %q is not {\"error\": {\"code\", \"message\"}}: %v", body, err)
	}
	if e.Error.Code != code {
		t.Errorf("error code %q, want %q (message %q)", e.Error.Code, code, e.Error.Message)
	}
	if e.Error.Message == "" {
		t.Errorf("error %q has no message", code)
	}
	for _, w := range words {
		if !strings.Contains(e.Error.Message, w) {
			t.Errorf("error message %q does not mention %q", e.Error.Message, w)
		}
	}
	return e.Error.Message
}

// wantJSON decodes body, which must be JSON, into a generic map or slice.
func wantJSON(t *testing.T, resp *http.Response, body []byte) map[string]any {
	t.Helper()
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("body %q is not a JSON object: %v", body, err)
	}
	return m
}

func wantVersion(t *testing.T, resp *http.Response, body []byte, version uint64) {
	t.Helper()
	wantStatus(t, resp, body, http.StatusOK)
	m := wantJSON(t, resp, body)
	if len(m) != 1 || m["version"] != float64(version) {
		t.Fatalf("body %s, want {\"version\": %d}", body, version)
	}
}

func TestHTTPPutGetDelete(t *testing.T) {
	ht := newHTTPTester(t, HTTPConfig{})

	resp, body := ht.do("PUT", "/v1/kv/c/k?tags=a,b", strings.NewReader("hello"))
	wantVersion(t, resp, body, 1)
	if got := ht.fb.lastPutReq(); string(got.Key) != "k" || string(got.Value) != "hello" || !slices.Equal(got.Tags, []string{"a", "b"}) || got.IfVersion != nil {
		t.Fatalf("backend got %+v", got)
	}

	resp, body = ht.do("GET", "/v1/kv/c/k", nil)
	wantStatus(t, resp, body, http.StatusOK)
	if string(body) != "hello" {
		t.Fatalf("value %q, want hello", body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/octet-stream" {
		t.Errorf("Content-Type %q, want application/octet-stream", ct)
	}
	if v := resp.Header.Get("Groupkv-Version"); v != "1" {
		t.Errorf("Groupkv-Version %q, want 1", v)
	}
	if tags := resp.Header.Get("Groupkv-Tags"); tags != "a,b" {
		t.Errorf("Groupkv-Tags %q, want a,b", tags)
	}

	// No tags: the header is present and empty; an empty tags parameter
	// means no tags.
	for i, path := range []string{"/v1/kv/c/k", "/v1/kv/c/k?tags="} {
		resp, body = ht.do("PUT", path, strings.NewReader("v2"))
		wantVersion(t, resp, body, uint64(2+i))
		if ht.fb.lastPutReq().Tags != nil {
			t.Errorf("%s: backend got tags %q, want none", path, ht.fb.lastPutReq().Tags)
		}
		resp, body = ht.do("GET", "/v1/kv/c/k", nil)
		wantStatus(t, resp, body, http.StatusOK)
		if tags, ok := resp.Header["Groupkv-Tags"]; !ok || len(tags) != 1 || tags[0] != "" {
			t.Errorf("Groupkv-Tags %q (present %v), want present and empty", tags, ok)
		}
	}

	// An empty value is a value.
	resp, body = ht.do("PUT", "/v1/kv/c/empty", nil)
	wantVersion(t, resp, body, 4)
	resp, body = ht.do("GET", "/v1/kv/c/empty", nil)
	wantStatus(t, resp, body, http.StatusOK)
	if len(body) != 0 || resp.Header.Get("Groupkv-Version") != "4" {
		t.Fatalf("empty value: body %q, version %q", body, resp.Header.Get("Groupkv-Version"))
	}

	// HEAD: the headers of GET without the value.
	resp, body = ht.do("HEAD", "/v1/kv/c/k", nil)
	wantStatus(t, resp, body, http.StatusOK)
	if len(body) != 0 || resp.Header.Get("Groupkv-Version") != "3" || resp.ContentLength != 2 {
		t.Fatalf("HEAD: body %q, version %q, length %d", body, resp.Header.Get("Groupkv-Version"), resp.ContentLength)
	}

	resp, body = ht.do("DELETE", "/v1/kv/c/k", nil)
	wantVersion(t, resp, body, 5)
	resp, body = ht.do("GET", "/v1/kv/c/k", nil)
	wantError(t, resp, body, http.StatusNotFound, kv.CodeNotFound)
	resp, body = ht.do("DELETE", "/v1/kv/c/k", nil)
	wantError(t, resp, body, http.StatusNotFound, kv.CodeNotFound)

	resp, body = ht.do("GET", "/v1/kv/nope/k", nil)
	wantError(t, resp, body, http.StatusNotFound, kv.CodeCollectionNotFound)
}

func TestHTTPKeyEscaping(t *testing.T) {
	ht := newHTTPTester(t, HTTPConfig{})
	for _, tc := range []struct {
		path string // after /v1/kv/c/
		key  string
	}{
		{"plain", "plain"},
		{"a/b", "a/b"},
		{"a%2Fb", "a/b"},
		{"a%2fb", "a/b"},
		{"a%20b", "a b"},
		{"a+b", "a+b"},
		{"a/../b", "a/../b"},
		{"../x", "../x"},
		{"..", ".."},
		{".", "."},
		{"%2E%2E/%2E%2E", "../.."},
		{"a//b", "a//b"},
		{"/a", "/a"},
		{"a/", "a/"},
		{"a%3Fb%23c", "a?b#c"},
		{"%25", "%"},
		{"%FF%00", "\xff\x00"},
		{"caf%C3%A9", "café"},
	} {
		for _, send := range []string{"client", "raw"} {
			value := []byte("value of " + tc.key)
			var resp *http.Response
			var body []byte
			if send == "client" {
				resp, body = ht.do("PUT", "/v1/kv/c/"+tc.path, bytes.NewReader(value))
			} else {
				resp, body = ht.raw("PUT", "/v1/kv/c/"+tc.path, value)
			}
			wantStatus(t, resp, body, http.StatusOK)
			if got := string(ht.fb.lastPutReq().Key); got != tc.key {
				t.Errorf("%s PUT %s: key %q, want %q", send, tc.path, got, tc.key)
			}
			if send == "client" {
				resp, body = ht.do("GET", "/v1/kv/c/"+tc.path, nil)
			} else {
				resp, body = ht.raw("GET", "/v1/kv/c/"+tc.path, nil)
			}
			wantStatus(t, resp, body, http.StatusOK)
			if got := string(ht.fb.lastGetReq().Key); got != tc.key || !bytes.Equal(body, value) {
				t.Errorf("%s GET %s: key %q value %q, want %q %q", send, tc.path, got, body, tc.key, value)
			}
		}
	}

	// The collection segment is escaped too.
	resp, body := ht.do("PUT", "/v1/kv/%63/k", strings.NewReader("x"))
	wantStatus(t, resp, body, http.StatusOK)
	if ht.fb.lastPutReq().Collection != "c" {
		t.Errorf("collection %q, want c", ht.fb.lastPutReq().Collection)
	}
	// An escaped slash does not end the collection.
	resp, body = ht.raw("PUT", "/v1/kv/c%2Fd/k", []byte("x"))
	wantError(t, resp, body, http.StatusBadRequest, kv.CodeInvalidArgument, "c/d")
}

func TestHTTPBadPaths(t *testing.T) {
	ht := newHTTPTester(t, HTTPConfig{})
	for _, tc := range []struct {
		method, path string
		status       int
		code         kv.Code
		words        []string
	}{
		{"GET", "/v1/kv", 400, kv.CodeInvalidArgument, []string{"no collection"}},
		{"GET", "/v1/kv/", 400, kv.CodeInvalidArgument, []string{"no collection"}},
		{"PUT", "/v1/kv//k", 400, kv.CodeInvalidArgument, []string{"no collection"}},
		{"GET", "/v1/kv/c", 400, kv.CodeInvalidArgument, []string{"no key"}},
		{"PUT", "/v1/kv/c/", 400, kv.CodeInvalidArgument, []string{"no key"}},
		{"DELETE", "/v1/kv/c/", 400, kv.CodeInvalidArgument, []string{"no key"}},
		{"GET", "/v1/kv/Bad/k", 400, kv.CodeInvalidArgument, []string{"Bad"}},
		{"GET", "/v1/kvx", 404, kv.CodeNotFound, []string{"unknown path", "/v1/kvx"}},
		{"GET", "/", 404, kv.CodeNotFound, []string{"unknown path"}},
		{"GET", "/v1/nope", 404, kv.CodeNotFound, []string{"unknown path"}},
		{"GET", "/v1/collections/c/shards", 404, kv.CodeNotFound, []string{"unknown path"}},
		{"GET", "/healthz/", 404, kv.CodeNotFound, []string{"unknown path"}},
		{"GET", "/v1/collections/BAD", 400, kv.CodeInvalidArgument, []string{"BAD"}},
		{"GET", "/v1/collections/", 400, kv.CodeInvalidArgument, []string{"collection name"}},
	} {
		resp, body := ht.raw(tc.method, tc.path, nil)
		wantError(t, resp, body, tc.status, tc.code, tc.words...)
		if resp.StatusCode/100 == 3 || resp.Header.Get("Location") != "" {
			t.Errorf("%s %s redirected", tc.method, tc.path)
		}
	}

	// A key over the limit.
	long := strings.Repeat("k", kv.MaxKeySize+1)
	resp, body := ht.do("PUT", "/v1/kv/c/"+long, strings.NewReader("x"))
	wantError(t, resp, body, http.StatusRequestEntityTooLarge, kv.CodeTooLarge, "key")
	resp, body = ht.do("PUT", "/v1/kv/c/"+long[1:], strings.NewReader("x"))
	wantStatus(t, resp, body, http.StatusOK)
}

func TestHTTPMethodNotAllowed(t *testing.T) {
	ht := newHTTPTester(t, HTTPConfig{})
	for _, tc := range []struct{ method, path, allow string }{
		{"POST", "/v1/kv/c/k", "GET, HEAD, PUT, DELETE"},
		{"PATCH", "/v1/kv/c/k", "GET, HEAD, PUT, DELETE"},
		{"PUT", "/v1/collections", "GET, HEAD, POST"},
		{"DELETE", "/v1/collections", "GET, HEAD, POST"},
		{"POST", "/v1/collections/c", "GET, HEAD, DELETE"},
		{"PUT", "/v1/collections/c", "GET, HEAD, DELETE"},
		{"POST", "/healthz", "GET, HEAD"},
	} {
		resp, body := ht.do(tc.method, tc.path, nil)
		wantError(t, resp, body, http.StatusMethodNotAllowed, kv.CodeInvalidArgument, tc.method, tc.allow)
		if got := resp.Header.Get("Allow"); got != tc.allow {
			t.Errorf("%s %s: Allow %q, want %q", tc.method, tc.path, got, tc.allow)
		}
	}
}

func TestHTTPConditional(t *testing.T) {
	ht := newHTTPTester(t, HTTPConfig{})
	resp, body := ht.do("PUT", "/v1/kv/c/k?if_version=0", strings.NewReader("v1"))
	wantVersion(t, resp, body, 1)
	if ifv := ht.fb.lastPutReq().IfVersion; ifv == nil || *ifv != 0 {
		t.Fatalf("backend got IfVersion %v, want 0", ifv)
	}
	resp, body = ht.do("PUT", "/v1/kv/c/k?if_version=0", strings.NewReader("again"))
	wantError(t, resp, body, http.StatusPreconditionFailed, kv.CodeConditionFailed)
	resp, body = ht.do("PUT", "/v1/kv/c/k?if_version=7", strings.NewReader("v2"))
	wantError(t, resp, body, http.StatusPreconditionFailed, kv.CodeConditionFailed)
	resp, body = ht.do("PUT", "/v1/kv/c/k?tags=t&if_version=1", strings.NewReader("v2"))
	wantVersion(t, resp, body, 2)

	resp, body = ht.do("DELETE", "/v1/kv/c/k?if_version=1", nil)
	wantError(t, resp, body, http.StatusPreconditionFailed, kv.CodeConditionFailed)
	resp, body = ht.do("DELETE", "/v1/kv/c/k?if_version=2", nil)
	wantVersion(t, resp, body, 3)
	if ifv := ht.fb.lastDeleteReq().IfVersion; ifv == nil || *ifv != 2 {
		t.Fatalf("backend got IfVersion %v, want 2", ifv)
	}
}

func TestHTTPReadAsOfVersion(t *testing.T) {
	ht := newHTTPTester(t, HTTPConfig{})
	for i := 1; i <= 3; i++ {
		resp, body := ht.do("PUT", "/v1/kv/c/k", strings.NewReader(fmt.Sprint("v", i)))
		wantVersion(t, resp, body, uint64(i))
	}
	resp, body := ht.do("GET", "/v1/kv/c/k?version=2", nil)
	wantStatus(t, resp, body, http.StatusOK)
	if string(body) != "v2" || resp.Header.Get("Groupkv-Version") != "2" || ht.fb.lastGetReq().Version != 2 {
		t.Fatalf("as of 2: %q version %q", body, resp.Header.Get("Groupkv-Version"))
	}
	ht.fb.mu.Lock()
	ht.fb.compactedBelow = 2
	ht.fb.mu.Unlock()
	resp, body = ht.do("GET", "/v1/kv/c/k?version=1", nil)
	wantError(t, resp, body, http.StatusGone, kv.CodeCompacted)
}

func TestHTTPBadQuery(t *testing.T) {
	ht := newHTTPTester(t, HTTPConfig{})
	tooMany := make([]string, kv.MaxTags+1)
	for i := range tooMany {
		tooMany[i] = fmt.Sprint("t", i)
	}
	for _, tc := range []struct {
		method, path string
		words        []string
	}{
		{"PUT", "/v1/kv/c/k?if_version=abc", []string{"if_version", "abc"}},
		{"PUT", "/v1/kv/c/k?if_version=-1", []string{"if_version", "-1"}},
		{"PUT", "/v1/kv/c/k?if_version=", []string{"if_version"}},
		{"PUT", "/v1/kv/c/k?if_version=18446744073709551616", []string{"if_version"}},
		{"DELETE", "/v1/kv/c/k?if_version=1.5", []string{"if_version", "1.5"}},
		{"GET", "/v1/kv/c/k?version=-1", []string{"version", "-1"}},
		{"GET", "/v1/kv/c/k?version=abc", []string{"version", "abc"}},
		{"GET", "/v1/kv/c/k?version=0", []string{"version", "omit it"}},
		{"PUT", "/v1/kv/c/k?ifversion=1", []string{"unknown query parameter", "ifversion", "if_version"}},
		{"GET", "/v1/kv/c/k?tags=a", []string{"unknown query parameter", "tags"}},
		{"GET", "/v1/kv/c/k?if_version=1", []string{"unknown query parameter", "if_version"}},
		{"PUT", "/v1/kv/c/k?if_version=1&if_version=2", []string{"if_version", "2 times"}},
		{"PUT", "/v1/kv/c/k?tags=a,,b", []string{"empty"}},
		{"PUT", "/v1/kv/c/k?tags=a,a", []string{"twice"}},
		{"PUT", "/v1/kv/c/k?tags=a%01", []string{"control"}},
		{"PUT", "/v1/kv/c/k?tags=" + strings.Join(tooMany, ","), []string{"65 tags"}},
		{"PUT", "/v1/kv/c/k?tags=" + strings.Repeat("t", kv.MaxTagSize+1), []string{"257 bytes"}},
		{"PUT", "/v1/kv/c/k?a=%zz", []string{"query string is malformed"}},
		{"GET", "/v1/collections?x=1", []string{"unknown query parameter", "x"}},
	} {
		resp, body := ht.raw(tc.method, tc.path, nil)
		wantError(t, resp, body, http.StatusBadRequest, kv.CodeInvalidArgument, tc.words...)
	}
	if ht.fb.writes() != 0 {
		t.Fatalf("a bad request reached the backend: %d writes", ht.fb.writes())
	}
	// The limits themselves are fine.
	resp, body := ht.do("PUT", "/v1/kv/c/k?tags="+strings.Join(tooMany[:kv.MaxTags], ","), strings.NewReader("x"))
	wantVersion(t, resp, body, 1)
	if len(ht.fb.lastPutReq().Tags) != kv.MaxTags {
		t.Fatalf("backend got %d tags", len(ht.fb.lastPutReq().Tags))
	}
	// A tag with a space and an escaped '+' and non-ASCII text.
	resp, body = ht.do("PUT", "/v1/kv/c/k?tags=a+b,c%2Bd,%C3%A9t%C3%A9", strings.NewReader("x"))
	wantVersion(t, resp, body, 2)
	resp, body = ht.do("GET", "/v1/kv/c/k", nil)
	wantStatus(t, resp, body, http.StatusOK)
	if got := resp.Header.Get("Groupkv-Tags"); got != "a b,c+d,été" {
		t.Fatalf("Groupkv-Tags %q", got)
	}
}

// countingReader yields endless bytes and counts them.
type countingReader struct{ n int }

func (r *countingReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	r.n += len(p)
	return len(p), nil
}

func TestHTTPValueLimit(t *testing.T) {
	const limit = 10
	ht := newHTTPTester(t, HTTPConfig{MaxValueSize: limit})

	resp, body := ht.do("PUT", "/v1/kv/c/k", strings.NewReader(strings.Repeat("v", limit)))
	wantVersion(t, resp, body, 1)
	resp, body = ht.do("PUT", "/v1/kv/c/k", strings.NewReader(strings.Repeat("v", limit+1)))
	wantError(t, resp, body, http.StatusRequestEntityTooLarge, kv.CodeTooLarge, "10")
	// Without a Content-Length (chunked), the body is cut at the limit too.
	resp, body = ht.do("PUT", "/v1/kv/c/k", io.MultiReader(strings.NewReader(strings.Repeat("v", limit+1))))
	wantError(t, resp, body, http.StatusRequestEntityTooLarge, kv.CodeTooLarge)
	resp, body = ht.do("PUT", "/v1/kv/c/k", io.MultiReader(strings.NewReader(strings.Repeat("v", limit))))
	wantVersion(t, resp, body, 2)

	// The handler reads at most limit+1 bytes of an endless body, and none
	// of a body whose Content-Length is over the limit.
	h := NewHTTPHandler(ht.fb, HTTPConfig{MaxValueSize: limit})
	for _, length := range []int64{-1, 1 << 40} {
		cr := &countingReader{}
		req := httptest.NewRequest("PUT", "/v1/kv/c/k", cr)
		req.ContentLength = length
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		wantError(t, rec.Result(), rec.Body.Bytes(), http.StatusRequestEntityTooLarge, kv.CodeTooLarge)
		if max := limit + 1; cr.n > max || (length > limit && cr.n != 0) {
			t.Errorf("Content-Length %d: read %d bytes of the body", length, cr.n)
		}
	}

	// The default limit is kv.DefaultMaxValueSize.
	ht = newHTTPTester(t, HTTPConfig{})
	resp, body = ht.do("PUT", "/v1/kv/c/k", bytes.NewReader(make([]byte, kv.DefaultMaxValueSize)))
	wantVersion(t, resp, body, 1)
	resp, body = ht.do("PUT", "/v1/kv/c/k", bytes.NewReader(make([]byte, kv.DefaultMaxValueSize+1)))
	wantError(t, resp, body, http.StatusRequestEntityTooLarge, kv.CodeTooLarge)
}

func TestHTTPCollections(t *testing.T) {
	ht := newHTTPTester(t, HTTPConfig{})
	ht.fb.DropCollection(context.Background(), "c")

	resp, body := ht.do("GET", "/v1/collections", nil)
	wantStatus(t, resp, body, http.StatusOK)
	if got := strings.TrimSpace(string(body)); got != `{"collections":[]}` {
		t.Fatalf("empty list: %s", got)
	}

	resp, body = ht.do("POST", "/v1/collections", strings.NewReader(`{"name": "users", "partitioning": "hash", "shards": 2}`))
	wantStatus(t, resp, body, http.StatusOK)
	m := wantJSON(t, resp, body)
	if m["name"] != "users" || m["partitioning"] != "hash" || m["id"] != float64(2) {
		t.Fatalf("create hash: %s", body)
	}
	shards := m["shards"].([]any)
	if len(shards) != 2 {
		t.Fatalf("create hash: %d shards: %s", len(shards), body)
	}
	s0 := shards[0].(map[string]any)
	if s0["id"] != float64(200) || s0["bucket_start"] != float64(0) || s0["bucket_end"] != float64(kv.NumBuckets/2) || s0["leader"] != float64(1) {
		t.Fatalf("hash shard 0: %v", s0)
	}
	if _, ok := s0["start"]; ok {
		t.Fatalf("hash shard has a start: %v", s0)
	}

	resp, body = ht.do("POST", "/v1/collections", strings.NewReader(`{"name": "events", "partitioning": "range", "split_points": ["a", "m"]}`))
	wantStatus(t, resp, body, http.StatusOK)
	want := `{"name":"events","id":3,"partitioning":"range","split_points":["a","m"],"shards":[` +
		`{"id":300,"start":"","end":"a","leader":1},{"id":301,"start":"a","end":"m","leader":1},{"id":302,"start":"m","end":"","leader":1}]}`
	if got := strings.TrimSpace(string(body)); got != want {
		t.Fatalf("create range:\n got %s\nwant %s", got, want)
	}
	if sp := ht.fb.splitPoints("events"); len(sp) != 2 || string(sp[0]) != "a" || string(sp[1]) != "m" {
		t.Fatalf("backend got split points %q", sp)
	}

	// Split points that are not UTF-8 travel in base64.
	resp, body = ht.do("POST", "/v1/collections", strings.NewReader(`{"name": "bin", "partitioning": "range", "split_points_base64": ["/w==", "/wA="]}`))
	wantStatus(t, resp, body, http.StatusOK)
	var bin struct {
		SplitPoints       []string `json:"split_points"`
		SplitPointsBase64 []string `json:"split_points_base64"`
		Shards            []struct {
			StartBase64 *string `json:"start_base64"`
		} `json:"shards"`
	}
	if err := json.Unmarshal(body, &bin); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(bin.SplitPointsBase64, []string{"/w==", "/wA="}) || len(bin.SplitPoints) != 2 ||
		bin.Shards[0].StartBase64 != nil || bin.Shards[1].StartBase64 == nil || *bin.Shards[1].StartBase64 != "/w==" {
		t.Fatalf("binary split points: %s", body)
	}
	if sp := ht.fb.splitPoints("bin"); string(sp[0]) != "\xff" || string(sp[1]) != "\xff\x00" {
		t.Fatalf("backend got split points %q", sp)
	}

	resp, body = ht.do("POST", "/v1/collections", strings.NewReader(`{"name": "users"}`))
	wantError(t, resp, body, http.StatusConflict, kv.CodeAlreadyExists)

	resp, body = ht.do("GET", "/v1/collections", nil)
	wantStatus(t, resp, body, http.StatusOK)
	var list struct {
		Collections []struct {
			Name string `json:"name"`
		} `json:"collections"`
	}
	if err := json.Unmarshal(body, &list); err != nil || len(list.Collections) != 3 || list.Collections[2].Name != "users" {
		t.Fatalf("list: %s (%v)", body, err)
	}

	resp, body = ht.do("GET", "/v1/collections/users", nil)
	wantStatus(t, resp, body, http.StatusOK)
	if m := wantJSON(t, resp, body); m["name"] != "users" || len(m["shards"].([]any)) != 2 {
		t.Fatalf("describe: %s", body)
	}
	resp, body = ht.do("GET", "/v1/collections/nope", nil)
	wantError(t, resp, body, http.StatusNotFound, kv.CodeCollectionNotFound)

	resp, body = ht.do("DELETE", "/v1/collections/users", nil)
	wantStatus(t, resp, body, http.StatusOK)
	if got := strings.TrimSpace(string(body)); got != "{}" {
		t.Fatalf("drop: %s", got)
	}
	resp, body = ht.do("DELETE", "/v1/collections/users", nil)
	wantError(t, resp, body, http.StatusNotFound, kv.CodeCollectionNotFound)
	resp, body = ht.do("GET", "/v1/collections/users", nil)
	wantError(t, resp, body, http.StatusNotFound, kv.CodeCollectionNotFound)
}

func TestHTTPCreateCollectionBadBody(t *testing.T) {
	ht := newHTTPTester(t, HTTPConfig{MaxBodySize: 100})
	for _, tc := range []struct {
		body   string
		status int
		code   kv.Code
		words  []string
	}{
		{``, 400, kv.CodeInvalidArgument, []string{"empty"}},
		{`{`, 400, kv.CodeInvalidArgument, []string{"middle"}},
		{`{"name": }`, 400, kv.CodeInvalidArgument, []string{"not valid JSON", "byte"}},
		{`{"name": "x", "bogus": 1}`, 400, kv.CodeInvalidArgument, []string{"unknown field", "bogus", "split_points"}},
		{`{"name": 5}`, 400, kv.CodeInvalidArgument, []string{"name", "string", "number"}},
		{`{"name": "x", "shards": "8"}`, 400, kv.CodeInvalidArgument, []string{"shards", "integer"}},
		{`{"name": "x", "shards": 1.5}`, 400, kv.CodeInvalidArgument, []string{"shards"}},
		{`{"name": "x", "split_points": "a"}`, 400, kv.CodeInvalidArgument, []string{"split_points", "array"}},
		{`["x"]`, 400, kv.CodeInvalidArgument, []string{"JSON object", "array"}},
		{`{"name": "x"} {"name": "y"}`, 400, kv.CodeInvalidArgument, []string{"more than one"}},
		{`{"name": "x"} x`, 400, kv.CodeInvalidArgument, []string{"not valid JSON"}},
		{`{"name": "Bad"}`, 400, kv.CodeInvalidArgument, []string{"Bad"}},
		{`{"name": "x", "partitioning": "zorder"}`, 400, kv.CodeInvalidArgument, []string{"zorder"}},
		{`{"name": "x", "shards": -1}`, 400, kv.CodeInvalidArgument, []string{"shards"}},
		{`{"name": "x", "split_points": ["a"]}`, 400, kv.CodeInvalidArgument, []string{"range"}},
		{`{"name": "x", "partitioning": "range", "split_points": ["m", "a"]}`, 400, kv.CodeInvalidArgument, []string{"increasing"}},
		{`{"name": "x", "split_points": ["a"], "split_points_base64": ["YQ=="]}`, 400, kv.CodeInvalidArgument, []string{"not both"}},
		{`{"name": "x", "partitioning": "range", "split_points_base64": ["!"]}`, 400, kv.CodeInvalidArgument, []string{"split_points_base64[0]", "base64"}},
		{`{"name": "x", "partitioning": "range", "split_points": ["` + strings.Repeat("a", 100) + `"]}`, 413, kv.CodeTooLarge, []string{"100"}},
	} {
		for _, chunked := range []bool{false, true} {
			var r io.Reader = strings.NewReader(tc.body)
			if chunked {
				r = io.MultiReader(r)
			}
			resp, body := ht.do("POST", "/v1/collections", r)
			wantError(t, resp, body, tc.status, tc.code, tc.words...)
		}
	}
	if infos, _ := ht.fb.ListCollections(context.Background()); len(infos) != 1 {
		t.Fatalf("a bad request created a collection: %v", infos)
	}
}

func TestHTTPHealth(t *testing.T) {
	ht := newHTTPTester(t, HTTPConfig{})
	resp, body := ht.do("GET", "/healthz", nil)
	wantStatus(t, resp, body, http.StatusOK)
	if got := strings.TrimSpace(string(body)); got != `{"status":"ok"}` {
		t.Fatalf("healthz: %s", got)
	}
	for _, err := range []error{
		kv.Errorf(kv.CodeUnavailable, "shard 3 has no leader"),
		errors.New("shard 3 has no leader"),
		kv.Errorf(kv.CodeInternal, "shard 3 has no leader"),
	} {
		ht.fb.mu.Lock()
		ht.fb.ready = err
		ht.fb.mu.Unlock()
		resp, body = ht.do("GET", "/healthz", nil)
		wantError(t, resp, body, http.StatusServiceUnavailable, kv.CodeUnavailable, "shard 3 has no leader")
	}
}

func TestHTTPMetricsEndpoint(t *testing.T) {
	ht := newHTTPTester(t, HTTPConfig{})
	resp, body := ht.do("GET", "/metrics", nil)
	wantError(t, resp, body, http.StatusNotFound, kv.CodeNotFound, "metrics")

	ht = newHTTPTester(t, HTTPConfig{Extra: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "# metrics\n")
	})})
	resp, body = ht.do("GET", "/metrics", nil)
	wantStatus(t, resp, body, http.StatusOK)
	if string(body) != "# metrics\n" {
		t.Fatalf("metrics: %q", body)
	}
}

func TestHTTPBackendErrors(t *testing.T) {
	ht := newHTTPTester(t, HTTPConfig{})
	for _, tc := range []struct {
		err    error
		status int
		code   kv.Code
	}{
		{kv.Errorf(kv.CodeInvalidArgument, "m"), 400, kv.CodeInvalidArgument},
		{kv.Errorf(kv.CodeNotFound, "m"), 404, kv.CodeNotFound},
		{kv.Errorf(kv.CodeCollectionNotFound, "m"), 404, kv.CodeCollectionNotFound},
		{kv.Errorf(kv.CodeAlreadyExists, "m"), 409, kv.CodeAlreadyExists},
		{kv.Errorf(kv.CodeTxnAborted, "m"), 409, kv.CodeTxnAborted},
		{kv.Errorf(kv.CodeKeyInGroup, "m"), 409, kv.CodeKeyInGroup},
		{kv.Errorf(kv.CodePlacementTagChanged, "m"), 409, kv.CodePlacementTagChanged},
		{kv.Errorf(kv.CodeCompacted, "m"), 410, kv.CodeCompacted},
		{kv.Errorf(kv.CodeConditionFailed, "m"), 412, kv.CodeConditionFailed},
		{kv.Errorf(kv.CodeTooLarge, "m"), 413, kv.CodeTooLarge},
		{kv.Errorf(kv.CodeUnavailable, "m"), 503, kv.CodeUnavailable},
		{kv.Errorf(kv.CodeCommitUnknown, "m"), 503, kv.CodeCommitUnknown},
		{kv.Errorf(kv.CodeInternal, "m"), 500, kv.CodeInternal},
		{fmt.Errorf("proposing: %w", kv.Errorf(kv.CodeCommitUnknown, "m")), 503, kv.CodeCommitUnknown},
		{errors.New("disk on fire"), 500, kv.CodeInternal},
		{context.Canceled, 503, kv.CodeUnavailable},
		{fmt.Errorf("waiting: %w", context.DeadlineExceeded), 503, kv.CodeUnavailable},
	} {
		ht.fb.setFail(tc.err)
		for _, req := range []struct{ method, path, body string }{
			{"PUT", "/v1/kv/c/k", "v"},
			{"GET", "/v1/kv/c/k", ""},
			{"DELETE", "/v1/kv/c/k", ""},
			{"POST", "/v1/collections", `{"name": "x"}`},
			{"GET", "/v1/collections", ""},
			{"GET", "/v1/collections/x", ""},
			{"DELETE", "/v1/collections/x", ""},
		} {
			resp, body := ht.do(req.method, req.path, strings.NewReader(req.body))
			wantError(t, resp, body, tc.status, tc.code)
		}
	}
}

func TestHTTPMetricsObserved(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	ht := newHTTPTester(t, HTTPConfig{Metrics: m})
	ht.do("PUT", "/v1/kv/c/k", strings.NewReader("v"))
	ht.do("PUT", "/v1/kv/c/k?if_version=9", strings.NewReader("v"))
	ht.do("GET", "/v1/kv/c/k", nil)
	ht.do("GET", "/v1/kv/c/nope", nil)
	ht.do("DELETE", "/v1/kv/c/k", nil)
	ht.do("POST", "/v1/collections", strings.NewReader(`{"name": "d"}`))
	ht.do("GET", "/v1/collections", nil)
	ht.do("GET", "/v1/collections/d", nil)
	ht.do("DELETE", "/v1/collections/d", nil)
	ht.do("GET", "/healthz", nil)
	ht.do("GET", "/nope", nil)
	ht.do("POST", "/v1/kv/c/k", nil)

	for _, tc := range []struct {
		op, code string
		n        float64
	}{
		{"put", "ok", 1},
		{"put", "condition_failed", 1},
		{"get", "ok", 1},
		{"get", "not_found", 1},
		{"delete", "ok", 1},
		{"create_collection", "ok", 1},
		{"list_collections", "ok", 1},
		{"describe_collection", "ok", 1},
		{"drop_collection", "ok", 1},
		{"ready", "ok", 1},
		{"unknown", "not_found", 1},
		{"unknown", "invalid_argument", 1},
	} {
		if got := testutil.ToFloat64(m.requests.WithLabelValues(tc.op, tc.code)); got != tc.n {
			t.Errorf("groupkv_requests_total{op=%q,code=%q} = %v, want %v", tc.op, tc.code, got, tc.n)
		}
	}
	if n := testutil.CollectAndCount(m.duration, "groupkv_request_duration_seconds"); n != 9 {
		t.Errorf("%d duration series, want 9 (one per op)", n)
	}

	// A second Metrics on the same registry shares the series.
	m2 := NewMetrics(reg)
	m2.Observe("put", "", 0.001)
	if got := testutil.ToFloat64(m.requests.WithLabelValues("put", "ok")); got != 2 {
		t.Errorf("after a second NewMetrics: %v, want 2", got)
	}
	// A nil Metrics records nothing and does not panic.
	var nilMetrics *Metrics
	nilMetrics.Observe("put", "", 1)
	NewMetrics(nil).Observe("put", kv.CodeInternal, 1)
}
