// Package api owns the network faces of a groupkv node over kv.Backend: the
// HTTP/JSON API (http.go for single keys and collections, http_multi.go for
// batches, delete range, scans, tag queries and watch streams, http_txn.go
// for transactions over kv.TxnBackend, http_group.go for Key Groups over
// kv.GroupBackend), the gRPC service groupkv.v1.GroupKV of
// proto/groupkv.proto (grpc.go, grpc_txn.go for its transaction and Key
// Groups RPCs), the conversions between kv types and its messages, shared
// with its Go clients (convert.go, convert_txn.go; TxnClient is the
// kv.TxnBackend and kv.GroupBackend of a remote server), the request
// metrics both protocols record (metrics.go), and the mux that serves both
// on one TCP port (mux.go).
//
// The layers translate and nothing else: they parse and check requests,
// call the Backend, and render its answers and errors. They hold no state of
// the store, decide nothing about placement, replication or transactions,
// and never retry: a Backend error is the client's answer.
//
// # Invariants
//
//   - No path cleaning. The HTTP handler routes on the escaped request path
//     itself; it never goes through http.ServeMux, which cleans paths and
//     redirects "//" and "..". The key of /v1/kv/{collection}/{key} is the
//     percent-decoded rest of the path, byte for byte: "a/../b", "a//b",
//     "a%2Fb" (the same key as "a/b") and " " are keys like any other.
//   - Errors always carry a stable code. Every HTTP error answer is JSON
//     {"error": {"code": "...", "message": "..."}} with the status of its
//     code (kv.Code.HTTPStatus), a 405 with an Allow header being the one
//     exception; gRPC errors carry the same codes. Errors that are not
//     *kv.Error become internal, or unavailable for a context that ended
//     (kv.CodeOf). Messages say what was wrong and what to do.
//   - Bounded buffering. A value is read up to its limit plus one byte, a
//     JSON body up to its limit; larger ones are answered too_large.
//   - Input is validated up front with the kv validators where that is
//     cheap; the Backend validates again and its answer stands.
//
// # What it may call
//
// api imports kv, the standard library, google.golang.org/grpc and the
// generated code of proto/, and prometheus for Metrics. It calls a node only
// through kv.Backend, and nothing below it (gateway, shard, storage) directly.
//
// # Usage
//
// A node serves both protocols on one port:
//
//	metrics := api.NewMetrics(reg)
//	httpSrv := &http.Server{
//		Handler: api.NewHTTPHandler(backend, api.HTTPConfig{
//			MaxValueSize: limits.MaxValueSize,
//			Metrics:      metrics,
//			Extra:        promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
//		}),
//		ReadHeaderTimeout: 10 * time.Second,
//	}
//	grpcSrv := grpc.NewServer()
//	// register the GroupKV service on grpcSrv (grpc.go)
//	mux := api.NewMux(listener, grpcSrv, httpSrv, api.MuxConfig{})
//	go mux.Serve()
//	...
//	mux.Close()              // stop accepting
//	grpcSrv.GracefulStop()   // then drain
//	httpSrv.Shutdown(ctx)
package api
