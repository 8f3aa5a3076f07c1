package shard

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"

	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/storage"
	"github.com/groupkv/groupkv/internal/txn"
)

// Transactions (see internal/txn and docs/transactions.md). Three commands
// change a shard's transactional state, each through its log:
//
//   - KindTxnRecord: a compare-and-set of a transaction record kept with its
//     anchor key (heartbeat, abort, commit — txn.Transition).
//   - KindTxnPrepare: a participant's prepare, at a version of its own: it
//     is refused unless it is applied in the raft term its locks were
//     granted in (a change of leader lost them); it writes an intent per
//     key written and a prepared entry naming the transaction's writes and
//     reads, from which a new leader rebuilds the transaction's locks. A
//     one-phase prepare (the whole transaction in this shard, record
//     included) commits at once at its version instead.
//   - KindTxnResolve: the outcome, at a version of its own: the intents of a
//     committed transaction become versions at its commit timestamp, those
//     of an aborted one vanish.
//   - KindTxnResolveBatch: resolves of several transactions in one entry,
//     at one version, each as its own KindTxnResolve would (the resolves
//     of a shard that come close together, proposed once).
//   - KindTxnForget: marks records of finished transactions, decided and
//     resolved everywhere, with the time after which they may go (After),
//     or removes them (docs/transactions.md, "Records of finished
//     transactions"); DueTxnRecords lists the marked records whose time
//     has come.
//
// A committed transaction's versions are written at its commit timestamp,
// which may be below versions the shard applied since it prepared; the
// shard's resolved timestamp therefore stays below its oldest prepared
// transaction's prepare version (MinPrepared), and readers at or above a
// prepare version consult the intent's record (the node does).

// Command kinds of transactions.
const (
	KindTxnRecord  CommandKind = 20
	KindTxnPrepare CommandKind = 21
	KindTxnResolve CommandKind = 22
	KindTxnForget  CommandKind = 25
	// KindTxnResolveBatch is 26.
	KindTxnResolveBatch CommandKind = 26
)

// MaxResolveBatch bounds the resolves of one KindTxnResolveBatch.
const MaxResolveBatch = 256

// TxnPrepareCmd is the body of a KindTxnPrepare.
type TxnPrepareCmd struct {
	Meta txn.Meta `json:"meta"`
	// LockTerm is the leader term the transaction's locks here were
	// granted in.
	LockTerm uint64 `json:"lock_term"`
	// OnePhase commits at once (the shard holds every key and the record).
	OnePhase bool `json:"one_phase,omitempty"`
	// Record makes a one-phase commit leave a COMMITTED record even if
	// the transaction had none (it wounded others, whose retries wait for
	// its record to be decided).
	Record bool `json:"record,omitempty"`
	// Deadline: a one-phase commit at a version above it aborts instead.
	Deadline uint64 `json:"deadline,omitempty"`
	// ReadTS, for snapshot isolation, refuses the prepare if a written key
	// has a version above it (first committer wins).
	ReadTS uint64 `json:"read_ts,omitempty"`
	// Last (with OnePhase) commits the transaction in the shard of its
	// record as its last participant: every other one, listed in
	// Participants, prepared at a version below MinCommit, and the
	// proposal gets a version above it (MinVersion), at which the shard
	// commits its writes and the record, COMMITTED and listing the
	// others, at once.
	Last      bool   `json:"last,omitempty"`
	MinCommit uint64 `json:"min_commit,omitempty"`
	// Early marks a prepare (not OnePhase) whose transaction commits in a
	// Last proposal once every participant prepared: its version is only
	// a floor under the commit's, which is drawn afresh, so the proposal
	// may take any version above the shard's last (AnyVersion) instead of
	// waiting for a timestamp issued after it was queued.
	Early        bool         `json:"early,omitempty"`
	Participants []uint64     `json:"participants,omitempty"`
	Writes       []Op         `json:"writes,omitempty"`
	Reads        []txn.Target `json:"reads,omitempty"`
}

// TxnKey is a key of a resolve.
type TxnKey struct {
	Bucket uint16 `json:"bucket"`
	Key    []byte `json:"key"`
}

// TxnResolveCmd is the body of a KindTxnResolve.
type TxnResolveCmd struct {
	ID       string   `json:"id"`
	Commit   bool     `json:"commit,omitempty"`
	CommitTS uint64   `json:"commit_ts,omitempty"`
	Keys     []TxnKey `json:"keys,omitempty"`
}

// TxnForgetCmd is the body of a KindTxnForget: the records to remove, or,
// with After, to mark as removable after that time (Unix nanoseconds).
type TxnForgetCmd struct {
	Records []TxnRecordRef `json:"records"`
	After   uint64         `json:"after,omitempty"`
}

// TxnRecordRef names a transaction record: the attempt and its anchor.
type TxnRecordRef struct {
	ID     string     `json:"id"`
	Anchor txn.Anchor `json:"anchor"`
}

// TxnResult is what a transaction command left.
type TxnResult struct {
	// ID is the transaction of a prepare or resolve.
	ID        string
	Status    txn.Status
	CommitTS  uint64
	Heartbeat uint64
	Reason    string
	// WoundedBy is the wounder of an ABORTED record's owner.
	WoundedBy *txn.Meta `json:",omitempty"`
	// RetriedAs is the next attempt of an ABORTED record's transaction.
	RetriedAs *txn.Meta `json:",omitempty"`
}

// RecordResult is what a record command or read answers of rec.
func RecordResult(rec txn.Record) *TxnResult {
	return &TxnResult{Status: rec.Status, CommitTS: rec.CommitTS, Heartbeat: rec.Heartbeat, Reason: rec.Reason, WoundedBy: rec.WoundedBy, RetriedAs: rec.RetriedAs}
}

// preparedEntry is the shard-state record of a prepared transaction.
type preparedEntry struct {
	Meta    txn.Meta     `json:"meta"`
	Version uint64       `json:"version"`
	Writes  []txn.Target `json:"writes,omitempty"`
	Reads   []txn.Target `json:"reads,omitempty"`
}

const statePrepared = "txn/" // + transaction id -> preparedEntry (encodePrepared)

// encodePrepared encodes e: txnFormatBinary, flags (preparePlain), the
// meta, the version, the writes and the reads. Entries written before this
// form are JSON (they begin with '{'), and still decode.
func encodePrepared(e *preparedEntry) []byte {
	n := 48 + len(e.Meta.ID) + len(e.Meta.Anchor.Key)
	for _, t := range e.Writes {
		n += 8 + len(t.Key)
	}
	for _, t := range e.Reads {
		n += 8 + len(t.Key) + len(t.End)
	}
	b := make([]byte, 0, n)
	var flags byte
	if e.Meta.Plain {
		flags |= preparePlain
	}
	b = append(b, txnFormatBinary, flags)
	b = txn.AppendMeta(b, &e.Meta)
	b = binary.AppendUvarint(b, e.Version)
	b = appendTargets(b, e.Writes)
	return appendTargets(b, e.Reads)
}

// decodePrepared decodes what encodePrepared encoded, or the JSON of an
// older entry.
func decodePrepared(v []byte) (preparedEntry, error) {
	var e preparedEntry
	if len(v) > 0 && v[0] == '{' {
		err := json.Unmarshal(v, &e)
		return e, err
	}
	if len(v) < 2 || v[0] != txnFormatBinary || v[1]&^preparePlain != 0 {
		return e, ErrCorruptCommand
	}
	m, rest, err := txn.DecodeMeta(v[2:])
	if err != nil {
		return e, ErrCorruptCommand
	}
	e.Meta = m
	e.Meta.Plain = v[1]&preparePlain != 0
	d := decoder{b: rest}
	e.Version = d.uvarint()
	if e.Writes, err = d.targets(); err != nil {
		return e, err
	}
	if e.Reads, err = d.targets(); err != nil {
		return e, err
	}
	if d.err != nil || len(d.b) != 0 {
		return e, ErrCorruptCommand
	}
	return e, nil
}

// inheritPrepared gives split child the transactions prepared in the shard
// whose intents are now the child's: a prepared entry of its own with
// those writes (and the read set, whose locks a new leader of the child
// restores), at the prepare's version. The coordinator resolves in the
// shard it prepared in, which leaves the child's intents alone (another
// shard's); with the entry the child holds back its resolved timestamp
// for them, its reads settle them from the record, and its leader settles
// them once their coordinator is gone (as any prepare it holds).
func (s *Shard) inheritPrepared(b *pebble.Batch, child Desc) error {
	coll := s.desc.Collection
	var entries []preparedEntry
	err := EachPrepared(b, s.desc.ShardID, func(m txn.Meta, version uint64, writes, reads []txn.Target) error {
		e := preparedEntry{Meta: m, Version: version, Reads: reads}
		for _, w := range writes {
			in, ok, err := ReadIntent(b, coll, w.Key)
			if err != nil {
				return err
			}
			if ok && in.Meta.ID == m.ID && child.Owns(in.Bucket, w.Key) {
				e.Writes = append(e.Writes, w)
			}
		}
		if len(e.Writes) > 0 {
			entries = append(entries, e)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for i := range entries {
		e := &entries[i]
		if err := b.Set(storage.ShardStateKey(child.ShardID, statePrepared+e.Meta.ID), encodePrepared(e), nil); err != nil {
			return err
		}
	}
	return nil
}

// inheritMergedPrepared takes over the transactions prepared in right, the
// frozen shard the shard takes in: their intents are the shard's now (its
// resolved timestamp waits for them, its reads settle them, its leader
// settles those whose coordinators are gone). A frozen shard takes no
// prepare, resolve or record: every replica of it holds the same entries
// here, whenever it applies the trigger. A transaction prepared in both
// keeps one entry, with the writes and reads of both, at the lower
// version.
func (s *Shard) inheritMergedPrepared(b *pebble.Batch, right uint64) error {
	var entries []preparedEntry
	err := EachPrepared(b, right, func(m txn.Meta, version uint64, writes, reads []txn.Target) error {
		entries = append(entries, preparedEntry{Meta: m, Version: version, Writes: writes, Reads: reads})
		return nil
	})
	if err != nil {
		return err
	}
	for i := range entries {
		if err := s.putPrepared(b, &entries[i]); err != nil {
			return err
		}
		s.txns.lower(entries[i].Version)
	}
	return nil
}

// putPrepared writes prepared entry e of the shard, joined with the entry
// its transaction has here already: one prepared in the right shard of a
// merge, or whose intents a split gave this shard, or a prepare applied
// twice. A transaction has one entry per shard, and its resolve resolves
// every intent the entry names; replaced, the earlier entry's intents
// would be named by none, and neither resolved nor counted (mayHold). The
// joined entry keeps the lower version, each write once, and both read
// sets.
func (s *Shard) putPrepared(b *pebble.Batch, e *preparedEntry) error {
	key := storage.ShardStateKey(s.desc.ShardID, statePrepared+e.Meta.ID)
	if _, ok := s.txns.prepared[e.Meta.ID]; ok {
		v, found, err := storage.GetValue(b, key)
		if err != nil {
			return err
		}
		if found {
			own, err := decodePrepared(v)
			if err != nil {
				return fmt.Errorf("shard %d: corrupt prepared entry of %s: %w", s.desc.ShardID, e.Meta.ID, err)
			}
			e.Version = min(e.Version, own.Version)
			had := make(map[string]bool, len(own.Writes))
			for _, w := range own.Writes {
				had[string(w.Key)] = true
			}
			writes := own.Writes
			for _, w := range e.Writes {
				if !had[string(w.Key)] {
					writes = append(writes, w)
				}
			}
			e.Writes = writes
			e.Reads = append(own.Reads, e.Reads...)
			// Set once after its last deletion (deleteOnce).
			if err := b.Delete(key, nil); err != nil {
				return err
			}
		}
	}
	if err := b.Set(key, encodePrepared(e), nil); err != nil {
		return err
	}
	s.txns.setEntry(e.Meta.ID, e.Version, e.Writes)
	return nil
}

// EncodeTxnRecord encodes a record compare-and-set.
func EncodeTxnRecord(c txn.RecordCmd) []byte {
	return encodeJSON(KindTxnRecord, false, c)
}

// EncodeTxnForget encodes the removal of finished transactions' records.
func EncodeTxnForget(c *TxnForgetCmd) []byte {
	return encodeJSON(KindTxnForget, false, c)
}

// Prepares and resolves are encoded in binary (txnFormatBinary after the
// version); those of logs written before are JSON, which starts with '{',
// and still decode.
const txnFormatBinary = 1

// Flags of a binary prepare.
const (
	prepareOnePhase = 1 << 0
	prepareRecord   = 1 << 1
	preparePlain    = 1 << 2
	// prepareLast: MinCommit follows the flags, 8 bytes at a fixed
	// offset (MinVersion), and the participants the reads.
	prepareLast = 1 << 3
	// prepareEarly: the proposal may take any version (AnyVersion).
	prepareEarly = 1 << 4
)

// Flags of a target of a binary prepare's read set.
const targetSpan = 1 << 0

// appendTargets appends ts: their count, then each one's collection, flags
// (targetSpan), key, and end if it is a span.
func appendTargets(b []byte, ts []txn.Target) []byte {
	b = binary.AppendUvarint(b, uint64(len(ts)))
	for _, t := range ts {
		b = binary.BigEndian.AppendUint32(b, t.Collection)
		var tf byte
		if t.IsSpan {
			tf |= targetSpan
		}
		b = append(b, tf)
		b = appendBytes(b, t.Key)
		if t.IsSpan {
			b = appendBytes(b, t.End)
		}
	}
	return b
}

// targets decodes what appendTargets appended, copying the keys.
func (d *decoder) targets() ([]txn.Target, error) {
	n := d.count(1 << 20)
	var ts []txn.Target
	if n > 0 && d.err == nil {
		ts = make([]txn.Target, 0, n)
	}
	for i := 0; i < n && d.err == nil; i++ {
		var t txn.Target
		t.Collection = d.uint32()
		tf := d.byte()
		if tf&^targetSpan != 0 {
			return nil, ErrCorruptCommand
		}
		t.Key = bytes.Clone(d.bytes())
		if t.IsSpan = tf&targetSpan != 0; t.IsSpan {
			t.End = bytes.Clone(d.bytes())
		}
		ts = append(ts, t)
	}
	if d.err != nil {
		return nil, ErrCorruptCommand
	}
	return ts, nil
}

// EncodeTxnPrepare encodes a prepare with version 0; the leader assigns it.
func EncodeTxnPrepare(c *TxnPrepareCmd) []byte {
	n := 64 + len(c.Meta.ID) + len(c.Meta.Anchor.Key)
	for i := range c.Writes {
		n += 24 + len(c.Writes[i].Key) + len(c.Writes[i].Value)
		for _, t := range c.Writes[i].Tags {
			n += len(t) + 2
		}
	}
	for i := range c.Reads {
		n += 12 + len(c.Reads[i].Key) + len(c.Reads[i].End)
	}
	b := make([]byte, 1+8, n)
	b[0] = byte(KindTxnPrepare)
	b = append(b, txnFormatBinary)
	var flags byte
	if c.OnePhase {
		flags |= prepareOnePhase
	}
	if c.Record {
		flags |= prepareRecord
	}
	if c.Meta.Plain {
		flags |= preparePlain
	}
	if c.Last {
		flags |= prepareLast
	}
	if c.Early {
		flags |= prepareEarly
	}
	b = append(b, flags)
	if c.Last {
		b = binary.BigEndian.AppendUint64(b, c.MinCommit)
	}
	b = txn.AppendMeta(b, &c.Meta)
	b = binary.AppendUvarint(b, c.LockTerm)
	b = binary.AppendUvarint(b, c.Deadline)
	b = binary.AppendUvarint(b, c.ReadTS)
	b = appendOps(b, c.Writes)
	b = appendTargets(b, c.Reads)
	if c.Last {
		b = binary.AppendUvarint(b, uint64(len(c.Participants)))
		for _, id := range c.Participants {
			b = binary.AppendUvarint(b, id)
		}
	}
	return b
}

// EncodeTxnResolve encodes a resolve with version 0.
func EncodeTxnResolve(c *TxnResolveCmd) []byte {
	b := make([]byte, 1+8, resolveSize(c)+10)
	b[0] = byte(KindTxnResolve)
	b = append(b, txnFormatBinary)
	return appendResolve(b, c)
}

// EncodeTxnResolveBatch encodes resolves of several transactions (at most
// MaxResolveBatch) as one command, with version 0.
func EncodeTxnResolveBatch(cs []*TxnResolveCmd) []byte {
	n := 1 + 8 + 1 + binary.MaxVarintLen64
	for _, c := range cs {
		n += binary.MaxVarintLen64 + resolveSize(c)
	}
	b := make([]byte, 1+8, n)
	b[0] = byte(KindTxnResolveBatch)
	b = append(b, txnFormatBinary)
	b = binary.AppendUvarint(b, uint64(len(cs)))
	for _, c := range cs {
		b = appendBytes(b, appendResolve(nil, c))
	}
	return b
}

func resolveSize(c *TxnResolveCmd) int {
	n := 32 + len(c.ID)
	for _, k := range c.Keys {
		n += 4 + len(k.Key)
	}
	return n
}

// appendResolve appends the binary body of c (after the format byte).
func appendResolve(b []byte, c *TxnResolveCmd) []byte {
	b = appendBytes(b, []byte(c.ID))
	var commit byte
	if c.Commit {
		commit = 1
	}
	b = append(b, commit)
	b = binary.AppendUvarint(b, c.CommitTS)
	b = binary.AppendUvarint(b, uint64(len(c.Keys)))
	for _, k := range c.Keys {
		b = binary.BigEndian.AppendUint16(b, k.Bucket)
		b = appendBytes(b, k.Key)
	}
	return b
}

// decodeTxnResolveBatch decodes a binary resolve batch body (after its
// format byte).
func decodeTxnResolveBatch(body []byte) ([]*TxnResolveCmd, error) {
	d := decoder{b: body}
	n := d.count(MaxResolveBatch)
	if d.err != nil || n == 0 {
		return nil, ErrCorruptCommand
	}
	cs := make([]*TxnResolveCmd, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		c, err := decodeTxnResolve(d.bytes())
		if err != nil {
			return nil, err
		}
		cs = append(cs, c)
	}
	if d.err != nil || len(d.b) != 0 {
		return nil, ErrCorruptCommand
	}
	return cs, nil
}

// decodeTxnPrepare decodes a binary prepare body (after its format byte).
// Its byte slices are copies: the prepare's targets outlive the entry in
// the leader's lock table.
func decodeTxnPrepare(body []byte) (*TxnPrepareCmd, error) {
	c := new(TxnPrepareCmd)
	d := decoder{b: body}
	if err := d.prepareHead(c); err != nil {
		return nil, err
	}
	var err error
	if c.Writes, err = d.ops(); err != nil {
		return nil, err
	}
	for i := range c.Writes {
		w := &c.Writes[i]
		w.Key = bytes.Clone(w.Key)
		if w.Value != nil {
			w.Value = bytes.Clone(w.Value)
		}
	}
	if c.Reads, err = d.targets(); err != nil {
		return nil, err
	}
	c.Participants = d.prepareParticipants(c.Last, c.Participants)
	if d.err != nil || len(d.b) != 0 {
		return nil, ErrCorruptCommand
	}
	return c, nil
}

// prepareHead decodes into c the fields of a binary prepare body that
// come before its writes.
func (d *decoder) prepareHead(c *TxnPrepareCmd) error {
	flags := d.byte()
	if d.err != nil || flags&^(prepareOnePhase|prepareRecord|preparePlain|prepareLast|prepareEarly) != 0 ||
		flags&prepareLast != 0 && flags&prepareOnePhase == 0 || flags&prepareEarly != 0 && flags&prepareOnePhase != 0 {
		return ErrCorruptCommand
	}
	c.OnePhase, c.Record, c.Last, c.Early = flags&prepareOnePhase != 0, flags&prepareRecord != 0, flags&prepareLast != 0, flags&prepareEarly != 0
	if c.Last {
		if len(d.b) < 8 {
			return ErrCorruptCommand
		}
		c.MinCommit = binary.BigEndian.Uint64(d.b)
		d.b = d.b[8:]
	}
	m, rest, err := txn.DecodeMeta(d.b)
	if err != nil {
		return ErrCorruptCommand
	}
	c.Meta, d.b = m, rest
	c.Meta.Plain = flags&preparePlain != 0
	if len(c.Meta.Anchor.Key) == 0 {
		c.Meta.Anchor.Key = nil // no anchor (a set one is never empty)
	}
	c.LockTerm = d.uvarint()
	c.Deadline = d.uvarint()
	c.ReadTS = d.uvarint()
	return d.err
}

// prepareParticipants decodes, for a last participant's prepare, the
// other participants that end its body, appending them to ps.
func (d *decoder) prepareParticipants(last bool, ps []uint64) []uint64 {
	if !last {
		return ps
	}
	n := d.count(1 << 20)
	for i := 0; i < n && d.err == nil; i++ {
		ps = append(ps, d.uvarint())
	}
	return ps
}

// PrepareLocks is what the leader of a prepare's shard checks against its
// lock table before proposing it (DecodePrepareLocks).
type PrepareLocks struct {
	// ID is the transaction's id.
	ID string
	// LockTerm is the leader term its locks were granted in.
	LockTerm uint64
	// Writes are the keys it writes; they alias the command.
	Writes [][]byte
	// Reads are the targets it read.
	Reads []txn.Target
}

// DecodePrepareLocks decodes into p the PrepareLocks of cmd, an encoded
// prepare (KindTxnPrepare), without copying its values or decoding its
// tags: a prepare's leader decodes each prepare it proposes this way.
func DecodePrepareLocks(cmd []byte, p *PrepareLocks) error {
	const at = 1 + 8 + 1 // kind, version, format
	if len(cmd) < at || CommandKind(cmd[0]) != KindTxnPrepare {
		return ErrCorruptCommand
	}
	if cmd[at-1] != txnFormatBinary {
		c, err := DecodeCommand(cmd) // the JSON of older versions
		if err != nil {
			return err
		}
		t := c.TxnPrepare
		*p = PrepareLocks{ID: t.Meta.ID, LockTerm: t.LockTerm, Reads: t.Reads, Writes: p.Writes[:0]}
		for _, w := range t.Writes {
			p.Writes = append(p.Writes, w.Key)
		}
		return nil
	}
	var c TxnPrepareCmd
	d := decoder{b: cmd[at:]}
	if err := d.prepareHead(&c); err != nil {
		return err
	}
	p.ID, p.LockTerm, p.Writes = c.Meta.ID, c.LockTerm, p.Writes[:0]
	n := d.count(1 << 20)
	for i := 0; i < n && d.err == nil; i++ {
		var op Op
		if err := d.op(i, &op, false); err != nil {
			return err
		}
		p.Writes = append(p.Writes, op.Key)
	}
	var err error
	if p.Reads, err = d.targets(); err != nil {
		return err
	}
	// The participants are not needed; they are read to check that the
	// body ends after them.
	var ps [16]uint64
	d.prepareParticipants(c.Last, ps[:0])
	if d.err != nil || len(d.b) != 0 {
		return ErrCorruptCommand
	}
	return nil
}

// AnyVersion reports whether a proposal of cmd may take any version
// above the shard's last, not only a timestamp issued after it was
// queued: the prepare of a transaction that commits later, in a Last
// proposal of its own (TxnPrepareCmd.Early).
func AnyVersion(cmd []byte) bool {
	return len(cmd) > 10 && CommandKind(cmd[0]) == KindTxnPrepare && cmd[9] == txnFormatBinary && cmd[10]&prepareEarly != 0
}

// MinVersion answers the version a proposal of cmd must be above: a
// last participant's commit's MinCommit, 0 for any other command.
func MinVersion(cmd []byte) uint64 {
	const at = 1 + 8 + 1 + 1 // kind, version, format, flags
	if len(cmd) < at+8 || CommandKind(cmd[0]) != KindTxnPrepare || cmd[9] != txnFormatBinary || cmd[10]&prepareLast == 0 {
		return 0
	}
	return binary.BigEndian.Uint64(cmd[at:])
}

// decodeTxnResolve decodes a binary resolve body (after its format byte).
func decodeTxnResolve(body []byte) (*TxnResolveCmd, error) {
	c := new(TxnResolveCmd)
	d := decoder{b: body}
	c.ID = string(d.bytes())
	switch d.byte() {
	case 0:
	case 1:
		c.Commit = true
	default:
		return nil, ErrCorruptCommand
	}
	c.CommitTS = d.uvarint()
	n := d.count(1 << 20)
	for i := 0; i < n && d.err == nil; i++ {
		bucket := d.uint16()
		c.Keys = append(c.Keys, TxnKey{Bucket: bucket, Key: bytes.Clone(d.bytes())})
	}
	if d.err != nil || len(d.b) != 0 {
		return nil, ErrCorruptCommand
	}
	return c, nil
}

func encodeJSON(kind CommandKind, versioned bool, body any) []byte {
	js, err := json.Marshal(body)
	if err != nil {
		panic(fmt.Sprintf("shard: encoding %T: %v", body, err)) // plain structs always encode
	}
	b := []byte{byte(kind)}
	if versioned {
		b = append(b, make([]byte, 8)...)
	}
	return append(b, js...)
}

func decodeTxn(c *Command, body []byte) error {
	var err error
	switch c.Kind {
	case KindTxnRecord:
		// Into a variable of its own: the address of a field of c given
		// to Unmarshal would move every decoded command to the heap.
		var rec txn.RecordCmd
		err = json.Unmarshal(body, &rec)
		c.TxnRecord = rec
	case KindTxnPrepare:
		if len(body) > 0 && body[0] == txnFormatBinary {
			c.TxnPrepare, err = decodeTxnPrepare(body[1:])
			break
		}
		c.TxnPrepare = new(TxnPrepareCmd)
		err = json.Unmarshal(body, c.TxnPrepare)
	case KindTxnResolve:
		if len(body) > 0 && body[0] == txnFormatBinary {
			c.TxnResolve, err = decodeTxnResolve(body[1:])
			break
		}
		c.TxnResolve = new(TxnResolveCmd)
		err = json.Unmarshal(body, c.TxnResolve)
	case KindTxnResolveBatch:
		if len(body) == 0 || body[0] != txnFormatBinary {
			return fmt.Errorf("%w: a resolve batch in an unknown format", ErrCorruptCommand)
		}
		c.TxnResolves, err = decodeTxnResolveBatch(body[1:])
	case KindTxnForget:
		c.TxnForget = new(TxnForgetCmd)
		err = json.Unmarshal(body, c.TxnForget)
	}
	if err != nil {
		return fmt.Errorf("%w: %v", ErrCorruptCommand, err)
	}
	return nil
}

// txnState is a shard's in-memory view of its prepared transactions.
type txnState struct {
	// prepared maps the shard's prepared transactions to their prepare
	// versions. Owned by the apply loop.
	prepared map[string]uint64
	// minPrepared is the lowest prepare version of prepared (0: none) as
	// visible to readers; read by other goroutines.
	minPrepared atomic.Uint64
	// stale: prepared lost an entry that minPrepared still holds back.
	stale bool

	// mu guards intents for readers outside the apply loop (mayHold);
	// the apply loop changes it, and writes, under mu.
	mu sync.RWMutex
	// intents counts, per key, the prepared entries here that write it.
	// Every intent on a key in the shard's span is the write of one of
	// its prepared entries (a split gives the new shard entries for the
	// intents it takes, a merge the right shard's), so a key not counted
	// holds none, and the point lookup of its intent is skipped. A key a
	// split moved away stays counted until its entry goes.
	intents map[string]int
	// writes are the keys each prepared entry counts in intents (and
	// resolves). Changed under mu, read by the apply loop.
	writes map[string][]string
	// gone are the entries resolved in the batch being applied: their
	// keys stay counted until the batch is committed (Committed), as a
	// reader outside the loop still finds their intents in storage.
	gone []string

	// held keeps, per prepared entry written by a prepare this shard
	// applied since it was loaded, split or merged, the intents that
	// prepare wrote, by key: its resolve takes them from here instead of
	// reading them back. Only the prepare writes an intent and only the
	// resolve of its entry deletes it (a split's child resolves those it
	// took, hence the forgetting at splits and merges), so an intent held
	// here is the one in storage; a key not held is looked up. Owned by
	// the apply loop.
	held map[string]map[string]*txn.Intent
}

// maxHeldBytes bounds the intent values of one prepare kept in memory
// until its resolve (txnState.held); a larger prepare's are read back.
const maxHeldBytes = 1 << 20

// hold keeps the intents of id's prepare, by key, for its resolve.
func (t *txnState) hold(id string, intents map[string]*txn.Intent) {
	if t.held == nil {
		t.held = map[string]map[string]*txn.Intent{}
	}
	t.held[id] = intents
}

// setEntry records prepared entry id at version, writing keys, in place
// of any entry id had.
func (t *txnState) setEntry(id string, version uint64, keys []txn.Target) {
	t.prepared[id] = version
	delete(t.held, id)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.dropKeysLocked(id)
	if t.intents == nil {
		t.intents, t.writes = map[string]int{}, map[string][]string{}
	}
	ks := make([]string, len(keys))
	for i, k := range keys {
		ks[i] = string(k.Key)
		t.intents[ks[i]]++
	}
	t.writes[id] = ks
}

// dropEntry forgets prepared entry id; its keys go once the batch is
// committed (published).
func (t *txnState) dropEntry(id string) {
	delete(t.prepared, id)
	delete(t.held, id)
	t.gone = append(t.gone, id)
}

// published uncounts the keys of the entries resolved in the batch just
// committed, but for one prepared again since.
func (t *txnState) published() {
	if len(t.gone) == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, id := range t.gone {
		if _, again := t.prepared[id]; !again {
			t.dropKeysLocked(id)
		}
	}
	t.gone = t.gone[:0]
}

func (t *txnState) dropKeysLocked(id string) {
	for _, k := range t.writes[id] {
		if t.intents[k]--; t.intents[k] <= 0 {
			delete(t.intents, k)
		}
	}
	delete(t.writes, id)
}

// reset forgets every entry.
func (t *txnState) reset() {
	t.prepared = map[string]uint64{}
	t.gone = nil
	t.held = nil
	t.mu.Lock()
	t.intents, t.writes = map[string]int{}, map[string][]string{}
	t.mu.Unlock()
}

// mayHold reports whether key may hold an intent of a transaction
// prepared here: false means it holds none.
func (t *txnState) mayHold(key []byte) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.intents[string(key)] > 0
}

// MayHoldIntent reports whether key, of the shard's collection, may hold
// the intent of a transaction prepared in the shard: false means it holds
// none, and a reader or a writer need not look. Safe for concurrent use.
func (s *Shard) MayHoldIntent(key []byte) bool { return s.txns.mayHold(key) }

// lower holds minPrepared at or below version, the prepare version of an
// entry just set. It never raises it: a resolve earlier in the batch being
// applied dropped its entry, but its versions, at a commit timestamp that
// may lie below versions applied already, are not visible until the batch
// is committed; Committed recomputes it then.
func (t *txnState) lower(version uint64) {
	if m := t.minPrepared.Load(); m == 0 || version < m {
		t.minPrepared.Store(version)
	}
}

func (t *txnState) recompute() {
	var m uint64
	for _, v := range t.prepared {
		if m == 0 || v < m {
			m = v
		}
	}
	t.minPrepared.Store(m)
}

// Committed tells the shard that the batch it applied into was committed:
// its writes reach the shard's caches, and transactions resolved in it
// stop holding back its resolved timestamp. The owner calls it after every
// committed batch, or calls Published and then ReleaseResolved, to publish
// its own view of the batch (the versions it applied) in between.
func (s *Shard) Committed() {
	s.Published()
	s.ReleaseResolved()
}

// Published is the first half of Committed: the batch's writes reach the
// shard's caches, and the keys of the transactions it resolved stop
// counting as intents.
func (s *Shard) Published() {
	for i, w := range s.latestDirty {
		if w.encoded == nil {
			s.latestCache.Invalidate(s.desc.Collection, []byte(w.key))
		} else {
			s.latestCache.wrote(s.desc.Collection, []byte(w.key), w.version, w.encoded)
		}
		s.latestDirty[i] = latestWrite{}
	}
	s.latestDirty = s.latestDirty[:0]
	s.txns.published()
}

// ReleaseResolved is the second half of Committed: the transactions the
// batch resolved stop holding back MinPrepared. A reader that finds no
// prepared transaction and then reads the versions the owner published
// for the batch (after Published, before this) reads versions at or above
// every resolve's: the owner publishes them first.
func (s *Shard) ReleaseResolved() {
	if s.txns.stale {
		s.txns.stale = false
		s.txns.recompute()
	}
}

// MinPrepared returns the lowest prepare version of the transactions
// prepared in the shard and not yet resolved (0: none). Safe for
// concurrent use.
func (s *Shard) MinPrepared() uint64 { return s.txns.minPrepared.Load() }

// loadPrepared rebuilds the shard's prepared set from its state, and the
// lowest prepare version with it (MinPrepared: reads settle the intents
// of a shard holding prepares, and its leader settles those their
// coordinators left).
func (s *Shard) loadPrepared(r pebble.Reader) error {
	s.txns.reset()
	err := EachPrepared(r, s.desc.ShardID, func(m txn.Meta, version uint64, writes, _ []txn.Target) error {
		s.txns.setEntry(m.ID, version, writes)
		return nil
	})
	s.txns.recompute()
	return err
}

// EachPrepared calls fn for every transaction prepared in shard shardID
// as stored in r: its meta, prepare version, written keys and read set.
func EachPrepared(r pebble.Reader, shardID uint64, fn func(m txn.Meta, version uint64, writes, reads []txn.Target) error) error {
	lo := storage.ShardStateKey(shardID, statePrepared)
	hi := storage.ShardStateKey(shardID, "txn0")
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	defer it.Close()
	for ok := it.First(); ok; ok = it.Next() {
		e, err := decodePrepared(it.Value())
		if err != nil {
			return fmt.Errorf("shard %d: corrupt prepared entry %q: %w", shardID, it.Key(), err)
		}
		if err := fn(e.Meta, e.Version, e.Writes, e.Reads); err != nil {
			return err
		}
	}
	return it.Error()
}

// ReadIntent reads the intent on (collection, key), if any.
func ReadIntent(r pebble.Reader, collection uint32, key []byte) (txn.Intent, bool, error) {
	v, closer, err := r.Get(storage.IntentKey(nil, collection, key))
	if errors.Is(err, pebble.ErrNotFound) {
		return txn.Intent{}, false, nil
	}
	if err != nil {
		return txn.Intent{}, false, err
	}
	defer closer.Close()
	in, err := txn.DecodeIntent(v)
	if err != nil {
		return txn.Intent{}, false, fmt.Errorf("intent on %q: %w", key, err)
	}
	return in, true, nil
}

// Intents calls fn for every intent of collection on keys in [start, end)
// (nil end: unbounded) held in r, whichever shard owns it.
func Intents(r pebble.Reader, collection uint32, start, end []byte, fn func(key []byte, in txn.Intent) error) error {
	lo, hi := storage.IntentSpan(collection)
	if start != nil {
		lo = storage.IntentKey(nil, collection, start)
	}
	if end != nil {
		hi = storage.IntentKey(nil, collection, end)
	}
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	defer it.Close()
	p := storage.IntentKey(nil, collection, nil)[:5]
	for ok := it.First(); ok; ok = it.Next() {
		key, _, err := storage.UnescapeKey(it.Key()[len(p):])
		if err != nil {
			return err
		}
		in, err := txn.DecodeIntent(it.Value())
		if err != nil {
			return fmt.Errorf("intent on %q: %w", key, err)
		}
		if err := fn(append([]byte(nil), key...), in); err != nil {
			return err
		}
	}
	return it.Error()
}

// loads numbers the times shards of this process took their state from
// storage or took in keys they did not write (Load, a split, a merge):
// a shard knows, from its own applies, of every transaction record written
// in its span since its number (txnRecords).
var loads atomic.Uint64

// TxnRecordEpoch returns the current load number. A transaction that takes
// it when it begins may ask NoTxnRecord of a shard with it.
func TxnRecordEpoch() uint64 { return loads.Load() }

// txnRecords are the transactions whose records the shard wrote since
// it was loaded, so that the common question "has my record been
// written (by a wound, an expiry, a heartbeat)?" is answered without a
// point lookup. Apply adds an id before the batch holding the record is
// committed, so a record in storage is always listed here.
type txnRecords struct {
	mu sync.Mutex
	// since is the load number of the shard's state: records written
	// before it may be in storage without being listed.
	since uint64
	desc  Desc
	ids   map[string]struct{}
}

// reload starts the list over for the span of desc (nothing listed,
// records written before now unknown).
func (r *txnRecords) reload(desc Desc) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.since, r.desc, r.ids = loads.Add(1), desc, map[string]struct{}{}
}

// maxListedRecords bounds the records a shard lists: past it, the list
// starts over (as at a load), records kept forever (a negative
// --txn-record-retention) do not grow it without end.
const maxListedRecords = 1 << 20

func (r *txnRecords) add(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.ids) >= maxListedRecords {
		r.since, r.ids = loads.Add(1), map[string]struct{}{}
	}
	r.ids[id] = struct{}{}
}

func (r *txnRecords) remove(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.ids, id)
}

// NoTxnRecord reports whether the shard knows that transaction m, begun
// at load number epoch (TxnRecordEpoch), has no record in storage: the
// shard owns its anchor, was loaded before the transaction began, and has
// written no record for it since. False means look it up. The caller
// reads after a read barrier, as it would read storage. Safe for
// concurrent use.
func (s *Shard) NoTxnRecord(m *txn.Meta, epoch uint64) bool {
	r := &s.recs
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ids == nil || r.since > epoch || r.desc.IsMeta() || m.Anchor.Collection != r.desc.Collection || !r.desc.Owns(m.Anchor.Bucket, m.Anchor.Key) {
		return false
	}
	_, ok := r.ids[m.ID]
	return !ok
}

// ReadTxnRecord reads the record of transaction m as stored in r.
func ReadTxnRecord(r pebble.Reader, m *txn.Meta) (txn.Record, bool, error) {
	v, closer, err := r.Get(storage.TxnRecordKey(m.Anchor.Collection, m.Anchor.Key, m.ID))
	if errors.Is(err, pebble.ErrNotFound) {
		return txn.Record{}, false, nil
	}
	if err != nil {
		return txn.Record{}, false, err
	}
	defer closer.Close()
	rec, _, err := txn.DecodeRecord(v)
	return rec, err == nil, err
}

// applyTxnForget removes the records c names that are decided (COMMITTED or
// ABORTED), or with c.After marks them removable after it (a record marked
// twice keeps the later time); it leaves a PENDING record, and one this
// shard no longer owns (a split or merge moved its anchor away since the
// removal was asked). Result.Count is how many it removed or marked.
func (s *Shard) applyTxnForget(b *pebble.Batch, c *TxnForgetCmd) (Result, error) {
	removed := 0
	for _, r := range c.Records {
		a := r.Anchor
		if s.desc.IsMeta() || a.Collection != s.desc.Collection || !s.desc.Owns(a.Bucket, a.Key) {
			continue
		}
		m := txn.Meta{ID: r.ID, Anchor: a}
		cur, exists, err := ReadTxnRecord(b, &m)
		if err != nil {
			return Result{}, err
		}
		if !exists || cur.Status == txn.Pending {
			continue
		}
		key := storage.TxnRecordKey(a.Collection, a.Key, r.ID)
		if c.After != 0 {
			if cur.ForgetAfter < c.After {
				cur.ForgetAfter = c.After
				if err := b.Set(key, txn.EncodeRecord(cur, a.Bucket), nil); err != nil {
					return Result{}, err
				}
			}
			removed++
			continue
		}
		if err := b.Delete(key, nil); err != nil {
			return Result{}, err
		}
		s.recs.remove(r.ID)
		removed++
	}
	return Result{Count: removed}, nil
}

// UnmarkedTxnRecord is a decided record nobody marked removable
// (UnmarkedTxnRecords).
type UnmarkedTxnRecord struct {
	Ref    TxnRecordRef
	Status txn.Status
	// CommitTS and Participants are a COMMITTED record's.
	CommitTS     uint64
	Participants []uint64
}

// UnmarkedTxnRecords returns up to limit decided records, anchored in keys
// shard d owns, not marked removable — those whose coordinator (or, for
// an ABORTED one, whoever aborted it) stopped before marking them: the
// COMMITTED ones that list their participants, committed below
// committedBefore (a timestamp), and the ABORTED ones aborted before
// abortedBefore (Unix nanoseconds). d is the caller's copy of the shard's
// descriptor.
func UnmarkedTxnRecords(r pebble.Reader, d Desc, committedBefore, abortedBefore uint64, limit int) ([]UnmarkedTxnRecord, error) {
	sw, err := SweepTxnRecords(r, []Desc{d}, 0, committedBefore, abortedBefore, 0, limit)
	if err != nil {
		return nil, err
	}
	return sw[0].Unmarked, nil
}

// DueTxnRecords returns up to limit records of transactions, anchored in
// keys shard d owns, marked removable at or before now (Unix
// nanoseconds), read from r. d is the caller's copy of the shard's
// descriptor (replication.Host.Desc): the shard's own changes in Apply.
func DueTxnRecords(r pebble.Reader, d Desc, now uint64, limit int) ([]TxnRecordRef, error) {
	sw, err := SweepTxnRecords(r, []Desc{d}, now, 0, 0, limit, 0)
	if err != nil {
		return nil, err
	}
	return sw[0].Due, nil
}

// TxnRecordSweep is what SweepTxnRecords found of one shard's records.
type TxnRecordSweep struct {
	// Due are the records DueTxnRecords answers, Unmarked those
	// UnmarkedTxnRecords answers.
	Due      []TxnRecordRef
	Unmarked []UnmarkedTxnRecord
}

// SweepTxnRecords reads the transaction records of the collection of ds
// (descriptors of shards of one collection, as DueTxnRecords takes them)
// from r once, and answers for each shard of ds, in order, the records
// anchored in keys it owns that DueTxnRecords (at now, up to dueLimit) and
// UnmarkedTxnRecords (committedBefore, abortedBefore, up to
// unmarkedLimit) answer. The records of a collection are kept by anchor
// key, not by shard: a node that leads several of a collection's shards
// reads them all once instead of once per shard.
func SweepTxnRecords(r pebble.Reader, ds []Desc, now, committedBefore, abortedBefore uint64, dueLimit, unmarkedLimit int) ([]TxnRecordSweep, error) {
	out := make([]TxnRecordSweep, len(ds))
	var coll uint32
	open := 0 // the shards whose lists are not full
	for i, d := range ds {
		if i > 0 && d.Collection != coll {
			return nil, fmt.Errorf("shard: sweeping the records of shards of collections %d and %d at once", coll, d.Collection)
		}
		coll = d.Collection
		if !d.IsMeta() && (dueLimit > 0 || unmarkedLimit > 0) {
			open++
		}
	}
	if open == 0 {
		return out, nil
	}
	due := func(rec *txn.Record) bool { return rec.ForgetAfter != 0 && rec.ForgetAfter <= now }
	unmarked := func(rec *txn.Record) bool {
		switch {
		case rec.ForgetAfter != 0:
			return false
		case rec.Status == txn.Committed:
			return rec.Listed && rec.CommitTS < committedBefore
		case rec.Status == txn.Aborted:
			return rec.AbortedAt != 0 && rec.AbortedAt < abortedBefore
		}
		return false
	}
	lo, hi := storage.TxnRecordSpan(coll)
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	for ok := it.First(); ok && open > 0; ok = it.Next() {
		k, v := it.Key(), it.Value()
		rec, bucket, err := txn.DecodeRecord(v)
		if err != nil {
			return nil, fmt.Errorf("%w: transaction record %x: %v", storage.ErrCorruptValue, k, err)
		}
		isDue, isUnmarked := due(&rec), unmarked(&rec)
		if !isDue && !isUnmarked {
			continue
		}
		key, id, err := storage.UnescapeKey(k[len(lo):])
		if err != nil {
			return nil, err
		}
		for i, d := range ds {
			if d.IsMeta() || !d.ownsStored(bucket, key) {
				continue
			}
			sw := &out[i]
			full := func() bool { return len(sw.Due) >= dueLimit && len(sw.Unmarked) >= unmarkedLimit }
			if full() {
				break
			}
			ref := TxnRecordRef{ID: string(id), Anchor: txn.Anchor{Collection: coll, Bucket: bucket, Key: bytes.Clone(key)}}
			if isDue && len(sw.Due) < dueLimit {
				sw.Due = append(sw.Due, ref)
			}
			if isUnmarked && len(sw.Unmarked) < unmarkedLimit {
				sw.Unmarked = append(sw.Unmarked, UnmarkedTxnRecord{Ref: ref, Status: rec.Status, CommitTS: rec.CommitTS, Participants: rec.Participants})
			}
			if full() {
				open--
			}
			break
		}
	}
	if err := it.Error(); err != nil {
		return nil, err
	}
	return out, nil
}

func (s *Shard) applyTxnRecord(b *pebble.Batch, c txn.RecordCmd) (Result, error) {
	a := c.Meta.Anchor
	if s.desc.IsMeta() || a.Collection != s.desc.Collection || !s.desc.Owns(a.Bucket, a.Key) {
		return Result{Err: kv.Errorf(kv.CodeUnavailable, "shard %d does not own the record of transaction %s; retry", s.desc.ShardID, c.Meta.ID)}, nil
	}
	cur, exists, err := ReadTxnRecord(b, &c.Meta)
	if err != nil {
		return Result{}, err
	}
	next, write := txn.Transition(cur, exists, c)
	if write {
		s.recs.add(c.Meta.ID)
		if err := b.Set(storage.TxnRecordKey(a.Collection, a.Key, c.Meta.ID), txn.EncodeRecord(next, a.Bucket), nil); err != nil {
			return Result{}, err
		}
	}
	return Result{Txn: RecordResult(next)}, nil
}

func aborted(format string, args ...any) *kv.Error {
	return kv.Errorf(kv.CodeTxnAborted, format, args...)
}

func (s *Shard) applyTxnPrepare(b *pebble.Batch, version, term uint64, p *TxnPrepareCmd) (Result, error) {
	if term != p.LockTerm {
		return Result{Err: aborted("transaction %s lost its locks in shard %d to a change of leader (locked in term %d, prepared in term %d)", p.Meta.ID, s.desc.ShardID, p.LockTerm, term)}, nil
	}
	if err := s.checkVersion(version); err != nil {
		return Result{Err: err}, nil
	}
	// A key read that joined a group since it was read is no longer
	// this shard's to vouch for.
	for _, r := range p.Reads {
		if r.Collection != s.desc.Collection {
			continue
		}
		if r.IsSpan {
			if k, y, ok := s.groupHolds(r.Key, r.End); ok {
				return Result{Err: keyInGroupError(k, y)}, nil
			}
		} else if y, ok := s.inGroup(r.Key); ok {
			return Result{Err: keyInGroupError(r.Key, y)}, nil
		}
	}
	seen := make(map[string]bool, len(p.Writes))
	// again are the keys that hold an intent of this transaction already
	// (a prepare applied twice, or prepared in a shard this one took in):
	// its intent there is deleted before it is set again, so that every
	// intent is set once after its key's last deletion (see resolve).
	var again map[string]bool
	for i := range p.Writes {
		op := &p.Writes[i]
		if !s.desc.Owns(op.Bucket, op.Key) {
			return Result{Err: kv.Errorf(kv.CodeUnavailable, "shard %d does not own key %q; retry", s.desc.ShardID, op.Key)}, nil
		}
		if seen[string(op.Key)] {
			return Result{Err: kv.Errorf(kv.CodeInvalidArgument, "key %q appears twice in one prepare", op.Key)}, nil
		}
		if y, ok := s.inGroup(op.Key); ok {
			return Result{Err: keyInGroupError(op.Key, y)}, nil
		}
		seen[string(op.Key)] = true
		var in txn.Intent
		var ok bool
		if s.txns.mayHold(op.Key) {
			var err error
			if in, ok, err = ReadIntent(b, s.desc.Collection, op.Key); err != nil {
				return Result{}, err
			}
		}
		if ok && in.Meta.ID == p.Meta.ID {
			if again == nil {
				again = map[string]bool{}
			}
			again[string(op.Key)] = true
		}
		if ok && in.Meta.ID != p.Meta.ID {
			// The leader proposes a prepare only while the transaction
			// holds its locks (marked prepared first, so that no wound
			// hands them over while it is in flight), and settles the
			// decided intents it finds on them first; an intent of
			// another transaction still here is one whose record is
			// undecided (a stale prepare that applied late): refuse,
			// the transaction retries.
			return Result{Err: aborted("key %q holds an intent of transaction %s", op.Key, in.Meta.ID)}, nil
		}
		if p.ReadTS != 0 {
			if _, v, _, err := s.latest(b, op.Key); err != nil {
				return Result{}, err
			} else if v > p.ReadTS {
				return Result{Err: aborted("key %q was written at version %d, after the transaction's snapshot %d (first committer wins)", op.Key, v, p.ReadTS)}, nil
			}
		}
	}
	if p.OnePhase {
		return s.commitOnePhase(b, version, p)
	}
	var e preparedEntry
	e.Meta, e.Version, e.Reads = p.Meta, version, p.Reads
	var size int
	for i := range p.Writes {
		size += len(p.Writes[i].Value)
	}
	var held map[string]*txn.Intent
	if size <= maxHeldBytes {
		held = make(map[string]*txn.Intent, len(p.Writes))
	}
	for i := range p.Writes {
		op := &p.Writes[i]
		in := txn.Intent{Bucket: op.Bucket, Meta: p.Meta, PrepareVersion: version, Delete: op.Type == OpDelete, Tags: op.Tags, Value: op.Value}
		ik := storage.IntentKey(nil, s.desc.Collection, op.Key)
		if again[string(op.Key)] {
			if err := b.Delete(ik, nil); err != nil {
				return Result{}, err
			}
		}
		if err := b.Set(ik, txn.EncodeIntent(&in), nil); err != nil {
			return Result{}, err
		}
		e.Writes = append(e.Writes, txn.Target{Collection: s.desc.Collection, Key: op.Key})
		if held != nil {
			held[string(op.Key)] = &in // a decoded prepare's values are its own (DecodeCommand copies)
		}
	}
	if err := s.putPrepared(b, &e); err != nil {
		return Result{}, err
	}
	if held != nil {
		s.txns.hold(p.Meta.ID, held)
	}
	s.txns.lower(e.Version)
	if err := s.setMaxVersion(b, version); err != nil {
		return Result{}, err
	}
	return Result{Version: version, Txn: &TxnResult{ID: p.Meta.ID, Status: txn.Pending}}, nil
}

// commitOnePhase commits a transaction held wholly by the shard at version.
func (s *Shard) commitOnePhase(b *pebble.Batch, version uint64, p *TxnPrepareCmd) (Result, error) {
	a := p.Meta.Anchor
	if a.Collection != s.desc.Collection || !s.desc.Owns(a.Bucket, a.Key) {
		return Result{Err: kv.Errorf(kv.CodeUnavailable, "shard %d does not own the record of transaction %s; retry", s.desc.ShardID, p.Meta.ID)}, nil
	}
	rec, exists, err := ReadTxnRecord(b, &p.Meta)
	if err != nil {
		return Result{}, err
	}
	if rec.Status == txn.Aborted {
		return Result{Err: aborted("transaction %s was aborted: %s", p.Meta.ID, rec.Reason)}, nil
	}
	if rec.Status == txn.Committed {
		return Result{Version: rec.CommitTS, Txn: &TxnResult{ID: p.Meta.ID, Status: txn.Committed, CommitTS: rec.CommitTS}}, nil
	}
	if p.Deadline != 0 && version > p.Deadline {
		return Result{Err: aborted("transaction %s ran past its deadline", p.Meta.ID)}, nil
	}
	if p.Last && version <= p.MinCommit {
		// The proposal's version is drawn above MinCommit; never here.
		return Result{Err: aborted("transaction %s would commit at %d, not above its other participants' prepares (%d)", p.Meta.ID, version, p.MinCommit)}, nil
	}
	if _, ok := s.txns.prepared[p.Meta.ID]; ok {
		// The transaction is prepared here too: in the right shard of a
		// merge this shard took in, or in a shard whose keys a split gave
		// this one. This proposal is its commit point, so those intents
		// are resolved in it, at its version. Left for a later resolve,
		// they would be committed with no lock left on their keys (the
		// commit releases the transaction's locks here), and a reader
		// would read past them.
		written := make(map[string]bool, len(p.Writes))
		for i := range p.Writes {
			written[string(p.Writes[i].Key)] = true
		}
		if _, err := s.resolve(b, &TxnResolveCmd{ID: p.Meta.ID, Commit: true, CommitTS: version}, written); err != nil {
			return Result{}, err
		}
	}
	for i := range p.Writes {
		op := &p.Writes[i]
		var cur storage.MVCCValue
		var found bool
		if !s.untaggedPut(op) {
			var err error
			if cur, _, found, err = s.latest(b, op.Key); err != nil {
				return Result{}, err
			}
		}
		if op.Type == OpDelete && !found {
			continue
		}
		var oldTags []string
		if found {
			oldTags = cur.Tags
		}
		if err := s.writeVersion(b, op.Key, op.Bucket, version, op.Type == OpDelete, op.Tags, op.Value, oldTags); err != nil {
			return Result{}, err
		}
	}
	if exists || p.Record || p.Last {
		// The record was written (a heartbeat), or victims wait for it:
		// leave it COMMITTED, so that a late wound finds it so.
		// Its writes are in place: no participant holds it prepared
		// but the others of a last participant, which it lists.
		rec = txn.Record{Status: txn.Committed, CommitTS: version, Heartbeat: rec.Heartbeat, Listed: true, Participants: p.Participants}
		s.recs.add(p.Meta.ID)
		if err := b.Set(storage.TxnRecordKey(a.Collection, a.Key, p.Meta.ID), txn.EncodeRecord(rec, a.Bucket), nil); err != nil {
			return Result{}, err
		}
	}
	if err := s.setMaxVersion(b, version); err != nil {
		return Result{}, err
	}
	return Result{Version: version, Txn: &TxnResult{ID: p.Meta.ID, Status: txn.Committed, CommitTS: version}}, nil
}

func (s *Shard) applyTxnResolve(b *pebble.Batch, version uint64, r *TxnResolveCmd) (Result, error) {
	if err := s.checkVersion(version); err != nil {
		return Result{Err: err}, nil
	}
	res, err := s.resolve(b, r, nil)
	if err != nil {
		return Result{}, err
	}
	if err := s.setMaxVersion(b, version); err != nil {
		return Result{}, err
	}
	res.Version = version
	return res, nil
}

// applyTxnResolveBatch applies each resolve of rs as applyTxnResolve
// would, at one version.
func (s *Shard) applyTxnResolveBatch(b *pebble.Batch, version uint64, rs []*TxnResolveCmd) (Result, error) {
	if err := s.checkVersion(version); err != nil {
		return Result{Err: err}, nil
	}
	out := Result{Version: version, Resolved: make([]string, 0, len(rs))}
	for _, r := range rs {
		if _, err := s.resolve(b, r, nil); err != nil {
			return Result{}, err
		}
		out.Resolved = append(out.Resolved, r.ID)
	}
	if err := s.setMaxVersion(b, version); err != nil {
		return Result{}, err
	}
	return out, nil
}

// resolve writes the outcome of r's transaction into b: its intents here
// become versions at its commit timestamp or vanish, its prepared entry
// goes. The intents on the keys in superseded vanish even in a commit:
// the caller writes those keys at the commit timestamp.
func (s *Shard) resolve(b *pebble.Batch, r *TxnResolveCmd, superseded map[string]bool) (Result, error) {
	coll := s.desc.Collection
	// Resolve every intent the transaction prepared here, not only the
	// keys named (its prepared entry and its locks go with this resolve),
	// each once.
	keys := make([]TxnKey, 0, len(r.Keys)+len(s.txns.writes[r.ID]))
	seen := make(map[string]bool, cap(keys))
	for _, k := range r.Keys {
		if !seen[string(k.Key)] {
			seen[string(k.Key)] = true
			keys = append(keys, k)
		}
	}
	for _, k := range s.txns.writes[r.ID] {
		if !seen[k] {
			seen[k] = true
			keys = append(keys, TxnKey{Key: []byte(k)})
		}
	}
	held := s.txns.held[r.ID]
	for _, k := range keys {
		if !s.txns.mayHold(k.Key) {
			continue // no intent here
		}
		var in txn.Intent
		if h, ok := held[string(k.Key)]; ok {
			in = *h
		} else {
			var err error
			if in, ok, err = ReadIntent(b, coll, k.Key); err != nil {
				return Result{}, err
			}
			if !ok || in.Meta.ID != r.ID {
				continue // resolved before
			}
		}
		if !s.desc.Owns(in.Bucket, k.Key) {
			continue // another shard resolves it
		}
		if r.Commit && superseded[string(k.Key)] {
			// Written by the caller instead.
		} else if r.Commit && !s.resolveNeedsLatest(&in, r.CommitTS) {
			if err := s.writeVersion(b, k.Key, in.Bucket, r.CommitTS, false, nil, in.Value, nil); err != nil {
				return Result{}, err
			}
		} else if r.Commit {
			cur, curVersion, found, err := s.latest(b, k.Key)
			if err != nil {
				return Result{}, err
			}
			// A version at or above the commit means this intent's write
			// landed before (a duplicate intent) or was superseded:
			// writing it again would move the key back.
			if curVersion < r.CommitTS && !(in.Delete && !found) {
				var oldTags []string
				if found {
					oldTags = cur.Tags
				}
				if err := s.writeVersion(b, k.Key, in.Bucket, r.CommitTS, in.Delete, in.Tags, in.Value, oldTags); err != nil {
					return Result{}, err
				}
			}
		}
		if err := deleteOnce(b, storage.IntentKey(nil, coll, k.Key), held[string(k.Key)] != nil); err != nil {
			return Result{}, err
		}
	}
	if _, ok := s.txns.prepared[r.ID]; ok {
		if err := deleteOnce(b, storage.ShardStateKey(s.desc.ShardID, statePrepared+r.ID), held != nil); err != nil {
			return Result{}, err
		}
		s.txns.dropEntry(r.ID)
		// Published by Committed, once the batch holding the resolved
		// versions is visible: until then a reader of the resolved
		// timestamp must not pass them.
		s.txns.stale = true
	}
	st := txn.Aborted
	if r.Commit {
		st = txn.Committed
	}
	return Result{Txn: &TxnResult{ID: r.ID, Status: st, CommitTS: r.CommitTS}}, nil
}

// deleteOnce deletes key in b: with a single deletion if once, which the
// caller says only of a key set exactly once since it was last deleted.
// A single deletion and the set it deletes vanish together as soon as
// one flush or compaction meets both: an intent or a prepared entry
// resolved before its memtable is flushed costs no disk write at all,
// where a deletion is written out and carried down the levels. Set twice,
// a single deletion would let the older value show again: the shard says
// once only of the intents and the prepared entry of a prepare it applied
// itself since it was loaded (txnState.held), which deletes what its
// transaction had there before setting them again.
func deleteOnce(b *pebble.Batch, key []byte, once bool) error {
	if once {
		return b.SingleDelete(key, nil)
	}
	return b.Delete(key, nil)
}

// resolveNeedsLatest reports whether committing intent in at commitTS
// must read the key's newest version first: for the tags it replaces,
// for whether a delete finds the key, or because a version at or above
// commitTS may be there (an intent prepared again after its first resolve,
// or a key written without regard to intents since the prepare). A put
// without tags, in a shard whose keys have none (untagged), prepared
// after the last blind write and at or below its commit (the highest of
// its prepares' versions), need not: every version of its key is below
// the prepare.
func (s *Shard) resolveNeedsLatest(in *txn.Intent, commitTS uint64) bool {
	return !s.untagged || in.Delete || len(in.Tags) > 0 || s.desc.Partitioning == kv.PartitionTag ||
		in.PrepareVersion <= s.blindWrite || in.PrepareVersion > commitTS
}

// TxnCommandID returns the transaction a prepare or resolve command names
// ("" for other commands), so that the leader can update its lock table
// when it applies.
func TxnCommandID(cmd []byte) (id string, kind CommandKind) {
	if len(cmd) < 9 {
		return "", 0
	}
	kind = CommandKind(cmd[0])
	if kind != KindTxnPrepare && kind != KindTxnResolve {
		return "", kind
	}
	c, err := DecodeCommand(cmd)
	if err != nil {
		return "", kind
	}
	if c.TxnPrepare != nil {
		return c.TxnPrepare.Meta.ID, kind
	}
	return c.TxnResolve.ID, kind
}
