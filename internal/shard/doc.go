// Package shard is the deterministic state machine of one shard replica.
//
// A shard's replicated state — its MVCC records, its applied index, the
// highest version it applied, its GC threshold, and for the meta shard the
// catalog and the TSO high-water mark — changes only in (*Shard).Apply, which
// is called with the committed raft entries of the shard in log order and
// writes its effects into a Pebble batch that also records the applied index.
// The batch is committed by the caller (package replication); Apply itself
// does no I/O beyond reading through that batch, reads no clock and draws no
// random numbers, so every replica that applies the same log reaches the same
// state.
//
// Checks whose answer must not change between proposal and application —
// conditional puts, deletes of absent keys, ownership of a key by the shard,
// monotonic versions — run inside Apply.
//
// Reads of applied state (ReadRecord) go straight to Pebble; the caller
// decides when a read is allowed (leadership, snapshot waits).
//
// Commands are encoded by the Encode* functions and decoded by
// DecodeCommand; a leader assigns a write's version at proposal time with
// SetVersion, just before handing the command to raft.
package shard
