package server

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	groupkv "github.com/groupkv/groupkv"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/node"
)

// startBench runs a server on a fresh data directory with a collection
// "bench" and returns it.
func startBench(tb testing.TB) *Server {
	tb.Helper()
	s, err := Start(Config{Node: node.Options{DataDir: tb.TempDir()}, Listen: "127.0.0.1:0", PeerListen: "127.0.0.1:0",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Node.WaitReady(ctx); err != nil {
		tb.Fatal(err)
	}
	if _, err := s.Node.CreateCollection(ctx, kv.CollectionOptions{Name: "bench"}); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s.Close(ctx)
	})
	return s
}

// The handler benchmarks run b.N requests from GOMAXPROCS*16 clients, so
// durable writes share fsyncs as they do under load.

func BenchmarkHTTPPut(b *testing.B) {
	s := startBench(b)
	value := bytes.Repeat([]byte("v"), 100)
	var n atomic.Int64
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024}}
	b.SetParallelism(16)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			req, _ := http.NewRequest("PUT", fmt.Sprintf("http://%s/v1/kv/bench/k%d", s.Addr(), i%10000), bytes.NewReader(value))
			resp, err := client.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				b.Fatalf("status %d", resp.StatusCode)
			}
		}
	})
}

func BenchmarkHTTPGet(b *testing.B) {
	s := startBench(b)
	for i := range 1000 {
		if _, err := s.Node.Put(context.Background(), kv.PutRequest{Collection: "bench", Key: []byte(fmt.Sprintf("k%d", i)), Value: []byte("v")}); err != nil {
			b.Fatal(err)
		}
	}
	var n atomic.Int64
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024}}
	b.SetParallelism(16)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			resp, err := client.Get(fmt.Sprintf("http://%s/v1/kv/bench/k%d", s.Addr(), i%1000))
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				b.Fatalf("status %d", resp.StatusCode)
			}
		}
	})
}

// The gRPC benchmarks run through groupkv.Dial twice: as it sends gets and
// puts (on a Pipeline stream), and as it does to a server without Pipeline
// (unary RPCs, gets sharing BatchGets).
var grpcForms = []struct {
	name string
	opts []groupkv.DialOption
}{
	{"pipelined", nil},
	{"unary", []groupkv.DialOption{groupkv.WithGRPCDialOptions(grpc.WithChainStreamInterceptor(
		func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			if strings.HasSuffix(method, "/Pipeline") {
				return nil, status.Error(codes.Unimplemented, "no Pipeline (benchmark of the unary form)")
			}
			return streamer(ctx, desc, cc, method, opts...)
		}))}},
}

func BenchmarkGRPCPut(b *testing.B) {
	for _, f := range grpcForms {
		b.Run(f.name, func(b *testing.B) { benchGRPCPut(b, startBench(b), f.opts...) })
	}
}

func benchGRPCPut(b *testing.B, s *Server, opts ...groupkv.DialOption) {
	db, err := groupkv.Dial(s.Addr(), opts...)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	value := bytes.Repeat([]byte("v"), 100)
	var n atomic.Int64
	b.SetParallelism(16)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			if _, err := db.Put(context.Background(), groupkv.PutRequest{Collection: "bench", Key: []byte(fmt.Sprintf("k%d", i%10000)), Value: value}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkGRPCGet(b *testing.B) {
	for _, f := range grpcForms {
		b.Run(f.name, func(b *testing.B) { benchGRPCGet(b, f.opts...) })
	}
}

func benchGRPCGet(b *testing.B, opts ...groupkv.DialOption) {
	s := startBench(b)
	db, err := groupkv.Dial(s.Addr(), opts...)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	for i := range 1000 {
		if _, err := db.Put(context.Background(), groupkv.PutRequest{Collection: "bench", Key: []byte(fmt.Sprintf("k%d", i)), Value: []byte("v")}); err != nil {
			b.Fatal(err)
		}
	}
	var n atomic.Int64
	b.SetParallelism(16)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			if _, err := db.Get(context.Background(), groupkv.GetRequest{Collection: "bench", Key: []byte(fmt.Sprintf("k%d", i%1000))}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
