package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Etcd drives etcd through go.etcd.io/etcd/client/v3: linearizable Get,
// Put, a Txn of puts for the load phase, and for scans a ranged Get with a
// limit. Records are the keys "<table>/<key>". Given several members'
// addresses it holds one client per member and spreads a run's clients
// over them.
type Etcd struct {
	c         *clientv3.Client   // cs[0]
	cs        []*clientv3.Client // one per endpoint
	endpoints []string
	prefix    string
	end       string // the end of the prefix's range
}

var _ Driver = (*Etcd)(nil)

// etcdMaxTxnOps is the server's default --max-txn-ops: a load batch may not
// hold more puts.
const etcdMaxTxnOps = 128

// OpenEtcd connects to the etcd member at addr. addr may list several
// members of a cluster, comma-separated: the driver connects to each (a
// client whose only endpoint is that member), and client i of a run sends
// its requests to member i mod n, as with groupkv (OpenGroupKV).
func OpenEtcd(ctx context.Context, addr string, opts DriverOptions) (*Etcd, error) {
	opts.EnsureDefaults()
	addrs := SplitAddrs(addr)
	if len(addrs) == 0 {
		addrs = []string{addr}
	}
	prefix := opts.Table + "/"
	e := &Etcd{prefix: prefix, end: clientv3.GetPrefixRangeEnd(prefix)}
	for _, a := range addrs {
		c, err := clientv3.New(clientv3.Config{
			Endpoints:   []string{"http://" + a},
			DialTimeout: opts.DialTimeout,
			Context:     ctx,
			Logger:      zap.NewNop(),
		})
		if err != nil {
			e.Close()
			return nil, fmt.Errorf("connecting to etcd at %s: %w", a, err)
		}
		e.cs = append(e.cs, c)
		e.endpoints = append(e.endpoints, "http://"+a)
	}
	e.c = e.cs[0]
	return e, nil
}

// client answers the client that serves a call on ctx (see spread).
func (e *Etcd) client(ctx context.Context) *clientv3.Client {
	return e.cs[spread(ctx, len(e.cs))]
}

func (e *Etcd) System() string { return "etcd" }

// ServerCPU implements CPUMeter: the members' process_cpu_seconds_total
// (etcd serves /metrics on its client address).
func (e *Etcd) ServerCPU(ctx context.Context) (time.Duration, error) {
	urls := make([]string, len(e.endpoints))
	for i, ep := range e.endpoints {
		urls[i] = ep + "/metrics"
	}
	return serverCPU(ctx, urls, nil)
}

func (e *Etcd) Version(ctx context.Context) (string, error) {
	st, err := e.c.Status(ctx, e.endpoints[0])
	if err != nil {
		return "", err
	}
	return st.Version, nil
}

func (e *Etcd) key(k []byte) string { return e.prefix + string(k) }

func (e *Etcd) Reset(ctx context.Context) error {
	_, err := e.c.Delete(ctx, e.prefix, clientv3.WithPrefix())
	return err
}

func (e *Etcd) Check(ctx context.Context) error {
	resp, err := e.c.Get(ctx, e.prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return err
	}
	if resp.Count == 0 {
		return fmt.Errorf("%w (etcd prefix %q)", ErrNotLoaded, e.prefix)
	}
	return nil
}

func (e *Etcd) Load(ctx context.Context, keys, values [][]byte) error {
	for len(keys) > 0 {
		n := min(len(keys), etcdMaxTxnOps)
		ops := make([]clientv3.Op, n)
		for i := range n {
			ops[i] = clientv3.OpPut(e.key(keys[i]), string(values[i]))
		}
		if _, err := e.client(ctx).Txn(ctx).Then(ops...).Commit(); err != nil {
			return err
		}
		keys, values = keys[n:], values[n:]
	}
	return nil
}

func (e *Etcd) Read(ctx context.Context, key []byte) error {
	resp, err := e.client(ctx).Get(ctx, e.key(key))
	if err != nil {
		return err
	}
	if len(resp.Kvs) == 0 {
		return fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	return nil
}

func (e *Etcd) Update(ctx context.Context, key, value []byte) error {
	_, err := e.client(ctx).Put(ctx, e.key(key), string(value))
	return err
}

func (e *Etcd) Insert(ctx context.Context, key, value []byte) error {
	return e.Update(ctx, key, value)
}

func (e *Etcd) Scan(ctx context.Context, key []byte, n int) (int, error) {
	resp, err := e.client(ctx).Get(ctx, e.key(key), clientv3.WithRange(e.end), clientv3.WithLimit(int64(n)))
	if err != nil {
		return 0, err
	}
	return len(resp.Kvs), nil
}

func (e *Etcd) Close() error {
	var errs []error
	for _, c := range e.cs {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}
