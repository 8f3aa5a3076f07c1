package storage

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// FormatVersion is the on-disk format this binary writes. It also opens a
// directory of format 2, which it marks as format 3 (format 3 only adds to
// what format 2 may hold); a directory of any other format is refused, and
// so a binary that reads only format 2 refuses a directory this one wrote.
//
// Version 2 added the latest-version pointers (prefix 0x09). Version 3 lets
// a pointer carry the encoded newest version itself (EncodeLatest), so that
// reading the newest version is one point lookup; pointers of format 2
// (version and bucket only) are still read.
const FormatVersion uint32 = 3

// oldestFormatVersion is the oldest format Open accepts (and upgrades).
const oldestFormatVersion uint32 = 2

const (
	formatVersionKey = "format_version"
	lockFileName     = "groupkv.lock"
)

// Errors returned by Open.
var (
	// ErrLocked means another process has the data directory open.
	ErrLocked = errors.New("storage: data directory is in use by another groupkv process")
	// ErrUnknownFormat means the data directory was written in a format this
	// binary does not know.
	ErrUnknownFormat = errors.New("storage: unknown on-disk format")
)

// Options configure an Engine. The zero value is usable.
type Options struct {
	// FS is the filesystem; nil means the operating system's (vfs.Default).
	// Tests pass vfs.NewCrashableMem() or an errorfs wrapper.
	FS vfs.FS
	// CacheSize is the bytes of Pebble's block cache left for blocks; 0
	// means 256 MiB, enough for a node's hot set in tests and small
	// deployments. Pebble charges its memtables to the block cache, so the
	// cache is made larger by what they may hold (memReservation in Open).
	CacheSize int64
	// Logger receives Pebble's log lines; nil means slog.Default().
	Logger *slog.Logger
	// BackgroundFailureLimit is how long flushes, or compactions, may
	// fail every time they are tried (at least backgroundMinFailures
	// times) before the engine reports it as fatal (OnFatal); 0 means
	// DefaultBackgroundFailureLimit, negative never.
	BackgroundFailureLimit time.Duration
	// Now is the clock of BackgroundFailureLimit; nil means time.Now.
	Now func() time.Time
	// MemTableSize is the size of each memtable; 0 means 16 MiB
	// (memTableSize). Tests make it small to fill memtables quickly.
	MemTableSize uint64
	// MinFreeBytes is the free space the engine keeps on its disk: Open
	// refuses a directory on a disk with less, and once its disk has less
	// the engine asks its owner whether to go on refusing writes
	// (OnLowSpace), else reports it as fatal (OnFatal); 0 means
	// DefaultMinFreeBytes, negative no check.
	MinFreeBytes int64
	// OpenLow has Open take a disk with less than MinFreeBytes free, down
	// to half of it, for an owner that may go on refusing writes
	// (OnLowSpace): the watch of the free space asks nothing, and reports
	// nothing but a disk below half the floor, until OnLowSpace is called.
	OpenLow bool
}

// DefaultBackgroundFailureLimit is the default of
// Options.BackgroundFailureLimit: long enough to ride out a disk that
// refuses writes for a moment (a full disk being cleaned up), short
// enough that a node whose writes would wait for good stops, and lets its
// shards' other replicas lead.
const DefaultBackgroundFailureLimit = time.Minute

// Engine is a node's Pebble instance.
type Engine struct {
	DB   *pebble.DB
	FS   vfs.FS
	Dir  string
	lock io.Closer
	// fatal is what makes this engine unfit to go on: data found damaged
	// on disk, or background writes failing for good.
	fatal *fatal
	// stalls counts write stalls (WriteStalls).
	stalls *atomic.Int64
	// wedged holds the failed write that left Pebble unable to write or
	// close (recoverWrite).
	wedged atomic.Pointer[error]
	// space is the watch of the free space (checkLowSpace).
	space lowSpace
	// stop, closed by Close, ends the watch of the free space.
	stop     chan struct{}
	stopOnce sync.Once
}

// WriteStalls is how many times writes stopped to wait for flushes or
// compactions since the engine opened.
func (e *Engine) WriteStalls() int64 { return e.stalls.Load() }

// Commit commits b. Pebble panics when it cannot write a batch to its
// write-ahead log (a full disk, an I/O error), or sync it; after the
// first, the pipeline that orders commits stays locked and no later write
// returns. Commit answers such a panic as an error instead, and reports it
// as fatal (OnFatal), so that a node stops writing and says why rather
// than crash its process (or the program it is embedded in). A panic that is not an error, or is a
// runtime error, is not Pebble's: it goes on. One failure cannot be
// recovered: a log that fails as Pebble closes it to start a new one
// (the memtable filled) panics with Pebble's mutex released, and the
// unlock deferred under it ends the process (a fatal error). The node's
// first failed write stops it, so only a first failure that meets such a
// rotation does.
func (e *Engine) Commit(b *pebble.Batch, opts *pebble.WriteOptions) (err error) {
	defer e.recoverWrite(&err)
	return b.Commit(opts)
}

// ApplyNoSyncWait is DB.ApplyNoSyncWait, with Commit's treatment of a
// failed log write.
func (e *Engine) ApplyNoSyncWait(b *pebble.Batch, opts *pebble.WriteOptions) (err error) {
	defer e.recoverWrite(&err)
	return e.DB.ApplyNoSyncWait(b, opts)
}

// Set is DB.Set, with Commit's treatment of a failed log write.
func (e *Engine) Set(key, value []byte, opts *pebble.WriteOptions) (err error) {
	defer e.recoverWrite(&err)
	return e.DB.Set(key, value, opts)
}

// LogData is DB.LogData, with Commit's treatment of a failed log write.
func (e *Engine) LogData(data []byte, opts *pebble.WriteOptions) (err error) {
	defer e.recoverWrite(&err)
	return e.DB.LogData(data, opts)
}

// recoverWrite turns Pebble's panic on a failed log write into *err, and
// reports it as fatal.
func (e *Engine) recoverWrite(err *error) {
	r := recover()
	if r == nil {
		return
	}
	perr, ok := r.(error)
	var rerr runtime.Error
	if !ok || errors.As(perr, &rerr) {
		panic(r)
	}
	*err = fmt.Errorf("storage: writing the write-ahead log: %w", perr)
	failed := *err
	e.wedged.CompareAndSwap(nil, &failed)
	e.fatal.report(*err)
}

// fatal records the conditions under which a node should stop rather than
// go on with its storage: the on-disk corruption Pebble detects (checksum
// mismatches of sstable blocks, found by reads and compactions), and
// flushes or compactions that keep failing (background), and tells the
// engine's owner of them (OnFatal).
type fatal struct {
	mu    sync.Mutex
	first error
	fn    func(error)
}

func (c *fatal) report(err error) {
	c.mu.Lock()
	if c.first == nil {
		c.first = err
	}
	fn := c.fn
	c.mu.Unlock()
	if fn != nil {
		fn(err)
	}
}

// OnFatal has fn called, without blocking, with every fatal condition
// detected from now on, and at once with the first one detected before, if
// any:
//
//   - on-disk corruption. A read that meets it fails with an error; a
//     damaged node should stop rather than go on with what it can still
//     read. Pebble's default, a panic, is not used.
//   - a write the write-ahead log did not take (Commit).
//   - less free space on the disk than Options.MinFreeBytes, unless the
//     owner goes on refusing writes (OnLowSpace); then less than half.
//   - flushes or compactions that have failed, each time they were tried,
//     for Options.BackgroundFailureLimit. Pebble retries them; a disk that
//     refuses them for good would otherwise leave writes waiting, once the
//     memtables are full, without an error.
//
// The owner decides what to do; a node stops.
func (e *Engine) OnFatal(fn func(error)) {
	e.fatal.mu.Lock()
	e.fatal.fn = fn
	first := e.fatal.first
	e.fatal.mu.Unlock()
	if first != nil {
		fn(first)
	}
}

// Fatal returns the first fatal condition detected, or nil.
func (e *Engine) Fatal() error {
	e.fatal.mu.Lock()
	defer e.fatal.mu.Unlock()
	return e.fatal.first
}

// background tracks failures of flushes and of compactions: how long each
// kind has failed, every time it was tried, since it last succeeded.
type background struct {
	limit  time.Duration
	now    func() time.Time
	log    *slog.Logger
	report func(error)

	mu         sync.Mutex
	kinds      [2]backgroundKind // flushes, compactions
	lastLog    time.Time
	suppressed int
}

type backgroundKind struct {
	since    time.Time // zero: not failing
	failures int
	reported bool
}

const (
	kindFlush = iota
	kindCompaction
)

var backgroundKindNames = [2]string{"flushes", "compactions"}

// errEmptyTable is the text of the error Pebble's FlushEnd carries for a
// flush that wrote no table (all its keys deleted): not a failure.
const errEmptyTable = "pebble: empty table"

// backgroundMinFailures is how many failures in a row, at the least, are
// fatal once the limit has passed: two failures an idle hour apart are not
// a disk that refuses writes.
const backgroundMinFailures = 3

// backgroundLogEvery rate-limits the log lines of background errors:
// Pebble retries a failed flush at once, and a disk that refuses every
// write would otherwise flood the log.
const backgroundLogEvery = 5 * time.Second

// ended records the end of a flush or compaction, failed when err is not
// nil.
func (b *background) ended(kind int, err error) {
	b.mu.Lock()
	k := &b.kinds[kind]
	if err == nil {
		if k.failures > 0 {
			b.log.Warn("storage: "+backgroundKindNames[kind]+" succeed again", "failed", k.failures, "component", "pebble")
		}
		*k = backgroundKind{}
		b.mu.Unlock()
		return
	}
	now := b.now()
	if k.failures == 0 {
		k.since = now
	}
	k.failures++
	var fatalErr error
	if b.limit > 0 && !k.reported && k.failures >= backgroundMinFailures && now.Sub(k.since) >= b.limit {
		k.reported = true
		fatalErr = fmt.Errorf("%s have failed for %v, %d times, with no success (last error: %v)",
			backgroundKindNames[kind], now.Sub(k.since).Round(time.Millisecond), k.failures, err)
	}
	b.mu.Unlock()
	if fatalErr != nil {
		b.log.Error("storage: giving up: "+fatalErr.Error(), "component", "pebble")
		b.report(fatalErr)
	}
}

// logError logs a background error (Pebble's BackgroundError: failed
// flushes and compactions among them), at most one every
// backgroundLogEvery, with the count of those not logged.
func (b *background) logError(err error) {
	b.mu.Lock()
	now := b.now()
	logIt := b.lastLog.IsZero() || now.Sub(b.lastLog) >= backgroundLogEvery
	suppressed := b.suppressed
	if logIt {
		b.lastLog, b.suppressed = now, 0
	} else {
		b.suppressed++
	}
	flushes, compactions := b.kinds[kindFlush].failures, b.kinds[kindCompaction].failures
	b.mu.Unlock()
	if logIt {
		b.log.Error("storage: background error; flushes and compactions are retried", "err", err.Error(),
			"failed_flushes", flushes, "failed_compactions", compactions, "errors_not_logged", suppressed, "component", "pebble")
	}
}

const (
	// memTableSize: raft entries are written in one synced batch per
	// cycle; a memtable of some size absorbs the churn of log entries
	// that are soon truncated. Past that it costs reads: a scan walks the
	// memtable's skiplist one cache miss per entry, where a flushed file
	// is read a block at a time. 16 MiB scanned about 14% cheaper than 64
	// (YCSB E, server CPU per operation) with no loss on writes; 8 MiB
	// cost transactions over a wide key range more in flushes and L0
	// files than it saved (docs/benchmarks.md, "Memtable size").
	memTableSize = 16 << 20
	// memTablesQueued is how many full memtables may wait for their flush
	// before writes stop (Pebble's default).
	memTablesQueued = 2
	// l0CompactionThreshold is how many overlapping files level 0 gathers
	// before they are compacted into the level below (Pebble's default is
	// 4). Versions, latest pointers and change log entries are written
	// across the whole key space, so every level-0 file overlaps the whole
	// of the level below, and each compaction into it rewrites all of it:
	// twice the files per compaction, half the rewrites. Under YCSB A it
	// cut the bytes flushes and compactions wrote by over a third and the
	// server's CPU per operation by about 8%; scans and reads of absent
	// keys, which consult every level-0 file, were no slower
	// (docs/benchmarks.md, "Level-0 compactions, plain writes without
	// locks").
	l0CompactionThreshold = 8
	// l0StopWritesThreshold is how many level-0 sublevels stop writes
	// until compactions catch up: three times the threshold, as Pebble's
	// defaults have it (4 and 12).
	l0StopWritesThreshold = 3 * l0CompactionThreshold
)

// Open opens (creating if needed) the data directory dir. It takes the
// directory's lock first, then checks the format version.
func Open(dir string, opts Options) (*Engine, error) {
	fs := opts.FS
	if fs == nil {
		fs = vfs.Default
	}
	if err := mkdirAllAndSync(fs, dir); err != nil {
		return nil, fmt.Errorf("storage: creating data directory %s: %w", dir, err)
	}
	lock, err := fs.Lock(fs.PathJoin(dir, lockFileName))
	if err != nil {
		return nil, fmt.Errorf("%w: %s (lock %s: %v); stop the other server or use another --data-dir",
			ErrLocked, dir, fs.PathJoin(dir, lockFileName), err)
	}
	var floor uint64
	switch {
	case opts.MinFreeBytes == 0:
		floor = DefaultMinFreeBytes
	case opts.MinFreeBytes > 0:
		floor = uint64(opts.MinFreeBytes)
	}
	if floor > 0 {
		if err := checkFreeSpace(fs, dir, floor); err != nil && (!opts.OpenLow || checkFreeSpace(fs, dir, floor/2) != nil) {
			lock.Close()
			return nil, err
		}
	}
	cacheSize := opts.CacheSize
	if cacheSize == 0 {
		cacheSize = 256 << 20
	}
	memSize := opts.MemTableSize
	if memSize == 0 {
		memSize = memTableSize
	}
	// The memtables' reservation in the block cache: Pebble reserves
	// every memtable's size in it (the one being written and those
	// waiting to be flushed). A cache no larger than that caches nothing
	// once the first memtable has grown to full size: every read then
	// goes to the files.
	memReservation := int64((memTablesQueued + 1) * memSize)
	cache := pebble.NewCache(cacheSize + memReservation)
	defer cache.Unref()
	logger := opts.Logger
	if logger == nil {
		logger = slog.Default()
	}
	fat := &fatal{}
	limit := opts.BackgroundFailureLimit
	if limit == 0 {
		limit = DefaultBackgroundFailureLimit
	}
	gaveUp := make(chan error, 1) // flushes or compactions failed for the limit
	bg := &background{limit: limit, now: opts.Now, log: logger, report: func(err error) {
		select {
		case gaveUp <- err:
		default:
		}
		fat.report(err)
	}}
	stalls := new(atomic.Int64)
	if bg.now == nil {
		bg.now = time.Now
	}
	popts := &pebble.Options{
		FS:                 fs,
		Cache:              cache,
		FormatMajorVersion: pebble.FormatNewest,
		Logger:             pebbleLogger{logger},
		MemTableSize:       memSize,
		MaxOpenFiles:       tableFiles(FileLimit()),
		// Writes stop while this many memtables wait to be flushed; the
		// cache is sized for it (memReservation).
		MemTableStopWritesThreshold: memTablesQueued,
		L0CompactionThreshold:       l0CompactionThreshold,
		L0StopWritesThreshold:       l0StopWritesThreshold,
		EventListener:               eventListener(logger, fat, bg, stalls),
	}
	for i := range popts.Levels {
		// Point reads of latest-version pointers and raft state: a bloom
		// filter lets a Get skip every file that lacks the key.
		popts.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
		if i < 5 {
			// The upper levels turn over quickly; decompressing them on
			// every cache miss cost more CPU than their disk space is worth.
			popts.Levels[i].Compression = func() *sstable.CompressionProfile { return sstable.NoCompression }
		}
	}
	// Pebble's Open flushes what it replays from the write-ahead log and
	// waits for that flush, retrying it for good (a full disk): it gives
	// up when the flushes have failed for the background failure limit.
	type opened struct {
		db  *pebble.DB
		err error
	}
	open := make(chan opened, 1)
	go func() {
		db, err := pebble.Open(fs.PathJoin(dir, "pebble"), popts)
		open <- opened{db, err}
	}()
	var db *pebble.DB
	select {
	case o := <-open:
		db, err = o.db, o.err
	case err := <-gaveUp:
		// The directory stays locked: Pebble goes on trying to open it
		// until the process exits.
		return nil, fmt.Errorf("storage: opening pebble in %s: %w (it stays locked until this process exits)", dir, err)
	}
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("storage: opening pebble in %s: %w", dir, corruptionError(err))
	}
	// Pebble syncs what it creates below its own directory; the entry of
	// that directory in dir is ours to make durable.
	if err := syncDir(fs, dir); err != nil {
		db.Close()
		lock.Close()
		return nil, fmt.Errorf("storage: syncing %s: %w", dir, err)
	}
	e := &Engine{DB: db, FS: fs, Dir: dir, lock: lock, fatal: fat, stalls: stalls, stop: make(chan struct{})}
	if err := e.checkFormat(); err != nil {
		e.Close()
		return nil, err
	}
	if floor > 0 {
		e.space.floor, e.space.wait = floor, opts.OpenLow
		go e.watchFreeSpace(e.stop)
	}
	return e, nil
}

func (e *Engine) checkFormat() error {
	v, closer, err := e.DB.Get(NodeKey(formatVersionKey))
	if errors.Is(err, pebble.ErrNotFound) {
		return e.Set(NodeKey(formatVersionKey), binary.BigEndian.AppendUint32(nil, FormatVersion), pebble.Sync)
	}
	if err != nil {
		return fmt.Errorf("storage: reading format version: %w", corruptionError(err))
	}
	defer closer.Close()
	if len(v) != 4 {
		return fmt.Errorf("%w: format version record is %d bytes", ErrUnknownFormat, len(v))
	}
	got := binary.BigEndian.Uint32(v)
	if got < oldestFormatVersion || got > FormatVersion {
		return fmt.Errorf("%w: %s has format version %d, this binary reads versions %d to %d", ErrUnknownFormat, e.Dir, got, oldestFormatVersion, FormatVersion)
	}
	if got < FormatVersion {
		return e.Set(NodeKey(formatVersionKey), binary.BigEndian.AppendUint32(nil, FormatVersion), pebble.Sync)
	}
	return nil
}

// corruptionError returns err, or for an error of on-disk corruption err
// with a message that names the damaged file in place of the line Pebble
// adds for the detail it carries ("<corruption detail carrier>").
func corruptionError(err error) error {
	info := pebble.ExtractDataCorruptionInfo(err)
	if info == nil {
		return err
	}
	return &damaged{err: err, path: info.Path}
}

type damaged struct {
	err  error
	path string
}

func (d *damaged) Error() string {
	msg, _, _ := strings.Cut(d.err.Error(), "\n")
	return fmt.Sprintf("%s (on-disk corruption in %s)", msg, d.path)
}

func (d *damaged) Unwrap() error { return d.err }

// Close closes Pebble and releases the directory lock.
func (e *Engine) Close() error {
	e.stopOnce.Do(func() { close(e.stop) })
	if err := e.wedged.Load(); err != nil {
		// Pebble's Close would wait for the commit pipeline the failed
		// write left locked, for good. The directory stays locked until
		// the process exits: Pebble's background work may still write
		// files in it.
		return fmt.Errorf("storage: %s not closed after a failed write (%w); it is released when the process exits", e.Dir, *err)
	}
	err := e.DB.Close()
	if lerr := e.lock.Close(); err == nil {
		err = lerr
	}
	return err
}

// GetValue returns a copy of the value at key, or nil and false when absent.
func GetValue(r pebble.Reader, key []byte) ([]byte, bool, error) {
	v, closer, err := r.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	out := append([]byte(nil), v...)
	closer.Close()
	return out, true, nil
}

// GetUint64 reads a big-endian uint64 at key; absent reads as 0.
func GetUint64(r pebble.Reader, key []byte) (uint64, error) {
	v, ok, err := GetValue(r, key)
	if err != nil || !ok {
		return 0, err
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("%w: %d-byte integer at %x", ErrCorruptValue, len(v), key)
	}
	return binary.BigEndian.Uint64(v), nil
}

// PutUint64 writes a big-endian uint64 at key into w.
func PutUint64(w pebble.Writer, key []byte, v uint64) error {
	return w.Set(key, binary.BigEndian.AppendUint64(nil, v), nil)
}

// eventListener reports Pebble's write stalls and slow disk operations
// as warnings, since they hold every write of the node up; at debug level
// it logs every flush, compaction and file change too, so that a latency
// stall can be set beside what the storage engine was doing.
func eventListener(logger *slog.Logger, fat *fatal, bg *background, stalls *atomic.Int64) *pebble.EventListener {
	el := pebble.EventListener{
		BackgroundError: bg.logError,
		FlushEnd: func(info pebble.FlushInfo) {
			err := info.Err
			if err != nil && err.Error() == errEmptyTable {
				err = nil
			}
			bg.ended(kindFlush, err)
		},
		CompactionEnd: func(info pebble.CompactionInfo) {
			if errors.Is(info.Err, pebble.ErrCancelledCompaction) {
				return
			}
			bg.ended(kindCompaction, info.Err)
		},
		DataCorruption: func(info pebble.DataCorruptionInfo) {
			logger.Error("storage: on-disk corruption: this node's copy of its data is damaged", "file", info.Path,
				"bounds", info.Bounds.String(), "err", info.Details.Error(), "component", "pebble")
			fat.report(fmt.Errorf("on-disk corruption in %s: %v", info.Path, info.Details))
		},
		WriteStallBegin: func(info pebble.WriteStallBeginInfo) {
			stalls.Add(1)
			logger.Warn("storage: writes stalled", "reason", info.Reason, "component", "pebble")
		},
		WriteStallEnd: func() {
			logger.Warn("storage: writes resumed", "component", "pebble")
		},
		DiskSlow: func(info pebble.DiskSlowInfo) {
			logger.Warn("storage: slow disk operation", "info", info.String(), "component", "pebble")
		},
	}
	if logger.Enabled(context.Background(), slog.LevelDebug) {
		el = pebble.TeeEventListener(el, pebble.MakeLoggingEventListener(pebbleLogger{logger}))
	}
	return &el
}

type pebbleLogger struct{ l *slog.Logger }

func (p pebbleLogger) Infof(format string, args ...any) {
	p.l.Debug(fmt.Sprintf(format, args...), "component", "pebble")
}
func (p pebbleLogger) Errorf(format string, args ...any) {
	p.l.Error(fmt.Sprintf(format, args...), "component", "pebble")
}
func (p pebbleLogger) Fatalf(format string, args ...any) {
	f := &fatalPanic{msg: fmt.Sprintf(format, args...)}
	for _, a := range args {
		if err, ok := a.(error); ok {
			f.err = err
			break
		}
	}
	p.l.Error(f.msg, "component", "pebble")
	panic(f)
}

// fatalPanic is what Pebble's fatal log lines panic with: an error, which
// wraps the error they name, if any (Engine.Commit recovers it).
type fatalPanic struct {
	msg string
	err error
}

func (f *fatalPanic) Error() string { return f.msg }
func (f *fatalPanic) Unwrap() error { return f.err }

// mkdirAllAndSync creates dir and its missing parents and syncs every
// directory whose entries changed, up to the closest ancestor that existed,
// so that a power loss cannot drop the new directory (and every write below
// it).
func mkdirAllAndSync(fs vfs.FS, dir string) error {
	var parents []string
	for p := fs.PathDir(dir); ; p = fs.PathDir(p) {
		parents = append(parents, p)
		if _, err := fs.Stat(p); err == nil || fs.PathDir(p) == p {
			break
		}
	}
	if _, err := fs.Stat(dir); err == nil {
		return nil
	}
	if err := fs.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, p := range parents {
		if err := syncDir(fs, p); err != nil {
			return err
		}
	}
	return nil
}

func syncDir(fs vfs.FS, dir string) error {
	d, err := fs.OpenDir(dir)
	if err != nil {
		return err
	}
	if err := d.Sync(); err != nil {
		d.Close()
		return err
	}
	return d.Close()
}
