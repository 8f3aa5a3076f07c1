package node

import (
	"context"
	"sync"
	"time"

	"github.com/groupkv/groupkv/internal/shard"
)

// Resolves, gathered per shard.
//
// A committed or aborted transaction's intents are resolved in the
// background, one resolve per participant. Under load a shard receives
// the resolves of many transactions a millisecond apart, and each would be
// a raft entry of its own; a node instead gathers the resolves it sends to
// a shard for resolveGather and proposes them as one entry
// (KindTxnResolveBatch), with one proposal of a shard's resolves in flight
// at a time. Nothing waits for a resolve but the intents it settles: a
// reader meeting one consults the record, as it would before the resolve
// applied anyway. A batch that fails is retried resolve by resolve, as a
// resolve on its own would be (resolveEach).

// resolveGather is how long a shard's resolves gather before they are
// proposed.
const resolveGather = 2 * time.Millisecond

type resolveQueue struct {
	mu     sync.Mutex
	shards map[uint64]*shardResolves
}

type shardResolves struct {
	items []queuedResolve
	// busy: a flush of this shard's resolves is waiting or in flight; it
	// takes what is queued meanwhile.
	busy bool
}

type queuedResolve struct {
	cmd  *shard.TxnResolveCmd
	done func(ok bool)
}

// queueResolve has cmd proposed to shardID, gathered with others, and
// calls done with whether it applied.
func (n *Node) queueResolve(shardID uint64, cmd *shard.TxnResolveCmd, done func(ok bool)) {
	q := &n.resolves
	q.mu.Lock()
	if q.shards == nil {
		q.shards = map[uint64]*shardResolves{}
	}
	sr := q.shards[shardID]
	if sr == nil {
		sr = &shardResolves{}
		q.shards[shardID] = sr
	}
	sr.items = append(sr.items, queuedResolve{cmd, done})
	start := !sr.busy
	sr.busy = true
	q.mu.Unlock()
	if start {
		n.bg.Add(1)
		n.workers.Go(func() {
			defer n.bg.Done()
			n.flushResolves(shardID)
		})
	}
}

// flushResolves proposes shardID's queued resolves, in batches, until
// none is left.
func (n *Node) flushResolves(shardID uint64) {
	q := &n.resolves
	for {
		gather := resolveGather
		if d := n.knobs.resolveGather.Load(); d != 0 {
			gather = time.Duration(d)
		}
		select {
		case <-time.After(gather):
		case <-n.stop:
		}
		q.mu.Lock()
		sr := q.shards[shardID]
		batch := sr.items
		if len(batch) > shard.MaxResolveBatch {
			batch = batch[:shard.MaxResolveBatch]
		}
		sr.items = sr.items[len(batch):]
		if len(batch) == 0 {
			sr.busy = false
			delete(q.shards, shardID)
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
		n.proposeResolves(shardID, batch)
	}
}

func (n *Node) proposeResolves(shardID uint64, batch []queuedResolve) {
	select {
	case <-n.stop:
		for _, r := range batch {
			r.done(false)
		}
		return
	default:
	}
	if len(batch) > 1 {
		cmds := make([]*shard.TxnResolveCmd, len(batch))
		for i, r := range batch {
			cmds[i] = r.cmd
		}
		ctx, cancel := context.WithTimeout(context.Background(), n.retryWindow())
		res, err := n.propose(ctx, shardID, shard.EncodeTxnResolveBatch(cmds))
		cancel()
		if err == nil && res.Err == nil {
			n.metrics.resolveBatches.Inc()
			n.metrics.resolvesBatched.Add(float64(len(batch)))
			for _, r := range batch {
				r.done(true)
			}
			return
		}
	}
	for _, r := range batch {
		n.resolveEach(shardID, shard.EncodeTxnResolve(r.cmd), r.done)
	}
}

// resolveEach proposes one resolve to shardID until it applies, following
// the shard should a merge take it in, for as long as 4 retry windows.
func (n *Node) resolveEach(shardID uint64, cmd []byte, done func(ok bool)) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*n.retryWindow())
	defer cancel()
	for attempt := 0; ctx.Err() == nil; attempt++ {
		res, err := n.propose(ctx, shardID, cmd)
		if err == nil && res.Err == nil {
			done(true)
			return
		}
		// A shard frozen for a merge refuses resolves: once the shard
		// taking it in has applied the merge here, resolve there (it
		// holds the prepare now). Elsewhere the attempt fails, and the
		// record stays for that shard's leader to settle.
		if into, ok := n.mergedSuccessor(shardID); ok {
			shardID = into
			continue
		}
		select {
		case <-n.stop:
			done(false)
			return
		case <-time.After(time.Duration(min(attempt+1, 20)) * 10 * time.Millisecond):
		}
	}
	done(false)
}
