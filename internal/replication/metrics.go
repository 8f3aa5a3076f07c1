package replication

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the replication layer's Prometheus collectors.
type Metrics struct {
	Proposals     prometheus.Counter
	ProposalFails prometheus.Counter
	ApplySeconds  prometheus.Histogram
	FsyncSeconds  prometheus.Histogram
	CycleEntries  prometheus.Histogram
	// ChecksumSeconds is how long the replicas here took to sum a shard
	// for a consistency check, off the raft loop.
	ChecksumSeconds prometheus.Histogram
	Truncations     prometheus.Counter
	// SnapshotsSent and SnapshotsApplied count raft snapshots sent to
	// followers and restored from a leader.
	SnapshotsSent, SnapshotsApplied prometheus.Counter
	// Orphans counts the proposals of a leader that stepped down before
	// they were applied, by what became of them: "applied" (the new
	// leader committed the entry), "not_applied" (another entry took its
	// index) or "unknown" (not learnt in time).
	Orphans *prometheus.CounterVec
}

// NewMetrics registers the replication collectors with reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Proposals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "groupkv_raft_proposals_total", Help: "Commands proposed to raft groups."}),
		ProposalFails: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "groupkv_raft_proposals_failed_total", Help: "Proposals that failed before being applied."}),
		ApplySeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "groupkv_raft_apply_seconds", Help: "Time to apply and commit one cycle's entries (not counting the wait for the cycle's fsync).",
			Buckets: prometheus.ExponentialBuckets(20e-6, 2, 16)}),
		FsyncSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "groupkv_raft_fsync_seconds", Help: "Time to write and fsync one cycle's raft entries and hard states.",
			Buckets: prometheus.ExponentialBuckets(20e-6, 2, 16)}),
		ChecksumSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "groupkv_replica_checksum_seconds", Help: "Time a replica took to sum its shard for a consistency check, off the raft loop, at most --consistency-rate bytes per second.",
			Buckets: prometheus.ExponentialBuckets(1e-3, 2, 20)}),
		CycleEntries: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "groupkv_raft_entries_per_fsync", Help: "Raft entries persisted per fsync (group commit).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 12)}),
		Truncations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "groupkv_raft_log_truncations_total", Help: "Raft log truncations."}),
		SnapshotsSent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "groupkv_raft_snapshots_sent_total", Help: "Raft snapshots sent to followers."}),
		SnapshotsApplied: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "groupkv_raft_snapshots_applied_total", Help: "Raft snapshots restored from a leader."}),
		Orphans: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "groupkv_raft_orphaned_proposals_total", Help: "Proposals whose leader stepped down before they were applied, by outcome (applied, not_applied, unknown)."},
			[]string{"outcome"}),
	}
	if reg != nil {
		reg.MustRegister(m.Proposals, m.ProposalFails, m.ApplySeconds, m.FsyncSeconds, m.CycleEntries, m.ChecksumSeconds, m.Truncations, m.SnapshotsSent, m.SnapshotsApplied, m.Orphans)
	}
	return m
}
