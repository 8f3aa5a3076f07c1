package node

import (
	"context"
	"fmt"
	"sync"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/txn"
)

// TxnBatchGet implements kv.TxnBackend: it reads refs in attempt id as
// TxnGet (forUpdate: TxnGetForUpdate) reads each of them, in one request.
// The keys of a shard are locked in one request to its leader, the
// shards' requests go out at once, and the attempt is confirmed PENDING
// once, after every lock is granted and every key read: the reads are as
// consistent as one TxnGet's. A key the attempt wrote answers that write
// (version 0). A key given twice is read once and answered twice.
//
// Every key is checked before anything is locked: a bad one (keys[i]
// named) fails the request and leaves the attempt as it was. A group
// attempt (which takes no locks) reads the keys one by one.
func (n *Node) TxnBatchGet(ctx context.Context, id string, refs []kv.KeyRef, forUpdate bool) ([]kv.BatchGetItem, error) {
	ctx, cancel, done, err := n.beginCancel(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	if err := n.checkBatchSize(len(refs), keyBytes(refs)); err != nil {
		return nil, err
	}
	if isGroupAttempt(id) {
		items := make([]kv.BatchGetItem, len(refs))
		for i, r := range refs {
			rec, found, err := n.groupTxnGet(ctx, id, r, forUpdate)
			if c := kv.CodeOf(err); c == kv.CodeInvalidArgument || c == kv.CodeCollectionNotFound {
				return nil, kv.Errorf(c, "%s: %s", keysName(i), kv.AsError(err).Message)
			}
			if err != nil {
				return nil, err
			}
			items[i] = batchItem(r, rec, found)
		}
		return items, nil
	}
	s, err := n.session(id, cancel)
	if err != nil {
		return nil, err
	}
	defer s.unlock()
	mode := txn.Shared
	if forUpdate {
		if s.readOnly {
			return nil, kv.Errorf(kv.CodeInvalidArgument, "transaction %s is read-only: it reads for update nothing it could write", s.meta.ID)
		}
		mode = txn.Exclusive
	}
	items, err := s.batchGet(ctx, refs, mode, keysName)
	return items, s.abortError(err)
}

// keysName names item i of a batch get's keys in its errors.
func keysName(i int) string { return fmt.Sprintf("keys[%d]", i) }

// batchItem is the item of a batch get answering ref with what a get of
// it answered.
func batchItem(ref kv.KeyRef, rec kv.Record, found bool) kv.BatchGetItem {
	it := kv.BatchGetItem{Collection: ref.Collection, Key: ref.Key, Found: found}
	if found {
		it.Value, it.Tags, it.Version = rec.Value, rec.Tags, rec.Version
	}
	return it
}

// shardLock is the lock request of a batch get in one shard: the keys of
// items at idx, as targets.
type shardLock struct {
	shard   uint64
	idx     []int
	targets []txn.Target
	resp    *txnLockResponse
	err     error
}

// batchGet reads refs in the attempt under locks of mode (see
// TxnBatchGet); name names a key of refs in an error.
func (s *txnSession) batchGet(ctx context.Context, refs []kv.KeyRef, mode txn.Mode, name func(int) string) ([]kv.BatchGetItem, error) {
	n := s.n
	items := make([]kv.BatchGetItem, len(refs))
	// Check every key first: nothing is locked for a request that fails.
	type routed struct {
		d      *cluster.CollectionDesc
		shard  uint64
		bucket uint16
		alone  bool // read as a get of its own (see below)
		snap   bool // read at the snapshot attempt's timestamp
		own    *bufferedWrite
		dup    int // index of the same key's first ref, or -1
	}
	rs := make([]routed, len(refs))
	first := make(map[string]int, len(refs))
	var kbuf [64]byte
	for i, ref := range refs {
		d, err := n.txnCollection(ref.Collection, ref.Key)
		if err != nil {
			return nil, kv.Errorf(kv.CodeOf(err), "%s: %s", name(i), kv.AsError(err).Message)
		}
		wk := appendWkey(kbuf[:0], d.ID, ref.Key)
		rs[i].d, rs[i].dup = d, -1
		if j, ok := first[string(wk)]; ok {
			rs[i].dup = j
			continue
		}
		first[string(wk)] = i
		if w := s.writes[string(wk)]; w != nil {
			rs[i].own = w
			continue
		}
		// A snapshot attempt reads at its timestamp, with no locks; a key
		// of a tag collection is read through its home shard's lock, as a
		// get of its own.
		if s.readTS != 0 {
			rs[i].snap = true
			continue
		}
		if d.Partitioning == kv.PartitionTag || testSkipReadLocks.Load() {
			rs[i].alone = true
			continue
		}
		rs[i].bucket, rs[i].shard = n.route(d, ref.Key)
		if !s.meta.Anchor.IsSet() {
			s.setAnchor(d, rs[i].bucket, ref.Key)
		}
	}
	if err := s.withinLimits(len(refs), keyBytes(refs)); err != nil {
		return nil, err
	}
	for i, ref := range refs {
		r := rs[i]
		if !r.alone { // a get of its own counts itself
			s.ops, s.bytes = s.ops+1, s.bytes+len(ref.Key)
		}
		switch {
		case r.dup >= 0:
		case r.own != nil && r.own.delete:
			items[i] = kv.BatchGetItem{Collection: ref.Collection, Key: ref.Key}
		case r.own != nil:
			items[i] = kv.BatchGetItem{Collection: ref.Collection, Key: ref.Key, Found: true, Value: r.own.value, Tags: r.own.tags}
		case r.alone:
			rec, found, err := s.getLocked(ctx, ref, mode)
			if err != nil {
				return nil, err
			}
			items[i] = batchItem(ref, rec, found)
		}
	}
	if s.readTS != 0 {
		if err := s.snapshotGets(ctx, refs, items, func(i int) bool { return rs[i].snap && rs[i].dup < 0 }); err != nil {
			return nil, s.fail(ctx, err)
		}
	}
	// The keys to lock, by shard, in the order their shards come.
	var locks []*shardLock
	byShard := map[uint64]*shardLock{}
	for i, r := range rs {
		if r.dup >= 0 || r.own != nil || r.alone || r.snap {
			continue
		}
		l := byShard[r.shard]
		if l == nil {
			l = &shardLock{shard: r.shard}
			byShard[r.shard] = l
			locks = append(locks, l)
		}
		l.idx = append(l.idx, i)
		l.targets = append(l.targets, txn.Target{Collection: r.d.ID, Key: refs[i].Key})
	}
	if len(locks) > 0 {
		if err := s.lockBatch(ctx, locks, mode); err != nil {
			return nil, s.fail(ctx, err)
		}
	}
	for _, l := range locks {
		for j, i := range l.idx {
			rec := l.resp.Records[j]
			items[i] = kv.BatchGetItem{Collection: refs[i].Collection, Key: refs[i].Key, Found: rec.Found}
			if rec.Found {
				items[i].Value, items[i].Tags, items[i].Version = rec.Value, rec.Tags, rec.Version
			}
			if mode == txn.Exclusive {
				if s.forUpdate == nil {
					s.forUpdate = make(map[string]uint64)
				}
				s.forUpdate[wkey(l.targets[j].Collection, refs[i].Key)] = l.shard
			}
		}
	}
	for i, r := range rs {
		if r.dup >= 0 {
			items[i] = items[r.dup]
		}
	}
	return items, nil
}

// snapshotGets reads the keys of refs that read says, at the snapshot
// attempt's timestamp, all at once, into items.
func (s *txnSession) snapshotGets(ctx context.Context, refs []kv.KeyRef, items []kv.BatchGetItem, read func(int) bool) error {
	errs := make([]error, len(refs))
	var wg sync.WaitGroup
	for i, ref := range refs {
		if !read(i) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec, err := s.n.txnGetAt(ctx, kv.GetRequest{Collection: ref.Collection, Key: ref.Key, Version: s.readTS})
			switch {
			case kv.CodeOf(err) == kv.CodeNotFound:
				items[i] = kv.BatchGetItem{Collection: ref.Collection, Key: ref.Key}
			case err != nil:
				errs[i] = err
			default:
				items[i] = batchItem(ref, rec, true)
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// lockBatch takes the locks of several shards' requests at once, with
// their keys' records, and then confirms the attempt PENDING once: a
// record check made by one shard's request as it is granted would not
// cover the locks of the others, granted later.
func (s *txnSession) lockBatch(ctx context.Context, locks []*shardLock, mode txn.Mode) error {
	checked := len(locks) == 1 && s.anchoredIn(locks[0].shard)
	if len(locks) == 1 {
		l := locks[0]
		l.resp, l.err = s.n.txnLock(ctx, s.lockRequest(l.shard, l.targets, mode, true, checked))
	} else {
		var wg sync.WaitGroup
		for _, l := range locks {
			req := s.lockRequest(l.shard, l.targets, mode, true, false)
			wg.Add(1)
			go func() {
				defer wg.Done()
				l.resp, l.err = s.n.txnLock(ctx, req)
			}()
		}
		wg.Wait()
	}
	// Every answer is noted, failed or not: the locks granted belong to
	// the attempt, which releases them when it ends.
	var first error
	for _, l := range locks {
		if err := s.granted(ctx, l.shard, l.targets, mode, true, l.resp, l.err); err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		return first
	}
	if err := s.checkPending(ctx, checked, locks[0].resp); err != nil {
		return err
	}
	seen := make([]shardSeen, len(locks))
	for i, l := range locks {
		seen[i].shard = l.shard
		for j := range l.resp.Records {
			seen[i].version = max(seen[i].version, l.resp.Records[j].seen())
		}
	}
	if err := s.validateEarlier(ctx, seen, nil); err != nil {
		return err
	}
	s.ensureHeartbeat()
	return nil
}
