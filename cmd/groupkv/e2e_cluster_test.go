package main

// End-to-end tests of a three-node cluster: real `groupkv server` processes
// (the binary TestMain builds) on loopback ports, spoken to over HTTP.
//
// A restarted member must come back on the ports it registered, so the
// nodes listen on fixed ports picked before the first start (see
// pickLoopbackPorts), not on port 0 like the single-node tests.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/linearizability"
)

// ---------------------------------------------------------------------------
// A cluster of server processes

// tnode is one node of a tcluster: its fixed addresses and data directory,
// and the process running it, if any.
type tnode struct {
	id             int
	addr, peerAddr string
	dir            string
	args           []string // more flags for every start
	logs           *tlog    // the output of every run, each run headed by a line "=== run N"

	mu   sync.Mutex
	cmd  *exec.Cmd     // the current (or last) process
	done chan struct{} // closed once cmd has exited
	err  error         // cmd's exit status, once done is closed
	runs int
}

// running reports whether the node's process is running.
func (n *tnode) running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return false
	}
	select {
	case <-n.done:
		return false
	default:
		return true
	}
}

// tlog collects a node's output.
type tlog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *tlog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// tail answers the last n lines written.
func (l *tlog) tail(n int) string {
	l.mu.Lock()
	s := l.b.String()
	l.mu.Unlock()
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("... (%d earlier lines)", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return "    " + strings.Join(lines, "\n    ")
}

// tcluster is a cluster of groupkv server processes on this machine. Its
// nodes are numbered from 1 (nodes[i].id == i+1); node 1 starts the cluster
// and the others join through its peer address.
type tcluster struct {
	tb     testing.TB
	nodes  []*tnode
	client *http.Client // for requests of the test itself
	// scheme is that of the nodes' client ports, "https://" for a cluster
	// served over TLS (client then trusts its CA), and cliArgs the flags
	// the groupkv commands of the test reach it with.
	scheme  string
	cliArgs []string
}

// newTCluster prepares (does not start) a cluster of n nodes, each with its
// data directory and two free loopback ports. Every process it starts is
// killed when the test ends, and a failed test logs the end of every
// node's output.
func newTCluster(tb testing.TB, n int) *tcluster {
	tb.Helper()
	root := tb.TempDir() // before the Cleanup below: it runs after the kill
	ports := pickLoopbackPorts(tb, 2*n)
	c := &tcluster{tb: tb, scheme: "http://", client: &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: 64},
	}}
	for i := range n {
		c.nodes = append(c.nodes, &tnode{
			id:       i + 1,
			addr:     "127.0.0.1:" + strconv.Itoa(ports[2*i]),
			peerAddr: "127.0.0.1:" + strconv.Itoa(ports[2*i+1]),
			dir:      filepath.Join(root, "node"+strconv.Itoa(i+1)),
			logs:     &tlog{},
		})
	}
	tb.Cleanup(func() {
		for _, nd := range c.nodes {
			c.killProc(nd)
		}
		if tb.Failed() {
			for _, nd := range c.nodes {
				tb.Logf("node %d (%s, peer %s) output:\n%s", nd.id, nd.addr, nd.peerAddr, nd.logs.tail(60))
			}
		}
	})
	return c
}

// pickLoopbackPorts answers n distinct ports that are free on 127.0.0.1
// now. It prefers ports below the kernel's ephemeral range, which no
// outgoing connection takes while a killed node is down, nor any test
// listening on port 0.
func pickLoopbackPorts(tb testing.TB, n int) []int {
	tb.Helper()
	lo, hi := 0, 0
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if ephemeral, err := strconv.Atoi(f[0]); err == nil && ephemeral > 12000 {
				lo, hi = 10000, ephemeral
			}
		}
	}
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for attempt := 0; len(ports) < n && attempt < 1000; attempt++ {
		addr := "127.0.0.1:0"
		if hi > lo {
			addr = "127.0.0.1:" + strconv.Itoa(lo+rand.IntN(hi-lo))
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	if len(ports) < n {
		tb.Fatalf("found only %d free loopback ports of %d", len(ports), n)
	}
	return ports
}

func (c *tcluster) node(id int) *tnode { return c.nodes[id-1] }

// url answers node id's base URL.
func (c *tcluster) url(id int) string { return c.scheme + c.node(id).addr }

// ids answers the ids of every node.
func (c *tcluster) ids() []int {
	out := make([]int, len(c.nodes))
	for i := range c.nodes {
		out[i] = i + 1
	}
	return out
}

// start starts node id's process and does not wait for it to serve. With
// join it joins through node 1's peer address (a new node); without, it
// starts a new cluster (node 1) or restarts a member on its data.
func (c *tcluster) start(id int, join bool) {
	c.tb.Helper()
	n := c.node(id)
	if n.running() {
		c.tb.Fatalf("node %d is already running", id)
	}
	args := []string{"server", "--node-id", strconv.Itoa(id), "--data-dir", n.dir,
		"--listen", n.addr, "--peer-listen", n.peerAddr, "--log-level", "info"}
	if join {
		args = append(args, "--join", c.node(1).peerAddr)
	}
	args = append(args, n.args...)
	n.mu.Lock()
	defer n.mu.Unlock()
	n.runs++
	fmt.Fprintf(n.logs, "=== run %d at %s: groupkv %s\n", n.runs, time.Now().Format("15:04:05.000"), strings.Join(args, " "))
	cmd := exec.Command(binary, args...)
	cmd.Stdout = n.logs
	cmd.Stderr = n.logs
	if err := cmd.Start(); err != nil {
		c.tb.Fatalf("starting node %d: %v", id, err)
	}
	done := make(chan struct{})
	n.cmd, n.done = cmd, done
	go func() {
		err := cmd.Wait()
		n.mu.Lock()
		n.err = err
		n.mu.Unlock()
		close(done)
	}()
}

// waitHealthy waits until node id answers /healthz with 200, failing the
// test if its process exits or the (generous) deadline passes.
func (c *tcluster) waitHealthy(id int) time.Duration {
	c.tb.Helper()
	n := c.node(id)
	n.mu.Lock()
	done := n.done
	n.mu.Unlock()
	start := time.Now()
	deadline := start.Add(60 * time.Second)
	last := "no answer yet"
	for {
		select {
		case <-done:
			n.mu.Lock()
			err := n.err
			n.mu.Unlock()
			c.tb.Fatalf("node %d exited while starting: %v", id, err)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		a, err := c.do(ctx, "GET", c.url(id)+"/healthz", "")
		cancel()
		if err == nil && a.code == 200 {
			return time.Since(start)
		}
		if err != nil {
			last = err.Error()
		} else {
			last = fmt.Sprintf("%d %s", a.code, a.body)
		}
		if time.Now().After(deadline) {
			c.tb.Fatalf("node %d not healthy within 60s (last: %s)", id, last)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// startAll starts node 1, then the other nodes joining through it, and
// waits until all are healthy.
func (c *tcluster) startAll() {
	c.tb.Helper()
	c.start(1, false)
	c.waitHealthy(1)
	for _, n := range c.nodes[1:] {
		c.start(n.id, true)
	}
	for _, n := range c.nodes[1:] {
		c.waitHealthy(n.id)
	}
	// Healthy nodes serve, but the meta shard gains its voters a moment
	// later; a test that stops a node must wait for them, out of the
	// joint configuration that promoted them (until it is left, node 1
	// alone is the quorum of the voters before it) as every voter sees
	// it.
	want := min(len(c.nodes), 3)
	c.eventually(30*time.Second, "the meta shard has its voters", func() error {
		seen := 0
		for _, n := range c.nodes {
			st, err := c.status(n.id)
			if err != nil {
				return err
			}
			for _, s := range st.Shards {
				if s.Collection == "" && s.Shard == 1 && len(s.Voters) == want && len(s.VotersOutgoing) == 0 {
					seen++
				}
			}
		}
		if seen < want {
			return fmt.Errorf("%d nodes see the meta shard's %d voters out of a joint configuration", seen, want)
		}
		return nil
	})
}

// killProc kills n's process, if it runs, with SIGKILL and waits for it.
func (c *tcluster) killProc(n *tnode) {
	n.mu.Lock()
	cmd, done := n.cmd, n.done
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-done:
		return
	default:
	}
	cmd.Process.Signal(syscall.SIGKILL)
	<-done
}

// wantCheckedOK runs `groupkv cluster check` through node id until it
// says ok for the meta shard and the shards of coll (want of them), all
// with replicas on nodes 1, 2 and 3; a mismatch fails the test at once. (A
// replica still catching up may miss a check, which is then incomplete
// and is run again.)
func (c *tcluster) wantCheckedOK(id int, coll string, want int) {
	c.tb.Helper()
	c.eventually(60*time.Second, "groupkv cluster check ok", func() error {
		out, err := exec.Command(binary, append([]string{"cluster", "check", "--addr", c.node(id).addr}, c.cliArgs...)...).CombinedOutput()
		if strings.Contains(string(out), "mismatch") {
			c.tb.Fatalf("groupkv cluster check found diverged replicas:\n%s", out)
		}
		if err != nil {
			return fmt.Errorf("groupkv cluster check: %v\n%s", err, out)
		}
		ok := regexp.MustCompile(`(?m)^`+coll+`\s+\d+\s+\d+\s+1,2,3\s+ok\s`).FindAllString(string(out), -1)
		if len(ok) != want || !regexp.MustCompile(`(?m)^\(meta\)\s+1\s+\d+\s+1,2,3\s+ok\s`).MatchString(string(out)) {
			return fmt.Errorf("groupkv cluster check lists %d shards of %s ok (want %d), or not the meta shard:\n%s", len(ok), coll, want, out)
		}
		return nil
	})
}

// signal sends sig to node id's process.
func (c *tcluster) signal(id int, sig syscall.Signal) {
	c.tb.Helper()
	n := c.node(id)
	n.mu.Lock()
	cmd := n.cmd
	n.mu.Unlock()
	if cmd == nil || !n.running() {
		c.tb.Fatalf("node %d is not running", id)
	}
	if err := cmd.Process.Signal(sig); err != nil {
		c.tb.Fatalf("signalling node %d: %v", id, err)
	}
}

// kill kills node id with SIGKILL.
func (c *tcluster) kill(id int) {
	c.tb.Helper()
	if !c.node(id).running() {
		c.tb.Fatalf("node %d is not running", id)
	}
	c.killProc(c.node(id))
}

// stop stops node id with SIGTERM and wants a clean exit.
func (c *tcluster) stop(id int) {
	c.tb.Helper()
	n := c.node(id)
	if !n.running() {
		c.tb.Fatalf("node %d is not running", id)
	}
	n.mu.Lock()
	cmd, done := n.cmd, n.done
	n.mu.Unlock()
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		c.killProc(n)
		c.tb.Fatalf("node %d did not exit within 30s of SIGTERM", id)
	}
	n.mu.Lock()
	err := n.err
	n.mu.Unlock()
	if err != nil {
		c.tb.Fatalf("node %d exited with %v after SIGTERM", id, err)
	}
}

// kvAnswer is a node's answer to an HTTP request.
type kvAnswer struct {
	code    int
	hdr     http.Header
	body    string
	errCode string // the code of an error answer's JSON body
}

func (a kvAnswer) String() string {
	return fmt.Sprintf("%d %.300s", a.code, a.body)
}

// do sends one request with the test's client; the error is a transport
// error (no answer).
func (c *tcluster) do(ctx context.Context, method, url, body string) (kvAnswer, error) {
	return doHTTP(ctx, c.client, method, url, body)
}

func doHTTP(ctx context.Context, client *http.Client, method, url, body string) (kvAnswer, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return kvAnswer{}, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return kvAnswer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return kvAnswer{}, err
	}
	a := kvAnswer{code: resp.StatusCode, hdr: resp.Header, body: string(b)}
	if a.code != 200 {
		var e struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		if json.Unmarshal(b, &e) == nil {
			a.errCode = e.Error.Code
		}
	}
	return a, nil
}

// putVersion answers the version of a put's 200 answer.
func putVersion(a kvAnswer) (uint64, error) {
	var v struct {
		Version uint64 `json:"version"`
	}
	if err := json.Unmarshal([]byte(a.body), &v); err != nil || v.Version == 0 {
		return 0, fmt.Errorf("put answered %s: no version", a)
	}
	return v.Version, nil
}

// getVersion answers the version of a get's 200 answer.
func getVersion(a kvAnswer) (uint64, error) {
	v, err := strconv.ParseUint(a.hdr.Get("Groupkv-Version"), 10, 64)
	if err != nil || v == 0 {
		return 0, fmt.Errorf("get answered 200 with Groupkv-Version %q", a.hdr.Get("Groupkv-Version"))
	}
	return v, nil
}

// tstatus is the answer of GET /v1/cluster.
type tstatus struct {
	Nodes []struct {
		ID       int    `json:"id"`
		Addr     string `json:"addr"`
		PeerAddr string `json:"peer_addr"`
		Healthy  bool   `json:"healthy"`
	} `json:"nodes"`
	Shards []tshard `json:"shards"`
}

type tshard struct {
	Collection string `json:"collection"`
	Shard      uint64 `json:"shard"`
	Replicas   []int  `json:"replicas"`
	Leader     int    `json:"leader"`
	Voters     []int  `json:"voters"`
	// VotersOutgoing are the voters before a change under way.
	VotersOutgoing []int `json:"voters_outgoing"`
}

// status answers node id's GET /v1/cluster.
func (c *tcluster) status(id int) (tstatus, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	a, err := c.do(ctx, "GET", c.url(id)+"/v1/cluster", "")
	if err != nil {
		return tstatus{}, err
	}
	if a.code != 200 {
		return tstatus{}, fmt.Errorf("GET /v1/cluster on node %d: %s", id, a)
	}
	var st tstatus
	if err := json.Unmarshal([]byte(a.body), &st); err != nil {
		return tstatus{}, fmt.Errorf("GET /v1/cluster on node %d: %v: %s", id, err, a.body)
	}
	return st, nil
}

func (st tstatus) shards(coll string) []tshard {
	var out []tshard
	for _, s := range st.Shards {
		if s.Collection == coll {
			out = append(out, s)
		}
	}
	return out
}

// eventually retries f every 50ms until it succeeds, failing the test with
// f's last error once timeout has passed.
func (c *tcluster) eventually(timeout time.Duration, what string, f func() error) {
	c.tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			c.tb.Fatalf("%s: not so after %v: %v", what, timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// leaderOf answers the node that leads coll's shard (its only or first
// one) as every running node other than those in except sees it, waiting
// until they agree on one running node.
func (c *tcluster) leaderOf(coll string, except ...int) int {
	c.tb.Helper()
	leader := 0
	c.eventually(30*time.Second, "the running nodes agree on the leader of "+coll, func() error {
		leader = 0
		for _, n := range c.nodes {
			if !n.running() || slices.Contains(except, n.id) {
				continue
			}
			st, err := c.status(n.id)
			if err != nil {
				return err
			}
			ss := st.shards(coll)
			if len(ss) == 0 {
				return fmt.Errorf("node %d lists no shard of %s", n.id, coll)
			}
			l := ss[0].Leader
			switch {
			case l == 0:
				return fmt.Errorf("node %d knows no leader of %s", n.id, coll)
			case leader != 0 && l != leader:
				return fmt.Errorf("nodes see leaders %d and %d", leader, l)
			case l < 1 || l > len(c.nodes) || !c.node(l).running():
				return fmt.Errorf("node %d sees node %d, which is down, as the leader", n.id, l)
			}
			leader = l
		}
		if leader == 0 {
			return errors.New("no running node answered")
		}
		return nil
	})
	return leader
}

// createCollection creates coll through node id, replicated 3 times.
func (c *tcluster) createCollection(id int, coll string, shards int) {
	c.tb.Helper()
	a, err := c.do(context.Background(), "POST", c.url(id)+"/v1/collections",
		fmt.Sprintf(`{"name": %q, "shards": %d, "replicas": 3}`, coll, shards))
	if err != nil || a.code != 200 {
		c.tb.Fatalf("creating %s through node %d: %v %s", coll, id, err, a)
	}
}

// put writes key through node id, retrying answers that are safe to retry
// (503: a put of the same value is idempotent as far as the value goes)
// for up to 30s, and answers the version of the put that succeeded.
func (c *tcluster) put(id int, coll, key, value string) uint64 {
	c.tb.Helper()
	start := time.Now()
	deadline := start.Add(30 * time.Second)
	var firstErr string
	for retries := 0; ; retries++ {
		a, err := c.do(context.Background(), "PUT", c.url(id)+"/v1/kv/"+coll+"/"+key, value)
		if err == nil && a.code == 200 {
			v, err := putVersion(a)
			if err != nil {
				c.tb.Fatal(err)
			}
			if retries > 0 {
				c.tb.Logf("put %s/%s through node %d succeeded after %d retries in %v; the first answer: %s",
					coll, key, id, retries, time.Since(start).Round(time.Millisecond), firstErr)
			}
			return v
		}
		if firstErr == "" {
			firstErr = a.String()
		}
		if err == nil && a.code != 503 || time.Now().After(deadline) {
			c.tb.Fatalf("put %s/%s through node %d: %v %s", coll, key, id, err, a)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// wantRead checks that key reads value at version through node id. It
// retries 503 unavailable (not performed) for up to 10s.
func (c *tcluster) wantRead(id int, coll, key, value string, version uint64) {
	c.tb.Helper()
	var a kvAnswer
	var err error
	start := time.Now()
	for retries := 0; ; retries++ {
		a, err = c.do(context.Background(), "GET", c.url(id)+"/v1/kv/"+coll+"/"+key, "")
		if err != nil || a.errCode != "unavailable" || time.Since(start) > 10*time.Second {
			if retries > 0 {
				c.tb.Logf("get %s/%s through node %d answered 503 unavailable %d times in %v", coll, key, id, retries, time.Since(start).Round(time.Millisecond))
			}
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil || a.code != 200 {
		c.tb.Fatalf("get %s/%s through node %d: %v %s; want %q at version %d", coll, key, id, err, a, value, version)
	}
	got, err := getVersion(a)
	if err != nil {
		c.tb.Fatal(err)
	}
	if a.body != value || got != version {
		c.tb.Fatalf("get %s/%s through node %d: %q at version %d, want %q at version %d", coll, key, id, a.body, got, value, version)
	}
}

// ---------------------------------------------------------------------------
// TestClusterFormsAndServes

// TestClusterFormsAndServes forms a three-node cluster (node 1, then nodes
// 2 and 3 joining through it), creates a six-shard collection replicated on
// all three, checks placement and leadership, writes through every node and
// reads through every node, runs `groupkv cluster status`, then stops node
// 3, writes on, restarts node 3 on its data without --join and checks that
// it serves the latest values, and that `groupkv cluster check` finds every
// shard's replicas equal.
func TestClusterFormsAndServes(t *testing.T) {
	c := newTCluster(t, 3)
	start := time.Now()
	c.startAll()
	t.Logf("3 nodes healthy after %v", time.Since(start).Round(time.Millisecond))

	// Membership: three healthy nodes at their addresses, a meta shard
	// replicated on all three with a leader.
	wantMembers := func(id int) error {
		st, err := c.status(id)
		if err != nil {
			return err
		}
		if len(st.Nodes) != 3 {
			return fmt.Errorf("node %d lists %d nodes: %+v", id, len(st.Nodes), st.Nodes)
		}
		sort.Slice(st.Nodes, func(i, j int) bool { return st.Nodes[i].ID < st.Nodes[j].ID })
		for i, nd := range st.Nodes {
			want := c.nodes[i]
			if nd.ID != want.id || nd.Addr != want.addr || nd.PeerAddr != want.peerAddr || !nd.Healthy {
				return fmt.Errorf("node %d lists %+v, want id %d at %s, peer %s, healthy", id, nd, want.id, want.addr, want.peerAddr)
			}
		}
		meta := st.shards("")
		if len(meta) != 1 {
			return fmt.Errorf("node %d lists %d meta shards", id, len(meta))
		}
		if r := slices.Sorted(slices.Values(meta[0].Replicas)); !slices.Equal(r, []int{1, 2, 3}) || meta[0].Leader == 0 {
			return fmt.Errorf("node %d lists the meta shard as %+v, want replicas 1,2,3 and a leader", id, meta[0])
		}
		return nil
	}
	for _, id := range c.ids() {
		c.eventually(30*time.Second, fmt.Sprintf("node %d sees the 3 members", id), func() error { return wantMembers(id) })
	}

	// A collection of 6 shards, 3 replicas each on distinct nodes, each
	// with a leader; leaders spread.
	const coll = "six"
	c.createCollection(2, coll, 6)
	var leaders map[int]int
	for _, id := range c.ids() {
		c.eventually(30*time.Second, fmt.Sprintf("node %d sees every shard of %s placed and led", id, coll), func() error {
			st, err := c.status(id)
			if err != nil {
				return err
			}
			ss := st.shards(coll)
			if len(ss) != 6 {
				return fmt.Errorf("node %d lists %d shards of %s, want 6", id, len(ss), coll)
			}
			leaders = map[int]int{}
			for _, s := range ss {
				r := slices.Sorted(slices.Values(s.Replicas))
				if !slices.Equal(r, []int{1, 2, 3}) {
					return fmt.Errorf("shard %d has replicas %v, want one on each of nodes 1, 2, 3", s.Shard, s.Replicas)
				}
				if !slices.Contains(s.Replicas, s.Leader) {
					return fmt.Errorf("shard %d: leader %d is not one of its replicas %v", s.Shard, s.Leader, s.Replicas)
				}
				leaders[s.Leader]++
			}
			for n, k := range leaders {
				if k > 4 {
					return fmt.Errorf("node %d leads %d of the 6 shards: %v", n, k, leaders)
				}
			}
			return nil
		})
	}
	t.Logf("shards of %s led per node: %v", coll, leaders)

	// Writes through each node are read through every node.
	type rec struct {
		value   string
		version uint64
	}
	want := map[string]rec{}
	for _, id := range c.ids() {
		for j := range 8 {
			key, value := fmt.Sprintf("n%d-k%d", id, j), fmt.Sprintf("first-%d-%d", id, j)
			want[key] = rec{value, c.put(id, coll, key, value)}
		}
	}
	keys := slices.Sorted(maps.Keys(want))
	for _, key := range keys {
		for _, id := range c.ids() {
			c.wantRead(id, coll, key, want[key].value, want[key].version)
		}
	}

	// The CLI lists every node, healthy, and the shards.
	out, err := exec.Command(binary, "cluster", "status", "--addr", c.node(2).addr).CombinedOutput()
	if err != nil {
		t.Fatalf("groupkv cluster status: %v\n%s", err, out)
	}
	for _, n := range c.nodes {
		re := regexp.MustCompile(`(?m)^` + strconv.Itoa(n.id) + `\s+` + regexp.QuoteMeta(n.addr) + `\s+` + regexp.QuoteMeta(n.peerAddr) + `\s+yes\s+`)
		if !re.MatchString(string(out)) {
			t.Errorf("groupkv cluster status lacks node %d (%s, %s) as healthy:\n%s", n.id, n.addr, n.peerAddr, out)
		}
	}
	if k := len(regexp.MustCompile(`(?m)^`+coll+`\s`).FindAllString(string(out), -1)); k != 6 || !strings.Contains(string(out), "(meta)") {
		t.Errorf("groupkv cluster status lists %d shards of %s (want 6) or no meta shard:\n%s", k, coll, out)
	}

	// Node 3 stops; writes go on through nodes 1 and 2.
	c.stop(3)
	stopped := time.Now()
	for i, key := range keys {
		id := 1 + i%2
		value := "second-" + key
		want[key] = rec{value, c.put(id, coll, key, value)}
	}
	for j := range 8 {
		key := fmt.Sprintf("late-k%d", j)
		value := "late-" + strconv.Itoa(j)
		want[key] = rec{value, c.put(1+j%2, coll, key, value)}
		keys = append(keys, key)
	}
	t.Logf("%d writes through nodes 1 and 2 with node 3 down took %v", len(keys), time.Since(stopped).Round(time.Millisecond))
	for _, key := range keys {
		for _, id := range []int{1, 2} {
			c.wantRead(id, coll, key, want[key].value, want[key].version)
		}
	}

	// Node 3 restarts on its data, without --join, and catches up.
	c.start(3, false)
	t.Logf("node 3 restarted, healthy after %v", c.waitHealthy(3).Round(time.Millisecond))
	for _, key := range keys {
		c.wantRead(3, coll, key, want[key].value, want[key].version)
	}
	for _, id := range c.ids() {
		c.eventually(30*time.Second, fmt.Sprintf("node %d sees the 3 members after the restart", id), func() error { return wantMembers(id) })
	}

	// The replicas of every shard hold the same data, node 3's too: the
	// CLI's on-demand check says ok for the meta shard and the 6 shards.
	// (A replica still catching up may miss a check, which is then
	// incomplete and is run again; a mismatch fails at once.)
	c.wantCheckedOK(3, coll, 6)
	for _, id := range c.ids() {
		c.stop(id)
	}
}

// ---------------------------------------------------------------------------
// TestClusterKillLeaderLinearizable

// linStats counts the outcomes of TestClusterKillLeaderLinearizable's
// operations.
type linStats struct {
	putsOK, getsOK, notFound, unavailable, unknown atomic.Int64

	mu         sync.Mutex
	unexpected []string // answers the API does not allow here
}

func (s *linStats) unexpectedf(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.unexpected) < 20 {
		s.unexpected = append(s.unexpected, fmt.Sprintf(format, args...))
	}
}

// linOp performs one recorded operation (a put when value is not empty,
// else a get) on key of coll through url, and records its outcome:
//   - 200: acknowledged (put) or read (get);
//   - 404 not_found (get): the key is absent;
//   - 503 unavailable: not performed (Fail);
//   - anything else — commit_unknown, a timeout, a transport error, an
//     unexpected answer — may or may not have been performed (Unknown).
//
// It answers the node's answer and whether the operation was answered
// definitively.
func linOp(rec *linearizability.Recorder, st *linStats, client int, hc *http.Client, url, coll, key, value string) (kvAnswer, bool) {
	method, op := "GET", linearizability.Get(key)
	if value != "" {
		method, op = "PUT", linearizability.Put(key, value)
	}
	p := rec.Begin(client, op)
	a, err := doHTTP(context.Background(), hc, method, url+"/v1/kv/"+coll+"/"+key, value)
	switch {
	case err != nil:
		p.End(linearizability.Unknown())
		st.unknown.Add(1)
		a.body = "no answer: " + err.Error()
		return a, false
	case a.code == 200 && method == "PUT":
		v, err := putVersion(a)
		if err != nil {
			p.End(linearizability.Unknown())
			st.unexpectedf("%s %s: %v", method, key, err)
			return a, false
		}
		p.End(linearizability.PutOK(v))
		st.putsOK.Add(1)
		return a, true
	case a.code == 200:
		v, err := getVersion(a)
		if err != nil {
			p.End(linearizability.Unknown())
			st.unexpectedf("%s %s: %v", method, key, err)
			return a, false
		}
		p.End(linearizability.GetOK(a.body, v))
		st.getsOK.Add(1)
		return a, true
	case a.code == 404 && a.errCode == "not_found" && method == "GET":
		p.End(linearizability.NotFound())
		st.notFound.Add(1)
		return a, true
	case a.code == 503 && a.errCode == "unavailable":
		p.Fail()
		st.unavailable.Add(1)
		return a, false
	case a.code == 503 && a.errCode == "commit_unknown":
		p.End(linearizability.Unknown())
		st.unknown.Add(1)
		return a, false
	default:
		p.End(linearizability.Unknown())
		st.unknown.Add(1)
		st.unexpectedf("%s %s through %s: %s", method, key, url, a)
		return a, false
	}
}

// TestClusterKillLeaderLinearizable runs 8 clients doing random puts and
// gets of 5 keys through random nodes of a three-node cluster while the
// leader of the keys' shard is killed with SIGKILL and restarted, three
// times, and checks that the history is linearizable, that writes resume
// within 30s of each kill, and that every node reads the same values at the
// end.
//
// The clients' choices derive from a seed, printed, that GROUPKV_SEED
// overrides; the timing of the kills does not (it is not reproducible).
func TestClusterKillLeaderLinearizable(t *testing.T) {
	leaderFaultLinearizable(t, false)
}

// TestClusterPauseLeaderLinearizable is TestClusterKillLeaderLinearizable
// with the leader paused (SIGSTOP) for 3 seconds, long enough for the
// others to elect a new one, and resumed (SIGCONT), three times: in the
// second round the leader of the meta shard, which runs the timestamp
// oracle. The clients go on sending requests to the paused node: they
// wait, and are served once it runs again, when it still believes it
// leads until it hears otherwise — a stale read or a lost write then
// would show in the history.
func TestClusterPauseLeaderLinearizable(t *testing.T) {
	leaderFaultLinearizable(t, true)
}

// leaderFaultLinearizable runs TestClusterKillLeaderLinearizable, or with
// pause TestClusterPauseLeaderLinearizable.
func leaderFaultLinearizable(t *testing.T, pause bool) {
	seed := time.Now().UnixNano()
	if s := os.Getenv("GROUPKV_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseInt(s, 10, 64); err != nil {
			t.Fatalf("GROUPKV_SEED=%q: %v", s, err)
		}
	}
	t.Logf("seed %d (set GROUPKV_SEED to reuse)", seed)

	c := newTCluster(t, 3)
	c.startAll()
	const coll = "lin"
	c.createCollection(1, coll, 1)
	c.leaderOf(coll)
	c.put(1, coll, "probe", "ready")

	const clients = 8
	keys := []string{"k0", "k1", "k2", "k3", "k4"}
	rec := &linearizability.Recorder{Timeout: 30 * time.Second}
	st := &linStats{}
	var down atomic.Int64 // the node killed and not yet healthy again, or 0
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for cl := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(seed), uint64(cl)))
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				// A random node that is up: requests to a killed node only
				// add unknown outcomes the checker must place.
				id := 1 + rng.IntN(3)
				for int64(id) == down.Load() {
					id = 1 + rng.IntN(3)
				}
				key, value := keys[rng.IntN(len(keys))], ""
				if rng.IntN(2) == 0 {
					value = fmt.Sprintf("c%d-%d", cl, n)
				}
				if _, ok := linOp(rec, st, cl, hc, c.url(id), coll, key, value); !ok {
					time.Sleep(time.Duration(20+rng.IntN(30)) * time.Millisecond)
				}
			}
		}()
	}
	defer func() { // on a failure too: a Fatal must not leave the clients running
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()

	time.Sleep(time.Second)
	for round := 1; round <= 3; round++ {
		if pause {
			target := coll
			if round == 2 {
				target = "" // the meta shard
			}
			leader := c.leaderOf(target)
			paused := time.Now()
			c.signal(leader, syscall.SIGSTOP)
			var others []int
			for _, id := range c.ids() {
				if id != leader {
					others = append(others, id)
				}
			}
			resume, err := waitWrite(c, others, coll, "probe", paused, 30*time.Second)
			if err != nil {
				c.signal(leader, syscall.SIGCONT)
				t.Fatalf("round %d: writes did not resume after node %d was paused: %v", round, leader, err)
			}
			time.Sleep(time.Until(paused.Add(3 * time.Second)))
			c.signal(leader, syscall.SIGCONT)
			t.Logf("round %d: paused node %d (leader of %q) for %v; writes resumed through the others after %v",
				round, leader, target, time.Since(paused).Round(time.Millisecond), resume.Round(time.Millisecond))
			time.Sleep(2 * time.Second)
			continue
		}
		leader := c.leaderOf(coll)
		down.Store(int64(leader))
		killed := time.Now()
		c.kill(leader)
		// Writes resume: a probe put (of a key the clients do not use)
		// through the other nodes succeeds.
		var others []int
		for _, id := range c.ids() {
			if id != leader {
				others = append(others, id)
			}
		}
		resume, err := waitWrite(c, others, coll, "probe", killed, 30*time.Second)
		if err != nil {
			t.Fatalf("round %d: writes did not resume after node %d (the leader) was killed: %v", round, leader, err)
		}
		c.start(leader, false)
		healthy := c.waitHealthy(leader)
		down.Store(0)
		t.Logf("round %d: killed node %d (leader of %s); writes resumed after %v; restarted, healthy after %v",
			round, leader, coll, resume.Round(time.Millisecond), healthy.Round(time.Millisecond))
		time.Sleep(time.Second)
	}
	close(stop)
	wg.Wait()

	// Every node reads every key, all alike; the reads join the history.
	for _, key := range keys {
		var first kvAnswer
		for _, id := range c.ids() {
			var a kvAnswer
			ok := false
			for start := time.Now(); time.Since(start) < 10*time.Second; time.Sleep(50 * time.Millisecond) {
				if a, ok = linOp(rec, st, clients+id-1, c.client, c.url(id), coll, key, ""); ok || a.errCode != "unavailable" {
					break
				}
			}
			if !ok || a.code != 200 {
				t.Errorf("final read of %s through node %d: %s", key, id, a)
				continue
			}
			if first.code == 0 {
				first = a
			} else if a.body != first.body || a.hdr.Get("Groupkv-Version") != first.hdr.Get("Groupkv-Version") {
				t.Errorf("key %s reads %q at %s through node %d, %q at %s through node 1", key, a.body, a.hdr.Get("Groupkv-Version"), id, first.body, first.hdr.Get("Groupkv-Version"))
			}
		}
	}
	t.Logf("operations: %d puts acknowledged, %d gets found, %d not found, %d unavailable (dropped), %d unknown",
		st.putsOK.Load(), st.getsOK.Load(), st.notFound.Load(), st.unavailable.Load(), st.unknown.Load())
	if st.putsOK.Load() < 100 || st.getsOK.Load() < 100 {
		t.Errorf("too few operations succeeded to check anything")
	}
	for _, u := range st.unexpected {
		t.Errorf("unexpected answer: %s", u)
	}
	checkStart := time.Now()
	rec.Check(t, seed)
	t.Logf("check took %v", time.Since(checkStart).Round(time.Millisecond))
}

// waitWrite puts key through the given nodes in turn, each try bounded by
// 2s, until one succeeds, and answers how long after since that was. It
// gives up after timeout.
func waitWrite(c *tcluster, through []int, coll, key string, since time.Time, timeout time.Duration) (time.Duration, error) {
	deadline := since.Add(timeout)
	var last string
	for i := 0; ; i++ {
		id := through[i%len(through)]
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		a, err := c.do(ctx, "PUT", c.url(id)+"/v1/kv/"+coll+"/"+key, "p"+strconv.Itoa(i))
		cancel()
		if err == nil && a.code == 200 {
			return time.Since(since), nil
		}
		if err != nil {
			last = err.Error()
		} else {
			last = a.String()
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("no put succeeded within %v; the last answer (node %d): %s", timeout, id, last)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
