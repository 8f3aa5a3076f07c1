package storage

import (
	"encoding/binary"
	"errors"
)

// Key space prefixes. See the package documentation.
const (
	prefixNode    byte = 0x01
	prefixRaft    byte = 0x02
	prefixShard   byte = 0x03
	prefixCatalog byte = 0x04
	prefixData    byte = 0x05
	// prefixTagIndex: collection, escaped tag, escaped key, ^version ->
	// tagEntry (whether the key carries the tag as of that version).
	prefixTagIndex byte = 0x06
	// prefixChange: collection, version, escaped key -> bucket; the change
	// log that watch reads in version order.
	prefixChange byte = 0x07
	// prefixPlacement: collection, escaped key -> placement tag (tag
	// collections only), kept by the key's home shard.
	prefixPlacement byte = 0x08
	// prefixLatest: collection, escaped key -> version(8) bucket(2) of the
	// key's newest version, followed by that version's encoded value
	// (EncodeLatest), so a read of the latest version is one point lookup
	// instead of an iterator. (A pointer written by format 2 holds the
	// version and bucket only; its value is read from the data key.)
	prefixLatest byte = 0x09
	// prefixIntent: collection, escaped key -> the write intent of a
	// prepared transaction (internal/shard/txn.go).
	prefixIntent byte = 0x0a
	// prefixTxnRecord: collection, escaped anchor key, transaction id ->
	// the transaction's record (internal/txn.Record).
	prefixTxnRecord byte = 0x0b
)

// Raft key kinds, after prefixRaft and the shard id.
const (
	raftHardState byte = 'h'
	raftTruncated byte = 't'
	raftLog       byte = 'l'
)

// ErrCorruptKey reports a key that does not decode.
var ErrCorruptKey = errors.New("storage: corrupt key")

// NodeKey returns the key of node-local metadata item name.
func NodeKey(name string) []byte {
	return append([]byte{prefixNode}, name...)
}

// NodeSpan returns the span of node-local metadata items starting with prefix.
func NodeSpan(prefix string) (start, end []byte) {
	start = NodeKey(prefix)
	return start, prefixEnd(start)
}

func raftPrefix(shard uint64, kind byte) []byte {
	k := make([]byte, 0, 18)
	k = append(k, prefixRaft)
	k = binary.BigEndian.AppendUint64(k, shard)
	return append(k, kind)
}

// RaftHardStateKey is the key of a shard's raft HardState.
func RaftHardStateKey(shard uint64) []byte { return raftPrefix(shard, raftHardState) }

// RaftTruncatedKey is the key of a shard's truncated state: the index and
// term of the last entry removed from the log (the log's snapshot point),
// with the configuration in force there.
func RaftTruncatedKey(shard uint64) []byte { return raftPrefix(shard, raftTruncated) }

// RaftLogKey is the key of a shard's raft log entry at index.
func RaftLogKey(shard, index uint64) []byte {
	return binary.BigEndian.AppendUint64(raftPrefix(shard, raftLog), index)
}

// RaftLogSpan is the span of a shard's raft log entries in [lo, hi).
func RaftLogSpan(shard, lo, hi uint64) (start, end []byte) {
	return RaftLogKey(shard, lo), RaftLogKey(shard, hi)
}

// RaftSpan is the span of all raft keys of a shard.
func RaftSpan(shard uint64) (start, end []byte) {
	start = binary.BigEndian.AppendUint64([]byte{prefixRaft}, shard)
	return start, prefixEnd(start)
}

// ShardStateKey is the key of replicated shard state item name.
func ShardStateKey(shard uint64, name string) []byte {
	k := make([]byte, 0, 9+len(name))
	k = append(k, prefixShard)
	k = binary.BigEndian.AppendUint64(k, shard)
	return append(k, name...)
}

// ShardStateSpan is the span of all replicated state items of a shard.
func ShardStateSpan(shard uint64) (start, end []byte) {
	start = binary.BigEndian.AppendUint64([]byte{prefixShard}, shard)
	return start, prefixEnd(start)
}

// CatalogKey is the key of catalog item name (meta shard only).
func CatalogKey(name string) []byte {
	return append([]byte{prefixCatalog}, name...)
}

// CatalogSpan is the span of catalog items starting with prefix.
func CatalogSpan(prefix string) (start, end []byte) {
	start = CatalogKey(prefix)
	return start, prefixEnd(start)
}

// CollectionSpan is the span of all data keys of a collection.
func CollectionSpan(collection uint32) (start, end []byte) {
	start = binary.BigEndian.AppendUint32([]byte{prefixData}, collection)
	return start, prefixEnd(start)
}

// DataKeyPrefix appends to dst the prefix shared by every version of
// userKey: prefix, collection, escaped key.
func DataKeyPrefix(dst []byte, collection uint32, userKey []byte) []byte {
	dst = append(dst, prefixData)
	dst = binary.BigEndian.AppendUint32(dst, collection)
	return EscapeKey(dst, userKey)
}

// DataKey appends to dst the key of one version of a record. Versions sort
// descending: the newest version of a key comes first.
func DataKey(dst []byte, collection uint32, userKey []byte, version uint64) []byte {
	dst = DataKeyPrefix(dst, collection, userKey)
	return binary.BigEndian.AppendUint64(dst, ^version)
}

// DataKeyStart returns the smallest data key of userKey and of all keys
// above it: seeking here finds userKey's newest version or the next key.
func DataKeyStart(collection uint32, userKey []byte) []byte {
	return DataKeyPrefix(nil, collection, userKey)
}

// DecodedDataKey is a data key split into its parts.
type DecodedDataKey struct {
	Collection uint32
	UserKey    []byte
	Version    uint64
}

// DecodeDataKey splits a data key. It returns ErrCorruptKey for anything
// DataKey could not have produced. UserKey aliases k when it needed no
// unescaping.
func DecodeDataKey(k []byte) (DecodedDataKey, error) {
	var d DecodedDataKey
	if len(k) < 5+2+8 || k[0] != prefixData {
		return d, ErrCorruptKey
	}
	d.Collection = binary.BigEndian.Uint32(k[1:5])
	uk, rest, err := UnescapeKey(k[5:])
	if err != nil {
		return d, err
	}
	if len(rest) != 8 {
		return d, ErrCorruptKey
	}
	d.UserKey = uk
	d.Version = ^binary.BigEndian.Uint64(rest)
	return d, nil
}

// TagIndexPrefix appends to dst the prefix of the tag index entries of tag.
func TagIndexPrefix(dst []byte, collection uint32, tag string) []byte {
	dst = append(dst, prefixTagIndex)
	dst = binary.BigEndian.AppendUint32(dst, collection)
	return EscapeKey(dst, []byte(tag))
}

// TagIndexKey appends to dst the key of the tag index entry saying whether
// userKey carries tag as of version. Versions sort descending.
func TagIndexKey(dst []byte, collection uint32, tag string, userKey []byte, version uint64) []byte {
	dst = TagIndexPrefix(dst, collection, tag)
	dst = EscapeKey(dst, userKey)
	return binary.BigEndian.AppendUint64(dst, ^version)
}

// TagIndexSpan is the span of every tag index entry of a collection.
func TagIndexSpan(collection uint32) (start, end []byte) {
	start = binary.BigEndian.AppendUint32([]byte{prefixTagIndex}, collection)
	return start, prefixEnd(start)
}

// DecodeTagIndexKey splits a tag index key.
func DecodeTagIndexKey(k []byte) (collection uint32, tag string, userKey []byte, version uint64, err error) {
	if len(k) < 5+2+2+8 || k[0] != prefixTagIndex {
		return 0, "", nil, 0, ErrCorruptKey
	}
	collection = binary.BigEndian.Uint32(k[1:5])
	t, rest, err := UnescapeKey(k[5:])
	if err != nil {
		return 0, "", nil, 0, err
	}
	userKey, rest, err = UnescapeKey(rest)
	if err != nil {
		return 0, "", nil, 0, err
	}
	if len(rest) != 8 {
		return 0, "", nil, 0, ErrCorruptKey
	}
	return collection, string(t), userKey, ^binary.BigEndian.Uint64(rest), nil
}

// ChangeKey appends to dst the key of a change log entry: userKey changed at
// version. Change log entries sort by (version, key), ascending.
func ChangeKey(dst []byte, collection uint32, version uint64, userKey []byte) []byte {
	dst = append(dst, prefixChange)
	dst = binary.BigEndian.AppendUint32(dst, collection)
	dst = binary.BigEndian.AppendUint64(dst, version)
	return EscapeKey(dst, userKey)
}

// ChangeSpan is the span of a collection's change log entries with versions
// in [from, to]; to may be ^uint64(0).
func ChangeSpan(collection uint32, from, to uint64) (start, end []byte) {
	start = binary.BigEndian.AppendUint32([]byte{prefixChange}, collection)
	start = binary.BigEndian.AppendUint64(start, from)
	if to == ^uint64(0) {
		return start, prefixEnd(binary.BigEndian.AppendUint32([]byte{prefixChange}, collection))
	}
	end = binary.BigEndian.AppendUint32([]byte{prefixChange}, collection)
	end = binary.BigEndian.AppendUint64(end, to+1)
	return start, end
}

// ChangeSpanAll is the span of all of a collection's change log entries.
func ChangeSpanAll(collection uint32) (start, end []byte) {
	return ChangeSpan(collection, 0, ^uint64(0))
}

// DecodeChangeKey splits a change log key.
func DecodeChangeKey(k []byte) (collection uint32, version uint64, userKey []byte, err error) {
	if len(k) < 1+4+8+2 || k[0] != prefixChange {
		return 0, 0, nil, ErrCorruptKey
	}
	collection = binary.BigEndian.Uint32(k[1:5])
	version = binary.BigEndian.Uint64(k[5:13])
	userKey, rest, err := UnescapeKey(k[13:])
	if err != nil || len(rest) != 0 {
		return 0, 0, nil, ErrCorruptKey
	}
	return collection, version, userKey, nil
}

// PlacementKey is the key of a tag collection's placement index entry of
// userKey: the placement tag the key was first put with.
func PlacementKey(collection uint32, userKey []byte) []byte {
	k := binary.BigEndian.AppendUint32([]byte{prefixPlacement}, collection)
	return EscapeKey(k, userKey)
}

// LatestKey is the key of the pointer to the newest version of userKey.
func LatestKey(dst []byte, collection uint32, userKey []byte) []byte {
	dst = append(dst, prefixLatest)
	dst = binary.BigEndian.AppendUint32(dst, collection)
	return EscapeKey(dst, userKey)
}

// DecodeLatestKey returns the user key of a latest-version pointer's key.
// It returns ErrCorruptKey for anything LatestKey could not have produced.
// The key aliases k when it needed no unescaping.
func DecodeLatestKey(k []byte) ([]byte, error) {
	if len(k) < 5+2 || k[0] != prefixLatest {
		return nil, ErrCorruptKey
	}
	uk, rest, err := UnescapeKey(k[5:])
	if err != nil {
		return nil, err
	}
	if len(rest) != 0 {
		return nil, ErrCorruptKey
	}
	return uk, nil
}

// LatestSpan is the span of a collection's latest-version pointers.
func LatestSpan(collection uint32) (start, end []byte) {
	start = binary.BigEndian.AppendUint32([]byte{prefixLatest}, collection)
	return start, prefixEnd(start)
}

// PlacementSpan is the span of a collection's placement index.
func PlacementSpan(collection uint32) (start, end []byte) {
	start = binary.BigEndian.AppendUint32([]byte{prefixPlacement}, collection)
	return start, prefixEnd(start)
}

// PrefixEnd returns the smallest key above every key with prefix p (nil
// when there is none).
func PrefixEnd(p []byte) []byte { return prefixEnd(p) }

// Key escaping keeps the order of user keys and lets a key be followed by
// more bytes: 0x00 becomes 0x00 0xFF and the key ends with 0x00 0x01.
const (
	escByte    = 0x00
	escEscaped = 0xFF
	escTerm    = 0x01
)

// EscapeKey appends the escaped form of key to dst.
func EscapeKey(dst, key []byte) []byte {
	for _, b := range key {
		if b == escByte {
			dst = append(dst, escByte, escEscaped)
		} else {
			dst = append(dst, b)
		}
	}
	return append(dst, escByte, escTerm)
}

// UnescapeKey decodes an escaped key at the start of b and returns it and the
// bytes after it.
func UnescapeKey(b []byte) (key, rest []byte, err error) {
	for i := 0; i < len(b); i++ {
		if b[i] != escByte {
			continue
		}
		if i+1 >= len(b) {
			return nil, nil, ErrCorruptKey
		}
		switch b[i+1] {
		case escTerm:
			if key == nil {
				return b[:i:i], b[i+2:], nil
			}
			return append(key, b[:i]...), b[i+2:], nil
		case escEscaped:
			if key == nil {
				key = make([]byte, 0, len(b))
			}
			key = append(key, b[:i]...)
			key = append(key, escByte)
			b = b[i+2:]
			i = -1
		default:
			return nil, nil, ErrCorruptKey
		}
	}
	return nil, nil, ErrCorruptKey
}

// prefixEnd returns the smallest key above every key with prefix p.
func prefixEnd(p []byte) []byte { return AppendPrefixEnd(nil, p) }

// AppendPrefixEnd appends to dst the smallest key above every key that
// starts with p, and answers dst unchanged when there is none (p is all
// 0xFF).
func AppendPrefixEnd(dst, p []byte) []byte {
	end := append(dst, p...)
	for i := len(end) - 1; i >= len(dst); i-- {
		if end[i] != 0xFF {
			end[i]++
			return end[:i+1]
		}
	}
	return dst[:len(dst):len(dst)]
}

// IntentKey is the key of the write intent on userKey.
func IntentKey(dst []byte, collection uint32, userKey []byte) []byte {
	dst = append(dst, prefixIntent)
	dst = binary.BigEndian.AppendUint32(dst, collection)
	return EscapeKey(dst, userKey)
}

// IntentSpan is the span of a collection's intents.
func IntentSpan(collection uint32) (start, end []byte) {
	start = binary.BigEndian.AppendUint32([]byte{prefixIntent}, collection)
	return start, prefixEnd(start)
}

// TxnRecordKey is the key of the record of transaction id anchored at
// userKey.
func TxnRecordKey(collection uint32, userKey []byte, id string) []byte {
	dst := binary.BigEndian.AppendUint32([]byte{prefixTxnRecord}, collection)
	dst = EscapeKey(dst, userKey)
	return append(dst, id...)
}

// TxnRecordSpan is the span of the records anchored in a collection.
func TxnRecordSpan(collection uint32) (start, end []byte) {
	start = binary.BigEndian.AppendUint32([]byte{prefixTxnRecord}, collection)
	return start, prefixEnd(start)
}
