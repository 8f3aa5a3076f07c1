package storage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

func TestOpenLockedAndReopen(t *testing.T) {
	dir := t.TempDir()
	e, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir, Options{}); !errors.Is(err, ErrLocked) {
		t.Fatalf("second open: got %v, want ErrLocked", err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e, err = Open(dir, Options{})
	if err != nil {
		t.Fatalf("reopen after close: %v", err)
	}
	e.Close()
}

func TestUnknownFormatRefused(t *testing.T) {
	dir := t.TempDir()
	e, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.DB.Set(NodeKey(formatVersionKey), binary.BigEndian.AppendUint32(nil, FormatVersion+1), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	e.Close()
	if _, err := Open(dir, Options{}); !errors.Is(err, ErrUnknownFormat) {
		t.Fatalf("got %v, want ErrUnknownFormat", err)
	}
	// The refused open must have released the lock.
	if _, err := Open(dir, Options{}); errors.Is(err, ErrLocked) {
		t.Fatalf("lock leaked by refused open")
	}
}

// TestBlockCacheCachesWithFullMemtables fills the memtable to its full
// size (Pebble charges memtables to the block cache) and then reads one
// flushed key again and again: the reads after the first are served from
// the block cache, not the files.
func TestBlockCacheCachesWithFullMemtables(t *testing.T) {
	e, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	value := bytes.Repeat([]byte("v"), 1<<10)
	// fill writes size bytes of values under keys prefix%08d, without
	// syncing, in batches of about 4 MiB.
	fill := func(prefix string, size int) {
		b := e.DB.NewBatch()
		for i := range size / len(value) {
			if err := b.Set(fmt.Appendf(nil, "%s%08d", prefix, i), value, nil); err != nil {
				t.Fatal(err)
			}
			if b.Len() > 4<<20 {
				if err := b.Commit(pebble.NoSync); err != nil {
					t.Fatal(err)
				}
				b = e.DB.NewBatch()
			}
		}
		if err := b.Commit(pebble.NoSync); err != nil {
			t.Fatal(err)
		}
	}
	fill("key", memTableSize+memTableSize/4)
	if err := e.DB.Flush(); err != nil {
		t.Fatal(err)
	}
	// Writes after the flush grow the new memtable to its full size.
	fill("new", memTableSize)
	before := e.DB.Metrics().BlockCache
	const reads = 100
	for range reads {
		_, closer, err := e.DB.Get([]byte("key00000007"))
		if err != nil {
			t.Fatal(err)
		}
		closer.Close()
	}
	after := e.DB.Metrics().BlockCache
	hits, misses := after.Hits-before.Hits, after.Misses-before.Misses
	t.Logf("memtables %d bytes; %d reads of one key: %d block cache hits, %d misses", e.DB.Metrics().MemTable.Size, reads, hits, misses)
	if misses > hits/(reads/2) {
		t.Fatalf("%d reads of one key missed the block cache %d times (%d hits): the cache holds nothing", reads, misses, hits)
	}
}

// TestFormatTwoUpgraded: a directory of format 2 opens and is marked with
// the current format; formats below 2 are refused like those above.
func TestFormatTwoUpgraded(t *testing.T) {
	for _, tc := range []struct {
		stored uint32
		opens  bool
	}{{2, true}, {1, false}, {0, false}} {
		dir := t.TempDir()
		e, err := Open(dir, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.DB.Set(NodeKey(formatVersionKey), binary.BigEndian.AppendUint32(nil, tc.stored), pebble.Sync); err != nil {
			t.Fatal(err)
		}
		e.Close()
		e, err = Open(dir, Options{})
		if !tc.opens {
			if !errors.Is(err, ErrUnknownFormat) {
				t.Errorf("format %d: got %v, want ErrUnknownFormat", tc.stored, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("format %d: %v", tc.stored, err)
		}
		v, _, err := GetValue(e.DB, NodeKey(formatVersionKey))
		e.Close()
		if err != nil || binary.BigEndian.Uint32(v) != FormatVersion {
			t.Errorf("format %d: stored %x after open, want %d (%v)", tc.stored, v, FormatVersion, err)
		}
	}
}

func TestDecodeLatest(t *testing.T) {
	enc := EncodeValue(nil, MVCCValue{Bucket: 7, Tags: []string{"t"}, Value: []byte("v")})
	p := EncodeLatest(nil, 42, 7, enc)
	v, b, got, err := DecodeLatest(p)
	if err != nil || v != 42 || b != 7 || !bytes.Equal(got, enc) {
		t.Fatalf("got %d %d %x %v", v, b, got, err)
	}
	if v, b, got, err := DecodeLatest(p[:10]); err != nil || v != 42 || b != 7 || got != nil {
		t.Fatalf("format 2 pointer: got %d %d %x %v", v, b, got, err)
	}
	for _, n := range []int{0, 9, 11, 13} {
		if _, _, _, err := DecodeLatest(p[:n]); !errors.Is(err, ErrCorruptValue) {
			t.Errorf("%d bytes: got %v, want ErrCorruptValue", n, err)
		}
	}
}

// TestFlushLoggedAtDebugOnly checks that the engine's event listener logs
// a memtable flush at debug level, and nothing of it above.
func TestFlushLoggedAtDebugOnly(t *testing.T) {
	for _, level := range []slog.Level{slog.LevelDebug, slog.LevelInfo} {
		// slog's handler serializes its writes; the buffer is read after
		// Close, once Pebble's goroutines are done.
		var buf bytes.Buffer
		logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: level}))
		e, err := Open(t.TempDir(), Options{Logger: logger})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.DB.Set([]byte("k"), []byte("v"), pebble.Sync); err != nil {
			t.Fatal(err)
		}
		if err := e.DB.Flush(); err != nil {
			t.Fatal(err)
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		logged := strings.Contains(buf.String(), "flushed")
		if level == slog.LevelDebug && !logged {
			t.Errorf("debug level: no flush logged:\n%s", buf.String())
		}
		if level == slog.LevelInfo && buf.String() != "" {
			t.Errorf("info level: logged:\n%s", buf.String())
		}
	}
}

// TestBackgroundFailureLimit: flushes (or compactions) that fail every
// time for the limit, by the injected clock, and at least three times,
// are reported once; a success
// in between (a flush that had nothing to write is one) starts the count
// again; a cancelled compaction is no failure; one kind's failures do not
// count for the other.
func TestBackgroundFailureLimit(t *testing.T) {
	now := time.Unix(1000, 0)
	var reported []error
	fat := &fatal{}
	fat.fn = func(err error) { reported = append(reported, err) }
	bg := &background{limit: 10 * time.Second, now: func() time.Time { return now }, log: slog.New(slog.DiscardHandler), report: fat.report}
	el := eventListener(slog.New(slog.DiscardHandler), fat, bg, new(atomic.Int64))
	failedFlush := pebble.FlushInfo{Err: errors.New("disk says no")}
	step := func(d time.Duration) { now = now.Add(d) }

	el.FlushEnd(failedFlush)
	step(9 * time.Second)
	el.FlushEnd(failedFlush)
	el.FlushEnd(pebble.FlushInfo{Err: errors.New(errEmptyTable)}) // a success: the count starts again
	step(5 * time.Second)
	el.FlushEnd(failedFlush)
	step(9 * time.Second)
	el.FlushEnd(failedFlush)
	// Compactions failing meanwhile are counted on their own.
	el.CompactionEnd(pebble.CompactionInfo{Err: errors.New("no room")})
	el.CompactionEnd(pebble.CompactionInfo{Err: pebble.ErrCancelledCompaction})
	if len(reported) != 0 {
		t.Fatalf("reported before the limit: %v", reported)
	}
	step(time.Second)
	el.FlushEnd(failedFlush)
	if len(reported) != 1 || !strings.Contains(reported[0].Error(), "flushes have failed for 10s, 3 times") || !strings.Contains(reported[0].Error(), "disk says no") {
		t.Fatalf("reported %v, want the flushes, once", reported)
	}
	step(time.Minute)
	el.FlushEnd(failedFlush)
	el.CompactionEnd(pebble.CompactionInfo{Err: pebble.ErrCancelledCompaction})
	if len(reported) != 1 {
		t.Fatalf("flushes reported again: %v", reported)
	}
	el.CompactionEnd(pebble.CompactionInfo{Err: errors.New("no room")})
	if len(reported) != 1 {
		t.Fatalf("compactions reported after two failures: %v", reported)
	}
	step(time.Second)
	el.CompactionEnd(pebble.CompactionInfo{Err: errors.New("no room")})
	if len(reported) != 2 || !strings.Contains(reported[1].Error(), "compactions have failed for 1m2s, 3 times") {
		t.Fatalf("reported %v, want the compactions second", reported)
	}
	if got := fat.first; got != reported[0] {
		t.Errorf("first fatal %v, want %v", got, reported[0])
	}

	// A negative limit never reports.
	bg.limit = -1
	bg.kinds = [2]backgroundKind{}
	el.FlushEnd(failedFlush)
	el.FlushEnd(failedFlush)
	step(time.Hour)
	el.FlushEnd(failedFlush)
	if len(reported) != 2 {
		t.Errorf("reported with no limit: %v", reported)
	}
}

// fullDisk fails every write of the files whose names end in suffix
// (".log", ".sst") with ENOSPC while on.
type fullDisk struct {
	suffix string
	on     atomic.Bool
}

func (f *fullDisk) String() string { return "ENOSPC on writes of *" + f.suffix }

func (f *fullDisk) MaybeError(op errorfs.Op) error {
	if f.on.Load() && op.Kind == errorfs.OpFileWrite && strings.HasSuffix(op.Path, f.suffix) {
		return fmt.Errorf("injected fault on %s: %w", op.Path, syscall.ENOSPC)
	}
	return nil
}

// TestFailedLogWriteIsAnError: Pebble panics on a commit whose sync of
// the write-ahead log failed (its fatal log line), and on a commit whose
// log write meets an earlier failure. The engine's writes answer an error
// instead, report it as fatal, and Close answers at once (Pebble's own
// would wait for good on the commit pipeline the second panic leaves
// locked).
func TestFailedLogWriteIsAnError(t *testing.T) {
	faults := &fullDisk{suffix: ".log"}
	mem := vfs.NewMem()
	e, err := Open("/data", Options{FS: errorfs.Wrap(mem, faults), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	var reported atomic.Pointer[error]
	e.OnFatal(func(err error) { reported.CompareAndSwap(nil, &err) })
	if err := e.Set([]byte("a"), []byte("1"), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	faults.on.Store(true)
	err = e.Set([]byte("b"), []byte("2"), pebble.Sync)
	if !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), "write-ahead log") {
		t.Fatalf("synced write on a failing log: %v, want the log's ENOSPC", err)
	}
	if r := reported.Load(); r == nil || !errors.Is(*r, syscall.ENOSPC) {
		t.Errorf("OnFatal got %v, want the failed write", r)
	}
	if f := e.Fatal(); !errors.Is(f, syscall.ENOSPC) {
		t.Errorf("Fatal() = %v, want the failed write", f)
	}
	// Unsynced commits go on into the log writer's buffer until it hands
	// a full block (32 KiB) to its flusher and takes the flusher's error.
	// They are small enough not to fill the memtable: Pebble's panic on
	// the log while it rotates memtables is one no one can recover (see
	// Commit).
	value := bytes.Repeat([]byte{'v'}, 1<<10)
	for i := 0; ; i++ {
		b := e.DB.NewBatch()
		b.Set(fmt.Appendf(nil, "c%d", i), value, nil)
		err := e.Commit(b, pebble.NoSync)
		if err != nil {
			if !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), "write-ahead log") {
				t.Fatalf("unsynced commit %d after the log failed: %v, want the log's ENOSPC", i, err)
			}
			t.Logf("unsynced commit %d after the log failed: %v", i, err)
			break
		}
		b.Close()
		if i == 200 {
			t.Fatal("200 unsynced commits of 1 KiB after the log failed answered no error")
		}
	}
	closed := make(chan error, 1)
	go func() { closed <- e.Close() }()
	select {
	case err := <-closed:
		if err == nil || !strings.Contains(err.Error(), "not closed") {
			t.Errorf("Close after the failed write: %v, want it to say the engine is not closed", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Close after the failed write still waits after a minute")
	}
}

// TestOpenGivesUpOnFailingFlushes reopens an engine whose write-ahead log
// holds writes on a disk that takes no sstable: Pebble's open flushes
// what it replays and waits for that flush, retrying it for good. Open
// answers an error once flushes have failed for BackgroundFailureLimit.
func TestOpenGivesUpOnFailingFlushes(t *testing.T) {
	faults := &fullDisk{suffix: ".sst"}
	fs := errorfs.Wrap(vfs.NewMem(), faults)
	opts := Options{FS: fs, Logger: slog.New(slog.DiscardHandler), BackgroundFailureLimit: 200 * time.Millisecond}
	e, err := Open("/data", opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Set([]byte("a"), []byte("1"), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	faults.on.Store(true)
	opened := make(chan error, 1)
	go func() {
		_, err := Open("/data", opts)
		opened <- err
	}()
	select {
	case err := <-opened:
		if err == nil || !strings.Contains(err.Error(), "no space left on device") || !strings.Contains(err.Error(), "flushes have failed") {
			t.Fatalf("Open on a disk that takes no sstable: %v, want the failing flushes named", err)
		}
		t.Logf("Open: %v", err)
	case <-time.After(time.Minute):
		// Liveness: a generous deadline that only catches an Open that
		// waits for good.
		t.Fatal("Open on a disk that takes no sstable still waits after a minute")
	}
	faults.on.Store(false) // Pebble's open, left running, finishes
}

// TestLowSpace: Open refuses a disk with less free space than
// MinFreeBytes, and an open engine reports it as fatal once its disk has
// less.
func TestLowSpace(t *testing.T) {
	mem := vfs.NewMem()
	opts := Options{FS: mem, Logger: slog.New(slog.DiscardHandler), MinFreeBytes: 10 << 20}
	mem.TestingSetDiskUsage(vfs.DiskUsage{AvailBytes: 9 << 20, TotalBytes: 100 << 20, UsedBytes: 91 << 20})
	_, err := Open("/data", opts)
	var low *LowSpaceError
	if !errors.As(err, &low) || low.Free != 9<<20 || low.Floor != 10<<20 {
		t.Fatalf("Open with 9 MiB free of the 10 kept: %v, want a LowSpaceError", err)
	}
	mem.TestingSetDiskUsage(vfs.DiskUsage{AvailBytes: 50 << 20, TotalBytes: 100 << 20, UsedBytes: 50 << 20})
	e, err := Open("/data", opts)
	if err != nil {
		t.Fatalf("Open with 50 MiB free: %v", err)
	}
	defer e.Close()
	reported := make(chan error, 1)
	e.OnFatal(func(err error) {
		select {
		case reported <- err:
		default:
		}
	})
	select {
	case err := <-reported:
		t.Fatalf("fatal with 50 MiB free: %v", err)
	case <-time.After(5 * freeSpaceInterval):
	}
	mem.TestingSetDiskUsage(vfs.DiskUsage{AvailBytes: 1 << 20, TotalBytes: 100 << 20, UsedBytes: 99 << 20})
	select {
	case err := <-reported:
		if !errors.As(err, &low) || !strings.Contains(err.Error(), "--min-free-space") {
			t.Fatalf("reported %v, want a LowSpaceError", err)
		}
		t.Log(err)
	case <-time.After(time.Minute):
		// Liveness: a generous deadline.
		t.Fatal("no fatal report a minute after the disk had 1 MiB free")
	}
}

// TestLowSpaceGoesOn: an owner that goes on with a low disk is told when
// the disk is low and when it has room again, and the disk is fatal only
// below half the floor.
func TestLowSpaceGoesOn(t *testing.T) {
	mem := vfs.NewMem()
	usage := func(free uint64) {
		mem.TestingSetDiskUsage(vfs.DiskUsage{AvailBytes: free, TotalBytes: 100 << 20, UsedBytes: 100<<20 - free})
	}
	usage(50 << 20)
	e, err := Open("/data", Options{FS: mem, Logger: slog.New(slog.DiscardHandler), MinFreeBytes: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	told := make(chan *LowSpaceError, 10)
	e.OnLowSpace(func(low *LowSpaceError) bool {
		told <- low
		return true
	})
	fatal := make(chan error, 1)
	e.OnFatal(func(err error) {
		select {
		case fatal <- err:
		default:
		}
	})
	// Liveness waits: generous deadlines that only catch a watch that
	// stopped looking.
	next := func(what string) *LowSpaceError {
		t.Helper()
		select {
		case low := <-told:
			return low
		case err := <-fatal:
			t.Fatalf("%s: fatal %v", what, err)
		case <-time.After(time.Minute):
			t.Fatalf("%s: not told within a minute", what)
		}
		return nil
	}
	quiet := func(what string) {
		t.Helper()
		select {
		case low := <-told:
			t.Fatalf("%s: told %v", what, low)
		case err := <-fatal:
			t.Fatalf("%s: fatal %v", what, err)
		case <-time.After(5 * freeSpaceInterval):
		}
	}
	usage(15 << 20)
	if low := next("15 MiB free of 16 kept"); low == nil || low.Free != 15<<20 || low.Floor != 16<<20 {
		t.Fatalf("15 MiB free of 16 kept: told %v, want the low disk", low)
	}
	usage(19 << 20) // above the floor, not a quarter above: still low
	quiet("19 MiB free")
	usage(20 << 20)
	if low := next("20 MiB free"); low != nil {
		t.Fatalf("20 MiB free: told %v, want room again", low)
	}
	usage(10 << 20)
	if low := next("10 MiB free again"); low == nil {
		t.Fatal("10 MiB free again: told room, want the low disk")
	}
	usage(7 << 20)
	select {
	case err := <-fatal:
		var low *LowSpaceError
		if !errors.As(err, &low) || low.Free != 7<<20 {
			t.Fatalf("7 MiB free: fatal %v, want the low disk", err)
		}
	case low := <-told:
		t.Fatalf("7 MiB free: told %v, want fatal", low)
	case <-time.After(time.Minute):
		t.Fatal("7 MiB free of 16 kept: no fatal report within a minute")
	}
}

// TestOpenLow: with OpenLow, Open takes a disk down to half the floor,
// and the low disk waits for OnLowSpace to be asked about.
func TestOpenLow(t *testing.T) {
	mem := vfs.NewMem()
	usage := func(free uint64) {
		mem.TestingSetDiskUsage(vfs.DiskUsage{AvailBytes: free, TotalBytes: 100 << 20, UsedBytes: 100<<20 - free})
	}
	opts := Options{FS: mem, Logger: slog.New(slog.DiscardHandler), MinFreeBytes: 16 << 20, OpenLow: true}
	usage(7 << 20)
	if _, err := Open("/data", opts); err == nil || !strings.Contains(err.Error(), "--min-free-space") {
		t.Fatalf("OpenLow with 7 MiB free of 16 kept: %v, want the low disk refused", err)
	}
	usage(9 << 20)
	e, err := Open("/data", opts)
	if err != nil {
		t.Fatalf("OpenLow with 9 MiB free of 16 kept: %v", err)
	}
	defer e.Close()
	fatal := make(chan error, 1)
	e.OnFatal(func(err error) {
		select {
		case fatal <- err:
		default:
		}
	})
	select {
	case err := <-fatal:
		t.Fatalf("fatal before OnLowSpace: %v", err)
	case <-time.After(5 * freeSpaceInterval):
	}
	told := make(chan *LowSpaceError, 1)
	e.OnLowSpace(func(low *LowSpaceError) bool {
		told <- low
		return false
	})
	select {
	case low := <-told:
		if low == nil || low.Free != 9<<20 {
			t.Fatalf("told %v, want the low disk", low)
		}
	case <-time.After(time.Minute): // liveness only
		t.Fatal("OnLowSpace not called within a minute")
	}
	select {
	case err := <-fatal:
		var low *LowSpaceError
		if !errors.As(err, &low) {
			t.Fatalf("fatal %v, want the low disk", err)
		}
	case <-time.After(time.Minute): // liveness only
		t.Fatal("an owner that does not go on: no fatal report within a minute")
	}
}
