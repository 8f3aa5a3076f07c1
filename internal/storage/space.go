package storage

import (
	"fmt"
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
		e.Dir, mib(e.Free), mib(e.Floor))
}

func mib(n uint64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

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

// watchFreeSpace looks at the free space every freeSpaceInterval until
// stop is closed, and reports as fatal the first time it is below floor:
// a disk that fills stops the node before a write finds no room (which
// Pebble may answer by ending the process, see Engine.Commit).
func (e *Engine) watchFreeSpace(floor uint64, stop <-chan struct{}) {
	t := time.NewTicker(freeSpaceInterval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if err := checkFreeSpace(e.FS, e.Dir, floor); err != nil {
			e.fatal.report(err)
			return
		}
	}
}

// FreeBytes is the free space of the disk holding the engine's directory;
// ok is false when the filesystem cannot tell.
func (e *Engine) FreeBytes() (free uint64, ok bool) { return freeBytes(e.FS, e.Dir) }
