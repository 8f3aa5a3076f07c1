package node

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
)

// groupTransact runs fn in group transaction attempts of group id until
// one commits, each retry naming the attempt it retries.
func groupTransact(ctx context.Context, n *Node, id string, fn func(attempt string) error) (uint64, int, error) {
	retryOf := ""
	for attempts := 1; ; attempts++ {
		a, err := n.BeginGroupTxn(ctx, id, kv.TxnOptions{RetryOf: retryOf})
		if err != nil {
			return 0, attempts, err
		}
		err = fn(a)
		if err == nil {
			var v uint64
			v, err = n.CommitTxn(ctx, a)
			if err == nil {
				return v, attempts, nil
			}
		}
		_ = n.AbortTxn(ctx, a)
		if kv.CodeOf(err) != kv.CodeTxnAborted || ctx.Err() != nil {
			return 0, attempts, err
		}
		retryOf = a
	}
}

// TestGroupOneNode: a group over keys of several shards and collections;
// group transactions keep a bank invariant; plain single-key reads and
// writes of members go through the group; batch writes and general
// transactions touching a member fail with key_in_group; the keys are
// their shards' again after the delete, with every group write.
func TestGroupOneNode(t *testing.T) {
	n := openTest(t, t.TempDir(), Options{Logger: quietLogger(), TickInterval: 20 * time.Millisecond})
	defer n.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, c := range []kv.CollectionOptions{{Name: "acct", Partitioning: kv.PartitionHash, Shards: 4}, {Name: "r", Partitioning: kv.PartitionRange, SplitPoints: [][]byte{[]byte("m")}}} {
		if _, err := n.CreateCollection(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	const accounts, initial = 8, 100
	key := func(i int) []byte { return []byte(fmt.Sprintf("a%02d", i)) }
	members := []kv.KeyRef{{Collection: "r", Key: []byte("z-total")}}
	for i := range accounts {
		if _, err := n.Put(ctx, kv.PutRequest{Collection: "acct", Key: key(i), Value: []byte(strconv.Itoa(initial))}); err != nil {
			t.Fatal(err)
		}
		members = append(members, kv.KeyRef{Collection: "acct", Key: key(i)})
	}
	created, err := n.CreateGroup(ctx, kv.GroupSpec{ID: "g1", Leader: kv.KeyRef{Collection: "r", Key: []byte("b-leader")}, Members: members})
	if err != nil {
		t.Fatal(err)
	}
	if len(created.Joined) != accounts+2 || len(created.Refused) != 0 {
		t.Fatalf("created %+v", created)
	}
	if _, err := n.CreateGroup(ctx, kv.GroupSpec{ID: "g1", Leader: kv.KeyRef{Collection: "r", Key: []byte("other")}}); kv.CodeOf(err) != kv.CodeAlreadyExists {
		t.Fatalf("second group g1: %v, want already_exists", err)
	}
	// A key of g1 cannot join another atomic group; the group's other key
	// is free again at once.
	_, err = n.CreateGroup(ctx, kv.GroupSpec{ID: "g2", Leader: kv.KeyRef{Collection: "r", Key: []byte("c-leader")}, Members: []kv.KeyRef{{Collection: "acct", Key: key(0)}}})
	if kv.CodeOf(err) != kv.CodeGroupRefused {
		t.Fatalf("g2 over a key of g1: %v, want group_refused", err)
	}
	if _, err := n.Put(ctx, kv.PutRequest{Collection: "r", Key: []byte("c-leader"), Value: []byte("free")}); err != nil {
		t.Fatalf("the refused group's leader key is not free: %v", err)
	}
	info, err := n.DescribeGroup(ctx, "g1")
	if err != nil || info.State != kv.GroupActive || len(info.Members) != accounts+2 || info.LeaderNode != n.ID() {
		t.Fatalf("describe: %+v %v", info, err)
	}

	// Transfers in group transactions, concurrent.
	var wg sync.WaitGroup
	maxAttempts := 0
	var mu sync.Mutex
	for c := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10 {
				a, b := (c+i)%accounts, (c+2*i+1)%accounts
				if a == b {
					continue
				}
				_, attempts, err := groupTransact(ctx, n, "g1", func(id string) error {
					ra, _, err := n.TxnGet(ctx, id, kv.KeyRef{Collection: "acct", Key: key(a)})
					if err != nil {
						return err
					}
					rb, _, err := n.TxnGet(ctx, id, kv.KeyRef{Collection: "acct", Key: key(b)})
					if err != nil {
						return err
					}
					va, _ := strconv.Atoi(string(ra.Value))
					vb, _ := strconv.Atoi(string(rb.Value))
					if err := n.TxnPut(ctx, id, kv.PutItem{Collection: "acct", Key: key(a), Value: []byte(strconv.Itoa(va - 7))}); err != nil {
						return err
					}
					return n.TxnPut(ctx, id, kv.PutItem{Collection: "acct", Key: key(b), Value: []byte(strconv.Itoa(vb + 7))})
				})
				if err != nil {
					t.Errorf("transfer: %v", err)
					return
				}
				mu.Lock()
				maxAttempts = max(maxAttempts, attempts)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	t.Logf("most attempts of one transfer: %d", maxAttempts)
	sum := func(read func(k []byte) ([]byte, error)) int {
		total := 0
		for i := range accounts {
			v, err := read(key(i))
			if err != nil {
				t.Fatal(err)
			}
			x, _ := strconv.Atoi(string(v))
			total += x
		}
		return total
	}
	plainGet := func(k []byte) ([]byte, error) {
		r, err := n.Get(ctx, kv.GetRequest{Collection: "acct", Key: k})
		return r.Value, err
	}
	if got := sum(plainGet); got != accounts*initial {
		t.Fatalf("total read with plain gets during the group: %d, want %d", got, accounts*initial)
	}

	// A plain put of a member goes through the group.
	if _, err := n.Put(ctx, kv.PutRequest{Collection: "r", Key: []byte("z-total"), Value: []byte("800")}); err != nil {
		t.Fatalf("plain put of a member: %v", err)
	}
	if r, err := n.Get(ctx, kv.GetRequest{Collection: "r", Key: []byte("z-total")}); err != nil || string(r.Value) != "800" {
		t.Fatalf("plain get of a member after a plain put: %q %v", r.Value, err)
	}
	// Batch writes and general transactions touching a member fail.
	if _, err := n.BatchPut(ctx, []kv.PutItem{{Collection: "acct", Key: key(1), Value: []byte("0")}, {Collection: "acct", Key: []byte("outside"), Value: []byte("0")}}); kv.CodeOf(err) != kv.CodeKeyInGroup {
		t.Fatalf("batch put over a member: %v, want key_in_group", err)
	}
	if _, err := n.Get(ctx, kv.GetRequest{Collection: "acct", Key: []byte("outside")}); kv.CodeOf(err) != kv.CodeNotFound {
		t.Fatalf("a refused batch wrote its other key: %v", err)
	}
	_, err = n.ExecTxn(ctx, kv.ExecRequest{Then: []kv.TxnOp{{Op: kv.TxnOpPut, Collection: "acct", Key: key(2), Value: []byte("0")}}})
	if kv.CodeOf(err) != kv.CodeKeyInGroup {
		t.Fatalf("one-shot transaction over a member: %v, want key_in_group", err)
	}
	// A group transaction touches members only.
	_, err = n.ExecGroupTxn(ctx, "g1", kv.ExecRequest{Then: []kv.TxnOp{{Op: kv.TxnOpGet, Collection: "acct", Key: []byte("outside")}}})
	if kv.CodeOf(err) != kv.CodeInvalidArgument {
		t.Fatalf("group transaction over a non-member: %v, want invalid_argument", err)
	}
	res, err := n.ExecGroupTxn(ctx, "g1", kv.ExecRequest{If: []kv.Compare{{Collection: "r", Key: []byte("z-total"), HasValue: true, Value: []byte("800")}},
		Then: []kv.TxnOp{{Op: kv.TxnOpPut, Collection: "r", Key: []byte("z-total"), Value: []byte("checked")}}})
	if err != nil || !res.Succeeded {
		t.Fatalf("group exec: %+v %v", res, err)
	}

	if err := n.DeleteGroup(ctx, "g1"); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if _, err := n.DescribeGroup(ctx, "g1"); kv.CodeOf(err) != kv.CodeNotFound {
		t.Fatalf("describe after delete: %v", err)
	}
	// Every group write is in the keys' own shards, read every way.
	if got := sum(plainGet); got != accounts*initial {
		t.Fatalf("total after the delete: %d", got)
	}
	var refs []kv.KeyRef
	for i := range accounts {
		refs = append(refs, kv.KeyRef{Collection: "acct", Key: key(i)})
	}
	bg, err := n.BatchGet(ctx, refs)
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, it := range bg.Items {
		x, _ := strconv.Atoi(string(it.Value))
		total += x
	}
	if total != accounts*initial {
		t.Fatalf("total by batch get after the delete: %d", total)
	}
	if r, err := n.Get(ctx, kv.GetRequest{Collection: "r", Key: []byte("z-total")}); err != nil || string(r.Value) != "checked" {
		t.Fatalf("a member after the delete: %q %v", r.Value, err)
	}
	// Plain writes work again.
	if _, err := n.BatchPut(ctx, []kv.PutItem{{Collection: "acct", Key: key(1), Value: []byte("0")}}); err != nil {
		t.Fatalf("batch put after the delete: %v", err)
	}
	list, err := n.ListGroups(ctx)
	if err != nil || len(list) != 0 {
		t.Fatalf("list after the delete: %+v %v", list, err)
	}
	if !slices.Equal(bg.Items[0].Key, key(0)) {
		t.Fatalf("batch get order: %q", bg.Items[0].Key)
	}
}
