package shard

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/cockroachdb/pebble/v2"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/storage"
)

// Raft snapshots of a shard's state machine.
//
// A snapshot holds every replicated key/value pair the shard owns: its
// shard-state span (applied index and term, max version, GC threshold, conf
// state, ...), the catalog for the meta shard, and for a data shard the keys
// of its collection that are its own. The shards of one collection on a node
// share one Pebble instance and their keys interleave in key order, so a
// data shard's keys are picked one by one, by the rules Apply writes them
// with:
//
//	0x05 data       a version is owned by the shard of the bucket in its value
//	                (range: of its user key), as writeVersion stores it
//	0x06 tag index  the shard of the bucket in the entry (range: of the key)
//	0x07 changes    the shard of the bucket in the entry (range: of the key)
//	0x08 placement  tag collections only: the key's home shard, the one that
//	                owns cluster.Bucket(key) (applyPlace)
//	0x09 latest     the shard of the bucket in the pointer (range: of the key)
//	0x0a intents    the shard of the bucket in the intent (range: of the key)
//	0x0b txn records the shard of the anchor's bucket in the record (range:
//	                of the anchor key)
//
// These are the rules (ownsStored) applyGC picks a shard's versions, tag
// index entries and changes by, so that GC and snapshots agree on what a
// shard holds.
//
// Encoding, version 1:
//
//	version(1) = 1
//	uvarint(shard id) uvarint(collection) bytes(partitioning)
//	uvarint(bucket start) uvarint(bucket end) bytes(start) has-end(1) [bytes(end)]
//	{ uvarint(shared) bytes(suffix) bytes(value) }*
//	uvarint(0) bytes("")
//	crc32c(4, big-endian) of every byte before it
//
// where bytes(p) is uvarint(len(p)) p, uvarints are minimal, and each pair's
// key is the previous key's first shared bytes followed by suffix. Keys are
// strictly increasing, so no pair has an empty suffix: an empty suffix ends
// the pairs.

// snapshotVersion is the first byte of the snapshot encoding.
const snapshotVersion byte = 1

// ErrCorruptSnapshot reports snapshot data that does not decode, or that
// holds a key the shard it names does not own.
var ErrCorruptSnapshot = errors.New("shard: corrupt snapshot")

// ErrSnapshotMismatch reports snapshot data of another shard (or of another
// span of the shard) than the one it is restored into.
var ErrSnapshotMismatch = errors.New("shard: snapshot of another shard")

var snapshotCRC = crc32.MakeTable(crc32.Castagnoli)

// spanKind tells the key spans of a snapshot apart.
type spanKind byte

const (
	spanState spanKind = iota
	spanCatalog
	spanData
	spanTagIndex
	spanChange
	spanPlacement
	spanLatest
	spanIntent
	spanTxnRecord
)

// snapSpan is a span of keys the shard may own.
type snapSpan struct {
	kind       spanKind
	start, end []byte
	// owned tells whether the shard owns a key of the span with value v,
	// or returns an error if the pair does not decode. nil: the shard owns
	// the whole span.
	owned func(k, v []byte) (bool, error)
}

// snapshotSpans returns the spans of the keys desc may own, in key order.
func snapshotSpans(d Desc) []snapSpan {
	start, end := storage.ShardStateSpan(d.ShardID)
	spans := []snapSpan{{kind: spanState, start: start, end: end}}
	if d.IsMeta() {
		start, end = storage.CatalogSpan("")
		return append(spans, snapSpan{kind: spanCatalog, start: start, end: end})
	}
	coll := d.Collection
	start, end = d.Span()
	spans = append(spans, snapSpan{kind: spanData, start: start, end: end, owned: d.ownsDataPair})
	start, end = storage.TagIndexSpan(coll)
	spans = append(spans, snapSpan{kind: spanTagIndex, start: start, end: end, owned: d.ownsTagPair})
	start, end = storage.ChangeSpanAll(coll)
	spans = append(spans, snapSpan{kind: spanChange, start: start, end: end, owned: d.ownsChangePair})
	if d.Partitioning == kv.PartitionTag {
		start, end = storage.PlacementSpan(coll)
		spans = append(spans, snapSpan{kind: spanPlacement, start: start, end: end, owned: d.ownsPlacementPair})
	}
	start, end = storage.LatestSpan(coll)
	if d.Partitioning == kv.PartitionRange {
		// Escaping keeps the order of user keys: the pointers of the
		// shard's keys are those between the pointers of its bounds.
		start = storage.LatestKey(nil, coll, d.Start)
		if d.End != nil {
			end = storage.LatestKey(nil, coll, d.End)
		}
	}
	spans = append(spans, snapSpan{kind: spanLatest, start: start, end: end, owned: d.ownsLatestPair})
	start, end = storage.IntentSpan(coll)
	spans = append(spans, snapSpan{kind: spanIntent, start: start, end: end, owned: d.ownsIntentPair})
	start, end = storage.TxnRecordSpan(coll)
	return append(spans, snapSpan{kind: spanTxnRecord, start: start, end: end, owned: d.ownsTxnRecordPair})
}

func (d Desc) ownsIntentPair(k, v []byte) (bool, error) {
	key, err := decodeCollectionKey(k, storage.IntentKey(nil, d.Collection, nil))
	if err != nil {
		return false, err
	}
	if len(v) < 2 {
		return false, storage.ErrCorruptValue
	}
	return d.ownsStored(binary.BigEndian.Uint16(v), key), nil
}

func (d Desc) ownsTxnRecordPair(k, v []byte) (bool, error) {
	p := storage.TxnRecordKey(d.Collection, nil, "")[:5]
	if !bytes.HasPrefix(k, p) {
		return false, storage.ErrCorruptKey
	}
	key, _, err := storage.UnescapeKey(k[len(p):])
	if err != nil {
		return false, err
	}
	if len(v) < 3 {
		return false, storage.ErrCorruptValue
	}
	return d.ownsStored(binary.BigEndian.Uint16(v[1:]), key), nil
}

func (d Desc) ownsDataPair(k, v []byte) (bool, error) {
	dk, err := storage.DecodeDataKey(k)
	if err != nil {
		return false, err
	}
	if dk.Collection != d.Collection {
		return false, storage.ErrCorruptKey
	}
	mv, err := storage.DecodeValue(v)
	if err != nil {
		return false, err
	}
	return d.ownsStored(mv.Bucket, dk.UserKey), nil
}

func (d Desc) ownsTagPair(k, v []byte) (bool, error) {
	coll, _, key, _, err := storage.DecodeTagIndexKey(k)
	if err != nil {
		return false, err
	}
	if coll != d.Collection {
		return false, storage.ErrCorruptKey
	}
	if len(v) != 3 || v[0] > 1 {
		return false, storage.ErrCorruptValue
	}
	return d.ownsStored(tagEntryBucket(v), key), nil
}

func (d Desc) ownsChangePair(k, v []byte) (bool, error) {
	coll, _, key, err := storage.DecodeChangeKey(k)
	if err != nil {
		return false, err
	}
	if coll != d.Collection {
		return false, storage.ErrCorruptKey
	}
	if len(v) != 2 {
		return false, storage.ErrCorruptValue
	}
	return d.ownsStored(binary.BigEndian.Uint16(v), key), nil
}

// ownsPlacementPair: the placement entry of a key is kept by the key's home
// shard, the owner of the key's own bucket (not of its placement tag's).
func (d Desc) ownsPlacementPair(k, _ []byte) (bool, error) {
	key, err := decodeCollectionKey(k, storage.PlacementKey(d.Collection, nil))
	if err != nil {
		return false, err
	}
	return d.Partitioning == kv.PartitionTag && d.OwnsBucket(cluster.Bucket(key)), nil
}

func (d Desc) ownsLatestPair(k, v []byte) (bool, error) {
	key, err := decodeCollectionKey(k, storage.LatestKey(nil, d.Collection, nil))
	if err != nil {
		return false, err
	}
	_, bucket, _, err := storage.DecodeLatest(v)
	if err != nil {
		return false, err
	}
	return d.ownsStored(bucket, key), nil
}

// decodeCollectionKey decodes a key made of a prefix byte, a collection and
// an escaped user key. emptyKey is such a key with an empty user key.
func decodeCollectionKey(k, emptyKey []byte) ([]byte, error) {
	p := emptyKey[:5]
	if len(k) < len(p)+2 || !bytes.HasPrefix(k, p) {
		return nil, storage.ErrCorruptKey
	}
	key, rest, err := storage.UnescapeKey(k[len(p):])
	if err != nil {
		return nil, err
	}
	if len(rest) != 0 {
		return nil, storage.ErrCorruptKey
	}
	return key, nil
}

// eachOwned calls fn for every key of span sp in r that the shard owns.
// The slices passed to fn are valid only during the call.
func eachOwned(r pebble.Reader, sp snapSpan, fn func(k, v []byte) error) error {
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: sp.start, UpperBound: sp.end})
	if err != nil {
		return err
	}
	defer it.Close()
	return eachOwnedIn(it, sp, fn)
}

// pairIter is what eachOwnedIn reads: a *pebble.Iterator bounded to a span,
// or a view of one with writes laid over it (batchOverlay).
type pairIter interface {
	First() bool
	Next() bool
	Key() []byte
	ValueAndErr() ([]byte, error)
	Error() error
}

// eachOwnedIn calls fn for every pair of it, which is bounded to sp, that
// the shard owns.
func eachOwnedIn(it pairIter, sp snapSpan, fn func(k, v []byte) error) error {
	for valid := it.First(); valid; valid = it.Next() {
		k := it.Key()
		v, err := it.ValueAndErr()
		if err != nil {
			return err
		}
		if sp.owned != nil {
			ok, err := sp.owned(k, v)
			if err != nil {
				return fmt.Errorf("key %x: %w", k, err)
			}
			if !ok {
				continue
			}
		}
		if err := fn(k, v); err != nil {
			return err
		}
	}
	return it.Error()
}

// SnapshotData returns every replicated key/value pair that shard desc owns,
// read from r (a Pebble snapshot taken at the applied index the caller
// reports): its shard-state span (storage.ShardStateSpan(desc.ShardID):
// applied index/term, max version, GC threshold, conf state, TSO mark ...),
// for the meta shard (desc.IsMeta()) the catalog span, and for a data shard
// every key of its collection that belongs to this shard: MVCC data
// versions, tag index entries, change-log entries, latest-version pointers
// and placement index entries. The encoding is versioned (first byte) and
// self-delimiting; see the top of this file.
func SnapshotData(r pebble.Reader, desc Desc) ([]byte, error) {
	buf := appendSnapshotHeader(make([]byte, 0, 4096), desc)
	var prev []byte
	for _, sp := range snapshotSpans(desc) {
		err := eachOwned(r, sp, func(k, v []byte) error {
			buf = appendSnapshotPair(buf, prev, k, v)
			prev = append(prev[:0], k...)
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("shard %d: snapshot: %w", desc.ShardID, err)
		}
	}
	return finishSnapshot(buf), nil
}

func appendSnapshotHeader(buf []byte, d Desc) []byte {
	buf = append(buf, snapshotVersion)
	buf = binary.AppendUvarint(buf, d.ShardID)
	buf = binary.AppendUvarint(buf, uint64(d.Collection))
	buf = appendBytes(buf, []byte(d.Partitioning))
	buf = binary.AppendUvarint(buf, uint64(d.BucketStart))
	buf = binary.AppendUvarint(buf, uint64(d.BucketEnd))
	buf = appendBytes(buf, d.Start)
	if d.End == nil {
		return append(buf, 0)
	}
	buf = append(buf, 1)
	return appendBytes(buf, d.End)
}

func appendSnapshotPair(buf, prev, k, v []byte) []byte {
	shared := 0
	for shared < len(prev) && shared < len(k) && prev[shared] == k[shared] {
		shared++
	}
	buf = binary.AppendUvarint(buf, uint64(shared))
	buf = appendBytes(buf, k[shared:])
	return appendBytes(buf, v)
}

// finishSnapshot appends the end of the pairs and the checksum.
func finishSnapshot(buf []byte) []byte {
	buf = append(buf, 0, 0)
	return binary.BigEndian.AppendUint32(buf, crc32.Checksum(buf, snapshotCRC))
}

// snapPair is one decoded pair of a snapshot; span indexes snapshotSpans.
type snapPair struct {
	key, value []byte
	span       int
}

// SnapshotDesc returns the descriptor snapshot data was taken with: its
// shard, and the span the shard had at the snapshot's index.
func SnapshotDesc(data []byte) (Desc, error) {
	h, _, _, err := decodeSnapshotHeader(data)
	return h, err
}

// decodeSnapshotHeader checks data's version and checksum and decodes its
// header; it returns the decoder positioned at the first pair.
func decodeSnapshotHeader(data []byte) (Desc, decoder, []byte, error) {
	if len(data) == 0 {
		return Desc{}, decoder{}, nil, fmt.Errorf("%w: empty", ErrCorruptSnapshot)
	}
	if data[0] != snapshotVersion {
		return Desc{}, decoder{}, nil, fmt.Errorf("%w: unknown version %d", ErrCorruptSnapshot, data[0])
	}
	if len(data) < 1+4 {
		return Desc{}, decoder{}, nil, fmt.Errorf("%w: %d bytes", ErrCorruptSnapshot, len(data))
	}
	body := data[:len(data)-4]
	if crc32.Checksum(body, snapshotCRC) != binary.BigEndian.Uint32(data[len(data)-4:]) {
		return Desc{}, decoder{}, nil, fmt.Errorf("%w: checksum mismatch (truncated or damaged)", ErrCorruptSnapshot)
	}
	d := decoder{b: body[1:]}
	var h Desc
	h.ShardID = d.uvarint()
	coll := d.uvarint()
	h.Partitioning = kv.Partitioning(d.bytes())
	bs, be := d.uvarint(), d.uvarint()
	h.Start = d.bytes()
	switch d.byte() {
	case 0:
	case 1:
		h.End = d.bytes()
	default:
		d.err = ErrCorruptCommand
	}
	if d.err != nil || coll > 1<<32-1 || bs > 1<<32-1 || be > 1<<32-1 {
		return Desc{}, decoder{}, nil, fmt.Errorf("%w: bad header", ErrCorruptSnapshot)
	}
	h.Collection, h.BucketStart, h.BucketEnd = uint32(coll), uint32(bs), uint32(be)
	if len(h.Start) == 0 {
		h.Start = nil
	}
	return h, d, body, nil
}

// decodeSnapshot decodes and checks data against desc: its version, its
// checksum, the shard it names, and that the shard owns every key of it.
// The span may differ from desc's (a split or merge the sender applied and
// this replica did not): the snapshot's span is checked and returned, and
// spans are the snapshot's. Values alias data.
func decodeSnapshot(desc Desc, data []byte) (Desc, []snapPair, []snapSpan, error) {
	h, d, _, err := decodeSnapshotHeader(data)
	if err != nil {
		return Desc{}, nil, nil, err
	}
	if h.ShardID != desc.ShardID {
		return Desc{}, nil, nil, fmt.Errorf("%w: the snapshot is of shard %d, not %d", ErrSnapshotMismatch, h.ShardID, desc.ShardID)
	}
	sameSpan := h.BucketStart == desc.BucketStart && h.BucketEnd == desc.BucketEnd &&
		bytes.Equal(h.Start, desc.Start) && (h.End == nil) == (desc.End == nil) && bytes.Equal(h.End, desc.End)
	if h.Collection != desc.Collection || h.Partitioning != desc.Partitioning || !sameSpan && desc.IsMeta() {
		return Desc{}, nil, nil, fmt.Errorf("%w: the snapshot of shard %d is of collection %d %s buckets [%d, %d) keys [%q, %q), not collection %d %s buckets [%d, %d) keys [%q, %q)",
			ErrSnapshotMismatch, h.ShardID, h.Collection, h.Partitioning, h.BucketStart, h.BucketEnd, h.Start, h.End,
			desc.Collection, desc.Partitioning, desc.BucketStart, desc.BucketEnd, desc.Start, desc.End)
	}
	spans := snapshotSpans(h)
	var (
		pairs []snapPair
		prev  []byte
		si    int
	)
	for {
		shared := d.uvarint()
		suffix := d.bytes()
		if d.err != nil {
			return Desc{}, nil, nil, fmt.Errorf("%w: bad pair %d", ErrCorruptSnapshot, len(pairs))
		}
		if len(suffix) == 0 {
			if shared != 0 {
				return Desc{}, nil, nil, fmt.Errorf("%w: bad end of pairs", ErrCorruptSnapshot)
			}
			break
		}
		value := d.bytes()
		if d.err != nil || shared > uint64(len(prev)) {
			return Desc{}, nil, nil, fmt.Errorf("%w: bad pair %d", ErrCorruptSnapshot, len(pairs))
		}
		key := make([]byte, 0, int(shared)+len(suffix))
		key = append(append(key, prev[:shared]...), suffix...)
		if prev != nil && bytes.Compare(key, prev) <= 0 {
			return Desc{}, nil, nil, fmt.Errorf("%w: key %x is not above %x", ErrCorruptSnapshot, key, prev)
		}
		for si < len(spans) && spans[si].end != nil && bytes.Compare(key, spans[si].end) >= 0 {
			si++
		}
		if si == len(spans) || bytes.Compare(key, spans[si].start) < 0 {
			return Desc{}, nil, nil, fmt.Errorf("%w: key %x is outside the spans of shard %d", ErrCorruptSnapshot, key, desc.ShardID)
		}
		if own := spans[si].owned; own != nil {
			ok, err := own(key, value)
			if err != nil {
				return Desc{}, nil, nil, fmt.Errorf("%w: key %x: %v", ErrCorruptSnapshot, key, err)
			}
			if !ok {
				return Desc{}, nil, nil, fmt.Errorf("%w: key %x is not owned by shard %d", ErrCorruptSnapshot, key, desc.ShardID)
			}
		}
		pairs = append(pairs, snapPair{key: key, value: value, span: si})
		prev = key
	}
	if len(d.b) != 0 {
		return Desc{}, nil, nil, fmt.Errorf("%w: %d bytes after the pairs", ErrCorruptSnapshot, len(d.b))
	}
	return h, pairs, spans, nil
}

// RestoreSnapshot writes into b the deletion of every key the shard owns now
// (the same selection as SnapshotData, read through r) and then every pair
// of data, so that after b commits the shard's replicated state equals the
// snapshot's. It fails without writing anything useful if data is corrupt
// or names another shard: data is checked whole before anything is written
// into b. An error while reading r may leave deletions in b; the caller
// discards b on any error.
//
// Keys of the shard's spans that other shards own are left alone: spans the
// shard owns whole (its shard-state span, the catalog of the meta shard)
// are cleared with a range deletion, the shared spans of a collection key by
// key. One key is shared for real: a latest-version pointer, when versions
// of a key of a tag collection live in two shards (the key moved to a new
// placement tag after a delete). A pointer of the snapshot does not replace
// one of another shard to a newer version.
//
// A data shard's snapshot may have another span than desc: its sender
// applied a split or merge that the log this replica would have applied
// it from no longer holds. The keys owned by either span are replaced, and
// the shard's span is the snapshot's from then on (SnapshotDesc; a span
// persisted by a split or merge comes with the shard-state span).
func RestoreSnapshot(b *pebble.Batch, r pebble.Reader, desc Desc, data []byte) error {
	h, pairs, spans, err := decodeSnapshot(desc, data)
	if err != nil {
		return fmt.Errorf("shard %d: restoring snapshot: %w", desc.ShardID, err)
	}
	// Read what the shard owns now before writing: r may be b itself. A
	// snapshot of another span (the sender applied a split or merge this
	// replica did not) replaces what the shard owns by either span.
	var del [][]byte
	owned := spans
	if !bytes.Equal(h.Start, desc.Start) || !bytes.Equal(h.End, desc.End) || (h.End == nil) != (desc.End == nil) ||
		h.BucketStart != desc.BucketStart || h.BucketEnd != desc.BucketEnd {
		owned = append(append([]snapSpan(nil), spans...), snapshotSpans(desc)...)
	}
	for _, sp := range owned {
		if sp.owned == nil {
			continue
		}
		err := eachOwned(r, sp, func(k, _ []byte) error {
			del = append(del, append([]byte(nil), k...))
			return nil
		})
		if err != nil {
			return fmt.Errorf("shard %d: restoring snapshot: reading current state: %w", desc.ShardID, err)
		}
	}
	keep := make([]bool, len(pairs))
	for i, p := range pairs {
		if spans[p.span].kind != spanLatest {
			continue
		}
		cur, ok, err := storage.GetValue(r, p.key)
		if err != nil {
			return fmt.Errorf("shard %d: restoring snapshot: %w", desc.ShardID, err)
		}
		if !ok {
			continue
		}
		ours, err := spans[p.span].owned(p.key, cur)
		if err != nil {
			return fmt.Errorf("shard %d: restoring snapshot: key %x: %w", desc.ShardID, p.key, err)
		}
		// Both values are 10 bytes (owned checked them): version, bucket.
		keep[i] = !ours && binary.BigEndian.Uint64(cur) > binary.BigEndian.Uint64(p.value)
	}
	for _, sp := range spans {
		if sp.owned == nil {
			if err := b.DeleteRange(sp.start, sp.end, nil); err != nil {
				return err
			}
		}
	}
	for _, k := range del {
		if err := b.Delete(k, nil); err != nil {
			return err
		}
	}
	for i, p := range pairs {
		if keep[i] {
			continue
		}
		if err := b.Set(p.key, p.value, nil); err != nil {
			return err
		}
	}
	return nil
}
