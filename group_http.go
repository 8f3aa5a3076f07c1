package groupkv

import (
	"context"
	"net/http"
	"net/url"

	"github.com/groupkv/groupkv/internal/api"
	"github.com/groupkv/groupkv/internal/kv"
)

// The kv.GroupBackend of a remote DB: the Key Groups forms
// (internal/api/http_group.go) of the dialed node, over httpTxn's
// connections. A group attempt lives on the node that began it, like any
// attempt, and is operated on with httpTxn's transaction forms.

var _ kv.GroupBackend = (*httpTxn)(nil)

// groupPath is the path of group id, followed by suffix ("", "/txn" or
// "/exec"). The id is escaped as one path segment.
func groupPath(id, suffix string) string { return "/v1/groups/" + url.PathEscape(id) + suffix }

// CreateGroup may have created the group when its connection breaks
// after the request was sent: that error is commit_unknown.
func (h *httpTxn) CreateGroup(ctx context.Context, spec kv.GroupSpec) (kv.GroupCreated, error) {
	var resp api.GroupCreatedJSON
	if err := h.call(ctx, "/v1/groups", api.ToGroupCreateRequestJSON(spec), &resp, true); err != nil {
		return kv.GroupCreated{}, err
	}
	created, err := api.GroupCreatedFromJSON(resp)
	if err != nil {
		return kv.GroupCreated{}, kv.Errorf(kv.CodeInternal, "the answer of the creation of group %q is malformed: %v", spec.ID, err)
	}
	return created, nil
}

func (h *httpTxn) DescribeGroup(ctx context.Context, id string) (kv.GroupInfo, error) {
	if id == "" {
		return kv.GroupInfo{}, errNoGroupID()
	}
	var resp api.GroupInfoJSON
	if err := h.do(ctx, http.MethodGet, groupPath(id, ""), nil, &resp, false); err != nil {
		return kv.GroupInfo{}, err
	}
	info, err := api.GroupInfoFromJSON(resp)
	if err != nil {
		return kv.GroupInfo{}, kv.Errorf(kv.CodeInternal, "the description of group %q is malformed: %v", id, err)
	}
	return info, nil
}

func (h *httpTxn) ListGroups(ctx context.Context) ([]kv.GroupInfo, error) {
	var resp api.GroupListJSON
	if err := h.do(ctx, http.MethodGet, "/v1/groups", nil, &resp, false); err != nil {
		return nil, err
	}
	infos, err := api.GroupListFromJSON(resp)
	if err != nil {
		return nil, kv.Errorf(kv.CodeInternal, "the list of groups is malformed: %v", err)
	}
	return infos, nil
}

// DeleteGroup may have deleted the group when its connection breaks after
// the request was sent: that error is commit_unknown.
func (h *httpTxn) DeleteGroup(ctx context.Context, id string) error {
	if id == "" {
		return errNoGroupID()
	}
	return h.do(ctx, http.MethodDelete, groupPath(id, ""), nil, &struct{}{}, true)
}

func (h *httpTxn) BeginGroupTxn(ctx context.Context, id string, opts kv.TxnOptions) (string, error) {
	if id == "" {
		return "", errNoGroupID()
	}
	var resp api.TxnBeginResponseJSON
	req := api.TxnBeginRequestJSON{Isolation: opts.Isolation, RetryOf: opts.RetryOf, ReadOnly: opts.ReadOnly}
	if err := h.call(ctx, groupPath(id, "/txn"), req, &resp, false); err != nil {
		return "", err
	}
	if resp.Txn == "" {
		return "", kv.Errorf(kv.CodeInternal, "POST %s: the answer names no transaction", groupPath(id, "/txn"))
	}
	return resp.Txn, nil
}

func (h *httpTxn) ExecGroupTxn(ctx context.Context, id string, req kv.ExecRequest) (kv.ExecResult, error) {
	if id == "" {
		return kv.ExecResult{}, errNoGroupID()
	}
	var resp api.ExecResponseJSON
	if err := h.call(ctx, groupPath(id, "/exec"), api.ToExecRequestJSON(req), &resp, execWrites(req)); err != nil {
		return kv.ExecResult{}, err
	}
	res, err := api.ExecResultFromJSON(resp)
	if err != nil {
		return kv.ExecResult{}, kv.Errorf(kv.CodeInternal, "the answer of a one-shot transaction is malformed: %v", err)
	}
	return res, nil
}

// errNoGroupID is the error of a call that names no group: "" would make
// its path another form's.
func errNoGroupID() error {
	return kv.Errorf(kv.CodeInvalidArgument, "no group id: name the group")
}
