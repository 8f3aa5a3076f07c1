package kv

import "context"

// Limits of multi-record requests. The node's Limits may raise them.
const (
	// DefaultMaxBatchKeys bounds the keys of one batch request.
	DefaultMaxBatchKeys = 1000
	// DefaultPageSize is the page size of a scan or tag query without a limit.
	DefaultPageSize = 100
	// MaxPageSize bounds the limit of one page.
	MaxPageSize = 1000
	// MaxRequestBytes bounds the bytes of keys and values of one request.
	MaxRequestBytes = 16 << 20
)

// KeyRef names a key of a collection.
type KeyRef struct {
	Collection string
	Key        []byte
}

// BatchGetItem is one answer of a batch get, in request order.
type BatchGetItem struct {
	Collection string
	Key        []byte
	Found      bool
	Value      []byte
	Tags       []string
	Version    uint64
}

// BatchGetResult is the answer of a batch get: every item was read at
// Version.
type BatchGetResult struct {
	Items   []BatchGetItem
	Version uint64
}

// PutItem is one record of a batch put.
type PutItem struct {
	Collection string
	Key        []byte
	Value      []byte
	Tags       []string
	// IfVersion makes the whole batch conditional on this key's current
	// version (0: absent).
	IfVersion *uint64
}

// WriteResult is the version a record of a batch was written at.
type WriteResult struct {
	Collection string
	Key        []byte
	Version    uint64
}

// BatchError is the error of a batch write that failed after some of its
// shards applied their part: Applied lists exactly the records that were
// written (and stay written). Its code is the code of Err.
type BatchError struct {
	Err     *Error
	Applied []WriteResult
}

func (e *BatchError) Error() string { return e.Err.Error() }

// Unwrap makes errors.As(err, *Error) and CodeOf see the cause.
func (e *BatchError) Unwrap() error { return e.Err }

// DeleteRangeRequest deletes every key of [Start, End) of a collection; an
// empty End is unbounded.
type DeleteRangeRequest struct {
	Collection string
	Start, End []byte
}

// DeleteRangeResult says how many keys a delete range removed.
type DeleteRangeResult struct {
	Deleted int
}

// ScanRequest reads records of a collection in key order.
type ScanRequest struct {
	Collection string
	// Start (inclusive) and End (exclusive) bound the keys; empty is unbounded.
	Start, End []byte
	// Limit is the page size; 0 means DefaultPageSize.
	Limit int
	// Reverse walks the same span in descending key order.
	Reverse bool
	// Page continues a scan from the NextPage of its previous page; the
	// other fields must be the same.
	Page string
	// Version reads at that version (within retention); 0 reads the latest.
	// A continued scan reads at the version of its first page.
	Version uint64
}

// ScanResult is one page of a scan or tag query.
type ScanResult struct {
	Items []Record
	// NextPage is empty at the end; else it continues the scan. It is
	// URL-safe as it is.
	NextPage string
	// Version is the version every page of the scan reads at.
	Version uint64
}

// TagQuery reads records carrying all of All, or any of Any (exactly one
// of them is set), in key order, paged like a scan.
type TagQuery struct {
	Collection string
	All, Any   []string
	Limit      int
	Page       string
	Version    uint64
}

// Event types of a watch.
const (
	EventPut      = "put"
	EventDelete   = "delete"
	EventProgress = "progress"
)

// Event is one change of a watched range, or a progress mark: no change
// at or below Version is still to come.
type Event struct {
	Type    string
	Key     []byte
	Value   []byte
	Tags    []string
	Version uint64
}

// WatchRequest follows the changes of a collection, or of [Start, End) of
// it, with versions above FromVersion (or, with AfterKey, above
// (FromVersion, AfterKey) in (version, key) order).
type WatchRequest struct {
	Collection  string
	Start, End  []byte
	FromVersion uint64
	AfterKey    []byte
}

// MultiBackend is the multi-record part of the service.
type MultiBackend interface {
	// BatchGet reads keys, possibly of several collections, at one version.
	BatchGet(ctx context.Context, keys []KeyRef) (BatchGetResult, error)
	// BatchPut writes records; the records of one shard are written
	// atomically at one version. A failure after some shards applied their
	// part is a *BatchError listing them.
	BatchPut(ctx context.Context, items []PutItem) ([]WriteResult, error)
	// BatchDelete deletes keys like BatchPut writes them; absent keys are
	// no-ops.
	BatchDelete(ctx context.Context, keys []KeyRef) ([]WriteResult, error)
	// DeleteRange deletes every key of a range, atomically per shard.
	DeleteRange(ctx context.Context, req DeleteRangeRequest) (DeleteRangeResult, error)
	// Scan reads one page of a range.
	Scan(ctx context.Context, req ScanRequest) (ScanResult, error)
	// GetByTags reads one page of the records carrying the tags.
	GetByTags(ctx context.Context, q TagQuery) (ScanResult, error)
	// Watch calls fn with the changes of the watched range in (version,
	// key) order, and with progress events, until ctx ends or fn returns an
	// error (which Watch returns). A FromVersion older than the retention
	// window fails with CodeCompacted before any event.
	Watch(ctx context.Context, req WatchRequest, fn func(Event) error) error
}
