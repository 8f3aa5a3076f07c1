package cluster

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"sort"

	"github.com/groupkv/groupkv/internal/kv"
)

// MetaShardID is the shard id of the meta shard, which holds the catalog and
// the TSO state. Data shards get ids from 2 on.
const MetaShardID uint64 = 1

// Replica is one member of a shard's raft group.
type Replica struct {
	Node uint64 `json:"node"`
	// ID is the raft id of the replica within its group; ids are never
	// reused within a group.
	ID uint64 `json:"id"`
	// Joining: the replica was added to a running group (a move), so its
	// node creates it empty and the leader fills it with a snapshot; the
	// replicas a shard is created with start from the same initial state.
	Joining bool `json:"joining,omitempty"`
}

// ShardDesc describes one shard of a collection.
type ShardDesc struct {
	ID uint64 `json:"id"`
	// Buckets [BucketStart, BucketEnd) of a hash or tag collection.
	BucketStart uint32 `json:"bucket_start"`
	BucketEnd   uint32 `json:"bucket_end"`
	// Keys [Start, End) of a range collection; nil End is unbounded.
	Start    []byte    `json:"start,omitempty"`
	End      []byte    `json:"end,omitempty"`
	Replicas []Replica `json:"replicas"`
	// NextReplica is the raft id the next added replica gets; 0 means one
	// above the highest id in Replicas (ids are never reused).
	NextReplica uint64 `json:"next_replica,omitempty"`
	// Leaving are replicas that left the target (the last few): they stay
	// members of the group until its leader removes them, and their
	// messages must still find them. Ids are never reused, so an entry is
	// never wrong, only possibly stale.
	Leaving []Replica `json:"leaving,omitempty"`
	// SplitFrom is the shard this one was split from: its replicas are
	// created by the split applied in the parent's log, not by their nodes.
	SplitFrom uint64 `json:"split_from,omitempty"`
	// MergedInto is, for an entry of CollectionDesc.Merged, the shard that
	// took its span: its left neighbour.
	MergedInto uint64 `json:"merged_into,omitempty"`
}

// Split splits shard shardID of d in two: the shard keeps the lower part
// and a new shard newID (same replicas and raft ids, a new raft group)
// takes the upper part from key (range collections) or from bucket (hash
// and tag collections; 0 means the middle of the shard's span). It
// returns the new shard's index in d.Shards.
func (d *CollectionDesc) Split(shardID, newID uint64, key []byte, bucket uint32) (int, error) {
	at := -1
	for i := range d.Shards {
		if d.Shards[i].ID == shardID {
			at = i
		}
	}
	if at < 0 {
		return 0, fmt.Errorf("collection %q has no shard %d", d.Name, shardID)
	}
	s := d.Shards[at]
	child := ShardDesc{ID: newID, Replicas: append([]Replica(nil), s.Replicas...), NextReplica: s.NextReplica, SplitFrom: shardID}
	for i := range child.Replicas {
		child.Replicas[i].Joining = false
	}
	if d.Partitioning == kv.PartitionRange {
		if len(key) == 0 || bytes.Compare(key, s.Start) <= 0 || (s.End != nil && bytes.Compare(key, s.End) >= 0) {
			return 0, fmt.Errorf("key %q is not inside shard %d's span", key, shardID)
		}
		child.Start, child.End = key, s.End
		d.Shards[at].End = key
		pts := append([][]byte(nil), d.SplitPoints[:at]...)
		pts = append(pts, key)
		d.SplitPoints = append(pts, d.SplitPoints[at:]...)
	} else {
		if bucket == 0 {
			bucket = s.BucketStart + (s.BucketEnd-s.BucketStart)/2
		}
		if bucket <= s.BucketStart || bucket >= s.BucketEnd {
			return 0, fmt.Errorf("bucket %d is not inside shard %d's span [%d, %d)", bucket, shardID, s.BucketStart, s.BucketEnd)
		}
		child.BucketStart, child.BucketEnd = bucket, s.BucketEnd
		d.Shards[at].BucketEnd = bucket
	}
	shards := append([]ShardDesc(nil), d.Shards[:at+1]...)
	shards = append(shards, child)
	d.Shards = append(shards, d.Shards[at+1:]...)
	return at + 1, nil
}

// ErrMergeReplicas reports a merge of two shards whose replicas are not on
// the same nodes, or are moving: a merge joins the two shards' records in
// place on every node, so both must be held by exactly the same nodes.
var ErrMergeReplicas = errors.New("cluster: the shards' replicas are not on the same nodes")

// Merge joins shard leftID of d and its right neighbour into leftID: the
// left shard keeps its id, replicas and raft group and takes the right
// one's span; the right one leaves d.Shards for d.Merged (its group is
// removed once the merge is applied in the left shard's log). It returns
// the right shard. Both shards must have replicas on the same nodes, none
// of them joining (a move in progress): else the error wraps
// ErrMergeReplicas.
func (d *CollectionDesc) Merge(leftID uint64) (ShardDesc, error) {
	at := -1
	for i := range d.Shards {
		if d.Shards[i].ID == leftID {
			at = i
		}
	}
	if at < 0 {
		return ShardDesc{}, fmt.Errorf("collection %q has no shard %d", d.Name, leftID)
	}
	if at == len(d.Shards)-1 {
		return ShardDesc{}, fmt.Errorf("shard %d is the last shard of collection %q: it has no right neighbour to merge with", leftID, d.Name)
	}
	left, right := d.Shards[at], d.Shards[at+1]
	if !sameNodes(left.Replicas, right.Replicas) {
		return ShardDesc{}, fmt.Errorf("%w: shard %d is on nodes %v, shard %d on nodes %v", ErrMergeReplicas, left.ID, nodesOf(left.Replicas), right.ID, nodesOf(right.Replicas))
	}
	for _, r := range append(append([]Replica(nil), left.Replicas...), right.Replicas...) {
		if r.Joining {
			return ShardDesc{}, fmt.Errorf("%w: a replica on node %d is joining (a move is in progress)", ErrMergeReplicas, r.Node)
		}
	}
	if d.Partitioning == kv.PartitionRange {
		d.Shards[at].End = right.End
		// Shard i owns [SplitPoints[i-1], SplitPoints[i]): the right
		// shard's start is SplitPoints[at].
		d.SplitPoints = append(append([][]byte(nil), d.SplitPoints[:at]...), d.SplitPoints[at+1:]...)
	} else {
		d.Shards[at].BucketEnd = right.BucketEnd
	}
	d.Shards = append(append([]ShardDesc(nil), d.Shards[:at+1]...), d.Shards[at+2:]...)
	gone := right
	gone.MergedInto = leftID
	d.Merged = append(append([]ShardDesc(nil), d.Merged...), gone)
	if n := len(d.Merged); n > maxMerged {
		d.Merged = d.Merged[n-maxMerged:]
	}
	return right, nil
}

// maxMerged bounds CollectionDesc.Merged: an entry is needed only until
// every replica of the merged shard has applied the merge, seconds.
const maxMerged = 16

func sameNodes(a, b []Replica) bool {
	na, nb := nodesOf(a), nodesOf(b)
	if len(na) != len(nb) {
		return false
	}
	for i := range na {
		if na[i] != nb[i] {
			return false
		}
	}
	return true
}

func nodesOf(rs []Replica) []uint64 {
	out := make([]uint64, len(rs))
	for i, r := range rs {
		out[i] = r.Node
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// maxLeaving bounds ShardDesc.Leaving.
const maxLeaving = 8

func (s *ShardDesc) leave(r Replica) {
	r.Joining = false
	s.Leaving = append(append([]Replica(nil), s.Leaving...), r)
	if n := len(s.Leaving); n > maxLeaving {
		s.Leaving = s.Leaving[n-maxLeaving:]
	}
}

// ReplicaNode returns the node of replica id of s, among its target and
// leaving replicas.
func (s *ShardDesc) ReplicaNode(id uint64) (uint64, bool) {
	for _, r := range s.Replicas {
		if r.ID == id {
			return r.Node, true
		}
	}
	for _, r := range s.Leaving {
		if r.ID == id {
			return r.Node, true
		}
	}
	return 0, false
}

// RenewReplica gives the replica of s on node a new raft id, joining: the
// node lost its copy. It reports false if node holds no replica of s.
func (s *ShardDesc) RenewReplica(node uint64) bool {
	return s.replaceReplica(node, node)
}

// Prefer moves the replica of s on node to the front of its replica list,
// making it the preferred leader. It reports false if node holds no
// replica of s.
func (s *ShardDesc) Prefer(node uint64) bool {
	for i, r := range s.Replicas {
		if r.Node == node {
			out := append([]Replica{r}, s.Replicas[:i]...)
			s.Replicas = append(out, s.Replicas[i+1:]...)
			return true
		}
	}
	return false
}

// MoveReplica replaces the replica of s on node from by a joining replica
// on node to, with a new raft id. It reports false if from holds no
// replica of s or to holds one already.
func (s *ShardDesc) MoveReplica(from, to uint64) bool {
	if from == to {
		return false
	}
	return s.replaceReplica(from, to)
}

// replaceReplica replaces the replica of s on node from by a joining one on
// node to with the next raft id; the old one is kept as leaving.
func (s *ShardDesc) replaceReplica(from, to uint64) bool {
	at := -1
	next := s.NextReplica
	for i, r := range s.Replicas {
		if r.Node == to && to != from {
			return false
		}
		if r.Node == from {
			at = i
		}
		next = max(next, r.ID+1)
	}
	if at < 0 {
		return false
	}
	s.leave(s.Replicas[at])
	s.Replicas = append([]Replica(nil), s.Replicas...)
	s.Replicas[at] = Replica{Node: to, ID: next, Joining: true}
	s.NextReplica = next + 1
	return true
}

// CollectionDesc is the catalog entry of a collection.
type CollectionDesc struct {
	Name         string          `json:"name"`
	ID           uint32          `json:"id"`
	Partitioning kv.Partitioning `json:"partitioning"`
	SplitPoints  [][]byte        `json:"split_points,omitempty"`
	// Shards are ordered by bucket span (hash, tag) or key span (range).
	Shards []ShardDesc `json:"shards"`
	// Merged are the last shards merged into their left neighbour
	// (ShardDesc.MergedInto), kept so that their groups can finish the
	// merge: the messages of their replicas must still find them.
	Merged []ShardDesc `json:"merged,omitempty"`
}

// Encode returns the catalog encoding of d.
func (d *CollectionDesc) Encode() []byte {
	b, err := json.Marshal(d)
	if err != nil {
		panic(fmt.Sprintf("cluster: encoding descriptor: %v", err))
	}
	return b
}

// DecodeCollectionDesc decodes a descriptor written by Encode.
func DecodeCollectionDesc(b []byte) (*CollectionDesc, error) {
	var d CollectionDesc
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("cluster: decoding collection descriptor: %w", err)
	}
	return &d, nil
}

// NodeDesc is the membership record of a node (meta shard).
type NodeDesc struct {
	ID uint64 `json:"id"`
	// Addr is the client (API) address, PeerAddr the node-to-node one.
	Addr     string `json:"addr"`
	PeerAddr string `json:"peer_addr"`
	// MetaReplica is the node's replica id in the meta shard's group, 0
	// when it holds none.
	MetaReplica uint64 `json:"meta_replica,omitempty"`
	// Draining: the node is being decommissioned; its replicas move away
	// and it gets no new ones.
	Draining bool `json:"draining,omitempty"`
}

// MetaReplicas is the number of voters of the meta shard once the cluster
// has that many nodes; every further node holds a learner replica, which
// keeps its copy of the catalog current.
const MetaReplicas = 3

// DefaultReplicas is the replication factor of a collection created
// without one on a cluster of n nodes.
func DefaultReplicas(n int) int { return min(3, max(n, 1)) }

// Load counts what each node holds over every shard of every collection:
// its replicas and the shards it is the preferred leader of (first
// replica). Nil maps count zero.
type Load struct {
	Replicas map[uint64]int
	Leaders  map[uint64]int
}

// CatalogLoad counts the replicas and preferred leaders of every node in
// the shards of catalog.
func CatalogLoad(catalog []*CollectionDesc) Load {
	l := Load{Replicas: map[uint64]int{}, Leaders: map[uint64]int{}}
	for _, c := range catalog {
		for _, s := range c.Shards {
			for i, r := range s.Replicas {
				l.Replicas[r.Node]++
				if i == 0 {
					l.Leaders[r.Node]++
				}
			}
		}
	}
	return l
}

// PlaceShard picks rf of nodes for one new shard: the ones holding the
// fewest replicas by load (ties: earlier in nodes), the one among them
// preferred leader of the fewest shards first. It counts the shard in
// load, so that the next call spreads the next shard.
func PlaceShard(nodes []uint64, rf int, load *Load) []uint64 {
	if load.Replicas == nil {
		load.Replicas = map[uint64]int{}
	}
	if load.Leaders == nil {
		load.Leaders = map[uint64]int{}
	}
	pos := make(map[uint64]int, len(nodes))
	for i, id := range nodes {
		pos[id] = i
	}
	picked := append([]uint64(nil), nodes...)
	sort.SliceStable(picked, func(i, j int) bool { return load.Replicas[picked[i]] < load.Replicas[picked[j]] })
	picked = picked[:min(rf, len(picked))]
	if len(picked) == 0 {
		return nil
	}
	sort.SliceStable(picked, func(i, j int) bool { return pos[picked[i]] < pos[picked[j]] })
	first := 0
	for i, id := range picked {
		f := picked[first]
		if load.Leaders[id] < load.Leaders[f] || load.Leaders[id] == load.Leaders[f] && load.Replicas[id] < load.Replicas[f] {
			first = i
		}
	}
	picked[0], picked[first] = picked[first], picked[0]
	if first > 1 {
		// Keep the others in node order.
		sort.SliceStable(picked[1:], func(i, j int) bool { return pos[picked[1+i]] < pos[picked[1+j]] })
	}
	for i, id := range picked {
		load.Replicas[id]++
		if i == 0 {
			load.Leaders[id]++
		}
	}
	return picked
}

// NewCollectionDesc lays out the shards of a new collection with validated
// options. firstShard is the id of its first shard; the others follow.
// nodes are the candidate nodes, least loaded first, and load what they
// hold already. Each shard is placed on its own (PlaceShard): on the
// opts.Replicas nodes (all when 0) holding the fewest replicas of any
// shard, its own shards counted as they are placed, so replicas are on
// distinct nodes and spread over the cluster; the preferred leader (the
// first replica) is the one of them leading the fewest shards. The new
// shards are counted into load's maps. Raft ids within a shard are 1, 2, ...
func NewCollectionDesc(opts kv.CollectionOptions, id uint32, firstShard uint64, nodes []uint64, load Load) *CollectionDesc {
	d := &CollectionDesc{Name: opts.Name, ID: id, Partitioning: opts.Partitioning, SplitPoints: opts.SplitPoints}
	rf := opts.Replicas
	if rf == 0 || rf > len(nodes) {
		rf = len(nodes)
	}
	replicas := func() []Replica {
		placed := PlaceShard(nodes, rf, &load)
		r := make([]Replica, len(placed))
		for j, node := range placed {
			r[j] = Replica{Node: node, ID: uint64(j + 1)}
		}
		return r
	}
	for i := 0; i < opts.Shards; i++ {
		s := ShardDesc{ID: firstShard + uint64(i), Replicas: replicas()}
		if opts.Partitioning == kv.PartitionRange {
			if i > 0 {
				s.Start = opts.SplitPoints[i-1]
			}
			if i < len(opts.SplitPoints) {
				s.End = opts.SplitPoints[i]
			}
		} else {
			s.BucketStart = uint32(uint64(i) * kv.NumBuckets / uint64(opts.Shards))
			s.BucketEnd = uint32(uint64(i+1) * kv.NumBuckets / uint64(opts.Shards))
		}
		d.Shards = append(d.Shards, s)
	}
	return d
}

// Bucket returns the hash bucket of b (a key, or a placement tag).
func Bucket(b []byte) uint16 {
	h := fnv.New32a()
	h.Write(b)
	s := h.Sum32()
	return uint16(s ^ s>>16)
}

// Route returns the bucket a key is stored under and the index of the shard
// that owns it. placement is the record's placement tag in a tag collection
// (ignored otherwise).
func (d *CollectionDesc) Route(key []byte, placement string) (bucket uint16, shard int) {
	switch d.Partitioning {
	case kv.PartitionRange:
		// Shard i owns [SplitPoints[i-1], SplitPoints[i]).
		i := sort.Search(len(d.SplitPoints), func(i int) bool { return bytes.Compare(d.SplitPoints[i], key) > 0 })
		return 0, i
	case kv.PartitionTag:
		if placement != "" {
			bucket = Bucket([]byte(placement))
		} else {
			bucket = Bucket(key)
		}
	default:
		bucket = Bucket(key)
	}
	i := sort.Search(len(d.Shards), func(i int) bool { return d.Shards[i].BucketEnd > uint32(bucket) })
	return bucket, i
}

// Info converts d to its client-facing form. leader maps a shard id to the
// node id of its leader (0 when unknown).
func (d *CollectionDesc) Info(leader func(shard uint64) uint64) kv.CollectionInfo {
	info := kv.CollectionInfo{Name: d.Name, ID: d.ID, Partitioning: d.Partitioning, SplitPoints: d.SplitPoints}
	for _, s := range d.Shards {
		si := kv.ShardInfo{ID: s.ID, BucketStart: s.BucketStart, BucketEnd: s.BucketEnd, Start: s.Start, End: s.End}
		if leader != nil {
			si.Leader = leader(s.ID)
		}
		info.Shards = append(info.Shards, si)
	}
	return info
}
