package txn

import (
	"context"
	"slices"
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
	if ok, err := lt.TryAcquireAll(context.Background(), y, []Target{b, a}); ok || err != nil {
		t.Fatalf("TryAcquireAll over a held key: %v %v", ok, err)
	}
	if lt.Holds("y") {
		t.Fatal("a refused TryAcquireAll holds a lock")
	}
	lt.Release("h")
	if ok, err := lt.TryAcquireAll(context.Background(), y, []Target{b, a}); !ok || err != nil {
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
	if ok, err := lt.TryAcquireAll(context.Background(), y, []Target{a}); ok || err != nil {
		t.Fatalf("TryAcquireAll over a plain write's key: %v %v", ok, err)
	}
	lt.Release("p")
	if ok, err := lt.TryAcquireAll(context.Background(), y, []Target{a}); !ok || err != nil {
		t.Fatalf("TryAcquireAll over a free key: %v %v", ok, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := lt.AcquireAll(ctx, p, []Target{a}, nil); err != context.DeadlineExceeded {
		t.Fatalf("a plain write over a yielding key: %v, want it to wait", err)
	}
	lt.Close()
	if _, err := lt.TryAcquireAll(context.Background(), &Meta{ID: "z"}, []Target{{Collection: 1, Key: []byte("c")}}); err != ErrLocksLost {
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
	// It takes no lock here again: a prepare naming the key would pass,
	// though its read before the split was not guarded since.
	if err := lt.Acquire(ctx, open, a, Exclusive, nil); err != ErrLocksDropped {
		t.Fatalf("the dropped transaction locking again: %v, want ErrLocksDropped", err)
	}
	if !lt.HoldsExclusive("prep", b) {
		t.Fatal("the prepared transaction lost its lock")
	}
	if ok, err := lt.TryAcquireAll(context.Background(), &Meta{ID: "w", Priority: 7}, []Target{a}); !ok || err != nil {
		t.Fatalf("the dropped key is not free: %v %v", ok, err)
	}
}

// TestAdopt: the prepared locks a merge brings in are granted; an
// unprepared transaction holding a conflicting lock loses all of its own,
// one holding compatible locks keeps them, and adopting again changes
// nothing.
func TestAdopt(t *testing.T) {
	lt := NewLockTable(1, time.Millisecond)
	ctx := context.Background()
	a, b, c := Target{Collection: 1, Key: []byte("a")}, Target{Collection: 1, Key: []byte("b")}, Target{Collection: 1, Key: []byte("c")}
	span := Target{Collection: 1, Key: []byte("m"), IsSpan: true, End: []byte("p")}
	early, reader := &Meta{ID: "early", Priority: 5}, &Meta{ID: "reader", Priority: 6}
	if err := lt.Acquire(ctx, early, a, Shared, nil); err != nil {
		t.Fatal(err)
	}
	if err := lt.Acquire(ctx, early, c, Exclusive, nil); err != nil {
		t.Fatal(err)
	}
	if err := lt.Acquire(ctx, reader, b, Shared, nil); err != nil {
		t.Fatal(err)
	}
	merged := &Meta{ID: "merged", Priority: 9}
	if n := lt.Adopt(merged, []Target{a}, []Target{b, span}); n != 1 {
		t.Fatalf("Adopt dropped %d transactions, want 1 (early, holding a shared lock on a key the merged one writes)", n)
	}
	if lt.Holds("early") {
		t.Fatal("early kept its locks over the adopted exclusive lock")
	}
	if err := lt.Acquire(ctx, early, c, Exclusive, nil); err != ErrLocksDropped {
		t.Fatalf("early locking again after Adopt dropped it: %v, want ErrLocksDropped", err)
	}
	if !lt.Holds("reader") {
		t.Fatal("reader lost its shared lock on a key the adopted transaction only reads")
	}
	if !lt.HoldsExclusive("merged", a) {
		t.Fatal("the adopted transaction holds no exclusive lock on a")
	}
	before := lt.Dump()
	if n := lt.Adopt(merged, []Target{a}, []Target{b, span}); n != 0 {
		t.Fatalf("adopting again dropped %d transactions", n)
	}
	if after := lt.Dump(); !slices.Equal(before, after) {
		t.Fatalf("adopting again changed the table:\n%q\n%q", before, after)
	}
	// Adopted locks are prepared: waited for, never wounded.
	older := &Meta{ID: "older", Priority: 1}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := lt.Acquire(wctx, older, a, Exclusive, woundAll{}); err != context.DeadlineExceeded {
		t.Fatalf("an older transaction over an adopted lock: %v, want it to wait", err)
	}
	lt.Release("merged")
	if ok, err := lt.TryAcquireAll(context.Background(), &Meta{ID: "w", Priority: 7}, []Target{a, c}); !ok || err != nil {
		t.Fatalf("a and c are not free once the adopted transaction resolved: %v %v", ok, err)
	}
}

// woundAll wounds every victim it is asked to and finds no holder done.
type woundAll struct{}

func (woundAll) Wound(context.Context, *Meta) (bool, error)       { return true, nil }
func (woundAll) Check(context.Context, *Meta, bool) (bool, error) { return false, nil }
