package group

import "testing"

// TestShipTicks: with ShipTicks 3 a committed write leaves its outbox at
// the third tick, not before, unless ShipNew ships it at once.
func TestShipTicks(t *testing.T) {
	opts := Options{RetryTicks: 100, ShipTicks: 3}
	l, f := NewLeader(1, opts), NewFollower(2, opts)
	effs, err := l.Create(CreateRequest{ID: "g", Mode: Atomic, Leader: Key{Key: "a"}, Members: []Member{{Key: Key{Key: "b"}, Shard: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	runJoin(l, f, effs)
	ships := func(effs []Effect) int {
		n := 0
		for _, e := range effs {
			if s, ok := e.(Send); ok && s.Msg.Type == MsgShip {
				n++
			}
		}
		return n
	}
	write := func(v string) {
		t.Helper()
		effs, err := l.Write("g", []Write{{Key: Key{Key: "b"}, Value: []byte(v)}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range effs {
			if lg, ok := e.(Log); ok {
				if n := ships(l.Apply(lg.Record)); n != 0 {
					t.Fatalf("the write's application shipped %d messages", n)
				}
			}
		}
	}
	// Align on a shipping tick.
	for l.ticks%3 != 0 {
		l.Tick()
	}
	write("v1")
	write("v2")
	for i := 1; i <= 3; i++ {
		n := ships(l.Tick())
		if want := map[bool]int{true: 1, false: 0}[i == 3]; n != want {
			t.Fatalf("tick %d after the writes: %d ships, want %d", i, n, want)
		}
	}
	write("v3")
	if n := ships(l.ShipNew("g")); n != 1 {
		t.Fatalf("ShipNew: %d ships, want 1", n)
	}
	if n := ships(l.Tick()) + ships(l.Tick()) + ships(l.Tick()); n != 0 {
		t.Fatalf("%d ships of writes ShipNew had shipped", n)
	}
}
