package shard

import (
	"bytes"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/storage"
)

// TestChangesWrittenBeforeReaders: the change log entries that writes
// leave for FinishBatch are in the batch before any command that may read
// the change log is applied into it, whichever of the shards sharing the
// buffer wrote them: a checksum applied after writes in the same batch
// sums what it sums when the writes were committed before it, and a
// command of another shard finds the first shard's entries in the batch.
func TestChangesWrittenBeforeReaders(t *testing.T) {
	left := Desc{ShardID: 2, Collection: 1, Partitioning: kv.PartitionRange, End: []byte("m")}
	right := Desc{ShardID: 3, Collection: 1, Partitioning: kv.PartitionRange, Start: []byte("m")}
	write := func(key string, version uint64) []byte {
		cmd := EncodeWrite([]Op{{Type: OpPut, Key: []byte(key), Value: []byte(key)}})
		SetVersion(cmd, version)
		return cmd
	}
	load := func(db *pebble.DB, d Desc, c *ChangeBuffer) *Shard {
		s, err := Load(db, d)
		if err != nil {
			t.Fatal(err)
		}
		if c != nil {
			s.SetChangeBuffer(c)
		}
		return s
	}
	apply := func(b *pebble.Batch, s *Shard, cmd []byte) Result {
		t.Helper()
		index, _ := s.Applied()
		res, err := s.Apply(b, index+1, 1, cmd)
		if err != nil || res.Err != nil {
			t.Fatal(err, res.Err)
		}
		return res
	}
	commit := func(b *pebble.Batch, shards ...*Shard) {
		t.Helper()
		for _, s := range shards {
			if err := s.FinishBatch(b); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.Commit(pebble.Sync); err != nil {
			t.Fatal(err)
		}
		b.Close()
		for _, s := range shards {
			s.Committed()
		}
	}

	// Writes committed first, then the checksum in a batch of its own.
	db1 := memDB(t)
	s := load(db1, right, nil)
	b := db1.NewIndexedBatch()
	apply(b, s, write("x", 10))
	apply(b, s, write("y", 11))
	commit(b, s)
	b = db1.NewIndexedBatch()
	want := apply(b, s, EncodeChecksum(1)).Checksum
	commit(b, s)

	// The same writes and the checksum in one batch, the left shard
	// writing too, into the buffer both share.
	db2 := memDB(t)
	buf := &ChangeBuffer{}
	l, r := load(db2, left, buf), load(db2, right, buf)
	b = db2.NewIndexedBatch()
	apply(b, l, write("a", 9))
	apply(b, r, write("x", 10))
	apply(b, r, write("y", 11))
	got := apply(b, r, EncodeChecksum(1)).Checksum
	if !bytes.Equal(got.Sum, want.Sum) || got.Pairs != want.Pairs {
		t.Fatalf("checksum after writes in the same batch: %d pairs %x; after them in an earlier batch: %d pairs %x",
			got.Pairs, got.Sum, want.Pairs, want.Sum)
	}
	if _, ok, err := storage.GetValue(b, storage.ChangeKey(nil, 1, 9, []byte("a"))); err != nil || !ok {
		t.Fatalf("the left shard's change log entry is not in the batch after the right shard's checksum (%v)", err)
	}
	commit(b, l, r)
	var changes []string
	if err := Changes(db2, 1, 0, 100, nil, func(c Change) bool {
		changes = append(changes, string(c.Key))
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if len(changes) != 3 || changes[0] != "a" || changes[1] != "x" || changes[2] != "y" {
		t.Fatalf("change log after the batch: %q, want a, x, y", changes)
	}
}
