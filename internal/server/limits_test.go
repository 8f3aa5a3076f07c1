package server

import (
	"context"
	"fmt"
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

func TestConnectionLimits(t *testing.T) {
	for _, c := range []struct {
		configured   int
		files        uint64
		clients, err string
		peers        int
	}{
		{configured: 50, files: 256, clients: "50", peers: 16},
		{files: 0, clients: "10000", peers: maxPeerConnections},
		{configured: 7, files: 0, clients: "7", peers: maxPeerConnections},
		{files: 1 << 20, clients: "10000", peers: maxPeerConnections},
		{files: 4096, clients: fmt.Sprint(4096 - storage.FileReserve(4096) - (4096-storage.FileReserve(4096))/4), peers: int(4096-storage.FileReserve(4096)) / 4},
		{files: 256, clients: "48", peers: 16},
		{files: 100, err: "leaves no room for connections"},
		{configured: -1, files: 4096, err: "want 0"},
	} {
		clients, peers, err := connectionLimits(c.configured, c.files)
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("connectionLimits(%d, %d) = %d, %d, %v; want an error saying %q", c.configured, c.files, clients, peers, err, c.err)
		case c.err == "" && (err != nil || fmt.Sprint(clients) != c.clients || peers != c.peers):
			t.Errorf("connectionLimits(%d, %d) = %d, %d, %v; want %s, %d", c.configured, c.files, clients, peers, err, c.clients, c.peers)
		case c.err == "" && c.configured == 0 && c.files > 0 && uint64(clients+peers)+storage.FileReserve(c.files) > c.files:
			t.Errorf("connectionLimits(0, %d) = %d, %d leaves the storage less than its reserve of %d", c.files, clients, peers, storage.FileReserve(c.files))
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
