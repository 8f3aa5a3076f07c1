package node

import (
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"encoding/binary"
	"sort"
	"sync"
	"time"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/shard"
)

// checkBatchSize refuses batches over the key and byte limits.
func (n *Node) checkBatchSize(count, bytes int) error {
	if count == 0 {
		return kv.Errorf(kv.CodeInvalidArgument, "the batch is empty")
	}
	if count > kv.DefaultMaxBatchKeys {
		return kv.Errorf(kv.CodeTooLarge, "the batch has %d keys, the limit is %d", count, kv.DefaultMaxBatchKeys)
	}
	if bytes > kv.MaxRequestBytes {
		return kv.Errorf(kv.CodeTooLarge, "the batch has %d bytes of keys and values, the limit is %d", bytes, kv.MaxRequestBytes)
	}
	return nil
}

// keyBytes is the bytes of the keys of refs.
func keyBytes(refs []kv.KeyRef) int {
	n := 0
	for _, r := range refs {
		n += len(r.Key)
	}
	return n
}

// BatchGet implements kv.Backend: every key is read at one version.
func (n *Node) BatchGet(ctx context.Context, keys []kv.KeyRef) (kv.BatchGetResult, error) {
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return kv.BatchGetResult{}, err
	}
	defer done()
	if err := n.checkBatchSize(len(keys), keyBytes(keys)); err != nil {
		return kv.BatchGetResult{}, err
	}
	descs := make([]*cluster.CollectionDesc, len(keys))
	keyShards := make([][]uint64, len(keys))
	shardSet := map[uint64]bool{}
	for i, k := range keys {
		d, err := n.collection(k.Collection)
		if err != nil {
			return kv.BatchGetResult{}, err
		}
		if err := kv.ValidateKey(k.Key); err != nil {
			return kv.BatchGetResult{}, kv.Errorf(kv.CodeOf(err), "keys[%d]: %s", i, kv.AsError(err).Message)
		}
		descs[i] = d
		if d.Partitioning == kv.PartitionTag {
			keyShards[i] = shardsOf(d)
		} else {
			_, id := n.route(d, k.Key)
			keyShards[i] = []uint64{id}
		}
		for _, id := range keyShards[i] {
			shardSet[id] = true
		}
	}
	shards := make([]uint64, 0, len(shardSet))
	for id := range shardSet {
		shards = append(shards, id)
	}
	sort.Slice(shards, func(i, j int) bool { return shards[i] < shards[j] })
	switch route, fwd, err := routeReadAs[kv.BatchGetResult](n, ctx, shards, "batch_get", keys); route {
	case routeForward:
		return fwd, err
	case routeSpread:
		return n.batchGetSpread(ctx, keys, descs, keyShards, shards)
	}
	// The keys groups hold now are read from their groups (overlayGroups);
	// what groups freed before now is in storage before the version is
	// taken, so that the read at it sees the writes their frees stored.
	held := n.groupHeld(descs, keys, keyShards)
	for _, id := range shards {
		if err := n.groupsVisible(ctx, id); err != nil {
			return kv.BatchGetResult{}, err
		}
	}
	version, err := n.readNow(ctx, shards)
	if err != nil {
		return kv.BatchGetResult{}, err
	}
	for i, k := range keys {
		if err := n.settleIntents(ctx, shards, descs[i].ID, k.Key, keyEnd(k.Key), version); err != nil {
			return kv.BatchGetResult{}, err
		}
	}
	res := kv.BatchGetResult{Version: version, Items: make([]kv.BatchGetItem, len(keys))}
	for i, k := range keys {
		val, v, found, err := n.readKey(descs[i].ID, k.Key, version)
		if err != nil {
			return kv.BatchGetResult{}, kv.Errorf(kv.CodeInternal, "reading %q: %v", k.Key, err)
		}
		item := kv.BatchGetItem{Collection: k.Collection, Key: k.Key, Found: found}
		if found {
			item.Value, item.Tags, item.Version = val.Value, val.Tags, v
		}
		res.Items[i] = item
	}
	if err := n.overlayGroups(ctx, descs, keyShards, held, &res); err != nil {
		return kv.BatchGetResult{}, err
	}
	return res, nil
}

// batchOp is one record of a batch write on its way to a shard.
type batchOp struct {
	index int // in the request
	desc  *cluster.CollectionDesc
	op    shard.Op
}

// BatchPut implements kv.Backend.
func (n *Node) BatchPut(ctx context.Context, items []kv.PutItem) ([]kv.WriteResult, error) {
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	size := 0
	for _, it := range items {
		size += len(it.Key) + len(it.Value)
	}
	if err := n.checkBatchSize(len(items), size); err != nil {
		return nil, err
	}
	refs := make([]kv.KeyRef, len(items))
	for i, it := range items {
		refs[i] = kv.KeyRef{Collection: it.Collection, Key: it.Key}
		if err := checkWritable(ctx, it.Collection); err != nil {
			return nil, kv.Errorf(kv.CodeOf(err), "items[%d]: %s", i, kv.AsError(err).Message)
		}
		if len(it.Value) > n.opts.MaxValueSize {
			return nil, kv.Errorf(kv.CodeTooLarge, "items[%d]: value is %d bytes, the limit is %d", i, len(it.Value), n.opts.MaxValueSize)
		}
		if err := kv.ValidateTags(it.Tags); err != nil {
			return nil, kv.Errorf(kv.CodeOf(err), "items[%d]: %s", i, kv.AsError(err).Message)
		}
	}
	return n.batchWrite(ctx, refs, func(i int, d *cluster.CollectionDesc) (shard.Op, []string) {
		it := items[i]
		hasCond, cond := condOf(it.IfVersion)
		return shard.Op{Type: shard.OpPut, Key: it.Key, Value: it.Value, Tags: it.Tags, HasCond: hasCond, CondVersion: cond}, it.Tags
	})
}

// BatchDelete implements kv.Backend.
func (n *Node) BatchDelete(ctx context.Context, keys []kv.KeyRef) ([]kv.WriteResult, error) {
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	size := 0
	for i, k := range keys {
		size += len(k.Key)
		if err := checkWritable(ctx, k.Collection); err != nil {
			return nil, kv.Errorf(kv.CodeOf(err), "keys[%d]: %s", i, kv.AsError(err).Message)
		}
	}
	if err := n.checkBatchSize(len(keys), size); err != nil {
		return nil, err
	}
	return n.batchWrite(ctx, keys, func(i int, d *cluster.CollectionDesc) (shard.Op, []string) {
		return shard.Op{Type: shard.OpDelete, Key: keys[i].Key}, nil
	})
}

// batchWrite validates the keys, places and routes them, and writes each
// shard's part as one atomic command, all shards concurrently.
func (n *Node) batchWrite(ctx context.Context, keys []kv.KeyRef, mk func(i int, d *cluster.CollectionDesc) (shard.Op, []string)) ([]kv.WriteResult, error) {
	descs := make([]*cluster.CollectionDesc, len(keys))
	seen := make(map[string]int, len(keys))
	var locks []lockRef
	for i, k := range keys {
		d, err := n.collection(k.Collection)
		if err != nil {
			return nil, err
		}
		if err := kv.ValidateKey(k.Key); err != nil {
			return nil, kv.Errorf(kv.CodeOf(err), "keys[%d]: %s", i, kv.AsError(err).Message)
		}
		id := k.Collection + "\x00" + string(k.Key)
		if j, dup := seen[id]; dup {
			return nil, kv.Errorf(kv.CodeInvalidArgument, "key %q of collection %q appears twice in the batch (at %d and %d)", k.Key, k.Collection, j, i)
		}
		seen[id] = i
		descs[i] = d
		if d.Partitioning == kv.PartitionTag {
			locks = append(locks, lockRef{d.ID, k.Key})
		}
	}
	if len(locks) > 0 {
		unlock := n.locks.lock(locks)
		defer unlock()
	}
	byShard := map[uint64][]batchOp{}
	for i, k := range keys {
		d := descs[i]
		op, tags := mk(i, d)
		var shardID uint64
		switch {
		case d.Partitioning == kv.PartitionTag && op.Type == shard.OpPut:
			b, id, err := n.placeForPut(ctx, d, k.Key, tags)
			if err != nil {
				return nil, kv.Errorf(kv.CodeOf(err), "keys[%d] (%q): %s", i, k.Key, kv.AsError(err).Message)
			}
			op.Bucket, shardID = b, id
		case d.Partitioning == kv.PartitionTag:
			tag, ok, err := n.placementOf(ctx, d, k.Key)
			if err != nil {
				return nil, err
			}
			if !ok {
				continue // never placed: nothing to delete
			}
			b, j := d.Route(k.Key, tag)
			op.Bucket, shardID = b, d.Shards[j].ID
		default:
			op.Bucket, shardID = n.route(d, k.Key)
		}
		byShard[shardID] = append(byShard[shardID], batchOp{index: i, desc: d, op: op})
	}
	if len(byShard) > 1 {
		// Several shards: one transaction, so the batch is atomic at one
		// version. (Keys of tag collections were placed above, under
		// this node's key locks; the transaction finds them placed, and
		// locks their placements before it writes. A placement made for
		// a batch that then fails names no live record, as after a
		// delete.)
		return n.batchTxn(ctx, keys, byShard)
	}
	type outcome struct {
		ops     []batchOp
		version uint64
		err     error
	}
	outcomes := make(chan outcome, len(byShard))
	var wg sync.WaitGroup
	for id, ops := range byShard {
		wg.Add(1)
		go func(id uint64, ops []batchOp) {
			defer wg.Done()
			sops := make([]shard.Op, len(ops))
			for i, o := range ops {
				sops[i] = o.op
			}
			reroute := func(prev uint64) uint64 {
				// The part routes again as a whole, or not at all.
				next := uint64(0)
				for _, o := range ops {
					id := n.rerouter(o.desc, o.op.Bucket, o.op.Key)(prev)
					if next != 0 && id != next {
						return prev
					}
					next = id
				}
				return next
			}
			cmd := shard.EncodeWrite(sops)
			deadline := time.Now().Add(n.ghostWindow())
			for attempt := 0; ; attempt++ {
				v, err := n.writeRouted(ctx, id, reroute, cmd)
				if kv.CodeOf(err) == kv.CodeKeyInGroup {
					// Keys a late join of a group gone meanwhile holds are
					// released within a few messages: wait for them.
					refs := make([]kv.KeyRef, len(ops))
					for i, o := range ops {
						refs[i] = keys[o.index]
					}
					if n.heldByGhosts(ctx, id, refs) && backoff(ctx, attempt, deadline, err) == nil {
						continue
					}
				}
				outcomes <- outcome{ops, v, err}
				break
			}
		}(id, ops)
	}
	wg.Wait()
	close(outcomes)
	results := make([]kv.WriteResult, len(keys))
	var (
		applied  []kv.WriteResult
		firstErr *kv.Error
	)
	for o := range outcomes {
		if o.err != nil {
			if firstErr == nil || firstErr.Code == kv.CodeCommitUnknown {
				firstErr = kv.AsError(o.err)
			}
			continue
		}
		for _, op := range o.ops {
			r := kv.WriteResult{Collection: keys[op.index].Collection, Key: keys[op.index].Key, Version: o.version}
			results[op.index] = r
			applied = append(applied, r)
		}
	}
	if firstErr != nil {
		if len(byShard) == 1 {
			return nil, firstErr // one shard: nothing was applied
		}
		sort.Slice(applied, func(i, j int) bool {
			return seen[applied[i].Collection+"\x00"+string(applied[i].Key)] < seen[applied[j].Collection+"\x00"+string(applied[j].Key)]
		})
		if applied == nil {
			applied = []kv.WriteResult{}
		}
		return nil, &kv.BatchError{Err: firstErr, Applied: applied}
	}
	for i := range results {
		if results[i].Key == nil {
			// A delete of a key of a tag collection that was never placed.
			results[i] = kv.WriteResult{Collection: keys[i].Collection, Key: keys[i].Key}
		}
	}
	return results, nil
}

// shardsIn returns the shards of d that may hold keys of [start, end).
func shardsIn(d *cluster.CollectionDesc, start, end []byte) []uint64 {
	if d.Partitioning != kv.PartitionRange {
		return shardsOf(d)
	}
	var ids []uint64
	for _, s := range d.Shards {
		if len(end) > 0 && s.Start != nil && bytes.Compare(s.Start, end) >= 0 {
			continue
		}
		if s.End != nil && bytes.Compare(s.End, start) <= 0 {
			continue
		}
		ids = append(ids, s.ID)
	}
	return ids
}

// DeleteRange implements kv.Backend.
func (n *Node) DeleteRange(ctx context.Context, req kv.DeleteRangeRequest) (kv.DeleteRangeResult, error) {
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return kv.DeleteRangeResult{}, err
	}
	defer done()
	if err := checkWritable(ctx, req.Collection); err != nil {
		return kv.DeleteRangeResult{}, err
	}
	d, err := n.collection(req.Collection)
	if err != nil {
		return kv.DeleteRangeResult{}, err
	}
	if len(req.End) > 0 && bytes.Compare(req.Start, req.End) >= 0 {
		return kv.DeleteRangeResult{}, kv.Errorf(kv.CodeInvalidArgument, "start %q is not below end %q", req.Start, req.End)
	}
	var end []byte
	if len(req.End) > 0 {
		end = req.End
	}
	shards := shardsIn(d, req.Start, end)
	type outcome struct {
		count int
		err   error
	}
	out := make(chan outcome, len(shards))
	for _, id := range shards {
		go func(id uint64) {
			deadline := time.Now().Add(n.ghostWindow())
			for attempt := 0; ; attempt++ {
				res, err := n.propose(ctx, id, shard.EncodeDeleteRange(req.Start, end))
				if err == nil && res.Err != nil {
					err = res.Err
				}
				// A key a late join of a group gone meanwhile holds is
				// released within a few messages: wait for it.
				if kv.CodeOf(err) == kv.CodeKeyInGroup && res.Held != nil &&
					n.heldByGhosts(ctx, id, []kv.KeyRef{{Collection: req.Collection, Key: res.Held}}) &&
					backoff(ctx, attempt, deadline, err) == nil {
					continue
				}
				out <- outcome{res.Count, err}
				return
			}
		}(id)
	}
	var (
		total  int
		failed []error
	)
	for range shards {
		o := <-out
		if o.err != nil {
			failed = append(failed, o.err)
			continue
		}
		total += o.count
	}
	if len(failed) > 0 {
		e := kv.AsError(failed[0])
		return kv.DeleteRangeResult{}, kv.Errorf(e.Code, "%d of %d shards failed (first: %s); the other shards deleted %d keys, each shard atomically",
			len(failed), len(shards), e.Message, total)
	}
	return kv.DeleteRangeResult{Deleted: total}, nil
}

// Page tokens: base64url (no padding) of version(8) | flags(1) | last key.
const pageFlagReverse = 1

func encodePage(version uint64, reverse bool, lastKey []byte) string {
	b := binary.BigEndian.AppendUint64(nil, version)
	var f byte
	if reverse {
		f |= pageFlagReverse
	}
	b = append(b, f)
	b = append(b, lastKey...)
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodePage(page string) (version uint64, reverse bool, lastKey []byte, err error) {
	b, derr := base64.RawURLEncoding.DecodeString(page)
	if derr != nil || len(b) < 9 || b[8]&^pageFlagReverse != 0 {
		return 0, false, nil, kv.Errorf(kv.CodeInvalidArgument, "page token %q is not one this server issued; pass next_page exactly as received", page)
	}
	return binary.BigEndian.Uint64(b), b[8]&pageFlagReverse != 0, b[9:], nil
}

func pageLimit(limit int) (int, error) {
	switch {
	case limit < 0:
		return 0, kv.Errorf(kv.CodeInvalidArgument, "limit %d is negative", limit)
	case limit == 0:
		return kv.DefaultPageSize, nil
	case limit > kv.MaxPageSize:
		return 0, kv.Errorf(kv.CodeInvalidArgument, "limit %d is above the page size limit %d", limit, kv.MaxPageSize)
	}
	return limit, nil
}

// readVersion resolves the version a paged read uses: the page's, the
// request's, or now.
func (n *Node) readVersion(ctx context.Context, page string, reqVersion uint64, reverse bool) (version uint64, after []byte, err error) {
	if page != "" {
		v, rev, last, err := decodePage(page)
		if err != nil {
			return 0, nil, err
		}
		if rev != reverse {
			return 0, nil, kv.Errorf(kv.CodeInvalidArgument, "the page token belongs to a scan in the other direction; keep reverse as it was")
		}
		if reqVersion != 0 && reqVersion != v {
			return 0, nil, kv.Errorf(kv.CodeInvalidArgument, "version %d differs from the version %d of the scan the page token continues", reqVersion, v)
		}
		return v, last, nil
	}
	if reqVersion != 0 {
		return reqVersion, nil, nil
	}
	v, err := n.latest(ctx)
	return v, nil, err
}

// scanVersion resolves the version of a paged read of shards, as
// readVersion does, and, on a read served here (route local), prepares
// the read at it: a read at the present takes its version from readNow.
func (n *Node) scanVersion(ctx context.Context, route readRoute, shards []uint64, page string, reqVersion uint64, reverse bool) (version uint64, after []byte, err error) {
	if route == routeSpread {
		return n.readVersion(ctx, page, reqVersion, reverse)
	}
	if page == "" && reqVersion == 0 {
		version, err = n.readNow(ctx, shards)
		return version, nil, err
	}
	if version, after, err = n.readVersion(ctx, page, reqVersion, reverse); err != nil {
		return 0, nil, err
	}
	return version, after, n.snapshotRead(ctx, shards, version)
}

// Scan implements kv.Backend.
func (n *Node) Scan(ctx context.Context, req kv.ScanRequest) (kv.ScanResult, error) {
	return n.txnScan(ctx, req, checkNone)
}

// txnScan is Scan for a transaction's scan, with check of the Key Groups
// holding keys in its span (checkGroups). A read at a timestamp
// (checkAtTimestamp) needs one, in req.Version or its page.
func (n *Node) txnScan(ctx context.Context, req kv.ScanRequest, check groupCheck) (kv.ScanResult, error) {
	if check == checkAtTimestamp && req.Version == 0 && req.Page == "" {
		return kv.ScanResult{}, errNoTimestamp()
	}
	var (
		items []kv.Record
		arena copyArena
	)
	res, streamed, err := n.scan(ctx, req, check, func(r *kv.Record) {
		if items == nil {
			items = scanItems(cmp.Or(req.Limit, kv.DefaultPageSize))
		}
		items = append(items, kv.Record{Key: arena.clone(r.Key), Value: arena.clone(r.Value), Tags: cloneTags(r.Tags), Version: r.Version})
	})
	if err != nil || !streamed {
		return res, err
	}
	if items == nil {
		items = []kv.Record{}
	}
	res.Items = items
	return res, nil
}

// ScanEach is Scan with the answer's records handed to each, in order,
// instead of returned in its Items (which are nil): each copies what it
// keeps of a record, whose slices may point into storage's buffers and
// are valid only during the call. When ScanEach fails, the records each
// received are not an answer.
func (n *Node) ScanEach(ctx context.Context, req kv.ScanRequest, each func(*kv.Record)) (kv.ScanResult, error) {
	res, streamed, err := n.scan(ctx, req, checkNone, each)
	if err != nil || streamed {
		return res, err
	}
	for i := range res.Items {
		each(&res.Items[i])
	}
	res.Items = nil
	return res, nil
}

// scan serves a scan. A scan of this node's storage hands its records to
// each (streamed); another node's answer, or one merged from several,
// comes whole in the result's Items instead.
func (n *Node) scan(ctx context.Context, req kv.ScanRequest, check groupCheck, each func(*kv.Record)) (res kv.ScanResult, streamed bool, err error) {
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return kv.ScanResult{}, false, err
	}
	defer done()
	d, err := n.collection(req.Collection)
	if err != nil {
		return kv.ScanResult{}, false, err
	}
	limit, err := pageLimit(req.Limit)
	if err != nil {
		return kv.ScanResult{}, false, err
	}
	if len(req.End) > 0 && bytes.Compare(req.Start, req.End) >= 0 {
		return kv.ScanResult{}, false, kv.Errorf(kv.CodeInvalidArgument, "start %q is not below end %q", req.Start, req.End)
	}
	op := [...]string{checkNone: "scan", checkMembers: "txn_scan_locked", checkAtTimestamp: "txn_scan_at"}[check]
	route, fwd, err := routeReadAs[kv.ScanResult](n, ctx, shardsIn(d, req.Start, req.End), op, req)
	if route == routeForward {
		return fwd, false, err
	}
	if req.Page == "" && req.Version == 0 {
		if err := n.awaitShippedFor(ctx, route, d, shardsIn(d, req.Start, req.End), req.Start, req.End); err != nil {
			return kv.ScanResult{}, false, err
		}
	}
	shards := shardsIn(d, req.Start, req.End)
	version, after, err := n.scanVersion(ctx, route, shards, req.Page, req.Version, req.Reverse)
	if err != nil {
		return kv.ScanResult{}, false, err
	}
	start, end := req.Start, req.End
	if len(start) == 0 {
		start = nil
	}
	if len(end) == 0 {
		end = nil
	}
	if after != nil {
		if req.Reverse {
			end = after // exclusive: continue below the last key returned
		} else {
			start = append(append([]byte(nil), after...), 0) // the smallest key above it
		}
	}
	if route == routeSpread {
		res, err := n.scanSpread(ctx, d, shards, version, start, end, req.Reverse, limit, check)
		return res, false, err
	}
	if err := n.checkGroups(ctx, check, n.expandLocal(shards), d.ID, start, end, version); err != nil {
		return kv.ScanResult{}, false, err
	}
	if err := n.settleIntents(ctx, n.expandLocal(shards), d.ID, start, end, version); err != nil {
		return kv.ScanResult{}, false, err
	}
	var (
		count int
		more  bool
		last  []byte    // the key of the last record handed to each
		rec   kv.Record // handed to each, one record after the other
	)
	err = shard.Scan(n.eng.DB, shard.ScanOptions{Collection: d.ID, Start: start, End: end, AsOf: version, Reverse: req.Reverse, Limit: limit + 1,
		Moves: d.Partitioning == kv.PartitionTag},
		func(r shard.ScanRecord) bool {
			if count == limit {
				more = true
				return false
			}
			count++
			last = append(last[:0], r.Key...)
			rec = kv.Record{Key: r.Key, Value: r.Value, Tags: r.Tags, Version: r.Version}
			each(&rec)
			return true
		})
	if err != nil {
		return kv.ScanResult{}, false, kv.Errorf(kv.CodeInternal, "scanning %q: %v", req.Collection, err)
	}
	if err := n.checkRetained(shards, version); err != nil {
		return kv.ScanResult{}, false, err
	}
	res = kv.ScanResult{Version: version}
	if more {
		res.NextPage = encodePage(version, req.Reverse, last)
	}
	return res, true, nil
}

func clone(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return append([]byte(nil), b...)
}

// copyArena copies the keys and values of one answer's records into a few
// shared allocations instead of two per record. What it returns keeps its
// chunk alive: it serves one answer, whose records live and die together.
type copyArena struct{ buf []byte }

const (
	copyArenaChunk = 8 << 10
	// copyArenaMax: larger slices get allocations of their own.
	copyArenaMax = 1 << 10
)

// clone is clone(b), from the arena.
func (a *copyArena) clone(b []byte) []byte {
	if len(b) == 0 || len(b) > copyArenaMax {
		return clone(b) // an empty value stays a non-nil empty slice
	}
	if cap(a.buf)-len(a.buf) < len(b) {
		a.buf = make([]byte, 0, copyArenaChunk)
	}
	n := len(a.buf)
	a.buf = append(a.buf, b...)
	return a.buf[n:len(a.buf):len(a.buf)]
}

// scanItems is the capacity an answer of at most limit records starts
// with: enough for most pages without regrowing, and no more for a large
// limit that a short answer would never fill.
func scanItems(limit int) []kv.Record { return make([]kv.Record, 0, min(limit, 128)) }

func cloneTags(t []string) []string {
	if len(t) == 0 {
		return nil
	}
	return append([]string(nil), t...)
}

// GetByTags implements kv.Backend.
func (n *Node) GetByTags(ctx context.Context, q kv.TagQuery) (kv.ScanResult, error) {
	return n.txnGetByTags(ctx, q, checkNone)
}

// txnGetByTags is GetByTags for a transaction's tag query, with check of
// the Key Groups holding keys of the collection (checkGroups). A read at
// a timestamp (checkAtTimestamp) needs one, in q.Version or its page.
func (n *Node) txnGetByTags(ctx context.Context, q kv.TagQuery, check groupCheck) (kv.ScanResult, error) {
	if check == checkAtTimestamp && q.Version == 0 && q.Page == "" {
		return kv.ScanResult{}, errNoTimestamp()
	}
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return kv.ScanResult{}, err
	}
	defer done()
	d, err := n.collection(q.Collection)
	if err != nil {
		return kv.ScanResult{}, err
	}
	limit, err := pageLimit(q.Limit)
	if err != nil {
		return kv.ScanResult{}, err
	}
	tags, all := q.All, true
	switch {
	case len(q.All) > 0 && len(q.Any) > 0:
		return kv.ScanResult{}, kv.Errorf(kv.CodeInvalidArgument, "give either all or any tags, not both")
	case len(q.Any) > 0:
		tags, all = q.Any, false
	case len(q.All) == 0:
		return kv.ScanResult{}, kv.Errorf(kv.CodeInvalidArgument, "no tags given: ask for all=... or any=...")
	}
	if err := kv.ValidateTags(tags); err != nil {
		return kv.ScanResult{}, err
	}
	op := [...]string{checkNone: "get_by_tags", checkMembers: "txn_get_by_tags_locked", checkAtTimestamp: "txn_get_by_tags_at"}[check]
	route, fwd, err := routeReadAs[kv.ScanResult](n, ctx, shardsOf(d), op, q)
	if route == routeForward {
		return fwd, err
	}
	if q.Page == "" && q.Version == 0 {
		if err := n.awaitShippedFor(ctx, route, d, shardsOf(d), nil, nil); err != nil {
			return kv.ScanResult{}, err
		}
	}
	shards := shardsOf(d)
	version, after, err := n.scanVersion(ctx, route, shards, q.Page, q.Version, false)
	if err != nil {
		return kv.ScanResult{}, err
	}
	if route == routeSpread {
		return n.tagsSpread(ctx, d, version, tags, all, after, limit, check)
	}
	if err := n.checkGroups(ctx, check, n.expandLocal(shards), d.ID, nil, nil, version); err != nil {
		return kv.ScanResult{}, err
	}
	if err := n.settleIntents(ctx, n.expandLocal(shards), d.ID, nil, nil, version); err != nil {
		return kv.ScanResult{}, err
	}
	res := kv.ScanResult{Version: version}
	var more bool
	res.Items, more, err = n.queryTags(d, version, tags, all, after, limit, nil)
	if err != nil {
		return kv.ScanResult{}, kv.Errorf(kv.CodeInternal, "querying tags of %q: %v", q.Collection, err)
	}
	if err := n.checkRetained(shards, version); err != nil {
		return kv.ScanResult{}, err
	}
	if more {
		res.NextPage = encodePage(version, false, res.Items[len(res.Items)-1].Key)
	}
	return res, nil
}

// queryTags reads, at version, up to limit records of d carrying all (or
// any) of tags in key order after the key after (nil: from the first),
// and reports whether there are more. owned, when set, keeps the records
// of those buckets only (the shards read). The caller has fenced version
// on the shards read.
func (n *Node) queryTags(d *cluster.CollectionDesc, version uint64, tags []string, all bool, after []byte, limit int, owned func(uint16) bool) ([]kv.Record, bool, error) {
	// Candidate keys in key order: those of the first tag for "all" (a
	// record carrying all tags carries the first), the union of every
	// tag's first limit+1 keys for "any".
	var candidates [][]byte
	collect := func(tag string, max int) error {
		var out [][]byte
		err := shard.TagKeys(n.eng.DB, d.ID, tag, version, after, owned, func(k []byte) bool {
			out = append(out, k)
			return max == 0 || len(out) < max
		})
		candidates = append(candidates, out...)
		return err
	}
	var items []kv.Record
	more := false
	take := func(key []byte) (bool, error) {
		val, v, found, err := n.readKey(d.ID, key, version)
		if err != nil {
			return false, err
		}
		if !found || !hasTags(val.Tags, tags, all) {
			return true, nil // the index and the data agree; this guards against a bug
		}
		if len(items) == limit {
			more = true
			return false, nil
		}
		items = append(items, kv.Record{Key: key, Value: val.Value, Tags: val.Tags, Version: v})
		return true, nil
	}
	var err error
	if all {
		var ierr error
		err = shard.TagKeys(n.eng.DB, d.ID, tags[0], version, after, owned, func(k []byte) bool {
			cont, err := take(k)
			if err != nil {
				ierr = err
				return false
			}
			return cont
		})
		if err == nil {
			err = ierr
		}
	} else {
		for _, t := range tags {
			if err = collect(t, limit+1); err != nil {
				break
			}
		}
		sort.Slice(candidates, func(i, j int) bool { return bytes.Compare(candidates[i], candidates[j]) < 0 })
		for i, k := range candidates {
			if i > 0 && bytes.Equal(k, candidates[i-1]) {
				continue
			}
			cont, terr := take(k)
			if terr != nil {
				err = terr
				break
			}
			if !cont {
				break
			}
		}
	}
	return items, more, err
}

func hasTags(have, want []string, all bool) bool {
	for _, w := range want {
		found := false
		for _, h := range have {
			if h == w {
				found = true
				break
			}
		}
		if all && !found {
			return false
		}
		if !all && found {
			return true
		}
	}
	return all
}
