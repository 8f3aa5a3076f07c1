// Package groupkv is the Go client of groupkv, a sharded, raft-replicated
// key-value store with consistent access to groups of keys.
//
// One interface, DB, is served two ways: Open runs a node in this process on
// a data directory (no network), Dial talks to a running server over gRPC.
//
//	db, err := groupkv.Dial("127.0.0.1:7070")
//	if err != nil { ... }
//	defer db.Close()
//	v, err := db.Put(ctx, groupkv.PutRequest{Collection: "users", Key: []byte("u1"), Value: []byte("ada")})
package groupkv

import (
	"io"

	"github.com/groupkv/groupkv/internal/kv"
)

// DB is a handle on groupkv, embedded or remote. It is safe for concurrent
// use. Errors are *Error values with a stable Code (see CodeOf), or context
// errors.
type DB interface {
	kv.Backend
	io.Closer
}

// Shared types; see their documentation in the kv package.
type (
	CollectionOptions = kv.CollectionOptions
	CollectionInfo    = kv.CollectionInfo
	ShardInfo         = kv.ShardInfo
	Partitioning      = kv.Partitioning
	Record            = kv.Record
	PutRequest        = kv.PutRequest
	GetRequest        = kv.GetRequest
	DeleteRequest     = kv.DeleteRequest
	Error             = kv.Error
	Code              = kv.Code

	KeyRef             = kv.KeyRef
	BatchGetItem       = kv.BatchGetItem
	BatchGetResult     = kv.BatchGetResult
	PutItem            = kv.PutItem
	WriteResult        = kv.WriteResult
	BatchError         = kv.BatchError
	DeleteRangeRequest = kv.DeleteRangeRequest
	DeleteRangeResult  = kv.DeleteRangeResult
	ScanRequest        = kv.ScanRequest
	ScanResult         = kv.ScanResult
	TagQuery           = kv.TagQuery
	Event              = kv.Event
	WatchRequest       = kv.WatchRequest
)

// Event types of a watch.
const (
	EventPut      = kv.EventPut
	EventDelete   = kv.EventDelete
	EventProgress = kv.EventProgress
)

// Partitionings.
const (
	PartitionHash  = kv.PartitionHash
	PartitionRange = kv.PartitionRange
	PartitionTag   = kv.PartitionTag
)

// Error codes and sentinels for errors.Is.
const (
	CodeInvalidArgument    = kv.CodeInvalidArgument
	CodeNotFound           = kv.CodeNotFound
	CodeCollectionNotFound = kv.CodeCollectionNotFound
	CodeConditionFailed    = kv.CodeConditionFailed
	CodeCompacted          = kv.CodeCompacted
	CodeTooLarge           = kv.CodeTooLarge
	CodeUnavailable        = kv.CodeUnavailable
)

var (
	ErrNotFound           = kv.ErrNotFound
	ErrCollectionNotFound = kv.ErrCollectionNotFound
	ErrConditionFailed    = kv.ErrConditionFailed
	ErrCompacted          = kv.ErrCompacted
	ErrUnavailable        = kv.ErrUnavailable
)

// CodeOf returns the stable code of err.
func CodeOf(err error) Code { return kv.CodeOf(err) }

// Version returns a pointer to v, for PutRequest.IfVersion and
// DeleteRequest.IfVersion.
func Version(v uint64) *uint64 { return &v }
