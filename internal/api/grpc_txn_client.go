package api

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"

	"github.com/groupkv/groupkv/internal/kv"
	pb "github.com/groupkv/groupkv/proto/groupkvpb"
)

// TxnClient is a kv.TxnBackend and kv.GroupBackend over the transaction and
// Key Groups RPCs of a GroupKV server: the client side of grpc_txn.go,
// shared by the Go client (groupkv.Dial) and the benchmark drivers. An
// attempt lives on the node that began it, so a TxnClient must be made on a
// connection to one node, never on one that balances calls across nodes.
//
// Its errors are the server's, with their kv.Code (ErrorFromStatus): a
// client tells txn_aborted, commit_unknown and unavailable apart as over
// HTTP. A call that could not reach the server is unavailable. A call that
// may change the store when it returns (CommitTxn, an ExecTxn or
// ExecGroupTxn with a put or a delete, CreateGroup, DeleteGroup) and whose
// connection broke after it was sent is commit_unknown: it may have been
// applied. TxnPut and TxnDelete apply nothing before the commit, so theirs
// is unavailable.
//
// Its kv.TxnBackend methods send one RPC per step, as the HTTP forms do;
// NewAttempt runs an attempt in fewer round trips (TxnAttempt), as the Go
// client and the benchmark drivers do.
type TxnClient struct {
	c pb.GroupKVClient
	// pipe, when not nil, carries attempts' gets and commits where its
	// server serves them (UsePipeline).
	pipe *PipelineClient
	// fail turns the error of an RPC into the caller's; sent says whether
	// a call that may change the store reached a connection.
	fail func(err error, sent bool) error

	// snaps are the snapshots of groups kept from the commits of
	// attempts with kv.TxnOptions.CachedSnapshot, by group id, each by
	// keptKey; never changed once kept (attempts read them unlocked).
	snapMu sync.Mutex
	snaps  map[string]map[string]kv.BatchGetItem
}

// maxKeptSnapshots bounds the groups whose snapshot a TxnClient keeps; a
// new one past it replaces one of them.
const maxKeptSnapshots = 1024

// keptSnapshot answers the snapshot of group kept, nil if none.
func (t *TxnClient) keptSnapshot(group string) map[string]kv.BatchGetItem {
	t.snapMu.Lock()
	defer t.snapMu.Unlock()
	return t.snaps[group]
}

// snapshotMap maps the items of a group's snapshot by keptKey.
func snapshotMap(items []kv.BatchGetItem) map[string]kv.BatchGetItem {
	snap := make(map[string]kv.BatchGetItem, len(items))
	for _, it := range items {
		snap[keptKey(it.Collection, it.Key)] = it
	}
	return snap
}

// keepSnapshot keeps items as the snapshot of group.
func (t *TxnClient) keepSnapshot(group string, items []kv.BatchGetItem) {
	snap := snapshotMap(items)
	t.snapMu.Lock()
	defer t.snapMu.Unlock()
	if t.snaps == nil {
		t.snaps = make(map[string]map[string]kv.BatchGetItem)
	}
	if _, ok := t.snaps[group]; !ok && len(t.snaps) >= maxKeptSnapshots {
		for g := range t.snaps {
			delete(t.snaps, g)
			break
		}
	}
	t.snaps[group] = snap
}

// forgetSnapshot drops the snapshot of group kept, if any.
func (t *TxnClient) forgetSnapshot(group string) {
	t.snapMu.Lock()
	defer t.snapMu.Unlock()
	delete(t.snaps, group)
}

var (
	_ kv.TxnBackend   = (*TxnClient)(nil)
	_ kv.GroupBackend = (*TxnClient)(nil)
)

// NewTxnClient returns a TxnClient over c. fail, when not nil, replaces
// ErrorFromStatus as the conversion of an RPC's error (the Go client uses
// it to answer "closed" after Close); it gets the RPC's error and whether a
// call that may change the store reached a connection.
func NewTxnClient(c pb.GroupKVClient, fail func(err error, sent bool) error) *TxnClient {
	if fail == nil {
		fail = ErrorFromStatus
	}
	return &TxnClient{c: c, fail: fail}
}

// UsePipeline makes the attempts of t (NewAttempt) send their gets and
// their commits as messages of p's Pipeline stream, where its server serves
// them there: p must be a client of the same node. The caller closes p.
func (t *TxnClient) UsePipeline(p *PipelineClient) { t.pipe = p }

func (t *TxnClient) BeginTxn(ctx context.Context, opts kv.TxnOptions) (string, error) {
	m, err := t.c.BeginTxn(ctx, TxnOptionsToPB(opts))
	if err != nil {
		return "", t.fail(err, false)
	}
	if m.GetTxn() == "" {
		return "", kv.Errorf(kv.CodeInternal, "BeginTxn: the answer names no transaction")
	}
	return m.GetTxn(), nil
}

// TxnGet answers the record with its key set to ref.Key when found.
func (t *TxnClient) TxnGet(ctx context.Context, txn string, ref kv.KeyRef) (kv.Record, bool, error) {
	return t.txnGet(ctx, txn, ref, false)
}

// TxnGetForUpdate is TxnGet taking the key's lock exclusively.
func (t *TxnClient) TxnGetForUpdate(ctx context.Context, txn string, ref kv.KeyRef) (kv.Record, bool, error) {
	return t.txnGet(ctx, txn, ref, true)
}

// TxnBatchGet reads refs in one TxnGet (TxnGetRequest.keys).
func (t *TxnClient) TxnBatchGet(ctx context.Context, txn string, refs []kv.KeyRef, forUpdate bool) ([]kv.BatchGetItem, error) {
	m, err := t.c.TxnGet(ctx, TxnBatchGetRequestToPB(txn, nil, refs, forUpdate))
	if err != nil {
		return nil, t.fail(err, false)
	}
	return TxnBatchGetResponseFromPB(m, refs)
}

func (t *TxnClient) txnGet(ctx context.Context, txn string, ref kv.KeyRef, forUpdate bool) (kv.Record, bool, error) {
	m, err := t.c.TxnGet(ctx, &pb.TxnGetRequest{Txn: txn, Collection: ref.Collection, Key: ref.Key, ForUpdate: forUpdate})
	if err != nil {
		return kv.Record{}, false, t.fail(err, false)
	}
	rec, found := TxnGetResponseFromPB(m)
	if found {
		rec.Key = ref.Key
	}
	return rec, found, nil
}

// TxnPut refuses an item with an IfVersion before sending it: a
// transaction compares by reading.
func (t *TxnClient) TxnPut(ctx context.Context, txn string, item kv.PutItem) error {
	if item.IfVersion != nil {
		return kv.Errorf(kv.CodeInvalidArgument, "a transaction's put takes no IfVersion: read the key in the transaction and compare its version")
	}
	_, err := t.c.TxnPut(ctx, &pb.TxnPutRequest{Txn: txn, Collection: item.Collection, Key: item.Key, Value: item.Value, Tags: item.Tags})
	if err != nil {
		return t.fail(err, false)
	}
	return nil
}

func (t *TxnClient) TxnDelete(ctx context.Context, txn string, ref kv.KeyRef) error {
	if _, err := t.c.TxnDelete(ctx, &pb.TxnDeleteRequest{Txn: txn, Collection: ref.Collection, Key: ref.Key}); err != nil {
		return t.fail(err, false)
	}
	return nil
}

// TxnScan refuses a request with a Version: an attempt reads at its own
// time.
func (t *TxnClient) TxnScan(ctx context.Context, txn string, req kv.ScanRequest) (kv.ScanResult, error) {
	if req.Version != 0 {
		return kv.ScanResult{}, kv.Errorf(kv.CodeInvalidArgument, "a transaction reads at its own time: leave ScanRequest.Version 0")
	}
	m, err := t.c.TxnScan(ctx, TxnScanRequestToPB(txn, req))
	if err != nil {
		return kv.ScanResult{}, t.fail(err, false)
	}
	return ScanResultFromPB(m), nil
}

// TxnGetByTags refuses a query with a Version, as TxnScan does.
func (t *TxnClient) TxnGetByTags(ctx context.Context, txn string, q kv.TagQuery) (kv.ScanResult, error) {
	if q.Version != 0 {
		return kv.ScanResult{}, kv.Errorf(kv.CodeInvalidArgument, "a transaction reads at its own time: leave TagQuery.Version 0")
	}
	m, err := t.c.TxnGetByTags(ctx, TxnTagQueryToPB(txn, q))
	if err != nil {
		return kv.ScanResult{}, t.fail(err, false)
	}
	return ScanResultFromPB(m), nil
}

func (t *TxnClient) CommitTxn(ctx context.Context, txn string) (uint64, error) {
	var p peer.Peer
	m, err := t.c.CommitTxn(ctx, &pb.CommitTxnRequest{Txn: txn}, grpc.Peer(&p))
	if err != nil {
		return 0, t.fail(err, p.Addr != nil)
	}
	return m.GetVersion(), nil
}

func (t *TxnClient) AbortTxn(ctx context.Context, txn string) error {
	if _, err := t.c.AbortTxn(ctx, &pb.AbortTxnRequest{Txn: txn}); err != nil {
		return t.fail(err, false)
	}
	return nil
}

func (t *TxnClient) ExecTxn(ctx context.Context, req kv.ExecRequest) (kv.ExecResult, error) {
	var p peer.Peer
	m, err := t.c.ExecTxn(ctx, ExecRequestToPB(req), grpc.Peer(&p))
	if err != nil {
		return kv.ExecResult{}, t.fail(err, p.Addr != nil && execWrites(req))
	}
	return ExecResultFromPB(m), nil
}

// execWrites reports whether req may write: whether a broken connection
// leaves its outcome unknown.
func execWrites(req kv.ExecRequest) bool {
	for _, ops := range [][]kv.TxnOp{req.Then, req.Else} {
		for _, op := range ops {
			if op.Op != kv.TxnOpGet {
				return true
			}
		}
	}
	return false
}

func (t *TxnClient) CreateGroup(ctx context.Context, spec kv.GroupSpec) (kv.GroupCreated, error) {
	var p peer.Peer
	m, err := t.c.CreateGroup(ctx, GroupSpecToPB(spec), grpc.Peer(&p))
	if err != nil {
		return kv.GroupCreated{}, t.fail(err, p.Addr != nil)
	}
	return GroupCreatedFromPB(m), nil
}

func (t *TxnClient) DescribeGroup(ctx context.Context, id string) (kv.GroupInfo, error) {
	m, err := t.c.DescribeGroup(ctx, &pb.DescribeGroupRequest{Id: id})
	if err != nil {
		return kv.GroupInfo{}, t.fail(err, false)
	}
	return GroupInfoFromPB(m), nil
}

func (t *TxnClient) ListGroups(ctx context.Context) ([]kv.GroupInfo, error) {
	m, err := t.c.ListGroups(ctx, &pb.ListGroupsRequest{})
	if err != nil {
		return nil, t.fail(err, false)
	}
	return GroupInfosFromPB(m), nil
}

func (t *TxnClient) DeleteGroup(ctx context.Context, id string) error {
	t.forgetSnapshot(id)
	var p peer.Peer
	if _, err := t.c.DeleteGroup(ctx, &pb.DeleteGroupRequest{Id: id}, grpc.Peer(&p)); err != nil {
		return t.fail(err, p.Addr != nil)
	}
	return nil
}

func (t *TxnClient) BeginGroupTxn(ctx context.Context, id string, opts kv.TxnOptions) (string, error) {
	m, err := t.c.BeginGroupTxn(ctx, GroupTxnOptionsToPB(id, opts))
	if err != nil {
		return "", t.fail(err, false)
	}
	if m.GetTxn() == "" {
		return "", kv.Errorf(kv.CodeInternal, "BeginGroupTxn: the answer names no transaction")
	}
	return m.GetTxn(), nil
}

func (t *TxnClient) ExecGroupTxn(ctx context.Context, id string, req kv.ExecRequest) (kv.ExecResult, error) {
	var p peer.Peer
	m, err := t.c.ExecGroupTxn(ctx, GroupExecRequestToPB(id, req), grpc.Peer(&p))
	if err != nil {
		return kv.ExecResult{}, t.fail(err, p.Addr != nil && execWrites(req))
	}
	return ExecResultFromPB(m), nil
}
