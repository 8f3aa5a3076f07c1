package shard

import (
	"bytes"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/groupkv/groupkv/internal/storage"
)

// Latest reads the newest version of a key.
const Latest = ^uint64(0)

// ReadRecord reads the version of (collection, bucket, key) visible at
// version asOf (Latest for the newest). found is false when the key has no
// version at or below asOf, or its visible version is a tombstone; then
// val.Tombstone tells which, and version is the tombstone's version (0 when
// nothing was found). Value and tags in the result are copies.
func ReadRecord(r pebble.Reader, collection uint32, bucket uint16, key []byte, asOf uint64) (val storage.MVCCValue, version uint64, found bool, err error) {
	prefix := storage.DataKeyPrefix(nil, collection, bucket, key)
	upper := append(append([]byte(nil), prefix...), 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF)
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: upper})
	if err != nil {
		return val, 0, false, err
	}
	defer it.Close()
	seek := storage.DataKey(nil, collection, bucket, key, asOf)
	if !it.SeekGE(seek) {
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
