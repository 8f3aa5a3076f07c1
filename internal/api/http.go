package api

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/groupkv/groupkv/internal/auth"
	"github.com/groupkv/groupkv/internal/kv"
)

// Headers of a record read with GET /v1/kv/{collection}/{key}.
const (
	// HeaderVersion carries the version of the record read, in decimal.
	HeaderVersion = "Groupkv-Version"
	// HeaderTags carries the tags of the record read, joined with commas; it
	// is present and empty when the record has no tags.
	HeaderTags = "Groupkv-Tags"
)

// DefaultMaxBodySize bounds JSON request bodies when HTTPConfig.MaxBodySize
// is zero: 16 MiB holds the largest valid collection options (1023 split
// points of 4 KiB: 4 MiB raw, under 6 MiB in base64) with room to spare, and
// still caps what one request can make the node buffer.
const DefaultMaxBodySize = 16 << 20

// HTTPConfig configures NewHTTPHandler. The zero value of every field means
// its default.
type HTTPConfig struct {
	// MaxValueSize bounds the value of a put, in bytes. A larger body is
	// answered 413 too_large after reading at most MaxValueSize+1 bytes of
	// it. Zero or negative means kv.DefaultMaxValueSize; set it to the node's
	// value limit (the backend enforces its own limit anyway).
	MaxValueSize int
	// MaxBodySize bounds JSON request bodies, in bytes. Zero or negative
	// means DefaultMaxBodySize.
	MaxBodySize int64
	// MaxBatchKeys bounds the keys or items of one batch request. A larger
	// batch is answered 413 too_large, its elements beyond the limit left
	// undecoded. Zero or negative means kv.DefaultMaxBatchKeys; set it to the
	// node's limit (the backend enforces its own limit anyway).
	MaxBatchKeys int
	// MaxTxnOps bounds the conditions, and the operations of each branch,
	// of one POST /v1/txn/exec. A larger list is answered 413 too_large.
	// Zero or negative means kv.DefaultMaxTxnOps; set it to the node's
	// limit (the backend enforces its own limit anyway).
	MaxTxnOps int
	// Metrics, when not nil, observes every request.
	Metrics *Metrics
	// Extra, when not nil, serves GET /metrics (a node passes promhttp's
	// handler for its registry). Without it /metrics answers 404.
	Extra http.Handler
	// Roles, when set, checks every request against its client's role
	// (package auth; the server's ConnContext names the client) before it
	// is served: 403 permission_denied otherwise.
	Roles *auth.Roles
}

// EnsureDefaults replaces zero or negative limits by their defaults.
func (c *HTTPConfig) EnsureDefaults() {
	if c.MaxValueSize <= 0 {
		c.MaxValueSize = kv.DefaultMaxValueSize
	}
	if c.MaxBodySize <= 0 {
		c.MaxBodySize = DefaultMaxBodySize
	}
	if c.MaxBatchKeys <= 0 {
		c.MaxBatchKeys = kv.DefaultMaxBatchKeys
	}
	if c.MaxTxnOps <= 0 {
		c.MaxTxnOps = kv.DefaultMaxTxnOps
	}
}

// Operation names, the op label of Metrics.
const (
	opPut                = "put"
	opGet                = "get"
	opDelete             = "delete"
	opCreateCollection   = "create_collection"
	opListCollections    = "list_collections"
	opDescribeCollection = "describe_collection"
	opDropCollection     = "drop_collection"
	opBatchGet           = "batch_get"
	opBatchPut           = "batch_put"
	opBatchDelete        = "batch_delete"
	opDeleteRange        = "delete_range"
	opScan               = "scan"
	opGetByTags          = "get_by_tags"
	opWatch              = "watch"
	opHealth             = "ready" // the gRPC Ready method's label too
	opCluster            = "cluster"
	opDecommission       = "decommission"
	opSplit              = "split"
	opMerge              = "merge"
	opMetrics            = "metrics"
	opConsistencyCheck   = "consistency_check"
	// opUnknown is a request that named no operation: an unknown path or a
	// method the path does not serve.
	opUnknown = "unknown"
	// opDenied is a request its client's role does not allow.
	opDenied = "denied"
)

// Paths the handler serves. kvPrefix is followed by {collection}/{key},
// collectionsPath optionally by /{name}.
const (
	kvPrefix        = "/v1/kv"
	collectionsPath = "/v1/collections"
	healthPath      = "/healthz"
	clusterPath     = "/v1/cluster"
	// clusterCheckPath runs replica consistency checks on demand.
	clusterCheckPath = "/v1/cluster/check"
	nodesPrefix      = "/v1/nodes"
	metricsPath      = "/metrics"
)

// NewHTTPHandler returns the HTTP/JSON face of b:
//
//	PUT    /v1/kv/{collection}/{key}[?tags=a,b][&if_version=N]  body: the value
//	GET    /v1/kv/{collection}/{key}[?version=N]                body: the value
//	DELETE /v1/kv/{collection}/{key}[?if_version=N]
//	POST   /v1/collections                                      body: JSON options
//	GET    /v1/collections
//	GET    /v1/collections/{name}
//	DELETE /v1/collections/{name}
//	POST   /v1/batch/get                                        JSON, see http_multi.go
//	POST   /v1/batch/put
//	POST   /v1/batch/delete
//	POST   /v1/delete_range
//	GET    /v1/scan/{collection}?start=&end=&limit=&reverse=&page=&version=
//	GET    /v1/tags/{collection}?all=a,b|any=a,b&limit=&page=&version=
//	GET    /v1/watch/{collection}?from_version=N&start=&end=&after_key=
//	POST   /v1/txn                                              JSON, see http_txn.go
//	POST   /v1/txn/{id}/{get,put,delete,scan,tags,commit,abort}
//	POST   /v1/txn/exec
//	POST   /v1/groups                                           JSON, see http_group.go
//	GET    /v1/groups
//	GET    /v1/groups/{id}
//	DELETE /v1/groups/{id}
//	POST   /v1/groups/{id}/{txn,exec}
//	GET    /v1/cluster
//	POST   /v1/cluster/check                                    JSON {"shards": [id, ...]}, optional
//	POST   /v1/nodes/{id}/decommission
//	POST   /v1/collections/{name}/{split,merge}
//	GET    /healthz
//	GET    /metrics                                             cfg.Extra
//
// The key is the percent-decoded rest of the path after the collection; it
// may contain '/', "..", empty segments and any byte. The handler does its
// own routing on the escaped path and never cleans or redirects it, so it
// must not be mounted behind an http.ServeMux pattern (ServeMux cleans
// paths). HEAD is served wherever GET is.
//
// Every error is answered as JSON {"error": {"code": ..., "message": ...}}
// with the status of the code (see kv.Code.HTTPStatus), except that a method
// a path does not serve is answered 405 with an Allow header and the code
// invalid_argument, and a backend that is not ready makes /healthz answer
// 503. The error of a batch write also lists the records it applied, and a
// watch that fails after its first event ends its stream instead.
func NewHTTPHandler(b kv.Backend, cfg HTTPConfig) http.Handler {
	cfg.EnsureDefaults()
	return &httpHandler{b: b, cfg: cfg}
}

type httpHandler struct {
	b   kv.Backend
	cfg HTTPConfig // defaults filled
}

// httpError is an error answered with a status other than its code's.
type httpError struct {
	err    *kv.Error
	status int    // the HTTP status; 0 means err.Code.HTTPStatus()
	allow  string // the Allow header of a 405, else ""
}

func (e *httpError) Error() string { return e.err.Error() }
func (e *httpError) Unwrap() error { return e.err }

func (h *httpHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	op, err := h.serve(w, r)
	var (
		code  kv.Code
		ended *streamEnded
	)
	switch {
	case err == nil:
	case errors.As(err, &ended):
		code = ended.code // the stream has told the client, if it could
	default:
		code = writeError(w, err)
	}
	h.cfg.Metrics.Observe(op, code, time.Since(start).Seconds())
}

// serve answers r and returns the operation it named. When it returns an
// error it has written nothing, and the caller answers the error.
func (h *httpHandler) serve(w http.ResponseWriter, r *http.Request) (op string, err error) {
	p := escapedPath(r.URL)
	if need, what := httpRole(r.Method, p); h.cfg.Roles != nil {
		if err := h.cfg.Roles.Check(r.Context(), need, what); err != nil {
			return opDenied, err
		}
	}
	switch {
	case p == healthPath:
		return opHealth, h.serveHealth(w, r)
	case p == clusterPath:
		return opCluster, h.serveCluster(w, r)
	case p == clusterCheckPath:
		return opConsistencyCheck, h.serveConsistencyCheck(w, r)
	case strings.HasPrefix(p, nodesPrefix+"/") && strings.HasSuffix(p, "/decommission"):
		return opDecommission, h.serveDecommission(w, r, strings.TrimSuffix(strings.TrimPrefix(p, nodesPrefix+"/"), "/decommission"))
	case p == metricsPath:
		if h.cfg.Extra == nil {
			return opMetrics, kv.Errorf(kv.CodeNotFound, "this node serves no metrics at %s", metricsPath)
		}
		h.cfg.Extra.ServeHTTP(w, r)
		return opMetrics, nil
	case p == kvPrefix || strings.HasPrefix(p, kvPrefix+"/"):
		return h.serveKV(w, r, strings.TrimPrefix(strings.TrimPrefix(p, kvPrefix), "/"))
	case p == collectionsPath:
		return h.serveCollections(w, r)
	case strings.HasPrefix(p, collectionsPath+"/") && strings.HasSuffix(p, "/split"):
		return opSplit, h.serveSplit(w, r, strings.TrimSuffix(strings.TrimPrefix(p, collectionsPath+"/"), "/split"))
	case strings.HasPrefix(p, collectionsPath+"/") && strings.HasSuffix(p, "/merge"):
		return opMerge, h.serveMerge(w, r, strings.TrimSuffix(strings.TrimPrefix(p, collectionsPath+"/"), "/merge"))
	case strings.HasPrefix(p, collectionsPath+"/"):
		return h.serveCollection(w, r, strings.TrimPrefix(p, collectionsPath+"/"))
	case p == batchGetPath:
		return h.servePost(w, r, opBatchGet, h.batchGet)
	case p == batchPutPath:
		return h.servePost(w, r, opBatchPut, h.batchPut)
	case p == batchDeletePath:
		return h.servePost(w, r, opBatchDelete, h.batchDelete)
	case p == deleteRangePath:
		return h.servePost(w, r, opDeleteRange, h.deleteRange)
	case under(p, scanPrefix):
		return h.serveInCollection(w, r, p, scanPrefix, opScan, h.scan)
	case under(p, tagsPrefix):
		return h.serveInCollection(w, r, p, tagsPrefix, opGetByTags, h.getByTags)
	case under(p, watchPrefix):
		return h.serveInCollection(w, r, p, watchPrefix, opWatch, h.watch)
	case under(p, txnPath):
		return h.serveTxn(w, r, p)
	case under(p, groupsPath):
		return h.serveGroups(w, r, p)
	}
	return opUnknown, kv.Errorf(kv.CodeNotFound,
		"unknown path %q: this server serves /v1/kv/{collection}/{key}, /v1/collections[/{name}], "+
			"/v1/batch/{get,put,delete}, /v1/delete_range, /v1/scan/{collection}, /v1/tags/{collection}, "+
			"/v1/watch/{collection}, /v1/txn[/...], /v1/groups[/...], /v1/cluster[/check], /healthz and /metrics",
		clip(p))
}

// escapedPath returns the path of u as the client sent it, percent escapes
// kept, so that an escaped '/' (%2F) stays distinct from a separator.
func escapedPath(u *url.URL) string {
	// RawPath is the path as sent when it differs from the default encoding
	// of Path. EscapedPath would drop it if it held bytes that Go would have
	// escaped itself; since it decodes to Path it is still the client's.
	if u.RawPath != "" {
		if p, err := url.PathUnescape(u.RawPath); err == nil && p == u.Path {
			return u.RawPath
		}
	}
	return u.EscapedPath()
}

func methodNotAllowed(r *http.Request, allow string) error {
	return &httpError{
		err:    kv.Errorf(kv.CodeInvalidArgument, "method %s is not allowed on %s: use %s", r.Method, clip(r.URL.Path), allow),
		status: http.StatusMethodNotAllowed,
		allow:  allow,
	}
}

// serveHealth answers GET /healthz.
func (h *httpHandler) serveHealth(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return methodNotAllowed(r, "GET, HEAD")
	}
	if err := h.b.Ready(); err != nil {
		e := kv.AsError(err)
		if e.Code.HTTPStatus() != http.StatusServiceUnavailable {
			e = kv.Errorf(kv.CodeUnavailable, "node is not ready: %s", e.Message)
		}
		return &httpError{err: e, status: http.StatusServiceUnavailable}
	}
	body := map[string]string{"status": "ok"}
	if wr, ok := h.b.(WritesRefuser); ok {
		if err := wr.WritesRefused(); err != nil {
			body["writes_refused"] = kv.AsError(err).Message
		}
	}
	writeJSON(w, http.StatusOK, body)
	return nil
}

// WritesRefuser is a backend that may refuse the writes that add data
// while it serves reads (a node whose disk is low): WritesRefused says
// why, or is nil.
type WritesRefuser interface {
	WritesRefused() error
}

// ClusterStatuser is a backend that can describe its cluster.
type ClusterStatuser interface {
	ClusterStatus(ctx context.Context) (kv.ClusterStatus, error)
}

// serveCluster answers GET /v1/cluster.
func (h *httpHandler) serveCluster(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return methodNotAllowed(r, "GET")
	}
	cs, ok := h.b.(ClusterStatuser)
	if !ok {
		return kv.Errorf(kv.CodeNotFound, "this server is not a cluster node")
	}
	st, err := cs.ClusterStatus(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, st)
	return nil
}

type consistencyCheckRequest struct {
	Shards []uint64 `json:"shards"`
}

type consistencyCheckResponse struct {
	// OK: every check found its replicas' sums equal and every replica
	// answered.
	OK     bool                  `json:"ok"`
	Checks []kv.ConsistencyCheck `json:"checks"`
}

// serveConsistencyCheck answers POST /v1/cluster/check: {"shards": [ids]}
// checks those shards, an empty body or no shards every shard. The answer
// is 200 whatever the outcomes, {"ok": ..., "checks": [...]}, one per shard.
func (h *httpHandler) serveConsistencyCheck(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodPost {
		return methodNotAllowed(r, "POST")
	}
	var req consistencyCheckRequest
	if r.ContentLength != 0 {
		if err := decodeJSON(w, r, h.cfg.MaxBodySize, &req, "shards"); err != nil {
			return err
		}
	}
	for _, id := range req.Shards {
		if id == 0 {
			return kv.Errorf(kv.CodeInvalidArgument, "shard ids are positive integers; 0 names no shard")
		}
	}
	c, ok := h.b.(kv.ConsistencyChecker)
	if !ok {
		return kv.Errorf(kv.CodeNotFound, "this server is not a cluster node")
	}
	checks, err := c.CheckConsistency(r.Context(), req.Shards)
	if err != nil {
		return err
	}
	resp := consistencyCheckResponse{OK: true, Checks: checks}
	for _, c := range checks {
		if c.Status != kv.ConsistencyOK {
			resp.OK = false
		}
	}
	writeJSON(w, http.StatusOK, resp)
	return nil
}

// Splitter is a backend that can split shards.
type Splitter interface {
	SplitShard(ctx context.Context, collection string, key []byte, shard uint64) (kv.CollectionInfo, error)
}

type splitRequest struct {
	Key   *string `json:"key"`
	Shard uint64  `json:"shard"`
}

// serveSplit answers POST /v1/collections/{name}/split.
func (h *httpHandler) serveSplit(w http.ResponseWriter, r *http.Request, escName string) error {
	if r.Method != http.MethodPost {
		return methodNotAllowed(r, "POST")
	}
	name, err := url.PathUnescape(escName)
	if err != nil {
		return kv.Errorf(kv.CodeInvalidArgument, "collection name %q is not a valid path segment", clip(escName))
	}
	var req splitRequest
	if err := decodeJSON(w, r, h.cfg.MaxBodySize, &req, "key, shard"); err != nil {
		return err
	}
	var key []byte
	switch {
	case req.Key != nil && req.Shard != 0:
		return kv.Errorf(kv.CodeInvalidArgument, "give key (range collections) or shard (hash and tag collections), not both")
	case req.Key != nil:
		key = []byte(*req.Key)
	case req.Shard == 0:
		return kv.Errorf(kv.CodeInvalidArgument, "give the key to split a range collection at, or the shard of a hash or tag collection to split in two")
	}
	s, ok := h.b.(Splitter)
	if !ok {
		return kv.Errorf(kv.CodeNotFound, "this server cannot split shards")
	}
	info, err := s.SplitShard(r.Context(), name, key, req.Shard)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, toCollectionJSON(info))
	return nil
}

// Merger is a backend that can merge shards.
type Merger interface {
	MergeShards(ctx context.Context, collection string, shard uint64) (kv.CollectionInfo, error)
}

type mergeRequest struct {
	Shard *uint64 `json:"shard"`
}

// serveMerge answers POST /v1/collections/{name}/merge: {"shard": id}
// merges shard id with its right neighbour.
func (h *httpHandler) serveMerge(w http.ResponseWriter, r *http.Request, escName string) error {
	if r.Method != http.MethodPost {
		return methodNotAllowed(r, "POST")
	}
	name, err := url.PathUnescape(escName)
	if err != nil {
		return kv.Errorf(kv.CodeInvalidArgument, "collection name %q is not a valid path segment", clip(escName))
	}
	var req mergeRequest
	if err := decodeJSON(w, r, h.cfg.MaxBodySize, &req, "shard"); err != nil {
		return err
	}
	if req.Shard == nil || *req.Shard == 0 {
		return kv.Errorf(kv.CodeInvalidArgument, "give the shard to merge with its right neighbour: {\"shard\": id}")
	}
	m, ok := h.b.(Merger)
	if !ok {
		return kv.Errorf(kv.CodeNotFound, "this server cannot merge shards")
	}
	info, err := m.MergeShards(r.Context(), name, *req.Shard)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, toCollectionJSON(info))
	return nil
}

// Decommissioner is a backend that can drain a node.
type Decommissioner interface {
	Decommission(ctx context.Context, id uint64, draining bool) error
}

type decommissionRequest struct {
	// Draining false takes a decommission back; absent means true.
	Draining *bool `json:"draining"`
}

// serveDecommission answers POST /v1/nodes/{id}/decommission.
func (h *httpHandler) serveDecommission(w http.ResponseWriter, r *http.Request, idText string) error {
	if r.Method != http.MethodPost {
		return methodNotAllowed(r, "POST")
	}
	id, err := strconv.ParseUint(idText, 10, 64)
	if err != nil || id == 0 {
		return kv.Errorf(kv.CodeInvalidArgument, "node id %q is not a positive integer", clip(idText))
	}
	var req decommissionRequest
	if r.ContentLength != 0 {
		if err := decodeJSON(w, r, h.cfg.MaxBodySize, &req, "draining"); err != nil {
			return err
		}
	}
	draining := req.Draining == nil || *req.Draining
	d, ok := h.b.(Decommissioner)
	if !ok {
		return kv.Errorf(kv.CodeNotFound, "this server is not a cluster node")
	}
	if err := d.Decommission(r.Context(), id, draining); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "draining": draining})
	return nil
}

// serveKV answers /v1/kv/{collection}/{key}; rest is the escaped path after
// "/v1/kv/".
func (h *httpHandler) serveKV(w http.ResponseWriter, r *http.Request, rest string) (string, error) {
	const allow = "GET, HEAD, PUT, DELETE"
	var op string
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		op = opGet
	case http.MethodPut:
		op = opPut
	case http.MethodDelete:
		op = opDelete
	default:
		return opUnknown, methodNotAllowed(r, allow)
	}
	coll, key, err := parseKVPath(rest)
	if err != nil {
		return op, err
	}
	switch op {
	case opGet:
		return op, h.get(w, r, coll, key)
	case opPut:
		return op, h.put(w, r, coll, key)
	default:
		return op, h.delete(w, r, coll, key)
	}
}

// parseKVPath splits "{collection}/{key}", both percent-escaped, and
// validates them.
func parseKVPath(rest string) (coll string, key []byte, err error) {
	escColl, escKey, _ := strings.Cut(rest, "/")
	if escColl == "" {
		return "", nil, kv.Errorf(kv.CodeInvalidArgument, "the path names no collection: use /v1/kv/{collection}/{key}")
	}
	coll, err = url.PathUnescape(escColl)
	if err != nil {
		return "", nil, kv.Errorf(kv.CodeInvalidArgument, "collection in the path is badly escaped: %v", err)
	}
	if err := kv.ValidateCollectionName(coll); err != nil {
		return "", nil, err
	}
	if escKey == "" {
		return "", nil, kv.Errorf(kv.CodeInvalidArgument, "the path names no key: use /v1/kv/{collection}/{key}")
	}
	k, err := url.PathUnescape(escKey)
	if err != nil {
		return "", nil, kv.Errorf(kv.CodeInvalidArgument, "key in the path is badly escaped: %v", err)
	}
	key = []byte(k)
	if err := kv.ValidateKey(key); err != nil {
		return "", nil, err
	}
	return coll, key, nil
}

func (h *httpHandler) put(w http.ResponseWriter, r *http.Request, coll string, key []byte) error {
	q, err := parseQuery(r, "tags", "if_version")
	if err != nil {
		return err
	}
	var tags []string
	if t := q.Get("tags"); t != "" {
		tags = strings.Split(t, ",")
	}
	if err := kv.ValidateTags(tags); err != nil {
		return err
	}
	ifVersion, err := parseVersion(q, "if_version", false)
	if err != nil {
		return err
	}
	value, err := readValue(r, h.cfg.MaxValueSize)
	if err != nil {
		return err
	}
	v, err := h.b.Put(r.Context(), kv.PutRequest{Collection: coll, Key: key, Value: value, Tags: tags, IfVersion: ifVersion})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, versionResponse{Version: v})
	return nil
}

func (h *httpHandler) get(w http.ResponseWriter, r *http.Request, coll string, key []byte) error {
	q, err := parseQuery(r, "version")
	if err != nil {
		return err
	}
	version, err := parseVersion(q, "version", true)
	if err != nil {
		return err
	}
	req := kv.GetRequest{Collection: coll, Key: key}
	if version != nil {
		req.Version = *version
	}
	rec, err := h.b.Get(r.Context(), req)
	if err != nil {
		return err
	}
	hdr := w.Header()
	hdr.Set("Content-Type", "application/octet-stream")
	hdr.Set("Content-Length", strconv.Itoa(len(rec.Value)))
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set(HeaderVersion, strconv.FormatUint(rec.Version, 10))
	hdr.Set(HeaderTags, strings.Join(rec.Tags, ","))
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = w.Write(rec.Value) // a client that went away is not an error of ours
	}
	return nil
}

func (h *httpHandler) delete(w http.ResponseWriter, r *http.Request, coll string, key []byte) error {
	q, err := parseQuery(r, "if_version")
	if err != nil {
		return err
	}
	ifVersion, err := parseVersion(q, "if_version", false)
	if err != nil {
		return err
	}
	v, err := h.b.Delete(r.Context(), kv.DeleteRequest{Collection: coll, Key: key, IfVersion: ifVersion})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, versionResponse{Version: v})
	return nil
}

// versionResponse answers a put or a delete.
type versionResponse struct {
	Version uint64 `json:"version"`
}

// parseQuery parses the query string of r, which may hold each of allowed
// at most once and nothing else: a misspelt if_version must not turn a
// conditional put into an unconditional one.
func parseQuery(r *http.Request, allowed ...string) (url.Values, error) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, kv.Errorf(kv.CodeInvalidArgument, "query string is malformed: %v", err)
	}
	for name, vals := range q {
		known := false
		for _, a := range allowed {
			known = known || a == name
		}
		if !known {
			accepted := "no query parameters"
			if len(allowed) > 0 {
				accepted = "only " + strings.Join(allowed, ", ")
			}
			return nil, kv.Errorf(kv.CodeInvalidArgument, "unknown query parameter %q: %s %s accepts %s",
				clip(name), r.Method, clip(r.URL.Path), accepted)
		}
		if len(vals) > 1 {
			return nil, kv.Errorf(kv.CodeInvalidArgument, "query parameter %q is given %d times; give it once", name, len(vals))
		}
	}
	return q, nil
}

// parseVersion parses query parameter name as a version, nil when absent.
// A version to read as of must be positive: 0 would mean the latest, which
// is what omitting the parameter says.
func parseVersion(q url.Values, name string, positive bool) (*uint64, error) {
	s, ok := q[name]
	if !ok {
		return nil, nil
	}
	v, err := strconv.ParseUint(s[0], 10, 64)
	if err != nil || (positive && v == 0) {
		want := "a non-negative decimal integer (0: only if the key is absent)"
		if positive {
			want = "a positive decimal integer; omit it to read the latest version"
		}
		return nil, kv.Errorf(kv.CodeInvalidArgument, "query parameter %s=%q is not a version: use %s", name, clip(s[0]), want)
	}
	return &v, nil
}

// readValue reads the body of r as a value of at most max bytes, reading no
// more than max+1 bytes of it.
func readValue(r *http.Request, max int) ([]byte, error) {
	if r.ContentLength > int64(max) {
		return nil, kv.Errorf(kv.CodeTooLarge, "value is %d bytes, the limit is %d", r.ContentLength, max)
	}
	size := 512
	if r.ContentLength >= 0 {
		size = int(r.ContentLength) + 1 // +1: seeing EOF needs no second buffer
	}
	buf := make([]byte, 0, size)
	lr := io.LimitReader(r.Body, int64(max)+1)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := lr.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, kv.Errorf(kv.CodeInvalidArgument, "reading the request body: %v", err)
		}
	}
	if len(buf) > max {
		return nil, kv.Errorf(kv.CodeTooLarge, "value is more than %d bytes, the limit", max)
	}
	return buf, nil
}

// serveCollections answers /v1/collections.
func (h *httpHandler) serveCollections(w http.ResponseWriter, r *http.Request) (string, error) {
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		if _, err := parseQuery(r); err != nil {
			return opListCollections, err
		}
		infos, err := h.b.ListCollections(r.Context())
		if err != nil {
			return opListCollections, err
		}
		resp := listCollectionsResponse{Collections: make([]collectionJSON, 0, len(infos))}
		for _, info := range infos {
			resp.Collections = append(resp.Collections, toCollectionJSON(info))
		}
		writeJSON(w, http.StatusOK, resp)
		return opListCollections, nil
	case http.MethodPost:
		return opCreateCollection, h.createCollection(w, r)
	default:
		return opUnknown, methodNotAllowed(r, "GET, HEAD, POST")
	}
}

func (h *httpHandler) createCollection(w http.ResponseWriter, r *http.Request) error {
	if _, err := parseQuery(r); err != nil {
		return err
	}
	var req createCollectionRequest
	if err := decodeJSON(w, r, h.cfg.MaxBodySize, &req, createCollectionFields); err != nil {
		return err
	}
	opts := kv.CollectionOptions{Name: req.Name, Partitioning: req.Partitioning, Shards: req.Shards, Replicas: req.Replicas}
	switch {
	case req.SplitPoints != nil && req.SplitPointsBase64 != nil:
		return kv.Errorf(kv.CodeInvalidArgument, "give split_points or split_points_base64, not both")
	case req.SplitPoints != nil:
		opts.SplitPoints = make([][]byte, len(req.SplitPoints))
		for i, p := range req.SplitPoints {
			opts.SplitPoints[i] = []byte(p)
		}
	case req.SplitPointsBase64 != nil:
		opts.SplitPoints = make([][]byte, len(req.SplitPointsBase64))
		for i, p := range req.SplitPointsBase64 {
			b, err := base64.StdEncoding.DecodeString(p)
			if err != nil {
				return kv.Errorf(kv.CodeInvalidArgument, "split_points_base64[%d] is not standard base64: %v", i, err)
			}
			opts.SplitPoints[i] = b
		}
	}
	check := opts // validated on a copy: the backend fills its own defaults
	if err := kv.ValidateCollectionOptions(&check); err != nil {
		return err
	}
	info, err := h.b.CreateCollection(r.Context(), opts)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, toCollectionJSON(info))
	return nil
}

// serveCollection answers /v1/collections/{name}; rest is the escaped path
// after "/v1/collections/".
func (h *httpHandler) serveCollection(w http.ResponseWriter, r *http.Request, rest string) (string, error) {
	if strings.Contains(rest, "/") {
		return opUnknown, kv.Errorf(kv.CodeNotFound, "unknown path %q: use /v1/collections/{name}", clip(r.URL.Path))
	}
	var op string
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		op = opDescribeCollection
	case http.MethodDelete:
		op = opDropCollection
	default:
		return opUnknown, methodNotAllowed(r, "GET, HEAD, DELETE")
	}
	name, err := url.PathUnescape(rest)
	if err != nil {
		return op, kv.Errorf(kv.CodeInvalidArgument, "collection in the path is badly escaped: %v", err)
	}
	if err := kv.ValidateCollectionName(name); err != nil {
		return op, err
	}
	if _, err := parseQuery(r); err != nil {
		return op, err
	}
	if op == opDropCollection {
		if err := h.b.DropCollection(r.Context(), name); err != nil {
			return op, err
		}
		writeJSON(w, http.StatusOK, struct{}{})
		return op, nil
	}
	info, err := h.b.DescribeCollection(r.Context(), name)
	if err != nil {
		return op, err
	}
	writeJSON(w, http.StatusOK, toCollectionJSON(info))
	return op, nil
}

// createCollectionRequest is the body of POST /v1/collections.
type createCollectionRequest struct {
	Name         string          `json:"name"`
	Partitioning kv.Partitioning `json:"partitioning"`
	Shards       int             `json:"shards"`
	Replicas     int             `json:"replicas"`
	// SplitPoints are keys as JSON strings; SplitPointsBase64 the same in
	// standard base64, for keys that are not UTF-8. At most one is given.
	SplitPoints       []string `json:"split_points"`
	SplitPointsBase64 []string `json:"split_points_base64"`
}

const createCollectionFields = "name, partitioning, shards, replicas, split_points, split_points_base64"

type listCollectionsResponse struct {
	Collections []collectionJSON `json:"collections"`
}

// collectionJSON is kv.CollectionInfo on the wire: keys are JSON strings,
// which are readable but cannot carry bytes that are not UTF-8. Where a key
// is not valid UTF-8 its string is lossy and a _base64 twin carries it
// exactly; the twin is absent otherwise.
type collectionJSON struct {
	Name         string          `json:"name"`
	ID           uint32          `json:"id"`
	Partitioning kv.Partitioning `json:"partitioning"`
	SplitPoints  []string        `json:"split_points,omitempty"`
	// SplitPointsBase64 is all of SplitPoints in base64, present only when
	// one of them is not valid UTF-8.
	SplitPointsBase64 []string    `json:"split_points_base64,omitempty"`
	Shards            []shardJSON `json:"shards"`
}

// shardJSON is kv.ShardInfo on the wire. A shard of a range collection has
// start and end (an empty end is unbounded), one of a hash or tag collection
// bucket_start and bucket_end; the fields of the other kind are absent.
type shardJSON struct {
	ID          uint64  `json:"id"`
	BucketStart *uint32 `json:"bucket_start,omitempty"`
	BucketEnd   *uint32 `json:"bucket_end,omitempty"`
	Start       *string `json:"start,omitempty"`
	End         *string `json:"end,omitempty"`
	StartBase64 *string `json:"start_base64,omitempty"`
	EndBase64   *string `json:"end_base64,omitempty"`
	Leader      uint64  `json:"leader"`
}

func toCollectionJSON(info kv.CollectionInfo) collectionJSON {
	c := collectionJSON{
		Name:         info.Name,
		ID:           info.ID,
		Partitioning: info.Partitioning,
		Shards:       make([]shardJSON, 0, len(info.Shards)),
	}
	lossy := false
	for _, p := range info.SplitPoints {
		c.SplitPoints = append(c.SplitPoints, string(p))
		lossy = lossy || !utf8.Valid(p)
	}
	if lossy {
		for _, p := range info.SplitPoints {
			c.SplitPointsBase64 = append(c.SplitPointsBase64, base64.StdEncoding.EncodeToString(p))
		}
	}
	for _, s := range info.Shards {
		sj := shardJSON{ID: s.ID, Leader: s.Leader}
		if info.Partitioning == kv.PartitionRange {
			sj.Start, sj.StartBase64 = keyJSON(s.Start)
			sj.End, sj.EndBase64 = keyJSON(s.End)
		} else {
			start, end := s.BucketStart, s.BucketEnd
			sj.BucketStart, sj.BucketEnd = &start, &end
		}
		c.Shards = append(c.Shards, sj)
	}
	return c
}

// keyJSON returns k as a string, and in base64 when the string is lossy.
func keyJSON(k []byte) (s, b64 *string) {
	str := string(k)
	if !utf8.Valid(k) {
		enc := base64.StdEncoding.EncodeToString(k)
		return &str, &enc
	}
	return &str, nil
}

// decodeJSON decodes the body of r, at most max bytes holding exactly one
// JSON value with no unknown fields, into v; fields lists the known ones for
// the error message.
func decodeJSON(w http.ResponseWriter, r *http.Request, max int64, v any, fields string) error {
	if r.ContentLength > max {
		return kv.Errorf(kv.CodeTooLarge, "request body is %d bytes, the limit for JSON bodies is %d", r.ContentLength, max)
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, max))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var e *kv.Error // from a field's UnmarshalJSON (jsonList), already said
		if errors.As(err, &e) {
			return e
		}
		return jsonError(err, max, "request body", fields)
	}
	if _, err := dec.Token(); err != io.EOF {
		if err == nil {
			return kv.Errorf(kv.CodeInvalidArgument, "request body holds more than one JSON value: send one object")
		}
		return jsonError(err, max, "request body", fields)
	}
	return nil
}

// jsonError turns an error of decoding a JSON value, subject (the request
// body or an element of it, as "keys[3]"), into a message that says what
// was wrong; fields lists the fields subject may have.
func jsonError(err error, max int64, subject, fields string) error {
	var (
		tooLarge  *http.MaxBytesError
		syntaxErr *json.SyntaxError
		typeErr   *json.UnmarshalTypeError
	)
	switch {
	case errors.As(err, &tooLarge):
		return kv.Errorf(kv.CodeTooLarge, "request body is more than %d bytes, the limit for JSON bodies", max)
	case err == io.EOF:
		return kv.Errorf(kv.CodeInvalidArgument, "%s is empty: send a JSON object", subject)
	case err == io.ErrUnexpectedEOF:
		return kv.Errorf(kv.CodeInvalidArgument, "%s ends in the middle of its JSON value", subject)
	case errors.As(err, &syntaxErr):
		return kv.Errorf(kv.CodeInvalidArgument, "%s is not valid JSON at byte %d: %s", subject, syntaxErr.Offset, strings.TrimPrefix(syntaxErr.Error(), "json: "))
	case errors.As(err, &typeErr):
		if typeErr.Field == "" {
			return kv.Errorf(kv.CodeInvalidArgument, "%s must be a JSON object, not %s", subject, typeErr.Value)
		}
		where := subject
		if where == "request body" {
			where = "the request body"
		}
		return kv.Errorf(kv.CodeInvalidArgument, "field %q of %s must be %s, not %s", typeErr.Field, where, jsonKind(typeErr), typeErr.Value)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		// encoding/json has no error type for this; the message is its API.
		return kv.Errorf(kv.CodeInvalidArgument, "%s has %s: the fields are %s",
			subject, strings.TrimPrefix(err.Error(), "json: "), fields)
	default:
		return kv.Errorf(kv.CodeInvalidArgument, "%s cannot be read: %v", subject, err)
	}
}

// jsonKind names the JSON kind a Go type decodes from.
func jsonKind(e *json.UnmarshalTypeError) string {
	switch e.Type.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	case reflect.Slice, reflect.Array:
		return "an array"
	default:
		return "an object"
	}
}

// errorResponse is the body of every error answer.
type errorResponse struct {
	Error errorDetail `json:"error"`
	// Applied is present, [] when empty, in the answers of failed batch
	// writes only: the records the batch wrote nonetheless.
	Applied *[]WriteResultJSON `json:"applied,omitempty"`
}

type errorDetail struct {
	Code    kv.Code `json:"code"`
	Message string  `json:"message"`
}

// writeError answers err and returns its code.
func writeError(w http.ResponseWriter, err error) kv.Code {
	var (
		e      *kv.Error
		status int
		he     *httpError
	)
	if errors.As(err, &he) {
		e, status = he.err, he.status
		if he.allow != "" {
			w.Header().Set("Allow", he.allow)
		}
	} else {
		e = kv.AsError(err)
	}
	if status == 0 {
		status = e.Code.HTTPStatus()
	}
	resp := errorResponse{Error: errorDetail{Code: e.Code, Message: e.Message}}
	var bw *batchWriteError
	if errors.As(err, &bw) {
		applied := ToWriteResultsJSON(bw.applied)
		resp.Applied = &applied
	}
	writeJSON(w, status, resp)
	return e.Code
}

// writeJSON answers v as JSON with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		// Only our own response types reach here; they always marshal.
		panic(fmt.Sprintf("api: marshaling %T: %v", v, err))
	}
	body = append(body, '\n')
	hdr := w.Header()
	hdr.Set("Content-Type", "application/json")
	hdr.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// clip shortens s for an error message: a path may hold a 4 KiB key.
func clip(s string) string {
	const max = 200
	if len(s) <= max {
		return s
	}
	return s[:max] + "..."
}
