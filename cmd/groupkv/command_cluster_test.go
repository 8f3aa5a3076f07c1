package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// clusterBody is a /v1/cluster answer with its nodes and shards out of order.
const clusterBody = `{
  "nodes": [
    {"id": 3, "addr": "127.0.0.1:7090", "peer_addr": "127.0.0.1:7091", "healthy": false, "replicas": 2, "held": -1},
    {"id": 1, "addr": "127.0.0.1:7070", "peer_addr": "127.0.0.1:7071", "healthy": true, "replicas": 2, "held": 2},
    {"id": 2, "addr": "127.0.0.1:7080", "peer_addr": "127.0.0.1:7081", "healthy": true, "replicas": 0, "held": 1, "draining": true}
  ],
  "shards": [
    {"collection": "users", "shard": 3, "replicas": [1, 2, 3], "voters": [1, 2, 3], "leader": 2, "consistency": "ok"},
    {"collection": "users", "shard": 2, "replicas": [1, 2, 3], "voters": [1, 2], "leader": 0},
    {"collection": "", "shard": 1, "replicas": [1, 2, 3], "voters": [1, 2, 3], "voters_outgoing": [1], "leader": 1},
    {"collection": "events", "shard": 4, "replicas": [2], "leader": 2, "future_field": true}
  ],
  "future_field": {"x": 1}
}`

// runCluster runs `groupkv cluster ARGS...` in-process and answers its
// output and error.
func runCluster(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := clusterCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	cmd.SilenceUsage = true
	cmd.SilenceErrors = true
	err := cmd.Execute()
	return out.String(), err
}

// serveCluster serves body with status on /v1/cluster.
func serveCluster(t *testing.T, status int, body string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != "/v1/cluster" {
			http.Error(w, `{"error":{"code":"not_found","message":"unknown path"}}`, 404)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

func TestClusterStatusFormat(t *testing.T) {
	var out bytes.Buffer
	if err := formatClusterStatus(&out, []byte(clusterBody)); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	want := `NODE  ADDR            PEER            HEALTHY  REPLICAS  HELD  STATE
1     127.0.0.1:7070  127.0.0.1:7071  yes      2         2     member
2     127.0.0.1:7080  127.0.0.1:7081  yes      0         1     draining
3     127.0.0.1:7090  127.0.0.1:7091  no       2         -     member

COLLECTION  SHARD  REPLICAS  LEADER  CONSISTENCY  VOTERS
(meta)      1      1,2,3     1       -            1,2,3 (from 1)
events      4      2         2       -            -
users       2      1,2,3     -       -            1,2
users       3      1,2,3     2       ok           1,2,3
`
	if got != want {
		t.Fatalf("got:\n%s\nwant:\n%s", got, want)
	}
}

func TestClusterStatusFormatEmptyAndBad(t *testing.T) {
	var out bytes.Buffer
	if err := formatClusterStatus(&out, []byte(`{"nodes": [{"id": 1}], "shards": [{"collection": "c", "shard": 1}]}`)); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "1     -     -     no") || !strings.Contains(out.String(), "c           1      -         -       -            -") {
		t.Fatalf("missing fields not shown as -:\n%s", out.String())
	}
	if err := formatClusterStatus(&out, []byte(`<html>`)); err == nil || !strings.Contains(err.Error(), "/v1/cluster") {
		t.Fatalf("bad body: %v", err)
	}
	if err := formatClusterStatus(&out, []byte(`{"nodes": [{"id": "one"}]}`)); err == nil {
		t.Fatal("a string id was accepted")
	}
}

func TestClusterStatusCommand(t *testing.T) {
	addr := serveCluster(t, 200, clusterBody)
	out, err := runCluster(t, "status", "--addr", addr)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{
		"1     127.0.0.1:7070", "2     127.0.0.1:7080", "3     127.0.0.1:7090  127.0.0.1:7091  no",
		"(meta)      1      1,2,3     1       -            1,2,3 (from 1)", "users       3      1,2,3     2       ok           1,2,3", "events      4      2         2       -            -",
	} {
		if !strings.Contains(out, s) {
			t.Errorf("output lacks %q:\n%s", s, out)
		}
	}

	// --json passes the body through, with a final newline.
	out, err = runCluster(t, "status", "--addr", addr, "--json")
	if err != nil {
		t.Fatal(err)
	}
	if out != clusterBody+"\n" {
		t.Fatalf("--json: got\n%s\nwant the body", out)
	}
}

func TestClusterStatusErrors(t *testing.T) {
	// An error body: its code and message are reported.
	addr := serveCluster(t, 503, `{"error":{"code":"unavailable","message":"node is not ready: not a member yet"}}`)
	out, err := runCluster(t, "status", "--addr", addr)
	if err == nil {
		t.Fatalf("503 not reported; output:\n%s", out)
	}
	for _, s := range []string{addr, "503", "unavailable", "not a member yet"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q lacks %q", err, s)
		}
	}
	if out != "" {
		t.Errorf("output on error: %q", out)
	}
	if _, err := runCluster(t, "status", "--addr", addr, "--json"); err == nil || !strings.Contains(err.Error(), "not a member yet") {
		t.Errorf("--json with 503: %v", err)
	}

	// A body that is not a groupkv error is shown as it is.
	addr = serveCluster(t, 502, "bad gateway\n")
	if _, err := runCluster(t, "status", "--addr", addr); err == nil || !strings.Contains(err.Error(), "502 Bad Gateway: bad gateway") {
		t.Errorf("502: %v", err)
	}

	// Nothing listening.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	if _, err := runCluster(t, "status", "--addr", closed); err == nil || !strings.Contains(err.Error(), "cannot reach a groupkv node at "+closed) {
		t.Errorf("unreachable: %v", err)
	}

	// Command-line mistakes are usage errors.
	for _, args := range [][]string{
		{"status", "--addr", "http://127.0.0.1:7070"},
		{"status", "extra"},
	} {
		_, err := runCluster(t, args...)
		var ue usageError
		if !errors.As(err, &ue) {
			t.Errorf("%v: got %v, want a usage error", args, err)
		}
	}
}

func TestClusterLocalValidation(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--nodes", "0"}, "at least 1 node"},
		{[]string{"--nodes", "-3"}, "at least 1 node"},
		{[]string{"--nodes", "1000"}, "at most"},
		{[]string{"--base-port", "0"}, "--base-port 0"},
		{[]string{"--base-port", "-1"}, "--base-port -1"},
		{[]string{"--base-port", "65520", "--nodes", "3"}, "over 65535"},
		{[]string{"--base-port", "65535", "--nodes", "1"}, "over 65535"},
		{[]string{"--dir", ""}, "--dir"},
		{[]string{"--timeout", "0s"}, "--timeout"},
		{[]string{"extra"}, "arguments"},
	} {
		args := append([]string{"local", "--dir", filepath.Join(dir, "c")}, tc.args...)
		_, err := runCluster(t, args...)
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want a usage error with %q", tc.args, err, tc.want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "c")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused command created its directory: %v", err)
	}

	ok := localOptions{Dir: "d", Nodes: 3, BasePort: 65514, Timeout: time.Second}
	if err := ok.validate(); err != nil {
		t.Errorf("the highest base port for 3 nodes: %v", err)
	}
}

func TestClusterLocalLayout(t *testing.T) {
	o := localOptions{Dir: "kv", Nodes: 3, BasePort: 7070, Timeout: time.Minute}
	want := [][]string{
		{"server", "--node-id", "1", "--data-dir", filepath.Join("kv", "node1"), "--listen", "127.0.0.1:7070", "--peer-listen", "127.0.0.1:7071"},
		{"server", "--node-id", "2", "--data-dir", filepath.Join("kv", "node2"), "--listen", "127.0.0.1:7080", "--peer-listen", "127.0.0.1:7081", "--join", "127.0.0.1:7071"},
		{"server", "--node-id", "3", "--data-dir", filepath.Join("kv", "node3"), "--listen", "127.0.0.1:7090", "--peer-listen", "127.0.0.1:7091", "--join", "127.0.0.1:7071"},
	}
	for i, w := range want {
		n := o.node(i + 1)
		if got := o.serverArgs(n); strings.Join(got, " ") != strings.Join(w, " ") {
			t.Errorf("node %d: got %q, want %q", i+1, got, w)
		}
		if n.logPath != filepath.Join("kv", fmt.Sprintf("node%d.log", i+1)) {
			t.Errorf("node %d log: %s", i+1, n.logPath)
		}
	}
}

func TestClusterLocalPlan(t *testing.T) {
	dir := t.TempDir()
	base := freeLocalBase(t, 2)
	o := localOptions{Dir: dir, Nodes: 1, BasePort: base, Timeout: time.Minute}

	nodes, err := planLocalCluster(o)
	if err != nil || len(nodes) != 1 || nodes[0].existing {
		t.Fatalf("fresh: %v %+v", err, nodes)
	}

	// A port in use is refused before anything starts.
	l, err := net.Listen("tcp", o.node(1).peerAddr)
	if err != nil {
		t.Fatal(err)
	}
	_, err = planLocalCluster(o)
	l.Close()
	if err == nil || !strings.Contains(err.Error(), o.node(1).peerAddr) || !strings.Contains(err.Error(), "--base-port") {
		t.Fatalf("port in use: %v", err)
	}

	// Node 2 has data but node 1 has none: node 1 would start another cluster.
	o.Nodes = 2
	if err := os.MkdirAll(o.node(2).dataDir, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(o.node(2).dataDir, "x"), nil, 0o644)
	nodes, err = planLocalCluster(o)
	if err == nil || !strings.Contains(err.Error(), "start afresh") {
		t.Fatalf("node 2 without node 1: %v %+v", err, nodes)
	}
	os.MkdirAll(o.node(1).dataDir, 0o755)
	os.WriteFile(filepath.Join(o.node(1).dataDir, "x"), nil, 0o644)
	nodes, err = planLocalCluster(o)
	if err != nil || !nodes[0].existing || !nodes[1].existing {
		t.Fatalf("restart: %v %+v", err, nodes)
	}
}

// freeLocalBase answers a base port for `groupkv cluster local` whose
// nodes' ports (node i's 10*(i-1) above it, and the port above that) are
// all free now.
func freeLocalBase(t *testing.T, nodes int) int {
	t.Helper()
	var err error
	for range 50 {
		base := freePortPair(t)
		o := localOptions{Dir: t.TempDir(), Nodes: nodes, BasePort: base, Timeout: time.Minute}
		if _, err = planLocalCluster(o); err == nil {
			return base
		}
	}
	t.Fatalf("no free ports for %d local nodes: %v", nodes, err)
	return 0
}

// freePortPair answers a loopback port p such that p and p+1 are free now.
func freePortPair(t *testing.T) int {
	t.Helper()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if p >= 65535 {
			continue
		}
		l2, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+1))
		if err != nil {
			continue
		}
		l2.Close()
		return p
	}
	t.Fatal("no two free consecutive ports")
	return 0
}

// localRun is a `groupkv cluster local` process (the binary built by TestMain).
type localRun struct {
	cmd    *exec.Cmd
	stderr *syncBuffer
	exited chan error
	done   bool
}

// startLocal runs `groupkv cluster local ARGS...` and waits until it says
// the cluster is running; it answers the process and what it printed.
func startLocal(t *testing.T, args ...string) (*localRun, string) {
	t.Helper()
	cmd := exec.Command(binary, append([]string{"cluster", "local"}, args...)...)
	r := &localRun{cmd: cmd, stderr: &syncBuffer{}, exited: make(chan error, 1)}
	cmd.Stderr = r.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// A failing test must not leave its cluster running.
	t.Cleanup(func() {
		if !r.done {
			r.stop(t)
		}
	})
	ready := make(chan string, 1)
	go func() {
		var out strings.Builder
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			out.WriteString(sc.Text() + "\n")
			if strings.HasPrefix(sc.Text(), "Ctrl-C stops the cluster") {
				ready <- out.String()
			}
		}
		close(ready)
		r.exited <- cmd.Wait()
	}()
	select {
	case out, ok := <-ready:
		if !ok {
			r.done = true
			t.Fatalf("cluster local exited before the cluster ran:\n%s", r.stderr)
		}
		return r, out
	case <-time.After(90 * time.Second):
		t.Fatalf("cluster local not running after 90s:\n%s", r.stderr)
	}
	return nil, ""
}

// stop sends SIGTERM and wants a clean exit within 30s.
func (r *localRun) stop(t *testing.T) {
	t.Helper()
	r.done = true
	r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-r.exited:
		if err != nil {
			t.Errorf("cluster local exited with %v after SIGTERM:\n%s", err, r.stderr)
		}
	case <-time.After(30 * time.Second):
		r.cmd.Process.Kill()
		t.Errorf("cluster local did not exit within 30s of SIGTERM:\n%s", r.stderr)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestClusterLocalTLS runs a two-node `groupkv cluster local --tls`: the
// nodes serve TLS only, the output names the client flags, and the CLI
// with them writes through one node and reads through the other.
func TestClusterLocalTLS(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cluster")
	base := freeLocalBase(t, 2)
	o := localOptions{Dir: dir, Nodes: 2, BasePort: base, TLS: true}
	r, out := startLocal(t, "--dir", dir, "--nodes", "2", "--base-port", strconv.Itoa(base), "--tls")
	flags := o.clientTLSArgs()
	if !strings.Contains(out, strings.Join(flags, " ")) || !strings.Contains(out, "TLS only") {
		t.Errorf("output lacks the client's TLS flags %q:\n%s", flags, out)
	}
	cli := func(addr string, args ...string) (string, error) {
		out, err := exec.Command(binary, append(append(args, "--addr", addr), flags...)...).CombinedOutput()
		return string(out), err
	}
	if out, err := cli(o.node(1).addr, "collections", "create", "users", "--shards", "2"); err != nil {
		t.Fatalf("collections create: %v\n%s", err, out)
	}
	if out, err := cli(o.node(2).addr, "put", "users", "alice", "hello"); err != nil {
		t.Fatalf("put through node 2: %v\n%s", err, out)
	}
	if out, err := cli(o.node(1).addr, "get", "users", "alice"); err != nil || strings.TrimSpace(out) != "hello" {
		t.Fatalf("get through node 1: %v %q", err, out)
	}
	if code, _, body := httpDo(t, "GET", "http://"+o.node(1).addr+"/healthz", ""); code != http.StatusBadRequest {
		t.Errorf("healthz in the clear: %d %s, want 400", code, body)
	}
	r.stop(t)
}

// TestClusterLocalOneNode runs a one-node `groupkv cluster local`, writes
// through it, stops it with SIGTERM, restarts it on the same directory and
// reads the write back.
func TestClusterLocalOneNode(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cluster")
	base := freePortPair(t)
	addr := "127.0.0.1:" + strconv.Itoa(base)
	url := "http://" + addr
	args := []string{"--dir", dir, "--nodes", "1", "--base-port", strconv.Itoa(base)}

	check := func(out string) {
		t.Helper()
		for _, s := range []string{addr, "cluster status --addr " + addr, filepath.Join(dir, "node1.log")} {
			if !strings.Contains(out, s) {
				t.Errorf("output lacks %q:\n%s", s, out)
			}
		}
		if code, _, body := httpDo(t, "GET", url+"/healthz", ""); code != 200 {
			t.Fatalf("healthz: %d %s", code, body)
		}
		if fi, err := os.Stat(filepath.Join(dir, "node1.log")); err != nil || fi.Size() == 0 {
			t.Errorf("node log: %v", err)
		}
	}
	stopped := func(r *localRun) {
		t.Helper()
		r.stop(t)
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			t.Fatalf("a node still listens on %s after cluster local exited", addr)
		}
		if !strings.Contains(r.stderr.String(), "cluster stopped") {
			t.Errorf("stderr lacks \"cluster stopped\":\n%s", r.stderr)
		}
	}

	r, out := startLocal(t, args...)
	check(out)
	if code, _, body := httpDo(t, "POST", url+"/v1/collections", `{"name": "c"}`); code != 200 {
		t.Fatalf("create collection: %d %s", code, body)
	}
	if code, _, body := httpDo(t, "PUT", url+"/v1/kv/c/k", "v1"); code != 200 {
		t.Fatalf("put: %d %s", code, body)
	}
	stopped(r)

	r, out = startLocal(t, args...)
	check(out)
	if !strings.Contains(r.stderr.String(), "restarting node(s) 1") {
		t.Errorf("stderr lacks the restart:\n%s", r.stderr)
	}
	if code, _, body := httpDo(t, "GET", url+"/v1/kv/c/k", ""); code != 200 || body != "v1" {
		t.Fatalf("get after restart: %d %s", code, body)
	}
	// A second run on the same ports is refused while the first runs.
	second := exec.Command(binary, append([]string{"cluster", "local"}, args...)...)
	if b, err := second.CombinedOutput(); err == nil || !strings.Contains(string(b), "in use") {
		t.Errorf("second cluster on the same ports: %v\n%s", err, b)
	}
	stopped(r)
}

// TestClusterCheckCommand runs `groupkv cluster check` against a fake node:
// the shards asked for reach it, the outcomes are tabled in its order, and
// an outcome that is not ok fails the command after printing them.
func TestClusterCheckCommand(t *testing.T) {
	var (
		mu     sync.Mutex
		bodies []string
	)
	answer := `{"ok": false, "checks": [
	  {"shard": 1, "id": 5, "index": 30, "status": "ok", "replicas": [1, 2, 3], "sums": {"1": "aa", "2": "aa", "3": "aa"}, "by": 1},
	  {"shard": 4, "collection": "users", "id": 6, "index": 12, "status": "mismatch", "replicas": [1, 2, 3], "sums": {"1": "aa", "2": "bb", "3": "aa"}, "mismatched": [2], "by": 1},
	  {"shard": 5, "collection": "users", "id": 0, "status": "incomplete", "replicas": null, "errors": ["the check could not be run: no leader"], "by": 1, "future_field": 1}
	]}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/cluster/check" {
			http.Error(w, `{"error":{"code":"not_found","message":"unknown path"}}`, 404)
			return
		}
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, string(b))
		mu.Unlock()
		io.WriteString(w, answer)
	}))
	defer srv.Close()
	addr := srv.Listener.Addr().String()

	out, err := runCluster(t, "check", "--addr", addr, "--shard", "1", "--shard", "4,5")
	if err == nil || err.Error() != "2 of 3 shards checked are not ok" {
		t.Errorf("error %v, want 2 of 3 shards not ok", err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	want := []string{
		`^COLLECTION\s+SHARD\s+INDEX\s+REPLICAS\s+STATUS\s+MISMATCHED\s+MISSING\s+ERRORS$`,
		`^\(meta\)\s+1\s+30\s+1,2,3\s+ok\s+-\s+-\s+-$`,
		`^users\s+4\s+12\s+1,2,3\s+mismatch\s+2\s+-\s+-$`,
		`^users\s+5\s+-\s+-\s+incomplete\s+-\s+-\s+the check could not be run: no leader$`,
	}
	if len(lines) != len(want) {
		t.Fatalf("output has %d lines, want %d:\n%s", len(lines), len(want), out)
	}
	for i, re := range want {
		if !regexp.MustCompile(re).MatchString(lines[i]) {
			t.Errorf("line %d %q does not match %s", i, lines[i], re)
		}
	}

	answer = `{"ok": true, "checks": [{"shard": 1, "index": 30, "status": "ok", "replicas": [1]}]}`
	out, err = runCluster(t, "check", "--addr", addr, "--json")
	if err != nil || out != answer+"\n" {
		t.Errorf("--json: %v, output %q, want the body", err, out)
	}
	mu.Lock()
	if !slices.Equal(bodies, []string{`{"shards":[1,4,5]}`, `{"shards":[]}`}) {
		t.Errorf("the node was sent %q, want shards [1,4,5], then none", bodies)
	}
	mu.Unlock()

	for _, args := range [][]string{
		{"check", "--addr", addr, "--shard", "0"},
		{"check", "--addr", addr, "--shard", "x"},
		{"check", "--addr", addr, "--timeout", "0s"},
		{"check", "--addr", "http://" + addr},
		{"check", "extra", "--addr", addr},
	} {
		_, err := runCluster(t, args...)
		var ue usageError
		if !errors.As(err, &ue) && !strings.Contains(fmt.Sprint(err), "invalid argument") {
			t.Errorf("%v: got %v, want a usage error", args, err)
		}
	}
}
