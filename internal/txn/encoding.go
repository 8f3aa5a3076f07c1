package txn

import (
	"encoding/binary"
	"errors"
)

// ErrCorrupt reports an encoded meta or intent that does not decode.
var ErrCorrupt = errors.New("txn: corrupt encoding")

// AppendMeta appends the encoding of m to b.
func AppendMeta(b []byte, m *Meta) []byte {
	b = appendBytes(b, []byte(m.ID))
	b = binary.BigEndian.AppendUint64(b, m.Priority)
	b = binary.BigEndian.AppendUint32(b, m.Attempt)
	b = binary.BigEndian.AppendUint64(b, m.Start)
	b = binary.BigEndian.AppendUint32(b, m.Anchor.Collection)
	b = binary.BigEndian.AppendUint16(b, m.Anchor.Bucket)
	return appendBytes(b, m.Anchor.Key)
}

// DecodeMeta decodes a meta from the front of b and returns the rest.
func DecodeMeta(b []byte) (Meta, []byte, error) {
	var m Meta
	id, b, err := readBytes(b)
	if err != nil || len(b) < 8+4+8+4+2 {
		return m, nil, ErrCorrupt
	}
	m.ID = string(id)
	m.Priority = binary.BigEndian.Uint64(b)
	m.Attempt = binary.BigEndian.Uint32(b[8:])
	m.Start = binary.BigEndian.Uint64(b[12:])
	m.Anchor.Collection = binary.BigEndian.Uint32(b[20:])
	m.Anchor.Bucket = binary.BigEndian.Uint16(b[24:])
	key, b, err := readBytes(b[26:])
	if err != nil {
		return m, nil, ErrCorrupt
	}
	m.Anchor.Key = append([]byte{}, key...)
	if len(id) == 0 {
		m.ID = ""
	}
	return m, b, nil
}

// Intent is the durable write of a prepared transaction to one key.
type Intent struct {
	// Bucket is the key's bucket (ownership, like a data version's).
	Bucket uint16
	Meta   Meta
	// PrepareVersion is the version of the prepare that wrote it; the
	// transaction commits at or above it.
	PrepareVersion uint64
	Delete         bool
	Tags           []string
	Value          []byte
}

// EncodeIntent encodes an intent; its first two bytes are the bucket.
func EncodeIntent(in *Intent) []byte {
	b := make([]byte, 0, 64+len(in.Value))
	b = binary.BigEndian.AppendUint16(b, in.Bucket)
	b = binary.BigEndian.AppendUint64(b, in.PrepareVersion)
	if in.Delete {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	b = AppendMeta(b, &in.Meta)
	b = binary.AppendUvarint(b, uint64(len(in.Tags)))
	for _, t := range in.Tags {
		b = appendBytes(b, []byte(t))
	}
	return appendBytes(b, in.Value)
}

// DecodeIntent decodes an intent. Its slices are copies.
func DecodeIntent(b []byte) (Intent, error) {
	var in Intent
	if len(b) < 11 || b[10] > 1 {
		return in, ErrCorrupt
	}
	in.Bucket = binary.BigEndian.Uint16(b)
	in.PrepareVersion = binary.BigEndian.Uint64(b[2:])
	in.Delete = b[10] == 1
	m, rest, err := DecodeMeta(b[11:])
	if err != nil {
		return in, err
	}
	in.Meta = m
	n, k := binary.Uvarint(rest)
	if k <= 0 || n > uint64(len(rest)) {
		return in, ErrCorrupt
	}
	rest = rest[k:]
	for range n {
		var t []byte
		if t, rest, err = readBytes(rest); err != nil {
			return in, err
		}
		in.Tags = append(in.Tags, string(t))
	}
	v, rest, err := readBytes(rest)
	if err != nil || len(rest) != 0 {
		return in, ErrCorrupt
	}
	in.Value = append([]byte{}, v...)
	return in, nil
}

func appendBytes(b, p []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(p)))
	return append(b, p...)
}

func readBytes(b []byte) ([]byte, []byte, error) {
	n, k := binary.Uvarint(b)
	if k <= 0 || k > 1 && b[k-1] == 0 || n > uint64(len(b)-k) {
		// Only the minimal encoding is valid: one value, one encoding.
		return nil, nil, ErrCorrupt
	}
	return b[k : k+int(n)], b[k+int(n):], nil
}
