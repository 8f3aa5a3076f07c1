package storage

import (
	"fmt"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// DefaultMinFreeBytes is the default of Options.MinFreeBytes: room for the
// memtables the engine may hold (memTablesQueued+1 of memTableSize) to be
// flushed, and for a write-ahead log of the same size.
const DefaultMinFreeBytes = 64 << 20

// freeSpaceInterval is how often the engine looks at its disk's free
// space.
const freeSpaceInterval = 100 * time.Millisecond

// LowSpaceError says that the disk holding an engine's directory has less
// free space than the engine keeps.
type LowSpaceError struct {
	Dir         string
	Free, Floor uint64
}

func (e *LowSpaceError) Error() string {
	return fmt.Sprintf("storage: the disk holding %s has %s free, less than the %s a node keeps free to write safely (--min-free-space); free some space, then restart it",
		e.Dir, MiB(e.Free), MiB(e.Floor))
}

// MiB writes n bytes in MiB, with one decimal.
func MiB(n uint64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// checkFreeSpace answers a LowSpaceError when the disk holding dir has
// less than floor bytes free, and nil when it has that much or fs cannot
// tell.
func checkFreeSpace(fs vfs.FS, dir string, floor uint64) error {
	if free, ok := freeBytes(fs, dir); ok && free < floor {
		return &LowSpaceError{Dir: dir, Free: free, Floor: floor}
	}
	return nil
}

// freeBytes is the free space of the disk holding dir; ok is false when
// fs cannot tell (vfs.ErrUnsupported, or a failed statfs).
func freeBytes(fs vfs.FS, dir string) (free uint64, ok bool) {
	u, err := fs.GetDiskUsage(dir)
	if err != nil {
		return 0, false
	}
	return u.AvailBytes, true
}

// watchFreeSpace looks at the free space every freeSpaceInterval
// (checkLowSpace) until stop is closed or the disk is reported fatal.
func (e *Engine) watchFreeSpace(stop <-chan struct{}) {
	t := time.NewTicker(freeSpaceInterval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if e.checkLowSpace() {
			return
		}
	}
}

// lowSpace is the engine's watch of its disk's free space against floor.
type lowSpace struct {
	floor uint64
	mu    sync.Mutex
	fn    func(*LowSpaceError) bool // OnLowSpace's
	wait  bool                      // no fn yet, and a low disk waits for one (Options.OpenLow)
	low   *LowSpaceError            // the owner goes on with writes refused
	fatal bool                      // reported fatal: nothing more to do
}

// checkLowSpace looks at the free space once. The first time it is below
// the floor it asks the engine's owner (OnLowSpace) whether to go on with
// writes refused; unasked, or answered no, it reports the low disk as
// fatal: a disk that fills stops the node before a write finds no room
// (which Pebble may answer by ending the process, see Engine.Commit).
// Going on, it reports the disk fatal once below half the floor (what is
// still written, the owner's own records and other nodes' writes to its
// replicas, filled it), and tells the owner once the disk has a quarter
// more than the floor free again. It answers true once the disk was
// reported fatal.
func (e *Engine) checkLowSpace() (fatal bool) {
	w := &e.space
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fatal {
		return true
	}
	free, ok := freeBytes(e.FS, e.Dir)
	if !ok {
		return false
	}
	switch {
	case w.low == nil && free < w.floor:
		if w.wait && free >= w.floor/2 {
			return false
		}
		w.low = &LowSpaceError{Dir: e.Dir, Free: free, Floor: w.floor}
		if w.fn == nil || !w.fn(w.low) {
			w.fatal = true
			e.fatal.report(w.low)
		}
	case w.low != nil && free < w.floor/2:
		w.fatal = true
		e.fatal.report(&LowSpaceError{Dir: e.Dir, Free: free, Floor: w.floor})
	case w.low != nil && free >= w.floor+w.floor/4:
		w.low = nil
		w.fn(nil)
	}
	return w.fatal
}

// OnLowSpace has fn called once the disk has less than
// Options.MinFreeBytes free (low set): at once if it has now, else from
// the goroutine that watches the free space. fn answers whether the
// engine's owner goes on, refusing the writes that would fill the disk;
// if not (or with no fn) the low disk is reported fatal (OnFatal), as it
// is once the disk has less than half of it. Going on, fn is called with
// nil once the disk has a quarter more than MinFreeBytes free again, and
// with the next low disk after that. fn must not call the engine's
// OnLowSpace.
func (e *Engine) OnLowSpace(fn func(low *LowSpaceError) (goOn bool)) {
	e.space.mu.Lock()
	e.space.fn, e.space.wait = fn, false
	e.space.mu.Unlock()
	if e.space.floor > 0 {
		e.checkLowSpace()
	}
}

// FreeBytes is the free space of the disk holding the engine's directory;
// ok is false when the filesystem cannot tell.
func (e *Engine) FreeBytes() (free uint64, ok bool) { return freeBytes(e.FS, e.Dir) }
