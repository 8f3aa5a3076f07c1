package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	groupkv "github.com/groupkv/groupkv"
	"github.com/groupkv/groupkv/internal/bench"
)

func benchCommand() *cobra.Command {
	var (
		opts         bench.Options
		target       string
		workloads    string
		partitioning string
		table        string
		load         bool
		version      string
		out          string
		progress     bool
		cpuProfile   string
		systemName   string
		round        int
		txn          txnBenchFlags
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Run YCSB workloads (or the timeline workload) against groupkv, etcd or Redis",
		Long: `Run YCSB core workloads against a running server and print throughput and
latency percentiles per operation; with --out, append a JSON record of each
run to a results file (see "groupkv bench chart" and "groupkv bench report").

Workloads (as in YCSB; keys chosen zipfian unless said otherwise):
  a  50% read, 50% update            d  95% read, 5% insert (latest)
  b  95% read, 5% update             e  95% scan of 1-100 records, 5% insert
  c  100% read                       f  50% read, 50% read-modify-write
  timeline  groupkv only: --users users with --records-per-user records
            tagged with the user's tag; each operation reads one user's
            records with GetByTags, on a tag and/or a hash collection
            (--partitioning)
  txn       multi-key transactions: each reads --txn-ops distinct keys drawn
            uniformly from --txn-keys keys and writes each back incremented,
            retried until it commits; counts attempts per commit. Targets:
            groupkv (gRPC transactions, or a node in this process with
            --embedded DIR), etcd (serializable STM), postgresql
            (SERIALIZABLE, --addr host:port or a connection URL).
            --txn-mode none runs the same reads and writes without
            transactions; --txn-reads batch reads a transaction's keys
            in one request instead of one at a time.

Each target is reached through its ordinary Go client; --addr defaults to
the target's usual port (groupkv 7070, etcd 2379, redis 6379) on 127.0.0.1.
For a groupkv or etcd cluster, --addr may list its nodes comma-separated:
the benchmark connects to each and client i sends its requests to node
i mod n; --system-name then tells the cluster's results from a single
node's (e.g. groupkv-3), and --replicas sets the replication factor of the
groupkv collections --load creates.
Run with --load once to write --records records (it empties the benchmark's
table first: collection "usertable", etcd prefix "usertable/", Redis keys
"usertable:*").`,
		Example: `  groupkv bench --workload a,b,c --records 100000 --load --out results.json
  groupkv bench --target etcd --addr 127.0.0.1:2379 --workload a --load --out results.json
  groupkv bench --workload timeline --partitioning tag,hash --load --duration 20s
  groupkv bench --addr 127.0.0.1:7070,127.0.0.1:7080,127.0.0.1:7090 --replicas 3 --system-name groupkv-3 --load
  groupkv bench --workload txn --embedded /tmp/gkv --txn-keys 100000,1000 --txn-mode serializable,none --load
  groupkv bench --workload txn --target postgresql --addr 127.0.0.1:5432 --txn-keys 1000 --load
  groupkv bench groups --addr 127.0.0.1:7070 --players 100000 --load --clients 1,4,16 --out results.json
  groupkv bench chart --in results.json --out chart.png`,
		Args: argsBetween(0, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			target = strings.ToLower(target)
			server, err := remoteOf(cmd)
			if err != nil {
				return err
			}
			if server.tls != nil && target != "groupkv" {
				return usagef("--ca-file, --cert-file and --key-file: groupkv targets only")
			}
			if cpuProfile != "" {
				stop, err := startCPUProfile(cpuProfile)
				if err != nil {
					return err
				}
				defer stop()
			}
			if strings.EqualFold(strings.TrimSpace(workloads), bench.TxnWorkloadName) {
				addr, _ := cmd.Flags().GetString("addr")
				if !cmd.Flags().Changed("addr") {
					addr = bench.DefaultAddr[target]
					if target == "postgresql" || target == "postgres" {
						addr = "127.0.0.1:5432"
					}
				}
				opts.System = systemName
				if progress || term.IsTerminal(int(os.Stderr.Fd())) {
					opts.Progress = bench.NewProgressBar(os.Stderr).Update
				}
				return runTxnBench(cmd, txnBenchRun{target: target, addr: addr, table: table, tableSet: cmd.Flags().Changed("table"),
					version: version, out: out, system: systemName, load: load, opts: opts, txn: txn, tls: server.tls})
			}
			if _, ok := bench.DefaultAddr[target]; !ok {
				return usagef("--target %q: use %s", target, strings.Join(bench.Targets, ", "))
			}
			addr, _ := cmd.Flags().GetString("addr")
			if !cmd.Flags().Changed("addr") {
				addr = bench.DefaultAddr[target]
			}
			var core []bench.Workload
			timeline := false
			for _, name := range strings.Split(workloads, ",") {
				name = strings.TrimSpace(name)
				if strings.EqualFold(name, bench.TimelineOp) {
					timeline = true
					continue
				}
				w, err := bench.LookupWorkload(name)
				if err != nil {
					return usagef("--workload %q: use a, b, c, d, e, f or timeline, or a comma-separated list", name)
				}
				core = append(core, w)
			}
			var parts []groupkv.Partitioning
			if timeline {
				if target != "groupkv" {
					return usagef("--workload timeline runs against groupkv only, not %s", target)
				}
				for _, p := range strings.Split(partitioning, ",") {
					switch p = strings.TrimSpace(p); p {
					case "tag", "hash":
						parts = append(parts, groupkv.Partitioning(p))
					default:
						return usagef("--partitioning %q: use tag, hash or tag,hash", p)
					}
				}
			}
			if n := len(bench.SplitAddrs(addr)); n == 0 {
				return usagef("--addr %q: give host:port, or a comma-separated list of them", addr)
			} else if n > 1 && target == "redis" {
				return usagef("--addr %q: redis takes one address", addr)
			}
			if opts.Replicas != 0 && target != "groupkv" {
				return usagef("--replicas applies to groupkv collections only, not %s", target)
			}
			if round < 0 {
				return usagef("--round %d: rounds are numbered from 1 (0: a run of one round)", round)
			}
			opts.Addr = addr
			opts.System = systemName
			if progress || term.IsTerminal(int(os.Stderr.Fd())) {
				opts.Progress = bench.NewProgressBar(os.Stderr).Update
			}
			if err := validateBenchOptions(opts); err != nil {
				return err
			}

			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			d, err := bench.Open(ctx, target, addr, bench.DriverOptions{Table: table, Shards: opts.Shards, Replicas: opts.Replicas, Conns: opts.Clients, TLS: server.tls})
			if err != nil {
				return err
			}
			defer d.Close()
			r, err := bench.NewRunner(d, opts)
			if err != nil {
				return err
			}
			var loaded *bench.LoadResult
			if load && len(core) > 0 {
				lr, err := r.Load(ctx)
				if err != nil {
					return err
				}
				loaded = &lr
			}
			stdout := cmd.OutOrStdout()
			emit := func(res bench.Result) error {
				if version != "" {
					res.Version = version
				}
				res.Params.Round = round
				if err := bench.WriteSummary(stdout, res); err != nil {
					return err
				}
				fmt.Fprintln(stdout)
				if out != "" {
					return bench.AppendResult(out, res)
				}
				return nil
			}
			for _, w := range core {
				res, err := r.Run(ctx, w)
				if err != nil {
					return err
				}
				res.Load, loaded = loaded, nil
				if err := emit(res); err != nil {
					return err
				}
			}
			for _, p := range parts {
				res, err := r.RunTimeline(ctx, p, load)
				if err != nil {
					return err
				}
				if err := emit(res); err != nil {
					return err
				}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&target, "target", "groupkv", "system to measure: groupkv, etcd or redis (txn workload: groupkv, etcd or postgresql)")
	f.String("addr", defaultAddr, "server address as host:port (no scheme); for a groupkv or etcd cluster, its nodes' addresses comma-separated, clients spread over them")
	addTLSFlags(cmd) // groupkv targets only
	f.StringVar(&workloads, "workload", "a", "workload: a to f or timeline, or a comma-separated list run in order")
	f.IntVar(&opts.Records, "records", 100000, "records of the load phase (and the key space of the runs)")
	f.IntVar(&opts.ValueSize, "value-size", 100, "value size in bytes")
	f.IntVar(&opts.Clients, "clients", 64, "concurrent clients, each with one request in flight")
	f.Float64Var(&opts.Rate, "rate", 0, "operations per second the clients start together, each on a fixed schedule, latency counted from the scheduled start (YCSB's -target; results name the workload e.g. a@45000/s); 0: each client starts its next operation when the last one ends")
	f.DurationVar(&opts.Duration, "duration", 30*time.Second, "measured time of each workload")
	f.DurationVar(&opts.Warmup, "warmup", 5*time.Second, "unmeasured time before each workload's measured time")
	f.StringVar(&opts.Distribution, "distribution", "", "request distribution: uniform, zipfian or latest (default: each workload's own)")
	f.BoolVar(&load, "load", false, "empty the benchmark's table and load --records records first")
	f.StringVar(&out, "out", "", "append a JSON record of each run to this file")
	f.StringVar(&version, "system-version", "", "version to record for the target (default: what its server reports; for groupkv the build's VCS revision)")
	f.IntVar(&round, "round", 0, "number of this run among the rounds of a comparison (recorded in --out; groupkv bench report then gives the median of the rounds' ratios)")
	f.DurationVar(&opts.Window, "window", 0, "split the measured time into windows of this length and report each one's operations and slowest latency (in --out; the summary names the slowest five): stalls show as windows")
	f.StringVar(&cpuProfile, "cpuprofile", "", "write a pprof CPU profile of the benchmark process (its clients) to this file")
	f.BoolVar(&progress, "progress", false, "draw the progress bar on stderr even when it is not a terminal")
	f.Uint64Var(&opts.Seed, "seed", 0, "seed of the random key choices (default: from the clock; results record it)")
	f.IntVar(&opts.Shards, "shards", 0, "shards of the groupkv collections --load creates (default: groupkv's)")
	f.IntVar(&opts.Replicas, "replicas", 0, "replication factor of the groupkv collections --load creates (default: groupkv's, 3 on a cluster of 3 nodes or more)")
	f.StringVar(&systemName, "system-name", "", "name of the system in results (default: the target's), e.g. groupkv-3 for a three-node cluster")
	f.StringVar(&table, "table", "usertable", "groupkv collection, etcd key prefix or Redis key prefix of the records")
	f.StringVar(&partitioning, "partitioning", "tag,hash", "timeline workload: collection partitioning, tag, hash or tag,hash")
	f.IntVar(&opts.Users, "users", 1000, "timeline workload: users")
	f.IntVar(&opts.PerUser, "records-per-user", 20, "timeline workload: records per user")
	txn.register(f)
	cmd.AddCommand(benchChartCommand(), benchReportCommand(), benchPgbenchCommand(), benchGroupsCommand())
	return cmd
}

// startCPUProfile starts Go's CPU profiler writing to path; stop ends it
// and closes the file.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

// validateBenchOptions reports the problems of opts as a usage error
// before any connection is made. Zero values mean the runner's defaults.
func validateBenchOptions(opts bench.Options) error {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return usagef("%v", err)
	}
	return nil
}

func benchChartCommand() *cobra.Command {
	var (
		in, out string
		copts   bench.ChartOptions
	)
	cmd := &cobra.Command{
		Use:   "chart",
		Short: "Draw a PNG bar chart of a results file: throughput and p99 latency per workload and system",
		Long: `Draw a PNG bar chart of the results file that "groupkv bench --out" appends to:
throughput and p99 latency per workload, one bar per system. When the file
holds several runs of one system and workload, the last one counts.`,
		Example: "  groupkv bench chart --in results.json --out chart.png",
		Args:    argsBetween(0, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := copts.Validate(); err != nil {
				return usagef("%v", err)
			}
			rs, err := bench.ReadResultsFile(in)
			if err != nil {
				return err
			}
			f, err := os.Create(out)
			if err != nil {
				return err
			}
			if err := bench.WriteChartPNG(f, rs, copts); err != nil {
				f.Close()
				os.Remove(out)
				if errors.Is(err, bench.ErrNoResults) {
					return fmt.Errorf("%s holds no results: run groupkv bench --out %s first", in, in)
				}
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s\n", out)
			return nil
		},
	}
	cmd.Flags().StringVar(&in, "in", "results.json", "results file")
	cmd.Flags().StringVar(&out, "out", "chart.png", "PNG file to write")
	cmd.Flags().IntVar(&copts.Width, "width", 1200, "image width in pixels")
	cmd.Flags().IntVar(&copts.Height, "height", 900, "image height in pixels")
	cmd.Flags().StringVar(&copts.Title, "title", "", "chart title (default: systems and parameters)")
	return cmd
}

func benchReportCommand() *cobra.Command {
	var in, baseline string
	cmd := &cobra.Command{
		Use:     "report",
		Short:   "Print Markdown tables of a results file, with the ratios of --baseline to every other system",
		Example: "  groupkv bench report --in results.json\n  groupkv bench report --in results.json --baseline redis",
		Args:    argsBetween(0, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			rs, err := bench.ReadResultsFile(in)
			if err != nil {
				return err
			}
			txnResults, rs := bench.SplitTxnResults(rs)
			groupsResults, rs := bench.SplitGroupsResults(rs)
			if len(rs) == 0 && len(txnResults) == 0 && len(groupsResults) == 0 {
				return fmt.Errorf("%s holds no results: run groupkv bench --out %s first", in, in)
			}
			stdout := cmd.OutOrStdout()
			written := false
			section := func(write func(io.Writer) error) error {
				if written {
					fmt.Fprintln(stdout)
				}
				written = true
				return write(stdout)
			}
			if len(rs) > 0 {
				if err := section(func(w io.Writer) error { return bench.WriteMarkdown(w, rs, baseline) }); err != nil {
					return err
				}
			}
			if len(txnResults) > 0 {
				if err := section(func(w io.Writer) error { return bench.WriteTxnMarkdown(w, txnResults) }); err != nil {
					return err
				}
			}
			if len(groupsResults) > 0 {
				return section(func(w io.Writer) error { return bench.WriteGroupsMarkdown(w, groupsResults) })
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&in, "in", "results.json", "results file")
	cmd.Flags().StringVar(&baseline, "baseline", "groupkv", "system whose ratios to the others are shown")
	return cmd
}
