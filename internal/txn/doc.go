// Package txn holds the parts of groupkv's transactions that need no
// storage or network: a transaction's identity and priority (Meta), its
// record and the transitions of the record's state machine (Record,
// Transition), the encoding of intents, and the lock table a shard leader
// keeps in memory (LockTable).
//
// The protocol (see docs/transactions.md): strict two-phase locking with
// wound-wait. A transaction's priority is the oracle timestamp of its first
// attempt, kept across retries; the older transaction wins every conflict.
// Locks are volatile state of a shard's leader, stamped with its raft term;
// intents and records are replicated shard state, changed only by commands
// applied through the shard's log (internal/shard/txn.go). The record moves
// PENDING → COMMITTED or PENDING → ABORTED by compare-and-set; that
// compare-and-set is the commit point.
//
// Invariants kept here:
//   - A record never leaves COMMITTED or ABORTED (Transition).
//   - A lock is granted to at most one exclusive holder, or to shared
//     holders only; a requester never waits for a younger holder (it wounds
//     it), so waits-for edges always point to older transactions and there
//     is no deadlock.
//
// txn imports only kv; the node drives it.
package txn
