package api

import (
	"context"
	"strings"
	"time"
	"unicode"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/groupkv/groupkv/internal/kv"
	pb "github.com/groupkv/groupkv/proto/groupkvpb"
)

// NewGRPCServer returns a gRPC server that serves the groupkv.v1.GroupKV
// service (proto/groupkv.proto) over b. The caller owns the server: it calls
// Serve on a listener and GracefulStop or Stop when done; b must outlive it.
//
// The server accepts and sends messages up to MaxMessageSize; opts come after
// these defaults and so may override them. Add interceptors through opts,
// e.g. grpc.ChainUnaryInterceptor(GRPCMetricsInterceptor(m.Observe)).
//
// Every error of b reaches the client as described at StatusFromError: the
// kv.Code rides in an ErrorDetail and in the CodeTrailer trailer, the
// message is the status message.
func NewGRPCServer(b kv.Backend, opts ...grpc.ServerOption) *grpc.Server {
	all := make([]grpc.ServerOption, 0, 2+len(opts))
	all = append(all, grpc.MaxRecvMsgSize(MaxMessageSize), grpc.MaxSendMsgSize(MaxMessageSize))
	all = append(all, opts...)
	s := grpc.NewServer(all...)
	pb.RegisterGroupKVServer(s, &grpcService{b: b})
	return s
}

// GRPCMetricsInterceptor returns an interceptor that calls obs once per
// unary RPC, after it ends, with the operation (the RPC's method name in
// snake_case: "put", "create_collection", "ready"), the kv.Code the client
// sees ("" on success, kv.CodeUnavailable for a request whose context ended)
// and the seconds the handler took. obs must be safe for concurrent use and
// quick; it runs on the request's goroutine. api.(*Metrics).Observe fits.
func GRPCMetricsInterceptor(obs func(op string, code kv.Code, seconds float64)) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		var code kv.Code
		if err != nil {
			code = kv.CodeOf(ErrorFromStatus(err, false))
		}
		obs(grpcOp(info.FullMethod), code, time.Since(start).Seconds())
		return resp, err
	}
}

// grpcOp turns a full method name, "/groupkv.v1.GroupKV/CreateCollection",
// into the operation label "create_collection".
func grpcOp(fullMethod string) string {
	name := fullMethod[strings.LastIndexByte(fullMethod, '/')+1:]
	var b strings.Builder
	for i, r := range name {
		if unicode.IsUpper(r) {
			if i > 0 {
				b.WriteByte('_')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// grpcService implements the GroupKV service over a Backend: it converts the
// request, calls the Backend, and converts the answer or the error.
type grpcService struct {
	pb.UnimplementedGroupKVServer
	b kv.Backend
}

var _ pb.GroupKVServer = (*grpcService)(nil)

// fail turns an error of the Backend into the status error the handler
// returns, and sets the CodeTrailer trailer when it carries a kv.Code.
func (s *grpcService) fail(ctx context.Context, err error) error {
	st, code := StatusFromError(err)
	if code != "" {
		// SetTrailer fails only outside a handler's context; the detail
		// still carries the code then.
		_ = grpc.SetTrailer(ctx, metadata.Pairs(CodeTrailer, string(code)))
	}
	return st.Err()
}

func (s *grpcService) CreateCollection(ctx context.Context, req *pb.CreateCollectionRequest) (*pb.CollectionInfo, error) {
	info, err := s.b.CreateCollection(ctx, CollectionOptionsFromPB(req))
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return CollectionInfoToPB(info), nil
}

func (s *grpcService) ListCollections(ctx context.Context, _ *pb.ListCollectionsRequest) (*pb.ListCollectionsResponse, error) {
	infos, err := s.b.ListCollections(ctx)
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return CollectionInfosToPB(infos), nil
}

func (s *grpcService) DescribeCollection(ctx context.Context, req *pb.DescribeCollectionRequest) (*pb.CollectionInfo, error) {
	info, err := s.b.DescribeCollection(ctx, req.GetName())
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return CollectionInfoToPB(info), nil
}

func (s *grpcService) DropCollection(ctx context.Context, req *pb.DropCollectionRequest) (*pb.DropCollectionResponse, error) {
	if err := s.b.DropCollection(ctx, req.GetName()); err != nil {
		return nil, s.fail(ctx, err)
	}
	return &pb.DropCollectionResponse{}, nil
}

func (s *grpcService) Put(ctx context.Context, req *pb.PutRequest) (*pb.PutResponse, error) {
	v, err := s.b.Put(ctx, PutRequestFromPB(req))
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return &pb.PutResponse{Version: v}, nil
}

func (s *grpcService) Get(ctx context.Context, req *pb.GetRequest) (*pb.GetResponse, error) {
	rec, err := s.b.Get(ctx, GetRequestFromPB(req))
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return RecordToPB(rec), nil
}

func (s *grpcService) Delete(ctx context.Context, req *pb.DeleteRequest) (*pb.DeleteResponse, error) {
	v, err := s.b.Delete(ctx, DeleteRequestFromPB(req))
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return &pb.DeleteResponse{Version: v}, nil
}

func (s *grpcService) Ready(ctx context.Context, _ *pb.ReadyRequest) (*pb.ReadyResponse, error) {
	if err := s.b.Ready(); err != nil {
		return nil, s.fail(ctx, err)
	}
	return &pb.ReadyResponse{}, nil
}
