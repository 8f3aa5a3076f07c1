package storage

import "testing"

func BenchmarkDataKey(b *testing.B) {
	key := []byte("user:000000012345")
	buf := make([]byte, 0, 64)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		buf = DataKey(buf[:0], 7, key, uint64(i))
	}
}

func BenchmarkDecodeDataKey(b *testing.B) {
	k := DataKey(nil, 7, []byte("user:000000012345"), 42)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := DecodeDataKey(k); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncodeValue(b *testing.B) {
	v := MVCCValue{Bucket: 9, Tags: []string{"a", "b"}, Value: make([]byte, 100)}
	buf := make([]byte, 0, 256)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		buf = EncodeValue(buf[:0], v)
	}
}

func BenchmarkDecodeValue(b *testing.B) {
	raw := EncodeValue(nil, MVCCValue{Bucket: 9, Tags: []string{"a", "b"}, Value: make([]byte, 100)})
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := DecodeValue(raw); err != nil {
			b.Fatal(err)
		}
	}
}
