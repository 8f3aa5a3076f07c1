package node

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/peer"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/shard"
	"github.com/groupkv/groupkv/internal/tlsfiles"
	"github.com/groupkv/groupkv/internal/txn"
)

// The peer service carries node-to-node requests other than raft messages
// (which internal/transport streams): joining, forwarded proposals,
// timestamps, reads that need a shard's leader, and status. Its messages
// are small Go structs encoded as JSON under a gRPC content subtype of its
// own, so the service needs no generated code.
const (
	peerService = "groupkv.peer.v1.Peer"
	peerCodec   = "groupkv-peer-json"
	// maxHops bounds how often a request is forwarded between nodes.
	maxHops = 3
)

type jsonCodec struct{}

func (jsonCodec) Marshal(v any) ([]byte, error)      { return json.Marshal(v) }
func (jsonCodec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }
func (jsonCodec) Name() string                       { return peerCodec }

func init() { encoding.RegisterCodec(jsonCodec{}) }

// peerError carries a kv error across the peer service.
type peerError struct {
	Code    kv.Code `json:"code,omitempty"`
	Message string  `json:"message,omitempty"`
}

func toPeerError(err error) *peerError {
	if err == nil {
		return nil
	}
	e := kv.AsError(err)
	return &peerError{Code: e.Code, Message: e.Message}
}

func (e *peerError) err() error {
	if e == nil || e.Code == "" {
		return nil
	}
	return &kv.Error{Code: e.Code, Message: e.Message}
}

type joinRequest struct {
	Node cluster.NodeDesc `json:"node"`
	Hops int              `json:"hops"`
}

type joinResponse struct {
	// Node is the joiner's membership record, with its meta replica id.
	Node cluster.NodeDesc `json:"node"`
	// Nodes are the members, so the joiner can reach them before its meta
	// replica has caught up.
	Nodes []cluster.NodeDesc `json:"nodes"`
	Error *peerError         `json:"error,omitempty"`
}

type proposeRequest struct {
	Shard   uint64 `json:"shard"`
	Command []byte `json:"command"`
	Hops    int    `json:"hops"`
}

type proposeResponse struct {
	Version uint64                  `json:"version,omitempty"`
	Refused *peerError              `json:"refused,omitempty"`
	Desc    *cluster.CollectionDesc `json:"desc,omitempty"`
	Count   int                     `json:"count,omitempty"`
	Node    *cluster.NodeDesc       `json:"node,omitempty"`
	Txn     *shard.TxnResult        `json:"txn,omitempty"`
	Error   *peerError              `json:"error,omitempty"`
}

type timestampsRequest struct {
	// Count timestamps above Floor; 0 asks only for Latest.
	Count int    `json:"count"`
	Floor uint64 `json:"floor"`
}

type timestampsResponse struct {
	First  uint64     `json:"first"`
	Latest uint64     `json:"latest"`
	Error  *peerError `json:"error,omitempty"`
}

// leaderReadRequest asks a shard's leader to prepare a read: a snapshot
// read at SnapshotTS, or its resolved timestamp. It answers with its
// applied index, which the asking replica waits for before reading.
type leaderReadRequest struct {
	Shard      uint64 `json:"shard"`
	SnapshotTS uint64 `json:"snapshot_ts,omitempty"`
	Now        uint64 `json:"now,omitempty"`
}

type leaderReadResponse struct {
	AppliedIndex uint64     `json:"applied_index"`
	Resolved     uint64     `json:"resolved,omitempty"`
	Error        *peerError `json:"error,omitempty"`
}

type statusRequest struct{}

type statusResponse struct {
	Node uint64 `json:"node"`
	// Leaders maps the shards this node holds a replica of to the node id
	// of their leader (0: unknown).
	Leaders map[uint64]uint64 `json:"leaders"`
}

func unary[Req, Resp any](f func(context.Context, *Req) (*Resp, error)) func(any, context.Context, func(any) error, grpc.UnaryServerInterceptor) (any, error) {
	return func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
		req := new(Req)
		if err := dec(req); err != nil {
			return nil, err
		}
		return f(ctx, req)
	}
}

// RegisterPeer registers the node's peer services (raft transport and the
// peer service) on s, the server of the node's peer port.
func (n *Node) RegisterPeer(s grpc.ServiceRegistrar) {
	n.registerTransport(s)
	n.registerConsistency(s)
	n.registerMoves(s)
	n.registerWatch(s)
	s.RegisterService(&grpc.ServiceDesc{
		ServiceName: peerService,
		HandlerType: (*any)(nil),
		Methods: append([]grpc.MethodDesc{
			{MethodName: "Join", Handler: unary(n.handleJoin)},
			{MethodName: "Propose", Handler: unary(n.handlePropose)},
			{MethodName: "Timestamps", Handler: unary(n.handleTimestamps)},
			{MethodName: "LeaderRead", Handler: unary(n.handleLeaderRead)},
			{MethodName: "Status", Handler: unary(n.handleStatus)},
			{MethodName: "Read", Handler: unary(n.handleRead)},
			{MethodName: "TxnLock", Handler: unary(n.handleTxnLock)},
			{MethodName: "TxnRelease", Handler: unary(n.handleTxnRelease)},
			{MethodName: "TxnEnded", Handler: unary(n.handleTxnEnded)},
			{MethodName: "ShardRead", Handler: unary(n.handleShardRead)},
		}, n.groupMethods()...),
	}, n)
}

// peers holds the node's client connections to other nodes' peer ports:
// one per port for requests, and one for the pings of callWatch, which a
// large answer on the first (a page of a scan) does not hold up.
type peers struct {
	dialOptions func(addr string, extra ...grpc.DialOption) []grpc.DialOption
	mu          sync.Mutex
	conns       map[string]*grpc.ClientConn
	pings       map[string]*grpc.ClientConn
}

// dialOptions returns the options of a connection to the peer port at
// addr (host:port).
func (n *Node) dialOptions(addr string, extra ...grpc.DialOption) []grpc.DialOption {
	creds := insecure.NewCredentials()
	if n.opts.PeerTLS != nil {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			host = addr
		}
		creds = credentials.NewTLS(tlsfiles.DialConfig(n.opts.PeerTLS, host))
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds),
		// A peer that comes back is reached within about an election
		// timeout, not after gRPC's default two-minute backoff.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: grpcbackoff.Config{
			BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second}})}
	if n.opts.Dialer != nil {
		opts = append(opts, grpc.WithContextDialer(n.opts.Dialer))
	}
	return append(opts, extra...)
}

func (p *peers) conn(addr string) (*grpc.ClientConn, error) {
	return p.connIn(&p.conns, addr)
}

// pingConn is the connection to addr that carries pings only.
func (p *peers) pingConn(addr string) (*grpc.ClientConn, error) {
	return p.connIn(&p.pings, addr)
}

func (p *peers) connIn(conns *map[string]*grpc.ClientConn, addr string) (*grpc.ClientConn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c, ok := (*conns)[addr]; ok {
		return c, nil
	}
	if *conns == nil {
		*conns = make(map[string]*grpc.ClientConn)
	}
	// Answers of forwarded reads and of parts of reads are as large as a
	// page of records, beyond gRPC's default 4 MiB.
	c, err := grpc.NewClient(addr, p.dialOptions(addr, grpc.WithDefaultCallOptions(grpc.CallContentSubtype(peerCodec), grpc.MaxCallRecvMsgSize(maxPeerMessage)))...)
	if err != nil {
		return nil, err
	}
	(*conns)[addr] = c
	return c, nil
}

func (p *peers) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	for _, c := range p.pings {
		c.Close()
	}
	p.conns, p.pings = nil, nil
}

// call invokes a peer method at a peer address.
func (n *Node) call(ctx context.Context, addr, method string, req, resp any) error {
	_, err := n.callSent(ctx, addr, method, req, resp)
	return err
}

// callSent is call that also says, on failure, whether the request may
// have reached the peer (a connection to it was up).
func (n *Node) callSent(ctx context.Context, addr, method string, req, resp any) (sent bool, err error) {
	c, err := n.peers.conn(addr)
	if err != nil {
		return false, kv.Errorf(kv.CodeUnavailable, "connecting to peer %s: %v", addr, err)
	}
	var p peer.Peer
	if err := c.Invoke(ctx, "/"+peerService+"/"+method, req, resp, grpc.Peer(&p)); err != nil {
		return p.Addr != nil, kv.Errorf(kv.CodeUnavailable, "peer %s: %s: %v", addr, method, err)
	}
	return true, nil
}

// callLeader is callSent to node target, which led shardID when the call
// began or, without a replica of shardID here, holds one. A node that
// stops answering with its connections open (a stopped process) would
// hold the call until the request's deadline, and a retry elsewhere
// cannot tell whether it took the request. So the call is watched
// (callWatch): target is pinged once this node's replica of shardID knows
// another leader or, without a replica here, once the call has waited an
// election timeout; when a ping goes unanswered the call is abandoned,
// with not_leader in the first case and unavailable in the second, both
// of which the callers retry. (A node that answers is waited for: a
// proposal a former leader took is decided by its successor's log.)
func (n *Node) callLeader(ctx context.Context, shardID, target uint64, method string, req, resp any) (sent bool, err error) {
	nd, ok := n.nodeDesc(target)
	if !ok {
		return false, kv.Errorf(kv.CodeUnavailable, "node %d is not a known member", target)
	}
	cctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	w := &callWatch{n: n, ctx: cctx, cancel: cancel, shard: shardID, target: target, addr: nd.PeerAddr, start: time.Now()}
	w.timer = time.AfterFunc(time.Hour, w.check) // armed once w.timer is set
	w.timer.Reset(n.opts.TickInterval)
	defer w.timer.Stop()
	sent, err = n.callSent(cctx, nd.PeerAddr, method, req, resp)
	if err != nil && ctx.Err() == nil && errors.Is(context.Cause(cctx), errSilent) {
		n.markSilent(target)
		if l := n.leaderOf(shardID); n.hasReplica(shardID) && l != 0 && l != target {
			return sent, kv.Errorf(kv.CodeNotLeader, "node %d, which led shard %d, stopped answering after node %d was elected", target, shardID, l)
		}
		return sent, kv.Errorf(kv.CodeUnavailable, "node %d stopped answering (its status went unanswered) while it held a request for shard %d", target, shardID)
	}
	return sent, err
}

// errSilent ends a callLeader whose node did not answer a ping.
var errSilent = errors.New("node: a peer stopped answering")

// callWatch watches one callLeader, every tick until its context ends.
// Its pings go over a connection of their own (peers.pingConn): on the
// call's, a ping would wait behind the call's own answer when that is
// large, and a busy node would be taken for a stopped one.
type callWatch struct {
	n      *Node
	ctx    context.Context
	cancel context.CancelCauseFunc
	timer  *time.Timer
	shard  uint64
	target uint64
	addr   string
	start  time.Time
	next   time.Time // of the next ping
	missed int       // pings in a row that went unanswered
}

// A node with a replica of the call's shard abandons the call when one
// ping goes unanswered for max(5 ticks, 500 ms): another leader was
// elected, so the target is most likely stopped or cut off. A node
// without a replica has no such sign, and a live node can be that slow
// to answer under load (in-process test clusters under the race
// detector were): it waits for silentPings pings in a row, of
// noReplicaPing each, before taking the target for stopped.
const (
	silentPings   = 2
	noReplicaPing = 2 * time.Second
)

func (w *callWatch) check() {
	if w.ctx.Err() != nil {
		return
	}
	tick := w.n.opts.TickInterval
	defer w.timer.Reset(tick)
	now := time.Now()
	if now.Before(w.next) {
		return
	}
	need, wait := 1, max(5*tick, 500*time.Millisecond)
	if w.n.hasReplica(w.shard) {
		if l := w.n.leaderOf(w.shard); l == 0 || l == w.target {
			return
		}
	} else if now.Sub(w.start) < w.n.electionTimeout() {
		return
	} else {
		need, wait = silentPings, max(wait, noReplicaPing)
	}
	answered, unanswered := w.n.pingWithin(w.ctx, w.addr, wait)
	switch {
	case w.ctx.Err() != nil:
		return
	case answered:
		w.missed = 0
	case unanswered:
		if w.missed++; w.missed >= need {
			w.cancel(errSilent)
		}
	}
	w.next = time.Now().Add(5 * tick)
}

// pingWithin pings the node at addr (ping) for at most wait: answered when
// it answered, unanswered when the wait ran out. A ping that failed
// otherwise — its connection refused or closed — is neither: it says
// nothing a timeout would (a stopped process's port still accepts
// connections; a dead one's connections fail the watched call itself).
func (n *Node) pingWithin(ctx context.Context, addr string, wait time.Duration) (answered, unanswered bool) {
	pctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	err := n.ping(pctx, addr)
	return err == nil, errors.Is(pctx.Err(), context.DeadlineExceeded)
}

// ping asks the node at addr for its status over the ping connection. It
// waits for the connection to come up (a stopped node's never does) until
// ctx ends.
func (n *Node) ping(ctx context.Context, addr string) error {
	c, err := n.peers.pingConn(addr)
	if err != nil {
		return err
	}
	var st statusResponse
	return c.Invoke(ctx, "/"+peerService+"/Status", &statusRequest{}, &st, grpc.WaitForReady(true))
}

// silentFor is how long a node whose call was abandoned (callWatch) is
// passed over where another node can serve instead.
const silentFor = 10 * time.Second

// silentNodes are the nodes whose calls were abandoned lately, with when.
type silentNodes struct {
	mu sync.Mutex
	at map[uint64]time.Time
}

func (n *Node) markSilent(id uint64) {
	n.silent.mu.Lock()
	defer n.silent.mu.Unlock()
	if n.silent.at == nil {
		n.silent.at = map[uint64]time.Time{}
	}
	n.silent.at[id] = time.Now()
}

// answering is false for a node whose call was abandoned in the last
// silentFor.
func (n *Node) answering(id uint64) bool {
	n.silent.mu.Lock()
	defer n.silent.mu.Unlock()
	at, ok := n.silent.at[id]
	if ok && time.Since(at) >= silentFor {
		delete(n.silent.at, id)
		ok = false
	}
	return !ok
}

// answeringFirst returns nodes (a new slice) with the answering ones
// first, each part in its order, and how many answer.
func (n *Node) answeringFirst(nodes []uint64) ([]uint64, int) {
	out := make([]uint64, 0, len(nodes))
	for _, id := range nodes {
		if n.answering(id) {
			out = append(out, id)
		}
	}
	k := len(out)
	for _, id := range nodes {
		if !slices.Contains(out[:k], id) {
			out = append(out, id)
		}
	}
	return out, k
}

// callNode invokes a peer method on node id.
func (n *Node) callNode(ctx context.Context, id uint64, method string, req, resp any) error {
	nd, ok := n.nodeDesc(id)
	if !ok {
		return kv.Errorf(kv.CodeUnavailable, "node %d is not a known member", id)
	}
	return n.call(ctx, nd.PeerAddr, method, req, resp)
}

func (n *Node) handlePropose(ctx context.Context, req *proposeRequest) (*proposeResponse, error) {
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return &proposeResponse{Error: toPeerError(err)}, nil
	}
	defer done()
	res, err := n.proposeHops(ctx, req.Shard, req.Command, req.Hops)
	if err != nil {
		if (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) && shard.IsWrite(req.Command) {
			// Proposed, then the wait ended: it may still apply.
			err = kv.Errorf(kv.CodeCommitUnknown, "the write was proposed but not applied before the request ended (%v); it may or may not take effect", err)
		}
		return &proposeResponse{Error: toPeerError(err)}, nil
	}
	out := &proposeResponse{Version: res.Version, Desc: res.Desc, Count: res.Count, Node: res.Node, Txn: res.Txn}
	if res.Err != nil {
		out.Refused = toPeerError(res.Err)
	}
	return out, nil
}

func (n *Node) handleTimestamps(ctx context.Context, req *timestampsRequest) (*timestampsResponse, error) {
	term, ok := n.oracleTerm()
	if !ok {
		return &timestampsResponse{Error: toPeerError(kv.Errorf(kv.CodeNotLeader, "node %d does not run the timestamp oracle", n.id))}, nil
	}
	out := &timestampsResponse{Latest: n.oracle.Latest()}
	if req.Count > 0 {
		first, ok := n.oracle.TryNextN(req.Floor, min(req.Count, 4096))
		if !ok {
			return &timestampsResponse{Error: toPeerError(kv.Errorf(kv.CodeUnavailable, "the timestamp oracle is renewing its window"))}, nil
		}
		out.First = first
	}
	if err := n.confirmOracle(ctx, term); err != nil {
		return &timestampsResponse{Error: toPeerError(kv.Errorf(kv.CodeNotLeader, "node %d could not confirm that it runs the timestamp oracle: %v", n.id, err))}, nil
	}
	return out, nil
}

func (n *Node) handleLeaderRead(ctx context.Context, req *leaderReadRequest) (*leaderReadResponse, error) {
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return &leaderReadResponse{Error: toPeerError(err)}, nil
	}
	defer done()
	if !n.host.Ready(req.Shard) {
		return &leaderReadResponse{Error: toPeerError(kv.Errorf(kv.CodeNotLeader, "shard %d is not led by node %d", req.Shard, n.id))}, nil
	}
	out := &leaderReadResponse{}
	if req.SnapshotTS != 0 {
		if err := n.host.SnapshotRead(ctx, req.Shard, req.SnapshotTS); err != nil {
			return &leaderReadResponse{Error: toPeerError(err)}, nil
		}
	} else {
		if err := n.host.ReadBarrier(ctx, req.Shard); err != nil {
			return &leaderReadResponse{Error: toPeerError(err)}, nil
		}
		out.Resolved = n.host.Resolved(req.Shard, req.Now)
	}
	out.AppliedIndex, _ = n.host.AppliedIndex(req.Shard)
	return out, nil
}

func (n *Node) handleStatus(ctx context.Context, _ *statusRequest) (*statusResponse, error) {
	return &statusResponse{Node: n.id, Leaders: n.localLeaders()}, nil
}

// proposeRemote hands a command to node id's proposal path.
func (n *Node) proposeRemote(ctx context.Context, id, shardID uint64, cmd []byte, hops int) (shard.Result, error) {
	var resp proposeResponse
	if sent, err := n.callLeader(ctx, shardID, id, "Propose", &proposeRequest{Shard: shardID, Command: cmd, Hops: hops}, &resp); err != nil {
		if sent && shard.IsWrite(cmd) {
			// The request may have reached the leader before the call
			// failed: the write may or may not take effect.
			return shard.Result{}, kv.Errorf(kv.CodeCommitUnknown, "forwarding the write to node %d failed (%v); it may or may not take effect", id, err)
		}
		return shard.Result{}, err
	}
	if err := resp.Error.err(); err != nil {
		return shard.Result{}, err
	}
	res := shard.Result{Version: resp.Version, Desc: resp.Desc, Count: resp.Count, Node: resp.Node, Txn: resp.Txn}
	if e := resp.Refused.err(); e != nil {
		res.Err = e.(*kv.Error)
	}
	return res, nil
}

// maxPeerMessage bounds one peer message: a raft snapshot of a shard is
// sent whole (streaming in chunks is future work).
const maxPeerMessage = 1 << 30

// readRequest is a client read forwarded whole to a node that holds a
// replica of every shard it needs.
type forwardedRead struct {
	Op      string          `json:"op"`
	Request json.RawMessage `json:"request"`
}

type forwardedReadResponse struct {
	Response json.RawMessage `json:"response,omitempty"`
	Error    *peerError      `json:"error,omitempty"`
}

type forwardedKey struct{}

// forwardRead runs a read whose shards are not all held here on a node that
// holds them all: it reports false when the read is local, else the
// remote answer decoded into resp, or errNoSingleHolder (see routeRead).
func (n *Node) forwardRead(ctx context.Context, shards []uint64, op string, req, resp any) (bool, error) {
	target, ok, err := n.readTarget(ctx, shards)
	if !ok || err != nil {
		return ok, err
	}
	body, err := json.Marshal(req)
	if err != nil {
		return true, kv.Errorf(kv.CodeInternal, "encoding a forwarded read: %v", err)
	}
	var out forwardedReadResponse
	if _, err := n.callLeader(ctx, shards[0], target, "Read", &forwardedRead{Op: op, Request: body}, &out); err != nil {
		return true, err
	}
	if err := out.Error.err(); err != nil {
		return true, err
	}
	if err := json.Unmarshal(out.Response, resp); err != nil {
		return true, kv.Errorf(kv.CodeInternal, "decoding a forwarded read: %v", err)
	}
	return true, nil
}

// errNoSingleHolder: no node holds a replica of every shard a read needs;
// it is read in parts (spread.go).
var errNoSingleHolder = errors.New("node: no node holds every shard of the read")

// readTarget picks the node a read of shards is forwarded to: ok false when
// this node holds them all (the read is local), else a node that holds
// them all, the first shard's leader preferred, or errNoSingleHolder when
// none does or the read was forwarded here already.
func (n *Node) readTarget(ctx context.Context, shards []uint64) (uint64, bool, error) {
	shards = n.liveShards(shards)
	var missing bool
	for _, id := range shards {
		if !n.localReadable(ctx, id) {
			missing = true
			break
		}
	}
	if !missing || len(shards) == 0 {
		return 0, false, nil
	}
	if ctx.Value(forwardedKey{}) != nil {
		return 0, true, errNoSingleHolder // forwarded once: read in parts
	}
	cands, _ := n.answeringFirst(append([]uint64{n.leaderOfAnywhere(shards[0])}, n.shardNodes(shards[0])...))
	for _, cand := range cands {
		if cand == 0 || cand == n.id {
			continue
		}
		all := true
		for _, id := range shards[1:] {
			if !contains(n.shardNodes(id), cand) {
				all = false
				break
			}
		}
		if all {
			return cand, true, nil
		}
	}
	return 0, true, errNoSingleHolder
}

// leaderOfAnywhere is the leader of shardID as this node knows it, or 0.
func (n *Node) leaderOfAnywhere(shardID uint64) uint64 {
	if n.hasReplica(shardID) {
		return n.leaderOf(shardID)
	}
	return 0
}

func (n *Node) handleRead(ctx context.Context, req *forwardedRead) (*forwardedReadResponse, error) {
	ctx = context.WithValue(ctx, forwardedKey{}, true)
	var (
		out any
		err error
	)
	switch req.Op {
	case "get":
		var r kv.GetRequest
		if err = json.Unmarshal(req.Request, &r); err == nil {
			out, err = n.Get(ctx, r)
		}
	case "txn_scan_at", "txn_scan_locked":
		var r kv.ScanRequest
		if err = json.Unmarshal(req.Request, &r); err == nil {
			out, err = n.txnScan(ctx, r, groupCheckOf(req.Op))
		}
	case "txn_get_by_tags_at", "txn_get_by_tags_locked":
		var r kv.TagQuery
		if err = json.Unmarshal(req.Request, &r); err == nil {
			out, err = n.txnGetByTags(ctx, r, groupCheckOf(req.Op))
		}
	case "txn_get_at":
		var r kv.GetRequest
		if err = json.Unmarshal(req.Request, &r); err == nil {
			out, err = n.txnGetAt(ctx, r)
		}
	case "batch_get":
		var r []kv.KeyRef
		if err = json.Unmarshal(req.Request, &r); err == nil {
			out, err = n.BatchGet(ctx, r)
		}
	case "scan":
		var r kv.ScanRequest
		if err = json.Unmarshal(req.Request, &r); err == nil {
			out, err = n.Scan(ctx, r)
		}
	case "get_by_tags":
		var r kv.TagQuery
		if err = json.Unmarshal(req.Request, &r); err == nil {
			out, err = n.GetByTags(ctx, r)
		}
	case "txn_record":
		var m txn.Meta
		if err = json.Unmarshal(req.Request, &m); err == nil {
			out, err = n.readRecord(ctx, &m)
		}
	default:
		err = kv.Errorf(kv.CodeInvalidArgument, "unknown forwarded read %q", req.Op)
	}
	if err != nil {
		return &forwardedReadResponse{Error: toPeerError(err)}, nil
	}
	body, err := json.Marshal(out)
	if err != nil {
		return &forwardedReadResponse{Error: toPeerError(kv.Errorf(kv.CodeInternal, "encoding a read: %v", err))}, nil
	}
	return &forwardedReadResponse{Response: body}, nil
}
