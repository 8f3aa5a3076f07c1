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
		return a.System < b.System
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

// find returns the result of system and workload in rs.
func find(rs []Result, system, workload string) (Result, bool) {
	for _, r := range rs {
		if r.System == system && r.Workload == workload {
			return r, true
		}
	}
	return Result{}, false
}

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
		parts = append(parts, fmt.Sprintf("benchmark client %s µs/op (%.2f cores)", cpuCell(res.ClientCPUPerOp()), res.ClientCPUSeconds/res.Seconds))
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
	for _, s := range res.ErrorSamples {
		fmt.Fprintf(w, "  error: %s\n", s)
	}
	return nil
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
	var b strings.Builder
	b.WriteString("| workload | system | version | ops/s | p50 ms | p99 ms | p99.9 ms | server CPU µs/op | client CPU µs/op | errors |\n")
	b.WriteString("|---|---|---|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, r := range rs {
		l := r.Latency[AllOps]
		fmt.Fprintf(&b, "| %s | %s | %s | %.0f | %s | %s | %s | %s | %s | %d |\n",
			r.Workload, r.System, r.Version, r.OpsPerSec, ms(l.P50Us), ms(l.P99Us), ms(l.P999Us), cpuCell(r.ServerCPUPerOp()), cpuCell(r.ClientCPUPerOp()), r.Errors)
	}

	systems, workloads := systemsOf(rs), workloadsOf(rs)
	var peers []string
	for _, s := range systems {
		if s != baseline {
			peers = append(peers, s)
		}
	}
	if contains(systems, baseline) && len(peers) > 0 {
		fmt.Fprintf(&b, "\nRatios %s/peer: throughput (above 1: %s is faster) and p99 latency (below 1: %s is faster).\n\n", baseline, baseline, baseline)
		b.WriteString("| workload |")
		for _, p := range peers {
			fmt.Fprintf(&b, " ops/s %s/%s | p99 %s/%s |", baseline, p, baseline, p)
		}
		b.WriteString("\n|---|")
		b.WriteString(strings.Repeat("--:|--:|", len(peers)))
		b.WriteString("\n")
		for _, wl := range workloads {
			base, ok := find(rs, baseline, wl)
			if !ok {
				continue
			}
			var row strings.Builder
			have := false
			for _, p := range peers {
				peer, ok := find(rs, p, wl)
				if !ok {
					row.WriteString(" – | – |")
					continue
				}
				have = true
				fmt.Fprintf(&row, " %s | %s |", ratio(base.OpsPerSec, peer.OpsPerSec), ratio(base.Latency[AllOps].P99Us, peer.Latency[AllOps].P99Us))
			}
			if have {
				fmt.Fprintf(&b, "| %s |%s\n", wl, row.String())
			}
		}
	}

	b.WriteString("\nPer operation (latencies in ms):\n\n")
	b.WriteString("| workload | system | op | count | ops/s | mean | p50 | p99 | p99.9 | max | errors |\n")
	b.WriteString("|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|\n")
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
			fmt.Fprintf(&b, "| %s | %s | %s | %d | %.0f | %s | %s | %s | %s | %s | %d |\n",
				r.Workload, r.System, name, l.Count, rate, ms(l.MeanUs), ms(l.P50Us), ms(l.P99Us), ms(l.P999Us), ms(l.MaxUs), l.Errors)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func ratio(a, b float64) string {
	if b == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", a/b)
}
