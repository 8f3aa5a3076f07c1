// Package linearizability records histories of concurrent single-key
// operations (put, get, delete) against groupkv and checks them for
// linearizability with porcupine (github.com/anishathalye/porcupine).
//
// The package owns three things:
//
//   - Recording: a Recorder, shared by the clients of a test, stamps each
//     operation's invocation (Begin) and response (Pending.End) with a strictly
//     increasing clock, so that an operation that returned before another was
//     invoked is ordered before it.
//   - The sequential specification: KVModel, a porcupine model of one key —
//     present or absent, its value, and its version — partitioned by key.
//     Reads must return the current value and the version of the write they
//     read; versions of acknowledged writes must strictly increase per key in
//     linearization order.
//   - Checking: Check runs porcupine over a History and, when the history is
//     not shown linearizable, writes porcupine's HTML visualisation to a file
//     whose path it returns. Recorder.Check does the same for tests.
//
// Operations whose outcome is unknown — a timeout, a lost connection, a
// commit_unknown answer, a server that died — are kept in the history with a
// response time after every other event: the checker may take them to have
// happened at any moment after their invocation, or (by placing them last,
// where nothing observes them) not at all. Operations that definitely did not
// happen — refused, not the leader, unavailable before proposing — are dropped
// with Pending.Fail.
//
// The package checks client-observable behaviour only; it knows nothing of
// raft, shards or storage, and imports nothing from groupkv. Keys are opaque
// strings: a test that uses several collections composes the collection into
// the key.
package linearizability
