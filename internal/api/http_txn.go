package api

import (
	"net/http"
	"strings"

	"github.com/groupkv/groupkv/internal/auth"
	"github.com/groupkv/groupkv/internal/kv"
)

// The transaction forms of the HTTP API (kv.TxnBackend), all POST with a
// JSON body (wire_txn.go holds the shapes):
//
//	POST /v1/txn               {"isolation", "retry_of", "read_only"}  → {"txn": id}
//	POST /v1/txn/{id}/get      {"collection", "key", "for_update"} → {"found", "value", "version", "tags"}
//	POST /v1/txn/{id}/batch_get {"keys": [{"collection", "key"}, ...], "for_update"} → {"items": [...]}
//	POST /v1/txn/{id}/put      {"collection", "key", "value", "tags"} → {}
//	POST /v1/txn/{id}/delete   {"collection", "key"}        → {}
//	POST /v1/txn/{id}/scan     {"collection", "start", "end", "limit", "reverse", "page"} → a scan page
//	POST /v1/txn/{id}/tags     {"collection", "all" | "any", "limit", "page"}             → a scan page
//	POST /v1/txn/{id}/commit   → {"committed": true, "version": N}
//	POST /v1/txn/{id}/abort    → {}
//	POST /v1/txn/exec          {"if": [...], "then": [...], "else": [...]}
//	                           → {"succeeded", "version", "results": [...]}
//
// An attempt id is used in the path as the backend gave it (it is
// URL-safe); the attempt lives on the node that began it, so its operations
// must be sent to that node. Errors are the backend's: txn_aborted (409)
// when the attempt was aborted, and the client may begin a new one with
// retry_of; commit_unknown (503) when a commit's outcome cannot be told
// (kv.TxnBackend.CommitTxn: a commit sent again answers what the first
// one did while the node remembers the attempt, and one of an attempt the
// node does not know answers commit_unknown). A
// backend that is not a kv.TxnBackend makes every form answer 501
// unimplemented.

// Paths of the transaction forms. txnPath alone begins an attempt; it is
// followed by /{id}/{verb} for the operations of one.
const (
	txnPath     = "/v1/txn"
	txnExecPath = "/v1/txn/exec"
)

// Operation names of the transaction forms, the op label of Metrics.
const (
	opTxnBegin  = "txn_begin"
	opTxnGet    = "txn_get" // and batch_get, a get of several keys
	opTxnPut    = "txn_put"
	opTxnDelete = "txn_delete"
	opTxnScan   = "txn_scan"
	opTxnTags   = "txn_tags"
	opTxnCommit = "txn_commit"
	opTxnAbort  = "txn_abort"
	opTxnExec   = "txn_exec"
)

// txnForm answers one transaction form; id is the attempt named in the
// path, "" for begin and exec.
type txnForm func(w http.ResponseWriter, r *http.Request, tb kv.TxnBackend, id string) error

// serveTxn answers txnPath and below; p is the escaped path.
func (h *httpHandler) serveTxn(w http.ResponseWriter, r *http.Request, p string) (string, error) {
	var (
		op   string
		form txnForm
		id   string
	)
	switch p {
	case txnPath:
		op, form = opTxnBegin, h.txnBegin
	case txnExecPath:
		op, form = opTxnExec, h.txnExec
	default:
		rest := strings.TrimPrefix(p, txnPath+"/")
		slash := strings.IndexByte(rest, '/')
		if slash <= 0 {
			return opUnknown, txnPathError(r)
		}
		id = rest[:slash]
		switch rest[slash+1:] {
		case "get":
			op, form = opTxnGet, h.txnGet
		case "batch_get":
			op, form = opTxnGet, h.txnBatchGet
		case "put":
			op, form = opTxnPut, h.txnPut
		case "delete":
			op, form = opTxnDelete, h.txnDelete
		case "scan":
			op, form = opTxnScan, h.txnScan
		case "tags":
			op, form = opTxnTags, h.txnTags
		case "commit":
			op, form = opTxnCommit, h.txnCommit
		case "abort":
			op, form = opTxnAbort, h.txnAbort
		default:
			return opUnknown, txnPathError(r)
		}
	}
	if r.Method != http.MethodPost {
		return opUnknown, methodNotAllowed(r, "POST")
	}
	tb, ok := h.b.(kv.TxnBackend)
	if !ok {
		return op, kv.Errorf(kv.CodeUnimplemented,
			"this server does not serve transactions: use conditional writes (if_version) and batches, or a server that does")
	}
	if _, err := parseQuery(r); err != nil {
		return op, err
	}
	return op, form(w, r, tb, id)
}

func txnPathError(r *http.Request) error {
	return kv.Errorf(kv.CodeNotFound,
		"unknown path %q: transactions are served at /v1/txn (begin), /v1/txn/{id}/{get,batch_get,put,delete,scan,tags,commit,abort} and /v1/txn/exec",
		clip(r.URL.Path))
}

// emptyResponse answers a form that has nothing to say but success.
type emptyResponse struct{}

func (h *httpHandler) txnBegin(w http.ResponseWriter, r *http.Request, tb kv.TxnBackend, _ string) error {
	opts, err := h.decodeTxnBegin(w, r)
	if err != nil {
		return err
	}
	id, err := tb.BeginTxn(r.Context(), opts)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, TxnBeginResponseJSON{Txn: id})
	return nil
}

// decodeTxnBegin reads and validates the body of a begin: none, or the
// options of the attempt.
func (h *httpHandler) decodeTxnBegin(w http.ResponseWriter, r *http.Request) (kv.TxnOptions, error) {
	var req TxnBeginRequestJSON
	if r.ContentLength != 0 { // no body: a serializable read-write transaction
		if err := decodeJSON(w, r, h.cfg.MaxBodySize, &req, txnBeginFields); err != nil {
			return kv.TxnOptions{}, err
		}
	}
	return TxnOptionsFromJSON(req)
}

func (h *httpHandler) txnGet(w http.ResponseWriter, r *http.Request, tb kv.TxnBackend, id string) error {
	var req TxnGetRequestJSON
	if err := decodeJSON(w, r, h.cfg.MaxBodySize, &req, txnGetFields); err != nil {
		return err
	}
	ref, err := req.toKeyRef()
	if err != nil {
		return err
	}
	get := tb.TxnGet
	if req.ForUpdate {
		// Its exclusive lock holds writers off: a read for a write.
		if err := h.cfg.Roles.Check(r.Context(), auth.Write, "a read for update"); err != nil {
			return err
		}
		get = tb.TxnGetForUpdate
	}
	rec, found, err := get(r.Context(), id, ref)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, ToTxnGetResponseJSON(rec, found))
	return nil
}

// txnBatchGetRequest is the body of a batch get in a transaction.
type txnBatchGetRequest struct {
	Keys      jsonList[KeyRefJSON] `json:"keys"`
	ForUpdate bool                 `json:"for_update"`
}

func (h *httpHandler) txnBatchGet(w http.ResponseWriter, r *http.Request, tb kv.TxnBackend, id string) error {
	req := txnBatchGetRequest{Keys: jsonList[KeyRefJSON]{name: "keys", fields: keyRefFields, max: h.cfg.MaxBatchKeys}}
	if err := decodeJSON(w, r, h.cfg.MaxBodySize, &req, "keys, for_update"); err != nil {
		return err
	}
	refs, err := keyRefsFromJSON(req.Keys.elems)
	if err != nil {
		return err
	}
	if req.ForUpdate {
		if err := h.cfg.Roles.Check(r.Context(), auth.Write, "a read for update"); err != nil {
			return err
		}
	}
	items, err := tb.TxnBatchGet(r.Context(), id, refs, req.ForUpdate)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, TxnBatchGetResponseJSON{Items: ToBatchGetItemsJSON(items)})
	return nil
}

func (h *httpHandler) txnPut(w http.ResponseWriter, r *http.Request, tb kv.TxnBackend, id string) error {
	var req TxnPutRequestJSON
	if err := decodeJSON(w, r, h.cfg.MaxBodySize, &req, txnPutFields); err != nil {
		return err
	}
	item, err := h.toPutItem(PutItemJSON{Collection: req.Collection, Key: req.Key, KeyBase64: req.KeyBase64,
		Value: req.Value, ValueBase64: req.ValueBase64, Tags: req.Tags})
	if err != nil {
		return err
	}
	if err := tb.TxnPut(r.Context(), id, item); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, emptyResponse{})
	return nil
}

func (h *httpHandler) txnDelete(w http.ResponseWriter, r *http.Request, tb kv.TxnBackend, id string) error {
	ref, err := h.decodeTxnKey(w, r)
	if err != nil {
		return err
	}
	if err := tb.TxnDelete(r.Context(), id, ref); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, emptyResponse{})
	return nil
}

// decodeTxnKey reads and validates the body of a get or delete.
func (h *httpHandler) decodeTxnKey(w http.ResponseWriter, r *http.Request) (kv.KeyRef, error) {
	var req KeyRefJSON
	if err := decodeJSON(w, r, h.cfg.MaxBodySize, &req, keyRefFields); err != nil {
		return kv.KeyRef{}, err
	}
	return req.toKeyRef()
}

func (h *httpHandler) txnScan(w http.ResponseWriter, r *http.Request, tb kv.TxnBackend, id string) error {
	var req TxnScanRequestJSON
	if err := decodeJSON(w, r, h.cfg.MaxBodySize, &req, txnScanFields); err != nil {
		return err
	}
	if err := kv.ValidateCollectionName(req.Collection); err != nil {
		return err
	}
	start, _, err := BytesFromJSON("start", req.Start, req.StartBase64)
	if err != nil {
		return err
	}
	end, _, err := BytesFromJSON("end", req.End, req.EndBase64)
	if err != nil {
		return err
	}
	if err := checkSpan(start, end); err != nil {
		return err
	}
	if err := checkPageSize(req.Limit); err != nil {
		return err
	}
	res, err := tb.TxnScan(r.Context(), id, kv.ScanRequest{Collection: req.Collection, Start: nonEmpty(start), End: nonEmpty(end),
		Limit: req.Limit, Reverse: req.Reverse, Page: req.Page})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, toScanResponse(res))
	return nil
}

func (h *httpHandler) txnTags(w http.ResponseWriter, r *http.Request, tb kv.TxnBackend, id string) error {
	var req TxnTagQueryRequestJSON
	if err := decodeJSON(w, r, h.cfg.MaxBodySize, &req, txnTagsFields); err != nil {
		return err
	}
	if err := kv.ValidateCollectionName(req.Collection); err != nil {
		return err
	}
	if (len(req.All) == 0) == (len(req.Any) == 0) {
		return kv.Errorf(kv.CodeInvalidArgument, `give exactly one of "all": [...] (records carrying every tag) and "any": [...] (records carrying one of them), with at least one tag`)
	}
	q := kv.TagQuery{Collection: req.Collection, All: req.All, Any: req.Any, Limit: req.Limit, Page: req.Page}
	name, tags := "all", req.All
	if len(req.Any) > 0 {
		name, tags = "any", req.Any
	}
	if err := kv.ValidateTags(tags); err != nil {
		return at(name, err)
	}
	if err := checkPageSize(req.Limit); err != nil {
		return err
	}
	res, err := tb.TxnGetByTags(r.Context(), id, q)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, toScanResponse(res))
	return nil
}

// checkPageSize checks the limit of a scan or tag query given in a body, 0
// meaning the backend's default.
func checkPageSize(n int) error {
	if n < 0 || n > kv.MaxPageSize {
		return kv.Errorf(kv.CodeInvalidArgument, "limit %d is not a page size: use 1 to %d; omit it for %d; use next_page for more",
			n, kv.MaxPageSize, kv.DefaultPageSize)
	}
	return nil
}

func (h *httpHandler) txnCommit(w http.ResponseWriter, r *http.Request, tb kv.TxnBackend, id string) error {
	if err := h.decodeNoFields(w, r); err != nil {
		return err
	}
	v, err := tb.CommitTxn(r.Context(), id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, TxnCommitResponseJSON{Committed: true, Version: v})
	return nil
}

// txnAbort answers 200 for an attempt that is unknown or already finished
// too: aborting is idempotent (kv.TxnBackend.AbortTxn). It takes no
// fields, and aborts whatever its body holds: an abort refused for its
// body would leave the attempt's locks held until it expires.
func (h *httpHandler) txnAbort(w http.ResponseWriter, r *http.Request, tb kv.TxnBackend, id string) error {
	if err := tb.AbortTxn(r.Context(), id); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, emptyResponse{})
	return nil
}

// decodeNoFields reads the body of a form that takes none: nothing, or {}.
func (h *httpHandler) decodeNoFields(w http.ResponseWriter, r *http.Request) error {
	if r.ContentLength == 0 {
		return nil
	}
	return decodeJSON(w, r, h.cfg.MaxBodySize, &emptyResponse{}, "none (send no body, or {})")
}

// execRequest is the body of POST /v1/txn/exec as decoded: its lists stop
// at their limit.
type execRequest struct {
	If   jsonList[CompareJSON] `json:"if"`
	Then jsonList[TxnOpJSON]   `json:"then"`
	Else jsonList[TxnOpJSON]   `json:"else"`
}

func (h *httpHandler) txnExec(w http.ResponseWriter, r *http.Request, tb kv.TxnBackend, _ string) error {
	req, err := h.decodeExec(w, r)
	if err != nil {
		return err
	}
	res, err := tb.ExecTxn(r.Context(), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, ToExecResponseJSON(req, res))
	return nil
}

// decodeExec reads and validates the body of a one-shot transaction.
func (h *httpHandler) decodeExec(w http.ResponseWriter, r *http.Request) (kv.ExecRequest, error) {
	max := h.cfg.MaxTxnOps
	body := execRequest{
		If:   jsonList[CompareJSON]{name: "if", fields: compareFields, max: max},
		Then: jsonList[TxnOpJSON]{name: "then", fields: txnOpFields, max: max},
		Else: jsonList[TxnOpJSON]{name: "else", fields: txnOpFields, max: max},
	}
	if err := decodeJSON(w, r, h.cfg.MaxBodySize, &body, execFields); err != nil {
		return kv.ExecRequest{}, err
	}
	return ExecRequestFromJSON(ExecRequestJSON{If: body.If.elems, Then: body.Then.elems, Else: body.Else.elems}, h.cfg.MaxValueSize)
}
