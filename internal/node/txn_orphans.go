package node

import (
	"context"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/shard"
	"github.com/groupkv/groupkv/internal/txn"
)

// Prepares their coordinators left.
//
// A coordinator resolves the intents of the attempts it decides. One that
// stops between its prepares and their resolves leaves, in each shard it
// prepared in, a prepared entry and its intents; whoever meets an intent
// settles it from the record (txn_read.go), but the prepared entry also
// holds the shard's resolved timestamp below its prepare version
// (shard.MinPrepared), and so every watch of the collection and every read
// at a resolved timestamp, keys met or not. So the leader of each shard
// settles, every TxnTimeout/2, the prepares older than the expiry of their
// attempt: it reads the record through its shard (aborting an attempt
// whose owner went silent past its expiry, as settleRecord does for any
// reader) and, once it is decided, resolves the shard's intents by it. A
// live attempt heartbeats, so its record stays PENDING and its prepare is
// left alone; a live coordinator resolving at the same time is harmless
// (a resolve applies once).

// settleOrphanedPrepares settles, in every shard led here, the prepares
// old enough to be orphans.
func (n *Node) settleOrphanedPrepares() {
	ctx, cancel := context.WithTimeout(context.Background(), n.retryWindow())
	defer cancel()
	var now uint64
	n.eachLed(func(id uint64, _ *shard.Shard) {
		if n.host.MinPrepared(id) == 0 {
			return
		}
		if now == 0 {
			var err error
			if now, err = n.latest(ctx); err != nil {
				return // the next shard asks again
			}
		}
		var old []txn.Meta
		err := shard.EachPrepared(n.eng.DB, id, func(m txn.Meta, _ uint64, _, _ []txn.Target) error {
			expiry := uint64(txn.ExpiryTimeout(n.opts.TxnTimeout, m.Attempt).Milliseconds()) << cluster.LogicalBits
			if now > expiry && m.Start < now-expiry {
				old = append(old, m)
			}
			return nil
		})
		if err != nil {
			n.log.Warn("reading prepared transactions failed", "shard", id, "err", err)
			return
		}
		for i := range old {
			rec, err := n.settleRecord(ctx, &old[i])
			if err != nil || rec.Status == txn.Pending {
				continue // alive, or its record unreachable: next round
			}
			if err := n.resolvePrepared(ctx, id, old[i].ID, rec); err != nil {
				n.log.Debug("resolving a prepared transaction its coordinator left failed", "shard", id, "txn", old[i].ID, "err", err)
				continue
			}
			n.metrics.orphans.Inc()
			n.log.Info("resolved a prepared transaction its coordinator left", "shard", id, "txn", old[i].ID, "status", rec.Status.String())
		}
	})
}
