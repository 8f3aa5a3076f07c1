package replication

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/shard"
	"github.com/groupkv/groupkv/internal/txn"
)

// syncGateFS is a filesystem whose WAL syncs (of files named *.log) wait,
// while the gate is held, until the test releases them one at a time.
type syncGateFS struct {
	vfs.FS
	mu      sync.Mutex
	held    bool
	tokens  chan struct{} // one per sync released
	entered chan struct{} // one per sync that waits
}

func newSyncGateFS() *syncGateFS {
	return &syncGateFS{FS: vfs.NewMem(), tokens: make(chan struct{}, 64), entered: make(chan struct{}, 64)}
}

// hold makes later WAL syncs wait for release.
func (fs *syncGateFS) hold() {
	fs.mu.Lock()
	fs.held = true
	fs.mu.Unlock()
}

// release lets one waiting (or the next) WAL sync through.
func (fs *syncGateFS) release() { fs.tokens <- struct{}{} }

// open lets every WAL sync through from now on.
func (fs *syncGateFS) open() {
	fs.mu.Lock()
	fs.held = false
	fs.mu.Unlock()
	for range 64 {
		select {
		case fs.tokens <- struct{}{}:
		default:
			return
		}
	}
}

func (fs *syncGateFS) wait() {
	fs.mu.Lock()
	held := fs.held
	fs.mu.Unlock()
	if held {
		fs.entered <- struct{}{}
		<-fs.tokens
	}
}

func (fs *syncGateFS) wrap(f vfs.File, name string, err error) (vfs.File, error) {
	if err != nil || !strings.HasSuffix(name, ".log") {
		return f, err
	}
	return gatedFile{f, fs}, nil
}

func (fs *syncGateFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, c)
	return fs.wrap(f, name, err)
}

func (fs *syncGateFS) ReuseForWrite(oldname, newname string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.ReuseForWrite(oldname, newname, c)
	return fs.wrap(f, newname, err)
}

func (fs *syncGateFS) OpenReadWrite(name string, c vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.OpenReadWrite(name, c, opts...)
	return fs.wrap(f, name, err)
}

type gatedFile struct {
	vfs.File
	fs *syncGateFS
}

func (f gatedFile) Sync() error {
	f.fs.wait()
	return f.File.Sync()
}

func (f gatedFile) SyncData() error {
	f.fs.wait()
	return f.File.SyncData()
}

func (f gatedFile) SyncTo(length int64) (bool, error) {
	f.fs.wait()
	return f.File.SyncTo(length)
}

// startGatedHost starts a one-voter host on a filesystem whose WAL syncs
// the test can hold (syncGateFS); everything stops when t ends.
func startGatedHost(t *testing.T) (*hostEnv, *syncGateFS) {
	fs := newSyncGateFS()
	t.Cleanup(fs.open)
	e := &hostEnv{t: t, fs: fs}
	e.openEngine()
	t.Cleanup(func() {
		fs.open()
		e.h.Stop()
		e.eng.Close()
	})
	e.startHost(true, &testVersions{})
	return e, fs
}

// TestHostAppliesSingleVoterWritesAhead checks the two halves of a cycle
// of a single voter under a steady load: a write is neither answered nor
// visible before its own entry is fsynced, and once it is, it is answered
// at once, applied while its fsync ran (markAhead), not in the next cycle:
// the loop, held as it takes the next proposal, has already answered it.
func TestHostAppliesSingleVoterWritesAhead(t *testing.T) {
	e, fs := startGatedHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// b's version is assigned by the loop only when the gate opens: the
	// loop stops there, in the cycle that takes b.
	gateB := newGate(t)
	e.vs.setGates(nil, gateB)
	fs.hold()
	base := e.queued()
	a := e.proposeAsync(ctx, putCmd("a", "1", nil))
	waitClosed(t, "a's fsync", fs.entered)
	b := e.proposeAsync(ctx, putCmd("b", "2", nil))
	e.waitQueued(base + 2)
	select {
	case r := <-a:
		t.Fatalf("a was answered (%+v) before its entry was fsynced", r)
	case <-time.After(20 * time.Millisecond):
	}
	if val, ver := e.read("a"); val != "" {
		t.Fatalf("a reads %q at %d before its entry was fsynced", val, ver)
	}

	fs.release() // a's fsync
	// The loop is held in the cycle that takes b: a was answered in its
	// own cycle.
	ra := waitResult(t, "a", a)
	waitClosed(t, "b's version assignment", gateB.entered)
	if ra.err != nil || ra.res.Err != nil {
		t.Fatalf("a: %v %v", ra.err, ra.res.Err)
	}
	if val, ver := e.read("a"); val != "1" || ver != ra.res.Version {
		t.Fatalf("a reads %q at %d once answered, want \"1\" at %d", val, ver, ra.res.Version)
	}
	gateB.open()
	waitClosed(t, "b's fsync", fs.entered)
	select {
	case r := <-b:
		t.Fatalf("b was answered (%+v) before its entry was fsynced", r)
	case <-time.After(20 * time.Millisecond):
	}
	if val, ver := e.read("b"); val != "" {
		t.Fatalf("b reads %q at %d before its entry was fsynced", val, ver)
	}
	fs.open()
	rb := waitResult(t, "b", b)
	if rb.err != nil || rb.res.Err != nil {
		t.Fatalf("b: %v %v", rb.err, rb.res.Err)
	}
	if rb.res.Version <= ra.res.Version {
		t.Fatalf("b answered at version %d, not above a's %d", rb.res.Version, ra.res.Version)
	}
	if val, ver := e.read("b"); val != "2" || ver != rb.res.Version {
		t.Fatalf("b reads %q at %d once answered, want \"2\" at %d", val, ver, rb.res.Version)
	}
}

// TestProposeThenWaitsForTheOutcome: a proposer whose context ends while
// its command is in flight gets ctx's error at once, but its then runs
// only once the command is applied: a plain write's locks (released in
// then) stay held while the write may still land.
func TestProposeThenWaitsForTheOutcome(t *testing.T) {
	e, fs := startGatedHost(t)

	fs.hold()
	ctx, cancel := context.WithCancel(context.Background())
	released := make(chan struct{})
	answered := make(chan error, 1)
	go func() {
		_, err := e.h.ProposeThen(ctx, testShardID, putCmd("a", "1", nil), func() { close(released) })
		answered <- err
	}()
	waitClosed(t, "a's fsync", fs.entered)
	cancel()
	select {
	case err := <-answered:
		if err != context.Canceled {
			t.Fatalf("ProposeThen with its context canceled: %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ProposeThen did not return when its context was canceled")
	}
	select {
	case <-released:
		t.Fatal("then ran while the command was still in flight")
	case <-time.After(20 * time.Millisecond):
	}
	fs.open()
	select {
	case <-released:
	case <-time.After(10 * time.Second):
		t.Fatal("then did not run once the command was applied")
	}
	if val, _ := e.read("a"); val != "1" {
		t.Fatalf("a reads %q once then ran, want \"1\" (applied before its locks go)", val)
	}
}

// TestHostRefusedBatchTakesBackItsVersions: when raft refuses a cycle's
// batch of commands (here the leader learned of a higher term just
// before), every command of the batch is answered unavailable, and the
// versions the batch took are taken back: the next version assigned
// follows the last one applied, not the refused ones.
func TestHostRefusedBatchTakesBackItsVersions(t *testing.T) {
	e := newHostEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ra, err := e.propose(ctx, putCmd("a", "1", nil))
	if err != nil || ra.Err != nil {
		t.Fatalf("a: %v %v", err, ra.Err)
	}

	// The loop is held assigning b's version; meanwhile a message of a
	// higher term arrives and c and d queue. The next cycle steps the
	// message first (the group follows another leader), then proposes c
	// and d, whose versions it assigned before raft refused them.
	gate := newGate(t)
	e.vs.setGates(gate)
	b := e.proposeAsync(ctx, putCmd("b", "2", nil))
	waitClosed(t, "b's version assignment", gate.entered)
	e.h.Deliver(Message{ShardID: testShardID, Msg: raftpb.Message{Type: raftpb.MsgHeartbeat, From: 2, To: 1, Term: 1000}})
	base := e.queued()
	c := e.proposeAsync(ctx, putCmd("c", "3", nil))
	d := e.proposeAsync(ctx, putCmd("d", "4", nil))
	e.waitQueued(base + 2)
	gate.open()

	rb := waitResult(t, "b", b)
	if rb.err != nil || rb.res.Err != nil {
		t.Fatalf("b: %v %v", rb.err, rb.res.Err)
	}
	for _, r := range []struct {
		name string
		ch   <-chan proposeResult
	}{{"c", c}, {"d", d}} {
		got := waitResult(t, r.name, r.ch)
		if got.err == nil || kv.CodeOf(got.err) != kv.CodeUnavailable || !strings.Contains(got.err.Error(), "refused the proposal") {
			t.Fatalf("%s: %+v, %v; want refused by raft", r.name, got.res, got.err)
		}
	}
	g := e.h.group(testShardID)
	g.mu.Lock()
	last, unapplied := g.mu.lastAssigned, append([]uint64(nil), g.mu.unapplied...)
	g.mu.Unlock()
	if last != rb.res.Version {
		t.Fatalf("last version assigned %d after c and d were refused, want b's %d", last, rb.res.Version)
	}
	for _, v := range unapplied {
		if v > rb.res.Version {
			t.Fatalf("refused version %d still awaited (unapplied %v)", v, unapplied)
		}
	}
}

// TestHostAnyVersionGoesAhead: while a write waits for a timestamp issued
// after it was queued, a prepare that may take any version
// (shard.AnyVersion) queued behind it is proposed on the timestamps at
// hand, and a plain write behind it keeps waiting. Versions still grow
// along the log: the waiting write, proposed next, gets a higher one.
func TestHostAnyVersionGoesAhead(t *testing.T) {
	e := newHostEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if r, err := e.propose(ctx, putCmd("a", "1", nil)); err != nil || r.Err != nil {
		t.Fatalf("a: %v %v", err, r)
	}
	base := e.queued()
	e.vs.setHoldFresh(true, base)
	w := e.proposeAsync(ctx, putCmd("w", "1", nil))
	e.waitQueued(base + 1)
	term, ok := e.h.LeaderTerm(testShardID)
	if !ok {
		t.Fatal("the test shard has no leader here")
	}
	prepare := func(key string, early bool) []byte {
		return shard.EncodeTxnPrepare(&shard.TxnPrepareCmd{Meta: txn.Meta{ID: txn.NewID(7, 1), Priority: 7, Attempt: 1, Start: 7,
			Anchor: txn.Anchor{Collection: testDesc.Collection, Bucket: cluster.Bucket([]byte("anchor")), Key: []byte("anchor")}},
			LockTerm: term, Early: early, Writes: []shard.Op{{Type: shard.OpPut, Bucket: cluster.Bucket([]byte(key)), Key: []byte(key), Value: []byte("v")}}})
	}
	x := e.proposeAsync(ctx, putCmd("x", "1", nil))
	e.waitQueued(base + 2)
	p := waitResult(t, "the prepare that may take any version", e.proposeAsync(ctx, prepare("p", true)))
	if p.err != nil || p.res.Err != nil {
		t.Fatalf("the prepare: %v %v", p.err, p.res.Err)
	}
	select {
	case r := <-w:
		t.Fatalf("w was answered (%+v) while it waited for a timestamp", r)
	case r := <-x:
		t.Fatalf("x, queued behind w, was answered (%+v) while w waited", r)
	case <-time.After(50 * time.Millisecond):
	}
	e.vs.setHoldFresh(false, 0)
	rw, rx := waitResult(t, "w", w), waitResult(t, "x", x)
	if rw.err != nil || rx.err != nil {
		t.Fatalf("w: %v, x: %v", rw.err, rx.err)
	}
	if !(p.res.Version < rw.res.Version && rw.res.Version < rx.res.Version) {
		t.Fatalf("versions: the prepare %d, w %d, x %d; want them growing in that order", p.res.Version, rw.res.Version, rx.res.Version)
	}
}
