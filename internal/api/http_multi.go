package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
)

// The multi-record forms of the HTTP API (kv.MultiBackend):
//
//	POST /v1/batch/get     {"keys": [{"collection", "key"}, ...]}
//	POST /v1/batch/put     {"items": [{"collection", "key", "value", "tags", "if_version"}, ...]}
//	POST /v1/batch/delete  {"keys": [...]}
//	POST /v1/delete_range  {"collection", "start", "end"}
//	GET  /v1/scan/{collection}?start=&end=&limit=&reverse=&page=&version=
//	GET  /v1/tags/{collection}?all=a,b|any=a,b&limit=&page=&version=
//	GET  /v1/watch/{collection}?from_version=N&start=&end=&after_key=
//
// Bytes in JSON. A key or value is a JSON string when it is valid UTF-8, and
// standard base64 in a _base64 twin field otherwise ("key_base64",
// "value_base64"; "start_base64" and "end_base64" in a delete range). An
// answer carries exactly one of the two; a request may give either, never
// both. encoding/json replaces bytes that are not UTF-8 in a string, so the
// twin is the only way to send or receive such bytes exactly. Keys and
// bounds in query strings are percent-decoded bytes and need no twin.
//
// Versions are JSON numbers (uint64, beyond 2^53).

// Paths of the multi-record forms. scanPrefix, tagsPrefix and watchPrefix
// are followed by /{collection}.
const (
	batchGetPath    = "/v1/batch/get"
	batchPutPath    = "/v1/batch/put"
	batchDeletePath = "/v1/batch/delete"
	deleteRangePath = "/v1/delete_range"
	scanPrefix      = "/v1/scan"
	tagsPrefix      = "/v1/tags"
	watchPrefix     = "/v1/watch"
)

// Media types of a watch stream.
const (
	ndjsonType      = "application/x-ndjson"
	eventStreamType = "text/event-stream"
)

// under reports whether path p is prefix or below it.
func under(p, prefix string) bool {
	return p == prefix || strings.HasPrefix(p, prefix+"/")
}

// servePost answers a POST of a JSON body with fn. A query string is an
// error: these forms take everything in the body. Every failure of a batch
// write is answered with the records it applied.
func (h *httpHandler) servePost(w http.ResponseWriter, r *http.Request, op string, fn func(http.ResponseWriter, *http.Request) error) (string, error) {
	if r.Method != http.MethodPost {
		return opUnknown, methodNotAllowed(r, "POST")
	}
	err := func() error {
		if _, err := parseQuery(r); err != nil {
			return err
		}
		return fn(w, r)
	}()
	if err != nil && (op == opBatchPut || op == opBatchDelete) {
		err = asBatchWriteError(err)
	}
	return op, err
}

// serveInCollection answers prefix/{collection} (p is the escaped path) with
// fn: GET and HEAD, or GET only for a watch (a stream has no headers to
// answer without it).
func (h *httpHandler) serveInCollection(w http.ResponseWriter, r *http.Request, p, prefix, op string,
	fn func(http.ResponseWriter, *http.Request, string) error) (string, error) {
	rest := strings.TrimPrefix(strings.TrimPrefix(p, prefix), "/")
	if strings.Contains(rest, "/") {
		return opUnknown, kv.Errorf(kv.CodeNotFound, "unknown path %q: use %s/{collection}", clip(r.URL.Path), prefix)
	}
	allow := "GET, HEAD"
	if op == opWatch {
		allow = "GET"
	}
	if r.Method != http.MethodGet && (r.Method != http.MethodHead || op == opWatch) {
		return opUnknown, methodNotAllowed(r, allow)
	}
	if rest == "" {
		return op, kv.Errorf(kv.CodeInvalidArgument, "the path names no collection: use %s/{collection}", prefix)
	}
	coll, err := url.PathUnescape(rest)
	if err != nil {
		return op, kv.Errorf(kv.CodeInvalidArgument, "collection in the path is badly escaped: %v", err)
	}
	if err := kv.ValidateCollectionName(coll); err != nil {
		return op, err
	}
	return op, fn(w, r, coll)
}

// batchWriteError is the failure of a batch put or delete: err, and the
// records written nonetheless (see kv.BatchError). Every error of those
// forms is one, so that their answers always carry "applied".
type batchWriteError struct {
	err     error
	applied []kv.WriteResult
}

func (e *batchWriteError) Error() string { return e.err.Error() }
func (e *batchWriteError) Unwrap() error { return e.err }

// asBatchWriteError makes err a *batchWriteError, taking the applied
// records of a *kv.BatchError.
func asBatchWriteError(err error) error {
	var bw *batchWriteError
	if errors.As(err, &bw) {
		return err
	}
	var be *kv.BatchError
	if !errors.As(err, &be) {
		return &batchWriteError{err: err}
	}
	cause := error(be.Err)
	if be.Err == nil { // a backend bug; kv.BatchError.Error would panic
		cause = kv.Errorf(kv.CodeInternal, "batch failed after applying %d records, with no cause", len(be.Applied))
	}
	return &batchWriteError{err: cause, applied: be.Applied}
}

// streamEnded is the error of a watch that failed after its first event:
// the answer was under way, so the stream told the client, if it could,
// and only the code is left for the metrics.
type streamEnded struct {
	code kv.Code
}

func (e *streamEnded) Error() string { return "stream ended: " + string(e.code) }

// at returns err, a validation error, with its message prefixed by where
// (as "keys[3]"), its code kept.
func at(where string, err error) error {
	e := kv.AsError(err)
	return &kv.Error{Code: e.Code, Message: where + ": " + e.Message}
}

// jsonList is an array field of a request body of at most max elements,
// each with no unknown fields. It decodes element by element and stops at
// the first one beyond max, so that a body of many tiny elements makes the
// handler allocate for max of them at most. Its errors are *kv.Error.
type jsonList[T any] struct {
	name   string // the field, for messages
	fields string // the fields of an element, for messages
	max    int
	// limit says, in the error of a list over max, what the limit is;
	// "" says it is that of one batch.
	limit string
	elems []T
}

func (l *jsonList[T]) UnmarshalJSON(b []byte) error {
	l.elems = nil
	if string(b) == "null" {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('[') {
		return kv.Errorf(kv.CodeInvalidArgument, "field %q of the request body must be an array", l.name)
	}
	for i := 0; dec.More(); i++ {
		if i == l.max {
			if l.limit != "" {
				return kv.Errorf(kv.CodeTooLarge, "more than %d %s: %s", l.max, l.name, l.limit)
			}
			return kv.Errorf(kv.CodeTooLarge, "more than %d %s: the limit of one batch is %d; split it", l.max, l.name, l.max)
		}
		var v T
		if err := dec.Decode(&v); err != nil {
			return jsonError(err, 0, fmt.Sprintf("%s[%d]", l.name, i), l.fields)
		}
		l.elems = append(l.elems, v)
	}
	return nil
}

const keyRefFields = "collection, key, key_base64"

// toKeyRef validates k.
func (k KeyRefJSON) toKeyRef() (kv.KeyRef, error) {
	if err := kv.ValidateCollectionName(k.Collection); err != nil {
		return kv.KeyRef{}, err
	}
	key, err := keyFromJSON(k.Key, k.KeyBase64)
	if err != nil {
		return kv.KeyRef{}, err
	}
	return kv.KeyRef{Collection: k.Collection, Key: key}, nil
}

const putItemFields = "collection, key, key_base64, value, value_base64, tags, if_version"

// keyFromJSON returns a record key given as key or key_base64, validated.
func keyFromJSON(s, b64 *string) ([]byte, error) {
	key, given, err := BytesFromJSON("key", s, b64)
	if err != nil {
		return nil, err
	}
	if !given {
		return nil, kv.Errorf(kv.CodeInvalidArgument, "no key: give key, or key_base64 for a key that is not UTF-8")
	}
	if err := kv.ValidateKey(key); err != nil {
		return nil, err
	}
	return key, nil
}

// checkRequestBytes fails when the keys and values of a request, n bytes,
// are over kv.MaxRequestBytes.
func checkRequestBytes(n int) error {
	if n > kv.MaxRequestBytes {
		return kv.Errorf(kv.CodeTooLarge, "the keys and values of the request are %d bytes, the limit is %d: split it", n, kv.MaxRequestBytes)
	}
	return nil
}

// batchKeysRequest is the body of a batch get or delete.
type batchKeysRequest struct {
	Keys jsonList[KeyRefJSON] `json:"keys"`
}

// decodeKeys reads and validates the body of a batch get or delete.
func (h *httpHandler) decodeKeys(w http.ResponseWriter, r *http.Request) ([]kv.KeyRef, error) {
	req := batchKeysRequest{Keys: jsonList[KeyRefJSON]{name: "keys", fields: keyRefFields, max: h.cfg.MaxBatchKeys}}
	if err := decodeJSON(w, r, h.cfg.MaxBodySize, &req, "keys"); err != nil {
		return nil, err
	}
	return keyRefsFromJSON(req.Keys.elems)
}

// keyRefsFromJSON validates the keys of a batch get or delete.
func keyRefsFromJSON(keys []KeyRefJSON) ([]kv.KeyRef, error) {
	if len(keys) == 0 {
		return nil, kv.Errorf(kv.CodeInvalidArgument, `no keys: give "keys": [{"collection": ..., "key": ...}, ...], at least one`)
	}
	refs := make([]kv.KeyRef, len(keys))
	n := 0
	for i, k := range keys {
		ref, err := k.toKeyRef()
		if err != nil {
			return nil, at(fmt.Sprintf("keys[%d]", i), err)
		}
		refs[i] = ref
		n += len(ref.Key)
	}
	return refs, checkRequestBytes(n)
}

// batchPutRequest is the body of a batch put.
type batchPutRequest struct {
	Items jsonList[PutItemJSON] `json:"items"`
}

// decodePutItems reads and validates the body of a batch put.
func (h *httpHandler) decodePutItems(w http.ResponseWriter, r *http.Request) ([]kv.PutItem, error) {
	req := batchPutRequest{Items: jsonList[PutItemJSON]{name: "items", fields: putItemFields, max: h.cfg.MaxBatchKeys}}
	if err := decodeJSON(w, r, h.cfg.MaxBodySize, &req, "items"); err != nil {
		return nil, err
	}
	if len(req.Items.elems) == 0 {
		return nil, kv.Errorf(kv.CodeInvalidArgument, `no items: give "items": [{"collection": ..., "key": ..., "value": ...}, ...], at least one`)
	}
	items := make([]kv.PutItem, len(req.Items.elems))
	n := 0
	for i, it := range req.Items.elems {
		item, err := h.toPutItem(it)
		if err != nil {
			return nil, at(fmt.Sprintf("items[%d]", i), err)
		}
		items[i] = item
		n += len(item.Key) + len(item.Value)
	}
	return items, checkRequestBytes(n)
}

// toPutItem validates it. A value must be given: an empty one as "".
func (h *httpHandler) toPutItem(it PutItemJSON) (kv.PutItem, error) {
	ref, err := KeyRefJSON{Collection: it.Collection, Key: it.Key, KeyBase64: it.KeyBase64}.toKeyRef()
	if err != nil {
		return kv.PutItem{}, err
	}
	value, given, err := BytesFromJSON("value", it.Value, it.ValueBase64)
	if err != nil {
		return kv.PutItem{}, err
	}
	if !given {
		return kv.PutItem{}, kv.Errorf(kv.CodeInvalidArgument, `no value: give value, or value_base64 for a value that is not UTF-8 ("" for an empty value)`)
	}
	if len(value) > h.cfg.MaxValueSize {
		return kv.PutItem{}, kv.Errorf(kv.CodeTooLarge, "value is %d bytes, the limit is %d", len(value), h.cfg.MaxValueSize)
	}
	if err := kv.ValidateTags(it.Tags); err != nil {
		return kv.PutItem{}, err
	}
	return kv.PutItem{Collection: ref.Collection, Key: ref.Key, Value: value, Tags: it.Tags, IfVersion: it.IfVersion}, nil
}

func (h *httpHandler) batchGet(w http.ResponseWriter, r *http.Request) error {
	keys, err := h.decodeKeys(w, r)
	if err != nil {
		return err
	}
	res, err := h.b.BatchGet(r.Context(), keys)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, ToBatchGetResponseJSON(res))
	return nil
}

func (h *httpHandler) batchPut(w http.ResponseWriter, r *http.Request) error {
	items, err := h.decodePutItems(w, r)
	if err != nil {
		return err
	}
	rs, err := h.b.BatchPut(r.Context(), items)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, BatchWriteResponseJSON{Items: ToWriteResultsJSON(rs)})
	return nil
}

func (h *httpHandler) batchDelete(w http.ResponseWriter, r *http.Request) error {
	keys, err := h.decodeKeys(w, r)
	if err != nil {
		return err
	}
	rs, err := h.b.BatchDelete(r.Context(), keys)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, BatchWriteResponseJSON{Items: ToWriteResultsJSON(rs)})
	return nil
}

// deleteRangeRequest is the body of a delete range. Start must be given,
// "" for the first key, so that a body that forgot it does not empty the
// collection; an absent or empty End is unbounded.
type deleteRangeRequest struct {
	Collection  string  `json:"collection"`
	Start       *string `json:"start"`
	StartBase64 *string `json:"start_base64"`
	End         *string `json:"end"`
	EndBase64   *string `json:"end_base64"`
}

const deleteRangeFields = "collection, start, start_base64, end, end_base64"

type deleteRangeResponse struct {
	Deleted int `json:"deleted"`
}

func (h *httpHandler) deleteRange(w http.ResponseWriter, r *http.Request) error {
	var req deleteRangeRequest
	if err := decodeJSON(w, r, h.cfg.MaxBodySize, &req, deleteRangeFields); err != nil {
		return err
	}
	if err := kv.ValidateCollectionName(req.Collection); err != nil {
		return err
	}
	start, given, err := BytesFromJSON("start", req.Start, req.StartBase64)
	if err != nil {
		return err
	}
	if !given {
		return kv.Errorf(kv.CodeInvalidArgument, `no start: give start ("" for the first key of the collection), or start_base64`)
	}
	end, _, err := BytesFromJSON("end", req.End, req.EndBase64)
	if err != nil {
		return err
	}
	if err := checkSpan(start, end); err != nil {
		return err
	}
	res, err := h.b.DeleteRange(r.Context(), kv.DeleteRangeRequest{Collection: req.Collection, Start: nonEmpty(start), End: nonEmpty(end)})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, deleteRangeResponse{Deleted: res.Deleted})
	return nil
}

// nonEmpty returns b, nil when empty: an unbounded end reaches the backend
// the same way from every form.
func nonEmpty(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return b
}

// checkSpan checks the bounds [start, end) of a range; an empty end is
// unbounded.
func checkSpan(start, end []byte) error {
	if err := checkBound("start", start); err != nil {
		return err
	}
	if err := checkBound("end", end); err != nil {
		return err
	}
	if len(end) > 0 && bytes.Compare(start, end) >= 0 {
		return kv.Errorf(kv.CodeInvalidArgument, "start %s is not below end %s: the range [start, end) is empty; an empty end is unbounded",
			quoteKey(start), quoteKey(end))
	}
	return nil
}

// checkBound checks a key bound or after_key, which may be empty.
func checkBound(name string, b []byte) error {
	if len(b) > kv.MaxKeySize {
		return kv.Errorf(kv.CodeTooLarge, "%s is %d bytes, the limit of a key is %d", name, len(b), kv.MaxKeySize)
	}
	return nil
}

// quoteKey quotes a key for a message, clipped.
func quoteKey(k []byte) string {
	return strconv.Quote(clip(string(k)))
}

// queryBytes returns query parameter name as bytes, nil when absent or
// empty.
func queryBytes(q url.Values, name string) []byte {
	return nonEmpty([]byte(q.Get(name)))
}

// parseLimit parses the page size, 0 (the backend's default) when absent.
func parseLimit(q url.Values) (int, error) {
	s, ok := q["limit"]
	if !ok {
		return 0, nil
	}
	n, err := strconv.Atoi(s[0])
	if err != nil || n < 1 {
		return 0, kv.Errorf(kv.CodeInvalidArgument, "query parameter limit=%q is not a page size: use 1 to %d; omit it for %d",
			clip(s[0]), kv.MaxPageSize, kv.DefaultPageSize)
	}
	if n > kv.MaxPageSize {
		return 0, kv.Errorf(kv.CodeInvalidArgument, "query parameter limit=%d is above the largest page, %d: use next_page for more",
			n, kv.MaxPageSize)
	}
	return n, nil
}

// parseBool parses query parameter name, false when absent.
func parseBool(q url.Values, name string) (bool, error) {
	s, ok := q[name]
	if !ok {
		return false, nil
	}
	switch s[0] {
	case "true", "1":
		return true, nil
	case "false", "0":
		return false, nil
	}
	return false, kv.Errorf(kv.CodeInvalidArgument, "query parameter %s=%q is not a boolean: use true, false, 1 or 0", name, clip(s[0]))
}

// scanResponse is a kv.ScanResult, the answer of a scan or a tag query.
type scanResponse struct {
	Items    []RecordJSON `json:"items"`
	NextPage string       `json:"next_page"`
	Version  uint64       `json:"version"`
}

func toScanResponse(res kv.ScanResult) scanResponse {
	resp := scanResponse{Items: make([]RecordJSON, len(res.Items)), NextPage: res.NextPage, Version: res.Version}
	for i, rec := range res.Items {
		resp.Items[i] = ToRecordJSON(rec)
	}
	return resp
}

// parsePaging parses the limit, page and version of a scan or tag query.
func parsePaging(q url.Values) (limit int, page string, version uint64, err error) {
	if limit, err = parseLimit(q); err != nil {
		return 0, "", 0, err
	}
	v, err := parseVersion(q, "version", true)
	if err != nil {
		return 0, "", 0, err
	}
	if v != nil {
		version = *v
	}
	return limit, q.Get("page"), version, nil
}

func (h *httpHandler) scan(w http.ResponseWriter, r *http.Request, coll string) error {
	q, err := parseQuery(r, "start", "end", "limit", "reverse", "page", "version")
	if err != nil {
		return err
	}
	req := kv.ScanRequest{Collection: coll, Start: queryBytes(q, "start"), End: queryBytes(q, "end")}
	if err := checkSpan(req.Start, req.End); err != nil {
		return err
	}
	if req.Reverse, err = parseBool(q, "reverse"); err != nil {
		return err
	}
	if req.Limit, req.Page, req.Version, err = parsePaging(q); err != nil {
		return err
	}
	res, err := h.b.Scan(r.Context(), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, toScanResponse(res))
	return nil
}

func (h *httpHandler) getByTags(w http.ResponseWriter, r *http.Request, coll string) error {
	q, err := parseQuery(r, "all", "any", "limit", "page", "version")
	if err != nil {
		return err
	}
	_, all := q["all"]
	_, anyOf := q["any"]
	if all == anyOf {
		return kv.Errorf(kv.CodeInvalidArgument, "give exactly one of all=a,b (records carrying every tag) and any=a,b (records carrying one of them)")
	}
	name := "any"
	if all {
		name = "all"
	}
	s := q.Get(name)
	if s == "" {
		return kv.Errorf(kv.CodeInvalidArgument, "query parameter %s= names no tag: give %s=a,b", name, name)
	}
	tags := strings.Split(s, ",")
	if err := kv.ValidateTags(tags); err != nil {
		return at(name, err)
	}
	query := kv.TagQuery{Collection: coll}
	if all {
		query.All = tags
	} else {
		query.Any = tags
	}
	if query.Limit, query.Page, query.Version, err = parsePaging(q); err != nil {
		return err
	}
	res, err := h.b.GetByTags(r.Context(), query)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, toScanResponse(res))
	return nil
}

// acceptsEventStream reports whether the Accept headers of r name
// text/event-stream (and do not refuse it with q=0).
func acceptsEventStream(r *http.Request) bool {
	for _, h := range r.Header.Values("Accept") {
		for _, part := range strings.Split(h, ",") {
			mt, params, err := mime.ParseMediaType(strings.TrimSpace(part))
			if err != nil || mt != eventStreamType {
				continue
			}
			if q, ok := params["q"]; ok {
				if f, err := strconv.ParseFloat(q, 64); err == nil && f == 0 {
					continue
				}
			}
			return true
		}
	}
	return false
}

// watch streams the events of Backend.Watch: newline-delimited JSON, or
// server-sent events ("data: <json>\n\n") when the client accepts
// text/event-stream, each flushed as it is written.
//
// The status is sent with the first event, so that an error Watch answers
// before it (collection_not_found, compacted, invalid_argument) is answered
// as usual with its status. After it, an error ends the stream: an SSE
// stream gets an "error" event holding the error body first, an NDJSON
// stream just ends (it has no way to tell it without a line of another
// shape). A watch ends normally when the client goes away (its request
// context ends, or a write fails); Watch's error then is not the client's
// answer and is not counted as a failure.
func (h *httpHandler) watch(w http.ResponseWriter, r *http.Request, coll string) error {
	q, err := parseQuery(r, "from_version", "start", "end", "after_key")
	if err != nil {
		return err
	}
	from, err := parseVersion(q, "from_version", false)
	if err != nil {
		return err
	}
	if from == nil {
		return kv.Errorf(kv.CodeInvalidArgument, "query parameter from_version is required: give the version to follow changes after, e.g. the version a scan or batch get answered")
	}
	req := kv.WatchRequest{Collection: coll, Start: queryBytes(q, "start"), End: queryBytes(q, "end"),
		FromVersion: *from, AfterKey: queryBytes(q, "after_key")}
	if err := checkSpan(req.Start, req.End); err != nil {
		return err
	}
	if err := checkBound("after_key", req.AfterKey); err != nil {
		return err
	}

	sse := acceptsEventStream(r)
	rc := http.NewResponseController(w)
	started := false
	start := func() {
		started = true
		hdr := w.Header()
		if sse {
			hdr.Set("Content-Type", eventStreamType)
		} else {
			hdr.Set("Content-Type", ndjsonType)
		}
		hdr.Set("Cache-Control", "no-cache")
		hdr.Set("X-Content-Type-Options", "nosniff")
		hdr.Set("X-Accel-Buffering", "no") // proxies that buffer (nginx): pass each event on
		// A server's WriteTimeout would cut every watch; the stream ends
		// when the client or the backend ends it.
		_ = rc.SetWriteDeadline(time.Time{})
		w.WriteHeader(http.StatusOK)
	}
	// frame writes one event, or an SSE event of type name, and flushes it.
	frame := func(name string, v any) error {
		body, err := json.Marshal(v)
		if err != nil {
			panic(fmt.Sprintf("api: marshaling %T: %v", v, err)) // our own types always marshal
		}
		var buf bytes.Buffer
		if sse {
			if name != "" {
				buf.WriteString("event: " + name + "\n")
			}
			buf.WriteString("data: ")
			buf.Write(body) // JSON holds no raw newline
			buf.WriteString("\n\n")
		} else {
			buf.Write(body)
			buf.WriteByte('\n')
		}
		if _, err := w.Write(buf.Bytes()); err != nil {
			return err
		}
		return rc.Flush()
	}

	// Watch calls fn one event at a time and not after it returns, so
	// started and writeErr need no lock.
	var writeErr error
	err = h.b.Watch(r.Context(), req, func(ev kv.Event) error {
		if !started {
			start()
		}
		if err := frame("", ToEventJSON(ev)); err != nil {
			writeErr = err
			return err
		}
		return nil
	})
	gone := writeErr != nil || r.Context().Err() != nil
	switch {
	case gone:
		return nil
	case !started && err != nil:
		return err
	case !started:
		start() // Watch ended with no error and no event: an empty stream
		return nil
	case err == nil:
		return nil
	}
	e := kv.AsError(err)
	if sse {
		_ = frame("error", errorResponse{Error: errorDetail{Code: e.Code, Message: e.Message}})
	}
	return &streamEnded{code: e.Code}
}
