package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/tlsfiles"
)

func clusterCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Show a cluster's nodes and shards, check its replicas, or run a local cluster",
		Args:  argsBetween(0, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			return cmd.Help()
		},
	}
	cmd.AddCommand(clusterStatusCommand(), clusterCheckCommand(), clusterLocalCommand())
	return cmd
}

// ---------------------------------------------------------------------------
// groupkv cluster status

func clusterStatusCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the cluster's nodes and shards as seen by one node",
		Long: `Show the cluster's nodes (id, client and peer address, health) and its
shards (collection, shard, replicas, leader) as seen by the node at --addr.
The meta shard, which holds the cluster's own configuration, is listed as
collection "(meta)". A leader of "-" means the shard has no leader now.`,
		Example: `  groupkv cluster status
  groupkv cluster status --addr 127.0.0.1:7080
  groupkv cluster status --json`,
		Args: argsBetween(0, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := remoteOf(cmd)
			if err != nil {
				return err
			}
			if strings.Contains(r.addr, "://") {
				return usagef("--addr %q has a scheme: give host:port, e.g. %s", r.addr, defaultAddr)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Second)
			defer cancel()
			body, err := fetchClusterStatus(ctx, r)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				if _, err := out.Write(body); err != nil {
					return err
				}
				if len(body) == 0 || body[len(body)-1] != '\n' {
					_, err = fmt.Fprintln(out)
				}
				return err
			}
			return formatClusterStatus(out, body)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the node's answer (GET /v1/cluster) as it is")
	addAddrFlag(cmd)
	return cmd
}

// clusterStatus is the answer of GET /v1/cluster.
type clusterStatus struct {
	Nodes  []clusterNode    `json:"nodes"`
	Shards []kv.ShardStatus `json:"shards"`
}

type clusterNode struct {
	ID       uint64 `json:"id"`
	Addr     string `json:"addr"`
	PeerAddr string `json:"peer_addr"`
	Healthy  bool   `json:"healthy"`
	Draining bool   `json:"draining"`
	Replicas int    `json:"replicas"`
	Held     *int   `json:"held"`
	// WritesRefused: why the node refuses writes (its disk is low).
	WritesRefused string `json:"writes_refused,omitempty"`
}

// metaCollection is how the table shows the meta shard's collection ("").
const metaCollection = "(meta)"

// fetchClusterStatus answers the body of GET http://addr/v1/cluster, or an
// error saying why there is none: the node cannot be reached, or it answered
// an error (its message is in the error).
func fetchClusterStatus(ctx context.Context, r remote) ([]byte, error) {
	return askNode(ctx, r, http.MethodGet, "/v1/cluster", nil)
}

// askNode sends a request to path on the node at addr and answers the
// body of its 200, or an error saying why there is none: the node cannot
// be reached or did not answer in time, or it answered an error (its
// message is in the error).
func askNode(ctx context.Context, r remote, method, path string, body []byte) ([]byte, error) {
	addr := r.addr
	req, err := http.NewRequestWithContext(ctx, method, r.url(path), bytes.NewReader(body))
	if err != nil {
		return nil, usagef("--addr %q is not host:port: give e.g. %s", addr, defaultAddr)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := r.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("no answer from %s in time: %v", addr, err)
		}
		return nil, fmt.Errorf("cannot reach a groupkv node at %s: %v (is it running? --addr takes its client address)", addr, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("reading the answer of %s: %v", addr, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, httpAnswerError(addr, resp.Status, out)
	}
	return out, nil
}

// httpAnswerError describes an answer other than 200: the code and message
// of its error body, or the body itself when it is not a groupkv error.
func httpAnswerError(addr, status string, body []byte) error {
	var e struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil && (e.Error.Code != "" || e.Error.Message != "") {
		return fmt.Errorf("%s answered %s: %s: %s", addr, status, e.Error.Code, e.Error.Message)
	}
	text := strings.TrimSpace(string(body))
	if len(text) > 300 {
		text = text[:300] + "..."
	}
	if text == "" {
		return fmt.Errorf("%s answered %s", addr, status)
	}
	return fmt.Errorf("%s answered %s: %s", addr, status, text)
}

// formatClusterStatus writes the answer of GET /v1/cluster as two tables,
// nodes by id and shards by collection and shard.
func formatClusterStatus(w io.Writer, body []byte) error {
	var st clusterStatus
	if err := json.Unmarshal(body, &st); err != nil {
		return fmt.Errorf("unexpected answer to GET /v1/cluster: %v", err)
	}
	nodes := append([]clusterNode(nil), st.Nodes...)
	sort.SliceStable(nodes, func(i, j int) bool { return nodes[i].ID < nodes[j].ID })
	shards := append([]kv.ShardStatus(nil), st.Shards...)
	sort.SliceStable(shards, func(i, j int) bool {
		if shards[i].Collection != shards[j].Collection {
			return shards[i].Collection < shards[j].Collection
		}
		return shards[i].Shard < shards[j].Shard
	})

	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tADDR\tPEER\tHEALTHY\tREPLICAS\tHELD\tSTATE")
	for _, n := range nodes {
		healthy := "no"
		if n.Healthy {
			healthy = "yes"
		}
		held := "-"
		if n.Held != nil && *n.Held >= 0 {
			held = strconv.Itoa(*n.Held)
		}
		state := "member"
		if n.Draining {
			state = "draining"
		}
		if n.WritesRefused != "" {
			state += ", writes refused (low disk)"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\n", n.ID, orDash(n.Addr), orDash(n.PeerAddr), healthy, n.Replicas, held, state)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	// Columns are only ever added at the end: scripts read them by place.
	fmt.Fprintln(tw, "COLLECTION\tSHARD\tREPLICAS\tLEADER\tCONSISTENCY\tVOTERS")
	for _, s := range shards {
		coll := s.Collection
		if coll == "" {
			coll = metaCollection
		}
		voters := orDash(nodeList(s.Voters))
		if len(s.VotersOutgoing) > 0 {
			// A change of the voters under way: both sets vote.
			voters += " (from " + nodeList(s.VotersOutgoing) + ")"
		}
		leader := "-"
		if s.Leader != 0 {
			leader = strconv.FormatUint(s.Leader, 10)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", coll, s.Shard, orDash(nodeList(s.Replicas)), leader, orDash(s.Consistency), voters)
	}
	return tw.Flush()
}

// nodeList joins node ids with commas.
func nodeList(ids []uint64) string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = strconv.FormatUint(id, 10)
	}
	return strings.Join(out, ",")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// ---------------------------------------------------------------------------
// groupkv cluster check

func clusterCheckCommand() *cobra.Command {
	var (
		asJSON  bool
		shards  []uint
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Check now that the replicas of shards hold the same data",
		Long: `Run a replica consistency check of every shard of the cluster, or of the
shards given with --shard, through the node at --addr (POST /v1/cluster/check),
one shard after the other. The replicas of a shard each sum their state at
one log index of the shard's raft log, off their apply loops at the rate
the servers' --consistency-rate allows, and the sums are compared. Each
shard's outcome is "ok" (every replica answered with the same sum),
"mismatch" (naming the replicas whose sum is not the majority's) or
"incomplete" (a replica did not answer, or the check could not be run: the
ERRORS column says why). The outcomes also show in groupkv cluster status.

The exit status is 0 when every shard is ok, 1 when one is not (or the
node could not be asked), 2 on a usage error.`,
		Example: `  groupkv cluster check
  groupkv cluster check --shard 3 --shard 4
  groupkv cluster check --json --timeout 30m`,
		Args: argsBetween(0, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := remoteOf(cmd)
			if err != nil {
				return err
			}
			if strings.Contains(r.addr, "://") {
				return usagef("--addr %q has a scheme: give host:port, e.g. %s", r.addr, defaultAddr)
			}
			if timeout <= 0 {
				return usagef("--timeout %v: give a positive duration, e.g. 10m", timeout)
			}
			ids := make([]uint64, len(shards))
			for i, id := range shards {
				if id == 0 {
					return usagef("--shard 0: shard ids are positive integers (see groupkv cluster status)")
				}
				ids[i] = uint64(id)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			body, err := postConsistencyCheck(ctx, r, ids)
			if err != nil && ctx.Err() != nil {
				return fmt.Errorf("%v: --timeout %v passed (the checks the node began go on)", err, timeout)
			}
			if err != nil {
				return err
			}
			var ans consistencyCheckAnswer
			if err := json.Unmarshal(body, &ans); err != nil {
				return fmt.Errorf("unexpected answer to POST /v1/cluster/check: %v", err)
			}
			out := cmd.OutOrStdout()
			if asJSON {
				if _, err := out.Write(body); err != nil {
					return err
				}
				if len(body) == 0 || body[len(body)-1] != '\n' {
					fmt.Fprintln(out)
				}
			} else if err := formatConsistencyChecks(out, ans.Checks); err != nil {
				return err
			}
			if !ans.OK {
				bad := 0
				for _, c := range ans.Checks {
					if c.Status != kv.ConsistencyOK {
						bad++
					}
				}
				return fmt.Errorf("%d of %d shards checked are not ok", bad, len(ans.Checks))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the node's answer (POST /v1/cluster/check) as it is")
	cmd.Flags().UintSliceVar(&shards, "shard", nil, "check this shard (repeat, or give a comma-separated list); every shard when absent")
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Minute, "give up waiting for the answer after this long")
	addAddrFlag(cmd)
	return cmd
}

// consistencyCheckAnswer is the answer of POST /v1/cluster/check.
type consistencyCheckAnswer struct {
	OK     bool                  `json:"ok"`
	Checks []kv.ConsistencyCheck `json:"checks"`
}

// postConsistencyCheck answers the body of POST http://addr/v1/cluster/check
// for shards (every shard when empty), or an error saying why there is none.
func postConsistencyCheck(ctx context.Context, r remote, shards []uint64) ([]byte, error) {
	body, err := json.Marshal(map[string][]uint64{"shards": shards})
	if err != nil {
		return nil, err
	}
	return askNode(ctx, r, http.MethodPost, "/v1/cluster/check", body)
}

// formatConsistencyChecks writes the outcomes of a check as a table in the
// order the node answered them.
func formatConsistencyChecks(w io.Writer, checks []kv.ConsistencyCheck) error {
	ids := func(xs []uint64) string {
		s := make([]string, len(xs))
		for i, x := range xs {
			s[i] = strconv.FormatUint(x, 10)
		}
		return orDash(strings.Join(s, ","))
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "COLLECTION\tSHARD\tINDEX\tREPLICAS\tSTATUS\tMISMATCHED\tMISSING\tERRORS")
	for _, c := range checks {
		coll := c.Collection
		if coll == "" {
			coll = metaCollection
		}
		index := "-"
		if c.Index != 0 {
			index = strconv.FormatUint(c.Index, 10)
		}
		errs := strings.Join(c.Errors, "; ")
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", coll, c.Shard, index, ids(c.Replicas), c.Status,
			ids(c.Mismatched), ids(c.Missing), orDash(errs))
	}
	return tw.Flush()
}

// ---------------------------------------------------------------------------
// groupkv cluster local

// localOptions are the flags of `groupkv cluster local`.
type localOptions struct {
	Dir      string
	Nodes    int
	BasePort int
	Timeout  time.Duration // how long each node may take to become healthy
	// TLS serves both ports of every node over TLS, with certificates in
	// Dir/certs (made when missing).
	TLS bool
}

// certsDir is where a local cluster over TLS keeps its CA and certificates.
func (o localOptions) certsDir() string { return filepath.Join(o.Dir, "certs") }

// clientTLSArgs are the flags a client of a local cluster over TLS gives.
func (o localOptions) clientTLSArgs() []string {
	if !o.TLS {
		return nil
	}
	d := o.certsDir()
	return []string{"--ca-file", filepath.Join(d, "ca.crt"), "--cert-file", filepath.Join(d, "client.crt"), "--key-file", filepath.Join(d, "client.key")}
}

// ensureCerts makes the CA of a local cluster over TLS, a certificate for
// each node (for 127.0.0.1 and localhost) and one for clients, keeping the
// files that exist.
func (o localOptions) ensureCerts() error {
	if !o.TLS {
		return nil
	}
	d := o.certsDir()
	if err := os.MkdirAll(d, 0o755); err != nil {
		return err
	}
	const validFor = 5 * 365 * 24 * time.Hour
	ca, err := tlsfiles.LoadCA(filepath.Join(d, "ca.crt"), filepath.Join(d, "ca.key"))
	if errors.Is(err, fs.ErrNotExist) {
		if ca, err = tlsfiles.NewCA("groupkv local CA", validFor); err == nil {
			_, _, err = ca.WriteFiles(d)
		}
	}
	if err != nil {
		return fmt.Errorf("the CA of %s: %w", d, err)
	}
	names := []string{"client"}
	for i := 1; i <= o.Nodes; i++ {
		names = append(names, "node"+strconv.Itoa(i))
	}
	for _, name := range names {
		if _, err := os.Stat(filepath.Join(d, name+".key")); err == nil {
			continue
		}
		if _, _, err := ca.IssueFiles(d, name, []string{"127.0.0.1", "localhost"}, validFor); err != nil {
			return err
		}
	}
	return nil
}

// httpClient answers a client of the nodes' HTTP API.
func (o localOptions) httpClient() (*http.Client, string, error) {
	client := &http.Client{Timeout: 2 * time.Second}
	if !o.TLS {
		return client, "http://", nil
	}
	d := o.certsDir()
	cfg, err := tlsfiles.Client(filepath.Join(d, "ca.crt"), filepath.Join(d, "client.crt"), filepath.Join(d, "client.key"))
	if err != nil {
		return nil, "", err
	}
	client.Transport = &http.Transport{TLSClientConfig: cfg}
	return client, "https://", nil
}

// maxLocalNodes keeps a typo from starting hundreds of servers.
const maxLocalNodes = 100

// localStopGrace is how long a node has to exit after SIGTERM before it is
// killed; the server itself gives its shutdown 10s.
const localStopGrace = 15 * time.Second

func (o localOptions) validate() error {
	if o.Dir == "" {
		return usagef("--dir must not be empty")
	}
	if o.Nodes < 1 {
		return usagef("--nodes %d: a cluster has at least 1 node", o.Nodes)
	}
	if o.Nodes > maxLocalNodes {
		return usagef("--nodes %d: at most %d nodes run locally", o.Nodes, maxLocalNodes)
	}
	if o.BasePort < 1 {
		return usagef("--base-port %d: give a port from 1 to 65535", o.BasePort)
	}
	if last := o.node(o.Nodes).peerPort; last > 65535 {
		return usagef("--base-port %d with --nodes %d needs ports up to %d, over 65535: choose a lower --base-port", o.BasePort, o.Nodes, last)
	}
	if o.Timeout <= 0 {
		return usagef("--timeout %v: give a positive duration, e.g. 60s", o.Timeout)
	}
	return nil
}

// localNode is node i of a local cluster: where it listens and keeps its
// data and log.
type localNode struct {
	id               int
	port, peerPort   int
	addr, peerAddr   string
	dataDir, logPath string
	existing         bool // its data directory holds data: a restart
}

// node answers node i (1-based): client port base+10*(i-1), peer port one above.
func (o localOptions) node(i int) localNode {
	port := o.BasePort + 10*(i-1)
	return localNode{
		id:       i,
		port:     port,
		peerPort: port + 1,
		addr:     "127.0.0.1:" + strconv.Itoa(port),
		peerAddr: "127.0.0.1:" + strconv.Itoa(port+1),
		dataDir:  filepath.Join(o.Dir, "node"+strconv.Itoa(i)),
		logPath:  filepath.Join(o.Dir, "node"+strconv.Itoa(i)+".log"),
	}
}

// serverArgs are the arguments of node n's `groupkv server`.
func (o localOptions) serverArgs(n localNode) []string {
	args := []string{"server",
		"--node-id", strconv.Itoa(n.id),
		"--data-dir", n.dataDir,
		"--listen", n.addr,
		"--peer-listen", n.peerAddr,
	}
	if n.id > 1 {
		// Node 1 starts the cluster; the others join through it. A node
		// restarted on its data needs no --join, but it does no harm.
		args = append(args, "--join", o.node(1).peerAddr)
	}
	if o.TLS {
		d := o.certsDir()
		crt, key, ca := filepath.Join(d, "node"+strconv.Itoa(n.id)+".crt"), filepath.Join(d, "node"+strconv.Itoa(n.id)+".key"), filepath.Join(d, "ca.crt")
		args = append(args, "--cert-file", crt, "--key-file", key, "--client-ca-file", ca,
			"--peer-cert-file", crt, "--peer-key-file", key, "--peer-ca-file", ca)
	}
	return args
}

func clusterLocalCommand() *cobra.Command {
	o := localOptions{}
	cmd := &cobra.Command{
		Use:   "local",
		Short: "Run a cluster of several nodes on this machine, until Ctrl-C",
		Long: `Run a cluster of --nodes nodes on this machine, each a "groupkv server"
process, until Ctrl-C (or SIGTERM) stops them all.

Node i keeps its data in DIR/node<i>, writes its log to DIR/node<i>.log,
serves clients on 127.0.0.1:<base-port + 10*(i-1)> and listens for its peers
on the port above that. Node 1 starts first and the others join it, one at a
time, each once the one before answers /healthz.

Run the same command again on the same --dir to restart the same nodes on
their data. Delete the directory to start afresh.

With --tls every node serves both its ports over TLS only: mutual TLS
between nodes, and clients must present a certificate. The CA and the
certificates (each node's, for 127.0.0.1 and localhost, and client.crt for
clients) are made in DIR/certs, kept across restarts.`,
		Example: `  groupkv cluster local
  groupkv cluster local --nodes 5 --base-port 8000 --dir /tmp/kv
  groupkv cluster local --tls`,
		Args: argsBetween(0, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.validate(); err != nil {
				return err
			}
			sig := make(chan os.Signal, 2)
			signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
			defer signal.Stop(sig)
			return runLocalCluster(cmd.OutOrStdout(), cmd.ErrOrStderr(), o, sig)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Dir, "dir", "groupkv-cluster", "directory holding each node's data directory and log")
	f.IntVar(&o.Nodes, "nodes", 3, "number of nodes")
	f.IntVar(&o.BasePort, "base-port", 7070, "client port of node 1; node i uses base-port+10*(i-1), and the port above for its peers")
	f.DurationVar(&o.Timeout, "timeout", 60*time.Second, "how long each node may take to answer /healthz")
	f.BoolVar(&o.TLS, "tls", false, "serve both ports of every node over TLS (mutual between nodes, client certificates asked for), with a CA and certificates made in DIR/certs")
	return cmd
}

// planLocalCluster checks that the cluster can start (ports free, data
// directories consistent) and answers its nodes, marked existing or not,
// without starting anything.
func planLocalCluster(o localOptions) ([]localNode, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	nodes := make([]localNode, o.Nodes)
	for i := range nodes {
		n := o.node(i + 1)
		for _, a := range []string{n.addr, n.peerAddr} {
			l, err := net.Listen("tcp", a)
			if err != nil {
				return nil, fmt.Errorf("node %d cannot listen on %s: %v (is a cluster already running? stop it, or choose other ports with --base-port)", n.id, a, err)
			}
			l.Close()
		}
		entries, err := os.ReadDir(n.dataDir)
		switch {
		case err == nil:
			n.existing = len(entries) > 0
		case !errors.Is(err, os.ErrNotExist):
			return nil, fmt.Errorf("node %d: %v", n.id, err)
		}
		nodes[i] = n
	}
	if !nodes[0].existing {
		for _, n := range nodes[1:] {
			if n.existing {
				return nil, fmt.Errorf("%s holds data but %s does not: node 1 would start a new cluster without the others; delete %s to start afresh", n.dataDir, nodes[0].dataDir, o.Dir)
			}
		}
	}
	return nodes, nil
}

// localProc is a running node of a local cluster.
type localProc struct {
	node     localNode
	cmd      *exec.Cmd
	logStart int64         // where this run's lines begin in the log
	done     chan struct{} // closed once the process has exited
	err      error         // its exit status, once done is closed
}

func (p *localProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// startLocalNode starts node n as a child process running self, its output
// appended to its log.
func startLocalNode(self string, o localOptions, n localNode) (*localProc, error) {
	logf, err := os.OpenFile(n.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child has its own descriptor
	start, err := logf.Seek(0, io.SeekEnd)
	if err != nil {
		return nil, err
	}
	args := o.serverArgs(n)
	fmt.Fprintf(logf, "=== %s groupkv cluster local: starting node %d: %s %s\n",
		time.Now().Format(time.RFC3339), n.id, self, strings.Join(args, " "))
	cmd := exec.Command(self, args...)
	cmd.Stdout = logf
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting node %d: %v", n.id, err)
	}
	p := &localProc{node: n, cmd: cmd, logStart: start, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// errInterrupted is a signal arriving while the cluster starts.
var errInterrupted = errors.New("interrupted")

// waitHealthy waits until p's /healthz answers 200, p exits, a signal
// arrives (errInterrupted) or the deadline passes.
func waitHealthy(p *localProc, o localOptions, deadline time.Time, interrupted <-chan struct{}) error {
	client, scheme, err := o.httpClient()
	if err != nil {
		return err
	}
	healthURL := scheme + p.node.addr + "/healthz"
	last := "no answer yet"
	for {
		select {
		case <-interrupted:
			return errInterrupted
		default:
		}
		if p.exited() {
			select {
			case <-interrupted: // Ctrl-C reaches the children too
				return errInterrupted
			case <-time.After(100 * time.Millisecond):
			}
			return fmt.Errorf("node %d exited while starting (%v); the end of %s:\n%s",
				p.node.id, p.err, p.node.logPath, p.logTail(20))
		}
		resp, err := client.Get(healthURL)
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status + " " + strings.TrimSpace(string(body))
		} else {
			last = err.Error()
			var ue *url.Error
			if errors.As(err, &ue) {
				last = ue.Err.Error()
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("node %d (%s) did not answer /healthz with 200 in time (last: %s); the end of %s:\n%s",
				p.node.id, p.node.addr, last, p.node.logPath, p.logTail(20))
		}
		select {
		case <-interrupted:
			return errInterrupted
		case <-p.done:
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// logTail answers the last n lines this run of p wrote to its log.
func (p *localProc) logTail(n int) string {
	f, err := os.Open(p.node.logPath)
	if err != nil {
		return "  (" + err.Error() + ")"
	}
	defer f.Close()
	from := p.logStart
	if fi, err := f.Stat(); err == nil && fi.Size()-from > 64<<10 {
		from = fi.Size() - 64<<10
	}
	if _, err := f.Seek(from, io.SeekStart); err != nil {
		return "  (" + err.Error() + ")"
	}
	b, _ := io.ReadAll(f)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "  " + strings.Join(lines, "\n  ")
}

// stopLocalNodes sends SIGTERM to every running node and waits for them to
// exit; a node still running after the grace period, or after a second
// signal, is killed.
func stopLocalNodes(errOut io.Writer, procs []*localProc, hurry <-chan os.Signal) {
	var running []*localProc
	for _, p := range procs {
		if p.exited() {
			continue
		}
		running = append(running, p)
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			p.cmd.Process.Kill()
		}
	}
	if len(running) == 0 {
		return
	}
	fmt.Fprintf(errOut, "stopping %d node(s)...\n", len(running))
	grace := time.NewTimer(localStopGrace)
	defer grace.Stop()
	for _, p := range running {
		select {
		case <-p.done:
			continue
		case <-grace.C:
			fmt.Fprintf(errOut, "nodes still running after %v: killing them\n", localStopGrace)
		case <-hurry:
			fmt.Fprintln(errOut, "second signal: killing the nodes")
		}
		for _, q := range running {
			if !q.exited() {
				q.cmd.Process.Kill()
			}
		}
		break
	}
	for _, p := range running {
		<-p.done
		if p.err != nil {
			fmt.Fprintf(errOut, "node %d exited: %v (see %s)\n", p.node.id, p.err, p.node.logPath)
		}
	}
}

// runLocalCluster starts the local cluster o, reports it on out, and runs it
// until a signal arrives on sig; then it stops the nodes and answers nil.
func runLocalCluster(out, errOut io.Writer, o localOptions, sig <-chan os.Signal) (err error) {
	nodes, err := planLocalCluster(o)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding the groupkv executable to run the nodes: %v", err)
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return err
	}
	if err := o.ensureCerts(); err != nil {
		return err
	}
	for i := o.Nodes + 1; ; i++ {
		extra := o.node(i)
		if _, err := os.Stat(extra.dataDir); err != nil {
			break
		}
		fmt.Fprintf(errOut, "note: %s exists but --nodes is %d: node %d stays down\n", extra.dataDir, o.Nodes, i)
	}

	// The first signal interrupts the start or ends the run; a second one
	// (read by stopLocalNodes) kills the nodes at once.
	interrupted := make(chan struct{})
	go func() {
		<-sig
		close(interrupted)
	}()

	var procs []*localProc
	defer func() {
		stopLocalNodes(errOut, procs, sig)
		if errors.Is(err, errInterrupted) {
			fmt.Fprintln(errOut, "groupkv: cluster stopped")
			err = nil
		}
	}()
	start := func(n localNode) (*localProc, error) {
		p, err := startLocalNode(self, o, n)
		if err != nil {
			return nil, err
		}
		procs = append(procs, p)
		return p, nil
	}

	// Nodes restarted on their data start together: a majority of them may
	// be needed before any is healthy.
	var restarted []*localProc
	var ids []string
	for _, n := range nodes {
		if n.existing {
			p, err := start(n)
			if err != nil {
				return err
			}
			restarted = append(restarted, p)
			ids = append(ids, strconv.Itoa(n.id))
		}
	}
	if len(restarted) > 0 {
		fmt.Fprintf(errOut, "restarting node(s) %s on their data in %s...\n", strings.Join(ids, ", "), o.Dir)
		deadline := time.Now().Add(o.Timeout)
		errs := make([]error, len(restarted))
		var wg sync.WaitGroup
		for i, p := range restarted {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = waitHealthy(p, o, deadline, interrupted)
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			if errors.Is(err, errInterrupted) {
				return errInterrupted
			}
			return err
		}
	}
	// New nodes start one at a time, each joining once the one before is a
	// member.
	for _, n := range nodes {
		if n.existing {
			continue
		}
		if n.id == 1 {
			fmt.Fprintf(errOut, "starting node 1 on %s...\n", n.addr)
		} else {
			fmt.Fprintf(errOut, "starting node %d on %s, joining through %s...\n", n.id, n.addr, o.node(1).peerAddr)
		}
		p, err := start(n)
		if err != nil {
			return err
		}
		if err := waitHealthy(p, o, time.Now().Add(o.Timeout), interrupted); err != nil {
			return err
		}
	}

	fmt.Fprintf(out, "groupkv: a %d-node cluster is running; data and logs in %s\n\n", o.Nodes, o.Dir)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  NODE\tADDR\tPEER\tLOG")
	for _, n := range nodes {
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\n", n.id, n.addr, n.peerAddr, n.logPath)
	}
	tw.Flush()
	first, last := nodes[0].addr, nodes[len(nodes)-1].addr
	if o.TLS {
		tlsArgs := " " + strings.Join(o.clientTLSArgs(), " ")
		first, last = first+tlsArgs, last+tlsArgs
		fmt.Fprintf(out, "\nBoth ports of every node serve TLS only; the CA and certificates are in %s.\n", o.certsDir())
	}
	fmt.Fprintf(out, `
Any node serves clients. Try:
  groupkv cluster status --addr %s
  groupkv collections create users --addr %s
  groupkv put users alice hello --addr %s
  groupkv get users alice --addr %s

Ctrl-C stops the cluster; the same command restarts it on its data.
`, first, first, last, first)
	if f, ok := out.(*os.File); ok {
		f.Sync()
	}

	// Run until a signal, reporting nodes that exit on their own.
	reported := make([]bool, len(procs))
	for {
		alive := 0
		for i, p := range procs {
			if !p.exited() {
				alive++
			} else if !reported[i] {
				reported[i] = true
				fmt.Fprintf(errOut, "groupkv: node %d exited (%v); the end of %s:\n%s\n", p.node.id, p.err, p.node.logPath, p.logTail(10))
			}
		}
		if alive == 0 {
			return errors.New("every node has exited")
		}
		select {
		case <-interrupted:
			return errInterrupted
		case <-time.After(500 * time.Millisecond):
		}
	}
}
