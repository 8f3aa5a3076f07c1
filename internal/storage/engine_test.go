package storage

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/cockroachdb/pebble/v2"
)

func TestOpenLockedAndReopen(t *testing.T) {
	dir := t.TempDir()
	e, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir, Options{}); !errors.Is(err, ErrLocked) {
		t.Fatalf("second open: got %v, want ErrLocked", err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e, err = Open(dir, Options{})
	if err != nil {
		t.Fatalf("reopen after close: %v", err)
	}
	e.Close()
}

func TestUnknownFormatRefused(t *testing.T) {
	dir := t.TempDir()
	e, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.DB.Set(NodeKey(formatVersionKey), binary.BigEndian.AppendUint32(nil, FormatVersion+1), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	e.Close()
	if _, err := Open(dir, Options{}); !errors.Is(err, ErrUnknownFormat) {
		t.Fatalf("got %v, want ErrUnknownFormat", err)
	}
	// The refused open must have released the lock.
	if _, err := Open(dir, Options{}); errors.Is(err, ErrLocked) {
		t.Fatalf("lock leaked by refused open")
	}
}
