package api

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/proto"

	"github.com/groupkv/groupkv/internal/kv"
	pb "github.com/groupkv/groupkv/proto/groupkvpb"
)

// TxnAttempt is one attempt of a transaction (or of a group transaction)
// run over a TxnClient with as few round trips as the RPCs allow:
//
//   - It is begun by its first request to reach the server, which carries
//     a TxnBegin in place of an id (the server answers the id); nothing is
//     sent before. An attempt whose function only writes costs one RPC.
//   - Puts and deletes are validated at once, as the server validates them
//     (collection name, key, tags, read-only, no tags in a group
//     transaction: invalid_argument or too_large), and kept in the client.
//     A get of a key kept answers what the server would: the value and
//     tags written, version 0, or not found after a delete. The writes
//     kept go to the server with the commit (CommitTxnRequest.writes), in
//     order, or before a scan or a tag query (TxnWrite), which the server
//     answers with them applied, or once they pass maxKeptBytes (a value
//     over 1 MiB is sent at once). The server applies them as it would
//     TxnPut and TxnDelete one by one, and so counts them against its
//     limits the same; an error of a write kept (the collection does not
//     exist, too_large) is the error of the request that sent it.
//
// Gets of keys not kept, scans and tag queries are sent as they come, so
// a transaction that reads n keys and writes some costs n + 1 round trips
// (BeginTxn, n TxnGet, a TxnPut or TxnDelete per write and CommitTxn
// before). In a group attempt the first get asks for the group's
// snapshot too (TxnGetRequest.group_snapshot), and gets of members not
// kept are answered from it, the members read so named in the commit
// (CommitTxnRequest.snapshot_reads) for the leader's validation: reading
// n members and writing costs 2 round trips. With
// kv.TxnOptions.CachedSnapshot, a group attempt's commit asks for the
// group's snapshot after it (CommitTxnRequest.group_snapshot), which the
// TxnClient keeps; the group's next such attempt answers its gets of
// members from that snapshot, sends nothing before its commit, and names
// those reads with their versions in it (cached_reads), validated even
// when it writes nothing: reading and writing members costs 1 round trip
// while no other client writes the group. A commit that fails drops the
// snapshot kept; so does a get the snapshot cannot answer, or writes
// sent before the commit, which fail the attempt with txn_aborted (the
// transaction runs again on a snapshot of the server's, so that no
// attempt reads from two). Its methods may be called from several
// goroutines.
//
// A request that carried the begin and failed names the attempt it began
// in its trailer (TxnTrailer), and the attempt goes on in it. If that
// request's connection broke, the attempt may or may not exist on the
// server: it is given up, and every later operation answers the error
// (unavailable) without sending anything; the server stops heartbeating
// such an attempt once its client falls silent, so that whoever waits for
// its locks aborts it, and aborts it itself after its idle timeout.
//
// A server older than these forms refuses the first request (a begin in
// place of an id): the attempt answers unimplemented. It never sends
// writes with a commit to such a server, which would drop them.
type TxnAttempt struct {
	t     *TxnClient
	group string
	opts  kv.TxnOptions

	// sendMu orders the sending of kept writes: it is held from taking
	// them to the answer of the request that carries them, and a get
	// takes it to look at the writes kept, so that no get overtakes a
	// write it should see.
	sendMu sync.Mutex

	mu sync.Mutex
	// id is the attempt's id, "" until a request began it.
	id string
	// beginning is closed when the request carrying the begin ends; nil
	// when none is under way.
	beginning chan struct{}
	// broken is the error of every operation once a begin's outcome is
	// unknown.
	broken error
	// writes are the writes kept, in order; latest indexes the last one
	// of each key (keptKey) in writes; bytes counts their keys, values
	// and tags.
	writes []kv.TxnOp
	latest map[string]int
	bytes  int
	// snapshot, in a group attempt, is the group's snapshot that its
	// first get asked for and was answered (TxnGetResponse.snapshot), by
	// keptKey; gets of its members are answered from it, and recorded in
	// snapReads, which the commit sends. It is dropped when writes are
	// sent before the commit: the server's snapshot does not have them.
	// flushes counts those sendings, so that a snapshot answered across
	// one is not taken.
	snapshot      map[string]kv.BatchGetItem
	askedSnapshot bool
	snapReads     map[string]kv.BatchGetItem
	flushes       int
	// cached: snapshot is the one the TxnClient kept for the group
	// (kv.TxnOptions.CachedSnapshot), and the reads from it are sent as
	// cached_reads.
	cached bool
}

// maxKeptBytes bounds the keys, values and tags of the writes an attempt
// keeps: a write that passes it sends them all (TxnWrite). It keeps the
// requests far below MaxMessageSize, and makes a put of a value larger
// than the default value limit reach the server at once.
const maxKeptBytes = kv.DefaultMaxValueSize

// NewAttempt returns an attempt of a transaction with opts, of the key
// group group, or a general one when group is "". It sends nothing.
func (t *TxnClient) NewAttempt(group string, opts kv.TxnOptions) *TxnAttempt {
	a := &TxnAttempt{t: t, group: group, opts: opts}
	if group != "" && opts.CachedSnapshot && opts.RetryOf == "" {
		// A retry reads the server's snapshot: with priority, it cannot
		// fail validation again, while a snapshot kept could be stale.
		if snap := t.keptSnapshot(group); snap != nil {
			a.snapshot, a.askedSnapshot, a.cached = snap, true, true
		}
	}
	return a
}

// errCachedMiss fails an attempt reading from a kept snapshot that must
// ask the server (a get of a key the snapshot lacks, writes sent before
// the commit): the server's snapshot may be another.
func (a *TxnAttempt) errCachedMiss(what string) error {
	a.t.forgetSnapshot(a.group)
	return kv.Errorf(kv.CodeTxnAborted, "group transaction %s read from the snapshot of group %q this client kept, and %s: it runs again on the server's snapshot", a.name(), a.group, what)
}

// ID returns the attempt's id, "" while no request has begun it.
func (a *TxnAttempt) ID() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.id
}

// Begin begins the attempt if no request did yet (a TxnWrite with the
// begin and no writes) and answers its id.
func (a *TxnAttempt) Begin(ctx context.Context) (string, error) {
	err := a.run(ctx, false, request{unary: func(txn string, begin *pb.TxnBegin, opts []grpc.CallOption) (string, error) {
		if begin == nil {
			return "", nil // begun already
		}
		m, err := a.t.c.TxnWrite(ctx, &pb.TxnWriteRequest{Begin: begin}, opts...)
		return m.GetTxn(), err
	}})
	return a.ID(), err
}

func keptKey(coll string, key []byte) string { return coll + "\x00" + string(key) }

// Get reads a key in the attempt: from the writes kept when it is one of
// theirs, else from the server. A record found has its key set to
// ref.Key.
func (a *TxnAttempt) Get(ctx context.Context, ref kv.KeyRef) (kv.Record, bool, error) {
	return a.get(ctx, ref, false)
}

// GetForUpdate is Get taking the key's lock exclusively on the server
// (kv.TxnBackend.TxnGetForUpdate). A key the attempt wrote is answered
// from its kept write, as Get does: its lock is taken by the commit that
// sends the write.
func (a *TxnAttempt) GetForUpdate(ctx context.Context, ref kv.KeyRef) (kv.Record, bool, error) {
	if err := a.checkReadOnly(); err != nil {
		return kv.Record{}, false, err
	}
	return a.get(ctx, ref, true)
}

func (a *TxnAttempt) get(ctx context.Context, ref kv.KeyRef, forUpdate bool) (kv.Record, bool, error) {
	kk := keptKey(ref.Collection, ref.Key)
	a.sendMu.Lock()
	a.mu.Lock()
	i, kept := a.latest[kk]
	var w kv.TxnOp
	if kept {
		w = a.writes[i]
	}
	sr, fromSnap := a.snapshot[kk]
	if fromSnap && !kept {
		if a.snapReads == nil {
			a.snapReads = make(map[string]kv.BatchGetItem)
		}
		a.snapReads[kk] = kv.BatchGetItem{Collection: ref.Collection, Key: bytes.Clone(ref.Key), Found: sr.Found, Version: sr.Version}
	}
	ask := a.group != "" && !a.askedSnapshot
	a.askedSnapshot = true
	flushes := a.flushes
	cached := a.cached
	a.mu.Unlock()
	a.sendMu.Unlock()
	if cached && !kept && !fromSnap {
		return kv.Record{}, false, a.errCachedMiss(fmt.Sprintf("key %q of collection %q is not in it", ref.Key, ref.Collection))
	}
	switch {
	case kept && w.Op == kv.TxnOpDelete:
		return kv.Record{}, false, nil
	case kept:
		// What the server answers for a write of the attempt: the value
		// and tags (nil when empty, as they cross the wire), version 0.
		return kv.Record{Key: ref.Key, Value: bytes.Clone(w.Value), Tags: slices.Clone(w.Tags)}, true, nil
	case fromSnap && !sr.Found:
		return kv.Record{}, false, nil
	case fromSnap:
		return kv.Record{Key: ref.Key, Value: bytes.Clone(sr.Value), Tags: slices.Clone(sr.Tags), Version: sr.Version}, true, nil
	}
	m, err := a.sendGet(ctx, true, func(txn string, begin *pb.TxnBegin) *pb.TxnGetRequest {
		return &pb.TxnGetRequest{Txn: txn, Begin: begin, Collection: ref.Collection, Key: ref.Key, GroupSnapshot: ask, ForUpdate: forUpdate}
	})
	if err != nil {
		return kv.Record{}, false, err
	}
	if snap := m.GetSnapshot(); ask && len(snap) > 0 {
		a.mu.Lock()
		if a.flushes == flushes {
			a.snapshot = snapshotMap(BatchGetItemsFromPB(snap))
		}
		a.mu.Unlock()
	}
	rec, found := TxnGetResponseFromPB(m)
	if found {
		rec.Key = ref.Key
	}
	return rec, found, nil
}

// BatchGet reads refs in the attempt, each as Get (forUpdate:
// GetForUpdate) would: the keys it wrote from the writes kept, the others
// in one request to the server (TxnGetRequest.keys). A group attempt
// reads them one by one, from its snapshot where it has one.
func (a *TxnAttempt) BatchGet(ctx context.Context, refs []kv.KeyRef, forUpdate bool) ([]kv.BatchGetItem, error) {
	if forUpdate {
		if err := a.checkReadOnly(); err != nil {
			return nil, err
		}
	}
	if len(refs) > kv.DefaultMaxBatchKeys {
		return nil, kv.Errorf(kv.CodeTooLarge, "the batch has %d keys, the limit is %d", len(refs), kv.DefaultMaxBatchKeys)
	}
	items := make([]kv.BatchGetItem, len(refs))
	if a.group != "" {
		for i, ref := range refs {
			rec, found, err := a.get(ctx, ref, forUpdate)
			if err != nil {
				return nil, err
			}
			items[i] = kv.BatchGetItem{Collection: ref.Collection, Key: ref.Key, Found: found}
			if found {
				items[i].Value, items[i].Tags, items[i].Version = rec.Value, rec.Tags, rec.Version
			}
		}
		return items, nil
	}
	var (
		ask  []kv.KeyRef
		askI []int
	)
	a.sendMu.Lock()
	a.mu.Lock()
	for i, ref := range refs {
		items[i] = kv.BatchGetItem{Collection: ref.Collection, Key: ref.Key}
		j, kept := a.latest[keptKey(ref.Collection, ref.Key)]
		switch {
		case !kept:
			ask, askI = append(ask, ref), append(askI, i)
		case a.writes[j].Op != kv.TxnOpDelete:
			// As Get answers a key of the writes kept.
			w := a.writes[j]
			items[i].Found, items[i].Value, items[i].Tags = true, bytes.Clone(w.Value), slices.Clone(w.Tags)
		}
	}
	a.mu.Unlock()
	a.sendMu.Unlock()
	if len(ask) == 0 {
		return items, nil
	}
	// A long answer would hold up the stream: it comes as a unary RPC's.
	m, err := a.sendGet(ctx, len(ask) <= PipelineMaxScan, func(txn string, begin *pb.TxnBegin) *pb.TxnGetRequest {
		return TxnBatchGetRequestToPB(txn, begin, ask, forUpdate)
	})
	if err != nil {
		return nil, err
	}
	got, err := TxnBatchGetResponseFromPB(m, ask)
	if err != nil {
		return nil, err
	}
	for j, i := range askI {
		got[j].Key = refs[i].Key
		items[i] = got[j]
	}
	return items, nil
}

// sendGet sends the TxnGet that makeReq makes for the attempt's id or
// begin, as a message of the pipeline when piped and the pipeline carries
// it, else as a unary RPC, and answers its response.
func (a *TxnAttempt) sendGet(ctx context.Context, piped bool, makeReq func(txn string, begin *pb.TxnBegin) *pb.TxnGetRequest) (*pb.TxnGetResponse, error) {
	var m *pb.TxnGetResponse
	req := request{
		unary: func(txn string, begin *pb.TxnBegin, opts []grpc.CallOption) (string, error) {
			var err error
			m, err = a.t.c.TxnGet(ctx, makeReq(txn, begin), opts...)
			return m.GetTxn(), err
		},
		answer: func(resp *pb.PipelineResponse) (string, error) {
			r := resp.GetTxnGet()
			if r == nil {
				return "", errWrongAnswer("txn_get")
			}
			m = r
			return r.GetTxn(), nil
		},
	}
	if piped {
		req.piped = func(txn string, begin *pb.TxnBegin) *pb.PipelineRequest {
			return &pb.PipelineRequest{Op: &pb.PipelineRequest_TxnGet{TxnGet: makeReq(txn, begin)}}
		}
	}
	err := a.run(ctx, false, req)
	return m, err
}

// checkWrite validates a write of the attempt as the server would,
// before it is kept.
func (a *TxnAttempt) checkWrite(coll string, key []byte) error {
	if err := kv.ValidateCollectionName(coll); err != nil {
		return err
	}
	if err := kv.ValidateKey(key); err != nil {
		return err
	}
	return nil
}

// checkReadOnly refuses a write in a read-only attempt, as the server
// does.
func (a *TxnAttempt) checkReadOnly() error {
	if a.opts.ReadOnly {
		if a.group != "" {
			return kv.Errorf(kv.CodeInvalidArgument, "group transaction %s is read-only", a.name())
		}
		return kv.Errorf(kv.CodeInvalidArgument, "transaction %s is read-only", a.name())
	}
	return nil
}

// name names the attempt in a message.
func (a *TxnAttempt) name() string {
	if id := a.ID(); id != "" {
		return id
	}
	return "(not begun)"
}

// Put validates a put and keeps it; it refuses an item with an IfVersion
// (a transaction compares by reading).
func (a *TxnAttempt) Put(ctx context.Context, item kv.PutItem) error {
	if item.IfVersion != nil {
		return kv.Errorf(kv.CodeInvalidArgument, "a transaction's put takes no IfVersion: read the key in the transaction and compare its version")
	}
	if err := a.checkWrite(item.Collection, item.Key); err != nil {
		return err
	}
	if err := kv.ValidateTags(item.Tags); err != nil {
		return err
	}
	if err := a.checkReadOnly(); err != nil {
		return err
	}
	op := kv.TxnOp{Op: kv.TxnOpPut, Collection: item.Collection, Key: bytes.Clone(item.Key)}
	if len(item.Value) > 0 {
		op.Value = bytes.Clone(item.Value)
	}
	if len(item.Tags) > 0 {
		op.Tags = slices.Clone(item.Tags)
	}
	return a.keep(ctx, op)
}

// Delete validates a delete and keeps it.
func (a *TxnAttempt) Delete(ctx context.Context, ref kv.KeyRef) error {
	if err := a.checkWrite(ref.Collection, ref.Key); err != nil {
		return err
	}
	if err := a.checkReadOnly(); err != nil {
		return err
	}
	return a.keep(ctx, kv.TxnOp{Op: kv.TxnOpDelete, Collection: ref.Collection, Key: bytes.Clone(ref.Key)})
}

// keep adds a write to those kept, and sends them all if they grew past
// maxKeptBytes.
func (a *TxnAttempt) keep(ctx context.Context, op kv.TxnOp) error {
	a.mu.Lock()
	if a.broken != nil {
		err := a.broken
		a.mu.Unlock()
		return err
	}
	if a.latest == nil {
		a.latest = map[string]int{}
	}
	a.writes = append(a.writes, op)
	a.latest[keptKey(op.Collection, op.Key)] = len(a.writes) - 1
	a.bytes += len(op.Key) + len(op.Value)
	for _, t := range op.Tags {
		a.bytes += len(t)
	}
	full := a.bytes > maxKeptBytes
	a.mu.Unlock()
	if full {
		return a.Flush(ctx)
	}
	return nil
}

// take returns the writes kept and forgets them. a.sendMu is held.
func (a *TxnAttempt) take() []kv.TxnOp {
	a.mu.Lock()
	defer a.mu.Unlock()
	w := a.writes
	a.writes, a.bytes = nil, 0
	clear(a.latest)
	return w
}

// Flush sends the writes kept (TxnWrite), if any.
func (a *TxnAttempt) Flush(ctx context.Context) error {
	a.sendMu.Lock()
	defer a.sendMu.Unlock()
	writes := a.take()
	if len(writes) == 0 {
		return nil
	}
	a.mu.Lock()
	cached := a.cached
	a.snapshot = nil
	a.flushes++
	a.mu.Unlock()
	if cached {
		return a.errCachedMiss("its writes must reach the server before its commit")
	}
	return a.run(ctx, false, request{unary: func(txn string, begin *pb.TxnBegin, opts []grpc.CallOption) (string, error) {
		m, err := a.t.c.TxnWrite(ctx, &pb.TxnWriteRequest{Txn: txn, Begin: begin, Writes: TxnWritesToPB(writes)}, opts...)
		return m.GetTxn(), err
	}})
}

// Scan sends the writes kept, then reads a page of a range in the attempt.
// It refuses a request with a Version: an attempt reads at its own time.
func (a *TxnAttempt) Scan(ctx context.Context, req kv.ScanRequest) (kv.ScanResult, error) {
	if req.Version != 0 {
		return kv.ScanResult{}, kv.Errorf(kv.CodeInvalidArgument, "a transaction reads at its own time: leave ScanRequest.Version 0")
	}
	return a.readPage(ctx, func(txn string, begin *pb.TxnBegin, opts []grpc.CallOption) (*pb.ScanResponse, error) {
		r := TxnScanRequestToPB(txn, req)
		r.Begin = begin
		return a.t.c.TxnScan(ctx, r, opts...)
	})
}

// GetByTags sends the writes kept, then reads a page of a tag query in
// the attempt. It refuses a query with a Version, as Scan does.
func (a *TxnAttempt) GetByTags(ctx context.Context, q kv.TagQuery) (kv.ScanResult, error) {
	if q.Version != 0 {
		return kv.ScanResult{}, kv.Errorf(kv.CodeInvalidArgument, "a transaction reads at its own time: leave TagQuery.Version 0")
	}
	return a.readPage(ctx, func(txn string, begin *pb.TxnBegin, opts []grpc.CallOption) (*pb.ScanResponse, error) {
		r := TxnTagQueryToPB(txn, q)
		r.Begin = begin
		return a.t.c.TxnGetByTags(ctx, r, opts...)
	})
}

// readPage sends the writes kept, then reads a page with call in the
// attempt.
func (a *TxnAttempt) readPage(ctx context.Context, call func(txn string, begin *pb.TxnBegin, opts []grpc.CallOption) (*pb.ScanResponse, error)) (kv.ScanResult, error) {
	a.mu.Lock()
	cached := a.cached
	a.mu.Unlock()
	if cached {
		return kv.ScanResult{}, a.errCachedMiss("it reads a page from the server")
	}
	if err := a.Flush(ctx); err != nil {
		return kv.ScanResult{}, err
	}
	var m *pb.ScanResponse
	err := a.run(ctx, false, request{unary: func(txn string, begin *pb.TxnBegin, opts []grpc.CallOption) (string, error) {
		var err error
		m, err = call(txn, begin, opts)
		return m.GetTxn(), err
	}})
	if err != nil {
		return kv.ScanResult{}, err
	}
	return ScanResultFromPB(m), nil
}

// Commit sends the writes kept with the commit, in one request (which
// begins the attempt if none did), and answers the commit version. A
// commit whose connection broke after it was sent is commit_unknown; one
// that could not be sent is unavailable. When a write fails there, the
// server aborts the attempt and the commit answers the write's error.
func (a *TxnAttempt) Commit(ctx context.Context) (uint64, error) {
	a.sendMu.Lock()
	defer a.sendMu.Unlock()
	writes := a.take()
	req := &pb.CommitTxnRequest{Writes: TxnWritesToPB(writes)}
	a.mu.Lock()
	if a.cached {
		reads := make([]kv.BatchGetItem, 0, len(a.snapReads))
		for _, r := range a.snapReads {
			reads = append(reads, r)
		}
		req.CachedReads = BatchGetItemsToPB(reads)
	} else {
		reads := make([]kv.KeyRef, 0, len(a.snapReads))
		for _, r := range a.snapReads {
			reads = append(reads, kv.KeyRef{Collection: r.Collection, Key: r.Key})
		}
		req.SnapshotReads = KeyRefsToPB(reads)
	}
	a.mu.Unlock()
	keep := a.group != "" && a.opts.CachedSnapshot
	req.GroupSnapshot = keep
	var v uint64
	var snap []*pb.BatchGetItem
	err := a.run(ctx, true, request{
		unary: func(txn string, begin *pb.TxnBegin, opts []grpc.CallOption) (string, error) {
			req.Txn, req.Begin = txn, begin
			m, err := a.t.c.CommitTxn(ctx, req, opts...)
			v, snap = m.GetVersion(), m.GetSnapshot()
			return m.GetTxn(), err
		},
		piped: func(txn string, begin *pb.TxnBegin) *pb.PipelineRequest {
			req.Txn, req.Begin = txn, begin
			if proto.Size(req) > PipelineMaxMessage {
				return nil
			}
			return &pb.PipelineRequest{Op: &pb.PipelineRequest_CommitTxn{CommitTxn: req}}
		},
		answer: func(resp *pb.PipelineResponse) (string, error) {
			m := resp.GetCommitTxn()
			if m == nil {
				return "", errWrongAnswer("commit_txn")
			}
			v, snap = m.GetVersion(), m.GetSnapshot()
			return m.GetTxn(), nil
		},
	})
	switch {
	case !keep:
	case err == nil && len(snap) > 0:
		a.t.keepSnapshot(a.group, BatchGetItemsFromPB(snap))
	default:
		a.t.forgetSnapshot(a.group)
	}
	return v, err
}

// Abort aborts the attempt on the server, if a request began it, and
// forgets the writes kept.
func (a *TxnAttempt) Abort(ctx context.Context) error {
	a.mu.Lock()
	id := a.id
	a.writes, a.bytes = nil, 0
	clear(a.latest)
	a.snapshot, a.snapReads = nil, nil
	a.mu.Unlock()
	if id == "" {
		return nil
	}
	return a.t.AbortTxn(ctx, id)
}

// target answers what a request names its attempt by: the id, or (when no
// request began it) the begin to carry, with the function that the
// request's end must call with the id it learned (or "") and the error
// that breaks the attempt (or nil). While a request carries the begin,
// the others wait for its end.
func (a *TxnAttempt) target(ctx context.Context) (string, *pb.TxnBegin, func(id string, broken error), error) {
	for {
		a.mu.Lock()
		switch {
		case a.broken != nil:
			err := a.broken
			a.mu.Unlock()
			return "", nil, nil, err
		case a.id != "":
			id := a.id
			a.mu.Unlock()
			return id, nil, nil, nil
		case a.beginning == nil:
			ch := make(chan struct{})
			a.beginning = ch
			a.mu.Unlock()
			return "", TxnBeginToPB(a.group, a.opts), func(id string, broken error) {
				a.mu.Lock()
				defer a.mu.Unlock()
				if id != "" {
					a.id = id
				} else if broken != nil {
					a.broken = broken
				}
				a.beginning = nil
				close(ch)
			}, nil
		}
		ch := a.beginning
		a.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return "", nil, nil, ctx.Err()
		}
	}
}

// pipedTxn answers the attempt a response of the Pipeline stream to a
// transaction's request names: the one its request began ("" if none).
func pipedTxn(resp *pb.PipelineResponse) string {
	switch r := resp.GetResult().(type) {
	case *pb.PipelineResponse_Error:
		return r.Error.GetTxn()
	case *pb.PipelineResponse_TxnGet:
		return r.TxnGet.GetTxn()
	case *pb.PipelineResponse_CommitTxn:
		return r.CommitTxn.GetTxn()
	}
	return ""
}

// errWrongAnswer is the error of a pipelined request of an attempt
// answered with the result of another operation.
func errWrongAnswer(op string) error {
	return kv.Errorf(kv.CodeInternal, "the server answered a pipelined %s with the result of another operation", op)
}

// oldServerMessage starts the message of a server older than TxnBegin to
// a request that carries one: it saw no txn.
const oldServerMessage = "no transaction: give txn, the id BeginTxn or BeginGroupTxn answered"

// request is one request of an attempt (run). unary sends it as a unary
// RPC with the attempt's id or the begin (target) and the call options,
// and answers the id in its response and its error. piped, when not nil,
// makes its message of the Pipeline stream instead (nil: send it as a
// unary RPC), sent when the TxnClient has a pipeline whose server serves
// it there; answer takes that message's response, answering the id in it,
// or an error if it is not the response the request asked for.
type request struct {
	unary  func(txn string, begin *pb.TxnBegin, opts []grpc.CallOption) (string, error)
	piped  func(txn string, begin *pb.TxnBegin) *pb.PipelineRequest
	answer func(resp *pb.PipelineResponse) (string, error)
}

// reply is how a request of an attempt ended.
type reply struct {
	// txn is the attempt id its answer named: its response's, or its
	// failure's when the request began the attempt ("" if none).
	txn string
	// err is its error as the caller sees it.
	err error
	// unanswered: it failed without the server's handler answering (the
	// connection broke, a context ended).
	unanswered bool
}

// send sends req with the attempt's id or the begin: on the pipeline if
// it carries req, else as a unary RPC.
func (a *TxnAttempt) send(ctx context.Context, mayApply bool, id string, begin *pb.TxnBegin, req request) reply {
	if r, ok := a.sendPiped(ctx, mayApply, id, begin, req); ok {
		return r
	}
	var trailer metadata.MD
	var p peer.Peer
	txn, err := req.unary(id, begin, []grpc.CallOption{grpc.Trailer(&trailer), grpc.Peer(&p)})
	if err == nil {
		return reply{txn: txn}
	}
	r := reply{err: a.t.fail(err, mayApply && p.Addr != nil), unanswered: len(trailer.Get(CodeTrailer)) == 0}
	if ids := trailer.Get(TxnTrailer); len(ids) > 0 {
		r.txn = ids[0]
	}
	return r
}

// sendPiped sends req as a message of the pipeline; ok is false when it
// must go as a unary RPC. A request that carries the begin and whose
// context ends before its answer comes leaves the attempt it began to be
// aborted when the answer does (the server's handler goes on after the
// client gave up, where a unary RPC's would end).
func (a *TxnAttempt) sendPiped(ctx context.Context, mayApply bool, id string, begin *pb.TxnBegin, req request) (r reply, ok bool) {
	if a.t.pipe == nil || req.piped == nil {
		return reply{}, false
	}
	m := req.piped(id, begin)
	if m == nil {
		return reply{}, false
	}
	var late func(*pb.PipelineResponse)
	if begin != nil {
		late = func(resp *pb.PipelineResponse) {
			// Not req.answer: it sets what its caller, gone by now, reads.
			if began := pipedTxn(resp); began != "" {
				go func() {
					actx, cancel := context.WithTimeout(context.Background(), abortBegunTimeout)
					defer cancel()
					_ = a.t.AbortTxn(actx, began) // a failed abort leaves the attempt to expire
				}()
			}
		}
	}
	resp, err := a.t.pipe.Exchange(ctx, m, mayApply, late)
	switch {
	case err == ErrPipelineOff || err == ErrPipelineNoOp:
		return reply{}, false
	case err != nil:
		return reply{err: err, unanswered: true}, true
	}
	if e := resp.GetError(); e != nil {
		return reply{txn: e.GetTxn(), err: PipelineErrorFromPB(e, mayApply), unanswered: e.GetCode() == ""}, true
	}
	txn, err := req.answer(resp)
	return reply{txn: txn, err: err}, true
}

// run sends one request of the attempt (send). mayApply says whether the
// request may change the store (a commit): a broken connection after it
// was sent then leaves its outcome unknown. run answers the error as the
// caller sees it.
func (a *TxnAttempt) run(ctx context.Context, mayApply bool, req request) error {
	id, begin, done, err := a.target(ctx)
	if err != nil {
		return err
	}
	r := a.send(ctx, mayApply, id, begin, req)
	if begin == nil {
		return r.err
	}
	began := r.txn
	var broken error
	switch {
	case r.err == nil && began == "":
		broken = kv.Errorf(kv.CodeInternal, "the server answered a request that began a transaction without naming the attempt it began")
		r.err = broken
	case r.err != nil && began == "" && r.unanswered:
		// The server's handler did not answer (the connection broke, the
		// context ended): the attempt may have begun there.
		broken = kv.Errorf(kv.CodeUnavailable, "the request that began this transaction attempt got no answer (%v): the attempt is given up; run the transaction again", r.err)
	}
	done(began, broken)
	if r.err == nil || r.err == broken {
		return r.err
	}
	if began == "" && kv.CodeOf(r.err) == kv.CodeInvalidArgument && strings.HasPrefix(kv.AsError(r.err).Message, oldServerMessage) {
		return kv.Errorf(kv.CodeUnimplemented, "the server is older than this client: it cannot begin a transaction in its first operation (%v); upgrade the server", r.err)
	}
	return r.err
}
