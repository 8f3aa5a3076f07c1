package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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
	mnt := smallDisk(t, 48)
	dir := filepath.Join(mnt, "d")
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)

	// No free-space floor: the disk fills to the last byte
	// (TestLowDiskSpaceRefusesWrites has the floor).
	srv := startWatched(t, dir, "--storage-failure-limit", "5s", "--min-free-space", "-1")
	base := "http://" + srv.serving(t)
	if code, _, body := httpDo(t, "POST", base+"/v1/collections", `{"name": "c", "shards": 4}`); code != 200 {
		t.Fatalf("create collection: %d %s", code, body)
	}

	value := func(i int) []byte { return bigValue(seed, i) }
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
	select {
	case <-srv.done:
	case <-time.After(3 * time.Minute):
		t.Fatalf("the server did not exit within 3 minutes of writes to a 48 MiB disk (%d acknowledged):\n%s", len(acked), srv.log.String())
	}
	wg.Wait()
	log := srv.log.String()
	wantFailStop(t, "the server on a full disk", srv.err, log, "no space left on device")
	if len(acked) == 0 {
		t.Fatalf("no write was acknowledged before the disk filled:\n%s", log)
	}
	t.Logf("%d writes acknowledged, %d answered 503 or cut off (%d after the exit); last lines:\n%s", len(acked), len(unknown), refused, lastLines(log, 2))

	// Restarted on the disk still full, it exits with status 1 naming
	// it (opening, Pebble flushes what it replays from its log, which
	// cannot succeed, and retries for good: the server gives up after
	// --storage-failure-limit), or, if what it replays fits, serves.
	restart := startWatched(t, dir, "--storage-failure-limit", "2s", "--min-free-space", "-1")
	deadline := time.After(2 * time.Minute)
restartWait:
	for {
		select {
		case <-restart.done:
			log := restart.log.String()
			wantFailStop(t, "the server restarted on the full disk", restart.err, log, "no space left on device")
			t.Logf("restarted on the full disk: %s", lastLines(log, 1))
			break restartWait
		case <-deadline:
			t.Fatalf("restarted on the full disk, the server neither served nor exited within 2 minutes:\n%s", lastLines(restart.log.String(), 5))
		case <-time.After(50 * time.Millisecond):
			if servingRE.MatchString(restart.log.String()) {
				t.Logf("restarted on the full disk, the server serves")
				restart.kill()
				break restartWait
			}
		}
	}

	// Room again: every acknowledged write is there.
	growDisk(t, mnt)
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

// smallDisk mounts a tmpfs of mib MiB on a new temporary directory, which
// it answers, and unmounts it when the test ends; it skips the test where
// it cannot mount (not root).
func smallDisk(t *testing.T, mib int) string {
	t.Helper()
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%dm", mib), "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Skipf("this test mounts a tmpfs, which needs root: %v %s", err, bytes.TrimSpace(out))
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v %s", mnt, err, out)
		}
	})
	return mnt
}

// growDisk makes the tmpfs on mnt 512 MiB: room again.
func growDisk(t *testing.T, mnt string) {
	t.Helper()
	if out, err := exec.Command("mount", "-o", "remount,size=512m", mnt).CombinedOutput(); err != nil {
		t.Fatalf("growing the tmpfs on %s: %v %s", mnt, err, out)
	}
}

// bigValue is the i-th write's value: 64 KiB drawn from seed.
func bigValue(seed uint64, i int) []byte {
	rng := rand.New(rand.NewPCG(seed, uint64(i)))
	b := make([]byte, 64<<10)
	for j := range b {
		b[j] = byte(rng.Uint32())
	}
	return b
}

// exitedWith waits (at most wait) for node id's process to exit and
// answers its exit status; it fails the test if the node is still running.
func (c *tcluster) exitedWith(id int, wait time.Duration) error {
	c.tb.Helper()
	n := c.node(id)
	n.mu.Lock()
	done := n.done
	n.mu.Unlock()
	select {
	case <-done:
	case <-time.After(wait):
		c.tb.Fatalf("node %d still runs after %v", id, wait)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.err
}

// TestClusterOutlivesAFullDisk runs a three-node cluster whose node 3 has
// its data directory on a small tmpfs, and writes 64 KiB values through
// nodes 1 and 2 from four clients until node 3's disk is full: node 3
// exits with status 1 naming the full disk, the cluster goes on taking
// writes on the two others, and node 3, restarted once there is room
// again, catches up: every acknowledged write reads back through it, and
// the replicas of every shard hold the same data (groupkv cluster check).
func TestClusterOutlivesAFullDisk(t *testing.T) {
	mnt := smallDisk(t, 64)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	c := newTCluster(t, 3)
	c.node(3).dir = filepath.Join(mnt, "node3")
	c.node(3).args = []string{"--storage-failure-limit", "5s", "--min-free-space", "-1"}
	c.startAll()
	const coll = "c"
	c.createCollection(1, coll, 3)

	key := func(i int) string { return fmt.Sprintf("k%05d", i) }
	var (
		mu      sync.Mutex
		acked   []int
		unknown int
		after   atomic.Int64 // writes acknowledged after node 3 exited
	)
	n3 := c.node(3)
	n3.mu.Lock()
	n3done := n3.done
	n3.mu.Unlock()
	const writers, wantAfter = 4, 40
	deadline := time.Now().Add(3 * time.Minute)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := w; after.Load() < wantAfter && time.Now().Before(deadline); i += writers {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				a, err := c.do(ctx, "PUT", c.url(1+i%2)+"/v1/kv/"+coll+"/"+key(i), string(bigValue(seed, i)))
				cancel()
				mu.Lock()
				switch {
				case err == nil && a.code == 200:
					acked = append(acked, i)
					select {
					case <-n3done:
						after.Add(1)
					default:
					}
				case err == nil && a.code == 503 && (a.errCode == "unavailable" || a.errCode == "commit_unknown"):
					unknown++ // a leader on node 3 stopped, or moved
				default:
					t.Errorf("put %s through node %d: %v %v, want 200, or 503 unavailable or commit_unknown", key(i), 1+i%2, err, a)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	werr := c.exitedWith(3, time.Until(deadline)+time.Second)
	log := n3.logs.tail(20)
	wantFailStop(t, "node 3 on a full disk", werr, log, "no space left on device")
	if after.Load() < wantAfter {
		t.Fatalf("%d writes acknowledged after node 3 exited by the deadline, want %d", after.Load(), wantAfter)
	}
	t.Logf("%d writes acknowledged (%d after node 3 exited), %d answered 503; node 3's last lines:\n%s", len(acked), after.Load(), unknown, lastLines(log, 2))

	// Room again: node 3 restarts on its data and catches up.
	growDisk(t, mnt)
	c.start(3, false)
	t.Logf("node 3 restarted, healthy after %v", c.waitHealthy(3).Round(time.Millisecond))
	for _, i := range acked {
		a, err := c.do(context.Background(), "GET", c.url(3)+"/v1/kv/"+coll+"/"+key(i), "")
		if err != nil || a.code != 200 || a.body != string(bigValue(seed, i)) {
			t.Fatalf("acknowledged write of %s through node 3 after its restart: %v %d, %d bytes", key(i), err, a.code, len(a.body))
		}
	}
	c.wantCheckedOK(3, coll, 3)
	for _, id := range c.ids() {
		c.stop(id)
	}
}

// TestLowDiskSpaceRefusesWrites writes 64 KiB values, paced, to a server
// on a 160 MiB tmpfs: once its disk has less than --min-free-space (64
// MiB by default) free the server, alone, refuses writes 503
// (unavailable, saying why) before any write finds no room, and goes on
// serving reads: every acknowledged write reads back, /healthz says why
// writes are refused, and `groupkv backup` copies the data off the full
// disk. Restarted with the disk as it is, it starts and serves reads the
// same way; given room, it takes writes again and has every write it
// acknowledged.
func TestLowDiskSpaceRefusesWrites(t *testing.T) {
	mnt := smallDisk(t, 160)
	dir := filepath.Join(mnt, "d")
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	srv := startWatched(t, dir)
	addr := srv.serving(t)
	base := "http://" + addr
	if code, _, body := httpDo(t, "POST", base+"/v1/collections", `{"name": "c", "shards": 2}`); code != 200 {
		t.Fatalf("create collection: %d %s", code, body)
	}
	var acked []int
	client := &http.Client{Timeout: time.Minute}
	deadline := time.After(3 * time.Minute)
	var refusal string
	for i := 0; refusal == ""; i++ {
		select {
		case <-srv.done:
			t.Fatalf("the server exited as its disk filled (%d writes acknowledged): %v\n%s", len(acked), srv.err, lastLines(srv.log.String(), 20))
		case <-deadline:
			t.Fatalf("the server still took writes after 3 minutes of writes (%d acknowledged):\n%s", len(acked), srv.log.String())
		case <-time.After(5 * time.Millisecond): // paced: the free space is looked at every 100 ms
		}
		req, _ := http.NewRequest("PUT", fmt.Sprintf("%s/v1/kv/c/k%05d", base, i), bytes.NewReader(bigValue(seed, i)))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("put k%05d: %v", i, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch resp.StatusCode {
		case 200:
			acked = append(acked, i)
		case 503:
			if !strings.Contains(string(body), "refuses writes") || !strings.Contains(string(body), "--min-free-space") {
				t.Fatalf("put k%05d answered 503 %s, want the low disk named", i, body)
			}
			refusal = string(body)
		default:
			t.Fatalf("put k%05d: %d %s", i, resp.StatusCode, body)
		}
	}
	t.Logf("%d writes acknowledged, then %s", len(acked), refusal)
	if log := srv.log.String(); strings.Contains(log, "no space left on device") {
		t.Errorf("a write found no room:\n%s", lastLines(log, 5))
	}
	readsBack := func(addr string) {
		t.Helper()
		for _, i := range acked {
			if code, _, body := httpDo(t, "GET", fmt.Sprintf("http://%s/v1/kv/c/k%05d", addr, i), ""); code != 200 || body != string(bigValue(seed, i)) {
				t.Fatalf("acknowledged write k%05d: %d, %d bytes", i, code, len(body))
			}
		}
	}
	readsBack(addr)
	if code, _, body := httpDo(t, "GET", base+"/healthz", ""); code != 200 || !strings.Contains(body, `"writes_refused"`) {
		t.Fatalf("/healthz on a low disk: %d %s, want 200 naming the refused writes", code, body)
	}
	if out, err := exec.Command(binary, "cluster", "status", "--addr", addr).CombinedOutput(); err != nil || !strings.Contains(string(out), "writes refused (low disk)") {
		t.Fatalf("groupkv cluster status on a low disk: %v\n%s", err, out)
	}
	backup := filepath.Join(t.TempDir(), "b") // off the full disk
	if out, err := exec.Command(binary, "backup", "--addr", addr, "--out", backup).CombinedOutput(); err != nil {
		t.Fatalf("backup of the server on a low disk: %v\n%s", err, out)
	}
	if _, got := readBackupFile(t, backup); len(got["c"]) != len(acked) {
		t.Fatalf("the backup holds %d records of c, want the %d acknowledged", len(got["c"]), len(acked))
	}
	srv.kill()

	// Restarted on a disk with 40 MiB free (files fill it to that: the
	// killed server's files that were deleted but open take no room any
	// more), it starts and serves reads. (Starting, it deletes files it
	// no longer needs, and may find room.)
	fill := func(name string, free int64) {
		t.Helper()
		var st syscall.Statfs_t
		if err := syscall.Statfs(mnt, &st); err != nil {
			t.Fatal(err)
		}
		if avail := int64(st.Bavail) * st.Bsize; avail > free {
			if err := os.WriteFile(filepath.Join(mnt, name), make([]byte, avail-free), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	fill("filler1", 40<<20)
	again := startWatched(t, dir)
	addr = again.serving(t)
	readsBack(addr)
	fill("filler2", 48<<20)
	waitFor(t, "writes refused by the restarted server", func() bool {
		code, _, body := httpDo(t, "PUT", "http://"+addr+"/v1/kv/c/more", "x")
		return code == 503 && strings.Contains(body, "refuses writes")
	})
	readsBack(addr)

	// Room again: writes are taken without a restart.
	os.Remove(filepath.Join(mnt, "filler1"))
	os.Remove(filepath.Join(mnt, "filler2"))
	waitFor(t, "writes taken once the disk has room", func() bool {
		code, _, _ := httpDo(t, "PUT", "http://"+addr+"/v1/kv/c/more", "x")
		return code == 200
	})
	readsBack(addr)
	again.kill()
}
