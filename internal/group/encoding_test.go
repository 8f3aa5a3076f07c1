package group

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

func sampleRecords() []Record {
	k := Key{Collection: 7, Key: "k\x00ey"}
	r := Ref{ID: "g", Leader: 3, Inc: 9}
	return []Record{
		{},
		{Kind: RecCreate, Group: Ref{ID: "g", Leader: 3}, Mode: Atomic, Key: k,
			Members: []Member{{Key: k, Shard: 3}, {Key: Key{Collection: 1, Key: "b"}, Shard: 1 << 40}}},
		{Kind: RecJoin, Group: r, Key: k, Yield: 1 << 63, Value: []byte("v"), Shard: 2},
		{Kind: RecJoin, Group: r, Key: k, Yield: 2, Value: []byte("v"), Tags: Tags{List: []string{"a", "", "b"}}, Shard: 2},
		{Kind: RecYield, Group: r, Key: k, Absent: true},
		{Kind: RecYield, Group: r, Key: k, Value: []byte("v"), Tags: Tags{Keep: true}},
		{Kind: RecRefuse, Group: r, Key: k, Reason: ReasonLocked},
		{Kind: RecWrite, Group: r, Writes: []Write{{Key: k, Value: []byte("x")}, {Key: k, Delete: true}, {Key: k, Value: []byte("z"), Tags: Tags{List: []string{"t"}}}}},
		{Kind: RecApplyShip, Group: r, Entries: []Entry{{Seq: 4, Write: Write{Key: k, Value: []byte("y"), Tags: Tags{List: []string{"t", "u"}}}}, {Seq: 5, Write: Write{Key: k, Tags: Tags{Keep: true}}}}},
		{Kind: RecApplyShip, Group: r, Entries: []Entry{{Seq: 6, Write: Write{Key: k, Value: []byte("y")}, Version: 1 << 62}, {Seq: 7, Write: Write{Key: k, Delete: true}, Version: 3}}},
		{Kind: RecFree, Group: r, Key: k, Yield: 2, Entries: []Entry{{Seq: 8, Write: Write{Key: k, Value: []byte("w"), Tags: Tags{List: []string{"t"}}}, Version: 9}}},
		{Kind: RecShipped, Group: r, Shard: 5, Seq: 6},
	}
}

// TestEntryVersionCanonical: an entry's version follows its write only
// when it has one; a version flag followed by 0 does not decode, as it
// would encode back without the flag.
func TestEntryVersionCanonical(t *testing.T) {
	x := Entry{Seq: 1, Write: Write{Key: Key{Key: "a"}, Value: []byte("v")}, Version: 5}
	var e encoder
	e.entries([]Entry{x})
	d := decoder{b: e.b}
	if got := d.entries(); d.done() != nil || !reflect.DeepEqual(got, []Entry{x}) {
		t.Fatalf("entries round trip: %+v, %v", got, d.err)
	}
	if e.b[len(e.b)-1] != 5 {
		t.Fatalf("the version is not last: % x", e.b)
	}
	e.b[len(e.b)-1] = 0
	d = decoder{b: e.b}
	if d.entries(); d.done() == nil {
		t.Fatalf("an entry flagged with version 0 decodes")
	}
	x.Version = 0
	e = encoder{}
	e.entries([]Entry{x})
	var old encoder // as builds without versions wrote an entry
	old.uint(1)
	old.uint(x.Seq)
	old.write(x.Write)
	if !bytes.Equal(e.b, old.b) {
		t.Fatalf("an entry without a version encodes as % x, older builds wrote % x", e.b, old.b)
	}
}

func TestRecordRoundTrip(t *testing.T) {
	for _, r := range sampleRecords() {
		if r.Kind == 0 {
			continue
		}
		b := EncodeRecord(r)
		got, err := DecodeRecord(b)
		if err != nil || !reflect.DeepEqual(got, r) {
			t.Errorf("DecodeRecord(EncodeRecord(%v)) = %+v, %v", r, got, err)
		}
	}
	if _, err := DecodeRecord(EncodeRecord(Record{})); !errors.Is(err, ErrCorrupt) {
		t.Errorf("a record of kind 0 decodes: %v", err)
	}
}

func TestMessageRoundTrip(t *testing.T) {
	for _, m := range []Message{
		{Type: MsgShip, From: 1, To: 2, Group: Ref{ID: "g", Leader: 1, Inc: 2},
			Entries: []Entry{{Seq: 1, Write: Write{Key: Key{Key: "a"}, Value: []byte("v"), Tags: Tags{List: []string{"x"}}}}, {Seq: 2, Write: Write{Key: Key{Key: "a"}, Delete: true}, Version: 8}}},
		{Type: MsgJA, From: 1, To: 2, Group: Ref{ID: "g", Leader: 1, Inc: 2}, Key: Key{Key: "a"}, Yield: 3,
			Value: []byte("v"), Tags: Tags{List: []string{"x", "y"}}, Version: 4},
	} {
		got, err := DecodeMessage(EncodeMessage(m))
		if err != nil || !reflect.DeepEqual(got, m) {
			t.Errorf("DecodeMessage(EncodeMessage(%v)) = %+v, %v", m, got, err)
		}
	}
}

// TestOldEncodingsKeepTags decodes a record, a message and a follower
// state as builds without tags wrote them (the absence flag a bool byte,
// no tags after it): their values' tags are to be kept, and they encode
// back to the same bytes.
func TestOldEncodingsKeepTags(t *testing.T) {
	k := Key{Collection: 7, Key: "k"}
	// A RecWrite of one put and one delete.
	var e encoder
	e.byte(uint8(RecWrite))
	e.ref(Ref{ID: "g", Leader: 3, Inc: 9})
	e.byte(0)
	e.key(Key{})
	e.uint(0)     // members
	e.uint(0)     // yield
	e.bytes(nil)  // value
	e.bool(false) // absent
	e.str("")     // reason
	e.uint(0)     // shard
	e.uint(0)     // seq
	e.uint(2)     // writes
	e.key(k)
	e.bytes([]byte("v"))
	e.bool(false)
	e.key(k)
	e.bytes(nil)
	e.bool(true)
	e.uint(0) // entries
	e.uint(5) // version
	e.uint(0) // reads
	old := e.b
	r, err := DecodeRecord(old)
	if err != nil {
		t.Fatal(err)
	}
	want := []Write{{Key: k, Value: []byte("v"), Tags: Tags{Keep: true}}, {Key: k, Delete: true, Tags: Tags{Keep: true}}}
	if !reflect.DeepEqual(r.Writes, want) || !r.Tags.Keep {
		t.Errorf("old record decodes to %+v", r)
	}
	if !bytes.Equal(EncodeRecord(r), old) {
		t.Errorf("old record encodes back to %x, was %x", EncodeRecord(r), old)
	}

	// A follower state with one yielded key.
	e = encoder{}
	e.byte(followerFormat)
	e.uint(1) // shard
	e.uint(4) // last yield
	e.uint(1)
	e.key(k)
	e.ref(Ref{ID: "g", Leader: 3, Inc: 9})
	e.uint(4)     // yield
	e.bool(false) // confirmed
	e.bytes([]byte("v"))
	e.bool(false) // absent
	e.uint(2)     // version
	e.uint(0)     // shipped
	f, err := DecodeFollower(e.b, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if y, _ := f.Key(k); !y.Tags.Keep || string(y.Value) != "v" {
		t.Errorf("old follower state: %+v", y)
	}
	if !bytes.Equal(f.Encode(), e.b) {
		t.Errorf("old follower state encodes back to %x, was %x", f.Encode(), e.b)
	}
	// A byte other than 0-3 in the flag's place is corrupt.
	bad := bytes.Clone(old)
	bad[bytes.LastIndex(bad, []byte{1, 'v'})+2] = 4
	if _, err := DecodeRecord(bad); !errors.Is(err, ErrCorrupt) {
		t.Errorf("flag byte 4 decodes: %v", err)
	}
}

// TestStateRoundTrip drives a leader and a follower through a create, a
// write and a half-done delete and checks that their encodings decode to
// states that encode the same and behave the same.
// runJoin carries effs between l and f until none is left: records are
// applied, and the messages of a creation (J, JA, JAA) delivered, a J
// finding the key's value "v0". Other effects are dropped.
func runJoin(l *Leader, f *Follower, effs []Effect) {
	runJoinWith(l, f, effs, KeyCheck{Value: []byte("v0")})
}

// runJoinWith is runJoin with the J finding kc.
func runJoinWith(l *Leader, f *Follower, effs []Effect, kc KeyCheck) {
	for len(effs) > 0 {
		var next []Effect
		for _, e := range effs {
			switch e := e.(type) {
			case Log:
				if e.Record.Kind.ForLeader() {
					next = append(next, l.Apply(e.Record)...)
				} else {
					next = append(next, f.Apply(e.Record)...)
				}
			case Send:
				switch e.Msg.Type {
				case MsgJ:
					next = append(next, f.OnJ(e.Msg, kc)...)
				case MsgJA:
					next = append(next, l.OnJA(e.Msg)...)
				case MsgJAA:
					next = append(next, f.OnJAA(e.Msg)...)
				}
			}
		}
		effs = next
	}
}

func TestStateRoundTrip(t *testing.T) {
	l, f := NewLeader(1, Options{}), NewFollower(1, Options{})
	run := func(effs []Effect) { runJoin(l, f, effs) }
	effs, err := l.Create(CreateRequest{ID: "g", Mode: Atomic, Leader: Key{Key: "a"}, Members: []Member{{Key: Key{Key: "b"}, Shard: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	run(effs)
	effs, err = l.Write("g", []Write{{Key: Key{Key: "b"}, Value: []byte("v1")}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	run(effs)
	for _, enc := range [][]byte{l.Encode(), f.Encode()} {
		if len(enc) == 0 {
			t.Fatal("empty encoding")
		}
	}
	l2, err := DecodeLeader(l.Encode(), Options{})
	if err != nil || !bytes.Equal(l2.Encode(), l.Encode()) || !reflect.DeepEqual(l2.groups, l.groups) {
		t.Fatalf("leader does not round-trip: %v", err)
	}
	f2, err := DecodeFollower(f.Encode(), Options{})
	if err != nil || !bytes.Equal(f2.Encode(), f.Encode()) || !reflect.DeepEqual(f2.keys, f.keys) {
		t.Fatalf("follower does not round-trip: %v", err)
	}
	if g, _ := l2.Group("g"); g.State != Active || len(g.Outboxes[0].Entries) != 1 {
		t.Fatalf("decoded group: %+v", g)
	}
	if _, err := DecodeLeader(f.Encode(), Options{}); err == nil {
		t.Errorf("a follower's encoding decodes as a leader's")
	}
	if _, err := DecodeFollower(append(f.Encode(), 0), Options{}); !errors.Is(err, ErrCorrupt) {
		t.Errorf("trailing byte: %v", err)
	}
}

func fuzzCheck[T any](t *testing.T, b []byte, dec func([]byte) (T, error), enc func(T) []byte) {
	v, err := dec(b)
	if err != nil {
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("decode(%x): %v is not ErrCorrupt", b, err)
		}
		return
	}
	if got := enc(v); !bytes.Equal(got, b) {
		t.Fatalf("encode(decode(%x)) = %x", b, got)
	}
}

// FuzzDecodeRecord checks that every input fails with ErrCorrupt or
// decodes to a record that encodes back to it (the encoding is canonical).
func FuzzDecodeRecord(f *testing.F) {
	for _, r := range sampleRecords() {
		f.Add(EncodeRecord(r))
	}
	f.Fuzz(func(t *testing.T, b []byte) { fuzzCheck(t, b, DecodeRecord, EncodeRecord) })
}

// FuzzDecodeMessage: the same for messages.
func FuzzDecodeMessage(f *testing.F) {
	f.Add(EncodeMessage(Message{Type: MsgJA, From: 1, To: 2, Group: Ref{ID: "g", Leader: 2, Inc: 1}, Key: Key{Key: "a"}, Yield: 3, Value: []byte("v")}))
	f.Fuzz(func(t *testing.T, b []byte) { fuzzCheck(t, b, DecodeMessage, EncodeMessage) })
}

// FuzzDecodeState: the same for leader and follower states.
func FuzzDecodeState(f *testing.F) {
	l := NewLeader(1, Options{})
	effs, _ := l.Create(CreateRequest{ID: "g", Mode: BestEffort, Leader: Key{Key: "a"}})
	l.Apply(effs[0].(Log).Record)
	f.Add(l.Encode())
	fl := NewFollower(1, Options{})
	fl.Apply(Record{Kind: RecYield, Group: Ref{ID: "g", Leader: 1, Inc: 1}, Key: Key{Key: "a"}, Value: []byte("v")})
	f.Add(fl.Encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		fuzzCheck(t, b, func(b []byte) (*Leader, error) { return DecodeLeader(b, Options{}) }, (*Leader).Encode)
		fuzzCheck(t, b, func(b []byte) (*Follower, error) { return DecodeFollower(b, Options{}) }, (*Follower).Encode)
	})
}
