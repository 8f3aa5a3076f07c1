package shard

import (
	"fmt"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/groupkv/groupkv/internal/group"
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

// BenchmarkApplyGroupWrite measures the application of a group write in a
// shard that leads 16 active groups of 10 (100) members with 765-byte
// values: one op is a batch of a group write of one member (to each group
// in turn) and of the record of its acknowledgment by the follower, the
// two records a group write costs its leader. batch-B/op is the size of
// the batch.
func BenchmarkApplyGroupWrite(b *testing.B) {
	for _, members := range []int{10, 100} {
		b.Run(fmt.Sprintf("members=%d", members), func(b *testing.B) { benchmarkApplyGroupWrite(b, 16, members, 1) })
	}
	// Acknowledged every 20th write: the outbox holds up to 20 entries.
	b.Run("members=10/ack=20", func(b *testing.B) { benchmarkApplyGroupWrite(b, 16, 10, 20) })
}

// benchmarkApplyGroupWrite applies group writes to groups of members in
// turn, and acknowledges a group's writes every ackEvery writes to it.
func benchmarkApplyGroupWrite(b *testing.B, groups, members, ackEvery int) {
	g := newGroupShard(b)
	g.value = make([]byte, 765)
	for i := range groups {
		keys := make([]string, members)
		for j := range keys {
			keys[j] = fmt.Sprintf("g%02d-m%d", i, j)
		}
		g.run(g.create(fmt.Sprintf("g%02d", i), group.Atomic, keys...), func() {})
	}
	refs := make([]group.Ref, groups)
	g.s.WithGroups(func(l *group.Leader, _ *group.Follower) {
		for i, gr := range l.Groups() {
			if gr.State != group.Active {
				b.Fatalf("group %s is %s", gr.Ref, gr.State)
			}
			refs[i] = gr.Ref
		}
	})
	value := make([]byte, 765)
	seq := make([]uint64, groups)
	total := 0
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		n := i % groups
		seq[n]++
		key := group.Key{Collection: 7, Key: fmt.Sprintf("g%02d-m%d", n, i/groups%members)}
		recs := []group.Record{{Kind: group.RecWrite, Group: refs[n], Writes: []group.Write{{Key: key, Value: value}}}}
		if seq[n]%uint64(ackEvery) == 0 {
			recs = append(recs, group.Record{Kind: group.RecShipped, Group: refs[n], Shard: 5, Seq: seq[n]})
		}
		g.apply(recs...)
		total += g.batchBytes
	}
	b.ReportMetric(float64(total)/float64(b.N), "batch-B/op")
}
