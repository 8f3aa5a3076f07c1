package node

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/shard"
)

func encodeMove(coll string, shardID, from, to uint64) []byte {
	return shard.EncodeMoveShardReplica(coll, shardID, from, to)
}

// spreadModel is what a collection should hold: key -> value and tags.
type spreadModel map[string]kv.Record

func (m spreadModel) sorted(start, end string, reverse bool) []kv.Record {
	var out []kv.Record
	for k, r := range m {
		if k >= start && (end == "" || k < end) {
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return keyBefore(out[i].Key, out[j].Key, reverse) })
	return out
}

func sameRecords(got, want []kv.Record) error {
	if len(got) != len(want) {
		return fmt.Errorf("%d records, want %d (got %s)", len(got), len(want), keysOf(got))
	}
	for i := range want {
		g, w := got[i], want[i]
		if !bytes.Equal(g.Key, w.Key) || !bytes.Equal(g.Value, w.Value) || strings.Join(g.Tags, ",") != strings.Join(w.Tags, ",") {
			return fmt.Errorf("record %d is %q=%q %v, want %q=%q %v", i, g.Key, g.Value, g.Tags, w.Key, w.Value, w.Tags)
		}
	}
	return nil
}

func keysOf(rs []kv.Record) string {
	var ks []string
	for _, r := range rs {
		ks = append(ks, string(r.Key))
	}
	return strings.Join(ks, " ")
}

// scanAll pages through a scan with limit and checks every page reads the
// version of the first.
func scanAll(ctx context.Context, n *Node, req kv.ScanRequest) ([]kv.Record, error) {
	var out []kv.Record
	var version uint64
	for pages := 0; pages < 1000; pages++ {
		res, err := n.Scan(ctx, req)
		if err != nil {
			return nil, err
		}
		if version != 0 && res.Version != version {
			return nil, fmt.Errorf("page %d read version %d, the first page %d", pages, res.Version, version)
		}
		version = res.Version
		out = append(out, res.Items...)
		if res.NextPage == "" {
			return out, nil
		}
		req.Page = res.NextPage
	}
	return nil, fmt.Errorf("more than 1000 pages")
}

func queryAll(ctx context.Context, n *Node, q kv.TagQuery) ([]kv.Record, error) {
	var out []kv.Record
	for pages := 0; pages < 1000; pages++ {
		res, err := n.GetByTags(ctx, q)
		if err != nil {
			return nil, err
		}
		out = append(out, res.Items...)
		if res.NextPage == "" {
			return out, nil
		}
		q.Page = res.NextPage
	}
	return nil, fmt.Errorf("more than 1000 pages")
}

// TestClusterReadsOverSeveralNodes lays out three collections (hash, tag,
// range) of four shards at three replicas on four nodes, so that no node
// holds every shard of any of them and every node holds some: scans
// (paged, reverse, bounded, at an older version), tag queries, batch gets,
// gets and puts of a tag collection (whose placement index and records may
// be on other nodes), delete ranges and watches through every node return
// what was written.
func TestClusterReadsOverSeveralNodes(t *testing.T) {
	c := startCluster(t, 4, nil)
	ctx := context.Background()
	colls := []kv.CollectionOptions{
		{Name: "h", Shards: 4, Replicas: 3},
		{Name: "t", Partitioning: kv.PartitionTag, Shards: 4, Replicas: 3},
		{Name: "r", Partitioning: kv.PartitionRange, Replicas: 3, SplitPoints: [][]byte{[]byte("k10"), []byte("k25"), []byte("k40")}},
	}
	for _, opts := range colls {
		if _, err := c.node(1).n.CreateCollection(ctx, opts); err != nil {
			t.Fatal(err)
		}
	}
	// The layout this test is about: per collection, every node holds some
	// of its shards and none holds all.
	for _, opts := range colls {
		d, _ := c.node(1).n.collection(opts.Name)
		for _, tn := range c.nodes {
			held := 0
			for _, s := range d.Shards {
				for _, r := range s.Replicas {
					if r.Node == tn.id {
						held++
					}
				}
			}
			if held == 0 || held == len(d.Shards) {
				t.Fatalf("collection %s: node %d holds %d of its %d shards; want some but not all", opts.Name, tn.id, held, len(d.Shards))
			}
		}
	}

	// Watches start below the first write (a watch from version 1 would
	// be compacted once garbage collection ran: versions are timestamps).
	before, err := c.node(1).n.latest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	models := map[string]spreadModel{"h": {}, "t": {}, "r": {}}
	put := func(via *Node, coll, key, value string, tags ...string) uint64 {
		t.Helper()
		v, err := via.Put(ctx, kv.PutRequest{Collection: coll, Key: []byte(key), Value: []byte(value), Tags: tags})
		if err != nil {
			t.Fatalf("put %s/%s through node %d: %v", coll, key, via.ID(), err)
		}
		models[coll][key] = kv.Record{Key: []byte(key), Value: []byte(value), Tags: tags, Version: v}
		return v
	}
	del := func(via *Node, coll, key string) {
		t.Helper()
		if _, err := via.Delete(ctx, kv.DeleteRequest{Collection: coll, Key: []byte(key)}); err != nil {
			t.Fatalf("delete %s/%s through node %d: %v", coll, key, via.ID(), err)
		}
		delete(models[coll], key)
	}
	for i := 0; i < 60; i++ {
		via := c.nodes[i%4].n
		key := fmt.Sprintf("k%02d", i)
		put(via, "h", key, "h"+key)
		put(via, "r", key, "r"+key)
		parity := []string{"even", "odd"}[i%2]
		put(via, "t", key, "t"+key, fmt.Sprintf("p%d", i%5), parity)
	}
	old := map[string]spreadModel{}
	var oldVersion uint64
	for name, m := range models {
		old[name] = spreadModel{}
		for k, r := range m {
			old[name][k] = r
			oldVersion = max(oldVersion, r.Version)
		}
	}
	// Later changes: deletes, overwrites, and keys of the tag collection
	// placed again under another tag (deleted, then put with another first
	// tag), through other nodes.
	for i := 0; i < 60; i += 7 {
		via := c.nodes[(i+1)%4].n
		key := fmt.Sprintf("k%02d", i)
		del(via, "h", key)
		del(via, "r", key)
		del(via, "t", key)
		put(c.nodes[(i+2)%4].n, "t", key, "moved"+key, "p9", "even")
		put(via, "h", key+"x", "new")
	}
	for i := 3; i < 60; i += 11 {
		put(c.nodes[i%4].n, "h", fmt.Sprintf("k%02d", i), "over")
	}

	for _, tn := range c.nodes {
		n := tn.n
		for _, name := range []string{"h", "t", "r"} {
			m := models[name]
			for _, limit := range []int{1000, 7} {
				for _, reverse := range []bool{false, true} {
					got, err := scanAll(ctx, n, kv.ScanRequest{Collection: name, Limit: limit, Reverse: reverse})
					if err == nil {
						err = sameRecords(got, m.sorted("", "", reverse))
					}
					if err != nil {
						t.Fatalf("node %d: scan of %s (limit %d, reverse %v): %v", tn.id, name, limit, reverse, err)
					}
				}
			}
			got, err := scanAll(ctx, n, kv.ScanRequest{Collection: name, Start: []byte("k12"), End: []byte("k41"), Limit: 5})
			if err == nil {
				err = sameRecords(got, m.sorted("k12", "k41", false))
			}
			if err != nil {
				t.Fatalf("node %d: bounded scan of %s: %v", tn.id, name, err)
			}
			got, err = scanAll(ctx, n, kv.ScanRequest{Collection: name, Version: oldVersion, Limit: 9})
			if err == nil {
				err = sameRecords(got, old[name].sorted("", "", false))
			}
			if err != nil {
				t.Fatalf("node %d: scan of %s at version %d: %v", tn.id, name, oldVersion, err)
			}
		}
		// Tag queries.
		for _, q := range []kv.TagQuery{{All: []string{"even"}}, {All: []string{"p1", "odd"}}, {Any: []string{"p2", "p9"}}} {
			q.Collection, q.Limit = "t", 4
			var want []kv.Record
			for _, r := range models["t"].sorted("", "", false) {
				if hasTags(r.Tags, append(q.All, q.Any...), len(q.All) > 0) {
					want = append(want, r)
				}
			}
			got, err := queryAll(ctx, n, q)
			if err == nil {
				err = sameRecords(got, want)
			}
			if err != nil {
				t.Fatalf("node %d: tag query %+v: %v", tn.id, q, err)
			}
		}
		// Batch gets over every collection, gets of the tag collection.
		var refs []kv.KeyRef
		for i := 0; i < 62; i += 3 {
			for _, name := range []string{"h", "t", "r"} {
				refs = append(refs, kv.KeyRef{Collection: name, Key: []byte(fmt.Sprintf("k%02d", i))})
			}
		}
		res, err := n.BatchGet(ctx, refs)
		if err != nil {
			t.Fatalf("node %d: batch get: %v", tn.id, err)
		}
		for i, it := range res.Items {
			want, ok := models[refs[i].Collection][string(refs[i].Key)]
			if it.Found != ok || ok && (!bytes.Equal(it.Value, want.Value) || it.Version != want.Version) {
				t.Fatalf("node %d: batch get of %s/%s: %+v, want %+v (found %v)", tn.id, refs[i].Collection, refs[i].Key, it, want, ok)
			}
		}
		for i := 0; i < 62; i++ {
			key := fmt.Sprintf("k%02d", i)
			r, err := n.Get(ctx, kv.GetRequest{Collection: "t", Key: []byte(key)})
			want, ok := models["t"][key]
			if ok && (err != nil || !bytes.Equal(r.Value, want.Value) || r.Version != want.Version) || !ok && kv.CodeOf(err) != kv.CodeNotFound {
				t.Fatalf("node %d: get t/%s = %+v, %v; want %+v (found %v)", tn.id, key, r, err, want, ok)
			}
			if i%7 == 0 && i < 60 {
				// At the older version the key was still placed by its first tag.
				r, err := n.Get(ctx, kv.GetRequest{Collection: "t", Key: []byte(key), Version: oldVersion})
				if want := old["t"][key]; err != nil || !bytes.Equal(r.Value, want.Value) {
					t.Fatalf("node %d: get t/%s at version %d = %+v, %v; want %+v", tn.id, key, oldVersion, r, err, want)
				}
			}
		}
		// A put that would change a live record's placement is refused
		// wherever the placement index and the record are.
		if _, err := n.Put(ctx, kv.PutRequest{Collection: "t", Key: []byte("k01"), Value: []byte("x"), Tags: []string{"p4"}}); kv.CodeOf(err) != kv.CodePlacementTagChanged {
			t.Fatalf("node %d: a put moving a live record's placement: %v", tn.id, err)
		}
	}

	// Watches through every node deliver every change in (version, key)
	// order, ending in the models.
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	delivered := map[string][]kv.Event{} // of node 1, by collection
	for _, tn := range c.nodes {
		for _, name := range []string{"h", "t", "r"} {
			state := map[string]string{}
			var lastV uint64
			var lastK []byte
			errDone := fmt.Errorf("done")
			var progress bool
			err := tn.n.Watch(wctx, kv.WatchRequest{Collection: name, FromVersion: before}, func(ev kv.Event) error {
				if ev.Type == kv.EventProgress {
					if ev.Version < lastV {
						return fmt.Errorf("progress %d after an event at %d", ev.Version, lastV)
					}
					progress = true
					lastV, lastK = ev.Version, nil
				} else {
					if ev.Version < lastV || ev.Version == lastV && lastK != nil && bytes.Compare(ev.Key, lastK) <= 0 {
						return fmt.Errorf("event %s@%d after %s@%d", ev.Key, ev.Version, lastK, lastV)
					}
					lastV, lastK = ev.Version, ev.Key
					if tn.id == 1 {
						delivered[name] = append(delivered[name], ev)
					}
					if ev.Type == kv.EventPut {
						state[string(ev.Key)] = string(ev.Value)
					} else {
						delete(state, string(ev.Key))
					}
				}
				if !progress || len(state) != len(models[name]) {
					return nil
				}
				for k, r := range models[name] {
					if state[k] != string(r.Value) {
						return nil
					}
				}
				return errDone
			})
			if err != errDone {
				t.Fatalf("node %d: watch of %s: %v (state %d keys, want %d)", tn.id, name, err, len(state), len(models[name]))
			}
		}
	}

	// A watch resumed after an event, through another node, continues with
	// the next one.
	for _, name := range []string{"h", "t"} {
		all := delivered[name]
		from := all[len(all)/3]
		rest := all[len(all)/3+1:]
		var got []kv.Event
		errDone := fmt.Errorf("done")
		err := c.node(3).n.Watch(wctx, kv.WatchRequest{Collection: name, FromVersion: from.Version, AfterKey: from.Key}, func(ev kv.Event) error {
			if ev.Type != kv.EventProgress {
				got = append(got, ev)
			}
			if len(got) == len(rest) {
				return errDone
			}
			return nil
		})
		if err != errDone {
			t.Fatalf("resumed watch of %s: %v", name, err)
		}
		for i := range rest {
			if got[i].Version != rest[i].Version || !bytes.Equal(got[i].Key, rest[i].Key) || got[i].Type != rest[i].Type {
				t.Fatalf("resumed watch of %s: event %d is %s %s@%d, want %s %s@%d", name, i, got[i].Type, got[i].Key, got[i].Version, rest[i].Type, rest[i].Key, rest[i].Version)
			}
		}
	}

	// A delete range over every shard of the range collection, through a
	// node holding some of them.
	want := len(models["r"].sorted("k05", "k50", false))
	dr, err := c.node(2).n.DeleteRange(ctx, kv.DeleteRangeRequest{Collection: "r", Start: []byte("k05"), End: []byte("k50")})
	if err != nil || dr.Deleted != want {
		t.Fatalf("delete range: %+v, %v; want %d deleted", dr, err, want)
	}
	for _, tn := range c.nodes {
		got, err := scanAll(ctx, tn.n, kv.ScanRequest{Collection: "r", Limit: 6})
		if err != nil || len(got) != len(models["r"])-want {
			t.Fatalf("node %d: %d records after the delete range, %v; want %d", tn.id, len(got), err, len(models["r"])-want)
		}
	}
}

// TestClusterWatchFollowsMoves watches, through node 1, a collection whose
// shards no node holds all of, while a replica node 1 reads for the watch
// moves to another node (and the rebalancer evens the counts again): the
// part reading it is planned again elsewhere and resumed after its last
// change, and the watch delivers every write once, in version order (a
// put tried again after commit_unknown may have written twice: both
// writes are delivered). On failure it tells which events were missed or
// repeated and what the parts of the watch did (watchTrace).
func TestClusterWatchFollowsMoves(t *testing.T) {
	c := startCluster(t, 4, nil)
	ctx := context.Background()
	if _, err := c.node(1).n.CreateCollection(ctx, kv.CollectionOptions{Name: "w", Shards: 4, Replicas: 2}); err != nil {
		t.Fatal(err)
	}
	d, _ := c.node(1).n.collection("w")
	var moving uint64
	var to uint64
	for _, s := range d.Shards {
		on1, nodes := false, map[uint64]bool{}
		for _, r := range s.Replicas {
			on1 = on1 || r.Node == 1
			nodes[r.Node] = true
		}
		if on1 && moving == 0 {
			moving = s.ID
			for _, tn := range c.nodes {
				if !nodes[tn.id] {
					to = tn.id
				}
			}
		}
	}
	if moving == 0 || to == 0 {
		t.Fatalf("node 1 holds no shard of w: %+v", d.Shards)
	}
	before, err := c.node(1).n.latest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// What the parts of the watch did, shown when it misses a write.
	var traceMu sync.Mutex
	var trace []string
	tf := func(s string) {
		traceMu.Lock()
		trace = append(trace, time.Now().Format("15:04:05.000")+" "+s)
		traceMu.Unlock()
	}
	watchTrace.Store(&tf)
	defer watchTrace.Store(nil)
	// The watch lives as long as the test; the deadline below only
	// catches a hang in delivering what was written (the move above can
	// take most of a minute on a busy machine).
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events := make(chan kv.Event, 1024)
	werr := make(chan error, 1)
	go func() {
		werr <- c.node(1).n.Watch(wctx, kv.WatchRequest{Collection: "w", FromVersion: before}, func(ev kv.Event) error {
			if ev.Type != kv.EventProgress {
				events <- ev
			}
			return nil
		})
	}()
	const total = 150
	// acked is the version each put answered. A try of a put that
	// answered commit_unknown may have been applied as well (the try after
	// it writes again): the watch delivers that write too.
	acked := map[string]uint64{}
	unknown := map[string]bool{}
	var moveAt uint64
	for i := 0; i < total; i++ {
		if i == 50 {
			moveAt, _ = c.node(1).n.latest(ctx)
			tf(fmt.Sprintf("test: moving shard %d from node 1 to node %d at about version %d", moving, to, moveAt))
			res, err := c.node(1).n.propose(ctx, 1, encodeMove("w", moving, 1, to))
			if err == nil && res.Err != nil {
				err = res.Err
			}
			if err != nil {
				t.Fatalf("moving shard %d from node 1 to node %d: %v", moving, to, err)
			}
		}
		if i == 100 {
			c.eventually(60*time.Second, "the move settled", func() error {
				if c.node(1).n.readable(moving) {
					return fmt.Errorf("node 1 still reads shard %d", moving)
				}
				return c.settledEverywhere("w")
			})
		}
		key := fmt.Sprintf("w%03d", i)
		c.eventually(30*time.Second, "a put", func() error {
			v, err := c.nodes[i%4].n.Put(ctx, kv.PutRequest{Collection: "w", Key: []byte(key), Value: []byte(key)})
			if err != nil {
				tf(fmt.Sprintf("test: put %s through node %d failed: %v", key, c.nodes[i%4].id, err))
				unknown[key] = unknown[key] || kv.CodeOf(err) == kv.CodeCommitUnknown
				return err
			}
			acked[key] = v
			return nil
		})
	}
	tf("test: the last put is written")
	// delivered holds the events delivered, by key@version; count the
	// acknowledged puts among them.
	delivered := map[string]bool{}
	at := func(key []byte, v uint64) string { return fmt.Sprintf("%s@%d", key, v) }
	count := 0
	var got []kv.Event
	var last kv.Event
	deliver := time.After(60 * time.Second)
	// explain tells which puts the watch missed, the events delivered
	// around them and what the parts of the watch did.
	explain := func(focus ...kv.Event) {
		t.Helper()
		d, _ := c.node(1).n.collection("w")
		t.Logf("shard %d moved from node 1 to node %d at about version %d; the watch started at %d; catalog now: %+v", moving, to, moveAt, before, d.Shards)
		shardOfKey := func(key []byte) uint64 {
			_, i := d.Route(key, "")
			return d.Shards[i].ID
		}
		around := func(v uint64) {
			i := sort.Search(len(got), func(i int) bool { return got[i].Version >= v })
			for j := max(0, i-3); j < min(len(got), i+3); j++ {
				t.Logf("  delivered around it: event %d %s@%d (shard %d)", j, got[j].Key, got[j].Version, shardOfKey(got[j].Key))
			}
		}
		for _, ev := range focus {
			t.Logf("event %s@%d (shard %d), put acknowledged at version %d (commit unknown before: %v)", ev.Key, ev.Version, shardOfKey(ev.Key), acked[string(ev.Key)], unknown[string(ev.Key)])
			around(ev.Version)
		}
		for i := 0; i < total && len(focus) == 0; i++ {
			key := fmt.Sprintf("w%03d", i)
			if delivered[at([]byte(key), acked[key])] {
				continue
			}
			r, err := c.node(1).n.Get(ctx, kv.GetRequest{Collection: "w", Key: []byte(key)})
			t.Logf("missing %s: put acknowledged at version %d, read %d (%v), shard %d", key, acked[key], r.Version, err, shardOfKey([]byte(key)))
			around(acked[key])
		}
		// The parts' rounds that read the versions of the missing puts,
		// and every start and end of a part.
		traceMu.Lock()
		for _, s := range trace {
			var from, to uint64
			if _, err := fmt.Sscanf(s[13:], "read %d %d", &from, &to); err == nil {
				covers := false
				for key, v := range acked {
					covers = covers || !delivered[at([]byte(key), v)] && from <= v && v <= to
				}
				for _, ev := range focus {
					covers = covers || from <= ev.Version && ev.Version <= to
				}
				if !covers {
					continue
				}
			} else if strings.Contains(s, " sent ") {
				mentioned := false
				for _, ev := range focus {
					mentioned = mentioned || strings.HasSuffix(s, fmt.Sprintf(" sent %s@%d", ev.Key, ev.Version))
				}
				if !mentioned {
					continue
				}
			}
			t.Log(s)
		}
		traceMu.Unlock()
		dumpCluster(t, c)
	}
	for count < total {
		select {
		case ev := <-events:
			got = append(got, ev)
			key := string(ev.Key)
			if ev.Type != kv.EventPut || delivered[at(ev.Key, ev.Version)] || ev.Version != acked[key] && !unknown[key] {
				explain(ev)
				t.Fatalf("event %s %s@%d (delivered before: %v; the put was acknowledged at %d)", ev.Type, ev.Key, ev.Version, delivered[at(ev.Key, ev.Version)], acked[key])
			}
			if ev.Version < last.Version || ev.Version == last.Version && bytes.Compare(ev.Key, last.Key) <= 0 {
				explain(ev, last)
				t.Fatalf("event %s@%d after %s@%d", ev.Key, ev.Version, last.Key, last.Version)
			}
			delivered[at(ev.Key, ev.Version)], last = true, ev
			if ev.Version == acked[key] {
				count++
			}
		case err := <-werr:
			explain()
			t.Fatalf("the watch ended after %d of %d puts: %v", count, total, err)
		case <-deliver:
			explain()
			t.Fatalf("the watch delivered %d of %d puts within a minute of the last", count, total)
		}
	}
}

// TestClusterReadAroundDownNode reads, through a node holding no replica of
// a collection's only shard, while the replica it would forward the read
// to (the shard's first) is cut off: the forwarded read fails, and the read
// is served in parts by the replicas that remain.
func TestClusterReadAroundDownNode(t *testing.T) {
	c := startCluster(t, 4, nil)
	ctx := context.Background()
	if _, err := c.node(1).n.CreateCollection(ctx, kv.CollectionOptions{Name: "f", Shards: 1, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		// Right after the creation the shard's leadership may still move
		// to its preferred replica, failing a put in flight as
		// commit_unknown: the same put again is the same record.
		c.eventually(30*time.Second, "a write", func() error {
			_, err := c.node(1).n.Put(ctx, kv.PutRequest{Collection: "f", Key: []byte(fmt.Sprint("k", i)), Value: []byte("v")})
			return err
		})
	}
	d, _ := c.node(1).n.collection("f")
	first := d.Shards[0].Replicas[0].Node
	var via *testNode
	for _, tn := range c.nodes {
		if !tn.n.hasReplica(d.Shards[0].ID) {
			via = tn
		}
	}
	if via == nil {
		t.Fatalf("every node holds shard %d", d.Shards[0].ID)
	}
	c.net.isolate(first)
	c.eventually(30*time.Second, "reads through a node without the shard, its first replica cut off", func() error {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if r, err := via.n.Get(cctx, kv.GetRequest{Collection: "f", Key: []byte("k3")}); err != nil || string(r.Value) != "v" {
			return fmt.Errorf("get: %+v, %v", r, err)
		}
		res, err := via.n.Scan(cctx, kv.ScanRequest{Collection: "f"})
		if err != nil || len(res.Items) != 10 {
			return fmt.Errorf("scan: %d records, %v", len(res.Items), err)
		}
		return nil
	})
}

// TestClusterWatchOutlivesPartRestarts: a watch over several nodes whose
// parts fail, one node cut off at a time, more often over its life than
// maxPartRestarts, goes on: the bound is on restarts in a row without
// progress, and every write is delivered, once, in order.
func TestClusterWatchOutlivesPartRestarts(t *testing.T) {
	c := startCluster(t, 4, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// Three replicas of each shard: a node cut off leaves each a quorum.
	if _, err := c.node(1).n.CreateCollection(ctx, kv.CollectionOptions{Name: "w", Shards: 4, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	c.waitVoters(3, c.shardIDs("w")...)
	w := startTestWatch(t, ctx, c.node(1).n, kv.WatchRequest{Collection: "w"})
	next := func(key string) { t.Helper(); w.next(key, 30*time.Second) }
	put := func(key string) {
		t.Helper()
		c.eventually(30*time.Second, "put "+key, func() error {
			_, err := c.node(1).n.Put(ctx, kv.PutRequest{Collection: "w", Key: []byte(key), Value: []byte(key)})
			return err
		})
	}
	put("k00")
	next("k00")
	// Each round cuts off one of the nodes serving parts, which breaks
	// its parts at once (its connections close), writes, waits for the
	// write, and heals the node.
	const rounds = maxPartRestarts + 4
	for i := 1; i <= rounds; i++ {
		cut := uint64(2 + i%3)
		c.net.isolate(cut)
		key := fmt.Sprintf("k%02d", i)
		put(key)
		next(key)
		c.net.heal(cut)
	}
	t.Logf("%d rounds, each cutting off a node the watch's parts may run on", rounds)
}

// testWatch is a watch run in the background for a test, its changes
// (not its progress marks) queued.
type testWatch struct {
	t      *testing.T
	events chan kv.Event
	ended  chan error
	last   kv.Event
}

// startTestWatch starts a watch through n, ended when the test ends.
func startTestWatch(t *testing.T, ctx context.Context, n *Node, req kv.WatchRequest) *testWatch {
	w := &testWatch{t: t, events: make(chan kv.Event, 1024), ended: make(chan error, 1)}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.ended <- n.Watch(ctx, req, func(ev kv.Event) error {
			if ev.Type != kv.EventProgress {
				w.events <- ev
			}
			return nil
		})
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return w
}

// next waits until the watch delivers a change of key, failing the test
// if it delivers a change out of (version, key) order or twice, ends, or
// delivers none of key within d (a generous deadline, which only catches
// a watch left waiting).
func (w *testWatch) next(key string, d time.Duration) {
	w.t.Helper()
	deadline := time.After(d)
	for {
		select {
		case ev := <-w.events:
			if ev.Version < w.last.Version || ev.Version == w.last.Version && string(ev.Key) <= string(w.last.Key) {
				w.t.Fatalf("event %s@%d after %s@%d: out of order, or delivered twice", ev.Key, ev.Version, w.last.Key, w.last.Version)
			}
			w.last = ev
			if string(ev.Key) == key {
				return
			}
		case err := <-w.ended:
			w.t.Fatalf("the watch ended: %v", err)
		case <-deadline:
			w.t.Fatalf("no change of %s delivered within %v", key, d)
		}
	}
}
