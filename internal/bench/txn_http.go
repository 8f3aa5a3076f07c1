package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/groupkv/groupkv/internal/api"
	"github.com/groupkv/groupkv/internal/kv"
)

// HTTPTxnClient is a kv.TxnBackend of a groupkv server's HTTP/JSON
// transaction endpoints, and a PlainKV of its /v1/kv endpoints:
//
//	POST /v1/txn             {"isolation": "serializable"[, "retry_of": id]} → {"txn": id}
//	POST /v1/txn/{id}/get    {"collection", "key"} → {"found": true, "value", "version"} | {"found": false}
//	POST /v1/txn/{id}/put    {"collection", "key", "value"}
//	POST /v1/txn/{id}/commit → {"committed": true, "version"}
//	POST /v1/txn/{id}/abort
//
// Errors are {"error": {"code", "message"}} and become *kv.Error values of
// that code (txn_aborted is 409, commit_unknown 503). Keys and values
// travel as JSON strings, so they must be valid UTF-8 (the txn workload's
// are ASCII). Only the methods the txn workload calls are implemented; the
// others answer CodeInvalidArgument.
type HTTPTxnClient struct {
	base string // "http://host:port"
	c    *http.Client
}

var (
	_ kv.TxnBackend = (*HTTPTxnClient)(nil)
	_ PlainKV       = (*HTTPTxnClient)(nil)
)

// NewHTTPTxnClient talks to the server at base ("http://host:port"),
// keeping up to conns idle connections alive (0 means 64).
func NewHTTPTxnClient(base string, conns int) *HTTPTxnClient {
	if conns <= 0 {
		conns = 64
	}
	tr := &http.Transport{
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     90 * time.Second,
	}
	return &HTTPTxnClient{base: base, c: &http.Client{Transport: tr}}
}

// Close closes the idle connections.
func (h *HTTPTxnClient) Close() error {
	h.c.CloseIdleConnections()
	return nil
}

// call sends method path with the JSON of in (none when nil) and decodes a
// 2xx answer into out (ignored when nil); any other answer becomes a
// *kv.Error.
func (h *HTTPTxnClient) call(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, h.base+path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := h.c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return httpError(resp.StatusCode, b)
	}
	if out == nil || len(b) == 0 {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("bench: %s %s answered %q: %w", method, path, b, err)
	}
	return nil
}

// httpError turns an error answer into a *kv.Error: the code of its JSON
// body, or one from the status.
func httpError(status int, body []byte) error {
	var e struct {
		Error struct {
			Code    kv.Code `json:"code"`
			Message string  `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil && e.Error.Code != "" {
		return &kv.Error{Code: e.Error.Code, Message: e.Error.Message}
	}
	code := kv.CodeInternal
	switch status {
	case http.StatusNotFound:
		code = kv.CodeNotFound
	case http.StatusConflict:
		code = kv.CodeTxnAborted
	case http.StatusServiceUnavailable:
		code = kv.CodeUnavailable
	}
	return &kv.Error{Code: code, Message: fmt.Sprintf("HTTP %d: %s", status, bytes.TrimSpace(body))}
}

func (h *HTTPTxnClient) BeginTxn(ctx context.Context, opts kv.TxnOptions) (string, error) {
	if opts.ReadOnly {
		return "", kv.Errorf(kv.CodeInvalidArgument, "bench: the HTTP client begins no read-only transactions")
	}
	iso := opts.Isolation
	if iso == "" {
		iso = kv.IsolationSerializable
	}
	in := struct {
		Isolation kv.Isolation `json:"isolation"`
		RetryOf   string       `json:"retry_of,omitempty"`
	}{iso, opts.RetryOf}
	var out struct {
		Txn string `json:"txn"`
	}
	if err := h.call(ctx, http.MethodPost, "/v1/txn", in, &out); err != nil {
		return "", err
	}
	if out.Txn == "" {
		return "", kv.Errorf(kv.CodeInternal, "bench: POST /v1/txn answered no transaction id")
	}
	return out.Txn, nil
}

func txnPath(id, op string) string { return "/v1/txn/" + url.PathEscape(id) + "/" + op }

type httpKeyRef struct {
	Collection string `json:"collection"`
	Key        string `json:"key"`
}

func (h *HTTPTxnClient) TxnGet(ctx context.Context, id string, ref kv.KeyRef) (kv.Record, bool, error) {
	var out struct {
		Found   bool   `json:"found"`
		Value   string `json:"value"`
		Version uint64 `json:"version"`
	}
	if err := h.call(ctx, http.MethodPost, txnPath(id, "get"), httpKeyRef{ref.Collection, string(ref.Key)}, &out); err != nil {
		return kv.Record{}, false, err
	}
	if !out.Found {
		return kv.Record{}, false, nil
	}
	return kv.Record{Key: ref.Key, Value: []byte(out.Value), Version: out.Version}, true, nil
}

func (h *HTTPTxnClient) TxnPut(ctx context.Context, id string, item kv.PutItem) error {
	in := struct {
		Collection string `json:"collection"`
		Key        string `json:"key"`
		Value      string `json:"value"`
	}{item.Collection, string(item.Key), string(item.Value)}
	return h.call(ctx, http.MethodPost, txnPath(id, "put"), in, nil)
}

func (h *HTTPTxnClient) CommitTxn(ctx context.Context, id string) (uint64, error) {
	var out struct {
		Committed bool   `json:"committed"`
		Version   uint64 `json:"version"`
	}
	if err := h.call(ctx, http.MethodPost, txnPath(id, "commit"), nil, &out); err != nil {
		return 0, err
	}
	if !out.Committed {
		return 0, kv.Errorf(kv.CodeCommitUnknown, "bench: commit of %s answered committed=false", id)
	}
	return out.Version, nil
}

func (h *HTTPTxnClient) AbortTxn(ctx context.Context, id string) error {
	return h.call(ctx, http.MethodPost, txnPath(id, "abort"), nil, nil)
}

var errHTTPUnimplemented = kv.Errorf(kv.CodeInvalidArgument, "bench: the HTTP transaction client does not implement this operation")

func (h *HTTPTxnClient) TxnDelete(ctx context.Context, id string, ref kv.KeyRef) error {
	return errHTTPUnimplemented
}

func (h *HTTPTxnClient) TxnScan(ctx context.Context, id string, req kv.ScanRequest) (kv.ScanResult, error) {
	return kv.ScanResult{}, errHTTPUnimplemented
}

func (h *HTTPTxnClient) TxnGetByTags(ctx context.Context, id string, q kv.TagQuery) (kv.ScanResult, error) {
	return kv.ScanResult{}, errHTTPUnimplemented
}

func (h *HTTPTxnClient) ExecTxn(ctx context.Context, req kv.ExecRequest) (kv.ExecResult, error) {
	return kv.ExecResult{}, errHTTPUnimplemented
}

func kvPath(coll string, key []byte) string {
	return "/v1/kv/" + url.PathEscape(coll) + "/" + url.PathEscape(string(key))
}

// Get reads a key with GET /v1/kv/{collection}/{key}.
func (h *HTTPTxnClient) Get(ctx context.Context, req kv.GetRequest) (kv.Record, error) {
	r, err := http.NewRequestWithContext(ctx, http.MethodGet, h.base+kvPath(req.Collection, req.Key), nil)
	if err != nil {
		return kv.Record{}, err
	}
	resp, err := h.c.Do(r)
	if err != nil {
		return kv.Record{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return kv.Record{}, err
	}
	if resp.StatusCode != http.StatusOK {
		return kv.Record{}, httpError(resp.StatusCode, b)
	}
	v, _ := strconv.ParseUint(resp.Header.Get(api.HeaderVersion), 10, 64)
	return kv.Record{Key: req.Key, Value: b, Version: v}, nil
}

// Put writes a key with PUT /v1/kv/{collection}/{key}.
func (h *HTTPTxnClient) Put(ctx context.Context, req kv.PutRequest) (uint64, error) {
	r, err := http.NewRequestWithContext(ctx, http.MethodPut, h.base+kvPath(req.Collection, req.Key), bytes.NewReader(req.Value))
	if err != nil {
		return 0, err
	}
	resp, err := h.c.Do(r)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return 0, err
	}
	if resp.StatusCode/100 != 2 {
		return 0, httpError(resp.StatusCode, b)
	}
	return 0, nil
}
