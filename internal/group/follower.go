package group

import (
	"bytes"
	"sort"
)

// Yielded is a key a follower shard has yielded to a group.
type Yielded struct {
	Group Ref
	// Yield is the yield id, unique within the follower shard: the shard
	// assigns 1, 2, 3... in the order it applies yields, so the yield ids of
	// one key increase.
	Yield uint64
	// Confirmed: the JAA came (the leader logged the join); the follower
	// stops re-sending JA and only probes.
	Confirmed bool
	// Value, Absent and Tags are the key's value at the yield, re-sent
	// with JA until the JAA comes (then dropped).
	Value   []byte
	Absent  bool
	Tags    Tags
	Version uint64
	// Shipped is the sequence number of the last entry of Group's outbox
	// applied to the key (0: none).
	Shipped uint64
}

// KeyCheck is what the node knows of a key when a J for it comes, read on
// the follower shard's raft leader: the key can be yielded only if it has
// no intent and no lock. Value, Absent and Tags are its committed value.
//
// The node must grant no lock on the key from the moment it proposes the
// yield until the yield is applied (or its proposal is lost), so that no
// write or intent lands in between and Value is still the key's value
// when the yield is applied.
type KeyCheck struct {
	Intent bool
	Locked bool
	// Refused, if not empty, is another reason the key cannot be yielded
	// (ReasonPlacement, ReasonInGroup).
	Refused string
	Value   []byte
	Absent  bool
	Tags    Tags
	Version uint64
}

// Reasons a follower gives when it refuses a J.
const (
	ReasonIntent  = "intent"
	ReasonLocked  = "locked"
	ReasonInGroup = "in_group"
	// ReasonPlacement: the key's record is in another shard (a key of a
	// tag collection whose placement changed), or its placement could not
	// be pinned.
	ReasonPlacement = "placement"
)

// Follower is the state of the keys of one shard that are yielded to
// groups: the state machine of the Key Grouping protocol's follower side.
// A key that is not in it is owned by the shard. It changes only in Apply;
// every other method reads it and returns effects. It is not safe for
// concurrent use.
type Follower struct {
	opts  Options
	shard ShardID
	// lastYield is the last yield id assigned. It is state: it survives
	// restarts, so yield ids never repeat.
	lastYield uint64
	keys      map[Key]*Yielded

	// ticks is volatile (the raft leader replica's).
	ticks uint64
}

// NewFollower returns the state of shard with no key yielded.
func NewFollower(shard ShardID, opts Options) *Follower {
	return &Follower{opts: opts.EnsureDefaults(), shard: shard, keys: map[Key]*Yielded{}}
}

// Shard returns the follower's shard.
func (f *Follower) Shard() ShardID { return f.shard }

// Key returns a copy of k's state: ok false means that the shard owns k.
func (f *Follower) Key(k Key) (Yielded, bool) {
	y, ok := f.keys[k]
	if !ok {
		return Yielded{}, false
	}
	c := *y
	c.Value, c.Tags = bytes.Clone(y.Value), y.Tags.clone()
	return c, true
}

// Holder returns the id of the group k is yielded to, or "" for none.
func (f *Follower) Holder(k Key) string {
	if y, ok := f.keys[k]; ok {
		return y.Group.ID
	}
	return ""
}

// Yielded reports how many keys are yielded to groups.
func (f *Follower) Yielded() int { return len(f.keys) }

// Keys returns the yielded keys, sorted.
func (f *Follower) Keys() []Key {
	ks := make([]Key, 0, len(f.keys))
	for k := range f.keys {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool { return ks[i].less(ks[j]) })
	return ks
}

// YieldedIn returns a key of collection in [start, end) (bounded false:
// unbounded above) yielded to a group, and that group's id; ok false when
// there is none. Any such key, not the first.
func (f *Follower) YieldedIn(collection uint32, start, end string, bounded bool) (k Key, group string, ok bool) {
	for k, y := range f.keys {
		if k.Collection == collection && k.Key >= start && (!bounded || k.Key < end) {
			return k, y.Group.ID, true
		}
	}
	return Key{}, "", false
}

// LastYield returns the last yield id the shard assigned.
func (f *Follower) LastYield() uint64 { return f.lastYield }

func (f *Follower) ja(y *Yielded, k Key, probe bool) Send {
	m := Message{Type: MsgJA, From: f.shard, To: y.Group.Leader, Group: y.Group, Key: k, Yield: y.Yield, Probe: probe}
	if !probe {
		m.Value, m.Absent, m.Tags, m.Version = bytes.Clone(y.Value), y.Absent, y.Tags.clone(), y.Version
	}
	return Send{m}
}

func (f *Follower) refuse(m Message, reason string) Send {
	return Send{Message{Type: MsgJA, From: f.shard, To: m.Group.Leader, Group: m.Group, Key: m.Key, Refused: reason}}
}

// OnJ handles a J, given what the node knows of the key. It never waits:
// a key with an intent, a lock or a group is refused at once.
func (f *Follower) OnJ(m Message, kc KeyCheck) []Effect {
	if y := f.keys[m.Key]; y != nil {
		return f.yieldedAlready(y, m)
	}
	switch {
	case kc.Intent:
		return []Effect{f.refuse(m, ReasonIntent)}
	case kc.Locked:
		return []Effect{f.refuse(m, ReasonLocked)}
	case kc.Refused != "":
		return []Effect{f.refuse(m, kc.Refused)}
	}
	return []Effect{Log{Record{Kind: RecYield, Group: m.Group, Key: m.Key, Value: bytes.Clone(kc.Value), Absent: kc.Absent, Tags: kc.Tags.clone(), Version: kc.Version}}}
}

// yieldedAlready answers a J (or applies a RecYield) for a key that is
// yielded: a duplicate J of its group gets the same JA again (no new
// yield), another group's J a refusal.
func (f *Follower) yieldedAlready(y *Yielded, m Message) []Effect {
	if y.Group == m.Group {
		return []Effect{f.ja(y, m.Key, false)}
	}
	return []Effect{f.refuse(m, ReasonInGroup)}
}

// OnJAA handles a JAA: it confirms the yield it echoes; a JAA of another
// yield or group is stale and ignored.
func (f *Follower) OnJAA(m Message) []Effect {
	if y := f.keys[m.Key]; y != nil && y.Group == m.Group && y.Yield == m.Yield && !y.Confirmed {
		return []Effect{Log{Record{Kind: RecConfirm, Group: m.Group, Key: m.Key, Yield: m.Yield}}}
	}
	return nil
}

// frees reports whether a D (or RecFree) naming r and yield frees y.
func frees(y *Yielded, r Ref, yield uint64) bool {
	return y != nil && y.Group == r && (yield == 0 || yield == y.Yield)
}

// OnD handles a D: it asks to log that the shard owns the key again if the
// key is yielded to the D's group (and yield); otherwise it answers DA at
// once, changing nothing: the key is not held for that group any more.
func (f *Follower) OnD(m Message) []Effect {
	if frees(f.keys[m.Key], m.Group, m.Yield) {
		return []Effect{Log{Record{Kind: RecFree, Group: m.Group, Key: m.Key, Yield: m.Yield, Entries: cloneEntries(m.Entries), Seq: m.Seq}}}
	}
	return []Effect{f.da(m.Group, m.Key, m.Yield)}
}

func (f *Follower) da(r Ref, k Key, y uint64) Send {
	return Send{Message{Type: MsgDA, From: f.shard, To: r.Leader, Group: r, Key: k, Yield: y}}
}

// shippable reports whether entry e of group r's outbox applies to its key
// now: the key is yielded to r, its join is confirmed, and it has not had
// e yet. Only the yield the leader joined is confirmed (a JAA echoes the
// joined yield), and a group joins a key once, so every entry of r's
// outbox for the key is for that yield. A key yielded to r again after r
// released it (a late J of r, a ghost) is never confirmed: an old Ship of
// r, duplicated or delayed, must not overwrite the writes the shard took
// since it owned the key again.
func (f *Follower) shippable(r Ref, e Entry) bool {
	y := f.keys[e.Key]
	return y != nil && y.Group == r && y.Confirmed && e.Seq > y.Shipped
}

// held reports whether entry e of group r's outbox waits: its key is
// yielded to r but its join is not confirmed yet. Either the leader has
// joined it and the JAA is on its way (the follower's JA retries bring it
// again) or the yield is a ghost's; in neither case may e apply, nor be
// acknowledged.
func (f *Follower) held(r Ref, e Entry) bool {
	y := f.keys[e.Key]
	return y != nil && y.Group == r && !y.Confirmed
}

// shipPrefix returns how many of entries, from the first, the follower can
// deal with now: those before the first held one.
func (f *Follower) shipPrefix(r Ref, entries []Entry) int {
	for i, e := range entries {
		if f.held(r, e) {
			return i
		}
	}
	return len(entries)
}

// OnShip handles a Ship: it asks to log the entries if one applies or is
// held (the confirm of a JAA may be logged and not applied yet: the record
// comes after it in the log, and Apply decides), or, if none does (a
// duplicate), acknowledges them at once.
func (f *Follower) OnShip(m Message) []Effect {
	for _, e := range m.Entries {
		if f.shippable(m.Group, e) || f.held(m.Group, e) {
			return []Effect{Log{Record{Kind: RecApplyShip, Group: m.Group, Entries: cloneEntries(m.Entries)}}}
		}
	}
	return f.shipAck(m.Group, m.Entries)
}

func (f *Follower) shipAck(r Ref, entries []Entry) []Effect {
	if len(entries) == 0 {
		return nil
	}
	return []Effect{Send{Message{Type: MsgShipAck, From: f.shard, To: r.Leader, Group: r, Seq: entries[len(entries)-1].Seq}}}
}

// Tick advances the follower's clock by one tick: every RetryTicks it
// re-sends JA for every key whose JAA has not come, every ProbeTicks it
// probes the leader of every other yielded key. Only the raft leader
// replica ticks.
func (f *Follower) Tick() []Effect {
	f.ticks++
	retry, probe := f.ticks%f.opts.RetryTicks == 0, f.ticks%f.opts.ProbeTicks == 0
	if !retry && !probe {
		return nil
	}
	var out []Effect
	for _, k := range f.Keys() {
		y := f.keys[k]
		switch {
		case !y.Confirmed && retry:
			out = append(out, f.ja(y, k, false))
		case y.Confirmed && probe:
			out = append(out, f.ja(y, k, true))
		}
	}
	return out
}

// Apply applies a committed follower record (a kind that is not
// ForLeader) and returns its effects. It is deterministic: every replica
// applies the same records in the same order to the same state and gets
// the same state and effects. Store effects are part of the application:
// every replica performs them. Records of a leader are ignored.
func (f *Follower) Apply(r Record) []Effect {
	switch r.Kind {
	case RecYield:
		m := Message{Group: r.Group, Key: r.Key}
		if y := f.keys[r.Key]; y != nil {
			// A J was logged twice, or another group's J came first.
			return f.yieldedAlready(y, m)
		}
		f.lastYield++
		y := &Yielded{Group: r.Group, Yield: f.lastYield, Value: bytes.Clone(r.Value), Absent: r.Absent, Tags: r.Tags.clone(), Version: r.Version}
		f.keys[r.Key] = y
		return []Effect{f.ja(y, r.Key, false)}
	case RecConfirm:
		if y := f.keys[r.Key]; y != nil && y.Group == r.Group && y.Yield == r.Yield {
			y.Confirmed, y.Value, y.Absent, y.Tags, y.Version = true, nil, false, Tags{}, 0
		}
	case RecFree:
		var stores []Entry
		if y := f.keys[r.Key]; frees(y, r.Group, r.Yield) {
			// The D of a joined member names the yield the leader joined
			// (not 0) and carries the group's writes of the key: those not
			// applied yet are stored before the shard owns the key again.
			// The join makes them the key's, confirmed or not.
			for _, e := range r.Entries {
				if r.Yield != 0 && e.Key == r.Key && e.Seq > y.Shipped {
					y.Shipped = e.Seq
					stores = append(stores, e)
				}
			}
			if r.Yield != 0 && r.Seq > y.Shipped {
				// A D carrying the first of the key's entries only (its
				// shipment would be too large): the key stays the
				// group's, confirmed (the D names the yield the leader
				// joined), so that Ships bring the rest; a D carrying
				// the last, Seq, frees it.
				y.Confirmed, y.Value, y.Absent, y.Tags, y.Version = true, nil, false, Tags{}, 0
				return storeEntries(stores)
			}
			delete(f.keys, r.Key)
		}
		return append(storeEntries(stores), f.da(r.Group, r.Key, r.Yield))
	case RecApplyShip:
		// Entries apply in order, up to the first held one; the ShipAck
		// covers those, and the leader re-sends the rest.
		var stores []Entry
		entries := r.Entries[:f.shipPrefix(r.Group, r.Entries)]
		for _, e := range entries {
			if f.shippable(r.Group, e) {
				f.keys[e.Key].Shipped = e.Seq
				stores = append(stores, e)
			}
		}
		return append(storeEntries(stores), f.shipAck(r.Group, entries)...)
	}
	return nil
}

// storeEntries returns the Store effects of entries, applied by one
// record, in their order: each at its version. Entries of an older build
// (no version) are stored at the record's version, so of those only a
// key's last, which is what the version holds in the end.
func storeEntries(entries []Entry) []Effect {
	var last map[Key]int
	for i, e := range entries {
		if e.Version == 0 {
			if last == nil {
				last = make(map[Key]int, len(entries))
			}
			last[e.Key] = i
		}
	}
	out := make([]Effect, 0, len(entries))
	for i, e := range entries {
		if e.Version == 0 && last[e.Key] != i {
			continue
		}
		out = append(out, Store{Write: Write{Key: e.Key, Value: bytes.Clone(e.Value), Delete: e.Delete, Tags: e.Tags.clone()}, Version: e.Version})
	}
	return out
}

func cloneEntries(es []Entry) []Entry {
	out := make([]Entry, len(es))
	for i, e := range es {
		out[i] = e
		out[i].Value, out[i].Tags = bytes.Clone(e.Value), e.Tags.clone()
	}
	return out
}
