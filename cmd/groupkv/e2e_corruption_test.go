package main

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDamagedDataExitsCleanly damages the sstables of a stopped server
// (a byte flipped every 64 KiB) and starts it again: the server must exit
// with status 1 and say what is damaged — at start if it reads the damage
// then, or at the first read of it once serving (the test reads every
// record) — never panic, and never serve on as if nothing were wrong.
func TestDamagedDataExitsCleanly(t *testing.T) {
	dir := t.TempDir()
	p := startServer(t, dir)
	base := "http://" + p.addr
	if code, _, body := httpDo(t, "POST", base+"/v1/collections", `{"name": "c", "shards": 2}`); code != 200 {
		t.Fatalf("create collection: %d %s", code, body)
	}
	// 24 MiB: more than a memtable, so most of it is in sstables.
	rng := rand.New(rand.NewPCG(1, 2))
	value := make([]byte, 96<<10)
	const records = 256
	for i := range records {
		for j := range value {
			value[j] = byte(rng.Uint32())
		}
		if code, _, body := httpDo(t, "PUT", fmt.Sprintf("%s/v1/kv/c/k%03d", base, i), string(value)); code != 200 {
			t.Fatalf("put: %d %s", code, body)
		}
	}
	p.stop(t)

	tables, err := filepath.Glob(filepath.Join(dir, "pebble", "*.sst"))
	if err != nil || len(tables) == 0 {
		t.Fatalf("no sstables in %s (%v)", dir, err)
	}
	for _, path := range tables {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for off := 4096; off < len(b)-4096; off += 64 << 10 {
			b[off] ^= 0xff
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	srv := startWatched(t, dir)
	stderr := &srv.log
	deadline := time.After(90 * time.Second)
	reads := 0
wait:
	for {
		select {
		case <-srv.done:
			break wait
		case <-deadline:
			t.Fatalf("the server on damaged data did not exit within 90s (%d reads sent):\n%s", reads, stderr.String())
		case <-time.After(50 * time.Millisecond):
		}
		// Serving? Read the records, which the damage is in.
		if m := servingRE.FindStringSubmatch(stderr.String()); m != nil {
			for i := range records {
				if resp, err := http.Get(fmt.Sprintf("http://%s/v1/kv/c/k%03d", m[1], i)); err == nil {
					resp.Body.Close()
					reads++
				}
			}
		}
	}
	log := stderr.String()
	wantFailStop(t, "the server on damaged data", srv.err, log, "checksum mismatch")
	if !strings.Contains(log, "corruption") {
		t.Errorf("the server's log does not say what is damaged:\n%s", log)
	}
	if strings.Contains(log, "<corruption detail carrier>") {
		t.Errorf("the server's log has Pebble's placeholder line instead of the file:\n%s", log)
	}
	t.Logf("exited with status 1 after %d reads; last lines:\n%s", reads, lastLines(log, 2))
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
