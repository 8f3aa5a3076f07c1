package group

import (
	"fmt"
	"strings"
)

// MsgType is the type of a protocol message.
type MsgType uint8

const (
	// MsgJ (Join), leader → follower: yield Key to Group.
	MsgJ MsgType = 1
	// MsgJA (JoinAck), follower → leader: Key is yielded to Group with
	// Yield and had Value and Tags (Absent: no value); or, Refused non-empty, it will
	// not be. A follower re-sends it until it gets JAA or D; with Probe set
	// it is the periodic check of a key whose JAA came, answered only by a
	// D if the leader does not hold the key.
	MsgJA MsgType = 2
	// MsgJAA (JoinAckAck), leader → follower: the join of Key with Yield is
	// logged.
	MsgJAA MsgType = 3
	// MsgD (Delete), leader → follower: take Key back if it is yielded to
	// Group with Yield (Yield 0: with any yield id).
	MsgD MsgType = 4
	// MsgDA (DeleteAck), follower → leader: Key is not yielded to Group with
	// Yield (echoing the D's) any more.
	MsgDA MsgType = 5
	// MsgShip, leader → follower: apply Entries, the unacknowledged group
	// writes to the follower's keys, in order.
	MsgShip MsgType = 6
	// MsgShipAck, follower → leader: every entry up to Seq is applied.
	MsgShipAck MsgType = 7
)

var msgNames = [...]string{MsgJ: "J", MsgJA: "JA", MsgJAA: "JAA", MsgD: "D", MsgDA: "DA", MsgShip: "Ship", MsgShipAck: "ShipAck"}

func (t MsgType) String() string {
	if int(t) < len(msgNames) && msgNames[t] != "" {
		return msgNames[t]
	}
	return fmt.Sprintf("MsgType(%d)", uint8(t))
}

// Message is a protocol message between a leader shard and a follower
// shard. Which fields are set depends on Type (see the MsgType constants).
type Message struct {
	Type     MsgType
	From, To ShardID
	Group    Ref
	Key      Key
	Yield    uint64
	Value    []byte
	Absent   bool
	Tags     Tags
	Version  uint64
	Refused  string
	Probe    bool
	Entries  []Entry
	Seq      uint64
}

func (m Message) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "s%d->s%d %s %s", m.From, m.To, m.Type, m.Group)
	switch m.Type {
	case MsgShip:
		for _, e := range m.Entries {
			fmt.Fprintf(&b, " %s", e)
		}
		return b.String()
	case MsgShipAck:
		fmt.Fprintf(&b, " seq=%d", m.Seq)
		return b.String()
	}
	fmt.Fprintf(&b, " %s", m.Key)
	if m.Type != MsgJ && !(m.Type == MsgJA && m.Refused != "") {
		fmt.Fprintf(&b, " y=%d", m.Yield)
	}
	for _, e := range m.Entries {
		fmt.Fprintf(&b, " %s", e) // a D's
	}
	if m.Type == MsgJA {
		switch {
		case m.Refused != "":
			fmt.Fprintf(&b, " refused=%q", m.Refused)
		case m.Probe:
			b.WriteString(" probe")
		case m.Absent:
			b.WriteString(" absent")
		default:
			fmt.Fprintf(&b, " value=%s%s", m.Value, m.Tags)
		}
	}
	return b.String()
}

// RecordKind is the kind of a state change record.
type RecordKind uint8

// Records of a leader's state.
const (
	// RecCreate: create Group (ID, Leader; the incarnation is assigned at
	// Apply) with Mode, leader key Key and Members.
	RecCreate RecordKind = 1
	// RecJoin: Key joined Group with Yield, Value, Absent, Tags (a JA from
	// follower Shard).
	RecJoin RecordKind = 2
	// RecRefuse: Key refused to join Group for Reason (a JA).
	RecRefuse RecordKind = 3
	// RecDelete: delete the group named Group.ID.
	RecDelete RecordKind = 4
	// RecRelease: Key is released from Group (a DA echoing Yield).
	RecRelease RecordKind = 5
	// RecWrite: Group committed Writes (the group executor's commit).
	RecWrite RecordKind = 6
	// RecShipped: follower Shard applied Group's outbox up to Seq (a
	// ShipAck).
	RecShipped RecordKind = 7
)

// Records of a follower's state.
const (
	// RecYield: yield Key to Group; its value is Value, Absent, Tags (a
	// J).
	RecYield RecordKind = 16
	// RecConfirm: the leader logged the join of Key with Yield (a JAA).
	RecConfirm RecordKind = 17
	// RecFree: take Key back from Group if yielded with Yield (0: any) (a
	// D).
	RecFree RecordKind = 18
	// RecApplyShip: apply Group's Entries to the keys still yielded to it
	// (a Ship).
	RecApplyShip RecordKind = 19
)

var recNames = map[RecordKind]string{RecCreate: "create", RecJoin: "join", RecRefuse: "refuse",
	RecDelete: "delete", RecRelease: "release", RecWrite: "write", RecShipped: "shipped",
	RecYield: "yield", RecConfirm: "confirm", RecFree: "free", RecApplyShip: "apply-ship"}

func (k RecordKind) String() string {
	if s, ok := recNames[k]; ok {
		return s
	}
	return fmt.Sprintf("RecordKind(%d)", uint8(k))
}

// ForLeader reports whether records of kind k belong to a Leader (else, if
// valid, to a Follower).
func (k RecordKind) ForLeader() bool { return k >= RecCreate && k <= RecShipped }

func (k RecordKind) valid() bool {
	return k.ForLeader() || k >= RecYield && k <= RecApplyShip
}

// Record is a state change of a Leader or a Follower. The node appends it
// to the shard's raft log and, once committed, calls Apply with it on every
// replica. Which fields are set depends on Kind (see the RecordKind
// constants).
type Record struct {
	Kind    RecordKind
	Group   Ref
	Mode    Mode
	Key     Key
	Members []Member
	Yield   uint64
	Value   []byte
	Absent  bool
	Tags    Tags
	Reason  string
	Shard   ShardID
	Seq     uint64
	Writes  []Write
	Entries []Entry
	// Version: of Value (RecYield, RecJoin); the commit version of a
	// RecWrite, which the node assigns.
	Version uint64
	// Reads are the keys a RecWrite's transaction read, validated in Apply.
	Reads []Read
}

func (r Record) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", r.Kind, r.Group)
	switch r.Kind {
	case RecCreate:
		fmt.Fprintf(&b, " %s leader=%s members=(", r.Mode, r.Key)
		for i, m := range r.Members {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, "%s@s%d", m.Key, m.Shard)
		}
		b.WriteString(")")
	case RecJoin, RecYield:
		fmt.Fprintf(&b, " %s", r.Key)
		if r.Kind == RecJoin {
			fmt.Fprintf(&b, " y=%d", r.Yield)
		}
		if r.Absent {
			b.WriteString(" absent")
		} else {
			fmt.Fprintf(&b, " value=%s%s", r.Value, r.Tags)
		}
	case RecRefuse:
		fmt.Fprintf(&b, " %s reason=%q", r.Key, r.Reason)
	case RecRelease, RecConfirm, RecFree:
		fmt.Fprintf(&b, " %s y=%d", r.Key, r.Yield)
		for _, e := range r.Entries {
			fmt.Fprintf(&b, " %s", e)
		}
	case RecWrite:
		for _, w := range r.Writes {
			fmt.Fprintf(&b, " %s", w)
		}
	case RecShipped:
		fmt.Fprintf(&b, " s%d seq=%d", r.Shard, r.Seq)
	case RecApplyShip:
		for _, e := range r.Entries {
			fmt.Fprintf(&b, " %s", e)
		}
	}
	return b.String()
}

// Effect is what a state machine asks of the node: one of Log, Send, Reply
// and Store.
type Effect interface{ isEffect() }

// Log asks the node to append Record to the shard's raft log and, once
// committed, to call Apply(Record) on every replica. Nothing has changed
// yet; if the entry is lost (the leader fails before it commits), the
// retries of the protocol make up for it.
type Log struct{ Record Record }

// Send asks the node to send Msg to shard Msg.To (its raft leader). Only
// the shard's raft leader sends; followers drop Send effects. Delivery may
// fail: the protocol retries.
type Send struct{ Msg Message }

// Op is the request a Reply answers.
type Op uint8

const (
	OpCreate Op = 1
	OpDelete Op = 2
	OpWrite  Op = 3
)

func (o Op) String() string {
	switch o {
	case OpCreate:
		return "create"
	case OpDelete:
		return "delete"
	case OpWrite:
		return "write"
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// Reply answers a creator, a deleter or a writer: Err nil is success.
// Joined lists the keys of a created group (the leader included), Refused
// the keys that would not join (best_effort: beside a success; atomic:
// with ErrRefused). Only the shard's raft leader answers; a request whose
// answer was lost to a change of leader is re-asked by its client.
type Reply struct {
	Op      Op
	Group   Ref
	Err     error
	Joined  []Key
	Refused []Refusal
}

func (r Reply) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s: ", r.Op, r.Group)
	if r.Err != nil {
		b.WriteString(r.Err.Error())
	} else {
		b.WriteString("ok")
	}
	if r.Op == OpCreate && (r.Err == nil || len(r.Joined) > 0) {
		fmt.Fprintf(&b, " joined=(%s)", joinKeys(r.Joined))
	}
	if len(r.Refused) > 0 {
		b.WriteString(" refused=(")
		for i, f := range r.Refused {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, "%s:%s", f.Key, f.Reason)
		}
		b.WriteString(")")
	}
	return b.String()
}

// Store asks the node to write Write into the key's data at Version (0:
// at the version of the record applied), as part of the Apply that
// returned it, on every replica (it is replicated state, like the record
// itself). Only a Follower's Apply of RecApplyShip or RecFree returns it;
// one Apply may store a key more than once, at increasing versions.
type Store struct {
	Write   Write
	Version uint64
}

func (Log) isEffect()   {}
func (Send) isEffect()  {}
func (Reply) isEffect() {}
func (Store) isEffect() {}
