package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/shard"
)

// progressInterval is how often a watch without changes reports its
// resolved timestamp: often enough that a watcher of a quiet range resumes
// well inside the retention window.
const progressInterval = time.Second

// watchTrace, when set (by tests), is told what the parts of watches over
// several nodes do: the rounds they read, the parts started and ended.
var watchTrace atomic.Pointer[func(string)]

func tracingWatch() bool { return watchTrace.Load() != nil }

func traceWatch(format string, args ...any) {
	if f := watchTrace.Load(); f != nil {
		(*f)(fmt.Sprintf(format, args...))
	}
}

// Watch implements kv.Backend.
//
// It reads the collection's change log, which every write appends to in the
// same raft proposal as the record, in (version, key) order up to the
// minimum resolved timestamp of the shards involved: no change at or below
// it can still appear, so events never go back in order and none is missed.
func (n *Node) Watch(ctx context.Context, req kv.WatchRequest, fn func(kv.Event) error) error {
	// A watch runs until its context ends, not for the request timeout. It
	// holds the node open (opsMu) only while it reads, never while fn
	// runs, so that a slow consumer cannot hold up Close.
	d, err := n.collection(req.Collection)
	if err != nil {
		return err
	}
	if len(req.End) > 0 && bytes.Compare(req.Start, req.End) >= 0 {
		return kv.Errorf(kv.CodeInvalidArgument, "start %q is not below end %q", req.Start, req.End)
	}
	if req.AfterKey != nil && len(req.AfterKey) == 0 {
		req.AfterKey = nil
	}
	shards := shardsIn(d, req.Start, req.End)
	if ok, err := n.forwardWatch(ctx, shards, &req, fn); ok {
		if errors.Is(err, errNoSingleHolder) {
			return n.watchSpread(ctx, d, shards, req, fn)
		}
		return err
	}
	return n.watchHere(ctx, d, shards, nil, progressInterval, req, fn)
}

// watchHere runs a watch of shards on this node's replicas. spans, when
// set, keep the changes of those shards' spans only (a part of a watch
// over several nodes); every is the period of progress events.
func (n *Node) watchHere(ctx context.Context, d *cluster.CollectionDesc, shards []uint64, spans []shardSpan, every time.Duration,
	req kv.WatchRequest, fn func(kv.Event) error) error {
	owned := func(c shard.Change) bool { return true }
	if spans != nil {
		if d.Partitioning == kv.PartitionRange {
			owned = func(c shard.Change) bool { return inSpans(spans, c.Key) }
		} else {
			in := ownedBy(spans)
			owned = func(c shard.Change) bool { return in(c.Bucket) }
		}
	}
	asked := shards
	shards = n.withLocalShards(d.ID, shards)
	for _, id := range shards {
		if err := n.readBarrier(ctx, id); err != nil {
			return err
		}
	}
	// Cursor: every change at or below (version, afterKey) was delivered.
	version, afterKey := req.FromVersion, req.AfterKey
	if err := n.reading(func() error { return n.checkWatchRetained(shards, version) }); err != nil {
		return err
	}
	latest, err := n.latest(ctx)
	if err != nil {
		return err
	}
	if version > latest {
		return kv.Errorf(kv.CodeInvalidArgument, "from_version %d is in the future (the latest timestamp is %d)", version, latest)
	}
	lastProgress := time.Time{}
	var progressed uint64
	for {
		if spans != nil {
			// A part ends when a replica it reads moves away: the merged
			// watch resumes it on a node that holds the shard.
			for _, id := range asked {
				if !n.readable(id) {
					return kv.Errorf(kv.CodeUnavailable, "node %d no longer holds shard %d", n.id, id)
				}
			}
		}
		notify := n.host.AppliedNotify()
		resolved := ^uint64(0)
		now, err := n.latest(ctx)
		if err != nil {
			return err
		}
		shards = n.liveShards(shards) // a merged shard's changes are its left neighbour's now
		var trace []string
		for _, id := range shards {
			r, err := n.resolved(ctx, id, now)
			if err != nil {
				if n.isMergedAway(id) && !n.hasReplica(id) {
					// Merged meanwhile: no progress this round; the next
					// one asks the shard that took it in.
					resolved = min(resolved, version)
					continue
				}
				if spans != nil && tracingWatch() {
					traceWatch("node %d part %v: resolved of shard %d: %v", n.id, asked, id, err)
				}
				return err
			}
			if spans != nil && tracingWatch() {
				ai, _ := n.host.AppliedIndex(id)
				trace = append(trace, fmt.Sprintf("%d:%d(ready=%v readable=%v applied=%d)", id, r, n.host.Ready(id), n.readable(id), ai))
			}
			resolved = min(resolved, r)
		}
		if resolved > version || (resolved == version && afterKey != nil) {
			var events []kv.Event
			var rerr error
			from := version + 1
			var after []byte
			if afterKey != nil {
				from, after = version, afterKey
			}
			err := n.reading(func() error {
				return shard.Changes(n.eng.DB, d.ID, from, resolved, after, func(c shard.Change) bool {
					if len(req.Start) > 0 && bytes.Compare(c.Key, req.Start) < 0 || len(req.End) > 0 && bytes.Compare(c.Key, req.End) >= 0 || !owned(c) {
						return true
					}
					val, v, found, err := shard.ReadRecord(n.eng.DB, d.ID, c.Key, c.Version)
					if err != nil {
						rerr = err
						return false
					}
					if v == 0 {
						// Garbage-collected under the watcher: checked below.
						return true
					}
					// v is c.Version, or below it for a Key Group's write,
					// stored at the version its group committed it and
					// logged at the version its shard stored it.
					ev := kv.Event{Type: kv.EventDelete, Key: c.Key, Version: c.Version}
					if found {
						ev.Type, ev.Value, ev.Tags = kv.EventPut, val.Value, val.Tags
					}
					events = append(events, ev)
					return len(events) < 10000
				})
			})
			if err == nil {
				err = rerr
			}
			if err != nil {
				if kv.CodeOf(err) == kv.CodeUnavailable {
					return err
				}
				return kv.Errorf(kv.CodeInternal, "reading the change log of %q: %v", req.Collection, err)
			}
			// The changes read are valid only if GC had not passed them.
			if err := n.reading(func() error { return n.checkWatchRetained(shards, version) }); err != nil {
				return err
			}
			if spans != nil && tracingWatch() {
				evs := make([]string, len(events))
				for i, ev := range events {
					evs[i] = fmt.Sprintf("%s@%d", ev.Key, ev.Version)
				}
				traceWatch("read %d %d: node %d part %v after %q, resolved %v: %v", from, resolved, n.id, asked, after, trace, evs)
			}
			for _, ev := range events {
				if err := fn(ev); err != nil {
					return err
				}
			}
			if len(events) == 10000 {
				last := events[len(events)-1]
				version, afterKey = last.Version, last.Key
				continue // more to read up to resolved
			}
			version, afterKey = resolved, nil
		}
		if version > progressed && time.Since(lastProgress) >= every {
			if err := fn(kv.Event{Type: kv.EventProgress, Version: version}); err != nil {
				return err
			}
			progressed, lastProgress = version, time.Now()
		}
		wait := every - time.Since(lastProgress)
		if wait < 10*time.Millisecond {
			wait = 10 * time.Millisecond
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-n.stop:
			timer.Stop()
			return kv.Errorf(kv.CodeUnavailable, "node is shutting down; resume the watch from version %d", version)
		case <-notify:
		case <-timer.C:
		}
		timer.Stop()
	}
}

// checkWatchRetained fails with compacted when changes above version may
// have been garbage-collected from any of shards.
func (n *Node) checkWatchRetained(shards []uint64, version uint64) error {
	for _, id := range shards {
		gc, err := n.gcThresholds.Get(n.eng.DB, id)
		if err != nil {
			return kv.Errorf(kv.CodeInternal, "reading the GC threshold: %v", err)
		}
		if gc > 0 && version+1 < gc {
			return kv.Errorf(kv.CodeCompacted, "changes after version %d are older than the retention window (changes below %d are compacted); start again from a fresh read", version, gc)
		}
	}
	return nil
}

// reading runs fn, which reads the engine, unless the node is closing.
func (n *Node) reading(fn func() error) error {
	n.opsMu.RLock()
	defer n.opsMu.RUnlock()
	select {
	case <-n.stop:
		return kv.Errorf(kv.CodeUnavailable, "node is shutting down")
	default:
	}
	return fn()
}
