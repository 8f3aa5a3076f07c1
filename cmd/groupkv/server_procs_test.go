package main

import "testing"

// TestServerProcs: a server on fewer than four cores runs twice as many
// scheduler slots, up to four; on more it keeps Go's count.
func TestServerProcs(t *testing.T) {
	for _, c := range []struct{ procs, want int }{{1, 2}, {2, 4}, {3, 4}, {4, 4}, {8, 8}, {64, 64}} {
		if got := serverProcs(c.procs); got != c.want {
			t.Errorf("serverProcs(%d) = %d, want %d", c.procs, got, c.want)
		}
	}
}
