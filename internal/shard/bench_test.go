package shard

import (
	"fmt"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/storage"
)

func BenchmarkEncodeDecodeWrite(b *testing.B) {
	ops := []Op{{Type: OpPut, Bucket: 3, Key: []byte("user:000000012345"), Value: make([]byte, 100), Tags: []string{"t"}}}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		cmd := EncodeWrite(ops)
		SetVersion(cmd, uint64(i+1))
		if _, err := DecodeCommand(cmd); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkApplyPut measures the state machine alone: one put per Apply,
// 64 applies per committed (unsynced) batch, on an in-memory filesystem.
func BenchmarkApplyPut(b *testing.B) {
	eng, err := storage.Open("/bench", storage.Options{FS: vfs.NewMem()})
	if err != nil {
		b.Fatal(err)
	}
	defer eng.Close()
	s, err := Load(eng.DB, Desc{ShardID: 2, Collection: 1, Partitioning: kv.PartitionHash, BucketStart: 0, BucketEnd: kv.NumBuckets})
	if err != nil {
		b.Fatal(err)
	}
	value := make([]byte, 100)
	b.ReportAllocs()
	b.ResetTimer()
	index := uint64(0)
	for i := 0; i < b.N; {
		batch := eng.DB.NewIndexedBatch()
		for j := 0; j < 64 && i < b.N; j, i = j+1, i+1 {
			key := []byte(fmt.Sprintf("user:%012d", i%100000))
			cmd := EncodeWrite([]Op{{Type: OpPut, Bucket: 0, Key: key, Value: value}})
			index++
			SetVersion(cmd, index)
			if _, err := s.Apply(batch, index, 1, cmd); err != nil {
				b.Fatal(err)
			}
		}
		if err := s.FinishBatch(batch); err != nil {
			b.Fatal(err)
		}
		if err := batch.Commit(nil); err != nil {
			b.Fatal(err)
		}
		batch.Close()
	}
}
