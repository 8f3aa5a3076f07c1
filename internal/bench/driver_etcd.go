package bench

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Etcd drives etcd through go.etcd.io/etcd/client/v3: linearizable Get,
// Put, a Txn of puts for the load phase, and for scans a ranged Get with a
// limit. Records are the keys "<table>/<key>".
type Etcd struct {
	c        *clientv3.Client
	endpoint string
	prefix   string
	end      string // the end of the prefix's range
}

var _ Driver = (*Etcd)(nil)

// etcdMaxTxnOps is the server's default --max-txn-ops: a load batch may not
// hold more puts.
const etcdMaxTxnOps = 128

// OpenEtcd connects to the etcd member at addr.
func OpenEtcd(ctx context.Context, addr string, opts DriverOptions) (*Etcd, error) {
	opts.EnsureDefaults()
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{"http://" + addr},
		DialTimeout: opts.DialTimeout,
		Context:     ctx,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("connecting to etcd at %s: %w", addr, err)
	}
	prefix := opts.Table + "/"
	return &Etcd{c: c, endpoint: "http://" + addr, prefix: prefix, end: clientv3.GetPrefixRangeEnd(prefix)}, nil
}

func (e *Etcd) System() string { return "etcd" }

func (e *Etcd) Version(ctx context.Context) (string, error) {
	st, err := e.c.Status(ctx, e.endpoint)
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
		if _, err := e.c.Txn(ctx).Then(ops...).Commit(); err != nil {
			return err
		}
		keys, values = keys[n:], values[n:]
	}
	return nil
}

func (e *Etcd) Read(ctx context.Context, key []byte) error {
	resp, err := e.c.Get(ctx, e.key(key))
	if err != nil {
		return err
	}
	if len(resp.Kvs) == 0 {
		return fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	return nil
}

func (e *Etcd) Update(ctx context.Context, key, value []byte) error {
	_, err := e.c.Put(ctx, e.key(key), string(value))
	return err
}

func (e *Etcd) Insert(ctx context.Context, key, value []byte) error {
	return e.Update(ctx, key, value)
}

func (e *Etcd) Scan(ctx context.Context, key []byte, n int) (int, error) {
	resp, err := e.c.Get(ctx, e.key(key), clientv3.WithRange(e.end), clientv3.WithLimit(int64(n)))
	if err != nil {
		return 0, err
	}
	return len(resp.Kvs), nil
}

func (e *Etcd) Close() error { return e.c.Close() }
