package kv

import "context"

// Partitioning says how a collection's keys are spread over its shards.
type Partitioning string

const (
	// PartitionHash hashes every key into one of NumBuckets fixed buckets; a
	// shard owns a contiguous span of buckets.
	PartitionHash Partitioning = "hash"
	// PartitionRange gives each shard a contiguous span of keys, cut at the
	// collection's split points.
	PartitionRange Partitioning = "range"
	// PartitionTag places a record by its placement tag (its first tag at its
	// first put) so that records sharing it live in one shard.
	PartitionTag Partitioning = "tag"
)

// NumBuckets is the number of fixed hash buckets of a hash or tag collection.
const NumBuckets = 65536

// CollectionOptions are the options of a collection, fixed at creation.
// The zero value of every field means its default.
type CollectionOptions struct {
	// Name matches [a-z0-9_.-]{1,64}.
	Name string `json:"name"`
	// Partitioning defaults to PartitionHash.
	Partitioning Partitioning `json:"partitioning,omitempty"`
	// Shards is the number of shards; it defaults to DefaultShards for hash
	// and tag collections and to len(SplitPoints)+1 for range collections.
	Shards int `json:"shards,omitempty"`
	// SplitPoints are the keys at which a range collection's shards begin,
	// strictly increasing; shard i owns [SplitPoints[i-1], SplitPoints[i]).
	SplitPoints [][]byte `json:"split_points,omitempty"`
	// Replicas is the replication factor: the number of nodes that hold
	// each shard. 0 means 3 on a cluster of 3 or more nodes, else the node
	// count. Fixed at creation.
	Replicas int `json:"replicas,omitempty"`
}

// ClusterStatus describes the nodes and shards of a cluster.
type ClusterStatus struct {
	Nodes  []NodeStatus  `json:"nodes"`
	Shards []ShardStatus `json:"shards"`
}

// NodeStatus is one member as seen by the answering node.
type NodeStatus struct {
	ID       uint64 `json:"id"`
	Addr     string `json:"addr"`
	PeerAddr string `json:"peer_addr"`
	// Healthy: the node answered the answering node just now.
	Healthy bool `json:"healthy"`
	// Draining: the node is being decommissioned.
	Draining bool `json:"draining,omitempty"`
	// Replicas is the number of data shard replicas the catalog places on
	// the node (its target: moves in progress count at their destination).
	Replicas int `json:"replicas"`
	// Held is the number of data shard replicas the node reported holding
	// (a replica that moved away is held until the move completes); -1
	// when it did not answer.
	Held int `json:"held"`
	// WritesRefused, on the answering node, says why it refuses writes
	// while it serves reads (a node alone whose disk is low); empty when
	// it takes them.
	WritesRefused string `json:"writes_refused,omitempty"`
}

// ShardStatus is one shard: its collection ("" for the meta shard), the
// node ids of its replicas, and its leader's node id (0: unknown).
type ShardStatus struct {
	Collection string   `json:"collection"`
	Shard      uint64   `json:"shard"`
	Replicas   []uint64 `json:"replicas"`
	Leader     uint64   `json:"leader"`
	// Voters are the node ids of the shard's voting replicas as the
	// answering node's replica knows them (absent when it holds none).
	Voters []uint64 `json:"voters,omitempty"`
	// VotersOutgoing, while a change of the voters is under way (raft's
	// joint configuration), are the voters before it: until the change
	// completes a quorum of both sets is needed to elect a leader or
	// commit.
	VotersOutgoing []uint64 `json:"voters_outgoing,omitempty"`
	// Consistency is the last outcome of a replica consistency check of
	// the shard known to the answering node: "ok", "mismatch: ..." naming
	// the diverged replicas, or "incomplete" (a replica did not answer);
	// empty when none is known.
	Consistency string `json:"consistency,omitempty"`
}

// MaxReplicas bounds a collection's replication factor.
const MaxReplicas = 7

// DefaultShards is the shard count of a hash or tag collection when none is
// given: enough to spread load over a few nodes, few enough to keep a single
// node's raft cycle cheap.
const DefaultShards = 8

// MaxShards bounds the shard count of one collection.
const MaxShards = 1024

// ShardInfo describes one shard of a collection.
type ShardInfo struct {
	ID uint64 `json:"id"`
	// Buckets [BucketStart, BucketEnd) for hash and tag collections.
	BucketStart uint32 `json:"bucket_start,omitempty"`
	BucketEnd   uint32 `json:"bucket_end,omitempty"`
	// Keys [Start, End) for range collections; an empty End is unbounded.
	Start []byte `json:"start,omitempty"`
	End   []byte `json:"end,omitempty"`
	// Leader is the node id of the shard's leader, 0 when unknown.
	Leader uint64 `json:"leader"`
}

// CollectionInfo describes a collection.
type CollectionInfo struct {
	Name         string       `json:"name"`
	ID           uint32       `json:"id"`
	Partitioning Partitioning `json:"partitioning"`
	SplitPoints  [][]byte     `json:"split_points,omitempty"`
	Shards       []ShardInfo  `json:"shards"`
}

// Record is one version of a key as read.
type Record struct {
	Key     []byte   `json:"key"`
	Value   []byte   `json:"value"`
	Tags    []string `json:"tags"`
	Version uint64   `json:"version"`
}

// PutRequest stores Value under Key with Tags.
type PutRequest struct {
	Collection string
	Key        []byte
	Value      []byte
	Tags       []string
	// IfVersion, when set, makes the put conditional: it succeeds only if the
	// key's current version is *IfVersion (0: only if the key is absent).
	IfVersion *uint64
}

// GetRequest reads a key.
type GetRequest struct {
	Collection string
	Key        []byte
	// Version, when non-zero, reads the key as of that version; it must be
	// within the retention window (else ErrCompacted).
	Version uint64
}

// DeleteRequest deletes a key.
type DeleteRequest struct {
	Collection string
	Key        []byte
	// IfVersion, when set, makes the delete conditional on the key's current
	// version.
	IfVersion *uint64
}

// Backend is the client-facing service of groupkv. A node implements it; the
// HTTP and gRPC layers and the embedded Go client call it. Every method is
// safe for concurrent use. Errors are *Error values (test with errors.As or
// CodeOf) or context errors.
type Backend interface {
	CreateCollection(ctx context.Context, opts CollectionOptions) (CollectionInfo, error)
	ListCollections(ctx context.Context) ([]CollectionInfo, error)
	DescribeCollection(ctx context.Context, name string) (CollectionInfo, error)
	DropCollection(ctx context.Context, name string) error

	// Put answers the version the write was given.
	Put(ctx context.Context, req PutRequest) (uint64, error)
	// Get answers ErrNotFound-coded errors when the key is absent.
	Get(ctx context.Context, req GetRequest) (Record, error)
	// Delete answers the version of the tombstone.
	Delete(ctx context.Context, req DeleteRequest) (uint64, error)

	MultiBackend

	// Ready reports whether the node serves requests: its shards have leaders
	// and its catalog is readable. A nil error means ready.
	Ready() error
}
