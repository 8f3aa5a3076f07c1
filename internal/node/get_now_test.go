package node

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
)

// TestGetNow: a get GetNow takes is answered as Get answers it — the
// record, or not found; one it does not take answers nothing, for Get to
// serve: a get at a version, a bad key, a collection that does not exist
// or is tag-partitioned, a key a committed transaction's intent is still
// on (Get resolves it), a key a Key Group holds (Get reads it from the
// group).
func TestGetNow(t *testing.T) {
	var opts Options
	unsweptOptions(&opts) // the transaction's intents stay until a get meets them
	n := mtOpen(t, t.TempDir(), opts)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	mtCreate(t, n, kv.CollectionOptions{Name: "h", Shards: 4})
	mtCreate(t, n, kv.CollectionOptions{Name: "t", Partitioning: kv.PartitionTag, Shards: 1})

	v, err := n.Put(ctx, kv.PutRequest{Collection: "h", Key: []byte("a"), Value: []byte("1"), Tags: []string{"x"}})
	if err != nil {
		t.Fatal(err)
	}
	rec, err, ok := n.GetNow(kv.GetRequest{Collection: "h", Key: []byte("a")})
	if !ok || err != nil || string(rec.Value) != "1" || rec.Version != v || len(rec.Tags) != 1 || string(rec.Key) != "a" {
		t.Fatalf("GetNow of a: %+v, %v, %v; want value 1 at %d", rec, err, ok, v)
	}
	if _, err, ok := n.GetNow(kv.GetRequest{Collection: "h", Key: []byte("missing")}); !ok || kv.CodeOf(err) != kv.CodeNotFound {
		t.Fatalf("GetNow of a missing key: %v, %v; want not found", err, ok)
	}
	if _, err := n.Put(ctx, kv.PutRequest{Collection: "t", Key: []byte("a"), Value: []byte("1"), Tags: []string{"x"}}); err != nil {
		t.Fatal(err)
	}
	for _, req := range []kv.GetRequest{
		{Collection: "h", Key: []byte("a"), Version: v},
		{Collection: "h", Key: nil},
		{Collection: "nope", Key: []byte("a")},
		{Collection: "t", Key: []byte("a")},
	} {
		if rec, err, ok := n.GetNow(req); ok {
			t.Errorf("GetNow of %+v answered %+v, %v; want it left to Get", req, rec, err)
		}
	}

	// Intents of a committed transaction, not resolved: Get's, which
	// resolves them.
	keys := make([]string, 16)
	for i := range keys {
		keys[i] = fmt.Sprintf("txn%d", i)
	}
	commitUnresolved(ctx, t, n, "h", keys)
	for _, k := range keys {
		if rec, err, ok := n.GetNow(kv.GetRequest{Collection: "h", Key: []byte(k)}); ok {
			t.Fatalf("GetNow of %s under a committed transaction's intent: %+v, %v; want it left to Get", k, rec, err)
		}
	}
	for _, k := range keys {
		if rec, err := n.Get(ctx, kv.GetRequest{Collection: "h", Key: []byte(k)}); err != nil || string(rec.Value) != "v"+k {
			t.Fatalf("Get of %s after the transaction: %+v, %v", k, rec, err)
		}
	}

	// A member of a Key Group: Get reads it from the group.
	if _, err := n.CreateGroup(ctx, kv.GroupSpec{ID: "g", Leader: kv.KeyRef{Collection: "h", Key: []byte("lead")}, Members: []kv.KeyRef{{Collection: "h", Key: []byte("a")}}}); err != nil {
		t.Fatal(err)
	}
	if rec, err, ok := n.GetNow(kv.GetRequest{Collection: "h", Key: []byte("a")}); ok {
		t.Fatalf("GetNow of a member of a group: %+v, %v; want it left to Get", rec, err)
	}
	if rec, err := n.Get(ctx, kv.GetRequest{Collection: "h", Key: []byte("a")}); err != nil || string(rec.Value) != "1" {
		t.Fatalf("Get of a member of a group: %+v, %v", rec, err)
	}
}

// TestGetValueIsTheCallers: the value and tags Get returns are the
// caller's to change, whether the read filled the cache of newest versions
// or was answered from it (GetNow shares the cache's with its caller).
func TestGetValueIsTheCallers(t *testing.T) {
	n := mtOpen(t, t.TempDir(), Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	mtCreate(t, n, kv.CollectionOptions{Name: "h", Shards: 1})
	if _, err := n.Put(ctx, kv.PutRequest{Collection: "h", Key: []byte("a"), Value: []byte("value"), Tags: []string{"tag"}}); err != nil {
		t.Fatal(err)
	}
	d, err := n.collection("h")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		if i == 3 {
			// The put filled the cache; now a miss that fills it, then hits.
			n.latestCache.Invalidate(d.ID, []byte("a"))
		}
		rec, err := n.Get(ctx, kv.GetRequest{Collection: "h", Key: []byte("a")})
		if err != nil {
			t.Fatal(err)
		}
		if string(rec.Value) != "value" || len(rec.Tags) != 1 || rec.Tags[0] != "tag" {
			t.Fatalf("read %d: %q %q, want \"value\" [tag]: an earlier caller's change reached the node's copy", i, rec.Value, rec.Tags)
		}
		// The caller changes what it got, in place.
		for j := range rec.Value {
			rec.Value[j] = '#'
		}
		rec.Tags[0] = "changed"
	}
}
