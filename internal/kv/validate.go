package kv

import (
	"bytes"
	"unicode"
	"unicode/utf8"
)

// Limits of records. A value limit is configurable per node (Limits); the
// others are fixed by the data model.
const (
	MaxKeySize          = 4 << 10 // 4 KiB
	MaxTagSize          = 256
	MaxTags             = 64
	DefaultMaxValueSize = 1 << 20 // 1 MiB
	MaxGroupIDSize      = 256
)

// ValidateCollectionName reports whether name is a valid collection name:
// [a-z0-9_.-]{1,64}. It runs on every request, so it is a loop, not a
// regular expression.
func ValidateCollectionName(name string) error {
	ok := len(name) >= 1 && len(name) <= 64
	for i := 0; ok && i < len(name); i++ {
		c := name[i]
		ok = c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-'
	}
	if !ok {
		return Errorf(CodeInvalidArgument, "collection name %q is invalid: use 1 to 64 characters of a-z, 0-9, '_', '.', '-'", name)
	}
	return nil
}

// SystemCollection reports whether name is reserved for groupkv's own
// collections (it begins with '_'): they can be read by anyone, and
// written, created or dropped only by groupkv itself.
func SystemCollection(name string) bool { return len(name) > 0 && name[0] == '_' }

// ValidateKey reports whether key is a valid record key.
func ValidateKey(key []byte) error {
	if len(key) == 0 {
		return Errorf(CodeInvalidArgument, "key is empty")
	}
	if len(key) > MaxKeySize {
		return Errorf(CodeTooLarge, "key is %d bytes, the limit is %d", len(key), MaxKeySize)
	}
	return nil
}

// ValidateTags reports whether tags are valid: UTF-8, no commas or control
// characters, at most MaxTagSize bytes each, at most MaxTags of them, no
// empty or repeated tag.
func ValidateTags(tags []string) error {
	if len(tags) > MaxTags {
		return Errorf(CodeInvalidArgument, "%d tags given, a record may carry at most %d", len(tags), MaxTags)
	}
	for i, t := range tags {
		if t == "" {
			return Errorf(CodeInvalidArgument, "tag %d is empty", i)
		}
		if len(t) > MaxTagSize {
			return Errorf(CodeInvalidArgument, "tag %d is %d bytes, the limit is %d", i, len(t), MaxTagSize)
		}
		if !utf8.ValidString(t) {
			return Errorf(CodeInvalidArgument, "tag %d is not valid UTF-8", i)
		}
		for _, r := range t {
			if r == ',' || unicode.IsControl(r) {
				return Errorf(CodeInvalidArgument, "tag %q contains %q: tags may not contain commas or control characters", t, r)
			}
		}
		for _, u := range tags[:i] {
			if u == t {
				return Errorf(CodeInvalidArgument, "tag %q is given twice", t)
			}
		}
	}
	return nil
}

// ValidateCollectionOptions checks opts and fills its defaults.
func ValidateCollectionOptions(opts *CollectionOptions) error {
	if err := ValidateCollectionName(opts.Name); err != nil {
		return err
	}
	switch opts.Partitioning {
	case "":
		opts.Partitioning = PartitionHash
	case PartitionHash, PartitionRange, PartitionTag:
	default:
		return Errorf(CodeInvalidArgument, "partitioning %q is unknown: use hash, range or tag", opts.Partitioning)
	}
	if opts.Replicas < 0 || opts.Replicas > MaxReplicas {
		return Errorf(CodeInvalidArgument, "replicas is %d, it must be between 1 and %d", opts.Replicas, MaxReplicas)
	}
	if opts.Shards < 0 || opts.Shards > MaxShards {
		return Errorf(CodeInvalidArgument, "shards is %d, it must be between 1 and %d", opts.Shards, MaxShards)
	}
	if opts.Partitioning != PartitionRange {
		if len(opts.SplitPoints) > 0 {
			return Errorf(CodeInvalidArgument, "split_points apply only to range collections")
		}
		if opts.Shards == 0 {
			opts.Shards = DefaultShards
		}
		return nil
	}
	if len(opts.SplitPoints)+1 > MaxShards {
		return Errorf(CodeInvalidArgument, "%d split points give more than %d shards", len(opts.SplitPoints), MaxShards)
	}
	for i, p := range opts.SplitPoints {
		if err := ValidateKey(p); err != nil {
			return Errorf(CodeInvalidArgument, "split point %d: %s", i, err.(*Error).Message)
		}
		if i > 0 && bytes.Compare(opts.SplitPoints[i-1], p) >= 0 {
			return Errorf(CodeInvalidArgument, "split points must be strictly increasing: %q is not above %q", p, opts.SplitPoints[i-1])
		}
	}
	if opts.Shards == 0 {
		opts.Shards = len(opts.SplitPoints) + 1
	} else if opts.Shards != len(opts.SplitPoints)+1 {
		return Errorf(CodeInvalidArgument, "a range collection with %d split points has %d shards, not %d", len(opts.SplitPoints), len(opts.SplitPoints)+1, opts.Shards)
	}
	return nil
}

// ValidateGroupID reports whether id is a valid key group id: 1 to
// MaxGroupIDSize bytes of UTF-8 without control characters.
func ValidateGroupID(id string) error {
	if id == "" || len(id) > MaxGroupIDSize {
		return Errorf(CodeInvalidArgument, "a group id is 1 to %d bytes, got %d", MaxGroupIDSize, len(id))
	}
	if !utf8.ValidString(id) {
		return Errorf(CodeInvalidArgument, "group id %q is not UTF-8", id)
	}
	for _, c := range id {
		if c < 0x20 || c == 0x7f {
			return Errorf(CodeInvalidArgument, "group id %q holds a control character", id)
		}
	}
	return nil
}
