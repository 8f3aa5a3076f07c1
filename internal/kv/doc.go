// Package kv holds the vocabulary every layer of groupkv shares: the request
// and result types of the client-facing service, the Backend interface that
// a node implements and the API layers (HTTP, gRPC, the Go client) call, the
// stable error codes, and the validation of user input.
//
// kv is a leaf package: it imports nothing from groupkv, so the node, the API
// layers and the public client can all depend on it.
package kv
