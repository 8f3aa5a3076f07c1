package bench

import (
	"fmt"
	"io"
	"sort"
	"strings"
)

// GroupsOverheadGoal is groupkv's goal for the groups workload: with games
// of GroupsGoalMinOps moves or more, the mean latency per operation of
// grouped games, their creation and deletion amortized, is at most this
// many times that of the same games ungrouped. (G-Store measured 10–30%.)
const GroupsOverheadGoal = 1.10

// GroupsGoalMinOps is the least moves per game the goal applies to.
const GroupsGoalMinOps = 50

// SplitGroupsResults separates the groups workload's results from the
// others.
func SplitGroupsResults(rs []Result) (groups, other []Result) {
	for _, r := range rs {
		if r.Workload == GroupsWorkloadName {
			groups = append(groups, r)
		} else {
			other = append(other, r)
		}
	}
	return groups, other
}

// describeGroups describes the games of a groups result in words.
func describeGroups(p Params) string {
	think := "no think time"
	if p.ThinkMs > 0 {
		think = fmt.Sprintf("think time %g–%g ms", p.ThinkMs, 2*p.ThinkMs)
	}
	return fmt.Sprintf("%d players, games of %d±%g %s players, %d moves each, %s",
		p.Records, p.GroupSize, p.GroupSizeStddev, p.GroupMembers, p.OpsPerGroup, think)
}

// WriteGroupsSummary prints a groups result: its games, its summary table
// (latencies of create, move, delete and amortized; "all" is a whole game,
// think times included) and its rates.
func WriteGroupsSummary(w io.Writer, res Result) error {
	fmt.Fprintf(w, "groups workload, mode %s: %s\n", res.Params.GroupMode, describeGroups(res.Params))
	if err := WriteSummary(w, res); err != nil {
		return err
	}
	if g := res.Groups; g != nil {
		fmt.Fprintf(w, "  games: %d (%.1f/s), %.1f players on average; creations refused: %d; moves: %.0f/s\n",
			g.Games, g.CreatesPerSec, g.MeanMembers, g.Refused, g.MovesPerSec)
	}
	_, err := fmt.Fprintln(w)
	return err
}

// groupsConfig is what makes two groups runs comparable: the system and
// the games (not the clients or the mode).
type groupsConfig struct {
	system, members    string
	players, size, ops int
	stddev, thinkMs    float64
}

// less orders configurations: by system (Targets' order first), then
// players, members, size, moves and think time.
func (a groupsConfig) less(b groupsConfig) bool {
	switch {
	case a.system != b.system:
		if ra, rb := systemRank(a.system), systemRank(b.system); ra != rb {
			return ra < rb
		}
		return a.system < b.system
	case a.players != b.players:
		return a.players > b.players
	case a.members != b.members:
		return a.members < b.members
	case a.size != b.size:
		return a.size < b.size
	case a.stddev != b.stddev:
		return a.stddev < b.stddev
	case a.ops != b.ops:
		return a.ops < b.ops
	}
	return a.thinkMs < b.thinkMs
}

type groupsCell struct {
	cfg     groupsConfig
	clients int
	round   int
	mode    string
}

func groupsCellOf(r Result) groupsCell {
	p := r.Params
	return groupsCell{
		cfg:     groupsConfig{r.System, p.GroupMembers, p.Records, p.GroupSize, p.OpsPerGroup, p.GroupSizeStddev, p.ThinkMs},
		clients: p.Clients,
		round:   p.Round,
		mode:    p.GroupMode,
	}
}

// latestGroups keeps the last groups result of each configuration, client
// count, round and mode.
func latestGroups(rs []Result) map[groupsCell]Result {
	out := map[groupsCell]Result{}
	for _, r := range rs {
		if r.Workload == GroupsWorkloadName {
			out[groupsCellOf(r)] = r
		}
	}
	return out
}

// GroupsOverhead is the price of groups at one configuration and client
// count: the mean latencies per operation of its grouped and ungrouped
// runs, with (Amortized) and without (Move) the creations and deletions.
type GroupsOverhead struct {
	config                          groupsConfig
	round                           int
	System, Members                 string
	Players, GroupSize, OpsPerGroup int
	ThinkMs                         float64
	Clients                         int
	// The mean amortized latencies and their ratio, and the ratio of the
	// medians.
	GroupedUs, UngroupedUs, Ratio  float64
	P50Ratio                       float64
	GroupedMoveUs, UngroupedMoveUs float64
	MoveRatio                      float64
	GroupedErrors, UngroupedErrors int64
	// Rounds are the ratios of the means of each round, in round order,
	// when the modes ran in rounds (--rounds): the latencies and ratios
	// above are then the medians of the rounds', and the errors their
	// sums. A round's two runs are close in time, so the machine's load
	// moves them alike; the median leaves out a round that met a stall.
	Rounds []float64
	// GoalApplies when OpsPerGroup >= GroupsGoalMinOps; Met when it
	// applies, both Ratio and P50Ratio are at most GroupsOverheadGoal (a
	// mean alone is moved by a few stalls of either run: the medians
	// confirm it) and the grouped run had no error.
	GoalApplies, Met bool
}

// GroupsOverheads answers the overhead of every configuration and client
// count of rs that has both a grouped and an ungrouped run (in a round,
// when they ran in rounds), ordered by configuration then clients.
func GroupsOverheads(rs []Result) []GroupsOverhead {
	cells := latestGroups(rs)
	type key struct {
		cfg     groupsConfig
		clients int
	}
	rounds := map[key][]GroupsOverhead{}
	for c, g := range cells {
		if c.mode != GroupsModeGrouped {
			continue
		}
		u, ok := cells[groupsCell{c.cfg, c.clients, c.round, GroupsModeUngrouped}]
		if !ok {
			continue
		}
		if o, ok := groupsOverhead(c, g, u); ok {
			k := key{c.cfg, c.clients}
			rounds[k] = append(rounds[k], o)
		}
	}
	var out []GroupsOverhead
	for _, os := range rounds {
		out = append(out, medianOverhead(os))
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.config != b.config {
			return a.config.less(b.config)
		}
		return a.Clients < b.Clients
	})
	return out
}

// groupsOverhead is the overhead of one grouped run g over its ungrouped
// run u, of cell c.
func groupsOverhead(c groupsCell, g, u Result) (GroupsOverhead, bool) {
	ga, ua := g.Latency[GroupsOpAmortized], u.Latency[GroupsOpAmortized]
	gm, um := g.Latency[GroupsOpMove], u.Latency[GroupsOpMove]
	if ga.Count == 0 || ua.Count == 0 {
		return GroupsOverhead{}, false
	}
	o := GroupsOverhead{
		config: c.cfg, round: c.round,
		System: c.cfg.system, Members: c.cfg.members, Players: c.cfg.players, GroupSize: c.cfg.size,
		OpsPerGroup: c.cfg.ops, ThinkMs: c.cfg.thinkMs, Clients: c.clients,
		GroupedUs: ga.MeanUs, UngroupedUs: ua.MeanUs, Ratio: ga.MeanUs / ua.MeanUs,
		GroupedMoveUs: gm.MeanUs, UngroupedMoveUs: um.MeanUs,
		GroupedErrors: g.Errors, UngroupedErrors: u.Errors,
		GoalApplies: c.cfg.ops >= GroupsGoalMinOps,
	}
	if um.MeanUs > 0 {
		o.MoveRatio = gm.MeanUs / um.MeanUs
	}
	if ua.P50Us > 0 {
		o.P50Ratio = ga.P50Us / ua.P50Us
	}
	if c.round > 0 {
		o.Rounds = []float64{o.Ratio}
	}
	o.Met = o.GoalApplies && o.Ratio <= GroupsOverheadGoal && o.P50Ratio <= GroupsOverheadGoal && g.Errors == 0
	return o, true
}

// medianOverhead combines the overheads of the rounds of one
// configuration and client count (each with one entry in Rounds): the
// medians of their latencies and ratios, the sums of their errors.
func medianOverhead(os []GroupsOverhead) GroupsOverhead {
	if len(os) == 1 {
		return os[0]
	}
	sort.Slice(os, func(i, j int) bool { return os[i].round < os[j].round })
	o := os[0]
	med := func(f func(GroupsOverhead) float64) float64 {
		vs := make([]float64, len(os))
		for i, x := range os {
			vs[i] = f(x)
		}
		return median(vs)
	}
	o.GroupedUs = med(func(x GroupsOverhead) float64 { return x.GroupedUs })
	o.UngroupedUs = med(func(x GroupsOverhead) float64 { return x.UngroupedUs })
	o.Ratio = med(func(x GroupsOverhead) float64 { return x.Ratio })
	o.P50Ratio = med(func(x GroupsOverhead) float64 { return x.P50Ratio })
	o.GroupedMoveUs = med(func(x GroupsOverhead) float64 { return x.GroupedMoveUs })
	o.UngroupedMoveUs = med(func(x GroupsOverhead) float64 { return x.UngroupedMoveUs })
	o.MoveRatio = med(func(x GroupsOverhead) float64 { return x.MoveRatio })
	o.Rounds, o.GroupedErrors, o.UngroupedErrors = nil, 0, 0
	for _, x := range os {
		o.Rounds = append(o.Rounds, x.Ratio)
		o.GroupedErrors += x.GroupedErrors
		o.UngroupedErrors += x.UngroupedErrors
	}
	o.Met = o.GoalApplies && o.Ratio <= GroupsOverheadGoal && o.P50Ratio <= GroupsOverheadGoal && o.GroupedErrors == 0
	return o
}

// median answers the median of vs (the mean of the middle two for an even
// count), which it sorts.
func median(vs []float64) float64 {
	sort.Float64s(vs)
	n := len(vs)
	if n%2 == 1 {
		return vs[n/2]
	}
	return (vs[n/2-1] + vs[n/2]) / 2
}

// WriteGroupsMarkdown writes Markdown tables of the groups workload's
// results in rs (the last of each configuration, client count and mode):
// per run, the creations, moves, deletions and amortized latencies; then
// per client count the overhead of groups, grouped/ungrouped, against
// GroupsOverheadGoal.
func WriteGroupsMarkdown(w io.Writer, rs []Result) error {
	cells := latestGroups(rs)
	if len(cells) == 0 {
		return ErrNoResults
	}
	var order []groupsCell
	for c := range cells {
		order = append(order, c)
	}
	sort.Slice(order, func(i, j int) bool {
		a, b := order[i], order[j]
		if a.cfg != b.cfg {
			return a.cfg.less(b.cfg)
		}
		if a.clients != b.clients {
			return a.clients < b.clients
		}
		if a.round != b.round {
			return a.round < b.round
		}
		return a.mode < b.mode // grouped before ungrouped
	})

	var b strings.Builder
	var last *groupsConfig
	for _, c := range order {
		r := cells[c]
		if last == nil || c.cfg != *last {
			if last != nil {
				b.WriteString("\n")
			}
			last = &c.cfg
			fmt.Fprintf(&b, "%s (%s), latencies in ms; \"amortized\" is the time a game spent in the store (creation, moves, deletion, no think time) over its moves + 2:\n\n",
				c.cfg.system, describeGroups(r.Params))
			b.WriteString("| clients | mode | creates/s | create p50 | create p99 | moves/s | move p50 | move p99 | amortized p50 | amortized p99 | amortized mean | delete p50 | delete p99 | refused | errors |\n")
			b.WriteString("|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
		}
		g := r.Groups
		if g == nil {
			g = &GroupsStats{}
		}
		cr, mv, am, de := r.Latency[GroupsOpCreate], r.Latency[GroupsOpMove], r.Latency[GroupsOpAmortized], r.Latency[GroupsOpDelete]
		lat := func(l Latency, us float64) string {
			if l.Count == 0 {
				return "–"
			}
			return ms(us)
		}
		mode := c.mode
		if c.round > 0 {
			mode = fmt.Sprintf("%s, round %d", c.mode, c.round)
		}
		fmt.Fprintf(&b, "| %d | %s | %.1f | %s | %s | %.0f | %s | %s | %s | %s | %s | %s | %s | %d | %d |\n",
			c.clients, mode, g.CreatesPerSec, lat(cr, cr.P50Us), lat(cr, cr.P99Us), g.MovesPerSec,
			lat(mv, mv.P50Us), lat(mv, mv.P99Us), lat(am, am.P50Us), lat(am, am.P99Us), lat(am, am.MeanUs),
			lat(de, de.P50Us), lat(de, de.P99Us), g.Refused, r.Errors)
	}

	if os := GroupsOverheads(rs); len(os) > 0 {
		fmt.Fprintf(&b, "\nOverhead of groups: mean latency per operation grouped / ungrouped, the creation and deletion amortized over the game (the goal: at most %.2f× with %d moves or more per game, the medians' ratio too), the same of the medians, and of the moves alone (mean); where the modes ran in rounds, alternating, each figure is the median of the rounds' and the last column gives each round's ratio of the means:\n\n",
			GroupsOverheadGoal, GroupsGoalMinOps)
		b.WriteString("| system | players | moves/game | clients | grouped ms/op | ungrouped ms/op | grouped / ungrouped | medians: grouped / ungrouped | moves alone: grouped / ungrouped | goal met | rounds |\n")
		b.WriteString("|---|--:|--:|--:|--:|--:|--:|--:|--:|---|---|\n")
		for _, o := range os {
			met := "n/a (fewer moves)"
			switch {
			case !o.GoalApplies:
			case o.Met:
				met = "yes"
			case o.Ratio <= GroupsOverheadGoal && o.GroupedErrors == 0:
				met = "no: the means' ratio is within it, the medians' is not"
			default:
				met = "no"
			}
			rounds := "1"
			if len(o.Rounds) > 1 {
				rs := make([]string, len(o.Rounds))
				for i, r := range o.Rounds {
					rs[i] = fmt.Sprintf("%.2f×", r)
				}
				rounds = fmt.Sprintf("%d: %s", len(o.Rounds), strings.Join(rs, ", "))
			}
			fmt.Fprintf(&b, "| %s | %d | %d | %d | %s | %s | %.2f× | %.2f× | %.2f× | %s | %s |\n",
				o.System, o.Players, o.OpsPerGroup, o.Clients, ms(o.GroupedUs), ms(o.UngroupedUs), o.Ratio, o.P50Ratio, o.MoveRatio, met, rounds)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
