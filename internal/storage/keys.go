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
	k := binary.BigEndian.AppendUint64([]byte{prefixShard}, shard)
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

// DataPrefix is the prefix of every data key of a collection's bucket.
func DataPrefix(collection uint32, bucket uint16) []byte {
	k := make([]byte, 0, 7)
	k = append(k, prefixData)
	k = binary.BigEndian.AppendUint32(k, collection)
	return binary.BigEndian.AppendUint16(k, bucket)
}

// CollectionSpan is the span of all data keys of a collection.
func CollectionSpan(collection uint32) (start, end []byte) {
	start = binary.BigEndian.AppendUint32([]byte{prefixData}, collection)
	return start, prefixEnd(start)
}

// BucketSpan is the span of data keys of buckets [lo, hi) of a collection;
// hi may be 65536.
func BucketSpan(collection uint32, lo, hi uint32) (start, end []byte) {
	start = DataPrefix(collection, uint16(lo))
	if hi >= 1<<16 {
		_, end = CollectionSpan(collection)
		return start, end
	}
	return start, DataPrefix(collection, uint16(hi))
}

// DataKeyPrefix returns the prefix shared by every version of userKey:
// prefix(collection, bucket) + escaped key + terminator. It appends to dst.
func DataKeyPrefix(dst []byte, collection uint32, bucket uint16, userKey []byte) []byte {
	dst = append(dst, prefixData)
	dst = binary.BigEndian.AppendUint32(dst, collection)
	dst = binary.BigEndian.AppendUint16(dst, bucket)
	return EscapeKey(dst, userKey)
}

// DataKey returns the key of one version of a record. Versions sort
// descending: the newest version of a key comes first.
func DataKey(dst []byte, collection uint32, bucket uint16, userKey []byte, version uint64) []byte {
	dst = DataKeyPrefix(dst, collection, bucket, userKey)
	return binary.BigEndian.AppendUint64(dst, ^version)
}

// DataKeyStart returns the smallest data key of userKey and all keys above
// it in the bucket: seeking here finds userKey's newest version or the next key.
func DataKeyStart(collection uint32, bucket uint16, userKey []byte) []byte {
	return DataKeyPrefix(nil, collection, bucket, userKey)
}

// DecodedDataKey is a data key split into its parts. UserKey aliases the
// decoded buffer only when it needed no unescaping.
type DecodedDataKey struct {
	Collection uint32
	Bucket     uint16
	UserKey    []byte
	Version    uint64
}

// DecodeDataKey splits a data key. It returns ErrCorruptKey for anything
// DataKey could not have produced.
func DecodeDataKey(k []byte) (DecodedDataKey, error) {
	var d DecodedDataKey
	if len(k) < 7+2+8 || k[0] != prefixData {
		return d, ErrCorruptKey
	}
	d.Collection = binary.BigEndian.Uint32(k[1:5])
	d.Bucket = binary.BigEndian.Uint16(k[5:7])
	uk, rest, err := UnescapeKey(k[7:])
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
func prefixEnd(p []byte) []byte {
	end := append([]byte(nil), p...)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] != 0xFF {
			end[i]++
			return end[:i+1]
		}
	}
	return nil // p is all 0xFF: no upper bound
}
