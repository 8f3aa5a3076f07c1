package groupkv

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
)

// Transactions.
//
// DB.Transact runs a function in a transaction and retries it until it
// commits:
//
//	err := db.Transact(ctx, func(tx *groupkv.Tx) error {
//		rec, err := tx.Get(ctx, groupkv.GetRequest{Collection: "accounts", Key: []byte("a")})
//		if err != nil {
//			return err // ErrNotFound when absent; a txn_aborted error is retried
//		}
//		...
//		return tx.Put(ctx, groupkv.PutRequest{Collection: "accounts", Key: []byte("b"), Value: v})
//	})
//
// DB.Exec runs a one-shot compare-and-operate transaction in one call.

// Shared transaction types; see their documentation in the kv package.
type (
	Isolation   = kv.Isolation
	Compare     = kv.Compare
	TxnOp       = kv.TxnOp
	TxnOpResult = kv.TxnOpResult
	ExecRequest = kv.ExecRequest
	ExecResult  = kv.ExecResult
)

// Isolation levels.
const (
	// Serializable is strict serializability, the default. A retried
	// serializable transaction keeps its priority and commits in the end.
	Serializable = kv.IsolationSerializable
	// Snapshot reads at the transaction's start without read locks; of two
	// concurrent transactions writing one key the first to commit wins.
	// Transact retries the loser too, but a snapshot transaction is not
	// promised to commit in the end: bound it with the context.
	Snapshot = kv.IsolationSnapshot
)

// Operations of a one-shot transaction (TxnOp.Op).
const (
	TxnOpGet    = kv.TxnOpGet
	TxnOpPut    = kv.TxnOpPut
	TxnOpDelete = kv.TxnOpDelete
)

// TxnOption configures Transact.
type TxnOption func(*kv.TxnOptions)

// WithIsolation sets the isolation level, Serializable by default.
func WithIsolation(iso Isolation) TxnOption {
	return func(o *kv.TxnOptions) { o.Isolation = iso }
}

// ReadOnly makes a transaction that reads at a snapshot and takes no locks;
// a write in it fails with an invalid_argument error.
func ReadOnly() TxnOption {
	return func(o *kv.TxnOptions) { o.ReadOnly = true }
}

// WithCachedSnapshot lets a group transaction (Group.Transact) of a
// remote DB read from the snapshot of the group that the DB kept from its
// last such transaction of the group: each commit brings back the group's
// snapshot as its leader holds it once the commit applied, and the next
// transaction answers its reads of members from it and sends only its
// commit, which names those reads with their versions. The group's leader
// validates them as it validates any read, and does so even for a
// transaction that wrote nothing; one that read a member changed since
// fails validation and runs again on a fresh snapshot (as a transaction
// of the group that fails validation does). A transaction that reads and
// writes members of a group that no other client writes in between costs
// one round trip instead of two; one that reads only may run again, which
// it never does without the option. A transaction that must ask the
// server anything before its commit (a get of a key that is not a member,
// a scan, writes too large to keep) runs again without the snapshot. It
// changes nothing for an embedded DB, nor for DB.Transact.
func WithCachedSnapshot() TxnOption {
	return func(o *kv.TxnOptions) { o.CachedSnapshot = true }
}

// Errors of transactions.
var (
	// ErrTxnAborted matches the error of an operation of an attempt that
	// was aborted (code txn_aborted). Transact retries such attempts; it
	// reaches callers of Transact only through a *TxnContextError.
	ErrTxnAborted = &kv.Error{Code: kv.CodeTxnAborted}
	// ErrCommitUnknown matches an error whose operation may or may not
	// have been applied (code commit_unknown), and every
	// *CommitUnknownError.
	ErrCommitUnknown = kv.ErrCommitUnknown
	// ErrTxnEnded is the error of an operation on a Tx whose attempt is
	// over: its function returned. Use the Tx of the current call.
	ErrTxnEnded = kv.Errorf(kv.CodeInvalidArgument, "groupkv: the transaction attempt of this Tx is over: use the Tx passed to the current call of the function")
)

// TxnContextError is the error of a Transact whose context ended before
// the transaction committed: nothing of it was applied. errors.Is(err,
// context.Canceled) or context.DeadlineExceeded holds, as the context says.
type TxnContextError struct {
	// Txn is the id of the last attempt that reached the server, aborted;
	// "" if none did. (A remote DB begins an attempt with its first
	// request, so an attempt whose function sent nothing has no id.)
	Txn string
	// Attempts is the number of attempts begun.
	Attempts int
	// Err is the context's error.
	Err error
	// Last is the error that aborted the last attempt that ended before
	// the context (a conflict, its deadline, ...); nil if none did.
	Last error
}

func (e *TxnContextError) Error() string {
	if e.Last != nil {
		return fmt.Sprintf("groupkv: transaction abandoned after %d attempts, none committed: %v (the last attempt that ended: %v)", e.Attempts, e.Err, e.Last)
	}
	return fmt.Sprintf("groupkv: transaction abandoned after %d attempts, none committed: %v", e.Attempts, e.Err)
}

func (e *TxnContextError) Unwrap() error { return e.Err }

// CommitUnknownError is the error of a Transact whose commit may or may not
// have been applied: the server said so (code commit_unknown), or the
// connection broke or the context ended while the commit was under way.
// Transact does not retry it: the caller must find out, by reading what
// the transaction wrote, before doing it again. errors.Is(err,
// ErrCommitUnknown) holds, and errors.Is(err, context.Canceled) and
// context.DeadlineExceeded do when the context ended.
type CommitUnknownError struct {
	// Txn is the id of the attempt whose commit is in doubt; "" when the
	// commit was the attempt's first request and its answer was lost.
	Txn string
	// Err is the commit's error; its code is commit_unknown.
	Err error
}

func (e *CommitUnknownError) Error() string {
	return fmt.Sprintf("groupkv: the commit of transaction %s may or may not have been applied: %v", e.Txn, e.Err)
}

func (e *CommitUnknownError) Unwrap() error { return e.Err }

// Tx is one attempt of a transaction, given to the function of Transact.
// Its reads see its own writes; its writes are applied at commit, all or
// none. A Tx is valid only during the call it was given to, and its
// methods may be called from several goroutines.
//
// After an operation answers an error, the attempt's state is unknown to
// the function: return that error (Transact decides whether to retry)
// rather than go on. Once an operation answered ErrTxnAborted, every later
// one answers it too without asking the server.
//
// On a remote DB (Dial), a Tx saves round trips: its first request to the
// server begins the attempt; Put and Delete are checked at once (a bad
// key, collection name or tags, a write in a read-only transaction, fail
// there as they would on the server) and kept in the client, which
// answers a Get of a key written from them; they are sent with the commit,
// or before a Scan or GetByTags. So an error the server finds in a write
// (an unknown collection, too many operations, a key of a key group, a
// conflict) is answered by the commit, or by the Scan or GetByTags that
// sent it, rather than by the Put.
type Tx struct {
	a txnAttempt

	mu struct {
		sync.Mutex
		// aborted is the txn_aborted error an operation answered.
		aborted error
		// keyInGroup is the first key_in_group error an operation
		// answered: the transaction touched a key of a key group, and
		// running it again would meet the group again.
		keyInGroup error
		// ended is set when the function returned.
		ended bool
		// ctxFailed is set when an operation failed after its context
		// ended.
		ctxFailed bool
	}
}

// ID returns the id of the attempt. On a remote DB, an attempt that has
// sent nothing yet is begun by ID (one round trip, bounded by
// idBeginTimeout); ID answers "" if that fails.
func (tx *Tx) ID() string {
	if id := tx.a.ID(); id != "" {
		return id
	}
	ctx, cancel := context.WithTimeout(context.Background(), idBeginTimeout)
	defer cancel()
	id, _ := tx.a.Begin(ctx)
	return id
}

// idBeginTimeout bounds the begin that Tx.ID sends.
const idBeginTimeout = 10 * time.Second

// txnAttempt is the attempt a Tx runs in: backendAttempt calls a
// kv.TxnBackend, begun before the function runs (an embedded DB);
// *api.TxnAttempt sends the RPCs of a remote DB, begun by its first
// request. Get answers a found record with its key.
type txnAttempt interface {
	// ID answers the attempt's id, "" while it is not begun.
	ID() string
	// Begin begins the attempt if it is not, and answers its id.
	Begin(ctx context.Context) (string, error)
	Get(ctx context.Context, ref kv.KeyRef) (kv.Record, bool, error)
	GetForUpdate(ctx context.Context, ref kv.KeyRef) (kv.Record, bool, error)
	BatchGet(ctx context.Context, refs []kv.KeyRef, forUpdate bool) ([]kv.BatchGetItem, error)
	Put(ctx context.Context, item kv.PutItem) error
	Delete(ctx context.Context, ref kv.KeyRef) error
	Scan(ctx context.Context, req kv.ScanRequest) (kv.ScanResult, error)
	GetByTags(ctx context.Context, q kv.TagQuery) (kv.ScanResult, error)
	Commit(ctx context.Context) (uint64, error)
	// Abort aborts the attempt, if it is begun.
	Abort(ctx context.Context) error
}

// backendAttempt is an attempt of a kv.TxnBackend, begun.
type backendAttempt struct {
	b  kv.TxnBackend
	id string
}

func (a *backendAttempt) ID() string                            { return a.id }
func (a *backendAttempt) Begin(context.Context) (string, error) { return a.id, nil }
func (a *backendAttempt) Get(ctx context.Context, ref kv.KeyRef) (kv.Record, bool, error) {
	return a.b.TxnGet(ctx, a.id, ref)
}
func (a *backendAttempt) GetForUpdate(ctx context.Context, ref kv.KeyRef) (kv.Record, bool, error) {
	return a.b.TxnGetForUpdate(ctx, a.id, ref)
}
func (a *backendAttempt) BatchGet(ctx context.Context, refs []kv.KeyRef, forUpdate bool) ([]kv.BatchGetItem, error) {
	return a.b.TxnBatchGet(ctx, a.id, refs, forUpdate)
}
func (a *backendAttempt) Put(ctx context.Context, item kv.PutItem) error {
	return a.b.TxnPut(ctx, a.id, item)
}
func (a *backendAttempt) Delete(ctx context.Context, ref kv.KeyRef) error {
	return a.b.TxnDelete(ctx, a.id, ref)
}
func (a *backendAttempt) Scan(ctx context.Context, req kv.ScanRequest) (kv.ScanResult, error) {
	return a.b.TxnScan(ctx, a.id, req)
}
func (a *backendAttempt) GetByTags(ctx context.Context, q kv.TagQuery) (kv.ScanResult, error) {
	return a.b.TxnGetByTags(ctx, a.id, q)
}
func (a *backendAttempt) Commit(ctx context.Context) (uint64, error) {
	return a.b.CommitTxn(ctx, a.id)
}
func (a *backendAttempt) Abort(ctx context.Context) error { return a.b.AbortTxn(ctx, a.id) }

// begin checks that an operation may be sent.
func (tx *Tx) begin() error {
	tx.mu.Lock()
	defer tx.mu.Unlock()
	switch {
	case tx.mu.ended:
		return ErrTxnEnded
	case tx.mu.aborted != nil:
		return tx.mu.aborted
	}
	return nil
}

// done notes the outcome of an operation.
func (tx *Tx) done(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	tx.mu.Lock()
	defer tx.mu.Unlock()
	switch kv.CodeOf(err) {
	case kv.CodeTxnAborted:
		if tx.mu.aborted == nil {
			tx.mu.aborted = err
		}
	case kv.CodeKeyInGroup:
		if tx.mu.keyInGroup == nil {
			tx.mu.keyInGroup = err
		}
	}
	if ctxEnded(ctx) {
		tx.mu.ctxFailed = true
	}
	return err
}

// Get reads a key as the transaction sees it, its own writes included. It
// answers an ErrNotFound-coded error when the key is absent, as DB.Get
// does. req.Version must be 0: a transaction reads at its own time.
func (tx *Tx) Get(ctx context.Context, req GetRequest) (Record, error) {
	return tx.get(ctx, req, tx.a.Get)
}

// GetForUpdate reads a key as Get does and, in a serializable
// transaction, locks it exclusively at once, as a write of it would at
// commit. It is the read of a read-modify-write: two transactions that
// update one key then queue at the read (the younger waits for the
// older) instead of both reading it and one being wounded, and run again,
// when it writes. A snapshot transaction reads as Get does (its writes
// conflict at commit); a read-only one refuses it.
func (tx *Tx) GetForUpdate(ctx context.Context, req GetRequest) (Record, error) {
	return tx.get(ctx, req, tx.a.GetForUpdate)
}

func (tx *Tx) get(ctx context.Context, req GetRequest, read func(context.Context, kv.KeyRef) (kv.Record, bool, error)) (Record, error) {
	if err := tx.begin(); err != nil {
		return Record{}, err
	}
	if req.Version != 0 {
		return Record{}, kv.Errorf(kv.CodeInvalidArgument, "a transaction reads at its own time: leave GetRequest.Version 0")
	}
	rec, found, err := read(ctx, kv.KeyRef{Collection: req.Collection, Key: req.Key})
	if err = tx.done(ctx, err); err != nil {
		return Record{}, err
	}
	if !found {
		return Record{}, kv.Errorf(kv.CodeNotFound, "key %q of collection %q is absent", clipKey(req.Key), req.Collection)
	}
	return rec, nil
}

// BatchGet reads keys as the transaction sees them, each as Get would
// read it alone, in one request: a remote DB sends one message for the
// keys it did not write (Get sends one per key), and the node locks the
// keys of each shard at once and reads them all before it confirms the
// attempt once. The items answer keys in order, each with its own
// version (0 for a key the transaction wrote), Found false for an absent
// key; there is no ErrNotFound. At most 1000 keys.
func (tx *Tx) BatchGet(ctx context.Context, keys []KeyRef) ([]BatchGetItem, error) {
	return tx.batchGet(ctx, keys, false)
}

// BatchGetForUpdate reads keys as BatchGet does, locking each as
// GetForUpdate does.
func (tx *Tx) BatchGetForUpdate(ctx context.Context, keys []KeyRef) ([]BatchGetItem, error) {
	return tx.batchGet(ctx, keys, true)
}

func (tx *Tx) batchGet(ctx context.Context, keys []KeyRef, forUpdate bool) ([]BatchGetItem, error) {
	if err := tx.begin(); err != nil {
		return nil, err
	}
	if len(keys) == 0 {
		return []BatchGetItem{}, nil
	}
	items, err := tx.a.BatchGet(ctx, keys, forUpdate)
	if err = tx.done(ctx, err); err != nil {
		return nil, err
	}
	return items, nil
}

// Put writes a record in the transaction. req.IfVersion must be nil: read
// the key in the transaction and compare instead.
func (tx *Tx) Put(ctx context.Context, req PutRequest) error {
	if err := tx.begin(); err != nil {
		return err
	}
	if req.IfVersion != nil {
		return kv.Errorf(kv.CodeInvalidArgument, "a transaction's put takes no IfVersion: read the key in the transaction and compare its version")
	}
	item := kv.PutItem{Collection: req.Collection, Key: req.Key, Value: req.Value, Tags: req.Tags}
	return tx.done(ctx, tx.a.Put(ctx, item))
}

// Delete deletes a key in the transaction; deleting an absent key is no
// error. req.IfVersion must be nil, as for Put.
func (tx *Tx) Delete(ctx context.Context, req DeleteRequest) error {
	if err := tx.begin(); err != nil {
		return err
	}
	if req.IfVersion != nil {
		return kv.Errorf(kv.CodeInvalidArgument, "a transaction's delete takes no IfVersion: read the key in the transaction and compare its version")
	}
	return tx.done(ctx, tx.a.Delete(ctx, kv.KeyRef{Collection: req.Collection, Key: req.Key}))
}

// Scan reads one page of a range as the transaction sees it. req.Version
// must be 0.
func (tx *Tx) Scan(ctx context.Context, req ScanRequest) (ScanResult, error) {
	if err := tx.begin(); err != nil {
		return ScanResult{}, err
	}
	if req.Version != 0 {
		return ScanResult{}, kv.Errorf(kv.CodeInvalidArgument, "a transaction reads at its own time: leave ScanRequest.Version 0")
	}
	res, err := tx.a.Scan(ctx, req)
	return res, tx.done(ctx, err)
}

// GetByTags reads one page of the records carrying the tags, as the
// transaction sees them. q.Version must be 0.
func (tx *Tx) GetByTags(ctx context.Context, q TagQuery) (ScanResult, error) {
	if err := tx.begin(); err != nil {
		return ScanResult{}, err
	}
	if q.Version != 0 {
		return ScanResult{}, kv.Errorf(kv.CodeInvalidArgument, "a transaction reads at its own time: leave TagQuery.Version 0")
	}
	res, err := tx.a.GetByTags(ctx, q)
	return res, tx.done(ctx, err)
}

// end closes the attempt to further operations and answers what its
// operations saw.
func (tx *Tx) end() (aborted, keyInGroup error, ctxFailed bool) {
	tx.mu.Lock()
	defer tx.mu.Unlock()
	tx.mu.ended = true
	return tx.mu.aborted, tx.mu.keyInGroup, tx.mu.ctxFailed
}

// abortTimeout bounds the abort Transact sends for an attempt it gives up:
// the abort only frees locks early (the server expires them anyway), so it
// is not worth holding the caller up for long.
const abortTimeout = 5 * time.Second

// beginFunc begins an attempt: kv.TxnBackend.BeginTxn, or
// kv.GroupBackend.BeginGroupTxn for a group.
type beginFunc func(ctx context.Context, opts kv.TxnOptions) (string, error)

// startFunc starts an attempt of a transaction with opts: begins it on a
// backend (backendStart), or makes a remote one that its first request
// begins.
type startFunc func(ctx context.Context, opts kv.TxnOptions) (txnAttempt, error)

// backendStart starts the attempts of b, each begun by begin before the
// function runs.
func backendStart(b kv.TxnBackend, begin beginFunc) startFunc {
	return func(ctx context.Context, opts kv.TxnOptions) (txnAttempt, error) {
		id, err := begin(ctx, opts)
		if err != nil {
			return nil, err
		}
		return &backendAttempt{b: b, id: id}, nil
	}
}

// transact runs fn in attempts of one transaction, each started by start,
// until one commits; see DB.Transact.
func transact(ctx context.Context, start startFunc, fn func(*Tx) error, opts []TxnOption) error {
	var o kv.TxnOptions
	for _, opt := range opts {
		opt(&o)
	}
	if o.Isolation == "" {
		o.Isolation = kv.IsolationSerializable
	}
	attempts := 0
	retryOf := ""
	var last error // what aborted the last attempt that ended
	ctxErr := func() error {
		return &TxnContextError{Txn: retryOf, Attempts: attempts, Err: ctxError(ctx), Last: last}
	}
	for {
		if ctxEnded(ctx) {
			return ctxErr()
		}
		if attempts > 0 {
			t := time.NewTimer(txnBackoff(attempts))
			select {
			case <-ctx.Done():
				t.Stop()
				return ctxErr()
			case <-t.C:
			}
		}
		bo := o
		bo.RetryOf = retryOf
		a, err := start(ctx, bo)
		if err != nil {
			if ctxEnded(ctx) {
				return ctxErr()
			}
			return err
		}
		attempts++
		tx := &Tx{a: a}
		ferr := runAttempt(ctx, tx, fn)
		aborted, keyInGroup, ctxFailed := tx.end()
		// noteID keeps the attempt's id for the next attempt's retry_of
		// (and the errors), if it reached the server; a remote attempt
		// that did not has none, and the next one retries the same.
		noteID := func() {
			if id := a.ID(); id != "" {
				retryOf = id
			}
		}
		switch {
		case keyInGroup != nil && !ctxEnded(ctx):
			// A key of the transaction belongs to a key group: another
			// attempt would meet it again. The attempt is given up, even
			// if it was aborted or fn went on and returned nil.
			if aborted == nil {
				abortAttempt(ctx, a)
			}
			if ferr != nil && kv.CodeOf(ferr) != kv.CodeTxnAborted {
				return ferr
			}
			return keyInGroup
		case aborted != nil && !ctxEnded(ctx):
			// An operation answered txn_aborted: whatever fn made of it,
			// the attempt is over; run fn again in a new one.
			noteID()
			last = aborted
			continue
		case ctxEnded(ctx) && (ferr == nil || aborted != nil || ctxFailed || isContextError(ferr)):
			noteID()
			if aborted == nil {
				abortAttempt(ctx, a)
			}
			return ctxErr()
		case ferr != nil:
			abortAttempt(ctx, a)
			return ferr
		}
		_, err = a.Commit(ctx)
		id := a.ID() // a remote commit may have begun the attempt
		switch {
		case err == nil:
			return nil
		case kv.CodeOf(err) == kv.CodeTxnAborted:
			noteID()
			last = err
			if ctxEnded(ctx) {
				return ctxErr()
			}
			continue
		case kv.CodeOf(err) == kv.CodeCommitUnknown:
			return &CommitUnknownError{Txn: id, Err: err}
		case ctxEnded(ctx) || isContextError(err):
			// The commit may have been applied before the context ended.
			return &CommitUnknownError{Txn: id, Err: fmt.Errorf("%w: %w",
				kv.Errorf(kv.CodeCommitUnknown, "the context ended while the commit was under way"), err)}
		default:
			// The commit was refused (unavailable: not performed;
			// invalid; too_large; key_in_group, which a retry would meet
			// again): the attempt is given up.
			abortAttempt(ctx, a)
			return err
		}
	}
}

// runAttempt runs fn in tx. If fn panics, the attempt is aborted before
// the panic goes on, so that its locks are not held until they expire.
func runAttempt(ctx context.Context, tx *Tx, fn func(*Tx) error) (err error) {
	completed := false
	defer func() {
		if !completed {
			tx.end()
			abortAttempt(ctx, tx.a)
		}
	}()
	err = fn(tx)
	completed = true
	return err
}

// ctxEnded reports whether ctx ended, or its deadline passed: a server
// may answer DEADLINE_EXCEEDED for the deadline before the context's own
// timer has run.
func ctxEnded(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

// ctxError is ctx.Err(), or context.DeadlineExceeded when the deadline
// passed before the context's timer ran (ctxEnded).
func ctxError(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return context.DeadlineExceeded
}

// isContextError reports whether err is a context's error.
func isContextError(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// abortAttempt aborts attempt a, best effort, even after ctx ended.
func abortAttempt(ctx context.Context, a txnAttempt) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abortTimeout)
	defer cancel()
	_ = a.Abort(actx) // a failed abort leaves locks to expire
}

// Backoff between the attempts of a transaction: the first retry waits
// about txnBackoffMin, each next one twice as long, up to txnBackoffMax,
// each wait drawn from [d/2, d) so that transactions that aborted each
// other do not meet again in step. Wound-wait makes the retried attempt
// win against younger ones, so waits stay short.
const (
	txnBackoffMin = 2 * time.Millisecond
	txnBackoffMax = 100 * time.Millisecond
)

// txnBackoff returns the wait before attempt n+1, n >= 1.
func txnBackoff(n int) time.Duration {
	d := txnBackoffMax
	if n < 16 {
		d = min(txnBackoffMin<<(n-1), txnBackoffMax)
	}
	return d/2 + rand.N(d/2)
}

// execTxn runs a one-shot transaction on b; see DB.Exec.
func execTxn(ctx context.Context, b kv.TxnBackend, req ExecRequest) (ExecResult, error) {
	// The checks of a request received by a server (at least one
	// operation, no value in a get, ...): an embedded DB refuses what a
	// remote one would, before the backend sees it.
	if err := kv.ValidateExec(req); err != nil {
		return ExecResult{}, err
	}
	return b.ExecTxn(ctx, req)
}

// clipKey shortens a key for a message.
func clipKey(k []byte) string {
	const max = 200
	if len(k) <= max {
		return string(k)
	}
	return string(k[:max]) + "..."
}

// txnBackendOf returns the kv.TxnBackend of b; a backend without
// transactions (none of groupkv's) answers unimplemented.
func txnBackendOf(b kv.Backend) (kv.TxnBackend, error) {
	if tb, ok := b.(kv.TxnBackend); ok {
		return tb, nil
	}
	return nil, kv.Errorf(kv.CodeUnimplemented, "this node does not serve transactions")
}
