package bench

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	groupkv "github.com/groupkv/groupkv"
)

// GroupKV drives groupkv through its Go client: Get, Put, Scan, and
// BatchPut for the load phase. Given several nodes' addresses it holds one
// client per node and spreads a run's clients over them.
type GroupKV struct {
	db   groupkv.DB   // dbs[0]
	dbs  []groupkv.DB // one per address
	own  bool         // Close closes dbs
	opts DriverOptions
	// metrics are the nodes' Prometheus endpoints (remote only).
	metrics []string
}

var _ Driver = (*GroupKV)(nil)

// OpenGroupKV dials the groupkv server at addr over gRPC. addr may list
// several nodes of a cluster, comma-separated ("127.0.0.1:7070,
// 127.0.0.1:7080"): the driver dials each, and client i of a run sends its
// requests to node i mod n.
func OpenGroupKV(ctx context.Context, addr string, opts DriverOptions) (*GroupKV, error) {
	opts.EnsureDefaults()
	addrs := SplitAddrs(addr)
	if len(addrs) == 0 {
		addrs = []string{addr} // Dial reports the bad address
	}
	g := &GroupKV{own: true, opts: opts}
	for _, a := range addrs {
		db, err := groupkv.Dial(a, opts.dialOptions()...)
		if err != nil {
			g.Close()
			return nil, err
		}
		g.dbs = append(g.dbs, db)
	}
	g.db = g.dbs[0]
	g.metrics = metricsURLs(addrs, opts.TLS != nil)
	return g, nil
}

// ServerCPU implements CPUMeter: the nodes' process_cpu_seconds_total.
func (g *GroupKV) ServerCPU(ctx context.Context) (time.Duration, error) {
	return serverCPU(ctx, g.metrics, g.opts.TLS)
}

// NewGroupKV drives db, which the caller keeps and closes (Close does not).
func NewGroupKV(db groupkv.DB, opts DriverOptions) *GroupKV {
	opts.EnsureDefaults()
	return &GroupKV{db: db, dbs: []groupkv.DB{db}, opts: opts}
}

// DB is the client the driver uses (of the first node, given several).
func (g *GroupKV) DB() groupkv.DB { return g.db }

// dbFor answers the client that serves a call on ctx (see spread).
func (g *GroupKV) dbFor(ctx context.Context) groupkv.DB {
	return g.dbs[spread(ctx, len(g.dbs))]
}

func (g *GroupKV) System() string { return "groupkv" }

// Version describes the build of this binary: a groupkv server exposes no
// version, and the benchmark is meant to run from the server's own tree.
func (g *GroupKV) Version(ctx context.Context) (string, error) {
	return BuildVersion(), nil
}

// BuildVersion is the VCS revision this binary was built from ("-dirty"
// when the tree had changes), or "devel" when the build has none.
func BuildVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	rev, dirty := "", false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return "devel"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if dirty {
		rev += "-dirty"
	}
	return rev
}

func (g *GroupKV) Reset(ctx context.Context) error {
	if err := g.db.DropCollection(ctx, g.opts.Table); err != nil && !errors.Is(err, groupkv.ErrCollectionNotFound) {
		return fmt.Errorf("dropping collection %q: %w", g.opts.Table, err)
	}
	return createCollection(ctx, g.db, groupkv.CollectionOptions{Name: g.opts.Table, Partitioning: groupkv.PartitionHash, Shards: g.opts.Shards, Replicas: g.opts.Replicas})
}

// adminDB is what the drivers need to set a collection up: a remote
// groupkv.DB or an embedded node.
type adminDB interface {
	CreateCollection(ctx context.Context, opts groupkv.CollectionOptions) (groupkv.CollectionInfo, error)
	DescribeCollection(ctx context.Context, name string) (groupkv.CollectionInfo, error)
	DropCollection(ctx context.Context, name string) error
	BatchPut(ctx context.Context, items []groupkv.PutItem) ([]groupkv.WriteResult, error)
}

// createCollection creates a collection and waits until every shard of it
// has a leader. A node's CreateCollection can answer unavailable ("shard N
// is not served by this node") although it created the collection, when
// its own reconcile ran on the catalog before the creation was applied; the
// shards start moments later, and this waits for them (up to 30 seconds).
func createCollection(ctx context.Context, db adminDB, opts groupkv.CollectionOptions) error {
	_, err := db.CreateCollection(ctx, opts)
	if err == nil {
		return nil
	}
	if groupkv.CodeOf(err) != groupkv.CodeUnavailable {
		return fmt.Errorf("creating collection %q: %w", opts.Name, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		info, derr := db.DescribeCollection(ctx, opts.Name)
		if derr == nil && len(info.Shards) > 0 {
			led := true
			for _, s := range info.Shards {
				led = led && s.Leader != 0
			}
			if led {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return fmt.Errorf("creating collection %q: %w (and its shards had no leader 30s later)", opts.Name, err)
}

func (g *GroupKV) Check(ctx context.Context) error {
	res, err := g.db.Scan(ctx, groupkv.ScanRequest{Collection: g.opts.Table, Limit: 1})
	if errors.Is(err, groupkv.ErrCollectionNotFound) || (err == nil && len(res.Items) == 0) {
		return fmt.Errorf("%w (groupkv collection %q)", ErrNotLoaded, g.opts.Table)
	}
	return err
}

func (g *GroupKV) Load(ctx context.Context, keys, values [][]byte) error {
	items := make([]groupkv.PutItem, len(keys))
	for i := range keys {
		items[i] = groupkv.PutItem{Collection: g.opts.Table, Key: keys[i], Value: values[i]}
	}
	_, err := g.dbFor(ctx).BatchPut(ctx, items)
	return err
}

func (g *GroupKV) Read(ctx context.Context, key []byte) error {
	_, err := g.dbFor(ctx).Get(ctx, groupkv.GetRequest{Collection: g.opts.Table, Key: key})
	if errors.Is(err, groupkv.ErrNotFound) {
		return fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	return err
}

func (g *GroupKV) Update(ctx context.Context, key, value []byte) error {
	_, err := g.dbFor(ctx).Put(ctx, groupkv.PutRequest{Collection: g.opts.Table, Key: key, Value: value})
	return err
}

func (g *GroupKV) Insert(ctx context.Context, key, value []byte) error {
	return g.Update(ctx, key, value)
}

func (g *GroupKV) Scan(ctx context.Context, key []byte, n int) (int, error) {
	res, err := g.dbFor(ctx).Scan(ctx, groupkv.ScanRequest{Collection: g.opts.Table, Start: key, Limit: n})
	return len(res.Items), err
}

func (g *GroupKV) Close() error {
	if !g.own {
		return nil
	}
	var errs []error
	for _, db := range g.dbs {
		errs = append(errs, db.Close())
	}
	return errors.Join(errs...)
}
