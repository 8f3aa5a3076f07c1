package api

import (
	"context"
	"testing"
	"time"
)

// TestSharedDeadlines: requests whose deadlines are close share a context
// whose deadline is never earlier than any of them asked for, and at most
// 2×deadlineSlack later; one asking for much more or much less gets its
// own; the stream's end cancels them.
func TestSharedDeadlines(t *testing.T) {
	parent, cancelParent := context.WithCancel(context.Background())
	var d sharedDeadlines
	check := func(ctx context.Context, timeout time.Duration, asked time.Time) {
		t.Helper()
		dl, ok := ctx.Deadline()
		if !ok {
			t.Fatal("no deadline")
		}
		if want := asked.Add(timeout); dl.Before(want) || dl.Sub(want) > 2*deadlineSlack+time.Millisecond {
			t.Fatalf("deadline %v after the request, asked %v", dl.Sub(asked), timeout)
		}
	}
	t0 := time.Now()
	a := d.context(parent, time.Second)
	check(a, time.Second, t0)
	t1 := time.Now()
	b := d.context(parent, time.Second+deadlineSlack/2)
	check(b, time.Second+deadlineSlack/2, t1)
	if a != b {
		t.Fatal("requests with close deadlines got two contexts")
	}
	t2 := time.Now()
	c := d.context(parent, 2*time.Second)
	check(c, 2*time.Second, t2)
	e := d.context(parent, time.Millisecond)
	if c == a || e == c {
		t.Fatal("requests with far apart deadlines share a context")
	}
	<-e.Done() // its own, short deadline
	if a.Err() != nil || c.Err() != nil {
		t.Fatal("a context ended before its deadline")
	}
	cancelParent()
	d.release()
	for _, ctx := range []context.Context{a, c} {
		if ctx.Err() == nil {
			t.Fatal("a context outlived its stream")
		}
	}
}
