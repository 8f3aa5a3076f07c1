package group

import (
	"errors"
	"testing"
)

// TestWriteValidatesReads: a group write commits only if every key its
// transaction read still has the version it read; a committed write gives
// its keys the record's version. Join versions come from the follower.
func TestWriteValidatesReads(t *testing.T) {
	l, f := NewLeader(1, Options{}), NewFollower(1, Options{})
	var replies []Reply
	run := func(effs []Effect, version uint64) {
		t.Helper()
		for len(effs) > 0 {
			var next []Effect
			for _, e := range effs {
				switch e := e.(type) {
				case Log:
					e.Record.Version = max(e.Record.Version, version)
					if e.Record.Kind.ForLeader() {
						next = append(next, l.Apply(e.Record)...)
					} else {
						next = append(next, f.Apply(e.Record)...)
					}
				case Send:
					switch e.Msg.Type {
					case MsgJ:
						next = append(next, f.OnJ(e.Msg, KeyCheck{Value: []byte("v0"), Version: 7})...)
					case MsgJA:
						next = append(next, l.OnJA(e.Msg)...)
					case MsgJAA:
						next = append(next, f.OnJAA(e.Msg)...)
					}
				case Reply:
					replies = append(replies, e)
				}
			}
			effs = next
		}
	}
	a, b := Key{Key: "a"}, Key{Key: "b"}
	effs, err := l.Create(CreateRequest{ID: "g", Mode: Atomic, Leader: a, Members: []Member{{Key: a, Shard: 1}, {Key: b, Shard: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	run(effs, 0)
	g, _ := l.Group("g")
	if g.State != Active || g.member(a).Version != 7 || g.member(b).Version != 7 {
		t.Fatalf("after the joins: %+v", g)
	}

	write := func(w Key, reads []Read, version uint64) error {
		t.Helper()
		replies = nil
		effs, err := l.Write("g", []Write{{Key: w, Value: []byte("x")}}, reads)
		if err != nil {
			t.Fatal(err)
		}
		run(effs, version)
		if len(replies) != 1 || replies[0].Op != OpWrite {
			t.Fatalf("replies %v", replies)
		}
		return replies[0].Err
	}
	// Two transactions read a at 7; the first to commit wins.
	if err := write(a, []Read{{a, 7}}, 10); err != nil {
		t.Fatalf("first write: %v", err)
	}
	if err := write(b, []Read{{a, 7}}, 11); !errors.Is(err, ErrConflict) {
		t.Fatalf("write after a changed: %v, want ErrConflict", err)
	}
	g, _ = l.Group("g")
	if g.member(a).Version != 10 || g.member(b).Version != 7 || string(g.member(b).Value) != "v0" {
		t.Fatalf("after the writes: a %+v b %+v", *g.member(a), *g.member(b))
	}
	// A blind write (no reads) always commits.
	if err := write(b, nil, 12); err != nil {
		t.Fatalf("blind write: %v", err)
	}
	if _, err := l.Write("g", nil, []Read{{Key{Key: "z"}, 1}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("read of a non-member: %v, want ErrInvalid", err)
	}
}
