// Package transport carries raft messages between the nodes of a cluster.
// It owns the node-to-node wire: the gRPC service of proto/raft.proto
// (package proto/transportpb), the client streams to peer nodes and the
// server side that hands incoming messages to the local replication Host.
//
// GRPC implements replication.Transport. Its Send never blocks: it groups the
// messages by destination node (an Options.Resolver says on which node, at
// which address, a replica lives) and appends them to that node's bounded
// queue; a full queue drops what does not fit and counts it (Dropped), since
// raft retransmits what is lost. One goroutine per destination node keeps
// one client stream (RaftTransport.Raft) and writes everything queued since
// its last write as one RaftBatch (batching across shards and Host cycles).
// A broken stream is redialled with exponential backoff; messages queued
// meanwhile are dropped.
//
// Each raft message travels as its own gogo encoding
// (go.etcd.io/raft/v3/raftpb.Message.Marshal) in an Envelope with its shard.
//
// Usage, on every node:
//
//	s := grpc.NewServer()
//	transport.Register(s, host.Deliver)
//	go s.Serve(lis)
//	t := transport.NewGRPC(transport.Options{Resolver: resolve})
//	host := replication.NewHost(replication.Config{..., Transport: t})
//	...
//	host.Stop(); t.Close(); s.Stop()
//
// Send takes ownership of the messages it is given: the caller must not
// modify them (or the entries they reference) afterwards; they are encoded
// later, on the sender goroutine.
//
// transport may import replication (for its Message type), the raft message
// type, gRPC and the generated proto/transportpb; nothing below replication
// imports it.
package transport
