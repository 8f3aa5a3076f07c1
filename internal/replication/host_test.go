package replication

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/shard"
	"github.com/groupkv/groupkv/internal/storage"
)

// testShardID is the data shard of these tests: a hash collection's only
// shard, owning every bucket.
const testShardID = 7

var testDesc = shard.Desc{ShardID: testShardID, Collection: 3, Partitioning: kv.PartitionHash, BucketStart: 0, BucketEnd: kv.NumBuckets}

// testVersions is a VersionSource counting up from 1. Tests freeze the
// Host loop at a chosen TryNext call with a gate, or make TryNext answer
// "not now" with paused.
type testVersions struct {
	mu     sync.Mutex
	next   uint64
	paused bool
	// calls counts the calls that were not paused.
	calls int
	// gates are consumed one per TryNext call that is not paused; a nil
	// gate lets its call through at once.
	gates []*versionGate
	// holdFresh refuses (TryNextAfter) the proposals numbered above
	// freshSeq that need a timestamp issued after they were queued, as a
	// node waiting for a window fetch would.
	holdFresh bool
	freshSeq  uint64
}

var _ SequencedVersionSource = (*testVersions)(nil)

func (v *testVersions) TryNextAfter(floor, seq uint64) (uint64, bool) {
	v.mu.Lock()
	held := v.holdFresh && seq > v.freshSeq
	v.mu.Unlock()
	if held {
		return 0, false
	}
	return v.TryNext(floor)
}

// setHoldFresh sets holdFresh, with freshSeq.
func (v *testVersions) setHoldFresh(hold bool, seq uint64) {
	v.mu.Lock()
	v.holdFresh, v.freshSeq = hold, seq
	v.mu.Unlock()
}

// versionGate holds one TryNext call: entered is closed when the call
// arrives, and the call answers once open is called.
type versionGate struct {
	entered, release chan struct{}
	once             sync.Once
}

// newGate returns a gate that t opens at the latest when it ends, so that a
// failing test does not leave the Host loop frozen and Stop hanging.
func newGate(t *testing.T) *versionGate {
	g := &versionGate{entered: make(chan struct{}), release: make(chan struct{})}
	t.Cleanup(g.open)
	return g
}

func (g *versionGate) open() { g.once.Do(func() { close(g.release) }) }

var _ VersionSource = (*testVersions)(nil)

func (v *testVersions) TryNext(floor uint64) (uint64, bool) {
	v.mu.Lock()
	if v.paused {
		v.mu.Unlock()
		return 0, false
	}
	v.calls++
	var g *versionGate
	if len(v.gates) > 0 {
		g, v.gates = v.gates[0], v.gates[1:]
	}
	v.mu.Unlock()
	if g != nil {
		close(g.entered)
		<-g.release
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.next = max(v.next+1, floor+1)
	return v.next, true
}

func (v *testVersions) setGates(gates ...*versionGate) {
	v.mu.Lock()
	v.gates = gates
	v.mu.Unlock()
}

func (v *testVersions) setPaused(p bool) {
	v.mu.Lock()
	v.paused = p
	v.mu.Unlock()
}

// appliedCmd is one call of the Applied hook.
type appliedCmd struct {
	shardID uint64
	kind    shard.CommandKind
	res     shard.Result
}

// hostEnv is a Host on a Pebble engine, on an in-memory filesystem unless
// said otherwise.
type hostEnv struct {
	t   testing.TB
	fs  vfs.FS
	dir string
	eng *storage.Engine
	vs  *testVersions
	reg *prometheus.Registry
	h   *Host

	mu struct {
		sync.Mutex
		// applied lists the Applied hook calls of the current Host in order.
		applied []appliedCmd
		// discard: the calls are not listed (benchmarks).
		discard bool
	}
}

func testLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// newHostEnv opens an engine, bootstraps the test shard and starts a Host
// serving it.
func newHostEnv(t testing.TB) *hostEnv {
	t.Helper()
	return newHostEnvOn(t, vfs.NewMem(), "/data")
}

// newHostEnvOn is newHostEnv with the engine in dir of fs.
func newHostEnvOn(t testing.TB, fs vfs.FS, dir string) *hostEnv {
	t.Helper()
	e := &hostEnv{t: t, fs: fs, dir: dir}
	e.openEngine()
	t.Cleanup(func() {
		e.h.Stop()
		e.eng.Close()
	})
	e.startHost(true, &testVersions{})
	return e
}

func (e *hostEnv) openEngine() {
	e.t.Helper()
	eng, err := storage.Open(e.dir, storage.Options{FS: e.fs, Logger: testLogger()})
	if err != nil {
		e.t.Fatal(err)
	}
	e.eng = eng
}

// startHost starts a new Host on the engine with version source vs; with
// bootstrap, it first writes the initial state of the test shard.
func (e *hostEnv) startHost(bootstrap bool, vs *testVersions) {
	e.t.Helper()
	e.mu.Lock()
	e.mu.applied = nil
	e.mu.Unlock()
	e.vs = vs
	e.reg = prometheus.NewRegistry()
	e.h = NewHost(Config{
		NodeID:       1,
		Engine:       e.eng,
		Versions:     vs,
		TickInterval: 10 * time.Millisecond,
		Metrics:      NewMetrics(e.reg),
		Logger:       testLogger(),
		Hooks: Hooks{Applied: func(shardID uint64, kind shard.CommandKind, res shard.Result) {
			e.mu.Lock()
			if !e.mu.discard {
				e.mu.applied = append(e.mu.applied, appliedCmd{shardID, kind, res})
			}
			e.mu.Unlock()
		}},
	})
	if bootstrap {
		if err := e.h.Bootstrap(testShardID, []uint64{1}, nil); err != nil {
			e.t.Fatal(err)
		}
	}
	e.h.Start()
	if err := e.h.AddGroup(testDesc, 1); err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.h.WaitReady(ctx, testShardID); err != nil {
		e.t.Fatal(err)
	}
}

// appliedWrites returns the versions of the writes the current Host applied
// and accepted, in apply order.
func (e *hostEnv) appliedWrites() []uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []uint64
	for _, a := range e.mu.applied {
		if a.shardID == testShardID && a.kind == shard.KindWrite && a.res.Err == nil {
			out = append(out, a.res.Version)
		}
	}
	return out
}

// waitApplied waits until the current Host's Applied hook has seen at
// least n accepted writes and returns their versions. A proposer is
// answered before the hooks of its cycle run, so a test that learned of a
// write from Propose waits here before it looks at the hooks.
func (e *hostEnv) waitApplied(n int) []uint64 {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := e.appliedWrites()
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("the Applied hook saw %d writes, want %d", len(got), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitQueued waits until the Host has taken n proposals since it started.
func (e *hostEnv) waitQueued(n uint64) {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		e.h.mu.Lock()
		got := e.h.mu.nextID
		e.h.mu.Unlock()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%d proposals queued, want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func (e *hostEnv) queued() uint64 {
	e.h.mu.Lock()
	defer e.h.mu.Unlock()
	return e.h.mu.nextID
}

// metric returns a counter's value, or a histogram's sample count and sum.
func (e *hostEnv) metric(name string) (count, sum float64) {
	e.t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		e.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if c := m.GetCounter(); c != nil {
				count += c.GetValue()
			}
			if h := m.GetHistogram(); h != nil {
				count += float64(h.GetSampleCount())
				sum += h.GetSampleSum()
			}
		}
	}
	return count, sum
}

func putCmd(key, value string, cond *uint64) []byte {
	op := shard.Op{Type: shard.OpPut, Bucket: cluster.Bucket([]byte(key)), Key: []byte(key), Value: []byte(value)}
	if cond != nil {
		op.HasCond, op.CondVersion = true, *cond
	}
	return shard.EncodeWrite([]shard.Op{op})
}

// read returns the latest value and version of key (version 0: absent).
// It reads the stored data key rather than asking the shard package, so
// that it sees what is stored, not what the read path makes of it.
func (e *hostEnv) read(key string) (string, uint64) {
	e.t.Helper()
	start, end := storage.CollectionSpan(testDesc.Collection)
	it, err := e.eng.DB.NewIter(&pebble.IterOptions{LowerBound: start, UpperBound: end})
	if err != nil {
		e.t.Fatal(err)
	}
	defer it.Close()
	// Versions of a key sort newest first: the first key at or after the
	// key's prefix is its newest version, if it has one.
	if it.SeekGE(storage.DataKeyPrefix(nil, testDesc.Collection, []byte(key))) {
		dk, err := storage.DecodeDataKey(it.Key())
		if err != nil {
			e.t.Fatal(err)
		}
		if string(dk.UserKey) != key {
			return "", 0
		}
		v, err := storage.DecodeValue(it.Value())
		if err != nil {
			e.t.Fatal(err)
		}
		if v.Tombstone {
			return "", 0
		}
		return string(v.Value), dk.Version
	}
	if err := it.Error(); err != nil {
		e.t.Fatal(err)
	}
	return "", 0
}

func (e *hostEnv) propose(ctx context.Context, cmd []byte) (shard.Result, error) {
	return e.h.Propose(ctx, testShardID, cmd)
}

type proposeResult struct {
	res shard.Result
	err error
}

// proposeAsync proposes cmd in a goroutine and delivers its outcome.
func (e *hostEnv) proposeAsync(ctx context.Context, cmd []byte) <-chan proposeResult {
	ch := make(chan proposeResult, 1)
	go func() {
		res, err := e.propose(ctx, cmd)
		ch <- proposeResult{res, err}
	}()
	return ch
}

func waitResult(t *testing.T, what string, ch <-chan proposeResult) proposeResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no outcome after 10s", what)
		return proposeResult{}
	}
}

func waitClosed(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not reached after 10s", what)
	}
}

// TestHostConcurrentProposals proposes puts and compare-and-set increments
// from many goroutines: every put is applied once at the version it was
// answered with, versions increase in apply order, and the conditions are
// checked at apply time (no lost increment).
func TestHostConcurrentProposals(t *testing.T) {
	e := newHostEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const (
		workers    = 16
		puts       = 30
		increments = 5
	)
	type acked struct {
		key, value string
		version    uint64
	}
	var (
		mu       sync.Mutex
		acks     []acked
		failures []string
		wg       sync.WaitGroup
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		failures = append(failures, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range puts {
				key, value := fmt.Sprintf("w%02d-%02d", w, i), fmt.Sprintf("v%d.%d", w, i)
				res, err := e.propose(ctx, putCmd(key, value, nil))
				if err != nil || res.Err != nil {
					fail("put %s: %v %v", key, err, res.Err)
					return
				}
				mu.Lock()
				acks = append(acks, acked{key, value, res.Version})
				mu.Unlock()
			}
			// Increment a shared counter with compare-and-set.
			for done := 0; done < increments; {
				val, ver := e.read("counter")
				n, _ := strconv.Atoi(val)
				res, err := e.propose(ctx, putCmd("counter", strconv.Itoa(n+1), &ver))
				switch {
				case err != nil:
					fail("increment: %v", err)
					return
				case res.Err == nil:
					done++
					mu.Lock()
					acks = append(acks, acked{"counter", strconv.Itoa(n + 1), res.Version})
					mu.Unlock()
				case res.Err.Code != kv.CodeConditionFailed:
					fail("increment: %v", res.Err)
					return
				}
			}
		}()
	}
	wg.Wait()
	for _, f := range failures {
		t.Error(f)
	}
	if t.Failed() {
		t.FailNow()
	}

	byVersion := make(map[uint64]acked)
	for _, a := range acks {
		if prev, ok := byVersion[a.version]; ok {
			t.Fatalf("%+v and %+v were answered with the same version", prev, a)
		}
		byVersion[a.version] = a
	}
	applied := e.waitApplied(len(acks))
	if len(applied) != len(acks) {
		t.Fatalf("%d writes applied, %d acknowledged", len(applied), len(acks))
	}
	for i, v := range applied {
		if i > 0 && v <= applied[i-1] {
			t.Fatalf("apply order: version %d applied after %d", v, applied[i-1])
		}
		if _, ok := byVersion[v]; !ok {
			t.Fatalf("applied version %d was answered to no proposer", v)
		}
	}
	for _, a := range acks {
		if a.key == "counter" {
			continue
		}
		if val, ver := e.read(a.key); val != a.value || ver != a.version {
			t.Fatalf("%s reads %q at %d, want %q at %d", a.key, val, ver, a.value, a.version)
		}
	}
	if val, _ := e.read("counter"); val != strconv.Itoa(workers*increments) {
		t.Fatalf("counter is %s after %d compare-and-set increments", val, workers*increments)
	}
	proposals, _ := e.metric("groupkv_raft_proposals_total")
	if int(proposals) < len(acks) {
		t.Fatalf("groupkv_raft_proposals_total %v, want at least %d", proposals, len(acks))
	}
	fsyncs, entries := e.metric("groupkv_raft_entries_per_fsync")
	t.Logf("%d proposals, %v fsync cycles persisting %v entries", int(proposals), fsyncs, entries)
}

// TestHostGroupCommit holds many concurrent proposals until all are queued,
// then lets them through: they are persisted in a few fsyncs, not one each.
func TestHostGroupCommit(t *testing.T) {
	e := newHostEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n = 64
	fsyncs0, entries0 := e.metric("groupkv_raft_entries_per_fsync")

	e.vs.setPaused(true)
	base := e.queued()
	results := make([]<-chan proposeResult, n)
	for i := range results {
		results[i] = e.proposeAsync(ctx, putCmd(fmt.Sprintf("k%02d", i), "v", nil))
	}
	e.waitQueued(base + n)
	e.vs.setPaused(false)
	seen := make(map[uint64]bool)
	for i, ch := range results {
		r := waitResult(t, fmt.Sprintf("proposal %d", i), ch)
		if r.err != nil || r.res.Err != nil {
			t.Fatalf("proposal %d: %v %v", i, r.err, r.res.Err)
		}
		if seen[r.res.Version] {
			t.Fatalf("version %d answered twice", r.res.Version)
		}
		seen[r.res.Version] = true
	}

	fsyncs1, entries1 := e.metric("groupkv_raft_entries_per_fsync")
	fsyncs, entries := fsyncs1-fsyncs0, entries1-entries0
	t.Logf("%d proposals persisted in %v fsync cycles (%v entries)", n, fsyncs, entries)
	if entries < n {
		t.Fatalf("%v entries persisted for %d proposals", entries, n)
	}
	if fsyncs > n/4 {
		t.Fatalf("%d queued proposals took %v fsync cycles: no group commit", n, fsyncs)
	}
}

// TestHostSnapshotRead freezes the Host loop right after it assigned a
// version to a proposal and checks that SnapshotRead waits for that
// proposal to be applied, and that proposals assigned afterwards land above
// the snapshot even though the version source answers small numbers.
func TestHostSnapshotRead(t *testing.T) {
	e := newHostEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := e.propose(ctx, putCmd("w0", "v", nil)); err != nil {
		t.Fatal(err)
	}

	// Calls of TryNext: b0 is held at g0 while b1 and b2 queue behind it;
	// then b1 gets its version and b2 is held at g2, leaving b1 assigned but
	// not applied.
	g0, g2 := newGate(t), newGate(t)
	e.vs.setGates(g0, nil, g2)
	base := e.queued()
	b0 := e.proposeAsync(ctx, putCmd("b0", "v", nil))
	waitClosed(t, "b0 waiting for a version", g0.entered)
	b1 := e.proposeAsync(ctx, putCmd("b1", "v", nil))
	e.waitQueued(base + 2)
	b2 := e.proposeAsync(ctx, putCmd("b2", "v", nil))
	e.waitQueued(base + 3)
	g0.open()
	waitClosed(t, "b2 waiting for a version", g2.entered)
	e.vs.mu.Lock()
	callsBefore := e.vs.calls
	e.vs.mu.Unlock()

	const ts = 1_000_000
	type readDone struct {
		err     error
		applied []uint64
	}
	read := make(chan readDone, 1)
	go func() {
		err := e.h.SnapshotRead(ctx, testShardID, ts)
		read <- readDone{err, e.appliedWrites()}
	}()
	select {
	case r := <-read:
		t.Fatalf("SnapshotRead(%d) returned (%v) while a proposal with a smaller version was not applied", ts, r.err)
	case <-time.After(50 * time.Millisecond):
	}
	g2.open()
	var rd readDone
	select {
	case rd = <-read:
	case <-time.After(10 * time.Second):
		t.Fatalf("SnapshotRead(%d) did not return after the loop went on", ts)
	}
	if rd.err != nil {
		t.Fatalf("SnapshotRead: %v", rd.err)
	}
	r0, r1, r2 := waitResult(t, "b0", b0), waitResult(t, "b1", b1), waitResult(t, "b2", b2)
	for i, r := range []proposeResult{r0, r1, r2} {
		if r.err != nil || r.res.Err != nil {
			t.Fatalf("b%d: %v %v", i, r.err, r.res.Err)
		}
	}
	if r1.res.Version >= ts {
		t.Fatalf("b1 got version %d; the test needs one below %d", r1.res.Version, ts)
	}
	found := false
	for _, v := range rd.applied {
		found = found || v == r1.res.Version
	}
	if !found {
		t.Fatalf("SnapshotRead(%d) returned before b1 (version %d) was applied; applied then: %v", ts, r1.res.Version, rd.applied)
	}
	if r2.res.Version <= ts {
		t.Fatalf("b2, assigned after SnapshotRead(%d), got version %d", ts, r2.res.Version)
	}
	// b2's held call was asked for a version above b1 only; the Host must
	// then ask for one above the raised watermark, not count up to it.
	e.vs.mu.Lock()
	extra := e.vs.calls - callsBefore
	e.vs.mu.Unlock()
	if extra > 2 {
		t.Fatalf("b2 took %d more calls of the version source to get above the watermark %d", extra, ts)
	}

	// The watermark stays raised, and a lower snapshot does not lower it.
	if err := e.h.SnapshotRead(ctx, testShardID, 5); err != nil {
		t.Fatal(err)
	}
	res, err := e.propose(ctx, putCmd("w1", "v", nil))
	if err != nil || res.Err != nil {
		t.Fatalf("w1: %v %v", err, res.Err)
	}
	if res.Version <= r2.res.Version {
		t.Fatalf("w1 got version %d, not above %d", res.Version, r2.res.Version)
	}
	// Every version assigned was issued by the version source (it is asked
	// for one above the watermark), so the source has passed ts too.
	e.vs.mu.Lock()
	source := e.vs.next
	e.vs.mu.Unlock()
	if source < res.Version {
		t.Fatalf("w1 got version %d, above anything the version source issued (%d)", res.Version, source)
	}
}

// TestHostUnknownShard checks that operations on a shard the Host does not
// serve fail with unavailable instead of hanging.
func TestHostUnknownShard(t *testing.T) {
	e := newHostEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := e.h.Propose(ctx, 999, putCmd("k", "v", nil))
	if !errors.Is(err, kv.ErrUnavailable) {
		t.Fatalf("propose to an unknown shard: %v, want unavailable", err)
	}
	if err := e.h.WaitReady(ctx, 999); !errors.Is(err, kv.ErrUnavailable) {
		t.Fatalf("WaitReady on an unknown shard: %v", err)
	}
	if err := e.h.SnapshotRead(ctx, 999, 1); !errors.Is(err, kv.ErrUnavailable) {
		t.Fatalf("SnapshotRead on an unknown shard: %v", err)
	}
	if e.h.Ready(999) || e.h.Leader(999) != 0 {
		t.Fatal("an unknown shard reports a leader")
	}
	// The counter is raised just after the proposer is answered.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		fails, _ := e.metric("groupkv_raft_proposals_failed_total")
		if fails == 1 {
			break
		}
		if fails > 1 || time.Now().After(deadline) {
			t.Fatalf("groupkv_raft_proposals_failed_total %v, want 1", fails)
		}
	}
}

// TestHostStopFailsPendingProposals stops a Host with one proposal handed
// to raft and others waiting: every proposer gets an answer, waiting ones
// unavailable (not performed) and the handed one success or commit_unknown.
func TestHostStopFailsPendingProposals(t *testing.T) {
	e := newHostEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g := newGate(t)
	e.vs.setGates(g)
	base := e.queued()
	handed := e.proposeAsync(ctx, putCmd("a", "v", nil))
	waitClosed(t, "a waiting for a version", g.entered)
	const waiting = 10
	var rest []<-chan proposeResult
	for i := range waiting {
		rest = append(rest, e.proposeAsync(ctx, putCmd(fmt.Sprintf("b%d", i), "v", nil)))
	}
	e.waitQueued(base + 1 + waiting)
	e.vs.setPaused(true) // the waiting proposals never get a version
	stopped := make(chan struct{})
	go func() {
		e.h.Stop()
		close(stopped)
	}()
	g.open()
	waitClosed(t, "Stop", stopped)

	r := waitResult(t, "a", handed)
	if r.err != nil && !errors.Is(r.err, kv.ErrCommitUnknown) {
		t.Fatalf("proposal handed to raft: %v, want success or commit_unknown", r.err)
	}
	for i, ch := range rest {
		if r := waitResult(t, fmt.Sprintf("b%d", i), ch); !errors.Is(r.err, kv.ErrUnavailable) {
			t.Fatalf("waiting proposal b%d: %+v %v, want unavailable", i, r.res, r.err)
		}
	}
	if _, err := e.propose(ctx, putCmd("c", "v", nil)); !errors.Is(err, kv.ErrUnavailable) {
		t.Fatalf("propose after Stop: %v, want unavailable", err)
	}
	if err := e.h.WaitReady(ctx, testShardID); !errors.Is(err, kv.ErrUnavailable) {
		t.Fatalf("WaitReady after Stop: %v, want unavailable", err)
	}
	if err := e.h.SnapshotRead(ctx, testShardID, 1); !errors.Is(err, kv.ErrUnavailable) {
		t.Fatalf("SnapshotRead after Stop: %v, want unavailable", err)
	}
	e.h.Stop() // a second Stop returns at once
}

// TestHostRestart stops a Host and starts a new one on the same engine,
// then on the engine closed and reopened: nothing applied is applied again,
// the applied index continues, the state is kept, and versions continue
// above the applied ones although the new version source starts at 1.
func TestHostRestart(t *testing.T) {
	e := newHostEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	want := make(map[string]uint64)
	var wg sync.WaitGroup
	var mu sync.Mutex
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10 {
				key := fmt.Sprintf("k%d-%d", w, i)
				res, err := e.propose(ctx, putCmd(key, key, nil))
				if err != nil || res.Err != nil {
					t.Errorf("put %s: %v %v", key, err, res.Err)
					return
				}
				mu.Lock()
				want[key] = res.Version
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	// A refused write is applied too (it moves the applied index).
	absent := uint64(0)
	if res, err := e.propose(ctx, putCmd("k0-0", "x", &absent)); err != nil || res.Err == nil || res.Err.Code != kv.CodeConditionFailed {
		t.Fatalf("conditional put on an existing key: %+v %v", res, err)
	}

	for _, reopen := range []bool{false, true} {
		e.h.Stop()
		sm, err := shard.Load(e.eng.DB, testDesc)
		if err != nil {
			t.Fatal(err)
		}
		applied, _ := sm.Applied()
		maxVersion := sm.MaxVersion()
		if reopen {
			if err := e.eng.Close(); err != nil {
				t.Fatal(err)
			}
			e.openEngine()
		}
		e.startHost(false, &testVersions{})
		if got := e.appliedWrites(); len(got) != 0 {
			t.Fatalf("reopen=%v: the restarted host applied writes again: %v", reopen, got)
		}
		for key, v := range want {
			if val, ver := e.read(key); val != key || ver != v {
				t.Fatalf("reopen=%v: %s reads %q at %d, want itself at %d", reopen, key, val, ver, v)
			}
		}
		key := fmt.Sprintf("after-%v", reopen)
		res, err := e.propose(ctx, putCmd(key, key, nil))
		if err != nil || res.Err != nil {
			t.Fatalf("reopen=%v: put after restart: %v %v", reopen, err, res.Err)
		}
		if res.Version <= maxVersion {
			t.Fatalf("reopen=%v: put after restart got version %d, not above the applied %d", reopen, res.Version, maxVersion)
		}
		want[key] = res.Version
		if got := e.waitApplied(1); len(got) != 1 || got[0] != res.Version {
			t.Fatalf("reopen=%v: applied after restart %v, want only %d", reopen, got, res.Version)
		}
		e.h.Stop()
		sm, err = shard.Load(e.eng.DB, testDesc)
		if err != nil {
			t.Fatal(err)
		}
		// The new leader's empty entry, then the put.
		if got, _ := sm.Applied(); got != applied+2 {
			t.Fatalf("reopen=%v: applied index %d after restart and one put, want %d", reopen, got, applied+2)
		}
		e.startHost(false, &testVersions{})
	}
}

// TestHostSumsChecksumsOffTheLoop holds a consistency checksum before it is
// summed and checks that the Host goes on applying writes meanwhile, and
// that the sum, computed afterwards, is of the state at the checksum's
// entry: a write applied after the entry is not in it.
func TestHostSumsChecksumsOffTheLoop(t *testing.T) {
	e := newHostEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := 0; i < 10; i++ {
		if _, err := e.propose(ctx, putCmd(fmt.Sprintf("k%d", i), "v", nil)); err != nil {
			t.Fatal(err)
		}
	}
	sum := func(id uint64) *shard.ChecksumJob {
		t.Helper()
		res, err := e.propose(ctx, shard.EncodeChecksum(id))
		if err != nil {
			t.Fatal(err)
		}
		if res.Checksum == nil || res.Checksum.ID != id || res.Checksum.Index == 0 {
			t.Fatalf("checksum %d: result %+v", id, res)
		}
		return res.Checksum
	}
	a := sum(1)
	waitClosed(t, "the first checksum", a.Done())
	if a.Err() != nil || len(a.Sum) != 32 || a.Pairs == 0 {
		t.Fatalf("first checksum: %+v, err %v", a.Checksum, a.Err())
	}

	gate := make(chan struct{})
	e.h.checksumGate = gate
	b := sum(2)
	// The loop is not held by the sum: a write after the entry is applied
	// and answered while the sum waits.
	if _, err := e.propose(ctx, putCmd("later", "v", nil)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-b.Done():
		t.Fatal("the checksum was summed before the gate opened")
	default:
	}
	close(gate)
	waitClosed(t, "the second checksum", b.Done())
	if b.Err() != nil {
		t.Fatal(b.Err())
	}
	// Nothing but the applied index changed between the two entries: the
	// same pairs (the write applied after the second is not among them).
	if b.Pairs != a.Pairs {
		t.Errorf("the checksum at %d summed %d pairs, the one at %d %d: it read a later write", b.Index, b.Pairs, a.Index, a.Pairs)
	}
	c := sum(3)
	waitClosed(t, "the third checksum", c.Done())
	if c.Err() != nil || c.Pairs <= b.Pairs {
		t.Errorf("the checksum after the write summed %d pairs (err %v), before it %d", c.Pairs, c.Err(), b.Pairs)
	}
	// Each sum is timed once it has ended (Done closes inside Run, a
	// little before the observation).
	deadline := time.Now().Add(10 * time.Second)
	for n, _ := e.metric("groupkv_replica_checksum_seconds"); n != 3; n, _ = e.metric("groupkv_replica_checksum_seconds") {
		if time.Now().After(deadline) {
			t.Fatalf("groupkv_replica_checksum_seconds counts %v sums, want 3", n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestHostStopEndsAHeldChecksum: a checksum still to be summed when the
// Host stops ends with an error instead of holding Stop.
func TestHostStopEndsAHeldChecksum(t *testing.T) {
	e := newHostEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e.h.checksumGate = make(chan struct{})
	res, err := e.propose(ctx, shard.EncodeChecksum(5))
	if err != nil {
		t.Fatal(err)
	}
	stopped := make(chan struct{})
	go func() {
		e.h.Stop()
		close(stopped)
	}()
	waitClosed(t, "Stop", stopped)
	waitClosed(t, "the checksum", res.Checksum.Done())
	if res.Checksum.Err() == nil {
		t.Fatalf("a checksum ended by Stop has a sum: %+v", res.Checksum.Checksum)
	}
}
