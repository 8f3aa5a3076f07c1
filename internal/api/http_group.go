package api

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/groupkv/groupkv/internal/kv"
)

// The Key Groups forms of the HTTP API (kv.GroupBackend); wire_group.go
// holds the shapes:
//
//	POST   /v1/groups             {"id", "leader": {"collection", "key"}, "members": [...], "mode"}
//	                              → {"id", "joined": [...], "refused": [{"collection", "key", "reason"}, ...]}
//	GET    /v1/groups             → {"groups": [...]}
//	GET    /v1/groups/{id}        → {"id", "leader", "members", "mode", "leader_node", "state", "shipper_lag"}
//	DELETE /v1/groups/{id}        → {}
//	POST   /v1/groups/{id}/txn    {"isolation", "retry_of", "read_only"} → {"txn": id}
//	POST   /v1/groups/{id}/exec   the body and answer of POST /v1/txn/exec
//
// The group id in a path is percent-decoded. An attempt begun by
// /v1/groups/{id}/txn is a transaction attempt like any other: its
// operations are the forms /v1/txn/{txn}/{get,batch_get,put,delete,commit,abort}
// (http_txn.go), sent to the node that began it. Errors are the backend's:
// group_refused (409) when an atomic group could not take every key,
// already_exists (409) for an id in use, not_found (404) for an unknown
// group, key_in_group (409) when a key belongs to another group. A backend
// that is not a kv.GroupBackend makes every form answer 501 unimplemented.

// groupsPath lists and creates groups; it is followed by /{id} for one
// group and /{id}/{txn,exec} for its transactions.
const groupsPath = "/v1/groups"

// Operation names of the Key Groups forms, the op label of Metrics.
const (
	opGroupCreate   = "group_create"
	opGroupList     = "group_list"
	opGroupDescribe = "group_describe"
	opGroupDelete   = "group_delete"
	opGroupTxnBegin = "group_txn_begin"
	opGroupTxnExec  = "group_txn_exec"
)

// groupForm answers one Key Groups form; id is the group named in the
// path, validated, "" for list and create.
type groupForm func(w http.ResponseWriter, r *http.Request, gb kv.GroupBackend, id string) error

// serveGroups answers groupsPath and below; p is the escaped path.
func (h *httpHandler) serveGroups(w http.ResponseWriter, r *http.Request, p string) (string, error) {
	var (
		op, allow string
		form      groupForm
		escID     string
	)
	method := r.Method
	if method == http.MethodHead {
		method = http.MethodGet
	}
	if p == groupsPath {
		allow = "GET, HEAD, POST"
		switch method {
		case http.MethodGet:
			op, form = opGroupList, h.groupList
		case http.MethodPost:
			op, form = opGroupCreate, h.groupCreate
		}
	} else {
		id, verb, hasVerb := strings.Cut(strings.TrimPrefix(p, groupsPath+"/"), "/")
		if id == "" || strings.Contains(verb, "/") {
			return opUnknown, groupPathError(r)
		}
		escID = id
		switch {
		case !hasVerb:
			allow = "GET, HEAD, DELETE"
			switch method {
			case http.MethodGet:
				op, form = opGroupDescribe, h.groupDescribe
			case http.MethodDelete:
				op, form = opGroupDelete, h.groupDelete
			}
		case verb == "txn":
			allow = "POST"
			if method == http.MethodPost {
				op, form = opGroupTxnBegin, h.groupTxnBegin
			}
		case verb == "exec":
			allow = "POST"
			if method == http.MethodPost {
				op, form = opGroupTxnExec, h.groupTxnExec
			}
		default:
			return opUnknown, groupPathError(r)
		}
	}
	if form == nil {
		return opUnknown, methodNotAllowed(r, allow)
	}
	gb, ok := h.b.(kv.GroupBackend)
	if !ok {
		return op, kv.Errorf(kv.CodeUnimplemented,
			"this server does not serve key groups: use transactions (/v1/txn) on the keys, or a server that does")
	}
	if _, err := parseQuery(r); err != nil {
		return op, err
	}
	var id string
	if escID != "" {
		var err error
		if id, err = url.PathUnescape(escID); err != nil {
			return op, kv.Errorf(kv.CodeInvalidArgument, "group id in the path is badly escaped: %v", err)
		}
		if err := ValidateGroupID(id); err != nil {
			return op, err
		}
	}
	return op, form(w, r, gb, id)
}

func groupPathError(r *http.Request) error {
	return kv.Errorf(kv.CodeNotFound,
		"unknown path %q: key groups are served at /v1/groups (list, create), /v1/groups/{id} (describe, delete) and /v1/groups/{id}/{txn,exec}",
		clip(r.URL.Path))
}

// groupCreateRequest is the body of POST /v1/groups as decoded: its
// members stop at their limit.
type groupCreateRequest struct {
	ID      string                 `json:"id"`
	Leader  *GroupKeyJSON          `json:"leader"`
	Members jsonList[GroupKeyJSON] `json:"members"`
	Mode    kv.GroupMode           `json:"mode"`
}

func (h *httpHandler) groupCreate(w http.ResponseWriter, r *http.Request, gb kv.GroupBackend, _ string) error {
	max := h.cfg.MaxBatchKeys
	body := groupCreateRequest{Members: jsonList[GroupKeyJSON]{name: "members", fields: groupKeyFields, max: max,
		limit: fmt.Sprintf("a group is created with at most %d members", max)}}
	if err := decodeJSON(w, r, h.cfg.MaxBodySize, &body, groupCreateFields); err != nil {
		return err
	}
	spec, err := GroupSpecFromJSON(GroupCreateRequestJSON{ID: body.ID, Leader: body.Leader, Members: body.Members.elems, Mode: body.Mode})
	if err != nil {
		return err
	}
	created, err := gb.CreateGroup(r.Context(), spec)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, ToGroupCreatedJSON(created))
	return nil
}

func (h *httpHandler) groupList(w http.ResponseWriter, r *http.Request, gb kv.GroupBackend, _ string) error {
	infos, err := gb.ListGroups(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, ToGroupListJSON(infos))
	return nil
}

func (h *httpHandler) groupDescribe(w http.ResponseWriter, r *http.Request, gb kv.GroupBackend, id string) error {
	info, err := gb.DescribeGroup(r.Context(), id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, ToGroupInfoJSON(info))
	return nil
}

// groupDelete answers once the group is gone: the backend returns when
// every key is owned by its shard again.
func (h *httpHandler) groupDelete(w http.ResponseWriter, r *http.Request, gb kv.GroupBackend, id string) error {
	if err := gb.DeleteGroup(r.Context(), id); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, emptyResponse{})
	return nil
}

// groupTxnBegin takes the body of POST /v1/txn. A group transaction is
// serializable: the group's leader validates it at commit.
func (h *httpHandler) groupTxnBegin(w http.ResponseWriter, r *http.Request, gb kv.GroupBackend, id string) error {
	opts, err := h.decodeTxnBegin(w, r)
	if err != nil {
		return err
	}
	if err := checkGroupIsolation(opts.Isolation); err != nil {
		return err
	}
	txn, err := gb.BeginGroupTxn(r.Context(), id, opts)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, TxnBeginResponseJSON{Txn: txn})
	return nil
}

func (h *httpHandler) groupTxnExec(w http.ResponseWriter, r *http.Request, gb kv.GroupBackend, id string) error {
	req, err := h.decodeExec(w, r)
	if err != nil {
		return err
	}
	res, err := gb.ExecGroupTxn(r.Context(), id, req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, ToExecResponseJSON(req, res))
	return nil
}
