package api_test

import (
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/groupkv/groupkv/internal/api"
)

// TestCoalescerSendsEachOnceInOrder: items added by many goroutines are
// each sent once, every goroutine's in the order it added them, and the
// items added while a send is under way go out together in the next.
func TestCoalescerSendsEachOnceInOrder(t *testing.T) {
	const goroutines, perGoroutine = 8, 500
	type item struct{ g, i int }
	var (
		c       api.Coalescer[item]
		mu      sync.Mutex
		sent    []item
		sends   int
		largest int
	)
	first := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	send := func(q []item) error {
		once.Do(func() {
			close(first)
			<-release // the first send is slow: the others queue meanwhile
		})
		mu.Lock()
		defer mu.Unlock()
		sent = append(sent, q...)
		sends++
		largest = max(largest, len(q))
		return nil
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := c.Add(item{-1, 0}, send); err != nil {
			t.Error(err)
		}
	}()
	<-first
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perGoroutine {
				if err := c.Add(item{g, i}, send); err != nil {
					t.Error(err)
					return
				}
				if g == 0 && i == 10 {
					close(release)
				}
			}
		}()
	}
	wg.Wait()
	if len(sent) != goroutines*perGoroutine+1 {
		t.Fatalf("sent %d items, want %d", len(sent), goroutines*perGoroutine+1)
	}
	next := make([]int, goroutines)
	for _, it := range sent[1:] {
		if it.g < 0 || it.i != next[it.g] {
			t.Fatalf("goroutine %d's item %d sent after its item %d: %v", it.g, it.i, next[it.g]-1, sent)
		}
		next[it.g]++
	}
	// Goroutine 0's first 11 items at least queued behind the first send.
	if largest < 11 || sends >= len(sent) {
		t.Errorf("%d sends of %d items, the largest %d: want the items queued behind a send sent together", sends, len(sent), largest)
	}
}

// TestCoalescerStopsAtFailedSend: a send that fails is answered to the
// goroutine sending, and to every Add after it, and nothing is sent after
// it.
func TestCoalescerStopsAtFailedSend(t *testing.T) {
	var c api.Coalescer[int]
	broken := errors.New("stream broke")
	var sent []int
	send := func(q []int) error {
		if slices.Contains(q, 3) {
			return broken
		}
		sent = append(sent, q...)
		return nil
	}
	for i := range 3 {
		if err := c.Add(i, send); err != nil {
			t.Fatalf("Add(%d): %v", i, err)
		}
	}
	if err := c.Add(3, send); !errors.Is(err, broken) {
		t.Fatalf("Add of the item whose send fails: %v, want %v", err, broken)
	}
	if err := c.Add(4, send); !errors.Is(err, broken) {
		t.Errorf("Add after the failed send: %v, want %v", err, broken)
	}
	if !errors.Is(c.Err(), broken) {
		t.Errorf("Err() = %v", c.Err())
	}
	if !slices.Equal(sent, []int{0, 1, 2}) {
		t.Errorf("sent %v, want [0 1 2]", sent)
	}
}
