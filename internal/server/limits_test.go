package server

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/groupkv/groupkv/internal/node"
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

// TestIdleConnectionsMakeRoom: with room for two connections, two idle
// HTTP keep-alive connections do not keep a third client waiting past
// IdleTimeout: the server closes them, and the third is served.
func TestIdleConnectionsMakeRoom(t *testing.T) {
	s, err := Start(Config{Node: node.Options{DataDir: t.TempDir()}, Listen: "127.0.0.1:0", PeerListen: "127.0.0.1:0",
		MaxConnections: 2, IdleTimeout: 300 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	get := func(hc *http.Client) error {
		resp, err := hc.Get("http://" + s.Addr() + "/healthz")
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		return resp.Body.Close()
	}
	// Two clients, each keeping its connection open after a request.
	for range 2 {
		hc := &http.Client{Transport: &http.Transport{}}
		defer hc.CloseIdleConnections()
		if err := get(hc); err != nil {
			t.Fatal(err)
		}
	}
	if open := testutil.ToFloat64(s.openConns); open != 2 {
		t.Errorf("groupkv_client_connections = %v with two connections open, want 2", open)
	}
	// A third, on a connection of its own, waits to be accepted until the
	// server has closed an idle one. Liveness: a generous deadline.
	third := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Minute}
	start := time.Now()
	if err := get(third); err != nil {
		t.Fatalf("the third client, after %v: %v", time.Since(start), err)
	}
	t.Logf("the third client was served after %v", time.Since(start).Round(time.Millisecond))
	// Every connection ends: the idle ones closed by the server, the
	// third by its client.
	for deadline := time.Now().Add(time.Minute); testutil.ToFloat64(s.openConns) != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("groupkv_client_connections = %v a minute after every connection ended, want 0", testutil.ToFloat64(s.openConns))
		}
	}
}
