package api

import (
	"context"
	"errors"
	"strings"
	"time"
	"unicode"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/groupkv/groupkv/internal/auth"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/workpool"
	pb "github.com/groupkv/groupkv/proto/groupkvpb"
)

// NewGRPCServer returns a gRPC server that serves the groupkv.v1.GroupKV
// service (proto/groupkv.proto) over b. The caller owns the server: it calls
// Serve on a listener and GracefulStop or Stop when done; b must outlive it.
//
// The server accepts and sends messages up to MaxMessageSize; opts come after
// these defaults and so may override them. Add interceptors through opts,
// e.g. grpc.ChainUnaryInterceptor(GRPCMetricsInterceptor(m.Observe)) and
// grpc.ChainStreamInterceptor(GRPCStreamMetricsInterceptor(m.Observe)).
//
// Watch streams last until their clients cancel them, so GracefulStop waits
// for them: bound it, and call Stop after, to end them.
//
// Every error of b reaches the client as described at StatusFromError: the
// kv.Code rides in an ErrorDetail and in the CodeTrailer trailer, the
// message is the status message.
func NewGRPCServer(b kv.Backend, opts ...grpc.ServerOption) *grpc.Server {
	return NewGRPCServerWith(b, GRPCConfig{}, opts...)
}

// GRPCConfig is what NewGRPCServerWith adds to NewGRPCServer.
type GRPCConfig struct {
	// Observe, when set, is called once per request of a Pipeline stream,
	// as GRPCMetricsInterceptor calls it once per unary RPC (op "put",
	// "get" or "delete").
	Observe func(op string, code kv.Code, seconds float64)
	// Draining, when closed, ends the Pipeline streams: each answers the
	// requests it is serving, serves no more, and ends with an
	// UNAVAILABLE status whose ErrorDetail says the client's requests not
	// answered were not served (PipelineDrained). Close it before
	// GracefulStop, which would otherwise wait for them.
	Draining <-chan struct{}
	// Roles, when set, checks every call against its client's role
	// (package auth), the client named by the certificate of its TLS
	// connection (the listener's: the server's transport credentials
	// become connCredentials).
	Roles *auth.Roles
}

// NewGRPCServerWith is NewGRPCServer with cfg.
func NewGRPCServerWith(b kv.Backend, cfg GRPCConfig, opts ...grpc.ServerOption) *grpc.Server {
	all := make([]grpc.ServerOption, 0, 3+len(opts))
	all = append(all, grpc.MaxRecvMsgSize(MaxMessageSize), grpc.MaxSendMsgSize(MaxMessageSize), grpc.ForceServerCodecV2(Codec{}))
	all = append(all, opts...)
	if cfg.Roles != nil {
		all = append(all, grpc.Creds(connCredentials{}),
			grpc.ChainUnaryInterceptor(authUnary(cfg.Roles)), grpc.ChainStreamInterceptor(authStream(cfg.Roles)))
	}
	s := grpc.NewServer(all...)
	pb.RegisterGroupKVServer(s, &grpcService{b: b, workers: workpool.New(), observe: cfg.Observe, draining: cfg.Draining, roles: cfg.Roles})
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

// GRPCStreamMetricsInterceptor is GRPCMetricsInterceptor for streaming RPCs
// (Watch): obs is called once per stream, after it ends, with the seconds the
// stream lasted.
//
// A watch normally ends because its client went away (it canceled, its
// deadline passed, its connection broke): that is counted as a success (code
// ""), as the HTTP layer counts a watch whose client left, since the error
// is no answer to anyone. Any other error is counted with its code.
func GRPCStreamMetricsInterceptor(obs func(op string, code kv.Code, seconds float64)) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		start := time.Now()
		err := handler(srv, ss)
		var code kv.Code
		if err != nil && ss.Context().Err() == nil {
			code = kv.CodeOf(ErrorFromStatus(err, false))
		}
		obs(grpcOp(info.FullMethod), code, time.Since(start).Seconds())
		return err
	}
}

// grpcOp turns a full method name, "/groupkv.v1.GroupKV/CreateCollection",
// into the operation label "create_collection"; the transaction and Key
// Groups RPCs get the labels of their HTTP forms (grpcTxnOps).
func grpcOp(fullMethod string) string {
	name := fullMethod[strings.LastIndexByte(fullMethod, '/')+1:]
	if op, ok := grpcTxnOps[name]; ok {
		return op
	}
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
	// workers serve the requests of Pipeline streams.
	workers  *workpool.Pool
	observe  func(op string, code kv.Code, seconds float64)
	draining <-chan struct{}
	roles    *auth.Roles // nil: no roles file
}

var _ pb.GroupKVServer = (*grpcService)(nil)

// fail turns an error of the Backend into the status error the handler
// returns, and sets the CodeTrailer trailer when it carries a kv.Code.
func (s *grpcService) fail(ctx context.Context, err error) error {
	return failWith(err, func(md metadata.MD) {
		// SetTrailer fails only outside a handler's context; the detail
		// still carries the code then.
		_ = grpc.SetTrailer(ctx, md)
	})
}

// failWith is fail with the way to set the trailer given: unary handlers set
// it on their context, streaming handlers on their stream.
func failWith(err error, setTrailer func(metadata.MD)) error {
	st, code := StatusFromError(err)
	if code != "" {
		setTrailer(metadata.Pairs(CodeTrailer, string(code)))
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

func (s *grpcService) BatchGet(ctx context.Context, req *pb.BatchGetRequest) (*pb.BatchGetResponse, error) {
	if req.GetIndependent() {
		return s.independentGets(ctx, KeyRefsFromPB(req.GetKeys()))
	}
	r, err := s.b.BatchGet(ctx, KeyRefsFromPB(req.GetKeys()))
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return BatchGetResultToPB(r), nil
}

// independentGets answers a batch get with independent set: each key is
// read by a Get of its own (the gets a client coalesced), a key not found
// is an item not found, and any other error fails the call, so that the
// client sends each get alone and each gets its own error.
func (s *grpcService) independentGets(ctx context.Context, keys []kv.KeyRef) (*pb.BatchGetResponse, error) {
	if len(keys) > kv.DefaultMaxBatchKeys {
		return nil, s.fail(ctx, kv.Errorf(kv.CodeTooLarge, "the batch has %d keys, the limit is %d", len(keys), kv.DefaultMaxBatchKeys))
	}
	items := make([]*pb.BatchGetItem, len(keys))
	for i, k := range keys {
		rec, err := s.b.Get(ctx, kv.GetRequest{Collection: k.Collection, Key: k.Key})
		switch {
		case kv.CodeOf(err) == kv.CodeNotFound:
			items[i] = &pb.BatchGetItem{Collection: k.Collection, Key: k.Key}
		case err != nil:
			return nil, s.fail(ctx, err)
		default:
			items[i] = &pb.BatchGetItem{Collection: k.Collection, Key: k.Key, Found: true, Value: rec.Value, Tags: rec.Tags, Version: rec.Version}
		}
	}
	return &pb.BatchGetResponse{Items: items}, nil
}

func (s *grpcService) BatchPut(ctx context.Context, req *pb.BatchPutRequest) (*pb.BatchWriteResponse, error) {
	rs, err := s.b.BatchPut(ctx, PutItemsFromPB(req))
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return &pb.BatchWriteResponse{Results: WriteResultsToPB(rs)}, nil
}

func (s *grpcService) BatchDelete(ctx context.Context, req *pb.BatchDeleteRequest) (*pb.BatchWriteResponse, error) {
	rs, err := s.b.BatchDelete(ctx, KeyRefsFromPB(req.GetKeys()))
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return &pb.BatchWriteResponse{Results: WriteResultsToPB(rs)}, nil
}

func (s *grpcService) DeleteRange(ctx context.Context, req *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error) {
	r, err := s.b.DeleteRange(ctx, DeleteRangeRequestFromPB(req))
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return DeleteRangeResultToPB(r), nil
}

func (s *grpcService) Scan(ctx context.Context, req *pb.ScanRequest) (*pb.ScanResponse, error) {
	r, err := s.b.Scan(ctx, ScanRequestFromPB(req))
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return ScanResultToPB(r), nil
}

func (s *grpcService) GetByTags(ctx context.Context, req *pb.TagQuery) (*pb.ScanResponse, error) {
	r, err := s.b.GetByTags(ctx, TagQueryFromPB(req))
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	return ScanResultToPB(r), nil
}

// Watch streams the events of Backend.Watch until the client cancels (the
// stream's context ends), the Backend fails, or a send fails.
//
// A failed send means the stream is broken (the client went away or the
// server is stopping): its error already is a status, which is returned as
// it is. Any other error of the Backend, before or during the stream, ends
// the RPC with the status StatusFromError makes of it, trailer included.
func (s *grpcService) Watch(req *pb.WatchRequest, stream grpc.ServerStreamingServer[pb.Event]) error {
	var sendErr error
	err := s.b.Watch(stream.Context(), WatchRequestFromPB(req), func(ev kv.Event) error {
		if err := stream.Send(EventToPB(ev)); err != nil {
			sendErr = err
			return err
		}
		return nil
	})
	switch {
	case err == nil:
		return nil
	case sendErr != nil && errors.Is(err, sendErr):
		return sendErr
	}
	return failWith(err, stream.SetTrailer)
}
