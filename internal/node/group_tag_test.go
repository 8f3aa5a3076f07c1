package node

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/group"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/shard"
)

// TestGroupTagCollection: keys of a tag collection join a group. Their
// placements are pinned in their home shards while the group holds them:
// the group's writes keep the placement tag first, a put that would move
// a deleted member elsewhere is refused, plain writes of a member go to
// the group's leader, and reads see the group's values. Deleting the group
// removes the pins and leaves its last writes in the records' shards.
func TestGroupTagCollection(t *testing.T) {
	n := openTagTest(t)
	t.Cleanup(func() { n.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "c", Partitioning: kv.PartitionHash, Shards: 2}); err != nil {
		t.Fatal(err)
	}
	d, err := n.collection("tc")
	if err != nil {
		t.Fatal(err)
	}
	ref := func(k string) kv.KeyRef { return kv.KeyRef{Collection: "tc", Key: []byte(k)} }
	put := func(k, v string, tags ...string) error {
		_, err := n.Put(ctx, kv.PutRequest{Collection: "tc", Key: []byte(k), Value: []byte(v), Tags: tags})
		return err
	}
	if err := put("a", "a0", "team-a", "x"); err != nil {
		t.Fatal(err)
	}
	if err := put("b", "b0", "team-b"); err != nil {
		t.Fatal(err)
	}
	pinned := func(k string) (string, bool) {
		t.Helper()
		p, err := n.placementPinOf(ctx, d, []byte(k))
		if err != nil {
			t.Fatal(err)
		}
		return p.Tag, p.Pin != ""
	}
	// "n" was never put: the group places it by its key.
	created, err := n.CreateGroup(ctx, kv.GroupSpec{ID: "g", Leader: kv.KeyRef{Collection: "c", Key: []byte("leader")},
		Members: []kv.KeyRef{ref("a"), ref("b"), ref("n")}, Mode: kv.GroupAtomic})
	if err != nil {
		t.Fatal(err)
	}
	if len(created.Joined) != 4 {
		t.Fatalf("joined %d keys, want 4: %+v", len(created.Joined), created)
	}
	for k, want := range map[string]string{"a": "team-a", "b": "team-b", "n": ""} {
		if tag, ok := pinned(k); !ok || tag != want {
			t.Fatalf("%s: placement %q pinned %v, want %q pinned", k, tag, ok, want)
		}
	}

	get := func(when, k, value string, tags ...string) {
		t.Helper()
		r, err := n.Get(ctx, kv.GetRequest{Collection: "tc", Key: []byte(k)})
		if value == "" {
			if kv.CodeOf(err) != kv.CodeNotFound {
				t.Fatalf("%s: get %s: %q %v, want not found", when, k, r.Value, err)
			}
		} else if err != nil || string(r.Value) != value || !slices.Equal(r.Tags, tags) {
			t.Fatalf("%s: get %s: %q tags %q (%v), want %q tags %q", when, k, r.Value, r.Tags, err, value, tags)
		}
		res, err := n.BatchGet(ctx, []kv.KeyRef{ref(k)})
		if err != nil || res.Items[0].Found != (value != "") || string(res.Items[0].Value) != value || !slices.Equal(res.Items[0].Tags, tags) {
			t.Fatalf("%s: batch get %s: %+v (%v), want %q tags %q", when, k, res.Items, err, value, tags)
		}
	}
	tagged := func(when, tag string, want ...string) {
		t.Helper()
		res, err := n.GetByTags(ctx, kv.TagQuery{Collection: "tc", All: []string{tag}})
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, it := range res.Items {
			keys = append(keys, string(it.Key))
		}
		if !slices.Equal(keys, want) {
			t.Fatalf("%s: tag %q lists %q, want %q", when, tag, keys, want)
		}
	}

	// The group's writes keep each key's placement tag first.
	if _, _, err := groupTransact(ctx, n, "g", func(a string) error {
		if err := n.TxnPut(ctx, a, kv.PutItem{Collection: "tc", Key: []byte("b"), Value: []byte("b1"), Tags: []string{"team-c"}}); kv.CodeOf(err) != kv.CodePlacementTagChanged {
			t.Errorf("a group put moving b to team-c: %v, want placement_tag_changed", err)
		}
		if err := n.TxnPut(ctx, a, kv.PutItem{Collection: "tc", Key: []byte("n"), Value: []byte("n1"), Tags: []string{"t"}}); kv.CodeOf(err) != kv.CodePlacementTagChanged {
			t.Errorf("a group put of n (placed by its key) with tags: %v, want placement_tag_changed", err)
		}
		if err := n.TxnPut(ctx, a, kv.PutItem{Collection: "tc", Key: []byte("n"), Value: []byte("n1")}); err != nil {
			return err
		}
		return n.TxnPut(ctx, a, kv.PutItem{Collection: "tc", Key: []byte("a"), Value: []byte("a1"), Tags: []string{"team-a", "y"}})
	}); err != nil {
		t.Fatal(err)
	}
	get("after a group transaction", "a", "a1", "team-a", "y")
	get("after a group transaction", "n", "n1")
	tagged("after a group transaction", "y", "a")
	tagged("after a group transaction", "x")

	// Plain writes of members go to the group's leader.
	if err := put("a", "a2", "team-a", "z"); err != nil {
		t.Fatal(err)
	}
	get("after a plain put", "a", "a2", "team-a", "z")
	tagged("after a plain put", "z", "a")
	if err := put("a", "a3", "team-z"); kv.CodeOf(err) != kv.CodePlacementTagChanged {
		t.Fatalf("a plain put moving a member: %v, want placement_tag_changed", err)
	}
	if _, err := n.Delete(ctx, kv.DeleteRequest{Collection: "tc", Key: []byte("b")}); err != nil {
		t.Fatal(err)
	}
	get("after a plain delete", "b", "")
	// Deleted, b would move with a put of another first tag; in the group
	// it keeps its placement.
	if err := put("b", "b2", "team-q"); kv.CodeOf(err) != kv.CodePlacementTagChanged {
		t.Fatalf("a plain put moving a deleted member: %v, want placement_tag_changed", err)
	}
	if tag, ok := pinned("b"); !ok || tag != "team-b" {
		t.Fatalf("b: placement %q pinned %v, want team-b pinned", tag, ok)
	}
	// Batches and general transactions do not touch members.
	if _, err := n.BatchPut(ctx, []kv.PutItem{{Collection: "tc", Key: []byte("a"), Value: []byte("x"), Tags: []string{"team-a"}}, {Collection: "tc", Key: []byte("other"), Value: []byte("x")}}); kv.CodeOf(err) != kv.CodeKeyInGroup {
		t.Fatalf("a batch with a member: %v, want key_in_group", err)
	}
	if err := commitTxn(ctx, n, func(id string) error {
		_, _, err := n.TxnGet(ctx, id, ref("a"))
		return err
	}); kv.CodeOf(err) != kv.CodeKeyInGroup {
		t.Fatalf("a transaction reading a member: %v, want key_in_group", err)
	}
	if err := commitTxn(ctx, n, func(id string) error {
		return n.TxnPut(ctx, id, kv.PutItem{Collection: "tc", Key: []byte("b"), Value: []byte("x"), Tags: []string{"team-q"}})
	}); kv.CodeOf(err) != kv.CodeKeyInGroup {
		t.Fatalf("a transaction moving a deleted member: %v, want key_in_group", err)
	}
	// A key a group holds joins no other group.
	other, err := n.CreateGroup(ctx, kv.GroupSpec{ID: "g2", Leader: kv.KeyRef{Collection: "c", Key: []byte("leader2")},
		Members: []kv.KeyRef{ref("a")}, Mode: kv.GroupBestEffort})
	if err != nil || len(other.Refused) != 1 {
		t.Fatalf("a second group asking for a: %+v %v, want a refused", other, err)
	}
	if err := n.DeleteGroup(ctx, "g2"); err != nil {
		t.Fatal(err)
	}

	if err := n.DeleteGroup(ctx, "g"); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"a", "b", "n"} {
		if _, ok := pinned(k); ok {
			t.Fatalf("%s is still pinned after its group was deleted", k)
		}
	}
	get("after the delete", "a", "a2", "team-a", "z")
	get("after the delete", "b", "")
	get("after the delete", "n", "n1")
	tagged("after the delete", "z", "a")
	tagged("after the delete", "team-a", "a")
	// The record of a is in the shard of its placement, as a plain put
	// would have left it.
	_, i := d.Route([]byte("a"), "team-a")
	if live, err := n.liveIn(ctx, d, d.Shards[i].ID, []byte("a")); err != nil || !live {
		t.Fatalf("a is not live in the shard of its placement: %v %v", live, err)
	}
	// Free again, b moves.
	if err := put("b", "b3", "team-q"); err != nil {
		t.Fatal(err)
	}
	get("after the move", "b", "b3", "team-q")
	tagged("after the move", "team-q", "b")
	if tag, ok := pinned("b"); ok || tag != "team-q" {
		t.Fatalf("b: placement %q pinned %v, want team-q unpinned", tag, ok)
	}

	// A pin that outlived its group (its yield never came) is removed by
	// the next J of the key, or by a put that would move the key.
	leftover := func(k string) {
		t.Helper()
		p, err := n.placementPinOf(ctx, d, []byte(k))
		if err != nil {
			t.Fatal(err)
		}
		hb, home := homeOf(d, []byte(k))
		res, err := n.propose(ctx, home, shard.EncodePlace(shard.Placement{Bucket: hb, Key: []byte(k), HasOld: p.OK, Old: p.Tag, New: p.Tag, Op: shard.PlacePin, Pin: "ghost#1@s99"}))
		if err != nil || res.Err != nil {
			t.Fatalf("pinning %s: %v %v", k, err, res.Err)
		}
	}
	leftover("a")
	if _, err := n.CreateGroup(ctx, kv.GroupSpec{ID: "g3", Leader: kv.KeyRef{Collection: "c", Key: []byte("leader3")}, Members: []kv.KeyRef{ref("a")}, Mode: kv.GroupAtomic}); err != nil {
		t.Fatalf("a group asking for a key with a leftover pin: %v", err)
	}
	if err := n.DeleteGroup(ctx, "g3"); err != nil {
		t.Fatal(err)
	}
	leftover("b")
	if _, err := n.Delete(ctx, kv.DeleteRequest{Collection: "tc", Key: []byte("b")}); err != nil {
		t.Fatal(err)
	}
	if err := put("b", "b4", "team-r"); kv.CodeOf(err) != kv.CodeUnavailable {
		t.Fatalf("a put moving a key with a leftover pin: %v, want unavailable (retry)", err)
	}
	if err := put("b", "b4", "team-r"); err != nil {
		t.Fatalf("the put again: %v", err)
	}
	get("after a leftover pin", "b", "b4", "team-r")
	for _, k := range []string{"a", "b"} {
		if _, ok := pinned(k); ok {
			t.Fatalf("%s is still pinned", k)
		}
	}
}

// TestGroupTagCollectionFourNodes: on four nodes with two replicas a
// shard, no node holds every shard of the tag collection: placements are
// read and pinned in home shards elsewhere, and a plain get of a member
// (read in parts) answers the group's value.
func TestGroupTagCollectionFourNodes(t *testing.T) {
	c := startCluster(t, 4, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n1 := c.node(1).n
	for _, o := range []kv.CollectionOptions{{Name: "tc", Partitioning: kv.PartitionTag, Shards: 4, Replicas: 2}, {Name: "l", Partitioning: kv.PartitionRange, Replicas: 2}} {
		if _, err := n1.CreateCollection(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	members := putMembers(ctx, c, n1, "tc", func(i int) []string { return []string{fmt.Sprintf("team-%d", i%3)} })
	d, _ := n1.collection("tc")
	var outsider *Node // a node missing a shard of the tag collection
	for _, tn := range c.nodes {
		for _, s := range d.Shards {
			if !tn.n.hasReplica(s.ID) {
				outsider = tn.n
			}
		}
	}
	if outsider == nil {
		t.Fatal("every node holds every shard")
	}
	c.eventually(60*time.Second, "the group is created", func() error {
		_, err := outsider.CreateGroup(ctx, kv.GroupSpec{ID: "g", Leader: kv.KeyRef{Collection: "l", Key: []byte("lead")}, Members: members})
		return err
	})
	// Nothing is shipped while the transfers run: the members' shards keep
	// their values from before the group, and a plain get must read the
	// group's.
	var hold atomic.Bool
	hold.Store(true)
	hook := func(msg group.Message) bool { return hold.Load() && msg.Type == group.MsgShip }
	for _, tn := range c.nodes {
		tn.n.groups.sent.Store(&hook)
	}
	expect := []int{5, 5, 5, 5, 5, 5, 5, 5}
	for i := range 8 {
		b := members[(i+3)%8]
		if err := groupTransfer(ctx, outsider, "g", members[i], b); err != nil {
			t.Fatalf("transfer %d: %v", i, err)
		}
		// Read back through a plain get, from the node missing a shard.
		r, err := outsider.Get(ctx, kv.GetRequest{Collection: "tc", Key: b.Key})
		if err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("team-%d", ((i+3)%8)%3)
		expect[i]--
		expect[(i+3)%8]++
		if len(r.Tags) != 1 || r.Tags[0] != want || string(r.Value) != strconv.Itoa(expect[(i+3)%8]) {
			t.Fatalf("transfer %d: %s has %q tags %q, want the group's value %d, tags [%s]", i, b.Key, r.Value, r.Tags, expect[(i+3)%8], want)
		}
	}
	sum := func(n *Node) int {
		total := 0
		for _, m := range members {
			r, err := n.Get(ctx, kv.GetRequest{Collection: "tc", Key: m.Key})
			if err != nil {
				t.Fatal(err)
			}
			x, _ := strconv.Atoi(string(r.Value))
			total += x
		}
		return total
	}
	if s := sum(outsider); s != 40 {
		t.Fatalf("total in the group: %d, want 40", s)
	}
	hold.Store(false)
	c.eventually(60*time.Second, "the group is deleted", func() error { return outsider.DeleteGroup(ctx, "g") })
	for _, tn := range c.nodes {
		if s := sum(tn.n); s != 40 {
			t.Fatalf("total after the delete on node %d: %d, want 40", tn.n.id, s)
		}
	}
	for _, m := range members {
		p, err := n1.placementPinOf(ctx, d, m.Key)
		if err != nil || p.Pin != "" {
			t.Fatalf("%s: placement %+v (%v) after the delete, want unpinned", m.Key, p, err)
		}
	}
}

// TestGroupScanInPartsSeesGroupWrites: on four nodes with one replica a
// shard, no node holds every shard of the collection, so a scan or tag
// query of the present is read in parts on several nodes. Right after a
// group transaction commits, each must answer the group's values, as a
// scan read on one node does: every part waits for the group's writes to
// its keys to be shipped before the read's version is picked.
func TestGroupScanInPartsSeesGroupWrites(t *testing.T) {
	c := startCluster(t, 4, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n1 := c.node(1).n
	for _, o := range []kv.CollectionOptions{{Name: "acct", Partitioning: kv.PartitionHash, Shards: 4, Replicas: 1}, {Name: "l", Partitioning: kv.PartitionRange, Replicas: 1}} {
		if _, err := n1.CreateCollection(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	members := putMembers(ctx, c, n1, "acct", func(int) []string { return []string{"acct"} })
	d, _ := n1.collection("acct")
	for _, tn := range c.nodes {
		all := true
		for _, s := range d.Shards {
			all = all && tn.n.hasReplica(s.ID)
		}
		if all {
			t.Fatalf("node %d holds every shard of the collection: its scans are not read in parts", tn.n.id)
		}
	}
	c.eventually(60*time.Second, "the group is created", func() error {
		_, err := n1.CreateGroup(ctx, kv.GroupSpec{ID: "g", Leader: kv.KeyRef{Collection: "l", Key: []byte("lead")}, Members: members})
		return err
	})
	var reads []kv.TxnOp
	for _, m := range members {
		reads = append(reads, kv.TxnOp{Op: kv.TxnOpGet, Collection: m.Collection, Key: m.Key})
	}
	for i := range 12 {
		tn := c.nodes[i%len(c.nodes)].n
		if err := groupTransfer(ctx, tn, "g", members[i%8], members[(i+3)%8]); err != nil {
			t.Fatalf("transfer %d: %v", i, err)
		}
		held, err := tn.ExecGroupTxn(ctx, "g", kv.ExecRequest{Then: reads})
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{}
		for j, m := range members {
			want[string(m.Key)] = string(held.Results[j].Value)
		}
		check := func(what string, items []kv.Record) {
			t.Helper()
			if len(items) != len(members) {
				t.Fatalf("transfer %d: %s on node %d: %d records, want %d", i, what, tn.id, len(items), len(members))
			}
			for _, r := range items {
				if w := want[string(r.Key)]; string(r.Value) != w {
					t.Fatalf("transfer %d: %s on node %d read %s = %q, the group holds %q", i, what, tn.id, r.Key, r.Value, w)
				}
			}
		}
		scanned, err := tn.Scan(ctx, kv.ScanRequest{Collection: "acct"})
		if err != nil {
			t.Fatal(err)
		}
		check("a scan", scanned.Items)
		tagged, err := tn.GetByTags(ctx, kv.TagQuery{Collection: "acct", All: []string{"acct"}})
		if err != nil {
			t.Fatal(err)
		}
		check("a tag query", tagged.Items)
	}
}
