package shard

import (
	"testing"

	"github.com/groupkv/groupkv/internal/group"
	"github.com/groupkv/groupkv/internal/kv"
)

// TestAddsData: what a node whose disk is low refuses, and what it takes.
func TestAddsData(t *testing.T) {
	ref := group.Ref{ID: "g", Leader: 1, Inc: 1}
	for _, c := range []struct {
		name string
		cmd  []byte
		want bool
	}{
		{"a put", EncodeWrite([]Op{{Type: OpPut, Key: []byte("k"), Value: []byte("v")}}), true},
		{"a batch with a put", EncodeWrite([]Op{{Type: OpDelete, Key: []byte("a")}, {Type: OpPut, Key: []byte("b")}}), true},
		{"deletes", EncodeWrite([]Op{{Type: OpDelete, Key: []byte("a")}, {Type: OpDelete, Key: []byte("b")}}), false},
		{"a range deletion", EncodeDeleteRange([]byte("a"), []byte("b")), true},
		{"a new collection", EncodeCreateCollection(kv.CollectionOptions{Name: "c"}, []uint64{1}), true},
		{"a prepare", EncodeTxnPrepare(&TxnPrepareCmd{}), true},
		{"a resolve", EncodeTxnResolve(&TxnResolveCmd{ID: "t"}), false},
		{"a group's commit", EncodeGroupRecord(group.Record{Kind: group.RecWrite, Group: ref}), true},
		{"a group's shipment", EncodeGroupRecord(group.Record{Kind: group.RecApplyShip, Group: ref}), false},
		{"a group's creation", EncodeGroupRecord(group.Record{Kind: group.RecCreate, Group: ref}), false},
		{"a GC", EncodeGC(7), false},
		{"timestamps", EncodeTSO(7), false},
		{"nothing", nil, false},
	} {
		if got := AddsData(c.cmd); got != c.want {
			t.Errorf("AddsData(%s) = %v, want %v", c.name, got, c.want)
		}
	}
}
