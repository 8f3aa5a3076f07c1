package groupkv_test

import (
	"context"
	"errors"
	"testing"

	groupkv "github.com/groupkv/groupkv"
)

// TestOpenEmbedded runs a node in this process through the public client:
// the same interface as Dial, with no network.
func TestOpenEmbedded(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	db, err := groupkv.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Ready(); err != nil {
		t.Fatalf("ready: %v", err)
	}
	if _, err := db.CreateCollection(ctx, groupkv.CollectionOptions{Name: "users"}); err != nil {
		t.Fatal(err)
	}
	v, err := db.Put(ctx, groupkv.PutRequest{Collection: "users", Key: []byte("ada"), Value: []byte("Ada"), Tags: []string{"admin"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := groupkv.Open(dir); err == nil {
		t.Fatalf("a second Open of the same directory succeeded")
	}
	page, err := db.Scan(ctx, groupkv.ScanRequest{Collection: "users"})
	if err != nil || len(page.Items) != 1 || string(page.Items[0].Key) != "ada" {
		t.Fatalf("scan: %+v %v", page, err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	db, err = groupkv.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rec, err := db.Get(ctx, groupkv.GetRequest{Collection: "users", Key: []byte("ada")})
	if err != nil || string(rec.Value) != "Ada" || rec.Version != v || len(rec.Tags) != 1 {
		t.Fatalf("after reopening: %+v %v", rec, err)
	}
	if _, err := db.Get(ctx, groupkv.GetRequest{Collection: "users", Key: []byte("bob")}); !errors.Is(err, groupkv.ErrNotFound) {
		t.Fatalf("absent key: %v", err)
	}
}
