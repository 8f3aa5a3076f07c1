package node

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/group"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/shard"
	"github.com/groupkv/groupkv/internal/txn"
)

// Key Groups (docs/groups.md). The protocol's state machines
// (internal/group) live in each shard's replicated state (shard/group.go);
// this file drives them on the shards this node leads:
//
//   - requests (create, delete, a group transaction's commit) are taken to
//     the raft leader of the group's leader shard, which asks its Leader
//     for the records to log and proposes them;
//   - every replica applies the records; the effects of an application
//     come back through onApplied: the raft leader replica sends the
//     messages (to the raft leader of the destination shard, over the
//     peer port, in batches) and every replica keeps the replies, so that
//     a request that outlives a change of leader finds its answer;
//   - a message that arrives is handled on the destination shard's raft
//     leader (dropped elsewhere: the protocol retries), the records it
//     asks for proposed there;
//   - a ticker drives the protocol's retries on the shards led here.
//
// A group's id is registered in the system collection groupsCollection
// (one record per group naming its leader key), which makes ids unique in
// the cluster and lets any node find a group's leader shard.

// groupsCollection is the system collection of group ids.
const groupsCollection = "_groups"

// maxGroupMembers bounds the keys of a group.
const maxGroupMembers = 10000

// groupTick is the period of the protocol's ticks (retries every
// group.Options.RetryTicks ticks).
const groupTick = 100 * time.Millisecond

// groupState is the node's volatile Key Groups state.
type groupState struct {
	// out queues messages to send, those of one effect list together
	// (groupSends), so that they go in one call and their receiver
	// handles them together.
	out chan []outMsg
	// sent, set by tests only, sees every message sent, and drops those
	// it answers true for.
	sent atomic.Pointer[func(group.Message) bool]

	mu struct {
		sync.Mutex
		// replies are the recent replies of applied records, by op,
		// group and incarnation; changed is closed when one is added.
		replies map[replyKey]replyEntry
		changed chan struct{}
		// prio are the priority tokens of groups led here (see
		// acquirePriority).
		prio map[string]*prioToken
		// sessions are the group transaction attempts begun here.
		sessions map[string]*groupTxn
		// regs caches registrations read here (see knownRegistration).
		regs map[string]cachedReg
		// yielding are the keys whose J is being handled here (groupJoin).
		yielding map[yieldKey]bool
		// freed are the members of deleting groups led here whose DA
		// came here (their shards own them again: see groupDeleteHere),
		// by group, key and yield, with when it came.
		freed map[freedKey]time.Time
	}
}

type replyKey struct {
	op  group.Op
	ref group.Ref
}

type replyEntry struct {
	r  group.Reply
	at time.Time
}

type outMsg struct {
	to   uint64 // destination shard
	msg  []byte
	hops int // times forwarded by a replica that did not lead
}

// maxGroupHops bounds how often a message is forwarded towards the
// destination shard's leader.
const maxGroupHops = 2

// replyTTL bounds how long a reply is kept for a waiter to find.
const replyTTL = 2 * time.Minute

// initGroups makes the node's Key Groups state, before the host starts
// (its records may apply at once).
func (n *Node) initGroups() {
	n.groups.out = make(chan []outMsg, 4096)
	n.groups.mu.replies = make(map[replyKey]replyEntry)
	n.groups.mu.changed = make(chan struct{})
	n.groups.mu.prio = make(map[string]*prioToken)
	n.groups.mu.sessions = make(map[string]*groupTxn)
	n.groups.mu.regs = make(map[string]cachedReg)
	n.groups.mu.yielding = make(map[yieldKey]bool)
	n.groups.mu.freed = make(map[freedKey]time.Time)
}

type freedKey struct {
	group group.Ref
	key   group.Key
	yield uint64
}

type yieldKey struct {
	shard uint64
	key   group.Key
}

type cachedReg struct {
	reg groupRegistration
	at  time.Time
}

// regTTL bounds how long a cached registration is used.
const regTTL = 5 * time.Second

// knownRegistration is registration, from a cache of a few seconds: a
// group's registration does not change while it lives, and a read of the
// group that finds it gone drops the entry (forgetRegistration).
func (n *Node) knownRegistration(ctx context.Context, id string) (groupRegistration, error) {
	n.groups.mu.Lock()
	c, ok := n.groups.mu.regs[id]
	n.groups.mu.Unlock()
	if ok && time.Since(c.at) < regTTL {
		return c.reg, nil
	}
	reg, _, err := n.registration(ctx, id)
	if err != nil {
		return reg, err
	}
	n.groups.mu.Lock()
	n.groups.mu.regs[id] = cachedReg{reg, time.Now()}
	n.groups.mu.Unlock()
	return reg, nil
}

func (n *Node) forgetRegistration(id string) {
	n.groups.mu.Lock()
	delete(n.groups.mu.regs, id)
	n.groups.mu.Unlock()
}

// startGroups starts the protocol's ticker and the message sender.
func (n *Node) startGroups() {
	n.bg.Add(2)
	go func() {
		defer n.bg.Done()
		n.every(groupTick, n.groupTick)
	}()
	go func() {
		defer n.bg.Done()
		n.groupSender()
	}()
}

// onGroupApplied takes the effects of a group record applied here.
func (n *Node) onGroupApplied(shardID uint64, effs []group.Effect) {
	leader := n.host.Ready(shardID)
	now := time.Now()
	n.groups.mu.Lock()
	added := false
	for _, e := range effs {
		if r, ok := e.(group.Reply); ok {
			ref := r.Group
			if r.Op == group.OpDelete {
				ref.Inc = 0 // a delete is asked by id
			}
			n.groups.mu.replies[replyKey{r.Op, ref}] = replyEntry{r, now}
			added = true
		}
	}
	if added {
		close(n.groups.mu.changed)
		n.groups.mu.changed = make(chan struct{})
	}
	n.groups.mu.Unlock()
	if leader {
		// Committed group writes wait in their outboxes for the next
		// tick, which ships every write of the tick's interval in one
		// message per follower shard (one proposal there, one
		// acknowledgment here) rather than one of each per write. Those
		// that wait for shipping — a deletion, a scan of member keys —
		// ship at once (shipGroupNow).
		n.groupSends(effs)
	}
}

// shipGroupNow ships, on the leader of shardID, the outbox entries of
// group id not shipped yet, without waiting for the next tick.
func (n *Node) shipGroupNow(shardID uint64, id string) {
	if !n.host.Ready(shardID) {
		return
	}
	sm := n.host.StateMachine(shardID)
	if sm == nil {
		return
	}
	var ships []group.Effect
	sm.WithGroups(func(l *group.Leader, _ *group.Follower) { ships = l.ShipNew(id) })
	n.groupSends(ships)
}

// groupSends queues the Send effects of effs (never blocks: a full queue
// drops, the protocol retries).
func (n *Node) groupSends(effs []group.Effect) {
	var out []outMsg
	for _, e := range effs {
		s, ok := e.(group.Send)
		if !ok {
			continue
		}
		if h := n.groups.sent.Load(); h != nil && (*h)(s.Msg) {
			continue // dropped by a test
		}
		if s.Msg.Type == group.MsgDA && n.unpinAfterDA(s.Msg) {
			continue // sent once the key's placement is unpinned
		}
		out = append(out, outMsg{to: uint64(s.Msg.To), msg: group.EncodeMessage(s.Msg)})
	}
	if len(out) == 0 {
		return
	}
	select {
	case n.groups.out <- out:
	default:
	}
}

// groupTick ticks the Leader and Follower of every shard led here and
// forgets old replies.
func (n *Node) groupTick() {
	// The messages of every shard's tick go together: those to one shard
	// (the shipments of groups led by several shards here) are handled
	// there together, in one proposal.
	var effs []group.Effect
	n.eachLed(func(_ uint64, sm *shard.Shard) {
		sm.WithGroups(func(l *group.Leader, f *group.Follower) {
			effs = append(effs, l.Tick()...)
			effs = append(effs, f.Tick()...)
		})
	})
	n.groupSends(effs)
	now := time.Now()
	n.groups.mu.Lock()
	for k, r := range n.groups.mu.replies {
		if now.Sub(r.at) > replyTTL {
			delete(n.groups.mu.replies, k)
		}
	}
	for k, at := range n.groups.mu.freed {
		if now.Sub(at) > replyTTL {
			delete(n.groups.mu.freed, k) // noted for a deletion asked elsewhere
		}
	}
	for id, c := range n.groups.mu.regs {
		if now.Sub(c.at) > regTTL {
			delete(n.groups.mu.regs, id)
		}
	}
	for id, s := range n.groups.mu.sessions {
		// An attempt in use (locked) is not idle; one idle ends aborted,
		// and its outcome is remembered (endGroupTxn, which takes
		// groups.mu: not called here).
		if now.Sub(time.Unix(0, s.used.Load())) > n.opts.TxnIdleTimeout && s.mu.TryLock() {
			if !s.done {
				s.done, s.err = true, kv.Errorf(kv.CodeTxnAborted, "group transaction %s expired: no request for %v", id, n.opts.TxnIdleTimeout)
				if s.client {
					n.rememberOutcome(id, txnOutcome{err: s.err})
				}
			}
			delete(n.groups.mu.sessions, id)
			s.mu.Unlock()
		}
	}
	for id, t := range n.groups.mu.prio {
		if t.holder != "" && now.After(t.lease) {
			t.holder = ""
			close(t.free)
			t.free = make(chan struct{})
		}
		if t.holder == "" && t.inflight == 0 {
			delete(n.groups.mu.prio, id)
		}
	}
	n.groups.mu.Unlock()
}

func (n *Node) localShardIDs() []uint64 {
	n.mu.RLock()
	defer n.mu.RUnlock()
	ids := make([]uint64, 0, len(n.mu.replicas))
	for id := range n.mu.replicas {
		if id != cluster.MetaShardID {
			ids = append(ids, id)
		}
	}
	return ids
}

// eachLed calls fn with every shard (but the meta shard) this node leads,
// ready, and its state machine.
func (n *Node) eachLed(fn func(id uint64, sm *shard.Shard)) {
	for _, id := range n.localShardIDs() {
		if !n.host.Ready(id) {
			continue
		}
		if sm := n.host.StateMachine(id); sm != nil {
			fn(id, sm)
		}
	}
}

// groupSender sends queued messages in batches, one call per node.
func (n *Node) groupSender() {
	for {
		var batch []outMsg
		select {
		case <-n.stop:
			return
		case ms := <-n.groups.out:
			batch = append(batch, ms...)
		}
	more:
		for len(batch) < 512 {
			select {
			case ms := <-n.groups.out:
				batch = append(batch, ms...)
			default:
				break more
			}
		}
		type dest struct {
			node uint64
			hops int
		}
		byNode := make(map[dest]*groupMessages)
		for _, m := range batch {
			target := n.leaderOfAnywhere(m.to)
			if target == 0 {
				// A node holding the shard forwards it to the leader.
				nodes := n.shardNodes(m.to)
				if len(nodes) == 0 {
					continue
				}
				target = nodes[rand.IntN(len(nodes))]
			}
			d := dest{target, m.hops}
			b := byNode[d]
			if b == nil {
				b = &groupMessages{Hops: m.hops}
				byNode[d] = b
			}
			b.Messages = append(b.Messages, m.msg)
		}
		for d, b := range byNode {
			target := d.node
			if target == n.id {
				go n.deliverGroupMessages(context.Background(), b)
				continue
			}
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				var resp groupMessagesResponse
				_ = n.callNode(ctx, target, "GroupMessages", b, &resp) // lost: retried
			}()
		}
	}
}

type groupMessages struct {
	Messages [][]byte `json:"messages"`
	// Hops counts the forwards of these messages so far.
	Hops int `json:"hops,omitempty"`
}

type groupMessagesResponse struct{}

func (n *Node) handleGroupMessages(ctx context.Context, req *groupMessages) (*groupMessagesResponse, error) {
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return &groupMessagesResponse{}, nil
	}
	defer done()
	n.deliverGroupMessages(ctx, req)
	return &groupMessagesResponse{}, nil
}

// deliverGroupMessages handles messages to shards led here; a replica
// that does not lead forwards them to the leader it knows (a bounded
// number of hops); others are dropped (their senders retry). The messages
// to one shard are handled together (deliverToShard).
func (n *Node) deliverGroupMessages(ctx context.Context, req *groupMessages) {
	byShard := make(map[uint64][]group.Message)
	var order []uint64
	for _, raw := range req.Messages {
		m, err := group.DecodeMessage(raw)
		if err != nil {
			n.log.Warn("dropping a corrupt group message", "err", err)
			continue
		}
		if to := uint64(m.To); !n.host.Ready(to) {
			// Not led here: a replica forwards it to the leader it knows.
			if l := n.leaderOfAnywhere(to); l != 0 && l != n.id && req.Hops < maxGroupHops {
				select {
				case n.groups.out <- []outMsg{{to: to, msg: raw, hops: req.Hops + 1}}:
				default:
				}
			}
			continue
		}
		if byShard[uint64(m.To)] == nil {
			order = append(order, uint64(m.To))
		}
		byShard[uint64(m.To)] = append(byShard[uint64(m.To)], m)
	}
	var wg sync.WaitGroup
	for _, id := range order {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			n.deliverToShard(mctx, id, byShard[id])
		}()
	}
	wg.Wait()
}

// deliverToShard handles msgs, to shard id led here. The records they
// log go in as few proposals as they can (groupAct): the Js' yields
// together once every J's key is checked (concurrently), the others
// together at once.
func (n *Node) deliverToShard(ctx context.Context, id uint64, msgs []group.Message) {
	if !n.host.Ready(id) {
		return
	}
	sm := n.host.StateMachine(id)
	if sm == nil {
		return
	}
	var joins struct {
		sync.Mutex
		effs     []group.Effect
		releases []func()
	}
	var wg sync.WaitGroup
	var effs []group.Effect
	for _, m := range msgs {
		if m.Type == group.MsgJ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				e, release := n.groupJoin(ctx, id, sm, m)
				joins.Lock()
				joins.effs = append(joins.effs, e...)
				if release != nil {
					joins.releases = append(joins.releases, release)
				}
				joins.Unlock()
			}()
			continue
		}
		var e []group.Effect
		sm.WithGroups(func(l *group.Leader, f *group.Follower) {
			switch m.Type {
			case group.MsgJAA:
				e = f.OnJAA(m)
			case group.MsgD:
				e = f.OnD(m)
			case group.MsgShip:
				e = f.OnShip(m)
			case group.MsgJA:
				e = l.OnJA(m)
			case group.MsgDA:
				e = l.OnDA(m)
			case group.MsgShipAck:
				e = l.OnShipAck(m)
			}
		})
		if m.Type == group.MsgDA && len(e) > 0 {
			n.noteFreed(m) // a member releasing with m's yield
		}
		effs = append(effs, e...)
	}
	n.groupAct(ctx, id, effs)
	wg.Wait()
	n.groupAct(ctx, id, joins.effs)
	for _, release := range joins.releases {
		release()
	}
}

// groupJoin checks, for a J on the follower shard's leader, the key (intent,
// lock, value) while an exclusive lock on it is held, and answers the J's
// effects and a func that releases the lock (nil if none is held), to be
// called once the yield is proposed and applied, so that no write or
// intent lands in between.
func (n *Node) groupJoin(ctx context.Context, id uint64, sm *shard.Shard, m group.Message) ([]group.Effect, func()) {
	lt := n.lockTable(id)
	if lt == nil {
		return nil, nil
	}
	// A J that comes again while the first is being handled (a retry, a
	// duplicate) is dropped: the first one's JA answers both. Handled
	// concurrently, it would find the key locked by the first one's yield
	// and refuse it.
	yk := yieldKey{id, m.Key}
	n.groups.mu.Lock()
	busy := n.groups.mu.yielding[yk]
	n.groups.mu.yielding[yk] = true
	n.groups.mu.Unlock()
	if busy {
		return nil, nil
	}
	var held *txn.Meta
	release := func() {
		if held != nil {
			lt.Release(held.ID)
		}
		n.groups.mu.Lock()
		delete(n.groups.mu.yielding, yk)
		n.groups.mu.Unlock()
	}
	key := []byte(m.Key.Key)
	meta := &txn.Meta{ID: "yield-" + n.plainSeq(), Priority: txn.PlainPriority, Plain: true}
	var kc group.KeyCheck
	ok, err := lt.TryAcquireAll(ctx, meta, []txn.Target{{Collection: m.Key.Collection, Key: key}})
	if err != nil {
		release()
		return nil, nil
	}
	if ok {
		held = meta
		in, has, err := shard.ReadIntent(n.eng.DB, m.Key.Collection, key)
		if err != nil {
			release()
			return nil, nil
		}
		kc.Intent = has && in.Meta.ID != ""
		if d := n.collectionByID(m.Key.Collection); !kc.Intent && d != nil && d.Partitioning == kv.PartitionTag {
			if kc.Refused, err = n.pinForGroup(ctx, d, id, sm, m); err != nil {
				release()
				return nil, nil // the protocol retries
			}
		}
		val, version, found, err := shard.ReadRecord(n.eng.DB, m.Key.Collection, key, shard.Latest)
		if err != nil {
			release()
			return nil, nil
		}
		if found {
			kc.Value, kc.Version, kc.Tags.List = val.Value, version, val.Tags
		} else {
			kc.Absent = true
		}
	} else {
		kc.Locked = true
	}
	var effs []group.Effect
	sm.WithGroups(func(_ *group.Leader, f *group.Follower) { effs = f.OnJ(m, kc) })
	return effs, release
}

// collectionByID returns the collection of id, nil if the catalog here
// has none.
func (n *Node) collectionByID(id uint32) *cluster.CollectionDesc {
	n.mu.RLock()
	defer n.mu.RUnlock()
	for _, d := range n.mu.catalog {
		if d.ID == id {
			return d
		}
	}
	return nil
}

// pinForGroup pins, for a J to follower shard id, the placement of its key
// of tag collection d in the key's home shard, so that the record stays in
// id while the group holds it: a move of the placement (a put with another
// first tag, after a delete) is refused until the key is freed and the pin
// removed (unpinAfterDA). A key never placed is placed by its key. It
// answers the reason to refuse the key ("" none): its placement is in
// another shard, or another group pins it. The caller holds the key's
// exclusive lock in id from before the pin until the yield is applied, and
// unpinAfterDA takes it too, so a pin is removed only while the key is not
// yielded to its group.
func (n *Node) pinForGroup(ctx context.Context, d *cluster.CollectionDesc, id uint64, sm *shard.Shard, m group.Message) (string, error) {
	yielded := false
	sm.WithGroups(func(_ *group.Leader, f *group.Follower) {
		_, yielded = f.Key(m.Key)
	})
	if yielded {
		return "", nil // pinned before it was yielded; OnJ answers
	}
	key := []byte(m.Key.Key)
	p, err := n.placementPinOf(ctx, d, key)
	if err != nil {
		return "", err
	}
	if _, i := d.Route(key, p.Tag); d.Shards[i].ID != id {
		return group.ReasonPlacement, nil
	}
	pin := m.Group.String()
	switch p.Pin {
	case pin:
		return "", nil
	case "":
	default:
		// Another group's pin, while the key is not yielded here and this
		// J holds its lock: left by a J handled on a leader that lost the
		// leadership before its yield (the key was then refused, or its
		// group deleted before its D): remove it.
		if err := n.proposeUnpin(ctx, d, key, p.Pin); err != nil {
			return "", err
		}
	}
	// The home shard takes the key's lock there for the proposal: a
	// transaction holding it (it reads or writes the key) would make the
	// J wait, so the pin gives up after a while and refuses the key.
	pctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	hb, home := homeOf(d, key)
	res, err := n.propose(pctx, home, shard.EncodePlace(shard.Placement{Bucket: hb, Key: key, HasOld: p.OK, Old: p.Tag, New: p.Tag, Op: shard.PlacePin, Pin: pin}))
	if err == nil && res.Err != nil {
		err = res.Err
	}
	if err == nil {
		return "", nil
	}
	switch kv.CodeOf(err) {
	case kv.CodeConditionFailed:
		return group.ReasonPlacement, nil
	case kv.CodeKeyInGroup:
		return group.ReasonInGroup, nil
	}
	if pctx.Err() != nil && ctx.Err() == nil {
		return group.ReasonLocked, nil
	}
	return "", err
}

// unpinAfterDA sends DA m, from a follower shard led here, once the pin
// of its key's placement, if of a tag collection, is removed from the
// key's home shard. It is sent only then (else dropped, and the leader
// sends the D again): the group's leader forgets the key at DA.
func (n *Node) unpinAfterDA(m group.Message) bool {
	d := n.collectionByID(m.Key.Collection)
	if d == nil || d.Partitioning != kv.PartitionTag {
		return false
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		select {
		case <-n.stop:
			return
		default:
		}
		if err := n.unpin(ctx, d, uint64(m.From), []byte(m.Key.Key), m.Group.String()); err != nil {
			n.log.Debug("removing a group's pin failed; its D comes again", "group", m.Group, "key", m.Key, "err", err)
			return
		}
		select {
		case n.groups.out <- []outMsg{{to: uint64(m.To), msg: group.EncodeMessage(m)}}:
		default:
		}
	}()
	return true
}

// unpin removes pin ("": whichever) from the placement of key, of tag
// collection d, unless follower shard id (led here, the shard of the
// key's placement) has the key yielded to a group (whose pin it is). It
// holds the key's lock in id, as pinForGroup does from its pin to its
// yield, so it never removes the pin of a yield under way.
func (n *Node) unpin(ctx context.Context, d *cluster.CollectionDesc, id uint64, key []byte, pin string) error {
	lt := n.lockTable(id)
	sm := n.host.StateMachine(id)
	if lt == nil || sm == nil || !n.host.Ready(id) {
		return kv.Errorf(kv.CodeNotLeader, "node %d does not lead shard %d", n.id, id)
	}
	meta := &txn.Meta{ID: "unpin-" + n.plainSeq(), Priority: txn.PlainPriority, Plain: true}
	ok, err := lt.TryAcquireAll(ctx, meta, []txn.Target{{Collection: d.ID, Key: key}})
	if err != nil {
		return err
	}
	if !ok {
		return kv.Errorf(kv.CodeUnavailable, "key %q is locked in shard %d", key, id)
	}
	defer lt.Release(meta.ID)
	held := false
	sm.WithGroups(func(_ *group.Leader, f *group.Follower) {
		_, held = f.Key(group.Key{Collection: d.ID, Key: string(key)})
	})
	if held {
		return nil
	}
	if pin == "" {
		p, err := n.placementPinOf(ctx, d, key)
		if err != nil || p.Pin == "" {
			return err
		}
		if _, i := d.Route(key, p.Tag); d.Shards[i].ID != id {
			return nil // not this shard's pin
		}
		pin = p.Pin
	}
	return n.proposeUnpin(ctx, d, key, pin)
}

// proposeUnpin removes pin from the placement of key in its home shard.
func (n *Node) proposeUnpin(ctx context.Context, d *cluster.CollectionDesc, key []byte, pin string) error {
	hb, home := homeOf(d, key)
	res, err := n.propose(ctx, home, shard.EncodePlace(shard.Placement{Bucket: hb, Key: key, Op: shard.PlaceUnpin, Pin: pin}))
	if err == nil && res.Err != nil {
		err = res.Err
	}
	return err
}

// noteFreed notes that member m.Key of the deleting group m.Group, which
// the leader releases with yield m.Yield, is free again: its shard logged
// its release (and stored the group's last writes of it) before it sent
// DA m. Volatile: the leader's release record is what lasts.
func (n *Node) noteFreed(m group.Message) {
	n.groups.mu.Lock()
	n.groups.mu.freed[freedKey{m.Group, m.Key, m.Yield}] = time.Now()
	close(n.groups.mu.changed)
	n.groups.mu.changed = make(chan struct{})
	n.groups.mu.Unlock()
}

// forgetFreed forgets what noteFreed noted of group g.
func (n *Node) forgetFreed(g group.Group) {
	n.groups.mu.Lock()
	defer n.groups.mu.Unlock()
	for _, m := range g.Members {
		delete(n.groups.mu.freed, freedKey{g.Ref, m.Key, m.Yield})
	}
}

// released reports whether every member of deleting group g is released,
// refused, or free again in its shard (its DA came here: noteFreed).
func (n *Node) released(g group.Group) bool {
	n.groups.mu.Lock()
	defer n.groups.mu.Unlock()
	for _, m := range g.Members {
		switch m.Status {
		case group.Released, group.Refused:
		case group.Releasing:
			if _, ok := n.groups.mu.freed[freedKey{g.Ref, m.Key, m.Yield}]; !ok {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// groupAct proposes the Log effects of effs in shardID (led here), in as
// few commands as they go in (shard.EncodeGroupRecords), and queues its
// Send effects. The effects of the records' application come through
// onApplied.
func (n *Node) groupAct(ctx context.Context, shardID uint64, effs []group.Effect) {
	n.groupSends(effs)
	var recs []group.Record
	for _, e := range effs {
		if l, ok := e.(group.Log); ok {
			recs = append(recs, l.Record)
		}
	}
	for _, cmd := range shard.EncodeGroupRecords(recs) {
		if _, err := n.host.Propose(ctx, shardID, cmd); err != nil {
			return // lost: the protocol retries
		}
	}
}

// waitReply waits for the reply of op on ref (ref.Inc 0 for a delete).
func (n *Node) waitReply(ctx context.Context, op group.Op, ref group.Ref) (group.Reply, error) {
	for {
		n.groups.mu.Lock()
		r, ok := n.groups.mu.replies[replyKey{op, ref}]
		ch := n.groups.mu.changed
		n.groups.mu.Unlock()
		if ok {
			return r.r, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return group.Reply{}, ctx.Err()
		case <-n.stop:
			return group.Reply{}, kv.Errorf(kv.CodeUnavailable, "node is shutting down")
		}
	}
}

// groupRegistration is a group's record in groupsCollection.
type groupRegistration struct {
	Collection string `json:"collection"`
	Key        []byte `json:"key"`
	// Spec is a digest of the creation request (groupCreateRequest.sum):
	// the same request asked again goes on with the registered group.
	Spec string `json:"spec,omitempty"`
}

func (n *Node) ensureGroupsCollection(ctx context.Context) error {
	if _, err := n.collection(groupsCollection); err == nil {
		return nil
	}
	_, err := n.CreateCollection(systemContext(ctx), kv.CollectionOptions{Name: groupsCollection, Partitioning: kv.PartitionRange})
	if kv.CodeOf(err) == kv.CodeAlreadyExists {
		return nil
	}
	return err
}

// registration reads group id's registration.
func (n *Node) registration(ctx context.Context, id string) (groupRegistration, uint64, error) {
	if _, err := n.collection(groupsCollection); err != nil {
		return groupRegistration{}, 0, kv.Errorf(kv.CodeNotFound, "no group %q", id)
	}
	rec, err := n.Get(ctx, kv.GetRequest{Collection: groupsCollection, Key: []byte(id)})
	if kv.CodeOf(err) == kv.CodeNotFound {
		return groupRegistration{}, 0, kv.Errorf(kv.CodeNotFound, "no group %q", id)
	}
	if err != nil {
		return groupRegistration{}, 0, err
	}
	var reg groupRegistration
	if err := json.Unmarshal(rec.Value, &reg); err != nil {
		return groupRegistration{}, 0, kv.Errorf(kv.CodeInternal, "group %q has a corrupt registration: %v", id, err)
	}
	return reg, rec.Version, nil
}

// groupKey resolves a key ref to the protocol's key and the shard holding
// its record: of a key of a tag collection, the shard of its placement (by
// its key if it was never placed), which a group holding the key pins.
func (n *Node) groupKey(ctx context.Context, ref kv.KeyRef) (group.Key, uint64, error) {
	d, err := n.collection(ref.Collection)
	if err != nil {
		return group.Key{}, 0, err
	}
	if err := kv.ValidateKey(ref.Key); err != nil {
		return group.Key{}, 0, err
	}
	k := group.Key{Collection: d.ID, Key: string(ref.Key)}
	if d.Partitioning == kv.PartitionTag {
		tag, _, err := n.placementOf(ctx, d, ref.Key)
		if err != nil {
			return group.Key{}, 0, err
		}
		_, i := d.Route(ref.Key, tag)
		return k, d.Shards[i].ID, nil
	}
	_, shardID := n.route(d, ref.Key)
	return k, shardID, nil
}

func (n *Node) keyRef(k group.Key) kv.KeyRef {
	n.mu.RLock()
	defer n.mu.RUnlock()
	for name, d := range n.mu.catalog {
		if d.ID == k.Collection {
			return kv.KeyRef{Collection: name, Key: []byte(k.Key)}
		}
	}
	return kv.KeyRef{Collection: fmt.Sprintf("#%d", k.Collection), Key: []byte(k.Key)}
}

// groupCreateRequest asks the leader of a group's leader shard to create it.
type groupCreateRequest struct {
	Shard   uint64         `json:"shard"`
	ID      string         `json:"id"`
	Mode    uint8          `json:"mode"`
	Leader  groupKeyWire   `json:"leader"`
	Members []groupKeyWire `json:"members"`
}

type groupKeyWire struct {
	Collection uint32 `json:"collection"`
	Key        []byte `json:"key"`
	Shard      uint64 `json:"shard,omitempty"`
}

func (w groupKeyWire) key() group.Key { return group.Key{Collection: w.Collection, Key: string(w.Key)} }

// sum is a digest of the group a creation asks for: its id, mode, leader
// key and set of members.
func (r *groupCreateRequest) sum() string {
	keys := make([]string, 0, len(r.Members))
	for _, m := range r.Members {
		keys = append(keys, fmt.Sprintf("%d/%x", m.Collection, m.Key))
	}
	sort.Strings(keys)
	h := sha256.New()
	fmt.Fprintf(h, "%q %d %d/%x %s", r.ID, r.Mode, r.Leader.Collection, r.Leader.Key, strings.Join(keys, ","))
	return hex.EncodeToString(h.Sum(nil)[:16])
}

type groupCreateResponse struct {
	Joined  []groupKeyWire `json:"joined,omitempty"`
	Refused []groupRefused `json:"refused,omitempty"`
	Error   *peerError     `json:"error,omitempty"`
	// Created: this call logged the group's creation (not an earlier
	// call of the same request).
	Created bool `json:"created,omitempty"`
}

type groupRefused struct {
	Key    groupKeyWire `json:"key"`
	Reason string       `json:"reason"`
}

// CreateGroup implements kv.GroupBackend.
func (n *Node) CreateGroup(ctx context.Context, spec kv.GroupSpec) (kv.GroupCreated, error) {
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return kv.GroupCreated{}, err
	}
	defer done()
	if err := kv.ValidateGroupID(spec.ID); err != nil {
		return kv.GroupCreated{}, err
	}
	var mode group.Mode
	switch spec.Mode {
	case "", kv.GroupAtomic:
		mode = group.Atomic
	case kv.GroupBestEffort:
		mode = group.BestEffort
	default:
		return kv.GroupCreated{}, kv.Errorf(kv.CodeInvalidArgument, "mode %q is not atomic or best_effort", spec.Mode)
	}
	if spec.Leader.Collection == "" {
		return kv.GroupCreated{}, kv.Errorf(kv.CodeInvalidArgument, "a group needs a leader key")
	}
	if len(spec.Members) > maxGroupMembers {
		return kv.GroupCreated{}, kv.Errorf(kv.CodeInvalidArgument, "a group holds at most %d keys, %d asked", maxGroupMembers, len(spec.Members))
	}
	for _, m := range append([]kv.KeyRef{spec.Leader}, spec.Members...) {
		if err := checkWritable(ctx, m.Collection); err != nil {
			return kv.GroupCreated{}, err
		}
	}
	lk, leaderShard, err := n.groupKey(ctx, spec.Leader)
	if err != nil {
		return kv.GroupCreated{}, err
	}
	req := &groupCreateRequest{Shard: leaderShard, ID: spec.ID, Mode: uint8(mode),
		Leader: groupKeyWire{Collection: lk.Collection, Key: spec.Leader.Key, Shard: leaderShard}}
	seen := map[group.Key]bool{lk: true}
	for _, m := range spec.Members {
		k, s, err := n.groupKey(ctx, m)
		if err != nil {
			return kv.GroupCreated{}, err
		}
		if seen[k] {
			continue
		}
		seen[k] = true
		req.Members = append(req.Members, groupKeyWire{Collection: k.Collection, Key: m.Key, Shard: s})
	}
	if err := n.ensureGroupsCollection(ctx); err != nil {
		return kv.GroupCreated{}, err
	}
	sum := req.sum()
	regVal, _ := json.Marshal(groupRegistration{Collection: spec.Leader.Collection, Key: spec.Leader.Key, Spec: sum})
	// The id is registered (a conditional put: ids are unique) while the
	// group is created, not before; a creation that loses the id to
	// another request is undone.
	type regResult struct {
		version uint64
		err     error
	}
	regDone := make(chan regResult, 1)
	go func() {
		zero := uint64(0)
		v, err := n.Put(systemContext(ctx), kv.PutRequest{Collection: groupsCollection, Key: []byte(spec.ID), Value: regVal, IfVersion: &zero})
		regDone <- regResult{v, err}
	}()
	create := func() (*groupCreateResponse, error) {
		resp, err := n.atGroupLeader(ctx, leaderShard, "GroupCreate", req, func(ctx context.Context) (any, error) {
			return n.groupCreateHere(ctx, req)
		})
		if err != nil {
			return nil, err
		}
		out := resp.(*groupCreateResponse)
		return out, out.Error.err()
	}
	out, err := create()
	reg := <-regDone
	if reg.err == nil && kv.CodeOf(err) == kv.CodeAlreadyExists {
		// The id is ours, yet another group of it is in the leader shard:
		// one being deleted, or one of a request that lost the id to this
		// one and undoes it. Wait for it to go.
		for wait := 10 * time.Millisecond; kv.CodeOf(err) == kv.CodeAlreadyExists && wait < groupCreateRaceWait; wait *= 2 {
			select {
			case <-time.After(wait):
			case <-ctx.Done():
			}
			if ctx.Err() != nil {
				break
			}
			out, err = create()
		}
	}
	regVersion := reg.version
	if reg.err != nil {
		// Registered already to this request: asked again (its first
		// answer was lost), or its put landed though it failed; it goes
		// on. Else the id is taken, or could not be registered.
		cur, v, rerr := n.registration(ctx, spec.ID)
		if rerr != nil || cur.Spec != sum {
			if out != nil && out.Created {
				// This call created a group the id is not registered to.
				undo := &groupDeleteRequest{Shard: leaderShard, ID: spec.ID}
				dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
				_, _ = n.atGroupLeader(dctx, leaderShard, "GroupDelete", undo, func(ctx context.Context) (any, error) {
					return n.groupDeleteHere(ctx, undo)
				})
				cancel()
			}
			if kv.CodeOf(reg.err) != kv.CodeConditionFailed {
				return kv.GroupCreated{}, reg.err
			}
			return kv.GroupCreated{}, kv.Errorf(kv.CodeAlreadyExists, "group %q exists; delete it first or choose another id", spec.ID)
		}
		regVersion = v
	}
	if err != nil {
		if c := kv.CodeOf(err); c == kv.CodeGroupRefused || c == kv.CodeInvalidArgument || c == kv.CodeAlreadyExists {
			// Nothing is held for it any more: the id is free again (this
			// request's registration, not a newer one).
			_, _ = n.Delete(systemContext(context.WithoutCancel(ctx)), kv.DeleteRequest{Collection: groupsCollection, Key: []byte(spec.ID), IfVersion: &regVersion})
		}
		return kv.GroupCreated{}, err
	}
	// The group's transactions, which a routed client sends to this node
	// (it leads the group's leader shard), begin without reading the
	// registration again.
	n.groups.mu.Lock()
	n.groups.mu.regs[spec.ID] = cachedReg{groupRegistration{Collection: spec.Leader.Collection, Key: spec.Leader.Key, Spec: sum}, time.Now()}
	n.groups.mu.Unlock()
	created := kv.GroupCreated{ID: spec.ID}
	for _, k := range out.Joined {
		created.Joined = append(created.Joined, n.keyRef(k.key()))
	}
	for _, r := range out.Refused {
		created.Refused = append(created.Refused, kv.GroupRefusal{KeyRef: n.keyRef(r.Key.key()), Reason: r.Reason})
	}
	return created, nil
}

// atGroupLeader runs local on this node if it leads shardID, else calls
// method on the node that does (or one that knows it), retrying while the
// shard has no leader.
func (n *Node) atGroupLeader(ctx context.Context, shardID uint64, method string, req any, local func(context.Context) (any, error)) (any, error) {
	search := n.leaderSearch()
	for attempt := 0; ; attempt++ {
		var out any
		var err error
		search.try()
		if n.host.Ready(shardID) {
			out, err = local(ctx)
		} else {
			target := n.leaderOfAnywhere(shardID)
			if target == 0 || target == n.id {
				if nodes, _ := n.answeringFirst(n.shardNodes(shardID)); len(nodes) > 0 && !n.hasReplica(shardID) {
					target = nodes[attempt%len(nodes)]
				}
			}
			if target == 0 || target == n.id {
				err = kv.Errorf(kv.CodeUnavailable, "shard %d has no leader", shardID)
			} else {
				out, err = n.callGroupMethod(ctx, shardID, target, method, req)
			}
		}
		if err == nil {
			return out, nil
		}
		if !retryable(err) || ctx.Err() != nil {
			return nil, err
		}
		if berr := search.backoff(ctx, attempt, err); berr != nil {
			return nil, berr
		}
	}
}

// callGroupMethod calls method on node target, which leads shardID (or
// knows who does). Each call is abandoned if target stops answering
// (callLeader). A read (GroupRead, GroupOwner), a creation or a deletion
// is then retried: a creation asked again of a group made to the same
// spec answers as the first did, a deletion asked again waits for the
// first's (or finds the group gone, which DeleteGroup takes as deleted).
// A commit the target may have received answers commit_unknown.
func (n *Node) callGroupMethod(ctx context.Context, shardID, target uint64, method string, req any) (any, error) {
	switch method {
	case "GroupCreate":
		resp := new(groupCreateResponse)
		if _, err := n.callLeader(ctx, shardID, target, method, req, resp); err != nil {
			return nil, err
		}
		if c := kv.CodeOf(resp.Error.err()); c == kv.CodeNotLeader || c == kv.CodeUnavailable {
			return nil, resp.Error.err()
		}
		return resp, nil
	case "GroupDelete":
		resp := new(groupDeleteResponse)
		if _, err := n.callLeader(ctx, shardID, target, method, req, resp); err != nil {
			return nil, err
		}
		return resp, resp.Error.err()
	case "GroupRead":
		resp := new(groupReadResponse)
		if _, err := n.callLeader(ctx, shardID, target, method, req, resp); err != nil {
			return nil, err
		}
		return resp, resp.Error.err()
	case "GroupOwner":
		resp := new(groupOwnerResponse)
		if _, err := n.callLeader(ctx, shardID, target, method, req, resp); err != nil {
			return nil, err
		}
		return resp, resp.Error.err()
	case "GroupCommit":
		resp := new(groupCommitResponse)
		if sent, err := n.callLeader(ctx, shardID, target, method, req, resp); err != nil {
			if sent && !req.(*groupCommitRequest).Release {
				// It may have reached the leader and been proposed there:
				// a retry could apply it again, or refuse it as changed
				// by itself.
				return nil, kv.Errorf(kv.CodeCommitUnknown, "forwarding the group commit to node %d failed (%v); it may or may not have taken effect", target, err)
			}
			return nil, err
		}
		return resp, resp.Error.err()
	}
	return nil, kv.Errorf(kv.CodeInternal, "unknown group method %s", method)
}

func (n *Node) handleGroupCreate(ctx context.Context, req *groupCreateRequest) (*groupCreateResponse, error) {
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return &groupCreateResponse{Error: toPeerError(err)}, nil
	}
	defer done()
	if !n.host.Ready(req.Shard) {
		return &groupCreateResponse{Error: toPeerError(kv.Errorf(kv.CodeNotLeader, "node %d does not lead shard %d", n.id, req.Shard))}, nil
	}
	out, err := n.groupCreateHere(ctx, req)
	if err != nil {
		return &groupCreateResponse{Error: toPeerError(err)}, nil
	}
	return out, nil
}

// groupCreateHere creates a group on the leader of its leader shard (this
// node) and waits for the creation to finish.
func (n *Node) groupCreateHere(ctx context.Context, req *groupCreateRequest) (*groupCreateResponse, error) {
	sm := n.host.StateMachine(req.Shard)
	if sm == nil {
		return nil, kv.Errorf(kv.CodeNotLeader, "node %d holds no replica of shard %d", n.id, req.Shard)
	}
	cr := group.CreateRequest{ID: req.ID, Mode: group.Mode(req.Mode), Leader: req.Leader.key()}
	for _, m := range req.Members {
		cr.Members = append(cr.Members, group.Member{Key: m.key(), Shard: group.ShardID(m.Shard)})
	}
	var effs []group.Effect
	var err error
	var existing group.Group
	var exists, created bool
	sm.WithGroups(func(l *group.Leader, _ *group.Follower) {
		existing, exists = l.Group(req.ID)
		if !exists {
			effs, err = l.Create(cr)
		}
	})
	ref := existing.Ref
	if exists && !sameGroupSpec(existing, cr) {
		return nil, kv.Errorf(kv.CodeAlreadyExists, "group %q exists; delete it first or choose another id", req.ID)
	}
	if exists && existing.State == group.Deleting {
		// Another incarnation on its way out (its registration goes
		// before it is forgotten), or this request's, deleted since.
		return nil, kv.Errorf(kv.CodeAlreadyExists, "group %q is being deleted: create it again once its delete has answered", req.ID)
	}
	if exists && existing.State == group.Active {
		// Created before (this request asked again): its answer.
		out := &groupCreateResponse{}
		for _, m := range existing.Members {
			k := groupKeyWire{Collection: m.Key.Collection, Key: []byte(m.Key.Key)}
			switch m.Status {
			case group.Joined:
				out.Joined = append(out.Joined, k)
			case group.Refused:
				out.Refused = append(out.Refused, groupRefused{Key: k, Reason: m.Reason})
			}
		}
		return out, nil
	}
	if !exists {
		if err != nil {
			return nil, groupError(err, req.ID)
		}
		var rec group.Record
		for _, e := range effs {
			if l, ok := e.(group.Log); ok {
				rec = l.Record
			}
		}
		res, err := n.host.Propose(ctx, req.Shard, shard.EncodeGroupRecord(rec))
		if err != nil {
			return nil, err
		}
		if res.Err != nil {
			return nil, res.Err
		}
		for _, e := range res.Group {
			switch e := e.(type) {
			case group.Send:
				ref = e.Msg.Group
			case group.Reply:
				if e.Err != nil {
					return nil, groupError(e.Err, req.ID)
				}
			}
		}
		created = true
	}
	if ref.Inc == 0 {
		return nil, kv.Errorf(kv.CodeInternal, "group %q was created without an incarnation", req.ID)
	}
	r, err := n.waitReply(ctx, group.OpCreate, ref)
	if err != nil {
		return nil, kv.Errorf(kv.CodeUnavailable, "group %q: creation did not finish before the request ended (%v); describe it to see where it is", req.ID, err)
	}
	out := &groupCreateResponse{Created: created}
	for _, k := range r.Joined {
		out.Joined = append(out.Joined, groupKeyWire{Collection: k.Collection, Key: []byte(k.Key)})
	}
	for _, f := range r.Refused {
		out.Refused = append(out.Refused, groupRefused{Key: groupKeyWire{Collection: f.Key.Collection, Key: []byte(f.Key.Key)}, Reason: f.Reason})
	}
	if r.Err != nil {
		err := groupError(r.Err, req.ID)
		if errors.Is(r.Err, group.ErrRefused) {
			var why []string
			for _, f := range r.Refused {
				why = append(why, fmt.Sprintf("%q (%s)", f.Key.Key, f.Reason))
			}
			sort.Strings(why)
			err = kv.Errorf(kv.CodeGroupRefused, "group %q: keys would not join the atomic group: %v; every key it took is released", req.ID, why)
		}
		out.Error = toPeerError(err)
	}
	return out, nil
}

// groupCreateRaceWait bounds how long a create that registered its id
// waits for another group of that id to leave the leader shard (about
// twice this, in doubling steps).
const groupCreateRaceWait = time.Second

// sameGroupSpec reports whether group g is what request cr creates: the
// same leader, mode and keys (then cr is taken for that request asked
// again).
func sameGroupSpec(g group.Group, cr group.CreateRequest) bool {
	if g.Leader != cr.Leader || g.Mode != cr.Mode {
		return false
	}
	want := map[group.Key]bool{cr.Leader: true}
	for _, m := range cr.Members {
		want[m.Key] = true
	}
	if len(want) != len(g.Members) {
		return false
	}
	for _, m := range g.Members {
		if !want[m.Key] {
			return false
		}
	}
	return true
}

// groupError maps the protocol's errors to the API's.
func groupError(err error, id string) error {
	switch {
	case errors.Is(err, group.ErrExists):
		return kv.Errorf(kv.CodeAlreadyExists, "group %q exists", id)
	case errors.Is(err, group.ErrNotFound):
		return kv.Errorf(kv.CodeNotFound, "no group %q", id)
	case errors.Is(err, group.ErrInvalid):
		return kv.Errorf(kv.CodeInvalidArgument, "group %q: invalid request (a key that is not a member of the group?)", id)
	case errors.Is(err, group.ErrRefused):
		return kv.Errorf(kv.CodeGroupRefused, "group %q: a key would not join the atomic group", id)
	case errors.Is(err, group.ErrDeletedWhileCreating):
		return kv.Errorf(kv.CodeGroupRefused, "group %q was deleted while it was being created", id)
	case errors.Is(err, group.ErrNotActive):
		return kv.Errorf(kv.CodeUnavailable, "group %q is not active (being created or deleted)", id)
	case errors.Is(err, group.ErrConflict):
		return kv.Errorf(kv.CodeTxnAborted, "group %q: a key the transaction read was changed by another transaction of the group; retry it", id)
	case errors.Is(err, group.ErrBacklogged):
		return kv.Errorf(kv.CodeUnavailable, "group %q: the shard of a key the transaction wrote has not taken the group's earlier writes (too many wait for it: is it out of reach?); nothing was written, retry later", id)
	}
	return err
}

// groupDeleteRequest asks the leader of a group's leader shard to delete it.
type groupDeleteRequest struct {
	Shard uint64 `json:"shard"`
	ID    string `json:"id"`
	// RegVersion is the version of the group's registration the deleter
	// read (0: unknown). The leader removes that registration, if still
	// there, while the members are released.
	RegVersion uint64 `json:"reg_version,omitempty"`
}

type groupDeleteResponse struct {
	Error *peerError `json:"error,omitempty"`
	// Unregistered: the leader removed the registration of RegVersion, or
	// found it gone or replaced; the deleter need not look at it again.
	Unregistered bool `json:"unregistered,omitempty"`
}

// DeleteGroup implements kv.GroupBackend.
func (n *Node) DeleteGroup(ctx context.Context, id string) error {
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return err
	}
	defer done()
	if err := kv.ValidateGroupID(id); err != nil {
		return err
	}
	reg, regVersion, err := n.registration(ctx, id)
	if err != nil {
		return err
	}
	_, shardID, err := n.groupKey(ctx, kv.KeyRef{Collection: reg.Collection, Key: reg.Key})
	if err != nil {
		return err
	}
	req := &groupDeleteRequest{Shard: shardID, ID: id, RegVersion: regVersion}
	out, err := n.atGroupLeader(ctx, shardID, "GroupDelete", req, func(ctx context.Context) (any, error) {
		return n.groupDeleteHere(ctx, req)
	})
	if err != nil && kv.CodeOf(err) != kv.CodeNotFound {
		return err
	}
	n.forgetRegistration(id)
	if resp, ok := out.(*groupDeleteResponse); ok && err == nil && resp.Unregistered {
		return nil
	}
	// The leader did not remove the registration (it could not, or the
	// group was gone, or its deletion was asked before): remove it here,
	// the one read, not a newer one.
	if _, v, err := n.registration(ctx, id); err == nil && v == regVersion {
		if _, err := n.Delete(systemContext(ctx), kv.DeleteRequest{Collection: groupsCollection, Key: []byte(id), IfVersion: &v}); err != nil &&
			kv.CodeOf(err) != kv.CodeNotFound && kv.CodeOf(err) != kv.CodeConditionFailed {
			return err
		}
	} else if err != nil && kv.CodeOf(err) != kv.CodeNotFound {
		return err
	}
	return nil
}

func (n *Node) handleGroupDelete(ctx context.Context, req *groupDeleteRequest) (*groupDeleteResponse, error) {
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return &groupDeleteResponse{Error: toPeerError(err)}, nil
	}
	defer done()
	if !n.host.Ready(req.Shard) {
		return &groupDeleteResponse{Error: toPeerError(kv.Errorf(kv.CodeNotLeader, "node %d does not lead shard %d", n.id, req.Shard))}, nil
	}
	resp, err := n.groupDeleteHere(ctx, req)
	if err != nil {
		return &groupDeleteResponse{Error: toPeerError(err)}, nil
	}
	return resp, nil
}

// groupDeleteHere deletes a group on the leader of its leader shard (this
// node) and waits until every member is released.
func (n *Node) groupDeleteHere(ctx context.Context, req *groupDeleteRequest) (*groupDeleteResponse, error) {
	sm := n.host.StateMachine(req.Shard)
	if sm == nil {
		return nil, kv.Errorf(kv.CodeNotLeader, "node %d holds no replica of shard %d", n.id, req.Shard)
	}
	var g group.Group
	var ok bool
	var effs []group.Effect
	var err error
	sm.WithGroups(func(l *group.Leader, _ *group.Follower) {
		g, ok = l.Group(req.ID)
		if ok && !g.DeleteAsked {
			effs, err = l.Delete(req.ID)
		}
	})
	if !ok {
		return nil, kv.Errorf(kv.CodeNotFound, "no group %q", req.ID)
	}
	if err != nil {
		return nil, groupError(err, req.ID)
	}
	var unregistered chan struct{}
	var unregErr error // set before unregistered is closed
	for _, e := range effs {
		if l, ok := e.(group.Log); ok {
			res, err := n.host.Propose(ctx, req.Shard, shard.EncodeGroupRecord(l.Record))
			if err != nil {
				return nil, err
			}
			if res.Err != nil {
				return nil, res.Err
			}
			if req.RegVersion != 0 {
				// The deletion is logged: it finishes whatever comes.
				// The id's registration goes while the members are
				// released, not after (the deleter removes it if this
				// fails: the answer says whether it did).
				unregistered = make(chan struct{})
				go func() {
					defer close(unregistered)
					rctx, cancel := context.WithTimeout(systemContext(context.WithoutCancel(ctx)), time.Minute)
					defer cancel()
					v := req.RegVersion
					_, unregErr = n.Delete(rctx, kv.DeleteRequest{Collection: groupsCollection, Key: []byte(req.ID), IfVersion: &v})
					n.forgetRegistration(req.ID)
				}()
			}
		}
	}
	// Each member's D carries its writes not shipped yet. The deletion
	// answers, once the registration is removed, when the group is
	// forgotten or every member's shard owns it again (its DA came: the
	// shard logged the release, with the group's last writes of the key,
	// before it sent it), without waiting for the leader to log the
	// releases in turn, which a new leader would redo (its D is answered
	// DA again).
	defer func() { n.forgetFreed(g) }()
	for {
		// Taken before the state is looked at: a change after the look
		// closes it.
		n.groups.mu.Lock()
		changed := n.groups.mu.changed
		n.groups.mu.Unlock()
		gone := false
		sm := n.host.StateMachine(req.Shard)
		if sm != nil {
			sm.WithGroups(func(l *group.Leader, _ *group.Follower) {
				cur, ok := l.Group(req.ID)
				gone = !ok || cur.Ref.Inc != g.Ref.Inc
				if !gone {
					g = cur
				}
			})
		}
		if gone || g.State == group.Deleting && n.released(g) {
			out := &groupDeleteResponse{}
			if unregistered != nil {
				select {
				case <-unregistered:
					// Removed, or gone or replaced since it was read
					// (another deleter's, a newer group's).
					c := kv.CodeOf(unregErr)
					out.Unregistered = unregErr == nil || c == kv.CodeNotFound || c == kv.CodeConditionFailed
				case <-ctx.Done():
				}
			}
			return out, nil
		}
		// A change of the group's state is applied, or a DA noted (both
		// close changed); the timer backs up a leader whose state moved
		// without either here (a snapshot).
		t := time.NewTimer(200 * time.Millisecond)
		select {
		case <-changed:
		case <-t.C:
		case <-ctx.Done():
		case <-n.stop:
		}
		t.Stop()
		if ctx.Err() != nil {
			return nil, kv.Errorf(kv.CodeUnavailable, "group %q: the deletion did not finish before the request ended; it goes on, delete it again to wait for it", req.ID)
		}
		select {
		case <-n.stop:
			return nil, kv.Errorf(kv.CodeUnavailable, "node is shutting down")
		default:
		}
	}
}

// DescribeGroup implements kv.GroupBackend.
func (n *Node) DescribeGroup(ctx context.Context, id string) (kv.GroupInfo, error) {
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return kv.GroupInfo{}, err
	}
	defer done()
	if err := kv.ValidateGroupID(id); err != nil {
		return kv.GroupInfo{}, err
	}
	reg, _, err := n.registration(ctx, id)
	if err != nil {
		return kv.GroupInfo{}, err
	}
	snap, err := n.readGroup(ctx, id, reg, "")
	if err != nil {
		return kv.GroupInfo{}, err
	}
	return snap.info(n), nil
}

// ListGroups implements kv.GroupBackend.
func (n *Node) ListGroups(ctx context.Context) ([]kv.GroupInfo, error) {
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	if _, err := n.collection(groupsCollection); err != nil {
		return []kv.GroupInfo{}, nil
	}
	out := []kv.GroupInfo{}
	req := kv.ScanRequest{Collection: groupsCollection, Limit: 1000}
	for {
		res, err := n.Scan(ctx, req)
		if err != nil {
			return nil, err
		}
		for _, r := range res.Items {
			var reg groupRegistration
			if err := json.Unmarshal(r.Value, &reg); err != nil {
				continue
			}
			snap, err := n.readGroup(ctx, string(r.Key), reg, "")
			if kv.CodeOf(err) == kv.CodeNotFound {
				continue // being created or just deleted
			}
			if err != nil {
				return nil, err
			}
			out = append(out, snap.info(n))
		}
		if res.NextPage == "" {
			return out, nil
		}
		req.Page = res.NextPage
	}
}

// groupReadRequest reads a group's state on the leader of its leader
// shard, linearizably. Priority, when set, names a group transaction
// attempt that takes the group's priority token first.
type groupReadRequest struct {
	Shard    uint64 `json:"shard"`
	ID       string `json:"id"`
	Priority string `json:"priority,omitempty"`
	// Ship asks the leader to ship the group's writes not shipped yet at
	// once: the reader waits for them to reach their keys.
	Ship bool `json:"ship,omitempty"`
	// NoBarrier: the group as the leader replica has applied it, without
	// confirming it still leads (a read whose use is validated in Apply).
	NoBarrier bool `json:"no_barrier,omitempty"`
	// At: the group once its leader shard is fenced at version At (every
	// group write committed at or below it applied, none to come), for a
	// read at At of its members' shards (awaitShipped).
	At uint64 `json:"at,omitempty"`
}

type groupReadResponse struct {
	Node    uint64       `json:"node"`
	Ref     groupRefWire `json:"ref"`
	Mode    uint8        `json:"mode"`
	State   uint8        `json:"state"`
	Leader  groupKeyWire `json:"leader"`
	Members []memberWire `json:"members"`
	Lag     int          `json:"lag"`
	Error   *peerError   `json:"error,omitempty"`
}

type groupRefWire struct {
	ID     string `json:"id"`
	Leader uint64 `json:"leader"`
	Inc    uint64 `json:"inc"`
}

type memberWire struct {
	Key    groupKeyWire `json:"key"`
	Status uint8        `json:"status"`
	Value  []byte       `json:"value,omitempty"`
	Absent bool         `json:"absent,omitempty"`
	Tags   []string     `json:"tags,omitempty"`
	// KeepTags: the group does not know the key's tags (group.Tags.Keep).
	KeepTags bool   `json:"keep_tags,omitempty"`
	Version  uint64 `json:"version,omitempty"`
	// Pending is the sequence number of the key's last write in its
	// shard's outbox, not yet acknowledged (0: none).
	Pending uint64 `json:"pending,omitempty"`
}

func (r *groupReadResponse) info(n *Node) kv.GroupInfo {
	info := kv.GroupInfo{ID: r.Ref.ID, Leader: n.keyRef(r.Leader.key()), LeaderNode: r.Node, ShipperLag: r.Lag, Members: []kv.KeyRef{}}
	switch group.Mode(r.Mode) {
	case group.BestEffort:
		info.Mode = kv.GroupBestEffort
	default:
		info.Mode = kv.GroupAtomic
	}
	switch group.State(r.State) {
	case group.Creating:
		info.State = kv.GroupCreating
	case group.Active:
		info.State = kv.GroupActive
	default:
		info.State = kv.GroupDeleting
	}
	for _, m := range r.Members {
		if s := group.MemberStatus(m.Status); s == group.Refused || s == group.Released {
			continue
		}
		info.Members = append(info.Members, n.keyRef(m.Key.key()))
	}
	return info
}

// readGroup reads group id's state where it is led.
func (n *Node) readGroup(ctx context.Context, id string, reg groupRegistration, priority string) (*groupReadResponse, error) {
	return n.readGroupOpts(ctx, id, reg, groupReadRequest{Priority: priority})
}

// readGroupOpts is readGroup with the options of opts (its Priority,
// Ship and NoBarrier).
func (n *Node) readGroupOpts(ctx context.Context, id string, reg groupRegistration, opts groupReadRequest) (*groupReadResponse, error) {
	_, shardID, err := n.groupKey(ctx, kv.KeyRef{Collection: reg.Collection, Key: reg.Key})
	if err != nil {
		return nil, err
	}
	opts.Shard, opts.ID = shardID, id
	return n.readGroupReq(ctx, &opts)
}

// readGroupAt reads group id at the leader of shardID, the group's leader
// shard (as a member's yield names it: without the registration, which a
// deletion removes while its members are being released).
func (n *Node) readGroupAt(ctx context.Context, id string, shardID uint64) (*groupReadResponse, error) {
	return n.readGroupReq(ctx, &groupReadRequest{Shard: shardID, ID: id})
}

func (n *Node) readGroupReq(ctx context.Context, req *groupReadRequest) (*groupReadResponse, error) {
	out, err := n.atGroupLeader(ctx, req.Shard, "GroupRead", req, func(ctx context.Context) (any, error) {
		return n.groupReadHere(ctx, req)
	})
	if err != nil {
		if kv.CodeOf(err) == kv.CodeNotFound {
			n.forgetRegistration(req.ID)
		}
		return nil, err
	}
	return out.(*groupReadResponse), nil
}

func (n *Node) handleGroupRead(ctx context.Context, req *groupReadRequest) (*groupReadResponse, error) {
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return &groupReadResponse{Error: toPeerError(err)}, nil
	}
	defer done()
	out, err := n.groupReadHere(ctx, req)
	if err != nil {
		return &groupReadResponse{Error: toPeerError(err)}, nil
	}
	return out, nil
}

func (n *Node) groupReadHere(ctx context.Context, req *groupReadRequest) (*groupReadResponse, error) {
	if !n.host.Ready(req.Shard) {
		return nil, kv.Errorf(kv.CodeNotLeader, "node %d does not lead shard %d", n.id, req.Shard)
	}
	if req.Priority != "" {
		if err := n.acquirePriority(ctx, req.ID, req.Priority); err != nil {
			return nil, err
		}
	}
	switch {
	case req.At != 0:
		if err := n.host.SnapshotRead(ctx, req.Shard, req.At); err != nil {
			return nil, err
		}
	case !req.NoBarrier:
		if err := n.host.ReadBarrier(ctx, req.Shard); err != nil {
			return nil, err
		}
	}
	sm := n.host.StateMachine(req.Shard)
	if sm == nil {
		return nil, kv.Errorf(kv.CodeNotLeader, "node %d holds no replica of shard %d", n.id, req.Shard)
	}
	var g group.Group
	var ok bool
	sm.WithGroups(func(l *group.Leader, _ *group.Follower) { g, ok = l.Group(req.ID) })
	if !ok {
		return nil, kv.Errorf(kv.CodeNotFound, "no group %q (it is being created or was deleted)", req.ID)
	}
	out := &groupReadResponse{Node: n.id, Ref: groupRefWire{ID: g.Ref.ID, Leader: uint64(g.Ref.Leader), Inc: g.Ref.Inc},
		Mode: uint8(g.Mode), State: uint8(g.State), Leader: groupKeyWire{Collection: g.Leader.Collection, Key: []byte(g.Leader.Key)}}
	pending := map[group.Key]uint64{}
	for _, ob := range g.Outboxes {
		for _, e := range ob.Entries {
			if req.At == 0 || e.Version <= req.At { // a read at At needs no write above it
				pending[e.Key] = e.Seq
			}
		}
	}
	for _, m := range g.Members {
		out.Members = append(out.Members, memberWire{Key: groupKeyWire{Collection: m.Key.Collection, Key: []byte(m.Key.Key), Shard: uint64(m.Shard)},
			Status: uint8(m.Status), Value: m.Value, Absent: m.Absent, Tags: m.Tags.List, KeepTags: m.Tags.Keep, Version: m.Version, Pending: pending[m.Key]})
	}
	for _, ob := range g.Outboxes {
		out.Lag += len(ob.Entries)
	}
	if req.Ship && out.Lag > 0 {
		n.shipGroupNow(req.Shard, req.ID)
	}
	return out, nil
}

// prioToken lets one group transaction attempt at a time, a retry of one
// that failed validation, run alone: from its first read to its commit no
// other attempt of the group commits, so its validation passes (unless
// the group's leadership moves meanwhile). holder "" is free.
type prioToken struct {
	holder string
	lease  time.Time
	free   chan struct{}
	// inflight counts the commits of the group past the token's check and
	// not yet applied; drained is closed when it falls to 0. A priority
	// attempt reads only once they are through (else one could land after
	// its read and fail its validation).
	inflight int
	drained  chan struct{}
}

// token returns group id's token, made if absent. Called with
// n.groups.mu held.
func (n *Node) token(groupID string) *prioToken {
	t := n.groups.mu.prio[groupID]
	if t == nil {
		t = &prioToken{free: make(chan struct{}), drained: make(chan struct{})}
		n.groups.mu.prio[groupID] = t
	}
	return t
}

// beginCommit counts a commit of group id in flight, unless another
// attempt holds the group's priority token.
func (n *Node) beginCommit(groupID, attempt string) (func(), bool) {
	n.groups.mu.Lock()
	defer n.groups.mu.Unlock()
	t := n.token(groupID)
	if t.holder != "" && t.holder != attempt && time.Now().Before(t.lease) {
		return nil, false
	}
	t.inflight++
	return func() {
		n.groups.mu.Lock()
		defer n.groups.mu.Unlock()
		t.inflight--
		if t.inflight == 0 {
			close(t.drained)
			t.drained = make(chan struct{})
		}
	}, true
}

// prioLease bounds how long a priority attempt that went away holds its
// group; every read and the commit renew it.
const prioLease = 10 * time.Second

func (n *Node) acquirePriority(ctx context.Context, groupID, attempt string) error {
	for {
		n.groups.mu.Lock()
		t := n.token(groupID)
		if t.holder == "" || t.holder == attempt || time.Now().After(t.lease) {
			t.holder, t.lease = attempt, time.Now().Add(prioLease)
			// Wait out the commits that passed the check before.
			for t.inflight > 0 {
				ch := t.drained
				n.groups.mu.Unlock()
				select {
				case <-ch:
				case <-ctx.Done():
					return kv.Errorf(kv.CodeUnavailable, "waiting for group %q's commits in flight: %v", groupID, ctx.Err())
				}
				n.groups.mu.Lock()
			}
			n.groups.mu.Unlock()
			return nil
		}
		ch, lease := t.free, t.lease
		n.groups.mu.Unlock()
		select {
		case <-ch:
		case <-time.After(time.Until(lease)):
		case <-ctx.Done():
			return kv.Errorf(kv.CodeUnavailable, "waiting for group %q's transaction with priority: %v", groupID, ctx.Err())
		}
	}
}

func (n *Node) releasePriority(groupID, attempt string) {
	n.groups.mu.Lock()
	defer n.groups.mu.Unlock()
	if t := n.groups.mu.prio[groupID]; t != nil && t.holder == attempt {
		t.holder = ""
		close(t.free)
		t.free = make(chan struct{})
	}
}

// groupMethods are the Key Groups peer methods.
func (n *Node) groupMethods() []grpc.MethodDesc {
	return []grpc.MethodDesc{
		{MethodName: "GroupMessages", Handler: unary(n.handleGroupMessages)},
		{MethodName: "GroupCreate", Handler: unary(n.handleGroupCreate)},
		{MethodName: "GroupDelete", Handler: unary(n.handleGroupDelete)},
		{MethodName: "GroupRead", Handler: unary(n.handleGroupRead)},
		{MethodName: "GroupCommit", Handler: unary(n.handleGroupCommit)},
		{MethodName: "GroupOwner", Handler: unary(n.handleGroupOwner)},
	}
}
