package groupkv_test

import (
	"context"
	"testing"

	groupkv "github.com/groupkv/groupkv"
)

// TestReadOnlyTransactOverGroupKeys: through the public client, embedded,
// a read-only transaction reads a key a group holds at its timestamp: the
// group's last write before it, in one attempt; one whose attempt began
// before the group's next write and deletion reads the value of its
// timestamp and commits in that attempt, and the next transaction reads
// the group's last write.
func TestReadOnlyTransactOverGroupKeys(t *testing.T) {
	ctx := context.Background()
	db, err := groupkv.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.CreateCollection(ctx, groupkv.CollectionOptions{Name: "p"}); err != nil {
		t.Fatal(err)
	}
	ada := groupkv.KeyRef{Collection: "p", Key: []byte("ada")}
	if _, err := db.Put(ctx, groupkv.PutRequest{Collection: "p", Key: ada.Key, Value: []byte("1")}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.CreateGroup(ctx, groupkv.GroupSpec{ID: "m", Leader: groupkv.KeyRef{Collection: "p", Key: []byte("lead")}, Members: []groupkv.KeyRef{ada}}); err != nil {
		t.Fatal(err)
	}
	if err := db.Group("m").Transact(ctx, func(tx *groupkv.Tx) error {
		return tx.Put(ctx, groupkv.PutRequest{Collection: "p", Key: ada.Key, Value: []byte("2")})
	}); err != nil {
		t.Fatal(err)
	}
	read := func(during func() error) (string, int, error) {
		attempts := 0
		var got string
		err := db.Transact(ctx, func(tx *groupkv.Tx) error {
			attempts++
			if attempts == 1 && during != nil {
				// The attempt's timestamp is taken.
				if err := during(); err != nil {
					return err
				}
			}
			rec, err := tx.Get(ctx, groupkv.GetRequest{Collection: "p", Key: ada.Key})
			got = string(rec.Value)
			return err
		}, groupkv.ReadOnly())
		return got, attempts, err
	}
	if got, attempts, err := read(nil); err != nil || attempts != 1 || got != "2" {
		t.Fatalf("a read-only read of a group's key: %q after %d attempts, %v; want 2 after 1", got, attempts, err)
	}
	got, attempts, err := read(func() error {
		if err := db.Group("m").Transact(ctx, func(g *groupkv.Tx) error {
			return g.Put(ctx, groupkv.PutRequest{Collection: "p", Key: ada.Key, Value: []byte("3")})
		}); err != nil {
			return err
		}
		return db.DeleteGroup(ctx, "m")
	})
	if err != nil || attempts != 1 || got != "2" {
		t.Fatalf("a read-only transaction across the group's write and deletion: %v after %d attempts, read %q; want 2 after 1", err, attempts, got)
	}
	if got, attempts, err := read(nil); err != nil || attempts != 1 || got != "3" {
		t.Fatalf("a read-only read after the group's deletion: %q after %d attempts, %v; want 3 after 1", got, attempts, err)
	}
}
