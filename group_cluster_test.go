package groupkv_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/groupkv/groupkv"
)

// TestGroupsOverServers: the Go client, embedded and dialed to one of
// three real servers, creates a group, runs transfers in it, writes a
// member with a plain put (through the group), is refused a put changing
// the placement tag of a member of a tag collection and a general
// transaction over a member (not retried), and deletes the group; the
// members' shards hold the group's values after.
func TestGroupsOverServers(t *testing.T) {
	servers, _ := startServers(t)
	remote, err := groupkv.Dial(servers[1].Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer remote.Close()
	embedded, err := groupkv.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer embedded.Close()
	for name, db := range map[string]groupkv.DB{"remote": remote, "embedded": embedded} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if _, err := db.CreateCollection(ctx, groupkv.CollectionOptions{Name: "p", Shards: 4}); err != nil {
				t.Fatal(err)
			}
			key := func(i int) []byte { return []byte(fmt.Sprintf("p%d", i)) }
			var members []groupkv.KeyRef
			for i := range 5 {
				if err := whileUnavailable(func() error {
					_, err := db.Put(ctx, groupkv.PutRequest{Collection: "p", Key: key(i), Value: []byte("10")})
					return err
				}); err != nil {
					t.Fatal(err)
				}
				members = append(members, groupkv.KeyRef{Collection: "p", Key: key(i)})
			}
			// A key of a tag collection, placed by its first tag.
			if _, err := db.CreateCollection(ctx, groupkv.CollectionOptions{Name: "t", Partitioning: groupkv.PartitionTag, Shards: 4}); err != nil {
				t.Fatal(err)
			}
			tagged := groupkv.KeyRef{Collection: "t", Key: []byte("tp")}
			if err := whileUnavailable(func() error {
				_, err := db.Put(ctx, groupkv.PutRequest{Collection: "t", Key: tagged.Key, Value: []byte("t0"), Tags: []string{"team"}})
				return err
			}); err != nil {
				t.Fatal(err)
			}
			members = append(members, tagged)
			// The first creation also creates the system collection of
			// group ids, whose shard may still be electing a leader: an
			// unavailable answer is retried (the same creation asked again
			// goes on with the group it registered).
			var created groupkv.GroupCreated
			for try := 0; try < 100; try++ {
				created, err = db.CreateGroup(ctx, groupkv.GroupSpec{ID: "room", Leader: members[0], Members: members[1:]})
				if groupkv.CodeOf(err) != groupkv.CodeUnavailable {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil || len(created.Joined) != 6 {
				t.Fatalf("create: %+v %v", created, err)
			}
			for i := range 4 {
				err := whileUnavailable(func() error {
					return db.Group("room").Transact(ctx, func(tx *groupkv.Tx) error {
						a, err := tx.Get(ctx, groupkv.GetRequest{Collection: "p", Key: key(i)})
						if err != nil {
							return err
						}
						b, err := tx.Get(ctx, groupkv.GetRequest{Collection: "p", Key: key(i + 1)})
						if err != nil {
							return err
						}
						x, _ := strconv.Atoi(string(a.Value))
						y, _ := strconv.Atoi(string(b.Value))
						var tags []string // a group write sets tags as a plain put does
						if i == 0 {
							tags = []string{"moved"}
						}
						if err := tx.Put(ctx, groupkv.PutRequest{Collection: "p", Key: key(i), Value: []byte(strconv.Itoa(x - 1)), Tags: tags}); err != nil {
							return err
						}
						return tx.Put(ctx, groupkv.PutRequest{Collection: "p", Key: key(i + 1), Value: []byte(strconv.Itoa(y + 1))})
					})
				})
				if err != nil {
					t.Fatalf("transfer %d: %v", i, err)
				}
			}
			var info groupkv.GroupInfo
			err = whileUnavailable(func() (err error) { info, err = db.DescribeGroup(ctx, "room"); return err })
			if err != nil || info.State != groupkv.GroupActive || len(info.Members) != 6 {
				t.Fatalf("describe: %+v %v", info, err)
			}
			if err := whileUnavailable(func() error {
				_, err := db.Put(ctx, groupkv.PutRequest{Collection: "p", Key: []byte("p4"), Value: []byte("11"), Tags: []string{"late"}})
				return err
			}); err != nil {
				t.Fatalf("plain put of a member: %v", err)
			}
			// The tag collection's key keeps its placement tag first.
			if err := whileUnavailable(func() error {
				_, err := db.Put(ctx, groupkv.PutRequest{Collection: "t", Key: tagged.Key, Value: []byte("t1"), Tags: []string{"team", "x"}})
				return err
			}); err != nil {
				t.Fatalf("plain put of the tag collection's member: %v", err)
			}
			err = db.Group("room").Transact(ctx, func(tx *groupkv.Tx) error {
				return tx.Put(ctx, groupkv.PutRequest{Collection: "t", Key: tagged.Key, Value: []byte("t2"), Tags: []string{"other"}})
			})
			if groupkv.CodeOf(err) != groupkv.CodePlacementTagChanged {
				t.Fatalf("a group put changing the placement tag: %v, want placement_tag_changed", err)
			}
			calls := 0
			err = db.Transact(ctx, func(tx *groupkv.Tx) error {
				calls++
				return tx.Put(ctx, groupkv.PutRequest{Collection: "p", Key: key(2), Value: []byte("0")})
			})
			if !errors.Is(err, groupkv.ErrKeyInGroup) || calls != 1 {
				t.Fatalf("a general transaction over a member: %v after %d calls, want key_in_group at once", err, calls)
			}
			if err := whileUnavailable(func() error { return db.DeleteGroup(ctx, "room") }); err != nil {
				t.Fatalf("delete: %v", err)
			}
			var tr groupkv.Record
			err = whileUnavailable(func() (err error) {
				tr, err = db.Get(ctx, groupkv.GetRequest{Collection: "t", Key: tagged.Key})
				return err
			})
			if err != nil || string(tr.Value) != "t1" || !slices.Equal(tr.Tags, []string{"team", "x"}) {
				t.Fatalf("tp after the delete: %q tags %q %v, want t1 tags [team x]", tr.Value, tr.Tags, err)
			}
			want := []string{"9", "10", "10", "10", "11"}
			wantTags := [][]string{{"moved"}, nil, nil, nil, {"late"}}
			for i, w := range want {
				var r groupkv.Record
				err := whileUnavailable(func() (err error) { r, err = db.Get(ctx, groupkv.GetRequest{Collection: "p", Key: key(i)}); return err })
				if err != nil || string(r.Value) != w || !slices.Equal(r.Tags, wantTags[i]) {
					t.Fatalf("%s after the delete: %q tags %q %v, want %s tags %q", key(i), r.Value, r.Tags, err, w, wantTags[i])
				}
			}
		})
	}
}

// whileUnavailable runs f until it answers something other than
// unavailable (not performed: a shard electing a leader), for a while.
func whileUnavailable(f func() error) error {
	var err error
	for try := 0; try < 100; try++ {
		if err = f(); groupkv.CodeOf(err) != groupkv.CodeUnavailable {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}
