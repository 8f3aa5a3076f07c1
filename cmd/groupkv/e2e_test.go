package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	groupkv "github.com/groupkv/groupkv"
)

// binary is the groupkv binary built once for the end-to-end tests.
var binary string

func TestMain(m *testing.M) {
	if os.Getenv(txnClientEnv) != "" {
		// A transaction client process of the client-kill tests: it runs
		// no server.
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "groupkv-e2e")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "groupkv")
	out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "building groupkv: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a groupkv server process.
type proc struct {
	cmd  *exec.Cmd
	addr string
	logs *bytes.Buffer
	mu   *sync.Mutex
}

var servingRE = regexp.MustCompile(`serving on (\S+) `)

// startServer runs `groupkv server` on dir with ports picked by the kernel
// and waits until /healthz answers 200.
func startServer(t *testing.T, dir string, extra ...string) *proc {
	t.Helper()
	args := append([]string{"server", "--data-dir", dir, "--listen", "127.0.0.1:0", "--peer-listen", "127.0.0.1:0", "--log-level", "warn"}, extra...)
	cmd := exec.Command(binary, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, logs: &bytes.Buffer{}, mu: &sync.Mutex{}}
	// A failing test must not leave its server running.
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			p.kill()
		}
	})
	addrCh := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sent := false
		for sc.Scan() {
			p.mu.Lock()
			p.logs.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
			if m := servingRE.FindStringSubmatch(sc.Text()); m != nil && !sent {
				addrCh <- m[1]
				sent = true
			}
		}
		if !sent {
			close(addrCh)
		}
	}()
	select {
	case addr, ok := <-addrCh:
		if !ok {
			cmd.Wait()
			t.Fatalf("server exited before serving:\n%s", p.logText())
		}
		p.addr = addr
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("server did not start within 60s:\n%s", p.logText())
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get("http://" + p.addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return p
			}
		}
		if time.Now().After(deadline) {
			p.kill()
			t.Fatalf("server not healthy within 60s:\n%s", p.logText())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// watchedServer is a `groupkv server` process whose output the test reads
// as it runs, and which may exit on its own.
type watchedServer struct {
	cmd  *exec.Cmd
	log  syncBuffer    // written by the command's copier as the test reads it
	done chan struct{} // closed once the process exited
	err  error         // its exit status, once done is closed
}

// startWatched runs `groupkv server` on dir (ports picked by the kernel,
// --log-level warn, then extra) and does not wait for it to serve. It is
// killed when the test ends, if it still runs.
func startWatched(t *testing.T, dir string, extra ...string) *watchedServer {
	t.Helper()
	return startWatchedCmd(t, exec.Command(binary, serverArgs(dir, extra...)...))
}

// serverArgs are the arguments of `groupkv server` on dir, with ports
// picked by the kernel, --log-level warn, then extra.
func serverArgs(dir string, extra ...string) []string {
	return append([]string{"server", "--data-dir", dir, "--listen", "127.0.0.1:0", "--peer-listen", "127.0.0.1:0", "--log-level", "warn"}, extra...)
}

// startWatchedCmd is startWatched for a command of the test's making.
func startWatchedCmd(t *testing.T, cmd *exec.Cmd) *watchedServer {
	t.Helper()
	w := &watchedServer{cmd: cmd, done: make(chan struct{})}
	w.cmd.Stderr = &w.log
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		w.err = w.cmd.Wait()
		close(w.done)
	}()
	t.Cleanup(w.kill)
	return w
}

// serving waits until the server says it serves and answers its client
// address; it fails the test if the server exits first or does not serve
// within a minute.
func (w *watchedServer) serving(t *testing.T) string {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if m := servingRE.FindStringSubmatch(w.log.String()); m != nil {
			return m[1]
		}
		select {
		case <-w.done:
			t.Fatalf("the server exited before it served: %v\n%s", w.err, w.log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server did not serve within 60s:\n%s", w.log.String())
		}
	}
}

// wantFailStop checks that a server (what names it) that stopped on a
// storage failure exited with status 1, its log (log) saying why (says),
// without a panic.
func wantFailStop(t *testing.T, what string, exit error, log, says string) {
	t.Helper()
	var ee *exec.ExitError
	if !errors.As(exit, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("%s exited with %v, want status 1:\n%s", what, exit, lastLines(log, 20))
	}
	if !strings.Contains(log, says) {
		t.Errorf("%s's log does not say %q:\n%s", what, says, lastLines(log, 20))
	}
	if strings.Contains(log, "panic:") || strings.Contains(log, "goroutine ") {
		t.Errorf("%s panicked:\n%s", what, log)
	}
}

// kill kills the process, if it runs, and waits for it.
func (w *watchedServer) kill() {
	select {
	case <-w.done:
	default:
		w.cmd.Process.Kill()
		<-w.done
	}
}

func (p *proc) logText() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.String()
}

func (p *proc) kill() {
	p.cmd.Process.Signal(syscall.SIGKILL)
	p.cmd.Wait()
}

// stop sends SIGINT and waits for a clean exit.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	p.cmd.Process.Signal(os.Interrupt)
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("server exited with %v after SIGINT:\n%s", err, p.logText())
		}
	case <-time.After(30 * time.Second):
		p.kill()
		t.Fatalf("server did not stop within 30s of SIGINT")
	}
}

func httpDo(t *testing.T, method, url, body string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

func TestEndToEndHTTPAndGRPC(t *testing.T) {
	dir := t.TempDir()
	p := startServer(t, dir)
	base := "http://" + p.addr

	code, _, body := httpDo(t, "POST", base+"/v1/collections", `{"name": "users", "partitioning": "hash", "shards": 4}`)
	if code != 200 || !strings.Contains(body, `"name":"users"`) {
		t.Fatalf("create collection: %d %s", code, body)
	}
	code, _, body = httpDo(t, "POST", base+"/v1/collections", `{"name": "ranged", "partitioning": "range", "split_points": ["g", "p"]}`)
	if code != 200 {
		t.Fatalf("create range collection: %d %s", code, body)
	}
	code, _, body = httpDo(t, "GET", base+"/v1/collections", "")
	if code != 200 || !strings.Contains(body, `"users"`) || !strings.Contains(body, `"ranged"`) {
		t.Fatalf("list collections: %d %s", code, body)
	}

	// HTTP put with tags; a key with a slash, percent-encoded.
	code, _, body = httpDo(t, "PUT", base+"/v1/kv/users/team%2Fada?tags=admin,paris", "hello")
	if code != 200 || !strings.HasPrefix(body, `{"version":`) {
		t.Fatalf("put: %d %s", code, body)
	}
	code, h, body := httpDo(t, "GET", base+"/v1/kv/users/team%2Fada", "")
	if code != 200 || body != "hello" || h.Get("Groupkv-Tags") != "admin,paris" || h.Get("Groupkv-Version") == "" {
		t.Fatalf("get: %d %q %v", code, body, h)
	}
	version, _ := strconv.ParseUint(h.Get("Groupkv-Version"), 10, 64)

	// gRPC sees the same record.
	db, err := groupkv.Dial(p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	rec, err := db.Get(ctx, groupkv.GetRequest{Collection: "users", Key: []byte("team/ada")})
	if err != nil || string(rec.Value) != "hello" || rec.Version != version {
		t.Fatalf("grpc get: %+v %v", rec, err)
	}
	v2, err := db.Put(ctx, groupkv.PutRequest{Collection: "users", Key: []byte("team/ada"), Value: []byte("bye"), IfVersion: groupkv.Version(version)})
	if err != nil || v2 <= version {
		t.Fatalf("grpc conditional put: %d %v", v2, err)
	}
	if _, err := db.Put(ctx, groupkv.PutRequest{Collection: "users", Key: []byte("team/ada"), Value: []byte("x"), IfVersion: groupkv.Version(version)}); !errors.Is(err, groupkv.ErrConditionFailed) {
		t.Fatalf("stale conditional put over gRPC: %v", err)
	}
	code, _, body = httpDo(t, "PUT", base+"/v1/kv/users/team%2Fada?if_version="+strconv.FormatUint(version, 10), "x")
	if code != 412 || !strings.Contains(body, `"condition_failed"`) {
		t.Fatalf("stale conditional put over HTTP: %d %s", code, body)
	}
	// Reads as of an old version.
	code, _, body = httpDo(t, "GET", base+"/v1/kv/users/team%2Fada?version="+strconv.FormatUint(version, 10), "")
	if code != 200 || body != "hello" {
		t.Fatalf("get at version: %d %s", code, body)
	}
	// Range collection keys land in order-preserving shards.
	for _, k := range []string{"apple", "grape", "zebra"} {
		if _, err := db.Put(ctx, groupkv.PutRequest{Collection: "ranged", Key: []byte(k), Value: []byte(k)}); err != nil {
			t.Fatalf("range put %s: %v", k, err)
		}
	}
	// Delete, then 404.
	code, _, body = httpDo(t, "DELETE", base+"/v1/kv/users/team%2Fada", "")
	if code != 200 || !strings.Contains(body, `"version"`) {
		t.Fatalf("delete: %d %s", code, body)
	}
	code, _, body = httpDo(t, "GET", base+"/v1/kv/users/team%2Fada", "")
	if code != 404 || !strings.Contains(body, `"not_found"`) {
		t.Fatalf("get deleted: %d %s", code, body)
	}
	code, _, body = httpDo(t, "DELETE", base+"/v1/kv/users/team%2Fada", "")
	if code != 404 {
		t.Fatalf("delete absent: %d %s", code, body)
	}
	// Bad input.
	for _, c := range []struct {
		method, path, body string
		code               int
		errCode            string
	}{
		{"PUT", "/v1/kv/nope/k", "v", 404, "collection_not_found"},
		{"PUT", "/v1/kv/Bad!/k", "v", 400, "invalid_argument"},
		{"PUT", "/v1/kv/users/" + strings.Repeat("k", 4097), "v", 413, "too_large"},
		{"PUT", "/v1/kv/users/k", strings.Repeat("v", 1<<20+1), 413, "too_large"},
		{"PUT", "/v1/kv/users/k?tags=a,,b", "v", 400, "invalid_argument"},
		{"PUT", "/v1/kv/users/k?if_version=abc", "v", 400, "invalid_argument"},
		{"POST", "/v1/collections", `{"name": `, 400, "invalid_argument"},
		{"POST", "/v1/collections", `{"name": "users"}`, 409, "already_exists"},
		{"GET", "/v1/kv/users/k?version=9000000000000000000", "", 400, "invalid_argument"},
	} {
		code, _, body := httpDo(t, c.method, base+c.path, c.body)
		if code != c.code || !strings.Contains(body, `"code":"`+c.errCode+`"`) {
			t.Errorf("%s %.60s: got %d %.200s, want %d %s", c.method, c.path, code, body, c.code, c.errCode)
		}
	}
	// Nothing was half-written by the refused requests.
	if _, err := db.Get(ctx, groupkv.GetRequest{Collection: "users", Key: []byte("k")}); !errors.Is(err, groupkv.ErrNotFound) {
		t.Fatalf("refused put left a record: %v", err)
	}
	// The CLI speaks to the same server; flags after positional arguments.
	out, err := exec.Command(binary, "put", "users", "cli-key", "cli-value", "--addr", p.addr, "--tags", "x").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "version ") {
		t.Fatalf("cli put: %v %s", err, out)
	}
	out, err = exec.Command(binary, "get", "--addr", p.addr, "users", "cli-key").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "cli-value" {
		t.Fatalf("cli get: %v %s", err, out)
	}
	out, err = exec.Command(binary, "get", "users", "missing", "--addr", p.addr).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "not_found") {
		t.Fatalf("cli get missing: %v %s", err, out)
	}
	out, err = exec.Command(binary, "collections", "--addr", p.addr).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "users") || !strings.Contains(string(out), "ranged") {
		t.Fatalf("cli collections: %v %s", err, out)
	}
	for _, sub := range [][]string{{"--help"}, {"server", "--help"}, {"put", "--help"}, {"get", "--help"}, {"del", "--help"}, {"collections", "--help"}, {"collections", "create", "--help"}} {
		if out, err := exec.Command(binary, sub...).CombinedOutput(); err != nil {
			t.Errorf("groupkv %v: %v %s", sub, err, out)
		}
	}
	// /metrics is Prometheus text with request, raft and pebble series.
	code, _, body = httpDo(t, "GET", base+"/metrics", "")
	for _, m := range []string{"groupkv_requests_total", "groupkv_request_duration_seconds", "groupkv_raft_proposals_total", "groupkv_raft_apply_seconds", "groupkv_raft_fsync_seconds", "groupkv_pebble_disk_space_bytes", "groupkv_disk_free_bytes"} {
		if code != 200 || !strings.Contains(body, m) {
			t.Errorf("/metrics lacks %s", m)
		}
	}

	// A second server on the same data directory is refused.
	out, err = exec.Command(binary, "server", "--data-dir", dir, "--listen", "127.0.0.1:0", "--peer-listen", "127.0.0.1:0").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "in use by another groupkv process") {
		t.Fatalf("second server on the same directory: %v %s", err, out)
	}

	// Ctrl-C shuts down cleanly, and the data survives a restart.
	p.stop(t)
	p = startServer(t, dir)
	defer p.stop(t)
	db2, err := groupkv.Dial(p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer db2.Close()
	if rec, err := db2.Get(ctx, groupkv.GetRequest{Collection: "ranged", Key: []byte("zebra")}); err != nil || string(rec.Value) != "zebra" {
		t.Fatalf("after restart: %+v %v", rec, err)
	}
}

// TestKill9KeepsAcknowledgedWrites kills a real server with SIGKILL under
// concurrent writes, repeatedly, and checks after each restart that every
// acknowledged write is there.
func TestKill9KeepsAcknowledgedWrites(t *testing.T) {
	seed := rand.Uint64()
	if s := os.Getenv("GROUPKV_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	dir := t.TempDir()
	p := startServer(t, dir)
	if code, _, body := httpDo(t, "POST", "http://"+p.addr+"/v1/collections", `{"name": "k9"}`); code != 200 {
		t.Fatalf("create: %d %s", code, body)
	}
	const writers = 8
	// acked[w][i]: the highest sequence writer w had acknowledged for key i;
	// tried[w][i]: the highest it sent.
	type state struct{ acked, tried map[string]int }
	states := make([]state, writers)
	for w := range states {
		states[w] = state{map[string]int{}, map[string]int{}}
	}
	client := &http.Client{Timeout: 10 * time.Second}
	for round := range 5 {
		var wg sync.WaitGroup
		stop := make(chan struct{})
		for w := range writers {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				st := &states[w]
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					key := fmt.Sprintf("w%d-k%d", w, i%20)
					seq := st.tried[key] + 1
					st.tried[key] = seq
					req, _ := http.NewRequest("PUT", "http://"+p.addr+"/v1/kv/k9/"+key, strings.NewReader(strconv.Itoa(seq)))
					resp, err := client.Do(req)
					if err != nil {
						return // the server is gone
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode == 200 {
						st.acked[key] = seq
					}
				}
			}(w)
		}
		time.Sleep(time.Duration(100+rng.IntN(400)) * time.Millisecond)
		p.kill()
		close(stop)
		wg.Wait()
		p = startServer(t, dir)
		total := 0
		for w := range states {
			for key, acked := range states[w].acked {
				code, _, body := httpDo(t, "GET", "http://"+p.addr+"/v1/kv/k9/"+key, "")
				if code != 200 {
					t.Fatalf("seed %d round %d: acknowledged key %s (seq %d) reads %d %s", seed, round, key, acked, code, body)
				}
				got, _ := strconv.Atoi(body)
				if got < acked || got > states[w].tried[key] {
					t.Fatalf("seed %d round %d: key %s reads seq %d, acknowledged %d, tried up to %d", seed, round, key, got, acked, states[w].tried[key])
				}
				// The next write must build on what is there.
				states[w].tried[key] = max(states[w].tried[key], got)
				total++
			}
		}
		t.Logf("round %d: %d acknowledged keys verified", round, total)
	}
	p.stop(t)
}
