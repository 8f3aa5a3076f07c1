package node

import (
	"slices"
	"testing"
	"time"
)

// TestAnsweringFirst: nodes whose calls were abandoned lately go last,
// each part in its order, until silentFor has passed.
func TestAnsweringFirst(t *testing.T) {
	n := &Node{}
	n.markSilent(2)
	n.markSilent(4)
	got, k := n.answeringFirst([]uint64{4, 1, 2, 3})
	if want := []uint64{1, 3, 4, 2}; !slices.Equal(got, want) || k != 2 {
		t.Fatalf("answeringFirst = %v, %d; want %v, 2", got, k, want)
	}
	if n.answering(2) || !n.answering(1) {
		t.Fatalf("answering(2) = %v, answering(1) = %v; want false, true", n.answering(2), n.answering(1))
	}
	n.silent.mu.Lock()
	n.silent.at[2] = time.Now().Add(-silentFor)
	n.silent.mu.Unlock()
	if !n.answering(2) {
		t.Fatalf("node 2 is still passed over %v after its call was abandoned", silentFor)
	}
	if got, k := n.answeringFirst([]uint64{4, 4, 2}); !slices.Equal(got, []uint64{2, 4, 4}) || k != 1 {
		t.Fatalf("answeringFirst with a repeat = %v, %d; want [2 4 4], 1", got, k)
	}
}
