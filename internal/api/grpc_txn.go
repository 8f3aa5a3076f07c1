package api

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/groupkv/groupkv/internal/kv"
	pb "github.com/groupkv/groupkv/proto/groupkvpb"
)

// The transaction and Key Groups RPCs of the GroupKV service, over the
// kv.TxnBackend and kv.GroupBackend of the service's Backend: the gRPC
// form of http_txn.go and http_group.go. Each handler validates its
// request as the HTTP form does (convert_txn.go), calls the backend, and
// answers its result or its error (with its kv.Code, see StatusFromError).
// A Backend that is not a kv.TxnBackend (kv.GroupBackend) makes every
// transaction (Key Groups) RPC answer UNIMPLEMENTED with code
// unimplemented, as the HTTP forms answer 501.
//
// An attempt lives on the node that began it: a client must send the
// operations of an attempt to the server that answered its BeginTxn.
//
// TxnGet, TxnScan, TxnGetByTags, TxnWrite and CommitTxn may begin their
// attempt (TxnBegin in place of txn), and TxnWrite and CommitTxn carry
// writes: a handler runs them on the same backend methods a client would
// call one RPC at a time (BeginTxn or BeginGroupTxn, then TxnPut and
// TxnDelete in order, then the operation), so the backend sees exactly
// the calls of the longer form, and the client saves the round trips.

// grpcTxnOps are the Metrics op labels of the transaction and Key Groups
// RPCs: those of the HTTP forms, so that an operation is counted under one
// label whichever protocol carried it. grpcOp derives the labels of the
// other RPCs from their names.
var grpcTxnOps = map[string]string{
	"BeginTxn":      opTxnBegin,
	"TxnGet":        opTxnGet,
	"TxnPut":        opTxnPut,
	"TxnDelete":     opTxnDelete,
	"TxnWrite":      opTxnWrite,
	"TxnScan":       opTxnScan,
	"TxnGetByTags":  opTxnTags,
	"CommitTxn":     opTxnCommit,
	"AbortTxn":      opTxnAbort,
	"ExecTxn":       opTxnExec,
	"CreateGroup":   opGroupCreate,
	"DescribeGroup": opGroupDescribe,
	"ListGroups":    opGroupList,
	"DeleteGroup":   opGroupDelete,
	"BeginGroupTxn": opGroupTxnBegin,
	"ExecGroupTxn":  opGroupTxnExec,
}

// txn returns the kv.TxnBackend of the service, or the error that says
// there is none.
func (s *grpcService) txn() (kv.TxnBackend, error) {
	tb, ok := s.b.(kv.TxnBackend)
	if !ok {
		return nil, kv.Errorf(kv.CodeUnimplemented,
			"this server does not serve transactions: use conditional writes (if_version) and batches, or a server that does")
	}
	return tb, nil
}

// groups returns the kv.GroupBackend of the service, or the error that
// says there is none.
func (s *grpcService) groups() (kv.GroupBackend, error) {
	gb, ok := s.b.(kv.GroupBackend)
	if !ok {
		return nil, kv.Errorf(kv.CodeUnimplemented,
			"this server does not serve key groups: use transactions on the keys, or a server that does")
	}
	return gb, nil
}

// opTxnWrite is the Metrics op label of TxnWrite, which has no HTTP form.
const opTxnWrite = "txn_write"

// TxnTrailer is the trailer in which an operation that began its attempt
// (TxnBegin) and then failed names the attempt it began, so that its
// client can go on in it, abort it or retry it with retry_of.
const TxnTrailer = "groupkv-txn"

// abortBegunTimeout bounds the abort of an attempt a request began when
// its client is gone.
const abortBegunTimeout = 5 * time.Second

// attempt is the attempt an operation runs in: the one it names, or the
// one it began.
type attempt struct {
	id    string
	began bool
}

// resp returns the id to answer in the response's txn field: the
// attempt's if the request began it, else "".
func (a attempt) resp() string {
	if a.began {
		return a.id
	}
	return ""
}

// attemptOf answers the attempt of an operation whose request was
// validated (checkTxnTarget): txn, or a new attempt begun from begin,
// on the TxnBackend or, for a group, the GroupBackend.
func (s *grpcService) attemptOf(ctx context.Context, tb kv.TxnBackend, txn string, begin *pb.TxnBegin) (attempt, error) {
	if begin == nil {
		return attempt{id: txn}, nil
	}
	group, opts, err := TxnBeginFromPB(begin)
	if err != nil {
		return attempt{}, err
	}
	var id string
	if group != "" {
		gb, gerr := s.groups()
		if gerr != nil {
			return attempt{}, gerr
		}
		id, err = gb.BeginGroupTxn(ctx, group, opts)
	} else {
		id, err = tb.BeginTxn(ctx, opts)
	}
	if err != nil {
		return attempt{}, err
	}
	return attempt{id: id, began: true}, nil
}

// failIn is fail for an operation in attempt a. If the request began a,
// the error names it in the TxnTrailer trailer; and if the request's
// context ended (its client is gone and will never learn the id), a is
// aborted, so that it does not hold its locks until it expires, unless
// abort is false (a commit was under way: its outcome is the backend's).
func (s *grpcService) failIn(ctx context.Context, tb kv.TxnBackend, a attempt, err error, abort bool) error {
	return s.failBegun(ctx, s.giveUp(ctx, tb, a, abort), err)
}

// giveUp is what a failed operation in attempt a does before it answers
// its error: it answers the id to name with the error (a's, if the
// request began it, else ""), and aborts an attempt it began whose
// request's context ended, unless abort is false (see failIn).
func (s *grpcService) giveUp(ctx context.Context, tb kv.TxnBackend, a attempt, abort bool) string {
	if !a.began {
		return ""
	}
	if abort && ctx.Err() != nil {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abortBegunTimeout)
		_ = tb.AbortTxn(actx, a.id)
		cancel()
	}
	return a.id
}

// failBegun is fail naming in the TxnTrailer trailer the attempt began,
// if not "".
func (s *grpcService) failBegun(ctx context.Context, began string, err error) error {
	if began != "" {
		_ = grpc.SetTrailer(ctx, metadata.Pairs(TxnTrailer, began))
	}
	return s.fail(ctx, err)
}

// applyWrites applies writes in attempt id, in order, as TxnPut and
// TxnDelete; it stops at the first error and answers it.
func applyWrites(ctx context.Context, tb kv.TxnBackend, id string, writes []kv.TxnOp) error {
	for _, w := range writes {
		var err error
		if w.Op == kv.TxnOpDelete {
			err = tb.TxnDelete(ctx, id, kv.KeyRef{Collection: w.Collection, Key: w.Key})
		} else {
			err = tb.TxnPut(ctx, id, kv.PutItem{Collection: w.Collection, Key: w.Key, Value: w.Value, Tags: w.Tags})
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (s *grpcService) BeginTxn(ctx context.Context, req *pb.BeginTxnRequest) (*pb.BeginTxnResponse, error) {
	tb, err := s.txn()
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	opts, err := TxnOptionsFromPB(req)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	id, err := tb.BeginTxn(ctx, opts)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return &pb.BeginTxnResponse{Txn: id}, nil
}

func (s *grpcService) TxnGet(ctx context.Context, req *pb.TxnGetRequest) (*pb.TxnGetResponse, error) {
	m, began, err := s.txnGet(ctx, req)
	if err != nil {
		return nil, s.failBegun(ctx, began, err)
	}
	return m, nil
}

// txnGet serves a TxnGet, as a unary RPC or a message of the Pipeline
// stream. A request that began its attempt and failed answers the
// attempt's id with the error (the TxnTrailer), and aborts the attempt if
// the request's context ended.
func (s *grpcService) txnGet(ctx context.Context, req *pb.TxnGetRequest) (*pb.TxnGetResponse, string, error) {
	tb, err := s.txn()
	if err != nil {
		return nil, "", err
	}
	if len(req.GetKeys()) > 0 {
		return s.txnBatchGet(ctx, tb, req)
	}
	id, ref, err := TxnGetRequestFromPB(req)
	if err != nil {
		return nil, "", err
	}
	a, err := s.attemptOf(ctx, tb, id, req.GetBegin())
	if err != nil {
		return nil, "", err
	}
	get := tb.TxnGet
	if req.GetForUpdate() {
		get = tb.TxnGetForUpdate
	}
	rec, found, err := get(ctx, a.id, ref)
	if err != nil {
		return nil, s.giveUp(ctx, tb, a, true), err
	}
	m := TxnGetResponseToPB(rec, found)
	m.Txn = a.resp()
	if gs, ok := tb.(kv.GroupSnapshotter); ok && req.GetGroupSnapshot() {
		recs, ok, err := gs.TxnGroupSnapshot(ctx, a.id, maxSnapshotBytes)
		if err != nil {
			return nil, s.giveUp(ctx, tb, a, true), err
		}
		if ok {
			m.Snapshot = BatchGetItemsToPB(recs)
		}
	}
	return m, "", nil
}

// txnBatchGet serves a TxnGet with keys, as txnGet serves one without.
func (s *grpcService) txnBatchGet(ctx context.Context, tb kv.TxnBackend, req *pb.TxnGetRequest) (*pb.TxnGetResponse, string, error) {
	id, refs, err := TxnBatchGetRequestFromPB(req)
	if err != nil {
		return nil, "", err
	}
	a, err := s.attemptOf(ctx, tb, id, req.GetBegin())
	if err != nil {
		return nil, "", err
	}
	items, err := tb.TxnBatchGet(ctx, a.id, refs, req.GetForUpdate())
	if err != nil {
		return nil, s.giveUp(ctx, tb, a, true), err
	}
	return &pb.TxnGetResponse{Items: BatchGetItemsToPB(items), Txn: a.resp()}, "", nil
}

// maxSnapshotBytes bounds the keys, values and tags of a group snapshot
// answered with a get (TxnGetResponse.snapshot): a larger group's members
// are read one get at a time. A transaction that reads one member pays
// for the snapshot without using it: the bound keeps that cost around a
// round trip's on a LAN.
const maxSnapshotBytes = 64 << 10

func (s *grpcService) TxnPut(ctx context.Context, req *pb.TxnPutRequest) (*pb.TxnPutResponse, error) {
	tb, err := s.txn()
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	id, item, err := TxnPutRequestFromPB(req)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	if err := tb.TxnPut(ctx, id, item); err != nil {
		return nil, s.fail(ctx, err)
	}
	return &pb.TxnPutResponse{}, nil
}

func (s *grpcService) TxnDelete(ctx context.Context, req *pb.TxnDeleteRequest) (*pb.TxnDeleteResponse, error) {
	tb, err := s.txn()
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	id, ref, err := TxnDeleteRequestFromPB(req)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	if err := tb.TxnDelete(ctx, id, ref); err != nil {
		return nil, s.fail(ctx, err)
	}
	return &pb.TxnDeleteResponse{}, nil
}

// TxnWrite applies its writes in order, as TxnPut and TxnDelete would.
func (s *grpcService) TxnWrite(ctx context.Context, req *pb.TxnWriteRequest) (*pb.TxnWriteResponse, error) {
	tb, err := s.txn()
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	if err := checkTxnTarget(req.GetTxn(), req.GetBegin()); err != nil {
		return nil, s.fail(ctx, err)
	}
	writes, err := TxnWritesFromPB(req.GetWrites())
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	a, err := s.attemptOf(ctx, tb, req.GetTxn(), req.GetBegin())
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	if err := applyWrites(ctx, tb, a.id, writes); err != nil {
		return nil, s.failIn(ctx, tb, a, err, true)
	}
	return &pb.TxnWriteResponse{Txn: a.resp()}, nil
}

func (s *grpcService) TxnScan(ctx context.Context, req *pb.TxnScanRequest) (*pb.ScanResponse, error) {
	return txnRangeRead(ctx, s, req.GetBegin(), func() (string, kv.ScanRequest, error) { return TxnScanRequestFromPB(req) }, kv.TxnBackend.TxnScan)
}

func (s *grpcService) TxnGetByTags(ctx context.Context, req *pb.TxnTagQuery) (*pb.ScanResponse, error) {
	return txnRangeRead(ctx, s, req.GetBegin(), func() (string, kv.TagQuery, error) { return TxnTagQueryFromPB(req) }, kv.TxnBackend.TxnGetByTags)
}

// txnRangeRead runs a scan or tag query of a transaction: decode the
// request, begin its attempt if it asks to, read, and answer the page with
// the attempt's id if the request began it.
func txnRangeRead[Q any](ctx context.Context, s *grpcService, begin *pb.TxnBegin, decode func() (string, Q, error),
	read func(kv.TxnBackend, context.Context, string, Q) (kv.ScanResult, error)) (*pb.ScanResponse, error) {
	tb, err := s.txn()
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	id, q, err := decode()
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	a, err := s.attemptOf(ctx, tb, id, begin)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	res, err := read(tb, ctx, a.id, q)
	if err != nil {
		return nil, s.failIn(ctx, tb, a, err, true)
	}
	m := ScanResultToPB(res)
	m.Txn = a.resp()
	return m, nil
}

// CommitTxn applies the request's writes, then commits. A write that
// fails aborts the attempt (it is not left half-written for a commit
// that will not come; one that failed with txn_aborted is over already)
// and is the commit's error — but for a write refused because the backend
// does not know the attempt (kv.TxnUnknownError): the attempt may have
// committed (this may be its commit sent again), so the commit answers
// commit_unknown, never txn_aborted.
func (s *grpcService) CommitTxn(ctx context.Context, req *pb.CommitTxnRequest) (*pb.CommitTxnResponse, error) {
	m, began, err := s.commitTxn(ctx, req)
	if err != nil {
		return nil, s.failBegun(ctx, began, err)
	}
	return m, nil
}

// commitTxn serves a CommitTxn, as a unary RPC or a message of the
// Pipeline stream; a request that began its attempt and failed answers
// the attempt's id with the error (see txnGet).
func (s *grpcService) commitTxn(ctx context.Context, req *pb.CommitTxnRequest) (*pb.CommitTxnResponse, string, error) {
	tb, err := s.txn()
	if err != nil {
		return nil, "", err
	}
	if err := checkTxnTarget(req.GetTxn(), req.GetBegin()); err != nil {
		return nil, "", err
	}
	writes, err := TxnWritesFromPB(req.GetWrites())
	if err != nil {
		return nil, "", err
	}
	reads, err := SnapshotReadsFromPB(req.GetSnapshotReads())
	if err != nil {
		return nil, "", err
	}
	cached, err := CachedReadsFromPB(req.GetCachedReads())
	if err != nil {
		return nil, "", err
	}
	gs, _ := tb.(kv.GroupSnapshotter)
	if len(reads) > 0 && (gs == nil || req.GetTxn() == "") {
		return nil, "", kv.Errorf(kv.CodeInvalidArgument, "snapshot_reads name reads from a group snapshot a get of this attempt answered: an attempt begun by its commit has none")
	}
	if len(cached) > 0 && len(reads) > 0 {
		return nil, "", kv.Errorf(kv.CodeInvalidArgument, "a commit names reads from the attempt's snapshot (snapshot_reads) or from one its client kept (cached_reads), not both")
	}
	if len(cached) > 0 && gs == nil {
		return nil, "", kv.Errorf(kv.CodeInvalidArgument, "cached_reads name reads from a snapshot of a key group: this server has no group transactions")
	}
	a, err := s.attemptOf(ctx, tb, req.GetTxn(), req.GetBegin())
	if err != nil {
		return nil, "", err
	}
	if len(reads) > 0 || len(cached) > 0 {
		err := gs.TxnGroupReads(ctx, a.id, reads)
		if err == nil {
			err = gs.TxnGroupCachedReads(ctx, a.id, cached, len(writes) > 0)
		}
		if err != nil {
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abortBegunTimeout)
			_ = tb.AbortTxn(actx, a.id) // a failed abort leaves the attempt to expire
			cancel()
			return nil, s.giveUp(ctx, tb, a, false), err
		}
	}
	if err := applyWrites(ctx, tb, a.id, writes); err != nil {
		if kv.IsTxnUnknown(err) {
			return nil, s.giveUp(ctx, tb, a, false), kv.Errorf(kv.CodeCommitUnknown,
				"the commit's writes could not be applied, and whether the attempt committed cannot be told: %s", kv.AsError(err).Message)
		}
		if kv.CodeOf(err) != kv.CodeTxnAborted { // else the backend ended it
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abortBegunTimeout)
			_ = tb.AbortTxn(actx, a.id) // a failed abort leaves the locks to expire
			cancel()
		}
		return nil, s.giveUp(ctx, tb, a, false), err
	}
	if gs != nil && req.GetGroupSnapshot() {
		v, snap, err := gs.TxnGroupCommit(ctx, a.id, maxSnapshotBytes)
		if err != nil {
			return nil, s.giveUp(ctx, tb, a, false), err
		}
		return &pb.CommitTxnResponse{Version: v, Txn: a.resp(), Snapshot: BatchGetItemsToPB(snap)}, "", nil
	}
	v, err := tb.CommitTxn(ctx, a.id)
	if err != nil {
		return nil, s.giveUp(ctx, tb, a, false), err
	}
	return &pb.CommitTxnResponse{Version: v, Txn: a.resp()}, "", nil
}

// AbortTxn answers OK for an attempt that is unknown or already finished
// too: aborting is idempotent (kv.TxnBackend.AbortTxn).
func (s *grpcService) AbortTxn(ctx context.Context, req *pb.AbortTxnRequest) (*pb.AbortTxnResponse, error) {
	tb, err := s.txn()
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	if err := checkTxnID(req.GetTxn()); err != nil {
		return nil, s.fail(ctx, err)
	}
	if err := tb.AbortTxn(ctx, req.GetTxn()); err != nil {
		return nil, s.fail(ctx, err)
	}
	return &pb.AbortTxnResponse{}, nil
}

func (s *grpcService) ExecTxn(ctx context.Context, req *pb.ExecTxnRequest) (*pb.ExecTxnResponse, error) {
	tb, err := s.txn()
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	er, err := ExecRequestFromPB(req)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	res, err := tb.ExecTxn(ctx, er)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return ExecResultToPB(res), nil
}

func (s *grpcService) CreateGroup(ctx context.Context, req *pb.CreateGroupRequest) (*pb.CreateGroupResponse, error) {
	gb, err := s.groups()
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	spec, err := GroupSpecFromPB(req)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	created, err := gb.CreateGroup(ctx, spec)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return GroupCreatedToPB(created), nil
}

func (s *grpcService) DescribeGroup(ctx context.Context, req *pb.DescribeGroupRequest) (*pb.GroupInfo, error) {
	gb, err := s.groups()
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	if err := ValidateGroupID(req.GetId()); err != nil {
		return nil, s.fail(ctx, err)
	}
	info, err := gb.DescribeGroup(ctx, req.GetId())
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return GroupInfoToPB(info), nil
}

func (s *grpcService) ListGroups(ctx context.Context, _ *pb.ListGroupsRequest) (*pb.ListGroupsResponse, error) {
	gb, err := s.groups()
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	infos, err := gb.ListGroups(ctx)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return GroupInfosToPB(infos), nil
}

// DeleteGroup answers once the group is gone: the backend returns when
// every key is owned by its shard again.
func (s *grpcService) DeleteGroup(ctx context.Context, req *pb.DeleteGroupRequest) (*pb.DeleteGroupResponse, error) {
	gb, err := s.groups()
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	if err := ValidateGroupID(req.GetId()); err != nil {
		return nil, s.fail(ctx, err)
	}
	if err := gb.DeleteGroup(ctx, req.GetId()); err != nil {
		return nil, s.fail(ctx, err)
	}
	return &pb.DeleteGroupResponse{}, nil
}

func (s *grpcService) BeginGroupTxn(ctx context.Context, req *pb.BeginGroupTxnRequest) (*pb.BeginTxnResponse, error) {
	gb, err := s.groups()
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	id, opts, err := GroupTxnOptionsFromPB(req)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	txn, err := gb.BeginGroupTxn(ctx, id, opts)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return &pb.BeginTxnResponse{Txn: txn}, nil
}

func (s *grpcService) ExecGroupTxn(ctx context.Context, req *pb.ExecGroupTxnRequest) (*pb.ExecTxnResponse, error) {
	gb, err := s.groups()
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	id, er, err := GroupExecRequestFromPB(req)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	res, err := gb.ExecGroupTxn(ctx, id, er)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return ExecResultToPB(res), nil
}
