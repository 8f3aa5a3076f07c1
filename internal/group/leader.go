package group

import (
	"bytes"
	"slices"
	"sort"
)

// Options tune the retries of a Leader and a Follower. The zero value
// means the defaults.
type Options struct {
	// RetryTicks: every RetryTicks ticks, a leader re-sends J to pending
	// members, D to releasing ones and its outboxes, and a follower re-sends
	// JA for the keys whose JAA has not come. It bounds how long a lost
	// message delays the protocol, and how long a key stays yielded to a
	// ghost group. Default 3: a few round trips of the transport.
	RetryTicks uint64
	// ProbeTicks: every ProbeTicks ticks, a follower probes the leader of
	// each key whose JAA came (a JA with Probe), so that a key held for a
	// group its leader does not know is freed. Default 20: the leader sends
	// D itself when it deletes a group; probes only back that up.
	ProbeTicks uint64
	// ShipTicks: every ShipTicks ticks, a leader ships the writes committed
	// since it last shipped, in one message per follower shard; a caller
	// that waits for them ships at once (ShipNew). Default 1.
	ShipTicks uint64
	// MaxShipEntries and MaxShipBytes bound a shipment (a Ship, a D): the
	// first entries of the outbox up to either (at least one); the rest
	// go in the next ones, as the follower acknowledges these. Defaults
	// 1024 entries, 4 MiB of values.
	MaxShipEntries int
	MaxShipBytes   int
	// MaxOutboxEntries and MaxOutboxBytes bound an outbox: a group write
	// that would take one past either is refused (ErrBacklogged), so that
	// a follower shard out of reach does not make the leader's state grow
	// without end. Defaults 262,144 entries, 64 MiB of values.
	MaxOutboxEntries int
	MaxOutboxBytes   int
}

// EnsureDefaults fills the zero fields of o with the defaults.
func (o Options) EnsureDefaults() Options {
	if o.RetryTicks == 0 {
		o.RetryTicks = 3
	}
	if o.ProbeTicks == 0 {
		o.ProbeTicks = 20
	}
	if o.ShipTicks == 0 {
		o.ShipTicks = 1
	}
	if o.MaxShipEntries == 0 {
		o.MaxShipEntries = 1024
	}
	if o.MaxShipBytes == 0 {
		o.MaxShipBytes = 4 << 20
	}
	if o.MaxOutboxEntries == 0 {
		o.MaxOutboxEntries = 1 << 18
	}
	if o.MaxOutboxBytes == 0 {
		o.MaxOutboxBytes = 64 << 20
	}
	return o
}

// Group is a group at its leader.
type Group struct {
	Ref    Ref
	Mode   Mode
	State  State
	Leader Key
	// Failed: an atomic creation that a key refused; the group is Deleting
	// and the creator is answered ErrRefused once it is Deleted.
	Failed bool
	// DeleteAsked: a delete was applied; the deleter is answered once the
	// group is Deleted.
	DeleteAsked bool
	// Members, sorted by key, the leader key among them.
	Members []Member
	// Outboxes, sorted by shard, one per follower shard of a member (the
	// leader's own shard included).
	Outboxes []Outbox
}

func (g *Group) member(k Key) *Member {
	i := sort.Search(len(g.Members), func(i int) bool { return !g.Members[i].Key.less(k) })
	if i < len(g.Members) && g.Members[i].Key == k {
		return &g.Members[i]
	}
	return nil
}

func (g *Group) outbox(s ShardID) *Outbox {
	for i := range g.Outboxes {
		if g.Outboxes[i].Shard == s {
			return &g.Outboxes[i]
		}
	}
	return nil
}

// clone copies g but the members' values, which it shares: Apply never
// changes a value in place (a write gives its member a new one).
func (g *Group) clone() Group {
	c := *g
	c.Members = slices.Clone(g.Members)
	c.Outboxes = slices.Clone(g.Outboxes)
	for i := range c.Outboxes {
		c.Outboxes[i].Entries = slices.Clone(c.Outboxes[i].Entries)
	}
	return c
}

// Leader is the state of the groups led by one shard: the state machine of
// the Key Grouping protocol's leader side. It changes only in Apply; every
// other method reads it and returns effects. It is not safe for concurrent
// use.
type Leader struct {
	opts  Options
	shard ShardID
	// nextInc is the last incarnation assigned; the next group gets
	// nextInc+1, so incarnations never repeat within the shard.
	nextInc uint64
	// groups are the live groups by id. A group is removed once Deleted.
	groups map[string]*Group

	// Volatile state of the raft leader replica (not encoded): the tick
	// count and, per outbox, the last sequence number shipped.
	ticks uint64
	sent  map[sentKey]uint64

	// wrote: the last Apply was a group write that applied. trimmed: the
	// entries the last Apply, an acknowledgment, removed. PartsAfter
	// names their parts.
	wrote   bool
	trimmed []Entry

	// forgotten is the group the last Apply forgot, if it forgot one: no
	// longer in groups, it still names the parts PartsAfter deletes.
	forgotten *Group
}

type sentKey struct {
	group Ref
	shard ShardID
}

// NewLeader returns the empty leader state of shard.
func NewLeader(shard ShardID, opts Options) *Leader {
	return &Leader{opts: opts.EnsureDefaults(), shard: shard, groups: map[string]*Group{}, sent: map[sentKey]uint64{}}
}

// Shard returns the leader's shard.
func (l *Leader) Shard() ShardID { return l.shard }

// Group returns a copy of the live group id. Its members' values are
// shared with the leader's state: the caller must not modify them.
func (l *Leader) Group(id string) (Group, bool) {
	g, ok := l.groups[id]
	if !ok {
		return Group{}, false
	}
	return g.clone(), true
}

// Groups returns a copy of every live group, sorted by id.
func (l *Leader) Groups() []Group {
	var out []Group
	for _, id := range l.ids() {
		out = append(out, l.groups[id].clone())
	}
	return out
}

func (l *Leader) ids() []string {
	ids := make([]string, 0, len(l.groups))
	for id := range l.groups {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// lookup returns the live group r names, if it is this incarnation.
func (l *Leader) lookup(r Ref) *Group {
	g := l.groups[r.ID]
	if g == nil || g.Ref != r {
		return nil
	}
	return g
}

// Create validates req and asks to log the group's creation. The creator
// is answered by a Reply once creation has finished.
func (l *Leader) Create(req CreateRequest) ([]Effect, error) {
	if req.ID == "" || req.Mode != Atomic && req.Mode != BestEffort {
		return nil, ErrInvalid
	}
	members := []Member{{Key: req.Leader, Shard: l.shard}}
	for _, m := range req.Members {
		i := slices.IndexFunc(members, func(o Member) bool { return o.Key == m.Key })
		if i >= 0 {
			if members[i].Shard != m.Shard {
				return nil, ErrInvalid
			}
			continue
		}
		members = append(members, Member{Key: m.Key, Shard: m.Shard})
	}
	sort.Slice(members, func(i, j int) bool { return members[i].Key.less(members[j].Key) })
	if _, ok := l.groups[req.ID]; ok {
		return nil, ErrExists
	}
	return []Effect{Log{Record{Kind: RecCreate, Group: Ref{ID: req.ID, Leader: l.shard},
		Mode: req.Mode, Key: req.Leader, Members: members}}}, nil
}

// Delete asks to log the deletion of group id. The deleter is answered
// once every update has been shipped and every member released.
func (l *Leader) Delete(id string) ([]Effect, error) {
	if _, ok := l.groups[id]; !ok {
		return nil, ErrNotFound
	}
	return []Effect{Log{Record{Kind: RecDelete, Group: Ref{ID: id, Leader: l.shard}}}}, nil
}

// Write asks to log writes of a transaction of active group id to its
// joined members, with the keys it read and their versions (reads), which
// Apply validates: the write commits only if no read key changed since.
// The node sets the record's Version (the commit version) when it logs it.
func (l *Leader) Write(id string, writes []Write, reads []Read) ([]Effect, error) {
	g := l.groups[id]
	if g == nil {
		return nil, ErrNotFound
	}
	if g.State != Active {
		return nil, ErrNotActive
	}
	for _, w := range writes {
		if m := g.member(w.Key); m == nil || m.Status != Joined {
			return nil, ErrInvalid
		}
	}
	for _, r := range reads {
		if m := g.member(r.Key); m == nil || m.Status != Joined {
			return nil, ErrInvalid
		}
	}
	return []Effect{Log{Record{Kind: RecWrite, Group: g.Ref, Writes: slices.Clone(writes), Reads: slices.Clone(reads)}}}, nil
}

// OnJA handles a JA.
func (l *Leader) OnJA(m Message) []Effect {
	g := l.lookup(m.Group)
	var mem *Member
	if g != nil {
		mem = g.member(m.Key)
	}
	switch {
	case mem != nil && g.State == Creating && mem.Status == Pending:
		if m.Probe {
			// Only a follower that got JAA probes; not from this group.
			return nil
		}
		if m.Refused != "" {
			return []Effect{Log{Record{Kind: RecRefuse, Group: m.Group, Key: m.Key, Reason: m.Refused}}}
		}
		return []Effect{Log{Record{Kind: RecJoin, Group: m.Group, Key: m.Key, Yield: m.Yield,
			Value: bytes.Clone(m.Value), Absent: m.Absent, Tags: m.Tags.clone(), Version: m.Version, Shard: m.From}}}
	case m.Refused != "":
		// Nothing was yielded; nothing to free.
		return nil
	}
	return l.answerJA(m.Group, mem, m.Key, m.Yield, m.From, m.Probe)
}

// answerJA answers a JA (or applies a RecJoin) naming ref, key and yield
// y, from shard from, that does not join a pending member: JAA if it is
// the member's join; nothing if the member joined with another yield (the
// yield the JA names was freed before the join, so it is stale); D
// otherwise: the key is yielded to a group, or an incarnation of it, that
// does not want it (a ghost), and D frees it.
func (l *Leader) answerJA(ref Ref, mem *Member, key Key, y uint64, from ShardID, probe bool) []Effect {
	if mem != nil && mem.Status == Joined {
		if mem.Yield != y || probe {
			return nil
		}
		return []Effect{l.send(MsgJAA, from, ref, key, y)}
	}
	if mem != nil && mem.Status == Releasing && mem.Yield == y && y != 0 {
		// The member's own release: its D carries the key's writes.
		if g := l.lookup(ref); g != nil {
			return []Effect{l.sendD(g, mem)}
		}
	}
	return []Effect{l.send(MsgD, from, ref, key, y)}
}

// sendD is the D that releases member m of g: with the yield the leader
// joined, and, for a joined member (a yield other than 0), its key's
// entries in its shard's outbox (shipment), which the follower stores
// before it owns the key again. A
// deletion so waits for no shipment: the D is the key's last shipment.
func (l *Leader) sendD(g *Group, m *Member) Send {
	s := l.send(MsgD, m.Shard, g.Ref, m.Key, m.Yield)
	if m.Yield == 0 {
		return s
	}
	if ob := g.outbox(m.Shard); ob != nil {
		var more bool
		if s.Msg.Entries, more = g.shipment(ob, &m.Key, l.opts); more {
			// Not all of them: the follower stores these and keeps the
			// key until a D carries its last entry, Seq.
			for _, e := range ob.Entries {
				if e.Key == m.Key {
					s.Msg.Seq = e.Seq
				}
			}
		}
	}
	return s
}

// shipment returns what ships of outbox ob (of key only, if not nil), in
// its order: every entry, with its write and version, which the key's
// shard stores at that version. An entry of an older build (no version)
// ships only if it is its key's last one, with the key's value at the
// leader (its member's), which every earlier entry's write is superseded
// by: sent again later, it carries a value as new or newer, as a member's
// value changes only with a write, which takes a higher sequence number.
//
// A shipment holds at most opts.MaxShipEntries entries and, past its
// first, opts.MaxShipBytes of values; more reports that entries were left
// out.
func (g *Group) shipment(ob *Outbox, only *Key, opts Options) (out []Entry, more bool) {
	size := 0
	var last map[Key]int
	for i, e := range ob.Entries {
		if e.Version == 0 && last == nil {
			last = make(map[Key]int, len(ob.Entries))
			for i, e := range ob.Entries {
				last[e.Key] = i
			}
		}
		if only != nil && e.Key != *only {
			continue
		}
		if len(out) > 0 && (len(out) >= opts.MaxShipEntries || size+len(e.Value) > opts.MaxShipBytes) {
			return out, true
		}
		size += len(e.Value)
		if e.Version > 0 {
			e.Value, e.Tags = bytes.Clone(e.Value), e.Tags.clone()
			out = append(out, e)
			continue
		}
		if last[e.Key] != i {
			continue
		}
		m := g.member(e.Key)
		out = append(out, Entry{Seq: e.Seq, Write: Write{Key: e.Key, Value: bytes.Clone(m.Value), Delete: m.Absent, Tags: m.Tags.clone()}})
	}
	return out, false
}

func (l *Leader) send(t MsgType, to ShardID, r Ref, k Key, y uint64) Send {
	return Send{Message{Type: t, From: l.shard, To: to, Group: r, Key: k, Yield: y}}
}

// OnDA handles a DA.
func (l *Leader) OnDA(m Message) []Effect {
	g := l.lookup(m.Group)
	if g == nil {
		return nil
	}
	if mem := g.member(m.Key); mem != nil && mem.Status == Releasing && mem.Yield == m.Yield {
		return []Effect{Log{Record{Kind: RecRelease, Group: m.Group, Key: m.Key, Yield: m.Yield}}}
	}
	return nil
}

// OnShipAck handles a ShipAck.
func (l *Leader) OnShipAck(m Message) []Effect {
	g := l.lookup(m.Group)
	if g == nil {
		return nil
	}
	if ob := g.outbox(m.From); ob != nil && len(ob.Entries) > 0 && ob.Entries[0].Seq <= m.Seq {
		return []Effect{Log{Record{Kind: RecShipped, Group: m.Group, Shard: m.From, Seq: m.Seq}}}
	}
	return nil
}

// Tick advances the leader's clock by one tick: it ships outboxes with
// entries not shipped yet and, every RetryTicks, re-sends J to pending
// members, D to releasing ones and every non-empty outbox. Only the raft
// leader replica ticks.
func (l *Leader) Tick() []Effect {
	l.ticks++
	retry := l.ticks%l.opts.RetryTicks == 0
	ship := retry || l.ticks%l.opts.ShipTicks == 0
	var out []Effect
	for _, id := range l.ids() {
		g := l.groups[id]
		if ship && (g.State != Deleting || g.joined() || g.backlogged(l.opts)) {
			// A deleting group's writes go with its Ds, unless an outbox
			// holds more than a shipment: then Ships drain it too.
			out = append(out, l.ship(g, retry)...)
		}
		if !retry {
			continue
		}
		for i := range g.Members {
			mem := &g.Members[i]
			switch {
			case g.State == Creating && mem.Status == Pending:
				out = append(out, l.send(MsgJ, mem.Shard, g.Ref, mem.Key, 0))
			case mem.Status == Releasing:
				out = append(out, l.sendD(g, mem))
			}
		}
	}
	return out
}

// ShipNew ships, at once, the outbox entries of group id not shipped yet
// (what the next Tick would ship), so that a committed group write reaches
// its key's shard without waiting for a tick. Only the raft leader replica
// calls it.
func (l *Leader) ShipNew(id string) []Effect {
	g := l.groups[id]
	if g == nil {
		return nil
	}
	return l.ship(g, false)
}

// ship sends g's outboxes: every non-empty one with retry, else those
// with entries not sent yet.
func (l *Leader) ship(g *Group, retry bool) []Effect {
	var out []Effect
	for i := range g.Outboxes {
		ob := &g.Outboxes[i]
		if len(ob.Entries) == 0 {
			continue
		}
		sk := sentKey{g.Ref, ob.Shard}
		last := ob.Entries[len(ob.Entries)-1].Seq
		if !retry && l.sent[sk] >= last {
			continue
		}
		es, _ := g.shipment(ob, nil, l.opts)
		l.sent[sk] = es[len(es)-1].Seq
		out = append(out, Send{Message{Type: MsgShip, From: l.shard, To: ob.Shard, Group: g.Ref, Entries: es}})
	}
	return out
}

// Apply applies a committed leader record (r.Kind.ForLeader()) and returns
// its effects. It is deterministic: every replica applies the same records
// in the same order to the same state and gets the same state and effects.
// Records of a follower are ignored.
func (l *Leader) Apply(r Record) []Effect {
	l.forgotten, l.wrote, l.trimmed = nil, false, nil
	switch r.Kind {
	case RecCreate:
		return l.applyCreate(r)
	case RecJoin:
		g := l.lookup(r.Group)
		var mem *Member
		if g != nil {
			mem = g.member(r.Key)
		}
		if mem == nil || g.State != Creating || mem.Status != Pending {
			// Two JAs were logged, or the group changed since the JA.
			return l.answerJA(r.Group, mem, r.Key, r.Yield, r.Shard, false)
		}
		mem.Status, mem.Yield, mem.Value, mem.Absent, mem.Tags, mem.Version = Joined, r.Yield, bytes.Clone(r.Value), r.Absent, r.Tags.clone(), r.Version
		out := []Effect{l.send(MsgJAA, mem.Shard, g.Ref, mem.Key, mem.Yield)}
		return append(out, l.maybeActive(g)...)
	case RecRefuse:
		g := l.lookup(r.Group)
		if g == nil || g.State != Creating {
			return nil
		}
		mem := g.member(r.Key)
		if mem == nil || mem.Status != Pending {
			return nil
		}
		mem.Status, mem.Reason = Refused, r.Reason
		if g.Mode == Atomic {
			g.Failed = true
			return l.startDeleting(g)
		}
		return l.maybeActive(g)
	case RecDelete:
		g := l.groups[r.Group.ID]
		if g == nil {
			return []Effect{Reply{Op: OpDelete, Group: r.Group, Err: ErrNotFound}}
		}
		g.DeleteAsked = true
		if g.State == Deleting {
			return nil
		}
		var out []Effect
		if g.State == Creating {
			out = append(out, Reply{Op: OpCreate, Group: g.Ref, Err: ErrDeletedWhileCreating})
		}
		return append(out, l.startDeleting(g)...)
	case RecRelease:
		g := l.lookup(r.Group)
		if g == nil {
			return nil
		}
		mem := g.member(r.Key)
		if mem == nil || mem.Status != Releasing || mem.Yield != r.Yield {
			return nil
		}
		mem.Status, mem.Value, mem.Absent, mem.Tags = Released, nil, false, Tags{}
		return l.maybeForget(g)
	case RecWrite:
		return l.applyWrite(r)
	case RecShipped:
		g := l.lookup(r.Group)
		if g == nil {
			return nil
		}
		ob := g.outbox(r.Shard)
		if ob == nil {
			return nil
		}
		n := 0
		for n < len(ob.Entries) && ob.Entries[n].Seq <= r.Seq {
			n++
		}
		l.trimmed = slices.Clone(ob.Entries[:n])
		for _, e := range l.trimmed {
			ob.size -= len(e.Value)
		}
		ob.Entries = slices.Delete(ob.Entries, 0, n)
		if g.State == Deleting {
			// A group stored deleting with joined members, by a build
			// that released them once its outboxes were empty.
			return l.releaseJoined(g)
		}
	}
	return nil
}

func (l *Leader) applyCreate(r Record) []Effect {
	if _, ok := l.groups[r.Group.ID]; ok {
		return []Effect{Reply{Op: OpCreate, Group: r.Group, Err: ErrExists}}
	}
	l.nextInc++
	g := &Group{Ref: Ref{ID: r.Group.ID, Leader: l.shard, Inc: l.nextInc}, Mode: r.Mode, State: Creating, Leader: r.Key}
	for _, m := range r.Members {
		g.Members = append(g.Members, Member{Key: m.Key, Shard: m.Shard, Status: Pending})
		if g.outbox(m.Shard) == nil {
			g.Outboxes = append(g.Outboxes, Outbox{Shard: m.Shard, Next: 1})
		}
	}
	sort.Slice(g.Outboxes, func(i, j int) bool { return g.Outboxes[i].Shard < g.Outboxes[j].Shard })
	l.groups[g.Ref.ID] = g
	var out []Effect
	for _, m := range g.Members {
		out = append(out, l.send(MsgJ, m.Shard, g.Ref, m.Key, 0))
	}
	return out
}

func (l *Leader) applyWrite(r Record) []Effect {
	g := l.lookup(r.Group)
	if g == nil {
		return []Effect{Reply{Op: OpWrite, Group: r.Group, Err: ErrNotFound}}
	}
	if g.State != Active {
		return []Effect{Reply{Op: OpWrite, Group: r.Group, Err: ErrNotActive}}
	}
	for _, w := range r.Writes {
		if m := g.member(w.Key); m == nil || m.Status != Joined {
			return []Effect{Reply{Op: OpWrite, Group: r.Group, Err: ErrInvalid}}
		}
	}
	for _, rd := range r.Reads {
		m := g.member(rd.Key)
		if m == nil || m.Status != Joined {
			return []Effect{Reply{Op: OpWrite, Group: r.Group, Err: ErrInvalid}}
		}
		if m.Version != rd.Version {
			return []Effect{Reply{Op: OpWrite, Group: r.Group, Err: ErrConflict}}
		}
	}
	if l.backlogged(g, r.Writes) {
		return []Effect{Reply{Op: OpWrite, Group: r.Group, Err: ErrBacklogged}}
	}
	for _, w := range r.Writes {
		m := g.member(w.Key)
		m.Value, m.Absent, m.Tags, m.Version = bytes.Clone(w.Value), w.Delete, w.Tags.clone(), r.Version
		if w.Delete {
			m.Tags = Tags{}
		}
		ob := g.outbox(m.Shard)
		// The entry holds the write and its version (sharing the member's
		// value and tags, which are never changed in place).
		ob.Entries = append(ob.Entries, Entry{Seq: ob.Next, Write: Write{Key: w.Key, Value: m.Value, Delete: m.Absent, Tags: m.Tags}, Version: r.Version})
		ob.Next++
		ob.size += len(m.Value)
	}
	l.wrote = true
	return []Effect{Reply{Op: OpWrite, Group: g.Ref}}
}

// maybeActive makes a creating group whose members all answered Active
// and answers its creator.
func (l *Leader) maybeActive(g *Group) []Effect {
	if g.State != Creating {
		return nil
	}
	for _, m := range g.Members {
		if m.Status == Pending {
			return nil
		}
	}
	g.State = Active
	rep := Reply{Op: OpCreate, Group: g.Ref}
	for _, m := range g.Members {
		if m.Status == Joined {
			rep.Joined = append(rep.Joined, m.Key)
		} else {
			rep.Refused = append(rep.Refused, Refusal{m.Key, m.Reason})
		}
	}
	return []Effect{rep}
}

// startDeleting moves g to Deleting and releases every member that is
// pending or joined: D with yield 0 to a pending one (whatever it yielded
// to g), D with its yield and its key's writes not acknowledged yet to a
// joined one (sendD).
func (l *Leader) startDeleting(g *Group) []Effect {
	g.State = Deleting
	var out []Effect
	for i := range g.Members {
		m := &g.Members[i]
		if m.Status == Pending {
			m.Status, m.Yield = Releasing, 0
			out = append(out, l.send(MsgD, m.Shard, g.Ref, m.Key, 0))
		}
	}
	return append(out, l.releaseJoined(g)...)
}

// releaseJoined releases the joined members of deleting group g: D with
// the member's yield and its key's writes not acknowledged (sendD).
func (l *Leader) releaseJoined(g *Group) []Effect {
	var out []Effect
	for i := range g.Members {
		m := &g.Members[i]
		if m.Status == Joined {
			m.Status = Releasing
			d := l.sendD(g, m)
			if len(d.Msg.Entries) == 0 {
				// Nothing to ship: its D needs no value. (Else the value
				// ships with its Ds.)
				m.Value, m.Absent, m.Tags = nil, false, Tags{}
			}
			out = append(out, d)
		}
	}
	return append(out, l.maybeForget(g)...)
}

// countOutboxes sets the size of g's outboxes from their entries (a
// group decoded).
func (g *Group) countOutboxes() {
	for i := range g.Outboxes {
		g.Outboxes[i].count()
	}
}

// backlogged reports whether writes, all to members of g, would take an
// outbox of g past l.opts.MaxOutboxEntries or MaxOutboxBytes.
func (l *Leader) backlogged(g *Group, writes []Write) bool {
	add := map[ShardID][2]int{} // entries, bytes
	for _, w := range writes {
		s := g.member(w.Key).Shard
		a := add[s]
		a[0]++
		a[1] += len(w.Value)
		add[s] = a
	}
	for s, a := range add {
		ob := g.outbox(s)
		if ob != nil && (len(ob.Entries)+a[0] > l.opts.MaxOutboxEntries || ob.size+a[1] > l.opts.MaxOutboxBytes) {
			return true
		}
	}
	return false
}

// backlogged reports whether an outbox of g holds more than one shipment
// carries.
func (g *Group) backlogged(opts Options) bool {
	for _, ob := range g.Outboxes {
		if len(ob.Entries) > opts.MaxShipEntries {
			return true
		}
		if ob.size > opts.MaxShipBytes {
			return true
		}
	}
	return false
}

func (g *Group) joined() bool {
	return slices.ContainsFunc(g.Members, func(m Member) bool { return m.Status == Joined })
}

// maybeForget removes a deleting group whose members are all released (or
// refused) and answers its creator (a failed atomic creation) and deleter.
func (l *Leader) maybeForget(g *Group) []Effect {
	for _, m := range g.Members {
		if m.Status != Released && m.Status != Refused {
			return nil
		}
	}
	delete(l.groups, g.Ref.ID)
	l.forgotten = g
	for k := range l.sent {
		if k.group == g.Ref {
			delete(l.sent, k)
		}
	}
	var out []Effect
	if g.Failed {
		rep := Reply{Op: OpCreate, Group: g.Ref, Err: ErrRefused}
		for _, m := range g.Members {
			if m.Status == Refused {
				rep.Refused = append(rep.Refused, Refusal{m.Key, m.Reason})
			}
		}
		out = append(out, rep)
	}
	if g.DeleteAsked {
		out = append(out, Reply{Op: OpDelete, Group: g.Ref})
	}
	return out
}
