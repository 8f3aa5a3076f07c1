package storage

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestDataKeyOrder(t *testing.T) {
	seed := rand.Uint64()
	rng := rand.New(rand.NewPCG(seed, 0))
	type kv struct {
		key     []byte
		version uint64
	}
	var items []kv
	for range 2000 {
		k := make([]byte, rng.IntN(6))
		for i := range k {
			k[i] = []byte{0, 1, 0xFF, 'a', 'b'}[rng.IntN(5)]
		}
		items = append(items, kv{k, rng.Uint64N(5)})
	}
	// Sorting by encoded key must equal sorting by (key asc, version desc).
	byEncoding := slices.Clone(items)
	slices.SortFunc(byEncoding, func(a, b kv) int {
		return bytes.Compare(DataKey(nil, 7, 3, a.key, a.version), DataKey(nil, 7, 3, b.key, b.version))
	})
	byTuple := slices.Clone(items)
	slices.SortFunc(byTuple, func(a, b kv) int {
		if c := bytes.Compare(a.key, b.key); c != 0 {
			return c
		}
		return -cmpU64(a.version, b.version)
	})
	for i := range byEncoding {
		if !bytes.Equal(byEncoding[i].key, byTuple[i].key) || byEncoding[i].version != byTuple[i].version {
			t.Fatalf("seed %d: order differs at %d: %v vs %v", seed, i, byEncoding[i], byTuple[i])
		}
	}
	for _, it := range items {
		d, err := DecodeDataKey(DataKey(nil, 7, 3, it.key, it.version))
		if err != nil || d.Collection != 7 || d.Bucket != 3 || !bytes.Equal(d.UserKey, it.key) || d.Version != it.version {
			t.Fatalf("seed %d: round trip of %q@%d: %+v %v", seed, it.key, it.version, d, err)
		}
		start := DataKeyStart(7, 3, it.key)
		if !bytes.HasPrefix(DataKey(nil, 7, 3, it.key, it.version), start) {
			t.Fatalf("DataKeyStart is not a prefix of the data key")
		}
	}
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func TestBucketSpan(t *testing.T) {
	s, e := BucketSpan(1, 0, 65536)
	k := DataKey(nil, 1, 65535, []byte("zz"), 1)
	if bytes.Compare(k, s) < 0 || bytes.Compare(k, e) >= 0 {
		t.Fatalf("last bucket outside span")
	}
	if other := DataKey(nil, 2, 0, nil, 1); bytes.Compare(other, e) < 0 {
		t.Fatalf("next collection inside span")
	}
	s, e = BucketSpan(1, 10, 20)
	if k := DataKey(nil, 1, 20, []byte("a"), 1); bytes.Compare(k, e) < 0 {
		t.Fatalf("bucket 20 inside [10,20)")
	}
	if k := DataKey(nil, 1, 19, []byte{0xFF, 0xFF}, 0); bytes.Compare(k, e) >= 0 || bytes.Compare(k, s) < 0 {
		t.Fatalf("bucket 19 outside [10,20)")
	}
}

func TestValueRoundTrip(t *testing.T) {
	for _, v := range []MVCCValue{
		{},
		{Value: []byte("hello"), Tags: []string{"a", "bé"}},
		{Tombstone: true},
		{Value: []byte{0, 1, 2}},
	} {
		got, err := DecodeValue(EncodeValue(nil, v))
		if err != nil {
			t.Fatalf("%+v: %v", v, err)
		}
		if got.Tombstone != v.Tombstone || !bytes.Equal(got.Value, v.Value) || !slices.Equal(got.Tags, v.Tags) {
			t.Fatalf("round trip %+v -> %+v", v, got)
		}
	}
	if _, err := DecodeValue([]byte{2, 0}); err == nil {
		t.Fatalf("unknown flag accepted")
	}
	if _, err := DecodeValue([]byte{0, 1, 5, 'a'}); err == nil {
		t.Fatalf("truncated tag accepted")
	}
}

func FuzzDecodeDataKey(f *testing.F) {
	f.Add(DataKey(nil, 1, 2, []byte("a\x00b"), 9))
	f.Add([]byte{prefixData, 0, 0, 0, 1, 0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := DecodeDataKey(b)
		if err != nil {
			return
		}
		if re := DataKey(nil, d.Collection, d.Bucket, d.UserKey, d.Version); !bytes.Equal(re, b) {
			t.Fatalf("decode/encode mismatch: %x -> %x", b, re)
		}
	})
}

func FuzzDecodeValue(f *testing.F) {
	f.Add(EncodeValue(nil, MVCCValue{Value: []byte("v"), Tags: []string{"t"}}))
	f.Add(EncodeValue(nil, MVCCValue{Tombstone: true}))
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := DecodeValue(b)
		if err != nil {
			return
		}
		if re := EncodeValue(nil, v); !bytes.Equal(re, b) {
			t.Fatalf("decode/encode mismatch: %x -> %x", b, re)
		}
	})
}
