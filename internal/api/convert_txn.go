package api

import (
	"bytes"
	"fmt"

	"github.com/groupkv/groupkv/internal/kv"
	pb "github.com/groupkv/groupkv/proto/groupkvpb"
)

// This file converts the transaction and Key Groups types of kv to and from
// their groupkv.v1 messages, for the gRPC server (grpc_txn.go) and its
// client (TxnClient). The ...FromPB functions that a server uses on a
// request also validate it, as the HTTP forms validate their bodies, and
// answer *kv.Error values with code invalid_argument (or too_large) whose
// messages name the element, as "then_ops[2]". Limits a node may raise
// (value size, operations per transaction, members per group) are left to
// the backend, which enforces its own.
//
// As in convert.go, bytes and lists cross as proto3 fields, which do not
// tell nil from empty.

// TxnOptionsToPB converts the options of BeginTxn.
func TxnOptionsToPB(o kv.TxnOptions) *pb.BeginTxnRequest {
	return &pb.BeginTxnRequest{Isolation: string(o.Isolation), RetryOf: o.RetryOf, ReadOnly: o.ReadOnly}
}

// TxnOptionsFromPB validates the options of a begin: an empty isolation is
// serializable.
func TxnOptionsFromPB(m *pb.BeginTxnRequest) (kv.TxnOptions, error) {
	return validTxnOptions(kv.TxnOptions{Isolation: kv.Isolation(m.GetIsolation()), RetryOf: m.GetRetryOf(), ReadOnly: m.GetReadOnly()})
}

// GroupTxnOptionsToPB converts the options of BeginGroupTxn.
func GroupTxnOptionsToPB(id string, o kv.TxnOptions) *pb.BeginGroupTxnRequest {
	return &pb.BeginGroupTxnRequest{Group: id, Isolation: string(o.Isolation), RetryOf: o.RetryOf, ReadOnly: o.ReadOnly}
}

// GroupTxnOptionsFromPB validates a group begin: the group id, and options
// whose isolation is serializable (or empty).
func GroupTxnOptionsFromPB(m *pb.BeginGroupTxnRequest) (string, kv.TxnOptions, error) {
	if err := ValidateGroupID(m.GetGroup()); err != nil {
		return "", kv.TxnOptions{}, err
	}
	opts, err := validTxnOptions(kv.TxnOptions{Isolation: kv.Isolation(m.GetIsolation()), RetryOf: m.GetRetryOf(), ReadOnly: m.GetReadOnly()})
	if err != nil {
		return "", kv.TxnOptions{}, err
	}
	if err := checkGroupIsolation(opts.Isolation); err != nil {
		return "", kv.TxnOptions{}, err
	}
	return m.GetGroup(), opts, nil
}

// checkTxnID checks the attempt id of an operation.
func checkTxnID(id string) error {
	if id == "" {
		return kv.Errorf(kv.CodeInvalidArgument, "no transaction: give txn, the id BeginTxn or BeginGroupTxn answered")
	}
	return nil
}

// checkTxnTarget checks that an operation names its attempt by exactly one
// of txn (an attempt begun before) and begin (one to begin with it).
func checkTxnTarget(id string, begin *pb.TxnBegin) error {
	switch {
	case id == "" && begin == nil:
		return kv.Errorf(kv.CodeInvalidArgument, "no transaction: give txn, the id BeginTxn or BeginGroupTxn answered, or begin, to begin one with this request")
	case id != "" && begin != nil:
		return kv.Errorf(kv.CodeInvalidArgument, "both txn and begin given: give txn to run in attempt %q, or begin to begin a new one, not both", clip(id))
	}
	return nil
}

// TxnBeginToPB converts the begin an operation carries: of a group
// transaction of group id, or of a general one when id is empty.
func TxnBeginToPB(id string, o kv.TxnOptions) *pb.TxnBegin {
	return &pb.TxnBegin{Group: id, Isolation: string(o.Isolation), RetryOf: o.RetryOf, ReadOnly: o.ReadOnly}
}

// TxnBeginFromPB validates the begin an operation carries as BeginTxn (no
// group) or BeginGroupTxn (a group) validate theirs; it answers the group
// ("" for a general transaction) and the options.
func TxnBeginFromPB(m *pb.TxnBegin) (string, kv.TxnOptions, error) {
	if m.GetGroup() != "" {
		return GroupTxnOptionsFromPB(&pb.BeginGroupTxnRequest{Group: m.GetGroup(), Isolation: m.GetIsolation(), RetryOf: m.GetRetryOf(), ReadOnly: m.GetReadOnly()})
	}
	opts, err := TxnOptionsFromPB(&pb.BeginTxnRequest{Isolation: m.GetIsolation(), RetryOf: m.GetRetryOf(), ReadOnly: m.GetReadOnly()})
	return "", opts, err
}

// TxnWritesToPB converts the writes of an attempt that a TxnWrite or a
// CommitTxn carries: puts and deletes.
func TxnWritesToPB(ops []kv.TxnOp) []*pb.TxnOp {
	if len(ops) == 0 {
		return nil
	}
	return txnOpsToPB(ops)
}

// TxnWritesFromPB validates the writes a TxnWrite or a CommitTxn carries:
// each a put or a delete of a valid key, validated as TxnPut and TxnDelete
// validate theirs (a put's tags; only a put has a value or tags).
func TxnWritesFromPB(ops []*pb.TxnOp) ([]kv.TxnOp, error) {
	out, _, err := txnOpsFromPB("writes", ops)
	if err != nil {
		return nil, err
	}
	for i, op := range out {
		if op.Op == kv.TxnOpGet {
			return nil, kv.Errorf(kv.CodeInvalidArgument, `writes[%d]: a get is not a write: give "put" or "delete" (read with TxnGet)`, i)
		}
	}
	return out, nil
}

// keyRefFromPB validates a collection and key of a request.
func keyRefFromPB(coll string, key []byte) (kv.KeyRef, error) {
	if err := kv.ValidateCollectionName(coll); err != nil {
		return kv.KeyRef{}, err
	}
	if err := kv.ValidateKey(key); err != nil {
		return kv.KeyRef{}, err
	}
	return kv.KeyRef{Collection: coll, Key: key}, nil
}

// TxnGetRequestFromPB validates a get in an attempt.
func TxnGetRequestFromPB(m *pb.TxnGetRequest) (string, kv.KeyRef, error) {
	if err := checkTxnTarget(m.GetTxn(), m.GetBegin()); err != nil {
		return "", kv.KeyRef{}, err
	}
	ref, err := keyRefFromPB(m.GetCollection(), m.GetKey())
	return m.GetTxn(), ref, err
}

// TxnBatchGetRequestToPB makes the TxnGet of a batch get in an attempt
// (txn, or begin when it begins one).
func TxnBatchGetRequestToPB(txn string, begin *pb.TxnBegin, refs []kv.KeyRef, forUpdate bool) *pb.TxnGetRequest {
	keys := make([]*pb.KeyRef, len(refs))
	for i, r := range refs {
		keys[i] = &pb.KeyRef{Collection: r.Collection, Key: r.Key}
	}
	return &pb.TxnGetRequest{Txn: txn, Begin: begin, Keys: keys, ForUpdate: forUpdate}
}

// TxnBatchGetRequestFromPB validates a batch get in an attempt (a TxnGet
// with keys).
func TxnBatchGetRequestFromPB(m *pb.TxnGetRequest) (string, []kv.KeyRef, error) {
	if err := checkTxnTarget(m.GetTxn(), m.GetBegin()); err != nil {
		return "", nil, err
	}
	if m.GetCollection() != "" || len(m.GetKey()) > 0 || m.GetGroupSnapshot() {
		return "", nil, kv.Errorf(kv.CodeInvalidArgument, "a batch get (keys) takes no collection, key or group_snapshot of its own")
	}
	if len(m.GetKeys()) > kv.DefaultMaxBatchKeys {
		return "", nil, kv.Errorf(kv.CodeTooLarge, "the batch has %d keys, the limit is %d", len(m.GetKeys()), kv.DefaultMaxBatchKeys)
	}
	refs := make([]kv.KeyRef, len(m.GetKeys()))
	for i, k := range m.GetKeys() {
		ref, err := keyRefFromPB(k.GetCollection(), k.GetKey())
		if err != nil {
			return "", nil, kv.Errorf(kv.CodeOf(err), "keys[%d]: %s", i, kv.AsError(err).Message)
		}
		refs[i] = ref
	}
	return m.GetTxn(), refs, nil
}

// TxnBatchGetResponseFromPB reads the answer of a batch get of refs,
// checking that it answers each of them, in order.
func TxnBatchGetResponseFromPB(m *pb.TxnGetResponse, refs []kv.KeyRef) ([]kv.BatchGetItem, error) {
	items := BatchGetItemsFromPB(m.GetItems())
	if len(items) != len(refs) {
		return nil, kv.Errorf(kv.CodeInternal, "a batch get of %d keys was answered %d items (is the server older than batch gets in transactions?)", len(refs), len(items))
	}
	for i := range items {
		if items[i].Collection != refs[i].Collection || !bytes.Equal(items[i].Key, refs[i].Key) {
			return nil, kv.Errorf(kv.CodeInternal, "a batch get's item %d answers key %q of %q, not the key asked for", i, items[i].Key, items[i].Collection)
		}
	}
	return items, nil
}

// TxnGetResponseToPB converts the answer of a get in an attempt.
func TxnGetResponseToPB(rec kv.Record, found bool) *pb.TxnGetResponse {
	if !found {
		return &pb.TxnGetResponse{}
	}
	return &pb.TxnGetResponse{Found: true, Value: rec.Value, Tags: rec.Tags, Version: rec.Version}
}

// TxnGetResponseFromPB is the inverse of TxnGetResponseToPB; the key is
// not in the answer and is left nil.
func TxnGetResponseFromPB(m *pb.TxnGetResponse) (kv.Record, bool) {
	if !m.GetFound() {
		return kv.Record{}, false
	}
	return kv.Record{Value: m.GetValue(), Tags: m.GetTags(), Version: m.GetVersion()}, true
}

// SnapshotReadsFromPB validates the snapshot reads of a commit.
func SnapshotReadsFromPB(m []*pb.KeyRef) ([]kv.KeyRef, error) {
	out := make([]kv.KeyRef, len(m))
	for i, r := range m {
		ref, err := keyRefFromPB(r.GetCollection(), r.GetKey())
		if err != nil {
			return nil, kv.Errorf(kv.CodeInvalidArgument, "snapshot_reads[%d]: %s", i, kv.AsError(err).Message)
		}
		out[i] = ref
	}
	return out, nil
}

// CachedReadsFromPB validates the cached_reads of a commit: each names a
// key, and the version and presence it was read at (its value and tags,
// if sent, are ignored).
func CachedReadsFromPB(m []*pb.BatchGetItem) ([]kv.BatchGetItem, error) {
	out := make([]kv.BatchGetItem, len(m))
	for i, r := range m {
		ref, err := keyRefFromPB(r.GetCollection(), r.GetKey())
		if err != nil {
			return nil, kv.Errorf(kv.CodeInvalidArgument, "cached_reads[%d]: %s", i, kv.AsError(err).Message)
		}
		out[i] = kv.BatchGetItem{Collection: ref.Collection, Key: ref.Key, Found: r.GetFound(), Version: r.GetVersion()}
	}
	return out, nil
}

// TxnPutRequestFromPB validates a put in an attempt: its key and tags.
func TxnPutRequestFromPB(m *pb.TxnPutRequest) (string, kv.PutItem, error) {
	if err := checkTxnID(m.GetTxn()); err != nil {
		return "", kv.PutItem{}, err
	}
	ref, err := keyRefFromPB(m.GetCollection(), m.GetKey())
	if err != nil {
		return "", kv.PutItem{}, err
	}
	if err := kv.ValidateTags(m.GetTags()); err != nil {
		return "", kv.PutItem{}, err
	}
	return m.GetTxn(), kv.PutItem{Collection: ref.Collection, Key: ref.Key, Value: m.GetValue(), Tags: m.GetTags()}, nil
}

// TxnDeleteRequestFromPB validates a delete in an attempt.
func TxnDeleteRequestFromPB(m *pb.TxnDeleteRequest) (string, kv.KeyRef, error) {
	if err := checkTxnID(m.GetTxn()); err != nil {
		return "", kv.KeyRef{}, err
	}
	ref, err := keyRefFromPB(m.GetCollection(), m.GetKey())
	return m.GetTxn(), ref, err
}

// TxnScanRequestToPB converts a scan in attempt txn; req.Version is not
// sent (an attempt reads at its own time).
func TxnScanRequestToPB(txn string, req kv.ScanRequest) *pb.TxnScanRequest {
	return &pb.TxnScanRequest{Txn: txn, Collection: req.Collection, Start: req.Start, End: req.End,
		Limit: int64(req.Limit), Reverse: req.Reverse, Page: req.Page}
}

// TxnScanRequestFromPB validates a scan in an attempt, as the HTTP form
// does: the collection, the range and the page size.
func TxnScanRequestFromPB(m *pb.TxnScanRequest) (string, kv.ScanRequest, error) {
	if err := checkTxnTarget(m.GetTxn(), m.GetBegin()); err != nil {
		return "", kv.ScanRequest{}, err
	}
	if err := kv.ValidateCollectionName(m.GetCollection()); err != nil {
		return "", kv.ScanRequest{}, err
	}
	if err := checkSpan(m.GetStart(), m.GetEnd()); err != nil {
		return "", kv.ScanRequest{}, err
	}
	limit := clampInt(m.GetLimit())
	if err := checkPageSize(limit); err != nil {
		return "", kv.ScanRequest{}, err
	}
	return m.GetTxn(), kv.ScanRequest{Collection: m.GetCollection(), Start: nonEmpty(m.GetStart()), End: nonEmpty(m.GetEnd()),
		Limit: limit, Reverse: m.GetReverse(), Page: m.GetPage()}, nil
}

// TxnTagQueryToPB converts a tag query in attempt txn; q.Version is not
// sent.
func TxnTagQueryToPB(txn string, q kv.TagQuery) *pb.TxnTagQuery {
	return &pb.TxnTagQuery{Txn: txn, Collection: q.Collection, All: q.All, Any: q.Any, Limit: int64(q.Limit), Page: q.Page}
}

// TxnTagQueryFromPB validates a tag query in an attempt, as the HTTP form
// does: the collection, exactly one of all and any, the tags and the page
// size.
func TxnTagQueryFromPB(m *pb.TxnTagQuery) (string, kv.TagQuery, error) {
	if err := checkTxnTarget(m.GetTxn(), m.GetBegin()); err != nil {
		return "", kv.TagQuery{}, err
	}
	if err := kv.ValidateCollectionName(m.GetCollection()); err != nil {
		return "", kv.TagQuery{}, err
	}
	all, any := m.GetAll(), m.GetAny()
	if (len(all) == 0) == (len(any) == 0) {
		return "", kv.TagQuery{}, kv.Errorf(kv.CodeInvalidArgument,
			"give exactly one of all (records carrying every tag) and any (records carrying one of them), with at least one tag")
	}
	name, tags := "all", all
	if len(any) > 0 {
		name, tags = "any", any
	}
	if err := kv.ValidateTags(tags); err != nil {
		return "", kv.TagQuery{}, at(name, err)
	}
	limit := clampInt(m.GetLimit())
	if err := checkPageSize(limit); err != nil {
		return "", kv.TagQuery{}, err
	}
	return m.GetTxn(), kv.TagQuery{Collection: m.GetCollection(), All: all, Any: any, Limit: limit, Page: m.GetPage()}, nil
}

// ExecRequestToPB converts a one-shot transaction.
func ExecRequestToPB(req kv.ExecRequest) *pb.ExecTxnRequest {
	return &pb.ExecTxnRequest{Compares: comparesToPB(req.If), ThenOps: txnOpsToPB(req.Then), ElseOps: txnOpsToPB(req.Else)}
}

// GroupExecRequestToPB converts a one-shot transaction on group id.
func GroupExecRequestToPB(id string, req kv.ExecRequest) *pb.ExecGroupTxnRequest {
	return &pb.ExecGroupTxnRequest{Group: id, Compares: comparesToPB(req.If), ThenOps: txnOpsToPB(req.Then), ElseOps: txnOpsToPB(req.Else)}
}

func comparesToPB(cs []kv.Compare) []*pb.Compare {
	out := make([]*pb.Compare, len(cs))
	for i, c := range cs {
		m := &pb.Compare{Collection: c.Collection, Key: c.Key}
		if c.HasValue {
			m.Condition = &pb.Compare_Value{Value: c.Value}
		} else {
			m.Condition = &pb.Compare_Version{Version: c.Version}
		}
		out[i] = m
	}
	return out
}

func txnOpsToPB(ops []kv.TxnOp) []*pb.TxnOp {
	out := make([]*pb.TxnOp, len(ops))
	for i, o := range ops {
		out[i] = &pb.TxnOp{Op: o.Op, Collection: o.Collection, Key: o.Key, Value: o.Value, Tags: o.Tags}
	}
	return out
}

// ExecRequestFromPB validates a one-shot transaction, as the HTTP form
// does: every condition names a key and exactly one of version and value;
// every operation is a get, put or delete of a valid key, only a put has a
// value or tags, and its tags are valid; there is at least one operation.
func ExecRequestFromPB(m *pb.ExecTxnRequest) (kv.ExecRequest, error) {
	return execRequestFromPB(m.GetCompares(), m.GetThenOps(), m.GetElseOps())
}

// GroupExecRequestFromPB validates a one-shot transaction on a group: the
// group id, and the transaction as ExecRequestFromPB does.
func GroupExecRequestFromPB(m *pb.ExecGroupTxnRequest) (string, kv.ExecRequest, error) {
	if err := ValidateGroupID(m.GetGroup()); err != nil {
		return "", kv.ExecRequest{}, err
	}
	req, err := execRequestFromPB(m.GetCompares(), m.GetThenOps(), m.GetElseOps())
	return m.GetGroup(), req, err
}

func execRequestFromPB(compares []*pb.Compare, thenOps, elseOps []*pb.TxnOp) (kv.ExecRequest, error) {
	out := kv.ExecRequest{If: make([]kv.Compare, len(compares))}
	n := 0
	for i, c := range compares {
		cmp, err := compareFromPB(c)
		if err != nil {
			return kv.ExecRequest{}, at(fmt.Sprintf("compares[%d]", i), err)
		}
		out.If[i] = cmp
		n += len(cmp.Key) + len(cmp.Value)
	}
	var err error
	var m int
	if out.Then, m, err = txnOpsFromPB("then_ops", thenOps); err != nil {
		return kv.ExecRequest{}, err
	}
	n += m
	if out.Else, m, err = txnOpsFromPB("else_ops", elseOps); err != nil {
		return kv.ExecRequest{}, err
	}
	n += m
	if len(out.Then) == 0 && len(out.Else) == 0 {
		return kv.ExecRequest{}, kv.Errorf(kv.CodeInvalidArgument,
			"no operations: give then_ops (run when every compare holds) and/or else_ops (run otherwise), at least one operation")
	}
	return out, checkRequestBytes(n)
}

func compareFromPB(c *pb.Compare) (kv.Compare, error) {
	ref, err := keyRefFromPB(c.GetCollection(), c.GetKey())
	if err != nil {
		return kv.Compare{}, err
	}
	cmp := kv.Compare{Collection: ref.Collection, Key: ref.Key}
	switch cond := c.GetCondition().(type) {
	case *pb.Compare_Version:
		cmp.Version = cond.Version
	case *pb.Compare_Value:
		cmp.HasValue, cmp.Value = true, cond.Value
	default:
		return kv.Compare{}, kv.Errorf(kv.CodeInvalidArgument,
			"no condition: set version (the key's current version; 0: the key is absent) or value")
	}
	return cmp, nil
}

// txnOpsFromPB validates the operations of branch name and answers them
// with the bytes of their keys and values.
func txnOpsFromPB(name string, ops []*pb.TxnOp) ([]kv.TxnOp, int, error) {
	if len(ops) == 0 {
		return nil, 0, nil
	}
	out := make([]kv.TxnOp, len(ops))
	n := 0
	for i, o := range ops {
		op, err := txnOpFromPB(o)
		if err != nil {
			return nil, 0, at(fmt.Sprintf("%s[%d]", name, i), err)
		}
		out[i] = op
		n += len(op.Key) + len(op.Value)
	}
	return out, n, nil
}

func txnOpFromPB(o *pb.TxnOp) (kv.TxnOp, error) {
	switch o.GetOp() {
	case kv.TxnOpGet, kv.TxnOpPut, kv.TxnOpDelete:
	case "":
		return kv.TxnOp{}, kv.Errorf(kv.CodeInvalidArgument, `no op: set op to "get", "put" or "delete"`)
	default:
		return kv.TxnOp{}, kv.Errorf(kv.CodeInvalidArgument, `op %q is not known: use "get", "put" or "delete"`, clip(o.GetOp()))
	}
	ref, err := keyRefFromPB(o.GetCollection(), o.GetKey())
	if err != nil {
		return kv.TxnOp{}, err
	}
	op := kv.TxnOp{Op: o.GetOp(), Collection: ref.Collection, Key: ref.Key}
	if op.Op != kv.TxnOpPut {
		if len(o.GetValue()) > 0 || len(o.GetTags()) > 0 {
			return kv.TxnOp{}, kv.Errorf(kv.CodeInvalidArgument, "a %s takes no value and no tags: only a put does", op.Op)
		}
		return op, nil
	}
	if err := kv.ValidateTags(o.GetTags()); err != nil {
		return kv.TxnOp{}, err
	}
	op.Value, op.Tags = o.GetValue(), o.GetTags()
	return op, nil
}

// ExecResultToPB converts the outcome of a one-shot transaction.
func ExecResultToPB(r kv.ExecResult) *pb.ExecTxnResponse {
	m := &pb.ExecTxnResponse{Succeeded: r.Succeeded, Version: r.Version, Results: make([]*pb.TxnOpResult, len(r.Results))}
	for i, res := range r.Results {
		m.Results[i] = &pb.TxnOpResult{Found: res.Found, Value: res.Value, Tags: res.Tags, Version: res.Version}
	}
	return m
}

// ExecResultFromPB is the inverse of ExecResultToPB; Results is never nil.
func ExecResultFromPB(m *pb.ExecTxnResponse) kv.ExecResult {
	r := kv.ExecResult{Succeeded: m.GetSucceeded(), Version: m.GetVersion(), Results: make([]kv.TxnOpResult, len(m.GetResults()))}
	for i, res := range m.GetResults() {
		r.Results[i] = kv.TxnOpResult{Found: res.GetFound(), Value: res.GetValue(), Tags: res.GetTags(), Version: res.GetVersion()}
	}
	return r
}

// GroupSpecToPB converts the spec of CreateGroup.
func GroupSpecToPB(spec kv.GroupSpec) *pb.CreateGroupRequest {
	return &pb.CreateGroupRequest{Id: spec.ID, Leader: &pb.KeyRef{Collection: spec.Leader.Collection, Key: spec.Leader.Key},
		Members: KeyRefsToPB(spec.Members), Mode: string(spec.Mode)}
}

// GroupSpecFromPB validates a group's creation as the HTTP form does: the
// id, every key, the mode (empty: atomic), and that no key is listed twice
// (the leader may be listed among the members).
func GroupSpecFromPB(m *pb.CreateGroupRequest) (kv.GroupSpec, error) {
	if err := ValidateGroupID(m.GetId()); err != nil {
		return kv.GroupSpec{}, err
	}
	if m.GetLeader() == nil {
		return kv.GroupSpec{}, kv.Errorf(kv.CodeInvalidArgument,
			"no leader: set leader, the key whose shard's leader will own the group")
	}
	leader, err := keyRefFromPB(m.GetLeader().GetCollection(), m.GetLeader().GetKey())
	if err != nil {
		return kv.GroupSpec{}, at("leader", err)
	}
	mode, err := groupMode(kv.GroupMode(m.GetMode()))
	if err != nil {
		return kv.GroupSpec{}, err
	}
	spec := kv.GroupSpec{ID: m.GetId(), Leader: leader, Members: make([]kv.KeyRef, len(m.GetMembers())), Mode: mode}
	seen := make(map[string]int, len(m.GetMembers()))
	n := len(leader.Key)
	for i, k := range m.GetMembers() {
		ref, err := keyRefFromPB(k.GetCollection(), k.GetKey())
		if err != nil {
			return kv.GroupSpec{}, at(fmt.Sprintf("members[%d]", i), err)
		}
		if err := checkMemberOnce(seen, i, ref); err != nil {
			return kv.GroupSpec{}, err
		}
		spec.Members[i] = ref
		n += len(ref.Key)
	}
	return spec, checkRequestBytes(n)
}

// GroupCreatedToPB converts the outcome of a creation.
func GroupCreatedToPB(c kv.GroupCreated) *pb.CreateGroupResponse {
	m := &pb.CreateGroupResponse{Id: c.ID, Joined: KeyRefsToPB(c.Joined), Refused: make([]*pb.GroupRefusal, len(c.Refused))}
	for i, r := range c.Refused {
		m.Refused[i] = &pb.GroupRefusal{Collection: r.Collection, Key: r.Key, Reason: r.Reason}
	}
	return m
}

// GroupCreatedFromPB is the inverse of GroupCreatedToPB; Joined and
// Refused are never nil, as over HTTP.
func GroupCreatedFromPB(m *pb.CreateGroupResponse) kv.GroupCreated {
	c := kv.GroupCreated{ID: m.GetId(), Joined: KeyRefsFromPB(m.GetJoined()), Refused: make([]kv.GroupRefusal, len(m.GetRefused()))}
	for i, r := range m.GetRefused() {
		c.Refused[i] = kv.GroupRefusal{KeyRef: kv.KeyRef{Collection: r.GetCollection(), Key: r.GetKey()}, Reason: r.GetReason()}
	}
	return c
}

// GroupInfoToPB converts a group's description; an empty mode is atomic.
func GroupInfoToPB(info kv.GroupInfo) *pb.GroupInfo {
	mode := info.Mode
	if mode == "" {
		mode = kv.GroupAtomic
	}
	return &pb.GroupInfo{Id: info.ID, Leader: &pb.KeyRef{Collection: info.Leader.Collection, Key: info.Leader.Key},
		Members: KeyRefsToPB(info.Members), Mode: string(mode), LeaderNode: info.LeaderNode, State: info.State,
		ShipperLag: int64(info.ShipperLag)}
}

// GroupInfoFromPB is the inverse of GroupInfoToPB; Members is never nil.
func GroupInfoFromPB(m *pb.GroupInfo) kv.GroupInfo {
	return kv.GroupInfo{ID: m.GetId(), Leader: kv.KeyRef{Collection: m.GetLeader().GetCollection(), Key: m.GetLeader().GetKey()},
		Members: KeyRefsFromPB(m.GetMembers()), Mode: kv.GroupMode(m.GetMode()), LeaderNode: m.GetLeaderNode(),
		State: m.GetState(), ShipperLag: clampInt(m.GetShipperLag())}
}

// GroupInfosToPB converts the answer of ListGroups.
func GroupInfosToPB(infos []kv.GroupInfo) *pb.ListGroupsResponse {
	m := &pb.ListGroupsResponse{Groups: make([]*pb.GroupInfo, len(infos))}
	for i, info := range infos {
		m.Groups[i] = GroupInfoToPB(info)
	}
	return m
}

// GroupInfosFromPB is the inverse of GroupInfosToPB; it never answers nil.
func GroupInfosFromPB(m *pb.ListGroupsResponse) []kv.GroupInfo {
	out := make([]kv.GroupInfo, len(m.GetGroups()))
	for i, g := range m.GetGroups() {
		out[i] = GroupInfoFromPB(g)
	}
	return out
}
