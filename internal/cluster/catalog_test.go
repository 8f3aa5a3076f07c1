package cluster

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"testing"

	"github.com/groupkv/groupkv/internal/kv"
)

func mustDesc(t *testing.T, opts kv.CollectionOptions, id uint32, firstShard uint64, nodes []uint64) *CollectionDesc {
	t.Helper()
	if err := kv.ValidateCollectionOptions(&opts); err != nil {
		t.Fatalf("options %+v: %v", opts, err)
	}
	return NewCollectionDesc(opts, id, firstShard, nodes, Load{})
}

func TestNewCollectionDescHash(t *testing.T) {
	for _, shards := range []int{1, 2, 3, 7, 8, 13, 1000, kv.MaxShards} {
		d := mustDesc(t, kv.CollectionOptions{Name: "c", Shards: shards}, 5, 100, []uint64{4, 9})
		if d.Name != "c" || d.ID != 5 || d.Partitioning != kv.PartitionHash || len(d.Shards) != shards {
			t.Fatalf("shards=%d: %+v", shards, d)
		}
		// Spans are contiguous, non-empty, start at 0 and end at NumBuckets;
		// ids are consecutive from firstShard; replicas are one per node.
		next := uint32(0)
		for i, s := range d.Shards {
			if s.ID != 100+uint64(i) {
				t.Fatalf("shards=%d: shard %d has id %d", shards, i, s.ID)
			}
			if s.BucketStart != next || s.BucketEnd <= s.BucketStart {
				t.Fatalf("shards=%d: shard %d spans [%d, %d), want it to start at %d and be non-empty", shards, i, s.BucketStart, s.BucketEnd, next)
			}
			next = s.BucketEnd
			// Replicas rotate over the nodes: the preferred leaders spread.
			want := []Replica{{Node: 4, ID: 1}, {Node: 9, ID: 2}}
			if i%2 == 1 {
				want = []Replica{{Node: 9, ID: 1}, {Node: 4, ID: 2}}
			}
			if !reflect.DeepEqual(s.Replicas, want) {
				t.Fatalf("shards=%d: shard %d replicas %+v, want %+v", shards, i, s.Replicas, want)
			}
			if s.Start != nil || s.End != nil {
				t.Fatalf("shards=%d: hash shard %d has a key span", shards, i)
			}
		}
		if next != kv.NumBuckets {
			t.Fatalf("shards=%d: spans end at %d, want %d", shards, next, kv.NumBuckets)
		}
		// Replica slices are not shared between shards.
		if shards > 1 {
			d.Shards[0].Replicas[0].Node = 77
			if d.Shards[1].Replicas[0].Node == 77 {
				t.Fatalf("shards share their replica slice")
			}
		}
	}
}

// TestRouteHashEveryBucket checks that every bucket maps to exactly one
// shard whose span contains it.
func TestRouteHashEveryBucket(t *testing.T) {
	for _, shards := range []int{1, 3, 8, 100} {
		d := mustDesc(t, kv.CollectionOptions{Name: "c", Shards: shards}, 1, 2, nil)
		for b := 0; b < kv.NumBuckets; b++ {
			i := shardOfBucket(d, uint16(b))
			if i < 0 || i >= len(d.Shards) {
				t.Fatalf("shards=%d: bucket %d routes to shard index %d", shards, b, i)
			}
			owners := 0
			for j, s := range d.Shards {
				if uint32(b) >= s.BucketStart && uint32(b) < s.BucketEnd {
					owners++
					if j != i {
						t.Fatalf("shards=%d: bucket %d routes to %d, owned by %d", shards, b, i, j)
					}
				}
			}
			if owners != 1 {
				t.Fatalf("shards=%d: bucket %d has %d owners", shards, b, owners)
			}
		}
	}
}

// bucketKeys returns one key of every bucket, found by search (about 700k
// tries: every bucket is reachable by some key).
var bucketKeys = sync.OnceValue(func() [][]byte {
	keys := make([][]byte, kv.NumBuckets)
	for i, found := 0, 0; found < kv.NumBuckets; i++ {
		k := strconv.AppendInt([]byte{'k'}, int64(i), 10)
		if b := Bucket(k); keys[b] == nil {
			keys[b] = k
			found++
		}
	}
	return keys
})

// shardOfBucket routes a key of bucket b through Route.
func shardOfBucket(d *CollectionDesc, b uint16) int {
	key := bucketKeys()[b]
	bucket, i := d.Route(key, "")
	if bucket != b {
		panic(fmt.Sprintf("Route(%q) answered bucket %d, Bucket says %d", key, bucket, b))
	}
	return i
}

func TestRouteHashDistribution(t *testing.T) {
	d := mustDesc(t, kv.CollectionOptions{Name: "c"}, 1, 2, nil)
	if len(d.Shards) != kv.DefaultShards || kv.DefaultShards != 8 {
		t.Fatalf("default shard count is %d", len(d.Shards))
	}
	const n = 80000
	counts := make([]int, len(d.Shards))
	for i := 0; i < n; i++ {
		_, s := d.Route(fmt.Appendf(nil, "user:%d", i), "")
		counts[s]++
	}
	// Each shard should get about n/8 = 10000; allow 10%.
	for s, c := range counts {
		if c < n/8*9/10 || c > n/8*11/10 {
			t.Errorf("shard %d got %d of %d keys: %v", s, c, n, counts)
		}
	}
}

func TestRouteTag(t *testing.T) {
	d := mustDesc(t, kv.CollectionOptions{Name: "t", Partitioning: kv.PartitionTag, Shards: 8}, 1, 2, nil)
	// Records sharing a placement tag share a bucket and a shard.
	b0, s0 := d.Route([]byte("a"), "tenant-1")
	for _, k := range []string{"b", "c", "zzz"} {
		b, s := d.Route([]byte(k), "tenant-1")
		if b != b0 || s != s0 {
			t.Fatalf("key %q with tag tenant-1 routes to bucket %d shard %d, key a to %d %d", k, b, s, b0, s0)
		}
	}
	if b0 != Bucket([]byte("tenant-1")) {
		t.Fatalf("tagged key routes by bucket %d, want the tag's bucket %d", b0, Bucket([]byte("tenant-1")))
	}
	// Without a tag, the key's own hash places it.
	if b, _ := d.Route([]byte("k"), ""); b != Bucket([]byte("k")) {
		t.Fatalf("untagged key routes by bucket %d, want %d", b, Bucket([]byte("k")))
	}
	// A hash collection ignores the placement tag.
	h := mustDesc(t, kv.CollectionOptions{Name: "h"}, 1, 2, nil)
	if b, _ := h.Route([]byte("k"), "tenant-1"); b != Bucket([]byte("k")) {
		t.Fatalf("hash collection routed by the placement tag")
	}
}

func TestNewCollectionDescRange(t *testing.T) {
	splits := [][]byte{[]byte("g"), []byte("p"), []byte("p\x00")}
	d := mustDesc(t, kv.CollectionOptions{Name: "r", Partitioning: kv.PartitionRange, SplitPoints: splits}, 3, 10, []uint64{1})
	if len(d.Shards) != 4 {
		t.Fatalf("%d shards, want 4", len(d.Shards))
	}
	want := [][2][]byte{{nil, []byte("g")}, {[]byte("g"), []byte("p")}, {[]byte("p"), []byte("p\x00")}, {[]byte("p\x00"), nil}}
	for i, s := range d.Shards {
		if !bytes.Equal(s.Start, want[i][0]) || !bytes.Equal(s.End, want[i][1]) ||
			(want[i][0] == nil) != (s.Start == nil) || (want[i][1] == nil) != (s.End == nil) {
			t.Fatalf("shard %d spans [%q, %q), want [%q, %q)", i, s.Start, s.End, want[i][0], want[i][1])
		}
		if s.ID != 10+uint64(i) || s.BucketStart != 0 || s.BucketEnd != 0 {
			t.Fatalf("shard %d: %+v", i, s)
		}
	}
	// No split points: one shard owning everything.
	one := mustDesc(t, kv.CollectionOptions{Name: "r", Partitioning: kv.PartitionRange}, 3, 10, nil)
	if len(one.Shards) != 1 || one.Shards[0].Start != nil || one.Shards[0].End != nil {
		t.Fatalf("no split points: %+v", one.Shards)
	}
	if b, s := one.Route([]byte("anything"), ""); b != 0 || s != 0 {
		t.Fatalf("single range shard: Route = %d, %d", b, s)
	}
}

func TestRouteRange(t *testing.T) {
	d := mustDesc(t, kv.CollectionOptions{Name: "r", Partitioning: kv.PartitionRange,
		SplitPoints: [][]byte{[]byte("g"), []byte("p")}}, 3, 10, nil)
	for _, tc := range []struct {
		key   string
		shard int
	}{
		{"", 0},
		{"\x00", 0},
		{"a", 0},
		{"f\xff\xff", 0},
		{"g", 1}, // a split point starts its shard
		{"g\x00", 1},
		{"o", 1},
		{"ozzz", 1},
		{"p", 2},
		{"pa", 2},
		{"z", 2},
		{"\xff\xff\xff", 2},
	} {
		b, s := d.Route([]byte(tc.key), "ignored")
		if b != 0 || s != tc.shard {
			t.Errorf("Route(%q) = bucket %d shard %d, want 0 %d", tc.key, b, s, tc.shard)
		}
		// The shard routed to owns the key by its span.
		sd := d.Shards[s]
		if (sd.Start != nil && bytes.Compare([]byte(tc.key), sd.Start) < 0) || (sd.End != nil && bytes.Compare([]byte(tc.key), sd.End) >= 0) {
			t.Errorf("Route(%q) = shard %d spanning [%q, %q)", tc.key, s, sd.Start, sd.End)
		}
	}
}

// TestRouteRangeRandom routes random keys against random split points and
// checks that the chosen shard's span contains each key.
func TestRouteRangeRandom(t *testing.T) {
	seed := rand.Uint64()
	rng := rand.New(rand.NewPCG(seed, 0))
	randKey := func() []byte {
		k := make([]byte, rng.IntN(4))
		for i := range k {
			k[i] = []byte{0, 1, 'a', 'b', 0xFF}[rng.IntN(5)]
		}
		return k
	}
	for iter := 0; iter < 200; iter++ {
		set := map[string]bool{}
		for n := rng.IntN(6); len(set) < n; {
			if k := randKey(); len(k) > 0 {
				set[string(k)] = true
			}
		}
		var splits [][]byte
		for k := range set {
			splits = append(splits, []byte(k))
		}
		slices.SortFunc(splits, bytes.Compare)
		d := mustDesc(t, kv.CollectionOptions{Name: "r", Partitioning: kv.PartitionRange, SplitPoints: splits}, 1, 2, nil)
		for j := 0; j < 50; j++ {
			k := randKey()
			_, s := d.Route(k, "")
			sd := d.Shards[s]
			if (sd.Start != nil && bytes.Compare(k, sd.Start) < 0) || (sd.End != nil && bytes.Compare(k, sd.End) >= 0) {
				t.Fatalf("seed %d: splits %q: Route(%q) = shard %d spanning [%q, %q)", seed, splits, k, s, sd.Start, sd.End)
			}
		}
	}
}

func TestCollectionDescEncodeDecode(t *testing.T) {
	for _, d := range []*CollectionDesc{
		mustDesc(t, kv.CollectionOptions{Name: "c", Shards: 3}, 1, 2, []uint64{1, 2}),
		mustDesc(t, kv.CollectionOptions{Name: "r", Partitioning: kv.PartitionRange,
			SplitPoints: [][]byte{{0, 0xFF}, []byte("m")}}, 7, 20, []uint64{3}),
	} {
		got, err := DecodeCollectionDesc(d.Encode())
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, d) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", got, d)
		}
		// Routing answers the same after the round trip.
		for i := 0; i < 1000; i++ {
			k := fmt.Appendf(nil, "%d", i)
			b1, s1 := d.Route(k, "")
			b2, s2 := got.Route(k, "")
			if b1 != b2 || s1 != s2 {
				t.Fatalf("Route(%q) differs after a round trip", k)
			}
		}
	}
	if _, err := DecodeCollectionDesc([]byte("{")); err == nil {
		t.Fatal("decoding a truncated descriptor succeeded")
	}
}

func TestInfo(t *testing.T) {
	d := mustDesc(t, kv.CollectionOptions{Name: "c", Shards: 2}, 4, 10, []uint64{1})
	info := d.Info(func(shard uint64) uint64 { return shard * 100 })
	if info.Name != "c" || info.ID != 4 || info.Partitioning != kv.PartitionHash || len(info.Shards) != 2 {
		t.Fatalf("%+v", info)
	}
	for i, s := range info.Shards {
		if s.ID != d.Shards[i].ID || s.Leader != s.ID*100 || s.BucketStart != d.Shards[i].BucketStart || s.BucketEnd != d.Shards[i].BucketEnd {
			t.Fatalf("shard %d: %+v", i, s)
		}
	}
	if info := d.Info(nil); info.Shards[0].Leader != 0 {
		t.Fatalf("nil leader func: leader %d", info.Shards[0].Leader)
	}
}

func TestTimestampTime(t *testing.T) {
	ts := TimestampFromTime(fakeEpoch)
	if ts&(1<<LogicalBits-1) != 0 {
		t.Fatalf("TimestampFromTime has logical bits %x", ts)
	}
	if got := TimeFromTimestamp(ts | 12345); !got.Equal(fakeEpoch.Truncate(1e6)) {
		t.Fatalf("TimeFromTimestamp = %v, want %v", got, fakeEpoch)
	}
}

func TestMoveReplica(t *testing.T) {
	s := ShardDesc{ID: 9, Replicas: []Replica{{Node: 1, ID: 1}, {Node: 2, ID: 2}, {Node: 3, ID: 3}}}
	orig := append([]Replica(nil), s.Replicas...)
	moved := s
	if !moved.MoveReplica(2, 4) {
		t.Fatal("the move was refused")
	}
	want := []Replica{{Node: 1, ID: 1}, {Node: 4, ID: 4, Joining: true}, {Node: 3, ID: 3}}
	if !reflect.DeepEqual(moved.Replicas, want) || moved.NextReplica != 5 {
		t.Fatalf("after the move: %+v next %d", moved.Replicas, moved.NextReplica)
	}
	// The leaving replica stays resolvable until its group drops it.
	if n, ok := moved.ReplicaNode(2); !ok || n != 2 {
		t.Fatalf("the leaving replica 2 resolves to %d, %v", n, ok)
	}
	if !reflect.DeepEqual(s.Replicas, orig) {
		t.Fatalf("the move changed the original's replicas: %+v", s.Replicas)
	}
	// Ids are never reused: moving back gets a new one.
	if !moved.MoveReplica(4, 2) || moved.Replicas[1] != (Replica{Node: 2, ID: 5, Joining: true}) {
		t.Fatalf("moving back: %+v", moved.Replicas)
	}
	if moved.MoveReplica(7, 8) || moved.MoveReplica(1, 3) {
		t.Fatal("a move from a node without a replica, or onto one with a replica, was accepted")
	}
}
