package shard

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/group"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/txn"
)

// ErrCorruptCommand reports a log entry that does not decode.
var ErrCorruptCommand = errors.New("shard: corrupt command")

// CommandKind tells commands apart; it is the first byte of an encoding.
type CommandKind byte

const (
	// KindWrite puts and deletes records atomically at one version.
	KindWrite CommandKind = 1
	// KindGC drops versions shadowed at or below a threshold.
	KindGC CommandKind = 2
	// KindGCChunk does a part of the same (EncodeGCChunk).
	KindGCChunk CommandKind = 31
	// KindCreateCollection adds a collection to the catalog (meta shard).
	KindCreateCollection CommandKind = 3
	// KindDropCollection removes a collection from the catalog (meta shard).
	KindDropCollection CommandKind = 4
	// KindTSO persists the timestamp oracle's high-water mark (meta shard).
	KindTSO CommandKind = 5
	// KindDeleteRange deletes every live key of [Start, End) the shard owns,
	// at one version.
	KindDeleteRange CommandKind = 6
	// KindPlace sets the placement tag of a key of a tag collection in the
	// key's home shard, if its current placement is the expected one.
	KindPlace CommandKind = 7
	// KindAddNode adds or updates a node's membership record (meta shard),
	// and may give it a replica of the meta shard.
	KindAddNode CommandKind = 8
	// KindChecksum asks every replica to compute a checksum of the shard's
	// replicated state as of the command's log index (ChecksumState); it
	// changes nothing but the applied index.
	KindChecksum CommandKind = 9
	// KindTruncateLog tells every replica that every replica of the group
	// had appended the raft log up to LogIndex when the leader proposed it:
	// each may drop its entries up to there (replication's truncateIndex).
	// It changes nothing but the applied index.
	KindTruncateLog CommandKind = 34
)

// OpType is the type of one operation of a write.
type OpType byte

const (
	OpPut    OpType = 1
	OpDelete OpType = 2
)

// Op is one operation of a write command.
type Op struct {
	Type   OpType
	Bucket uint16
	Key    []byte
	Value  []byte
	Tags   []string
	// HasCond makes the op conditional on the key's current version being
	// CondVersion (0: absent).
	HasCond     bool
	CondVersion uint64
	// MustExist makes a delete of an absent key fail with not_found.
	MustExist bool
}

// Command is a decoded log entry.
type Command struct {
	Kind CommandKind
	// Version is the version of a write, assigned by the leader.
	Version uint64
	Ops     []Op
	// Threshold is the GC threshold (KindGC) or the high-water mark (KindTSO).
	Threshold uint64
	// GC is where a KindGCChunk starts and how much it does.
	GC *GCChunk
	// Collection is the options of KindCreateCollection (with Nodes) or the
	// name of KindDropCollection.
	Collection kv.CollectionOptions
	Nodes      []uint64
	// Start and End bound a KindDeleteRange (nil End: unbounded).
	Start, End []byte
	// Place is the placement change of a KindPlace.
	Place Placement
	// Node is the record of a KindAddNode; AssignMeta asks for a meta
	// replica id for it if it has none (every node holds a meta replica:
	// the first cluster.MetaReplicas as voters, the others as learners).
	Node       cluster.NodeDesc
	AssignMeta bool
	// Rejoin: the node came back with an empty disk; it gets new replica
	// ids in the meta shard and every shard it holds (ids are never
	// reused), and its old replicas are replaced.
	Rejoin bool
	// ChecksumID names a KindChecksum, so that the replicas' answers to one
	// consistency check can be told apart from another's.
	ChecksumID uint64
	// LogIndex is the raft log index of a KindTruncateLog.
	LogIndex uint64
	// Move and Drain are the bodies of KindMoveReplicas (and
	// KindMoveShardReplica) and KindSetDraining (moves.go).
	Move   MoveCmd
	Drain  DrainCmd
	Prefer PreferCmd
	Split  SplitCmd
	Merge  MergeCmd
	// Transaction commands (txn.go).
	// GroupBody is the body of KindGroup and KindGroupWrite, and of their
	// batches (the versioned ones with their version first).
	GroupBody  []byte
	TxnRecord  txn.RecordCmd
	TxnPrepare *TxnPrepareCmd
	TxnResolve *TxnResolveCmd
	// TxnResolves is the body of a KindTxnResolveBatch.
	TxnResolves []*TxnResolveCmd
	TxnForget   *TxnForgetCmd
}

// Placement is a change of a key's placement tag: from Old (HasOld false:
// no placement yet) to New.
type Placement struct {
	Bucket uint16 // the key's home bucket
	Key    []byte
	HasOld bool
	Old    string
	New    string
	// Txn is the transaction that changes the placement, holding the
	// key's exclusive lock in its home shard ("": a plain put, which locks
	// the key for the proposal).
	Txn string
	// Pin, with Op PlacePin, pins the placement for a Key Group (the
	// group's id and incarnation, group.Ref): while pinned, the placement
	// does not move, so the key's record stays in the shard that yielded
	// it to the group. With HasOld false it places the key by New first.
	// With Op PlaceUnpin it removes the pin if Pin holds it (the
	// condition and New are not used).
	Op  PlaceOp
	Pin string
}

// PlaceOp is what a KindPlace does.
type PlaceOp uint8

// Operations of a KindPlace.
const (
	PlaceSet   PlaceOp = iota // set the placement (a move, refused while pinned)
	PlacePin                  // pin it for a group
	PlaceUnpin                // remove a group's pin
)

const opFlagCond, opFlagMustExist = 1, 2

// versionOffset is where a write's version sits in its encoding, so that a
// leader can assign it without re-encoding.
const versionOffset = 1

// EncodeWrite encodes a write command with version 0; SetVersion fills it.
func EncodeWrite(ops []Op) []byte {
	n := 16
	for i := range ops {
		n += 24 + len(ops[i].Key) + len(ops[i].Value)
		for _, t := range ops[i].Tags {
			n += len(t) + 2
		}
	}
	b := make([]byte, 1+8, n)
	b[0] = byte(KindWrite)
	return appendOps(b, ops)
}

// appendOps appends the encoding of ops: their count, then each op.
func appendOps(b []byte, ops []Op) []byte {
	b = binary.AppendUvarint(b, uint64(len(ops)))
	for _, op := range ops {
		b = append(b, byte(op.Type))
		var flags byte
		if op.HasCond {
			flags |= opFlagCond
		}
		if op.MustExist {
			flags |= opFlagMustExist
		}
		b = append(b, flags)
		if op.HasCond {
			b = binary.AppendUvarint(b, op.CondVersion)
		}
		b = binary.BigEndian.AppendUint16(b, op.Bucket)
		b = appendBytes(b, op.Key)
		if op.Type == OpPut {
			b = binary.AppendUvarint(b, uint64(len(op.Tags)))
			for _, t := range op.Tags {
				b = appendBytes(b, []byte(t))
			}
			b = appendBytes(b, op.Value)
		}
	}
	return b
}

// EncodeDeleteRange encodes a delete of [start, end) with version 0;
// SetVersion fills it. A nil end is unbounded.
func EncodeDeleteRange(start, end []byte) []byte {
	b := make([]byte, 1+8, 16+len(start)+len(end))
	b[0] = byte(KindDeleteRange)
	b = appendBytes(b, start)
	if end == nil {
		return append(b, 0)
	}
	b = append(b, 1)
	return appendBytes(b, end)
}

// EncodePlace encodes a placement change.
func EncodePlace(p Placement) []byte {
	b := []byte{byte(KindPlace)}
	b = binary.BigEndian.AppendUint16(b, p.Bucket)
	b = appendBytes(b, p.Key)
	var flags byte
	if p.HasOld {
		flags |= placeHasOld
	}
	if p.Txn != "" {
		flags |= placeTxn
	}
	if p.Op != PlaceSet {
		flags |= placePin
	}
	b = append(b, flags)
	if p.HasOld {
		b = appendBytes(b, []byte(p.Old))
	}
	b = appendBytes(b, []byte(p.New))
	if p.Txn != "" {
		b = appendBytes(b, []byte(p.Txn))
	}
	if p.Op != PlaceSet {
		b = append(b, byte(p.Op))
		b = appendBytes(b, []byte(p.Pin))
	}
	return b
}

// Flags of a KindPlace.
const (
	placeHasOld = 1 << 0
	placeTxn    = 1 << 1
	placePin    = 1 << 2 // Op and Pin follow
)

// SetVersion assigns the version of an encoded write command in place.
func SetVersion(cmd []byte, version uint64) {
	binary.BigEndian.PutUint64(cmd[versionOffset:], version)
}

// IsWrite reports whether an encoded command writes versioned data (it
// needs a version, at offset 1). A freeze (merge.go) is versioned too.
func IsWrite(cmd []byte) bool {
	if len(cmd) <= 8 {
		return false
	}
	switch CommandKind(cmd[0]) {
	case KindWrite, KindDeleteRange, KindFreeze, KindTxnPrepare, KindTxnResolve, KindTxnResolveBatch, KindGroupWrite, KindGroupWriteBatch:
		return true
	}
	return false
}

// AddsData reports whether an encoded command is one that a node whose
// disk is low refuses (Host.RefuseWrites): a client's write or batch with
// a put, a range deletion, a transaction's prepare, a Key Group
// transaction's commit, a new collection. Deletes of single keys are
// taken (a tombstone each, and what the GC frees once the retention
// window has passed), and so is what finishes work already accepted (a
// transaction's record and resolves, a group's shipments and release, its
// registration's removal), frees space (GC, log truncation) or keeps the
// cluster going (timestamps, membership, placement). It decodes a
// write's operations: call it only to refuse.
func AddsData(cmd []byte) bool {
	if len(cmd) == 0 {
		return false
	}
	switch CommandKind(cmd[0]) {
	case KindWrite:
		c, err := DecodeCommand(cmd)
		if err != nil {
			return true
		}
		for _, op := range c.Ops {
			if op.Type != OpDelete {
				return true
			}
		}
		return false
	case KindDeleteRange, KindTxnPrepare, KindCreateCollection:
		return true
	case KindGroupWrite:
		return len(cmd) > 9 && group.RecordKind(cmd[9]) == group.RecWrite
	}
	return false
}

// EncodeGC encodes a GC command that collects the whole shard in one
// Apply.
func EncodeGC(threshold uint64) []byte {
	return binary.AppendUvarint([]byte{byte(KindGC)}, threshold)
}

// GCChunk is the part of a garbage collection one KindGC does: from
// Phase and Key (the zero value: the start, which also raises the
// shard's GC threshold) for about Limit entries, stopping between keys.
// Phases: the data versions, the tag index entries, the change log.
type GCChunk struct {
	Phase uint8
	Key   []byte
	Limit uint64
}

// EncodeGCChunk encodes a GC command that does chunk of the collection at
// threshold; its Result.GCNext says where the next one starts (nil once
// the collection is done).
func EncodeGCChunk(threshold uint64, chunk GCChunk) []byte {
	b := binary.AppendUvarint([]byte{byte(KindGCChunk)}, threshold)
	b = append(b, chunk.Phase)
	b = appendBytes(b, chunk.Key)
	return binary.AppendUvarint(b, chunk.Limit)
}

// EncodeTSO encodes a TSO high-water mark command.
func EncodeTSO(hwm uint64) []byte {
	return binary.AppendUvarint([]byte{byte(KindTSO)}, hwm)
}

// EncodeCreateCollection encodes a collection creation placed on nodes.
func EncodeCreateCollection(opts kv.CollectionOptions, nodes []uint64) []byte {
	b := []byte{byte(KindCreateCollection)}
	b = appendBytes(b, []byte(opts.Name))
	b = appendBytes(b, []byte(opts.Partitioning))
	b = binary.AppendUvarint(b, uint64(opts.Shards))
	b = binary.AppendUvarint(b, uint64(len(opts.SplitPoints)))
	for _, p := range opts.SplitPoints {
		b = appendBytes(b, p)
	}
	b = binary.AppendUvarint(b, uint64(len(nodes)))
	for _, n := range nodes {
		b = binary.AppendUvarint(b, n)
	}
	if opts.Replicas != 0 {
		b = binary.AppendUvarint(b, uint64(opts.Replicas))
	}
	return b
}

// EncodeRejoinNode encodes the return of node n with an empty disk.
func EncodeRejoinNode(n cluster.NodeDesc) []byte {
	b := EncodeAddNode(n, true)
	b[len(b)-1] = 2
	return b
}

// EncodeAddNode encodes a membership record change.
func EncodeAddNode(n cluster.NodeDesc, assignMeta bool) []byte {
	b := []byte{byte(KindAddNode)}
	b = binary.AppendUvarint(b, n.ID)
	b = appendBytes(b, []byte(n.Addr))
	b = appendBytes(b, []byte(n.PeerAddr))
	b = binary.AppendUvarint(b, n.MetaReplica)
	if assignMeta {
		return append(b, 1)
	}
	return append(b, 0)
}

// EncodeChecksum encodes a consistency check named id.
func EncodeChecksum(id uint64) []byte {
	return binary.AppendUvarint([]byte{byte(KindChecksum)}, id)
}

// EncodeTruncateLog encodes the leader's word that every replica has the
// raft log up to index.
func EncodeTruncateLog(index uint64) []byte {
	return binary.AppendUvarint([]byte{byte(KindTruncateLog)}, index)
}

// EncodeDropCollection encodes a collection drop.
func EncodeDropCollection(name string) []byte {
	return appendBytes([]byte{byte(KindDropCollection)}, []byte(name))
}

func appendBytes(b, p []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(p)))
	return append(b, p...)
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 || n > 1 && d.b[n-1] == 0 {
		// Only the minimal encoding is valid, so a command has one encoding.
		d.err = ErrCorruptCommand
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.err = ErrCorruptCommand
		return nil
	}
	p := d.b[:n:n]
	d.b = d.b[n:]
	return p
}

func (d *decoder) byte() byte {
	if d.err != nil || len(d.b) == 0 {
		d.err = ErrCorruptCommand
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

// ops decodes what appendOps encoded.
func (d *decoder) ops() ([]Op, error) {
	n := d.count(1 << 20)
	// Every op takes at least 5 bytes; a corrupt count cannot make this
	// allocation larger than the entry.
	ops := make([]Op, 0, min(n, len(d.b)/5+1))
	for i := 0; i < n && d.err == nil; i++ {
		var op Op
		if err := d.op(i, &op, true); err != nil {
			return nil, err
		}
		ops = append(ops, op)
	}
	return ops, d.err
}

// op decodes op i of what appendOps encoded into op, its tags only with
// tags (else they are skipped).
func (d *decoder) op(i int, op *Op, tags bool) error {
	op.Type = OpType(d.byte())
	flags := d.byte()
	if d.err == nil && (op.Type != OpPut && op.Type != OpDelete || flags&^(opFlagCond|opFlagMustExist) != 0) {
		return fmt.Errorf("%w: op %d has type %d flags %d", ErrCorruptCommand, i, op.Type, flags)
	}
	op.HasCond = flags&opFlagCond != 0
	op.MustExist = flags&opFlagMustExist != 0
	if op.HasCond {
		op.CondVersion = d.uvarint()
	}
	op.Bucket = d.uint16()
	op.Key = d.bytes()
	if op.Type == OpPut {
		nt := d.count(kv.MaxTags)
		for j := 0; j < nt && d.err == nil; j++ {
			t := d.bytes()
			if !utf8.Valid(t) {
				d.err = ErrCorruptCommand
			}
			if tags {
				op.Tags = append(op.Tags, string(t))
			}
		}
		op.Value = d.bytes()
	}
	return nil
}

// WriteKeys appends to keys the key of every op of cmd, an encoded write
// (KindWrite), without decoding the rest: the keys alias cmd.
func WriteKeys(cmd []byte, keys [][]byte) ([][]byte, error) {
	if len(cmd) < 1+8 || CommandKind(cmd[0]) != KindWrite {
		return keys, ErrCorruptCommand
	}
	d := decoder{b: cmd[1+8:]}
	n := d.count(1 << 20)
	for i := 0; i < n && d.err == nil; i++ {
		var op Op
		if err := d.op(i, &op, false); err != nil {
			return keys, err
		}
		keys = append(keys, op.Key)
	}
	if d.err != nil || len(d.b) != 0 {
		return keys, ErrCorruptCommand
	}
	return keys, nil
}

// uint16 decodes a big-endian uint16.
func (d *decoder) uint16() uint16 {
	if d.err != nil || len(d.b) < 2 {
		d.err = ErrCorruptCommand
		return 0
	}
	v := binary.BigEndian.Uint16(d.b)
	d.b = d.b[2:]
	return v
}

// uint32 decodes a big-endian uint32.
func (d *decoder) uint32() uint32 {
	if d.err != nil || len(d.b) < 4 {
		d.err = ErrCorruptCommand
		return 0
	}
	v := binary.BigEndian.Uint32(d.b)
	d.b = d.b[4:]
	return v
}

func (d *decoder) count(max uint64) int {
	n := d.uvarint()
	if n > max || n > uint64(len(d.b)) {
		d.err = ErrCorruptCommand
		return 0
	}
	return int(n)
}

// DecodeCommand decodes an encoded command. Byte slices in the result alias b.
func DecodeCommand(b []byte) (Command, error) {
	var c Command
	if len(b) == 0 {
		return c, ErrCorruptCommand
	}
	c.Kind = CommandKind(b[0])
	d := decoder{b: b[1:]}
	switch c.Kind {
	case KindWrite:
		if len(d.b) < 8 {
			return c, ErrCorruptCommand
		}
		c.Version = binary.BigEndian.Uint64(d.b)
		d.b = d.b[8:]
		ops, err := d.ops()
		if err != nil {
			return c, err
		}
		c.Ops = ops
	case KindTxnRecord, KindTxnForget:
		return c, decodeTxn(&c, d.b)
	case KindGroup, KindGroupWrite, KindGroupBatch, KindGroupWriteBatch:
		c.GroupBody = d.b
		body := d.b
		if c.Kind == KindGroupWrite || c.Kind == KindGroupWriteBatch {
			if len(d.b) < 8 {
				return c, ErrCorruptCommand
			}
			c.Version = binary.BigEndian.Uint64(d.b)
			body = d.b[8:]
		}
		if c.Kind == KindGroupBatch || c.Kind == KindGroupWriteBatch {
			// The records are the group package's; the framing is this
			// package's.
			if _, err := decodeGroupBatch(body); err != nil {
				return c, err
			}
		}
		return c, nil
	case KindTxnPrepare, KindTxnResolve, KindTxnResolveBatch:
		if len(d.b) < 8 {
			return c, ErrCorruptCommand
		}
		c.Version = binary.BigEndian.Uint64(d.b)
		return c, decodeTxn(&c, d.b[8:])
	case KindGC, KindTSO:
		c.Threshold = d.uvarint()
	case KindGCChunk:
		c.Threshold = d.uvarint()
		ch := &GCChunk{Phase: d.byte(), Key: d.bytes(), Limit: d.uvarint()}
		if d.err == nil && (ch.Phase > gcPhaseChanges || ch.Limit == 0) {
			d.err = ErrCorruptCommand
		}
		if len(ch.Key) == 0 {
			ch.Key = nil // the start
		}
		c.GC = ch
	case KindChecksum:
		c.ChecksumID = d.uvarint()
	case KindTruncateLog:
		c.LogIndex = d.uvarint()
	case KindCreateCollection:
		c.Collection.Name = string(d.bytes())
		c.Collection.Partitioning = kv.Partitioning(d.bytes())
		if shards := d.uvarint(); shards <= kv.MaxShards {
			c.Collection.Shards = int(shards)
		} else {
			d.err = ErrCorruptCommand
		}
		np := d.count(kv.MaxShards)
		for i := 0; i < np && d.err == nil; i++ {
			c.Collection.SplitPoints = append(c.Collection.SplitPoints, d.bytes())
		}
		nn := d.count(1 << 16)
		for i := 0; i < nn && d.err == nil; i++ {
			c.Nodes = append(c.Nodes, d.uvarint())
		}
		if len(d.b) > 0 && d.err == nil {
			if r := d.uvarint(); r >= 1 && r <= kv.MaxReplicas {
				c.Collection.Replicas = int(r)
			} else {
				d.err = ErrCorruptCommand
			}
		}
	case KindMoveReplicas, KindMoveShardReplica:
		c.Move = decodeMove(&d, c.Kind)
	case KindSetDraining:
		c.Drain = decodeDrain(&d)
	case KindSetPreferred:
		c.Prefer = decodePrefer(&d)
	case KindSplitShard, KindSplitTrigger:
		c.Split = decodeSplit(&d, c.Kind)
	case KindFreeze:
		if len(d.b) < 8 {
			return c, ErrCorruptCommand
		}
		c.Version = binary.BigEndian.Uint64(d.b)
		d.b = d.b[8:]
		c.Merge = decodeMerge(&d, c.Kind)
	case KindMergeShards, KindMergeTrigger:
		c.Merge = decodeMerge(&d, c.Kind)
	case KindAddNode:
		c.Node.ID = d.uvarint()
		c.Node.Addr = string(d.bytes())
		c.Node.PeerAddr = string(d.bytes())
		c.Node.MetaReplica = d.uvarint()
		switch d.byte() {
		case 0:
		case 1:
			c.AssignMeta = true
		case 2:
			c.AssignMeta, c.Rejoin = true, true
		default:
			d.err = ErrCorruptCommand
		}
	case KindDropCollection:
		c.Collection.Name = string(d.bytes())
	case KindDeleteRange:
		if len(d.b) < 8 {
			return c, ErrCorruptCommand
		}
		c.Version = binary.BigEndian.Uint64(d.b)
		d.b = d.b[8:]
		c.Start = d.bytes()
		switch d.byte() {
		case 0:
		case 1:
			c.End = d.bytes()
		default:
			d.err = ErrCorruptCommand
		}
	case KindPlace:
		if len(d.b) < 2 {
			return c, ErrCorruptCommand
		}
		c.Place.Bucket = binary.BigEndian.Uint16(d.b)
		d.b = d.b[2:]
		c.Place.Key = d.bytes()
		flags := d.byte()
		if flags&^(placeHasOld|placeTxn|placePin) != 0 {
			d.err = ErrCorruptCommand
		}
		if flags&placeHasOld != 0 {
			c.Place.HasOld = true
			c.Place.Old = string(d.bytes())
		}
		c.Place.New = string(d.bytes())
		if flags&placeTxn != 0 {
			if c.Place.Txn = string(d.bytes()); c.Place.Txn == "" {
				d.err = ErrCorruptCommand // absent, not empty
			}
		}
		if flags&placePin != 0 {
			c.Place.Op = PlaceOp(d.byte())
			c.Place.Pin = string(d.bytes())
			if c.Place.Op != PlacePin && c.Place.Op != PlaceUnpin || c.Place.Pin == "" {
				d.err = ErrCorruptCommand
			}
		}
	default:
		return c, fmt.Errorf("%w: unknown kind %d", ErrCorruptCommand, c.Kind)
	}
	if d.err != nil {
		return c, d.err
	}
	if len(d.b) != 0 {
		return c, fmt.Errorf("%w: %d trailing bytes", ErrCorruptCommand, len(d.b))
	}
	return c, nil
}
