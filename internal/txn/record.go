package txn

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// Status is the state of a transaction record. A record that does not
// exist is PENDING: records are written lazily, at the first heartbeat, a
// wound or the commit.
type Status byte

const (
	Pending   Status = 0
	Committed Status = 1
	Aborted   Status = 2
)

func (s Status) String() string {
	switch s {
	case Pending:
		return "PENDING"
	case Committed:
		return "COMMITTED"
	case Aborted:
		return "ABORTED"
	}
	return fmt.Sprintf("Status(%d)", byte(s))
}

// Record is a transaction record.
type Record struct {
	Status Status
	// CommitTS is the commit timestamp of a COMMITTED record.
	CommitTS uint64
	// Heartbeat is the oracle timestamp of the owner's last heartbeat (0:
	// none yet; the attempt's start counts).
	Heartbeat uint64
	// Reason says why an ABORTED record was aborted.
	Reason string
	// WoundedBy is the transaction that wounded an ABORTED record's owner
	// (nil: not a wound). Its retry waits for it to finish, so that one
	// transaction wounds another at most once.
	WoundedBy *Meta
	// RetriedAs is the next attempt of an ABORTED record's transaction,
	// set once by that attempt before it runs (OpRetry). Whoever waits for
	// the transaction to end follows it from attempt to attempt.
	RetriedAs *Meta
	// ForgetAfter, if not 0, is when a decided record may be removed (Unix
	// time in nanoseconds, by the clock of the node that asked): its
	// coordinator found it decided and its intents resolved, and set it,
	// so that the anchor shard's leader removes it then, whatever becomes
	// of the coordinator meanwhile.
	ForgetAfter uint64
	// Participants are the shards a COMMITTED record's transaction
	// prepared in (Listed: the record lists them, even none; records
	// written before they were listed do not). Once none of them holds the
	// transaction prepared, its intents are resolved and the record may
	// go, should its coordinator not have marked it (txn_forget.go).
	Participants []uint64
	Listed       bool
	// AbortedAt is when an ABORTED record was aborted (Unix time in
	// nanoseconds, by the clock of the node that asked; 0: not known, a
	// record aborted before it was kept). The attempt cannot commit after
	// its deadline, MaxTxnDuration past its start, which came before.
	AbortedAt uint64
}

// Flags of the byte after the heartbeat in an encoded record.
const (
	recordWoundedBy    = 1 << 0
	recordRetriedAs    = 1 << 1
	recordForgetAfter  = 1 << 2
	recordParticipants = 1 << 3
	recordAbortedAt    = 1 << 4
)

// EncodeRecord encodes r (bucket: the anchor's, kept for ownership).
func EncodeRecord(r Record, bucket uint16) []byte {
	b := make([]byte, 0, 1+2+8+8+1+len(r.Reason))
	b = append(b, byte(r.Status))
	b = binary.BigEndian.AppendUint16(b, bucket)
	b = binary.BigEndian.AppendUint64(b, r.CommitTS)
	b = binary.BigEndian.AppendUint64(b, r.Heartbeat)
	var flags byte
	if r.WoundedBy != nil {
		flags |= recordWoundedBy
	}
	if r.RetriedAs != nil {
		flags |= recordRetriedAs
	}
	if r.ForgetAfter != 0 {
		flags |= recordForgetAfter
	}
	if r.Listed {
		flags |= recordParticipants
	}
	if r.AbortedAt != 0 {
		flags |= recordAbortedAt
	}
	b = append(b, flags)
	if r.ForgetAfter != 0 {
		b = binary.BigEndian.AppendUint64(b, r.ForgetAfter)
	}
	if r.Listed {
		b = binary.AppendUvarint(b, uint64(len(r.Participants)))
		for _, p := range r.Participants {
			b = binary.AppendUvarint(b, p)
		}
	}
	if r.AbortedAt != 0 {
		b = binary.BigEndian.AppendUint64(b, r.AbortedAt)
	}
	if r.WoundedBy != nil {
		b = AppendMeta(b, r.WoundedBy)
	}
	if r.RetriedAs != nil {
		b = AppendMeta(b, r.RetriedAs)
	}
	return append(b, r.Reason...)
}

// ErrCorruptRecord reports a record that does not decode.
var ErrCorruptRecord = errors.New("txn: corrupt record")

// DecodeRecord decodes a record and the bucket of its anchor.
func DecodeRecord(b []byte) (Record, uint16, error) {
	if len(b) < 20 || b[0] > byte(Aborted) || b[19]&^(recordWoundedBy|recordRetriedAs|recordForgetAfter|recordParticipants|recordAbortedAt) != 0 {
		return Record{}, 0, ErrCorruptRecord
	}
	r := Record{Status: Status(b[0]), CommitTS: binary.BigEndian.Uint64(b[3:]), Heartbeat: binary.BigEndian.Uint64(b[11:])}
	rest := b[20:]
	var ok bool
	if b[19]&recordForgetAfter != 0 {
		if r.ForgetAfter, rest, ok = nonZero64(rest); !ok {
			return Record{}, 0, ErrCorruptRecord
		}
	}
	if b[19]&recordParticipants != 0 {
		n, more, ok := canonicalUvarint(rest)
		if !ok || n > uint64(len(more)) {
			return Record{}, 0, ErrCorruptRecord
		}
		rest = more
		r.Listed = true
		for range n {
			p, more, ok := canonicalUvarint(rest)
			if !ok {
				return Record{}, 0, ErrCorruptRecord
			}
			r.Participants, rest = append(r.Participants, p), more
		}
	}
	if b[19]&recordAbortedAt != 0 {
		if r.AbortedAt, rest, ok = nonZero64(rest); !ok {
			return Record{}, 0, ErrCorruptRecord
		}
	}
	if b[19]&recordWoundedBy != 0 {
		m, more, err := DecodeMeta(rest)
		if err != nil {
			return Record{}, 0, ErrCorruptRecord
		}
		r.WoundedBy, rest = &m, more
	}
	if b[19]&recordRetriedAs != 0 {
		m, more, err := DecodeMeta(rest)
		if err != nil {
			return Record{}, 0, ErrCorruptRecord
		}
		r.RetriedAs, rest = &m, more
	}
	r.Reason = string(rest)
	return r, binary.BigEndian.Uint16(b[1:]), nil
}

// nonZero64 decodes a big-endian uint64 that a flag says is there, so not
// 0 (a 0 has no flag: the encoding is canonical).
func nonZero64(b []byte) (uint64, []byte, bool) {
	if len(b) < 8 {
		return 0, nil, false
	}
	v := binary.BigEndian.Uint64(b)
	return v, b[8:], v != 0
}

// canonicalUvarint decodes a uvarint in its shortest encoding.
func canonicalUvarint(b []byte) (uint64, []byte, bool) {
	v, k := binary.Uvarint(b)
	if k <= 0 || k != len(binary.AppendUvarint(nil, v)) {
		return 0, nil, false
	}
	return v, b[k:], true
}

// RecordOp is what a record command asks.
type RecordOp byte

const (
	// OpHeartbeat refreshes a PENDING record's heartbeat.
	OpHeartbeat RecordOp = 1
	// OpAbort moves a PENDING record to ABORTED: a wound (IfIdleBefore 0)
	// or, with IfIdleBefore, only if the owner's last sign of life is older
	// than it (an expired heartbeat).
	OpAbort RecordOp = 2
	// OpCommit moves a PENDING record to COMMITTED at TS, unless the
	// attempt ran past its deadline.
	OpCommit RecordOp = 3
	// OpStatus changes nothing; it reads the record through the log.
	OpStatus RecordOp = 4
	// OpRetry links an attempt to its next one (Next), which is about to
	// run: an ABORTED record not yet linked gets RetriedAs; a PENDING one,
	// which its own client gave up, is aborted and linked at once. A
	// COMMITTED or already linked record is left as it is (the answer
	// tells the caller which).
	OpRetry RecordOp = 5
)

// RecordCmd is the body of a record command.
type RecordCmd struct {
	Op   RecordOp
	Meta Meta
	// TS is the heartbeat's timestamp (OpHeartbeat) or the commit
	// timestamp (OpCommit).
	TS uint64
	// IfIdleBefore makes an OpAbort conditional (see OpAbort).
	IfIdleBefore uint64
	// Deadline: an OpCommit with TS above it aborts instead (0: none).
	Deadline uint64
	Reason   string
	// By is the wounder of an OpAbort that is a wound.
	By *Meta
	// Next is the attempt an OpRetry links.
	Next *Meta
	// Participants (Listed) are the shards an OpCommit's transaction
	// prepared in (Record.Participants).
	Participants []uint64 `json:",omitempty"`
	Listed       bool     `json:",omitempty"`
	// Now is the proposer's wall clock (Unix nanoseconds): an ABORTED
	// record the command makes keeps it (Record.AbortedAt).
	Now uint64 `json:",omitempty"`
}

// Transition applies cmd to the record cur (exists false: no record yet)
// and returns the record after it and whether it must be written. A record
// never leaves COMMITTED or ABORTED; an ABORTED one may be linked once
// to its next attempt (OpRetry).
func Transition(cur Record, exists bool, cmd RecordCmd) (next Record, write bool) {
	if cmd.Op == OpRetry && cmd.Next != nil && cur.Status == Aborted && cur.RetriedAs == nil {
		cur.RetriedAs = cmd.Next
		return cur, true
	}
	if cur.Status != Pending {
		return cur, false
	}
	switch cmd.Op {
	case OpHeartbeat:
		if cmd.TS > cur.Heartbeat {
			cur.Heartbeat = cmd.TS
			return cur, true
		}
		return cur, !exists
	case OpAbort:
		if cmd.IfIdleBefore != 0 && LastAlive(cur, cmd.Meta) >= cmd.IfIdleBefore {
			return cur, false
		}
		return Record{Status: Aborted, Heartbeat: cur.Heartbeat, Reason: cmd.Reason, WoundedBy: cmd.By, AbortedAt: cmd.Now}, true
	case OpCommit:
		if cmd.Deadline != 0 && cmd.TS > cmd.Deadline {
			return Record{Status: Aborted, Heartbeat: cur.Heartbeat, Reason: "the transaction ran past its deadline", AbortedAt: cmd.Now}, true
		}
		return Record{Status: Committed, CommitTS: cmd.TS, Heartbeat: cur.Heartbeat, Participants: cmd.Participants, Listed: cmd.Listed}, true
	case OpRetry:
		if cmd.Next == nil {
			return cur, false
		}
		return Record{Status: Aborted, Heartbeat: cur.Heartbeat, Reason: "its client retried it", RetriedAs: cmd.Next, AbortedAt: cmd.Now}, true
	}
	return cur, false
}

// LastAlive is the timestamp of the last sign of life of a PENDING
// record's owner: its last heartbeat, or the attempt's start.
func LastAlive(r Record, m Meta) uint64 {
	return max(r.Heartbeat, m.Start)
}

// ExpiryTimeout is how long a PENDING record may go without a heartbeat
// before anyone may abort it; it grows with the attempt number, so a
// transaction retried after expiring gets more time.
func ExpiryTimeout(base time.Duration, attempt uint32) time.Duration {
	return base * time.Duration(min(max(attempt, 1), 8))
}
