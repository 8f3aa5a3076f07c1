package auth

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
)

func TestRolesFile(t *testing.T) {
	now := time.Unix(1000, 0)
	timeNow = func() time.Time { return now }
	defer func() { timeNow = time.Now }()
	file := filepath.Join(t.TempDir(), "roles")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("# who may do what\nreader read\nwriter   write  # a comment\n\nops admin\n")
	r, err := Load(file)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]Role{"reader": Read, "writer": Write, "ops": Admin, "stranger": None, "": None} {
		if got := r.Of(name); got != want {
			t.Errorf("%q: %s, want %s", name, got, want)
		}
	}
	ctx := func(name string) context.Context { return WithClient(context.Background(), name) }
	if err := r.Check(ctx("reader"), Read, "a get"); err != nil {
		t.Errorf("reader reading: %v", err)
	}
	err = r.Check(ctx("reader"), Write, "a put")
	if kv.CodeOf(err) != kv.CodePermissionDenied || !strings.Contains(err.Error(), `a put needs the write role; client "reader" has read`) {
		t.Errorf("reader writing: %v", err)
	}
	if err := r.Check(context.Background(), Read, "a get"); kv.CodeOf(err) != kv.CodePermissionDenied || !strings.Contains(err.Error(), "no certificate") {
		t.Errorf("a client of no connection: %v", err)
	}
	if err := r.Check(context.Background(), None, "health"); err != nil {
		t.Errorf("an open path: %v", err)
	}
	var none *Roles
	if err := none.Check(context.Background(), Admin, "anything"); err != nil {
		t.Errorf("no roles file: %v", err)
	}

	// Read again when it changes, at most once a second; * for the rest.
	write("reader write\n* read\n")
	if got := r.Of("reader"); got != Read {
		t.Fatalf("the file was read again before a second passed: %s", got)
	}
	now = now.Add(recheck)
	if got, other := r.Of("reader"), r.Of("stranger"); got != Write || other != Read {
		t.Fatalf("after the change: reader %s, stranger %s; want write, read", got, other)
	}
	// A file that does not load keeps the last good one.
	write("reader superuser\n")
	now = now.Add(recheck)
	if got := r.Of("reader"); got != Write {
		t.Fatalf("after a bad file: reader %s, want write (the last good file)", got)
	}

	for _, c := range []struct{ text, says string }{
		{"reader\n", "line 1: want a name and a role"},
		{"a read\nb owner\n", `line 2: role "owner" is not read, write or admin`},
		{"a read\na write\n", `line 2: "a" is listed twice`},
		{"a read extra\n", "want a name and a role"},
	} {
		write(c.text)
		if _, err := Load(file); err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%q: %v, want an error saying %q", c.text, err, c.says)
		}
	}
	if _, err := Load(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Error("a missing roles file loaded")
	}
}
