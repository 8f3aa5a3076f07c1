package shard

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/group"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/txn"
)

// writeCases are writes that must survive EncodeWrite, SetVersion and
// DecodeCommand unchanged.
var writeCases = []struct {
	name    string
	version uint64
	ops     []Op
}{
	{"no-ops", 1, nil},
	{"put", 10, []Op{{Type: OpPut, Bucket: 7, Key: []byte("k"), Value: []byte("v"), Tags: []string{"a", "b"}}}},
	{"put-empty", 11, []Op{{Type: OpPut, Key: []byte{}, Value: []byte{}}}},
	{"put-binary", 12, []Op{{Type: OpPut, Bucket: math.MaxUint16, Key: []byte{0, 0xFF, 0, 1}, Value: []byte{0, 0, 0xFF}}}},
	{"put-if-absent", 13, []Op{{Type: OpPut, Key: []byte("k"), Value: []byte("v"), HasCond: true}}},
	{"put-if-version", 14, []Op{{Type: OpPut, Key: []byte("k"), Value: []byte("v"), HasCond: true, CondVersion: math.MaxUint64}}},
	{"put-must-exist", 15, []Op{{Type: OpPut, Key: []byte("k"), MustExist: true}}},
	{"put-max-tags", 16, []Op{{Type: OpPut, Key: []byte("k"), Tags: manyTags(kv.MaxTags)}}},
	{"put-unicode-tags", 17, []Op{{Type: OpPut, Key: []byte("k"), Tags: []string{"été", "日本", ""}}}},
	{"delete", 18, []Op{{Type: OpDelete, Bucket: 3, Key: []byte("k")}}},
	{"delete-must-exist", 19, []Op{{Type: OpDelete, Key: []byte("k"), MustExist: true}}},
	{"delete-if-version", 20, []Op{{Type: OpDelete, Key: []byte("k"), HasCond: true, CondVersion: 1 << 40, MustExist: true}}},
	{"mixed", math.MaxUint64, []Op{
		{Type: OpPut, Bucket: 1, Key: []byte("a"), Value: []byte("1"), Tags: []string{"x"}},
		{Type: OpDelete, Bucket: 2, Key: []byte("b"), HasCond: true, CondVersion: 5},
		{Type: OpPut, Bucket: 3, Key: []byte("c"), Value: bytes.Repeat([]byte("v"), 300), HasCond: true},
	}},
	{"many-ops", 1 << 62, manyOps(1000)},
	{"big-value", 21, []Op{{Type: OpPut, Key: bytes.Repeat([]byte("k"), kv.MaxKeySize), Value: bytes.Repeat([]byte{0xAB}, 1<<20)}}},
}

func manyTags(n int) []string {
	tags := make([]string, n)
	for i := range tags {
		tags[i] = fmt.Sprintf("tag%d", i)
	}
	return tags
}

func manyOps(n int) []Op {
	ops := make([]Op, n)
	for i := range ops {
		ops[i] = Op{Type: OpType(1 + i%2), Bucket: uint16(i), Key: fmt.Appendf(nil, "key%d", i), HasCond: i%3 == 0, CondVersion: uint64(i)}
		if ops[i].Type == OpPut {
			ops[i].Value = fmt.Appendf(nil, "value%d", i)
			ops[i].Tags = manyTags(i % 4)
		}
	}
	return ops
}

// opsEqual compares ops as the encoding sees them: nil and empty are equal,
// and a delete carries no value or tags.
func opsEqual(a, b []Op) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if x.Type != y.Type || x.Bucket != y.Bucket || !bytes.Equal(x.Key, y.Key) ||
			x.HasCond != y.HasCond || x.MustExist != y.MustExist {
			return false
		}
		if x.HasCond && x.CondVersion != y.CondVersion {
			return false
		}
		if x.Type == OpPut && (!bytes.Equal(x.Value, y.Value) || !slices.Equal(x.Tags, y.Tags)) {
			return false
		}
	}
	return true
}

func TestWriteRoundTrip(t *testing.T) {
	for _, tc := range writeCases {
		t.Run(tc.name, func(t *testing.T) {
			b := EncodeWrite(tc.ops)
			if !IsWrite(b) {
				t.Fatalf("IsWrite(%x) = false", b[:min(len(b), 16)])
			}
			c, err := DecodeCommand(b)
			if err != nil {
				t.Fatalf("decoding before SetVersion: %v", err)
			}
			if c.Kind != KindWrite || c.Version != 0 {
				t.Fatalf("before SetVersion: kind %d version %d, want %d and 0", c.Kind, c.Version, KindWrite)
			}
			SetVersion(b, tc.version)
			c, err = DecodeCommand(b)
			if err != nil {
				t.Fatal(err)
			}
			if c.Kind != KindWrite || c.Version != tc.version {
				t.Fatalf("kind %d version %d, want %d and %d", c.Kind, c.Version, KindWrite, tc.version)
			}
			if !opsEqual(c.Ops, tc.ops) {
				t.Fatalf("ops differ:\n got %+v\nwant %+v", c.Ops, tc.ops)
			}
			re := EncodeWrite(c.Ops)
			SetVersion(re, c.Version)
			if !bytes.Equal(re, b) {
				t.Fatalf("re-encoding differs")
			}
		})
	}
}

// TestWriteKeys: the keys of an encoded write are those of its ops, in
// order; a truncated or extended write, or another command, is refused.
func TestWriteKeys(t *testing.T) {
	for _, tc := range writeCases {
		b := EncodeWrite(tc.ops)
		SetVersion(b, tc.version)
		keys, err := WriteKeys(b, nil)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if len(keys) != len(tc.ops) {
			t.Fatalf("%s: %d keys of %d ops", tc.name, len(keys), len(tc.ops))
		}
		for i, op := range tc.ops {
			if !bytes.Equal(keys[i], op.Key) {
				t.Errorf("%s: key %d is %q, want %q", tc.name, i, keys[i], op.Key)
			}
		}
		for n := range len(b) {
			if _, err := WriteKeys(b[:n], nil); err == nil {
				t.Errorf("%s cut to %d of %d bytes: keys answered", tc.name, n, len(b))
			}
		}
		if _, err := WriteKeys(append(bytes.Clone(b), 0), nil); err == nil {
			t.Errorf("%s with a byte more: keys answered", tc.name)
		}
	}
	if _, err := WriteKeys(EncodeDeleteRange([]byte("a"), []byte("b")), nil); err == nil {
		t.Error("keys answered for a range delete")
	}
}

func TestSetVersion(t *testing.T) {
	b := EncodeWrite([]Op{{Type: OpPut, Key: []byte("k"), Value: []byte("v")}})
	tail := slices.Clone(b[1+8:])
	for _, v := range []uint64{1, 1 << 8, 1<<56 + 3, math.MaxUint64, 0, 42} {
		SetVersion(b, v)
		if got := binary.BigEndian.Uint64(b[1:9]); got != v {
			t.Fatalf("SetVersion(%d) wrote %d", v, got)
		}
		if b[0] != byte(KindWrite) || !bytes.Equal(b[9:], tail) {
			t.Fatalf("SetVersion(%d) changed bytes outside the version", v)
		}
		c, err := DecodeCommand(b)
		if err != nil || c.Version != v {
			t.Fatalf("SetVersion(%d): decoded version %d, err %v", v, c.Version, err)
		}
	}
}

func TestIsWrite(t *testing.T) {
	for _, tc := range []struct {
		b    []byte
		want bool
	}{
		{nil, false},
		{[]byte{}, false},
		{EncodeWrite(nil), true},
		{EncodeGC(1), false},
		{EncodeTSO(1), false},
		{EncodeCreateCollection(kv.CollectionOptions{Name: "c"}, nil), false},
		{EncodeDropCollection("c"), false},
	} {
		if got := IsWrite(tc.b); got != tc.want {
			t.Errorf("IsWrite(%x) = %v, want %v", tc.b, got, tc.want)
		}
	}
}

func TestThresholdRoundTrip(t *testing.T) {
	for _, v := range []uint64{0, 1, 127, 128, 1 << 40, math.MaxUint64} {
		for _, tc := range []struct {
			kind CommandKind
			b    []byte
		}{{KindGC, EncodeGC(v)}, {KindTSO, EncodeTSO(v)}} {
			c, err := DecodeCommand(tc.b)
			if err != nil {
				t.Fatalf("kind %d threshold %d: %v", tc.kind, v, err)
			}
			if c.Kind != tc.kind || c.Threshold != v {
				t.Fatalf("kind %d threshold %d: decoded kind %d threshold %d", tc.kind, v, c.Kind, c.Threshold)
			}
		}
	}
}

func TestChecksumRoundTrip(t *testing.T) {
	for _, id := range []uint64{0, 1, 127, 128, 1 << 40, math.MaxUint64} {
		b := EncodeChecksum(id)
		c, err := DecodeCommand(b)
		if err != nil {
			t.Fatalf("id %d: %v", id, err)
		}
		if c.Kind != KindChecksum || c.ChecksumID != id {
			t.Fatalf("id %d: decoded kind %d id %d", id, c.Kind, c.ChecksumID)
		}
		if IsWrite(b) {
			t.Fatalf("id %d: IsWrite(%x) = true", id, b)
		}
		if re := EncodeChecksum(c.ChecksumID); !bytes.Equal(re, b) {
			t.Fatalf("id %d: re-encoding differs", id)
		}
	}
}

func TestCreateCollectionRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		opts  kv.CollectionOptions
		nodes []uint64
	}{
		{kv.CollectionOptions{Name: "c"}, nil},
		{kv.CollectionOptions{Name: "c", Partitioning: kv.PartitionHash, Shards: 4}, []uint64{1}},
		{kv.CollectionOptions{Name: "r", Partitioning: kv.PartitionRange, Shards: 3,
			SplitPoints: [][]byte{[]byte("g"), {0, 0xFF}}}, []uint64{1, 2, 3}},
		{kv.CollectionOptions{Name: "t", Partitioning: kv.PartitionTag, Shards: kv.MaxShards}, []uint64{math.MaxUint64, 0}},
		// The encoding carries unvalidated options; Apply validates them.
		{kv.CollectionOptions{Name: "Not Valid é", Partitioning: "weird"}, nil},
	} {
		b := EncodeCreateCollection(tc.opts, tc.nodes)
		c, err := DecodeCommand(b)
		if err != nil {
			t.Fatalf("%+v: %v", tc.opts, err)
		}
		got := c.Collection
		if c.Kind != KindCreateCollection || got.Name != tc.opts.Name || got.Partitioning != tc.opts.Partitioning ||
			got.Shards != tc.opts.Shards || !slices.EqualFunc(got.SplitPoints, tc.opts.SplitPoints, bytes.Equal) ||
			!slices.Equal(c.Nodes, tc.nodes) {
			t.Fatalf("round trip of %+v %v: got kind %d %+v %v", tc.opts, tc.nodes, c.Kind, got, c.Nodes)
		}
		if re := EncodeCreateCollection(c.Collection, c.Nodes); !bytes.Equal(re, b) {
			t.Fatalf("re-encoding of %+v differs", tc.opts)
		}
	}
}

func TestDropCollectionRoundTrip(t *testing.T) {
	for _, name := range []string{"c", "", "a.b-c_d", strings.Repeat("x", 300)} {
		c, err := DecodeCommand(EncodeDropCollection(name))
		if err != nil {
			t.Fatalf("%q: %v", name, err)
		}
		if c.Kind != KindDropCollection || c.Collection.Name != name {
			t.Fatalf("%q: decoded kind %d name %q", name, c.Kind, c.Collection.Name)
		}
	}
}

// validEncodings returns one valid encoding of every command shape.
func validEncodings() [][]byte {
	var out [][]byte
	for _, tc := range writeCases {
		if len(tc.ops) > 10 || tc.name == "big-value" {
			continue
		}
		b := EncodeWrite(tc.ops)
		SetVersion(b, tc.version)
		out = append(out, b)
	}
	return append(out,
		EncodeGC(0), EncodeGC(1<<50), EncodeGCChunk(7, GCChunk{Phase: gcPhaseTags, Key: []byte("k"), Limit: 3}), EncodeGCChunk(8, GCChunk{Limit: 2000}), EncodeTSO(300), EncodeTSO(math.MaxUint64),
		EncodeCreateCollection(kv.CollectionOptions{Name: "c", Partitioning: kv.PartitionHash, Shards: 4}, []uint64{1}),
		EncodeCreateCollection(kv.CollectionOptions{Name: "r", Partitioning: kv.PartitionRange, Shards: 3,
			SplitPoints: [][]byte{[]byte("g"), []byte("p")}}, []uint64{1, 2, 3}),
		EncodeDropCollection("c"),
		EncodeChecksum(0), EncodeChecksum(math.MaxUint64),
		EncodeTruncateLog(1), EncodeTruncateLog(math.MaxUint64),
		EncodeMoveReplicas("c", 1, 4), EncodeMoveReplicas("", math.MaxUint64, 0),
		EncodeMoveShardReplica("c", 7, 1, 4), EncodeMoveShardReplica("", math.MaxUint64, math.MaxUint64, 0),
		EncodeSetDraining(3, true), EncodeSetDraining(math.MaxUint64, false),
		EncodeSetPreferred("c", 7, 2),
		EncodeSplitShard("r", 3, []byte("m"), 0), EncodeSplitTrigger(9, nil, 1234),
		EncodeMergeShards("r", 3), EncodeFreeze(2), versioned(EncodeFreeze(math.MaxUint64), 77),
		EncodeGroupRecords([]group.Record{
			{Kind: group.RecConfirm, Group: group.Ref{ID: "g", Leader: 5, Inc: 1}, Key: group.Key{Collection: 7, Key: "k"}, Yield: 2},
			{Kind: group.RecConfirm, Group: group.Ref{ID: "g", Leader: 5, Inc: 1}, Key: group.Key{Collection: 7, Key: "l"}, Yield: 3},
		})[0],
		versioned(EncodeGroupRecords([]group.Record{
			{Kind: group.RecFree, Group: group.Ref{ID: "g", Leader: 5, Inc: 1}, Key: group.Key{Collection: 7, Key: "k"}, Yield: 2,
				Entries: []group.Entry{{Seq: 4, Write: group.Write{Key: group.Key{Collection: 7, Key: "k"}, Value: []byte("v")}}}},
			{Kind: group.RecRelease, Group: group.Ref{ID: "h", Leader: 5, Inc: 2}, Key: group.Key{Collection: 7, Key: "l"}, Yield: 3},
		})[0], 78),
		EncodeMergeTrigger(Desc{ShardID: 4, Start: []byte("g"), End: []byte("p")}, FrozenState{Into: 3, Index: 12, MaxVersion: 1 << 40, GCThreshold: 9}),
		EncodeMergeTrigger(Desc{ShardID: 4, Start: []byte("g")}, FrozenState{Into: 3}),
		EncodeMergeTrigger(Desc{ShardID: 5, BucketStart: 100, BucketEnd: kv.NumBuckets}, FrozenState{Into: 1, Index: 1}),
		EncodeAddNode(cluster.NodeDesc{ID: 2, Addr: "h:7080", PeerAddr: "h:7081", MetaReplica: 4}, true),
		EncodeRejoinNode(cluster.NodeDesc{ID: 3, Addr: "h:7090", PeerAddr: "h:7091"}),
		EncodePlace(Placement{Bucket: 7, Key: []byte("k"), HasOld: true, Old: "a", New: "b"}),
		EncodePlace(Placement{Bucket: 8, Key: []byte("k"), New: "b", Txn: "t1"}),
		EncodePlace(Placement{Bucket: 9, Key: []byte("k"), HasOld: true, Old: "a", New: "a", Op: PlacePin, Pin: "g1#3@s4"}),
		EncodePlace(Placement{Bucket: 9, Key: []byte("k"), Op: PlaceUnpin, Pin: "g1#3@s4"}),
		EncodeDeleteRange([]byte("a"), []byte("z")), EncodeDeleteRange([]byte("a"), nil),
		versioned(EncodeTxnPrepare(testPrepare()), 88), EncodeTxnPrepare(&TxnPrepareCmd{Meta: txn.Meta{ID: "x"}}),
		versioned(EncodeTxnResolve(&TxnResolveCmd{ID: "y", Commit: true, CommitTS: 5, Keys: []TxnKey{{Bucket: 2, Key: []byte("k")}}}), 89),
	)
}

func TestMoveAndDrainRoundTrip(t *testing.T) {
	c, err := DecodeCommand(EncodeMoveReplicas("users", 2, 5))
	if err != nil || c.Kind != KindMoveReplicas || c.Move != (MoveCmd{Collection: "users", From: 2, To: 5}) {
		t.Fatalf("decoded %+v, %v", c, err)
	}
	c, err = DecodeCommand(EncodeMoveShardReplica("users", 9, 2, 5))
	if err != nil || c.Kind != KindMoveShardReplica || c.Move != (MoveCmd{Collection: "users", Shard: 9, From: 2, To: 5}) {
		t.Fatalf("decoded %+v, %v", c, err)
	}
	for _, on := range []bool{true, false} {
		c, err := DecodeCommand(EncodeSetDraining(7, on))
		if err != nil || c.Kind != KindSetDraining || c.Drain != (DrainCmd{Node: 7, Draining: on}) {
			t.Fatalf("decoded %+v, %v", c, err)
		}
	}
	b := EncodeSetDraining(7, true)
	b[len(b)-1] = 2
	if _, err := DecodeCommand(b); !errors.Is(err, ErrCorruptCommand) {
		t.Fatalf("a draining flag of 2 decoded: %v", err)
	}
}

// TestDecodeTruncatedOrExtended checks that no strict prefix of a valid
// encoding decodes, nor does one with a byte appended.
func TestDecodeTruncatedOrExtended(t *testing.T) {
	for _, b := range validEncodings() {
		for n := 0; n < len(b); n++ {
			if c, err := DecodeCommand(b[:n]); !errors.Is(err, ErrCorruptCommand) {
				t.Fatalf("prefix %x of %x decoded as %+v, err %v", b[:n], b, c, err)
			}
		}
		ext := append(slices.Clone(b), 0)
		if _, err := DecodeCommand(ext); !errors.Is(err, ErrCorruptCommand) {
			t.Fatalf("%x with a trailing byte: err %v", b, err)
		}
	}
}

func TestDecodeCorrupt(t *testing.T) {
	version := make([]byte, 8)
	write := func(rest ...byte) []byte { return append(append([]byte{byte(KindWrite)}, version...), rest...) }
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"kind-0", []byte{0}},
		{"kind-6", []byte{6, 0}},
		{"kind-255", []byte{255}},
		{"write-short-version", []byte{byte(KindWrite), 0, 0, 0}},
		{"write-no-count", write()},
		{"write-count-above-bytes", write(9, byte(OpDelete), 0, 0, 0, 0)},
		{"write-bad-op-type", write(1, 3, 0, 0, 0, 1, 'k')},
		{"write-op-type-0", write(1, 0, 0, 0, 0, 1, 'k')},
		{"write-bad-flags", write(1, byte(OpDelete), 4, 0, 0, 1, 'k')},
		{"write-no-bucket", write(1, byte(OpDelete), 0, 0)},
		{"write-key-too-long", write(1, byte(OpDelete), 0, 0, 0, 9, 'k')},
		{"write-cond-truncated", write(1, byte(OpDelete), opFlagCond, 0x80)},
		{"write-too-many-tags", append(write(1, byte(OpPut), 0, 0, 0, 1, 'k', kv.MaxTags+1), bytes.Repeat([]byte{0}, kv.MaxTags+2)...)},
		{"write-invalid-utf8-tag", write(1, byte(OpPut), 0, 0, 0, 1, 'k', 1, 1, 0xFF, 0)},
		{"write-no-value", write(1, byte(OpPut), 0, 0, 0, 1, 'k', 0)},
		{"gc-no-threshold", []byte{byte(KindGC)}},
		{"gc-varint-overflow", append([]byte{byte(KindGC)}, bytes.Repeat([]byte{0xFF}, 10)...)},
		{"tso-trailing", []byte{byte(KindTSO), 1, 1}},
		{"create-too-many-shards", append(EncodeCreateCollection(kv.CollectionOptions{Name: "c"}, nil)[:4], 0x81, 0x08, 0, 0)},
		{"drop-name-too-long", []byte{byte(KindDropCollection), 2, 'c'}},
		{"checksum-no-id", []byte{byte(KindChecksum)}},
		{"checksum-trailing", []byte{byte(KindChecksum), 1, 0}},
		{"checksum-nonminimal-id", []byte{byte(KindChecksum), 0x80, 0x00}},
		{"truncate-log-no-index", []byte{byte(KindTruncateLog)}},
		{"truncate-log-trailing", []byte{byte(KindTruncateLog), 1, 0}},
	} {
		if c, err := DecodeCommand(tc.b); !errors.Is(err, ErrCorruptCommand) {
			t.Errorf("%s: %x decoded as %+v, err %v", tc.name, tc.b, c, err)
		}
	}
}

// reencode encodes a decoded command again with the Encode* functions.
func reencode(c Command) []byte {
	switch c.Kind {
	case KindWrite:
		b := EncodeWrite(c.Ops)
		SetVersion(b, c.Version)
		return b
	case KindGC:
		return EncodeGC(c.Threshold)
	case KindGCChunk:
		return EncodeGCChunk(c.Threshold, *c.GC)
	case KindTSO:
		return EncodeTSO(c.Threshold)
	case KindCreateCollection:
		return EncodeCreateCollection(c.Collection, c.Nodes)
	case KindDropCollection:
		return EncodeDropCollection(c.Collection.Name)
	case KindChecksum:
		return EncodeChecksum(c.ChecksumID)
	case KindTruncateLog:
		return EncodeTruncateLog(c.LogIndex)
	case KindMoveReplicas:
		return EncodeMoveReplicas(c.Move.Collection, c.Move.From, c.Move.To)
	case KindMoveShardReplica:
		return EncodeMoveShardReplica(c.Move.Collection, c.Move.Shard, c.Move.From, c.Move.To)
	case KindSetDraining:
		return EncodeSetDraining(c.Drain.Node, c.Drain.Draining)
	case KindSplitShard:
		return EncodeSplitShard(c.Split.Collection, c.Split.Shard, c.Split.Key, c.Split.Bucket)
	case KindSplitTrigger:
		return EncodeSplitTrigger(c.Split.Child, c.Split.Key, c.Split.Bucket)
	case KindMergeShards:
		return EncodeMergeShards(c.Merge.Collection, c.Merge.Shard)
	case KindFreeze:
		return versioned(EncodeFreeze(c.Merge.Into), c.Version)
	case KindMergeTrigger:
		m := c.Merge
		return EncodeMergeTrigger(Desc{ShardID: m.Right, Start: m.Start, End: m.End, BucketStart: m.BucketStart, BucketEnd: m.BucketEnd}, m.Frozen)
	case KindSetPreferred:
		return EncodeSetPreferred(c.Prefer.Collection, c.Prefer.Shard, c.Prefer.Node)
	case KindDeleteRange:
		b := EncodeDeleteRange(c.Start, c.End)
		SetVersion(b, c.Version)
		return b
	case KindPlace:
		return EncodePlace(c.Place)
	case KindAddNode:
		if c.Rejoin {
			return EncodeRejoinNode(c.Node)
		}
		return EncodeAddNode(c.Node, c.AssignMeta)
	case KindGroup, KindGroupWrite, KindGroupBatch, KindGroupWriteBatch:
		// The body is the group package's (internal/group encoding tests).
		return append([]byte{byte(c.Kind)}, c.GroupBody...)
	case KindTxnPrepare:
		b := EncodeTxnPrepare(c.TxnPrepare)
		SetVersion(b, c.Version)
		return b
	case KindTxnResolve:
		b := EncodeTxnResolve(c.TxnResolve)
		SetVersion(b, c.Version)
		return b
	}
	panic(fmt.Sprintf("decoded unknown kind %d", c.Kind))
}

// FuzzDecodeCommand checks that decoding arbitrary bytes never panics, fails
// only with ErrCorruptCommand, and that whatever decodes re-encodes to the
// same bytes.
func FuzzDecodeCommand(f *testing.F) {
	for _, b := range validEncodings() {
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{byte(KindWrite)})
	f.Add([]byte{byte(KindGC), 0x80, 0x00})
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := DecodeCommand(data)
		if err != nil {
			if !errors.Is(err, ErrCorruptCommand) {
				t.Fatalf("%x: error %v is not ErrCorruptCommand", data, err)
			}
			return
		}
		if jsonBody(data) {
			return // a command of a JSON body has no single encoding
		}
		re := reencode(c)
		if bytes.Equal(re, data) {
			return
		}
		t.Fatalf("%x decodes as %+v, which re-encodes as %x", data, c, re)
	})
}

// TestDecodeNonMinimalUvarint checks that a uvarint with a redundant 0x80
// continuation byte is refused, so every command has one encoding.
func TestDecodeNonMinimalUvarint(t *testing.T) {
	inputs := [][]byte{
		{byte(KindGC), 0x80, 0x00}, // threshold 0 in two bytes
		append(append([]byte{byte(KindWrite)}, make([]byte, 8)...), 0x80, 0x00), // zero ops in two bytes
		{byte(KindDropCollection), 0x81, 0x00, 'c'},                             // name length 1 in two bytes
	}
	var accepted []string
	for _, b := range inputs {
		if _, err := DecodeCommand(b); err == nil {
			accepted = append(accepted, fmt.Sprintf("%x", b))
		}
	}
	if len(accepted) > 0 {
		t.Fatalf("DecodeCommand accepts non-minimal uvarints: %s", strings.Join(accepted, ", "))
	}
}

func versioned(cmd []byte, version uint64) []byte {
	SetVersion(cmd, version)
	return cmd
}

// jsonBody reports whether data is a command whose body is JSON: records,
// removals of records, and the prepares and resolves of older logs.
func jsonBody(data []byte) bool {
	switch CommandKind(data[0]) {
	case KindTxnRecord, KindTxnForget:
		return true
	case KindTxnPrepare, KindTxnResolve:
		return len(data) > 9 && data[9] == '{'
	}
	return false
}
