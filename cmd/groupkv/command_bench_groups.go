package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/groupkv/groupkv/internal/bench"
)

// groupsBenchFlags are the flags of "groupkv bench groups".
type groupsBenchFlags struct {
	addr, embedded       string
	clients, modes       string
	w                    bench.GroupsWorkload
	opts                 bench.Options
	loadClients, rounds  int
	load, progress       bool
	noCache              bool
	out, version, system string
	table                string
}

// parseClientList parses --clients: positive counts, comma-separated.
func parseClientList(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, usagef("--clients %q: give positive client counts, comma-separated (e.g. 1,4,16)", s)
		}
		out = append(out, n)
	}
	return out, nil
}

// parseGroupsModes parses --mode.
func parseGroupsModes(s string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(s, ",") {
		switch f = strings.TrimSpace(f); f {
		case bench.GroupsModeGrouped, bench.GroupsModeUngrouped:
			out = append(out, f)
		default:
			return nil, usagef("--mode %q: use grouped, ungrouped or grouped,ungrouped", f)
		}
	}
	return out, nil
}

func benchGroupsCommand() *cobra.Command {
	var f groupsBenchFlags
	cmd := &cobra.Command{
		Use:   "groups",
		Short: "Run G-Store's gaming benchmark on Key Groups: games on groups of players, against the same games without groups",
		Long: `Run G-Store's gaming benchmark (Das, Agrawal, El Abbadi, SoCC 2010) on
groupkv's Key Groups. A collection (--table, hash-partitioned) holds
--players players, each 25 fields of 20 to 40 bytes. Each client plays one
game after the other: it draws a size K (normal around --group-size, at
least 2) and K players (--members contiguous: a run of consecutive ids;
random: any ids), creates an atomic group of them led by the first (a
creation refused because a player is in another game is counted and the
client draws again), plays --ops-per-group moves, each a group transaction
that reads one or two players and updates one, after a think time drawn
from [--think, 2×--think), and deletes the group.

--mode ungrouped plays the same games with plain gets and puts and no
group (its create and delete do nothing). For each --clients count, each
mode runs for --warmup then --duration. The report gives the creations'
latency and rate, the moves' latency and rate, and the mean latency per
operation with a game's creation and deletion amortized over its moves + 2,
whose ratio grouped/ungrouped is the overhead of groups.

--rounds N runs both modes N times at each client count, alternating
their order (grouped then ungrouped, then ungrouped then grouped, ...), so
that the machine's other load and the compactions that follow a load weigh
on both alike; the overhead is then the median of the rounds'.

--load empties the collection and loads the players first (--load-clients
clients, --load-batch players per batch put).`,
		Example: `  groupkv bench groups --addr 127.0.0.1:7070 --players 1000000 --load --clients 1,4,16 --out results.json
  groupkv bench groups --embedded /tmp/gkv --players 10000 --load --clients 4 --duration 10s
  groupkv bench report --in results.json`,
		Args: argsBetween(0, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runGroupsBench(cmd, f)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&f.addr, "addr", defaultAddr, "server address as host:port (no scheme); for a cluster, its nodes' addresses comma-separated, clients spread over them")
	addTLSFlags(cmd)
	fs.StringVar(&f.embedded, "embedded", "", "run a groupkv node in this process on this data directory instead of connecting to --addr")
	fs.StringVar(&f.table, "table", "players", "collection of the players")
	fs.IntVar(&f.w.Players, "players", 1_000_000, "players in the collection")
	fs.IntVar(&f.w.GroupSize, "group-size", 10, "mean players of a game")
	fs.Float64Var(&f.w.GroupSizeStddev, "group-size-stddev", 0, "standard deviation of a game's size (default: a quarter of --group-size)")
	fs.StringVar(&f.w.Members, "members", bench.MembersContiguous, "how a game's players are chosen: contiguous (consecutive ids) or random")
	fs.IntVar(&f.w.OpsPerGroup, "ops-per-group", 50, "moves of a game (group transactions)")
	fs.DurationVar(&f.w.Think, "think", 10*time.Millisecond, "least think time before a move, drawn from [think, 2×think); 0 for none")
	fs.StringVar(&f.modes, "mode", "grouped,ungrouped", "grouped (games in key groups), ungrouped (plain gets and puts), or both, run in this order")
	fs.BoolVar(&f.noCache, "no-cached-snapshot", false, "make each move read the group's snapshot from its leader, instead of from the one the game's previous move brought back (groupkv.WithCachedSnapshot)")
	fs.IntVar(&f.rounds, "rounds", 1, "times each mode runs at each client count, the modes' order alternating; the overhead is the median of the rounds'")
	fs.StringVar(&f.clients, "clients", "1,4,16", "concurrent clients, each playing one game at a time; a comma-separated list runs each")
	fs.DurationVar(&f.opts.Duration, "duration", 15*time.Second, "measured time of each run")
	fs.DurationVar(&f.opts.Warmup, "warmup", 3*time.Second, "unmeasured time before each run's measured time")
	fs.BoolVar(&f.load, "load", false, "empty the collection and load --players players first")
	fs.IntVar(&f.loadClients, "load-clients", 8, "concurrent batch puts of the load")
	fs.IntVar(&f.opts.LoadBatch, "load-batch", 200, "players per batch put of the load")
	fs.IntVar(&f.opts.Shards, "shards", 0, "shards of the collection --load creates (default: groupkv's)")
	fs.IntVar(&f.opts.Replicas, "replicas", 0, "replication factor of the collection --load creates (default: groupkv's)")
	fs.Uint64Var(&f.opts.Seed, "seed", 0, "seed of the random choices (default: from the clock; results record it)")
	fs.StringVar(&f.out, "out", "", "append a JSON record of each run to this file")
	fs.StringVar(&f.version, "system-version", "", "version to record (default: the build's VCS revision)")
	fs.StringVar(&f.system, "system-name", "", "name of the system in results (default groupkv), e.g. groupkv-3 for a three-node cluster")
	fs.BoolVar(&f.progress, "progress", false, "draw the progress bar on stderr even when it is not a terminal")
	return cmd
}

// runGroupsBench loads the players (--load), then runs each mode at each
// client count.
func runGroupsBench(cmd *cobra.Command, f groupsBenchFlags) error {
	clients, err := parseClientList(f.clients)
	if err != nil {
		return err
	}
	modes, err := parseGroupsModes(f.modes)
	if err != nil {
		return err
	}
	w := f.w
	w.EnsureDefaults()
	if err := w.Validate(); err != nil {
		return usagef("%v", err)
	}
	if f.rounds < 1 {
		return usagef("--rounds %d: need at least 1", f.rounds)
	}
	if f.loadClients < 1 {
		return usagef("--load-clients %d: need at least 1", f.loadClients)
	}
	opts := f.opts
	opts.System = f.system
	opts.Clients = f.loadClients
	if err := validateBenchOptions(opts); err != nil {
		return err
	}
	if opts.Seed == 0 {
		// One seed for every run, so that each mode plays the same games.
		opts.Seed = uint64(time.Now().UnixNano())
	}
	if f.progress || term.IsTerminal(int(os.Stderr.Fd())) {
		opts.Progress = bench.NewProgressBar(os.Stderr).Update
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	server, err := remoteOf(cmd)
	if err != nil {
		return err
	}
	dopts := bench.DriverOptions{Table: f.table, Shards: opts.Shards, Replicas: opts.Replicas, NoCachedSnapshot: f.noCache, TLS: server.tls}
	var d *bench.GroupKVGroups
	if f.embedded != "" {
		// The node logs through the default logger: warnings and errors
		// only, as the server's benchmarks run it.
		slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
		d, err = bench.OpenGroupKVGroupsEmbedded(ctx, f.embedded, dopts)
		opts.Addr = "embedded:" + filepath.Clean(f.embedded)
	} else {
		if len(bench.SplitAddrs(f.addr)) == 0 {
			return usagef("--addr %q: give host:port, or a comma-separated list of them", f.addr)
		}
		d, err = bench.OpenGroupKVGroups(ctx, f.addr, dopts)
		opts.Addr = f.addr
	}
	if err != nil {
		return err
	}
	defer d.Close()

	stdout := cmd.OutOrStdout()
	var loaded *bench.LoadResult
	if f.load {
		r, err := bench.NewGroupsRunner(d, opts)
		if err != nil {
			return err
		}
		lr, err := r.Load(ctx, w)
		if err != nil {
			return err
		}
		loaded = &lr
		fmt.Fprintf(stdout, "loaded %d players in %.1fs (%.0f players/s)\n\n", lr.Records, lr.Seconds, lr.RecordsPer)
	}
	var results []bench.Result
	for _, n := range clients {
		opts.Clients = n
		r, err := bench.NewGroupsRunner(d, opts)
		if err != nil {
			return err
		}
		for i := range f.rounds * len(modes) {
			round, m := i/len(modes), i%len(modes)
			if round%2 == 1 {
				m = len(modes) - 1 - m // every other round in the other order
			}
			w.Mode = modes[m]
			res, err := r.Run(ctx, w)
			if err != nil {
				return err
			}
			if f.rounds > 1 {
				res.Params.Round = round + 1
			}
			res.Params.NoCachedSnapshot = f.noCache && w.Mode == bench.GroupsModeGrouped
			res.Load, loaded = loaded, nil
			if f.version != "" {
				res.Version = f.version
			}
			if err := bench.WriteGroupsSummary(stdout, res); err != nil {
				return err
			}
			if f.out != "" {
				if err := bench.AppendResult(f.out, res); err != nil {
					return err
				}
			}
			results = append(results, res)
		}
	}
	ids, err := d.Groups(ctx)
	if err != nil {
		return err
	}
	if len(ids) > 0 {
		return fmt.Errorf("%d groups of collection %q are left after the runs (e.g. %s): a deletion failed", len(ids), f.table, ids[0])
	}
	return bench.WriteGroupsMarkdown(stdout, results)
}
