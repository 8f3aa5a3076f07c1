package txn

import (
	"context"
	"testing"
	"time"
)

// TestTryAcquireAll: granted only when no other holds a key, all or none,
// without waiting; a closed table reports ErrLocksLost.
func TestTryAcquireAll(t *testing.T) {
	lt := NewLockTable(1, time.Millisecond)
	a, b := Target{Collection: 1, Key: []byte("a")}, Target{Collection: 1, Key: []byte("b")}
	holder := &Meta{ID: "h", Priority: 5}
	if err := lt.Acquire(context.Background(), holder, a, Shared, nil); err != nil {
		t.Fatal(err)
	}
	y := &Meta{ID: "y", Priority: PlainPriority, Plain: true}
	if ok, err := lt.TryAcquireAll(y, []Target{b, a}); ok || err != nil {
		t.Fatalf("TryAcquireAll over a held key: %v %v", ok, err)
	}
	if lt.Holds("y") {
		t.Fatal("a refused TryAcquireAll holds a lock")
	}
	lt.Release("h")
	if ok, err := lt.TryAcquireAll(y, []Target{b, a}); !ok || err != nil {
		t.Fatalf("TryAcquireAll over free keys: %v %v", ok, err)
	}
	lt.Release("y")

	// A key being yielded excludes plain writes, which share their locks
	// only with each other: a plain write's lock refuses the yield, and
	// the yield's lock holds plain writes back.
	p := &Meta{ID: "p", Priority: PlainPriority, Plain: true}
	if err := lt.AcquireAll(context.Background(), p, []Target{a}, nil); err != nil {
		t.Fatal(err)
	}
	if ok, err := lt.TryAcquireAll(y, []Target{a}); ok || err != nil {
		t.Fatalf("TryAcquireAll over a plain write's key: %v %v", ok, err)
	}
	lt.Release("p")
	if ok, err := lt.TryAcquireAll(y, []Target{a}); !ok || err != nil {
		t.Fatalf("TryAcquireAll over a free key: %v %v", ok, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := lt.AcquireAll(ctx, p, []Target{a}, nil); err != context.DeadlineExceeded {
		t.Fatalf("a plain write over a yielding key: %v, want it to wait", err)
	}
	lt.Close()
	if _, err := lt.TryAcquireAll(&Meta{ID: "z"}, []Target{{Collection: 1, Key: []byte("c")}}); err != ErrLocksLost {
		t.Fatalf("closed table: %v", err)
	}
}

// TestDropUnprepared: a split drops the locks of the transactions that
// have not prepared, which then fail to prepare; a prepared one keeps its
// locks, and waiters for a dropped lock get it.
func TestDropUnprepared(t *testing.T) {
	lt := NewLockTable(1, time.Millisecond)
	ctx := context.Background()
	a, b := Target{Collection: 1, Key: []byte("a")}, Target{Collection: 1, Key: []byte("b")}
	open, prepared := &Meta{ID: "open", Priority: 5}, &Meta{ID: "prep", Priority: 6}
	if err := lt.Acquire(ctx, open, a, Exclusive, nil); err != nil {
		t.Fatal(err)
	}
	if err := lt.Acquire(ctx, prepared, b, Exclusive, nil); err != nil {
		t.Fatal(err)
	}
	if !lt.Prepare("prep", []Target{b}, nil) {
		t.Fatal("prep could not prepare")
	}
	if n := lt.DropUnprepared(); n != 1 {
		t.Fatalf("DropUnprepared dropped %d transactions, want 1", n)
	}
	if lt.Holds("open") || lt.Prepare("open", []Target{a}, nil) {
		t.Fatal("the unprepared transaction still holds its lock")
	}
	if !lt.HoldsExclusive("prep", b) {
		t.Fatal("the prepared transaction lost its lock")
	}
	if ok, err := lt.TryAcquireAll(&Meta{ID: "w", Priority: 7}, []Target{a}); !ok || err != nil {
		t.Fatalf("the dropped key is not free: %v %v", ok, err)
	}
}
