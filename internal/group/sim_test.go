package group

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestSimulation runs seeded random workloads of overlapping group creates,
// deletes, group writes and plain writes over several shards, through a
// simulated transport that loses 30% of the messages, duplicates and
// reorders them, and crashes shards: a crashed shard restarts from the
// parts of its applied state and loses the records it logged but had not
// applied (as raft loses uncommitted entries). Raft is one replica per
// shard whose log commits when the simulation applies its next record. A
// shard stores its state as the node does: in parts, each Apply storing
// only the parts that PartsAfter returns; the state rebuilt from them must
// encode as the live one, after every Apply and at every crash.
//
// After every step it checks that
//   - no key has two owners (see doc.go): its home shard owns it (the
//     follower holds no yield of it) XOR exactly one group's leader has
//     logged its join and not yet sent D; and a joined member's yield is
//     the yield its follower holds;
//   - a key its home shard owns has the last acknowledged write (plain or
//     group) in the shard's data, and a joined member's value at its
//     leader is that write too;
//   - an atomic group is answered success only with every member joined,
//     failure only with every key it took released.
//
// Then it stops the faults and runs until quiet, and checks that every
// request was answered, every live group is active with its joined keys
// held for it (no ghost), every atomic group fully joined; then it deletes
// every group and checks that every key is owned by its home shard again
// with every acknowledged write in its data.
//
// The seed fixes the run. Each run prints its seed on failure;
// GROUPKV_SEED=N runs seed N only.
func TestSimulation(t *testing.T) {
	seeds := make([]uint64, 0, 32)
	if s := os.Getenv("GROUPKV_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("GROUPKV_SEED=%q: %v", s, err)
		}
		seeds = append(seeds, seed)
	} else {
		base := uint64(time.Now().UnixNano())
		n := 24
		if testing.Short() {
			n = 4
		}
		for i := range n {
			seeds = append(seeds, base+uint64(i))
		}
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			s := newSim(seed)
			s.run()
			t.Log(s.stats())
			if len(s.errs) > 0 {
				t.Errorf("GROUPKV_SEED=%d:\n%s\nlast events:\n%s", seed, strings.Join(s.errs, "\n"), strings.Join(s.history, "\n"))
			}
		})
	}
}

const (
	simShards   = 4
	simKeys     = 14
	simSteps    = 4000
	simLoss     = 0.30
	simDup      = 0.10
	simQuiet    = 200 // rounds to quiescence, far more than needed
	simHistory  = 60
	simMaxGroup = 4
)

// Shipments of two entries at most (and a few bytes of values): outboxes
// drain in several, and deletions meet Ds that carry part of a key's
// entries; outboxes of six (and a few more bytes): writes to shards that
// fall behind are refused.
var simOpts = Options{RetryTicks: 3, ProbeTicks: 7, MaxShipEntries: 2, MaxShipBytes: 12, MaxOutboxEntries: 6, MaxOutboxBytes: 40}

// simVersion is a value at a version.
type simVersion struct {
	version uint64
	val     simVal
}

type simVal struct {
	v       string
	present bool
	// tags are the value's tags, joined by commas.
	tags string
}

// valOf is the simVal of a value, or of a write.
func valOf(value []byte, absent bool, t Tags) simVal {
	if absent {
		return simVal{}
	}
	return simVal{string(value), true, strings.Join(t.List, ",")}
}

func (v simVal) String() string {
	if !v.present {
		return "<absent>"
	}
	if v.tags != "" {
		return v.v + " tags=" + v.tags
	}
	return v.v
}

// simTags draws the tags of a write: none, or one or two.
func (s *sim) simTags() Tags {
	switch s.rng.IntN(3) {
	case 0:
		return Tags{}
	case 1:
		return Tags{List: []string{fmt.Sprintf("t%d", s.step)}}
	}
	return Tags{List: []string{"a", fmt.Sprintf("t%d", s.step)}}
}

type simEntry struct {
	rec   *Record
	plain *Write
}

type simShard struct {
	id       ShardID
	leader   *Leader
	follower *Follower
	data     map[Key]simVal
	// stored is each key's history in its shard's data: every value
	// stored, at its version.
	stored map[Key][]simVersion
	// leaderParts and followerParts are the stored parts of leader and
	// follower, by name: those of the initial state, then, after every
	// Apply, those PartsAfter returns.
	leaderParts, followerParts map[string][]byte
	// log holds the records logged and not applied yet; a crash loses them.
	log []simEntry
	// Volatile lock discipline of the shard's raft leader: locked keys
	// have a plain write logged; yieldPending keys a yield. A plain write
	// is not logged on a key with a yield pending, and a J on a locked key
	// is refused.
	locked       map[Key]bool
	yieldPending map[Key]int
}

type simReq struct {
	ref    Ref
	op     Op
	mode   Mode
	keys   []Key
	answer bool
}

type sim struct {
	rng    *rand.Rand
	shards []*simShard
	keys   []Key
	home   map[Key]ShardID
	net    []Message
	faults bool
	// expected is each key's last acknowledged write.
	expected map[Key]simVal
	// acked is each key's acknowledged writes, at their versions.
	acked map[Key][]simVersion
	// version is the last version given to a record that stores writes
	// (all shards draw from one clock, as a cluster's timestamp oracle).
	version uint64
	// awaiting are the applied creates and deletes not answered yet.
	awaiting map[Ref][]Op
	nextID   int
	ids      []string
	errs     []string
	history  []string
	step     int
	n        map[string]int
}

func newSim(seed uint64) *sim {
	s := &sim{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), home: map[Key]ShardID{},
		expected: map[Key]simVal{}, acked: map[Key][]simVersion{}, awaiting: map[Ref][]Op{}, faults: true, n: map[string]int{}}
	for i := range simShards {
		id := ShardID(i + 1)
		sh := &simShard{id: id, leader: NewLeader(id, simOpts), follower: NewFollower(id, simOpts),
			data: map[Key]simVal{}, stored: map[Key][]simVersion{}, locked: map[Key]bool{}, yieldPending: map[Key]int{},
			leaderParts: map[string][]byte{}, followerParts: map[string][]byte{}}
		storeParts(sh.leaderParts, sh.leader.Parts())
		storeParts(sh.followerParts, sh.follower.Parts())
		s.shards = append(s.shards, sh)
	}
	for i := range simKeys {
		k := Key{Collection: 1, Key: fmt.Sprintf("k%d", i)}
		s.keys = append(s.keys, k)
		s.home[k] = ShardID(1 + s.rng.IntN(simShards))
	}
	return s
}

func (s *sim) shard(id ShardID) *simShard { return s.shards[id-1] }

func (s *sim) logf(format string, args ...any) {
	s.history = append(s.history, fmt.Sprintf("%5d ", s.step)+fmt.Sprintf(format, args...))
	if len(s.history) > simHistory {
		s.history = s.history[1:]
	}
}

func (s *sim) errorf(format string, args ...any) {
	if len(s.errs) < 20 {
		s.errs = append(s.errs, fmt.Sprintf("step %d: ", s.step)+fmt.Sprintf(format, args...))
	}
}

func (s *sim) stats() string {
	var ks []string
	for k := range s.n {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	var b strings.Builder
	for _, k := range ks {
		fmt.Fprintf(&b, "%s=%d ", k, s.n[k])
	}
	return b.String()
}

func (s *sim) run() {
	for s.step = 0; s.step < simSteps && len(s.errs) == 0; s.step++ {
		s.randomStep()
		s.checkInvariants()
	}
	if len(s.errs) > 0 {
		return
	}
	s.faults = false
	s.logf("faults stop")
	// quiesce stops at the first safety violation, with the protocol
	// unfinished: checkQuiet would only report its work in flight.
	if !s.quiesce() {
		return
	}
	s.checkQuiet(true)
	if len(s.errs) > 0 {
		return
	}
	for _, sh := range s.shards {
		for _, g := range sh.leader.Groups() {
			s.propose(sh, func() ([]Effect, error) { return sh.leader.Delete(g.Ref.ID) })
		}
	}
	s.logf("delete every group")
	if !s.quiesce() {
		return
	}
	s.checkQuiet(false)
	for _, sh := range s.shards {
		if gs := sh.leader.Groups(); len(gs) > 0 {
			s.errorf("s%d still leads %d groups after deleting them all", sh.id, len(gs))
		}
		if ks := sh.follower.Keys(); len(ks) > 0 {
			s.errorf("s%d still yields %v after every group was deleted", sh.id, ks)
		}
	}
	s.checkInvariants()
}

func (s *sim) randomStep() {
	r := s.rng.IntN(100)
	sh := s.shards[s.rng.IntN(len(s.shards))]
	switch {
	case r < 45:
		s.deliver()
	case r < 65:
		s.applyOne(sh)
	case r < 77:
		s.tick(sh)
	case r < 82:
		s.create()
	case r < 83:
		if len(s.ids) > 0 {
			id := s.ids[s.rng.IntN(len(s.ids))]
			for _, sh := range s.shards {
				if _, ok := sh.leader.Group(id); ok {
					s.logf("s%d delete %s", sh.id, id)
					s.propose(sh, func() ([]Effect, error) { return sh.leader.Delete(id) })
				}
			}
		}
	case r < 92:
		s.groupWrite(sh)
	case r < 99:
		s.plainWrite()
	default:
		s.crash(sh)
	}
}

func (s *sim) propose(sh *simShard, f func() ([]Effect, error)) {
	effs, err := f()
	if err != nil {
		s.logf("s%d request: %v", sh.id, err)
		return
	}
	s.effects(sh, effs, nil)
}

func (s *sim) create() {
	n := 1 + s.rng.IntN(simMaxGroup)
	perm := s.rng.Perm(len(s.keys))[:n]
	leader := s.keys[perm[0]]
	sh := s.shard(s.home[leader])
	req := CreateRequest{ID: fmt.Sprintf("g%d", s.nextID%7), Leader: leader, Mode: Atomic}
	s.nextID++
	if s.rng.IntN(2) == 0 {
		req.Mode = BestEffort
	}
	for _, i := range perm[1:] {
		req.Members = append(req.Members, Member{Key: s.keys[i], Shard: s.home[s.keys[i]]})
	}
	if !slices.Contains(s.ids, req.ID) {
		s.ids = append(s.ids, req.ID)
	}
	s.logf("s%d create %s %s leader=%s members=%v", sh.id, req.ID, req.Mode, leader, req.Members)
	s.propose(sh, func() ([]Effect, error) { return sh.leader.Create(req) })
}

func (s *sim) groupWrite(sh *simShard) {
	for _, g := range sh.leader.Groups() {
		if g.State != Active || s.rng.IntN(2) == 0 {
			continue
		}
		var ws []Write
		for _, m := range g.Members {
			if m.Status == Joined && s.rng.IntN(2) == 0 {
				w := Write{Key: m.Key, Value: fmt.Appendf(nil, "g%d", s.step), Tags: s.simTags()}
				if s.rng.IntN(5) == 0 {
					w.Value, w.Delete, w.Tags = nil, true, Tags{}
				}
				ws = append(ws, w)
			}
		}
		if len(ws) > 0 {
			s.logf("s%d write %s %v", sh.id, g.Ref, ws)
			s.propose(sh, func() ([]Effect, error) { return sh.leader.Write(g.Ref.ID, ws, nil) })
		}
		return
	}
}

func (s *sim) plainWrite() {
	k := s.keys[s.rng.IntN(len(s.keys))]
	sh := s.shard(s.home[k])
	if sh.locked[k] || sh.yieldPending[k] > 0 {
		return
	}
	w := Write{Key: k, Value: fmt.Appendf(nil, "p%d", s.step), Tags: s.simTags()}
	if s.rng.IntN(5) == 0 {
		w.Value, w.Delete, w.Tags = nil, true, Tags{}
	}
	sh.locked[k] = true
	sh.log = append(sh.log, simEntry{plain: &w})
	s.logf("s%d log plain %s", sh.id, w)
}

func (s *sim) crash(sh *simShard) {
	s.n["crash"]++
	s.logf("s%d crash: %d logged entries lost", sh.id, len(sh.log))
	l, f, ok := s.stored(sh)
	if !ok {
		return
	}
	// The whole encodings round-trip too.
	l2, err := DecodeLeader(l.Encode(), simOpts)
	if err != nil || !bytes.Equal(l2.Encode(), l.Encode()) {
		s.errorf("s%d: the leader's encoding does not round-trip: %v", sh.id, err)
	}
	f2, err := DecodeFollower(f.Encode(), simOpts)
	if err != nil || !bytes.Equal(f2.Encode(), f.Encode()) {
		s.errorf("s%d: the follower's encoding does not round-trip: %v", sh.id, err)
	}
	sh.leader, sh.follower = l, f
	sh.log, sh.locked, sh.yieldPending = nil, map[Key]bool{}, map[Key]int{}
}

// stored decodes sh's stored parts and checks that they are the live
// state's: they encode the same, and are the parts the live state has.
func (s *sim) stored(sh *simShard) (*Leader, *Follower, bool) {
	l, err := DecodeLeaderParts(partsOf(sh.leaderParts), simOpts)
	if err != nil {
		s.errorf("s%d DecodeLeaderParts: %v", sh.id, err)
		return nil, nil, false
	}
	f, err := DecodeFollowerParts(partsOf(sh.followerParts), simOpts)
	if err != nil {
		s.errorf("s%d DecodeFollowerParts: %v", sh.id, err)
		return nil, nil, false
	}
	for _, g := range sh.leader.Groups() {
		if dg, ok := l.Group(g.Ref.ID); ok {
			for i, ob := range g.Outboxes {
				if dob := dg.Outboxes[i]; dob.size != ob.size {
					s.errorf("s%d: %s's outbox to s%d holds %d bytes of values, %d as decoded", sh.id, g.Ref, ob.Shard, ob.size, dob.size)
				}
			}
		}
	}
	if !bytes.Equal(l.Encode(), sh.leader.Encode()) {
		s.errorf("s%d: the stored leader parts are not the live state:\nstored %x\nlive   %x", sh.id, l.Encode(), sh.leader.Encode())
		return nil, nil, false
	}
	if !bytes.Equal(f.Encode(), sh.follower.Encode()) {
		s.errorf("s%d: the stored follower parts are not the live state:\nstored %x\nlive   %x", sh.id, f.Encode(), sh.follower.Encode())
		return nil, nil, false
	}
	if len(sh.leaderParts) != len(sh.leader.Parts()) || len(sh.followerParts) != len(sh.follower.Parts()) {
		s.errorf("s%d: %d leader and %d follower parts stored, the live state has %d and %d", sh.id,
			len(sh.leaderParts), len(sh.followerParts), len(sh.leader.Parts()), len(sh.follower.Parts()))
		return nil, nil, false
	}
	return l, f, true
}

func (s *sim) send(m Message) {
	b := EncodeMessage(m)
	m, err := DecodeMessage(b)
	if err != nil {
		s.errorf("DecodeMessage: %v", err)
		return
	}
	s.n["sent"]++
	if s.faults && s.rng.Float64() < simLoss {
		s.n["lost"]++
		return
	}
	s.net = append(s.net, m)
	if s.faults && s.rng.Float64() < simDup {
		s.n["duplicated"]++
		s.net = append(s.net, m)
	}
}

func (s *sim) deliver() {
	if len(s.net) == 0 {
		return
	}
	i := s.rng.IntN(len(s.net))
	m := s.net[i]
	s.net = slices.Delete(s.net, i, i+1)
	s.deliverMsg(m)
}

func (s *sim) deliverMsg(m Message) {
	sh := s.shard(m.To)
	s.logf("deliver %s", m)
	var effs []Effect
	switch m.Type {
	case MsgJ:
		v := sh.data[m.Key]
		kc := KeyCheck{Locked: sh.locked[m.Key], Intent: s.faults && s.rng.IntN(40) == 0, Value: []byte(v.v), Absent: !v.present}
		if v.tags != "" {
			kc.Tags.List = strings.Split(v.tags, ",")
		}
		effs = sh.follower.OnJ(m, kc)
	case MsgJA:
		effs = sh.leader.OnJA(m)
	case MsgJAA:
		effs = sh.follower.OnJAA(m)
	case MsgD:
		effs = sh.follower.OnD(m)
	case MsgDA:
		effs = sh.leader.OnDA(m)
	case MsgShip:
		effs = sh.follower.OnShip(m)
	case MsgShipAck:
		effs = sh.leader.OnShipAck(m)
	}
	s.effects(sh, effs, nil)
}

func (s *sim) tick(sh *simShard) {
	s.effects(sh, sh.leader.Tick(), nil)
	s.effects(sh, sh.follower.Tick(), nil)
}

func (s *sim) applyOne(sh *simShard) {
	if len(sh.log) == 0 {
		return
	}
	e := sh.log[0]
	sh.log = sh.log[1:]
	if e.plain != nil {
		w := *e.plain
		sh.locked[w.Key] = false
		if _, yielded := sh.follower.Key(w.Key); yielded {
			s.n["plain refused"]++
			s.logf("s%d apply plain %s: key in group", sh.id, w)
			return
		}
		v := valOf(w.Value, w.Delete, w.Tags)
		sh.data[w.Key], s.expected[w.Key] = v, v
		s.version++
		sh.stored[w.Key] = append(sh.stored[w.Key], simVersion{s.version, v})
		s.acked[w.Key] = append(s.acked[w.Key], simVersion{s.version, v})
		s.n["plain"]++
		s.logf("s%d apply plain %s", sh.id, w)
		return
	}
	r := *e.rec
	if r.Kind == RecWrite || r.Kind == RecApplyShip || r.Kind == RecFree {
		s.version++
		r.Version = s.version
	}
	s.logf("s%d apply %s", sh.id, r)
	if r.Kind.ForLeader() {
		var before map[string]Ref
		if r.Kind == RecCreate || r.Kind == RecDelete {
			before = map[string]Ref{}
			for _, g := range sh.leader.Groups() {
				before[g.Ref.ID] = g.Ref
			}
		}
		effs := sh.leader.Apply(r)
		storeParts(sh.leaderParts, sh.leader.PartsAfter(r))
		s.stored(sh)
		switch r.Kind {
		case RecCreate:
			if g, ok := sh.leader.Group(r.Group.ID); ok && before[r.Group.ID] != g.Ref {
				s.awaiting[g.Ref] = append(s.awaiting[g.Ref], OpCreate)
			}
		case RecDelete:
			if ref, ok := before[r.Group.ID]; ok && !slices.Contains(s.awaiting[ref], OpDelete) {
				s.awaiting[ref] = append(s.awaiting[ref], OpDelete)
			}
		}
		s.effects(sh, effs, &r)
		return
	}
	if r.Kind == RecYield {
		sh.yieldPending[r.Key]--
	}
	effs := sh.follower.Apply(r)
	if _, held := sh.follower.Key(r.Key); r.Kind == RecFree && r.Seq > 0 && held {
		s.n["partial free"]++
	}
	storeParts(sh.followerParts, sh.follower.PartsAfter(r))
	s.stored(sh)
	s.effects(sh, effs, &r)
}

func (s *sim) effects(sh *simShard, effs []Effect, applying *Record) {
	for _, ef := range effs {
		switch ef := ef.(type) {
		case Log:
			r, err := DecodeRecord(EncodeRecord(ef.Record))
			if err != nil {
				s.errorf("DecodeRecord: %v", err)
				continue
			}
			if r.Kind == RecYield {
				sh.yieldPending[r.Key]++
			}
			sh.log = append(sh.log, simEntry{rec: &r})
		case Send:
			s.send(ef.Msg)
		case Store:
			if applying == nil || applying.Kind != RecApplyShip && applying.Kind != RecFree {
				s.errorf("Store outside the Apply of a ship or a free: %v", ef)
			}
			if ef.Write.Tags.Keep {
				s.errorf("Store of tags to keep: %v", ef)
			}
			v, k := valOf(ef.Write.Value, ef.Write.Delete, ef.Write.Tags), ef.Write.Key
			at := ef.Version
			if at == 0 && applying != nil {
				at = applying.Version
			}
			if h := sh.stored[k]; len(h) > 0 && h[len(h)-1].version >= at {
				s.errorf("%s stored at version %d in s%d after version %d", k, at, sh.id, h[len(h)-1].version)
			}
			sh.data[k] = v
			sh.stored[k] = append(sh.stored[k], simVersion{at, v})
			s.n["shipped"]++
		case Reply:
			s.reply(sh, ef, applying)
		}
	}
}

func (s *sim) reply(sh *simShard, rep Reply, applying *Record) {
	s.logf("s%d reply %s", sh.id, rep)
	switch rep.Op {
	case OpWrite:
		if errors.Is(rep.Err, ErrBacklogged) {
			s.n["backlogged"]++
		}
		if rep.Err == nil {
			for _, w := range applying.Writes {
				v := valOf(w.Value, w.Delete, w.Tags)
				s.expected[w.Key] = v
				s.acked[w.Key] = append(s.acked[w.Key], simVersion{applying.Version, v})
			}
			s.n["group write"]++
		}
		return
	case OpCreate:
		switch {
		case rep.Err == nil:
			s.n["created "+s.modeOf(sh, rep.Group).String()]++
			g, ok := sh.leader.Group(rep.Group.ID)
			if !ok || g.Ref != rep.Group || g.State != Active {
				s.errorf("create %s answered ok, but the group is not active", rep.Group)
				break
			}
			var joined []Key
			for _, m := range g.Members {
				if m.Status == Joined {
					joined = append(joined, m.Key)
				} else if g.Mode == Atomic {
					s.errorf("atomic %s answered ok with member %s %s", g.Ref, m.Key, m.Status)
				}
			}
			if !slices.Equal(joined, rep.Joined) {
				s.errorf("create %s answered joined=%v, its members joined are %v", g.Ref, rep.Joined, joined)
			}
		case errors.Is(rep.Err, ErrRefused):
			s.n["refused atomic"]++
			s.checkReleased(rep.Group)
		case errors.Is(rep.Err, ErrDeletedWhileCreating):
			s.n["deleted while creating"]++
		}
	case OpDelete:
		if rep.Err == nil {
			s.n["deleted"]++
			s.checkReleased(rep.Group)
		}
	}
	if rep.Err == nil || errors.Is(rep.Err, ErrRefused) || errors.Is(rep.Err, ErrDeletedWhileCreating) {
		i := slices.Index(s.awaiting[rep.Group], rep.Op)
		if i < 0 {
			s.errorf("%s answered twice or unasked: %s", rep.Op, rep)
			return
		}
		s.awaiting[rep.Group] = slices.Delete(s.awaiting[rep.Group], i, i+1)
		if len(s.awaiting[rep.Group]) == 0 {
			delete(s.awaiting, rep.Group)
		}
	}
}

func (s *sim) modeOf(sh *simShard, r Ref) Mode {
	g, _ := sh.leader.Group(r.ID)
	return g.Mode
}

// checkReleased checks, when a group is answered gone, that its leader
// forgot it and that no key it took is still held for it: a key may still
// be yielded to it only if its JAA never came (a ghost of a late J, which
// the follower's JA retries free).
func (s *sim) checkReleased(r Ref) {
	if g, ok := s.shard(r.Leader).leader.Group(r.ID); ok && g.Ref == r {
		s.errorf("%s answered gone but its leader still has it", r)
	}
	for _, sh := range s.shards {
		for _, k := range sh.follower.Keys() {
			if y, _ := sh.follower.Key(k); y.Group == r && y.Confirmed {
				s.errorf("%s answered gone but s%d still holds %s for it (y=%d)", r, sh.id, k, y.Yield)
			}
		}
	}
}

// checkInvariants checks the safety invariants over the applied states.
func (s *sim) checkInvariants() {
	owners := map[Key][]string{}
	for _, k := range s.keys {
		sh := s.shard(s.home[k])
		if _, yielded := sh.follower.Key(k); !yielded {
			owners[k] = append(owners[k], fmt.Sprintf("home s%d", sh.id))
			if got := sh.data[k]; got != s.expected[k] {
				s.errorf("%s owned by home s%d has %v, last acknowledged write %v", k, sh.id, got, s.expected[k])
			}
			if !slices.Equal(sh.stored[k], s.acked[k]) {
				s.errorf("%s owned by home s%d stores the history %v, its acknowledged writes are %v", k, sh.id, sh.stored[k], s.acked[k])
			}
		}
	}
	for _, sh := range s.shards {
		for _, g := range sh.leader.Groups() {
			for _, m := range g.Members {
				if m.Status != Joined {
					continue
				}
				owners[m.Key] = append(owners[m.Key], g.Ref.String())
				y, ok := s.shard(m.Shard).follower.Key(m.Key)
				if !ok || y.Group != g.Ref || y.Yield != m.Yield {
					s.errorf("%s joined %s with y=%d, its follower holds %+v (yielded %t)", m.Key, g.Ref, m.Yield, y, ok)
				}
				if got := valOf(m.Value, m.Absent, m.Tags); got != s.expected[m.Key] {
					s.errorf("%s in %s has %v, last acknowledged write %v", m.Key, g.Ref, got, s.expected[m.Key])
				}
			}
		}
	}
	for _, k := range s.keys {
		if len(owners[k]) > 1 {
			s.errorf("%s has two owners: %v", k, owners[k])
		}
	}
}

// quiesce runs without faults until nothing is in flight, or until a
// safety check fails (it reports false then). Each round counts as a step,
// so that events and errors of quiescence are told apart by their step.
func (s *sim) quiesce() bool {
	for range simQuiet {
		s.step++
		for _, sh := range s.shards {
			for len(sh.log) > 0 {
				s.applyOne(sh)
			}
		}
		for len(s.net) > 0 {
			s.deliver()
		}
		for _, sh := range s.shards {
			s.tick(sh)
		}
		s.checkInvariants()
		if len(s.errs) > 0 {
			return false
		}
	}
	for _, sh := range s.shards {
		for len(sh.log) > 0 {
			s.applyOne(sh)
		}
	}
	return true
}

// checkQuiet checks a quiet system: every request answered, every group
// active, every yielded key held for a group that has it joined.
func (s *sim) checkQuiet(groupsLive bool) {
	for r, ops := range s.awaiting {
		s.errorf("%s never answered: %v", r, ops)
	}
	for _, sh := range s.shards {
		for _, g := range sh.leader.Groups() {
			if g.State != Active {
				s.errorf("%s is %s at quiescence", g.Ref, g.State)
			}
			for _, m := range g.Members {
				if g.Mode == Atomic && m.Status != Joined || m.Status != Joined && m.Status != Refused {
					s.errorf("%s %s member %s is %s at quiescence", g.Mode, g.Ref, m.Key, m.Status)
				}
				if m.Status == Joined {
					if y, _ := s.shard(m.Shard).follower.Key(m.Key); !y.Confirmed {
						s.errorf("%s: %s joined but not confirmed at its follower", g.Ref, m.Key)
					}
				}
			}
		}
		for _, k := range sh.follower.Keys() {
			y, _ := sh.follower.Key(k)
			g, ok := s.shard(y.Group.Leader).leader.Group(y.Group.ID)
			var m *Member
			if ok && g.Ref == y.Group {
				m = g.member(k)
			}
			if m == nil || m.Status != Joined || m.Yield != y.Yield {
				s.errorf("s%d holds %s for ghost %s (y=%d) at quiescence", sh.id, k, y.Group, y.Yield)
			}
		}
	}
	if groupsLive {
		s.n["live at end"] += len(s.liveGroups())
	}
}

func (s *sim) liveGroups() []Ref {
	var out []Ref
	for _, sh := range s.shards {
		for _, g := range sh.leader.Groups() {
			out = append(out, g.Ref)
		}
	}
	return out
}
