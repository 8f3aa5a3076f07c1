// Package groupkvpb holds the Go code generated from proto/groupkv.proto: the
// messages and the GroupKV service of groupkv's gRPC API. Do not edit the
// generated files; edit the .proto and run proto/gen.sh (or go generate).
// The server is internal/api.NewGRPCServer; the Go client is groupkv.Dial.
package groupkvpb

//go:generate sh ../gen.sh
