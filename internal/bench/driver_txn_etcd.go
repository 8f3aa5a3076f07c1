package bench

import (
	"context"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// EtcdTxn drives etcd's software transactional memory: each transaction
// runs in concurrency.NewSTM with concurrency.Serializable isolation (reads
// of an attempt see the revision of its first read; the commit is an etcd
// Txn that succeeds only if no key read has changed since, and puts its
// writes). The STM retries an attempt whose commit failed; etcd has no
// priorities, so a retry is a fresh attempt. Records are the keys
// "<table>/<key>", as Etcd's.
type EtcdTxn struct {
	*Etcd
}

var _ TxnDriver = (*EtcdTxn)(nil)

// OpenEtcdTxn connects to the etcd member(s) at addr, as OpenEtcd.
func OpenEtcdTxn(ctx context.Context, addr string, opts DriverOptions) (*EtcdTxn, error) {
	e, err := OpenEtcd(ctx, addr, opts)
	if err != nil {
		return nil, err
	}
	return &EtcdTxn{e}, nil
}

func (e *EtcdTxn) Transact(ctx context.Context, fn func(ctx context.Context, tx Tx) error) (int, error) {
	attempts := 0
	_, err := concurrency.NewSTM(e.client(ctx), func(s concurrency.STM) error {
		attempts++
		if err := retryBackoff(ctx, attempts); err != nil {
			return err
		}
		return fn(ctx, etcdTx{e.Etcd, s})
	}, concurrency.WithIsolation(concurrency.Serializable), concurrency.WithAbortContext(ctx))
	return attempts, err
}

// etcdTx is one STM attempt. The STM's Get answers "" for an absent key
// (and panics out of the attempt on an error, which NewSTM answers); the
// workload writes no empty values, so "" means absent.
type etcdTx struct {
	e *Etcd
	s concurrency.STM
}

func (t etcdTx) Get(ctx context.Context, key []byte) ([]byte, bool, error) {
	v := t.s.Get(t.e.key(key))
	return []byte(v), v != "", nil
}

// GetBatch makes etcdTx a BatchReader: the STM's Get of several keys
// fetches them all in one Txn (and answers the first), after which a Get
// of each is answered from the attempt's read set.
func (t etcdTx) GetBatch(ctx context.Context, keys [][]byte) ([][]byte, []bool, error) {
	names := make([]string, len(keys))
	for i, k := range keys {
		names[i] = t.e.key(k)
	}
	t.s.Get(names...)
	values, found := make([][]byte, len(keys)), make([]bool, len(keys))
	for i, name := range names {
		v := t.s.Get(name)
		values[i], found[i] = []byte(v), v != ""
	}
	return values, found, nil
}

func (t etcdTx) Put(ctx context.Context, key, value []byte) error {
	t.s.Put(t.e.key(key), string(value))
	return nil
}

func (e *EtcdTxn) Plain() Tx { return etcdPlain{e.Etcd} }

// etcdPlain reads (linearizable) and writes outside transactions.
type etcdPlain struct{ e *Etcd }

func (p etcdPlain) Get(ctx context.Context, key []byte) ([]byte, bool, error) {
	resp, err := p.e.client(ctx).Get(ctx, p.e.key(key))
	if err != nil || len(resp.Kvs) == 0 {
		return nil, false, err
	}
	return resp.Kvs[0].Value, true, nil
}

// GetBatch makes etcdPlain a BatchReader: one Txn of the gets.
func (p etcdPlain) GetBatch(ctx context.Context, keys [][]byte) ([][]byte, []bool, error) {
	ops := make([]clientv3.Op, len(keys))
	for i, k := range keys {
		ops[i] = clientv3.OpGet(p.e.key(k))
	}
	resp, err := p.e.client(ctx).Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, nil, err
	}
	values, found := make([][]byte, len(keys)), make([]bool, len(keys))
	for i, r := range resp.Responses {
		if kvs := r.GetResponseRange().GetKvs(); len(kvs) > 0 {
			values[i], found[i] = kvs[0].Value, true
		}
	}
	return values, found, nil
}

func (p etcdPlain) Put(ctx context.Context, key, value []byte) error {
	_, err := p.e.client(ctx).Put(ctx, p.e.key(key), string(value))
	return err
}
