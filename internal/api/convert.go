package api

import (
	"context"
	"errors"
	"fmt"
	"math"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"

	"github.com/groupkv/groupkv/internal/kv"
	pb "github.com/groupkv/groupkv/proto/groupkvpb"
)

// This file converts between the kv types and the groupkv.v1 messages, in
// both directions, and between *kv.Error and gRPC statuses. The gRPC server
// (grpc.go) and the Go client (groupkv.Dial) share it, so a value or an error
// that crosses the wire comes back as it left.
//
// Byte slices and tag lists cross as proto3 bytes and repeated fields, which
// do not tell nil from empty: an empty value or tag list arrives as nil.

// MaxMessageSize bounds a gRPC message in either direction, on the server and
// on the client. A node may be configured for values up to 16 MiB; a record
// adds at most 4 KiB of key and 16 KiB of tags, and a collection listing with
// many range shards carries their split points, so 32 MiB leaves room for all
// of it while still refusing a runaway message.
const MaxMessageSize = 32 << 20

// CollectionOptionsToPB converts the options of CreateCollection.
func CollectionOptionsToPB(o kv.CollectionOptions) *pb.CreateCollectionRequest {
	return &pb.CreateCollectionRequest{
		Name:         o.Name,
		Partitioning: string(o.Partitioning),
		Shards:       int64(o.Shards),
		SplitPoints:  o.SplitPoints,
	}
}

// CollectionOptionsFromPB is the inverse of CollectionOptionsToPB.
func CollectionOptionsFromPB(m *pb.CreateCollectionRequest) kv.CollectionOptions {
	return kv.CollectionOptions{
		Name:         m.GetName(),
		Partitioning: kv.Partitioning(m.GetPartitioning()),
		Shards:       clampInt(m.GetShards()),
		SplitPoints:  m.GetSplitPoints(),
	}
}

// clampInt turns a wire count (a shard count, a page limit) into an int. A
// count beyond what an int holds (only possible on 32-bit platforms) is
// clamped to a value that is still out of range, so validation rejects it
// rather than a truncated count slipping through.
func clampInt(n int64) int {
	switch {
	case n > math.MaxInt:
		return math.MaxInt
	case n < math.MinInt:
		return math.MinInt
	}
	return int(n)
}

// CollectionInfoToPB converts a collection's description.
func CollectionInfoToPB(c kv.CollectionInfo) *pb.CollectionInfo {
	m := &pb.CollectionInfo{
		Name:         c.Name,
		Id:           c.ID,
		Partitioning: string(c.Partitioning),
		SplitPoints:  c.SplitPoints,
		Shards:       make([]*pb.ShardInfo, len(c.Shards)),
	}
	for i, s := range c.Shards {
		m.Shards[i] = &pb.ShardInfo{
			Id:          s.ID,
			BucketStart: s.BucketStart,
			BucketEnd:   s.BucketEnd,
			Start:       s.Start,
			End:         s.End,
			Leader:      s.Leader,
		}
	}
	return m
}

// CollectionInfoFromPB is the inverse of CollectionInfoToPB. Shards is never
// nil, so a description with no shards reads the same as one from the
// embedded DB.
func CollectionInfoFromPB(m *pb.CollectionInfo) kv.CollectionInfo {
	c := kv.CollectionInfo{
		Name:         m.GetName(),
		ID:           m.GetId(),
		Partitioning: kv.Partitioning(m.GetPartitioning()),
		SplitPoints:  m.GetSplitPoints(),
		Shards:       make([]kv.ShardInfo, len(m.GetShards())),
	}
	for i, s := range m.GetShards() {
		c.Shards[i] = kv.ShardInfo{
			ID:          s.GetId(),
			BucketStart: s.GetBucketStart(),
			BucketEnd:   s.GetBucketEnd(),
			Start:       s.GetStart(),
			End:         s.GetEnd(),
			Leader:      s.GetLeader(),
		}
	}
	return c
}

// CollectionInfosToPB converts the answer of ListCollections.
func CollectionInfosToPB(cs []kv.CollectionInfo) *pb.ListCollectionsResponse {
	m := &pb.ListCollectionsResponse{Collections: make([]*pb.CollectionInfo, len(cs))}
	for i, c := range cs {
		m.Collections[i] = CollectionInfoToPB(c)
	}
	return m
}

// CollectionInfosFromPB is the inverse of CollectionInfosToPB; it never
// answers nil.
func CollectionInfosFromPB(m *pb.ListCollectionsResponse) []kv.CollectionInfo {
	cs := make([]kv.CollectionInfo, len(m.GetCollections()))
	for i, c := range m.GetCollections() {
		cs[i] = CollectionInfoFromPB(c)
	}
	return cs
}

// PutRequestToPB converts a put. IfVersion keeps its presence: nil stays
// unset, a pointer to 0 stays "only if absent".
func PutRequestToPB(r kv.PutRequest) *pb.PutRequest {
	return &pb.PutRequest{
		Collection: r.Collection,
		Key:        r.Key,
		Value:      r.Value,
		Tags:       r.Tags,
		IfVersion:  copyVersion(r.IfVersion),
	}
}

// PutRequestFromPB is the inverse of PutRequestToPB.
func PutRequestFromPB(m *pb.PutRequest) kv.PutRequest {
	return kv.PutRequest{
		Collection: m.GetCollection(),
		Key:        m.GetKey(),
		Value:      m.GetValue(),
		Tags:       m.GetTags(),
		IfVersion:  copyVersion(m.IfVersion),
	}
}

// GetRequestToPB converts a get.
func GetRequestToPB(r kv.GetRequest) *pb.GetRequest {
	return &pb.GetRequest{Collection: r.Collection, Key: r.Key, Version: r.Version}
}

// GetRequestFromPB is the inverse of GetRequestToPB.
func GetRequestFromPB(m *pb.GetRequest) kv.GetRequest {
	return kv.GetRequest{Collection: m.GetCollection(), Key: m.GetKey(), Version: m.GetVersion()}
}

// RecordToPB converts the answer of a get.
func RecordToPB(r kv.Record) *pb.GetResponse {
	return &pb.GetResponse{Key: r.Key, Value: r.Value, Tags: r.Tags, Version: r.Version}
}

// RecordFromPB is the inverse of RecordToPB.
func RecordFromPB(m *pb.GetResponse) kv.Record {
	return kv.Record{Key: m.GetKey(), Value: m.GetValue(), Tags: m.GetTags(), Version: m.GetVersion()}
}

// DeleteRequestToPB converts a delete, keeping IfVersion's presence.
func DeleteRequestToPB(r kv.DeleteRequest) *pb.DeleteRequest {
	return &pb.DeleteRequest{Collection: r.Collection, Key: r.Key, IfVersion: copyVersion(r.IfVersion)}
}

// DeleteRequestFromPB is the inverse of DeleteRequestToPB.
func DeleteRequestFromPB(m *pb.DeleteRequest) kv.DeleteRequest {
	return kv.DeleteRequest{Collection: m.GetCollection(), Key: m.GetKey(), IfVersion: copyVersion(m.IfVersion)}
}

// KeyRefsToPB converts the keys of a batch get or delete.
func KeyRefsToPB(keys []kv.KeyRef) []*pb.KeyRef {
	m := make([]*pb.KeyRef, len(keys))
	for i, k := range keys {
		m[i] = &pb.KeyRef{Collection: k.Collection, Key: k.Key}
	}
	return m
}

// KeyRefsFromPB is the inverse of KeyRefsToPB; it never answers nil.
func KeyRefsFromPB(m []*pb.KeyRef) []kv.KeyRef {
	keys := make([]kv.KeyRef, len(m))
	for i, k := range m {
		keys[i] = kv.KeyRef{Collection: k.GetCollection(), Key: k.GetKey()}
	}
	return keys
}

// BatchGetResultToPB converts the answer of a batch get.
func BatchGetResultToPB(r kv.BatchGetResult) *pb.BatchGetResponse {
	return &pb.BatchGetResponse{Items: BatchGetItemsToPB(r.Items), Version: r.Version}
}

// BatchGetItemsToPB converts the items of a batch get (or the members of
// a group snapshot, TxnGetResponse.snapshot).
func BatchGetItemsToPB(items []kv.BatchGetItem) []*pb.BatchGetItem {
	m := make([]*pb.BatchGetItem, len(items))
	for i, it := range items {
		m[i] = &pb.BatchGetItem{
			Collection: it.Collection,
			Key:        it.Key,
			Found:      it.Found,
			Value:      it.Value,
			Tags:       it.Tags,
			Version:    it.Version,
		}
	}
	return m
}

// BatchGetResultFromPB is the inverse of BatchGetResultToPB. Items is never
// nil.
func BatchGetResultFromPB(m *pb.BatchGetResponse) kv.BatchGetResult {
	return kv.BatchGetResult{Items: BatchGetItemsFromPB(m.GetItems()), Version: m.GetVersion()}
}

// BatchGetItemsFromPB is the inverse of BatchGetItemsToPB; it never
// answers nil.
func BatchGetItemsFromPB(m []*pb.BatchGetItem) []kv.BatchGetItem {
	items := make([]kv.BatchGetItem, len(m))
	for i, it := range m {
		items[i] = kv.BatchGetItem{
			Collection: it.GetCollection(),
			Key:        it.GetKey(),
			Found:      it.GetFound(),
			Value:      it.GetValue(),
			Tags:       it.GetTags(),
			Version:    it.GetVersion(),
		}
	}
	return items
}

// PutItemsToPB converts the records of a batch put, keeping the presence of
// each IfVersion.
func PutItemsToPB(items []kv.PutItem) *pb.BatchPutRequest {
	m := &pb.BatchPutRequest{Items: make([]*pb.PutItem, len(items))}
	for i, it := range items {
		m.Items[i] = &pb.PutItem{
			Collection: it.Collection,
			Key:        it.Key,
			Value:      it.Value,
			Tags:       it.Tags,
			IfVersion:  copyVersion(it.IfVersion),
		}
	}
	return m
}

// PutItemsFromPB is the inverse of PutItemsToPB; it never answers nil.
func PutItemsFromPB(m *pb.BatchPutRequest) []kv.PutItem {
	items := make([]kv.PutItem, len(m.GetItems()))
	for i, it := range m.GetItems() {
		items[i] = kv.PutItem{
			Collection: it.GetCollection(),
			Key:        it.GetKey(),
			Value:      it.GetValue(),
			Tags:       it.GetTags(),
			IfVersion:  copyVersion(it.IfVersion),
		}
	}
	return items
}

// WriteResultsToPB converts the answer of a batch write, or the applied
// list of a *kv.BatchError.
func WriteResultsToPB(rs []kv.WriteResult) []*pb.WriteResult {
	m := make([]*pb.WriteResult, len(rs))
	for i, r := range rs {
		m[i] = &pb.WriteResult{Collection: r.Collection, Key: r.Key, Version: r.Version}
	}
	return m
}

// WriteResultsFromPB is the inverse of WriteResultsToPB; it never answers
// nil.
func WriteResultsFromPB(m []*pb.WriteResult) []kv.WriteResult {
	rs := make([]kv.WriteResult, len(m))
	for i, r := range m {
		rs[i] = kv.WriteResult{Collection: r.GetCollection(), Key: r.GetKey(), Version: r.GetVersion()}
	}
	return rs
}

// DeleteRangeRequestToPB converts a delete range.
func DeleteRangeRequestToPB(r kv.DeleteRangeRequest) *pb.DeleteRangeRequest {
	return &pb.DeleteRangeRequest{Collection: r.Collection, Start: r.Start, End: r.End}
}

// DeleteRangeRequestFromPB is the inverse of DeleteRangeRequestToPB.
func DeleteRangeRequestFromPB(m *pb.DeleteRangeRequest) kv.DeleteRangeRequest {
	return kv.DeleteRangeRequest{Collection: m.GetCollection(), Start: m.GetStart(), End: m.GetEnd()}
}

// DeleteRangeResultToPB converts the answer of a delete range.
func DeleteRangeResultToPB(r kv.DeleteRangeResult) *pb.DeleteRangeResponse {
	return &pb.DeleteRangeResponse{Deleted: int64(r.Deleted)}
}

// DeleteRangeResultFromPB is the inverse of DeleteRangeResultToPB.
func DeleteRangeResultFromPB(m *pb.DeleteRangeResponse) kv.DeleteRangeResult {
	return kv.DeleteRangeResult{Deleted: clampInt(m.GetDeleted())}
}

// ScanRequestToPB converts a scan.
func ScanRequestToPB(r kv.ScanRequest) *pb.ScanRequest {
	return &pb.ScanRequest{
		Collection: r.Collection,
		Start:      r.Start,
		End:        r.End,
		Limit:      int64(r.Limit),
		Reverse:    r.Reverse,
		Page:       r.Page,
		Version:    r.Version,
	}
}

// ScanRequestFromPB is the inverse of ScanRequestToPB.
func ScanRequestFromPB(m *pb.ScanRequest) kv.ScanRequest {
	return kv.ScanRequest{
		Collection: m.GetCollection(),
		Start:      m.GetStart(),
		End:        m.GetEnd(),
		Limit:      clampInt(m.GetLimit()),
		Reverse:    m.GetReverse(),
		Page:       m.GetPage(),
		Version:    m.GetVersion(),
	}
}

// TagQueryToPB converts a tag query.
func TagQueryToPB(q kv.TagQuery) *pb.TagQuery {
	return &pb.TagQuery{
		Collection: q.Collection,
		All:        q.All,
		Any:        q.Any,
		Limit:      int64(q.Limit),
		Page:       q.Page,
		Version:    q.Version,
	}
}

// TagQueryFromPB is the inverse of TagQueryToPB.
func TagQueryFromPB(m *pb.TagQuery) kv.TagQuery {
	return kv.TagQuery{
		Collection: m.GetCollection(),
		All:        m.GetAll(),
		Any:        m.GetAny(),
		Limit:      clampInt(m.GetLimit()),
		Page:       m.GetPage(),
		Version:    m.GetVersion(),
	}
}

// ScanResultToPB converts a page of a scan or tag query.
func ScanResultToPB(r kv.ScanResult) *pb.ScanResponse {
	m := &pb.ScanResponse{Items: make([]*pb.Record, len(r.Items)), NextPage: r.NextPage, Version: r.Version}
	// One allocation for the answer's messages, not one each.
	recs := make([]pb.Record, len(r.Items))
	for i, rec := range r.Items {
		p := &recs[i]
		p.Key, p.Value, p.Tags, p.Version = rec.Key, rec.Value, rec.Tags, rec.Version
		m.Items[i] = p
	}
	return m
}

// ScanResultFromPB is the inverse of ScanResultToPB. Items is never nil.
func ScanResultFromPB(m *pb.ScanResponse) kv.ScanResult {
	r := kv.ScanResult{Items: make([]kv.Record, len(m.GetItems())), NextPage: m.GetNextPage(), Version: m.GetVersion()}
	for i, rec := range m.GetItems() {
		r.Items[i] = kv.Record{Key: rec.GetKey(), Value: rec.GetValue(), Tags: rec.GetTags(), Version: rec.GetVersion()}
	}
	return r
}

// WatchRequestToPB converts a watch.
func WatchRequestToPB(r kv.WatchRequest) *pb.WatchRequest {
	return &pb.WatchRequest{
		Collection:  r.Collection,
		Start:       r.Start,
		End:         r.End,
		FromVersion: r.FromVersion,
		AfterKey:    r.AfterKey,
	}
}

// WatchRequestFromPB is the inverse of WatchRequestToPB.
func WatchRequestFromPB(m *pb.WatchRequest) kv.WatchRequest {
	return kv.WatchRequest{
		Collection:  m.GetCollection(),
		Start:       m.GetStart(),
		End:         m.GetEnd(),
		FromVersion: m.GetFromVersion(),
		AfterKey:    m.GetAfterKey(),
	}
}

// EventToPB converts an event of a watch. The type crosses as its string,
// so a type a peer does not know still passes.
func EventToPB(e kv.Event) *pb.Event {
	return &pb.Event{Type: e.Type, Key: e.Key, Value: e.Value, Tags: e.Tags, Version: e.Version}
}

// EventFromPB is the inverse of EventToPB.
func EventFromPB(m *pb.Event) kv.Event {
	return kv.Event{Type: m.GetType(), Key: m.GetKey(), Value: m.GetValue(), Tags: m.GetTags(), Version: m.GetVersion()}
}

// copyVersion copies an optional version so that neither side aliases the
// other's pointer.
func copyVersion(v *uint64) *uint64 {
	if v == nil {
		return nil
	}
	c := *v
	return &c
}

// CodeTrailer is the trailer metadata key that carries the kv.Code of a
// failed RPC, for clients that do not read status details. gRPC metadata keys
// are lower case.
const CodeTrailer = "groupkv-code"

// GRPCCode is the gRPC status code that carries a kv.Code. A code this
// version does not know maps to Internal.
func GRPCCode(c kv.Code) codes.Code {
	switch c {
	case kv.CodeInvalidArgument:
		return codes.InvalidArgument
	case kv.CodePermissionDenied:
		return codes.PermissionDenied
	case kv.CodeNotFound, kv.CodeCollectionNotFound:
		return codes.NotFound
	case kv.CodeAlreadyExists:
		return codes.AlreadyExists
	case kv.CodeTxnAborted, kv.CodeKeyInGroup, kv.CodeGroupRefused, kv.CodePlacementTagChanged:
		return codes.Aborted
	case kv.CodeCompacted:
		return codes.OutOfRange
	case kv.CodeConditionFailed:
		return codes.FailedPrecondition
	case kv.CodeTooLarge:
		return codes.ResourceExhausted
	case kv.CodeUnavailable, kv.CodeNotLeader:
		return codes.Unavailable
	case kv.CodeCommitUnknown:
		return codes.Unknown
	case kv.CodeUnimplemented:
		return codes.Unimplemented
	default:
		return codes.Internal
	}
}

// StatusFromError turns an error of a Backend into the gRPC status the
// server answers:
//   - an *kv.Error (found with errors.As, so wrapping is allowed) gets the
//     status code of its Code, its Message as the status message, and an
//     ErrorDetail with its Code;
//   - a *kv.BatchError (found with errors.As too) is answered like its Err,
//     plus a BatchErrorDetail with its Applied list;
//   - a context error gets Canceled or DeadlineExceeded and no detail, so the
//     client returns a context error as the embedded DB would;
//   - any other error becomes an internal *kv.Error with the error's text.
//
// The second result is the kv.Code the client will see: "" for a context
// error. StatusFromError panics on a nil err.
func StatusFromError(err error) (*status.Status, kv.Code) {
	if err == nil {
		panic("api: StatusFromError of a nil error")
	}
	var (
		be *kv.BatchError
		e  *kv.Error
	)
	switch {
	case errors.As(err, &be):
		e = be.Err
		if e == nil {
			// Not a valid BatchError (its Error method would panic), but
			// its list is still worth passing on.
			e = &kv.Error{Code: kv.CodeInternal, Message: "batch write failed without a cause"}
		}
	case errors.As(err, &e):
	case errors.Is(err, context.Canceled):
		return status.New(codes.Canceled, err.Error()), ""
	case errors.Is(err, context.DeadlineExceeded):
		return status.New(codes.DeadlineExceeded, err.Error()), ""
	default:
		e = &kv.Error{Code: kv.CodeInternal, Message: err.Error()}
	}
	st := status.New(GRPCCode(e.Code), e.Message)
	details := []protoadapt.MessageV1{&pb.ErrorDetail{Code: string(e.Code)}}
	if be != nil {
		details = append(details, &pb.BatchErrorDetail{Applied: WriteResultsToPB(be.Applied)})
	}
	// A detail that does not marshal (it cannot: it is a string and a list
	// of plain records) leaves the client to fall back on the status code,
	// which still names the class.
	if withDetails, derr := st.WithDetails(details...); derr == nil {
		st = withDetails
	}
	return st, e.Code
}

// ErrorFromStatus turns the error of a gRPC call back into the error the
// Backend returned on the server. err must come from a groupkv.v1 RPC.
//
// A status with an ErrorDetail becomes the *kv.Error the server produced: the
// same Code and Message. Canceled and DeadlineExceeded become errors that
// match context.Canceled and context.DeadlineExceeded under errors.Is. Any
// other status was made by gRPC itself, not by the server's handler, and is
// mapped by its status code; for Unavailable that depends on mayHaveRun:
//
//   - mayHaveRun false (the call is a read, or it never reached a server)
//     gives kv.CodeUnavailable: nothing was done, the call may be retried;
//   - mayHaveRun true (a write that was handed to a connection before it
//     broke) gives kv.CodeCommitUnknown: the server may have applied it.
//
// A status that also has a BatchErrorDetail becomes a *kv.BatchError whose
// Err is that *kv.Error and whose Applied is the detail's list (never nil).
func ErrorFromStatus(err error, mayHaveRun bool) error {
	if err == nil {
		return nil
	}
	st, _ := status.FromError(err)
	var (
		coded   *kv.Error
		applied *pb.BatchErrorDetail
	)
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *pb.ErrorDetail:
			if d.GetCode() != "" && coded == nil {
				coded = &kv.Error{Code: kv.Code(d.GetCode()), Message: st.Message()}
			}
		case *pb.BatchErrorDetail:
			applied = d
		}
	}
	if coded == nil {
		e := errorFromCode(st, mayHaveRun)
		if applied == nil {
			return e
		}
		// A batch detail without a code detail is not what a groupkv server
		// sends; keep the list anyway, with the code of the status.
		coded = kv.AsError(e)
	}
	if applied != nil {
		return &kv.BatchError{Err: coded, Applied: WriteResultsFromPB(applied.GetApplied())}
	}
	return coded
}

// errorFromCode maps a status without an ErrorDetail, see ErrorFromStatus.
func errorFromCode(st *status.Status, mayHaveRun bool) error {
	var code kv.Code
	switch st.Code() {
	case codes.Canceled:
		return &contextError{msg: st.Message(), err: context.Canceled}
	case codes.DeadlineExceeded:
		return &contextError{msg: st.Message(), err: context.DeadlineExceeded}
	case codes.Unavailable:
		code = kv.CodeUnavailable
		if mayHaveRun {
			code = kv.CodeCommitUnknown
		}
	case codes.InvalidArgument:
		code = kv.CodeInvalidArgument
	case codes.PermissionDenied:
		code = kv.CodePermissionDenied
	case codes.NotFound:
		code = kv.CodeNotFound
	case codes.AlreadyExists:
		code = kv.CodeAlreadyExists
	case codes.Aborted:
		code = kv.CodeTxnAborted
	case codes.OutOfRange:
		code = kv.CodeCompacted
	case codes.FailedPrecondition:
		code = kv.CodeConditionFailed
	case codes.ResourceExhausted:
		// gRPC's own message size limit, on either side.
		code = kv.CodeTooLarge
	case codes.Unimplemented:
		// A server that does not know the RPC (older than this client).
		code = kv.CodeUnimplemented
	case codes.Unknown:
		code = kv.CodeInternal
		if mayHaveRun {
			code = kv.CodeCommitUnknown
		}
	default:
		code = kv.CodeInternal
	}
	return &kv.Error{Code: code, Message: fmt.Sprintf("grpc %s: %s", st.Code(), st.Message())}
}

// contextError is a context error that reached the client as a gRPC status:
// it keeps gRPC's message and matches its context sentinel under errors.Is.
type contextError struct {
	msg string
	err error // context.Canceled or context.DeadlineExceeded
}

func (e *contextError) Error() string { return "groupkv: " + e.err.Error() + ": " + e.msg }
func (e *contextError) Unwrap() error { return e.err }
