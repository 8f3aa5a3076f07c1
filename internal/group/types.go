package group

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// ShardID names a shard (a raft group).
type ShardID uint64

// Key is a key of a collection.
type Key struct {
	Collection uint32
	Key        string
}

func (k Key) String() string {
	if k.Collection == 0 {
		return k.Key
	}
	return fmt.Sprintf("%d/%s", k.Collection, k.Key)
}

func (k Key) less(o Key) bool {
	if k.Collection != o.Collection {
		return k.Collection < o.Collection
	}
	return k.Key < o.Key
}

// Ref names one incarnation of a group in protocol messages and follower
// state. ID is the user's name of the group; Leader is the shard that
// keeps the group (the leader key's shard); Inc is the incarnation the
// leader shard assigned when it applied the creation, unique within that
// shard. A group id may be reused once its group is deleted; the new group
// has another Inc, so no message of the old one is taken for the new one.
type Ref struct {
	ID     string
	Leader ShardID
	Inc    uint64
}

func (r Ref) String() string {
	if r.Inc == 0 {
		return fmt.Sprintf("%s@s%d", r.ID, r.Leader)
	}
	return fmt.Sprintf("%s#%d@s%d", r.ID, r.Inc, r.Leader)
}

// Mode says what a creation does with keys that cannot join.
type Mode uint8

const (
	// Atomic: the group is created with every member or not at all; if a
	// key is refused, the keys that joined are released before the creator
	// is answered.
	Atomic Mode = 1
	// BestEffort: the group keeps the keys that joined.
	BestEffort Mode = 2
)

func (m Mode) String() string {
	switch m {
	case Atomic:
		return "atomic"
	case BestEffort:
		return "best_effort"
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// State is the state of a group at its leader.
type State uint8

const (
	// Creating: J sent to members that have not answered yet.
	Creating State = 1
	// Active: every member answered; the group serves its joined keys.
	Active State = 2
	// Deleting: deleted (or an atomic creation failed); the leader waits for
	// its outboxes to empty, then for a DA from every member it sent D.
	Deleting State = 3
	// Deleted: every member released; the leader forgot the group. Only
	// replies carry it.
	Deleted State = 4
)

func (s State) String() string {
	switch s {
	case Creating:
		return "creating"
	case Active:
		return "active"
	case Deleting:
		return "deleting"
	case Deleted:
		return "deleted"
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// MemberStatus is where a member stands in the protocol, at the leader.
type MemberStatus uint8

const (
	// Pending: J sent, no answer logged yet.
	Pending MemberStatus = 1
	// Joined: the follower yielded the key (Yield) and the leader logged
	// the join; the group owns the key.
	Joined MemberStatus = 2
	// Refused: the follower would not yield the key (Reason).
	Refused MemberStatus = 3
	// Releasing: the group is being deleted and D was sent (with Yield, or
	// with 0 for a member that never joined); waiting for DA.
	Releasing MemberStatus = 4
	// Released: DA logged.
	Released MemberStatus = 5
)

func (s MemberStatus) String() string {
	switch s {
	case Pending:
		return "pending"
	case Joined:
		return "joined"
	case Refused:
		return "refused"
	case Releasing:
		return "releasing"
	case Released:
		return "released"
	}
	return fmt.Sprintf("MemberStatus(%d)", uint8(s))
}

// Member is one key of a group, at its leader.
type Member struct {
	Key Key
	// Shard is the follower shard that owns Key when no group does.
	Shard  ShardID
	Status MemberStatus
	// Yield is the follower's yield id of a Joined or Releasing member (0:
	// the member was still pending when the deletion began).
	Yield uint64
	// Value and Absent are the key's value in the group: the follower's at
	// the join, then the group's last committed write. Kept for Joined
	// members only.
	Value  []byte
	Absent bool
	// Tags are the key's tags in the group, with Value.
	Tags Tags
	// Version is the version of Value: the follower's at the join, then
	// that of the group's last committed write of the key. Group
	// transactions validate their reads against it.
	Version uint64
	// Reason says why a Refused member was refused.
	Reason string
}

// Write is a write of one key: a value and its tags, or a deletion
// (Delete).
type Write struct {
	Key    Key
	Value  []byte
	Delete bool
	Tags   Tags
}

func (w Write) String() string {
	if w.Delete {
		return w.Key.String() + "=<deleted>"
	}
	return fmt.Sprintf("%s=%s%s", w.Key, w.Value, w.Tags)
}

// Tags are the tags of a key's value, which a group holds and ships with
// the value: a group write sets them, as a plain put does.
type Tags struct {
	// Keep: the tags are not known here; the key's shard keeps those it
	// stores. States and messages of builds whose group writes always kept
	// a key's tags decode so; nothing this build makes has Keep.
	Keep bool
	// List is the tags (none: nil). Shared like values: never changed in
	// place.
	List []string
}

func (t Tags) clone() Tags {
	t.List = slices.Clone(t.List)
	return t
}

// String is empty for no tags, so that the common case reads as before.
func (t Tags) String() string {
	switch {
	case t.Keep:
		return " tags=<kept>"
	case len(t.List) == 0:
		return ""
	}
	return " tags=" + strings.Join(t.List, ",")
}

// Read is a key a group transaction read, at the version it read (the
// member's Version then).
type Read struct {
	Key     Key
	Version uint64
}

// Entry is a committed group write waiting in an outbox, numbered in the
// order of its outbox: the write, and Version, the version of the group
// write record that committed it. A shipment (Ship, D, and the records
// that apply them) carries the outbox's entries as they are, and the
// key's shard stores each at its Version, so that the shard's history of
// the key is the group's.
//
// An entry of an older build has no Version (0) and, in an outbox, names
// the key only (its member holds the value); it ships as the key's last
// such entry, with the key's value at the leader when sent
// (Group.shipment), and is stored at the version of the record that
// applies it.
type Entry struct {
	Seq uint64
	Write
	Version uint64
}

func (e Entry) String() string {
	if e.Version == 0 {
		return fmt.Sprintf("%d:%s", e.Seq, e.Write)
	}
	return fmt.Sprintf("%d:%s@%d", e.Seq, e.Write, e.Version)
}

// Outbox holds the committed group writes to the keys of one follower
// shard that the follower has not acknowledged yet.
type Outbox struct {
	Shard ShardID
	// Next is the sequence number the next entry gets.
	// Invariant: Entries are consecutive and end at Next-1.
	Next    uint64
	Entries []Entry
	// size is the bytes of the Entries' values (derived: not encoded;
	// the decoders count it).
	size int
}

// count sets ob.size from ob.Entries.
func (ob *Outbox) count() {
	ob.size = 0
	for _, e := range ob.Entries {
		ob.size += len(e.Value)
	}
}

// CreateRequest asks a leader shard to create a group.
type CreateRequest struct {
	ID   string
	Mode Mode
	// Leader is the leader key; it is a member whether or not Members
	// lists it.
	Leader Key
	// Members are the keys, each with the shard that owns it (the node
	// resolves it). The leader key's shard must be the leader's.
	Members []Member
}

// Refusal is a key that would not join, and why.
type Refusal struct {
	Key    Key
	Reason string
}

func joinKeys(keys []Key) string {
	s := make([]string, len(keys))
	for i, k := range keys {
		s[i] = k.String()
	}
	return strings.Join(s, ",")
}

// Errors of requests (returned by Create, Delete and Write, or carried by
// a Reply when Apply finds them).
var (
	// ErrInvalid: the request is malformed (no id, no members, an unknown
	// mode, a leader key on another shard, a write to a non-member).
	ErrInvalid = errors.New("group: invalid request")
	// ErrExists: a group with this id exists at this leader shard; delete
	// it first or choose another id.
	ErrExists = errors.New("group: a group with this id exists")
	// ErrNotFound: no group with this id at this leader shard.
	ErrNotFound = errors.New("group: no such group")
	// ErrRefused: an atomic group could not take every key; every key it
	// took has been released (the API's 409).
	ErrRefused = errors.New("group: a key refused to join the atomic group")
	// ErrDeletedWhileCreating: the group was deleted before its creation
	// finished.
	ErrDeletedWhileCreating = errors.New("group: the group was deleted while being created")
	// ErrNotActive: a write to a group that is not active.
	ErrNotActive = errors.New("group: the group is not active")
	// ErrConflict: a group transaction read a key that a write committed
	// since changed (optimistic validation failed); retry it.
	ErrConflict = errors.New("group: a key read has changed since")
	// ErrBacklogged: a write to a key whose shard has not acknowledged
	// as many of the group's writes as its outbox holds
	// (Options.MaxOutboxEntries, MaxOutboxBytes); retry it once they
	// are shipped.
	ErrBacklogged = errors.New("group: a member's shard is too far behind the group's writes")
)

// ErrCorrupt reports an encoding that does not decode.
var ErrCorrupt = errors.New("group: corrupt encoding")
