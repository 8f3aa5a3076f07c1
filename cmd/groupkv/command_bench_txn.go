package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/groupkv/groupkv/internal/bench"
)

// txnBenchFlags are the flags of "groupkv bench --workload txn".
type txnBenchFlags struct {
	keys     string // comma-separated key range sizes
	modes    string // comma-separated modes
	ops      int
	reads    string
	loadMax  int
	embedded string
}

func (t *txnBenchFlags) register(f *pflag.FlagSet) {
	f.StringVar(&t.keys, "txn-keys", "100000", "txn workload: size of the key range the keys of a transaction are drawn from, or a comma-separated list run in order (e.g. 10000000,100000,10000,1000)")
	f.StringVar(&t.modes, "txn-mode", bench.TxnModeSerializable, "txn workload: serializable (transactions, retried until they commit), none (the same reads and writes without a transaction), or serializable,none")
	f.IntVar(&t.ops, "txn-ops", 10, "txn workload: distinct keys each transaction reads and then writes")
	f.StringVar(&t.reads, "txn-reads", bench.TxnReadsEach, "txn workload: each (a transaction reads its keys one request at a time) or batch (all in one request: groupkv's Tx.BatchGetForUpdate, etcd STM's Get of several keys, SELECT ... WHERE k = ANY($1))")
	f.IntVar(&t.loadMax, "txn-load-max", 1_000_000, "txn workload: largest key range --load writes; a larger one starts empty and a read of an absent key counts as 0")
	f.StringVar(&t.embedded, "embedded", "", "txn workload, groupkv only: run a groupkv node in this process on this data directory instead of connecting to --addr")
}

// txnBenchRun is what runTxnBench needs of the bench command's flags.
type txnBenchRun struct {
	target, addr, table, version, out, system string
	load                                      bool
	opts                                      bench.Options
	txn                                       txnBenchFlags
	tableSet                                  bool
	tls                                       *tls.Config // groupkv over TLS
}

// parseTxnKeys parses --txn-keys.
func parseTxnKeys(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.ReplaceAll(strings.TrimSpace(f), "_", "")
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, usagef("--txn-keys %q: give positive key counts, comma-separated", s)
		}
		out = append(out, n)
	}
	return out, nil
}

// parseTxnModes parses --txn-mode.
func parseTxnModes(s string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(s, ",") {
		switch f = strings.TrimSpace(f); f {
		case bench.TxnModeSerializable, bench.TxnModeNone:
			out = append(out, f)
		default:
			return nil, usagef("--txn-mode %q: use serializable, none or serializable,none", f)
		}
	}
	return out, nil
}

// runTxnBench runs the txn workload: for each key range, --load resets the
// table and loads it (or leaves it empty, above --txn-load-max), then each
// mode runs.
func runTxnBench(cmd *cobra.Command, run txnBenchRun) error {
	keys, err := parseTxnKeys(run.txn.keys)
	if err != nil {
		return err
	}
	modes, err := parseTxnModes(run.txn.modes)
	if err != nil {
		return err
	}
	target := run.target
	if target == "postgres" {
		target = "postgresql"
	}
	switch target {
	case "groupkv", "etcd", "postgresql":
	default:
		return usagef("--workload txn: --target %q: use groupkv, etcd or postgresql", run.target)
	}
	if run.txn.embedded != "" && target != "groupkv" {
		return usagef("--embedded runs a groupkv node; it does not apply to %s", target)
	}
	table := run.table
	if !run.tableSet {
		table = "txn"
	}
	var workloads []bench.TxnWorkload
	for _, k := range keys {
		w := bench.TxnWorkload{Keys: k, Ops: run.txn.ops, Reads: run.txn.reads, LoadMax: run.txn.loadMax}
		w.EnsureDefaults()
		if err := w.Validate(); err != nil {
			return usagef("%v", err)
		}
		workloads = append(workloads, w)
	}
	opts := run.opts
	if err := validateBenchOptions(opts); err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dopts := bench.DriverOptions{Table: table, Shards: opts.Shards, Replicas: opts.Replicas, Conns: opts.Clients, TLS: run.tls}
	var d bench.TxnDriver
	switch {
	case run.txn.embedded != "":
		d, err = bench.OpenGroupKVEmbedded(ctx, run.txn.embedded, dopts)
		opts.Addr = "embedded:" + filepath.Clean(run.txn.embedded)
	case target == "groupkv":
		d, err = bench.OpenGroupKVTxn(ctx, run.addr, dopts)
	case target == "etcd":
		d, err = bench.OpenEtcdTxn(ctx, run.addr, dopts)
	default:
		d, err = bench.OpenPostgres(ctx, bench.PostgresDSN(run.addr), dopts)
	}
	if err != nil {
		return err
	}
	defer d.Close()
	r, err := bench.NewTxnRunner(d, opts)
	if err != nil {
		return err
	}
	stdout := cmd.OutOrStdout()
	for _, w := range workloads {
		var loaded *bench.LoadResult
		if run.load {
			if loaded, err = r.Load(ctx, w); err != nil {
				return err
			}
		}
		for _, m := range modes {
			w.Mode = m
			res, err := r.Run(ctx, w)
			if err != nil {
				return err
			}
			res.Load, loaded = loaded, nil
			if run.version != "" {
				res.Version = run.version
			}
			if err := writeTxnSummary(stdout, res); err != nil {
				return err
			}
			if run.out != "" {
				if err := bench.AppendResult(run.out, res); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// writeTxnSummary prints a txn result: its summary table and the attempts
// per commit.
func writeTxnSummary(w io.Writer, res bench.Result) error {
	fmt.Fprintf(w, "txn workload: %d keys", res.Params.Records)
	if res.Params.TxnLazy {
		fmt.Fprint(w, " (not loaded: absent keys count as 0)")
	}
	fmt.Fprintf(w, ", %d reads and %d writes per transaction, mode %s", res.Params.TxnOps, res.Params.TxnOps, res.Params.TxnMode)
	if res.Params.TxnReads == bench.TxnReadsBatch {
		fmt.Fprint(w, ", the reads in one request")
	}
	fmt.Fprintln(w)
	if err := bench.WriteSummary(w, res); err != nil {
		return err
	}
	if a := res.Attempts; a != nil {
		fmt.Fprintf(w, "  attempts per commit: p50 %d  p99 %d  max %d  mean %.3f\n", a.P50, a.P99, a.Max, a.Mean)
	}
	_, err := fmt.Fprintln(w)
	return err
}

// benchPgbenchCommand turns the per-transaction logs of a pgbench run of
// scripts/txn.pgbench into a result of the txn workload.
func benchPgbenchCommand() *cobra.Command {
	var (
		run       bench.PgbenchRun
		out       string
		warmup    time.Duration
		duration  time.Duration
		loadMax   int
		keys, ops int
		clients   int
		version   string
		seed      uint64
	)
	cmd := &cobra.Command{
		Use:   "pgbench LOG...",
		Short: "Append the result of a pgbench run of scripts/txn.pgbench, read from its per-transaction logs, to a results file",
		Long: `Read the per-transaction logs (pgbench -l, with --max-tries) of a pgbench run of
scripts/txn.pgbench and append it to a results file as a txn workload result
of system postgresql-pgbench, so that "groupkv bench report" shows it beside
groupkv's transactions. Transactions that started in the first --warmup, or
after --warmup plus --duration, are not counted.`,
		Example: "  groupkv bench pgbench --txn-keys 1000 --clients 64 --warmup 3s --duration 12s --out results.json pgbench_log.*",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			run.Keys, run.Ops, run.Clients = keys, ops, clients
			run.Warmup, run.Duration, run.Version, run.Seed = warmup, duration, version, seed
			run.Lazy = keys > loadMax
			res, err := bench.PgbenchResult(args, run)
			if err != nil {
				return err
			}
			if err := writeTxnSummary(cmd.OutOrStdout(), res); err != nil {
				return err
			}
			return bench.AppendResult(out, res)
		},
	}
	f := cmd.Flags()
	f.IntVar(&keys, "txn-keys", 100000, "key range of the run (pgbench -D keys=N)")
	f.IntVar(&ops, "txn-ops", 10, "keys read and written per transaction")
	f.IntVar(&loadMax, "txn-load-max", 1_000_000, "largest key range that was loaded (a larger one started empty)")
	f.IntVar(&clients, "clients", 64, "pgbench clients (-c)")
	f.DurationVar(&warmup, "warmup", 5*time.Second, "time at the start of the run not counted")
	f.DurationVar(&duration, "duration", 30*time.Second, "measured time after the warm-up")
	f.StringVar(&version, "system-version", "", "PostgreSQL version to record")
	f.Uint64Var(&seed, "seed", 0, "pgbench --random-seed to record")
	f.StringVar(&out, "out", "results.json", "results file to append to")
	return cmd
}
