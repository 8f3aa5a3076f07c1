package node

import (
	"testing"

	"github.com/groupkv/groupkv/internal/kv"
)

// TestTxnAtTimestampRefusesGroupMembers: read-only and snapshot
// transactions read at a timestamp, where a member key's shard may lack
// the group's writes below it (it stores them as they are shipped, after
// their versions). Their reads of a key a group holds answer
// key_in_group, as a locking transaction's do; a read of a key freed
// after the transaction's timestamp aborts the attempt, and the next
// attempt reads the group's last write.
func TestTxnAtTimestampRefusesGroupMembers(t *testing.T) {
	n, ctx := openWithCollection(t)
	a := kv.KeyRef{Collection: "c", Key: []byte("a")}
	var other kv.KeyRef // a key of a's shard, in no group
	d, err := n.collection("c")
	if err != nil {
		t.Fatal(err)
	}
	_, sa := n.route(d, a.Key)
	for i := 0; other.Key == nil; i++ {
		k := []byte{'o', byte('a' + i)}
		if _, s := n.route(d, k); s == sa {
			other = kv.KeyRef{Collection: "c", Key: k}
		}
	}
	for _, r := range []kv.KeyRef{a, other} {
		if _, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: r.Key, Value: []byte("0")}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := n.CreateGroup(ctx, kv.GroupSpec{ID: "g", Leader: kv.KeyRef{Collection: "c", Key: []byte("L")}, Members: []kv.KeyRef{a}}); err != nil {
		t.Fatal(err)
	}
	write := func(v string) uint64 {
		t.Helper()
		ver, _, err := groupTransact(ctx, n, "g", func(at string) error {
			return n.TxnPut(ctx, at, kv.PutItem{Collection: "c", Key: a.Key, Value: []byte(v)})
		})
		if err != nil {
			t.Fatal(err)
		}
		return ver
	}
	write("1")
	modes := []kv.TxnOptions{{ReadOnly: true}, {Isolation: kv.IsolationSnapshot}}
	for _, opts := range modes {
		for _, batch := range []bool{false, true} {
			tx, err := n.BeginTxn(ctx, opts)
			if err != nil {
				t.Fatal(err)
			}
			if batch {
				_, err = n.TxnBatchGet(ctx, tx, []kv.KeyRef{other, a}, false)
			} else {
				_, _, err = n.TxnGet(ctx, tx, a)
			}
			if kv.CodeOf(err) != kv.CodeKeyInGroup {
				t.Fatalf("%+v (batch %v): a member read at the transaction's timestamp: %v, want key_in_group", opts, batch, err)
			}
			n.AbortTxn(ctx, tx)
			// The shard's other keys read as before.
			tx, err = n.BeginTxn(ctx, opts)
			if err != nil {
				t.Fatal(err)
			}
			rec, found, err := n.TxnGet(ctx, tx, other)
			if err != nil || !found || string(rec.Value) != "0" {
				t.Fatalf("%+v: a key of the member's shard in no group: %+v %v %v", opts, rec, found, err)
			}
			n.AbortTxn(ctx, tx)
		}
	}
	// Scans: of a span holding the member, refused; of one without it,
	// read.
	for _, opts := range modes {
		tx, err := n.BeginTxn(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := n.TxnScan(ctx, tx, kv.ScanRequest{Collection: "c"}); kv.CodeOf(err) != kv.CodeKeyInGroup {
			t.Fatalf("%+v: a scan over the member: %v, want key_in_group", opts, err)
		}
		n.AbortTxn(ctx, tx)
		tx, err = n.BeginTxn(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		page, err := n.TxnScan(ctx, tx, kv.ScanRequest{Collection: "c", Start: []byte("b")})
		if err != nil || len(page.Items) != 1 || string(page.Items[0].Key) != string(other.Key) {
			t.Fatalf("%+v: a scan past the member: %+v, %v", opts, page, err)
		}
		n.AbortTxn(ctx, tx)
	}
	// A locking transaction's scan over the member is refused at the scan
	// (its prepare would refuse it, and the group's writes take no
	// locks); one past it reads.
	tx, err := n.BeginTxn(ctx, kv.TxnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if page, err := n.TxnScan(ctx, tx, kv.ScanRequest{Collection: "c"}); kv.CodeOf(err) != kv.CodeKeyInGroup {
		t.Fatalf("a serializable scan over the member: %+v, %v; want key_in_group", page, err)
	}
	if page, err := n.TxnScan(ctx, tx, kv.ScanRequest{Collection: "c", Start: []byte("b")}); err != nil || len(page.Items) != 1 {
		t.Fatalf("a serializable scan past the member: %+v, %v", page, err)
	}
	if _, err := n.CommitTxn(ctx, tx); err != nil {
		t.Fatalf("commit after a refused scan: %v", err)
	}
	// Attempts whose timestamps come before the group is deleted, reading
	// a after: the group's last write (2) reached a's shard after them.
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
		rec, found, err := n.TxnGet(ctx, tx, a)
		if kv.CodeOf(err) != kv.CodeTxnAborted {
			t.Fatalf("%+v begun before the delete: read %q (found %v, version %d), %v; want txn_aborted", modes[i], rec.Value, found, rec.Version, err)
		}
		if _, err := n.CommitTxn(ctx, tx); kv.CodeOf(err) != kv.CodeTxnAborted {
			t.Fatalf("%+v: commit after the aborted read: %v", modes[i], err)
		}
		tx, err = n.BeginTxn(ctx, kv.TxnOptions{ReadOnly: modes[i].ReadOnly, Isolation: modes[i].Isolation, RetryOf: tx})
		if err != nil {
			t.Fatal(err)
		}
		rec, found, err = n.TxnGet(ctx, tx, a)
		if err != nil || !found || string(rec.Value) != "2" || rec.Version < last {
			t.Fatalf("%+v retried: %q version %d (found %v), %v; want 2 at or above %d", modes[i], rec.Value, rec.Version, found, err, last)
		}
		if _, err := n.CommitTxn(ctx, tx); err != nil {
			t.Fatal(err)
		}
	}
}
