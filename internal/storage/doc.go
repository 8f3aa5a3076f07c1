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
//	0x05 data    MVCC records: collection id, escaped key, ^version
//	0x06 tags    tag index: collection id, escaped tag, escaped key, ^version
//	0x07 changes change log: collection id, version, escaped key
//	0x08 place   placement index of tag collections: collection id, escaped key
//	0x09 latest  pointer to each key's newest version: collection id, escaped key
//
// Invariants:
//   - A data key sorts by (collection, user key, version descending), so
//     the records of a collection held by a node are in key order whatever
//     the partitioning, and the newest version of a key comes first. A
//     shard's records are those whose bucket (stored in every value) lies in
//     the shard's span; for a range collection that is one contiguous span.
//   - The format version written at creation is checked at every open; a node
//     refuses a format it does not know.
//   - One process at a time opens a data directory: Open takes an advisory
//     lock that dies with the process.
//
// storage does no raft and knows no shard semantics; the shard and
// replication packages build on the encodings here.
package storage
