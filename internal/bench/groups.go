package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"time"
)

// The groups workload is G-Store's gaming benchmark (Das, Agrawal and El
// Abbadi, "G-Store: a scalable data store for transactional multi key
// access in the cloud", SoCC 2010) on groupkv's Key Groups. A collection
// holds Players player records. Each client plays one game after the
// other; a game:
//
//  1. draws its size K from a normal distribution around GroupSize (at
//     least 2) and K players: a run of consecutive player ids, or K
//     distinct ids drawn uniformly;
//  2. creates a group of them, led by the first (atomic: when a player is
//     in another client's game, the creation is refused, counted, and the
//     client draws again);
//  3. plays OpsPerGroup moves, each after a think time drawn uniformly from
//     [Think, 2·Think): a group transaction that reads one or two players
//     and updates one (its move counter and one of its fields);
//  4. deletes the group.
//
// The "ungrouped" mode plays the same games with plain gets and puts, no
// group and no guarantee: its create and delete steps do nothing. The
// price of groups is the ratio of the two modes' mean latency per
// operation, the create and delete of a game amortized over its
// OpsPerGroup+2 operations (GroupsStats, the "amortized" latency).

// GroupsWorkloadName is the workload's name in results.
const GroupsWorkloadName = "groups"

// Names of the groups workload's operations in results. The top-level
// operation (AllOps) is a game: from the first creation attempt to the end
// of the delete, think times included.
const (
	// GroupsOpCreate is a group's creation that succeeded (refused ones
	// are counted in GroupsStats.Refused).
	GroupsOpCreate = "create"
	// GroupsOpMove is one move: its transaction, retries included, or in
	// ungrouped mode its gets and put. Think time is not included.
	GroupsOpMove = "move"
	// GroupsOpDelete is a group's deletion.
	GroupsOpDelete = "delete"
	// GroupsOpAmortized is one value per completed game: the time it
	// spent in the store (its successful creation, its moves and its
	// delete, without think time or refused creations) divided by
	// OpsPerGroup+2.
	GroupsOpAmortized = "amortized"
)

// groupsOps are the operation ids of a groups run, in order.
var groupsOps = []string{GroupsOpCreate, GroupsOpMove, GroupsOpDelete, GroupsOpAmortized}

const (
	groupsCreate = iota
	groupsMove
	groupsDelete
	groupsAmortized
)

// Modes of the groups workload.
const (
	// GroupsModeGrouped plays each game in a key group.
	GroupsModeGrouped = "grouped"
	// GroupsModeUngrouped plays the same games with plain gets and puts.
	GroupsModeUngrouped = "ungrouped"
)

// How a game chooses its players (GroupsWorkload.Members).
const (
	// MembersContiguous is a run of consecutive player ids from a start
	// drawn uniformly.
	MembersContiguous = "contiguous"
	// MembersRandom is distinct player ids drawn uniformly.
	MembersRandom = "random"
)

// MaxGroupMembers is the most members a groupkv group may have; larger
// drawn sizes are cut to it.
const MaxGroupMembers = 10_000

// GroupsWorkload sizes the groups workload. The zero value of each field
// means its default.
type GroupsWorkload struct {
	// Players is the number of player records; 0 means 1,000,000
	// (G-Store's benchmark ran on a table of about that size per node).
	Players int
	// GroupSize is the mean number of players of a game; 0 means 10.
	GroupSize int
	// GroupSizeStddev is the standard deviation of a game's size; 0 means
	// GroupSize/4, so that most games are within half their mean.
	GroupSizeStddev float64
	// Members is MembersContiguous (default) or MembersRandom.
	Members string
	// OpsPerGroup is the number of moves of a game; 0 means 50.
	OpsPerGroup int
	// Think is the least think time before a move (drawn from [Think,
	// 2·Think)); 0 means none.
	Think time.Duration
	// Mode is GroupsModeGrouped (default) or GroupsModeUngrouped.
	Mode string
}

// EnsureDefaults fills the defaults of zero fields.
func (w *GroupsWorkload) EnsureDefaults() {
	if w.Players == 0 {
		w.Players = 1_000_000
	}
	if w.GroupSize == 0 {
		w.GroupSize = 10
	}
	if w.GroupSizeStddev == 0 {
		w.GroupSizeStddev = float64(w.GroupSize) / 4
	}
	if w.Members == "" {
		w.Members = MembersContiguous
	}
	if w.OpsPerGroup == 0 {
		w.OpsPerGroup = 50
	}
	if w.Mode == "" {
		w.Mode = GroupsModeGrouped
	}
}

// Validate reports every problem of w.
func (w GroupsWorkload) Validate() error {
	var errs []string
	if w.Players < 2 {
		errs = append(errs, fmt.Sprintf("players %d: need at least 2", w.Players))
	}
	if w.GroupSize < 2 || w.GroupSize > MaxGroupMembers {
		errs = append(errs, fmt.Sprintf("group size %d: give 2 to %d", w.GroupSize, MaxGroupMembers))
	}
	if w.GroupSizeStddev < 0 || math.IsNaN(w.GroupSizeStddev) {
		errs = append(errs, fmt.Sprintf("group size standard deviation %g: must not be negative", w.GroupSizeStddev))
	}
	switch w.Members {
	case MembersContiguous, MembersRandom:
	default:
		errs = append(errs, fmt.Sprintf("members %q: use contiguous or random", w.Members))
	}
	if w.OpsPerGroup < 1 {
		errs = append(errs, fmt.Sprintf("operations per group %d: need at least 1", w.OpsPerGroup))
	}
	if w.Think < 0 {
		errs = append(errs, fmt.Sprintf("think time %v is negative", w.Think))
	}
	switch w.Mode {
	case GroupsModeGrouped, GroupsModeUngrouped:
	default:
		errs = append(errs, fmt.Sprintf("mode %q: use grouped or ungrouped", w.Mode))
	}
	return joinProblems("groups workload", errs)
}

// PlayerKey is the key of player i: "p" and i in decimal.
func PlayerKey(i uint64) []byte {
	return strconv.AppendUint(append(make([]byte, 0, 24), 'p'), i, 10)
}

// DrawGroupSize draws a game's size from a normal distribution of mean and
// stddev, rounded, at least 2 and at most limit (limit >= 2).
func DrawGroupSize(r *rand.Rand, mean int, stddev float64, limit int) int {
	k := int(math.Round(float64(mean) + stddev*r.NormFloat64()))
	return min(max(k, 2), limit)
}

// ChoosePlayers fills dst with len(dst) distinct player ids of [0, n): a
// run of consecutive ids from a uniform start (MembersContiguous) or ids
// drawn uniformly, in random order (MembersRandom). It panics if len(dst) >
// n.
func ChoosePlayers(r *rand.Rand, n uint64, members string, dst []uint64) {
	if members != MembersContiguous {
		ChooseTxnKeys(r, n, dst)
		return
	}
	k := uint64(len(dst))
	if k > n {
		panic(fmt.Sprintf("bench: %d players of %d", k, n))
	}
	start := r.Uint64N(n - k + 1)
	for i := range dst {
		dst[i] = start + uint64(i)
	}
}

// Player records. A player's value is PlayerFields fields of 20 to 40
// bytes, each written as its length (one byte) then its bytes. Field 0 is
// the player's move counter, 20 decimal digits; the others are random
// bytes. A move adds one to the counter and replaces one other field: the
// sum of the counters is the number of moves applied.

// PlayerFields is the number of fields of a player.
const PlayerFields = 25

// Sizes of a player's fields.
const (
	playerFieldMin = 20
	playerFieldMax = 40
	counterDigits  = 20
)

// PlayerValueMean is the mean size of a player's value in bytes.
const PlayerValueMean = PlayerFields + counterDigits + (PlayerFields-1)*(playerFieldMin+playerFieldMax)/2

// ErrBadPlayer is a value of the groups workload that is not a player: the
// collection holds records of something else, or a write was torn.
var ErrBadPlayer = errors.New("bench: value is not a player")

// NewPlayer answers a new player's value: its counter 0 and random fields.
func NewPlayer(r *rand.Rand) []byte {
	v := make([]byte, 0, PlayerFields*(playerFieldMax+1))
	v = appendCounter(v, 0)
	for range PlayerFields - 1 {
		v = appendRandomField(v, r)
	}
	return v
}

func appendCounter(v []byte, n int64) []byte {
	v = append(v, counterDigits)
	s := strconv.AppendInt(make([]byte, 0, counterDigits), n, 10)
	for range counterDigits - len(s) {
		v = append(v, '0')
	}
	return append(v, s...)
}

func appendRandomField(v []byte, r *rand.Rand) []byte {
	n := playerFieldMin + r.IntN(playerFieldMax-playerFieldMin+1)
	v = append(v, byte(n))
	for i := 0; i < n; i += 8 {
		x := r.Uint64()
		for j := i; j < i+8 && j < n; j++ {
			v = append(v, byte(x))
			x >>= 8
		}
	}
	return v
}

// playerFields answers the offsets of the fields of v: field i is
// v[off[i]+1 : off[i+1]], its length byte at v[off[i]].
func playerFields(v []byte) ([PlayerFields + 1]int, error) {
	var off [PlayerFields + 1]int
	p := 0
	for i := range PlayerFields {
		if p >= len(v) {
			return off, fmt.Errorf("%w: %d fields of %d", ErrBadPlayer, i, PlayerFields)
		}
		n := int(v[p])
		if n < playerFieldMin || n > playerFieldMax || p+1+n > len(v) {
			return off, fmt.Errorf("%w: field %d of %d bytes", ErrBadPlayer, i, n)
		}
		off[i] = p
		p += 1 + n
	}
	if p != len(v) {
		return off, fmt.Errorf("%w: %d bytes after the last field", ErrBadPlayer, len(v)-p)
	}
	off[PlayerFields] = p
	return off, nil
}

// PlayerMoves answers the move counter of the player v.
func PlayerMoves(v []byte) (int64, error) {
	off, err := playerFields(v)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(string(v[off[0]+1:off[1]]), 10, 64)
	if err != nil || v[off[0]] != counterDigits {
		return 0, fmt.Errorf("%w: counter %q", ErrBadPlayer, v[off[0]+1:off[1]])
	}
	return n, nil
}

// Move is what a move changes of a player besides its counter: field
// Field (1 to PlayerFields-1) becomes Data (20 to 40 bytes).
type Move struct {
	Field int
	Data  []byte
}

// DrawMove draws a move's field and new data.
func DrawMove(r *rand.Rand) Move {
	f := appendRandomField(nil, r)
	return Move{Field: 1 + r.IntN(PlayerFields-1), Data: f[1:]}
}

// ApplyMove answers the player v after move m: its counter plus one and
// m's field replaced. v is not changed.
func ApplyMove(v []byte, m Move) ([]byte, error) {
	n, err := PlayerMoves(v)
	if err != nil {
		return nil, err
	}
	off, _ := playerFields(v)
	out := make([]byte, 0, len(v)+playerFieldMax)
	out = appendCounter(out, n+1)
	out = append(out, v[off[1]:off[m.Field]]...)
	out = append(out, byte(len(m.Data)))
	out = append(out, m.Data...)
	return append(out, v[off[m.Field+1]:]...), nil
}

// GroupsDriver is a system under test of the groups workload. Every method
// is safe for concurrent use; the driver does not keep the byte slices it
// is given after a call returns.
type GroupsDriver interface {
	// System is the system's name in results.
	System() string
	// Version describes the server, as well as the system lets a client
	// find out.
	Version(ctx context.Context) (string, error)
	// Reset deletes the groups a previous run left on the collection, and
	// empties it.
	Reset(ctx context.Context) error
	// Load writes records (the load phase), outside any group.
	Load(ctx context.Context, keys, values [][]byte) error
	// CreateGroup creates group id of members, led by members[0], all or
	// nothing: when a member cannot join (it belongs to another group, or
	// a transaction holds it) it answers an error wrapping
	// ErrGroupRefused, and no member stays in the group.
	CreateGroup(ctx context.Context, id string, members [][]byte) error
	// DeleteGroup deletes group id and answers once its members are
	// ungrouped, their last values written back to them.
	DeleteGroup(ctx context.Context, id string) error
	// GroupTransact runs fn in a transaction of group id and commits it,
	// running fn again in a new attempt when the group's leader aborts one
	// for a conflict. An error fn returns ends it without a retry, and is
	// answered.
	GroupTransact(ctx context.Context, id string, fn func(ctx context.Context, tx Tx) error) error
	// Plain answers a Tx whose reads and writes are performed at once,
	// each on its own, outside any group or transaction.
	Plain() Tx
	// Groups answers the ids of the groups led by a key of the
	// collection.
	Groups(ctx context.Context) ([]string, error)
	Close() error
}

// ErrGroupRefused is a group's creation refused because a member could
// not join it.
var ErrGroupRefused = errors.New("bench: group refused")

// GroupsStats are the figures of a groups run beside its latencies.
type GroupsStats struct {
	// Games counts the games completed in the measured time, Refused the
	// creations refused in it (keys in another game's group).
	Games   int64 `json:"games"`
	Refused int64 `json:"refused"`
	// MeanMembers is the mean size of the games completed.
	MeanMembers float64 `json:"mean_members"`
	// CreatesPerSec and MovesPerSec are the successful creations (games,
	// in ungrouped mode) and moves of the measured time per second.
	CreatesPerSec float64 `json:"creates_per_sec"`
	MovesPerSec   float64 `json:"moves_per_sec"`
	// Applied counts the moves applied over the whole run, warm-up
	// included: what the players' move counters gained.
	Applied int64 `json:"applied"`
}

// GroupsRunner runs the groups workload against one GroupsDriver.
type GroupsRunner struct {
	d    GroupsDriver
	opts Options
	// ids hands out the numbers of group ids.
	ids atomic.Uint64
}

// NewGroupsRunner returns a runner of d with opts (Records, ValueSize,
// Users, PerUser, Distribution play no part).
func NewGroupsRunner(d GroupsDriver, opts Options) (*GroupsRunner, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.System == "" {
		opts.System = d.System()
	}
	return &GroupsRunner{d: d, opts: opts}, nil
}

// Options are the runner's options, defaults filled.
func (g *GroupsRunner) Options() Options { return g.opts }

// Load empties the collection (GroupsDriver.Reset) and writes w.Players
// new players, LoadBatch per request from Clients clients.
func (g *GroupsRunner) Load(ctx context.Context, w GroupsWorkload) (LoadResult, error) {
	w.EnsureDefaults()
	if err := w.Validate(); err != nil {
		return LoadResult{}, err
	}
	if err := g.d.Reset(ctx); err != nil {
		return LoadResult{}, fmt.Errorf("resetting %s: %w", g.d.System(), err)
	}
	r := &Runner{opts: g.opts}
	n, b := w.Players, g.opts.LoadBatch
	var next, done atomic.Int64
	stopProgress := r.progress(func() Status {
		return Status{Phase: "load", Workload: GroupsWorkloadName, Elapsed: time.Duration(done.Load()), Total: time.Duration(n), Ops: done.Load()}
	})
	start := time.Now()
	err := r.parallel(ctx, func(ctx context.Context, id int) error {
		rng := rand.New(rand.NewPCG(g.opts.Seed, uint64(id)))
		for {
			lo := int(next.Add(1)-1) * b
			if lo >= n {
				return nil
			}
			hi := min(lo+b, n)
			keys := make([][]byte, 0, hi-lo)
			values := make([][]byte, 0, hi-lo)
			for k := lo; k < hi; k++ {
				keys = append(keys, PlayerKey(uint64(k)))
				values = append(values, NewPlayer(rng))
			}
			if err := g.d.Load(ctx, keys, values); err != nil {
				return fmt.Errorf("loading players %d to %d into %s: %w", lo, hi-1, g.d.System(), err)
			}
			done.Add(int64(hi - lo))
		}
	})
	stopProgress()
	if err != nil {
		return LoadResult{}, err
	}
	secs := time.Since(start).Seconds()
	return LoadResult{Records: n, Seconds: secs, RecordsPer: float64(n) / secs}, nil
}

// Run plays w for Warmup then Duration, each client playing one game after
// the other, and returns what the measured time recorded. The collection
// must hold w.Players players (Load); else it answers ErrNotLoaded.
//
// Every run of a runner draws the same games: the runs of the two modes
// with the same options choose the same players, sizes and moves, but for
// the draws that replace refused creations.
func (g *GroupsRunner) Run(ctx context.Context, w GroupsWorkload) (Result, error) {
	w.EnsureDefaults()
	if err := w.Validate(); err != nil {
		return Result{}, err
	}
	if err := g.check(ctx, w); err != nil {
		return Result{}, err
	}
	version, err := g.d.Version(ctx)
	if err != nil {
		return Result{}, fmt.Errorf("asking %s for its version: %w", g.d.System(), err)
	}
	grouped := w.Mode == GroupsModeGrouped
	players := uint64(w.Players)
	limit := min(w.Players, MaxGroupMembers)
	// Group ids are unique across runs and processes: the run's start
	// and a number.
	prefix := "bench-" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-"
	if grouped {
		if err := g.firstGroup(ctx, prefix+"first", min(w.GroupSize, limit)); err != nil {
			return Result{}, err
		}
	}
	type tally struct{ refused, games, members int64 }
	var tallies []*tally
	var applied atomic.Int64
	m, _ := g.d.(CPUMeter)
	r := &Runner{opts: g.opts, meter: m}
	res, err := r.loop(ctx, GroupsWorkloadName, groupsOps, func(c *client) stepFunc {
		t := &tally{}
		tallies = append(tallies, t)
		ids := make([]uint64, 0, limit)
		var keys [][]byte
		draw := func() {
			ids = ids[:DrawGroupSize(c.rng, w.GroupSize, w.GroupSizeStddev, limit)]
			ChoosePlayers(c.rng, players, w.Members, ids)
			keys = keys[:0]
			for _, id := range ids {
				keys = append(keys, PlayerKey(id))
			}
		}
		return func(ctx context.Context) error {
			var busy time.Duration
			draw()
			id := ""
			if grouped {
				for {
					id = prefix + strconv.FormatUint(g.ids.Add(1), 10)
					t0 := time.Now()
					err := g.d.CreateGroup(ctx, id, keys)
					if errors.Is(err, ErrGroupRefused) && ctx.Err() == nil {
						if c.measuring {
							t.refused++
						}
						draw()
						continue
					}
					if err != nil {
						return c.fail(groupsCreate, err)
					}
					busy += c.record(groupsCreate, t0)
					break
				}
			}
			var err error
			for range w.OpsPerGroup {
				if err = think(ctx, c.rng, w.Think); err != nil {
					break
				}
				// The updated player, and the other one read, if any.
				a := c.rng.IntN(len(keys))
				b := -1
				if c.rng.IntN(2) == 1 {
					b = (a + 1 + c.rng.IntN(len(keys)-1)) % len(keys)
				}
				m := DrawMove(c.rng)
				fn := func(ctx context.Context, tx Tx) error { return playMove(ctx, tx, keys, a, b, m) }
				t0 := time.Now()
				if grouped {
					err = g.d.GroupTransact(ctx, id, fn)
				} else {
					err = fn(ctx, g.d.Plain())
				}
				if err != nil {
					err = c.fail(groupsMove, err)
					break
				}
				applied.Add(1)
				busy += c.record(groupsMove, t0)
			}
			if grouped {
				// The group is deleted even when the run is interrupted,
				// so that no key stays grouped.
				dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
				t0 := time.Now()
				derr := g.d.DeleteGroup(dctx, id)
				cancel()
				if derr != nil {
					derr = c.fail(groupsDelete, fmt.Errorf("deleting group %s: %w", id, derr))
					return errors.Join(err, derr)
				}
				busy += c.record(groupsDelete, t0)
			}
			if err != nil {
				return err
			}
			if c.measuring {
				c.ops[groupsAmortized].hist.Record(busy / time.Duration(w.OpsPerGroup+2))
				t.games++
				t.members += int64(len(keys))
			}
			return nil
		}
	})
	if err != nil {
		return Result{}, err
	}
	res.System, res.Version = r.system(), version
	res.Params.Records = w.Players
	res.Params.ValueSize = PlayerValueMean
	res.Params.Distribution = DistUniform
	res.Params.GroupMode, res.Params.GroupSize, res.Params.GroupSizeStddev = w.Mode, w.GroupSize, w.GroupSizeStddev
	res.Params.GroupMembers, res.Params.OpsPerGroup = w.Members, w.OpsPerGroup
	res.Params.ThinkMs = float64(w.Think) / float64(time.Millisecond)
	s := &GroupsStats{Applied: applied.Load()}
	for _, t := range tallies {
		s.Games += t.games
		s.Refused += t.refused
		s.MeanMembers += float64(t.members)
	}
	if s.Games > 0 {
		s.MeanMembers /= float64(s.Games)
	}
	if res.Seconds > 0 {
		s.MovesPerSec = float64(res.Latency[GroupsOpMove].Count) / res.Seconds
		s.CreatesPerSec = float64(s.Games) / res.Seconds
		if grouped {
			s.CreatesPerSec = float64(res.Latency[GroupsOpCreate].Count) / res.Seconds
		}
	}
	res.Groups = s
	return res, nil
}

// check answers ErrNotLoaded unless the first and last players are there.
// firstGroup creates and deletes one group of players 0 to n-1 before
// the run's clock starts: a store's first group can cost what no other
// does (the store may set up its registry of groups then), and neither
// the warm-up nor the first round measured should be the one to pay it.
// A refusal (a player grouped by someone else) is no failure.
func (g *GroupsRunner) firstGroup(ctx context.Context, id string, n int) error {
	keys := make([][]byte, max(n, 1))
	for i := range keys {
		keys[i] = PlayerKey(uint64(i))
	}
	err := g.d.CreateGroup(ctx, id, keys)
	if errors.Is(err, ErrGroupRefused) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("creating a first group in %s: %w", g.d.System(), err)
	}
	if err := g.d.DeleteGroup(ctx, id); err != nil {
		return fmt.Errorf("deleting the first group %s in %s: %w", id, g.d.System(), err)
	}
	return nil
}

func (g *GroupsRunner) check(ctx context.Context, w GroupsWorkload) error {
	for _, i := range []uint64{0, uint64(w.Players - 1)} {
		v, found, err := g.d.Plain().Get(ctx, PlayerKey(i))
		if err != nil {
			return fmt.Errorf("reading player %d from %s: %w", i, g.d.System(), err)
		}
		if !found {
			return fmt.Errorf("%w (player %d of %d is missing)", ErrNotLoaded, i, w.Players)
		}
		if _, err := PlayerMoves(v); err != nil {
			return fmt.Errorf("player %d: %w", i, err)
		}
	}
	return nil
}

// playMove is one move: it reads player keys[a] and, when b >= 0, player
// keys[b], then writes keys[a] moved by m.
func playMove(ctx context.Context, tx Tx, keys [][]byte, a, b int, m Move) error {
	v, found, err := tx.Get(ctx, keys[a])
	if err != nil {
		return err
	}
	if !found {
		return fmt.Errorf("%w: player %s", ErrNotFound, keys[a])
	}
	if b >= 0 {
		o, found, err := tx.Get(ctx, keys[b])
		if err != nil {
			return err
		}
		if !found {
			return fmt.Errorf("%w: player %s", ErrNotFound, keys[b])
		}
		if _, err := PlayerMoves(o); err != nil {
			return fmt.Errorf("player %s: %w", keys[b], err)
		}
	}
	nv, err := ApplyMove(v, m)
	if err != nil {
		return fmt.Errorf("player %s: %w", keys[a], err)
	}
	return tx.Put(ctx, keys[a], nv)
}

// think waits a time drawn uniformly from [d, 2d); d = 0 does not wait.
func think(ctx context.Context, r *rand.Rand, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d + time.Duration(r.Int64N(int64(d))))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// record records, when the current top-level operation is measured, the
// success of operation op that started at t0, and answers its duration.
func (c *client) record(op int, t0 time.Time) time.Duration {
	d := time.Since(t0)
	if c.measuring {
		c.ops[op].hist.Record(d)
	}
	return d
}

// fail records, when the current top-level operation is measured, err as
// a failure of operation op, and answers it.
func (c *client) fail(op int, err error) error {
	if c.measuring {
		c.ops[op].errors++
		c.sample(err)
	}
	return err
}
