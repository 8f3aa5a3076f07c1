package groupkv_test

import (
	"context"
	"errors"
	"testing"

	groupkv "github.com/groupkv/groupkv"
)

// TestReadOnlyTransactOverGroupKeys: through the public client, embedded,
// a read-only transaction's read of a key a group holds fails with
// ErrKeyInGroup and is not run again; one whose attempt began before the
// group's deletion and reads the key after it is run again by Transact,
// and its next attempt reads the group's last write.
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
	attempts := 0
	err = db.Transact(ctx, func(tx *groupkv.Tx) error {
		attempts++
		_, err := tx.Get(ctx, groupkv.GetRequest{Collection: "p", Key: ada.Key})
		return err
	}, groupkv.ReadOnly())
	if !errors.Is(err, groupkv.ErrKeyInGroup) || attempts != 1 {
		t.Fatalf("a read-only read of a group's key: %v after %d attempts, want ErrKeyInGroup after 1", err, attempts)
	}
	attempts = 0
	var got string
	err = db.Transact(ctx, func(tx *groupkv.Tx) error {
		attempts++
		if attempts == 1 {
			// The attempt's timestamp is taken; the group writes and goes.
			if err := db.Group("m").Transact(ctx, func(g *groupkv.Tx) error {
				return g.Put(ctx, groupkv.PutRequest{Collection: "p", Key: ada.Key, Value: []byte("3")})
			}); err != nil {
				return err
			}
			if err := db.DeleteGroup(ctx, "m"); err != nil {
				return err
			}
		}
		rec, err := tx.Get(ctx, groupkv.GetRequest{Collection: "p", Key: ada.Key})
		got = string(rec.Value)
		return err
	}, groupkv.ReadOnly())
	if err != nil || attempts != 2 || got != "3" {
		t.Fatalf("a read-only transaction across the group's deletion: %v after %d attempts, read %q; want 3 after 2", err, attempts, got)
	}
}
