#!/bin/sh
# Regenerates proto/groupkvpb from proto/groupkv.proto and proto/transportpb
# from proto/raft.proto. The generated code is
# committed; run this after editing the .proto and commit both.
#
# Needs protoc (Debian: apt-get install protobuf-compiler) and the two Go
# plugins at the versions the generated code was made with:
#
#	go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
#	go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
set -eu

cd "$(dirname "$0")/.."
PATH="$(go env GOPATH)/bin:$PATH"
export PATH

protoc \
	-I proto \
	--go_out=. --go_opt=module=github.com/groupkv/groupkv \
	--go-grpc_out=. --go-grpc_opt=module=github.com/groupkv/groupkv \
	proto/groupkv.proto

# proto/transportpb: the node-to-node raft transport (internal/transport).
# Compiled from the repository root so that it registers as
# "proto/raft.proto": go.etcd.io/raft/v3/raftpb already registers
# "raft.proto", and a second file of that name panics at init.
protoc \
	-I . \
	--go_out=. --go_opt=module=github.com/groupkv/groupkv \
	--go-grpc_out=. --go-grpc_opt=module=github.com/groupkv/groupkv \
	proto/raft.proto
