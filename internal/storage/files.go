package storage

import "syscall"

// File descriptors. Pebble keeps up to MaxOpenFiles sstables open (its
// table cache) besides its write-ahead log and manifest; a process that
// runs out of descriptors fails Pebble's next file operation, and Pebble
// ends the process when that operation is the switch to a new
// write-ahead log. The engine therefore opens at most tableFiles of them,
// and a server leaves FileReserve descriptors to the engine when it sizes
// its client connections (server.Config.MaxConnections).
const (
	maxTableFiles = 1000 // Pebble's default
	minTableFiles = 32
	// otherFiles are the engine's other descriptors and the process's
	// own: logs and manifests, sstables a compaction or a flush writes,
	// sstables held open past MaxOpenFiles while iterators use them (the
	// table cache only closes files no one reads), the directory lock,
	// listeners, outgoing connections, the runtime's poller. 64 was too
	// few under 256 files (TestFileLimitKeepsTheServerUp: a compaction
	// could not open its input).
	otherFiles = 128
)

// FileLimit is the process's limit on open file descriptors (its soft
// RLIMIT_NOFILE, which Go raises to the hard limit at start), or 0 when it
// cannot be read.
func FileLimit() uint64 {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0
	}
	return rl.Cur
}

// tableFiles is how many sstables the engine keeps open under a
// descriptor limit of limit: a quarter of it, between minTableFiles and
// maxTableFiles (0: no known limit).
func tableFiles(limit uint64) int {
	if limit == 0 {
		return maxTableFiles
	}
	return int(min(max(limit/4, minTableFiles), maxTableFiles))
}

// FileReserve is how many descriptors the engine (and the process around
// it) may need under a limit of limit: what a server must not give to
// client connections.
func FileReserve(limit uint64) uint64 {
	return uint64(tableFiles(limit)) + otherFiles
}
