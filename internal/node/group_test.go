package node

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/groupkv/groupkv/internal/group"
	"github.com/groupkv/groupkv/internal/kv"
)

// groupTransact runs fn in group transaction attempts of group id until
// one commits, each retry naming the attempt it retries.
func groupTransact(ctx context.Context, n *Node, id string, fn func(attempt string) error) (uint64, int, error) {
	return groupTransactFrom(ctx, n, id, nil, fn)
}

// groupTransactFrom is groupTransact calling begin, when not nil, before
// each attempt begins (transactFrom).
func groupTransactFrom(ctx context.Context, n *Node, id string, begin func(), fn func(attempt string) error) (uint64, int, error) {
	retryOf := ""
	for attempts := 1; ; attempts++ {
		if begin != nil {
			begin()
		}
		a, err := n.BeginGroupTxn(ctx, id, kv.TxnOptions{RetryOf: retryOf})
		if err != nil {
			return 0, attempts, err
		}
		err = fn(a)
		if err == nil {
			var v uint64
			if v, err = n.CommitTxn(ctx, a); err == nil {
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
	// The same request asked again (its answer lost) answers the same.
	again, err := n.CreateGroup(ctx, kv.GroupSpec{ID: "g1", Leader: kv.KeyRef{Collection: "r", Key: []byte("b-leader")}, Members: members})
	if err != nil || len(again.Joined) != accounts+2 {
		t.Fatalf("the creation asked again: %+v %v", again, err)
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
	// A key a transaction holds a lock on is refused at once, not waited
	// for: a best-effort group goes on without it.
	tx, err := n.BeginTxn(ctx, kv.TxnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := n.TxnGet(ctx, tx, kv.KeyRef{Collection: "r", Key: []byte("locked")}); err != nil {
		t.Fatal(err)
	}
	g3, err := n.CreateGroup(ctx, kv.GroupSpec{ID: "g3", Leader: kv.KeyRef{Collection: "r", Key: []byte("c-leader")},
		Members: []kv.KeyRef{{Collection: "r", Key: []byte("locked")}}, Mode: kv.GroupBestEffort})
	if err != nil || len(g3.Joined) != 1 || len(g3.Refused) != 1 || g3.Refused[0].Reason != "locked" {
		t.Fatalf("best-effort group over a locked key: %+v %v", g3, err)
	}
	if err := n.AbortTxn(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if err := n.DeleteGroup(ctx, "g3"); err != nil {
		t.Fatal(err)
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
	// A scan right after a group write sees the group's values.
	var reads []kv.TxnOp
	for i := range accounts {
		reads = append(reads, kv.TxnOp{Op: kv.TxnOpGet, Collection: "acct", Key: key(i)})
	}
	inGroup, err := n.ExecGroupTxn(ctx, "g1", kv.ExecRequest{Then: reads})
	if err != nil {
		t.Fatal(err)
	}
	v5, _ := strconv.Atoi(string(inGroup.Results[5].Value))
	v6, _ := strconv.Atoi(string(inGroup.Results[6].Value))
	if _, err := n.ExecGroupTxn(ctx, "g1", kv.ExecRequest{Then: []kv.TxnOp{{Op: kv.TxnOpPut, Collection: "acct", Key: key(5), Value: []byte(strconv.Itoa(v5 + 5))},
		{Op: kv.TxnOpPut, Collection: "acct", Key: key(6), Value: []byte(strconv.Itoa(v6 - 5))}}}); err != nil {
		t.Fatal(err)
	}
	if inGroup, err = n.ExecGroupTxn(ctx, "g1", kv.ExecRequest{Then: reads}); err != nil {
		t.Fatal(err)
	}
	scanned, err := n.Scan(ctx, kv.ScanRequest{Collection: "acct"})
	if err != nil {
		t.Fatal(err)
	}
	if len(scanned.Items) != accounts {
		t.Fatalf("a scan during the group: %d records", len(scanned.Items))
	}
	for _, r := range scanned.Items {
		i, _ := strconv.Atoi(string(r.Key[1:]))
		if want := inGroup.Results[i].Value; string(r.Value) != string(want) {
			t.Fatalf("a scan during the group read %s = %q, the group holds %q", r.Key, r.Value, want)
		}
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

	// A shard holding group state neither splits nor merges.
	if _, err := n.SplitShard(ctx, "r", []byte("c"), 0); kv.CodeOf(err) != kv.CodeConditionFailed {
		t.Fatalf("split of the group's leader shard: %v, want condition_failed", err)
	}
	rd, _ := n.collection("r")
	if _, err := n.MergeShards(ctx, "r", rd.Shards[0].ID); kv.CodeOf(err) != kv.CodeConditionFailed {
		t.Fatalf("merge of shards holding group state: %v, want condition_failed", err)
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

// TestGroupClusterLeaderLoss: a bank inside a group on three nodes, whose
// accounts live in shards led all over; the node leading the group's
// leader shard is cut off mid-run. Transfers go on at the shard's new
// leader (the group's state is the shard's, carried by its log), the total
// holds throughout, and after the delete every account's own shard holds
// the group's last value.
func TestGroupClusterLeaderLoss(t *testing.T) {
	c := startCluster(t, 3, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	n1 := c.node(1).n
	for _, o := range []kv.CollectionOptions{{Name: "acct", Partitioning: kv.PartitionHash, Shards: 6}, {Name: "lead", Partitioning: kv.PartitionRange}} {
		if _, err := n1.CreateCollection(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	const accounts, initial = 10, 100
	key := func(i int) []byte { return []byte(fmt.Sprintf("a%02d", i)) }
	var members []kv.KeyRef
	for i := range accounts {
		c.eventually(30*time.Second, "an initial put", func() error {
			_, err := n1.Put(ctx, kv.PutRequest{Collection: "acct", Key: key(i), Value: []byte(strconv.Itoa(initial))})
			return err
		})
		members = append(members, kv.KeyRef{Collection: "acct", Key: key(i)})
	}
	var created kv.GroupCreated
	c.eventually(30*time.Second, "the group is created", func() error {
		var err error
		created, err = c.node(2).n.CreateGroup(ctx, kv.GroupSpec{ID: "bank", Leader: kv.KeyRef{Collection: "lead", Key: []byte("bank")}, Members: members})
		return err
	})
	if len(created.Joined) != accounts+1 {
		t.Fatalf("created %+v", created)
	}
	d, _ := n1.collection("lead")
	leadShard := d.Shards[0].ID
	total := func(via *Node) (int, error) {
		sum := 0
		_, _, err := groupTransact(ctx, via, "bank", func(id string) error {
			sum = 0
			for i := range accounts {
				r, _, err := via.TxnGet(ctx, id, kv.KeyRef{Collection: "acct", Key: key(i)})
				if err != nil {
					return err
				}
				x, _ := strconv.Atoi(string(r.Value))
				sum += x
			}
			return nil
		})
		return sum, err
	}

	victim := c.leader(leadShard)
	var clients []*Node
	for _, tn := range c.nodes {
		if tn != victim {
			clients = append(clients, tn.n)
		}
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	committed, unknown := 0, 0
	stop := make(chan struct{})
	for ci := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			via := clients[ci%len(clients)]
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				a, b := (ci*3+i)%accounts, (ci+5*i+1)%accounts
				if a == b {
					continue
				}
				tctx, tcancel := context.WithTimeout(ctx, 20*time.Second)
				_, _, err := groupTransact(tctx, via, "bank", func(id string) error {
					ra, _, err := via.TxnGet(tctx, id, kv.KeyRef{Collection: "acct", Key: key(a)})
					if err != nil {
						return err
					}
					rb, _, err := via.TxnGet(tctx, id, kv.KeyRef{Collection: "acct", Key: key(b)})
					if err != nil {
						return err
					}
					va, _ := strconv.Atoi(string(ra.Value))
					vb, _ := strconv.Atoi(string(rb.Value))
					if err := via.TxnPut(tctx, id, kv.PutItem{Collection: "acct", Key: key(a), Value: []byte(strconv.Itoa(va - 3))}); err != nil {
						return err
					}
					return via.TxnPut(tctx, id, kv.PutItem{Collection: "acct", Key: key(b), Value: []byte(strconv.Itoa(vb + 3))})
				})
				tcancel()
				mu.Lock()
				switch {
				case err == nil:
					committed++
				case kv.CodeOf(err) == kv.CodeCommitUnknown:
					unknown++ // a transfer is balanced: applied or not, the total holds
				}
				mu.Unlock()
				if err != nil {
					time.Sleep(50 * time.Millisecond)
				}
			}
		}()
	}
	// Audits from outside the group, throughout: a scan of the accounts
	// in pages of three (every page after the first reads at the first's
	// version) and a read-only transaction's scan, each at one version:
	// the total is the same in every one that answers.
	var audits [2]atomic.Int64
	badAudit := make(chan string, 2)
	for ai := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			via := clients[ai%len(clients)]
			for {
				select {
				case <-stop:
					return
				default:
				}
				actx, acancel := context.WithTimeout(ctx, 10*time.Second)
				sum, err := 0, error(nil)
				add := func(items []kv.Record) {
					for _, r := range items {
						x, _ := strconv.Atoi(string(r.Value))
						sum += x
					}
				}
				if ai == 0 {
					req := kv.ScanRequest{Collection: "acct", Limit: 3}
					for {
						var page kv.ScanResult
						if page, err = via.Scan(actx, req); err != nil {
							break
						}
						add(page.Items)
						if page.NextPage == "" {
							break
						}
						req.Page = page.NextPage
					}
				} else {
					var tx string
					if tx, err = via.BeginTxn(actx, kv.TxnOptions{ReadOnly: true}); err == nil {
						var page kv.ScanResult
						if page, err = via.TxnScan(actx, tx, kv.ScanRequest{Collection: "acct"}); err == nil {
							add(page.Items)
							_, err = via.CommitTxn(actx, tx)
						} else {
							via.AbortTxn(actx, tx)
						}
					}
				}
				acancel()
				if err != nil {
					time.Sleep(20 * time.Millisecond)
					continue
				}
				if sum != accounts*initial {
					select {
					case badAudit <- fmt.Sprintf("audit %d (paged scan 0, read-only transaction 1) read a total of %d, want %d", ai, sum, accounts*initial):
					default:
					}
				}
				audits[ai].Add(1)
			}
		}()
	}
	waitCommitted := func(n int) {
		c.eventually(60*time.Second, fmt.Sprintf("%d transfers committed", n), func() error {
			mu.Lock()
			defer mu.Unlock()
			if committed < n {
				return fmt.Errorf("%d committed", committed)
			}
			return nil
		})
	}
	waitCommitted(20)
	c.net.isolate(victim.id)
	mu.Lock()
	before := committed
	mu.Unlock()
	waitCommitted(before + 20)
	c.net.heal(victim.id)
	waitCommitted(before + 40)
	close(stop)
	wg.Wait()
	t.Logf("transfers: %d committed, %d unknown; the group's leader shard moved from node %d; audits outside the group: %d paged scans, %d read-only transactions",
		committed, unknown, victim.id, audits[0].Load(), audits[1].Load())
	select {
	case bad := <-badAudit:
		t.Fatal(bad)
	default:
	}
	if audits[0].Load() == 0 || audits[1].Load() == 0 {
		t.Fatalf("audits outside the group: %d paged scans, %d read-only transactions answered; want some of each", audits[0].Load(), audits[1].Load())
	}
	var got int
	c.eventually(60*time.Second, "a total read in the group", func() error {
		var err error
		got, err = total(clients[0])
		return err
	})
	if got != accounts*initial {
		t.Fatalf("total in the group: %d, want %d", got, accounts*initial)
	}
	if _, err := clients[0].SplitShard(ctx, "lead", []byte("c"), 0); kv.CodeOf(err) != kv.CodeConditionFailed {
		t.Fatalf("split of the group's leader shard: %v, want condition_failed", err)
	}
	c.eventually(60*time.Second, "the group is deleted", func() error {
		return clients[0].DeleteGroup(ctx, "bank")
	})
	// A J of the group sent again while its leader moved may come after
	// the delete and yield the leader key to the deleted incarnation (a
	// ghost): the leader answers its JA with a D, within a few retry
	// periods, and only then does the shard hold no group.
	c.eventually(30*time.Second, "a split after the delete", func() error {
		_, err := clients[0].SplitShard(ctx, "lead", []byte("c"), 0)
		if err != nil && kv.CodeOf(err) != kv.CodeConditionFailed {
			t.Fatalf("split after the delete: %v", err)
		}
		if err != nil {
			// What holds the shard, as its leader sees it.
			for _, tn := range c.nodes {
				for _, id := range tn.n.localShardIDs() {
					sm := tn.n.host.StateMachine(id)
					if sm == nil || !tn.n.host.Ready(id) {
						continue
					}
					sm.WithGroups(func(l *group.Leader, f *group.Follower) {
						for _, g := range l.Groups() {
							t.Logf("split refused: node %d shard %d leads group %s (%s)", tn.id, id, g.Ref, g.State)
						}
						for _, k := range f.Keys() {
							y, _ := f.Key(k)
							t.Logf("split refused: node %d shard %d holds %s yielded to %s (y=%d confirmed=%v)", tn.id, id, k, y.Group, y.Yield, y.Confirmed)
						}
					})
				}
			}
		}
		return err
	})
	sum := 0
	for i := range accounts {
		var r kv.Record
		c.eventually(30*time.Second, "a read after the delete", func() error {
			var err error
			r, err = clients[1].Get(ctx, kv.GetRequest{Collection: "acct", Key: key(i)})
			return err
		})
		x, _ := strconv.Atoi(string(r.Value))
		sum += x
	}
	if sum != accounts*initial {
		t.Fatalf("total in the accounts' own shards after the delete: %d, want %d", sum, accounts*initial)
	}
}

// TestGroupTxnRetryHasPriority: a group transaction that reads a hot key
// and takes its time fails validation while others keep writing that key;
// retried with retry_of it runs with priority and commits at once.
func TestGroupTxnRetryHasPriority(t *testing.T) {
	n, ctx := openWithCollection(t)
	hot, other := kv.KeyRef{Collection: "c", Key: []byte("hot")}, kv.KeyRef{Collection: "c", Key: []byte("other")}
	if _, err := n.CreateGroup(ctx, kv.GroupSpec{ID: "g", Leader: hot, Members: []kv.KeyRef{other}}); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				_, _, err := groupTransact(ctx, n, "g", func(id string) error {
					r, _, err := n.TxnGet(ctx, id, hot)
					if err != nil {
						return err
					}
					return n.TxnPut(ctx, id, kv.PutItem{Collection: "c", Key: hot.Key, Value: append(r.Value, byte('a'+w))})
				})
				if err != nil && ctx.Err() == nil {
					t.Errorf("writer: %v", err)
					return
				}
			}
		}()
	}
	attempts := 0
	_, _, err := groupTransact(ctx, n, "g", func(id string) error {
		attempts++
		if _, _, err := n.TxnGet(ctx, id, hot); err != nil {
			return err
		}
		time.Sleep(30 * time.Millisecond) // the writers commit meanwhile
		return n.TxnPut(ctx, id, kv.PutItem{Collection: "c", Key: other.Key, Value: []byte("slow")})
	})
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the slow transaction committed at attempt %d", attempts)
	// The first attempt loses to the writers; the retry, with priority,
	// holds the group from its first read to its commit.
	if attempts > 2 {
		t.Fatalf("the slow transaction needed %d attempts; a retry should run with priority", attempts)
	}
}

// TestGroupFourNodesTwoReplicas: on four nodes with two replicas a shard,
// the group's messages reach shards whose replicas the sending node does
// not hold, and group transactions run from a node that holds none of the
// group's leader shard.
func TestGroupFourNodesTwoReplicas(t *testing.T) {
	c := startCluster(t, 4, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n1 := c.node(1).n
	for _, o := range []kv.CollectionOptions{{Name: "a", Partitioning: kv.PartitionHash, Shards: 4, Replicas: 2}, {Name: "l", Partitioning: kv.PartitionRange, Replicas: 2}} {
		if _, err := n1.CreateCollection(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	members := putMembers(ctx, c, n1, "a", nil)
	ld, _ := n1.collection("l")
	var outsider *Node // a node holding no replica of the leader shard
	for _, tn := range c.nodes {
		if !tn.n.hasReplica(ld.Shards[0].ID) {
			outsider = tn.n
		}
	}
	if outsider == nil {
		t.Fatal("every node holds the leader shard")
	}
	c.eventually(60*time.Second, "the group is created", func() error {
		_, err := outsider.CreateGroup(ctx, kv.GroupSpec{ID: "g", Leader: kv.KeyRef{Collection: "l", Key: []byte("lead")}, Members: members})
		return err
	})
	for i := range 8 {
		if err := groupTransfer(ctx, outsider, "g", members[i], members[(i+3)%8]); err != nil {
			t.Fatalf("transfer %d: %v", i, err)
		}
	}
	c.eventually(60*time.Second, "the group is deleted", func() error { return outsider.DeleteGroup(ctx, "g") })
	sum := 0
	for _, m := range members {
		r, err := c.node(4).n.Get(ctx, kv.GetRequest{Collection: "a", Key: m.Key})
		if err != nil {
			t.Fatal(err)
		}
		x, _ := strconv.Atoi(string(r.Value))
		sum += x
	}
	if sum != 40 {
		t.Fatalf("total after the delete: %d, want 40", sum)
	}
}

// putMembers puts "5" to keys k0…k7 of collection coll through n (tagged
// by tags(i), if not nil), retrying while the shards elect leaders, and
// returns them.
func putMembers(ctx context.Context, c *testCluster, n *Node, coll string, tags func(i int) []string) []kv.KeyRef {
	var members []kv.KeyRef
	for i := range 8 {
		k := []byte(fmt.Sprintf("k%d", i))
		var tg []string
		if tags != nil {
			tg = tags(i)
		}
		c.eventually(30*time.Second, "a put", func() error {
			_, err := n.Put(ctx, kv.PutRequest{Collection: coll, Key: k, Value: []byte("5"), Tags: tg})
			return err
		})
		members = append(members, kv.KeyRef{Collection: coll, Key: k})
	}
	return members
}

// groupTransfer moves one unit from member a to member b of group id in a
// group transaction on n, keeping their tags.
func groupTransfer(ctx context.Context, n *Node, id string, a, b kv.KeyRef) error {
	_, _, err := groupTransact(ctx, n, id, func(attempt string) error {
		ra, _, err := n.TxnGet(ctx, attempt, a)
		if err != nil {
			return err
		}
		rb, _, err := n.TxnGet(ctx, attempt, b)
		if err != nil {
			return err
		}
		x, _ := strconv.Atoi(string(ra.Value))
		y, _ := strconv.Atoi(string(rb.Value))
		if err := n.TxnPut(ctx, attempt, kv.PutItem{Collection: a.Collection, Key: a.Key, Value: []byte(strconv.Itoa(x - 1)), Tags: ra.Tags}); err != nil {
			return err
		}
		return n.TxnPut(ctx, attempt, kv.PutItem{Collection: b.Collection, Key: b.Key, Value: []byte(strconv.Itoa(y + 1)), Tags: rb.Tags})
	})
	return err
}

// TestCommitAfterARefusedRead: a read the transaction's lock request was
// refused for (a key a group holds) took no lock and returned nothing to
// the transaction, so it leaves nothing to validate: the transaction
// still commits, and is not answered that its locks were lost.
func TestCommitAfterARefusedRead(t *testing.T) {
	n := openTest(t, t.TempDir(), Options{Logger: quietLogger(), TickInterval: 20 * time.Millisecond})
	defer n.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "c", Partitioning: kv.PartitionRange, SplitPoints: [][]byte{[]byte("m")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.CreateGroup(ctx, kv.GroupSpec{ID: "g", Leader: kv.KeyRef{Collection: "c", Key: []byte("a-leader")},
		Members: []kv.KeyRef{{Collection: "c", Key: []byte("b-member")}}}); err != nil {
		t.Fatal(err)
	}
	for _, other := range []string{"", "x-free"} { // alone, and with a read of another shard
		id, err := n.BeginTxn(ctx, kv.TxnOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := n.TxnGet(ctx, id, kv.KeyRef{Collection: "c", Key: []byte("b-member")}); kv.CodeOf(err) != kv.CodeKeyInGroup {
			t.Fatalf("read of a group's key: %v, want key_in_group", err)
		}
		if other != "" {
			if _, _, err := n.TxnGet(ctx, id, kv.KeyRef{Collection: "c", Key: []byte(other)}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := n.CommitTxn(ctx, id); err != nil {
			t.Errorf("commit after a refused read (other read %q): %v", other, err)
		}
	}
	// And with writes, on the refused key's shard and on another.
	for _, key := range []string{"c-free", "y-free"} {
		id, err := n.BeginTxn(ctx, kv.TxnOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := n.TxnGet(ctx, id, kv.KeyRef{Collection: "c", Key: []byte("b-member")}); kv.CodeOf(err) != kv.CodeKeyInGroup {
			t.Fatalf("read of a group's key: %v, want key_in_group", err)
		}
		if err := n.TxnPut(ctx, id, kv.PutItem{Collection: "c", Key: []byte(key), Value: []byte("v")}); err != nil {
			t.Fatal(err)
		}
		v, err := n.CommitTxn(ctx, id)
		if err != nil {
			t.Errorf("commit of a write of %s after a refused read: %v", key, err)
			continue
		}
		if rec, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte(key)}); err != nil || rec.Version != v {
			t.Errorf("%s after the commit: %+v %v, want version %d", key, rec, err, v)
		}
	}
}

// TestPlainWriteOfAGhostHeldKey: a late J of a group that no longer exists
// (a retry that arrived after the group was refused or deleted) yields its
// key to that ghost until the group's leader answers the JA with a D. A
// plain put, delete, batch put or delete-range of the key, or a
// transaction's write of it, meanwhile waits for the release and succeeds; it is never answered
// that the key belongs to the ghost, nor that the ghost does not exist.
func TestPlainWriteOfAGhostHeldKey(t *testing.T) {
	n := openTest(t, t.TempDir(), Options{Logger: quietLogger(), TickInterval: 20 * time.Millisecond})
	defer n.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "c", Partitioning: kv.PartitionRange}); err != nil {
		t.Fatal(err)
	}
	d, _ := n.collection("c")
	s := group.ShardID(d.Shards[0].ID)
	// The leader's Ds are held back for a while: the ghost holds its key.
	var release atomic.Bool
	var held atomic.Int32
	hook := func(m group.Message) bool {
		if m.Type == group.MsgD && !release.Load() {
			held.Add(1)
			return true
		}
		return false
	}
	n.groups.sent.Store(&hook)
	for _, k := range []string{"delete-me", "read-me"} {
		if _, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte(k), Value: []byte("v")}); err != nil {
			t.Fatal(err)
		}
	}
	ghostHolds := func(k string) bool { return n.groupHolding(uint64(s), d.ID, []byte(k)) == "ghost" }
	deadline := time.Now().Add(30 * time.Second)
	// yield has the ghost's J delivered to keys until the ghost holds each
	// (a J whose yield was not applied is not retried by a leader here).
	yield := func(keys ...string) {
		t.Helper()
		for {
			var missing []string
			for _, k := range keys {
				if !ghostHolds(k) {
					missing = append(missing, k)
				}
			}
			if len(missing) == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the ghost does not hold %v, %d Ds held", missing, held.Load())
			}
			for _, k := range missing {
				j := group.EncodeMessage(group.Message{Type: group.MsgJ, From: s, To: s, Group: group.Ref{ID: "ghost", Leader: s, Inc: 1},
					Key: group.Key{Collection: d.ID, Key: k}})
				n.deliverGroupMessages(ctx, &groupMessages{Messages: [][]byte{j}})
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	yield("put-me", "delete-me", "read-me")
	// A read of a key the ghost holds reads its value.
	if rec, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte("read-me")}); err != nil || string(rec.Value) != "v" {
		t.Fatalf("read of a key a ghost holds: %+v %v", rec, err)
	}
	// So does a read-only transaction's, at its timestamp: the ghost
	// wrote nothing.
	ro, err := n.BeginTxn(ctx, kv.TxnOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if rec, _, err := n.TxnGet(ctx, ro, kv.KeyRef{Collection: "c", Key: []byte("read-me")}); err != nil || string(rec.Value) != "v" {
		t.Fatalf("read-only read of a key a ghost holds: %+v, %v", rec, err)
	}
	// The writes meet the ghost; the Ds go out while they retry.
	time.AfterFunc(50*time.Millisecond, func() { release.Store(true) })
	v, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte("put-me"), Value: []byte("mine")})
	if err != nil {
		t.Fatalf("put of a key a ghost holds: %v", err)
	}
	if rec, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte("put-me")}); err != nil || string(rec.Value) != "mine" || rec.Version != v {
		t.Fatalf("read after the put: %+v %v", rec, err)
	}
	if _, err := n.Delete(ctx, kv.DeleteRequest{Collection: "c", Key: []byte("delete-me")}); err != nil {
		t.Fatalf("delete of a key a ghost holds: %v", err)
	}
	if _, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte("delete-me")}); kv.CodeOf(err) != kv.CodeNotFound {
		t.Fatalf("read after the delete: %v, want not_found", err)
	}

	// Again, for a transaction and then for a batch put, each meeting a
	// ghost of its own.
	ghost := func(k string) {
		release.Store(false)
		yield(k)
		time.AfterFunc(50*time.Millisecond, func() { release.Store(true) })
	}
	ghost("txn-me")
	id, err := n.BeginTxn(ctx, kv.TxnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := n.TxnGetForUpdate(ctx, id, kv.KeyRef{Collection: "c", Key: []byte("txn-me")}); err != nil {
		t.Fatalf("transaction read of a key a ghost holds: %v", err)
	}
	if err := n.TxnPut(ctx, id, kv.PutItem{Collection: "c", Key: []byte("txn-me"), Value: []byte("t")}); err != nil {
		t.Fatalf("transaction write of a key a ghost holds: %v", err)
	}
	if _, err := n.CommitTxn(ctx, id); err != nil {
		t.Fatalf("commit: %v", err)
	}
	ghost("batch-me")
	if _, err := n.BatchPut(ctx, []kv.PutItem{{Collection: "c", Key: []byte("batch-me"), Value: []byte("b")}, {Collection: "c", Key: []byte("free"), Value: []byte("f")}}); err != nil {
		t.Fatalf("batch put of a key a ghost holds: %v", err)
	}
	for k, v := range map[string]string{"batch-me": "b", "free": "f", "txn-me": "t"} {
		if rec, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte(k)}); err != nil || string(rec.Value) != v {
			t.Errorf("%s after the writes: %q %v, want %q", k, rec.Value, err, v)
		}
	}
	// And a delete-range over a key the ghost holds.
	for _, k := range []string{"range-a", "range-me"} {
		if _, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte(k), Value: []byte("v")}); err != nil {
			t.Fatal(err)
		}
	}
	ghost("range-me")
	res, err := n.DeleteRange(ctx, kv.DeleteRangeRequest{Collection: "c", Start: []byte("range-"), End: []byte("range-z")})
	if err != nil || res.Deleted != 2 {
		t.Fatalf("delete-range over a key a ghost holds: %+v %v, want 2 deleted", res, err)
	}
	for _, k := range []string{"range-a", "range-me"} {
		if _, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte(k)}); kv.CodeOf(err) != kv.CodeNotFound {
			t.Errorf("%s after the delete-range: %v, want not_found", k, err)
		}
	}
}

// TestGroupDuplicateJoin: a J delivered twice at once (a retry racing the
// first) yields the key once and refuses nothing: the second is not
// answered "locked" because of the first one's yield.
func TestGroupDuplicateJoin(t *testing.T) {
	n := openTest(t, t.TempDir(), Options{Logger: quietLogger(), TickInterval: 20 * time.Millisecond})
	defer n.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "c", Partitioning: kv.PartitionRange}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var refused []group.Message
	hook := func(m group.Message) bool {
		if m.Type == group.MsgJA && m.Refused != "" {
			mu.Lock()
			refused = append(refused, m)
			mu.Unlock()
		}
		return false
	}
	n.groups.sent.Store(&hook)
	d, _ := n.collection("c")
	s := group.ShardID(d.Shards[0].ID)
	for i := range 20 {
		k := group.Key{Collection: d.ID, Key: fmt.Sprintf("k%d", i)}
		j := group.EncodeMessage(group.Message{Type: group.MsgJ, From: s, To: s, Group: group.Ref{ID: "ghost", Leader: s, Inc: 1}, Key: k})
		n.deliverGroupMessages(ctx, &groupMessages{Messages: [][]byte{j, j, j}})
	}
	mu.Lock()
	defer mu.Unlock()
	if len(refused) > 0 {
		t.Fatalf("a duplicate J was refused: %v", refused[0])
	}
}

// TestSystemCollectionsAreReadOnly: the registry of groups (_groups) can
// be read, but a user can neither write into it — by any write path —
// nor drop it, nor create a collection named like a system one; the
// groups go on working.
func TestSystemCollectionsAreReadOnly(t *testing.T) {
	n := openTest(t, t.TempDir(), Options{Logger: quietLogger(), TickInterval: 20 * time.Millisecond})
	defer n.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "p", Partitioning: kv.PartitionHash, Shards: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.CreateGroup(ctx, kv.GroupSpec{ID: "g", Leader: kv.KeyRef{Collection: "p", Key: []byte("a")}, Members: []kv.KeyRef{{Collection: "p", Key: []byte("b")}}}); err != nil {
		t.Fatal(err)
	}
	reg, err := n.Get(ctx, kv.GetRequest{Collection: groupsCollection, Key: []byte("g")})
	if err != nil {
		t.Fatalf("reading the registration of g: %v", err)
	}
	sys := kv.KeyRef{Collection: groupsCollection, Key: []byte("g")}
	txnID, err := n.BeginTxn(ctx, kv.TxnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer n.AbortTxn(ctx, txnID)
	writes := map[string]func() error{
		"put": func() error {
			_, err := n.Put(ctx, kv.PutRequest{Collection: sys.Collection, Key: sys.Key, Value: []byte("forged")})
			return err
		},
		"delete": func() error {
			_, err := n.Delete(ctx, kv.DeleteRequest{Collection: sys.Collection, Key: sys.Key})
			return err
		},
		"batch put": func() error {
			_, err := n.BatchPut(ctx, []kv.PutItem{{Collection: "p", Key: []byte("c"), Value: []byte("1")}, {Collection: sys.Collection, Key: []byte("h"), Value: []byte("forged")}})
			return err
		},
		"batch delete": func() error {
			_, err := n.BatchDelete(ctx, []kv.KeyRef{sys})
			return err
		},
		"delete range": func() error {
			_, err := n.DeleteRange(ctx, kv.DeleteRangeRequest{Collection: sys.Collection})
			return err
		},
		"drop": func() error { return n.DropCollection(ctx, groupsCollection) },
		"create": func() error {
			_, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "_mine", Partitioning: kv.PartitionHash, Shards: 1})
			return err
		},
		"one-shot transaction": func() error {
			_, err := n.ExecTxn(ctx, kv.ExecRequest{Then: []kv.TxnOp{{Op: kv.TxnOpPut, Collection: sys.Collection, Key: sys.Key, Value: []byte("forged")}}})
			return err
		},
		"transaction put": func() error {
			return n.TxnPut(ctx, txnID, kv.PutItem{Collection: sys.Collection, Key: sys.Key, Value: []byte("forged")})
		},
		"group member": func() error {
			_, err := n.CreateGroup(ctx, kv.GroupSpec{ID: "h", Leader: kv.KeyRef{Collection: "p", Key: []byte("d")}, Members: []kv.KeyRef{sys}})
			return err
		},
	}
	for name, write := range writes {
		if err := write(); kv.CodeOf(err) != kv.CodeInvalidArgument || !strings.Contains(err.Error(), "reserved") {
			t.Errorf("%s into %s: %v, want invalid_argument naming the reservation", name, groupsCollection, err)
		}
	}
	if _, err := n.Get(ctx, kv.GetRequest{Collection: "p", Key: []byte("c")}); kv.CodeOf(err) != kv.CodeNotFound {
		t.Errorf("the refused batch wrote its other item: %v", err)
	}
	if _, err := n.DescribeCollection(ctx, "_mine"); kv.CodeOf(err) != kv.CodeCollectionNotFound {
		t.Errorf("_mine: %v, want collection_not_found", err)
	}
	again, err := n.Get(ctx, kv.GetRequest{Collection: groupsCollection, Key: []byte("g")})
	if err != nil || string(again.Value) != string(reg.Value) || again.Version != reg.Version {
		t.Fatalf("the registration of g changed: %q at %d, was %q at %d (%v)", again.Value, again.Version, reg.Value, reg.Version, err)
	}
	if err := n.DeleteGroup(ctx, "g"); err != nil {
		t.Fatalf("deleting g: %v", err)
	}
}

// TestGroupValuesAreCopies: the values a group's reads return — a group
// transaction's get, a single-key get and a batch get of a member — are
// the caller's own: scribbling over them changes nothing in the group.
func TestGroupValuesAreCopies(t *testing.T) {
	n, ctx := openWithCollection(t)
	ref := kv.KeyRef{Collection: "c", Key: []byte("k")}
	if _, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: ref.Key, Value: []byte("value")}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.CreateGroup(ctx, kv.GroupSpec{ID: "g", Leader: ref}); err != nil {
		t.Fatal(err)
	}
	scribble := func(b []byte) {
		for i := range b {
			b[i] = 'x'
		}
	}
	check := func(how string) {
		t.Helper()
		rec, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: ref.Key})
		if err != nil || string(rec.Value) != "value" {
			t.Fatalf("after scribbling over the value of %s: %q, %v", how, rec.Value, err)
		}
	}
	if _, _, err := groupTransact(ctx, n, "g", func(a string) error {
		rec, found, err := n.TxnGet(ctx, a, ref)
		if err != nil || !found {
			return fmt.Errorf("get: %v %v", found, err)
		}
		scribble(rec.Value)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	check("a group transaction's get")
	rec, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: ref.Key})
	if err != nil {
		t.Fatal(err)
	}
	scribble(rec.Value)
	check("a get")
	res, err := n.BatchGet(ctx, []kv.KeyRef{ref})
	if err != nil || len(res.Items) != 1 {
		t.Fatalf("batch get: %+v %v", res, err)
	}
	scribble(res.Items[0].Value)
	check("a batch get")
}

// openWithCollection opens a node, closed when the test ends, with the
// hash collection "c" of two shards, and a context of a minute.
func openWithCollection(t *testing.T) (*Node, context.Context) {
	t.Helper()
	n := openTest(t, t.TempDir(), Options{Logger: quietLogger(), TickInterval: 20 * time.Millisecond})
	t.Cleanup(func() { n.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "c", Partitioning: kv.PartitionHash, Shards: 2}); err != nil {
		t.Fatal(err)
	}
	return n, ctx
}

// TestGroupDeleteRemovesRegistration: the leader removes a deleted group's
// registration while the members are released, the version the deleter
// read and no other; the deleter removes it if the leader did not; either
// way the id is free once the delete answers.
func TestGroupDeleteRemovesRegistration(t *testing.T) {
	n, ctx := openWithCollection(t)
	spec := func(id string) kv.GroupSpec {
		return kv.GroupSpec{ID: id, Leader: kv.KeyRef{Collection: "c", Key: []byte(id + "-leader")}, Members: []kv.KeyRef{{Collection: "c", Key: []byte(id + "-m")}}}
	}
	registered := func(id string) (uint64, bool) {
		t.Helper()
		_, v, err := n.registration(ctx, id)
		if kv.CodeOf(err) == kv.CodeNotFound {
			return 0, false
		}
		if err != nil {
			t.Fatal(err)
		}
		return v, true
	}
	// The usual way: the delete answers with the registration gone, and
	// the id can be taken again at once.
	if _, err := n.CreateGroup(ctx, spec("g")); err != nil {
		t.Fatal(err)
	}
	if err := n.DeleteGroup(ctx, "g"); err != nil {
		t.Fatal(err)
	}
	if _, ok := registered("g"); ok {
		t.Fatal("g is registered after its delete answered")
	}
	if _, err := n.CreateGroup(ctx, spec("g")); err != nil {
		t.Fatalf("creating g again: %v", err)
	}

	// The leader says when it removed the registration, so that the
	// deleter need not read it again.
	v, ok := registered("g")
	if !ok {
		t.Fatal("g is not registered")
	}
	gShard := func(id string) uint64 {
		t.Helper()
		reg, _, err := n.registration(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		_, shardID, err := n.groupKey(ctx, kv.KeyRef{Collection: reg.Collection, Key: reg.Key})
		if err != nil {
			t.Fatal(err)
		}
		return shardID
	}
	resp, err := n.groupDeleteHere(ctx, &groupDeleteRequest{Shard: gShard("g"), ID: "g", RegVersion: v})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.Unregistered {
		t.Fatal("the leader removed g's registration and does not say so")
	}
	if _, ok := registered("g"); ok {
		t.Fatal("g is registered after its leader said it was not")
	}

	// A leader asked with another version of the registration leaves it;
	// the deleter, which read it, removes it.
	if _, err := n.CreateGroup(ctx, spec("h")); err != nil {
		t.Fatal(err)
	}
	v, ok = registered("h")
	if !ok {
		t.Fatal("h is not registered")
	}
	resp, err = n.groupDeleteHere(ctx, &groupDeleteRequest{Shard: gShard("h"), ID: "h", RegVersion: v + 1000})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.Unregistered {
		// Not of that version: nothing of it for the deleter to remove.
		t.Fatal("a leader asked to remove another version of h's registration answers that it is still there")
	}
	if v2, ok := registered("h"); !ok || v2 != v {
		t.Fatalf("a leader asked to remove another version of h's registration removed it (%d, %v)", v2, ok)
	}
	if err := n.DeleteGroup(ctx, "h"); err != nil {
		t.Fatal(err)
	}
	if _, ok := registered("h"); ok {
		t.Fatal("h is registered after its delete answered")
	}
}

// TestGroupCreateWhileDeleting: a create of an id whose group is still
// being deleted (its registration already gone) waits a while for it to
// go, then answers already_exists, not the old group's creation; once the
// delete has answered, the id is free.
func TestGroupCreateWhileDeleting(t *testing.T) {
	n, ctx := openWithCollection(t)
	spec := kv.GroupSpec{ID: "g", Leader: kv.KeyRef{Collection: "c", Key: []byte("leader")}, Members: []kv.KeyRef{{Collection: "c", Key: []byte("m")}}}
	if _, err := n.CreateGroup(ctx, spec); err != nil {
		t.Fatal(err)
	}
	// No D gets through: the deletion stays where it is.
	var hold atomic.Bool
	hold.Store(true)
	hook := func(m group.Message) bool { return hold.Load() && m.Type == group.MsgD }
	n.groups.sent.Store(&hook)
	deleted := make(chan error, 1)
	go func() { deleted <- n.DeleteGroup(ctx, "g") }()
	// Wait until the deletion is logged and the registration gone.
	for {
		if _, _, err := n.registration(ctx, "g"); kv.CodeOf(err) == kv.CodeNotFound {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the registration of the group being deleted stays")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := n.CreateGroup(ctx, spec); kv.CodeOf(err) != kv.CodeAlreadyExists {
		t.Fatalf("create while the group is being deleted: %v, want already_exists", err)
	}
	select {
	case err := <-deleted:
		t.Fatalf("the delete answered while its Ds were held: %v", err)
	default:
	}
	hold.Store(false) // the retries get through
	if err := <-deleted; err != nil {
		t.Fatal(err)
	}
	if _, err := n.CreateGroup(ctx, spec); err != nil {
		t.Fatalf("create after the delete answered: %v", err)
	}
}

// TestGroupCreateSameIDConcurrently: two requests create the same id with
// different keys at once, their leaders in different shards or in the
// same one. At most one succeeds; the id then names it (registration and
// group agree), and every key of a request that failed is free again: a
// group of them can be created at once.
func TestGroupCreateSameIDConcurrently(t *testing.T) {
	n := openTest(t, t.TempDir(), Options{Logger: quietLogger(), TickInterval: 20 * time.Millisecond})
	defer n.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "r", Partitioning: kv.PartitionRange, SplitPoints: [][]byte{[]byte("m")}}); err != nil {
		t.Fatal(err)
	}
	ref := func(k string) kv.KeyRef { return kv.KeyRef{Collection: "r", Key: []byte(k)} }
	wins := 0
	for round := range 12 {
		id := fmt.Sprintf("g%d", round)
		// Leaders in shards 1 and 2, or both in shard 1.
		otherLeader := fmt.Sprintf("z-%d", round)
		if round%2 == 1 {
			otherLeader = fmt.Sprintf("c-%d", round)
		}
		specs := []kv.GroupSpec{
			{ID: id, Leader: ref(fmt.Sprintf("a-%d", round)), Members: []kv.KeyRef{ref(fmt.Sprintf("b-%d", round)), ref(fmt.Sprintf("y-%d", round))}},
			{ID: id, Leader: ref(otherLeader), Members: []kv.KeyRef{ref(fmt.Sprintf("d-%d", round)), ref(fmt.Sprintf("x-%d", round))}},
		}
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for i := range specs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = n.CreateGroup(ctx, specs[i])
			}()
		}
		wg.Wait()
		winner := -1
		for i, err := range errs {
			switch {
			case err == nil:
				if winner >= 0 {
					t.Fatalf("round %d: both creations of %s succeeded", round, id)
				}
				winner = i
			case kv.CodeOf(err) != kv.CodeAlreadyExists:
				t.Fatalf("round %d: creation %d: %v, want success or already_exists", round, i, err)
			}
		}
		if winner >= 0 {
			wins++
			info, err := n.DescribeGroup(ctx, id)
			if err != nil || string(info.Leader.Key) != string(specs[winner].Leader.Key) {
				t.Fatalf("round %d: %s describes %+v, %v; want the winner's, led by %s", round, id, info, err, specs[winner].Leader.Key)
			}
		} else if _, _, err := n.registration(ctx, id); kv.CodeOf(err) != kv.CodeNotFound {
			t.Fatalf("round %d: no creation succeeded, yet %s is registered (%v)", round, id, err)
		}
		for i, sp := range specs {
			if i == winner {
				continue
			}
			free := kv.GroupSpec{ID: fmt.Sprintf("free-%d-%d", round, i), Leader: sp.Leader, Members: sp.Members}
			created, err := n.CreateGroup(ctx, free)
			if err != nil || len(created.Joined) != 3 {
				t.Fatalf("round %d: the keys of the failed creation %d are not free: %+v, %v", round, i, created, err)
			}
			if err := n.DeleteGroup(ctx, free.ID); err != nil {
				t.Fatal(err)
			}
		}
		if winner >= 0 {
			if err := n.DeleteGroup(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Logf("%d of 12 rounds had a winner", wins)
}

// TestGroupReleasingMemberReadsGroupValue: while a group is being deleted
// and a member's D (carrying the group's last write of it) has not been
// stored by its shard, plain reads of the member — a get, a batch get —
// answer the group's value, not the shard's older one.
func TestGroupReleasingMemberReadsGroupValue(t *testing.T) {
	n, ctx := openWithCollection(t)
	m := kv.KeyRef{Collection: "c", Key: []byte("m")}
	if _, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: m.Key, Value: []byte("before")}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.CreateGroup(ctx, kv.GroupSpec{ID: "g", Leader: kv.KeyRef{Collection: "c", Key: []byte("leader")}, Members: []kv.KeyRef{m}}); err != nil {
		t.Fatal(err)
	}
	// Nothing is shipped, and no D gets through: the shard keeps "before".
	var hold atomic.Bool
	hold.Store(true)
	hook := func(msg group.Message) bool {
		return hold.Load() && (msg.Type == group.MsgShip || msg.Type == group.MsgD)
	}
	n.groups.sent.Store(&hook)
	if _, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: m.Key, Value: []byte("after")}); err != nil {
		t.Fatal(err)
	}
	deleted := make(chan error, 1)
	go func() { deleted <- n.DeleteGroup(ctx, "g") }()
	for {
		if _, _, err := n.registration(ctx, "g"); kv.CodeOf(err) == kv.CodeNotFound {
			break // the deletion is logged
		}
		if ctx.Err() != nil {
			t.Fatal("the group is not being deleted")
		}
		time.Sleep(5 * time.Millisecond)
	}
	check := func(when string) {
		t.Helper()
		if r, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: m.Key}); err != nil || string(r.Value) != "after" {
			t.Fatalf("%s: get of the member: %q %v, want after", when, r.Value, err)
		}
		res, err := n.BatchGet(ctx, []kv.KeyRef{m})
		if err != nil || !res.Items[0].Found || string(res.Items[0].Value) != "after" {
			t.Fatalf("%s: batch get of the member: %+v %v, want after", when, res.Items, err)
		}
	}
	check("while its D is held")
	hold.Store(false)
	if err := <-deleted; err != nil {
		t.Fatal(err)
	}
	check("after the delete")
}

// TestGroupWritesSetTags: a group holds its members' tags with their
// values. A member joins with the tags its shard stores; a put in a group
// transaction, a one-shot group transaction or a plain put of a member
// sets them as a plain put does; reads of the member (a get, a batch get,
// a group transaction's get) answer them; a tag query sees the group's
// tags; after the deletion the key's shard stores the last ones.
func TestGroupWritesSetTags(t *testing.T) {
	n, ctx := openWithCollection(t)
	m := kv.KeyRef{Collection: "c", Key: []byte("m")}
	for _, k := range []string{"m", "x"} {
		if _, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte(k), Value: []byte("v0"), Tags: []string{"old"}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := n.CreateGroup(ctx, kv.GroupSpec{ID: "g", Leader: kv.KeyRef{Collection: "c", Key: []byte("leader")}, Members: []kv.KeyRef{m}}); err != nil {
		t.Fatal(err)
	}
	tagged := func(tag string) []string {
		t.Helper()
		res, err := n.GetByTags(ctx, kv.TagQuery{Collection: "c", All: []string{tag}})
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, it := range res.Items {
			keys = append(keys, string(it.Key))
		}
		return keys
	}
	check := func(when, value string, tags ...string) {
		t.Helper()
		r, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: m.Key})
		if err != nil || string(r.Value) != value || !slices.Equal(r.Tags, tags) {
			t.Fatalf("%s: get: %q tags %q (%v), want %q tags %q", when, r.Value, r.Tags, err, value, tags)
		}
		res, err := n.BatchGet(ctx, []kv.KeyRef{m})
		if err != nil || string(res.Items[0].Value) != value || !slices.Equal(res.Items[0].Tags, tags) {
			t.Fatalf("%s: batch get: %+v (%v), want %q tags %q", when, res.Items, err, value, tags)
		}
		for _, tag := range tags {
			if got := tagged(tag); !slices.Contains(got, "m") {
				t.Fatalf("%s: tag %q lists %q, not m", when, tag, got)
			}
		}
		if got := tagged("old"); !slices.Equal(got, map[bool][]string{true: {"m", "x"}, false: {"x"}}[slices.Contains(tags, "old")]) {
			t.Fatalf("%s: tag old lists %q", when, got)
		}
	}
	check("joined", "v0", "old")

	if _, _, err := groupTransact(ctx, n, "g", func(a string) error {
		r, found, err := n.TxnGet(ctx, a, m)
		if err != nil || !found || !slices.Equal(r.Tags, []string{"old"}) {
			return fmt.Errorf("group transaction's get: %+v %v %v", r, found, err)
		}
		if err := n.TxnPut(ctx, a, kv.PutItem{Collection: "c", Key: m.Key, Value: []byte("v1"), Tags: []string{"t1", "u1"}}); err != nil {
			return err
		}
		r, _, err = n.TxnGet(ctx, a, m)
		if err != nil || !slices.Equal(r.Tags, []string{"t1", "u1"}) {
			return fmt.Errorf("the transaction does not read its own tags: %+v %v", r, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	check("after a group transaction", "v1", "t1", "u1")

	if _, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: m.Key, Value: []byte("v2"), Tags: []string{"t2"}}); err != nil {
		t.Fatal(err)
	}
	check("after a plain put", "v2", "t2")
	if _, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: m.Key, Value: []byte("v3")}); err != nil {
		t.Fatal(err)
	}
	check("after a plain put without tags", "v3")
	if _, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: m.Key, Value: []byte("v"), Tags: []string{""}}); kv.CodeOf(err) != kv.CodeInvalidArgument {
		t.Fatalf("a put of a member with an empty tag: %v, want invalid_argument", err)
	}

	res, err := n.ExecGroupTxn(ctx, "g", kv.ExecRequest{Then: []kv.TxnOp{{Op: kv.TxnOpPut, Collection: "c", Key: m.Key, Value: []byte("v4"), Tags: []string{"t4"}}}})
	if err != nil || !res.Succeeded {
		t.Fatalf("one-shot group transaction: %+v %v", res, err)
	}
	check("after a one-shot group transaction", "v4", "t4")

	if err := n.DeleteGroup(ctx, "g"); err != nil {
		t.Fatal(err)
	}
	check("after the delete", "v4", "t4")
	if _, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: m.Key, Value: []byte("v5"), Tags: []string{"old"}}); err != nil {
		t.Fatal(err)
	}
	check("a plain put after the delete", "v5", "old")
}

// TestGroupDeleteAnswersOnceFree: a deletion answers once every member's
// shard has sent DA (it logged the key's release, with the group's last
// writes of it), before the leader has logged the releases in turn. Right
// after each answer, in a loop: every member reads the group's last
// write with a plain get, outside the group (batch get included), takes a
// plain write, and joins a new group at once; and the deleted group's id
// is free.
func TestGroupDeleteAnswersOnceFree(t *testing.T) {
	n := openTest(t, t.TempDir(), Options{Logger: quietLogger(), TickInterval: 20 * time.Millisecond})
	defer n.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "c", Partitioning: kv.PartitionHash, Shards: 4}); err != nil {
		t.Fatal(err)
	}
	var members []kv.KeyRef
	for i := range 6 {
		members = append(members, kv.KeyRef{Collection: "c", Key: []byte(fmt.Sprintf("k%d", i))})
	}
	for round := range 15 {
		id := fmt.Sprintf("g%d", round)
		created, err := n.CreateGroup(ctx, kv.GroupSpec{ID: id, Leader: members[0], Members: members})
		if err != nil || len(created.Joined) != len(members) {
			t.Fatalf("round %d: create: %+v %v", round, created, err)
		}
		want := fmt.Sprintf("v%d", round)
		if _, _, err := groupTransact(ctx, n, id, func(a string) error {
			for _, m := range members {
				if err := n.TxnPut(ctx, a, kv.PutItem{Collection: m.Collection, Key: m.Key, Value: []byte(want)}); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatalf("round %d: group transaction: %v", round, err)
		}
		if err := n.DeleteGroup(ctx, id); err != nil {
			t.Fatalf("round %d: delete: %v", round, err)
		}
		batch, err := n.BatchGet(ctx, members)
		if err != nil {
			t.Fatalf("round %d: batch get after the delete: %v", round, err)
		}
		for i, m := range members {
			rec, err := n.Get(ctx, kv.GetRequest{Collection: m.Collection, Key: m.Key})
			if err != nil || string(rec.Value) != want {
				t.Fatalf("round %d: %s after the delete = %q, %v; want the group's last write %q", round, m.Key, rec.Value, err, want)
			}
			if it := batch.Items[i]; !it.Found || string(it.Value) != want {
				t.Fatalf("round %d: batch get of %s after the delete = %+v, want %q", round, m.Key, it, want)
			}
		}
		if _, err := n.BatchPut(ctx, []kv.PutItem{{Collection: "c", Key: members[1].Key, Value: []byte(want)}}); err != nil {
			t.Fatalf("round %d: a batch put of a member right after the delete: %v", round, err)
		}
		if _, err := n.DescribeGroup(ctx, id); kv.CodeOf(err) != kv.CodeNotFound {
			t.Fatalf("round %d: describe after the delete: %v, want not_found", round, err)
		}
	}
}

// TestGroupProtocolBatched: the records that the messages of one step of
// the protocol log in a shard (the yields of a creation's Js, the joins
// of their JAs, the frees of a deletion's Ds, ...) go in one proposal per
// shard, not one per member: creating and deleting a group of 16 keys in
// two shards takes a few proposals, where one per member per step would
// take at least 48 (16 yields, joins and frees) before the delete answers.
func TestGroupProtocolBatched(t *testing.T) {
	n, ctx := openWithCollection(t)
	spec := func(id string) kv.GroupSpec {
		s := kv.GroupSpec{ID: id, Leader: kv.KeyRef{Collection: "c", Key: []byte(id + "-0")}}
		for i := 1; i < 16; i++ {
			s.Members = append(s.Members, kv.KeyRef{Collection: "c", Key: []byte(fmt.Sprintf("%s-%d", id, i))})
		}
		return s
	}
	// The first group creates the groups' collection.
	if _, err := n.CreateGroup(ctx, spec("warm")); err != nil {
		t.Fatal(err)
	}
	if err := n.DeleteGroup(ctx, "warm"); err != nil {
		t.Fatal(err)
	}
	before := testutil.ToFloat64(n.metrics.repl.Proposals)
	created, err := n.CreateGroup(ctx, spec("g"))
	if err != nil {
		t.Fatal(err)
	}
	if len(created.Joined) != 16 {
		t.Fatalf("joined %d keys, want 16", len(created.Joined))
	}
	if err := n.DeleteGroup(ctx, "g"); err != nil {
		t.Fatal(err)
	}
	proposals := testutil.ToFloat64(n.metrics.repl.Proposals) - before
	if proposals > 32 {
		t.Fatalf("creating and deleting a group of 16 keys took %v proposals", proposals)
	}
	t.Logf("%v proposals", proposals)
}

// TestGroupCachedReadsValidatedInApply: the reads a writing attempt took
// from a snapshot its client kept are compared with the group as its
// leader replica has it, without a read barrier (TxnGroupCachedReads with
// writes). What makes that safe is the commit's validation in Apply, which
// fails a read made stale between the comparison and the commit; a read
// stale already is refused at once, with writes or without.
func TestGroupCachedReadsValidatedInApply(t *testing.T) {
	n, ctx := openWithCollection(t)
	ref := func(k string) kv.KeyRef { return kv.KeyRef{Collection: "c", Key: []byte(k)} }
	if _, err := n.CreateGroup(ctx, kv.GroupSpec{ID: "g", Leader: ref("a"), Members: []kv.KeyRef{ref("b")}}); err != nil {
		t.Fatal(err)
	}
	write := func(k, v string) uint64 {
		t.Helper()
		version, _, err := groupTransact(ctx, n, "g", func(a string) error {
			return n.TxnPut(ctx, a, kv.PutItem{Collection: "c", Key: []byte(k), Value: []byte(v)})
		})
		if err != nil {
			t.Fatal(err)
		}
		return version
	}
	read := func(version uint64) []kv.BatchGetItem {
		return []kv.BatchGetItem{{Collection: "c", Key: []byte("a"), Found: true, Value: []byte("1"), Version: version}}
	}
	va := write("a", "1")
	for _, writes := range []bool{true, false} {
		a, err := n.BeginGroupTxn(ctx, "g", kv.TxnOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := n.TxnGroupCachedReads(ctx, a, read(va-1), writes); kv.CodeOf(err) != kv.CodeTxnAborted {
			t.Fatalf("a stale cached read (writes %v): %v, want txn_aborted", writes, err)
		}
	}
	a, err := n.BeginGroupTxn(ctx, "g", kv.TxnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.TxnGroupCachedReads(ctx, a, read(va), true); err != nil {
		t.Fatal(err)
	}
	write("a", "2")
	if err := n.TxnPut(ctx, a, kv.PutItem{Collection: "c", Key: []byte("b"), Value: []byte("from a stale read")}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.CommitTxn(ctx, a); kv.CodeOf(err) != kv.CodeTxnAborted {
		t.Fatalf("commit of an attempt whose cached read went stale after it was compared: %v, want txn_aborted", err)
	}
	if rec, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte("b")}); kv.CodeOf(err) != kv.CodeNotFound {
		t.Fatalf("b is %q (%v) after the attempt failed", rec.Value, err)
	}
}

// TestGroupCreateKeepsRegistration: a node that created a group knows its
// registration: the group's first transaction there begins without
// reading it (here, with the registration's record removed behind the
// node's back, it still begins; a node that did not create the group
// reads it, and finds none).
func TestGroupCreateKeepsRegistration(t *testing.T) {
	n, ctx := openWithCollection(t)
	ref := func(k string) kv.KeyRef { return kv.KeyRef{Collection: "c", Key: []byte(k)} }
	if _, err := n.CreateGroup(ctx, kv.GroupSpec{ID: "g", Leader: ref("a"), Members: []kv.KeyRef{ref("b")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Delete(systemContext(ctx), kv.DeleteRequest{Collection: groupsCollection, Key: []byte("g")}); err != nil {
		t.Fatal(err)
	}
	a, err := n.BeginGroupTxn(ctx, "g", kv.TxnOptions{})
	if err != nil {
		t.Fatalf("the first transaction of a group created here: %v", err)
	}
	_ = n.AbortTxn(ctx, a)
	n.forgetRegistration("g")
	if _, err := n.BeginGroupTxn(ctx, "g", kv.TxnOptions{}); kv.CodeOf(err) != kv.CodeNotFound {
		t.Fatalf("a transaction of a group whose registration is gone, not known here: %v, want not_found", err)
	}
}
