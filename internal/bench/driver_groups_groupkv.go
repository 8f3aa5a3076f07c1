package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	groupkv "github.com/groupkv/groupkv"
)

// GroupKVGroups drives groupkv's Key Groups through its Go client: the
// groups' creation and deletion, their transactions (DB.Group(id).Transact)
// and the plain gets and puts of the ungrouped mode. Given several nodes'
// addresses it holds one client per node, and client i of a run sends all
// its requests, those of its groups included, to node i mod n.
type GroupKVGroups struct {
	dbs  []groupkv.DB
	own  bool // Close closes dbs
	opts DriverOptions
	// metrics are the nodes' Prometheus endpoints (remote only).
	metrics []string
}

var _ GroupsDriver = (*GroupKVGroups)(nil)

// OpenGroupKVGroups dials the groupkv servers at addr (host:port, or
// several comma-separated): everything goes over gRPC, the groups and their
// transactions through the Key Groups and transaction RPCs.
func OpenGroupKVGroups(ctx context.Context, addr string, opts DriverOptions) (*GroupKVGroups, error) {
	opts.EnsureDefaults()
	addrs := SplitAddrs(addr)
	if len(addrs) == 0 {
		addrs = []string{addr} // Dial reports the bad address
	}
	g := &GroupKVGroups{own: true, opts: opts}
	for _, a := range addrs {
		db, err := groupkv.Dial(a, opts.dialOptions()...)
		if err != nil {
			g.Close()
			return nil, err
		}
		g.dbs = append(g.dbs, db)
	}
	g.metrics = metricsURLs(addrs, opts.TLS != nil)
	return g, nil
}

// ServerCPU implements CPUMeter: the nodes' process_cpu_seconds_total.
func (g *GroupKVGroups) ServerCPU(ctx context.Context) (time.Duration, error) {
	return serverCPU(ctx, g.metrics, g.opts.TLS)
}

// OpenGroupKVGroupsEmbedded opens a groupkv node in this process on the
// data directory dir (groupkv.Open) and drives it: no network, no
// encoding. Close closes the node.
func OpenGroupKVGroupsEmbedded(ctx context.Context, dir string, opts DriverOptions) (*GroupKVGroups, error) {
	opts.EnsureDefaults()
	db, err := groupkv.Open(dir)
	if err != nil {
		return nil, err
	}
	return &GroupKVGroups{dbs: []groupkv.DB{db}, own: true, opts: opts}, nil
}

// NewGroupKVGroups drives db, which the caller keeps and closes (Close
// does not).
func NewGroupKVGroups(db groupkv.DB, opts DriverOptions) *GroupKVGroups {
	opts.EnsureDefaults()
	return &GroupKVGroups{dbs: []groupkv.DB{db}, opts: opts}
}

// dbFor answers the client that serves a call on ctx (see spread).
func (g *GroupKVGroups) dbFor(ctx context.Context) groupkv.DB {
	return g.dbs[spread(ctx, len(g.dbs))]
}

func (g *GroupKVGroups) System() string { return "groupkv" }

// Version is the build of this binary (see BuildVersion).
func (g *GroupKVGroups) Version(ctx context.Context) (string, error) { return BuildVersion(), nil }

func (g *GroupKVGroups) Reset(ctx context.Context) error {
	ids, err := g.Groups(ctx)
	if err != nil {
		return err
	}
	for _, id := range ids {
		if err := g.dbs[0].DeleteGroup(ctx, id); err != nil && !errors.Is(err, groupkv.ErrNotFound) {
			return fmt.Errorf("deleting group %s left by a previous run: %w", id, err)
		}
	}
	db := g.dbs[0]
	if err := db.DropCollection(ctx, g.opts.Table); err != nil && !errors.Is(err, groupkv.ErrCollectionNotFound) {
		return fmt.Errorf("dropping collection %q: %w", g.opts.Table, err)
	}
	return createCollection(ctx, db, groupkv.CollectionOptions{Name: g.opts.Table, Partitioning: groupkv.PartitionHash, Shards: g.opts.Shards, Replicas: g.opts.Replicas})
}

func (g *GroupKVGroups) Load(ctx context.Context, keys, values [][]byte) error {
	items := make([]groupkv.PutItem, len(keys))
	for i := range keys {
		items[i] = groupkv.PutItem{Collection: g.opts.Table, Key: keys[i], Value: values[i]}
	}
	_, err := g.dbFor(ctx).BatchPut(ctx, items)
	return err
}

func (g *GroupKVGroups) CreateGroup(ctx context.Context, id string, members [][]byte) error {
	refs := make([]groupkv.KeyRef, len(members))
	for i, k := range members {
		refs[i] = groupkv.KeyRef{Collection: g.opts.Table, Key: k}
	}
	_, err := g.dbFor(ctx).CreateGroup(ctx, groupkv.GroupSpec{ID: id, Leader: refs[0], Members: refs, Mode: groupkv.GroupAtomic})
	if errors.Is(err, groupkv.ErrGroupRefused) {
		return fmt.Errorf("%w: %w", ErrGroupRefused, err)
	}
	return err
}

func (g *GroupKVGroups) DeleteGroup(ctx context.Context, id string) error {
	return g.dbFor(ctx).DeleteGroup(ctx, id)
}

// GroupTransact runs fn in a transaction of group id, with
// groupkv.WithCachedSnapshot unless the options say NoCachedSnapshot: a
// game's client is the only one writing its group, so its moves read the
// snapshot the previous move's commit brought back and cost one round
// trip.
func (g *GroupKVGroups) GroupTransact(ctx context.Context, id string, fn func(ctx context.Context, tx Tx) error) error {
	var opts []groupkv.TxnOption
	if !g.opts.NoCachedSnapshot {
		opts = append(opts, groupkv.WithCachedSnapshot())
	}
	return g.dbFor(ctx).Group(id).Transact(ctx, func(tx *groupkv.Tx) error {
		return fn(ctx, groupkvGroupTx{tx, g.opts.Table})
	}, opts...)
}

// groupkvGroupTx is one attempt of a group transaction.
type groupkvGroupTx struct {
	tx   *groupkv.Tx
	coll string
}

func (t groupkvGroupTx) Get(ctx context.Context, key []byte) ([]byte, bool, error) {
	rec, err := t.tx.Get(ctx, groupkv.GetRequest{Collection: t.coll, Key: key})
	if errors.Is(err, groupkv.ErrNotFound) {
		return nil, false, nil
	}
	return rec.Value, err == nil, err
}

func (t groupkvGroupTx) Put(ctx context.Context, key, value []byte) error {
	return t.tx.Put(ctx, groupkv.PutRequest{Collection: t.coll, Key: key, Value: value})
}

func (g *GroupKVGroups) Plain() Tx { return groupkvGroupsPlain{g} }

// groupkvGroupsPlain reads and writes outside groups and transactions.
type groupkvGroupsPlain struct{ g *GroupKVGroups }

func (p groupkvGroupsPlain) Get(ctx context.Context, key []byte) ([]byte, bool, error) {
	rec, err := p.g.dbFor(ctx).Get(ctx, groupkv.GetRequest{Collection: p.g.opts.Table, Key: key})
	if errors.Is(err, groupkv.ErrNotFound) {
		return nil, false, nil
	}
	return rec.Value, err == nil, err
}

func (p groupkvGroupsPlain) Put(ctx context.Context, key, value []byte) error {
	_, err := p.g.dbFor(ctx).Put(ctx, groupkv.PutRequest{Collection: p.g.opts.Table, Key: key, Value: value})
	return err
}

func (g *GroupKVGroups) Groups(ctx context.Context) ([]string, error) {
	infos, err := g.dbs[0].ListGroups(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing groups: %w", err)
	}
	var ids []string
	for _, in := range infos {
		if in.Leader.Collection == g.opts.Table {
			ids = append(ids, in.ID)
		}
	}
	return ids, nil
}

func (g *GroupKVGroups) Close() error {
	if !g.own {
		return nil
	}
	var errs []error
	for _, db := range g.dbs {
		errs = append(errs, db.Close())
	}
	return errors.Join(errs...)
}
