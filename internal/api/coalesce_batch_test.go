package api

import (
	"errors"
	"fmt"
	"reflect"
	"testing"
)

// TestSendBatched: items go in runs whose sizes add up to at most the
// limit, in order; an item larger than the limit, or a run of one, goes
// alone; limit 0 sends every item alone; a failed send stops.
func TestSendBatched(t *testing.T) {
	var got []string
	one := func(n int) error { got = append(got, fmt.Sprint(n)); return nil }
	batch := func(q []int) error { got = append(got, fmt.Sprint(q)); return nil }
	size := func(n int) int { return n }
	for _, tc := range []struct {
		q     []int
		limit int
		want  []string
	}{
		{[]int{3, 3, 3, 10, 1, 1}, 6, []string{"[3 3]", "3", "10", "[1 1]"}},
		{[]int{7, 1, 1, 1, 1, 1, 1, 1}, 6, []string{"7", "[1 1 1 1 1 1]", "1"}},
		{[]int{2, 2, 2}, 0, []string{"2", "2", "2"}},
		{[]int{5}, 6, []string{"5"}},
		{nil, 6, nil},
	} {
		got = nil
		if err := sendBatched(tc.q, tc.limit, size, one, batch); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%v limit %d: sent %q, want %q", tc.q, tc.limit, got, tc.want)
		}
	}
	broken := errors.New("broken")
	calls := 0
	failing := func([]int) error { calls++; return broken }
	if err := sendBatched([]int{1, 1, 9, 1, 1}, 2, size, one, failing); !errors.Is(err, broken) || calls != 1 {
		t.Errorf("a failed send: %v after %d calls, want %v after 1", err, calls, broken)
	}
}
