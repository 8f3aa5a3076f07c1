package main

import (
	"net"
	"net/http"
	"testing"

	"github.com/groupkv/groupkv/internal/api"
	"github.com/groupkv/groupkv/internal/kv"
)

// serveAPI serves the API of b as a node does, HTTP/JSON and gRPC on one
// port of 127.0.0.1 (api.NewMux), until the test ends, and answers the
// port's address: the CLI reaches it through the Go client (groupkv.Dial,
// gRPC) and over HTTP alike.
func serveAPI(t *testing.T, b kv.Backend) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	grpcSrv := api.NewGRPCServer(b)
	httpSrv := &http.Server{Handler: api.NewHTTPHandler(b, api.HTTPConfig{})}
	mux := api.NewMux(l, grpcSrv, httpSrv, api.MuxConfig{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = mux.Serve()
	}()
	t.Cleanup(func() {
		mux.Close()
		grpcSrv.Stop()
		httpSrv.Close()
		<-done
	})
	return l.Addr().String()
}
