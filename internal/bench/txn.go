package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"time"
)

// The txn workload measures multi-key transactions: each transaction reads
// TxnWorkload.Ops distinct keys chosen uniformly from a range of Keys keys,
// then writes each back incremented (a read-modify-write of every key it
// read), and is retried until it commits. It counts the attempts each
// commit took. Its "none" mode runs the same reads and writes one by one,
// outside any transaction: the price of transactions is the ratio of the
// two. The key range sets the contention: 64 clients writing 10 keys each
// hardly meet on 10,000,000 keys, and meet all the time on 1,000.

// TxnWorkloadName is the workload's name in results.
const TxnWorkloadName = "txn"

// TxnOp is the name of the workload's operation in results: one committed
// transaction, its retries included (in "none" mode, the same reads and
// writes without a transaction).
const TxnOp = "txn"

// Modes of the txn workload.
const (
	// TxnModeSerializable runs each transaction at the system's
	// serializable isolation, retried until it commits.
	TxnModeSerializable = "serializable"
	// TxnModeNone runs the same operations as plain reads and writes.
	TxnModeNone = "none"
)

// Reads of the txn workload (TxnWorkload.Reads).
const (
	// TxnReadsEach reads the keys of a transaction one request at a time,
	// as an interactive transaction whose next read depends on the last
	// one would.
	TxnReadsEach = "each"
	// TxnReadsBatch reads them all in one request, where the transaction
	// knows its keys up front (BatchReader).
	TxnReadsBatch = "batch"
)

// TxnDriver is a system under test of the txn workload. Every method is safe
// for concurrent use. The driver does not keep the byte slices it is given
// after a call returns.
type TxnDriver interface {
	// System is the system's name in results: "groupkv", "etcd",
	// "postgresql".
	System() string
	// Version describes the server, as well as the system lets a client
	// find out.
	Version(ctx context.Context) (string, error)
	// Reset removes the records a previous run left and prepares an empty
	// table.
	Reset(ctx context.Context) error
	// Load writes records (the load phase), outside any transaction.
	Load(ctx context.Context, keys, values [][]byte) error
	// Transact runs fn in a serializable transaction and commits it. When
	// the system aborts the attempt for a conflict (and only then), it runs
	// fn again in a new attempt, which keeps the first attempt's priority
	// where the system has priorities, until an attempt commits or ctx
	// ends. It answers the number of attempts made. An error fn returns
	// ends the transaction (aborted) without a retry, and is answered.
	Transact(ctx context.Context, fn func(ctx context.Context, tx Tx) error) (attempts int, err error)
	// Plain answers a Tx whose reads and writes are performed at once, each
	// on its own, outside any transaction.
	Plain() Tx
	Close() error
}

// Tx reads and writes within one transaction attempt (or none: see
// TxnDriver.Plain). An error of either method ends the attempt; the
// function given to Transact should answer it unchanged, so that the
// driver can tell a conflict, which it retries, from a failure.
type Tx interface {
	// Get answers the value of key and whether it exists.
	Get(ctx context.Context, key []byte) (value []byte, found bool, err error)
	Put(ctx context.Context, key, value []byte) error
}

// ForUpdateReader is a Tx that can lock a key for its write as it reads
// it (groupkv's Tx.GetForUpdate, SQL's SELECT … FOR UPDATE). The txn
// workload reads through it where a driver's Tx has it, as a user of the
// system would for a read-modify-write; etcd's STM takes no locks, and
// the PostgreSQL driver reads with plain SELECTs under SERIALIZABLE (FOR
// UPDATE on keys taken in random order would deadlock, and each deadlock
// waits deadlock_timeout before it is broken).
type ForUpdateReader interface {
	GetForUpdate(ctx context.Context, key []byte) (value []byte, found bool, err error)
}

// BatchReader is a Tx that reads several keys in one request: groupkv's
// Tx.BatchGetForUpdate (and DB.BatchGet outside transactions), etcd's STM
// Get of several keys (which fetches them all in one Txn), and SQL's
// SELECT … WHERE k = ANY($1). The txn workload reads through it with
// TxnReadsBatch.
type BatchReader interface {
	// GetBatch answers the value of each key and whether it exists, in
	// the order of keys.
	GetBatch(ctx context.Context, keys [][]byte) (values [][]byte, found []bool, err error)
}

// TxnWorkload sizes the txn workload. The zero value of each field means
// its default.
type TxnWorkload struct {
	// Keys is the size of the key range; 0 means 100,000.
	Keys int
	// Ops is the number of distinct keys a transaction reads and then
	// writes; 0 means 10 (10 reads and 10 writes).
	Ops int
	// Mode is TxnModeSerializable (default) or TxnModeNone.
	Mode string
	// Reads is TxnReadsEach (default) or TxnReadsBatch.
	Reads string
	// LoadMax is the largest key range the load phase writes; a larger one
	// is left empty and filled as the workload writes it (a read of an
	// absent key counts as 0). 0 means 1,000,000: loading ten million keys
	// takes longer than a benchmark run on a small machine.
	LoadMax int
}

// EnsureDefaults fills the defaults of zero fields.
func (w *TxnWorkload) EnsureDefaults() {
	if w.Keys == 0 {
		w.Keys = 100_000
	}
	if w.Ops == 0 {
		w.Ops = 10
	}
	if w.Mode == "" {
		w.Mode = TxnModeSerializable
	}
	if w.Reads == "" {
		w.Reads = TxnReadsEach
	}
	if w.LoadMax == 0 {
		w.LoadMax = 1_000_000
	}
}

// Validate reports every problem of w.
func (w TxnWorkload) Validate() error {
	var errs []string
	if w.Ops < 1 {
		errs = append(errs, fmt.Sprintf("operations per transaction %d: need at least 1", w.Ops))
	}
	if w.Keys < w.Ops {
		errs = append(errs, fmt.Sprintf("key range %d: need at least the %d distinct keys of a transaction", w.Keys, w.Ops))
	}
	switch w.Mode {
	case TxnModeSerializable, TxnModeNone:
	default:
		errs = append(errs, fmt.Sprintf("mode %q: use serializable or none", w.Mode))
	}
	switch w.Reads {
	case TxnReadsEach, TxnReadsBatch:
	default:
		errs = append(errs, fmt.Sprintf("reads %q: use each or batch", w.Reads))
	}
	if w.LoadMax < 0 {
		errs = append(errs, fmt.Sprintf("load limit %d is negative", w.LoadMax))
	}
	return joinProblems("txn workload", errs)
}

// Loaded reports whether the load phase writes the key range (else it is
// filled lazily).
func (w TxnWorkload) Loaded() bool { return w.Keys <= w.LoadMax }

// TxnKey is the key of item i of the txn workload's range: "k" and i in
// decimal (scripts/txn.pgbench builds the same keys).
func TxnKey(i uint64) []byte {
	return strconv.AppendUint(append(make([]byte, 0, 24), 'k'), i, 10)
}

// ChooseTxnKeys fills dst with len(dst) distinct items drawn uniformly from
// [0, n), in random order (Floyd's sampling, then a shuffle). It panics if
// len(dst) > n.
func ChooseTxnKeys(r *rand.Rand, n uint64, dst []uint64) {
	k := uint64(len(dst))
	if k > n {
		panic(fmt.Sprintf("bench: %d distinct keys of a range of %d", k, n))
	}
	i := 0
	for j := n - k; j < n; j++ {
		t := r.Uint64N(j + 1)
		if containsUint(dst[:i], t) {
			t = j
		}
		dst[i] = t
		i++
	}
	r.Shuffle(len(dst), func(a, b int) { dst[a], dst[b] = dst[b], dst[a] })
}

func containsUint(s []uint64, x uint64) bool {
	for _, y := range s {
		if y == x {
			return true
		}
	}
	return false
}

// Counter values: the txn workload's values are decimal integers; an absent
// key counts as 0.

// DecodeCounter reads a counter value; an absent key (found false) is 0.
func DecodeCounter(v []byte, found bool) (int64, error) {
	if !found {
		return 0, nil
	}
	n, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %q", ErrBadValue, v)
	}
	return n, nil
}

// EncodeCounter writes a counter value.
func EncodeCounter(n int64) []byte { return strconv.AppendInt(nil, n, 10) }

// ReadModifyWrite reads every key of keys through tx (for update, where tx
// is a ForUpdateReader; with batch, in one request of a BatchReader), then
// writes each back incremented by one: the body of one transaction of the
// workload.
func ReadModifyWrite(ctx context.Context, tx Tx, keys [][]byte, batch bool) error {
	if batch {
		b, ok := tx.(BatchReader)
		if !ok {
			return fmt.Errorf("%w: this system's driver reads no batches", ErrInvalidOptions)
		}
		values, found, err := b.GetBatch(ctx, keys)
		if err != nil {
			return err
		}
		for i, k := range keys {
			n, err := DecodeCounter(values[i], found[i])
			if err != nil {
				return err
			}
			if err := tx.Put(ctx, k, EncodeCounter(n+1)); err != nil {
				return err
			}
		}
		return nil
	}
	get := tx.Get
	if f, ok := tx.(ForUpdateReader); ok {
		get = f.GetForUpdate
	}
	vals := make([]int64, len(keys))
	for i, k := range keys {
		v, found, err := get(ctx, k)
		if err != nil {
			return err
		}
		if vals[i], err = DecodeCounter(v, found); err != nil {
			return err
		}
	}
	for i, k := range keys {
		if err := tx.Put(ctx, k, EncodeCounter(vals[i]+1)); err != nil {
			return err
		}
	}
	return nil
}

// retryBackoff waits before attempt (2 and later) of a transaction: a
// random time up to attempt-1 milliseconds, at most 10, so that attempts
// that collided do not collide again in step. Every driver uses it, so that
// the systems are retried alike.
func retryBackoff(ctx context.Context, attempt int) error {
	if attempt < 2 {
		return ctx.Err()
	}
	d := rand.N(time.Duration(min(attempt-1, 10))*time.Millisecond + 1)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// TxnRunner runs the txn workload against one TxnDriver.
type TxnRunner struct {
	d TxnDriver
	r *Runner // its loop; r.d is nil
}

// NewTxnRunner returns a runner of d with opts (Records, Users, PerUser,
// Distribution and Shards play no part).
func NewTxnRunner(d TxnDriver, opts Options) (*TxnRunner, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.Rate != 0 {
		// Its reports read attempts and rates of closed-loop clients.
		return nil, fmt.Errorf("options: rate %v: the txn workload runs closed-loop clients only", opts.Rate)
	}
	if opts.System == "" {
		opts.System = d.System()
	}
	m, _ := d.(CPUMeter)
	return &TxnRunner{d: d, r: &Runner{opts: opts, meter: m}}, nil
}

// Options are the runner's options, defaults filled.
func (t *TxnRunner) Options() Options { return t.r.opts }

// Load empties the store (TxnDriver.Reset) and, when w.Loaded, writes the
// key range with every value 0, LoadBatch keys per request from Clients
// clients. It answers a nil result when the range is left to be filled
// lazily.
func (t *TxnRunner) Load(ctx context.Context, w TxnWorkload) (*LoadResult, error) {
	w.EnsureDefaults()
	if err := w.Validate(); err != nil {
		return nil, err
	}
	if err := t.d.Reset(ctx); err != nil {
		return nil, fmt.Errorf("resetting %s: %w", t.d.System(), err)
	}
	if !w.Loaded() {
		return nil, nil
	}
	n, b := w.Keys, t.r.opts.LoadBatch
	var next, done atomic.Int64
	stopProgress := t.r.progress(func() Status {
		return Status{Phase: "load", Workload: TxnWorkloadName, Elapsed: time.Duration(done.Load()), Total: time.Duration(n), Ops: done.Load()}
	})
	start := time.Now()
	zero := EncodeCounter(0)
	err := t.r.parallel(ctx, func(ctx context.Context, id int) error {
		for {
			lo := int(next.Add(1)-1) * b
			if lo >= n {
				return nil
			}
			hi := min(lo+b, n)
			keys := make([][]byte, 0, hi-lo)
			values := make([][]byte, 0, hi-lo)
			for k := lo; k < hi; k++ {
				keys = append(keys, TxnKey(uint64(k)))
				values = append(values, zero)
			}
			if err := t.d.Load(ctx, keys, values); err != nil {
				return fmt.Errorf("loading keys %d to %d into %s: %w", lo, hi-1, t.d.System(), err)
			}
			done.Add(int64(hi - lo))
		}
	})
	stopProgress()
	if err != nil {
		return nil, err
	}
	secs := time.Since(start).Seconds()
	return &LoadResult{Records: n, Seconds: secs, RecordsPer: float64(n) / secs}, nil
}

// Run runs w for Warmup then Duration, each client running one
// transaction after the other, and returns what the measured time
// recorded. The store must hold the key range (Load) or, for a range above
// w.LoadMax, have been reset.
func (t *TxnRunner) Run(ctx context.Context, w TxnWorkload) (Result, error) {
	w.EnsureDefaults()
	if err := w.Validate(); err != nil {
		return Result{}, err
	}
	version, err := t.d.Version(ctx)
	if err != nil {
		return Result{}, fmt.Errorf("asking %s for its version: %w", t.d.System(), err)
	}
	var attempts []*AttemptHistogram // one per client
	keyRange := uint64(w.Keys)
	batch := w.Reads == TxnReadsBatch
	res, err := t.r.loop(ctx, TxnWorkloadName, []string{TxnOp}, func(c *client) stepFunc {
		h := &AttemptHistogram{}
		attempts = append(attempts, h)
		items := make([]uint64, w.Ops)
		keys := make([][]byte, w.Ops)
		return func(ctx context.Context) error {
			ChooseTxnKeys(c.rng, keyRange, items)
			for i, it := range items {
				keys[i] = TxnKey(it)
			}
			return c.do(0, func() error {
				if w.Mode == TxnModeNone {
					return ReadModifyWrite(ctx, t.d.Plain(), keys, batch)
				}
				n, err := t.d.Transact(ctx, func(ctx context.Context, tx Tx) error {
					return ReadModifyWrite(ctx, tx, keys, batch)
				})
				if err == nil && c.measuring {
					h.Record(n)
				}
				return err
			})
		}
	})
	if err != nil {
		return Result{}, err
	}
	res.System, res.Version = t.r.system(), version
	res.Params.Distribution = DistUniform
	res.Params.Records = w.Keys
	res.Params.ValueSize = 0
	res.Params.TxnMode, res.Params.TxnOps, res.Params.TxnLazy = w.Mode, w.Ops, !w.Loaded()
	if batch {
		res.Params.TxnReads = w.Reads
	}
	if w.Mode != TxnModeNone {
		var all AttemptHistogram
		for _, h := range attempts {
			all.Merge(h)
		}
		s := all.Stats()
		res.Attempts = &s
	}
	return res, nil
}

// ErrBadValue is a value of the txn workload that is not a decimal integer:
// the table holds records of something else.
var ErrBadValue = errors.New("bench: value is not a counter")
