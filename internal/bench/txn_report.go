package bench

import (
	"fmt"
	"io"
	"sort"
	"strings"
)

// txnSystems orders the systems of txn results.
var txnSystems = []string{"groupkv", "etcd", "postgresql", PgbenchSystem}

// txnCell names one txn result: a system, a mode, a key range.
type txnCell struct {
	system, mode string
	keys         int
}

func cellOf(r Result) txnCell {
	return txnCell{r.System, r.Params.TxnMode, r.Params.Records}
}

// SplitTxnResults separates the txn workload's results from the others.
func SplitTxnResults(rs []Result) (txn, other []Result) {
	for _, r := range rs {
		if r.Workload == TxnWorkloadName {
			txn = append(txn, r)
		} else {
			other = append(other, r)
		}
	}
	return txn, other
}

// latestTxn keeps the last result of each system, mode and key range,
// ordered by key range (largest first), system, then mode.
func latestTxn(rs []Result) map[txnCell]Result {
	out := map[txnCell]Result{}
	for _, r := range rs {
		if r.Workload == TxnWorkloadName {
			out[cellOf(r)] = r
		}
	}
	return out
}

func txnSystemRank(s string) int {
	for i, t := range txnSystems {
		if t == s {
			return i
		}
	}
	return len(txnSystems)
}

// WriteTxnMarkdown writes Markdown tables of the txn workload's results in
// rs (the last of each system, mode and key range): throughput, latency and
// attempts of every run; the ratios of groupkv to its peers and to its own
// non-transactional mode per key range; the distribution of attempts; and
// the goals of groupkv's transactions, each with its measured ratio.
func WriteTxnMarkdown(w io.Writer, rs []Result) error {
	cells := latestTxn(rs)
	if len(cells) == 0 {
		return ErrNoResults
	}
	var order []txnCell
	keySet := map[int]bool{}
	for c := range cells {
		order = append(order, c)
		keySet[c.keys] = true
	}
	sort.Slice(order, func(i, j int) bool {
		a, b := order[i], order[j]
		if a.keys != b.keys {
			return a.keys > b.keys
		}
		if ra, rb := txnSystemRank(a.system), txnSystemRank(b.system); ra != rb {
			return ra < rb
		}
		if a.system != b.system {
			return a.system < b.system
		}
		return a.mode > b.mode // serializable before none
	})
	var keys []int
	for k := range keySet {
		keys = append(keys, k)
	}
	sort.Sort(sort.Reverse(sort.IntSlice(keys)))

	var b strings.Builder
	b.WriteString("| keys | system | mode | version | commits/s | p50 ms | p99 ms | attempts p50 | p99 | max | mean | server CPU µs/commit | errors |\n")
	b.WriteString("|--:|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, c := range order {
		r := cells[c]
		l := r.Latency[AllOps]
		keysCol := fmt.Sprint(c.keys)
		if r.Params.TxnLazy {
			keysCol += " (lazy)"
		}
		att := "– | – | – | –"
		if a := r.Attempts; a != nil {
			att = fmt.Sprintf("%d | %d | %d | %.2f", a.P50, a.P99, a.Max, a.Mean)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %.0f | %s | %s | %s | %s | %d |\n",
			keysCol, c.system, c.mode, r.Version, r.OpsPerSec, ms(l.P50Us), ms(l.P99Us), att, cpuCell(r.ServerCPUPerOp()), r.Errors)
	}

	rate := func(system, mode string, k int) (float64, bool) {
		r, ok := cells[txnCell{system, mode, k}]
		if !ok || r.Ops == 0 {
			return 0, false
		}
		return r.OpsPerSec, true
	}
	ratioOf := func(a, b float64, okA, okB bool) string {
		if !okA || !okB {
			return "–"
		}
		return ratio(a, b)
	}
	ser, none := TxnModeSerializable, TxnModeNone
	uncontended := 0
	if len(keys) > 0 {
		uncontended = keys[0]
	}
	b.WriteString("\nRatios of commits/s (above 1: groupkv is faster). \"non-txn\" is groupkv running the same reads and writes without a transaction; \"uncontended\" is groupkv's transactions on the largest key range.\n\n")
	fmt.Fprintf(&b, "| keys | groupkv / etcd STM | groupkv / postgresql (pgx) | groupkv / postgresql (pgbench) | groupkv txn / non-txn | groupkv txn / uncontended (%d keys) |\n", uncontended)
	b.WriteString("|--:|--:|--:|--:|--:|--:|\n")
	for _, k := range keys {
		g, gok := rate("groupkv", ser, k)
		e, eok := rate("etcd", ser, k)
		p, pok := rate("postgresql", ser, k)
		pb, pbok := rate(PgbenchSystem, ser, k)
		n, nok := rate("groupkv", none, k)
		u, uok := rate("groupkv", ser, uncontended)
		unc := ratioOf(g, u, gok, uok)
		if k == uncontended {
			unc = "–"
		}
		fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %s |\n", k,
			ratioOf(g, e, gok, eok), ratioOf(g, p, gok, pok), ratioOf(g, pb, gok, pbok), ratioOf(g, n, gok, nok), unc)
	}

	b.WriteString("\nAttempts per committed transaction: share of the commits that took 1, 2, 3–4, 5–8, 9–16, 17–64 and more than 64 attempts.\n\n")
	b.WriteString("| keys | system | 1 | 2 | 3–4 | 5–8 | 9–16 | 17–64 | >64 | max |\n")
	b.WriteString("|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	bounds := []int{1, 2, 4, 8, 16, 64, int(^uint(0) >> 1)}
	for _, c := range order {
		r := cells[c]
		a := r.Attempts
		if a == nil || a.Count == 0 {
			continue
		}
		counts := make([]uint64, len(bounds))
		for _, bk := range a.Buckets {
			for i, hi := range bounds {
				if bk.Attempts <= hi {
					counts[i] += bk.Count
					break
				}
			}
		}
		fmt.Fprintf(&b, "| %d | %s |", c.keys, c.system)
		for _, n := range counts {
			fmt.Fprintf(&b, " %s |", share(n, a.Count))
		}
		fmt.Fprintf(&b, " %d |\n", a.Max)
	}

	if goals := TxnGoals(rs); len(goals) > 0 {
		b.WriteString("\nGoals of groupkv's transactions, against the measurements above:\n\n")
		b.WriteString("| goal | measured | met |\n|---|---|---|\n")
		for _, g := range goals {
			met := "no"
			if g.Met {
				met = "yes"
			}
			fmt.Fprintf(&b, "| %s | %s | %s |\n", g.Goal, g.Measured, met)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func share(n, total uint64) string {
	if n == 0 {
		return "–"
	}
	p := 100 * float64(n) / float64(total)
	if p < 0.1 {
		return "<0.1%"
	}
	return fmt.Sprintf("%.1f%%", p)
}

// TxnGoal is one goal of groupkv's transactions and how a set of results
// measures up to it.
type TxnGoal struct {
	Goal, Measured string
	Met            bool
}

// TxnGoals checks the txn results of rs against groupkv's goals: at low
// contention (key ranges of 100,000 keys and more) at least 10 times etcd
// STM's commits/s, 5 times PostgreSQL's (the faster of its Go driver and
// pgbench) and half of groupkv's own non-transactional rate; at the
// smallest key range (high contention), at least 20% of the uncontended
// rate (the largest key range) with every transaction committed, in a
// bounded number of attempts (the largest is shown). A goal whose results
// are missing is left out.
func TxnGoals(rs []Result) []TxnGoal {
	cells := latestTxn(rs)
	var keys []int
	seen := map[int]bool{}
	for c := range cells {
		if !seen[c.keys] {
			seen[c.keys] = true
			keys = append(keys, c.keys)
		}
	}
	sort.Sort(sort.Reverse(sort.IntSlice(keys)))
	if len(keys) == 0 {
		return nil
	}
	get := func(system, mode string, k int) (Result, bool) {
		r, ok := cells[txnCell{system, mode, k}]
		return r, ok && r.Ops > 0
	}
	ser := TxnModeSerializable
	var out []TxnGoal
	type meas struct {
		k int
		x float64
	}
	add := func(goal string, ms []meas, min float64) {
		if len(ms) == 0 {
			return
		}
		var parts []string
		met := true
		for _, m := range ms {
			parts = append(parts, fmt.Sprintf("%.2f× at %d keys", m.x, m.k))
			met = met && m.x >= min
		}
		out = append(out, TxnGoal{Goal: goal, Measured: strings.Join(parts, ", "), Met: met})
	}
	var vsEtcd, vsPG, vsNone []meas
	for _, k := range keys {
		if k < 100_000 {
			continue
		}
		g, ok := get("groupkv", ser, k)
		if !ok {
			continue
		}
		if e, ok := get("etcd", ser, k); ok {
			vsEtcd = append(vsEtcd, meas{k, g.OpsPerSec / e.OpsPerSec})
		}
		best := 0.0
		for _, s := range []string{"postgresql", PgbenchSystem} {
			if p, ok := get(s, ser, k); ok {
				best = max(best, p.OpsPerSec)
			}
		}
		if best > 0 {
			vsPG = append(vsPG, meas{k, g.OpsPerSec / best})
		}
		if n, ok := get("groupkv", TxnModeNone, k); ok {
			vsNone = append(vsNone, meas{k, g.OpsPerSec / n.OpsPerSec})
		}
	}
	add("low contention: groupkv ≥ 10× etcd STM", vsEtcd, 10)
	add("low contention: groupkv ≥ 5× PostgreSQL SERIALIZABLE (the faster of pgx and pgbench)", vsPG, 5)
	add("low contention: groupkv transactions ≥ 0.5× groupkv without transactions", vsNone, 0.5)
	small, large := keys[len(keys)-1], keys[0]
	if small < large {
		g, gok := get("groupkv", ser, small)
		u, uok := get("groupkv", ser, large)
		if gok && uok {
			x := g.OpsPerSec / u.OpsPerSec
			max := 0
			if g.Attempts != nil {
				max = g.Attempts.Max
			}
			out = append(out, TxnGoal{
				Goal:     fmt.Sprintf("high contention (%d keys): groupkv ≥ 0.2× its uncontended rate (%d keys), every transaction committed in a bounded number of attempts", small, large),
				Measured: fmt.Sprintf("%.2f×; %d failed transactions; at most %d attempts", x, g.Errors, max),
				Met:      x >= 0.2 && g.Errors == 0,
			})
		}
	}
	return out
}
