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

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/elle"
	"github.com/groupkv/groupkv/internal/kv"
)

// List-append histories of transactions, checked by internal/elle: each
// key holds a list of integers, written as "1,5,9"; an append reads the
// list and writes it back with one more element, unique in the whole
// history; a read returns the list. Every attempt of every transaction is
// recorded, with the outcome its client learned.

// elleKey is a key of a list-append workload.
type elleKey struct {
	coll string
	key  string
}

func (k elleKey) name() string { return k.coll + "/" + k.key }

func (k elleKey) ref() kv.KeyRef { return kv.KeyRef{Collection: k.coll, Key: []byte(k.key)} }

func encodeList(l []int) []byte {
	s := make([]string, len(l))
	for i, v := range l {
		s[i] = strconv.Itoa(v)
	}
	return []byte(strings.Join(s, ","))
}

func decodeList(b []byte) ([]int, error) {
	if len(b) == 0 {
		return nil, nil
	}
	var l []int
	for _, s := range strings.Split(string(b), ",") {
		v, err := strconv.Atoi(s)
		if err != nil {
			return nil, fmt.Errorf("list %q: %w", b, err)
		}
		l = append(l, v)
	}
	return l, nil
}

// nodePool is the set of nodes clients may send transactions to; a node
// being restarted is out of it.
type nodePool struct {
	mu    sync.Mutex
	nodes []*Node // nil: down
}

func newNodePool(c *testCluster) *nodePool {
	p := &nodePool{}
	for _, tn := range c.nodes {
		p.nodes = append(p.nodes, tn.n)
	}
	return p
}

func (p *nodePool) pick(rng *rand.Rand) *Node {
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		if n := p.nodes[rng.IntN(len(p.nodes))]; n != nil {
			return n
		}
	}
}

func (p *nodePool) set(i int, n *Node) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.nodes[i] = n
}

// appendWorkload runs list-append transactions through a pool of nodes
// and records them.
type appendWorkload struct {
	pool *nodePool
	rec  *elle.Recorder
	keys []elleKey
	// maxOps bounds the micro-operations of a read-write transaction.
	maxOps int
	// readOnlyEvery: one transaction in readOnlyEvery is a read-only one
	// (a snapshot read of several keys); 0: none.
	readOnlyEvery int
	// txnTimeout bounds one transaction, all attempts (a hang-catcher).
	txnTimeout time.Duration
	// group, if set, runs the read-write transactions as transactions of
	// that Key Group (its keys must be the group's), reading key by key.
	group string

	next                      atomic.Int64 // the last value appended
	committed, failed, infos  atomic.Int64
	readOnlyCommitted, errors atomic.Int64
	maxAttempts               atomic.Int64
	// firstErr keeps the first error that is not a transaction's outcome
	// (a garbled list).
	firstErr atomic.Pointer[error]
	// notes says, for each recorded attempt by its history ID, where it
	// ran and how it ended, for the report of an anomaly.
	notes sync.Map
}

// plannedOp is one micro-operation of a transaction: an append (TxnGet
// the list, TxnPut it with one more element) or a read.
type plannedOp struct {
	append bool
	key    elleKey
}

// run runs transactions as client cl until stop is set.
func (w *appendWorkload) run(ctx context.Context, cl int, rng *rand.Rand, stop *atomic.Bool) {
	for !stop.Load() && ctx.Err() == nil {
		n := w.pool.pick(rng)
		var plan []plannedOp
		readOnly := w.readOnlyEvery > 0 && rng.IntN(w.readOnlyEvery) == 0
		if readOnly {
			for _, i := range rng.Perm(len(w.keys))[:min(len(w.keys), 2+rng.IntN(3))] {
				plan = append(plan, plannedOp{key: w.keys[i]})
			}
		} else {
			for range 1 + rng.IntN(w.maxOps) {
				plan = append(plan, plannedOp{append: rng.IntN(2) == 0, key: w.keys[rng.IntN(len(w.keys))]})
			}
		}
		w.txn(ctx, cl, n, plan, readOnly, rng.IntN(2) == 0)
	}
}

// txn runs one transaction of plan on n with the retry helper, recording
// each attempt: committed → OK; aborted (txn_aborted), or any error before
// the commit was sent → Fail; any other error after it was sent → Info.
// An attempt is invoked before it begins: its snapshot and priority are
// drawn in BeginTxn, and a transaction that completes while BeginTxn runs
// is concurrent with it, not before it.
//
// With batch, the attempt reads every key of the plan first in one
// TxnBatchGet (a key planned twice asked twice), for update on odd
// clients when it appends, and then runs the plan on what it read and
// its own appends, as its gets would have answered.
func (w *appendWorkload) txn(ctx context.Context, cl int, n *Node, plan []plannedOp, readOnly, batch bool) {
	ctx, cancel := context.WithTimeout(ctx, w.txnTimeout)
	defer cancel()
	var p *elle.Pending
	var ops, observed []elle.Op
	commitSent := false
	begin := func() {
		if p != nil {
			// The previous attempt was aborted: transact retries only
			// txn_aborted.
			p.Complete(nil, elle.Fail)
			w.failed.Add(1)
		}
		commitSent = false
		ops = make([]elle.Op, len(plan))
		for i, op := range plan {
			if op.append {
				ops[i] = elle.Append(op.key.name(), int(w.next.Add(1)))
			} else {
				ops[i] = elle.Read(op.key.name())
			}
		}
		p = w.rec.Invoke(cl, ops)
	}
	retry := func(fn func(id string) error) (uint64, int, error) {
		return transactFrom(ctx, n, kv.TxnOptions{ReadOnly: readOnly}, begin, fn)
	}
	if w.group != "" && !readOnly {
		batch = false
		retry = func(fn func(id string) error) (uint64, int, error) {
			return groupTransactFrom(ctx, n, w.group, begin, fn)
		}
	}
	version, attempts, err := retry(func(id string) error {
		w.notes.Store(p.ID(), fmt.Sprintf("attempt %s on node %d (read-only %v, batch %v)", id, n.id, readOnly, batch))
		observed = observed[:0]
		var batched map[string]kv.Record // by key name; absent keys: none
		if batch {
			refs := make([]kv.KeyRef, len(plan))
			appends := false
			for i, op := range plan {
				refs[i] = op.key.ref()
				appends = appends || op.append
			}
			items, err := n.TxnBatchGet(ctx, id, refs, appends && cl%2 == 1)
			if err != nil {
				return err
			}
			batched = make(map[string]kv.Record)
			for i, it := range items {
				if it.Found {
					batched[plan[i].key.name()] = kv.Record{Value: it.Value}
				}
			}
		}
		for i, op := range plan {
			// Odd clients read the keys they append to for update
			// (exclusive locks from the read on), even ones under
			// shared locks: both kinds meet in every history.
			get := n.TxnGet
			if op.append && cl%2 == 1 {
				get = n.TxnGetForUpdate
			}
			if batch {
				get = func(context.Context, string, kv.KeyRef) (kv.Record, bool, error) {
					rec, found := batched[op.key.name()]
					return rec, found, nil
				}
			}
			rec, found, err := get(ctx, id, op.key.ref())
			if err != nil {
				return err
			}
			var list []int
			if found {
				if list, err = decodeList(rec.Value); err != nil {
					w.firstErr.CompareAndSwap(nil, &err)
					return err
				}
			}
			if !op.append {
				observed = append(observed, elle.Read(op.key.name(), list...))
				continue
			}
			v := ops[i].Value
			item := kv.PutItem{Collection: op.key.coll, Key: []byte(op.key.key), Value: encodeList(append(list, v))}
			if err := n.TxnPut(ctx, id, item); err != nil {
				return err
			}
			if batch {
				batched[op.key.name()] = kv.Record{Value: item.Value}
			}
			observed = append(observed, elle.Append(op.key.name(), v))
		}
		commitSent = true
		return nil
	})
	for m := w.maxAttempts.Load(); int64(attempts) > m && !w.maxAttempts.CompareAndSwap(m, int64(attempts)); m = w.maxAttempts.Load() {
	}
	if note, ok := w.notes.Load(p.ID()); ok {
		w.notes.Store(p.ID(), fmt.Sprintf("%s: version %d, err %v", note, version, err))
	}
	switch {
	case err == nil:
		p.Complete(observed, elle.OK)
		w.committed.Add(1)
		if readOnly {
			w.readOnlyCommitted.Add(1)
		}
	case !commitSent || kv.CodeOf(err) == kv.CodeTxnAborted:
		p.Complete(nil, elle.Fail)
		w.failed.Add(1)
		w.errors.Add(1)
	default:
		p.Complete(nil, elle.Info)
		w.infos.Add(1)
		w.errors.Add(1)
	}
}

func (w *appendWorkload) summary() string {
	return fmt.Sprintf("%d committed (%d read-only), %d failed attempts, %d unknown, %d transactions ended in errors, at most %d attempts",
		w.committed.Load(), w.readOnlyCommitted.Load(), w.failed.Load(), w.infos.Load(), w.errors.Load(), w.maxAttempts.Load())
}

// finalRead reads every key with one plain BatchGet through n once the
// clients stopped, records it as a transaction (invoked after every other
// one completed, so real-time edges order it last), and checks that each key's final list extends the longest list any
// committed transaction read and holds every committed append.
func (w *appendWorkload) finalRead(t *testing.T, c *testCluster, n *Node, seed uint64) {
	t.Helper()
	refs := make([]kv.KeyRef, len(w.keys))
	for i, k := range w.keys {
		refs[i] = k.ref()
	}
	var res kv.BatchGetResult
	c.eventually(30*time.Second, "the final batch get", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var err error
		res, err = n.BatchGet(ctx, refs)
		return err
	})
	final := map[string][]int{}
	for _, it := range res.Items {
		l, err := decodeList(it.Value)
		if err != nil {
			t.Fatalf("seed %d: final read: %v", seed, err)
		}
		final[it.Collection+"/"+string(it.Key)] = l
	}
	ops := make([]elle.Op, len(w.keys))
	for i, k := range w.keys {
		ops[i] = elle.Read(k.name(), final[k.name()]...)
	}
	p := w.rec.Invoke(-1, ops)
	p.Complete(ops, elle.OK)

	longest := map[string][]int{}
	appended := map[string][]int{}
	for _, tx := range w.rec.History() {
		if tx.Outcome != elle.OK {
			continue
		}
		for _, op := range tx.Ops {
			switch op.Kind {
			case elle.OpRead:
				if len(op.Values) > len(longest[op.Key]) {
					longest[op.Key] = op.Values
				}
			case elle.OpAppend:
				appended[op.Key] = append(appended[op.Key], op.Value)
			}
		}
	}
	for _, k := range w.keys {
		f, l := final[k.name()], longest[k.name()]
		if len(f) < len(l) || !slices.Equal(f[:len(l)], l) {
			t.Errorf("seed %d: key %s: the final list %v does not extend the longest list read %v", seed, k.name(), f, l)
		}
		for _, v := range appended[k.name()] {
			if !slices.Contains(f, v) {
				t.Errorf("seed %d: key %s: the committed append of %d is missing from the final list %v", seed, k.name(), v, f)
			}
		}
	}
}

// transferLeader asks the leader of shardID to hand its leadership to
// another replica, picked with rng, and returns the two node ids (0 when
// the shard had no ready leader or no other replica).
func (c *testCluster) transferLeader(shardID uint64, rng *rand.Rand) (from, to uint64) {
	for _, tn := range c.nodes {
		if !tn.n.host.Ready(shardID) {
			continue
		}
		tn.n.mu.RLock()
		ref, ok := tn.n.mu.shards[shardID]
		var others []cluster.Replica
		if ok {
			for _, r := range ref.coll.Shards[ref.index].Replicas {
				if r.Node != tn.id {
					others = append(others, r)
				}
			}
		}
		tn.n.mu.RUnlock()
		if len(others) == 0 {
			return 0, 0
		}
		r := others[rng.IntN(len(others))]
		tn.n.host.TransferLeadership(shardID, r.ID)
		return tn.id, r.Node
	}
	return 0, 0
}

// shardIDs returns the shard ids of the named collections.
func (c *testCluster) shardIDs(names ...string) []uint64 {
	c.t.Helper()
	var ids []uint64
	for _, name := range names {
		d, err := c.node(1).n.collection(name)
		if err != nil {
			c.t.Fatal(err)
		}
		for _, s := range d.Shards {
			ids = append(ids, s.ID)
		}
	}
	return ids
}

// txnCollectionH runs createTxnCollections and returns collection h.
func (c *testCluster) txnCollectionH(ctx context.Context) *cluster.CollectionDesc {
	c.t.Helper()
	c.createTxnCollections(ctx)
	d, err := c.node(1).n.collection("h")
	if err != nil {
		c.t.Fatal(err)
	}
	return d
}

// waitVoters waits until as many nodes as a shard has voters see that
// many voters of each of shards, out of any joint configuration: a
// replica that has not applied its promotion cannot stand for election,
// and while the promotion's joint configuration is not left, no election
// is won without a quorum of the voters before it (with one voter before
// it, that voter alone).
func (c *testCluster) waitVoters(voters int, shards ...uint64) {
	c.t.Helper()
	c.eventually(30*time.Second, fmt.Sprintf("%d voters of shards %v seen by each", voters, shards), func() error {
		for _, id := range shards {
			seen := 0
			for _, tn := range c.nodes {
				// A joint configuration counts only once left: until then
				// a quorum of the outgoing voters is needed too.
				if cs, ok := tn.n.host.ConfState(id); ok && len(cs.Voters) == voters && len(cs.VotersOutgoing) == 0 {
					seen++
				}
			}
			if seen < voters {
				return fmt.Errorf("%d nodes see %d voters of shard %d", seen, voters, id)
			}
		}
		return nil
	})
}

// createTxnCollections creates hash collection h (4 shards) and range
// collection r (split at "k4") and waits until every node knows them.
func (c *testCluster) createTxnCollections(ctx context.Context) {
	c.t.Helper()
	n1 := c.node(1).n
	if _, err := n1.CreateCollection(ctx, kv.CollectionOptions{Name: "h", Partitioning: kv.PartitionHash, Shards: 4}); err != nil {
		c.t.Fatal(err)
	}
	if _, err := n1.CreateCollection(ctx, kv.CollectionOptions{Name: "r", Partitioning: kv.PartitionRange, SplitPoints: [][]byte{[]byte("k4")}}); err != nil {
		c.t.Fatal(err)
	}
	for _, tn := range c.nodes {
		for _, name := range []string{"h", "r"} {
			c.eventually(30*time.Second, "collection "+name+" everywhere", func() error {
				_, err := tn.n.DescribeCollection(ctx, name)
				return err
			})
		}
	}
	for _, id := range c.shardIDs("h", "r") {
		c.leader(id)
	}
}

// txnKeys returns n keys k0, k1… spread over collections h and r.
func txnKeys(n int) []elleKey {
	keys := make([]elleKey, n)
	for i := range keys {
		coll := "h"
		if i%3 == 2 {
			coll = "r"
		}
		keys[i] = elleKey{coll: coll, key: fmt.Sprintf("k%d", i)}
	}
	return keys
}

// TestTxnListAppendStrictSerializable runs list-append transactions (and
// read-only ones) from six clients through every node of a three-node
// cluster while leaders move, a node is cut off and healed, and a node is
// stopped and started again on its data; the history of every attempt
// must be strictly serializable, and the final state must hold every
// committed append.
func TestTxnListAppendStrictSerializable(t *testing.T) {
	seed := clusterSeed(t)
	t.Logf("seed %d (GROUPKV_SEED=%d replays the clients' and the faults' choices)", seed, seed)
	c := startCluster(t, 3, func(o *Options) {
		o.TxnTimeout = 2 * time.Second
		// Records of finished transactions go as soon as they may, so that
		// their removal runs under the faults too.
		o.TxnRecordRetention = 10 * time.Millisecond
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c.createTxnCollections(ctx)
	shards := c.shardIDs("h", "r")

	w := &appendWorkload{pool: newNodePool(c), rec: &elle.Recorder{}, keys: txnKeys(8), maxOps: 4, readOnlyEvery: 6, txnTimeout: 30 * time.Second}
	var stop atomic.Bool
	var wg sync.WaitGroup
	for cl := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.run(ctx, cl, rand.New(rand.NewPCG(seed, uint64(cl))), &stop)
		}()
	}

	// The faults, from the test's goroutine.
	frng := rand.New(rand.NewPCG(seed, 1000))
	pause := func(d time.Duration) { time.Sleep(d) }
	transfer := func() {
		id := shards[frng.IntN(len(shards))]
		if from, to := c.transferLeader(id, frng); from != 0 {
			t.Logf("moving the leadership of shard %d from node %d to node %d", id, from, to)
		}
	}
	pause(time.Second)
	transfer()
	pause(500 * time.Millisecond)
	transfer()
	pause(time.Second)
	cut := uint64(1 + frng.IntN(len(c.nodes)))
	t.Logf("isolating node %d for a second", cut)
	c.net.isolate(cut)
	pause(time.Second)
	c.net.heal(cut)
	pause(1500 * time.Millisecond)
	transfer()
	pause(500 * time.Millisecond)
	down := 1 + frng.IntN(len(c.nodes))
	old := c.nodes[down-1]
	t.Logf("stopping node %d", down)
	w.pool.set(down-1, nil)
	old.srv.Stop()
	if err := old.n.Close(); err != nil {
		t.Fatalf("seed %d: closing node %d: %v", seed, down, err)
	}
	pause(time.Second)
	t.Logf("starting node %d again on its data", down)
	tn := c.startNode(uint64(down), old.n.opts.DataDir, nil, old.peer)
	c.nodes[down-1] = tn
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	if err := tn.n.WaitReady(rctx); err != nil {
		t.Fatalf("seed %d: node %d after its restart: %v", seed, down, err)
	}
	rcancel()
	w.pool.set(down-1, tn.n)
	pause(time.Second)
	transfer()
	pause(1500 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	if errp := w.firstErr.Load(); errp != nil {
		t.Fatalf("seed %d: %v", seed, *errp)
	}
	t.Logf("seed %d: %s", seed, w.summary())
	if w.committed.Load() < 20 || w.readOnlyCommitted.Load() == 0 {
		t.Errorf("seed %d: too few transactions committed to check anything: %s", seed, w.summary())
	}
	w.finalRead(t, c, c.node(1).n, seed)
	w.check(t, seed)
	forgotten := 0.0
	for _, tn := range c.nodes {
		forgotten += testutil.ToFloat64(tn.n.forgetter.forgotten)
	}
	t.Logf("seed %d: %v records of finished transactions removed during the run", seed, forgotten)
	if forgotten == 0 {
		t.Errorf("seed %d: no record of a finished transaction was removed", seed)
	}
}

// check checks the recorded history, and on an anomaly logs every
// transaction it involves: its operations, real-time bounds and where it
// ran.
func (w *appendWorkload) check(t *testing.T, seed uint64) {
	t.Helper()
	h := w.rec.History()
	res, err := elle.Check(h, elle.Options{Model: elle.StrictSerializable})
	if err != nil {
		t.Fatalf("elle check failed (seed %d): %v", seed, err)
	}
	if res.Valid {
		t.Logf("elle (seed %d): %v", seed, res)
		return
	}
	for _, a := range res.Anomalies {
		for _, id := range a.Txns {
			tx := h[id]
			note, _ := w.notes.Load(id)
			t.Logf("%v: client %d, invoked %d, completed %d; %v", tx, tx.Process, tx.Invoke, tx.Complete, note)
		}
	}
	t.Fatalf("elle (seed %d): %v", seed, res)
}

// TestTxnCheckerCatchesMissingReadLocks runs the list-append workload on
// three hot keys with read locks switched off: lost updates and read skew
// follow, and the checker must report them. It shows that the checker of
// TestTxnListAppendStrictSerializable can see what read locks prevent.
func TestTxnCheckerCatchesMissingReadLocks(t *testing.T) {
	seed := clusterSeed(t)
	t.Logf("seed %d (GROUPKV_SEED=%d replays the clients' choices)", seed, seed)
	c := startCluster(t, 3, func(o *Options) { o.TxnTimeout = 2 * time.Second })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c.createTxnCollections(ctx)
	testSkipReadLocks.Store(true)
	t.Cleanup(func() { testSkipReadLocks.Store(false) })

	w := &appendWorkload{pool: newNodePool(c), rec: &elle.Recorder{}, keys: txnKeys(3), maxOps: 4, readOnlyEvery: 8, txnTimeout: 30 * time.Second}
	const rounds = 6
	for round := 1; round <= rounds; round++ {
		var stop atomic.Bool
		var wg sync.WaitGroup
		for cl := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				w.run(ctx, cl, rand.New(rand.NewPCG(seed+uint64(round), uint64(cl))), &stop)
			}()
		}
		time.Sleep(2 * time.Second)
		stop.Store(true)
		wg.Wait()
		if errp := w.firstErr.Load(); errp != nil {
			t.Fatalf("seed %d: %v", seed, *errp)
		}
		res, err := elle.Check(w.rec.History(), elle.Options{Model: elle.StrictSerializable})
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if !res.Valid {
			t.Logf("seed %d: after round %d (%s) the checker found %v", seed, round, w.summary(), res.Types())
			for i, a := range res.Anomalies {
				if i == 5 {
					t.Logf("  … %d more", len(res.Anomalies)-i)
					break
				}
				t.Logf("  %s", a.Explanation)
			}
			return
		}
		t.Logf("seed %d: round %d: no anomaly yet (%s)", seed, round, w.summary())
	}
	t.Fatalf("seed %d: with read locks off, %d rounds of contended list appends (%s) showed the checker no anomaly: it misses lost updates, or the switch does not drop the locks",
		seed, rounds, w.summary())
}
