package api_test

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	groupkv "github.com/groupkv/groupkv"
	"github.com/groupkv/groupkv/internal/api"
	"github.com/groupkv/groupkv/internal/kv"
	pb "github.com/groupkv/groupkv/proto/groupkvpb"
)

// grpcFake is an in-memory kv.Backend for testing the gRPC layer only: it
// keeps every version of every key and validates input with the kv package,
// so that what the client sends and what the server answers can be checked
// end to end. Two collections behave specially:
//   - "fail": every record call fails with the error named by its key (see
//     grpcFakeErr); a batch write fails at its first record of "fail",
//     with a *kv.BatchError listing the records before it if there are
//     any; DeleteRange, Scan and Watch fail with the error named by Start,
//     GetByTags with the error named by its first All tag;
//   - "block": Put and Get signal on blocked and wait for their context.
//
// The multi-record methods are as simple as can be: a batch write gives all
// its records one version, a scan page token is the last key read, and a
// watch replays the stored versions and then waits for writes.
type grpcFake struct {
	blocked chan struct{} // one send per blocked call

	mu struct {
		sync.Mutex
		ready   error
		nextID  uint32
		version uint64 // last version given
		colls   map[string]kv.CollectionInfo
		// recs[collection][key] holds the key's versions, oldest first; a
		// tombstone has a nil Tags and Value and deleted set.
		recs map[string]map[string][]grpcFakeVersion
		// changed is closed (and replaced) on every write, to wake watches.
		changed chan struct{}
		// compacted: a watch from below this version fails with compacted.
		compacted uint64
		// watchErr, once set, ends every watch with it after the events it
		// has read.
		watchErr error
		// watches counts the Watch calls running.
		watches int
	}
}

type grpcFakeVersion struct {
	rec     kv.Record
	deleted bool
}

var _ kv.Backend = (*grpcFake)(nil)

func newGRPCFake() *grpcFake {
	f := &grpcFake{blocked: make(chan struct{}, 16)}
	f.mu.colls = map[string]kv.CollectionInfo{}
	f.mu.recs = map[string]map[string][]grpcFakeVersion{}
	f.mu.changed = make(chan struct{})
	return f
}

// grpcFakeMessage is the message of the errors of the "fail" collection: it
// has characters that a careless encoding would mangle.
func grpcFakeMessage(code kv.Code) string {
	return fmt.Sprintf("fake %s: \"quoted\", ünïcödé, a newline\nand a colon: here", code)
}

// grpcFakeErr is the error a call on the "fail" collection answers for key.
func grpcFakeErr(key []byte) error {
	switch k := string(key); k {
	case "ctx-canceled":
		return fmt.Errorf("waiting for shard 3: %w", context.Canceled)
	case "ctx-deadline":
		return context.DeadlineExceeded
	case "plain":
		return errors.New("disk on fire")
	case "wrapped":
		return fmt.Errorf("shard 3: %w", kv.Errorf(kv.CodeNotFound, "inner message"))
	default:
		return &kv.Error{Code: kv.Code(k), Message: grpcFakeMessage(kv.Code(k))}
	}
}

func (f *grpcFake) CreateCollection(_ context.Context, opts kv.CollectionOptions) (kv.CollectionInfo, error) {
	if err := kv.ValidateCollectionOptions(&opts); err != nil {
		return kv.CollectionInfo{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.mu.colls[opts.Name]; ok {
		return kv.CollectionInfo{}, kv.Errorf(kv.CodeAlreadyExists, "collection %q exists", opts.Name)
	}
	f.mu.nextID++
	info := kv.CollectionInfo{Name: opts.Name, ID: f.mu.nextID, Partitioning: opts.Partitioning, SplitPoints: opts.SplitPoints}
	for i := 0; i < opts.Shards; i++ {
		s := kv.ShardInfo{ID: uint64(100*f.mu.nextID) + uint64(i), Leader: uint64(i%3 + 1)}
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
	f.mu.colls[opts.Name] = info
	f.mu.recs[opts.Name] = map[string][]grpcFakeVersion{}
	return info, nil
}

func (f *grpcFake) ListCollections(context.Context) ([]kv.CollectionInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []kv.CollectionInfo
	for _, c := range f.mu.colls {
		out = append(out, c)
	}
	return out, nil
}

func (f *grpcFake) DescribeCollection(_ context.Context, name string) (kv.CollectionInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.mu.colls[name]
	if !ok {
		return kv.CollectionInfo{}, kv.Errorf(kv.CodeCollectionNotFound, "collection %q does not exist", name)
	}
	return c, nil
}

func (f *grpcFake) DropCollection(_ context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.mu.colls[name]; !ok {
		return kv.Errorf(kv.CodeCollectionNotFound, "collection %q does not exist", name)
	}
	delete(f.mu.colls, name)
	delete(f.mu.recs, name)
	return nil
}

// special handles the "fail" and "block" collections; ok is false for any
// other collection.
func (f *grpcFake) special(ctx context.Context, coll string, key []byte) (err error, ok bool) {
	switch coll {
	case "fail":
		return grpcFakeErr(key), true
	case "block":
		f.blocked <- struct{}{}
		<-ctx.Done()
		return ctx.Err(), true
	}
	return nil, false
}

// versionsLocked answers the versions of key, or a collection_not_found
// error.
func (f *grpcFake) versionsLocked(coll string, key []byte) ([]grpcFakeVersion, error) {
	recs, ok := f.mu.recs[coll]
	if !ok {
		return nil, kv.Errorf(kv.CodeCollectionNotFound, "collection %q does not exist", coll)
	}
	return recs[string(key)], nil
}

// checkLocked applies a conditional write's IfVersion to the key's versions.
func checkLocked(vs []grpcFakeVersion, ifVersion *uint64) error {
	if ifVersion == nil {
		return nil
	}
	var cur uint64
	if n := len(vs); n > 0 && !vs[n-1].deleted {
		cur = vs[n-1].rec.Version
	}
	if cur != *ifVersion {
		return kv.Errorf(kv.CodeConditionFailed, "key is at version %d, not %d", cur, *ifVersion)
	}
	return nil
}

func (f *grpcFake) Put(ctx context.Context, req kv.PutRequest) (uint64, error) {
	if err, ok := f.special(ctx, req.Collection, req.Key); ok {
		return 0, err
	}
	if err := kv.ValidateKey(req.Key); err != nil {
		return 0, err
	}
	if err := kv.ValidateTags(req.Tags); err != nil {
		return 0, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	vs, err := f.versionsLocked(req.Collection, req.Key)
	if err != nil {
		return 0, err
	}
	if err := checkLocked(vs, req.IfVersion); err != nil {
		return 0, err
	}
	f.mu.version++
	rec := kv.Record{Key: bytes.Clone(req.Key), Value: bytes.Clone(req.Value), Tags: req.Tags, Version: f.mu.version}
	f.mu.recs[req.Collection][string(req.Key)] = append(vs, grpcFakeVersion{rec: rec})
	f.notifyLocked()
	return f.mu.version, nil
}

func (f *grpcFake) Get(ctx context.Context, req kv.GetRequest) (kv.Record, error) {
	if err, ok := f.special(ctx, req.Collection, req.Key); ok {
		return kv.Record{}, err
	}
	if err := kv.ValidateKey(req.Key); err != nil {
		return kv.Record{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	vs, err := f.versionsLocked(req.Collection, req.Key)
	if err != nil {
		return kv.Record{}, err
	}
	for i := len(vs) - 1; i >= 0; i-- {
		if req.Version != 0 && vs[i].rec.Version > req.Version {
			continue
		}
		if vs[i].deleted {
			break
		}
		return vs[i].rec, nil
	}
	return kv.Record{}, kv.Errorf(kv.CodeNotFound, "key %q not found", req.Key)
}

func (f *grpcFake) Delete(ctx context.Context, req kv.DeleteRequest) (uint64, error) {
	if err, ok := f.special(ctx, req.Collection, req.Key); ok {
		return 0, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	vs, err := f.versionsLocked(req.Collection, req.Key)
	if err != nil {
		return 0, err
	}
	if err := checkLocked(vs, req.IfVersion); err != nil {
		return 0, err
	}
	f.mu.version++
	tomb := grpcFakeVersion{rec: kv.Record{Key: bytes.Clone(req.Key), Version: f.mu.version}, deleted: true}
	f.mu.recs[req.Collection][string(req.Key)] = append(vs, tomb)
	f.notifyLocked()
	return f.mu.version, nil
}

func (f *grpcFake) Ready() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mu.ready
}

func (f *grpcFake) setReady(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mu.ready = err
}

// notifyLocked wakes the watches after a write.
func (f *grpcFake) notifyLocked() {
	close(f.mu.changed)
	f.mu.changed = make(chan struct{})
}

// readLocked answers key's record as of version, and whether it is live.
func readLocked(vs []grpcFakeVersion, version uint64) (kv.Record, bool) {
	for i := len(vs) - 1; i >= 0; i-- {
		if vs[i].rec.Version > version {
			continue
		}
		return vs[i].rec, !vs[i].deleted
	}
	return kv.Record{}, false
}

func (f *grpcFake) BatchGet(_ context.Context, keys []kv.KeyRef) (kv.BatchGetResult, error) {
	for _, k := range keys {
		if k.Collection == "fail" {
			return kv.BatchGetResult{}, grpcFakeErr(k.Key)
		}
		if err := kv.ValidateKey(k.Key); err != nil {
			return kv.BatchGetResult{}, err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	res := kv.BatchGetResult{Version: f.mu.version}
	for _, k := range keys {
		vs, err := f.versionsLocked(k.Collection, k.Key)
		if err != nil {
			return kv.BatchGetResult{}, err
		}
		it := kv.BatchGetItem{Collection: k.Collection, Key: k.Key}
		if rec, ok := readLocked(vs, f.mu.version); ok {
			it.Found, it.Value, it.Tags, it.Version = true, rec.Value, rec.Tags, rec.Version
		}
		res.Items = append(res.Items, it)
	}
	return res, nil
}

// batchWrite is BatchPut and BatchDelete: items are written in order at one
// new version, up to the first record of "fail", whose error ends the batch.
func (f *grpcFake) batchWrite(items []kv.PutItem, del bool) ([]kv.WriteResult, error) {
	for _, it := range items {
		if it.Collection == "fail" {
			continue
		}
		if err := kv.ValidateKey(it.Key); err != nil {
			return nil, err
		}
		if err := kv.ValidateTags(it.Tags); err != nil {
			return nil, err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, it := range items {
		if it.Collection == "fail" {
			break
		}
		vs, err := f.versionsLocked(it.Collection, it.Key)
		if err != nil {
			return nil, err
		}
		if err := checkLocked(vs, it.IfVersion); err != nil {
			return nil, err
		}
	}
	f.mu.version++
	var applied []kv.WriteResult
	for _, it := range items {
		if it.Collection == "fail" {
			err := grpcFakeErr(it.Key)
			if len(applied) == 0 {
				return nil, err
			}
			return nil, fmt.Errorf("shard 7: %w", &kv.BatchError{Err: kv.AsError(err), Applied: applied})
		}
		v := grpcFakeVersion{rec: kv.Record{Key: bytes.Clone(it.Key), Version: f.mu.version}, deleted: del}
		if !del {
			v.rec.Value, v.rec.Tags = bytes.Clone(it.Value), it.Tags
		}
		recs := f.mu.recs[it.Collection]
		recs[string(it.Key)] = append(recs[string(it.Key)], v)
		applied = append(applied, kv.WriteResult{Collection: it.Collection, Key: it.Key, Version: f.mu.version})
	}
	f.notifyLocked()
	return applied, nil
}

func (f *grpcFake) BatchPut(_ context.Context, items []kv.PutItem) ([]kv.WriteResult, error) {
	return f.batchWrite(items, false)
}

func (f *grpcFake) BatchDelete(_ context.Context, keys []kv.KeyRef) ([]kv.WriteResult, error) {
	items := make([]kv.PutItem, len(keys))
	for i, k := range keys {
		items[i] = kv.PutItem{Collection: k.Collection, Key: k.Key}
	}
	return f.batchWrite(items, true)
}

// inRange reports whether key is in [start, end); an empty end is unbounded.
func inRange(key, start, end []byte) bool {
	return bytes.Compare(key, start) >= 0 && (len(end) == 0 || bytes.Compare(key, end) < 0)
}

// liveLocked answers the live records of coll in key order as of version,
// filtered by keep.
func (f *grpcFake) liveLocked(coll string, version uint64, keep func(kv.Record) bool) ([]kv.Record, error) {
	recs, ok := f.mu.recs[coll]
	if !ok {
		return nil, kv.Errorf(kv.CodeCollectionNotFound, "collection %q does not exist", coll)
	}
	var out []kv.Record
	for _, vs := range recs {
		if rec, ok := readLocked(vs, version); ok && keep(rec) {
			out = append(out, rec)
		}
	}
	slices.SortFunc(out, func(a, b kv.Record) int { return bytes.Compare(a.Key, b.Key) })
	return out, nil
}

func (f *grpcFake) DeleteRange(_ context.Context, req kv.DeleteRangeRequest) (kv.DeleteRangeResult, error) {
	if req.Collection == "fail" {
		return kv.DeleteRangeResult{}, grpcFakeErr(req.Start)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	live, err := f.liveLocked(req.Collection, f.mu.version, func(r kv.Record) bool { return inRange(r.Key, req.Start, req.End) })
	if err != nil || len(live) == 0 {
		return kv.DeleteRangeResult{}, err
	}
	f.mu.version++
	recs := f.mu.recs[req.Collection]
	for _, r := range live {
		recs[string(r.Key)] = append(recs[string(r.Key)], grpcFakeVersion{rec: kv.Record{Key: r.Key, Version: f.mu.version}, deleted: true})
	}
	f.notifyLocked()
	return kv.DeleteRangeResult{Deleted: len(live)}, nil
}

// page cuts one page of limit records out of recs, which are in the scan's
// order, after the key named by the page token; the token of the next page
// is "version:hex(last key)".
func page(recs []kv.Record, limit int, token string, version uint64) (kv.ScanResult, error) {
	if limit < 0 || limit > kv.MaxPageSize {
		return kv.ScanResult{}, kv.Errorf(kv.CodeInvalidArgument, "limit %d is not within 0 to %d", limit, kv.MaxPageSize)
	}
	if limit == 0 {
		limit = kv.DefaultPageSize
	}
	if token != "" {
		_, after, _ := strings.Cut(token, ":")
		for len(recs) > 0 && fmt.Sprintf("%x", recs[0].Key) != after {
			recs = recs[1:]
		}
		if len(recs) == 0 {
			return kv.ScanResult{}, kv.Errorf(kv.CodeInvalidArgument, "bad page token %q", token)
		}
		recs = recs[1:]
	}
	res := kv.ScanResult{Items: recs, Version: version}
	if len(recs) > limit {
		res.Items = recs[:limit]
		res.NextPage = fmt.Sprintf("%d:%x", version, recs[limit-1].Key)
	}
	return res, nil
}

// pageVersion answers the version a scan reads at: its page token's, its
// own, or the latest.
func (f *grpcFake) pageVersionLocked(token string, version uint64) uint64 {
	if v, _, ok := strings.Cut(token, ":"); ok {
		fmt.Sscan(v, &version)
	}
	if version == 0 {
		version = f.mu.version
	}
	return version
}

func (f *grpcFake) Scan(_ context.Context, req kv.ScanRequest) (kv.ScanResult, error) {
	if req.Collection == "fail" {
		return kv.ScanResult{}, grpcFakeErr(req.Start)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	version := f.pageVersionLocked(req.Page, req.Version)
	recs, err := f.liveLocked(req.Collection, version, func(r kv.Record) bool { return inRange(r.Key, req.Start, req.End) })
	if err != nil {
		return kv.ScanResult{}, err
	}
	if req.Reverse {
		slices.Reverse(recs)
	}
	return page(recs, req.Limit, req.Page, version)
}

func (f *grpcFake) GetByTags(_ context.Context, q kv.TagQuery) (kv.ScanResult, error) {
	if q.Collection == "fail" && len(q.All) > 0 {
		return kv.ScanResult{}, grpcFakeErr([]byte(q.All[0]))
	}
	if (len(q.All) == 0) == (len(q.Any) == 0) {
		return kv.ScanResult{}, kv.Errorf(kv.CodeInvalidArgument, "give exactly one of all and any")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	version := f.pageVersionLocked(q.Page, q.Version)
	recs, err := f.liveLocked(q.Collection, version, func(r kv.Record) bool {
		n := 0
		for _, t := range append(q.All, q.Any...) {
			if slices.Contains(r.Tags, t) {
				n++
			}
		}
		return len(q.All) > 0 && n == len(q.All) || len(q.Any) > 0 && n > 0
	})
	if err != nil {
		return kv.ScanResult{}, err
	}
	return page(recs, q.Limit, q.Page, version)
}

// compact makes watches from below version fail with compacted.
func (f *grpcFake) compact(version uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mu.compacted = version
}

// failWatches ends every watch with err.
func (f *grpcFake) failWatches(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mu.watchErr = err
	f.notifyLocked()
}

// watching answers the number of Watch calls running.
func (f *grpcFake) watching() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mu.watches
}

// eventsLocked answers the changes of the watched range above (from, after)
// in (version, key) order.
func (f *grpcFake) eventsLocked(req kv.WatchRequest, from uint64, after []byte) []kv.Event {
	var evs []kv.Event
	for _, vs := range f.mu.recs[req.Collection] {
		for _, v := range vs {
			if !inRange(v.rec.Key, req.Start, req.End) ||
				v.rec.Version < from || v.rec.Version == from && (len(after) == 0 || bytes.Compare(v.rec.Key, after) <= 0) {
				continue
			}
			ev := kv.Event{Type: kv.EventPut, Key: v.rec.Key, Value: v.rec.Value, Tags: v.rec.Tags, Version: v.rec.Version}
			if v.deleted {
				ev.Type = kv.EventDelete
			}
			evs = append(evs, ev)
		}
	}
	slices.SortFunc(evs, func(a, b kv.Event) int {
		if a.Version != b.Version {
			return cmp.Compare(a.Version, b.Version)
		}
		return bytes.Compare(a.Key, b.Key)
	})
	return evs
}

// Watch replays the stored changes, sends a progress event whenever it has
// caught up with a newer version, and waits for more.
func (f *grpcFake) Watch(ctx context.Context, req kv.WatchRequest, fn func(kv.Event) error) error {
	if req.Collection == "fail" {
		return grpcFakeErr(req.Start)
	}
	f.mu.Lock()
	if _, ok := f.mu.recs[req.Collection]; !ok {
		f.mu.Unlock()
		return kv.Errorf(kv.CodeCollectionNotFound, "collection %q does not exist", req.Collection)
	}
	if req.FromVersion < f.mu.compacted {
		f.mu.Unlock()
		return kv.Errorf(kv.CodeCompacted, "version %d is compacted; watch from %d or later", req.FromVersion, f.mu.compacted)
	}
	f.mu.watches++
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.mu.watches--
		f.mu.Unlock()
	}()

	from, after := req.FromVersion, req.AfterKey
	var progress uint64
	for {
		f.mu.Lock()
		evs := f.eventsLocked(req, from, after)
		cur, changed, failErr := f.mu.version, f.mu.changed, f.mu.watchErr
		f.mu.Unlock()
		for _, ev := range evs {
			if err := fn(ev); err != nil {
				return err
			}
			from, after = ev.Version, ev.Key
		}
		if failErr != nil {
			return failErr
		}
		if cur > progress {
			if err := fn(kv.Event{Type: kv.EventProgress, Version: cur}); err != nil {
				return err
			}
			progress = cur
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}

// grpcServe serves b on a fresh loopback port and answers its address and
// server; the server stops when the test ends.
func grpcServe(t *testing.T, b kv.Backend, opts ...grpc.ServerOption) (string, *grpc.Server) {
	t.Helper()
	return grpcServeWith(t, b, api.GRPCConfig{}, opts...)
}

// grpcServeWith is grpcServe with NewGRPCServerWith's cfg.
func grpcServeWith(t *testing.T, b kv.Backend, cfg api.GRPCConfig, opts ...grpc.ServerOption) (string, *grpc.Server) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := api.NewGRPCServerWith(b, cfg, opts...)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return lis.Addr().String(), srv
}

// grpcBare dials addr with a bare gRPC client, as a client in another
// language would, and closes it when the test ends.
func grpcBare(t *testing.T, addr string) pb.GroupKVClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pb.NewGroupKVClient(conn)
}

// grpcDial dials addr with groupkv.Dial and closes the DB when the test ends.
func grpcDial(t *testing.T, addr string, opts ...groupkv.DialOption) groupkv.DB {
	t.Helper()
	// These tests check the wire against a fake backend, not the
	// routing of a cluster client (see route.go), which would add calls.
	opts = append([]groupkv.DialOption{groupkv.WithoutShardRouting()}, opts...)
	db, err := groupkv.Dial(addr, opts...)
	if err != nil {
		t.Fatalf("Dial(%q): %v", addr, err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// grpcStart serves a fresh grpcFake and dials it.
func grpcStart(t *testing.T, opts ...grpc.ServerOption) (*grpcFake, groupkv.DB) {
	t.Helper()
	f := newGRPCFake()
	addr, _ := grpcServe(t, f, opts...)
	return f, grpcDial(t, addr)
}

// wantCode fails the test unless err is a *kv.Error with code.
func wantCode(t *testing.T, what string, err error, code kv.Code) *kv.Error {
	t.Helper()
	var e *kv.Error
	if !errors.As(err, &e) {
		t.Fatalf("%s: error %v (%T) is not a *kv.Error with code %s", what, err, err, code)
	}
	if e.Code != code {
		t.Fatalf("%s: code %s (error %v), want %s", what, e.Code, err, code)
	}
	return e
}

func TestGRPCRecordRoundTrip(t *testing.T) {
	ctx := context.Background()
	_, db := grpcStart(t)
	if _, err := db.CreateCollection(ctx, kv.CollectionOptions{Name: "users"}); err != nil {
		t.Fatal(err)
	}

	key := []byte{0, 'u', 0xff, '1'}
	val := []byte{0xde, 0xad, 0, 0xbe, 0xef}
	tags := []string{"team:ada", "ünïcode tag", "x"}
	v1, err := db.Put(ctx, kv.PutRequest{Collection: "users", Key: key, Value: val, Tags: tags})
	if err != nil {
		t.Fatal(err)
	}
	if v1 == 0 {
		t.Fatal("Put answered version 0")
	}
	rec, err := db.Get(ctx, kv.GetRequest{Collection: "users", Key: key})
	if err != nil {
		t.Fatal(err)
	}
	want := kv.Record{Key: key, Value: val, Tags: tags, Version: v1}
	if !reflect.DeepEqual(rec, want) {
		t.Fatalf("Get = %+v, want %+v", rec, want)
	}

	// IfVersion keeps its presence: a pointer to 0 means "only if absent",
	// which fails on a present key where no condition at all succeeds.
	_, err = db.Put(ctx, kv.PutRequest{Collection: "users", Key: key, Value: []byte("x"), IfVersion: groupkv.Version(0)})
	wantCode(t, "put if absent on a present key", err, kv.CodeConditionFailed)
	if !errors.Is(err, groupkv.ErrConditionFailed) {
		t.Fatalf("errors.Is(%v, ErrConditionFailed) is false", err)
	}
	_, err = db.Put(ctx, kv.PutRequest{Collection: "users", Key: key, Value: []byte("x"), IfVersion: groupkv.Version(v1 + 7)})
	wantCode(t, "put at a wrong version", err, kv.CodeConditionFailed)

	v2, err := db.Put(ctx, kv.PutRequest{Collection: "users", Key: key, Value: []byte("second"), IfVersion: groupkv.Version(v1)})
	if err != nil {
		t.Fatalf("put at the right version: %v", err)
	}
	if v2 <= v1 {
		t.Fatalf("second put answered version %d, not above %d", v2, v1)
	}
	if _, err := db.Put(ctx, kv.PutRequest{Collection: "users", Key: []byte("new"), Value: []byte{}, IfVersion: groupkv.Version(0)}); err != nil {
		t.Fatalf("put if absent on an absent key: %v", err)
	}
	empty, err := db.Get(ctx, kv.GetRequest{Collection: "users", Key: []byte("new")})
	if err != nil || len(empty.Value) != 0 || len(empty.Tags) != 0 {
		t.Fatalf("Get of an empty value = %+v, %v", empty, err)
	}

	// The version of a get selects an older version.
	old, err := db.Get(ctx, kv.GetRequest{Collection: "users", Key: key, Version: v1})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(old.Value, val) || old.Version != v1 {
		t.Fatalf("Get at version %d = %+v, want value %x", v1, old, val)
	}
	cur, err := db.Get(ctx, kv.GetRequest{Collection: "users", Key: key})
	if err != nil || string(cur.Value) != "second" || cur.Version != v2 || cur.Tags != nil {
		t.Fatalf("Get latest = %+v, %v; want value second at %d with no tags", cur, err, v2)
	}

	_, err = db.Delete(ctx, kv.DeleteRequest{Collection: "users", Key: key, IfVersion: groupkv.Version(v1)})
	wantCode(t, "delete at a wrong version", err, kv.CodeConditionFailed)
	v3, err := db.Delete(ctx, kv.DeleteRequest{Collection: "users", Key: key, IfVersion: groupkv.Version(v2)})
	if err != nil {
		t.Fatal(err)
	}
	if v3 <= v2 {
		t.Fatalf("delete answered version %d, not above %d", v3, v2)
	}
	_, err = db.Get(ctx, kv.GetRequest{Collection: "users", Key: key})
	if !errors.Is(err, groupkv.ErrNotFound) {
		t.Fatalf("Get after delete: %v, want ErrNotFound", err)
	}
	if v4, err := db.Delete(ctx, kv.DeleteRequest{Collection: "users", Key: []byte("new")}); err != nil || v4 <= v3 {
		t.Fatalf("unconditional delete = %d, %v; want a version above %d", v4, err, v3)
	}

	// Input the server validates comes back with the server's exact error.
	_, err = db.Put(ctx, kv.PutRequest{Collection: "users", Key: key, Tags: []string{"a,b"}})
	if want := kv.ValidateTags([]string{"a,b"}); !reflect.DeepEqual(err, want) {
		t.Fatalf("put with a bad tag: %#v, want %#v", err, want)
	}
	_, err = db.Get(ctx, kv.GetRequest{Collection: "users"})
	if want := kv.ValidateKey(nil); !reflect.DeepEqual(err, want) {
		t.Fatalf("get of an empty key: %#v, want %#v", err, want)
	}
}

func TestGRPCCollections(t *testing.T) {
	ctx := context.Background()
	_, db := grpcStart(t)

	hash, err := db.CreateCollection(ctx, kv.CollectionOptions{Name: "h", Shards: 3})
	if err != nil {
		t.Fatal(err)
	}
	if hash.Partitioning != kv.PartitionHash || len(hash.Shards) != 3 ||
		hash.Shards[2].BucketEnd != kv.NumBuckets || hash.Shards[1].BucketStart == 0 || hash.Shards[1].Leader != 2 {
		t.Fatalf("hash collection = %+v", hash)
	}
	splits := [][]byte{[]byte("g"), {'p', 0, 0xff}}
	rng, err := db.CreateCollection(ctx, kv.CollectionOptions{Name: "r", Partitioning: kv.PartitionRange, SplitPoints: splits})
	if err != nil {
		t.Fatal(err)
	}
	wantRange := kv.CollectionInfo{
		Name: "r", ID: 2, Partitioning: kv.PartitionRange, SplitPoints: splits,
		Shards: []kv.ShardInfo{
			{ID: 200, End: splits[0], Leader: 1},
			{ID: 201, Start: splits[0], End: splits[1], Leader: 2},
			{ID: 202, Start: splits[1], Leader: 3},
		},
	}
	if !reflect.DeepEqual(rng, wantRange) {
		t.Fatalf("CreateCollection = %+v\nwant %+v", rng, wantRange)
	}
	desc, err := db.DescribeCollection(ctx, "r")
	if err != nil || !reflect.DeepEqual(desc, wantRange) {
		t.Fatalf("DescribeCollection = %+v, %v\nwant %+v", desc, err, wantRange)
	}

	list, err := db.ListCollections(ctx)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]kv.CollectionInfo{}
	for _, c := range list {
		byName[c.Name] = c
	}
	if len(list) != 2 || !reflect.DeepEqual(byName["r"], wantRange) || !reflect.DeepEqual(byName["h"], hash) {
		t.Fatalf("ListCollections = %+v", list)
	}

	_, err = db.CreateCollection(ctx, kv.CollectionOptions{Name: "r"})
	wantCode(t, "create twice", err, kv.CodeAlreadyExists)

	// Options the server rejects come back with the server's exact error,
	// including a shard count that would not fit a narrower integer.
	for _, opts := range []kv.CollectionOptions{
		{Name: "Bad Name"},
		{Name: "neg", Shards: -5},
		{Name: "huge", Shards: math.MaxInt},
		{Name: "unsorted", Partitioning: kv.PartitionRange, SplitPoints: [][]byte{[]byte("b"), []byte("a")}},
	} {
		_, err := db.CreateCollection(ctx, opts)
		local := opts
		want := kv.ValidateCollectionOptions(&local)
		if want == nil || !reflect.DeepEqual(err, want) {
			t.Fatalf("CreateCollection(%+v): %#v, want %#v", opts, err, want)
		}
	}

	if err := db.DropCollection(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	_, err = db.DescribeCollection(ctx, "r")
	if !errors.Is(err, groupkv.ErrCollectionNotFound) {
		t.Fatalf("describe after drop: %v, want ErrCollectionNotFound", err)
	}
	err = db.DropCollection(ctx, "r")
	wantCode(t, "drop twice", err, kv.CodeCollectionNotFound)
	if list, err := db.ListCollections(ctx); err != nil || len(list) != 1 || list[0].Name != "h" {
		t.Fatalf("ListCollections after drop = %+v, %v", list, err)
	}
}

// grpcCodes lists every kv.Code with the gRPC code that must carry it, as
// documented in proto/groupkv.proto.
var grpcCodes = []struct {
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
	{kv.CodeCompacted, codes.OutOfRange},
	{kv.CodeConditionFailed, codes.FailedPrecondition},
	{kv.CodeTooLarge, codes.ResourceExhausted},
	{kv.CodeUnavailable, codes.Unavailable},
	{kv.CodeNotLeader, codes.Unavailable},
	{kv.CodeCommitUnknown, codes.Unknown},
	{kv.CodeUnimplemented, codes.Unimplemented},
	{kv.CodeInternal, codes.Internal},
}

func TestGRPCErrorCodesRoundTrip(t *testing.T) {
	ctx := context.Background()
	f, db := grpcStart(t)
	for _, c := range grpcCodes {
		want := &kv.Error{Code: c.kv, Message: grpcFakeMessage(c.kv)}
		key := []byte(c.kv)
		_, putErr := db.Put(ctx, kv.PutRequest{Collection: "fail", Key: key})
		_, getErr := db.Get(ctx, kv.GetRequest{Collection: "fail", Key: key})
		_, delErr := db.Delete(ctx, kv.DeleteRequest{Collection: "fail", Key: key})
		f.setReady(want)
		readyErr := db.Ready()
		for name, err := range map[string]error{"put": putErr, "get": getErr, "delete": delErr, "ready": readyErr} {
			if !reflect.DeepEqual(err, want) {
				t.Errorf("%s %s: got %#v, want %#v", name, c.kv, err, want)
			}
			if !errors.Is(err, &kv.Error{Code: c.kv}) {
				t.Errorf("%s %s: errors.Is with the code's sentinel is false", name, c.kv)
			}
		}
	}
	_, err := db.Get(ctx, kv.GetRequest{Collection: "fail", Key: []byte("not_found")})
	if !errors.Is(err, groupkv.ErrNotFound) {
		t.Error("errors.Is(remote not_found, groupkv.ErrNotFound) is false")
	}
	f.setReady(nil)
	if err := db.Ready(); err != nil {
		t.Errorf("Ready of a ready server: %v", err)
	}
}

// TestGRPCWireErrors checks the status on the wire with a bare gRPC client:
// the gRPC code, the message, the ErrorDetail and the trailer.
func TestGRPCWireErrors(t *testing.T) {
	addr, _ := grpcServe(t, newGRPCFake())
	c := grpcBare(t, addr)
	for _, tc := range grpcCodes {
		var trailer metadata.MD
		_, err := c.Get(context.Background(), &pb.GetRequest{Collection: "fail", Key: []byte(tc.kv)}, grpc.Trailer(&trailer))
		st := status.Convert(err)
		if st.Code() != tc.grpc || st.Message() != grpcFakeMessage(tc.kv) {
			t.Errorf("%s: status %v %q, want %v %q", tc.kv, st.Code(), st.Message(), tc.grpc, grpcFakeMessage(tc.kv))
		}
		if got := trailer.Get(api.CodeTrailer); len(got) != 1 || got[0] != string(tc.kv) {
			t.Errorf("%s: trailer %s = %q", tc.kv, api.CodeTrailer, got)
		}
		if d := st.Details(); len(d) != 1 || d[0].(*pb.ErrorDetail).GetCode() != string(tc.kv) {
			t.Errorf("%s: details %v", tc.kv, d)
		}
	}
	// A context error has no kv code: no detail, no trailer.
	var trailer metadata.MD
	_, err := c.Get(context.Background(), &pb.GetRequest{Collection: "fail", Key: []byte("ctx-deadline")}, grpc.Trailer(&trailer))
	if st := status.Convert(err); st.Code() != codes.DeadlineExceeded || len(st.Details()) != 0 || len(trailer.Get(api.CodeTrailer)) != 0 {
		t.Errorf("context error on the wire: %v, details %v, trailer %v", st, st.Details(), trailer)
	}
}

func TestGRPCOtherErrors(t *testing.T) {
	ctx := context.Background()
	_, db := grpcStart(t)
	get := func(key string) error {
		_, err := db.Get(ctx, kv.GetRequest{Collection: "fail", Key: []byte(key)})
		return err
	}

	if err := get("ctx-canceled"); !errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("server-side cancel: %v, want context.Canceled", err)
	}
	if err := get("ctx-deadline"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("server-side deadline: %v, want context.DeadlineExceeded", err)
	}
	if err, want := get("plain"), (&kv.Error{Code: kv.CodeInternal, Message: "disk on fire"}); !reflect.DeepEqual(err, want) {
		t.Errorf("plain error: %#v, want %#v", err, want)
	}
	if err, want := get("wrapped"), (&kv.Error{Code: kv.CodeNotFound, Message: "inner message"}); !reflect.DeepEqual(err, want) {
		t.Errorf("wrapped error: %#v, want %#v", err, want)
	}

	// The caller's own deadline ends a call the server would block on.
	dctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := db.Get(dctx, kv.GetRequest{Collection: "block", Key: []byte("k")}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("client deadline: %v, want context.DeadlineExceeded", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := db.Put(cctx, kv.PutRequest{Collection: "x", Key: []byte("k")}); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled context: %v, want context.Canceled", err)
	}
}

// TestGRPCLargeValue sends a value above gRPC's default 4 MiB limit and
// above the largest configurable value size, in both directions.
func TestGRPCLargeValue(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 34 MiB through loopback")
	}
	ctx := context.Background()
	_, db := grpcStart(t)
	if _, err := db.CreateCollection(ctx, kv.CollectionOptions{Name: "big"}); err != nil {
		t.Fatal(err)
	}
	val := bytes.Repeat([]byte("0123456789abcdef"), (16<<20+64<<10)/16)
	if _, err := db.Put(ctx, kv.PutRequest{Collection: "big", Key: []byte("k"), Value: val}); err != nil {
		t.Fatalf("put of %d bytes: %v", len(val), err)
	}
	rec, err := db.Get(ctx, kv.GetRequest{Collection: "big", Key: []byte("k")})
	if err != nil || !bytes.Equal(rec.Value, val) {
		t.Fatalf("get of %d bytes: %d bytes, %v", len(val), len(rec.Value), err)
	}
	// Past MaxMessageSize the client refuses before sending.
	huge := make([]byte, api.MaxMessageSize+1)
	_, err = db.Put(ctx, kv.PutRequest{Collection: "big", Key: []byte("h"), Value: huge})
	wantCode(t, "put past the message limit", err, kv.CodeTooLarge)
}

func TestGRPCTransportErrors(t *testing.T) {
	ctx := context.Background()

	// A port where nothing listens.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := lis.Addr().String()
	lis.Close()
	db := grpcDial(t, deadAddr)
	_, err = db.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte("k")})
	wantCode(t, "get from a dead server", err, kv.CodeUnavailable)
	if !errors.Is(err, groupkv.ErrUnavailable) {
		t.Errorf("errors.Is(%v, ErrUnavailable) is false", err)
	}
	// A write that never reached a server was not applied.
	_, err = db.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte("k")})
	wantCode(t, "put to a dead server", err, kv.CodeUnavailable)
	if err := db.Ready(); kv.CodeOf(err) != kv.CodeUnavailable {
		t.Errorf("Ready of a dead server: %v", err)
	}
	if _, err := groupkv.Dial(deadAddr, groupkv.WithDialTimeout(200*time.Millisecond)); kv.CodeOf(err) != kv.CodeUnavailable {
		t.Errorf("Dial with timeout to a dead server: %v, want unavailable", err)
	}

	// A write whose connection breaks while the server handles it may have
	// been applied; a read in the same spot may simply be retried.
	f := newGRPCFake()
	addr, srv := grpcServe(t, f)
	live := grpcDial(t, addr, groupkv.WithDialTimeout(5*time.Second))
	errc := make(chan error, 2)
	go func() {
		_, err := live.Put(ctx, kv.PutRequest{Collection: "block", Key: []byte("k")})
		errc <- err
	}()
	go func() {
		_, err := live.Get(ctx, kv.GetRequest{Collection: "block", Key: []byte("k")})
		errc <- err
	}()
	<-f.blocked
	<-f.blocked
	srv.Stop()
	var got []kv.Code
	for range 2 {
		got = append(got, kv.CodeOf(<-errc))
	}
	if !(got[0] == kv.CodeCommitUnknown && got[1] == kv.CodeUnavailable ||
		got[1] == kv.CodeCommitUnknown && got[0] == kv.CodeUnavailable) {
		t.Errorf("codes of a put and a get cut off by a server stop: %v, want commit_unknown and unavailable", got)
	}
}

func TestGRPCDialAndClose(t *testing.T) {
	for _, addr := range []string{"http://127.0.0.1:7070", "grpc://h:1", "127.0.0.1", "host:", ""} {
		if db, err := groupkv.Dial(addr); kv.CodeOf(err) != kv.CodeInvalidArgument {
			t.Errorf("Dial(%q) = %v, %v; want invalid_argument", addr, db, err)
		}
	}

	_, db := grpcStart(t)
	ctx := context.Background()
	if _, err := db.ListCollections(ctx); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	_, err := db.ListCollections(ctx)
	e := wantCode(t, "call after Close", err, kv.CodeUnavailable)
	if !strings.Contains(e.Message, "closed") {
		t.Errorf("call after Close: %q does not say the DB is closed", e.Message)
	}
	if err := db.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestGRPCMetricsInterceptor(t *testing.T) {
	type obs struct {
		op   string
		code kv.Code
	}
	var mu sync.Mutex
	var got []obs
	record := func(op string, code kv.Code, seconds float64) {
		if seconds < 0 {
			t.Errorf("%s: negative duration %v", op, seconds)
		}
		mu.Lock()
		defer mu.Unlock()
		got = append(got, obs{op, code})
	}
	// Puts and gets go through the Pipeline stream: its requests are
	// observed one by one, as unary RPCs are.
	addr, _ := grpcServeWith(t, newGRPCFake(), api.GRPCConfig{Observe: record}, grpc.ChainUnaryInterceptor(api.GRPCMetricsInterceptor(record)))
	db := grpcDial(t, addr)

	ctx := context.Background()
	_, _ = db.CreateCollection(ctx, kv.CollectionOptions{Name: "c"})
	_, _ = db.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte("k")})
	_, _ = db.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte("absent")})
	_, _ = db.Get(ctx, kv.GetRequest{Collection: "fail", Key: []byte("ctx-canceled")})
	_, _ = db.ListCollections(ctx)
	_ = db.Ready()

	want := []obs{
		{"create_collection", ""},
		{"put", ""},
		{"get", kv.CodeNotFound},
		{"get", kv.CodeUnavailable},
		{"list_collections", ""},
		{"ready", ""},
	}
	mu.Lock()
	defer mu.Unlock()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("observed %v, want %v", got, want)
	}
}

func TestGRPCBatchRoundTrip(t *testing.T) {
	ctx := context.Background()
	_, db := grpcStart(t)
	for _, name := range []string{"users", "teams"} {
		if _, err := db.CreateCollection(ctx, kv.CollectionOptions{Name: name}); err != nil {
			t.Fatal(err)
		}
	}
	bin := []byte{0, 'k', 0xff}
	items := []kv.PutItem{
		{Collection: "users", Key: []byte("ada"), Value: []byte("Ada"), Tags: []string{"admin", "ünï"}},
		{Collection: "teams", Key: bin, Value: []byte{0xde, 0xad}},
		{Collection: "users", Key: []byte("bob"), Value: nil, IfVersion: groupkv.Version(0)},
	}
	rs, err := db.BatchPut(ctx, items)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 3 || rs[0].Version == 0 {
		t.Fatalf("BatchPut = %+v", rs)
	}
	v1 := rs[0].Version
	wantRs := []kv.WriteResult{{Collection: "users", Key: []byte("ada"), Version: v1}, {Collection: "teams", Key: bin, Version: v1}, {Collection: "users", Key: []byte("bob"), Version: v1}}
	if !reflect.DeepEqual(rs, wantRs) {
		t.Fatalf("BatchPut = %+v, want %+v", rs, wantRs)
	}

	got, err := db.BatchGet(ctx, []kv.KeyRef{{Collection: "teams", Key: bin}, {Collection: "users", Key: []byte("absent")}, {Collection: "users", Key: []byte("ada")}, {Collection: "users", Key: []byte("bob")}})
	if err != nil {
		t.Fatal(err)
	}
	want := kv.BatchGetResult{Version: v1, Items: []kv.BatchGetItem{
		{Collection: "teams", Key: bin, Found: true, Value: []byte{0xde, 0xad}, Version: v1},
		{Collection: "users", Key: []byte("absent")},
		{Collection: "users", Key: []byte("ada"), Found: true, Value: []byte("Ada"), Tags: []string{"admin", "ünï"}, Version: v1},
		{Collection: "users", Key: []byte("bob"), Found: true, Version: v1},
	}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("BatchGet = %+v\nwant %+v", got, want)
	}

	// Each item keeps the presence of its IfVersion: 0 is "only if absent".
	_, err = db.BatchPut(ctx, []kv.PutItem{{Collection: "users", Key: []byte("ada"), IfVersion: groupkv.Version(0)}})
	wantCode(t, "batch put if absent on a present key", err, kv.CodeConditionFailed)
	var be *kv.BatchError
	if errors.As(err, &be) {
		t.Fatalf("a batch that applied nothing failed with a *kv.BatchError: %#v", be)
	}
	rs, err = db.BatchPut(ctx, []kv.PutItem{
		{Collection: "users", Key: []byte("ada"), Value: []byte("x"), IfVersion: groupkv.Version(v1)},
		{Collection: "users", Key: []byte("cy"), Value: []byte("y")},
	})
	if err != nil || len(rs) != 2 || rs[0].Version <= v1 {
		t.Fatalf("conditional BatchPut = %+v, %v", rs, err)
	}

	rs, err = db.BatchDelete(ctx, []kv.KeyRef{{Collection: "users", Key: []byte("ada")}, {Collection: "teams", Key: bin}})
	if err != nil || len(rs) != 2 || rs[1].Collection != "teams" || !bytes.Equal(rs[1].Key, bin) {
		t.Fatalf("BatchDelete = %+v, %v", rs, err)
	}
	got, err = db.BatchGet(ctx, []kv.KeyRef{{Collection: "users", Key: []byte("ada")}, {Collection: "teams", Key: bin}})
	if err != nil || got.Items[0].Found || got.Items[1].Found || got.Version != rs[0].Version {
		t.Fatalf("BatchGet after delete = %+v, %v", got, err)
	}

	// Empty batches answer empty, non-nil lists.
	if got, err := db.BatchGet(ctx, nil); err != nil || got.Items == nil || len(got.Items) != 0 {
		t.Fatalf("empty BatchGet = %#v, %v", got, err)
	}

	// Input the server validates comes back with the server's exact error.
	_, err = db.BatchPut(ctx, []kv.PutItem{{Collection: "users", Key: []byte("k"), Tags: []string{"a,b"}}})
	if want := kv.ValidateTags([]string{"a,b"}); !reflect.DeepEqual(err, want) {
		t.Fatalf("batch put with a bad tag: %#v, want %#v", err, want)
	}
	_, err = db.BatchGet(ctx, []kv.KeyRef{{Collection: "users", Key: nil}})
	if want := kv.ValidateKey(nil); !reflect.DeepEqual(err, want) {
		t.Fatalf("batch get of an empty key: %#v, want %#v", err, want)
	}
	_, err = db.BatchDelete(ctx, []kv.KeyRef{{Collection: "nope", Key: []byte("k")}})
	wantCode(t, "batch delete in a missing collection", err, kv.CodeCollectionNotFound)
}

func TestGRPCBatchError(t *testing.T) {
	ctx := context.Background()
	_, db := grpcStart(t)
	if _, err := db.CreateCollection(ctx, kv.CollectionOptions{Name: "users"}); err != nil {
		t.Fatal(err)
	}
	for _, c := range grpcCodes {
		for _, op := range []string{"delete", "put"} {
			var err error
			if op == "put" {
				_, err = db.BatchPut(ctx, []kv.PutItem{
					{Collection: "users", Key: []byte("a")},
					{Collection: "users", Key: []byte{0, 0xff}},
					{Collection: "fail", Key: []byte(c.kv)},
					{Collection: "users", Key: []byte("never")},
				})
			} else {
				_, err = db.BatchDelete(ctx, []kv.KeyRef{{Collection: "users", Key: []byte("a")}, {Collection: "users", Key: []byte{0, 0xff}}, {Collection: "fail", Key: []byte(c.kv)}})
			}
			var be *kv.BatchError
			if !errors.As(err, &be) {
				t.Fatalf("batch %s failing with %s: %#v is not a *kv.BatchError", op, c.kv, err)
			}
			if len(be.Applied) != 2 {
				t.Fatalf("batch %s failing with %s: applied %+v", op, c.kv, be.Applied)
			}
			v := be.Applied[0].Version
			want := &kv.BatchError{
				Err:     &kv.Error{Code: c.kv, Message: grpcFakeMessage(c.kv)},
				Applied: []kv.WriteResult{{Collection: "users", Key: []byte("a"), Version: v}, {Collection: "users", Key: []byte{0, 0xff}, Version: v}},
			}
			if !reflect.DeepEqual(err, want) {
				t.Errorf("batch %s failing with %s: %#v, want %#v", op, c.kv, err, want)
			}
			if !errors.Is(err, &kv.Error{Code: c.kv}) || kv.CodeOf(err) != c.kv {
				t.Errorf("batch %s failing with %s: errors.Is or CodeOf do not see the code", op, c.kv)
			}
		}
	}
	// The applied records stay written.
	got, err := db.BatchGet(ctx, []kv.KeyRef{{Collection: "users", Key: []byte("a")}, {Collection: "users", Key: []byte("never")}})
	if err != nil || !got.Items[0].Found || got.Items[1].Found {
		t.Fatalf("BatchGet after the failed batches = %+v, %v", got, err)
	}
}

// TestGRPCBatchErrorLarge sends the largest applied list a batch can have,
// every key of the most keys at the longest length: it rides in a trailer,
// whose size gRPC bounds separately from messages.
func TestGRPCBatchErrorLarge(t *testing.T) {
	ctx := context.Background()
	_, db := grpcStart(t)
	if _, err := db.CreateCollection(ctx, kv.CollectionOptions{Name: "c"}); err != nil {
		t.Fatal(err)
	}
	var items []kv.PutItem
	for i := range kv.DefaultMaxBatchKeys - 1 {
		key := bytes.Repeat([]byte{0xff}, kv.MaxKeySize)
		copy(key, fmt.Sprintf("%04d", i))
		items = append(items, kv.PutItem{Collection: "c", Key: key})
	}
	items = append(items, kv.PutItem{Collection: "fail", Key: []byte(kv.CodeUnavailable)})
	_, err := db.BatchPut(ctx, items)
	var be *kv.BatchError
	if !errors.As(err, &be) || kv.CodeOf(err) != kv.CodeUnavailable {
		t.Fatalf("BatchPut: %v", err)
	}
	if len(be.Applied) != len(items)-1 || !bytes.Equal(be.Applied[17].Key, items[17].Key) {
		t.Fatalf("applied %d records, want %d", len(be.Applied), len(items)-1)
	}
}

// TestGRPCBatchErrorWire checks a *kv.BatchError on the wire with a bare
// gRPC client: the status of its Err, both details and the trailer.
func TestGRPCBatchErrorWire(t *testing.T) {
	f := newGRPCFake()
	addr, _ := grpcServe(t, f)
	if _, err := f.CreateCollection(context.Background(), kv.CollectionOptions{Name: "users"}); err != nil {
		t.Fatal(err)
	}
	c := grpcBare(t, addr)
	var trailer metadata.MD
	_, err := c.BatchPut(context.Background(), &pb.BatchPutRequest{Items: []*pb.PutItem{
		{Collection: "users", Key: []byte("a")},
		{Collection: "fail", Key: []byte(kv.CodeCommitUnknown)},
	}}, grpc.Trailer(&trailer))
	st := status.Convert(err)
	if st.Code() != codes.Unknown || st.Message() != grpcFakeMessage(kv.CodeCommitUnknown) {
		t.Errorf("status %v %q", st.Code(), st.Message())
	}
	if got := trailer.Get(api.CodeTrailer); len(got) != 1 || got[0] != string(kv.CodeCommitUnknown) {
		t.Errorf("trailer %s = %q", api.CodeTrailer, got)
	}
	d := st.Details()
	if len(d) != 2 {
		t.Fatalf("details %v, want an ErrorDetail and a BatchErrorDetail", d)
	}
	if ed, ok := d[0].(*pb.ErrorDetail); !ok || ed.GetCode() != string(kv.CodeCommitUnknown) {
		t.Errorf("first detail %v", d[0])
	}
	bd, ok := d[1].(*pb.BatchErrorDetail)
	if !ok || len(bd.GetApplied()) != 1 || string(bd.GetApplied()[0].GetKey()) != "a" || bd.GetApplied()[0].GetVersion() == 0 {
		t.Errorf("second detail %v", d[1])
	}
}

func TestGRPCBatchErrorStatus(t *testing.T) {
	// An empty applied list still makes a *kv.BatchError, with a non-nil
	// list.
	st, code := api.StatusFromError(&kv.BatchError{Err: kv.Errorf(kv.CodeUnavailable, "m")})
	if code != kv.CodeUnavailable {
		t.Fatalf("code %s", code)
	}
	err := api.ErrorFromStatus(st.Err(), false)
	want := &kv.BatchError{Err: &kv.Error{Code: kv.CodeUnavailable, Message: "m"}, Applied: []kv.WriteResult{}}
	if !reflect.DeepEqual(err, want) {
		t.Fatalf("round trip of an empty BatchError: %#v, want %#v", err, want)
	}
	// A BatchError without a cause is internal, not a panic.
	st, code = api.StatusFromError(&kv.BatchError{Applied: []kv.WriteResult{{Collection: "c", Key: []byte("k"), Version: 3}}})
	var be *kv.BatchError
	if err := api.ErrorFromStatus(st.Err(), false); code != kv.CodeInternal || !errors.As(err, &be) || len(be.Applied) != 1 {
		t.Fatalf("BatchError without Err: %s, %#v", code, err)
	}
}

func TestGRPCScanTagsDeleteRange(t *testing.T) {
	ctx := context.Background()
	_, db := grpcStart(t)
	if _, err := db.CreateCollection(ctx, kv.CollectionOptions{Name: "c"}); err != nil {
		t.Fatal(err)
	}
	keys := []string{"a", "b", "c", "d", "e\xff"}
	tags := [][]string{{"x", "y"}, {"x"}, {"y"}, nil, {"x", "y", "z"}}
	var recs []kv.Record
	for i, k := range keys {
		v, err := db.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte(k), Value: []byte("v" + k), Tags: tags[i]})
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, kv.Record{Key: []byte(k), Value: []byte("v" + k), Tags: tags[i], Version: v})
	}
	last := recs[len(recs)-1].Version

	all, err := db.Scan(ctx, kv.ScanRequest{Collection: "c"})
	if err != nil {
		t.Fatal(err)
	}
	if want := (kv.ScanResult{Items: recs, Version: last}); !reflect.DeepEqual(all, want) {
		t.Fatalf("Scan = %+v\nwant %+v", all, want)
	}

	// Paged, reversed, bounded: every field reaches the backend.
	var paged []kv.Record
	req := kv.ScanRequest{Collection: "c", Start: []byte("b"), End: []byte("e"), Limit: 2, Reverse: true}
	for n := 0; ; n++ {
		res, err := db.Scan(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if res.Version != last {
			t.Fatalf("page %d at version %d, want %d", n, res.Version, last)
		}
		paged = append(paged, res.Items...)
		if res.NextPage == "" {
			break
		}
		req.Page = res.NextPage
	}
	if want := []kv.Record{recs[3], recs[2], recs[1]}; !reflect.DeepEqual(paged, want) {
		t.Fatalf("reverse paged scan = %+v\nwant %+v", paged, want)
	}

	// The version of a scan reads the past.
	old, err := db.Scan(ctx, kv.ScanRequest{Collection: "c", Version: recs[1].Version})
	if err != nil || len(old.Items) != 2 || old.Version != recs[1].Version {
		t.Fatalf("Scan at version %d = %+v, %v", recs[1].Version, old, err)
	}

	byAll, err := db.GetByTags(ctx, kv.TagQuery{Collection: "c", All: []string{"x", "y"}})
	if want := []kv.Record{recs[0], recs[4]}; err != nil || !reflect.DeepEqual(byAll.Items, want) {
		t.Fatalf("GetByTags all x,y = %+v, %v", byAll, err)
	}
	byAny, err := db.GetByTags(ctx, kv.TagQuery{Collection: "c", Any: []string{"z", "y"}, Limit: 2})
	if want := []kv.Record{recs[0], recs[2]}; err != nil || !reflect.DeepEqual(byAny.Items, want) || byAny.NextPage == "" {
		t.Fatalf("GetByTags any z,y limit 2 = %+v, %v", byAny, err)
	}
	rest, err := db.GetByTags(ctx, kv.TagQuery{Collection: "c", Any: []string{"z", "y"}, Limit: 2, Page: byAny.NextPage})
	if want := []kv.Record{recs[4]}; err != nil || !reflect.DeepEqual(rest.Items, want) || rest.NextPage != "" {
		t.Fatalf("GetByTags second page = %+v, %v", rest, err)
	}
	none, err := db.GetByTags(ctx, kv.TagQuery{Collection: "c", All: []string{"nobody"}})
	if err != nil || none.Items == nil || len(none.Items) != 0 {
		t.Fatalf("GetByTags with no match = %#v, %v", none, err)
	}
	_, err = db.GetByTags(ctx, kv.TagQuery{Collection: "c", All: []string{"x"}, Any: []string{"y"}})
	wantCode(t, "tag query with all and any", err, kv.CodeInvalidArgument)

	// A limit beyond any int32 reaches the server's check unchanged.
	_, err = db.Scan(ctx, kv.ScanRequest{Collection: "c", Limit: math.MaxInt})
	wantCode(t, "scan with a huge limit", err, kv.CodeInvalidArgument)
	_, err = db.Scan(ctx, kv.ScanRequest{Collection: "c", Limit: -1})
	wantCode(t, "scan with a negative limit", err, kv.CodeInvalidArgument)

	del, err := db.DeleteRange(ctx, kv.DeleteRangeRequest{Collection: "c", Start: []byte("b"), End: []byte("d")})
	if err != nil || del.Deleted != 2 {
		t.Fatalf("DeleteRange [b, d) = %+v, %v", del, err)
	}
	del, err = db.DeleteRange(ctx, kv.DeleteRangeRequest{Collection: "c", Start: []byte("e")})
	if err != nil || del.Deleted != 1 {
		t.Fatalf("DeleteRange [e, ∞) = %+v, %v", del, err)
	}
	left, err := db.Scan(ctx, kv.ScanRequest{Collection: "c"})
	if want := []kv.Record{recs[0], recs[3]}; err != nil || !reflect.DeepEqual(left.Items, want) {
		t.Fatalf("Scan after DeleteRange = %+v, %v", left, err)
	}

	for _, c := range grpcCodes {
		want := &kv.Error{Code: c.kv, Message: grpcFakeMessage(c.kv)}
		_, scanErr := db.Scan(ctx, kv.ScanRequest{Collection: "fail", Start: []byte(c.kv)})
		_, tagsErr := db.GetByTags(ctx, kv.TagQuery{Collection: "fail", All: []string{string(c.kv)}})
		_, delErr := db.DeleteRange(ctx, kv.DeleteRangeRequest{Collection: "fail", Start: []byte(c.kv)})
		_, getErr := db.BatchGet(ctx, []kv.KeyRef{{Collection: "fail", Key: []byte(c.kv)}})
		for name, err := range map[string]error{"scan": scanErr, "tags": tagsErr, "delete range": delErr, "batch get": getErr} {
			if !reflect.DeepEqual(err, want) {
				t.Errorf("%s %s: got %#v, want %#v", name, c.kv, err, want)
			}
		}
	}
}

// watchCollect runs db.Watch in a goroutine and passes its events on a
// channel; the returned channel of the error receives Watch's answer.
func watchCollect(ctx context.Context, db groupkv.DB, req kv.WatchRequest) (<-chan kv.Event, <-chan error) {
	evs := make(chan kv.Event, 100)
	errc := make(chan error, 1)
	go func() {
		errc <- db.Watch(ctx, req, func(ev kv.Event) error {
			evs <- ev
			return nil
		})
	}()
	return evs, errc
}

// nextEvent waits for the next event of a watch.
func nextEvent(t *testing.T, evs <-chan kv.Event, errc <-chan error) kv.Event {
	t.Helper()
	select {
	case ev := <-evs:
		return ev
	case err := <-errc:
		t.Fatalf("watch ended: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no event within 10s")
	}
	panic("unreachable")
}

// waitFor polls cond for up to 10s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestGRPCWatch(t *testing.T) {
	ctx := context.Background()
	f, db := grpcStart(t)
	if _, err := db.CreateCollection(ctx, kv.CollectionOptions{Name: "c"}); err != nil {
		t.Fatal(err)
	}
	v1, _ := db.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte{'a', 0xff}, Value: []byte{0, 1}, Tags: []string{"t1", "t2"}})
	rs, err := db.BatchPut(ctx, []kv.PutItem{{Collection: "c", Key: []byte("b"), Value: []byte("vb")}, {Collection: "c", Key: []byte("c")}})
	if err != nil {
		t.Fatal(err)
	}
	v2 := rs[0].Version
	v3, _ := db.Delete(ctx, kv.DeleteRequest{Collection: "c", Key: []byte("b")})

	// Events arrive in order, with every field; a watch that caught up sends
	// progress, and later writes follow.
	wctx, cancel := context.WithCancel(ctx)
	evs, errc := watchCollect(wctx, db, kv.WatchRequest{Collection: "c"})
	want := []kv.Event{
		{Type: kv.EventPut, Key: []byte{'a', 0xff}, Value: []byte{0, 1}, Tags: []string{"t1", "t2"}, Version: v1},
		{Type: kv.EventPut, Key: []byte("b"), Value: []byte("vb"), Version: v2},
		{Type: kv.EventPut, Key: []byte("c"), Version: v2},
		{Type: kv.EventDelete, Key: []byte("b"), Version: v3},
		{Type: kv.EventProgress, Version: v3},
	}
	for i, w := range want {
		if ev := nextEvent(t, evs, errc); !reflect.DeepEqual(ev, w) {
			t.Fatalf("event %d = %+v, want %+v", i, ev, w)
		}
	}
	v4, _ := db.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte("d"), Value: []byte("vd")})
	if ev := nextEvent(t, evs, errc); ev.Type != kv.EventPut || string(ev.Key) != "d" || ev.Version != v4 {
		t.Fatalf("event after a new put = %+v", ev)
	}
	if ev := nextEvent(t, evs, errc); ev.Type != kv.EventProgress || ev.Version != v4 {
		t.Fatalf("progress after a new put = %+v", ev)
	}

	// Canceling the caller's context ends the watch on both sides.
	cancel()
	select {
	case err := <-errc:
		if err != context.Canceled {
			t.Fatalf("canceled watch: %#v, want context.Canceled itself", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a canceled watch did not return")
	}
	waitFor(t, "the server's watch ends", func() bool { return f.watching() == 0 })

	// A deadline ends it with DeadlineExceeded (which the server may notice
	// first).
	dctx, dcancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer dcancel()
	if err := db.Watch(dctx, kv.WatchRequest{Collection: "c"}, func(kv.Event) error { return nil }); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("watch past its deadline: %#v", err)
	}

	// Range, from-version and after-key reach the backend.
	var got []kv.Event
	stop := errors.New("stop")
	err = db.Watch(ctx, kv.WatchRequest{Collection: "c", Start: []byte("b"), End: []byte("d"), FromVersion: v2, AfterKey: []byte("b")},
		func(ev kv.Event) error {
			got = append(got, ev)
			if ev.Type == kv.EventProgress {
				return stop
			}
			return nil
		})
	if err != stop {
		t.Fatalf("watch whose fn failed: %#v, want fn's error itself", err)
	}
	wantRange := []kv.Event{
		{Type: kv.EventPut, Key: []byte("c"), Version: v2},
		{Type: kv.EventDelete, Key: []byte("b"), Version: v3},
		{Type: kv.EventProgress, Version: v4},
	}
	if !reflect.DeepEqual(got, wantRange) {
		t.Fatalf("range watch = %+v\nwant %+v", got, wantRange)
	}
	waitFor(t, "the server's watch ends after fn failed", func() bool { return f.watching() == 0 })
}

func TestGRPCWatchErrors(t *testing.T) {
	ctx := context.Background()
	f, db := grpcStart(t)
	if _, err := db.CreateCollection(ctx, kv.CollectionOptions{Name: "c"}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := db.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte{'k', byte('0' + i)}}); err != nil {
			t.Fatal(err)
		}
	}
	noEvent := func(ev kv.Event) error {
		t.Errorf("unexpected event %+v", ev)
		return nil
	}

	// A from-version below the retention window fails before any event.
	f.compact(2)
	err := db.Watch(ctx, kv.WatchRequest{Collection: "c", FromVersion: 1}, noEvent)
	e := wantCode(t, "watch from a compacted version", err, kv.CodeCompacted)
	if !errors.Is(err, groupkv.ErrCompacted) || !strings.Contains(e.Message, "compacted") {
		t.Errorf("compacted watch: %#v", err)
	}
	err = db.Watch(ctx, kv.WatchRequest{Collection: "nope"}, noEvent)
	wantCode(t, "watch of a missing collection", err, kv.CodeCollectionNotFound)

	for _, c := range grpcCodes {
		err := db.Watch(ctx, kv.WatchRequest{Collection: "fail", Start: []byte(c.kv)}, noEvent)
		if want := (&kv.Error{Code: c.kv, Message: grpcFakeMessage(c.kv)}); !reflect.DeepEqual(err, want) {
			t.Errorf("watch failing with %s: %#v, want %#v", c.kv, err, want)
		}
	}

	// An error during the stream ends it after the events sent before.
	evs, errc := watchCollect(ctx, db, kv.WatchRequest{Collection: "c", FromVersion: 2})
	if ev := nextEvent(t, evs, errc); string(ev.Key) != "k2" {
		t.Fatalf("first event %+v", ev)
	}
	if ev := nextEvent(t, evs, errc); ev.Type != kv.EventProgress {
		t.Fatalf("second event %+v", ev)
	}
	midErr := kv.Errorf(kv.CodeUnavailable, "shard 4 lost its leader: watch again from version 3")
	f.failWatches(midErr)
	select {
	case err := <-errc:
		if !reflect.DeepEqual(err, midErr) {
			t.Fatalf("watch failed midway: %#v, want %#v", err, midErr)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("watch did not end with the backend's error")
	}

	// The wire carries the status of unary errors: OUT_OF_RANGE, the detail
	// and the trailer.
	addr, _ := grpcServe(t, f)
	c := grpcBare(t, addr)
	stream, err := c.Watch(ctx, &pb.WatchRequest{Collection: "c", FromVersion: 1})
	if err != nil {
		t.Fatal(err)
	}
	_, err = stream.Recv()
	st := status.Convert(err)
	if st.Code() != codes.OutOfRange || len(st.Details()) != 1 || st.Details()[0].(*pb.ErrorDetail).GetCode() != string(kv.CodeCompacted) {
		t.Errorf("compacted watch on the wire: %v, details %v", st, st.Details())
	}
	if got := stream.Trailer().Get(api.CodeTrailer); len(got) != 1 || got[0] != string(kv.CodeCompacted) {
		t.Errorf("compacted watch: trailer %q", got)
	}
}

func TestGRPCWatchServerStop(t *testing.T) {
	ctx := context.Background()
	f := newGRPCFake()
	if _, err := f.CreateCollection(ctx, kv.CollectionOptions{Name: "c"}); err != nil {
		t.Fatal(err)
	}
	addr, srv := grpcServe(t, f)
	db := grpcDial(t, addr)
	evs, errc := watchCollect(ctx, db, kv.WatchRequest{Collection: "c"})
	if _, err := db.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte("k")}); err != nil {
		t.Fatal(err)
	}
	nextEvent(t, evs, errc)
	srv.Stop()
	select {
	case err := <-errc:
		wantCode(t, "watch of a stopped server", err, kv.CodeUnavailable)
	case <-time.After(10 * time.Second):
		t.Fatal("watch did not end when the server stopped")
	}
}

func TestGRPCStreamMetricsInterceptor(t *testing.T) {
	type obs struct {
		op   string
		code kv.Code
	}
	var mu sync.Mutex
	var got []obs
	record := func(op string, code kv.Code, seconds float64) {
		if seconds < 0 {
			t.Errorf("%s: negative duration %v", op, seconds)
		}
		mu.Lock()
		defer mu.Unlock()
		got = append(got, obs{op, code})
	}
	f, db := grpcStart(t, grpc.ChainStreamInterceptor(api.GRPCStreamMetricsInterceptor(record)))
	ctx := context.Background()
	if _, err := f.CreateCollection(ctx, kv.CollectionOptions{Name: "c"}); err != nil {
		t.Fatal(err)
	}
	f.compact(5)
	_ = db.Watch(ctx, kv.WatchRequest{Collection: "c", FromVersion: 1}, func(kv.Event) error { return nil })
	dctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_ = db.Watch(dctx, kv.WatchRequest{Collection: "c", FromVersion: 5}, func(kv.Event) error { return nil })

	// A watch whose client went away did what it was asked: no error.
	want := []obs{{"watch", kv.CodeCompacted}, {"watch", ""}}
	waitFor(t, "both watches observed", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == 2
	})
	mu.Lock()
	defer mu.Unlock()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("observed %v, want %v", got, want)
	}
}

// snapshotless is a grpcFake whose batch gets fail the test: an independent
// batch get must read each key with Get.
type snapshotless struct {
	*grpcFake
	t *testing.T
}

func (s snapshotless) BatchGet(context.Context, []kv.KeyRef) (kv.BatchGetResult, error) {
	s.t.Error("an independent batch get read the keys at one version")
	return kv.BatchGetResult{}, kv.Errorf(kv.CodeInternal, "not here")
}

// TestGRPCIndependentBatchGet: a batch get with independent set reads each
// key by a Get of its own: found, not found (an item not found), and any
// other error of one key fails the call with that error.
func TestGRPCIndependentBatchGet(t *testing.T) {
	f := newGRPCFake()
	ctx := context.Background()
	if _, err := f.CreateCollection(ctx, kv.CollectionOptions{Name: "c"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte("a"), Value: []byte("1"), Tags: []string{"t"}}); err != nil {
		t.Fatal(err)
	}
	addr, _ := grpcServe(t, snapshotless{f, t})
	c := grpcBare(t, addr)
	res, err := c.BatchGet(ctx, &pb.BatchGetRequest{Independent: true, Keys: []*pb.KeyRef{{Collection: "c", Key: []byte("a")}, {Collection: "c", Key: []byte("b")}}})
	if err != nil {
		t.Fatal(err)
	}
	items := res.GetItems()
	if len(items) != 2 || !items[0].GetFound() || string(items[0].GetValue()) != "1" || !slices.Equal(items[0].GetTags(), []string{"t"}) ||
		items[0].GetVersion() == 0 || items[1].GetFound() || string(items[1].GetKey()) != "b" || res.GetVersion() != 0 {
		t.Fatalf("independent batch get: %v", res)
	}
	_, err = c.BatchGet(ctx, &pb.BatchGetRequest{Independent: true, Keys: []*pb.KeyRef{{Collection: "c", Key: []byte("a")}, {Collection: "nope", Key: []byte("a")}}})
	if got := api.ErrorFromStatus(err, false); kv.CodeOf(got) != kv.CodeCollectionNotFound {
		t.Fatalf("independent batch get of an unknown collection: %v", got)
	}
}
