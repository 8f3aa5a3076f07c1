package server

import (
	"strings"
	"testing"

	"github.com/groupkv/groupkv/internal/storage"
)

func TestConnectionLimit(t *testing.T) {
	for _, c := range []struct {
		configured int
		files      uint64
		want       int
		err        string
	}{
		{configured: 50, files: 256, want: 50},
		{files: 0, want: DefaultMaxConnections},
		{files: 1 << 20, want: DefaultMaxConnections},
		{files: 4096, want: 4096 - int(storage.FileReserve(4096))},
		{files: 256, want: 256 - int(storage.FileReserve(256))},
		{files: 100, err: "leaves no room for client connections"},
		{configured: -1, files: 4096, err: "want 0"},
	} {
		got, err := connectionLimit(c.configured, c.files)
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("connectionLimit(%d, %d) = %d, %v; want an error saying %q", c.configured, c.files, got, err, c.err)
		case c.err == "" && (err != nil || got != c.want):
			t.Errorf("connectionLimit(%d, %d) = %d, %v; want %d", c.configured, c.files, got, err, c.want)
		case c.err == "" && c.configured == 0 && c.files > 0 && uint64(got)+storage.FileReserve(c.files) > c.files:
			t.Errorf("connectionLimit(0, %d) = %d leaves the storage less than its reserve of %d", c.files, got, storage.FileReserve(c.files))
		}
	}
}
