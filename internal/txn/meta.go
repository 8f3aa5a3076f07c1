package txn

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
)

// Meta identifies a transaction attempt wherever its locks, intents and
// record are: its id, its priority and where its record lives.
type Meta struct {
	// ID names the attempt; it is URL-safe (lower-case hex) and carries
	// the priority and the attempt number (ParseID).
	ID string `json:"id"`
	// Priority is the oracle timestamp of the transaction's first attempt;
	// the lower one is older and wins every conflict.
	Priority uint64 `json:"priority"`
	// Attempt counts the attempts of the transaction, from 1.
	Attempt uint32 `json:"attempt"`
	// Start is the oracle timestamp at which this attempt began; a record
	// whose owner stopped heartbeating is judged from it until the first
	// heartbeat.
	Start uint64 `json:"start"`
	// Anchor is the key whose shard keeps the record.
	Anchor Anchor `json:"anchor"`
	// Plain marks the pseudo-transaction of a plain (non-transactional)
	// write: it holds its locks for one proposal, is never wounded and never
	// wounds.
	Plain bool `json:"plain,omitempty"`
}

// Anchor is a key of a collection, with its bucket: the record of a
// transaction is kept with its anchor, so that it follows the key through
// splits and moves.
type Anchor struct {
	Collection uint32 `json:"collection"`
	Bucket     uint16 `json:"bucket"`
	Key        []byte `json:"key"`
}

// IsSet reports whether the anchor was chosen.
func (a Anchor) IsSet() bool { return a.Key != nil }

// PlainPriority is the priority of a plain write: younger than every
// transaction.
const PlainPriority = math.MaxUint64

// NewID returns the id of attempt attempt of a transaction of priority p.
func NewID(priority uint64, attempt uint32) string {
	var b [8 + 4 + 8]byte
	binary.BigEndian.PutUint64(b[:], priority)
	binary.BigEndian.PutUint32(b[8:], attempt)
	if _, err := rand.Read(b[12:]); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return hex.EncodeToString(b[:])
}

// ErrBadID reports a transaction id that NewID did not make.
var ErrBadID = errors.New("malformed transaction id")

// ParseID returns the priority and attempt number an id carries.
func ParseID(id string) (priority uint64, attempt uint32, err error) {
	if len(id) != 40 {
		return 0, 0, fmt.Errorf("%w %q", ErrBadID, id)
	}
	b, err := hex.DecodeString(id)
	// NewID writes lower case only: an upper-case spelling would name the
	// same attempt by another string (ids are compared and looked up as
	// strings).
	if err != nil || hex.EncodeToString(b) != id {
		return 0, 0, fmt.Errorf("%w %q", ErrBadID, id)
	}
	return binary.BigEndian.Uint64(b), binary.BigEndian.Uint32(b[8:]), nil
}

// Older reports whether a has priority over b: a lower priority
// timestamp, ties broken by id.
func Older(a, b *Meta) bool {
	if a.Priority != b.Priority {
		return a.Priority < b.Priority
	}
	return a.ID < b.ID
}
