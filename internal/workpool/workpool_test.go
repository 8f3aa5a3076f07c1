package workpool

import (
	"sync"
	"testing"
)

// TestPoolRunsEveryFunction: every function given runs exactly once,
// concurrently with the others (each waits for all to have started, which
// would never happen if the pool ran them one after another).
func TestPoolRunsEveryFunction(t *testing.T) {
	p := New()
	const n = 64
	for round := 0; round < 3; round++ {
		var started, done sync.WaitGroup
		started.Add(n)
		done.Add(n)
		ran := make([]int, n)
		for i := range n {
			p.Go(func() {
				defer done.Done()
				ran[i]++
				started.Done()
				started.Wait()
			})
		}
		done.Wait()
		for i, c := range ran {
			if c != 1 {
				t.Fatalf("round %d: function %d ran %d times", round, i, c)
			}
		}
	}
}
