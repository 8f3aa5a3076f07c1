package api

import (
	"errors"
	"fmt"
	"slices"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/groupkv/groupkv/internal/kv"
)

// Field numbers of the messages appendScanAnswer encodes (proto/groupkv.proto).
const (
	fieldPipelineResponseScan = 7 // PipelineResponse.scan

	fieldScanItems    = 1 // ScanResponse.items
	fieldScanNextPage = 2 // ScanResponse.next_page
	fieldScanVersion  = 3 // ScanResponse.version
	fieldScanTxn      = 4 // ScanResponse.txn (not in kv.ScanResult)

	fieldRecordKey     = 1 // Record.key
	fieldRecordValue   = 2 // Record.value
	fieldRecordTags    = 3 // Record.tags
	fieldRecordVersion = 4 // Record.version
)

// appendScanAnswer appends to b the field PipelineResponse.scan holding r,
// encoded as proto.Marshal encodes ScanResultToPB(r) there. A Pipeline
// answer carries it as an unknown field of its PipelineResponse (set with
// SetUnknown), which a client decodes as the scan: the records go from
// the scan's copies straight into the wire bytes, without a message each
// and the reflection that marshals them (about a tenth of the server's CPU
// under scans).
func appendScanAnswer(b []byte, r kv.ScanResult) []byte {
	size := scanTailSize(r.NextPage, r.Version)
	for i := range r.Items {
		n := recordSize(&r.Items[i])
		size += protowire.SizeTag(fieldScanItems) + protowire.SizeBytes(n)
	}
	b = slices.Grow(b, protowire.SizeTag(fieldPipelineResponseScan)+protowire.SizeBytes(size))
	b = protowire.AppendTag(b, fieldPipelineResponseScan, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(size))
	for i := range r.Items {
		b = appendScanItem(b, &r.Items[i])
	}
	return appendScanTail(b, r.NextPage, r.Version)
}

// appendScanItem appends rec as an item (field 1) of a ScanResponse.
func appendScanItem(b []byte, rec *kv.Record) []byte {
	b = protowire.AppendTag(b, fieldScanItems, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(recordSize(rec)))
	if len(rec.Key) > 0 {
		b = protowire.AppendTag(b, fieldRecordKey, protowire.BytesType)
		b = protowire.AppendBytes(b, rec.Key)
	}
	if len(rec.Value) > 0 {
		b = protowire.AppendTag(b, fieldRecordValue, protowire.BytesType)
		b = protowire.AppendBytes(b, rec.Value)
	}
	for _, t := range rec.Tags {
		b = protowire.AppendTag(b, fieldRecordTags, protowire.BytesType)
		b = protowire.AppendString(b, t)
	}
	if rec.Version != 0 {
		b = protowire.AppendTag(b, fieldRecordVersion, protowire.VarintType)
		b = protowire.AppendVarint(b, rec.Version)
	}
	return b
}

// appendScanTail appends the fields of a ScanResponse that follow its
// items.
func appendScanTail(b []byte, nextPage string, version uint64) []byte {
	if nextPage != "" {
		b = protowire.AppendTag(b, fieldScanNextPage, protowire.BytesType)
		b = protowire.AppendString(b, nextPage)
	}
	if version != 0 {
		b = protowire.AppendTag(b, fieldScanVersion, protowire.VarintType)
		b = protowire.AppendVarint(b, version)
	}
	return b
}

func scanTailSize(nextPage string, version uint64) int {
	size := 0
	if nextPage != "" {
		size += protowire.SizeTag(fieldScanNextPage) + protowire.SizeBytes(len(nextPage))
	}
	if version != 0 {
		size += protowire.SizeTag(fieldScanVersion) + protowire.SizeVarint(version)
	}
	return size
}

// scanBytes builds the answer of a scan as PipelineResponse.scan_bytes
// carries it, the bytes proto.Marshal makes of ScanResultToPB(r), from the
// records as the scan produces them: add copies each record straight
// from storage's buffers into the encoding, with no copy of its own and
// no message.
type scanBytes struct {
	b []byte
	// limit is the most records the answer holds (0: unknown).
	limit int
}

// add appends rec, whose slices need not outlive the call.
func (e *scanBytes) add(rec *kv.Record) {
	if e.b == nil && e.limit > 0 {
		// Room for as many records as the first, up to a Go client's
		// longest page on the stream: one allocation for most answers,
		// where growing by appending copied each one several times.
		// The buffer comes from the codec's pool, and goes back to it once
		// the answer is sent (releaseScanBytes).
		n := protowire.SizeTag(fieldScanItems) + protowire.SizeBytes(recordSize(rec))
		e.b = (*codecPool.Get(min(e.limit, PipelineMaxScan)*n + scanTailRoom))[:0]
	}
	e.b = appendScanItem(e.b, rec)
}

// releaseScanBytes gives the buffer of a scan's answer that scanBytes
// wrote back to the codec's pool, once nothing reads it any more (a gRPC
// send has marshaled the message holding it). A buffer that outgrew the
// pool's, or did not come from it, is left to the garbage collector.
func releaseScanBytes(b []byte) {
	b = b[:0]
	codecPool.Put(&b)
}

// scanTailRoom is room for the fields after the items: a next page (a
// version and a key, in base64) and a version.
const scanTailRoom = 64

// finish appends the fields after the items, from the scan's result r
// (whose Items are not read), and returns the encoding.
func (e *scanBytes) finish(r kv.ScanResult) []byte {
	return appendScanTail(e.b, r.NextPage, r.Version)
}

// DecodeScanBytes decodes a ScanResponse from its encoding b (as
// PipelineResponse.scan_bytes carries it) as ScanResultFromPB would
// convert it: the records' keys and values are slices of b, which the
// result keeps alive, and Items is one allocation for every record.
// Fields it does not know are skipped; malformed bytes are an error.
func DecodeScanBytes(b []byte) (kv.ScanResult, error) {
	var r kv.ScanResult
	n := 0
	for rest := b; len(rest) > 0; {
		num, typ, m, err := consumeTag(rest)
		if err != nil {
			return kv.ScanResult{}, scanBytesError(err)
		}
		rest = rest[m:]
		if num == fieldScanItems && typ == protowire.BytesType {
			n++
		}
		m = protowire.ConsumeFieldValue(num, typ, rest)
		if m < 0 {
			return kv.ScanResult{}, scanBytesError(protowire.ParseError(m))
		}
		rest = rest[m:]
	}
	r.Items = make([]kv.Record, 0, n)
	for len(b) > 0 {
		num, typ, m, _ := consumeTag(b) // checked above
		b = b[m:]
		switch {
		case num == fieldScanItems && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			b = b[m:]
			rec, err := decodeRecord(v)
			if err != nil {
				return kv.ScanResult{}, err
			}
			r.Items = append(r.Items, rec)
		case num == fieldScanNextPage && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			b = b[m:]
			if !utf8.Valid(v) {
				return kv.ScanResult{}, scanBytesError(errors.New("the next page is not valid UTF-8"))
			}
			r.NextPage = string(v)
		case num == fieldScanVersion && typ == protowire.VarintType:
			v, m := protowire.ConsumeVarint(b)
			b = b[m:]
			r.Version = v
		case num == fieldScanTxn && typ == protowire.BytesType:
			// Not kept, but a string: checked as protobuf checks it.
			v, m := protowire.ConsumeBytes(b)
			b = b[m:]
			if !utf8.Valid(v) {
				return kv.ScanResult{}, scanBytesError(errors.New("the transaction id is not valid UTF-8"))
			}
		default:
			b = b[protowire.ConsumeFieldValue(num, typ, b):]
		}
	}
	return r, nil
}

func decodeRecord(b []byte) (kv.Record, error) {
	var rec kv.Record
	for len(b) > 0 {
		num, typ, m, err := consumeTag(b)
		if err != nil {
			return kv.Record{}, scanBytesError(err)
		}
		b = b[m:]
		switch {
		case (num == fieldRecordKey || num == fieldRecordValue || num == fieldRecordTags) && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return kv.Record{}, scanBytesError(protowire.ParseError(m))
			}
			b = b[m:]
			if len(v) == 0 {
				v = nil // as protobuf decodes an empty bytes field
			}
			switch num {
			case fieldRecordKey:
				rec.Key = v[:len(v):len(v)]
			case fieldRecordValue:
				rec.Value = v[:len(v):len(v)]
			default:
				if !utf8.Valid(v) {
					return kv.Record{}, scanBytesError(errors.New("a tag is not valid UTF-8"))
				}
				rec.Tags = append(rec.Tags, string(v))
			}
		case num == fieldRecordVersion && typ == protowire.VarintType:
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return kv.Record{}, scanBytesError(protowire.ParseError(m))
			}
			b = b[m:]
			rec.Version = v
		default:
			m := protowire.ConsumeFieldValue(num, typ, b)
			if m < 0 {
				return kv.Record{}, scanBytesError(protowire.ParseError(m))
			}
			b = b[m:]
		}
	}
	return rec, nil
}

// consumeTag is protowire.ConsumeTag refusing, as protobuf's decoder of
// a message does, a field number past protowire.MaxValidNumber (which
// ConsumeTag allows, for MessageSets). err is the reason of a negative m.
func consumeTag(b []byte) (num protowire.Number, typ protowire.Type, m int, err error) {
	num, typ, m = protowire.ConsumeTag(b)
	switch {
	case m < 0:
		return 0, 0, m, protowire.ParseError(m)
	case num > protowire.MaxValidNumber:
		return 0, 0, -1, fmt.Errorf("field number %d is past the largest, %d", num, protowire.MaxValidNumber)
	}
	return num, typ, m, nil
}

func scanBytesError(err error) error {
	return kv.Errorf(kv.CodeInternal, "malformed scan answer: %v", err)
}

// recordSize is the encoded size of a Record message of rec.
func recordSize(rec *kv.Record) int {
	n := 0
	if len(rec.Key) > 0 {
		n += protowire.SizeTag(fieldRecordKey) + protowire.SizeBytes(len(rec.Key))
	}
	if len(rec.Value) > 0 {
		n += protowire.SizeTag(fieldRecordValue) + protowire.SizeBytes(len(rec.Value))
	}
	for _, t := range rec.Tags {
		n += protowire.SizeTag(fieldRecordTags) + protowire.SizeBytes(len(t))
	}
	if rec.Version != 0 {
		n += protowire.SizeTag(fieldRecordVersion) + protowire.SizeVarint(rec.Version)
	}
	return n
}
