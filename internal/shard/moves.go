package shard

import (
	"encoding/binary"
	"encoding/json"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/storage"
)

// Placement changes of the meta shard: moving a collection's replicas from
// one node to another, and marking a node as draining.
const (
	// KindMoveReplicas replaces, in every shard of a collection, the
	// replica on one node by a joining replica on another (meta shard).
	KindMoveReplicas CommandKind = 10
	// KindSetDraining marks a node as draining or not (meta shard).
	KindSetDraining CommandKind = 11
	// KindSetPreferred makes a shard's replica on a node its preferred
	// leader (first in its replica list) (meta shard).
	KindSetPreferred CommandKind = 12
	// KindMoveShardReplica replaces the replica of one shard on one node
	// by a joining replica on another (meta shard). (Kinds 15-29 are
	// reserved.)
	KindMoveShardReplica CommandKind = 30
)

// PreferCmd is the body of a KindSetPreferred.
type PreferCmd struct {
	Collection string
	Shard      uint64
	Node       uint64
}

// EncodeSetPreferred encodes making node the preferred leader of shard.
func EncodeSetPreferred(collection string, shard, node uint64) []byte {
	b := appendBytes([]byte{byte(KindSetPreferred)}, []byte(collection))
	b = binary.AppendUvarint(b, shard)
	return binary.AppendUvarint(b, node)
}

func decodePrefer(d *decoder) PreferCmd {
	var p PreferCmd
	p.Collection = string(d.bytes())
	p.Shard = d.uvarint()
	p.Node = d.uvarint()
	return p
}

func (s *Shard) applyPrefer(b *pebble.Batch, p PreferCmd) (Result, error) {
	if !s.desc.IsMeta() {
		return Result{Err: kv.Errorf(kv.CodeInternal, "catalog command proposed to shard %d", s.desc.ShardID)}, nil
	}
	key := storage.CatalogKey(catalogCollection + p.Collection)
	v, ok, err := storage.GetValue(b, key)
	if err != nil {
		return Result{}, err
	}
	if !ok {
		return Result{Err: kv.Errorf(kv.CodeCollectionNotFound, "collection %q not found", p.Collection)}, nil
	}
	desc, err := cluster.DecodeCollectionDesc(v)
	if err != nil {
		return Result{}, err
	}
	for i := range desc.Shards {
		if desc.Shards[i].ID != p.Shard {
			continue
		}
		if !desc.Shards[i].Prefer(p.Node) {
			return Result{Err: kv.Errorf(kv.CodeConditionFailed, "shard %d has no replica on node %d", p.Shard, p.Node)}, nil
		}
		if err := b.Set(key, desc.Encode(), nil); err != nil {
			return Result{}, err
		}
		return Result{Desc: desc}, nil
	}
	return Result{Err: kv.Errorf(kv.CodeNotFound, "collection %q has no shard %d", p.Collection, p.Shard)}, nil
}

// MoveCmd is the body of a KindMoveReplicas or KindMoveShardReplica.
type MoveCmd struct {
	Collection string
	// Shard is the shard whose replica moves (KindMoveShardReplica); 0
	// moves the replicas of every shard of the collection on From.
	Shard    uint64
	From, To uint64
}

// DrainCmd is the body of a KindSetDraining.
type DrainCmd struct {
	Node     uint64
	Draining bool
}

// EncodeMoveReplicas encodes a move of collection's replicas from node from
// to node to.
func EncodeMoveReplicas(collection string, from, to uint64) []byte {
	b := appendBytes([]byte{byte(KindMoveReplicas)}, []byte(collection))
	b = binary.AppendUvarint(b, from)
	return binary.AppendUvarint(b, to)
}

// EncodeMoveShardReplica encodes a move of the replica of shard (of
// collection) on node from to node to.
func EncodeMoveShardReplica(collection string, shard, from, to uint64) []byte {
	b := appendBytes([]byte{byte(KindMoveShardReplica)}, []byte(collection))
	b = binary.AppendUvarint(b, shard)
	b = binary.AppendUvarint(b, from)
	return binary.AppendUvarint(b, to)
}

// EncodeSetDraining encodes a change of a node's draining mark.
func EncodeSetDraining(node uint64, draining bool) []byte {
	b := binary.AppendUvarint([]byte{byte(KindSetDraining)}, node)
	if draining {
		return append(b, 1)
	}
	return append(b, 0)
}

func decodeMove(d *decoder, kind CommandKind) MoveCmd {
	var m MoveCmd
	m.Collection = string(d.bytes())
	if kind == KindMoveShardReplica {
		if m.Shard = d.uvarint(); m.Shard == 0 {
			d.err = ErrCorruptCommand
		}
	}
	m.From = d.uvarint()
	m.To = d.uvarint()
	return m
}

func decodeDrain(d *decoder) DrainCmd {
	var c DrainCmd
	c.Node = d.uvarint()
	switch d.byte() {
	case 0:
	case 1:
		c.Draining = true
	default:
		d.err = ErrCorruptCommand
	}
	return c
}

func (s *Shard) applyMove(b *pebble.Batch, m MoveCmd) (Result, error) {
	if !s.desc.IsMeta() {
		return Result{Err: kv.Errorf(kv.CodeInternal, "catalog command proposed to shard %d", s.desc.ShardID)}, nil
	}
	key := storage.CatalogKey(catalogCollection + m.Collection)
	v, ok, err := storage.GetValue(b, key)
	if err != nil {
		return Result{}, err
	}
	if !ok {
		return Result{Err: kv.Errorf(kv.CodeCollectionNotFound, "collection %q not found", m.Collection)}, nil
	}
	desc, err := cluster.DecodeCollectionDesc(v)
	if err != nil {
		return Result{}, err
	}
	nodes, err := LoadNodes(b)
	if err != nil {
		return Result{}, err
	}
	known := false
	for _, n := range nodes {
		known = known || n.ID == m.To
	}
	if !known || m.From == m.To {
		return Result{Err: kv.Errorf(kv.CodeInvalidArgument, "cannot move replicas of %q from node %d to node %d", m.Collection, m.From, m.To)}, nil
	}
	moved := 0
	for i := range desc.Shards {
		if m.Shard != 0 && desc.Shards[i].ID != m.Shard {
			continue
		}
		if desc.Shards[i].MoveReplica(m.From, m.To) {
			moved++
		}
	}
	if moved == 0 && m.Shard != 0 {
		return Result{Err: kv.Errorf(kv.CodeConditionFailed, "shard %d of %q has no replica on node %d to move, or node %d holds one already", m.Shard, m.Collection, m.From, m.To)}, nil
	}
	if moved == 0 {
		return Result{Err: kv.Errorf(kv.CodeConditionFailed, "collection %q has no replica on node %d to move to node %d", m.Collection, m.From, m.To)}, nil
	}
	if err := b.Set(key, desc.Encode(), nil); err != nil {
		return Result{}, err
	}
	return Result{Desc: desc}, nil
}

func (s *Shard) applyDrain(b *pebble.Batch, c DrainCmd) (Result, error) {
	if !s.desc.IsMeta() {
		return Result{Err: kv.Errorf(kv.CodeInternal, "membership command proposed to shard %d", s.desc.ShardID)}, nil
	}
	nodes, err := LoadNodes(b)
	if err != nil {
		return Result{}, err
	}
	for _, n := range nodes {
		if n.ID != c.Node {
			continue
		}
		n.Draining = c.Draining
		data, err := json.Marshal(n)
		if err != nil {
			return Result{}, err
		}
		if err := b.Set(storage.CatalogKey(fmt.Sprintf("%s%016x", catalogNode, n.ID)), data, nil); err != nil {
			return Result{}, err
		}
		return Result{Node: &n}, nil
	}
	return Result{Err: kv.Errorf(kv.CodeNotFound, "node %d is not a member", c.Node)}, nil
}
