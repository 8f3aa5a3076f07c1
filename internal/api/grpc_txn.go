package api

import (
	"context"

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

// grpcTxnOps are the Metrics op labels of the transaction and Key Groups
// RPCs: those of the HTTP forms, so that an operation is counted under one
// label whichever protocol carried it. grpcOp derives the labels of the
// other RPCs from their names.
var grpcTxnOps = map[string]string{
	"BeginTxn":      opTxnBegin,
	"TxnGet":        opTxnGet,
	"TxnPut":        opTxnPut,
	"TxnDelete":     opTxnDelete,
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
	tb, err := s.txn()
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	id, ref, err := TxnGetRequestFromPB(req)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	rec, found, err := tb.TxnGet(ctx, id, ref)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return TxnGetResponseToPB(rec, found), nil
}

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

func (s *grpcService) TxnScan(ctx context.Context, req *pb.TxnScanRequest) (*pb.ScanResponse, error) {
	tb, err := s.txn()
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	id, sr, err := TxnScanRequestFromPB(req)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	res, err := tb.TxnScan(ctx, id, sr)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return ScanResultToPB(res), nil
}

func (s *grpcService) TxnGetByTags(ctx context.Context, req *pb.TxnTagQuery) (*pb.ScanResponse, error) {
	tb, err := s.txn()
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	id, q, err := TxnTagQueryFromPB(req)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	res, err := tb.TxnGetByTags(ctx, id, q)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return ScanResultToPB(res), nil
}

func (s *grpcService) CommitTxn(ctx context.Context, req *pb.CommitTxnRequest) (*pb.CommitTxnResponse, error) {
	tb, err := s.txn()
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	if err := checkTxnID(req.GetTxn()); err != nil {
		return nil, s.fail(ctx, err)
	}
	v, err := tb.CommitTxn(ctx, req.GetTxn())
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return &pb.CommitTxnResponse{Version: v}, nil
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
