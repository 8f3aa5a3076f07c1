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
		return bytes.Compare(DataKey(nil, 7, a.key, a.version), DataKey(nil, 7, b.key, b.version))
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
		d, err := DecodeDataKey(DataKey(nil, 7, it.key, it.version))
		if err != nil || d.Collection != 7 || !bytes.Equal(d.UserKey, it.key) || d.Version != it.version {
			t.Fatalf("seed %d: round trip of %q@%d: %+v %v", seed, it.key, it.version, d, err)
		}
		start := DataKeyStart(7, it.key)
		if !bytes.HasPrefix(DataKey(nil, 7, it.key, it.version), start) {
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

func TestIndexKeysRoundTrip(t *testing.T) {
	for _, c := range []struct {
		tag     string
		key     []byte
		version uint64
	}{{"a", []byte("k"), 1}, {"x\x00y", []byte{0, 0, 1}, 1 << 60}, {"é", []byte("a/b"), 0}} {
		coll, tag, key, v, err := DecodeTagIndexKey(TagIndexKey(nil, 9, c.tag, c.key, c.version))
		if err != nil || coll != 9 || tag != c.tag || !bytes.Equal(key, c.key) || v != c.version {
			t.Fatalf("tag index round trip %+v: %d %q %q %d %v", c, coll, tag, key, v, err)
		}
		if key, err := DecodeLatestKey(LatestKey(nil, 9, c.key)); err != nil || !bytes.Equal(key, c.key) {
			t.Fatalf("latest key round trip %q: %q %v", c.key, key, err)
		}
		coll, v, key, err = DecodeChangeKey(ChangeKey(nil, 9, c.version, c.key))
		if err != nil || coll != 9 || !bytes.Equal(key, c.key) || v != c.version {
			t.Fatalf("change key round trip %+v: %d %q %d %v", c, coll, key, v, err)
		}
	}
	for _, bad := range [][]byte{DataKey(nil, 9, []byte("k"), 1), append(LatestKey(nil, 9, []byte("k")), 0), LatestKey(nil, 9, []byte("k"))[:6]} {
		if _, err := DecodeLatestKey(bad); err == nil {
			t.Fatalf("DecodeLatestKey(%x) accepted", bad)
		}
	}
	// Change log entries sort by version, then key; ChangeSpan bounds them.
	a, b := ChangeKey(nil, 1, 5, []byte("z")), ChangeKey(nil, 1, 6, []byte("a"))
	if bytes.Compare(a, b) >= 0 {
		t.Fatalf("change log not in version order")
	}
	start, end := ChangeSpan(1, 6, 6)
	if bytes.Compare(b, start) < 0 || bytes.Compare(b, end) >= 0 || bytes.Compare(a, start) >= 0 {
		t.Fatalf("ChangeSpan(6,6) bounds wrong")
	}
	// A collection's data span holds its keys and not the next collection's.
	s, e := CollectionSpan(1)
	if k := DataKey(nil, 1, []byte{0xFF, 0xFF}, 0); bytes.Compare(k, s) < 0 || bytes.Compare(k, e) >= 0 {
		t.Fatalf("key outside its collection span")
	}
	if k := DataKey(nil, 2, nil, 1); bytes.Compare(k, e) < 0 {
		t.Fatalf("next collection inside span")
	}
}

func TestValueRoundTrip(t *testing.T) {
	for _, v := range []MVCCValue{
		{},
		{Value: []byte("hello"), Tags: []string{"a", "bé"}, Bucket: 65535},
		{Tombstone: true},
		{Value: []byte{0, 1, 2}},
	} {
		got, err := DecodeValue(EncodeValue(nil, v))
		if err != nil {
			t.Fatalf("%+v: %v", v, err)
		}
		if got.Tombstone != v.Tombstone || got.Bucket != v.Bucket || !bytes.Equal(got.Value, v.Value) || !slices.Equal(got.Tags, v.Tags) {
			t.Fatalf("round trip %+v -> %+v", v, got)
		}
	}
	if _, err := DecodeValue([]byte{2, 0, 0, 0}); err == nil {
		t.Fatalf("unknown flag accepted")
	}
	if _, err := DecodeValue([]byte{0, 0, 0, 1, 5, 'a'}); err == nil {
		t.Fatalf("truncated tag accepted")
	}
}

func FuzzDecodeDataKey(f *testing.F) {
	f.Add(DataKey(nil, 1, []byte("a\x00b"), 9))
	f.Add([]byte{prefixData, 0, 0, 0, 1, 0, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := DecodeDataKey(b)
		if err != nil {
			return
		}
		if re := DataKey(nil, d.Collection, d.UserKey, d.Version); !bytes.Equal(re, b) {
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

func FuzzDecodeIndexKeys(f *testing.F) {
	f.Add(TagIndexKey(nil, 1, "t", []byte("k"), 3))
	f.Add(ChangeKey(nil, 1, 3, []byte("k")))
	f.Fuzz(func(t *testing.T, b []byte) {
		if c, tag, k, v, err := DecodeTagIndexKey(b); err == nil {
			if re := TagIndexKey(nil, c, tag, k, v); !bytes.Equal(re, b) {
				t.Fatalf("tag index decode/encode mismatch: %x -> %x", b, re)
			}
		}
		if c, v, k, err := DecodeChangeKey(b); err == nil {
			if re := ChangeKey(nil, c, v, k); !bytes.Equal(re, b) {
				t.Fatalf("change key decode/encode mismatch: %x -> %x", b, re)
			}
		}
	})
}
