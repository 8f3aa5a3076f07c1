// Package node wires one groupkv node together: its Pebble engine, the raft
// Host that runs every shard replica it holds, the meta shard (catalog and
// timestamp oracle), and the gateway that routes each client request to the
// shard owning its key. *Node implements kv.Backend, which the HTTP and gRPC
// layers and the embedded Go client call.
//
// Lifecycle: Open takes the data directory's lock, bootstraps the meta shard
// on a fresh directory (unless it is to join a cluster), starts every local
// replica and returns; Serve (with the node's advertised addresses, once its
// ports are bound) starts its cluster work — joining, keeping its membership
// record, growing the meta shard; RegisterPeer puts the raft transport and
// the peer service on the peer port; Ready reports when requests are
// served; Close stops everything and releases the lock. See cluster.go for
// how requests, reads and versions work across nodes.
//
// Invariants:
//   - Shard state changes only through proposals applied by the Host; the
//     node's own bookkeeping (which replicas live here) is node-local
//     metadata, reconciled with the catalog after every catalog change and at
//     start.
//   - A request is answered only after its write was fsynced and applied.
//
// node may import every internal package below api.
package node
