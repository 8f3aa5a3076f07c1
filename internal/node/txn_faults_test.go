package node

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/shard"
	"github.com/groupkv/groupkv/internal/txn"
)

// TestTxnStarvation runs long transactions — each reads and rewrites six
// hot keys, thinking a few milliseconds between operations, one at a
// time — against eight clients running short transactions on the same keys without
// pause. Wound-wait keeps a long transaction's priority across its
// attempts, so it becomes the oldest and commits; no transaction needs
// more attempts than there are concurrent transactions.
func TestTxnStarvation(t *testing.T) {
	seed := clusterSeed(t)
	t.Logf("seed %d (GROUPKV_SEED=%d replays the clients' choices)", seed, seed)
	const txnTimeout = 2 * time.Second
	c := startCluster(t, 3, func(o *Options) { o.TxnTimeout = txnTimeout })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c.createTxnCollections(ctx)
	keys := make([]kv.KeyRef, 6)
	for i := range keys {
		keys[i] = kv.KeyRef{Collection: "h", Key: []byte(fmt.Sprintf("hot%d", i))}
	}
	// incr reads a counter and writes it back plus one.
	incr := func(n *Node, id string, k kv.KeyRef) error {
		rec, _, err := n.TxnGet(ctx, id, k)
		if err != nil {
			return err
		}
		v, _ := strconv.Atoi(string(rec.Value))
		return n.TxnPut(ctx, id, kv.PutItem{Collection: k.Collection, Key: k.Key, Value: []byte(strconv.Itoa(v + 1))})
	}

	const shorts = 8
	var stop atomic.Bool
	var wg sync.WaitGroup
	var mu sync.Mutex
	var attempts []int        // of every committed short transaction
	leaderAborts := 0         // attempts aborted by a change of leader
	var worstReasons []string // why the short transaction with the most attempts aborted
	// twice lists the transactions one transaction wounded twice: a
	// wounded transaction's retry waits until its wounder's transaction
	// has ended, so none should be there.
	var twice []string
	errs := make(chan error, shorts+1)
	for cl := range shorts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(cl)))
			for !stop.Load() {
				n := c.nodes[rng.IntN(len(c.nodes))].n
				ks := []kv.KeyRef{keys[rng.IntN(len(keys))]}
				if rng.IntN(2) == 0 {
					ks = append(ks, keys[rng.IntN(len(keys))])
				}
				tctx, tcancel := context.WithTimeout(ctx, 30*time.Second)
				lost := 0
				var reasons []string
				wounders := map[uint64]int{} // priority → wounds
				_, a, err := transactObserved(tctx, n, func(id string) error {
					for _, k := range ks {
						if err := incr(n, id, k); err != nil {
							return err
						}
					}
					return nil
				}, func(err error, w *txn.Meta) {
					reason := err.Error()
					if w != nil {
						reason += fmt.Sprintf(" [wounded by priority %d attempt %d]", w.Priority, w.Attempt)
						if wounders[w.Priority]++; wounders[w.Priority] == 2 {
							mu.Lock()
							twice = append(twice, fmt.Sprintf("priority %d wounded the same transaction twice (%s)", w.Priority, reason))
							mu.Unlock()
						}
					}
					reasons = append(reasons, reason)
					if leaderChanged(err) {
						lost++
					}
				})
				tcancel()
				if err != nil {
					errs <- fmt.Errorf("a short transaction through node %d: %w", n.id, err)
					return
				}
				mu.Lock()
				// An attempt whose locks a change of leader took is a
				// failure's, not the contention's: the bound below is on
				// the others.
				attempts = append(attempts, a-lost)
				leaderAborts += lost
				if a-lost > len(worstReasons) {
					worstReasons = reasons
				}
				mu.Unlock()
			}
		}()
	}
	time.Sleep(300 * time.Millisecond) // the contention is on

	// Three long transactions, one after the other, each through another
	// node.
	const longs = 3
	var longAttempts []int
	var longErr error
	for i := range longs {
		n := c.nodes[i%len(c.nodes)].n
		deadline := 60 * time.Second // a hang-catcher, not a bound
		lctx, lcancel := context.WithTimeout(ctx, deadline)
		start := time.Now()
		lost := 0
		_, a, err := transactObserved(lctx, n, func(id string) error {
			for _, k := range keys {
				time.Sleep(3 * time.Millisecond)
				if err := incr(n, id, k); err != nil {
					return err
				}
			}
			return nil
		}, func(err error, _ *txn.Meta) {
			if leaderChanged(err) {
				lost++
			}
		})
		lcancel()
		a -= lost
		mu.Lock()
		leaderAborts += lost
		mu.Unlock()
		if err != nil {
			longErr = fmt.Errorf("long transaction %d did not commit within %v (%d attempts): %w", i, deadline, a, err)
			break
		}
		t.Logf("seed %d: long transaction %d through node %d committed after %d attempts in %v", seed, i, n.id, a, time.Since(start).Round(time.Millisecond))
		longAttempts = append(longAttempts, a)
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("seed %d: %v", seed, err)
	}
	if longErr != nil {
		t.Fatalf("seed %d: %v", seed, longErr)
	}
	mu.Lock()
	all := append(slices.Clone(attempts), longAttempts...)
	nShort := len(attempts)
	mu.Unlock()
	slices.Sort(all)
	pct := func(p float64) int { return all[min(len(all)-1, int(p*float64(len(all))))] }
	hist := map[int]int{}
	for _, a := range all {
		hist[a]++
	}
	t.Logf("seed %d: long transactions' attempts %v; %d short transactions committed meanwhile; attempts of all p50=%d p99=%d max=%d; histogram %v; %d attempts lost to a change of leader (not counted)",
		seed, longAttempts, nShort, pct(0.5), pct(0.99), all[len(all)-1], hist, leaderAborts)
	if nShort == 0 {
		t.Errorf("seed %d: no short transaction committed: there was no contention", seed)
	}
	// Wound-wait bounds a transaction's attempts by the concurrent
	// transactions: only a transaction older than it wounds it, and once
	// (its retry waits until the wounder's transaction has ended, following
	// the wounder's own retries), so it aborts at most once per other
	// transaction running when it began.
	const concurrent = shorts + 1
	for _, s := range twice {
		t.Errorf("seed %d: %s", seed, s)
	}
	if m := all[len(all)-1]; m > concurrent {
		t.Errorf("seed %d: a transaction needed %d attempts, more than the %d concurrent transactions; long ones needed %v; the short one with the most aborted for: %q",
			seed, m, concurrent, longAttempts, worstReasons)
	}
}

// prepareOnly runs the first phase of the commit of attempt id on its
// coordinator n — every participant prepares, as CommitTxn would — and
// returns the highest prepare version, leaving the record PENDING: what a
// coordinator that dies between the phases leaves behind.
func prepareOnly(ctx context.Context, n *Node, id string) (txn.Meta, uint64, error) {
	s, err := n.session(id, func() {})
	if err != nil {
		return txn.Meta{}, 0, err
	}
	defer s.unlock()
	var commitTS uint64
	for _, p := range s.parts {
		res, err := n.propose(ctx, p.shard, shard.EncodeTxnPrepare(&shard.TxnPrepareCmd{Meta: s.meta, LockTerm: p.term, Writes: p.writes, Reads: p.reads}))
		if err == nil && res.Err != nil {
			err = res.Err
		}
		if err != nil {
			return s.meta, 0, fmt.Errorf("preparing shard %d: %w", p.shard, err)
		}
		commitTS = max(commitTS, res.Version)
	}
	return s.meta, commitTS, nil
}

// TestTxnCoordinatorCrash stops the node that coordinates three
// transactions on keys of shards led by other nodes: one holds locks only,
// one has prepared in every participant, one has also committed its record
// but resolved no intent. Transactions through another node then get every
// key within a bound set by TxnTimeout (checked generously, 10×, only to
// catch hangs), and no partial commit shows: the prepared transaction's
// writes are all invisible, the committed one's all visible, to plain
// batch reads and to transactions alike. The committed transaction's
// record, which its coordinator never marked, is removed once its intents
// are resolved.
func TestTxnCoordinatorCrash(t *testing.T) {
	const txnTimeout = 2 * time.Second
	c := startCluster(t, 3, func(o *Options) { o.TxnTimeout, o.TxnRecordRetention = txnTimeout, 500*time.Millisecond })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c.createTxnCollections(ctx)

	// The victim: a node that leads neither of two shards of h; the keys
	// live in those two shards.
	d, err := c.node(1).n.collection("h")
	if err != nil {
		t.Fatal(err)
	}
	leaders := map[uint64]uint64{} // shard → leading node
	for _, s := range d.Shards {
		leaders[s.ID] = c.leader(s.ID).id
	}
	var victim *testNode
	var pair []uint64
	for _, cand := range c.nodes {
		pair = pair[:0]
		for _, s := range d.Shards {
			if leaders[s.ID] != cand.id && len(pair) < 2 {
				pair = append(pair, s.ID)
			}
		}
		if len(pair) == 2 {
			victim = cand
			break
		}
	}
	if victim == nil {
		t.Fatalf("no node leads fewer than three of the four shards: leaders %v", leaders)
	}
	// keysIn returns count keys named prefix… in shard id, none reused.
	used := map[string]bool{}
	keysIn := func(id uint64, prefix string, count int) []kv.KeyRef {
		var out []kv.KeyRef
		for i := 0; len(out) < count; i++ {
			k := fmt.Sprintf("%s%d", prefix, i)
			if _, sid := victim.n.route(d, []byte(k)); sid == id && !used[k] {
				used[k] = true
				out = append(out, kv.KeyRef{Collection: "h", Key: []byte(k)})
			}
		}
		return out
	}
	// Each case writes two keys in one shard and one in the other, so
	// that the record's shard and another participant both hold intents.
	caseKeys := func(prefix string) []kv.KeyRef {
		return append(keysIn(pair[0], prefix, 2), keysIn(pair[1], prefix, 1)...)
	}
	lockedKeys, preparedKeys, committedKeys := caseKeys("locked"), caseKeys("prepared"), caseKeys("committed")
	t.Logf("node %d coordinates; shards %v are led by nodes %d and %d", victim.id, pair, leaders[pair[0]], leaders[pair[1]])

	vn := victim.n
	// begin starts a transaction on the victim that writes "dead" to keys
	// (reading the first: a read lock that becomes a write lock).
	begin := func(keys []kv.KeyRef) string {
		t.Helper()
		id, err := vn.BeginTxn(ctx, kv.TxnOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := vn.TxnGet(ctx, id, keys[0]); err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if err := vn.TxnPut(ctx, id, kv.PutItem{Collection: k.Collection, Key: k.Key, Value: []byte("dead")}); err != nil {
				t.Fatal(err)
			}
		}
		return id
	}
	begin(lockedKeys)
	preparedID := begin(preparedKeys)
	if _, _, err := prepareOnly(ctx, vn, preparedID); err != nil {
		t.Fatalf("preparing: %v", err)
	}
	committedID := begin(committedKeys)
	meta, commitTS, err := prepareOnly(ctx, vn, committedID)
	if err != nil {
		t.Fatalf("preparing: %v", err)
	}
	rec, err := vn.recordCAS(ctx, txn.RecordCmd{Op: txn.OpCommit, Meta: meta, TS: commitTS, Participants: slices.Sorted(slices.Values(pair)), Listed: true})
	if err != nil || rec.Status != txn.Committed {
		t.Fatalf("committing the record: %+v, %v", rec, err)
	}

	t.Logf("stopping node %d without aborting or resolving anything", victim.id)
	victim.srv.Stop()
	c.net.isolate(victim.id)
	if err := vn.Close(); err != nil {
		t.Fatal(err)
	}
	var other *testNode
	for _, tn := range c.nodes {
		if tn != victim {
			other = tn
			break
		}
	}
	on := other.n

	// Before anyone touches the keys: the shards' resolved timestamps, held
	// below the dead coordinator's prepares while their intents stay, move
	// past them (the shards' leaders settle prepares their coordinators
	// left), so watches and reads at a resolved timestamp go on.
	now0, err := on.latest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range pair {
		start := time.Now()
		c.eventually(10*txnTimeout, fmt.Sprintf("shard %d's resolved timestamp past the dead coordinator's prepares", id), func() error {
			rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
			defer rcancel()
			now, err := on.latest(rctx)
			if err != nil {
				return err
			}
			r, err := on.resolved(rctx, id, now)
			if err != nil {
				return err
			}
			if r < now0 {
				return fmt.Errorf("resolved %d, below %d", r, now0)
			}
			return nil
		})
		t.Logf("shard %d resolved past the crash after %v", id, time.Since(start).Round(time.Millisecond))
	}
	orphans := 0.0
	for _, tn := range c.nodes {
		if tn != victim {
			orphans += testutil.ToFloat64(tn.n.metrics.orphans)
		}
	}
	if orphans == 0 {
		t.Error("no node counted a prepare the dead coordinator left as resolved")
	}

	// visible reads keys with one plain batch get and reports how many
	// hold the dead coordinator's value.
	visible := func(keys []kv.KeyRef) int {
		t.Helper()
		var res kv.BatchGetResult
		c.eventually(30*time.Second, "a batch get", func() error {
			bctx, bcancel := context.WithTimeout(ctx, 5*time.Second)
			defer bcancel()
			var err error
			res, err = on.BatchGet(bctx, keys)
			return err
		})
		dead := 0
		for _, it := range res.Items {
			if it.Found && string(it.Value) == "dead" {
				dead++
			}
		}
		return dead
	}
	if v := visible(preparedKeys); v != 0 {
		t.Errorf("a plain read sees %d of the %d writes of the prepared, uncommitted transaction", v, len(preparedKeys))
	}
	if v := visible(committedKeys); v != len(committedKeys) {
		t.Errorf("a plain read sees %d of the %d writes of the committed transaction", v, len(committedKeys))
	}

	// Transactions through another node take every key: each reads its
	// keys (all or none of the dead writes), then overwrites them.
	for _, tc := range []struct {
		name string
		keys []kv.KeyRef
		want int // dead values the transaction must read
	}{
		{"locked", lockedKeys, 0},
		{"prepared", preparedKeys, 0},
		{"committed", committedKeys, len(committedKeys)},
	} {
		bound := 10 * txnTimeout // a hang-catcher, not a timing assertion
		tctx, tcancel := context.WithTimeout(ctx, bound)
		start := time.Now()
		var seen int
		_, attempts, err := transact(tctx, on, kv.TxnOptions{}, func(id string) error {
			seen = 0
			for _, k := range tc.keys {
				r, found, err := on.TxnGet(tctx, id, k)
				if err != nil {
					return err
				}
				if found && string(r.Value) == "dead" {
					seen++
				}
			}
			for _, k := range tc.keys {
				if err := on.TxnPut(tctx, id, kv.PutItem{Collection: k.Collection, Key: k.Key, Value: []byte("alive")}); err != nil {
					return err
				}
			}
			return nil
		})
		tcancel()
		if err != nil {
			t.Fatalf("%s: the keys of the dead coordinator's transaction were not free within %v (10×TxnTimeout): %v", tc.name, bound, err)
		}
		t.Logf("%s: node %d's transaction took the keys and committed after %v (%d attempts)", tc.name, other.id, time.Since(start).Round(time.Millisecond), attempts)
		if seen != tc.want {
			t.Errorf("%s: the transaction read %d of the %d dead writes, want %d", tc.name, seen, len(tc.keys), tc.want)
		}
		if v := visible(tc.keys); v != 0 {
			t.Errorf("%s: after the overwrite a plain read still sees %d dead writes", tc.name, v)
		}
	}
	c.eventually(10*txnTimeout, "the unmarked record of the committed transaction removed", func() error {
		found := false
		eachTxnRecord(t, on, d.ID, func(id string, _ txn.Record) { found = found || id == committedID })
		if found {
			return fmt.Errorf("the record of %s is still there", committedID)
		}
		return nil
	})
}

// TestTxnLocksLostOnLeaderChange takes a transaction's read lock on a
// key, moves its shard's leadership, and commits: the locks were volatile
// state of the old leader, so the commit fails with txn_aborted — for a
// one-phase commit, a two-phase one and a read-only validation — and a
// retry of the same priority (RetryOf) commits.
func TestTxnLocksLostOnLeaderChange(t *testing.T) {
	seed := clusterSeed(t)
	t.Logf("seed %d", seed)
	c := startCluster(t, 3, func(o *Options) { o.TxnTimeout = 2 * time.Second })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c.createTxnCollections(ctx)
	rng := rand.New(rand.NewPCG(seed, 0))
	d, err := c.node(1).n.collection("h")
	if err != nil {
		t.Fatal(err)
	}
	shardA, shardB := d.Shards[0].ID, d.Shards[1].ID
	for _, tc := range []struct {
		name string
		// writes are the keys written after the read of key read (in
		// shardA).
		read   []byte
		writes [][]byte
	}{
		{"one-phase", c.keyIn(d, shardA, "one-r"), [][]byte{c.keyIn(d, shardA, "one-w")}},
		{"two-phase", c.keyIn(d, shardA, "two-r"), [][]byte{c.keyIn(d, shardA, "two-w"), c.keyIn(d, shardB, "two-w")}},
		{"read-only", c.keyIn(d, shardA, "ro-r"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := c.nodes[rng.IntN(len(c.nodes))].n
			run := func(id string) error {
				if _, _, err := n.TxnGet(ctx, id, kv.KeyRef{Collection: "h", Key: tc.read}); err != nil {
					return err
				}
				for _, k := range tc.writes {
					if err := n.TxnPut(ctx, id, kv.PutItem{Collection: "h", Key: k, Value: []byte(tc.name)}); err != nil {
						return err
					}
				}
				return nil
			}
			id, err := n.BeginTxn(ctx, kv.TxnOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if err := run(id); err != nil {
				t.Fatal(err)
			}
			from, to := c.moveLeader(shardA, rng)
			t.Logf("transaction %s through node %d held a read lock in shard %d; moved its leadership from node %d to node %d", id, n.id, shardA, from, to)
			_, err = n.CommitTxn(ctx, id)
			if kv.CodeOf(err) != kv.CodeTxnAborted {
				t.Fatalf("the commit after the change of leader answered %v, want txn_aborted", err)
			}
			t.Logf("the commit failed as it should: %v", err)
			// The retry keeps the priority. (The rebalancer may hand the
			// leadership back meanwhile, aborting a retry too: retry again.)
			prev := id
			p0, _, _ := txn.ParseID(id)
			for attempt := 2; ; attempt++ {
				retry, err := n.BeginTxn(ctx, kv.TxnOptions{RetryOf: prev})
				if err != nil {
					t.Fatal(err)
				}
				if p, a, _ := txn.ParseID(retry); p != p0 || a != uint32(attempt) {
					t.Fatalf("retry %s has priority %d attempt %d; want %d and %d", retry, p, a, p0, attempt)
				}
				err = run(retry)
				if err == nil {
					_, err = n.CommitTxn(ctx, retry)
				}
				if err == nil {
					break
				}
				n.AbortTxn(ctx, retry)
				if kv.CodeOf(err) != kv.CodeTxnAborted || attempt == 5 {
					t.Fatalf("attempt %d (retry of %s) did not commit: %v", attempt, prev, err)
				}
				t.Logf("attempt %d aborted too: %v", attempt, err)
				prev = retry
			}
			for _, k := range tc.writes {
				r, err := n.Get(ctx, kv.GetRequest{Collection: "h", Key: k})
				if err != nil || string(r.Value) != tc.name {
					t.Fatalf("after the retry %s = %q, %v", k, r.Value, err)
				}
			}
		})
	}
}

// TestTxnOnePhaseCommitEndedContext commits a one-shard transaction with
// a context that ended. A commit that answers txn_aborted must never
// become visible — the client would retry it and apply its writes twice;
// one that cannot tell answers commit_unknown. (A commit now runs to its
// end whatever becomes of its request, so these commit;
// TestTxnCommitContextCancelled requires it.)
func TestTxnOnePhaseCommitEndedContext(t *testing.T) {
	n, ctx := openRangeTxn(t)
	for i := range 20 {
		key := []byte(fmt.Sprintf("k%d", i))
		id, err := n.BeginTxn(ctx, kv.TxnOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := n.TxnPut(ctx, id, kv.PutItem{Collection: "c", Key: key, Value: []byte("v")}); err != nil {
			t.Fatal(err)
		}
		ended, cancel := context.WithCancel(ctx)
		cancel()
		_, cerr := n.CommitTxn(ended, id)
		if cerr == nil || kv.CodeOf(cerr) == kv.CodeCommitUnknown {
			continue
		}
		if kv.CodeOf(cerr) != kv.CodeTxnAborted {
			t.Fatalf("commit %d with an ended context: %v", i, cerr)
		}
		// It said aborted: the write must stay invisible. A barrier
		// write to the same shard orders the read after any proposal the
		// commit queued.
		if _, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte("barrier"), Value: []byte("b")}); err != nil {
			t.Fatal(err)
		}
		if r, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: key}); err == nil {
			t.Fatalf("commit %d answered %v, yet its write is visible (%q at version %d)", i, cerr, r.Value, r.Version)
		}
	}
}

// leaderChanged reports an abort because a change of a shard's leader took
// the transaction's locks (a failure, not a conflict).
func leaderChanged(err error) bool {
	msg := err.Error()
	return kv.CodeOf(err) == kv.CodeTxnAborted && (strings.Contains(msg, "changed leader") || strings.Contains(msg, "change of leader"))
}

// transactObserved is transact, telling aborted of the error of every
// attempt that aborted and of the transaction that wounded it (nil: the
// attempt was not wounded, or its node does not know by whom).
func transactObserved(ctx context.Context, n *Node, fn func(id string) error, aborted func(err error, wounder *txn.Meta)) (uint64, int, error) {
	var opts kv.TxnOptions
	for attempt := 1; ; attempt++ {
		id, err := n.BeginTxn(ctx, opts)
		if err != nil {
			return 0, attempt, err
		}
		err = fn(id)
		var v uint64
		if err == nil {
			v, err = n.CommitTxn(ctx, id)
		}
		if err == nil {
			return v, attempt, nil
		}
		n.AbortTxn(ctx, id)
		if kv.CodeOf(err) != kv.CodeTxnAborted || ctx.Err() != nil {
			return 0, attempt, err
		}
		n.txns.mu.Lock()
		wounder := n.txns.ended[id].wounder
		n.txns.mu.Unlock()
		aborted(err, wounder)
		opts.RetryOf = id
		time.Sleep(time.Duration(rand.N(attempt*2+1)) * time.Millisecond)
	}
}
