package api

import (
	"net/http"
	"testing"

	"github.com/groupkv/groupkv/internal/auth"
	pb "github.com/groupkv/groupkv/proto/groupkvpb"
)

// TestGRPCRolesCoverEveryMethod: every method of the service has a role
// of its own, so that a method added later is a decision, not a default.
func TestGRPCRolesCoverEveryMethod(t *testing.T) {
	names := map[string]bool{}
	for _, m := range pb.GroupKV_ServiceDesc.Methods {
		names[m.MethodName] = true
	}
	for _, s := range pb.GroupKV_ServiceDesc.Streams {
		names[s.StreamName] = true
	}
	for name := range names {
		if _, ok := grpcRoles[name]; !ok {
			t.Errorf("method %s has no role in grpcRoles", name)
		}
	}
	for name := range grpcRoles {
		if !names[name] {
			t.Errorf("grpcRoles names %s, which the service does not have", name)
		}
	}
	if got := grpcRole("/other.Service/Get", nil); got != auth.Admin {
		t.Errorf("a method of another service: %s, want admin", got)
	}
	if got := grpcRole(pb.GroupKV_CommitTxn_FullMethodName, &pb.CommitTxnRequest{}); got != auth.Read {
		t.Errorf("a commit without writes: %s, want read", got)
	}
	if got := grpcRole(pb.GroupKV_CommitTxn_FullMethodName, &pb.CommitTxnRequest{Writes: []*pb.TxnOp{{Op: "put"}}}); got != auth.Write {
		t.Errorf("a commit with writes: %s, want write", got)
	}
	if got := grpcRole(pb.GroupKV_TxnGet_FullMethodName, &pb.TxnGetRequest{ForUpdate: true}); got != auth.Write {
		t.Errorf("a read for update: %s, want write", got)
	}
	for _, c := range []struct {
		req  *pb.PipelineRequest
		want auth.Role
	}{
		{&pb.PipelineRequest{Op: &pb.PipelineRequest_Get{Get: &pb.GetRequest{}}}, auth.Read},
		{&pb.PipelineRequest{Op: &pb.PipelineRequest_Scan{Scan: &pb.ScanRequest{}}}, auth.Read},
		{&pb.PipelineRequest{Op: &pb.PipelineRequest_Put{Put: &pb.PutRequest{}}}, auth.Write},
		{&pb.PipelineRequest{Op: &pb.PipelineRequest_Delete{Delete: &pb.DeleteRequest{}}}, auth.Write},
		{&pb.PipelineRequest{Op: &pb.PipelineRequest_CommitTxn{CommitTxn: &pb.CommitTxnRequest{}}}, auth.Read},
		{&pb.PipelineRequest{Op: &pb.PipelineRequest_CommitTxn{CommitTxn: &pb.CommitTxnRequest{Writes: []*pb.TxnOp{{Op: "delete"}}}}}, auth.Write},
		{&pb.PipelineRequest{Op: &pb.PipelineRequest_TxnGet{TxnGet: &pb.TxnGetRequest{}}}, auth.Read},
		{&pb.PipelineRequest{Op: &pb.PipelineRequest_TxnGet{TxnGet: &pb.TxnGetRequest{ForUpdate: true}}}, auth.Write},
	} {
		if got := pipelinedRole(c.req); got != c.want {
			t.Errorf("pipelined %v: %s, want %s", c.req, got, c.want)
		}
	}
}

func TestHTTPRoles(t *testing.T) {
	for _, c := range []struct {
		method, path string
		want         auth.Role
	}{
		{http.MethodGet, "/healthz", auth.None},
		{http.MethodGet, "/metrics", auth.None},
		{http.MethodGet, "/v1/cluster", auth.Read},
		{http.MethodPost, "/v1/cluster/check", auth.Admin},
		{http.MethodPost, "/v1/nodes/3/decommission", auth.Admin},
		{http.MethodGet, "/v1/kv/c/k", auth.Read},
		{http.MethodHead, "/v1/kv/c/k", auth.Read},
		{http.MethodPut, "/v1/kv/c/k", auth.Write},
		{http.MethodDelete, "/v1/kv/c/k", auth.Write},
		{http.MethodGet, "/v1/collections", auth.Read},
		{http.MethodGet, "/v1/collections/c", auth.Read},
		{http.MethodPost, "/v1/collections", auth.Admin},
		{http.MethodDelete, "/v1/collections/c", auth.Admin},
		{http.MethodPost, "/v1/collections/c/split", auth.Admin},
		{http.MethodGet, "/v1/collections/c/split", auth.Admin},
		{http.MethodPost, "/v1/collections/c/merge", auth.Admin},
		{http.MethodPost, "/v1/batch/get", auth.Read},
		{http.MethodPost, "/v1/batch/put", auth.Write},
		{http.MethodPost, "/v1/batch/delete", auth.Write},
		{http.MethodPost, "/v1/delete_range", auth.Write},
		{http.MethodGet, "/v1/scan/c", auth.Read},
		{http.MethodGet, "/v1/tags/c", auth.Read},
		{http.MethodGet, "/v1/watch/c", auth.Read},
		{http.MethodPost, "/v1/txn", auth.Read},
		{http.MethodPost, "/v1/txn/abc/get", auth.Read},
		{http.MethodPost, "/v1/txn/abc/scan", auth.Read},
		{http.MethodPost, "/v1/txn/abc/put", auth.Write},
		{http.MethodPost, "/v1/txn/abc/delete", auth.Write},
		{http.MethodPost, "/v1/txn/abc/commit", auth.Read},
		{http.MethodPost, "/v1/txn/abc/abort", auth.Read},
		{http.MethodPost, "/v1/txn/exec", auth.Write},
		{http.MethodGet, "/v1/groups", auth.Read},
		{http.MethodGet, "/v1/groups/g", auth.Read},
		{http.MethodPost, "/v1/groups", auth.Write},
		{http.MethodDelete, "/v1/groups/g", auth.Write},
		{http.MethodPost, "/v1/groups/g/txn", auth.Read},
		{http.MethodPost, "/v1/groups/g/exec", auth.Write},
		{http.MethodGet, "/v1/groups/exec", auth.Read}, // a group named exec
		{http.MethodDelete, "/v1/groups/txn", auth.Write},
		{http.MethodPost, "/v1/txn/put/get", auth.Read}, // an attempt named put
	} {
		if got, _ := httpRole(c.method, c.path); got != c.want {
			t.Errorf("%s %s: %s, want %s", c.method, c.path, got, c.want)
		}
	}
}
