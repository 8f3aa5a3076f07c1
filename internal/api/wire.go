package api

import (
	"encoding/base64"
	"unicode/utf8"

	"github.com/groupkv/groupkv/internal/kv"
)

// The JSON shapes of the multi-record forms of the HTTP API, shared with the
// command-line client (cmd/groupkv), which reads and prints the same JSON.
// See http_multi.go for how bytes, tags and versions are put in JSON.

// KeyJSON is a key in an answer: key when it is valid UTF-8, else
// key_base64. Embedded in an answer's object, its fields are the object's.
type KeyJSON struct {
	Key       *string `json:"key,omitempty"`
	KeyBase64 *string `json:"key_base64,omitempty"`
}

// ToKeyJSON returns key k on the wire.
func ToKeyJSON(k []byte) KeyJSON {
	s, b64 := bytesToJSON(k)
	return KeyJSON{Key: s, KeyBase64: b64}
}

// ValueJSON is a value in an answer: value when it is valid UTF-8, else
// value_base64; neither (the zero ValueJSON) when there is no value.
type ValueJSON struct {
	Value       *string `json:"value,omitempty"`
	ValueBase64 *string `json:"value_base64,omitempty"`
}

// ToValueJSON returns value v on the wire.
func ToValueJSON(v []byte) ValueJSON {
	s, b64 := bytesToJSON(v)
	return ValueJSON{Value: s, ValueBase64: b64}
}

// bytesToJSON returns b as a string when it is valid UTF-8, else in
// standard base64.
func bytesToJSON(b []byte) (s, b64 *string) {
	if utf8.Valid(b) {
		str := string(b)
		return &str, nil
	}
	enc := base64.StdEncoding.EncodeToString(b)
	return nil, &enc
}

// TagsJSON returns tags, [] for none: an answer's tags are never null.
func TagsJSON(tags []string) []string {
	if tags == nil {
		return []string{}
	}
	return tags
}

// RecordJSON is a kv.Record: an item of the answer of a scan or a tag
// query.
type RecordJSON struct {
	KeyJSON
	ValueJSON
	Version uint64   `json:"version"`
	Tags    []string `json:"tags"`
}

// ToRecordJSON returns rec on the wire.
func ToRecordJSON(rec kv.Record) RecordJSON {
	return RecordJSON{KeyJSON: ToKeyJSON(rec.Key), ValueJSON: ToValueJSON(rec.Value), Version: rec.Version, Tags: TagsJSON(rec.Tags)}
}

// EventJSON is a kv.Event of a watch. A put has a key, a value, a version
// and tags; a delete no value and tags []; a progress event only a version.
type EventJSON struct {
	Type string `json:"type"`
	KeyJSON
	ValueJSON
	Version uint64    `json:"version"`
	Tags    *[]string `json:"tags,omitempty"`
}

// ToEventJSON returns ev on the wire.
func ToEventJSON(ev kv.Event) EventJSON {
	e := EventJSON{Type: ev.Type, Version: ev.Version}
	if ev.Type == kv.EventProgress {
		return e
	}
	e.KeyJSON = ToKeyJSON(ev.Key)
	tags := []string{}
	if ev.Type != kv.EventDelete {
		e.ValueJSON = ToValueJSON(ev.Value)
		tags = TagsJSON(ev.Tags)
	}
	e.Tags = &tags
	return e
}

// BatchGetResponseJSON is a kv.BatchGetResult: the answer of a batch get.
type BatchGetResponseJSON struct {
	Items   []BatchGetItemJSON `json:"items"`
	Version uint64             `json:"version"`
}

// BatchGetItemJSON is a kv.BatchGetItem; one that was not found has no
// value.
type BatchGetItemJSON struct {
	Collection string `json:"collection"`
	KeyJSON
	Found bool `json:"found"`
	ValueJSON
	Version uint64   `json:"version"`
	Tags    []string `json:"tags"`
}

// ToBatchGetResponseJSON returns res on the wire.
func ToBatchGetResponseJSON(res kv.BatchGetResult) BatchGetResponseJSON {
	return BatchGetResponseJSON{Items: ToBatchGetItemsJSON(res.Items), Version: res.Version}
}

// ToBatchGetItemsJSON returns items on the wire.
func ToBatchGetItemsJSON(items []kv.BatchGetItem) []BatchGetItemJSON {
	out := make([]BatchGetItemJSON, len(items))
	for i, it := range items {
		item := BatchGetItemJSON{
			Collection: it.Collection,
			KeyJSON:    ToKeyJSON(it.Key),
			Found:      it.Found,
			Version:    it.Version,
			Tags:       TagsJSON(it.Tags),
		}
		if it.Found {
			item.ValueJSON = ToValueJSON(it.Value)
		}
		out[i] = item
	}
	return out
}

// WriteResultJSON is a kv.WriteResult: a record a batch put or delete
// wrote.
type WriteResultJSON struct {
	Collection string `json:"collection"`
	KeyJSON
	Version uint64 `json:"version"`
}

// ToWriteResultsJSON returns rs on the wire, [] for none.
func ToWriteResultsJSON(rs []kv.WriteResult) []WriteResultJSON {
	out := make([]WriteResultJSON, len(rs))
	for i, res := range rs {
		out[i] = WriteResultJSON{Collection: res.Collection, KeyJSON: ToKeyJSON(res.Key), Version: res.Version}
	}
	return out
}

// BatchWriteResponseJSON is the answer of a batch put or delete that
// succeeded.
type BatchWriteResponseJSON struct {
	Items []WriteResultJSON `json:"items"`
}

// KeyRefJSON is a key of a batch get or delete request: key, or key_base64
// for a key that is not UTF-8 (see BytesFromJSON).
type KeyRefJSON struct {
	Collection string  `json:"collection"`
	Key        *string `json:"key"`
	KeyBase64  *string `json:"key_base64"`
}

// PutItemJSON is an item of a batch put request: key or key_base64, and
// value or value_base64 (see BytesFromJSON).
type PutItemJSON struct {
	Collection  string   `json:"collection"`
	Key         *string  `json:"key"`
	KeyBase64   *string  `json:"key_base64"`
	Value       *string  `json:"value"`
	ValueBase64 *string  `json:"value_base64"`
	Tags        []string `json:"tags"`
	IfVersion   *uint64  `json:"if_version"`
}

// BytesFromJSON returns the bytes of request field name given as a string
// (s, field name) or in standard base64 (b64, field name_base64); given is
// false when neither is. Giving both is an error. Its errors are *kv.Error
// with code invalid_argument.
func BytesFromJSON(name string, s, b64 *string) (b []byte, given bool, err error) {
	switch {
	case s != nil && b64 != nil:
		return nil, false, kv.Errorf(kv.CodeInvalidArgument, "give %s or %s_base64, not both", name, name)
	case s != nil:
		return []byte(*s), true, nil
	case b64 != nil:
		b, err := base64.StdEncoding.DecodeString(*b64)
		if err != nil {
			return nil, false, kv.Errorf(kv.CodeInvalidArgument, "%s_base64 is not standard base64: %v", name, err)
		}
		return b, true, nil
	}
	return nil, false, nil
}
