package api_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/groupkv/groupkv/internal/api"
	"github.com/groupkv/groupkv/internal/kv"
	pb "github.com/groupkv/groupkv/proto/groupkvpb"
)

// TestGRPCPipelineScans: a dialed DB sends its short scans on the Pipeline
// stream once the server announced that it serves them there (answered in
// scan_bytes, or in scan by a server that does not name scan_bytes), and
// as unary RPCs to a server that did not (or has no Pipeline RPC), and to
// any server when the page asked for is long; every way, pages, order,
// the continuation and errors are those of the unary RPC.
func TestGRPCPipelineScans(t *testing.T) {
	for _, server := range []string{"new", "without scan bytes", "without scans", "without pipeline"} {
		t.Run(server, func(t *testing.T) {
			ctx := context.Background()
			var rpcs rpcCounter
			opts := rpcs.options(server == "without pipeline")
			switch server {
			case "without scans":
				opts = append(opts, grpc.ChainStreamInterceptor(hidePipelineOps))
			case "without scan bytes":
				opts = append(opts, grpc.ChainStreamInterceptor(hidePipelineScanBytes))
			}
			addr, _ := grpcServe(t, newGRPCFake(), opts...)
			db := grpcDial(t, addr)
			if _, err := db.CreateCollection(ctx, kv.CollectionOptions{Name: "c"}); err != nil {
				t.Fatal(err)
			}
			var want []string
			for i := range 30 {
				k := fmt.Sprintf("k%02d", i)
				want = append(want, k)
				// A pipelined put's answer comes after the stream's
				// header: from then on the client knows whether the
				// server serves scans.
				if _, err := db.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte(k), Value: []byte("v" + k)}); err != nil {
					t.Fatal(err)
				}
			}
			scanAll := func(req kv.ScanRequest) []string {
				t.Helper()
				var got []string
				for pages := 0; ; pages++ {
					res, err := db.Scan(ctx, req)
					if err != nil {
						t.Fatalf("scan %+v: %v", req, err)
					}
					for _, r := range res.Items {
						if string(r.Value) != "v"+string(r.Key) || r.Version == 0 {
							t.Errorf("scan: %q = %q at version %d", r.Key, r.Value, r.Version)
						}
						got = append(got, string(r.Key))
					}
					if res.NextPage == "" || pages > 100 {
						return got
					}
					req.Page = res.NextPage
				}
			}
			var wg sync.WaitGroup
			for g := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if got := scanAll(kv.ScanRequest{Collection: "c", Limit: 7 + g}); !slices.Equal(got, want) {
						t.Errorf("scan in pages of %d: %q, want %q", 7+g, got, want)
					}
				}()
			}
			wg.Wait()
			rev := slices.Clone(want)
			slices.Reverse(rev)
			if got := scanAll(kv.ScanRequest{Collection: "c", Start: []byte("k05"), End: []byte("k25"), Reverse: true}); !slices.Equal(got, rev[5:25]) {
				t.Errorf("reverse scan of [k05, k25): %q, want %q", got, rev[5:25])
			}
			pipelined := rpcs.get("Scan")
			onStream := server == "new" || server == "without scan bytes"
			if onStream && pipelined != 0 {
				t.Errorf("%d short scans went as unary RPCs to a server that serves them on its stream", pipelined)
			}
			if !onStream && pipelined == 0 {
				t.Errorf("no unary scan: the scans went to a server that did not announce them")
			}
			// A long page goes as a unary RPC, whatever the server.
			if got := scanAll(kv.ScanRequest{Collection: "c", Limit: 1000}); !slices.Equal(got, want) {
				t.Errorf("scan in a page of 1000: %q, want %q", got, want)
			}
			if rpcs.get("Scan") != pipelined+1 {
				t.Errorf("a scan of a page of 1000: %d unary scans, want %d", rpcs.get("Scan"), pipelined+1)
			}
			// Errors are the unary RPC's: code and message.
			for _, code := range []kv.Code{kv.CodeNotFound, kv.CodeInvalidArgument, kv.CodeUnavailable} {
				_, err := db.Scan(ctx, kv.ScanRequest{Collection: "fail", Start: []byte(code), Limit: 10})
				var ke *kv.Error
				if !errors.As(err, &ke) || ke.Code != code || ke.Message != grpcFakeMessage(code) {
					t.Errorf("scan failing with %s: %v", code, err)
				}
			}
			if _, err := db.Scan(ctx, kv.ScanRequest{Collection: "c", Limit: -1}); kv.CodeOf(err) != kv.CodeInvalidArgument {
				t.Errorf("scan with limit -1: %v, want invalid_argument", err)
			}
		})
	}
}

// hidePipelineOps makes a server's Pipeline streams answer as those of a
// server older than scans on the stream: the client's question goes
// unheard, and the header names no operation.
func hidePipelineOps(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if info.FullMethod != pipelineMethod {
		return h(srv, ss)
	}
	md, _ := metadata.FromIncomingContext(ss.Context())
	md = md.Copy()
	delete(md, api.PipelineOpsKey)
	return h(srv, &watchedStream{ServerStream: ss, ctx: metadata.NewIncomingContext(ss.Context(), md), w: &pipelineWatch{}})
}

// hidePipelineScanBytes makes a server's Pipeline streams answer as those
// of a server that serves scans on the stream but older than scan_bytes.
func hidePipelineScanBytes(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if info.FullMethod != pipelineMethod {
		return h(srv, ss)
	}
	md, _ := metadata.FromIncomingContext(ss.Context())
	md = md.Copy()
	md.Set(api.PipelineOpsKey, slices.DeleteFunc(md.Get(api.PipelineOpsKey), func(op string) bool { return op == api.PipelineOpScanBytes })...)
	return h(srv, &watchedStream{ServerStream: ss, ctx: metadata.NewIncomingContext(ss.Context(), md), w: &pipelineWatch{}})
}

// TestGRPCPipelineScanWire: a server names scans in the header of a stream
// whose client asked which operations it serves (and only then), and
// answers a scan on the stream as the unary RPC does: in scan, or in
// scan_bytes, encoded, when the client asked for that too.
func TestGRPCPipelineScanWire(t *testing.T) {
	ctx := context.Background()
	addr, _ := grpcServe(t, newGRPCFake())
	c := grpcBare(t, addr)
	if _, err := c.CreateCollection(ctx, &pb.CreateCollectionRequest{Name: "c"}); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"a", "b", "c"} {
		if _, err := c.Put(ctx, &pb.PutRequest{Collection: "c", Key: []byte(k), Value: []byte("v" + k), Tags: []string{"t" + k}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, ask := range [][]string{nil, {api.PipelineOpScan}, {api.PipelineOpScan, api.PipelineOpScanBytes}, {api.PipelineOpScanBytes}} {
		sctx := ctx
		for _, op := range ask {
			sctx = metadata.AppendToOutgoingContext(sctx, api.PipelineOpsKey, op)
		}
		s, err := c.Pipeline(sctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(&pb.PipelineRequest{Id: 1, Op: &pb.PipelineRequest_Scan{Scan: &pb.ScanRequest{Collection: "c", Limit: 2}}}); err != nil {
			t.Fatal(err)
		}
		md, err := s.Header()
		if err != nil {
			t.Fatal(err)
		}
		scans := slices.Contains(ask, api.PipelineOpScan)
		encoded := scans && slices.Contains(ask, api.PipelineOpScanBytes)
		if got := slices.Contains(md.Get(api.PipelineOpsKey), api.PipelineOpScan); got != scans {
			t.Errorf("client asked for %q; header names scans: %v (%v)", ask, got, md)
		}
		if got := slices.Contains(md.Get(api.PipelineOpsKey), api.PipelineOpScanBytes); got != encoded {
			t.Errorf("client asked for %q; header names scan_bytes: %v (%v)", ask, got, md)
		}
		got, _ := closeAndReceive(t, s)
		want, err := c.Scan(ctx, &pb.ScanRequest{Collection: "c", Limit: 2})
		if err != nil {
			t.Fatal(err)
		}
		if want.GetNextPage() == "" || len(want.GetItems()) != 2 {
			t.Fatalf("unary scan: %v, want two records and a next page", want)
		}
		if !encoded {
			if !proto.Equal(got[1].GetScan(), want) {
				t.Errorf("client asked for %q; scan on the stream: %v; unary: %v", ask, got[1], want)
			}
			continue
		}
		r, ok := got[1].GetResult().(*pb.PipelineResponse_ScanBytes)
		if !ok {
			t.Fatalf("client asked for %q; answer %v, want scan_bytes", ask, got[1])
		}
		var m pb.ScanResponse
		if err := proto.Unmarshal(r.ScanBytes, &m); err != nil || !proto.Equal(&m, want) {
			t.Errorf("scan_bytes on the stream decode to %v (%v); unary: %v", &m, err, want)
		}
		dec, err := api.DecodeScanBytes(r.ScanBytes)
		if err != nil || !reflect.DeepEqual(dec, api.ScanResultFromPB(want)) {
			t.Errorf("DecodeScanBytes: %+v (%v), want %+v", dec, err, api.ScanResultFromPB(want))
		}
	}
}

// TestGRPCPipelineScansConcurrent: many scans at once on one stream, of
// answers large enough that their buffers come from the codec's pool and
// go back to it once sent, each read whole and right: no answer is
// overwritten by another's reuse of its buffer.
func TestGRPCPipelineScansConcurrent(t *testing.T) {
	ctx := context.Background()
	addr, _ := grpcServe(t, newGRPCFake())
	db := grpcDial(t, addr)
	if _, err := db.CreateCollection(ctx, kv.CollectionOptions{Name: "c"}); err != nil {
		t.Fatal(err)
	}
	const keys = 60
	value := func(k string) string { return strings.Repeat(k, 40) } // 120 bytes
	for i := range keys {
		k := fmt.Sprintf("k%02d", i)
		if _, err := db.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte(k), Value: []byte(value(k))}); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 40 {
				start, limit := (g*7+i*3)%keys, 1+(g+i*5)%40
				res, err := db.Scan(ctx, kv.ScanRequest{Collection: "c", Start: []byte(fmt.Sprintf("k%02d", start)), Limit: limit})
				if err != nil {
					t.Errorf("scan from k%02d: %v", start, err)
					return
				}
				if want := min(limit, keys-start); len(res.Items) != want {
					t.Errorf("scan from k%02d limit %d: %d records, want %d", start, limit, len(res.Items), want)
					return
				}
				for j, r := range res.Items {
					k := fmt.Sprintf("k%02d", start+j)
					if string(r.Key) != k || string(r.Value) != value(k) {
						t.Errorf("scan from k%02d: record %d is %q = %.20q..., want %s", start, j, r.Key, r.Value, k)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
}
