package node

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/groupkv/groupkv/internal/replication"
	"github.com/groupkv/groupkv/internal/storage"
)

type metrics struct {
	repl *replication.Metrics
	// orphans counts the prepares their coordinators left that shards
	// led here resolved (txn_orphans.go).
	orphans prometheus.Counter
	// resolveBatches counts the batches of resolves proposed, and
	// resolvesBatched the resolves in them (txn_resolves.go).
	resolveBatches  prometheus.Counter
	resolvesBatched prometheus.Counter
	// readValidations counts the checks of locks held elsewhere that
	// reads of transactions asked for (txnSession.validateEarlier).
	readValidations prometheus.Counter
}

func newMetrics(reg *prometheus.Registry, eng *storage.Engine) *metrics {
	m := &metrics{repl: replication.NewMetrics(reg)}
	m.orphans = counter(reg,
		"groupkv_txn_orphaned_prepares_resolved_total",
		"Prepared transactions their coordinator left (it stopped before resolving them) that the leader of their shard resolved from their record.")
	m.resolveBatches = counter(reg,
		"groupkv_txn_resolve_batches_total",
		"Resolves of several transactions proposed to a shard as one raft entry.")
	m.resolvesBatched = counter(reg,
		"groupkv_txn_resolves_batched_total",
		"Resolves proposed in batches of several (groupkv_txn_resolve_batches_total).")
	m.readValidations = counter(reg,
		"groupkv_txn_read_validations_total",
		"Checks, asked by a transaction's read before it is returned, that the transaction still holds its locks in a shard it read under before: the read saw a version above that shard's when its locks were last confirmed.")
	// The Go runtime's scheduler metrics besides the defaults: among them
	// go_sched_latencies_seconds, how long goroutines waited to run once
	// runnable (a server short of CPU shows there first).
	goc := collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(collectors.MetricsScheduler))
	reg.MustRegister(goc, collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), pebbleCollector{eng})
	return m
}

// pebbleCollector exports a few of Pebble's own metrics at scrape time.
type pebbleCollector struct{ eng *storage.Engine }

var (
	pebbleDiskBytes = prometheus.NewDesc("groupkv_pebble_disk_space_bytes", "Disk space used by Pebble.", nil, nil)
	pebbleMemtable  = prometheus.NewDesc("groupkv_pebble_memtable_bytes", "Size of Pebble's memtables.", nil, nil)
	pebbleWALBytes  = prometheus.NewDesc("groupkv_pebble_wal_bytes_written_total", "Bytes written to Pebble's WAL.", nil, nil)
	pebbleCompacts  = prometheus.NewDesc("groupkv_pebble_compactions_total", "Pebble compactions.", nil, nil)
	pebbleFlushed   = prometheus.NewDesc("groupkv_pebble_flushed_bytes_total", "Bytes Pebble wrote to sstables by flushing memtables.", nil, nil)
	pebbleCompacted = prometheus.NewDesc("groupkv_pebble_compacted_bytes_total", "Bytes Pebble wrote to sstables by compactions.", nil, nil)
	pebbleL0Files   = prometheus.NewDesc("groupkv_pebble_l0_files", "Files in Pebble's level 0.", nil, nil)
	pebbleCacheHits = prometheus.NewDesc("groupkv_pebble_block_cache_hits_total", "Pebble block cache hits.", nil, nil)
	pebbleCacheMiss = prometheus.NewDesc("groupkv_pebble_block_cache_misses_total", "Pebble block cache misses.", nil, nil)
	pebbleStalls    = prometheus.NewDesc("groupkv_pebble_write_stalls_total", "Times Pebble stopped writes to wait for flushes or compactions.", nil, nil)
	diskFree        = prometheus.NewDesc("groupkv_disk_free_bytes", "Free space on the disk holding the node's data; below --min-free-space the node refuses writes (alone) or stops (with peers).", nil, nil)
)

func (c pebbleCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{pebbleDiskBytes, pebbleMemtable, pebbleWALBytes, pebbleCompacts, pebbleFlushed, pebbleCompacted, pebbleL0Files, pebbleCacheHits, pebbleCacheMiss, pebbleStalls, diskFree} {
		ch <- d
	}
}

func (c pebbleCollector) Collect(ch chan<- prometheus.Metric) {
	m := c.eng.DB.Metrics()
	ch <- prometheus.MustNewConstMetric(pebbleDiskBytes, prometheus.GaugeValue, float64(m.DiskSpaceUsage()))
	ch <- prometheus.MustNewConstMetric(pebbleMemtable, prometheus.GaugeValue, float64(m.MemTable.Size))
	ch <- prometheus.MustNewConstMetric(pebbleWALBytes, prometheus.CounterValue, float64(m.WAL.BytesWritten))
	ch <- prometheus.MustNewConstMetric(pebbleCompacts, prometheus.CounterValue, float64(m.Compact.Count))
	// Summed by level: Metrics.Total counts the WAL's bytes as flushed.
	var flushed, compacted uint64
	for i := range m.Levels {
		flushed += m.Levels[i].TableBytesFlushed
		compacted += m.Levels[i].TableBytesCompacted
	}
	ch <- prometheus.MustNewConstMetric(pebbleFlushed, prometheus.CounterValue, float64(flushed))
	ch <- prometheus.MustNewConstMetric(pebbleCompacted, prometheus.CounterValue, float64(compacted))
	ch <- prometheus.MustNewConstMetric(pebbleL0Files, prometheus.GaugeValue, float64(m.Levels[0].TablesCount))
	ch <- prometheus.MustNewConstMetric(pebbleStalls, prometheus.CounterValue, float64(c.eng.WriteStalls()))
	if free, ok := c.eng.FreeBytes(); ok {
		ch <- prometheus.MustNewConstMetric(diskFree, prometheus.GaugeValue, float64(free))
	}
	ch <- prometheus.MustNewConstMetric(pebbleCacheHits, prometheus.CounterValue, float64(m.BlockCache.Hits))
	ch <- prometheus.MustNewConstMetric(pebbleCacheMiss, prometheus.CounterValue, float64(m.BlockCache.Misses))
}
