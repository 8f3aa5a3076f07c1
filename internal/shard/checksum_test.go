package shard

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/storage"
)

// applyBatch applies cmds as the next entries of shard id in one batch, the
// way a replica applies the entries of one raft cycle, and commits it.
func (e *snapEnv) applyBatch(id uint64, cmds ...[]byte) []Result {
	e.t.Helper()
	s := e.shards[id]
	applied, _ := s.Applied()
	b := e.db.NewIndexedBatch()
	defer b.Close()
	var out []Result
	for i, cmd := range cmds {
		res, err := s.Apply(b, applied+1+uint64(i), e.term, cmd)
		if err != nil {
			e.t.Fatalf("shard %d: %v", id, err)
		}
		if res.Err != nil {
			e.t.Fatalf("shard %d: %s: %s", id, res.Err.Code, res.Err.Message)
		}
		out = append(out, res)
	}
	if err := s.FinishBatch(b); err != nil {
		e.t.Fatal(err)
	}
	e.commitAndSum(b, out...)
	return out
}

// allShards returns the Desc of the meta shard and of every data shard.
func (e *snapEnv) allShards() []Desc {
	out := []Desc{MetaDesc}
	for _, c := range e.colls {
		for _, s := range c.Shards {
			out = append(out, DescFor(c, s))
		}
	}
	return out
}

// nextWrite returns a put of a new key into shard d, the version left 0.
func (e *snapEnv) nextWrite(d Desc, i int) []byte {
	c, _ := e.collOf(d.ShardID)
	for j := 0; j < 1000; j++ {
		key := []byte(fmt.Sprintf("%c-fresh%d-%d", 'a'+j%26, i, j))
		if bucket, id := route(c, key); id == d.ShardID {
			return EncodeWrite([]Op{{Type: OpPut, Bucket: bucket, Key: key, Tags: recordTags(c, key, 0), Value: []byte("fresh")}})
		}
	}
	e.t.Fatalf("no fresh key for shard %d", d.ShardID)
	return nil
}

// TestChecksumReplicasAgree applies the same log to two replicas of every
// shard, one entry per batch on one and the last entries in one batch on
// the other, and checks that their checksums agree, that the checksum sees
// the entries before it in its own batch, and that it writes nothing but
// the applied index.
func TestChecksumReplicasAgree(t *testing.T) {
	a, b := newSnapEnv(t, 3), newSnapEnv(t, 3)
	for _, e := range []*snapEnv{a, b} {
		e.createCollections()
		e.workload(0)
	}
	for i, d := range a.allShards() {
		var pre [][]byte
		if !d.IsMeta() {
			// A write in the same cycle as the checksum on b.
			w := a.nextWrite(d, i)
			SetVersion(w, a.nextVersion())
			b.nextVersion()
			pre = append(pre, w)
		}
		cmd := EncodeChecksum(uint64(100 + i))

		for _, w := range pre {
			a.apply(d.ShardID, w)
		}
		before := rawDump(t, a.db)
		ra := a.apply(d.ShardID, cmd)
		after := rawDump(t, a.db)
		rb := b.applyBatch(d.ShardID, append(pre, cmd)...)[len(pre)]

		if ra.Checksum == nil || rb.Checksum == nil {
			t.Fatalf("shard %d: no checksum in %+v / %+v", d.ShardID, ra, rb)
		}
		if ra.Checksum.ID != uint64(100+i) || ra.Checksum.Index != rb.Checksum.Index || ra.Checksum.Index == 0 {
			t.Fatalf("shard %d: checksums %+v and %+v", d.ShardID, ra.Checksum, rb.Checksum)
		}
		if len(ra.Checksum.Sum) != 32 || !bytes.Equal(ra.Checksum.Sum, rb.Checksum.Sum) || ra.Checksum.Pairs != rb.Checksum.Pairs {
			t.Errorf("shard %d: replicas with the same log disagree: %x (%d pairs) != %x (%d pairs)",
				d.ShardID, ra.Checksum.Sum, ra.Checksum.Pairs, rb.Checksum.Sum, rb.Checksum.Pairs)
		}
		if !d.IsMeta() && ra.Checksum.Pairs < 20 {
			t.Errorf("shard %d: only %d pairs summed", d.ShardID, ra.Checksum.Pairs)
		}
		// Only the applied index changed.
		applied := string(storage.ShardStateKey(d.ShardID, stateApplied))
		delete(before, applied)
		delete(after, applied)
		if diffs := diffDumps(after, before); len(diffs) > 0 {
			t.Errorf("shard %d: the checksum wrote:\n%s", d.ShardID, strings.Join(diffs, "\n"))
		}
		if idx, _ := a.shards[d.ShardID].Applied(); idx != ra.Checksum.Index {
			t.Errorf("shard %d: applied %d after the checksum at %d", d.ShardID, idx, ra.Checksum.Index)
		}
	}
	// Shards differ from one another.
	sums := map[string]uint64{}
	for _, d := range a.allShards() {
		res := a.apply(d.ShardID, EncodeChecksum(1))
		if other, dup := sums[string(res.Checksum.Sum)]; dup {
			t.Errorf("shards %d and %d have the same checksum", other, d.ShardID)
		}
		sums[string(res.Checksum.Sum)] = d.ShardID
	}
}

// TestChecksumDetectsDivergence changes one replica's state behind Apply
// and checks that the checksums differ.
func TestChecksumDetectsDivergence(t *testing.T) {
	for _, tc := range []struct {
		name    string
		shard   func(e *snapEnv) Desc
		corrupt func(t *testing.T, e *snapEnv, d Desc)
	}{
		{"data-value", func(e *snapEnv) Desc { return DescFor(e.colls[0], e.colls[0].Shards[0]) },
			func(t *testing.T, e *snapEnv, d Desc) {
				// Another value in the newest live version of a key.
				k, v := firstOwned(t, e, d, spanData, func(v []byte) bool { return !storage.IsTombstone(v) })
				mv, err := storage.DecodeValue(v)
				if err != nil {
					t.Fatal(err)
				}
				mv.Value = append(mv.Value, '!')
				set(t, e.db, k, storage.EncodeValue(nil, mv))
			}},
		{"extra-version", func(e *snapEnv) Desc { return DescFor(e.colls[1], e.colls[1].Shards[1]) },
			func(t *testing.T, e *snapEnv, d Desc) {
				c, _ := e.collOf(d.ShardID)
				key := []byte("zzz")
				bucket, id := route(c, key)
				if id != d.ShardID {
					t.Fatalf("%q is in shard %d", key, id)
				}
				set(t, e.db, storage.DataKey(nil, d.Collection, key, 1), storage.EncodeValue(nil, storage.MVCCValue{Bucket: bucket, Value: []byte("x")}))
			}},
		{"missing-tag-entry", func(e *snapEnv) Desc { return DescFor(e.colls[2], e.colls[2].Shards[0]) },
			func(t *testing.T, e *snapEnv, d Desc) {
				k, _ := firstOwned(t, e, d, spanTagIndex, nil)
				if err := e.db.Delete(k, pebble.Sync); err != nil {
					t.Fatal(err)
				}
			}},
		{"gc-threshold", func(e *snapEnv) Desc { return DescFor(e.colls[0], e.colls[0].Shards[1]) },
			func(t *testing.T, e *snapEnv, d Desc) {
				set(t, e.db, storage.ShardStateKey(d.ShardID, stateGCThreshold), binary.BigEndian.AppendUint64(nil, 3))
			}},
		{"conf-state", func(e *snapEnv) Desc { return DescFor(e.colls[0], e.colls[0].Shards[1]) },
			func(t *testing.T, e *snapEnv, d Desc) {
				set(t, e.db, storage.ShardStateKey(d.ShardID, "conf_state"), []byte{0x08, 0x02})
			}},
		{"catalog", func(e *snapEnv) Desc { return MetaDesc },
			func(t *testing.T, e *snapEnv, d Desc) {
				set(t, e.db, storage.CatalogKey(catalogTSO), binary.BigEndian.AppendUint64(nil, math.MaxUint64))
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := newSnapEnv(t, 3), newSnapEnv(t, 3)
			for _, e := range []*snapEnv{a, b} {
				e.createCollections()
				e.workload(1)
			}
			d := tc.shard(a)
			cmd := EncodeChecksum(9)
			if x, y := a.apply(d.ShardID, cmd).Checksum, b.apply(d.ShardID, cmd).Checksum; !bytes.Equal(x.Sum, y.Sum) {
				t.Fatalf("the replicas disagree before the corruption: %x != %x", x.Sum, y.Sum)
			}
			tc.corrupt(t, b, d)
			x, y := a.apply(d.ShardID, cmd).Checksum, b.apply(d.ShardID, cmd).Checksum
			if bytes.Equal(x.Sum, y.Sum) {
				t.Fatalf("the checksum %x misses the corruption", x.Sum)
			}
		})
	}
}

func set(t *testing.T, db *pebble.DB, k, v []byte) {
	t.Helper()
	if err := db.Set(k, v, pebble.Sync); err != nil {
		t.Fatal(err)
	}
}

// firstOwned returns the first pair of span kind that shard d owns and
// whose value passes ok (nil: any).
func firstOwned(t *testing.T, e *snapEnv, d Desc, kind spanKind, ok func(v []byte) bool) ([]byte, []byte) {
	t.Helper()
	var k, v []byte
	for _, sp := range snapshotSpans(d) {
		if sp.kind != kind {
			continue
		}
		err := eachOwned(e.db, sp, func(key, val []byte) error {
			if k == nil && (ok == nil || ok(val)) {
				k, v = append([]byte(nil), key...), append([]byte(nil), val...)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if k == nil {
		t.Fatalf("shard %d owns no pair of span %d", d.ShardID, kind)
	}
	return k, v
}

// TestChecksumIgnoresSharedLatestPointer: a key of a tag collection deleted
// in shard A and put again in shard B shares one latest pointer between
// them; at A's checksum the pointer is A's on a node where B has not
// applied its put yet and B's where it has. Both replicas of A agree.
func TestChecksumIgnoresSharedLatestPointer(t *testing.T) {
	key := []byte("moved")
	bA, bB := cluster.Bucket([]byte(placeTags[0])), cluster.Bucket([]byte(placeTags[1]))
	var sums, snaps [2][]byte
	for i, bFirst := range []bool{false, true} {
		e := newSnapEnv(t, 3)
		e.createCollections()
		c := e.colls[2]
		a, b := DescFor(c, c.Shards[0]), DescFor(c, c.Shards[1])
		e.writeAt(a.ShardID, 10, Op{Type: OpPut, Bucket: bA, Key: key, Tags: []string{placeTags[0]}, Value: []byte("in a")})
		e.writeAt(a.ShardID, 11, Op{Type: OpDelete, Bucket: bA, Key: key})
		putB := func() {
			e.writeAt(b.ShardID, 12, Op{Type: OpPut, Bucket: bB, Key: key, Tags: []string{placeTags[1]}, Value: []byte("in b")})
		}
		if bFirst {
			putB()
		}
		snaps[i] = snapshotOf(t, e.db, a)
		sums[i] = e.apply(a.ShardID, EncodeChecksum(5)).Checksum.Sum
		if !bFirst {
			putB()
		}
	}
	if bytes.Equal(snaps[0], snaps[1]) {
		t.Fatal("the test does not make the pointer differ")
	}
	if !bytes.Equal(sums[0], sums[1]) {
		t.Errorf("the replicas of A disagree: %x != %x", sums[0], sums[1])
	}
}

// TestChecksumPacedAndStopped: a sum held to its rate waits between reads
// (at one byte per second it cannot finish) and ends with an error when
// stopped; a sum at a rate it does not reach is the unlimited sum.
func TestChecksumPacedAndStopped(t *testing.T) {
	e := newSnapEnv(t, 3)
	e.createCollections()
	e.workload(0)
	d := DescFor(e.colls[0], e.colls[0].Shards[0])
	s := e.shards[d.ShardID]
	applied, _ := s.Applied()
	b := e.db.NewIndexedBatch()
	defer b.Close()
	res, err := s.Apply(b, applied+1, e.term, EncodeChecksum(3))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.FinishBatch(b); err != nil {
		t.Fatal(err)
	}
	snap := e.db.NewSnapshot()
	defer snap.Close()
	if err := b.Commit(pebble.Sync); err != nil {
		t.Fatal(err)
	}
	job := res.Checksum
	unlimited := *job
	unlimited.done = make(chan struct{})
	fast := *job
	fast.done = make(chan struct{})

	stop := make(chan struct{})
	go job.Run(snap, stop, 1)
	select {
	case <-job.Done():
		t.Fatalf("a sum at 1 B/s finished: %+v, err %v", job.Checksum, job.Err())
	case <-time.After(50 * time.Millisecond):
	}
	close(stop)
	select {
	case <-job.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a stopped sum did not end")
	}
	if job.Err() == nil || job.Sum != nil {
		t.Fatalf("a stopped sum: %+v, err %v", job.Checksum, job.Err())
	}

	unlimited.Run(snap, nil, 0)
	fast.Run(snap, nil, 1<<40)
	if unlimited.Err() != nil || fast.Err() != nil || len(unlimited.Sum) != 32 || !bytes.Equal(unlimited.Sum, fast.Sum) {
		t.Fatalf("unlimited %x (%v), paced %x (%v)", unlimited.Sum, unlimited.Err(), fast.Sum, fast.Err())
	}
}
