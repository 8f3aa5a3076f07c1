package shard

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/groupkv/groupkv/internal/storage"
)

// Latest reads the newest version of a key.
const Latest = ^uint64(0)

// ReadRecord reads the version of (collection, key) visible at version asOf
// (Latest for the newest). found is false when the key has no version at or
// below asOf, or its visible version is a tombstone; then val.Tombstone tells
// which, and version is the tombstone's version (0 when nothing was found).
// Value and tags in the result are copies.
func ReadRecord(r pebble.Reader, collection uint32, key []byte, asOf uint64) (val storage.MVCCValue, version uint64, found bool, err error) {
	if asOf == Latest {
		return readLatest(r, collection, key)
	}
	prefix, upper := recordBounds(collection, key)
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: upper})
	if err != nil {
		return val, 0, false, err
	}
	defer it.Close()
	return readRecordIter(it, collection, key, asOf, prefix)
}

// readLatest reads the newest version of key through its latest-version
// pointer: one point lookup, or two for a pointer of format 2, which holds
// no value. A pointer to a version that GC removed (a tombstone) reads as
// absent.
func readLatest(r pebble.Reader, collection uint32, key []byte) (val storage.MVCCValue, version uint64, found bool, err error) {
	var buf [64]byte
	ptr, closer, err := r.Get(storage.LatestKey(buf[:0], collection, key))
	if errors.Is(err, pebble.ErrNotFound) {
		return val, 0, false, nil
	}
	if err != nil {
		return val, 0, false, err
	}
	version, _, raw, err := storage.DecodeLatest(ptr)
	if err != nil {
		closer.Close()
		return val, 0, false, fmt.Errorf("shard: corrupt latest pointer of %q: %w", key, err)
	}
	if raw == nil {
		closer.Close()
		raw, closer, err = r.Get(storage.DataKey(buf[:0], collection, key, version))
		if errors.Is(err, pebble.ErrNotFound) {
			return val, 0, false, nil
		}
		if err != nil {
			return val, 0, false, err
		}
	}
	defer closer.Close()
	v, err := storage.DecodeValue(raw)
	if err != nil {
		return val, 0, false, fmt.Errorf("shard: record %q@%d: %w", key, version, err)
	}
	v.Value = append([]byte(nil), v.Value...)
	return v, version, !v.Tombstone, nil
}

// recordBounds returns the iterator bounds of every version of key.
func recordBounds(collection uint32, key []byte) (lower, upper []byte) {
	lower = storage.DataKeyPrefix(nil, collection, key)
	upper = append(append(make([]byte, 0, len(lower)+9), lower...), 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF)
	return lower, upper
}

// readRecordIter is ReadRecord on an iterator bounded to the versions of key.
func readRecordIter(it *pebble.Iterator, collection uint32, key []byte, asOf uint64, prefix []byte) (val storage.MVCCValue, version uint64, found bool, err error) {
	if !it.SeekGE(storage.DataKey(nil, collection, key, asOf)) {
		return val, 0, false, it.Error()
	}
	k := it.Key()
	if len(k) != len(prefix)+8 || !bytes.HasPrefix(k, prefix) {
		return val, 0, false, fmt.Errorf("shard: unexpected key %x under %x", k, prefix)
	}
	dk, err := storage.DecodeDataKey(k)
	if err != nil {
		return val, 0, false, err
	}
	raw, err := it.ValueAndErr()
	if err != nil {
		return val, 0, false, err
	}
	v, err := storage.DecodeValue(raw)
	if err != nil {
		return val, 0, false, fmt.Errorf("shard: record %x: %w", k, err)
	}
	v.Value = append([]byte(nil), v.Value...)
	return v, dk.Version, !v.Tombstone, nil
}

// ScanRecord is one record produced by a scan.
type ScanRecord struct {
	Key     []byte
	Value   []byte
	Tags    []string
	Version uint64
	Bucket  uint16
}

// ScanOptions bound a scan of a collection's records.
type ScanOptions struct {
	Collection uint32
	// Start (inclusive) and End (exclusive) bound the keys; nil is unbounded.
	Start, End []byte
	// AsOf is the version read.
	AsOf    uint64
	Reverse bool
	// Limit stops the scan after that many records; 0 is unbounded.
	Limit int
	// Owned, when set, keeps only records whose bucket it accepts (the
	// buckets of the shards read).
	Owned func(bucket uint16) bool
	// Moves tells that the collection's keys may move between shards (a
	// tag collection: see the notes on checksums). A key then has
	// versions in two shards that share one latest pointer, which names
	// the version applied last on this node: not the newest when the
	// shard the key moved from applied its last writes late. A pointer
	// to a tombstone, or to a bucket not owned, is then checked against
	// the key's versions instead of skipping the key.
	Moves bool
}

// sameKey reports whether data key k is a version of the key whose prefix
// is prefix (an escaped key ends with a terminator that occurs nowhere
// else in it: no other key's prefix starts with it).
func sameKey(k, prefix []byte) bool {
	return len(k) == len(prefix)+8 && bytes.HasPrefix(k, prefix)
}

// Scan calls fn for every live record visible at opts.AsOf in key order
// (descending with Reverse) until fn returns false or the limit is reached.
// Slices passed to fn are valid only during the call.
//
// A scan walks the keys' latest-version pointers, one per key whatever
// the number of versions it keeps, and answers from a pointer when its
// version is at or below opts.AsOf: it is then the key's newest version,
// and the pointer carries its value. Only a key written after opts.AsOf,
// a pointer of format 2 (no value), or in a collection whose keys move
// (opts.Moves) a pointer that is not to a live version of a bucket owned,
// costs a seek among the key's versions, on a clone of the pointers'
// iterator, so that both read the same state.
func Scan(r pebble.Reader, opts ScanOptions, fn func(ScanRecord) bool) error {
	lower, upper := storage.LatestSpan(opts.Collection)
	if opts.Start != nil {
		lower = storage.LatestKey(nil, opts.Collection, opts.Start)
	}
	if opts.End != nil {
		upper = storage.LatestKey(nil, opts.Collection, opts.End)
	}
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return err
	}
	defer it.Close()
	var versions *pebble.Iterator
	defer func() {
		if versions != nil {
			versions.Close()
		}
	}()
	var seek []byte
	n := 0
	valid := it.First()
	if opts.Reverse {
		valid = it.Last()
	}
	for ; valid; valid = scanStep(it, opts.Reverse) {
		key, err := storage.DecodeLatestKey(it.Key())
		if err != nil {
			return fmt.Errorf("shard: latest pointer %x: %w", it.Key(), err)
		}
		version, bucket, raw, err := storage.DecodeLatest(it.Value())
		if err != nil {
			return fmt.Errorf("shard: latest pointer of %q: %w", key, err)
		}
		fromVersions := version > opts.AsOf || raw == nil
		if !fromVersions && (storage.IsTombstone(raw) || opts.Owned != nil && !opts.Owned(bucket)) {
			if !opts.Moves {
				continue // deleted, or another shard's
			}
			fromVersions = true
		}
		if fromVersions {
			// The newest version at or below AsOf, among the key's
			// versions (newest first).
			if versions == nil {
				lo, hi := storage.CollectionSpan(opts.Collection)
				if versions, err = it.Clone(pebble.CloneOptions{IterOptions: &pebble.IterOptions{LowerBound: lo, UpperBound: hi}}); err != nil {
					return err
				}
			}
			seek = storage.DataKey(seek[:0], opts.Collection, key, opts.AsOf)
			if !versions.SeekGE(seek) {
				if err := versions.Error(); err != nil {
					return err
				}
				continue
			}
			k := versions.Key()
			if !sameKey(k, seek[:len(seek)-8]) {
				continue // no version of this key at or below AsOf
			}
			version = ^binary.BigEndian.Uint64(k[len(k)-8:])
			raw = versions.Value()
		}
		v, err := storage.DecodeValue(raw)
		if err != nil {
			return fmt.Errorf("shard: record %q@%d: %w", key, version, err)
		}
		if v.Tombstone || opts.Owned != nil && !opts.Owned(v.Bucket) {
			continue
		}
		n++
		if !fn(ScanRecord{Key: key, Value: v.Value, Tags: v.Tags, Version: version, Bucket: v.Bucket}) {
			return nil
		}
		if opts.Limit > 0 && n >= opts.Limit {
			return nil
		}
	}
	return it.Error()
}

func scanStep(it *pebble.Iterator, reverse bool) bool {
	if reverse {
		return it.Prev()
	}
	return it.Next()
}

// TagMember reports whether key carries tag as of version asOf according to
// the tag index.
func tagEntryPresent(raw []byte) bool { return len(raw) > 0 && raw[0] == 1 }

// TagKeys calls fn, in key order, for every key of the collection that
// carries tag as of asOf according to the tag index, starting after
// afterKey (nil: from the first). It stops when fn returns false.
func TagKeys(r pebble.Reader, collection uint32, tag string, asOf uint64, afterKey []byte, owned func(uint16) bool, fn func(key []byte) bool) error {
	prefix := storage.TagIndexPrefix(nil, collection, tag)
	lower := prefix
	if afterKey != nil {
		lower = storage.PrefixEnd(storage.EscapeKey(append([]byte(nil), prefix...), afterKey))
	}
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: storage.PrefixEnd(prefix)})
	if err != nil {
		return err
	}
	defer it.Close()
	for valid := it.First(); valid; {
		_, _, key, version, err := storage.DecodeTagIndexKey(it.Key())
		if err != nil {
			return err
		}
		keyPrefix := it.Key()[:len(it.Key())-8]
		keyPrefix = append([]byte(nil), keyPrefix...)
		if version > asOf {
			valid = it.SeekGE(storage.TagIndexKey(nil, collection, tag, key, asOf))
			if !valid {
				break
			}
			if !bytes.HasPrefix(it.Key(), keyPrefix) || len(it.Key()) != len(keyPrefix)+8 {
				continue
			}
		}
		raw := it.Value()
		if tagEntryPresent(raw) && (owned == nil || owned(tagEntryBucket(raw))) {
			if !fn(append([]byte(nil), key...)) {
				return nil
			}
		}
		valid = it.SeekGE(storage.PrefixEnd(keyPrefix))
	}
	return it.Error()
}

func tagEntry(present bool, bucket uint16) []byte {
	b := []byte{0, byte(bucket >> 8), byte(bucket)}
	if present {
		b[0] = 1
	}
	return b
}

func tagEntryBucket(raw []byte) uint16 {
	if len(raw) < 3 {
		return 0
	}
	return uint16(raw[1])<<8 | uint16(raw[2])
}

// Change is one entry of a collection's change log.
type Change struct {
	Version uint64
	Key     []byte
	Bucket  uint16
}

// Changes calls fn for each change log entry of the collection with a
// version in [from, to], in (version, key) order, starting after
// (from, afterKey) when afterKey is set. It stops when fn returns false.
func Changes(r pebble.Reader, collection uint32, from, to uint64, afterKey []byte, fn func(Change) bool) error {
	lower, upper := storage.ChangeSpan(collection, from, to)
	if afterKey != nil {
		lower = storage.PrefixEnd(storage.ChangeKey(nil, collection, from, afterKey))
	}
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return err
	}
	defer it.Close()
	for valid := it.First(); valid; valid = it.Next() {
		_, v, key, err := storage.DecodeChangeKey(it.Key())
		if err != nil {
			return err
		}
		raw := it.Value()
		var bucket uint16
		if len(raw) == 2 {
			bucket = uint16(raw[0])<<8 | uint16(raw[1])
		}
		if !fn(Change{Version: v, Key: append([]byte(nil), key...), Bucket: bucket}) {
			return nil
		}
	}
	return it.Error()
}
