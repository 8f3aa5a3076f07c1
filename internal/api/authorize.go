package api

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/groupkv/groupkv/internal/auth"
	pb "github.com/groupkv/groupkv/proto/groupkvpb"
)

// Authorization: with a roles file (HTTPConfig.Roles, GRPCConfig.Roles)
// every request is checked against its client's role (package auth)
// before it is served: HTTP requests by method and path, gRPC calls by
// method, and each request of a Pipeline stream by its operation. The
// client is named by the certificate its TLS connection presented, found
// by ConnContext (HTTP) and connCredentials (gRPC).

// tlsState answers the TLS state of c, looking through the connections
// that wrap it (the mux's, a listener's), or nil for a connection in the
// clear.
func tlsState(c net.Conn) *tls.ConnectionState {
	for range 8 {
		switch t := c.(type) {
		case *tls.Conn:
			st := t.ConnectionState()
			return &st
		case interface{ NetConn() net.Conn }:
			c = t.NetConn()
		default:
			return nil
		}
	}
	return nil
}

// ConnContext is an http.Server's ConnContext that names, in the context
// of every request of a TLS connection, the client its certificate says.
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	if st := tlsState(c); st != nil {
		return auth.WithClient(ctx, auth.NameOf(st))
	}
	return ctx
}

// httpRole answers the role an HTTP request needs (auth.None: any
// client) and what it is, for the refusal.
func httpRole(method, p string) (auth.Role, string) {
	read := method == http.MethodGet || method == http.MethodHead
	switch {
	case p == healthPath || p == metricsPath:
		return auth.None, ""
	case p == clusterPath:
		return auth.Read, "reading the cluster's status"
	case p == clusterCheckPath, strings.HasPrefix(p, nodesPrefix+"/"):
		return auth.Admin, "a cluster operation"
	case p == kvPrefix || strings.HasPrefix(p, kvPrefix+"/"):
		if read {
			return auth.Read, "a get"
		}
		return auth.Write, "a write"
	case p == collectionsPath || strings.HasPrefix(p, collectionsPath+"/"):
		if read && !strings.HasSuffix(p, "/split") && !strings.HasSuffix(p, "/merge") {
			return auth.Read, "reading collections"
		}
		return auth.Admin, "changing collections (create, drop, split, merge)"
	case p == batchGetPath, under(p, scanPrefix), under(p, tagsPrefix), under(p, watchPrefix):
		return auth.Read, "a read"
	case p == batchPutPath, p == batchDeletePath, p == deleteRangePath:
		return auth.Write, "a write"
	case p == txnExecPath:
		return auth.Write, "a one-shot transaction"
	case under(p, txnPath):
		// /v1/txn/{id}/{verb}, as serveTxn reads it.
		switch _, verb, _ := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(p, txnPath), "/"), "/"); verb {
		case "put", "delete":
			return auth.Write, "a write in a transaction"
		}
		return auth.Read, "a transaction"
	case under(p, groupsPath):
		// /v1/groups[/{id}[/{verb}]], as serveGroups reads it.
		_, verb, _ := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(p, groupsPath), "/"), "/")
		switch {
		case verb == "exec":
			return auth.Write, "a one-shot transaction"
		case verb == "txn", read:
			return auth.Read, "reading key groups"
		}
		return auth.Write, "creating or deleting a key group"
	}
	return auth.None, "" // an unknown path: answered 404
}

// grpcRoles is the role each gRPC method needs; a method not listed needs
// auth.Admin. CommitTxn needs more when it carries writes, and TxnGet
// when it reads for update (grpcRole).
var grpcRoles = map[string]auth.Role{
	"Ready":              auth.None,
	"ListCollections":    auth.Read,
	"DescribeCollection": auth.Read,
	"CreateCollection":   auth.Admin,
	"DropCollection":     auth.Admin,
	"Get":                auth.Read,
	"BatchGet":           auth.Read,
	"Scan":               auth.Read,
	"GetByTags":          auth.Read,
	"Watch":              auth.Read,
	"Pipeline":           auth.Read, // and each request by its operation
	"Put":                auth.Write,
	"Delete":             auth.Write,
	"BatchPut":           auth.Write,
	"BatchDelete":        auth.Write,
	"DeleteRange":        auth.Write,
	"BeginTxn":           auth.Read,
	"TxnGet":             auth.Read,
	"TxnScan":            auth.Read,
	"TxnGetByTags":       auth.Read,
	"AbortTxn":           auth.Read,
	"CommitTxn":          auth.Read,
	"TxnPut":             auth.Write,
	"TxnDelete":          auth.Write,
	"TxnWrite":           auth.Write,
	"ExecTxn":            auth.Write,
	"DescribeGroup":      auth.Read,
	"ListGroups":         auth.Read,
	"BeginGroupTxn":      auth.Read,
	"CreateGroup":        auth.Write,
	"DeleteGroup":        auth.Write,
	"ExecGroupTxn":       auth.Write,
}

// grpcRole answers the role a call of fullMethod with req (nil for a
// stream) needs.
func grpcRole(fullMethod string, req any) auth.Role {
	name := fullMethod[strings.LastIndexByte(fullMethod, '/')+1:]
	if !strings.HasPrefix(fullMethod, "/"+pb.GroupKV_ServiceDesc.ServiceName+"/") {
		return auth.Admin
	}
	role, ok := grpcRoles[name]
	if !ok {
		return auth.Admin
	}
	switch r := req.(type) {
	case *pb.CommitTxnRequest:
		if len(r.GetWrites()) > 0 {
			return auth.Write
		}
	case *pb.TxnGetRequest:
		if r.GetForUpdate() {
			return auth.Write // its exclusive lock holds writers off
		}
	}
	return role
}

// pipelinedRole answers the role a request of a Pipeline stream needs;
// each request of a batch carrier is checked on its own.
func pipelinedRole(req *pb.PipelineRequest) auth.Role {
	switch {
	case req.GetPut() != nil, req.GetDelete() != nil:
		return auth.Write
	case len(req.GetCommitTxn().GetWrites()) > 0, req.GetTxnGet().GetForUpdate():
		return auth.Write
	}
	return auth.Read
}

// clientContext names, in ctx, the client of the gRPC call's connection.
func clientContext(ctx context.Context) context.Context {
	if p, ok := peer.FromContext(ctx); ok {
		if info, ok := p.AuthInfo.(connAuthInfo); ok {
			return auth.WithClient(ctx, auth.NameOf(info.state))
		}
	}
	return ctx
}

// authUnary checks each unary call against its client's role.
func authUnary(roles *auth.Roles) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx = clientContext(ctx)
		if err := roles.Check(ctx, grpcRole(info.FullMethod, req), info.FullMethod); err != nil {
			return nil, failWith(err, func(md metadata.MD) { _ = grpc.SetTrailer(ctx, md) })
		}
		return handler(ctx, req)
	}
}

// authStream checks each stream against its client's role, and hands the
// Pipeline handler a context that names the client, for its requests.
func authStream(roles *auth.Roles) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx := clientContext(ss.Context())
		if err := roles.Check(ctx, grpcRole(info.FullMethod, nil), info.FullMethod); err != nil {
			return failWith(err, func(md metadata.MD) { ss.SetTrailer(md) })
		}
		return handler(srv, &contextStream{ServerStream: ss, ctx: ctx})
	}
}

// contextStream is a ServerStream with another context.
type contextStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *contextStream) Context() context.Context { return s.ctx }

// connCredentials are the client port's gRPC transport credentials when
// TLS is done before gRPC sees a connection (by the port's listener): they
// add nothing to the connection, and give the calls on it the
// connection's TLS state (connAuthInfo), which names the client.
type connCredentials struct{}

type connAuthInfo struct {
	credentials.CommonAuthInfo
	state *tls.ConnectionState
}

func (connAuthInfo) AuthType() string { return "tls" }

func (connCredentials) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	info := connAuthInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}}
	if st := tlsState(c); st != nil {
		info.state = st
		info.SecurityLevel = credentials.PrivacyAndIntegrity
	}
	return c, info, nil
}

func (connCredentials) ClientHandshake(_ context.Context, _ string, c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c, connAuthInfo{}, nil
}

func (connCredentials) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls"}
}

func (c connCredentials) Clone() credentials.TransportCredentials { return c }

func (connCredentials) OverrideServerName(string) error { return nil }
