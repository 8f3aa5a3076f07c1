package node

import (
	"context"
	"hash/fnv"
	"sort"
	"sync"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/shard"
)

// Tag placement.
//
// A record of a tag collection lives in the shard of its placement tag: its
// first tag at its first put (a record put without tags is placed by its
// key). The placement index, kept by the key's home shard (the shard its key
// hashes to), maps the key to its placement tag so that a get by key finds
// the record. A write of a key of a tag collection runs under a per-key lock
// on this node:
//
//  1. read the key's placement from the home shard;
//  2. none: record the new placement in the home shard (a KindPlace
//     proposal, conditional on there still being none), then write the
//     record in the placement's shard;
//  3. the same as the write's: write the record;
//  4. another: if the record is live there, refuse with
//     placement_tag_changed; else (it was deleted) move the placement
//     (conditional on the old one) and write in the new shard.
//
// Deletes leave the placement in place; a later put with another first tag
// moves it through step 4. The data shard checks again, inside Apply, that
// a put does not change the bucket of a live record.

// keyLocks serializes the writes of one key of a tag collection.
type keyLocks struct {
	stripes [256]sync.Mutex
}

func (l *keyLocks) stripe(coll uint32, key []byte) int {
	h := fnv.New32a()
	h.Write([]byte{byte(coll >> 24), byte(coll >> 16), byte(coll >> 8), byte(coll)})
	h.Write(key)
	return int(h.Sum32() % uint32(len(l.stripes)))
}

// lock locks the stripes of keys (in order, so that batches cannot
// deadlock) and returns the unlock function.
func (l *keyLocks) lock(refs []lockRef) func() {
	idx := make([]int, 0, len(refs))
	seen := map[int]bool{}
	for _, r := range refs {
		i := l.stripe(r.coll, r.key)
		if !seen[i] {
			seen[i] = true
			idx = append(idx, i)
		}
	}
	sort.Ints(idx)
	for _, i := range idx {
		l.stripes[i].Lock()
	}
	return func() {
		for j := len(idx) - 1; j >= 0; j-- {
			l.stripes[idx[j]].Unlock()
		}
	}
}

type lockRef struct {
	coll uint32
	key  []byte
}

// homeOf returns the home bucket and shard of a key of a tag collection.
func homeOf(d *cluster.CollectionDesc, key []byte) (uint16, uint64) {
	b := cluster.Bucket(key)
	for _, s := range d.Shards {
		if uint32(b) >= s.BucketStart && uint32(b) < s.BucketEnd {
			return b, s.ID
		}
	}
	return b, d.Shards[len(d.Shards)-1].ID
}

// placementOf reads the placement tag of key (ok false: never placed).
func (n *Node) placementOf(ctx context.Context, d *cluster.CollectionDesc, key []byte) (string, bool, error) {
	p, err := n.placementPinOf(ctx, d, key)
	return p.Tag, p.OK, err
}

// placementPinOf reads the placement of key and the pin of the Key Group
// holding it, if one does (Pin).
func (n *Node) placementPinOf(ctx context.Context, d *cluster.CollectionDesc, key []byte) (partPlacement, error) {
	_, home := homeOf(d, key)
	if !n.localReadable(ctx, home) {
		return n.readPlacement(ctx, d, home, key)
	}
	if err := n.readBarrier(ctx, home); err != nil {
		return partPlacement{}, err
	}
	tag, pin, ok, err := shard.ReadPlacementPin(n.eng.DB, d.ID, key)
	if err != nil {
		return partPlacement{}, kv.Errorf(kv.CodeInternal, "reading the placement of %q: %v", key, err)
	}
	return partPlacement{Tag: tag, OK: ok, Pin: pin}, nil
}

// placeForPut makes the placement of key the one of tags (steps 1-4 above)
// and returns where the record goes. The caller holds the key's lock. A
// key a Key Group holds keeps its placement (its home shard refuses to
// move it): placeForPut then answers key_in_group, with the bucket and
// shard of the record, which the group's leader writes.
func (n *Node) placeForPut(ctx context.Context, d *cluster.CollectionDesc, key []byte, tags []string) (uint16, uint64, error) {
	want := ""
	if len(tags) > 0 {
		want = tags[0]
	}
	cur, err := n.placementPinOf(ctx, d, key)
	if err != nil {
		return 0, 0, err
	}
	bucket, i := d.Route(key, want)
	if cur.OK && cur.Tag == want {
		return bucket, d.Shards[i].ID, nil // its shard refuses it if a group holds it
	}
	if cur.Pin != "" {
		return n.pinnedPlacement(ctx, d, key)
	}
	if cur.OK {
		_, j := d.Route(key, cur.Tag)
		live, err := n.liveIn(ctx, d, d.Shards[j].ID, key)
		if err != nil {
			return 0, 0, err
		}
		if live {
			return 0, 0, kv.Errorf(kv.CodePlacementTagChanged,
				"key %q is placed by tag %q; a put must keep it as the first tag until the key is deleted", key, cur.Tag)
		}
	}
	hb, home := homeOf(d, key)
	res, err := n.propose(ctx, home, shard.EncodePlace(shard.Placement{Bucket: hb, Key: key, HasOld: cur.OK, Old: cur.Tag, New: want}))
	if err != nil {
		return 0, 0, err
	}
	if res.Err != nil {
		if res.Err.Code == kv.CodeKeyInGroup {
			return n.pinnedPlacement(ctx, d, key) // pinned since it was read
		}
		return 0, 0, res.Err
	}
	return bucket, d.Shards[i].ID, nil
}

// pinnedPlacement answers key_in_group for key, which a Key Group holds,
// with the bucket and shard of its record.
func (n *Node) pinnedPlacement(ctx context.Context, d *cluster.CollectionDesc, key []byte) (uint16, uint64, error) {
	cur, err := n.placementPinOf(ctx, d, key)
	if err != nil {
		return 0, 0, err
	}
	b, i := d.Route(key, cur.Tag)
	return b, d.Shards[i].ID, kv.Errorf(kv.CodeKeyInGroup, "key %q belongs to a group; write it in a transaction of the group", key)
}

// liveIn reports whether key has a live record in shard id (read here or
// on a node holding the shard).
func (n *Node) liveIn(ctx context.Context, d *cluster.CollectionDesc, id uint64, key []byte) (bool, error) {
	if !n.localReadable(ctx, id) {
		recs, err := n.readRecords(ctx, d, []uint64{id}, [][]byte{key}, 0, checkNone)
		if err != nil {
			return false, err
		}
		return recs[0].Found, nil
	}
	if err := n.readBarrier(ctx, id); err != nil {
		return false, err
	}
	_, _, live, err := shard.ReadRecord(n.eng.DB, d.ID, key, shard.Latest)
	if err != nil {
		return false, kv.Errorf(kv.CodeInternal, "reading %q: %v", key, err)
	}
	return live, nil
}

// shardsOf returns the ids of every shard of a collection.
func shardsOf(d *cluster.CollectionDesc) []uint64 {
	ids := make([]uint64, len(d.Shards))
	for i, s := range d.Shards {
		ids[i] = s.ID
	}
	return ids
}
