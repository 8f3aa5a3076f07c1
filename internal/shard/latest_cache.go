package shard

import (
	"encoding/binary"
	"hash/maphash"
	"slices"
	"sync"

	"github.com/cockroachdb/pebble/v2"

	"github.com/groupkv/groupkv/internal/storage"
)

// LatestCache keeps the newest version of keys read recently, so that a
// read of the latest value (ReadLatestCached) is a map lookup instead of a
// Pebble point lookup (most of a get's CPU on a node).
//
// It holds only what storage holds. Every writer of a latest pointer
// marks the key pending when it writes the pointer into its batch, and
// after the batch is committed fills the key with the version the batch
// wrote, which ends the pending mark (Shard.writeVersion and the GC, then
// Shard.Committed; a pointer deleted or a value too large is only
// invalidated, and a batch not committed fills nothing; a snapshot
// restored, a replica cleared or a collection dropped clears the whole
// cache but the pending marks, before and after). A pending key is read
// from storage, and no read fills it: between the batch's commit and the
// fill, storage already holds the new value while a read that looked the
// key up before the commit holds the old one. Otherwise a reader fills the
// cache with what it read from storage only if no mark, fill or
// invalidation touched the key's stripe since it began. The replication
// loop commits, fills, and only then publishes the applied index and
// answers proposers, so a read that must see a write (after its ack, or
// after a read barrier that covers it) finds the new value or nothing,
// and once a read found the new value in storage no later read finds the
// old one in the cache. Reads of the latest value in the apply loop,
// through its batch, do not use the cache.
//
// Safe for concurrent use.
type LatestCache struct {
	seed      maphash.Seed
	perStripe int // bytes
	stripes   [latestStripes]latestStripe
}

const (
	latestStripes = 64
	// maxCachedValue bounds the value of a cached version; a larger one is
	// read from storage each time.
	maxCachedValue = 4 << 10
	// latestEntryOverhead approximates a map entry's bytes beyond its key
	// and value.
	latestEntryOverhead = 96
)

type latestStripe struct {
	mu sync.Mutex
	// gen counts the invalidations of the stripe's keys.
	gen   uint64
	bytes int
	m     map[string]latestEntry
}

type latestEntry struct {
	val     storage.MVCCValue
	version uint64
	found   bool
	// pending marks a key whose pointer a batch not yet committed and
	// published wrote: no value, and no fill replaces it (see LatestCache).
	pending bool
}

func (e *latestEntry) size(key string) int {
	n := len(key) + len(e.val.Value) + latestEntryOverhead
	for _, t := range e.val.Tags {
		n += len(t) + 16
	}
	return n
}

// NewLatestCache returns a cache of at most about maxBytes.
func NewLatestCache(maxBytes int) *LatestCache {
	c := &LatestCache{seed: maphash.MakeSeed(), perStripe: max(maxBytes/latestStripes, 1)}
	for i := range c.stripes {
		c.stripes[i].m = map[string]latestEntry{}
	}
	return c
}

// cacheKey is the map key of (collection, key), built in buf.
func cacheKey(buf []byte, collection uint32, key []byte) []byte {
	return append(binary.BigEndian.AppendUint32(buf[:0], collection), key...)
}

func (c *LatestCache) stripe(k []byte) *latestStripe {
	return &c.stripes[maphash.Bytes(c.seed, k)%latestStripes]
}

// pend marks key of collection pending, its pointer written into a batch
// not yet committed, until Invalidate or wrote, and refuses the fills of
// reads begun before.
func (c *LatestCache) pend(collection uint32, key []byte) {
	var buf [64]byte
	st, k := c.change(buf[:0], collection, key)
	if e, ok := st.m[string(k)]; ok {
		if e.pending {
			st.mu.Unlock()
			return
		}
		st.bytes -= e.size(string(k))
	}
	e := latestEntry{pending: true}
	st.m[string(k)] = e
	st.bytes += e.size(string(k))
	st.mu.Unlock()
}

// Invalidate forgets key of collection, and its pending mark, and refuses
// the fills of reads begun before.
func (c *LatestCache) Invalidate(collection uint32, key []byte) {
	var buf [64]byte
	st, k := c.change(buf[:0], collection, key)
	st.remove(k)
	st.mu.Unlock()
}

// change locks the stripe of key of collection for a change of the key,
// which refuses the fills of reads begun before, and returns it with the
// key's map key, built in buf. The caller unlocks the stripe.
func (c *LatestCache) change(buf []byte, collection uint32, key []byte) (*latestStripe, []byte) {
	k := cacheKey(buf, collection, key)
	st := c.stripe(k)
	st.mu.Lock()
	st.gen++
	return st, k
}

// remove forgets k's entry. The caller holds st.mu.
func (st *latestStripe) remove(k []byte) {
	if e, ok := st.m[string(k)]; ok {
		st.bytes -= e.size(string(k))
		delete(st.m, string(k))
	}
}

// Clear forgets every key but the pending ones and refuses the fills of
// reads begun before.
func (c *LatestCache) Clear() {
	for i := range c.stripes {
		st := &c.stripes[i]
		st.mu.Lock()
		st.gen++
		for k, e := range st.m {
			if !e.pending {
				st.bytes -= e.size(k)
				delete(st.m, k)
			}
		}
		st.mu.Unlock()
	}
}

// ReadLatestCached is ReadRecord(r, collection, key, Latest) answered from
// c where it can, r being the node's committed state (not a batch being
// applied, nor a snapshot). A nil c reads r. The value and tags are the
// caller's.
func ReadLatestCached(c *LatestCache, r pebble.Reader, collection uint32, key []byte) (val storage.MVCCValue, version uint64, found bool, err error) {
	return readLatestCached(c, r, collection, key, false)
}

// ReadLatestShared is ReadLatestCached for a caller that only reads the
// value and tags: they may be the cache's, and must not be modified.
func ReadLatestShared(c *LatestCache, r pebble.Reader, collection uint32, key []byte) (val storage.MVCCValue, version uint64, found bool, err error) {
	return readLatestCached(c, r, collection, key, true)
}

func readLatestCached(c *LatestCache, r pebble.Reader, collection uint32, key []byte, shared bool) (val storage.MVCCValue, version uint64, found bool, err error) {
	if c == nil {
		return readLatest(r, collection, key)
	}
	var buf [64]byte
	k := cacheKey(buf[:0], collection, key)
	st := c.stripe(k)
	st.mu.Lock()
	e, hit := st.m[string(k)]
	gen := st.gen
	st.mu.Unlock()
	pending := hit && e.pending
	if hit && !pending {
		v := e.val
		if !shared {
			v.Value = slices.Clone(v.Value)
			v.Tags = slices.Clone(v.Tags)
		}
		return v, e.version, e.found, nil
	}
	val, version, found, err = readLatest(r, collection, key)
	if err != nil || len(val.Value) > maxCachedValue {
		return val, version, found, err
	}
	e = latestEntry{val: val, version: version, found: found}
	if !shared {
		e.val.Value = slices.Clone(val.Value)
		e.val.Tags = slices.Clone(val.Tags)
	}
	st.mu.Lock()
	// A pending mark made since it began changed gen; one made before is
	// still there.
	if st.gen == gen && !pending {
		st.put(c.perStripe, string(k), e)
	}
	st.mu.Unlock()
	return val, version, found, nil
}

// put stores e as k's entry, evicting others to stay within limit bytes.
// The caller holds st.mu.
func (st *latestStripe) put(limit int, k string, e latestEntry) {
	size := e.size(k)
	if old, ok := st.m[k]; ok {
		st.bytes -= old.size(k)
		delete(st.m, k)
	}
	if st.bytes+size > limit {
		// Only when full: beginning a range over a large map costs a
		// random probe of its table, which every put used to pay.
		for other, o := range st.m {
			if st.bytes+size <= limit {
				break
			}
			if o.pending {
				continue // goes when its batch is published
			}
			st.bytes -= o.size(other)
			delete(st.m, other) // map order is random: a random victim
		}
	}
	if size <= limit {
		st.m[k] = e
		st.bytes += size
	}
}

// wrote makes version, with its encoded value (storage.EncodeValue), key's
// cached newest version, once the batch that wrote it is committed, and
// refuses the fills of reads begun before. The entry is what
// ReadLatestCached would read from storage.
func (c *LatestCache) wrote(collection uint32, key []byte, version uint64, encoded []byte) {
	v, err := storage.DecodeValue(encoded)
	var buf [64]byte
	st, k := c.change(buf[:0], collection, key)
	if err != nil || len(v.Value) > maxCachedValue {
		// (It encoded the value itself: an error cannot happen.)
		st.remove(k)
	} else {
		if len(v.Value) == 0 {
			v.Value = nil // as readLatest answers
		}
		st.put(c.perStripe, string(k), latestEntry{val: v, version: version, found: !v.Tombstone})
	}
	st.mu.Unlock()
}
