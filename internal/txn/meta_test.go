package txn

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func TestIDRoundTrip(t *testing.T) {
	for _, c := range []struct {
		priority uint64
		attempt  uint32
	}{{0, 0}, {1, 1}, {1 << 40, 7}, {PlainPriority, math.MaxUint32}} {
		id := NewID(c.priority, c.attempt)
		if len(id) != 40 || strings.ToLower(id) != id {
			t.Errorf("NewID(%d, %d) = %q: want 40 lower-case hex digits", c.priority, c.attempt, id)
		}
		p, a, err := ParseID(id)
		if err != nil || p != c.priority || a != c.attempt {
			t.Errorf("ParseID(NewID(%d, %d)) = %d, %d, %v", c.priority, c.attempt, p, a, err)
		}
	}
	// Two attempts of one priority get different ids.
	if a, b := NewID(5, 1), NewID(5, 1); a == b {
		t.Errorf("NewID returned %q twice", a)
	}
}

func TestParseIDBad(t *testing.T) {
	good := NewID(42, 3)
	for _, id := range []string{
		"",
		"abc",
		good[:39],
		good + "0",
		"z" + good[1:],              // not hex
		good[:20] + " " + good[21:], // not hex
		strings.ToUpper(good),       // NewID writes lower case only
	} {
		p, a, err := ParseID(id)
		if !errors.Is(err, ErrBadID) {
			t.Errorf("ParseID(%q) = %d, %d, %v: want ErrBadID", id, p, a, err)
		}
	}
}

func TestOlder(t *testing.T) {
	m := func(p uint64, id string) *Meta { return &Meta{ID: id, Priority: p} }
	for _, c := range []struct {
		a, b *Meta
		want bool
	}{
		{m(1, "b"), m(2, "a"), true},  // priority first, whatever the ids
		{m(2, "a"), m(1, "b"), false}, //
		{m(5, "a"), m(5, "b"), true},  // ties broken by id
		{m(5, "b"), m(5, "a"), false},
		{m(5, "a"), m(5, "a"), false}, // not older than itself
		{m(1<<60, "z"), m(PlainPriority, "a"), true},
	} {
		if got := Older(c.a, c.b); got != c.want {
			t.Errorf("Older(%+v, %+v) = %v, want %v", *c.a, *c.b, got, c.want)
		}
	}
	// Ids made by NewID order attempts of one priority.
	a, b := &Meta{ID: NewID(9, 1), Priority: 9}, &Meta{ID: NewID(9, 2), Priority: 9}
	if !Older(a, b) || Older(b, a) {
		t.Errorf("attempt 1 and 2 of one priority: Older(a, b)=%v Older(b, a)=%v", Older(a, b), Older(b, a))
	}
}

func TestExpiryTimeout(t *testing.T) {
	base := 2 * time.Second
	for _, c := range []struct {
		attempt uint32
		want    time.Duration
	}{{0, base}, {1, base}, {2, 2 * base}, {8, 8 * base}, {9, 8 * base}, {math.MaxUint32, 8 * base}} {
		if got := ExpiryTimeout(base, c.attempt); got != c.want {
			t.Errorf("ExpiryTimeout(%v, %d) = %v, want %v", base, c.attempt, got, c.want)
		}
	}
}
