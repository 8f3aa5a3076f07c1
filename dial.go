package groupkv

import (
	"cmp"
	"context"
	"crypto/tls"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"

	"github.com/groupkv/groupkv/internal/api"
	"github.com/groupkv/groupkv/internal/kv"
	pb "github.com/groupkv/groupkv/proto/groupkvpb"
)

// DialOption configures Dial. The zero set of options gives a client that
// connects lazily, on its first call, and reconnects by itself.
type DialOption func(*dialOptions)

type dialOptions struct {
	// timeout, when positive, makes Dial connect at once and fail if the
	// connection is not up within it.
	timeout time.Duration
	// grpc are appended to Dial's own gRPC options.
	grpc []grpc.DialOption
	// noRouting sends every call to the dialed node (see route.go).
	noRouting bool
	// tls, when set, secures the connections (WithTLS).
	tls *tls.Config
}

// WithTLS connects over TLS with cfg: cfg.RootCAs are the CAs trusted to
// sign the servers' certificates (nil: the system's), and a client
// certificate goes in cfg.Certificates or cfg.GetClientCertificate for a
// server that asks for one (groupkv server --client-ca-file). Every node
// the client reaches (the dialed one, and the shard leaders it routes to)
// is dialed the same way, by the address the cluster advertises for it,
// which its certificate must name.
func WithTLS(cfg *tls.Config) DialOption {
	return func(o *dialOptions) { o.tls = cfg }
}

// WithoutShardRouting sends every call to the dialed node, which forwards
// what other nodes lead, instead of routing single-key operations straight
// to shard leaders (see route.go): for a client that can reach only the
// node it dials.
func WithoutShardRouting() DialOption {
	return func(o *dialOptions) { o.noRouting = true }
}

// WithDialTimeout makes Dial connect before it returns and fail with an
// ErrUnavailable-coded error if the server cannot be reached within d. Without
// it (or with d <= 0) Dial does not touch the network, and a server that is
// down shows up as ErrUnavailable on the first call.
func WithDialTimeout(d time.Duration) DialOption {
	return func(o *dialOptions) { o.timeout = d }
}

// WithGRPCDialOptions adds options to the underlying gRPC client, for
// example transport credentials, which replace the default of none, or
// interceptors. They are applied after Dial's own options.
func WithGRPCDialOptions(opts ...grpc.DialOption) DialOption {
	return func(o *dialOptions) { o.grpc = append(o.grpc, opts...) }
}

// readyTimeout bounds Ready on a remote DB, which has no context: a probe
// that outlasts a health checker's period is useless, and a server that does
// not answer must read as not ready rather than hang the caller.
const readyTimeout = 5 * time.Second

// Dial returns a DB that talks to the groupkv server at addr, "host:port"
// with no scheme (e.g. "127.0.0.1:7070" or "db1.internal:7070"), over gRPC
// without TLS unless WithTLS says otherwise. The DB reconnects by
// itself; Close releases it.
//
// Errors of the remote DB are those of the server: the same Code and Message,
// so errors.Is(err, ErrNotFound) holds remotely as it does embedded. Errors of
// the transport are coded too: a call that could not reach the server is
// ErrUnavailable, a write whose connection broke after it was sent has the
// code commit_unknown (it may have been applied), and a call whose context ended
// answers an error matching context.Canceled or context.DeadlineExceeded.
//
// Transact, Exec and the Key Groups methods use the transaction and Key
// Groups RPCs of the same service. Every operation of a general
// transaction goes to the dialed node, where its attempt lives. A group's
// transactions (Group(id).Transact and Exec) go to the node that leads the
// group when the client knows it — it learns the group's leader key from a
// CreateGroup it sent, else from one DescribeGroup — where the group's
// state is, so that their reads and commits skip a hop; each attempt lives
// on the node it began on. Against a server older than those RPCs they fail
// with code CodeUnimplemented.
func Dial(addr string, opts ...DialOption) (DB, error) {
	var o dialOptions
	for _, opt := range opts {
		opt(&o)
	}
	if strings.Contains(addr, "://") {
		return nil, kv.Errorf(kv.CodeInvalidArgument, "address %q has a scheme: give host:port, e.g. 127.0.0.1:7070", addr)
	}
	if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
		return nil, kv.Errorf(kv.CodeInvalidArgument, "address %q is not host:port: give e.g. 127.0.0.1:7070", addr)
	}
	creds := insecure.NewCredentials()
	if o.tls != nil {
		creds = credentials.NewTLS(o.tls)
	}
	gopts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(
			grpc.MaxCallRecvMsgSize(api.MaxMessageSize),
			grpc.MaxCallSendMsgSize(api.MaxMessageSize),
			api.CodecCallOption(),
		),
	}
	gopts = append(gopts, o.grpc...)
	// The explicit dns scheme keeps a host such as "localhost" from being
	// read as a URL scheme.
	conn, err := grpc.NewClient("dns:///"+addr, gopts...)
	if err != nil {
		return nil, kv.Errorf(kv.CodeInvalidArgument, "dial %s: %v", addr, err)
	}
	if o.timeout > 0 {
		if err := waitConnected(conn, o.timeout); err != nil {
			_ = conn.Close()
			return nil, kv.Errorf(kv.CodeUnavailable, "dial %s: no connection within %v: check that the server runs and the address is right", addr, o.timeout)
		}
	}
	db := &remoteDB{conn: conn, c: pb.NewGroupKVClient(conn)}
	db.pipe = api.NewPipelineClient(db.c)
	db.txn = api.NewTxnClient(db.c, db.fail)
	db.txn.UsePipeline(db.pipe)
	db.gets.direct, db.gets.batch = db.getOne, db.getMany
	if o.noRouting {
		return db, nil
	}
	return newRoutedDB(db, addr, o), nil
}

// waitConnected connects conn and waits up to timeout for it to be ready.
func waitConnected(conn *grpc.ClientConn, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conn.Connect()
	for {
		s := conn.GetState()
		if s == connectivity.Ready {
			return nil
		}
		if !conn.WaitForStateChange(ctx, s) {
			return ctx.Err()
		}
	}
}

// remoteDB is the DB that Dial returns: each method is one RPC of the
// groupkv.v1.GroupKV service, but Get, Put and Delete, which are messages
// of its Pipeline stream (api.PipelineClient).
type remoteDB struct {
	conn *grpc.ClientConn
	c    pb.GroupKVClient
	// txn is the kv.TxnBackend and kv.GroupBackend of Transact, Exec and
	// the Key Groups methods, over c.
	txn    *api.TxnClient
	closed atomic.Bool
	// gets coalesces concurrent gets (getbatch.go).
	gets getBatcher
	// pipe carries gets, puts, deletes and short scans, and txn's gets
	// and commits (api.PipelineClient).
	pipe *api.PipelineClient
}

var _ DB = (*remoteDB)(nil)

// fail turns the error of an RPC into the error the caller sees. sent says
// whether a write was handed to a connection (the call got a peer): if that
// connection then broke, the server may have applied it. Reads pass false.
func (r *remoteDB) fail(err error, sent bool) error {
	if r.closed.Load() {
		return kv.Errorf(kv.CodeUnavailable, "the DB is closed: Dial again")
	}
	return api.ErrorFromStatus(err, sent)
}

// piped sends req as a message of the pipeline and answers its response,
// with ok true; ok is false when the server has no Pipeline RPC, and req
// must go as a unary RPC. write says whether req writes.
func (r *remoteDB) piped(ctx context.Context, req *pb.PipelineRequest, write bool) (resp *pb.PipelineResponse, ok bool, err error) {
	resp, err = r.pipe.Call(ctx, req, write)
	switch {
	case err == api.ErrPipelineOff, err == api.ErrPipelineNoOp:
		return nil, false, nil
	case err != nil && r.closed.Load():
		return nil, true, kv.Errorf(kv.CodeUnavailable, "the DB is closed: Dial again")
	}
	return resp, true, err
}

func (r *remoteDB) CreateCollection(ctx context.Context, opts CollectionOptions) (CollectionInfo, error) {
	var p peer.Peer
	m, err := r.c.CreateCollection(ctx, api.CollectionOptionsToPB(opts), grpc.Peer(&p))
	if err != nil {
		return CollectionInfo{}, r.fail(err, p.Addr != nil)
	}
	return api.CollectionInfoFromPB(m), nil
}

func (r *remoteDB) ListCollections(ctx context.Context) ([]CollectionInfo, error) {
	m, err := r.c.ListCollections(ctx, &pb.ListCollectionsRequest{})
	if err != nil {
		return nil, r.fail(err, false)
	}
	return api.CollectionInfosFromPB(m), nil
}

func (r *remoteDB) DescribeCollection(ctx context.Context, name string) (CollectionInfo, error) {
	m, err := r.c.DescribeCollection(ctx, &pb.DescribeCollectionRequest{Name: name})
	if err != nil {
		return CollectionInfo{}, r.fail(err, false)
	}
	return api.CollectionInfoFromPB(m), nil
}

func (r *remoteDB) DropCollection(ctx context.Context, name string) error {
	var p peer.Peer
	if _, err := r.c.DropCollection(ctx, &pb.DropCollectionRequest{Name: name}, grpc.Peer(&p)); err != nil {
		return r.fail(err, p.Addr != nil)
	}
	return nil
}

// Put goes as a message of the pipeline, but a large value goes as an RPC
// of its own (api.PipelineMaxValue).
func (r *remoteDB) Put(ctx context.Context, req PutRequest) (uint64, error) {
	if len(req.Value) <= api.PipelineMaxValue {
		if resp, ok, err := r.piped(ctx, &pb.PipelineRequest{Op: &pb.PipelineRequest_Put{Put: api.PutRequestToPB(req)}}, true); ok {
			return resp.GetPut().GetVersion(), err
		}
	}
	var p peer.Peer
	m, err := r.c.Put(ctx, api.PutRequestToPB(req), grpc.Peer(&p))
	if err != nil {
		return 0, r.fail(err, p.Addr != nil)
	}
	return m.GetVersion(), nil
}

// Get goes as a message of the pipeline. Against a server without one, it
// shares a BatchGet with other gets when the connection is busy (see
// getDirectLimit), and a get of an older version goes alone.
func (r *remoteDB) Get(ctx context.Context, req GetRequest) (Record, error) {
	if resp, ok, err := r.piped(ctx, &pb.PipelineRequest{Op: &pb.PipelineRequest_Get{Get: api.GetRequestToPB(req)}}, false); ok {
		if err != nil {
			return Record{}, err
		}
		return api.RecordFromPB(resp.GetGet()), nil
	}
	if req.Version != 0 {
		return r.getOne(ctx, req)
	}
	return r.gets.get(ctx, req)
}

// getMany reads keys in one independent BatchGet: each as Get reads it.
func (r *remoteDB) getMany(ctx context.Context, keys []KeyRef) (BatchGetResult, error) {
	m, err := r.c.BatchGet(ctx, &pb.BatchGetRequest{Keys: api.KeyRefsToPB(keys), Independent: true})
	if err != nil {
		return BatchGetResult{}, r.fail(err, false)
	}
	return api.BatchGetResultFromPB(m), nil
}

// getOne is Get as one RPC.
func (r *remoteDB) getOne(ctx context.Context, req GetRequest) (Record, error) {
	m, err := r.c.Get(ctx, api.GetRequestToPB(req))
	if err != nil {
		return Record{}, r.fail(err, false)
	}
	return api.RecordFromPB(m), nil
}

func (r *remoteDB) Delete(ctx context.Context, req DeleteRequest) (uint64, error) {
	if resp, ok, err := r.piped(ctx, &pb.PipelineRequest{Op: &pb.PipelineRequest_Delete{Delete: api.DeleteRequestToPB(req)}}, true); ok {
		return resp.GetDelete().GetVersion(), err
	}
	var p peer.Peer
	m, err := r.c.Delete(ctx, api.DeleteRequestToPB(req), grpc.Peer(&p))
	if err != nil {
		return 0, r.fail(err, p.Addr != nil)
	}
	return m.GetVersion(), nil
}

func (r *remoteDB) BatchGet(ctx context.Context, keys []KeyRef) (BatchGetResult, error) {
	m, err := r.c.BatchGet(ctx, &pb.BatchGetRequest{Keys: api.KeyRefsToPB(keys)})
	if err != nil {
		return BatchGetResult{}, r.fail(err, false)
	}
	return api.BatchGetResultFromPB(m), nil
}

// BatchPut fails with a *BatchError when the server reports one: the same
// code and message, and the records that were applied.
func (r *remoteDB) BatchPut(ctx context.Context, items []PutItem) ([]WriteResult, error) {
	var p peer.Peer
	m, err := r.c.BatchPut(ctx, api.PutItemsToPB(items), grpc.Peer(&p))
	if err != nil {
		return nil, r.fail(err, p.Addr != nil)
	}
	return api.WriteResultsFromPB(m.GetResults()), nil
}

// BatchDelete fails with a *BatchError like BatchPut.
func (r *remoteDB) BatchDelete(ctx context.Context, keys []KeyRef) ([]WriteResult, error) {
	var p peer.Peer
	m, err := r.c.BatchDelete(ctx, &pb.BatchDeleteRequest{Keys: api.KeyRefsToPB(keys)}, grpc.Peer(&p))
	if err != nil {
		return nil, r.fail(err, p.Addr != nil)
	}
	return api.WriteResultsFromPB(m.GetResults()), nil
}

func (r *remoteDB) DeleteRange(ctx context.Context, req DeleteRangeRequest) (DeleteRangeResult, error) {
	var p peer.Peer
	m, err := r.c.DeleteRange(ctx, api.DeleteRangeRequestToPB(req), grpc.Peer(&p))
	if err != nil {
		return DeleteRangeResult{}, r.fail(err, p.Addr != nil)
	}
	return api.DeleteRangeResultFromPB(m), nil
}

func (r *remoteDB) Scan(ctx context.Context, req ScanRequest) (ScanResult, error) {
	if limit := cmp.Or(req.Limit, kv.DefaultPageSize); limit > 0 && limit <= api.PipelineMaxScan {
		if resp, ok, err := r.piped(ctx, &pb.PipelineRequest{Op: &pb.PipelineRequest_Scan{Scan: api.ScanRequestToPB(req)}}, false); ok {
			if err != nil {
				return ScanResult{}, err
			}
			if r, ok := resp.GetResult().(*pb.PipelineResponse_ScanBytes); ok {
				return api.DecodeScanBytes(r.ScanBytes)
			}
			return api.ScanResultFromPB(resp.GetScan()), nil
		}
	}
	m, err := r.c.Scan(ctx, api.ScanRequestToPB(req))
	if err != nil {
		return ScanResult{}, r.fail(err, false)
	}
	return api.ScanResultFromPB(m), nil
}

func (r *remoteDB) GetByTags(ctx context.Context, q TagQuery) (ScanResult, error) {
	m, err := r.c.GetByTags(ctx, api.TagQueryToPB(q))
	if err != nil {
		return ScanResult{}, r.fail(err, false)
	}
	return api.ScanResultFromPB(m), nil
}

// Watch opens a Watch stream and calls fn with each event it receives, on
// the caller's goroutine, one at a time. It returns
//   - fn's error, untouched, after canceling the stream, when fn fails;
//   - ctx.Err() when ctx ends (or, when the server saw the deadline pass
//     first, an error matching context.DeadlineExceeded under errors.Is);
//   - the server's error, coded like any other (a compacted from-version is
//     ErrCompacted), when the stream ends with one, and ErrUnavailable when
//     the connection breaks;
//   - nil if the server ends the stream without an error, which a groupkv
//     server does not do.
func (r *remoteDB) Watch(ctx context.Context, req WatchRequest, fn func(Event) error) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the stream on every return
	stream, err := r.c.Watch(sctx, api.WatchRequestToPB(req))
	if err != nil {
		return r.watchFail(ctx, err)
	}
	for {
		m, err := stream.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return r.watchFail(ctx, err)
		}
		if err := fn(api.EventFromPB(m)); err != nil {
			return err
		}
	}
}

// watchFail is fail for Watch, which answers the caller's own context error
// as it is.
func (r *remoteDB) watchFail(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return cerr
	}
	return r.fail(err, false)
}

// Ready asks the server whether it serves requests. A server that does not
// answer within readyTimeout is reported as ErrUnavailable.
func (r *remoteDB) Ready() error {
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	if _, err := r.c.Ready(ctx, &pb.ReadyRequest{}); err != nil {
		if ctx.Err() != nil && !r.closed.Load() {
			return kv.Errorf(kv.CodeUnavailable, "no answer to Ready within %v", readyTimeout)
		}
		return r.fail(err, false)
	}
	return nil
}

func (r *remoteDB) Transact(ctx context.Context, fn func(tx *Tx) error, opts ...TxnOption) error {
	if r.closed.Load() {
		return kv.Errorf(kv.CodeUnavailable, "the DB is closed: Dial again")
	}
	return transact(ctx, r.start(""), fn, opts)
}

func (r *remoteDB) Exec(ctx context.Context, req ExecRequest) (ExecResult, error) {
	if r.closed.Load() {
		return ExecResult{}, kv.Errorf(kv.CodeUnavailable, "the DB is closed: Dial again")
	}
	return execTxn(ctx, r.txn, req)
}

func (r *remoteDB) CreateGroup(ctx context.Context, spec GroupSpec) (GroupCreated, error) {
	if r.closed.Load() {
		return GroupCreated{}, errClosed()
	}
	return r.txn.CreateGroup(ctx, spec)
}

func (r *remoteDB) DescribeGroup(ctx context.Context, id string) (GroupInfo, error) {
	if r.closed.Load() {
		return GroupInfo{}, errClosed()
	}
	return r.txn.DescribeGroup(ctx, id)
}

func (r *remoteDB) ListGroups(ctx context.Context) ([]GroupInfo, error) {
	if r.closed.Load() {
		return nil, errClosed()
	}
	return r.txn.ListGroups(ctx)
}

func (r *remoteDB) DeleteGroup(ctx context.Context, id string) error {
	if r.closed.Load() {
		return errClosed()
	}
	return r.txn.DeleteGroup(ctx, id)
}

// start starts the attempts of the transactions of group (a general
// transaction when ""): api.TxnAttempt, which its first request begins.
func (r *remoteDB) start(group string) startFunc {
	return func(_ context.Context, opts kv.TxnOptions) (txnAttempt, error) {
		return r.txn.NewAttempt(group, opts), nil
	}
}

// Group returns a handle whose transactions run on the dialed node, like
// Transact.
func (r *remoteDB) Group(id string) *Group {
	return &Group{id: id, backends: func() (kv.TxnBackend, kv.GroupBackend, error) {
		if r.closed.Load() {
			return nil, nil, errClosed()
		}
		return r.txn, r.txn, nil
	}, start: r.start}
}

// errClosed is the error of a call on a closed DB.
func errClosed() error { return kv.Errorf(kv.CodeUnavailable, "the DB is closed: Dial again") }

// Close closes the connection. Calls in flight fail, and so does every call
// after it; a second Close does nothing.
func (r *remoteDB) Close() error {
	if r.closed.Swap(true) {
		return nil
	}
	r.pipe.Close()
	return r.conn.Close()
}
