package txn

import (
	"context"
	"errors"
	"testing"
	"time"
)

// waitsTest is how long a call is watched to see that it waits; the calls
// that must return get hangTest before the test calls them hung.
const (
	waitsTest = 20 * time.Millisecond
	hangTest  = 10 * time.Second
)

// TestAdmitPlain: a plain write is admitted without locks only while no
// holder has a lock that excludes plain writes and no transaction is
// taking one; a transaction (on any key) is granted nothing while an
// admitted write is in flight, and no write is admitted while it waits.
func TestAdmitPlain(t *testing.T) {
	ctx := context.Background()
	a := Target{Collection: 1, Key: []byte("a")}
	b := Target{Collection: 1, Key: []byte("b")}
	lt := NewLockTable(1, time.Hour)

	if !lt.AdmitPlain() {
		t.Fatal("an empty table did not admit a plain write")
	}
	// A transaction's lock on another key waits for the admitted write:
	// the table does not know which keys it writes.
	tx := &Meta{ID: "tx", Priority: 5}
	waitsForAdmitted(t, lt, "a transaction's lock", func() error { return lt.Acquire(ctx, tx, b, Shared, nil) })
	// A transaction's lock, on any key, keeps plain writes to their locks.
	if lt.AdmitPlain() {
		t.Fatal("a plain write was admitted while a transaction held a lock")
	}
	lt.Release(tx.ID)
	if !lt.AdmitPlain() {
		t.Fatal("a plain write was not admitted once the transaction released its locks")
	}
	lt.DonePlain()

	// Plain writes' own locks share with plain writes: they admit more.
	p := &Meta{ID: "p", Priority: PlainPriority, Plain: true}
	if err := lt.AcquireAll(ctx, p, []Target{a}, nil); err != nil {
		t.Fatal(err)
	}
	if !lt.AdmitPlain() {
		t.Fatal("a plain write's lock kept another plain write from being admitted")
	}
	lt.DonePlain()
	lt.Release(p.ID)

	// A yield's exclusive lock (TryAcquireAll) excludes plain writes, and
	// waits for the admitted ones first, admitting no more meanwhile.
	if !lt.AdmitPlain() {
		t.Fatal("not admitted")
	}
	y := &Meta{ID: "y", Priority: PlainPriority, Plain: true}
	waitsForAdmitted(t, lt, "TryAcquireAll", func() error {
		ok, err := lt.TryAcquireAll(ctx, y, []Target{a})
		if err == nil && !ok {
			err = errors.New("refused over a free key")
		}
		return err
	})
	if lt.AdmitPlain() {
		t.Fatal("a plain write was admitted while a yield held its key")
	}
	lt.Release(y.ID)

	// A waiting TryAcquireAll gives up with its context.
	if !lt.AdmitPlain() {
		t.Fatal("not admitted")
	}
	cctx, cancel := context.WithTimeout(ctx, waitsTest)
	defer cancel()
	if _, err := lt.TryAcquireAll(cctx, y, []Target{a}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("TryAcquireAll with an admitted write in flight and an ended context: %v", err)
	}
	if lt.Holds(y.ID) {
		t.Fatal("a TryAcquireAll that gave up holds a lock")
	}
	lt.DonePlain()
	if !lt.AdmitPlain() {
		t.Fatal("a TryAcquireAll that gave up still keeps plain writes out")
	}
	lt.DonePlain()

	lt.Close()
	if lt.AdmitPlain() {
		t.Fatal("a closed table admitted a plain write")
	}
}

// waitsForAdmitted runs take (what must wait for the one plain write
// admitted in lt) and checks that it waits, that no plain write is
// admitted meanwhile, and that it succeeds once the write is done.
func waitsForAdmitted(t *testing.T, lt *LockTable, what string, take func() error) {
	t.Helper()
	got := make(chan error, 1)
	go func() { got <- take() }()
	select {
	case err := <-got:
		t.Fatalf("%s returned while an admitted plain write was in flight (err %v)", what, err)
	case <-time.After(waitsTest):
	}
	if lt.AdmitPlain() {
		t.Fatalf("a plain write was admitted while %s waited", what)
	}
	lt.DonePlain()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(hangTest):
		t.Fatalf("%s did not return once the admitted write was done", what)
	}
}
