// Package group holds groupkv's Key Grouping protocol (G-Store) as two
// pure, deterministic state machines: Leader, the groups a shard leads (it
// keeps them in the shard of each group's leader key), and Follower, the
// keys of a shard that it has yielded to groups. They do no I/O and read
// no clock: inputs (requests, messages, ticks, committed records) go in,
// effects come out.
//
// # What it owns
//
// Leader: each group's incarnation (Ref), mode (atomic | best_effort),
// state (creating → active → deleting, then forgotten), members with their
// join status (pending, joined with the follower's yield id and the
// group's value of the key, refused with a reason, releasing, released),
// and one outbox per follower shard: the committed group writes the
// follower has not acknowledged, numbered, each with the version of the
// record that committed it (a shipment carries them all, and the follower
// stores each at its version, so that a read of the key's shard at any
// version finds the group's write of that version once shipped).
// Follower: for each yielded key,
// the group, the yield id, whether the JAA came, and the last outbox entry
// applied to it; and the shard's last yield id, so that yield ids never
// repeat (they are assigned 1, 2, 3... in Apply, hence increase per key).
// Both encode deterministically, to live in the shard's storage and ride
// raft snapshots: in parts (parts.go), a header and, per group, a part for
// the group, one per member, one per outbox and one per outbox entry (per
// yielded key, one part), so that storing the change of a record rewrites only the parts it
// touched (PartsAfter; Parts, DecodeLeaderParts, DecodeFollowerParts); or
// whole (Encode, DecodeLeader, DecodeFollower), the format of the shards
// that stored one value. Records and messages
// encode too (EncodeRecord, EncodeMessage).
//
// # The protocol
//
//	leader                                        follower
//	Create → log create; on Apply: J ──────────→  OnJ: key has an intent, a lock or
//	                                              a group → JA refused (no wait);
//	                                              else log yield; on Apply: yield id
//	              OnJA: log join (or refuse) ←──  y, JA(y, value)  (re-sent until JAA)
//	on Apply: JAA(y) ─────────────────────────→  OnJAA: y is the key's yield →
//	  all answered → active, reply               log confirm (else stale, ignored)
//	Write → log write; on Apply: value, outbox
//	Tick: Ship(the outbox's entries) ─────────→  log apply-ship; on Apply: Store each
//	              OnShipAck: log shipped ←─────  entry not applied yet to a key whose
//	                                              join is confirmed, ShipAck
//	Delete → log delete; on Apply: deleting;
//	  D(y, the key's entries) ────────────────→  OnD: key yielded to the group with
//	                                              y → log free; on Apply: Store each
//	                                              entry not applied yet, owned, DA;
//	              OnDA: log release ←──────────  else DA at once, no change
//	  all released → forget, reply
//
// Creation answers once every member has answered: best_effort keeps the
// keys that joined; atomic, at the first refusal, deletes the group (D to
// every member not refused, with yield 0 to those still pending: "whatever
// you yielded to this group") and answers ErrRefused only once every D is
// acknowledged, so the keys can join another group at once. A delete
// during creation answers the creator ErrDeletedWhileCreating and
// proceeds the same way.
//
// A shipment is bounded (Options.MaxShipEntries, MaxShipBytes): a Ship
// carries the first entries of its outbox, the next Ship those after the
// ones acknowledged. A D that cannot carry all of its key's entries
// carries the first and names the last (Seq): the follower stores them,
// confirms the key (the D names the joined yield) and keeps it for the
// group, which, its outbox backlogged, ships while deleting; the D that
// carries the last frees the key.
//
// Duplicates, delays and reordering are harmless: a J for a key already
// yielded to the group answers the same JA (no second yield); a JA of a
// joined member answers the same JAA; a JAA whose yield id is not the
// key's current one is stale and ignored; a D that does not match the
// key's current group and yield is answered DA without a change; a JA for
// a group, or an incarnation of it, the leader does not know, or that does
// not want the key (deleting, refused, released), gets D; entries already
// applied are skipped by their sequence numbers, and entries for a key
// whose join is not confirmed wait, unacknowledged, for its JAA: a key
// yielded again to a group that released it (a late J) is never confirmed,
// so a late Ship of that group does not overwrite the writes the key's
// shard took since. Group ids may be reused once deleted: a Ref carries
// the leader shard's incarnation, and no message of one incarnation acts
// on another.
//
// Retries (Tick, on the raft leader replica only): every RetryTicks, the
// leader re-sends J to pending members, D to releasing ones and every
// non-empty outbox of a group not deleting (new outbox entries ship every
// ShipTicks, or at once with ShipNew; a deleting group's go with its Ds);
// the follower re-sends JA for every yielded key whose JAA
// has not come, and every ProbeTicks a probe (JA with Probe) for the
// others, which the leader answers only with D, when it does not hold the
// key. So a key yielded to a ghost group (a late J of a group since
// deleted) is freed within a retry period once messages get through.
//
// # Ownership and invariants
//
// A key's owner is defined over applied (committed) state: the group G
// owns key k when G's leader has k as a Joined member (its join is logged
// and its D not yet sent); k's home shard owns it when its Follower holds
// no yield of k. A key yielded but not joined (a join in progress, a
// release in progress, or a ghost) has no owner: nobody writes it.
//
//   - Never two owners: if G has k Joined with yield y, k's follower holds
//     k yielded to G with y. (The follower frees (G, y) only on a D for G
//     with y or 0; the leader sends such a D only after it stopped holding
//     k: D(y) to a releasing member, D(0) to a member that never joined,
//     and D in answer to a JA it will never join.)
//   - A key owned by its home shard holds the last acknowledged write: a
//     group's D(y) to a joined member carries the key's entries not
//     acknowledged (the group is deleting: no write comes after), and the
//     follower stores those it has not applied, each at its version, in
//     the same Apply that frees the key, so the key's committed group
//     writes are applied when the shard owns it again; and a group's entry
//     applies only to the yield the group joined (confirmed by a JAA, or
//     named by the D of the join), so once the key is freed no late Ship
//     or D of the group writes it.
//   - A group's value of a joined key is the follower's value at the yield,
//     then the group's last committed write.
//   - Safety does not depend on timing: a message may be lost, duplicated,
//     delayed or reordered; a replica may restart from its applied state.
//     Liveness (every request answered, no key left yielded to a ghost)
//     needs messages to get through eventually and the ticks to run.
//
// # What the node must do
//
//  1. Keep a Leader and a Follower per shard in the shard's replicated
//     state, in parts: after every Apply(r), store the parts PartsAfter(r)
//     returns (deleting those with a nil Value) with the applied index;
//     restore the states from the stored parts (or from a snapshot of
//     them) with DecodeLeaderParts and DecodeFollowerParts. Leader parts
//     of an older format (OldLeaderParts) are replaced, all, by Parts at
//     the next record.
//  2. On the shard's raft leader, call Create, Delete, Write and the On*
//     handlers, and route each message by Type: J, JAA, D and Ship to the
//     destination shard's Follower, JA, DA and ShipAck to its Leader.
//  3. For every Log effect, propose the record (EncodeRecord) to the
//     shard's raft log; once committed, call Apply with it on every
//     replica (Leader.Apply if Kind.ForLeader(), else Follower.Apply). The
//     state changes only in Apply. A lost proposal needs nothing: the
//     retries make up for it.
//  4. Perform Store effects of an Apply in the same state change, on every
//     replica; perform Send and Reply effects only on the raft leader
//     replica (others drop them; a new leader picks up through Tick).
//  5. Call Tick on the raft leader replica only, at a fixed rate.
//  6. For OnJ, fill KeyCheck from the follower shard's leader: an
//     unresolved intent on the key, a lock in the lock table, the key's
//     committed value; grant no lock on the key while its yield is
//     proposed and not applied. Every intent's and plain write's Apply
//     must check that the shard owns the key (Follower.Key reports it
//     yielded), and a group write goes only through Leader.Write.
//
// Usage, on the raft leader of a shard (sketch):
//
//	effs, err := leader.Create(req)   // Log(create)
//	propose(effs)                     // ...committed...
//	for _, rec := range committed {
//		var effs []group.Effect
//		var parts []group.Part
//		if rec.Kind.ForLeader() {
//			effs, parts = leader.Apply(rec), leader.PartsAfter(rec)
//		} else {
//			effs, parts = follower.Apply(rec), follower.PartsAfter(rec)
//		}
//		storeParts(parts) // every replica, with the applied index
//		for _, e := range effs {
//			switch e := e.(type) {
//			case group.Store:
//				writeKey(e.Write) // every replica
//			case group.Send:
//				transport.Send(e.Msg) // leader replica only
//			case group.Reply:
//				answer(e) // leader replica only
//			}
//		}
//	}
//
// group imports only the standard library.
package group
