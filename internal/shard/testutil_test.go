package shard

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/groupkv/groupkv/internal/storage"
)

// memDB opens a store in memory, closed when the test ends.
func memDB(t *testing.T) *pebble.DB {
	t.Helper()
	eng, err := storage.Open("/d", storage.Options{FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	return eng.DB
}

// seededRand returns a generator seeded from the clock, on stream, and
// its seed, which it logs so that a failure can be replayed.
func seededRand(t *testing.T, stream uint64) (*rand.Rand, uint64) {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	return rand.New(rand.NewPCG(seed, stream)), seed
}

// applyOne applies cmd to s at its next index, in term 1, in a batch of
// its own that it commits, as the replication loop does.
func applyOne(t *testing.T, db *pebble.DB, s *Shard, cmd []byte) Result {
	t.Helper()
	return applyOneThen(t, db, s, cmd, nil)
}

// applyAt is applyOne of cmd at version.
func applyAt(t *testing.T, db *pebble.DB, s *Shard, version uint64, cmd []byte) Result {
	t.Helper()
	SetVersion(cmd, version)
	return applyOne(t, db, s, cmd)
}

// applyOneThen is applyOne calling beforeCommit, when set, with the
// finished batch before it commits.
func applyOneThen(t *testing.T, db *pebble.DB, s *Shard, cmd []byte, beforeCommit func(*pebble.Batch)) Result {
	t.Helper()
	b := db.NewIndexedBatch()
	defer b.Close()
	index, _ := s.Applied()
	res, err := s.Apply(b, index+1, 1, cmd)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.FinishBatch(b); err != nil {
		t.Fatal(err)
	}
	if beforeCommit != nil {
		beforeCommit(b)
	}
	if err := b.Commit(pebble.Sync); err != nil {
		t.Fatal(err)
	}
	s.Committed()
	return res
}
