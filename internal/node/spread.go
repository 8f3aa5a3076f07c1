package node

import (
	"bytes"
	"context"
	"errors"
	"sort"
	"sync"
	"time"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/shard"
	"github.com/groupkv/groupkv/internal/txn"
)

// Reads over several nodes (see docs/cluster.md, "Reads over several
// nodes").
//
// A scan, tag query, batch get, watch or get of a tag collection needs a
// set of shards. It is served by, in order of preference:
//
//  1. this node, when it holds a readable replica of each (routeLocal);
//  2. another node holding one of each, forwarded whole (routeForward);
//  3. parts (routeSpread): every shard read here if a replica is here,
//     else on a node holding one, the shards of one node read in one
//     ShardRead call. The parts of a scan, tag query or batch get read at
//     one version, each fenced on its own shards (a snapshot read), and
//     are merged in key order; a watch follows each part's change log and
//     merges them in version order behind the parts' resolved timestamps.
//
// A part's shards are named with their spans as the asking node's catalog
// knows them, and the part keeps only records within those spans, so that
// no record is read twice or missed although several nodes hold shards of
// one collection in one key space each. The node serving a part refuses
// (unavailable; the asker plans again) when its replicas do not cover the
// spans.

// readRoute says how a read is served.
type readRoute int

const (
	routeLocal readRoute = iota
	routeForward
	routeSpread
)

// readable reports whether this node's replica of shardID serves reads: it
// holds one and the catalog still places it here (a replica that moved
// away stays until its group dropped it, but is read elsewhere) or does
// not know the shard yet (a split child).
func (n *Node) readable(shardID uint64) bool {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.readableLocked(shardID)
}

// readableLocked is readable with n.mu held.
func (n *Node) readableLocked(shardID uint64) bool {
	if _, ok := n.mu.replicas[shardID]; !ok {
		return false
	}
	ref, ok := n.mu.shards[shardID]
	if !ok {
		return true
	}
	for _, r := range ref.coll.Shards[ref.index].Replicas {
		if r.Node == n.id {
			return true
		}
	}
	return false
}

// localReadable reports whether shardID is read here: a readable replica,
// or a split child that the split applied here is about to create.
func (n *Node) localReadable(ctx context.Context, shardID uint64) bool {
	return n.readable(shardID) || n.awaitSplitChild(ctx, shardID)
}

// routeReadAs is routeRead answering the forwarded read's response. A
// read served here, the common case, costs no allocation for a request
// or a response that only a forwarded read encodes or decodes.
func routeReadAs[Resp, Req any](n *Node, ctx context.Context, shards []uint64, op string, req Req) (readRoute, Resp, error) {
	if _, ok, err := n.readTarget(ctx, shards); !ok && err == nil {
		var none Resp
		return routeLocal, none, nil
	}
	fwd := new(Resp)
	route, err := n.routeRead(ctx, shards, op, req, fwd)
	return route, *fwd, err
}

// routeRead decides how a read of shards is served; with routeForward it
// has run it on the node holding them all and decoded the answer into
// resp. A forwarded read refused as unavailable (its node is down, or
// the shard had no leader there) is read in parts instead, which plans
// around failing nodes: reads may run twice.
func (n *Node) routeRead(ctx context.Context, shards []uint64, op string, req, resp any) (readRoute, error) {
	ok, err := n.forwardRead(ctx, shards, op, req, resp)
	switch {
	case !ok:
		return routeLocal, nil
	case errors.Is(err, errNoSingleHolder):
		return routeSpread, nil
	case kv.CodeOf(err) == kv.CodeUnavailable && ctx.Err() == nil:
		return routeSpread, nil
	}
	return routeForward, err
}

// readPart is the shards of a read served by one node.
type readPart struct {
	node   uint64 // n.id: here
	shards []uint64
}

// planRead splits shards by the node that reads them: those held here,
// here; every other shard on a node holding it, as few nodes as possible,
// nodes in avoid only when no other holds the shard, joining replicas only
// when no other holds it.
func (n *Node) planRead(ctx context.Context, shards []uint64, avoid map[uint64]bool) ([]readPart, error) {
	var local, missing []uint64
	for _, id := range shards {
		if n.localReadable(ctx, id) {
			local = append(local, id)
		} else {
			missing = append(missing, id)
		}
	}
	var parts []readPart
	if len(local) > 0 {
		parts = append(parts, readPart{n.id, local})
	}
	holders := map[uint64][]uint64{}
	for _, id := range missing {
		holders[id] = n.readNodes(id, avoid)
		if len(holders[id]) == 0 {
			return nil, kv.Errorf(kv.CodeUnavailable, "no node is known to hold a replica of shard %d", id)
		}
	}
	for len(missing) > 0 {
		count := map[uint64]int{}
		for _, id := range missing {
			for _, nd := range holders[id] {
				count[nd]++
			}
		}
		var best uint64
		for nd, c := range count {
			if best == 0 || c > count[best] || c == count[best] && nd < best {
				best = nd
			}
		}
		p := readPart{node: best}
		rest := missing[:0:0]
		for _, id := range missing {
			if contains(holders[id], best) {
				p.shards = append(p.shards, id)
			} else {
				rest = append(rest, id)
			}
		}
		parts = append(parts, p)
		missing = rest
	}
	return parts, nil
}

// readNodes returns the other nodes that may serve a read of shardID:
// those of its settled replicas not in avoid (those answering lately if
// any), else its joining ones, else those in avoid.
func (n *Node) readNodes(shardID uint64, avoid map[uint64]bool) []uint64 {
	n.mu.RLock()
	ref, ok := n.mu.shards[shardID]
	var reps []cluster.Replica
	if ok {
		reps = ref.coll.Shards[ref.index].Replicas
	}
	n.mu.RUnlock()
	for _, pass := range []func(cluster.Replica) bool{
		func(r cluster.Replica) bool { return !r.Joining && !avoid[r.Node] && n.answering(r.Node) },
		func(r cluster.Replica) bool { return !r.Joining && !avoid[r.Node] },
		func(r cluster.Replica) bool { return !avoid[r.Node] },
		func(r cluster.Replica) bool { return true },
	} {
		var out []uint64
		for _, r := range reps {
			if r.Node != n.id && pass(r) {
				out = append(out, r.Node)
			}
		}
		if len(out) > 0 {
			return out
		}
	}
	return nil
}

// runParts reads shards in parts (planRead), all parts at once, with run
// reading one part; a part that fails with a retryable error is planned
// again, avoiding its node, for a few election timeouts. The results are
// in the order of the parts of the plan that succeeded.
func runParts[T any](ctx context.Context, n *Node, shards []uint64, run func(context.Context, readPart) (T, error)) ([]T, error) {
	avoid := map[uint64]bool{}
	deadline := time.Now().Add(n.retryWindow())
	for attempt := 0; ; attempt++ {
		parts, err := n.planRead(ctx, shards, avoid)
		if err != nil {
			return nil, err
		}
		out := make([]T, len(parts))
		errs := make([]error, len(parts))
		var wg sync.WaitGroup
		for i, p := range parts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out[i], errs[i] = run(ctx, p)
			}()
		}
		wg.Wait()
		var failed error
		for i, err := range errs {
			if err == nil {
				continue
			}
			if !retryable(err) || ctx.Err() != nil {
				return nil, err
			}
			failed = err
			if parts[i].node != n.id {
				avoid[parts[i].node] = true
			}
		}
		if failed == nil {
			return out, nil
		}
		if berr := backoff(ctx, attempt, deadline, failed); berr != nil {
			return nil, berr
		}
	}
}

// shardSpan is a shard's span as the asking node's catalog knows it.
type shardSpan struct {
	ID          uint64 `json:"id"`
	BucketStart uint32 `json:"bucket_start,omitempty"`
	BucketEnd   uint32 `json:"bucket_end,omitempty"`
	Start       []byte `json:"start,omitempty"`
	// End nil: unbounded.
	End []byte `json:"end,omitempty"`
}

func spansOf(d *cluster.CollectionDesc, ids []uint64) []shardSpan {
	var out []shardSpan
	for _, s := range d.Shards {
		if contains(ids, s.ID) {
			out = append(out, shardSpan{ID: s.ID, BucketStart: s.BucketStart, BucketEnd: s.BucketEnd, Start: s.Start, End: s.End})
		}
	}
	return out
}

// ownedBy keeps, of a hash or tag collection, the buckets of spans.
func ownedBy(spans []shardSpan) func(uint16) bool {
	return func(b uint16) bool {
		for _, s := range spans {
			if uint32(b) >= s.BucketStart && uint32(b) < s.BucketEnd {
				return true
			}
		}
		return false
	}
}

// inSpans reports whether key of a range collection is in one of spans.
func inSpans(spans []shardSpan, key []byte) bool {
	for _, s := range spans {
		if bytes.Compare(key, s.Start) >= 0 && (s.End == nil || bytes.Compare(key, s.End) < 0) {
			return true
		}
	}
	return false
}

// shardReadRequest asks a node for one part of a read (ShardRead): the
// records of Keys, a page of a scan, a page of a tag query, or the
// placements of Keys, of the shards of Spans only.
type shardReadRequest struct {
	Op           string      `json:"op"` // "records", "placement", "prepared", "shipped", "scan", "tags"
	Collection   string      `json:"collection"`
	CollectionID uint32      `json:"collection_id"`
	Spans        []shardSpan `json:"spans"`
	// Version is the version read; 0 (records, placement, prepared,
	// shipped) reads the latest state behind a read barrier of every shard.
	// "shipped" reads nothing: it answers once the group writes to the
	// keys of its spans in [Start, End) are applied to them (awaitShipped).
	Version uint64   `json:"version,omitempty"`
	Keys    [][]byte `json:"keys,omitempty"`
	// Start and End (nil: unbounded) bound a scan.
	Start   []byte `json:"start,omitempty"`
	End     []byte `json:"end,omitempty"`
	Reverse bool   `json:"reverse,omitempty"`
	Limit   int    `json:"limit,omitempty"`
	// Tags, All and After are a tag query's (after: the last key of the
	// previous page).
	Tags  []string `json:"tags,omitempty"`
	All   bool     `json:"all,omitempty"`
	After []byte   `json:"after,omitempty"`
	// Check: a transaction's scan or tag query, checked for the Key
	// Groups holding keys it reads (checkGroups).
	Check groupCheck `json:"check,omitempty"`
}

// checkPart checks the Key Groups holding keys a part read req reads in
// the replicas of shards (checkGroups): a scan's span, a tag query's
// collection, the keys of a records read.
func (n *Node) checkPart(ctx context.Context, req *shardReadRequest, collection uint32, shards []uint64) error {
	if req.Check > checkAtTimestamp || req.Version == 0 {
		return kv.Errorf(kv.CodeInvalidArgument, "a part read's group check %d at version %d is not known", req.Check, req.Version)
	}
	switch req.Op {
	case "scan":
		end := req.End
		if len(end) == 0 {
			end = nil
		}
		return n.checkGroups(ctx, req.Check, shards, collection, req.Start, end, req.Version)
	case "tags":
		return n.checkGroups(ctx, req.Check, shards, collection, nil, nil, req.Version)
	case "records":
		for _, k := range req.Keys {
			if err := n.checkGroups(ctx, req.Check, shards, collection, k, keyEnd(k), req.Version); err != nil {
				return err
			}
		}
		return nil
	}
	return kv.Errorf(kv.CodeInvalidArgument, "a %s part is not checked as a transaction's read", req.Op)
}

// partRecord is what a part read of one key found: its newest version at
// or below the version read (0: none), a live record or a tombstone.
type partRecord struct {
	Version uint64   `json:"version,omitempty"`
	Found   bool     `json:"found,omitempty"`
	Value   []byte   `json:"value,omitempty"`
	Tags    []string `json:"tags,omitempty"`
}

type partPlacement struct {
	Tag string `json:"tag,omitempty"`
	OK  bool   `json:"ok,omitempty"`
	Pin string `json:"pin,omitempty"` // the Key Group holding the key
}

type shardReadResponse struct {
	Records    []partRecord    `json:"records,omitempty"`
	Placements []partPlacement `json:"placements,omitempty"`
	// Prepared are the transactions prepared in the shards (op prepared).
	Prepared []string `json:"prepared,omitempty"`
	// Items are a page of a scan or tag query; More: the part has more.
	Items []kv.Record `json:"items,omitempty"`
	More  bool        `json:"more,omitempty"`
	Error *peerError  `json:"error,omitempty"`
}

func (n *Node) handleShardRead(ctx context.Context, req *shardReadRequest) (*shardReadResponse, error) {
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return &shardReadResponse{Error: toPeerError(err)}, nil
	}
	defer done()
	resp, err := n.readPartHere(ctx, req)
	if err != nil {
		return &shardReadResponse{Error: toPeerError(err)}, nil
	}
	return resp, nil
}

// readPart reads one part of a read, here or on its node.
func (n *Node) readPart(ctx context.Context, p readPart, req shardReadRequest, d *cluster.CollectionDesc) (*shardReadResponse, error) {
	req.Collection, req.CollectionID = d.Name, d.ID
	req.Spans = spansOf(d, p.shards)
	if p.node == n.id {
		return n.readPartHere(ctx, &req)
	}
	var resp shardReadResponse
	if _, err := n.callLeader(ctx, p.shards[0], p.node, "ShardRead", &req, &resp); err != nil {
		return nil, err
	}
	if err := resp.Error.err(); err != nil {
		return nil, err
	}
	return &resp, nil
}

// readPartHere serves a part of a read from this node's replicas.
func (n *Node) readPartHere(ctx context.Context, req *shardReadRequest) (*shardReadResponse, error) {
	d, err := n.collection(req.Collection)
	if err != nil {
		return nil, err
	}
	if d.ID != req.CollectionID {
		return nil, kv.Errorf(kv.CodeCollectionNotFound, "collection %q was dropped and created again", req.Collection)
	}
	ids := make([]uint64, len(req.Spans))
	for i, s := range req.Spans {
		ids[i] = s.ID
		if !n.localReadable(ctx, s.ID) {
			return nil, kv.Errorf(kv.CodeUnavailable, "node %d holds no replica of shard %d; ask a node that does", n.id, s.ID)
		}
	}
	if !n.covers(d, req.Spans) {
		return nil, kv.Errorf(kv.CodeUnavailable, "node %d's replicas do not cover shards %v as asked (the catalog changed); ask again", n.id, ids)
	}
	if req.Version == 0 {
		if req.Op != "records" && req.Op != "placement" && req.Op != "prepared" && req.Op != "shipped" {
			return nil, kv.Errorf(kv.CodeInvalidArgument, "a %s part needs a version", req.Op)
		}
		for _, id := range n.expandLocal(ids) {
			if err := n.readBarrier(ctx, id); err != nil {
				return nil, err
			}
		}
	} else if err := n.snapshotRead(ctx, ids, req.Version); err != nil {
		return nil, err
	}
	if req.Version != 0 && (req.Check != checkNone || req.Op == "scan" || req.Op == "tags" || req.Op == "records") {
		if err := n.checkPart(ctx, req, d.ID, n.expandLocal(ids)); err != nil {
			return nil, err
		}
	}
	if req.Op == "shipped" {
		if err := n.awaitShipped(ctx, d.ID, n.expandLocal(ids), req.Start, req.End, 0); err != nil {
			return nil, err
		}
		return &shardReadResponse{}, nil
	}
	resp := &shardReadResponse{}
	asOf := req.Version
	if asOf == 0 {
		asOf = shard.Latest
	}
	// Intents of transactions in what is read are settled first
	// (txn_read.go).
	switch req.Op {
	case "records":
		for _, k := range req.Keys {
			if err := n.settleIntents(ctx, ids, d.ID, k, keyEnd(k), asOf); err != nil {
				return nil, err
			}
		}
	case "scan":
		start, end := req.Start, req.End
		if len(start) == 0 {
			start = nil
		}
		if len(end) == 0 {
			end = nil
		}
		if err := n.settleIntents(ctx, n.expandLocal(ids), d.ID, start, end, asOf); err != nil {
			return nil, err
		}
	case "tags":
		if err := n.settleIntents(ctx, n.expandLocal(ids), d.ID, nil, nil, asOf); err != nil {
			return nil, err
		}
	}
	switch req.Op {
	case "records":
		for _, k := range req.Keys {
			val, v, found, err := shard.ReadRecord(n.eng.DB, d.ID, k, asOf)
			if err != nil {
				return nil, kv.Errorf(kv.CodeInternal, "reading %q: %v", k, err)
			}
			r := partRecord{Version: v, Found: found}
			if found {
				r.Value, r.Tags = val.Value, val.Tags
			}
			resp.Records = append(resp.Records, r)
		}
	case "prepared":
		for _, id := range ids {
			err := shard.EachPrepared(n.eng.DB, id, func(m txn.Meta, _ uint64, _, _ []txn.Target) error {
				resp.Prepared = append(resp.Prepared, m.ID)
				return nil
			})
			if err != nil {
				return nil, kv.Errorf(kv.CodeInternal, "reading the prepared transactions of shard %d: %v", id, err)
			}
		}
	case "placement":
		for _, k := range req.Keys {
			tag, pin, ok, err := shard.ReadPlacementPin(n.eng.DB, d.ID, k)
			if err != nil {
				return nil, kv.Errorf(kv.CodeInternal, "reading the placement of %q: %v", k, err)
			}
			resp.Placements = append(resp.Placements, partPlacement{tag, ok, pin})
		}
	case "scan":
		if resp.Items, resp.More, err = n.scanSpans(d, req); err != nil {
			return nil, kv.Errorf(kv.CodeInternal, "scanning %q: %v", d.Name, err)
		}
	case "tags":
		if resp.Items, resp.More, err = n.queryTags(d, req.Version, req.Tags, req.All, req.After, req.Limit, ownedBy(req.Spans)); err != nil {
			return nil, kv.Errorf(kv.CodeInternal, "querying tags of %q: %v", d.Name, err)
		}
	default:
		return nil, kv.Errorf(kv.CodeInvalidArgument, "unknown part read %q", req.Op)
	}
	if req.Version != 0 {
		if err := n.checkRetained(ids, req.Version); err != nil {
			return nil, err
		}
	}
	return resp, nil
}

// covers reports whether the readable replicas here own every bucket or
// key of spans (a shard split here is read through its children).
func (n *Node) covers(d *cluster.CollectionDesc, spans []shardSpan) bool {
	var descs []shard.Desc
	for _, id := range n.localShardsOf(d.ID) {
		if desc, ok := n.host.Desc(id); ok {
			descs = append(descs, desc)
		}
	}
	for _, s := range spans {
		if d.Partitioning != kv.PartitionRange {
			for cur := s.BucketStart; cur < s.BucketEnd; {
				next := cur
				for _, desc := range descs {
					if desc.BucketStart <= cur && desc.BucketEnd > cur {
						next = desc.BucketEnd
					}
				}
				if next == cur {
					return false
				}
				cur = next
			}
			continue
		}
		cur := s.Start
		for {
			var found *shard.Desc
			for i := range descs {
				if bytes.Compare(descs[i].Start, cur) <= 0 && (descs[i].End == nil || bytes.Compare(descs[i].End, cur) > 0) {
					found = &descs[i]
				}
			}
			if found == nil {
				return false
			}
			if found.End == nil || s.End != nil && bytes.Compare(found.End, s.End) >= 0 {
				break
			}
			cur = found.End
		}
	}
	return true
}

// scanSpans scans, at req.Version, the records of req.Spans in
// [req.Start, req.End), at most req.Limit, and reports whether there are
// more.
func (n *Node) scanSpans(d *cluster.CollectionDesc, req *shardReadRequest) ([]kv.Record, bool, error) {
	items := scanItems(req.Limit)
	more := false
	var arena copyArena
	take := func(r shard.ScanRecord) bool {
		if len(items) == req.Limit {
			more = true
			return false
		}
		items = append(items, kv.Record{Key: arena.clone(r.Key), Value: arena.clone(r.Value), Tags: cloneTags(r.Tags), Version: r.Version})
		return true
	}
	if d.Partitioning != kv.PartitionRange {
		err := shard.Scan(n.eng.DB, shard.ScanOptions{Collection: d.ID, Start: req.Start, End: req.End, AsOf: req.Version,
			Reverse: req.Reverse, Limit: req.Limit + 1, Owned: ownedBy(req.Spans), Moves: d.Partitioning == kv.PartitionTag}, take)
		return items, more, err
	}
	// A range collection: each span's part of [Start, End), in order.
	spans := append([]shardSpan(nil), req.Spans...)
	sort.Slice(spans, func(i, j int) bool { return keyBefore(spans[i].Start, spans[j].Start, req.Reverse) })
	for _, s := range spans {
		start, end := s.Start, s.End
		if req.Start != nil && bytes.Compare(req.Start, start) > 0 {
			start = req.Start
		}
		if req.End != nil && (end == nil || bytes.Compare(req.End, end) < 0) {
			end = req.End
		}
		if len(start) == 0 {
			start = nil
		}
		if end != nil && bytes.Compare(start, end) >= 0 {
			continue
		}
		err := shard.Scan(n.eng.DB, shard.ScanOptions{Collection: d.ID, Start: start, End: end, AsOf: req.Version,
			Reverse: req.Reverse, Limit: req.Limit + 1}, take)
		if err != nil || more {
			return items, more, err
		}
	}
	return items, more, nil
}

// keyBefore orders keys ascending, or descending with reverse.
func keyBefore(a, b []byte, reverse bool) bool {
	if reverse {
		return bytes.Compare(a, b) > 0
	}
	return bytes.Compare(a, b) < 0
}

// mergePages merges the pages of parts, each in key order (descending
// with reverse), into one page of at most limit records; more: a part had
// more, or the page is cut.
func mergePages(parts []*shardReadResponse, limit int, reverse bool) ([]kv.Record, bool) {
	var all []kv.Record
	more := false
	for _, p := range parts {
		all = append(all, p.Items...)
		more = more || p.More
	}
	sort.SliceStable(all, func(i, j int) bool { return keyBefore(all[i].Key, all[j].Key, reverse) })
	// A key is in one shard at one version; a duplicate would be a bug.
	out := all[:0]
	for i, r := range all {
		if i > 0 && bytes.Equal(r.Key, all[i-1].Key) {
			continue
		}
		out = append(out, r)
	}
	if len(out) > limit {
		out, more = out[:limit], true
	}
	return out, more
}

// scanSpread serves a scan whose shards no one node holds.
func (n *Node) scanSpread(ctx context.Context, d *cluster.CollectionDesc, shards []uint64, version uint64, start, end []byte, reverse bool, limit int, check groupCheck) (kv.ScanResult, error) {
	parts, err := runParts(ctx, n, shards, func(ctx context.Context, p readPart) (*shardReadResponse, error) {
		return n.readPart(ctx, p, shardReadRequest{Op: "scan", Version: version, Start: start, End: end, Reverse: reverse, Limit: limit, Check: check}, d)
	})
	if err != nil {
		return kv.ScanResult{}, err
	}
	res := kv.ScanResult{Version: version}
	var more bool
	res.Items, more = mergePages(parts, limit, reverse)
	if more && len(res.Items) > 0 {
		res.NextPage = encodePage(version, reverse, res.Items[len(res.Items)-1].Key)
	}
	return res, nil
}

// tagsSpread serves a tag query whose shards no one node holds.
func (n *Node) tagsSpread(ctx context.Context, d *cluster.CollectionDesc, version uint64, tags []string, all bool, after []byte, limit int, check groupCheck) (kv.ScanResult, error) {
	parts, err := runParts(ctx, n, shardsOf(d), func(ctx context.Context, p readPart) (*shardReadResponse, error) {
		return n.readPart(ctx, p, shardReadRequest{Op: "tags", Version: version, Tags: tags, All: all, After: after, Limit: limit, Check: check}, d)
	})
	if err != nil {
		return kv.ScanResult{}, err
	}
	res := kv.ScanResult{Version: version}
	var more bool
	res.Items, more = mergePages(parts, limit, false)
	if more && len(res.Items) > 0 {
		res.NextPage = encodePage(version, false, res.Items[len(res.Items)-1].Key)
	}
	return res, nil
}

// readRecords reads keys of d, each of which may be in any of shards, at
// version (0: the latest, behind read barriers): per key, the newest
// version any part found (a key of a tag collection whose placement
// changed has older versions in another shard).
func (n *Node) readRecords(ctx context.Context, d *cluster.CollectionDesc, shards []uint64, keys [][]byte, version uint64, check groupCheck) ([]partRecord, error) {
	parts, err := runParts(ctx, n, shards, func(ctx context.Context, p readPart) (*shardReadResponse, error) {
		return n.readPart(ctx, p, shardReadRequest{Op: "records", Version: version, Keys: keys, Check: check}, d)
	})
	if err != nil {
		return nil, err
	}
	out := make([]partRecord, len(keys))
	for _, p := range parts {
		if len(p.Records) != len(keys) {
			return nil, kv.Errorf(kv.CodeInternal, "a part read answered %d records for %d keys", len(p.Records), len(keys))
		}
		for i, r := range p.Records {
			if r.Version > out[i].Version {
				out[i] = r
			}
		}
	}
	return out, nil
}

// readPlacement reads the placement of key from its home shard, held
// elsewhere.
func (n *Node) readPlacement(ctx context.Context, d *cluster.CollectionDesc, home uint64, key []byte) (partPlacement, error) {
	parts, err := runParts(ctx, n, []uint64{home}, func(ctx context.Context, p readPart) (*shardReadResponse, error) {
		return n.readPart(ctx, p, shardReadRequest{Op: "placement", Keys: [][]byte{key}}, d)
	})
	if err != nil {
		return partPlacement{}, err
	}
	if len(parts) != 1 || len(parts[0].Placements) != 1 {
		return partPlacement{}, kv.Errorf(kv.CodeInternal, "a placement read answered %d parts", len(parts))
	}
	return parts[0].Placements[0], nil
}

// batchGetSpread serves a batch get whose shards no one node holds: every
// key at version, read in the parts holding its shards.
func (n *Node) batchGetSpread(ctx context.Context, keys []kv.KeyRef, descs []*cluster.CollectionDesc, keyShards [][]uint64, shards []uint64) (kv.BatchGetResult, error) {
	version, err := n.latest(ctx)
	if err != nil {
		return kv.BatchGetResult{}, err
	}
	type answer struct {
		index int // in keys
		rec   partRecord
	}
	parts, err := runParts(ctx, n, shards, func(ctx context.Context, p readPart) ([]answer, error) {
		// One request per collection of the keys whose shards the part
		// holds.
		byColl := map[string][]int{}
		var order []string
		for i, k := range keys {
			for _, id := range keyShards[i] {
				if contains(p.shards, id) {
					if _, ok := byColl[k.Collection]; !ok {
						order = append(order, k.Collection)
					}
					byColl[k.Collection] = append(byColl[k.Collection], i)
					break
				}
			}
		}
		var out []answer
		for _, name := range order {
			idx := byColl[name]
			d := descs[idx[0]]
			var ks [][]byte
			var own []uint64
			for _, i := range idx {
				ks = append(ks, keys[i].Key)
			}
			for _, id := range p.shards {
				if contains(shardsOf(d), id) {
					own = append(own, id)
				}
			}
			resp, err := n.readPart(ctx, readPart{p.node, own}, shardReadRequest{Op: "records", Version: version, Keys: ks}, d)
			if err != nil {
				return nil, err
			}
			if len(resp.Records) != len(ks) {
				return nil, kv.Errorf(kv.CodeInternal, "a part read answered %d records for %d keys", len(resp.Records), len(ks))
			}
			for j, i := range idx {
				out = append(out, answer{i, resp.Records[j]})
			}
		}
		return out, nil
	})
	if err != nil {
		return kv.BatchGetResult{}, err
	}
	best := make([]partRecord, len(keys))
	for _, p := range parts {
		for _, a := range p {
			if a.rec.Version > best[a.index].Version {
				best[a.index] = a.rec
			}
		}
	}
	res := kv.BatchGetResult{Version: version, Items: make([]kv.BatchGetItem, len(keys))}
	for i, k := range keys {
		item := kv.BatchGetItem{Collection: k.Collection, Key: k.Key, Found: best[i].Found}
		if item.Found {
			item.Value, item.Tags, item.Version = best[i].Value, best[i].Tags, best[i].Version
		}
		res.Items[i] = item
	}
	return res, nil
}
