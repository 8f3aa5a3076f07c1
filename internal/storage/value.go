package storage

import (
	"encoding/binary"
	"errors"
	"unicode/utf8"
)

// ErrCorruptValue reports a stored value that does not decode.
var ErrCorruptValue = errors.New("storage: corrupt value")

// valueFlagTombstone marks a version that deletes its key.
const valueFlagTombstone byte = 1

// MVCCValue is the content of one version of a record.
type MVCCValue struct {
	Tombstone bool
	// Bucket is the hash bucket of the record (0 in range collections); it
	// tells which shard of a hash or tag collection the version belongs to.
	Bucket uint16
	Tags   []string
	Value  []byte
}

// EncodeValue appends the encoding of v to dst:
//
//	flags(1) | bucket(2) | uvarint(len(tags)) | { uvarint(len(tag)) tag }* | value
func EncodeValue(dst []byte, v MVCCValue) []byte {
	var flags byte
	if v.Tombstone {
		flags |= valueFlagTombstone
	}
	dst = append(dst, flags)
	dst = binary.BigEndian.AppendUint16(dst, v.Bucket)
	dst = binary.AppendUvarint(dst, uint64(len(v.Tags)))
	for _, t := range v.Tags {
		dst = binary.AppendUvarint(dst, uint64(len(t)))
		dst = append(dst, t...)
	}
	return append(dst, v.Value...)
}

// DecodeValue decodes a value written by EncodeValue. The returned Value
// aliases b; tags are copied.
func DecodeValue(b []byte) (MVCCValue, error) {
	var v MVCCValue
	if len(b) < 4 || b[0]&^valueFlagTombstone != 0 {
		return v, ErrCorruptValue
	}
	v.Tombstone = b[0]&valueFlagTombstone != 0
	v.Bucket = binary.BigEndian.Uint16(b[1:3])
	b = b[3:]
	n, k := binary.Uvarint(b)
	if k <= 0 || n > 1<<16 || k > 1 && b[k-1] == 0 {
		return v, ErrCorruptValue
	}
	b = b[k:]
	if n > 0 {
		v.Tags = make([]string, 0, n)
	}
	for i := uint64(0); i < n; i++ {
		l, k := binary.Uvarint(b)
		if k <= 0 || l > uint64(len(b)-k) || k > 1 && b[k-1] == 0 {
			return v, ErrCorruptValue
		}
		t := b[k : k+int(l)]
		if !utf8.Valid(t) {
			return v, ErrCorruptValue
		}
		v.Tags = append(v.Tags, string(t))
		b = b[k+int(l):]
	}
	if v.Tombstone && len(b) != 0 {
		return v, ErrCorruptValue
	}
	v.Value = b
	return v, nil
}

// IsTombstone reports whether an encoded value is a tombstone, without
// decoding it.
func IsTombstone(b []byte) bool { return len(b) > 0 && b[0]&valueFlagTombstone != 0 }

// ValueBucket returns the bucket of an encoded value without decoding it.
func ValueBucket(b []byte) (uint16, error) {
	if len(b) < 4 {
		return 0, ErrCorruptValue
	}
	return binary.BigEndian.Uint16(b[1:3]), nil
}

// latestHeader is the length of a latest pointer's version and bucket.
const latestHeader = 10

// EncodeLatest appends a latest-version pointer to dst: the newest
// version's number and bucket, then its value as EncodeValue encoded it.
//
//	version(8) | bucket(2) | encoded value
func EncodeLatest(dst []byte, version uint64, bucket uint16, encoded []byte) []byte {
	dst = binary.BigEndian.AppendUint64(dst, version)
	dst = binary.BigEndian.AppendUint16(dst, bucket)
	return append(dst, encoded...)
}

// DecodeLatest decodes a latest-version pointer. encoded, which aliases b,
// is the newest version's encoded value, or nil for a pointer of format 2,
// which holds no value.
func DecodeLatest(b []byte) (version uint64, bucket uint16, encoded []byte, err error) {
	if len(b) < latestHeader || len(b) > latestHeader && len(b) < latestHeader+4 {
		return 0, 0, nil, ErrCorruptValue
	}
	version = binary.BigEndian.Uint64(b)
	bucket = binary.BigEndian.Uint16(b[8:])
	if len(b) > latestHeader {
		encoded = b[latestHeader:]
	}
	return version, bucket, encoded, nil
}
