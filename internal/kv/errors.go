package kv

import (
	"context"
	"errors"
	"fmt"
	"net/http"
)

// Code is a stable, machine-readable error code. New codes are added to this
// list, never invented ad hoc.
type Code string

const (
	CodeInvalidArgument     Code = "invalid_argument"      // 400
	CodePermissionDenied    Code = "permission_denied"     // 403: the client's role does not allow the operation
	CodeNotFound            Code = "not_found"             // 404
	CodeCollectionNotFound  Code = "collection_not_found"  // 404
	CodeAlreadyExists       Code = "already_exists"        // 409
	CodeTxnAborted          Code = "txn_aborted"           // 409
	CodeKeyInGroup          Code = "key_in_group"          // 409
	CodeGroupRefused        Code = "group_refused"         // 409: an atomic group could not take every key
	CodePlacementTagChanged Code = "placement_tag_changed" // 409
	CodeCompacted           Code = "compacted"             // 410
	CodeConditionFailed     Code = "condition_failed"      // 412
	CodeTooLarge            Code = "too_large"             // 413
	CodeUnavailable         Code = "unavailable"           // 503: not performed, may be retried
	CodeCommitUnknown       Code = "commit_unknown"        // 503: may or may not have been performed
	CodeNotLeader           Code = "not_leader"            // 503: ask the shard's leader; the shard map moved
	CodeUnimplemented       Code = "unimplemented"         // 501: this server does not serve the operation
	CodeInternal            Code = "internal"              // 500
)

// HTTPStatus is the HTTP status that carries the code.
func (c Code) HTTPStatus() int {
	switch c {
	case CodeInvalidArgument:
		return http.StatusBadRequest
	case CodePermissionDenied:
		return http.StatusForbidden
	case CodeNotFound, CodeCollectionNotFound:
		return http.StatusNotFound
	case CodeAlreadyExists, CodeTxnAborted, CodeKeyInGroup, CodeGroupRefused, CodePlacementTagChanged:
		return http.StatusConflict
	case CodeCompacted:
		return http.StatusGone
	case CodeConditionFailed:
		return http.StatusPreconditionFailed
	case CodeTooLarge:
		return http.StatusRequestEntityTooLarge
	case CodeUnavailable, CodeCommitUnknown, CodeNotLeader:
		return http.StatusServiceUnavailable
	case CodeUnimplemented:
		return http.StatusNotImplemented
	default:
		return http.StatusInternalServerError
	}
}

// Error is the error type of the service. Message says what was wrong and,
// where it helps, what to do.
type Error struct {
	Code    Code
	Message string
}

func (e *Error) Error() string { return string(e.Code) + ": " + e.Message }

// Is makes errors.Is(err, ErrNotFound) and friends match on the code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Message == "" && t.Code == e.Code
}

// Errorf returns an *Error with the code and a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Sentinels for errors.Is; they match any *Error of their code.
var (
	ErrInvalidArgument    = &Error{Code: CodeInvalidArgument}
	ErrNotFound           = &Error{Code: CodeNotFound}
	ErrCollectionNotFound = &Error{Code: CodeCollectionNotFound}
	ErrAlreadyExists      = &Error{Code: CodeAlreadyExists}
	ErrCompacted          = &Error{Code: CodeCompacted}
	ErrConditionFailed    = &Error{Code: CodeConditionFailed}
	ErrTooLarge           = &Error{Code: CodeTooLarge}
	ErrUnavailable        = &Error{Code: CodeUnavailable}
	ErrCommitUnknown      = &Error{Code: CodeCommitUnknown}
)

// CodeOf returns the code of err: its *Error code, CodeUnavailable for a
// context that ended, CodeInternal otherwise.
func CodeOf(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return CodeUnavailable
	}
	return CodeInternal
}

// AsError converts any error into an *Error, keeping the code of an *Error.
func AsError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return &Error{Code: CodeOf(err), Message: err.Error()}
}

// TxnUnknownError is the error of an operation of a transaction attempt
// its backend does not know: one begun elsewhere, or one that ended and
// whose outcome the backend no longer remembers. Err (txn_aborted) is what
// the operation answers — the attempt cannot go on — but the backend
// cannot tell whether the attempt committed, so a request that commits
// after the operation (a gRPC CommitTxn carrying writes) answers
// commit_unknown, never txn_aborted. errors.As finds Err in it.
type TxnUnknownError struct {
	Err *Error
}

func (e *TxnUnknownError) Error() string { return e.Err.Error() }

func (e *TxnUnknownError) Unwrap() error { return e.Err }

// TxnUnknown marks err as the error of an operation of an attempt its
// backend does not know (TxnUnknownError).
func TxnUnknown(err *Error) error { return &TxnUnknownError{Err: err} }

// IsTxnUnknown reports whether err says that its backend does not know the
// transaction attempt (TxnUnknownError).
func IsTxnUnknown(err error) bool {
	var e *TxnUnknownError
	return errors.As(err, &e)
}
