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
	lt.Close()
	if _, err := lt.TryAcquireAll(&Meta{ID: "z"}, []Target{{Collection: 1, Key: []byte("c")}}); err != ErrLocksLost {
		t.Fatalf("closed table: %v", err)
	}
}
