package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestDiskFullStopsCleanly runs a server whose data directory is on a small
// tmpfs and writes to it from four clients until the disk is full. A full
// disk loses nothing acknowledged: the server answers the writes it cannot
// keep 503 (unavailable, or commit_unknown for those in flight), exits
// with status 1 naming the full disk (no panic), and restarted once there
// is room again it has every write it acknowledged, each with its value,
// and takes new ones. It needs to mount a tmpfs (root), as CI's machine
// can.
func TestDiskFullStopsCleanly(t *testing.T) {
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Skipf("this test mounts a tmpfs, which needs root: %v %s", err, bytes.TrimSpace(out))
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v %s", mnt, err, out)
		}
	})
	dir := filepath.Join(mnt, "d")
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)

	cmd := exec.Command(binary, "server", "--data-dir", dir, "--listen", "127.0.0.1:0", "--peer-listen", "127.0.0.1:0",
		"--log-level", "warn", "--storage-failure-limit", "5s")
	var stderr syncBuffer // written by the command's copier as the test reads it
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-exited
		}
	})
	var base string
	for deadline := time.Now().Add(60 * time.Second); base == ""; time.Sleep(20 * time.Millisecond) {
		if m := servingRE.FindStringSubmatch(stderr.String()); m != nil {
			base = "http://" + m[1]
		} else if time.Now().After(deadline) {
			t.Fatalf("the server did not start within 60s:\n%s", stderr.String())
		}
	}
	if code, _, body := httpDo(t, "POST", base+"/v1/collections", `{"name": "c", "shards": 4}`); code != 200 {
		t.Fatalf("create collection: %d %s", code, body)
	}

	// value is the i-th write's value: 64 KiB drawn from the seed.
	value := func(i int) []byte {
		rng := rand.New(rand.NewPCG(seed, uint64(i)))
		b := make([]byte, 64<<10)
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		return b
	}
	key := func(i int) string { return fmt.Sprintf("k%05d", i) }
	const writers = 4
	var (
		mu      sync.Mutex
		acked   []int // writes answered 200
		unknown []int // writes answered 503: kept or not
		refused int   // writes the exited server did not take
	)
	client := &http.Client{Timeout: 2 * time.Minute}
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := w; ; i += writers {
				req, _ := http.NewRequest("PUT", base+"/v1/kv/c/"+key(i), bytes.NewReader(value(i)))
				resp, err := client.Do(req)
				if err != nil {
					// The server exited (or closed the connection as it
					// did): the write may have been taken before.
					mu.Lock()
					unknown = append(unknown, i)
					refused++
					mu.Unlock()
					return
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				var e struct {
					Error struct{ Code string } `json:"error"`
				}
				_ = json.Unmarshal(body, &e)
				mu.Lock()
				switch {
				case resp.StatusCode == 200:
					acked = append(acked, i)
				case resp.StatusCode == 503 && (e.Error.Code == "unavailable" || e.Error.Code == "commit_unknown"):
					unknown = append(unknown, i)
				default:
					t.Errorf("put %s: %d %s, want 200, or 503 unavailable or commit_unknown", key(i), resp.StatusCode, body)
				}
				many := len(unknown) > 1000
				mu.Unlock()
				if many {
					return // the server answers but does not exit: the deadline below says so
				}
			}
		})
	}
	// Liveness: a generous deadline that only catches a server that goes
	// on without its disk, or hangs.
	var werr error
	select {
	case werr = <-exited:
	case <-time.After(3 * time.Minute):
		t.Fatalf("the server did not exit within 3 minutes of writes to a 48 MiB disk (%d acknowledged):\n%s", len(acked), stderr.String())
	}
	wg.Wait()
	log := stderr.String()
	var ee *exec.ExitError
	if !errors.As(werr, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("the server on a full disk exited with %v, want status 1:\n%s", werr, log)
	}
	if !strings.Contains(log, "no space left on device") {
		t.Errorf("the server's log does not say the disk is full:\n%s", log)
	}
	if strings.Contains(log, "panic:") || strings.Contains(log, "goroutine ") {
		t.Errorf("the server panicked:\n%s", log)
	}
	if len(acked) == 0 {
		t.Fatalf("no write was acknowledged before the disk filled:\n%s", log)
	}
	t.Logf("%d writes acknowledged, %d answered 503 or cut off (%d after the exit); last lines:\n%s", len(acked), len(unknown), refused, lastLines(log, 2))

	// Room again: every acknowledged write is there.
	if out, err := exec.Command("mount", "-o", "remount,size=512m", mnt).CombinedOutput(); err != nil {
		t.Fatalf("growing the tmpfs: %v %s", err, out)
	}
	p := startServer(t, dir)
	base = "http://" + p.addr
	get := func(i int) (int, []byte) {
		resp, err := http.Get(base + "/v1/kv/c/" + key(i))
		if err != nil {
			t.Fatalf("get %s: %v", key(i), err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	for _, i := range acked {
		if code, b := get(i); code != 200 || !bytes.Equal(b, value(i)) {
			t.Errorf("acknowledged write of %s after the restart: %d, %d bytes (equal: %v)", key(i), code, len(b), bytes.Equal(b, value(i)))
		}
	}
	kept := 0
	for _, i := range unknown {
		switch code, b := get(i); {
		case code == 200 && bytes.Equal(b, value(i)):
			kept++
		case code != 404:
			t.Errorf("unacknowledged write of %s after the restart: %d, %d bytes, want its value or 404", key(i), code, len(b))
		}
	}
	if code, _, body := httpDo(t, "PUT", base+"/v1/kv/c/after", "v"); code != 200 {
		t.Errorf("put after the restart: %d %s", code, body)
	}
	t.Logf("after the restart: every acknowledged write there; %d of the %d unacknowledged kept", kept, len(unknown))
	p.stop(t)
}
