// Package storage owns groupkv's single Pebble instance per node and the
// layout of every key in it.
//
// Everything a node keeps lives in one Pebble database, in disjoint key
// spaces told apart by their first byte:
//
//	0x01 node    node-local metadata: format version, node id, local replicas
//	0x02 raft    per shard: raft log entries, hard state, truncated state
//	0x03 shard   per shard replicated state: applied index, max version, GC threshold
//	0x04 catalog the meta shard's catalog and timestamp-oracle state
//	0x05 data    MVCC records: collection id, bucket, escaped key, ^version
//
// Invariants:
//   - A data key sorts by (collection, bucket, user key, version descending),
//     so a shard's records are one contiguous span and the newest version of a
//     key comes first.
//   - The format version written at creation is checked at every open; a node
//     refuses a format it does not know.
//   - One process at a time opens a data directory: Open takes an advisory
//     lock that dies with the process.
//
// storage does no raft and knows no shard semantics; the shard and
// replication packages build on the encodings here.
package storage
