package group

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestProtocol runs the scripts in testdata/protocol against Leaders and
// Followers driven by hand: the script plays the network (it hands each
// message to its destination, late, twice or never) and raft (a logged
// record changes nothing until the script applies it). Rewrite the
// expected outputs with -rewrite and read the diff before keeping it.
//
// Every shard has a Leader, a Follower and the data of its keys. Keys are
// named by single words (collection 0); groups by their ids, their
// incarnation being the live one at the leader unless inc=N says
// otherwise.
//
// Commands (arguments in brackets are optional):
//
//	keys K=SHARD...
//	    The home shard of each key (creates the shards).
//	put K=V... / del K...
//	    Sets (deletes) keys in their home shard's data, as committed plain
//	    writes.
//	create id=G leader=K [members=(K,...)] [mode=atomic|best_effort]
//	delete id=G
//	write id=G K=V...
//	    Requests at the group's leader shard (the leader key's home).
//	j group=G key=K [inc=N] [intent] [locked]
//	    A J to K's home shard; its KeyCheck reads the shard's data.
//	ja group=G key=K yield=Y [inc=N] [refused=REASON] [probe] [value=V]
//	    A JA from K's home shard to the group's leader shard; without
//	    value= it carries K's current value in its home shard's data.
//	jaa group=G key=K yield=Y [inc=N]
//	d group=G key=K [yield=Y] [inc=N]
//	da group=G key=K [yield=Y] [inc=N]
//	ship group=G shard=S [inc=N] [entries=(SEQ:K=V[@VERSION],...)]
//	    A Ship of the leader's current outbox for shard S; with entries=,
//	    a Ship of those entries (a late copy of one whose entries the
//	    outbox has dropped since).
//	shipack group=G shard=S seq=N [inc=N]
//	apply shard=S [n=N]
//	    Applies the first N (default: all) logged records of shard S.
//	tick shard=S [n=N]
//	    Ticks shard S's leader and follower N times (default 1).
//	crash shard=S
//	    Drops the records logged but not applied and restarts the shard's
//	    leader and follower from their parts (Parts).
//	dump [shard=S]
//
// Effects print as "sN log: RECORD" (queued until applied), "send: MSG"
// (never delivered by itself), "sN reply: REPLY" and "sN store:
// WRITE@VERSION" (WRITE alone: at the version of the record applied).
// Records that store writes get versions 1, 2, 3... as they are applied,
// whichever their shard; an entry shows its write's as SEQ:WRITE@VERSION.
func TestProtocol(t *testing.T) {
	datadriven.Walk(t, "testdata/protocol", func(t *testing.T, path string) {
		e := &ddEnv{home: map[string]ShardID{}, shards: map[ShardID]*ddShard{}, leaderOf: map[string]ShardID{}}
		datadriven.RunTest(t, path, e.run)
	})
}

type ddShard struct {
	id       ShardID
	leader   *Leader
	follower *Follower
	pending  []Record
	data     map[Key][]byte
}

type ddEnv struct {
	home     map[string]ShardID
	shards   map[ShardID]*ddShard
	leaderOf map[string]ShardID
	lastInc  map[string]uint64
	// version is the last version given to an applied record that
	// stores writes (one clock for all shards).
	version uint64
	out     strings.Builder
}

var ddOpts = Options{RetryTicks: 3, ProbeTicks: 6}

func (e *ddEnv) shard(id ShardID) *ddShard {
	s := e.shards[id]
	if s == nil {
		s = &ddShard{id: id, leader: NewLeader(id, ddOpts), follower: NewFollower(id, ddOpts), data: map[Key][]byte{}}
		e.shards[id] = s
	}
	return s
}

func (e *ddEnv) homeOf(t *testing.T, td *datadriven.TestData, k string) *ddShard {
	id, ok := e.home[k]
	if !ok {
		td.Fatalf(t, "key %q has no home shard", k)
	}
	return e.shard(id)
}

func (e *ddEnv) ref(t *testing.T, td *datadriven.TestData) Ref {
	var id string
	td.ScanArgs(t, "group", &id)
	ls, ok := e.leaderOf[id]
	if !ok {
		td.Fatalf(t, "group %q was never created", id)
	}
	r := Ref{ID: id, Leader: ls, Inc: e.lastInc[id]}
	if g, ok := e.shard(ls).leader.Group(id); ok {
		r.Inc = g.Ref.Inc
	}
	td.MaybeScanArgs(t, "inc", &r.Inc)
	return r
}

func (e *ddEnv) effects(s *ddShard, effs []Effect) {
	for _, ef := range effs {
		switch ef := ef.(type) {
		case Log:
			// The record is encoded and decoded, as the log would.
			r, err := DecodeRecord(EncodeRecord(ef.Record))
			if err != nil {
				panic(err)
			}
			s.pending = append(s.pending, r)
			fmt.Fprintf(&e.out, "s%d log: %s\n", s.id, r)
		case Send:
			m, err := DecodeMessage(EncodeMessage(ef.Msg))
			if err != nil {
				panic(err)
			}
			fmt.Fprintf(&e.out, "send: %s\n", m)
		case Reply:
			fmt.Fprintf(&e.out, "s%d reply: %s\n", s.id, ef)
		case Store:
			if ef.Write.Delete {
				delete(s.data, ef.Write.Key)
			} else {
				s.data[ef.Write.Key] = ef.Write.Value
			}
			if ef.Version > 0 {
				fmt.Fprintf(&e.out, "s%d store: %s@%d\n", s.id, ef.Write, ef.Version)
			} else {
				fmt.Fprintf(&e.out, "s%d store: %s\n", s.id, ef.Write)
			}
		}
	}
}

func (e *ddEnv) keyArg(t *testing.T, td *datadriven.TestData) (Key, *ddShard) {
	var k string
	td.ScanArgs(t, "key", &k)
	return Key{Key: k}, e.homeOf(t, td, k)
}

func (e *ddEnv) run(t *testing.T, td *datadriven.TestData) string {
	e.out.Reset()
	if e.lastInc == nil {
		e.lastInc = map[string]uint64{}
	}
	switch td.Cmd {
	case "keys":
		for _, a := range td.CmdArgs {
			n, err := strconv.ParseUint(a.Vals[0], 10, 64)
			if err != nil {
				td.Fatalf(t, "%s: %v", a.Key, err)
			}
			e.home[a.Key] = ShardID(n)
			e.shard(ShardID(n))
		}
		return "ok"
	case "put":
		for _, a := range td.CmdArgs {
			e.homeOf(t, td, a.Key).data[Key{Key: a.Key}] = []byte(a.Vals[0])
		}
		return "ok"
	case "del":
		for _, a := range td.CmdArgs {
			delete(e.homeOf(t, td, a.Key).data, Key{Key: a.Key})
		}
		return "ok"
	case "create":
		var id, leader, mode string
		var members []string
		td.ScanArgs(t, "id", &id)
		td.ScanArgs(t, "leader", &leader)
		td.MaybeScanArgs(t, "members", &members)
		mode = "atomic"
		td.MaybeScanArgs(t, "mode", &mode)
		s := e.homeOf(t, td, leader)
		req := CreateRequest{ID: id, Leader: Key{Key: leader}, Mode: Mode(99)}
		switch mode {
		case "atomic":
			req.Mode = Atomic
		case "best_effort":
			req.Mode = BestEffort
		}
		for _, m := range members {
			req.Members = append(req.Members, Member{Key: Key{Key: m}, Shard: e.homeOf(t, td, m).id})
		}
		e.leaderOf[id] = s.id
		effs, err := s.leader.Create(req)
		if err != nil {
			return fmt.Sprintf("error: %v\n", err)
		}
		e.effects(s, effs)
	case "delete", "write":
		var id string
		td.ScanArgs(t, "id", &id)
		s := e.shard(e.leaderOf[id])
		var effs []Effect
		var err error
		if td.Cmd == "delete" {
			effs, err = s.leader.Delete(id)
		} else {
			var ws []Write
			for _, a := range td.CmdArgs[1:] {
				ws = append(ws, Write{Key: Key{Key: a.Key}, Value: []byte(a.Vals[0])})
			}
			effs, err = s.leader.Write(id, ws, nil)
		}
		if err != nil {
			return fmt.Sprintf("error: %v\n", err)
		}
		e.effects(s, effs)
	case "j":
		r := e.ref(t, td)
		k, s := e.keyArg(t, td)
		kc := KeyCheck{Intent: td.HasArg("intent"), Locked: td.HasArg("locked")}
		kc.Value, kc.Absent = e.value(s, k)
		e.effects(s, s.follower.OnJ(Message{Type: MsgJ, From: r.Leader, To: s.id, Group: r, Key: k}, kc))
	case "ja":
		r := e.ref(t, td)
		k, fs := e.keyArg(t, td)
		m := Message{Type: MsgJA, From: fs.id, To: r.Leader, Group: r, Key: k, Probe: td.HasArg("probe")}
		td.ScanArgs(t, "yield", &m.Yield)
		td.MaybeScanArgs(t, "refused", &m.Refused)
		if td.HasArg("value") {
			var v string
			td.ScanArgs(t, "value", &v)
			m.Value = []byte(v)
		} else {
			m.Value, m.Absent = e.value(fs, k)
		}
		e.effects(e.shard(r.Leader), e.shard(r.Leader).leader.OnJA(m))
	case "jaa", "d":
		r := e.ref(t, td)
		k, s := e.keyArg(t, td)
		m := Message{From: r.Leader, To: s.id, Group: r, Key: k}
		td.MaybeScanArgs(t, "yield", &m.Yield)
		if td.Cmd == "jaa" {
			m.Type = MsgJAA
			e.effects(s, s.follower.OnJAA(m))
		} else {
			// The D the leader sends (sendD): with its key's writes, if
			// the member is releasing with this yield.
			m.Type = MsgD
			if g, ok := e.shard(r.Leader).leader.Group(r.ID); ok && g.Ref == r {
				if mem := g.member(k); mem != nil && mem.Status == Releasing && mem.Yield == m.Yield {
					m.Entries = e.shard(r.Leader).leader.sendD(&g, mem).Msg.Entries
				}
			}
			fmt.Fprintf(&e.out, "deliver: %s\n", m)
			e.effects(s, s.follower.OnD(m))
		}
	case "da":
		r := e.ref(t, td)
		k, s := e.keyArg(t, td)
		m := Message{Type: MsgDA, From: s.id, To: r.Leader, Group: r, Key: k}
		td.MaybeScanArgs(t, "yield", &m.Yield)
		e.effects(e.shard(r.Leader), e.shard(r.Leader).leader.OnDA(m))
	case "ship":
		r := e.ref(t, td)
		var sh uint64
		td.ScanArgs(t, "shard", &sh)
		m := Message{Type: MsgShip, From: r.Leader, To: ShardID(sh), Group: r}
		if td.HasArg("entries") {
			var es []string
			td.ScanArgs(t, "entries", &es)
			for _, x := range es {
				seq, kv, ok := strings.Cut(x, ":")
				k, v, ok2 := strings.Cut(kv, "=")
				n, err := strconv.ParseUint(seq, 10, 64)
				var at uint64
				if _, ver, versioned := strings.Cut(v, "@"); versioned && err == nil {
					at, err = strconv.ParseUint(ver, 10, 64)
				}
				if !ok || !ok2 || err != nil {
					td.Fatalf(t, "entry %q: want SEQ:K=V or SEQ:K=V@VERSION", x)
				}
				v, _, _ = strings.Cut(v, "@")
				m.Entries = append(m.Entries, Entry{Seq: n, Write: Write{Key: Key{Key: k}, Value: []byte(v)}, Version: at})
			}
		} else if g, ok := e.shard(r.Leader).leader.Group(r.ID); ok {
			if ob := g.outbox(ShardID(sh)); ob != nil {
				m.Entries, _ = g.shipment(ob, nil, ddOpts.EnsureDefaults()) // what the leader sends
			}
		}
		fmt.Fprintf(&e.out, "deliver: %s\n", m)
		s := e.shard(ShardID(sh))
		e.effects(s, s.follower.OnShip(m))
	case "shipack":
		r := e.ref(t, td)
		var sh uint64
		td.ScanArgs(t, "shard", &sh)
		m := Message{Type: MsgShipAck, From: ShardID(sh), To: r.Leader, Group: r}
		td.ScanArgs(t, "seq", &m.Seq)
		e.effects(e.shard(r.Leader), e.shard(r.Leader).leader.OnShipAck(m))
	case "apply":
		s := e.shardArg(t, td)
		n := len(s.pending)
		td.MaybeScanArgs(t, "n", &n)
		if n > len(s.pending) {
			td.Fatalf(t, "s%d has %d records logged", s.id, len(s.pending))
		}
		recs := s.pending[:n]
		s.pending = s.pending[n:]
		for _, r := range recs {
			if r.Kind == RecWrite || r.Kind == RecApplyShip || r.Kind == RecFree {
				e.version++
				r.Version = e.version
			}
			fmt.Fprintf(&e.out, "s%d apply: %s\n", s.id, r)
			if r.Kind.ForLeader() {
				e.effects(s, s.leader.Apply(r))
			} else {
				e.effects(s, s.follower.Apply(r))
			}
			for _, g := range s.leader.Groups() {
				e.lastInc[g.Ref.ID] = g.Ref.Inc
			}
		}
	case "tick":
		s := e.shardArg(t, td)
		n := 1
		td.MaybeScanArgs(t, "n", &n)
		for range n {
			e.effects(s, s.leader.Tick())
			e.effects(s, s.follower.Tick())
		}
	case "crash":
		s := e.shardArg(t, td)
		fmt.Fprintf(&e.out, "s%d: %d logged records lost\n", s.id, len(s.pending))
		s.pending = nil
		l, err := DecodeLeaderParts(s.leader.Parts(), ddOpts)
		if err != nil {
			td.Fatalf(t, "DecodeLeaderParts: %v", err)
		}
		f, err := DecodeFollowerParts(s.follower.Parts(), ddOpts)
		if err != nil {
			td.Fatalf(t, "DecodeFollowerParts: %v", err)
		}
		s.leader, s.follower = l, f
	case "dump":
		var ids []ShardID
		if td.HasArg("shard") {
			ids = append(ids, e.shardArg(t, td).id)
		} else {
			for id := range e.shards {
				ids = append(ids, id)
			}
			sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
		}
		for _, id := range ids {
			e.out.WriteString(dumpShard(e.shards[id]))
		}
	default:
		td.Fatalf(t, "unknown command %q", td.Cmd)
	}
	if e.out.Len() == 0 {
		return "ok"
	}
	return e.out.String()
}

func (e *ddEnv) shardArg(t *testing.T, td *datadriven.TestData) *ddShard {
	var id uint64
	td.ScanArgs(t, "shard", &id)
	s := e.shards[ShardID(id)]
	if s == nil {
		td.Fatalf(t, "no shard %d", id)
	}
	return s
}

func (e *ddEnv) value(s *ddShard, k Key) ([]byte, bool) {
	v, ok := s.data[k]
	return v, !ok
}

func dumpShard(s *ddShard) string {
	var b strings.Builder
	fmt.Fprintf(&b, "s%d leader: last-inc=%d\n", s.id, s.leader.nextInc)
	for _, g := range s.leader.Groups() {
		fmt.Fprintf(&b, "  %s %s %s leader=%s", g.Ref, g.Mode, g.State, g.Leader)
		if g.Failed {
			b.WriteString(" failed")
		}
		if g.DeleteAsked {
			b.WriteString(" delete-asked")
		}
		b.WriteString("\n")
		for _, m := range g.Members {
			fmt.Fprintf(&b, "    %s@s%d %s", m.Key, m.Shard, m.Status)
			if m.Status == Joined || m.Status == Releasing {
				fmt.Fprintf(&b, " y=%d", m.Yield)
			}
			if m.Status == Joined {
				if m.Absent {
					b.WriteString(" absent")
				} else {
					fmt.Fprintf(&b, " value=%s", m.Value)
				}
			}
			if m.Reason != "" {
				fmt.Fprintf(&b, " reason=%s", m.Reason)
			}
			b.WriteString("\n")
		}
		for _, ob := range g.Outboxes {
			if len(ob.Entries) == 0 && ob.Next == 1 {
				continue
			}
			fmt.Fprintf(&b, "    outbox s%d next=%d:", ob.Shard, ob.Next)
			for _, en := range ob.Entries {
				fmt.Fprintf(&b, " %s", en)
			}
			b.WriteString("\n")
		}
	}
	fmt.Fprintf(&b, "s%d follower: last-yield=%d\n", s.id, s.follower.LastYield())
	for _, k := range s.follower.Keys() {
		y, _ := s.follower.Key(k)
		fmt.Fprintf(&b, "  %s: %s y=%d", k, y.Group, y.Yield)
		if y.Confirmed {
			b.WriteString(" confirmed")
		}
		if y.Shipped > 0 {
			fmt.Fprintf(&b, " shipped=%d", y.Shipped)
		}
		b.WriteString("\n")
	}
	var ks []Key
	for k := range s.data {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool { return ks[i].less(ks[j]) })
	if len(ks) > 0 {
		fmt.Fprintf(&b, "s%d data:", s.id)
		for _, k := range ks {
			fmt.Fprintf(&b, " %s=%s", k, s.data[k])
		}
		b.WriteString("\n")
	}
	return b.String()
}

// TestFollowerYieldedIn: YieldedIn finds a yielded key of the collection
// in the span asked, with its group, and none outside it.
func TestFollowerYieldedIn(t *testing.T) {
	f := NewFollower(2, Options{})
	for _, k := range []Key{{Collection: 7, Key: "b"}, {Collection: 8, Key: "d"}} {
		f.Apply(Record{Kind: RecYield, Group: Ref{ID: "g", Leader: 1, Inc: 1}, Key: k})
	}
	for _, c := range []struct {
		coll       uint32
		start, end string
		bounded    bool
		want       string
	}{
		{7, "", "", false, "b"},
		{7, "a", "c", true, "b"},
		{7, "b", "b\x00", true, "b"},
		{7, "a", "b", true, ""},
		{7, "c", "", false, ""},
		{8, "", "", false, "d"},
		{9, "", "", false, ""},
	} {
		k, g, ok := f.YieldedIn(c.coll, c.start, c.end, c.bounded)
		if got := k.Key; ok != (c.want != "") || got != c.want || (ok && g != "g") {
			t.Errorf("YieldedIn(%d, %q, %q, %v) = %q %q %v, want %q", c.coll, c.start, c.end, c.bounded, got, g, ok, c.want)
		}
	}
}
