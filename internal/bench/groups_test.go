package bench

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	groupkv "github.com/groupkv/groupkv"
	"github.com/groupkv/groupkv/internal/api"
	"github.com/groupkv/groupkv/internal/node"
)

func TestPlayerValue(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("SEED=%d", seed)
	r := rand.New(rand.NewPCG(seed, 1))
	total := 0
	const n = 2000
	for range n {
		v := NewPlayer(r)
		total += len(v)
		if moves, err := PlayerMoves(v); err != nil || moves != 0 {
			t.Fatalf("new player %x: %d moves, %v (SEED=%d)", v, moves, err, seed)
		}
		off, err := playerFields(v)
		if err != nil {
			t.Fatal(err)
		}
		for i := range PlayerFields {
			if l := off[i+1] - off[i] - 1; l < 20 || l > 40 {
				t.Fatalf("field %d of %d bytes (SEED=%d)", i, l, seed)
			}
		}
		w := v
		for k := range 5 {
			m := DrawMove(r)
			next, err := ApplyMove(w, m)
			if err != nil {
				t.Fatalf("move %d: %v (SEED=%d)", k, err, seed)
			}
			if moves, err := PlayerMoves(next); err != nil || moves != int64(k+1) {
				t.Fatalf("after move %d: %d moves, %v (SEED=%d)", k, moves, err, seed)
			}
			o, _ := playerFields(next)
			if got := next[o[m.Field]+1 : o[m.Field+1]]; !bytes.Equal(got, m.Data) {
				t.Fatalf("field %d is %x, want %x (SEED=%d)", m.Field, got, m.Data, seed)
			}
			w = next
		}
	}
	if mean := float64(total) / n; mean < PlayerValueMean-10 || mean > PlayerValueMean+10 {
		t.Errorf("mean value of %.0f bytes, want about %d (SEED=%d)", mean, PlayerValueMean, seed)
	}
	for _, bad := range [][]byte{nil, []byte("x"), append(NewPlayer(r), 0), NewPlayer(r)[:100]} {
		if _, err := PlayerMoves(bad); !errors.Is(err, ErrBadPlayer) {
			t.Errorf("PlayerMoves(%q) = %v, want ErrBadPlayer", bad, err)
		}
	}
}

func TestChoosePlayers(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("SEED=%d", seed)
	r := rand.New(rand.NewPCG(seed, 1))
	sizes := map[int]int{}
	for range 10000 {
		k := DrawGroupSize(r, 10, 2.5, 12)
		if k < 2 || k > 12 {
			t.Fatalf("size %d out of [2, 12] (SEED=%d)", k, seed)
		}
		sizes[k]++
	}
	if sizes[10] < sizes[5] || sizes[12] < sizes[2] {
		t.Errorf("sizes %v are not around 10 and cut at 12 (SEED=%d)", sizes, seed)
	}
	if k := DrawGroupSize(r, 2, 100, 3); k < 2 || k > 3 {
		t.Errorf("size %d out of [2, 3]", k)
	}
	dst := make([]uint64, 7)
	for range 1000 {
		ChoosePlayers(r, 20, MembersContiguous, dst)
		for i := range dst {
			if dst[i] != dst[0]+uint64(i) || dst[i] >= 20 {
				t.Fatalf("contiguous %v (SEED=%d)", dst, seed)
			}
		}
		ChoosePlayers(r, 20, MembersRandom, dst)
		seen := map[uint64]bool{}
		for _, x := range dst {
			if x >= 20 || seen[x] {
				t.Fatalf("random %v (SEED=%d)", dst, seed)
			}
			seen[x] = true
		}
	}
	ChoosePlayers(r, 7, MembersContiguous, dst)
	if dst[0] != 0 || dst[6] != 6 {
		t.Errorf("all 7 of 7: %v", dst)
	}
}

func TestGroupsWorkloadValidate(t *testing.T) {
	w := GroupsWorkload{Players: 1, GroupSize: 1, Members: "sorted", OpsPerGroup: -1, Think: -time.Second, Mode: "loose"}
	err := w.Validate()
	if !errors.Is(err, ErrInvalidOptions) {
		t.Fatalf("Validate = %v, want ErrInvalidOptions", err)
	}
	for _, want := range []string{"players 1", "group size 1", `members "sorted"`, "operations per group -1", "think time -1s", `mode "loose"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%v does not mention %s", err, want)
		}
	}
	w = GroupsWorkload{}
	w.EnsureDefaults()
	if err := w.Validate(); err != nil || w.Players != 1_000_000 || w.GroupSize != 10 || w.GroupSizeStddev != 2.5 ||
		w.Members != MembersContiguous || w.OpsPerGroup != 50 || w.Think != 0 || w.Mode != GroupsModeGrouped {
		t.Errorf("defaults %+v: %v", w, err)
	}
}

// TestGroupsEmbedded plays the groups workload for about a second in each
// mode on a groupkv node in this process, with small games on few players
// so that creations are refused, and checks the store afterwards: no group
// is left, and the players' move counters add up to the moves applied (no
// group write was lost, in the group or when it was given back).
func TestGroupsEmbedded(t *testing.T) {
	if testing.Short() {
		t.Skip("opens a node")
	}
	d, err := OpenGroupKVGroupsEmbedded(context.Background(), filepath.Join(t.TempDir(), "node"), DriverOptions{Table: "players", Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	groupsCheck(t, d)
}

// TestGroupsGRPC plays the groups workload as TestGroupsEmbedded does,
// through the driver OpenGroupKVGroups connects to a node in this process
// behind the real gRPC server: the groups, their transactions and the
// plain gets and puts all go over gRPC.
func TestGroupsGRPC(t *testing.T) {
	if testing.Short() {
		t.Skip("opens a node")
	}
	d, err := OpenGroupKVGroups(context.Background(), serveNodeGRPC(t), DriverOptions{Table: "players", Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	groupsCheck(t, d)
}

// serveNodeGRPC opens a groupkv node in this process, serves its gRPC
// service on a port of 127.0.0.1 until the test ends, and answers the
// address.
func serveNodeGRPC(t *testing.T) string {
	t.Helper()
	n, err := node.Open(node.Options{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := n.WaitReady(ctx); err != nil {
		n.Close()
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		n.Close()
		t.Fatal(err)
	}
	srv := api.NewGRPCServer(n)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
		n.Close()
	})
	return lis.Addr().String()
}

// groupsCheck plays the groups workload on d; see TestGroupsEmbedded.
func groupsCheck(t *testing.T, d *GroupKVGroups) {
	t.Helper()
	ctx := context.Background()
	r, err := NewGroupsRunner(d, Options{Clients: 6, Duration: time.Second, Warmup: 200 * time.Millisecond, Seed: 5, Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	w := GroupsWorkload{Players: 60, GroupSize: 6, OpsPerGroup: 5, Think: time.Millisecond}
	if _, err := r.Load(ctx, w); err != nil {
		t.Fatal(err)
	}
	var applied int64
	for _, mode := range []string{GroupsModeGrouped, GroupsModeUngrouped} {
		w.Mode = mode
		res, err := r.Run(ctx, w)
		if err != nil {
			t.Fatal(err)
		}
		var sum bytes.Buffer
		if err := WriteGroupsSummary(&sum, res); err != nil {
			t.Fatal(err)
		}
		t.Logf("\n%s", sum.String())
		g := res.Groups
		if res.Errors != 0 || g == nil || g.Games == 0 || res.Latency[GroupsOpMove].Count == 0 {
			t.Fatalf("%s: %d errors %v, stats %+v", mode, res.Errors, res.ErrorSamples, g)
		}
		if g.MeanMembers < 2 || res.Latency[GroupsOpAmortized].Count != g.Games {
			t.Errorf("%s: %d games of %.1f members, %d amortized latencies", mode, g.Games, g.MeanMembers, res.Latency[GroupsOpAmortized].Count)
		}
		if mode == GroupsModeGrouped {
			if c := res.Latency[GroupsOpCreate].Count; c != g.Games || res.Latency[GroupsOpDelete].Count != c {
				t.Errorf("%d games, %d creates, %d deletes", g.Games, c, res.Latency[GroupsOpDelete].Count)
			}
			if g.Refused == 0 {
				t.Errorf("6 clients taking 6 of 60 players: no creation refused")
			}
			ids, err := d.Groups(ctx)
			if err != nil || len(ids) != 0 {
				t.Fatalf("groups left after the run: %v, %v", ids, err)
			}
			infos, err := d.dbs[0].ListGroups(ctx)
			if err != nil || len(infos) != 0 {
				t.Fatalf("ListGroups after the run: %v, %v", infos, err)
			}
			if got := countMoves(t, d); got != g.Applied {
				t.Fatalf("the players' counters add up to %d moves; %d were applied", got, g.Applied)
			}
			applied = g.Applied
		} else if res.Latency[GroupsOpCreate].Count != 0 || g.Refused != 0 {
			t.Errorf("ungrouped: %d creates, %d refused", res.Latency[GroupsOpCreate].Count, g.Refused)
		} else if got := countMoves(t, d); got <= applied || got > applied+g.Applied {
			// Plain read-modify-writes may lose updates to each other.
			t.Errorf("after the ungrouped run the counters add up to %d moves; %d + at most %d were applied", got, applied, g.Applied)
		}
	}
}

// countMoves adds up the move counters of every player of d's collection.
func countMoves(t *testing.T, d *GroupKVGroups) int64 {
	t.Helper()
	res, err := d.dbs[0].Scan(context.Background(), groupkv.ScanRequest{Collection: d.opts.Table, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, it := range res.Items {
		m, err := PlayerMoves(it.Value)
		if err != nil {
			t.Fatalf("player %s: %v", it.Key, err)
		}
		n += m
	}
	return n
}

func TestGroupsOverheads(t *testing.T) {
	run := func(clients int, mode string, meanUs, p50Us float64) Result {
		return Result{System: "groupkv", Workload: GroupsWorkloadName, Groups: &GroupsStats{Games: 10},
			Params: Params{Records: 1000, Clients: clients, GroupMode: mode, GroupSize: 10, GroupMembers: MembersContiguous, OpsPerGroup: 50, ThinkMs: 10},
			Latency: map[string]Latency{
				GroupsOpAmortized: {Count: 10, MeanUs: meanUs, P50Us: p50Us},
				GroupsOpMove:      {Count: 500, MeanUs: meanUs, P50Us: p50Us},
			}}
	}
	rs := []Result{
		run(4, GroupsModeGrouped, 1000, 1000), run(4, GroupsModeUngrouped, 500, 500), // superseded below
		run(1, GroupsModeGrouped, 1050, 1080), run(1, GroupsModeUngrouped, 1000, 1000),
		run(4, GroupsModeGrouped, 1050, 2000), run(4, GroupsModeUngrouped, 1000, 1000),
		run(16, GroupsModeGrouped, 3000, 3000),
	}
	os := GroupsOverheads(rs)
	if len(os) != 2 || os[0].Clients != 1 || os[1].Clients != 4 {
		t.Fatalf("overheads %+v", os)
	}
	if o := os[0]; o.Ratio != 1.05 || o.P50Ratio != 1.08 || !o.GoalApplies || !o.Met {
		t.Errorf("1 client: %+v", o)
	}
	if o := os[1]; o.Ratio != 1.05 || o.P50Ratio != 2 || o.Met {
		t.Errorf("4 clients: %+v", o)
	}
	var b bytes.Buffer
	if err := WriteGroupsMarkdown(&b, rs); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| 16 | grouped |", "| groupkv | 1000 | 50 | 1 | 1.05 | 1.00 | 1.05× | 1.08× | 1.05× | yes |",
		"| 4 | 1.05 | 1.00 | 1.05× | 2.00× | 1.05× | no: the means' ratio is within it, the medians' is not |"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
	if err := WriteGroupsMarkdown(&b, nil); !errors.Is(err, ErrNoResults) {
		t.Errorf("no results: %v", err)
	}
}

// TestGroupsOverheadsRounds: runs in rounds give, per client count, the
// median of the rounds' figures, each round's ratio in round order, and
// the errors of every round.
func TestGroupsOverheadsRounds(t *testing.T) {
	run := func(round int, mode string, meanUs, p50Us float64, errs int64) Result {
		return Result{System: "groupkv", Workload: GroupsWorkloadName, Groups: &GroupsStats{Games: 10}, Errors: errs,
			Params: Params{Records: 1000, Clients: 4, GroupMode: mode, GroupSize: 10, GroupMembers: MembersContiguous, OpsPerGroup: 50, ThinkMs: 10, Round: round},
			Latency: map[string]Latency{
				GroupsOpAmortized: {Count: 10, MeanUs: meanUs, P50Us: p50Us},
				GroupsOpMove:      {Count: 500, MeanUs: meanUs, P50Us: p50Us},
			}}
	}
	g, u := GroupsModeGrouped, GroupsModeUngrouped
	rs := []Result{
		run(1, g, 1050, 1000, 0), run(1, u, 1000, 1000, 0),
		run(2, u, 1000, 1000, 1), run(2, g, 3000, 3000, 0), // a stall
		run(3, g, 1000, 1080, 0), run(3, u, 1000, 1000, 0),
	}
	os := GroupsOverheads(rs)
	if len(os) != 1 {
		t.Fatalf("overheads %+v", os)
	}
	o := os[0]
	if o.Ratio != 1.05 || o.P50Ratio != 1.08 || o.GroupedUs != 1050 || o.UngroupedUs != 1000 || !o.Met {
		t.Errorf("median of the rounds: %+v", o)
	}
	if !slices.Equal(o.Rounds, []float64{1.05, 3, 1}) || o.UngroupedErrors != 1 || o.GroupedErrors != 0 {
		t.Errorf("rounds %v, errors %d/%d", o.Rounds, o.GroupedErrors, o.UngroupedErrors)
	}
	// A grouped error in any round fails the goal.
	rs[4].Errors = 2
	if o := GroupsOverheads(rs)[0]; o.Met || o.GroupedErrors != 2 {
		t.Errorf("with a grouped error: %+v", o)
	}
	var b bytes.Buffer
	if err := WriteGroupsMarkdown(&b, rs); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| 4 | grouped, round 2 |", "| 3: 1.05×, 3.00×, 1.00× |"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
}
