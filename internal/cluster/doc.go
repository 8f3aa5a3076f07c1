// Package cluster owns the catalog of collections and the shard map (the
// descriptors kept in the meta shard), the routing of a key to its shard,
// placement (each shard's replicas on the least loaded nodes; the
// rebalancer's plans of single replica moves and preferred leaders, pure
// functions of the catalog), and the timestamp oracle (TSO) that the meta
// shard's leader runs.
//
// Descriptors are plain values; they change only by commands applied in the
// meta shard (see package shard). The Oracle is volatile leader state: it
// issues hybrid timestamps (milliseconds << 18 | counter) below a high-water
// mark that it persists through the meta shard before issuing above it, so a
// restarted or new leader never goes backwards.
//
// cluster may import kv and storage; it does no I/O of its own: time comes
// from an injected clock and persistence from an injected proposer.
package cluster
