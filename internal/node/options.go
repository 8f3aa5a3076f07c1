package node

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/groupkv/groupkv/internal/kv"
)

// Options configure a Node. The zero value of every field but DataDir means
// its default.
type Options struct {
	// DataDir holds everything the node stores (required).
	DataDir string
	// NodeID is the node's integer id; 0 means 1 on a new directory, or the
	// id the directory was created with.
	NodeID uint64
	// FS is the filesystem; nil means the operating system's.
	FS vfs.FS
	// Clock returns the current time; nil means time.Now.
	Clock func() time.Time
	// TickInterval is the raft tick; 0 means 100ms.
	TickInterval time.Duration
	// TruncateAfter is the number of applied entries a shard's raft log
	// keeps for replicas that fall behind before truncation (a log
	// every replica has is truncated sooner); 0 means 10,000.
	TruncateAfter uint64
	// LatestCacheBytes bounds the cache of keys' newest versions that
	// reads of the latest value use (shard.LatestCache); 0 means 64 MiB, a
	// negative value no cache.
	LatestCacheBytes int
	// Retention is how long old versions stay readable; 0 means 1 hour,
	// long enough for a reader of a version or a resuming watcher to catch up.
	Retention time.Duration
	// GCInterval is how often shards drop versions older than Retention; 0
	// means 1 minute.
	GCInterval time.Duration
	// ConsistencyInterval is how often the leader of each shard checks that
	// its replicas hold the same state; 0 means 10 minutes, a negative
	// value disables the periodic checks (Node.CheckConsistency still runs
	// one on demand).
	ConsistencyInterval time.Duration
	// ConsistencyRate is how many bytes per second a replica reads when it
	// sums its shard for a consistency check, so that a check takes a
	// small share of the node's CPU and disk; 0 means 8 MiB, a negative
	// value no limit.
	ConsistencyRate int64
	// MaxValueSize is the largest value accepted; 0 means 1 MiB.
	MaxValueSize int
	// RequestTimeout bounds an operation whose context has no deadline; 0
	// means 30 seconds.
	RequestTimeout time.Duration
	// Join are peer addresses of cluster members; a new node asks one of
	// them to add it instead of bootstrapping a cluster of its own. A node
	// that is already a member ignores them.
	Join []string
	// Dialer opens the node's connections to other nodes' peer ports; nil
	// means a plain TCP dial. Tests inject network faults through it.
	Dialer func(ctx context.Context, addr string) (net.Conn, error)
	// PeerTLS, when set, secures the node's connections to other nodes'
	// peer ports (tlsfiles.Peer: the node's certificate, and the CAs whose
	// certificates it accepts from the nodes it dials); nil means none.
	// The server end is server.Config.PeerTLS.
	PeerTLS *tls.Config
	// StorageFailureLimit is how long the storage's flushes, or its
	// compactions, may fail every time they are tried before the node
	// stops (Failed); 0 means storage.DefaultBackgroundFailureLimit.
	StorageFailureLimit time.Duration
	// MemTableSize is the size of each of the storage's memtables; 0
	// means 16 MiB.
	MemTableSize uint64
	// MinFreeBytes is the free space the node keeps on its disk, so that
	// no write finds no room. Once its disk has less, a node alone (no
	// Join, no other member) refuses the writes that add data, answering
	// them unavailable, and serves the rest (WritesRefused) until the
	// disk has a quarter more free again; it stops (Failed) once the disk
	// has less than half, and does not open on a disk with less than
	// half. A node with peers stops (Failed) at once, and does not open
	// on a disk with less. 0 means 64 MiB, negative no check.
	MinFreeBytes int64
	// FailedCloseWait bounds how long Close waits for a node whose storage
	// failed to stop (a write Pebble stalls behind flushes that cannot
	// succeed holds it until the disk takes writes again); 0 means 10
	// seconds. Close then returns an error and leaves the storage open.
	FailedCloseWait time.Duration
	// SplitBytes is the estimated on-disk size above which a range shard
	// splits at its middle key; 0 means 512 MiB, negative never.
	SplitBytes int64
	// SplitCheckInterval is how often the leaders look at their shards'
	// sizes; 0 means 30 seconds.
	SplitCheckInterval time.Duration
	// TxnTimeout is how long a transaction's coordinator may go without a
	// heartbeat before anyone may abort it (multiplied by the attempt
	// number, up to 8); 0 means 5 seconds. Coordinators heartbeat every
	// TxnTimeout/4.
	TxnTimeout time.Duration
	// TxnCheckInterval is how often a lock waiter looks at the holders it
	// waits for; 0 means TxnTimeout/5.
	TxnCheckInterval time.Duration
	// TxnIdleTimeout aborts a session transaction (HTTP) that saw no
	// request for this long; 0 means 30 seconds. It is also how long the
	// node remembers how a session transaction ended, for a commit sent
	// again (txn_outcomes.go).
	TxnIdleTimeout time.Duration
	// TxnRecordRetention is how long the record of a finished transaction
	// stays after its coordinator saw it decided and resolved everywhere;
	// then the coordinator removes it (txn_forget.go). 0 means 4 ×
	// TxnIdleTimeout; negative keeps records forever.
	TxnRecordRetention time.Duration
	// MaxTxnOutcomes bounds how many ended session transactions the node
	// remembers the outcome of; past it the oldest are forgotten first. 0
	// means 65536.
	MaxTxnOutcomes int
	// MaxTxnDuration bounds a transaction attempt from its start to its
	// commit; 0 means 1 minute.
	MaxTxnDuration time.Duration
	// MaxTxnOps and MaxTxnBytes bound the operations and the bytes of keys
	// and values of one transaction; 0 means kv.DefaultMaxTxnOps and
	// kv.DefaultMaxTxnBytes.
	MaxTxnOps   int
	MaxTxnBytes int
	// MergeBytes is the estimated on-disk size below which two adjacent
	// range shards together merge, when a split made the boundary between
	// them (checked every SplitCheckInterval); 0 means SplitBytes/4, so
	// that a merged shard is far from splitting again; negative never.
	MergeBytes int64
	// MergeQuiet is how long after a split a shard is not merged by size,
	// so that a shard split by request is not merged right back; 0 means
	// 10 minutes.
	MergeQuiet time.Duration
	// Registry receives the node's metrics; nil means a new registry.
	Registry *prometheus.Registry
	Logger   *slog.Logger
}

// EnsureDefaults fills the defaults of zero fields.
func (o *Options) EnsureDefaults() {
	if o.Clock == nil {
		o.Clock = time.Now
	}
	if o.SplitBytes == 0 {
		o.SplitBytes = 512 << 20
	}
	if o.FailedCloseWait == 0 {
		o.FailedCloseWait = 10 * time.Second
	}
	if o.SplitCheckInterval == 0 {
		o.SplitCheckInterval = 30 * time.Second
	}
	if o.MergeBytes == 0 {
		o.MergeBytes = o.SplitBytes / 4
		if o.SplitBytes < 0 {
			o.MergeBytes = -1
		}
	}
	if o.MergeQuiet == 0 {
		o.MergeQuiet = 10 * time.Minute
	}
	if o.TickInterval == 0 {
		o.TickInterval = 100 * time.Millisecond
	}
	if o.Retention == 0 {
		o.Retention = time.Hour
	}
	if o.GCInterval == 0 {
		o.GCInterval = time.Minute
	}
	if o.ConsistencyInterval == 0 {
		o.ConsistencyInterval = 10 * time.Minute
	}
	if o.ConsistencyRate == 0 {
		o.ConsistencyRate = DefaultConsistencyRate
	}
	if o.MaxValueSize == 0 {
		o.MaxValueSize = kv.DefaultMaxValueSize
	}
	if o.TxnTimeout == 0 {
		o.TxnTimeout = 5 * time.Second
	}
	if o.TxnCheckInterval == 0 {
		o.TxnCheckInterval = o.TxnTimeout / 5
	}
	if o.TxnIdleTimeout == 0 {
		o.TxnIdleTimeout = 30 * time.Second
	}
	if o.MaxTxnOutcomes == 0 {
		o.MaxTxnOutcomes = 1 << 16
	}
	if o.TxnRecordRetention == 0 {
		o.TxnRecordRetention = 4 * o.TxnIdleTimeout
	}
	if o.MaxTxnDuration == 0 {
		o.MaxTxnDuration = time.Minute
	}
	if o.MaxTxnOps == 0 {
		o.MaxTxnOps = kv.DefaultMaxTxnOps
	}
	if o.MaxTxnBytes == 0 {
		o.MaxTxnBytes = kv.DefaultMaxTxnBytes
	}
	if o.RequestTimeout == 0 {
		o.RequestTimeout = 30 * time.Second
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// Validate reports every problem of o.
func (o *Options) Validate() error {
	var errs []string
	if o.DataDir == "" {
		errs = append(errs, "DataDir is required")
	}
	if o.Retention < 0 {
		errs = append(errs, fmt.Sprintf("Retention %v is negative", o.Retention))
	}
	if o.MaxTxnOutcomes < 0 {
		errs = append(errs, fmt.Sprintf("MaxTxnOutcomes %d is negative", o.MaxTxnOutcomes))
	}
	if o.MaxValueSize < 0 || o.MaxValueSize > 64<<20 {
		errs = append(errs, fmt.Sprintf("MaxValueSize %d is outside [1, 64 MiB]", o.MaxValueSize))
	}
	if o.MergeBytes > 0 && o.SplitBytes > 0 && o.MergeBytes > o.SplitBytes/2 {
		// The two halves of a split would merge back at once.
		errs = append(errs, fmt.Sprintf("MergeBytes %d is above half of SplitBytes %d: shards would split and merge back", o.MergeBytes, o.SplitBytes))
	}
	if len(errs) > 0 {
		return fmt.Errorf("node: invalid options: %v", errs)
	}
	return nil
}
