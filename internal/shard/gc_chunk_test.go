package shard

import (
	"bytes"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/groupkv/groupkv/internal/storage"
)

// TestGCInChunks: a garbage collection done in chunks of a few entries
// leaves every shard exactly as one done in a single Apply (but for the
// applied index), whatever the chunk size; the first chunk raises the
// threshold before anything is dropped; a key's versions are never split
// between chunks, even a key with more versions than a chunk's limit.
func TestGCInChunks(t *testing.T) {
	build := func() *snapEnv {
		e := newSnapEnv(t, 1)
		e.createCollections()
		e.workload(0)
		// A key of collection h with more versions than a chunk holds.
		c := e.colls[0]
		key := []byte("many")
		bucket, id := route(c, key)
		for i := range 9 {
			e.writeAt(id, e.nextVersion(), Op{Type: OpPut, Bucket: bucket, Key: key, Value: []byte{byte('a' + i)}})
		}
		e.writeAt(id, e.nextVersion(), Op{Type: OpDelete, Bucket: bucket, Key: key})
		return e
	}
	// dump is the DB without the applied indexes.
	dump := func(e *snapEnv) map[string]string {
		d := rawDump(t, e.db)
		for id := range e.shards {
			delete(d, string(storage.ShardStateKey(id, stateApplied)))
		}
		return d
	}
	whole := build()
	threshold := whole.version + 1 // every version but the newest of each key is collectable
	for id := range whole.shards {
		if res := whole.apply(id, EncodeGC(threshold)); res.GCNext != nil {
			t.Fatalf("a whole collection answered a next chunk %+v", res.GCNext)
		}
	}
	want := dump(whole)
	if before := dump(build()); len(diffDumps(before, want)) == 0 {
		t.Fatal("the collection dropped nothing: the test proves nothing")
	}
	for _, limit := range []uint64{1, 3, 7, 1000} {
		e := build()
		chunks := 0
		for id, s := range e.shards {
			chunk := &GCChunk{Limit: limit}
			for chunk != nil {
				cmd := EncodeGCChunk(threshold, *chunk)
				first := chunk.Key == nil
				res := e.apply(id, cmd)
				if first && !s.desc.IsMeta() && s.GCThreshold() != threshold {
					t.Fatalf("limit %d: shard %d's threshold is %d after the first chunk, want %d", limit, id, s.GCThreshold(), threshold)
				}
				if res.GCNext != nil && (res.GCNext.Key == nil || res.GCNext.Limit != limit) {
					t.Fatalf("limit %d: next chunk %+v", limit, res.GCNext)
				}
				if next := res.GCNext; next != nil && next.Phase == gcPhaseData {
					// A data chunk starts at a key's newest version.
					if it, err := e.db.NewIter(&pebble.IterOptions{UpperBound: next.Key}); err == nil {
						if it.Last() {
							dk, err1 := storage.DecodeDataKey(it.Key())
							nk, err2 := storage.DecodeDataKey(next.Key)
							if err1 == nil && err2 == nil && dk.Collection == nk.Collection && bytes.Equal(dk.UserKey, nk.UserKey) {
								t.Fatalf("limit %d: a chunk ends inside the versions of key %q", limit, nk.UserKey)
							}
						}
						it.Close()
					}
				}
				chunk = res.GCNext
				chunks++
			}
		}
		if diffs := diffDumps(dump(e), want); len(diffs) > 0 {
			t.Fatalf("limit %d (%d chunks): the DB differs from one collected in a single Apply:\n%v", limit, chunks, diffs)
		}
		if limit == 1 && chunks <= 2*len(e.shards) {
			t.Fatalf("limit 1 took %d chunks over %d shards: it did not chunk", chunks, len(e.shards))
		}
	}
	// A command from before chunks (the threshold alone) still decodes as
	// a whole collection, and a chunk round-trips.
	if c, err := DecodeCommand(EncodeGC(9)); err != nil || c.GC != nil || c.Threshold != 9 {
		t.Fatalf("EncodeGC decodes as %+v, %v", c, err)
	}
	ch := GCChunk{Phase: gcPhaseTags, Key: []byte("k"), Limit: 5}
	if c, err := DecodeCommand(EncodeGCChunk(9, ch)); err != nil || c.GC == nil || c.GC.Phase != ch.Phase || !bytes.Equal(c.GC.Key, ch.Key) || c.GC.Limit != 5 {
		t.Fatalf("EncodeGCChunk decodes as %+v, %v", c, err)
	}
	for _, bad := range []GCChunk{{Phase: 3, Limit: 1}, {Phase: gcPhaseData, Limit: 0}} {
		if _, err := DecodeCommand(EncodeGCChunk(9, bad)); err == nil {
			t.Errorf("chunk %+v decodes", bad)
		}
	}
}

// TestGCNothingToCollect: a collection at a threshold below every write
// of the shard's collection raises the threshold and changes nothing else,
// without walking the shard.
func TestGCNothingToCollect(t *testing.T) {
	e := newSnapEnv(t, 1)
	e.createCollections()
	c := e.colls[0]
	e.version = 100
	for i := range 20 {
		key := []byte{'k', byte('a' + i%5)}
		bucket, id := route(c, key)
		e.writeAt(id, e.nextVersion(), Op{Type: OpPut, Bucket: bucket, Key: key, Value: []byte{byte(i)}})
	}
	before := rawDump(t, e.db)
	for _, s := range c.Shards {
		// With a limit of 1 entry, a walk would answer a next chunk.
		if res := e.apply(s.ID, EncodeGCChunk(50, GCChunk{Limit: 1})); res.GCNext != nil {
			t.Fatalf("shard %d walked its entries (next chunk %+v) with nothing to collect", s.ID, res.GCNext)
		}
		if got := e.shards[s.ID].GCThreshold(); got != 50 {
			t.Fatalf("shard %d's threshold is %d, want 50", s.ID, got)
		}
	}
	after := rawDump(t, e.db)
	for _, s := range c.Shards {
		for _, name := range []string{stateApplied, stateGCThreshold} {
			k := string(storage.ShardStateKey(s.ID, name))
			delete(before, k)
			delete(after, k)
		}
	}
	if diffs := diffDumps(before, after); len(diffs) > 0 {
		t.Fatalf("a collection below every write changed the DB:\n%v", diffs)
	}
}
