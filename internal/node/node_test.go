package node

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
)

func openTest(t *testing.T, dir string, opts Options) *Node {
	t.Helper()
	opts.DataDir = dir
	n, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := n.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestPutGetDeleteAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	n := openTest(t, dir, Options{})
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "c"}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "c"}); !errors.Is(err, kv.ErrAlreadyExists) {
		t.Fatalf("second create: %v", err)
	}
	var last uint64
	for i := range 50 {
		v, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte(fmt.Sprintf("k%d", i)), Value: []byte(fmt.Sprint(i)), Tags: []string{"t"}})
		if err != nil {
			t.Fatal(err)
		}
		if v <= last && i > 0 {
			// Versions of one shard increase; across shards they come from
			// one oracle, so they increase too on a single node.
			t.Fatalf("version %d after %d", v, last)
		}
		last = v
	}
	rec, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte("k7")})
	if err != nil || string(rec.Value) != "7" || len(rec.Tags) != 1 {
		t.Fatalf("get: %+v %v", rec, err)
	}
	old := rec.Version
	v2, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte("k7"), Value: []byte("new"), IfVersion: &old})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte("k7"), Value: []byte("x"), IfVersion: &old}); !errors.Is(err, kv.ErrConditionFailed) {
		t.Fatalf("stale conditional put: %v", err)
	}
	if rec, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte("k7"), Version: old}); err != nil || string(rec.Value) != "7" {
		t.Fatalf("get at old version: %+v %v", rec, err)
	}
	if _, err := n.Delete(ctx, kv.DeleteRequest{Collection: "c", Key: []byte("nope")}); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("delete absent: %v", err)
	}
	if _, err := n.Delete(ctx, kv.DeleteRequest{Collection: "c", Key: []byte("k8")}); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}

	n = openTest(t, dir, Options{})
	defer n.Close()
	rec, err = n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte("k7")})
	if err != nil || string(rec.Value) != "new" || rec.Version != v2 {
		t.Fatalf("after restart: %+v %v", rec, err)
	}
	if _, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte("k8")}); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("deleted key after restart: %v", err)
	}
	v3, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte("k9"), Value: []byte("x")})
	if err != nil || v3 <= v2 {
		t.Fatalf("version after restart %d <= %d (%v)", v3, v2, err)
	}
	if _, err := n.Get(ctx, kv.GetRequest{Collection: "nope", Key: []byte("k")}); !errors.Is(err, kv.ErrCollectionNotFound) {
		t.Fatalf("unknown collection: %v", err)
	}
}

// TestFailedNodeAnswersNoRead: once the node's storage failed, a get
// answers unavailable at once, even in the moment before its raft loop
// has stopped (the fast path of a single voter's reads looked only at
// the loop's state).
func TestFailedNodeAnswersNoRead(t *testing.T) {
	ctx := context.Background()
	n := openTest(t, t.TempDir(), Options{})
	defer n.Close()
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "c"}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte("k"), Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte("k")}); err != nil {
		t.Fatal(err)
	}
	n.host.Fail(errors.New("injected storage failure"))
	if _, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte("k")}); kv.CodeOf(err) != kv.CodeUnavailable {
		t.Fatalf("get right after the failure: %v, want unavailable", err)
	}
}

func TestOracleUnavailable(t *testing.T) {
	err := oracleUnavailable(kv.Errorf(kv.CodeNotLeader, "node 3 no longer leads the meta shard"))
	if kv.CodeOf(err) != kv.CodeUnavailable || !strings.Contains(err.Error(), "node 3 no longer leads") {
		t.Errorf("a not_leader of the meta shard: %v, want unavailable naming it", err)
	}
	other := kv.Errorf(kv.CodeTxnAborted, "aborted")
	if got := oracleUnavailable(other); got != other {
		t.Errorf("another error: %v, want it unchanged", got)
	}
}
