package bench

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
)

// workloadRank orders workloads: the core ones a to f, then the others
// (timelines) by name.
func workloadRank(name string) int {
	for i, w := range Workloads {
		if w.Name == name {
			return i
		}
	}
	return len(Workloads)
}

// systemRank orders systems: Targets first, then the others by name.
func systemRank(name string) int {
	for i, t := range Targets {
		if t == name {
			return i
		}
	}
	return len(Targets)
}

func sortResults(rs []Result) {
	sort.SliceStable(rs, func(i, j int) bool {
		a, b := rs[i], rs[j]
		if ra, rb := workloadRank(a.Workload), workloadRank(b.Workload); ra != rb {
			return ra < rb
		}
		if a.Workload != b.Workload {
			return a.Workload < b.Workload
		}
		if ra, rb := systemRank(a.System), systemRank(b.System); ra != rb {
			return ra < rb
		}
		if a.System != b.System {
			return a.System < b.System
		}
		return a.Params.Round < b.Params.Round
	})
}

// workloadsOf and systemsOf list the workloads and systems of rs in order.
func workloadsOf(rs []Result) []string {
	var out []string
	for _, r := range rs {
		if !contains(out, r.Workload) {
			out = append(out, r.Workload)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if ri, rj := workloadRank(out[i]), workloadRank(out[j]); ri != rj {
			return ri < rj
		}
		return out[i] < out[j]
	})
	return out
}

func systemsOf(rs []Result) []string {
	var out []string
	for _, r := range rs {
		if !contains(out, r.System) {
			out = append(out, r.System)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if ri, rj := systemRank(out[i]), systemRank(out[j]); ri != rj {
			return ri < rj
		}
		return out[i] < out[j]
	})
	return out
}

// find returns the result of system and workload in rs (of its last round).
func find(rs []Result, system, workload string) (Result, bool) {
	var found Result
	ok := false
	for _, r := range rs {
		if r.System == system && r.Workload == workload {
			found, ok = r, true
		}
	}
	return found, ok
}

// roundsOf returns the rounds of rs for system and workload, by round.
func roundsOf(rs []Result, system, workload string) map[int]Result {
	out := map[int]Result{}
	for _, r := range rs {
		if r.System == system && r.Workload == workload {
			out[r.Params.Round] = r
		}
	}
	return out
}

// hasRounds reports whether rs holds results of numbered rounds.
func hasRounds(rs []Result) bool {
	for _, r := range rs {
		if r.Params.Round > 0 {
			return true
		}
	}
	return false
}

// roundRatios are the ratios f(a)/f(b) of the rounds that both a and b
// ran, in round order.
func roundRatios(a, b map[int]Result, f func(Result) float64) []float64 {
	var rounds []int
	for n := range a {
		if _, ok := b[n]; ok {
			rounds = append(rounds, n)
		}
	}
	sort.Ints(rounds)
	var out []float64
	for _, n := range rounds {
		if d := f(b[n]); d > 0 {
			out = append(out, f(a[n])/d)
		}
	}
	return out
}

// medianOf returns the median of xs, which it leaves in their order; 0
// for none.
func medianOf(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	return median(append([]float64(nil), xs...))
}

// ratioCell formats the median of a set of rounds' ratios followed by
// each round's, or the one ratio of a single run.
func ratioCell(xs []float64) string {
	switch len(xs) {
	case 0:
		return "–"
	case 1:
		return fmt.Sprintf("%.2f", xs[0])
	}
	each := make([]string, len(xs))
	for i, x := range xs {
		each[i] = fmt.Sprintf("%.2f", x)
	}
	return fmt.Sprintf("%.2f (%s)", medianOf(xs), strings.Join(each, ", "))
}

func opsPerSec(r Result) float64 { return r.OpsPerSec }
func p99All(r Result) float64    { return r.Latency[AllOps].P99Us }

// cpuCell formats a CPU time per operation in µs; "–" when unknown.
func cpuCell(us float64) string {
	switch {
	case us <= 0:
		return "–"
	case us >= 100:
		return fmt.Sprintf("%.0f", us)
	default:
		return fmt.Sprintf("%.1f", us)
	}
}

// cpuSummary describes res's CPU figures in a line ("" when it has none).
func cpuSummary(res Result) string {
	var parts []string
	if res.ServerCPUSeconds > 0 && res.Seconds > 0 {
		parts = append(parts, fmt.Sprintf("server %s µs/op (%.2f cores)", cpuCell(res.ServerCPUPerOp()), res.ServerCPUSeconds/res.Seconds))
	}
	if res.ClientCPUSeconds > 0 && res.Seconds > 0 {
		client := fmt.Sprintf("benchmark client %s µs/op (%.2f cores", cpuCell(res.ClientCPUPerOp()), res.ClientCPUSeconds/res.Seconds)
		if res.ClientSchedP99Us > 0 {
			client += fmt.Sprintf("; its goroutines' wait to run, p99 %s ms", ms(res.ClientSchedP99Us))
		}
		parts = append(parts, client+")")
	}
	return strings.Join(parts, ", ")
}

func ms(us float64) string {
	switch {
	case us >= 100_000:
		return fmt.Sprintf("%.0f", us/1000)
	case us >= 10_000:
		return fmt.Sprintf("%.1f", us/1000)
	default:
		return fmt.Sprintf("%.2f", us/1000)
	}
}

// WriteSummary writes res as a small text table: one line per operation,
// latencies in milliseconds.
func WriteSummary(w io.Writer, res Result) error {
	p := res.Params
	fmt.Fprintf(w, "%s %s  workload %s  %d clients  %.0fs (warm-up %.0fs)  %s  %d records of %d B\n",
		res.System, res.Version, res.Workload, p.Clients, p.DurationSeconds, p.WarmupSeconds, p.Distribution, p.Records, p.ValueSize)
	if res.Load != nil {
		fmt.Fprintf(w, "  load: %d records in %.1fs (%.0f records/s)\n", res.Load.Records, res.Load.Seconds, res.Load.RecordsPer)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "  op\tcount\terrors\tops/s\tmean ms\tp50 ms\tp99 ms\tp99.9 ms\tmax ms\t")
	for _, name := range sortedOps(res) {
		l := res.Latency[name]
		rate := ""
		if res.Seconds > 0 {
			rate = fmt.Sprintf("%.0f", float64(l.Count)/res.Seconds)
		}
		fmt.Fprintf(tw, "  %s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t\n", name, l.Count, l.Errors, rate, ms(l.MeanUs), ms(l.P50Us), ms(l.P99Us), ms(l.P999Us), ms(l.MaxUs))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if c := cpuSummary(res); c != "" {
		fmt.Fprintf(w, "  CPU over the measured time: %s\n", c)
	}
	if len(res.Windows) > 0 {
		fmt.Fprintf(w, "  slowest windows of %s: %s\n", windowLength(res.Windows), slowestWindows(res.Windows, 5))
	}
	for _, s := range res.ErrorSamples {
		fmt.Fprintf(w, "  error: %s\n", s)
	}
	return nil
}

// windowLength is the length of ws's windows, from their starts.
func windowLength(ws []Window) string {
	if len(ws) < 2 {
		return "the run"
	}
	return fmt.Sprintf("%gms", ws[1].StartMs-ws[0].StartMs)
}

// slowestWindows describes the n windows of ws with the slowest
// operations, slowest first: when each started (seconds into the
// measured time), its slowest operation and its operations.
func slowestWindows(ws []Window, n int) string {
	order := make([]int, len(ws))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return ws[order[a]].MaxMs > ws[order[b]].MaxMs })
	var parts []string
	for _, i := range order[:min(n, len(order))] {
		parts = append(parts, fmt.Sprintf("%.2fs max %s ms (%d ops)", ws[i].StartMs/1000, ms(ws[i].MaxMs*1000), ws[i].Ops))
	}
	return strings.Join(parts, ", ")
}

// WriteMarkdown writes Markdown tables of rs (the latest result of each
// system and workload): throughput and latency of every run, each
// operation's latencies, and the ratios of baseline (e.g. "groupkv") to
// every other system: throughput baseline/peer (above 1: the baseline is
// faster) and p99 latency baseline/peer (below 1: the baseline is faster).
func WriteMarkdown(w io.Writer, rs []Result, baseline string) error {
	rs = LatestResults(rs)
	if len(rs) == 0 {
		return ErrNoResults
	}
	rounds := hasRounds(rs)
	// roundCol is the round column's cell of r, when rs has rounds.
	roundCol := func(r Result) string {
		if !rounds {
			return ""
		}
		return fmt.Sprintf(" %d |", r.Params.Round)
	}
	var b strings.Builder
	writeHeader(&b, rounds, 3, "workload", "system", "version", "ops/s>", "p50 ms>", "p99 ms>", "p99.9 ms>", "server CPU µs/op>", "client CPU µs/op>", "errors>")
	for _, r := range rs {
		l := r.Latency[AllOps]
		fmt.Fprintf(&b, "| %s | %s | %s |%s %.0f | %s | %s | %s | %s | %s | %d |\n",
			r.Workload, r.System, r.Version, roundCol(r), r.OpsPerSec, ms(l.P50Us), ms(l.P99Us), ms(l.P999Us), cpuCell(r.ServerCPUPerOp()), cpuCell(r.ClientCPUPerOp()), r.Errors)
	}

	systems, workloads := systemsOf(rs), workloadsOf(rs)
	var peers []string
	for _, s := range systems {
		if s != baseline {
			peers = append(peers, s)
		}
	}
	if contains(systems, baseline) && len(peers) > 0 {
		fmt.Fprintf(&b, "\nRatios %s/peer: throughput (above 1: %s is faster) and p99 latency (below 1: %s is faster).", baseline, baseline, baseline)
		if rounds {
			b.WriteString(" Each cell is the median of the rounds' ratios (each round's systems ran one after the other), then every round's in round order.")
		}
		b.WriteString("\n\n")
		b.WriteString("| workload |")
		for _, p := range peers {
			fmt.Fprintf(&b, " ops/s %s/%s | p99 %s/%s |", baseline, p, baseline, p)
		}
		b.WriteString("\n|---|")
		b.WriteString(strings.Repeat("--:|--:|", len(peers)))
		b.WriteString("\n")
		for _, wl := range workloads {
			base := roundsOf(rs, baseline, wl)
			if len(base) == 0 {
				continue
			}
			var row strings.Builder
			have := false
			for _, p := range peers {
				tput := roundRatios(base, roundsOf(rs, p, wl), opsPerSec)
				if len(tput) == 0 {
					row.WriteString(" – | – |")
					continue
				}
				have = true
				fmt.Fprintf(&row, " %s | %s |", ratioCell(tput), ratioCell(roundRatios(base, roundsOf(rs, p, wl), p99All)))
			}
			if have {
				fmt.Fprintf(&b, "| %s |%s\n", wl, row.String())
			}
		}
	}

	if baseline == "groupkv" && contains(peers, "etcd") && contains(peers, "redis") {
		writePeerGoals(&b, rs)
	}

	b.WriteString("\nPer operation (latencies in ms):\n\n")
	writeHeader(&b, rounds, 2, "workload", "system", "op", "count>", "ops/s>", "mean>", "p50>", "p99>", "p99.9>", "max>", "errors>")
	for _, r := range rs {
		for _, name := range sortedOps(r) {
			if name == AllOps {
				continue
			}
			l := r.Latency[name]
			rate := 0.0
			if r.Seconds > 0 {
				rate = float64(l.Count) / r.Seconds
			}
			fmt.Fprintf(&b, "| %s | %s |%s %s | %d | %.0f | %s | %s | %s | %s | %s | %d |\n",
				r.Workload, r.System, roundCol(r), name, l.Count, rate, ms(l.MeanUs), ms(l.P50Us), ms(l.P99Us), ms(l.P999Us), ms(l.MaxUs), l.Errors)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeHeader writes a Markdown table's header of cols, a column whose name
// ends in ">" aligned right; with rounds, a "round" column goes after the
// first at of them.
func writeHeader(b *strings.Builder, rounds bool, at int, cols ...string) {
	if rounds {
		cols = append(cols[:at:at], append([]string{"round>"}, cols[at:]...)...)
	}
	var names, aligns strings.Builder
	for _, c := range cols {
		name, right := strings.CutSuffix(c, ">")
		names.WriteString("| " + name + " ")
		if right {
			aligns.WriteString("|--:")
		} else {
			aligns.WriteString("|---")
		}
	}
	b.WriteString(names.String() + "|\n" + aligns.String() + "|\n")
}

func ratio(a, b float64) string {
	if b == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", a/b)
}

// peerGoal is one of groupkv's goals against etcd and Redis: the ratio
// groupkv/peer of a figure on a workload, and the bound it must meet.
type peerGoal struct {
	what     string
	workload string
	ratios   []float64 // one per round
	atLeast  bool      // the ratio must be at least bound (else at most)
	bound    float64
}

// writePeerGoals writes the table of groupkv's goals against its peers
// (2 cores, 64 clients, durable writes, 100-byte values): put throughput
// (workload A, half updates) at least 3× etcd's and at least Redis's; get
// throughput (B and C) at least 2× etcd's and half Redis's; p99 latency on
// each workload no worse than the better peer's. A goal is read on the
// median of the rounds' ratios, and the table says in how many rounds it
// held.
func writePeerGoals(b *strings.Builder, rs []Result) {
	var goals []peerGoal
	add := func(what, wl, peer string, f func(Result) float64, atLeast bool, bound float64) {
		g := roundsOf(rs, "groupkv", wl)
		p := roundsOf(rs, peer, wl)
		if len(g) == 0 || len(p) == 0 {
			return
		}
		goals = append(goals, peerGoal{what: what, workload: wl, ratios: roundRatios(g, p, f), atLeast: atLeast, bound: bound})
	}
	add("put throughput ≥ 3× etcd's", "a", "etcd", opsPerSec, true, 3)
	add("put throughput ≥ Redis's", "a", "redis", opsPerSec, true, 1)
	for _, wl := range []string{"b", "c"} {
		add("get throughput ≥ 2× etcd's", wl, "etcd", opsPerSec, true, 2)
		add("get throughput ≥ ½ Redis's", wl, "redis", opsPerSec, true, 0.5)
	}
	for _, wl := range workloadsOf(rs) {
		g := roundsOf(rs, "groupkv", wl)
		e, r := roundsOf(rs, "etcd", wl), roundsOf(rs, "redis", wl)
		if len(g) == 0 || len(e) == 0 || len(r) == 0 {
			continue
		}
		// The better peer of each round: the lower p99.
		better := map[int]Result{}
		for n, er := range e {
			if rr, ok := r[n]; ok {
				if p99All(rr) < p99All(er) {
					er = rr
				}
				better[n] = er
			}
		}
		goals = append(goals, peerGoal{what: "p99 ≤ the better peer's", workload: wl, ratios: roundRatios(g, better, p99All), bound: 1})
	}
	if len(goals) == 0 {
		return
	}
	b.WriteString("\nGoals (2 cores, 64 clients, durable writes, 100-byte values; puts are workload A's, gets B's and C's), read on the median ratio:\n\n")
	b.WriteString("| goal | workload | groupkv/peer | rounds met | met |\n|---|---|--:|--:|---|\n")
	for _, g := range goals {
		holds := func(x float64) bool {
			if g.atLeast {
				return x >= g.bound
			}
			return x <= g.bound
		}
		n := 0
		for _, x := range g.ratios {
			if holds(x) {
				n++
			}
		}
		met := "no"
		if len(g.ratios) > 0 && holds(medianOf(g.ratios)) {
			met = "yes"
		}
		fmt.Fprintf(b, "| %s | %s | %s | %d of %d | %s |\n", g.what, g.workload, ratioCell(g.ratios), n, len(g.ratios), met)
	}
}
