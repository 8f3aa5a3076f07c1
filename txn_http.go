package groupkv

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync/atomic"
	"time"

	"github.com/groupkv/groupkv/internal/api"
	"github.com/groupkv/groupkv/internal/kv"
)

// httpTxn is the kv.TxnBackend and kv.GroupBackend (group_http.go) of a
// remote DB: the HTTP transaction and Key Groups forms
// (internal/api/http_txn.go, http_group.go) of the dialed node, on the port
// where it serves gRPC too. An attempt lives on the node that began it, so every
// call goes to the dialed node, never to a shard leader. Connections are
// kept alive and reused across calls and transactions.
type httpTxn struct {
	base   string // "http://host:port"
	client *http.Client
}

var _ kv.TxnBackend = (*httpTxn)(nil)

// txnMaxIdleConns is how many idle connections to the dialed node a remote
// DB keeps for transactions: one per transaction in flight up to this
// many, so that a busy client does not open a connection per call
// (net/http keeps only 2 by default).
const txnMaxIdleConns = 64

func newHTTPTxn(addr string) *httpTxn {
	tr := &http.Transport{
		// No proxy: the gRPC calls of the same DB go straight to addr.
		DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost:   txnMaxIdleConns,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	return &httpTxn{base: "http://" + addr, client: &http.Client{Transport: tr}}
}

// close releases the idle connections.
func (h *httpTxn) close() { h.client.CloseIdleConnections() }

// call POSTs in (nil: no body) as JSON to path and decodes the answer into
// out; see do.
func (h *httpTxn) call(ctx context.Context, path string, in, out any, write bool) error {
	return h.do(ctx, http.MethodPost, path, in, out, write)
}

// do sends in (nil: no body) as JSON to path with method and decodes the
// answer into out. Its errors are the server's, coded; ctx.Err() when ctx
// ended; for a failure of the transport, unavailable, or commit_unknown
// when write is set and the request had been sent whole (the server may
// have applied it).
func (h *httpTxn) do(ctx context.Context, method, path string, in, out any, write bool) error {
	var body io.Reader = http.NoBody
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return kv.Errorf(kv.CodeInvalidArgument, "encoding the request: %v", err)
		}
		body = bytes.NewReader(b)
	}
	var sent atomic.Bool
	tctx := httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteRequest: func(i httptrace.WroteRequestInfo) { sent.Store(i.Err == nil) },
	})
	req, err := http.NewRequestWithContext(tctx, method, h.base+path, body)
	if err != nil {
		return kv.Errorf(kv.CodeInvalidArgument, "%s %s: %v", method, path, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	fail := func(err error) error {
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		code := kv.CodeUnavailable
		if write && sent.Load() {
			code = kv.CodeCommitUnknown
		}
		return kv.Errorf(code, "%s %s: %v", method, path, err)
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return fail(err)
	}
	defer func() {
		// Drain what is left (a newline) so the connection is reused.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
		resp.Body.Close()
	}()
	if resp.StatusCode != http.StatusOK {
		data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if err != nil {
			return fail(err)
		}
		return errorFromHTTP(method, path, resp.StatusCode, data)
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if write {
			return kv.Errorf(kv.CodeCommitUnknown, "%s %s: the answer could not be read: %v", method, path, err)
		}
		return kv.Errorf(kv.CodeInternal, "%s %s: the answer could not be read: %v", method, path, err)
	}
	return nil
}

// errorFromHTTP returns the error a server answered with status: its
// {"error": {"code", "message"}} body, or, when the body is not one (a
// proxy's page), an error coded by the status.
func errorFromHTTP(method, path string, status int, data []byte) error {
	var e struct {
		Error struct {
			Code    kv.Code `json:"code"`
			Message string  `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(data, &e) == nil && e.Error.Code != "" {
		return &kv.Error{Code: e.Error.Code, Message: e.Error.Message}
	}
	code := kv.CodeInternal
	switch status {
	case http.StatusServiceUnavailable, http.StatusBadGateway, http.StatusGatewayTimeout:
		code = kv.CodeUnavailable
	case http.StatusNotImplemented:
		code = kv.CodeUnimplemented
	}
	return kv.Errorf(code, "%s %s: HTTP %d: %s", method, path, status, clipKey(bytes.TrimSpace(data)))
}

// txnPath is the path of operation verb of attempt id. Ids are URL-safe
// and go in the path as they are.
func txnPath(id, verb string) string { return "/v1/txn/" + id + "/" + verb }

// txnKeyJSON is the body of a get or delete.
type txnKeyJSON struct {
	Collection string `json:"collection"`
	api.KeyJSON
}

func (h *httpTxn) BeginTxn(ctx context.Context, opts kv.TxnOptions) (string, error) {
	var resp api.TxnBeginResponseJSON
	req := api.TxnBeginRequestJSON{Isolation: opts.Isolation, RetryOf: opts.RetryOf, ReadOnly: opts.ReadOnly}
	if err := h.call(ctx, "/v1/txn", req, &resp, false); err != nil {
		return "", err
	}
	if resp.Txn == "" {
		return "", kv.Errorf(kv.CodeInternal, "POST /v1/txn: the answer names no transaction")
	}
	return resp.Txn, nil
}

func (h *httpTxn) TxnGet(ctx context.Context, txn string, ref kv.KeyRef) (kv.Record, bool, error) {
	var resp api.TxnGetResponseJSON
	if err := h.call(ctx, txnPath(txn, "get"), txnKeyJSON{ref.Collection, api.ToKeyJSON(ref.Key)}, &resp, false); err != nil {
		return kv.Record{}, false, err
	}
	rec, found, err := api.TxnGetFromJSON(resp)
	if err != nil {
		return kv.Record{}, false, kv.Errorf(kv.CodeInternal, "the answer of a get is malformed: %v", err)
	}
	if found {
		rec.Key = ref.Key
	}
	return rec, found, nil
}

func (h *httpTxn) TxnPut(ctx context.Context, txn string, item kv.PutItem) error {
	if item.IfVersion != nil {
		return kv.Errorf(kv.CodeInvalidArgument, "a transaction's put takes no IfVersion: read the key in the transaction and compare its version")
	}
	k, v := api.ToKeyJSON(item.Key), api.ToValueJSON(item.Value)
	req := api.TxnPutRequestJSON{Collection: item.Collection, Key: k.Key, KeyBase64: k.KeyBase64,
		Value: v.Value, ValueBase64: v.ValueBase64, Tags: item.Tags}
	return h.call(ctx, txnPath(txn, "put"), req, &struct{}{}, false)
}

func (h *httpTxn) TxnDelete(ctx context.Context, txn string, ref kv.KeyRef) error {
	return h.call(ctx, txnPath(txn, "delete"), txnKeyJSON{ref.Collection, api.ToKeyJSON(ref.Key)}, &struct{}{}, false)
}

func (h *httpTxn) TxnScan(ctx context.Context, txn string, req kv.ScanRequest) (kv.ScanResult, error) {
	if req.Version != 0 {
		return kv.ScanResult{}, kv.Errorf(kv.CodeInvalidArgument, "a transaction reads at its own time: leave ScanRequest.Version 0")
	}
	body := api.TxnScanRequestJSON{Collection: req.Collection, Limit: req.Limit, Reverse: req.Reverse, Page: req.Page}
	if len(req.Start) > 0 {
		k := api.ToKeyJSON(req.Start)
		body.Start, body.StartBase64 = k.Key, k.KeyBase64
	}
	if len(req.End) > 0 {
		k := api.ToKeyJSON(req.End)
		body.End, body.EndBase64 = k.Key, k.KeyBase64
	}
	return h.page(ctx, txnPath(txn, "scan"), body)
}

func (h *httpTxn) TxnGetByTags(ctx context.Context, txn string, q kv.TagQuery) (kv.ScanResult, error) {
	if q.Version != 0 {
		return kv.ScanResult{}, kv.Errorf(kv.CodeInvalidArgument, "a transaction reads at its own time: leave TagQuery.Version 0")
	}
	body := api.TxnTagQueryRequestJSON{Collection: q.Collection, All: q.All, Any: q.Any, Limit: q.Limit, Page: q.Page}
	return h.page(ctx, txnPath(txn, "tags"), body)
}

// page asks for one page of a scan or tag query.
func (h *httpTxn) page(ctx context.Context, path string, body any) (kv.ScanResult, error) {
	var resp api.ScanPageJSON
	if err := h.call(ctx, path, body, &resp, false); err != nil {
		return kv.ScanResult{}, err
	}
	res, err := api.ScanResultFromJSON(resp)
	if err != nil {
		return kv.ScanResult{}, kv.Errorf(kv.CodeInternal, "the answer of a scan is malformed: %v", err)
	}
	return res, nil
}

func (h *httpTxn) CommitTxn(ctx context.Context, txn string) (uint64, error) {
	var resp api.TxnCommitResponseJSON
	if err := h.call(ctx, txnPath(txn, "commit"), nil, &resp, true); err != nil {
		return 0, err
	}
	if !resp.Committed {
		return 0, kv.Errorf(kv.CodeCommitUnknown, "the answer of the commit of %s does not say it committed", txn)
	}
	return resp.Version, nil
}

func (h *httpTxn) AbortTxn(ctx context.Context, txn string) error {
	return h.call(ctx, txnPath(txn, "abort"), nil, &struct{}{}, false)
}

func (h *httpTxn) ExecTxn(ctx context.Context, req kv.ExecRequest) (kv.ExecResult, error) {
	var resp api.ExecResponseJSON
	if err := h.call(ctx, "/v1/txn/exec", api.ToExecRequestJSON(req), &resp, execWrites(req)); err != nil {
		return kv.ExecResult{}, err
	}
	res, err := api.ExecResultFromJSON(resp)
	if err != nil {
		return kv.ExecResult{}, kv.Errorf(kv.CodeInternal, "the answer of a one-shot transaction is malformed: %v", err)
	}
	return res, nil
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

func (h *httpTxn) String() string { return fmt.Sprintf("groupkv transactions over HTTP at %s", h.base) }
