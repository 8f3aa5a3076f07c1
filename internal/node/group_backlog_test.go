package node

import (
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/group"
	"github.com/groupkv/groupkv/internal/kv"
)

// TestGroupShipsABacklog: a member's shard that gets no Ship for a while
// (the leader's Ships and Ds to it are dropped) is owed more group writes
// than one shipment carries. Once they flow again it gets them all, each
// at the version its group committed it: reads at those versions find
// them. A deletion while it is cut off sends Ds that cannot carry the
// key's writes; the key stays the group's until Ships have brought them,
// and the deletion ends with the key's whole history in its shard.
func TestGroupShipsABacklog(t *testing.T) {
	n, ctx := openWithCollection(t)
	k := kv.KeyRef{Collection: "c", Key: []byte("k")}
	if _, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: k.Key, Value: []byte("start")}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.CreateGroup(ctx, kv.GroupSpec{ID: "g", Leader: kv.KeyRef{Collection: "c", Key: []byte("L")}, Members: []kv.KeyRef{k}}); err != nil {
		t.Fatal(err)
	}
	d, err := n.collection("c")
	if err != nil {
		t.Fatal(err)
	}
	_, ks := n.route(d, k.Key)
	var cut atomic.Bool
	var largest atomic.Int64 // the most entries a Ship or D carried
	hook := func(m group.Message) bool {
		if m.Type != group.MsgShip && m.Type != group.MsgD || uint64(m.To) != ks {
			return false
		}
		for l := largest.Load(); int64(len(m.Entries)) > l && !largest.CompareAndSwap(l, int64(len(m.Entries))); l = largest.Load() {
		}
		return cut.Load()
	}
	n.groups.sent.Store(&hook)
	const writes = 1100 // above the 1024 entries of one shipment
	versions := map[int]uint64{}
	write := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			v, _, err := groupTransact(ctx, n, "g", func(at string) error {
				return n.TxnPut(ctx, at, kv.PutItem{Collection: "c", Key: k.Key, Value: []byte(strconv.Itoa(i))})
			})
			if err != nil {
				t.Fatalf("group write %d: %v", i, err)
			}
			versions[i] = v
		}
	}
	check := func(upTo int) {
		t.Helper()
		for _, i := range []int{0, 1, 511, 1023, 1024, 1025, upTo - 1} {
			if i >= upTo {
				continue
			}
			rec, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: k.Key, Version: versions[i]})
			if err != nil || string(rec.Value) != strconv.Itoa(i) || rec.Version != versions[i] {
				t.Fatalf("get at the version of write %d (%d): %q@%d, %v", i, versions[i], rec.Value, rec.Version, err)
			}
		}
		rec, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: k.Key, Version: versions[0] - 1})
		if err != nil || string(rec.Value) != "start" {
			t.Fatalf("get below the group's first write: %q, %v", rec.Value, err)
		}
	}
	cut.Store(true)
	write(0, writes)
	cut.Store(false)
	check(writes)

	// Again, and the group deleted while the key's shard is cut off.
	cut.Store(true)
	write(writes, 2*writes)
	deleted := make(chan error, 1)
	go func() { deleted <- n.DeleteGroup(ctx, "g") }()
	time.Sleep(300 * time.Millisecond) // Ds sent, and dropped
	select {
	case err := <-deleted:
		t.Fatalf("the delete answered while the key's shard got no D: %v", err)
	default:
	}
	cut.Store(false)
	select {
	case err := <-deleted:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("the delete did not end")
	}
	if h := n.groupHolding(ks, d.ID, k.Key); h != "" {
		t.Fatalf("the key is still held by %q after the delete", h)
	}
	check(2 * writes)
	for _, i := range []int{writes, writes + 1024, 2*writes - 1} {
		rec, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: k.Key, Version: versions[i]})
		if err != nil || string(rec.Value) != strconv.Itoa(i) {
			t.Fatalf("after the delete, get at the version of write %d: %q, %v", i, rec.Value, err)
		}
	}
	if rec, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: k.Key}); err != nil || string(rec.Value) != strconv.Itoa(2*writes-1) || rec.Version != versions[2*writes-1] {
		t.Fatalf("after the delete: %q@%d, %v; want the group's last write", rec.Value, rec.Version, err)
	}
	if l := largest.Load(); l != 1024 {
		t.Fatalf("the largest shipment carried %d entries, want 1024 (one shipment's most)", l)
	}
	if f := n.host.StateMachine(ks).FreedAbove(); f != 0 {
		t.Fatalf("FreedAbove %d: a write was stored above its version", f)
	}
}
