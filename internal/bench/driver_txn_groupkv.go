package bench

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"google.golang.org/grpc"

	groupkv "github.com/groupkv/groupkv"
	"github.com/groupkv/groupkv/internal/api"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/node"
	pb "github.com/groupkv/groupkv/proto/groupkvpb"
)

// PlainKV is the part of a groupkv node that the txn workload's "none" mode
// uses: single-key reads and writes.
type PlainKV interface {
	Get(ctx context.Context, req kv.GetRequest) (kv.Record, error)
	BatchGet(ctx context.Context, keys []kv.KeyRef) (kv.BatchGetResult, error)
	Put(ctx context.Context, req kv.PutRequest) (uint64, error)
}

// GroupKVTxn drives groupkv's interactive transactions through a
// kv.TxnBackend: the gRPC client api.TxnClient of a server
// (OpenGroupKVTxn), or a node in this process (OpenGroupKVEmbedded). Transactions are serializable; an
// attempt aborted by a conflict (txn_aborted) is retried with RetryOf, so
// that it keeps its priority and, by wound-wait, commits in the end.
type GroupKVTxn struct {
	txn              kv.TxnBackend
	plain            PlainKV
	admin            adminDB // Reset and Load
	coll             string
	shards, replicas int
	// closers are closed by Close, in order.
	closers []func() error
	// metrics is the node's Prometheus endpoint (remote only), reached
	// with metricsTLS.
	metrics    []string
	metricsTLS *tls.Config
}

var _ TxnDriver = (*GroupKVTxn)(nil)

// ServerCPU implements CPUMeter: the node's process_cpu_seconds_total.
func (g *GroupKVTxn) ServerCPU(ctx context.Context) (time.Duration, error) {
	return serverCPU(ctx, g.metrics, g.metricsTLS)
}

// NewGroupKVTxn drives the transactions of txn and the plain reads and
// writes of plain (the "none" mode); admin creates the collection and
// loads it. The caller keeps and closes all three.
func NewGroupKVTxn(txn kv.TxnBackend, plain PlainKV, admin adminDB, opts DriverOptions) *GroupKVTxn {
	opts.EnsureDefaults()
	return &GroupKVTxn{txn: txn, plain: plain, admin: admin, coll: opts.Table, shards: opts.Shards, replicas: opts.Replicas}
}

// OpenGroupKVTxn connects to the groupkv server at addr (host:port), over
// gRPC only: the transactions go through the GroupKV service's transaction
// RPCs (api.TxnClient, their gets and commits on its Pipeline stream) on a
// connection to addr, where their attempts live;
// the plain reads and writes of the "none" mode, the collection's creation
// and its loading through the Go client (groupkv.Dial). Each connection
// multiplexes the calls of every client of the run.
func OpenGroupKVTxn(ctx context.Context, addr string, opts DriverOptions) (*GroupKVTxn, error) {
	opts.EnsureDefaults()
	db, err := groupkv.Dial(addr, opts.dialOptions()...)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient("dns:///"+addr,
		grpc.WithTransportCredentials(opts.transportCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(api.MaxMessageSize), grpc.MaxCallSendMsgSize(api.MaxMessageSize), api.CodecCallOption()))
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("connecting to %s: %w", addr, err)
	}
	c := pb.NewGroupKVClient(conn)
	tc := api.NewTxnClient(c, nil)
	pipe := api.NewPipelineClient(c)
	tc.UsePipeline(pipe)
	// The stream's header names what the server serves on it: opened
	// now, the first transactions go on it too. A server without the
	// stream, or older than its header, gets unary RPCs instead (the
	// attempts fall back by themselves): its error is not the run's.
	octx, cancel := context.WithTimeout(ctx, opts.DialTimeout)
	_ = pipe.Open(octx)
	cancel()
	g := NewGroupKVTxn(tc, db, db, opts)
	g.closers = []func() error{func() error { pipe.Close(); return nil }, conn.Close, db.Close}
	g.metrics, g.metricsTLS = metricsURLs([]string{addr}, opts.TLS != nil), opts.TLS
	return g, nil
}

// OpenGroupKVEmbedded opens a groupkv node in this process on the data
// directory dir (created if needed) and drives it directly: no network, no
// encoding. Close closes the node. The node logs warnings and errors to
// stderr.
func OpenGroupKVEmbedded(ctx context.Context, dir string, opts DriverOptions) (*GroupKVTxn, error) {
	opts.EnsureDefaults()
	n, err := node.Open(node.Options{
		DataDir: dir,
		Logger:  slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := n.WaitReady(wctx); err != nil {
		n.Close()
		return nil, err
	}
	g := NewGroupKVTxn(n, n, n, opts)
	g.closers = []func() error{n.Close}
	return g, nil
}

func (g *GroupKVTxn) System() string { return "groupkv" }

// Version is the build of this binary (see BuildVersion).
func (g *GroupKVTxn) Version(ctx context.Context) (string, error) { return BuildVersion(), nil }

func (g *GroupKVTxn) Reset(ctx context.Context) error {
	if err := g.admin.DropCollection(ctx, g.coll); err != nil && !errors.Is(err, groupkv.ErrCollectionNotFound) {
		return fmt.Errorf("dropping collection %q: %w", g.coll, err)
	}
	return createCollection(ctx, g.admin, groupkv.CollectionOptions{Name: g.coll, Partitioning: groupkv.PartitionHash, Shards: g.shards, Replicas: g.replicas})
}

func (g *GroupKVTxn) Load(ctx context.Context, keys, values [][]byte) error {
	items := make([]groupkv.PutItem, len(keys))
	for i := range keys {
		items[i] = groupkv.PutItem{Collection: g.coll, Key: keys[i], Value: values[i]}
	}
	_, err := g.admin.BatchPut(ctx, items)
	return err
}

// Transact runs fn in attempts until one commits. Over gRPC
// (api.TxnClient) an attempt is an api.TxnAttempt, as the Go client's: its
// first request begins it and its puts go with the commit, so a
// transaction of n reads and n writes costs n + 1 round trips; on a
// node in this process, each step is a call of the node.
func (g *GroupKVTxn) Transact(ctx context.Context, fn func(ctx context.Context, tx Tx) error) (int, error) {
	opts := kv.TxnOptions{Isolation: kv.IsolationSerializable}
	for attempt := 1; ; attempt++ {
		if err := retryBackoff(ctx, attempt); err != nil {
			return attempt - 1, err
		}
		a, err := g.start(ctx, opts)
		if err != nil {
			return attempt, err
		}
		err = fn(ctx, groupkvTx{g, a})
		if err == nil {
			if _, err = a.Commit(ctx); err == nil {
				return attempt, nil
			}
		}
		// Aborting a finished or aborted attempt succeeds; this frees the
		// locks of one that failed otherwise.
		_ = a.Abort(context.WithoutCancel(ctx))
		if kv.CodeOf(err) != kv.CodeTxnAborted {
			return attempt, err
		}
		if id := a.ID(); id != "" {
			opts.RetryOf = id
		}
	}
}

// txnAttempt is one attempt of a transaction: an api.TxnAttempt, or
// backendAttempt.
type txnAttempt interface {
	ID() string
	Get(ctx context.Context, ref kv.KeyRef) (kv.Record, bool, error)
	GetForUpdate(ctx context.Context, ref kv.KeyRef) (kv.Record, bool, error)
	BatchGet(ctx context.Context, refs []kv.KeyRef, forUpdate bool) ([]kv.BatchGetItem, error)
	Put(ctx context.Context, item kv.PutItem) error
	Commit(ctx context.Context) (uint64, error)
	Abort(ctx context.Context) error
}

// start starts an attempt with opts.
func (g *GroupKVTxn) start(ctx context.Context, opts kv.TxnOptions) (txnAttempt, error) {
	if tc, ok := g.txn.(*api.TxnClient); ok {
		return tc.NewAttempt("", opts), nil
	}
	id, err := g.txn.BeginTxn(ctx, opts)
	if err != nil {
		return nil, err
	}
	return backendAttempt{g.txn, id}, nil
}

// backendAttempt is an attempt of a kv.TxnBackend, begun.
type backendAttempt struct {
	b  kv.TxnBackend
	id string
}

func (a backendAttempt) ID() string { return a.id }
func (a backendAttempt) Get(ctx context.Context, ref kv.KeyRef) (kv.Record, bool, error) {
	return a.b.TxnGet(ctx, a.id, ref)
}
func (a backendAttempt) GetForUpdate(ctx context.Context, ref kv.KeyRef) (kv.Record, bool, error) {
	return a.b.TxnGetForUpdate(ctx, a.id, ref)
}
func (a backendAttempt) BatchGet(ctx context.Context, refs []kv.KeyRef, forUpdate bool) ([]kv.BatchGetItem, error) {
	return a.b.TxnBatchGet(ctx, a.id, refs, forUpdate)
}
func (a backendAttempt) Put(ctx context.Context, item kv.PutItem) error {
	return a.b.TxnPut(ctx, a.id, item)
}
func (a backendAttempt) Commit(ctx context.Context) (uint64, error) { return a.b.CommitTxn(ctx, a.id) }
func (a backendAttempt) Abort(ctx context.Context) error            { return a.b.AbortTxn(ctx, a.id) }

// groupkvTx is one attempt of a transaction.
type groupkvTx struct {
	g *GroupKVTxn
	a txnAttempt
}

func (t groupkvTx) Get(ctx context.Context, key []byte) ([]byte, bool, error) {
	rec, found, err := t.a.Get(ctx, kv.KeyRef{Collection: t.g.coll, Key: key})
	return rec.Value, found, err
}

// GetForUpdate makes groupkvTx a ForUpdateReader.
func (t groupkvTx) GetForUpdate(ctx context.Context, key []byte) ([]byte, bool, error) {
	rec, found, err := t.a.GetForUpdate(ctx, kv.KeyRef{Collection: t.g.coll, Key: key})
	return rec.Value, found, err
}

// GetBatch makes groupkvTx a BatchReader: the keys read for update in
// one request.
func (t groupkvTx) GetBatch(ctx context.Context, keys [][]byte) ([][]byte, []bool, error) {
	items, err := t.a.BatchGet(ctx, t.g.refs(keys), true)
	return batchValues(items, err)
}

// refs names keys of the benchmark's collection.
func (g *GroupKVTxn) refs(keys [][]byte) []kv.KeyRef {
	refs := make([]kv.KeyRef, len(keys))
	for i, k := range keys {
		refs[i] = kv.KeyRef{Collection: g.coll, Key: k}
	}
	return refs
}

func batchValues(items []kv.BatchGetItem, err error) ([][]byte, []bool, error) {
	if err != nil {
		return nil, nil, err
	}
	values, found := make([][]byte, len(items)), make([]bool, len(items))
	for i, it := range items {
		values[i], found[i] = it.Value, it.Found
	}
	return values, found, nil
}

func (t groupkvTx) Put(ctx context.Context, key, value []byte) error {
	return t.a.Put(ctx, kv.PutItem{Collection: t.g.coll, Key: key, Value: value})
}

func (g *GroupKVTxn) Plain() Tx { return groupkvPlain{g} }

// groupkvPlain reads and writes outside transactions.
type groupkvPlain struct{ g *GroupKVTxn }

func (p groupkvPlain) Get(ctx context.Context, key []byte) ([]byte, bool, error) {
	rec, err := p.g.plain.Get(ctx, kv.GetRequest{Collection: p.g.coll, Key: key})
	if kv.CodeOf(err) == kv.CodeNotFound {
		return nil, false, nil
	}
	return rec.Value, err == nil, err
}

// GetBatch makes groupkvPlain a BatchReader: one batch get.
func (p groupkvPlain) GetBatch(ctx context.Context, keys [][]byte) ([][]byte, []bool, error) {
	res, err := p.g.plain.BatchGet(ctx, p.g.refs(keys))
	return batchValues(res.Items, err)
}

func (p groupkvPlain) Put(ctx context.Context, key, value []byte) error {
	_, err := p.g.plain.Put(ctx, kv.PutRequest{Collection: p.g.coll, Key: key, Value: value})
	return err
}

func (g *GroupKVTxn) Close() error {
	var errs []error
	for _, c := range g.closers {
		errs = append(errs, c())
	}
	return errors.Join(errs...)
}
