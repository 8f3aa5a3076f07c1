package kv

import "context"

// Isolation is the isolation level of a transaction.
type Isolation string

const (
	// IsolationSerializable is strict serializability: two-phase locking
	// with wound-wait; a retried transaction always commits in the end.
	IsolationSerializable Isolation = "serializable"
	// IsolationSnapshot reads at the transaction's start timestamp without
	// read locks; of two concurrent transactions writing one key, the first
	// to commit wins. It does not promise that a retried transaction
	// commits.
	IsolationSnapshot Isolation = "snapshot"
)

// Default limits of one transaction; the node's options may raise them.
const (
	DefaultMaxTxnOps   = 10000
	DefaultMaxTxnBytes = 64 << 20
)

// TxnOptions start a transaction attempt.
type TxnOptions struct {
	// Isolation is serializable when empty.
	Isolation Isolation
	// RetryOf names an earlier attempt (aborted) whose priority the new
	// attempt keeps; empty starts a new transaction with a new priority.
	RetryOf string
	// ReadOnly transactions read at a snapshot timestamp and take no
	// locks; a write in one fails with invalid_argument.
	ReadOnly bool
	// CachedSnapshot (a remote client's, in group transactions only; not
	// sent) lets an attempt read from the snapshot of the group its
	// client kept from an earlier transaction of the group, its commit
	// validating those reads (api.TxnAttempt).
	CachedSnapshot bool
}

// Compare is one condition of a one-shot transaction: the key's current
// version is Version (0: absent), or, with HasValue, its value is Value.
type Compare struct {
	Collection string
	Key        []byte
	Version    uint64
	HasValue   bool
	Value      []byte
}

// TxnOp types of a one-shot transaction.
const (
	TxnOpGet    = "get"
	TxnOpPut    = "put"
	TxnOpDelete = "delete"
)

// TxnOp is one operation of a one-shot transaction.
type TxnOp struct {
	Op         string // TxnOpGet, TxnOpPut or TxnOpDelete
	Collection string
	Key        []byte
	Value      []byte
	Tags       []string
}

// ExecRequest is a one-shot transaction: if every compare of If holds, the
// operations of Then run, else those of Else, all in one transaction.
type ExecRequest struct {
	If   []Compare
	Then []TxnOp
	Else []TxnOp
}

// TxnOpResult is the outcome of one TxnOp: the commit version of a put or
// delete; Found, Value, Tags and Version of a get.
type TxnOpResult struct {
	Found   bool
	Value   []byte
	Tags    []string
	Version uint64
}

// ExecResult is the outcome of a one-shot transaction. Version is its
// commit version (the read version when it wrote nothing).
type ExecResult struct {
	Succeeded bool
	Version   uint64
	Results   []TxnOpResult
}

// TxnBackend is the transactional part of the service. A transaction
// attempt is named by the id BeginTxn answers (URL-safe); it lives on the
// node that began it. Operations of an attempt known to be aborted answer
// CodeTxnAborted; the caller may begin a new attempt with RetryOf. A
// commit whose outcome the node cannot tell answers CodeCommitUnknown.
type TxnBackend interface {
	BeginTxn(ctx context.Context, opts TxnOptions) (string, error)
	// TxnGet reads a key; the transaction's own earlier writes are seen.
	TxnGet(ctx context.Context, txn string, ref KeyRef) (Record, bool, error)
	// TxnGetForUpdate reads a key as TxnGet does, and in a serializable
	// transaction takes the key's lock exclusively at once, as a write
	// would at commit: the read of a read-modify-write, so that two
	// transactions updating one key queue at the read (the younger waits
	// for the older) instead of both reading and one being wounded when
	// it writes. A snapshot transaction reads as TxnGet does; a read-only
	// one answers CodeInvalidArgument.
	TxnGetForUpdate(ctx context.Context, txn string, ref KeyRef) (Record, bool, error)
	// TxnBatchGet reads refs in one request, each as TxnGet (forUpdate:
	// TxnGetForUpdate) would read it alone, and answers them in request
	// order, each with its own version (0 for the attempt's own write).
	// Every key is checked first: a bad one fails the request with
	// nothing locked. At most DefaultMaxBatchKeys keys.
	TxnBatchGet(ctx context.Context, txn string, refs []KeyRef, forUpdate bool) ([]BatchGetItem, error)
	TxnPut(ctx context.Context, txn string, item PutItem) error
	TxnDelete(ctx context.Context, txn string, ref KeyRef) error
	TxnScan(ctx context.Context, txn string, req ScanRequest) (ScanResult, error)
	TxnGetByTags(ctx context.Context, txn string, q TagQuery) (ScanResult, error)
	// CommitTxn answers the commit version. A commit of an attempt that
	// ended answers what its first commit did (the same version, or
	// CodeTxnAborted), while the backend remembers the attempt; one of
	// an attempt it does not know (begun elsewhere, or forgotten)
	// answers CodeCommitUnknown. It never answers CodeTxnAborted unless
	// the attempt is known not to have committed.
	CommitTxn(ctx context.Context, txn string) (uint64, error)
	// AbortTxn is idempotent: aborting an unknown or finished attempt
	// succeeds.
	AbortTxn(ctx context.Context, txn string) error
	// ExecTxn runs a one-shot transaction, retrying it on conflict.
	ExecTxn(ctx context.Context, req ExecRequest) (ExecResult, error)
}

// ValidateExec checks a one-shot transaction as a server checks one it
// receives, so that every caller of TxnBackend.ExecTxn, embedded or
// remote, is refused alike: at least one operation; every compare and
// operation naming a valid collection and key; ops get, put or delete,
// only a put carrying a value or tags, and valid tags; the keys and
// values within MaxRequestBytes. An error names the part at fault (if[i],
// then[i], else[i]).
func ValidateExec(req ExecRequest) error {
	n := 0
	for i, c := range req.If {
		if err := validateRef(c.Collection, c.Key); err != nil {
			return Errorf(CodeOf(err), "if[%d]: %s", i, AsError(err).Message)
		}
		n += len(c.Key) + len(c.Value)
	}
	if len(req.Then) == 0 && len(req.Else) == 0 {
		return Errorf(CodeInvalidArgument, "no operations: give then (run when every compare holds) and/or else (run otherwise), at least one operation")
	}
	for _, branch := range []struct {
		name string
		ops  []TxnOp
	}{{"then", req.Then}, {"else", req.Else}} {
		for i, op := range branch.ops {
			if err := validateTxnOp(op); err != nil {
				return Errorf(CodeOf(err), "%s[%d]: %s", branch.name, i, AsError(err).Message)
			}
			n += len(op.Key) + len(op.Value)
		}
	}
	if n > MaxRequestBytes {
		return Errorf(CodeTooLarge, "the keys and values of the request are %d bytes, the limit is %d: split it", n, MaxRequestBytes)
	}
	return nil
}

func validateRef(collection string, key []byte) error {
	if err := ValidateCollectionName(collection); err != nil {
		return err
	}
	return ValidateKey(key)
}

func validateTxnOp(op TxnOp) error {
	switch op.Op {
	case TxnOpGet, TxnOpPut, TxnOpDelete:
	case "":
		return Errorf(CodeInvalidArgument, `no op: set op to "get", "put" or "delete"`)
	default:
		name := op.Op
		if len(name) > 64 {
			name = name[:64] + "..."
		}
		return Errorf(CodeInvalidArgument, `op %q is not known: use "get", "put" or "delete"`, name)
	}
	if err := validateRef(op.Collection, op.Key); err != nil {
		return err
	}
	if op.Op != TxnOpPut {
		if len(op.Value) > 0 || len(op.Tags) > 0 {
			return Errorf(CodeInvalidArgument, "a %s takes no value and no tags: only a put does", op.Op)
		}
		return nil
	}
	return ValidateTags(op.Tags)
}
