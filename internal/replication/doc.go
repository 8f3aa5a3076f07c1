// Package replication drives one etcd raft group (go.etcd.io/raft/v3
// RawNode) per shard replica on a node, and is the only place where shard
// state machines are applied.
//
// A Host owns every group of a node and runs them from one loop:
//
//	for each cycle:
//	  propose queued commands (assigning write versions: above the TSO,
//	    above the shard's last version and above its read watermark)
//	  tick, collect Ready from every group that has one
//	  write all new entries and hard states to Pebble in ONE batch, ONE fsync
//	  send raft messages
//	  apply committed entries of all groups into one Pebble batch (with the
//	    applied index of each shard), commit it, then answer the proposers
//	  Advance; truncate logs that grew past the configured length
//
// So concurrent writes to any shard of a node share an fsync (group commit),
// and a write is acknowledged only after its entry was fsynced and applied.
//
// The fsync of a cycle runs while the cycle applies what is committed. When
// every committed entry was persisted by an earlier cycle (a leader's
// entries are committed only once its own copy is durable), the apply batch
// is committed and its proposers answered without waiting for this cycle's
// fsync; otherwise (a follower's entries that arrived with their commit
// index) after it. A single voter commits what a cycle persists as soon as
// it is durable, so its leader applies the cycle's own new entries (plain
// writes and transaction commands) while their fsync runs, ahead of raft's
// commit, and commits the apply batch and answers them once the fsync is
// done, in the same cycle; the hard state written with them carries a
// commit index raised past them, so that a restart never finds a state
// applied beyond the commit. Raft delivers them committed in a later cycle,
// which skips them. Without that, they were applied a cycle later.
// The raft library does no I/O; this package persists, sends and applies.
//
// Leader rules (see ARCHITECTURE.md, "Versions and snapshot reads"): a new
// leader proposes nothing until an entry of its own term has been applied,
// and then seeds its read watermark from the oracle.
//
// Across nodes, a Transport carries each cycle's raft messages after its
// entries are persisted, and Deliver hands incoming ones to their group at
// the start of the next cycle. Configuration changes (ProposeConfChange) are
// applied in log order and persisted with the applied index. A leader
// builds a snapshot of a shard's applied state (shard.SnapshotData) when a
// follower is behind its truncated log; a follower restores it
// (shard.RestoreSnapshot) in the same synced batch as the log reset, before
// anything is applied on top. ReadBarrier runs raft's ReadIndex on leaders
// and followers alike. Write versions come from a VersionSource; a
// SequencedVersionSource only hands a proposal a timestamp fetched after it
// was queued, which keeps versions in real-time order across nodes.
//
// replication may import storage, shard, cluster and kv. Nothing outside the
// Host's loop touches a RawNode or a Shard.
package replication
