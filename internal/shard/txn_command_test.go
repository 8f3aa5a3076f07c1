package shard

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"testing"

	"github.com/groupkv/groupkv/internal/txn"
)

func testPrepare() *TxnPrepareCmd {
	return &TxnPrepareCmd{
		Meta:     txn.Meta{ID: txn.NewID(7, 3), Priority: 7, Attempt: 3, Start: 1234, Anchor: txn.Anchor{Collection: 5, Bucket: 77, Key: []byte("anchor")}},
		LockTerm: 9, OnePhase: true, Record: true, Deadline: 99999, ReadTS: 4321,
		Writes: []Op{
			{Type: OpPut, Bucket: 3, Key: []byte("a"), Value: []byte("va"), Tags: []string{"t1", "t2"}},
			{Type: OpDelete, Bucket: 4, Key: []byte("b"), HasCond: true, CondVersion: 12, MustExist: true},
			{Type: OpPut, Bucket: 5, Key: []byte("c"), Value: []byte{}},
		},
		Reads: []txn.Target{
			{Collection: 5, Key: []byte("a")},
			{Collection: 6, Key: []byte("s"), IsSpan: true, End: []byte("t")},
			{Collection: 6, Key: []byte(""), IsSpan: true},
		},
	}
}

// TestTxnCommandsRoundTrip: prepares and resolves decode to what was
// encoded, in the binary encoding and in the JSON one of older logs.
func TestTxnCommandsRoundTrip(t *testing.T) {
	plain := testPrepare()
	plain.Meta.Plain, plain.OnePhase, plain.Record, plain.Reads = true, false, false, nil
	last := testPrepare()
	last.Last, last.MinCommit, last.Participants = true, 1<<62+5, []uint64{3, 9, 1 << 40}
	early := testPrepare()
	early.OnePhase, early.Record, early.Early = false, false, true
	for _, p := range []*TxnPrepareCmd{testPrepare(), plain, last, early, {Meta: txn.Meta{ID: txn.NewID(1, 1)}}} {
		if got := AnyVersion(EncodeTxnPrepare(p)); got != p.Early {
			t.Fatalf("AnyVersion of a prepare with Early %v: %v", p.Early, got)
		}
		for name, enc := range map[string][]byte{"binary": EncodeTxnPrepare(p), "json": encodeJSON(KindTxnPrepare, true, p)} {
			SetVersion(enc, 42)
			c, err := DecodeCommand(enc)
			if err != nil {
				t.Fatalf("%s prepare: %v", name, err)
			}
			if c.Kind != KindTxnPrepare || c.Version != 42 {
				t.Fatalf("%s prepare: kind %d version %d", name, c.Kind, c.Version)
			}
			want := *p
			if name == "json" {
				want.Meta.Plain = false // never in the JSON of a log
				got := *c.TxnPrepare
				got.Meta.Plain = false
				c.TxnPrepare = &got
			}
			if !reflect.DeepEqual(normPrepare(c.TxnPrepare), normPrepare(&want)) {
				t.Fatalf("%s prepare:\n got %+v\nwant %+v", name, *c.TxnPrepare, want)
			}
			// What its leader checks, decoded alone.
			var locks PrepareLocks
			if err := DecodePrepareLocks(enc, &locks); err != nil {
				t.Fatalf("%s prepare's locks: %v", name, err)
			}
			var keys [][]byte
			for _, w := range p.Writes {
				keys = append(keys, w.Key)
			}
			if locks.ID != p.Meta.ID || locks.LockTerm != p.LockTerm || !slices.EqualFunc(locks.Writes, keys, bytes.Equal) ||
				!reflect.DeepEqual(normTargets(locks.Reads), normTargets(p.Reads)) {
				t.Fatalf("%s prepare's locks: got %+v, want id %s, lock term %d, writes %q, reads %+v", name, locks, p.Meta.ID, p.LockTerm, keys, p.Reads)
			}
		}
	}
	for _, r := range []*TxnResolveCmd{
		{ID: txn.NewID(7, 3), Commit: true, CommitTS: 555, Keys: []TxnKey{{Bucket: 1, Key: []byte("a")}, {Bucket: 65535, Key: []byte("zz")}}},
		{ID: txn.NewID(8, 1)},
	} {
		for name, enc := range map[string][]byte{"binary": EncodeTxnResolve(r), "json": encodeJSON(KindTxnResolve, true, r)} {
			SetVersion(enc, 43)
			c, err := DecodeCommand(enc)
			if err != nil {
				t.Fatalf("%s resolve: %v", name, err)
			}
			if c.Kind != KindTxnResolve || c.Version != 43 || !reflect.DeepEqual(*c.TxnResolve, *r) {
				t.Fatalf("%s resolve: got %+v version %d, want %+v", name, *c.TxnResolve, c.Version, *r)
			}
		}
	}
}

// normPrepare makes empty and nil slices compare equal.
func normPrepare(p *TxnPrepareCmd) TxnPrepareCmd {
	c := *p
	if len(c.Writes) == 0 {
		c.Writes = nil
	}
	if len(c.Reads) == 0 {
		c.Reads = nil
	}
	c.Writes = append([]Op(nil), c.Writes...)
	for i := range c.Writes {
		if len(c.Writes[i].Value) == 0 {
			c.Writes[i].Value = nil
		}
	}
	c.Reads = normTargets(c.Reads)
	return c
}

// normTargets is ts with empty keys and ends nil, as they decode either
// way.
func normTargets(ts []txn.Target) []txn.Target {
	if len(ts) == 0 {
		return nil
	}
	ts = append([]txn.Target(nil), ts...)
	for i := range ts {
		if len(ts[i].End) == 0 {
			ts[i].End = nil
		}
		if len(ts[i].Key) == 0 {
			ts[i].Key = nil
		}
	}
	return ts
}

func normPrepared(e preparedEntry) preparedEntry {
	e.Writes, e.Reads = normTargets(e.Writes), normTargets(e.Reads)
	return e
}

// TestTxnCommandsTruncated: every strict prefix of a binary prepare or
// resolve, and one with a byte too many, is refused as corrupt.
func TestTxnCommandsTruncated(t *testing.T) {
	r := &TxnResolveCmd{ID: txn.NewID(7, 3), Commit: true, CommitTS: 555, Keys: []TxnKey{{Bucket: 1, Key: []byte("a")}}}
	for name, enc := range map[string][]byte{"prepare": EncodeTxnPrepare(testPrepare()), "resolve": EncodeTxnResolve(r)} {
		for n := 1; n < len(enc); n++ {
			if _, err := DecodeCommand(enc[:n]); !errors.Is(err, ErrCorruptCommand) {
				t.Fatalf("%s cut to %d of %d bytes: %v, want corrupt", name, n, len(enc), err)
			}
			if name == "prepare" {
				if err := DecodePrepareLocks(enc[:n], &PrepareLocks{}); !errors.Is(err, ErrCorruptCommand) {
					t.Fatalf("the locks of a prepare cut to %d of %d bytes: %v, want corrupt", n, len(enc), err)
				}
			}
		}
		if _, err := DecodeCommand(append(enc[:len(enc):len(enc)], 0)); !errors.Is(err, ErrCorruptCommand) {
			t.Fatalf("%s with a trailing byte: %v, want corrupt", name, err)
		}
		if name == "prepare" {
			if err := DecodePrepareLocks(append(enc[:len(enc):len(enc)], 0), &PrepareLocks{}); !errors.Is(err, ErrCorruptCommand) {
				t.Fatalf("the locks of a prepare with a trailing byte: %v, want corrupt", err)
			}
		}
	}
}

// TestTxnPrepareDecodedCopies: a decoded prepare does not alias the entry
// (its targets go into the lock table, its writes into the intents a shard
// holds until their resolve, both of which outlive it).
func TestTxnPrepareDecodedCopies(t *testing.T) {
	enc := EncodeTxnPrepare(testPrepare())
	c, err := DecodeCommand(enc)
	if err != nil {
		t.Fatal(err)
	}
	for i := range enc {
		enc[i] = 0xEE
	}
	if string(c.TxnPrepare.Writes[0].Key) != "a" || string(c.TxnPrepare.Writes[0].Value) != "va" || c.TxnPrepare.Writes[0].Tags[1] != "t2" ||
		string(c.TxnPrepare.Reads[1].End) != "t" || string(c.TxnPrepare.Meta.Anchor.Key) != "anchor" {
		t.Fatalf("the decoded prepare changed with its entry: %+v", *c.TxnPrepare)
	}
}

// TestResolveBatchEncoding: a batch of resolves decodes to what was
// encoded; an empty, truncated, oversized or trailing-bytes batch is
// refused as corrupt.
func TestResolveBatchEncoding(t *testing.T) {
	rs := []*TxnResolveCmd{
		{ID: txn.NewID(7, 3), Commit: true, CommitTS: 555, Keys: []TxnKey{{Bucket: 1, Key: []byte("a")}, {Bucket: 65535, Key: []byte("zz")}}},
		{ID: txn.NewID(8, 1)},
	}
	enc := EncodeTxnResolveBatch(rs)
	SetVersion(enc, 44)
	c, err := DecodeCommand(enc)
	if err != nil {
		t.Fatal(err)
	}
	if c.Kind != KindTxnResolveBatch || c.Version != 44 || len(c.TxnResolves) != 2 {
		t.Fatalf("decoded %+v", c)
	}
	for i := range rs {
		if !reflect.DeepEqual(c.TxnResolves[i], rs[i]) {
			t.Fatalf("resolve %d:\n got %+v\nwant %+v", i, *c.TxnResolves[i], *rs[i])
		}
	}
	if !IsWrite(enc) {
		t.Fatal("a resolve batch takes no version")
	}
	many := make([]*TxnResolveCmd, MaxResolveBatch+1)
	for i := range many {
		many[i] = &TxnResolveCmd{ID: txn.NewID(uint64(i+1), 1)}
	}
	for name, bad := range map[string][]byte{
		"empty":     EncodeTxnResolveBatch(nil),
		"truncated": enc[:len(enc)-1],
		"trailing":  append(append([]byte(nil), enc...), 0),
		"oversized": EncodeTxnResolveBatch(many),
	} {
		if _, err := DecodeCommand(bad); !errors.Is(err, ErrCorruptCommand) {
			t.Errorf("%s batch: %v, want a corrupt command", name, err)
		}
	}
}

// TestLastPrepareEncoding: a last participant's commit carries MinCommit
// where the host finds it without decoding (MinVersion), and its
// participants; no other command has a minimum version; the flag without
// a one-phase commit, or a truncated minimum, is corrupt.
func TestLastPrepareEncoding(t *testing.T) {
	last := testPrepare()
	last.Last, last.MinCommit, last.Participants = true, 777, []uint64{4, 5}
	enc := EncodeTxnPrepare(last)
	SetVersion(enc, 900)
	if got := MinVersion(enc); got != 777 {
		t.Fatalf("MinVersion = %d, want 777", got)
	}
	c, err := DecodeCommand(enc)
	if err != nil || !c.TxnPrepare.Last || c.TxnPrepare.MinCommit != 777 || !reflect.DeepEqual(c.TxnPrepare.Participants, []uint64{4, 5}) {
		t.Fatalf("decoded %+v, %v", c.TxnPrepare, err)
	}
	for _, other := range [][]byte{EncodeTxnPrepare(testPrepare()), EncodeTxnResolve(&TxnResolveCmd{ID: "x"}), EncodeWrite([]Op{{Type: OpPut, Key: []byte("k")}})} {
		if got := MinVersion(other); got != 0 {
			t.Fatalf("MinVersion of a command %d = %d, want 0", other[0], got)
		}
	}
	bad := append([]byte(nil), enc...)
	bad[10] &^= prepareOnePhase
	if _, err := DecodeCommand(bad); !errors.Is(err, ErrCorruptCommand) {
		t.Fatalf("last without one-phase: %v, want a corrupt command", err)
	}
	if _, err := DecodeCommand(enc[:15]); !errors.Is(err, ErrCorruptCommand) {
		t.Fatalf("truncated: %v, want a corrupt command", err)
	}
	// Early marks a prepare that commits later: one that commits itself
	// needs a fresh version, and the two flags together are corrupt.
	early := append([]byte(nil), enc...)
	early[10] |= prepareEarly
	if _, err := DecodeCommand(early); !errors.Is(err, ErrCorruptCommand) {
		t.Fatalf("early and one-phase: %v, want a corrupt command", err)
	}
	if AnyVersion(enc) || AnyVersion(EncodeWrite([]Op{{Type: OpPut, Key: []byte("k")}})) {
		t.Fatal("AnyVersion of a commit or a write")
	}
}

// TestPreparedEntryEncoding: a prepared entry decodes to what was encoded
// (plain or not, with and without writes and reads, spans included), the
// JSON of entries written before the binary form still decodes, and a
// damaged entry is refused.
func TestPreparedEntryEncoding(t *testing.T) {
	p := testPrepare()
	entries := []preparedEntry{
		{Meta: p.Meta, Version: 42, Writes: []txn.Target{{Collection: 5, Key: []byte("a")}, {Collection: 5, Key: []byte("b")}}, Reads: p.Reads},
		{Meta: txn.Meta{ID: "plain-x", Priority: txn.PlainPriority, Plain: true, Anchor: txn.Anchor{Key: []byte("k")}}, Version: 1},
		{Meta: p.Meta, Version: 1 << 60, Reads: []txn.Target{{Collection: 6, Key: []byte{}, IsSpan: true, End: []byte("z")}}},
	}
	for i, e := range entries {
		b := encodePrepared(&e)
		got, err := decodePrepared(b)
		if err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
		if !reflect.DeepEqual(normPrepared(got), normPrepared(e)) {
			t.Errorf("entry %d: decoded %+v, want %+v", i, got, e)
		}
		js, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		old, err := decodePrepared(js)
		if err != nil || !reflect.DeepEqual(normPrepared(old), normPrepared(e)) {
			t.Errorf("entry %d as JSON: decoded %+v, %v; want %+v", i, old, err, e)
		}
		for n := range len(b) {
			if _, err := decodePrepared(b[:n]); err == nil {
				t.Errorf("entry %d cut to %d of %d bytes: decoded", i, n, len(b))
			}
		}
		if _, err := decodePrepared(append(b, 0)); err == nil {
			t.Errorf("entry %d with a byte more: decoded", i)
		}
	}
	b := encodePrepared(&entries[0])
	b[1] |= 1 << 7
	if _, err := decodePrepared(b); err == nil {
		t.Error("an entry with unknown flags: decoded")
	}
}
