package node

import (
	"bytes"
	"context"
	"errors"
	"io"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/kv"
)

// A watch of shards this node holds no replica of runs on a node that
// holds them all, over a server-streaming method of the peer service; the
// events come back as they are delivered there. When no node holds them
// all, the watch runs in parts (WatchPart, watchSpread) merged here.

const watchMethod = "/" + peerService + "Watch/Watch"

var watchStreamDesc = grpc.StreamDesc{StreamName: "Watch", ServerStreams: true}

// watchFrame is one message of a forwarded watch: an event, or the error
// that ended it.
type watchFrame struct {
	Event *kv.Event  `json:"event,omitempty"`
	Error *peerError `json:"error,omitempty"`
}

func (n *Node) registerWatch(s grpc.ServiceRegistrar) {
	s.RegisterService(&grpc.ServiceDesc{
		ServiceName: peerService + "Watch",
		HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{
			StreamName:    "Watch",
			ServerStreams: true,
			Handler: func(_ any, stream grpc.ServerStream) error {
				var req kv.WatchRequest
				if err := stream.RecvMsg(&req); err != nil {
					return err
				}
				ctx := context.WithValue(stream.Context(), forwardedKey{}, true)
				err := n.Watch(ctx, req, func(ev kv.Event) error {
					return stream.SendMsg(&watchFrame{Event: &ev})
				})
				if err != nil && stream.Context().Err() == nil {
					return stream.SendMsg(&watchFrame{Error: toPeerError(err)})
				}
				return nil
			},
		}, {
			StreamName:    "WatchPart",
			ServerStreams: true,
			Handler: func(_ any, stream grpc.ServerStream) error {
				var req watchPartRequest
				if err := stream.RecvMsg(&req); err != nil {
					return err
				}
				err := n.watchPartHere(stream.Context(), &req, func(ev kv.Event) error {
					return stream.SendMsg(&watchFrame{Event: &ev})
				})
				if err != nil && stream.Context().Err() == nil {
					return stream.SendMsg(&watchFrame{Error: toPeerError(err)})
				}
				return nil
			},
		}},
	}, n)
}

// forwardWatch runs a watch whose shards are not all held here on a node
// that holds them all; it reports false when the watch is local. A stream
// that breaks (its node stopped, or stopped answering: streamWatch) is
// resumed on another such node after the last change or progress mark
// delivered, up to maxPartRestarts times in a row, or in parts when no
// other node holds them all (errNoSingleHolder); req holds that point,
// from which the caller goes on when the watch turns local or is read in
// parts.
func (n *Node) forwardWatch(ctx context.Context, shards []uint64, req *kv.WatchRequest, fn func(kv.Event) error) (bool, error) {
	var fnErr error
	restarts := 0
	deliver := func(ev kv.Event) error {
		if err := fn(ev); err != nil {
			fnErr = err
			return err
		}
		// Every change at or below (Version, Key) was delivered; a
		// progress mark has no key.
		req.FromVersion, req.AfterKey = ev.Version, ev.Key
		restarts = 0
		return nil
	}
	for {
		target, ok, err := n.readTarget(ctx, shards)
		if !ok || err != nil {
			return ok, err
		}
		if restarts > 0 && !n.answering(target) {
			// The only node holding them all is one whose stream broke:
			// read in parts, around it.
			return true, errNoSingleHolder
		}
		err = n.streamWatch(ctx, target, watchMethod, req, deliver)
		if fnErr != nil || ctx.Err() != nil || !retryable(err) {
			return true, err
		}
		if restarts++; restarts > maxPartRestarts {
			return true, kv.Errorf(kv.CodeOf(err), "%s; resume the watch from the last version seen", kv.AsError(err).Message)
		}
		select {
		case <-time.After(time.Duration(restarts) * 20 * time.Millisecond):
		case <-ctx.Done():
			return true, ctx.Err()
		case <-n.stop:
			return true, kv.Errorf(kv.CodeUnavailable, "node is shutting down; resume the watch from the last version seen")
		}
	}
}

// streamWatch runs a watch (or a part of one) on node target over the
// stream method, handing its events to fn. A node that stops answering
// with its connections open (a stopped process) would hold the stream
// forever, so the stream is watched (silenceWatch): once it has been
// quiet for an election timeout the node is pinged, and silentPings pings
// in a row unanswered for noReplicaPing each end the stream, unavailable.
// A node whose stream broke is passed over (markSilent) where another can
// serve.
func (n *Node) streamWatch(ctx context.Context, target uint64, method string, req any, fn func(kv.Event) error) error {
	nd, found := n.nodeDesc(target)
	if !found {
		return kv.Errorf(kv.CodeUnavailable, "node %d is not a known member", target)
	}
	c, err := n.peers.conn(nd.PeerAddr)
	if err != nil {
		return kv.Errorf(kv.CodeUnavailable, "connecting to node %d: %v", target, err)
	}
	sctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	w := &silenceWatch{n: n, ctx: sctx, cancel: cancel, addr: nd.PeerAddr}
	w.heard()
	w.timer = time.AfterFunc(time.Hour, w.check) // armed once w.timer is set
	w.timer.Reset(n.electionTimeout())
	defer w.timer.Stop()
	broke := func(err error) error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// Stopped, or not answering: passed over while another can serve.
		n.markSilent(target)
		if errors.Is(context.Cause(sctx), errSilent) {
			return kv.Errorf(kv.CodeUnavailable, "node %d stopped answering (its status went unanswered) during the watch; resume from the last version seen", target)
		}
		return kv.Errorf(kv.CodeUnavailable, "the watch through node %d broke: %v; resume from the last version seen", target, err)
	}
	stream, err := c.NewStream(sctx, &watchStreamDesc, method)
	if err != nil {
		return broke(err)
	}
	if err := stream.SendMsg(req); err != nil {
		return broke(err)
	}
	if err := stream.CloseSend(); err != nil {
		return broke(err)
	}
	for {
		var f watchFrame
		err := stream.RecvMsg(&f)
		w.heard()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return broke(err)
		}
		if f.Error != nil {
			return f.Error.err()
		}
		if f.Event != nil {
			if err := fn(*f.Event); err != nil {
				return err
			}
		}
	}
}

// silenceWatch watches one long-lived stream (streamWatch) until its
// context ends.
type silenceWatch struct {
	n      *Node
	ctx    context.Context
	cancel context.CancelCauseFunc
	timer  *time.Timer
	addr   string
	// heardAt is when the stream last delivered a frame or the node last
	// answered a ping (UnixNano).
	heardAt atomic.Int64
	missed  int // pings in a row that went unanswered
}

func (w *silenceWatch) heard() { w.heardAt.Store(time.Now().UnixNano()) }

func (w *silenceWatch) check() {
	if w.ctx.Err() != nil {
		return
	}
	quiet := w.n.electionTimeout()
	if since := time.Since(time.Unix(0, w.heardAt.Load())); since < quiet {
		w.timer.Reset(quiet - since)
		return
	}
	answered, unanswered := w.n.pingWithin(w.ctx, w.addr, noReplicaPing)
	switch {
	case w.ctx.Err() != nil:
		return
	case unanswered:
		if w.missed++; w.missed >= silentPings {
			w.cancel(errSilent)
			return
		}
	case answered:
		w.missed = 0
		w.heard()
	default:
		w.heard() // failed otherwise: no sign either way; wait again
	}
	w.timer.Reset(w.n.opts.TickInterval)
}

const watchPartMethod = "/" + peerService + "Watch/WatchPart"

// partProgressInterval is how often a part of a watch over several nodes
// reports its resolved timestamp: the merged watch delivers an event once
// every part has progressed past its version.
const partProgressInterval = 50 * time.Millisecond

// watchPartRequest asks a node for a part of a watch: the changes of the
// shards of Spans only, with a progress event every partProgressInterval.
type watchPartRequest struct {
	Request      kv.WatchRequest `json:"request"`
	CollectionID uint32          `json:"collection_id"`
	Spans        []shardSpan     `json:"spans"`
}

func (n *Node) watchPartHere(ctx context.Context, req *watchPartRequest, fn func(kv.Event) error) error {
	d, err := n.collection(req.Request.Collection)
	if err != nil {
		return err
	}
	if d.ID != req.CollectionID {
		return kv.Errorf(kv.CodeCollectionNotFound, "collection %q was dropped and created again", d.Name)
	}
	ids := make([]uint64, len(req.Spans))
	for i, s := range req.Spans {
		ids[i] = s.ID
		if !n.localReadable(ctx, s.ID) {
			return kv.Errorf(kv.CodeUnavailable, "node %d holds no replica of shard %d; resume the watch", n.id, s.ID)
		}
	}
	if !n.covers(d, req.Spans) {
		return kv.Errorf(kv.CodeUnavailable, "node %d's replicas do not cover shards %v as asked (the catalog changed); resume the watch", n.id, ids)
	}
	return n.watchHere(ctx, d, ids, req.Spans, partProgressInterval, req.Request, fn)
}

// watchSpread runs a watch of shards that no one node holds: a part per
// node (planRead), each sending its changes in (version, key) order and
// its progress every partProgressInterval. An event is delivered once
// every part has progressed to its version, so that the merged events are
// in (version, key) order; a progress event reports the lowest part
// progress. A part that fails (its node stopped, or lost a replica to a
// move) is planned again on other nodes and resumed after the last change
// it sent; after maxPartRestarts such restarts with no progress of the
// merged watch in between, the watch ends (resume it from the last
// version seen).
//
// Invariant: parts[i].mark is a version at or below which part i has sent
// every change, and parts[i].from, .after the point after which it sends
// changes when started again; every change at or below the lowest mark
// has been delivered or is in pending.
func (n *Node) watchSpread(ctx context.Context, d *cluster.CollectionDesc, shards []uint64, req kv.WatchRequest, fn func(kv.Event) error) error {
	plan, err := n.planRead(ctx, shards, nil)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type msg struct {
		part int
		ev   kv.Event
		err  error
	}
	type part struct {
		readPart
		mark  uint64
		from  uint64
		after []byte
	}
	msgs := make(chan msg, 64)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	run := func(i int, p part) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			send := func(ev kv.Event) error {
				select {
				case msgs <- msg{part: i, ev: ev}:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			preq := watchPartRequest{Request: req, CollectionID: d.ID, Spans: spansOf(d, p.shards)}
			preq.Request.FromVersion, preq.Request.AfterKey = p.from, p.after
			if tracingWatch() {
				traceWatch("merge on node %d: part %d starts on node %d, shards %v, from (%d,%q), mark %d", n.id, i, p.node, p.shards, p.from, p.after, p.mark)
			}
			var err error
			if p.node == n.id {
				err = n.watchPartHere(ctx, &preq, send)
			} else {
				err = n.streamWatch(ctx, p.node, watchPartMethod, &preq, send)
			}
			if err == nil {
				err = kv.Errorf(kv.CodeUnavailable, "a part of the watch on node %d ended", p.node)
			}
			select {
			case msgs <- msg{part: i, err: err}:
			case <-ctx.Done():
			}
		}()
	}
	var parts []part
	start := req.FromVersion
	if req.AfterKey != nil && start > 0 {
		start-- // changes at FromVersion after AfterKey may come
	}
	for _, p := range plan {
		parts = append(parts, part{readPart: p, mark: start, from: req.FromVersion, after: req.AfterKey})
		run(len(parts)-1, parts[len(parts)-1])
	}
	var pending []kv.Event
	var progressed uint64
	var lastProgress time.Time
	// restarts counts the parts planned again since the merged watch last
	// progressed (its lowest mark was lowAtRestart then), low is that mark
	// now.
	restarts := 0
	low, lowAtRestart := start, start
	for {
		var m msg
		select {
		case m = <-msgs:
		case <-ctx.Done():
			return ctx.Err()
		case <-n.stop:
			return kv.Errorf(kv.CodeUnavailable, "node is shutting down; resume the watch from the last version seen")
		}
		p := &parts[m.part]
		switch {
		case m.err != nil:
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if tracingWatch() {
				traceWatch("merge on node %d: part %d on node %d, shards %v, ended at (%d,%q) mark %d: %v", n.id, m.part, p.node, p.shards, p.from, p.after, p.mark, m.err)
			}
			if !retryable(m.err) {
				return m.err
			}
			if restarts >= maxPartRestarts {
				return kv.Errorf(kv.CodeOf(m.err), "%s; resume the watch from the last version seen", kv.AsError(m.err).Message)
			}
			restarts++
			lowAtRestart = low
			again, err := n.planRead(ctx, p.shards, map[uint64]bool{p.node: true})
			if err != nil {
				return err
			}
			select {
			case <-time.After(time.Duration(restarts) * 20 * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
			old := *p
			for j, rp := range again {
				np := old
				np.readPart = rp
				at := m.part
				if j > 0 {
					parts = append(parts, np)
					at = len(parts) - 1
				} else {
					parts[at] = np
				}
				run(at, np)
			}
			continue
		case m.ev.Type == kv.EventProgress:
			p.mark = max(p.mark, m.ev.Version)
			p.from, p.after = p.mark, nil
		default:
			if tracingWatch() {
				traceWatch("merge on node %d: part %d on node %d sent %s@%d", n.id, m.part, p.node, m.ev.Key, m.ev.Version)
			}
			pending = append(pending, m.ev)
			if m.ev.Version > 0 {
				p.mark = max(p.mark, m.ev.Version-1)
			}
			p.from, p.after = m.ev.Version, m.ev.Key
		}
		low = parts[0].mark
		for _, q := range parts[1:] {
			low = min(low, q.mark)
		}
		if low > lowAtRestart {
			restarts = 0
		}
		sort.SliceStable(pending, func(i, j int) bool {
			if pending[i].Version != pending[j].Version {
				return pending[i].Version < pending[j].Version
			}
			return bytes.Compare(pending[i].Key, pending[j].Key) < 0
		})
		k := 0
		for k < len(pending) && pending[k].Version <= low {
			if err := fn(pending[k]); err != nil {
				return err
			}
			k++
		}
		pending = pending[k:]
		if low > progressed && time.Since(lastProgress) >= progressInterval {
			if err := fn(kv.Event{Type: kv.EventProgress, Version: low}); err != nil {
				return err
			}
			progressed, lastProgress = low, time.Now()
		}
	}
}

// maxPartRestarts bounds how often in a row, with no progress in between,
// a watch served by other nodes, or its parts, is started again after
// failing.
const maxPartRestarts = 16
