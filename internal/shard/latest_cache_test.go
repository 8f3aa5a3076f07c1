package shard

import (
	"bytes"
	"fmt"
	"io"
	"reflect"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/groupkv/groupkv/internal/kv"
)

// getHook is a reader that runs a function before each point lookup.
type getHook struct {
	pebble.Reader
	before func()
}

func (r getHook) Get(key []byte) ([]byte, io.Closer, error) {
	r.before()
	return r.Reader.Get(key)
}

func readCached(t *testing.T, c *LatestCache, r pebble.Reader, key string) string {
	t.Helper()
	val, _, found, err := ReadLatestCached(c, r, 1, []byte(key))
	if err != nil {
		t.Fatal(err)
	}
	if !found {
		return "<absent>"
	}
	return string(val.Value)
}

// cachedShard returns a range shard of collection 1 on a fresh database,
// writing through a cache of newest versions of 1 MiB.
func cachedShard(t *testing.T) (*pebble.DB, *LatestCache, *Shard) {
	t.Helper()
	db := memDB(t)
	c := NewLatestCache(1 << 20)
	s, err := Load(db, Desc{ShardID: 2, Collection: 1, Partitioning: kv.PartitionRange})
	if err != nil {
		t.Fatal(err)
	}
	s.SetLatestCache(c)
	return db, c, s
}

// applyUncommitted applies cmd to s at its next index into a new batch of
// db, finished but not committed.
func applyUncommitted(t *testing.T, db *pebble.DB, s *Shard, cmd []byte) *pebble.Batch {
	t.Helper()
	b := db.NewIndexedBatch()
	index, _ := s.Applied()
	if res, err := s.Apply(b, index+1, 1, cmd); err != nil || res.Err != nil {
		t.Fatal(err, res.Err)
	}
	if err := s.FinishBatch(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestLatestCacheFollowsWrites: reads through the cache see every write
// once its batch is committed and the shard told (Committed), as the
// replication loop does before it answers the writer or publishes the
// applied index: including a read that filled the cache with the old value
// while the batch was being applied, and reads of a key the GC dropped.
// A value handed out is the reader's own.
func TestLatestCacheFollowsWrites(t *testing.T) {
	db, c, s := cachedShard(t)
	version := uint64(10)
	write := func(value string) *pebble.Batch {
		t.Helper()
		version++
		cmd := EncodeWrite([]Op{{Type: OpPut, Key: []byte("k"), Value: []byte(value)}})
		if value == "" {
			cmd = EncodeWrite([]Op{{Type: OpDelete, Key: []byte("k")}})
		}
		SetVersion(cmd, version)
		return applyUncommitted(t, db, s, cmd)
	}
	commit := func(b *pebble.Batch) {
		t.Helper()
		if err := b.Commit(pebble.Sync); err != nil {
			t.Fatal(err)
		}
		b.Close()
		s.Committed()
	}
	if got := readCached(t, c, db, "k"); got != "<absent>" {
		t.Fatalf("k = %s before any write", got)
	}
	commit(write("v1"))
	if got := readCached(t, c, db, "k"); got != "v1" {
		t.Fatalf("k = %s after v1 was committed", got)
	}
	val, _, _, _ := ReadLatestCached(c, db, 1, []byte("k"))
	val.Value[0] = 'X' // the reader's own copy
	if got := readCached(t, c, db, "k"); got != "v1" {
		t.Fatalf("k = %s after a reader changed its copy", got)
	}
	// A read while the batch is applied, before it is committed, finds
	// the old value (in storage: the key is pending); the commit's fill
	// replaces it.
	b := write("v2")
	if got := readCached(t, c, db, "k"); got != "v1" {
		t.Fatalf("k = %s before v2 was committed", got)
	}
	commit(b)
	if got := readCached(t, c, db, "k"); got != "v2" {
		t.Fatalf("k = %s after v2 was committed (a stale entry stayed)", got)
	}
	// A read whose lookup the commit's invalidation overtakes fills
	// nothing (though what it read is new).
	b = write("v3")
	if got := readCached(t, c, getHook{Reader: db, before: func() { commit(b) }}, "k"); got != "v3" {
		t.Fatalf("k = %s read after v3 committed", got)
	}
	k := cacheKey(nil, 1, []byte("k"))
	if e, ok := c.stripe(k).m[string(k)]; !ok || string(e.val.Value) != "v3" || e.version != version {
		t.Fatalf("k's entry after v3 was committed: %+v (present %v); want v3 at %d, filled by the commit", e, ok, version)
	}
	commit(write(""))
	if got := readCached(t, c, db, "k"); got != "<absent>" {
		t.Fatalf("k = %s after its delete", got)
	}
}

// getAfterHook is a reader that runs a function after each point lookup.
type getAfterHook struct {
	pebble.Reader
	after func()
}

func (r getAfterHook) Get(key []byte) ([]byte, io.Closer, error) {
	v, closer, err := r.Reader.Get(key)
	r.after()
	return v, closer, err
}

// TestLatestCacheNoStaleFillAfterCommit: between a batch's commit and the
// shard's Committed (the replication loop's window, where readers already
// find the new value in storage), a read that looked the old value up
// before the commit does not put it back in the cache: once any read
// returned the new value, every read that begins later returns it.
func TestLatestCacheNoStaleFillAfterCommit(t *testing.T) {
	db, c, s := cachedShard(t)
	apply := func(version uint64, value string) *pebble.Batch {
		t.Helper()
		cmd := EncodeWrite([]Op{{Type: OpPut, Key: []byte("k"), Value: []byte(value)}})
		SetVersion(cmd, version)
		return applyUncommitted(t, db, s, cmd)
	}
	b := apply(10, "v1")
	if err := b.Commit(pebble.Sync); err != nil {
		t.Fatal(err)
	}
	b.Close()
	s.Committed()
	for round, fill := range []bool{false, true} {
		old := fmt.Sprintf("v%d", round+1)
		val := fmt.Sprintf("v%d", round+2)
		if fill {
			// The old value cached before the batch is applied.
			if got := readCached(t, c, db, "k"); got != old {
				t.Fatalf("k = %s, want %s", got, old)
			}
		}
		b := apply(uint64(20+10*round), val)
		var newer string
		// A read looks the old value up while the batch is applied; before
		// it fills the cache, the batch is committed and another read
		// finds the new value in storage.
		slow := getAfterHook{Reader: db, after: func() {
			if newer != "" {
				return
			}
			newer = "-"
			if err := b.Commit(pebble.Sync); err != nil {
				t.Fatal(err)
			}
			newer = readCached(t, c, db, "k")
		}}
		if got := readCached(t, c, slow, "k"); got != old {
			t.Fatalf("round %d: the read that overlapped the commit: k = %s, want %s", round, got, old)
		}
		if newer != val {
			t.Fatalf("round %d: the read after the commit: k = %s, want %s", round, newer, val)
		}
		if got := readCached(t, c, db, "k"); got != val {
			t.Fatalf("round %d: k = %s after a read returned %s: the cache went back to the old value", round, got, val)
		}
		b.Close()
		s.Committed()
		if got := readCached(t, c, db, "k"); got != val {
			t.Fatalf("round %d: k = %s after Committed", round, got)
		}
	}
}

// TestLatestCacheRefusesOvertakenFill: a read whose point lookup began
// before an invalidation of its key does not fill the cache with what it
// read.
func TestLatestCacheRefusesOvertakenFill(t *testing.T) {
	db := memDB(t)
	c := NewLatestCache(1 << 20)
	s, err := Load(db, Desc{ShardID: 2, Collection: 1, Partitioning: kv.PartitionRange})
	if err != nil {
		t.Fatal(err)
	}
	put := func(version uint64, value string) {
		cmd := EncodeWrite([]Op{{Type: OpPut, Key: []byte("k"), Value: []byte(value)}})
		SetVersion(cmd, version)
		applyOne(t, db, s, cmd)
	}
	put(10, "old")
	// The shard writes without the cache here; the test invalidates by
	// hand, in the middle of the lookup, as a concurrent writer would.
	r := getHook{Reader: db, before: func() { c.Invalidate(1, []byte("k")) }}
	if got := readCached(t, c, r, "k"); got != "old" {
		t.Fatalf("k = %s", got)
	}
	put(20, "new")
	if got := readCached(t, c, db, "k"); got != "new" {
		t.Fatalf("k = %s: the overtaken read filled the cache with %q", got, "old")
	}
}

// TestLatestCacheBounded: the cache stays within its size, whatever is
// read, and a value too large to cache is read from storage each time.
func TestLatestCacheBounded(t *testing.T) {
	db := memDB(t)
	const limit = 64 << 10
	c := NewLatestCache(limit)
	s, err := Load(db, Desc{ShardID: 2, Collection: 1, Partitioning: kv.PartitionRange})
	if err != nil {
		t.Fatal(err)
	}
	var ops []Op
	for i := range 2000 {
		ops = append(ops, Op{Type: OpPut, Key: fmt.Appendf(nil, "k%05d", i), Value: make([]byte, 100)})
	}
	ops = append(ops, Op{Type: OpPut, Key: []byte("large"), Value: make([]byte, maxCachedValue+1)})
	cmd := EncodeWrite(ops)
	SetVersion(cmd, 10)
	applyOne(t, db, s, cmd)
	for _, op := range ops {
		if _, _, found, err := ReadLatestCached(c, db, 1, op.Key); err != nil || !found {
			t.Fatalf("%s: found %v, %v", op.Key, found, err)
		}
	}
	total, entries := 0, 0
	for i := range c.stripes {
		total += c.stripes[i].bytes
		entries += len(c.stripes[i].m)
		if c.stripes[i].bytes > c.perStripe {
			t.Fatalf("stripe %d holds %d bytes, more than its %d", i, c.stripes[i].bytes, c.perStripe)
		}
		if _, ok := c.stripes[i].m[string(cacheKey(nil, 1, []byte("large")))]; ok {
			t.Fatalf("a value of %d bytes was cached", maxCachedValue+1)
		}
	}
	if total > limit || entries == 0 || entries >= len(ops) {
		t.Fatalf("%d entries, %d bytes cached of %d keys read (limit %d)", entries, total, len(ops), limit)
	}
}

// TestLatestCacheFilledByWrites: once a batch is committed, the cache
// holds, for every key it wrote, exactly what a read of storage answers
// (values with and without tags, empty values, deletes, several writes of
// a key in one batch; a value too large to cache is not kept), and a
// batch that was not committed fills nothing.
func TestLatestCacheFilledByWrites(t *testing.T) {
	rng, seed := seededRand(t, 3)
	db, c, s := cachedShard(t)
	keys := []string{"a", "b", "c", "d", "e"}
	version := uint64(10)
	apply := func() (*pebble.Batch, map[string]bool) {
		b := db.NewIndexedBatch()
		written := map[string]bool{}
		for range 1 + rng.IntN(6) {
			k := keys[rng.IntN(len(keys))]
			op := Op{Type: OpPut, Key: []byte(k)}
			switch rng.IntN(6) {
			case 0:
				op = Op{Type: OpDelete, Key: []byte(k)}
			case 1:
				op.Value = []byte{} // empty
			case 2:
				op.Value = bytes.Repeat([]byte{'x'}, maxCachedValue+1)
			case 3:
				op.Value, op.Tags = []byte(fmt.Sprintf("%s@%d", k, version)), []string{"t1", fmt.Sprintf("t%d", rng.IntN(3))}
			default:
				op.Value = []byte(fmt.Sprintf("%s@%d", k, version))
			}
			// A delete of an absent key writes nothing.
			_, _, exists, err := readLatest(b, 1, op.Key)
			if err != nil {
				t.Fatal(err)
			}
			version++
			cmd := EncodeWrite([]Op{op})
			SetVersion(cmd, version)
			index, _ := s.Applied()
			if res, err := s.Apply(b, index+1, 1, cmd); err != nil || res.Err != nil {
				t.Fatalf("seed %d: %v %v", seed, err, res.Err)
			}
			written[k] = written[k] || op.Type != OpDelete || exists
		}
		if err := s.FinishBatch(b); err != nil {
			t.Fatal(err)
		}
		return b, written
	}
	filled, aborted := 0, 0
	for i := range 200 {
		b, written := apply()
		if rng.IntN(5) == 0 {
			// Not committed: its writes must not reach the cache.
			// (The shard's applied index moves on in memory only: the
			// test does not reload it.)
			s.EndBatch()
			b.Close()
			aborted++
			continue
		}
		if err := b.Commit(pebble.Sync); err != nil {
			t.Fatal(err)
		}
		b.Close()
		s.Committed()
		for _, k := range keys {
			ck := cacheKey(nil, 1, []byte(k))
			e, ok := c.stripe(ck).m[string(ck)]
			val, v, found, err := readLatest(db, 1, []byte(k))
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				if written[k] && len(val.Value) <= maxCachedValue {
					t.Fatalf("seed %d, batch %d: %q written and committed but not cached", seed, i, k)
				}
				continue
			}
			want := latestEntry{val: val, version: v, found: found}
			if !reflect.DeepEqual(e, want) {
				t.Fatalf("seed %d, batch %d: cached %q = %+v, storage has %+v", seed, i, k, e, want)
			}
			if written[k] {
				filled++
			}
		}
	}
	if filled == 0 || aborted == 0 {
		t.Fatalf("seed %d: %d writes filled the cache, %d batches not committed; the test must reach both", seed, filled, aborted)
	}
}
