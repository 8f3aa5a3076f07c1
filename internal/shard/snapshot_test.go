package shard

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/storage"
)

// snapEnv is a Pebble DB on an in-memory filesystem with shard state
// machines applying real commands into it, like a node's.
type snapEnv struct {
	t       *testing.T
	db      *pebble.DB
	shards  map[uint64]*Shard
	term    uint64
	version uint64
	colls   []*cluster.CollectionDesc
}

func newSnapEnv(t *testing.T, term uint64) *snapEnv {
	t.Helper()
	eng, err := storage.Open("/d", storage.Options{FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	return &snapEnv{t: t, db: eng.DB, shards: map[uint64]*Shard{}, term: term}
}

func (e *snapEnv) load(d Desc) *Shard {
	e.t.Helper()
	s, err := Load(e.db, d)
	if err != nil {
		e.t.Fatal(err)
	}
	e.shards[d.ShardID] = s
	return s
}

// apply applies cmd as the next entry of shard id and commits it.
func (e *snapEnv) apply(id uint64, cmd []byte) Result {
	e.t.Helper()
	s := e.shards[id]
	if s == nil {
		e.t.Fatalf("no shard %d", id)
	}
	applied, _ := s.Applied()
	b := e.db.NewIndexedBatch()
	defer b.Close()
	res, err := s.Apply(b, applied+1, e.term, cmd)
	if err != nil {
		e.t.Fatalf("shard %d: %v", id, err)
	}
	if res.Err != nil {
		e.t.Fatalf("shard %d: %s: %s", id, res.Err.Code, res.Err.Message)
	}
	if err := s.FinishBatch(b); err != nil {
		e.t.Fatal(err)
	}
	e.commitAndSum(b, res)
	return res
}

// commitAndSum commits b and, the way the Host does, computes the
// checksums of results off the batch, from a snapshot taken before the
// commit.
func (e *snapEnv) commitAndSum(b *pebble.Batch, results ...Result) {
	e.t.Helper()
	var snap *pebble.Snapshot
	for _, r := range results {
		if r.Checksum != nil && snap == nil {
			snap = e.db.NewSnapshot()
			defer snap.Close()
		}
	}
	if err := b.Commit(pebble.Sync); err != nil {
		e.t.Fatal(err)
	}
	for _, r := range results {
		if r.Checksum != nil {
			r.Checksum.Run(snap, nil, 0)
			if err := r.Checksum.Err(); err != nil {
				e.t.Fatal(err)
			}
		}
	}
}

func (e *snapEnv) nextVersion() uint64 {
	e.version++
	return e.version
}

func (e *snapEnv) writeAt(id, version uint64, ops ...Op) {
	e.t.Helper()
	cmd := EncodeWrite(ops)
	SetVersion(cmd, version)
	e.apply(id, cmd)
}

func (e *snapEnv) deleteRangeAt(id, version uint64, start, end []byte) {
	e.t.Helper()
	cmd := EncodeDeleteRange(start, end)
	SetVersion(cmd, version)
	e.apply(id, cmd)
}

var snapCollections = []kv.CollectionOptions{
	{Name: "h", Partitioning: kv.PartitionHash, Shards: 2},
	{Name: "r", Partitioning: kv.PartitionRange, SplitPoints: [][]byte{[]byte("m")}},
	{Name: "t", Partitioning: kv.PartitionTag, Shards: 2},
}

// createCollections creates the test collections through the meta shard
// and loads the state machines of their shards.
func (e *snapEnv) createCollections() {
	e.t.Helper()
	e.load(MetaDesc)
	for _, opts := range snapCollections {
		res := e.apply(cluster.MetaShardID, EncodeCreateCollection(opts, []uint64{1, 2, 3}))
		e.colls = append(e.colls, res.Desc)
		for _, s := range res.Desc.Shards {
			e.load(DescFor(res.Desc, s))
		}
	}
	e.apply(cluster.MetaShardID, EncodeTSO(1000*e.term))
}

// placeTags are placement tags of the tag collection, alternating between
// its two shards.
var placeTags = func() []string {
	var lo, hi []string
	for i := 0; len(lo) < 2 || len(hi) < 2; i++ {
		t := fmt.Sprintf("p%d", i)
		if cluster.Bucket([]byte(t)) < 1<<15 {
			lo = append(lo, t)
		} else {
			hi = append(hi, t)
		}
	}
	return []string{lo[0], hi[0], lo[1], hi[1]}
}()

// snapKeys returns the keys variant writes in collection c.
func snapKeys(c *cluster.CollectionDesc, variant int) [][]byte {
	var keys [][]byte
	for i := 0; i < 24; i++ {
		if variant == 1 && i%3 == 1 {
			continue
		}
		switch c.Partitioning {
		case kv.PartitionRange:
			keys = append(keys, []byte(fmt.Sprintf("%c%02d", 'a'+(i*7)%26, i)))
		default:
			keys = append(keys, []byte(fmt.Sprintf("k%02d", i)))
		}
	}
	// Keys that escape, and keys at the split point.
	keys = append(keys, []byte("\x00"), []byte("m"), []byte("m\x00"), []byte("l\xff\xff"))
	if variant == 1 {
		keys = append(keys, []byte("stale1"), []byte("a-stale"), []byte("z-stale"))
	}
	return keys
}

func snapUniverse(c *cluster.CollectionDesc) [][]byte {
	seen := map[string]bool{}
	var out [][]byte
	for v := 0; v < 2; v++ {
		for _, k := range snapKeys(c, v) {
			if !seen[string(k)] {
				seen[string(k)] = true
				out = append(out, k)
			}
		}
	}
	return out
}

// placementTag is the placement tag of key in the tag collection ("": placed
// by key), the same in every variant.
func placementTag(key []byte) string {
	h := cluster.Bucket(append([]byte("pt"), key...))
	if h%5 == 4 {
		return ""
	}
	return placeTags[int(h)%len(placeTags)]
}

// recordTags returns the tags of generation gen of key.
func recordTags(c *cluster.CollectionDesc, key []byte, gen int) []string {
	sets := [][]string{{"red", "blue"}, {"blue", "green"}, {"green"}, nil}
	tags := sets[(int(cluster.Bucket(key))+gen)%len(sets)]
	if c.Partitioning == kv.PartitionTag {
		pt := placementTag(key)
		if pt == "" {
			return nil
		}
		return append([]string{pt}, tags...)
	}
	return tags
}

var snapTagNames = []string{"red", "blue", "green", placeTags[0], placeTags[1], placeTags[2], placeTags[3]}

// route returns the bucket the record of key is stored under and its shard.
func route(c *cluster.CollectionDesc, key []byte) (uint16, uint64) {
	bucket, i := c.Route(key, placementTag(key))
	return bucket, c.Shards[i].ID
}

// workload applies variant's writes to every shard of every collection.
func (e *snapEnv) workload(variant int) {
	e.t.Helper()
	for _, c := range e.colls {
		keys := snapKeys(c, variant)
		put := func(key []byte, gen int) {
			bucket, id := route(c, key)
			e.writeAt(id, e.nextVersion(), Op{Type: OpPut, Bucket: bucket, Key: key,
				Tags: recordTags(c, key, gen), Value: []byte(fmt.Sprintf("v%d-g%d-%q", variant, gen, key))})
		}
		del := func(key []byte) {
			bucket, id := route(c, key)
			e.writeAt(id, e.nextVersion(), Op{Type: OpDelete, Bucket: bucket, Key: key})
		}
		for _, k := range keys {
			if c.Partitioning == kv.PartitionTag {
				hb := cluster.Bucket(k)
				_, home := c.Route(k, "")
				e.apply(c.Shards[home].ID, EncodePlace(Placement{Bucket: hb, Key: k, New: placementTag(k)}))
			}
			put(k, variant)
		}
		for i, k := range keys {
			if i%3 == 0 {
				put(k, variant+1) // new value, tags added and removed
			}
		}
		for i, k := range keys {
			switch i % 4 {
			case 1:
				del(k)
			case 2:
				if variant == 0 {
					del(k)
					put(k, 2)
				}
			}
		}
		// A delete-range in every shard.
		start, end := []byte("k10"), []byte("k14")
		if c.Partitioning == kv.PartitionRange {
			start, end = []byte("c"), []byte("p")
		}
		for _, s := range c.Shards {
			e.deleteRangeAt(s.ID, e.nextVersion(), start, end)
		}
		// GC in every shard, at a version in the middle of the history.
		threshold := e.version - 10
		for _, s := range c.Shards {
			e.apply(s.ID, EncodeGC(threshold))
			threshold += 3
		}
		for i, k := range keys {
			if i%5 == variant {
				put(k, 3)
			}
		}
	}
	if variant == 0 {
		e.apply(cluster.MetaShardID, EncodeCreateCollection(kv.CollectionOptions{Name: "late"}, []uint64{1}))
		e.apply(cluster.MetaShardID, EncodeTSO(5000))
	} else {
		e.apply(cluster.MetaShardID, EncodeCreateCollection(kv.CollectionOptions{Name: "stale", Shards: 3}, []uint64{2}))
		e.apply(cluster.MetaShardID, EncodeDropCollection("r"))
	}
}

// collOf returns the collection of data shard id and its Desc.
func (e *snapEnv) collOf(id uint64) (*cluster.CollectionDesc, Desc) {
	for _, c := range e.colls {
		for _, s := range c.Shards {
			if s.ID == id {
				return c, DescFor(c, s)
			}
		}
	}
	e.t.Fatalf("no shard %d", id)
	return nil, Desc{}
}

// view renders everything the package's read functions answer about shard
// d of collection c in r: its state, its records at every version, its tag
// index, its change log, its placement entries.
func view(t *testing.T, r pebble.Reader, c *cluster.CollectionDesc, d Desc, maxVersion uint64) string {
	t.Helper()
	var sb strings.Builder
	s, err := Load(r, d)
	if err != nil {
		t.Fatal(err)
	}
	gc, err := ReadGCThreshold(r, d.ShardID)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(&sb, "%s gc=%d\n", formatState(s), gc)
	if d.IsMeta() {
		descs, err := LoadCatalog(r)
		if err != nil {
			t.Fatal(err)
		}
		for _, cd := range descs {
			sb.WriteString(formatCollection(cd))
		}
		for _, name := range []string{catalogNextCollection, catalogNextShard, catalogTSO} {
			v, err := storage.GetUint64(r, storage.CatalogKey(name))
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&sb, "%s=%d\n", name, v)
		}
		return sb.String()
	}
	inRange := func(key []byte) bool {
		return bytes.Compare(key, d.Start) >= 0 && (d.End == nil || bytes.Compare(key, d.End) < 0)
	}
	owned := func(bucket uint16, key []byte) bool {
		if d.Partitioning == kv.PartitionRange {
			return inRange(key)
		}
		return d.OwnsBucket(bucket)
	}
	opts := ScanOptions{Collection: d.Collection}
	var ownedBucket func(uint16) bool
	if d.Partitioning == kv.PartitionRange {
		opts.Start, opts.End = d.Start, d.End
	} else {
		ownedBucket = d.OwnsBucket
		opts.Owned = ownedBucket
	}
	asOfs := []uint64{Latest}
	for v := uint64(0); v <= maxVersion+1; v++ {
		asOfs = append(asOfs, v)
	}
	for _, asOf := range asOfs {
		for _, reverse := range []bool{false, true} {
			o := opts
			o.AsOf, o.Reverse = asOf, reverse
			fmt.Fprintf(&sb, "scan as-of=%d reverse=%t:", asOf, reverse)
			err := Scan(r, o, func(rec ScanRecord) bool {
				fmt.Fprintf(&sb, " %q@%d/b%d[%s]=%q", rec.Key, rec.Version, rec.Bucket, strings.Join(rec.Tags, ","), rec.Value)
				return true
			})
			if err != nil {
				t.Fatal(err)
			}
			sb.WriteString("\n")
		}
		for _, tag := range snapTagNames {
			fmt.Fprintf(&sb, "tag %s as-of=%d:", tag, asOf)
			err := TagKeys(r, d.Collection, tag, asOf, nil, ownedBucket, func(key []byte) bool {
				if d.Partitioning != kv.PartitionRange || inRange(key) {
					fmt.Fprintf(&sb, " %q", key)
				}
				return true
			})
			if err != nil {
				t.Fatal(err)
			}
			sb.WriteString("\n")
		}
	}
	for _, key := range snapUniverse(c) {
		bucket, _ := route(c, key)
		if owned(bucket, key) {
			for _, asOf := range asOfs {
				val, version, found, err := ReadRecord(r, d.Collection, key, asOf)
				if err != nil {
					t.Fatal(err)
				}
				fmt.Fprintf(&sb, "get %q as-of=%d: found=%t version=%d %s b%d\n", key, asOf, found, version, formatValue(val), val.Bucket)
			}
		}
		if d.Partitioning == kv.PartitionTag && d.OwnsBucket(cluster.Bucket(key)) {
			tag, ok, err := ReadPlacement(r, d.Collection, key)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&sb, "placement %q: %t %q\n", key, ok, tag)
		}
	}
	sb.WriteString("changes:")
	err = Changes(r, d.Collection, 0, Latest, nil, func(ch Change) bool {
		if owned(ch.Bucket, ch.Key) {
			fmt.Fprintf(&sb, " %d:%q/b%d", ch.Version, ch.Key, ch.Bucket)
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	sb.WriteString("\n")
	return sb.String()
}

// rawDump returns every key/value pair of r.
func rawDump(t *testing.T, r pebble.Reader) map[string]string {
	t.Helper()
	it, err := r.NewIter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	out := map[string]string{}
	for valid := it.First(); valid; valid = it.Next() {
		out[string(it.Key())] = string(it.Value())
	}
	if err := it.Error(); err != nil {
		t.Fatal(err)
	}
	return out
}

// ownerOf tells, independently of the code under test, which shard owns a
// raw key of the DB: 0 when none of the test's shards (node keys), the
// shard id otherwise.
func ownerOf(t *testing.T, colls []*cluster.CollectionDesc, k, v string) uint64 {
	t.Helper()
	key := []byte(k)
	switch key[0] {
	case 0x01, 0x02:
		return 0
	case 0x03:
		return binary.BigEndian.Uint64(key[1:9])
	case 0x04:
		return cluster.MetaShardID
	}
	coll := binary.BigEndian.Uint32(key[1:5])
	var c *cluster.CollectionDesc
	for _, cd := range colls {
		if cd.ID == coll {
			c = cd
		}
	}
	if c == nil {
		t.Fatalf("key %x of unknown collection %d", key, coll)
	}
	var (
		userKey []byte
		bucket  uint16
	)
	switch key[0] {
	case 0x05:
		dk, err := storage.DecodeDataKey(key)
		if err != nil {
			t.Fatal(err)
		}
		mv, err := storage.DecodeValue([]byte(v))
		if err != nil {
			t.Fatal(err)
		}
		userKey, bucket = dk.UserKey, mv.Bucket
	case 0x06:
		_, _, uk, _, err := storage.DecodeTagIndexKey(key)
		if err != nil {
			t.Fatal(err)
		}
		userKey, bucket = uk, binary.BigEndian.Uint16([]byte(v)[1:])
	case 0x07:
		_, _, uk, err := storage.DecodeChangeKey(key)
		if err != nil {
			t.Fatal(err)
		}
		userKey, bucket = uk, binary.BigEndian.Uint16([]byte(v))
	case 0x08:
		uk, _, err := storage.UnescapeKey(key[5:])
		if err != nil {
			t.Fatal(err)
		}
		userKey, bucket = uk, cluster.Bucket(uk)
	case 0x09:
		uk, _, err := storage.UnescapeKey(key[5:])
		if err != nil {
			t.Fatal(err)
		}
		userKey, bucket = uk, binary.BigEndian.Uint16([]byte(v)[8:])
	default:
		t.Fatalf("unknown key %x", key)
	}
	for _, s := range c.Shards {
		if c.Partitioning == kv.PartitionRange {
			if bytes.Compare(userKey, s.Start) >= 0 && (s.End == nil || bytes.Compare(userKey, s.End) < 0) {
				return s.ID
			}
		} else if uint32(bucket) >= s.BucketStart && uint32(bucket) < s.BucketEnd {
			return s.ID
		}
	}
	t.Fatalf("key %x has no owner", key)
	return 0
}

// ownedDump returns the pairs of dump that shard id owns.
func ownedDump(t *testing.T, colls []*cluster.CollectionDesc, dump map[string]string, id uint64) map[string]string {
	out := map[string]string{}
	for k, v := range dump {
		if ownerOf(t, colls, k, v) == id {
			out[k] = v
		}
	}
	return out
}

func diffDumps(a, b map[string]string) []string {
	var diffs []string
	for k, v := range a {
		if w, ok := b[k]; !ok {
			diffs = append(diffs, fmt.Sprintf("%x only in the first", k))
		} else if v != w {
			diffs = append(diffs, fmt.Sprintf("%x: %x != %x", k, v, w))
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			diffs = append(diffs, fmt.Sprintf("%x only in the second", k))
		}
	}
	sort.Strings(diffs)
	return diffs
}

// snapshotOf returns SnapshotData of shard d read from a Pebble snapshot.
func snapshotOf(t *testing.T, db *pebble.DB, d Desc) []byte {
	t.Helper()
	snap := db.NewSnapshot()
	defer snap.Close()
	data, err := SnapshotData(snap, d)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// restore restores data into shard d of db in one committed batch.
func restore(t *testing.T, db *pebble.DB, d Desc, data []byte) {
	t.Helper()
	b := db.NewBatch()
	defer b.Close()
	if err := RestoreSnapshot(b, db, d, data); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(pebble.Sync); err != nil {
		t.Fatal(err)
	}
}

func sameState(t *testing.T, what string, got, want *Shard) {
	t.Helper()
	gi, gt := got.Applied()
	wi, wt := want.Applied()
	if gi != wi || gt != wt || got.MaxVersion() != want.MaxVersion() || got.GCThreshold() != want.GCThreshold() || got.TSOHighWater() != want.TSOHighWater() {
		t.Errorf("%s: loaded %s, want %s", what, formatState(got), formatState(want))
	}
}

func compareViews(t *testing.T, what, got, want string) {
	t.Helper()
	if got == want {
		return
	}
	gl, wl := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := 0; i < len(gl) || i < len(wl); i++ {
		var g, w string
		if i < len(gl) {
			g = gl[i]
		}
		if i < len(wl) {
			w = wl[i]
		}
		if g != w {
			t.Errorf("%s: views differ at line %d:\n  got:  %s\n  want: %s", what, i+1, g, w)
			return
		}
	}
}

// TestSnapshotRestoreDataShards takes a snapshot of every shard of a hash, a
// range and a tag collection sharing one DB and restores it into an empty
// DB, into a DB holding stale state of every shard, and into the source DB
// itself.
func TestSnapshotRestoreDataShards(t *testing.T) {
	src := newSnapEnv(t, 3)
	src.createCollections()
	src.workload(0)
	srcDump := rawDump(t, src.db)
	for _, c := range src.colls {
		for _, sd := range c.Shards {
			d := DescFor(c, sd)
			t.Run(fmt.Sprintf("%s/shard%d", c.Name, d.ShardID), func(t *testing.T) {
				data := snapshotOf(t, src.db, d)
				want := view(t, src.db, c, d, src.version)
				wantState := src.shards[d.ShardID]
				if len(ownedDump(t, src.colls, srcDump, d.ShardID)) < 20 {
					t.Fatalf("the workload left too little in shard %d", d.ShardID)
				}

				t.Run("empty", func(t *testing.T) {
					dst := newSnapEnv(t, 1)
					restore(t, dst.db, d, data)
					compareViews(t, "restored", view(t, dst.db, c, d, src.version), want)
					sameState(t, "restored", dst.load(d), wantState)
					// The DB holds the shard's keys and nothing else.
					got := rawDump(t, dst.db)
					for k := range got {
						if k[0] == 0x01 {
							delete(got, k) // node keys of the fresh DB
						}
					}
					if diffs := diffDumps(got, ownedDump(t, src.colls, srcDump, d.ShardID)); len(diffs) > 0 {
						t.Errorf("restored keys differ from the source's:\n%s", strings.Join(diffs, "\n"))
					}
					if again := snapshotOf(t, dst.db, d); !bytes.Equal(again, data) {
						t.Errorf("a snapshot of the restored shard differs from the one restored")
					}
				})

				t.Run("stale", func(t *testing.T) {
					dst := newSnapEnv(t, 2)
					dst.createCollections()
					dst.workload(1)
					before := rawDump(t, dst.db)
					var others []Desc
					otherViews := map[uint64]string{}
					for _, oc := range dst.colls {
						for _, os := range oc.Shards {
							if os.ID != d.ShardID {
								od := DescFor(oc, os)
								others = append(others, od)
								otherViews[od.ShardID] = view(t, dst.db, oc, od, dst.version)
							}
						}
					}
					otherViews[cluster.MetaShardID] = view(t, dst.db, nil, MetaDesc, 0)
					if view(t, dst.db, c, d, src.version) == want {
						t.Fatal("the stale state equals the source's")
					}

					restore(t, dst.db, d, data)

					// (a) The shard reads as in the source.
					compareViews(t, "restored", view(t, dst.db, c, d, src.version), want)
					// (c) Its persisted state is the source's.
					restored := dst.load(d)
					sameState(t, "restored", restored, wantState)
					// (b) Other shards are untouched: they read the same,
					// and every key not owned by the shard is unchanged.
					for _, od := range others {
						oc, _ := dst.collOf(od.ShardID)
						compareViews(t, fmt.Sprintf("shard %d", od.ShardID), view(t, dst.db, oc, od, dst.version), otherViews[od.ShardID])
					}
					compareViews(t, "meta shard", view(t, dst.db, nil, MetaDesc, 0), otherViews[cluster.MetaShardID])
					after := rawDump(t, dst.db)
					notOwned := func(dump map[string]string) map[string]string {
						out := map[string]string{}
						for k, v := range dump {
							if ownerOf(t, dst.colls, k, v) != d.ShardID {
								out[k] = v
							}
						}
						return out
					}
					if diffs := diffDumps(notOwned(after), notOwned(before)); len(diffs) > 0 {
						t.Errorf("keys of other shards changed:\n%s", strings.Join(diffs, "\n"))
					}
					if diffs := diffDumps(ownedDump(t, dst.colls, after, d.ShardID), ownedDump(t, src.colls, srcDump, d.ShardID)); len(diffs) > 0 {
						t.Errorf("restored keys differ from the source's:\n%s", strings.Join(diffs, "\n"))
					}

					// The restored shard goes on applying like the source.
					next := max(src.version, dst.version) + 1
					key := snapKeys(c, 0)[0]
					for _, k := range snapUniverse(c) {
						if _, id := route(c, k); id == d.ShardID {
							key = k
							break
						}
					}
					bucket, _ := route(c, key)
					op := Op{Type: OpPut, Bucket: bucket, Key: key, Tags: recordTags(c, key, 1), Value: []byte("next")}
					after1 := newSnapEnv(t, 3)
					restore(t, after1.db, d, data)
					after1.load(d)
					after1.term, dst.term = 4, 4
					for _, e := range []*snapEnv{after1, dst} {
						e.writeAt(d.ShardID, next, op)
						e.apply(d.ShardID, EncodeGC(next-2))
					}
					compareViews(t, "after more entries", view(t, dst.db, c, d, next), view(t, after1.db, c, d, next))
					sameState(t, "after more entries", dst.load(d), after1.load(d))
				})

				t.Run("same-db", func(t *testing.T) {
					// Restoring a shard's own snapshot changes nothing.
					dst := newSnapEnv(t, 3)
					dst.createCollections()
					dst.workload(0)
					before := rawDump(t, dst.db)
					if diffs := diffDumps(before, srcDump); len(diffs) > 0 {
						t.Fatalf("the workload is not deterministic:\n%s", strings.Join(diffs, "\n"))
					}
					restore(t, dst.db, d, data)
					if diffs := diffDumps(rawDump(t, dst.db), before); len(diffs) > 0 {
						t.Errorf("restoring the shard's own state changed the DB:\n%s", strings.Join(diffs, "\n"))
					}
				})
			})
		}
	}
}

// TestSnapshotRestoreMetaShard restores the meta shard's catalog and TSO
// mark over a stale catalog.
func TestSnapshotRestoreMetaShard(t *testing.T) {
	src := newSnapEnv(t, 3)
	src.createCollections()
	src.workload(0)
	data := snapshotOf(t, src.db, MetaDesc)
	want := view(t, src.db, nil, MetaDesc, 0)

	dst := newSnapEnv(t, 2)
	dst.createCollections()
	dst.workload(1)
	dst.apply(cluster.MetaShardID, EncodeTSO(9999))
	if view(t, dst.db, nil, MetaDesc, 0) == want {
		t.Fatal("the stale catalog equals the source's")
	}
	before := rawDump(t, dst.db)
	var dataViews []string
	for _, c := range dst.colls {
		for _, s := range c.Shards {
			dataViews = append(dataViews, view(t, dst.db, c, DescFor(c, s), dst.version))
		}
	}

	restore(t, dst.db, MetaDesc, data)

	compareViews(t, "restored", view(t, dst.db, nil, MetaDesc, 0), want)
	restored := dst.load(MetaDesc)
	sameState(t, "restored", restored, src.shards[cluster.MetaShardID])
	if restored.TSOHighWater() != 5000 {
		t.Errorf("TSO mark %d, want 5000", restored.TSOHighWater())
	}
	i := 0
	for _, c := range dst.colls {
		for _, s := range c.Shards {
			compareViews(t, fmt.Sprintf("shard %d", s.ID), view(t, dst.db, c, DescFor(c, s), dst.version), dataViews[i])
			i++
		}
	}
	after := rawDump(t, dst.db)
	for k, v := range before {
		if ownerOf(t, dst.colls, k, v) != cluster.MetaShardID && after[k] != v {
			t.Errorf("key %x of another shard changed", k)
		}
	}
	for k, v := range after {
		if ownerOf(t, dst.colls, k, v) != cluster.MetaShardID && before[k] != v {
			t.Errorf("key %x of another shard appeared", k)
		}
	}

	// Into an empty DB.
	empty := newSnapEnv(t, 1)
	restore(t, empty.db, MetaDesc, data)
	compareViews(t, "restored into an empty DB", view(t, empty.db, nil, MetaDesc, 0), want)
	if again := snapshotOf(t, empty.db, MetaDesc); !bytes.Equal(again, data) {
		t.Errorf("a snapshot of the restored meta shard differs from the one restored")
	}
}

// TestRestoreSnapshotRefusesBadData checks that corrupt data and data of
// another shard are refused before anything is written.
func TestRestoreSnapshotRefusesBadData(t *testing.T) {
	src := newSnapEnv(t, 3)
	src.createCollections()
	src.workload(0)
	hash := src.colls[0]
	d2, d3 := DescFor(hash, hash.Shards[0]), DescFor(hash, hash.Shards[1])
	data := snapshotOf(t, src.db, d2)
	meta := snapshotOf(t, src.db, MetaDesc)

	refuse := func(what string, d Desc, data []byte, want error) {
		t.Helper()
		b := src.db.NewIndexedBatch()
		defer b.Close()
		err := RestoreSnapshot(b, src.db, d, data)
		if err == nil {
			t.Errorf("%s: restored", what)
			return
		}
		if !errors.Is(err, want) {
			t.Errorf("%s: error %v, want %v", what, err, want)
		}
		if !b.Empty() {
			t.Errorf("%s: the batch holds %d writes", what, b.Count())
		}
	}

	for n := 0; n < len(data); n++ {
		refuse(fmt.Sprintf("truncated to %d bytes", n), d2, data[:n], ErrCorruptSnapshot)
	}
	bad := append([]byte(nil), data...)
	bad[0] = 2
	refuse("version 2", d2, bad, ErrCorruptSnapshot)
	bad[0] = 0
	refuse("version 0", d2, bad, ErrCorruptSnapshot)
	for _, i := range []int{1, 5, len(data) / 2, len(data) - 7, len(data) - 1} {
		bad := append([]byte(nil), data...)
		bad[i] ^= 0x10
		refuse(fmt.Sprintf("byte %d flipped", i), d2, bad, ErrCorruptSnapshot)
	}
	refuse("trailing bytes", d2, append(append([]byte(nil), data...), 0), ErrCorruptSnapshot)

	refuse("snapshot of shard 2 into shard 3", d3, data, ErrSnapshotMismatch)
	refuse("snapshot of the meta shard into shard 2", d2, meta, ErrSnapshotMismatch)
	refuse("snapshot of shard 2 into the meta shard", MetaDesc, data, ErrSnapshotMismatch)
	other := d2
	other.Collection = src.colls[2].ID
	other.Partitioning = kv.PartitionTag
	refuse("snapshot of shard 2 into another collection", other, data, ErrSnapshotMismatch)
	// (A snapshot of another span of the shard is restored with its span:
	// TestSnapshotAcrossMerge.)

	// Well-formed data, with a valid checksum, holding a key of shard 3.
	craft := func(pairs ...[2][]byte) []byte {
		buf := appendSnapshotHeader(nil, d2)
		var prev []byte
		for _, p := range pairs {
			buf = appendSnapshotPair(buf, prev, p[0], p[1])
			prev = p[0]
		}
		return finishSnapshot(buf)
	}
	applied := storage.ShardStateKey(d2.ShardID, stateApplied)
	appliedVal := make([]byte, 16)
	var foreign []byte
	for _, k := range snapUniverse(hash) {
		if _, id := route(hash, k); id == d3.ShardID {
			foreign = k
			break
		}
	}
	foreignVal := storage.EncodeValue(nil, storage.MVCCValue{Bucket: cluster.Bucket(foreign), Value: []byte("x")})
	ownedKey := []byte(nil)
	for _, k := range snapUniverse(hash) {
		if _, id := route(hash, k); id == d2.ShardID {
			ownedKey = k
			break
		}
	}
	ownedVal := storage.EncodeValue(nil, storage.MVCCValue{Bucket: cluster.Bucket(ownedKey), Value: []byte("x")})
	ok := src.db.NewBatch()
	if err := RestoreSnapshot(ok, src.db, d2, craft([2][]byte{applied, appliedVal},
		[2][]byte{storage.DataKey(nil, d2.Collection, ownedKey, 7), ownedVal})); err != nil {
		t.Fatalf("a crafted snapshot of owned keys is refused: %v", err)
	}
	ok.Close()
	refuse("a data version of shard 3", d2, craft([2][]byte{applied, appliedVal},
		[2][]byte{storage.DataKey(nil, d2.Collection, foreign, 7), foreignVal}), ErrCorruptSnapshot)
	refuse("a latest pointer of shard 3", d2, craft(
		[2][]byte{storage.LatestKey(nil, d2.Collection, foreign), binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint64(nil, 7), cluster.Bucket(foreign))}), ErrCorruptSnapshot)
	refuse("a change of shard 3", d2, craft(
		[2][]byte{storage.ChangeKey(nil, d2.Collection, 7, foreign), binary.BigEndian.AppendUint16(nil, cluster.Bucket(foreign))}), ErrCorruptSnapshot)
	refuse("a key of another collection", d2, craft(
		[2][]byte{storage.DataKey(nil, d2.Collection+1, ownedKey, 7), ownedVal}), ErrCorruptSnapshot)
	refuse("the state of shard 3", d2, craft(
		[2][]byte{storage.ShardStateKey(d3.ShardID, stateApplied), appliedVal}), ErrCorruptSnapshot)
	refuse("a catalog key", d2, craft(
		[2][]byte{storage.CatalogKey(catalogTSO), appliedVal[:8]}), ErrCorruptSnapshot)
	refuse("a raft key", d2, craft(
		[2][]byte{storage.RaftHardStateKey(d2.ShardID), appliedVal}), ErrCorruptSnapshot)
	refuse("a corrupt value", d2, craft(
		[2][]byte{storage.DataKey(nil, d2.Collection, ownedKey, 7), []byte{9, 9}}), ErrCorruptSnapshot)
	refuse("keys out of order", d2, craft(
		[2][]byte{storage.DataKey(nil, d2.Collection, ownedKey, 7), ownedVal},
		[2][]byte{applied, appliedVal}), ErrCorruptSnapshot)
	refuse("a repeated key", d2, craft(
		[2][]byte{applied, appliedVal}, [2][]byte{applied, appliedVal}), ErrCorruptSnapshot)
}

// TestRestoreSnapshotKeepsNewerPointerOfOtherShard: a key of a tag
// collection deleted in one shard and put again, under another placement
// tag, in the other has versions in both, and one latest pointer. A
// snapshot of the first shard taken before the put carries the pointer to
// its tombstone; restoring it where the second shard's put is applied does
// not replace the pointer to the newer version.
func TestRestoreSnapshotKeepsNewerPointerOfOtherShard(t *testing.T) {
	tagColl := func(e *snapEnv) (*cluster.CollectionDesc, Desc, Desc) {
		c := e.colls[2]
		return c, DescFor(c, c.Shards[0]), DescFor(c, c.Shards[1])
	}
	key := []byte("moved")
	// placeTags alternate between the shards: [0] is in shard A, [1] in B.
	bA, bB := cluster.Bucket([]byte(placeTags[0])), cluster.Bucket([]byte(placeTags[1]))

	src := newSnapEnv(t, 3)
	src.createCollections()
	_, a, b := tagColl(src)
	src.writeAt(a.ShardID, 10, Op{Type: OpPut, Bucket: bA, Key: key, Tags: []string{placeTags[0]}, Value: []byte("in a")})
	src.writeAt(a.ShardID, 11, Op{Type: OpDelete, Bucket: bA, Key: key})
	data := snapshotOf(t, src.db, a)

	dst := newSnapEnv(t, 3)
	dst.createCollections()
	dst.writeAt(a.ShardID, 10, Op{Type: OpPut, Bucket: bA, Key: key, Tags: []string{placeTags[0]}, Value: []byte("in a")})
	dst.writeAt(a.ShardID, 11, Op{Type: OpDelete, Bucket: bA, Key: key})
	dst.writeAt(b.ShardID, 12, Op{Type: OpPut, Bucket: bB, Key: key, Tags: []string{placeTags[1]}, Value: []byte("in b")})
	restore(t, dst.db, a, data)
	val, version, found, err := ReadRecord(dst.db, a.Collection, key, Latest)
	if err != nil {
		t.Fatal(err)
	}
	if !found || version != 12 || string(val.Value) != "in b" {
		t.Errorf("after the restore %q reads found=%t version=%d value=%q, want B's version 12", key, found, version, val.Value)
	}
	// A's versions are restored.
	val, version, found, err = ReadRecord(dst.db, a.Collection, key, 11)
	if err != nil || found || version != 11 || !val.Tombstone {
		t.Errorf("as of 11: found=%t version=%d tombstone=%t err=%v, want A's tombstone", found, version, val.Tombstone, err)
	}

	// Into a DB where the pointer is A's, the snapshot's pointer is written.
	empty := newSnapEnv(t, 3)
	restore(t, empty.db, a, data)
	if _, version, _, err := ReadRecord(empty.db, a.Collection, key, Latest); err != nil || version != 11 {
		t.Errorf("restored into an empty DB: version %d (%v), want 11", version, err)
	}
}
