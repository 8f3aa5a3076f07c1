package node

import (
	"strings"
	"testing"

	"github.com/groupkv/groupkv/internal/kv"
)

// TestTxnAtTimestampReadsGroupMembers: read-only and snapshot
// transactions, and plain reads at an explicit version, read a key a
// group holds at their version as they read every key: a member's shard
// stores each group write at the version its group committed it, and a
// read at a version waits until every group write at or below it is
// shipped there. A group transaction over keys of two shards is seen
// whole or not at all; an attempt begun before the group's last write
// and deletion reads the value of its timestamp and commits.
func TestTxnAtTimestampReadsGroupMembers(t *testing.T) {
	n, ctx := openWithCollection(t)
	a := kv.KeyRef{Collection: "c", Key: []byte("a")}
	var other, b kv.KeyRef // a key of a's shard in no group; a member of another shard
	d, err := n.collection("c")
	if err != nil {
		t.Fatal(err)
	}
	_, sa := n.route(d, a.Key)
	for i := 0; other.Key == nil || b.Key == nil; i++ {
		k := []byte{'o', byte('a' + i)}
		if _, s := n.route(d, k); s == sa && other.Key == nil {
			other = kv.KeyRef{Collection: "c", Key: k}
		} else if s != sa && b.Key == nil {
			b = kv.KeyRef{Collection: "c", Key: append([]byte("b"), k...)}
			if _, s := n.route(d, b.Key); s == sa {
				b.Key = nil
			}
		}
	}
	var before uint64
	for _, r := range []kv.KeyRef{a, b, other} {
		rec, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: r.Key, Value: []byte("0")})
		if err != nil {
			t.Fatal(err)
		}
		before = max(before, rec)
	}
	if _, err := n.CreateGroup(ctx, kv.GroupSpec{ID: "g", Leader: kv.KeyRef{Collection: "c", Key: []byte("L")}, Members: []kv.KeyRef{a, b}}); err != nil {
		t.Fatal(err)
	}
	write := func(v string) uint64 {
		t.Helper()
		ver, _, err := groupTransact(ctx, n, "g", func(at string) error {
			if err := n.TxnPut(ctx, at, kv.PutItem{Collection: "c", Key: a.Key, Value: []byte(v)}); err != nil {
				return err
			}
			return n.TxnPut(ctx, at, kv.PutItem{Collection: "c", Key: b.Key, Value: []byte(v)})
		})
		if err != nil {
			t.Fatal(err)
		}
		return ver
	}
	// Plain reads at explicit versions, at once after the commit (the
	// shipment is not due for 300 ms): below it the value before, at it
	// the commit's, in both shards.
	v1 := write("1")
	for _, c := range []struct {
		at   uint64
		want string
	}{{v1 - 1, "0"}, {v1, "1"}, {before, "0"}} {
		for _, r := range []kv.KeyRef{a, b} {
			rec, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: r.Key, Version: c.at})
			if err != nil || string(rec.Value) != c.want || c.want == "1" && rec.Version != v1 {
				t.Fatalf("get %s at %d: %q@%d, %v; want %s (the group committed 1 at %d)", r.Key, c.at, rec.Value, rec.Version, err, c.want, v1)
			}
		}
		page, err := n.Scan(ctx, kv.ScanRequest{Collection: "c", Version: c.at})
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range page.Items {
			if string(it.Key) == string(a.Key) || string(it.Key) == string(b.Key) {
				if string(it.Value) != c.want {
					t.Fatalf("scan at %d: %s=%q, want %s", c.at, it.Key, it.Value, c.want)
				}
			}
		}
	}
	modes := []kv.TxnOptions{{ReadOnly: true}, {Isolation: kv.IsolationSnapshot}}
	for _, opts := range modes {
		for _, batch := range []bool{false, true} {
			tx, err := n.BeginTxn(ctx, opts)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			if batch {
				items, err := n.TxnBatchGet(ctx, tx, []kv.KeyRef{other, a, b}, false)
				if err != nil {
					t.Fatalf("%+v: batch get: %v", opts, err)
				}
				for _, it := range items {
					got = append(got, string(it.Value))
				}
			} else {
				for _, r := range []kv.KeyRef{other, a, b} {
					rec, _, err := n.TxnGet(ctx, tx, r)
					if err != nil {
						t.Fatalf("%+v: get %s: %v", opts, r.Key, err)
					}
					got = append(got, string(rec.Value))
				}
			}
			if strings.Join(got, ",") != "0,1,1" {
				t.Fatalf("%+v (batch %v): read %v, want [0 1 1]", opts, batch, got)
			}
			page, err := n.TxnScan(ctx, tx, kv.ScanRequest{Collection: "c"})
			if err != nil {
				t.Fatalf("%+v: a scan over the members: %v", opts, err)
			}
			for _, it := range page.Items {
				if (string(it.Key) == string(a.Key) || string(it.Key) == string(b.Key)) && string(it.Value) != "1" {
					t.Fatalf("%+v: the scan read %s=%q, want 1", opts, it.Key, it.Value)
				}
			}
			if _, err := n.CommitTxn(ctx, tx); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A locking transaction's scan over the member is refused at the scan
	// (its prepare would refuse it, and the group's writes take no
	// locks); one past it reads.
	tx, err := n.BeginTxn(ctx, kv.TxnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if page, err := n.TxnScan(ctx, tx, kv.ScanRequest{Collection: "c", End: []byte("b")}); kv.CodeOf(err) != kv.CodeKeyInGroup {
		t.Fatalf("a serializable scan over the member: %+v, %v; want key_in_group", page, err)
	}
	if page, err := n.TxnScan(ctx, tx, kv.ScanRequest{Collection: "c", Start: []byte("o"), End: []byte("p")}); err != nil || len(page.Items) != 1 {
		t.Fatalf("a serializable scan past the member: %+v, %v", page, err)
	}
	if _, err := n.CommitTxn(ctx, tx); err != nil {
		t.Fatalf("commit after a refused scan: %v", err)
	}
	// Attempts whose timestamps come before the group's last write and
	// its deletion read the value of their timestamp, and commit.
	var early []string
	for _, opts := range modes {
		tx, err := n.BeginTxn(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		early = append(early, tx)
	}
	last := write("2")
	if err := n.DeleteGroup(ctx, "g"); err != nil {
		t.Fatal(err)
	}
	for i, tx := range early {
		for _, r := range []kv.KeyRef{a, b} {
			rec, found, err := n.TxnGet(ctx, tx, r)
			if err != nil || !found || string(rec.Value) != "1" || rec.Version != v1 {
				t.Fatalf("%+v begun before the last write: read %s=%q@%d (found %v), %v; want 1@%d", modes[i], r.Key, rec.Value, rec.Version, found, err, v1)
			}
		}
		if _, err := n.CommitTxn(ctx, tx); err != nil {
			t.Fatalf("%+v: commit: %v", modes[i], err)
		}
	}
	for _, opts := range modes {
		tx, err := n.BeginTxn(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		rec, found, err := n.TxnGet(ctx, tx, b)
		if err != nil || !found || string(rec.Value) != "2" || rec.Version != last {
			t.Fatalf("%+v after the delete: %q version %d (found %v), %v; want 2 at %d", opts, rec.Value, rec.Version, found, err, last)
		}
		if _, err := n.CommitTxn(ctx, tx); err != nil {
			t.Fatal(err)
		}
	}
	// After the delete the keys' history is the group's.
	for _, c := range []struct {
		at   uint64
		want string
	}{{v1 - 1, "0"}, {v1, "1"}, {last - 1, "1"}, {last, "2"}} {
		for _, r := range []kv.KeyRef{a, b} {
			rec, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: r.Key, Version: c.at})
			if err != nil || string(rec.Value) != c.want {
				t.Fatalf("after the delete, get %s at %d: %q@%d, %v; want %s", r.Key, c.at, rec.Value, rec.Version, err, c.want)
			}
		}
	}
}
