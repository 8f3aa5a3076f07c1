package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"time"
)

// AllOps is the key of Result.Latency that covers every top-level
// operation of a run (a read-modify-write counts once, not as its read and
// its update).
const AllOps = "all"

// Result is the record of one run: one workload against one system. A
// results file holds one JSON object per line (AppendResult, ReadResults).
type Result struct {
	System   string `json:"system"`
	Version  string `json:"version"`
	Workload string `json:"workload"`
	// Time is when the run started, in UTC.
	Time   time.Time `json:"time"`
	Params Params    `json:"params"`
	// Host describes the machine of the benchmark client.
	Host Host `json:"host"`
	// Seconds is the measured time: from the end of the warm-up to the end
	// of the last operation that started before the end.
	Seconds float64 `json:"seconds"`
	// Ops counts the successful top-level operations of the measured time;
	// OpsPerSec is Ops/Seconds.
	Ops       int64   `json:"ops"`
	OpsPerSec float64 `json:"ops_per_sec"`
	// Errors counts the failed top-level operations of the measured time.
	Errors       int64    `json:"errors"`
	ErrorSamples []string `json:"error_samples,omitempty"`
	// Latency holds the latencies of each operation that ran, by name
	// ("read", "update", "insert", "scan", "rmw", "timeline"), and of all
	// top-level operations under AllOps. A nested operation (the read of a
	// read-modify-write) counts under its own name too, as in YCSB.
	Latency map[string]Latency `json:"latency"`
	// Windows are the measured time's windows (Options.Window), in order.
	Windows []Window `json:"windows,omitempty"`
	// Load describes the load phase that preceded the run, if any.
	Load *LoadResult `json:"load,omitempty"`
	// Attempts counts the attempts per committed transaction (txn
	// workload, serializable mode only).
	Attempts *AttemptStats `json:"attempts,omitempty"`
	// Groups are the games, refusals and rates of a groups run.
	Groups *GroupsStats `json:"groups,omitempty"`
	// ServerCPUSeconds is the CPU time the server (every node or member
	// the driver talks to) used over the measured time, where the driver
	// can ask (CPUMeter); ClientCPUSeconds that of the benchmark process.
	// 0: not measured.
	ServerCPUSeconds float64 `json:"server_cpu_seconds,omitempty"`
	ClientCPUSeconds float64 `json:"client_cpu_seconds,omitempty"`
	// ClientSchedP99Us is the 99th percentile of how long the benchmark
	// process's goroutines waited to run once runnable, over the measured
	// time (Go's /sched/latencies:seconds): a client short of CPU adds
	// that much to the latencies it measures, whatever the system.
	ClientSchedP99Us float64 `json:"client_sched_p99_us,omitempty"`
}

// Params are the parameters of a run.
type Params struct {
	Addr            string  `json:"addr,omitempty"`
	Records         int     `json:"records"`
	ValueSize       int     `json:"value_size"`
	Clients         int     `json:"clients"`
	DurationSeconds float64 `json:"duration_seconds"`
	WarmupSeconds   float64 `json:"warmup_seconds"`
	// Rate is the operations per second a paced run started (its
	// latencies count from their scheduled starts); 0 for a closed loop.
	Rate          float64 `json:"rate,omitempty"`
	Distribution  string  `json:"distribution"`
	MaxScanLength int     `json:"max_scan_length,omitempty"`
	Seed          uint64  `json:"seed"`
	Shards        int     `json:"shards,omitempty"`
	Replicas      int     `json:"replicas,omitempty"`
	// Timeline workload only.
	Partitioning string `json:"partitioning,omitempty"`
	Users        int    `json:"users,omitempty"`
	PerUser      int    `json:"records_per_user,omitempty"`
	// Txn workload only: the mode (TxnModeSerializable or TxnModeNone),
	// the keys each transaction reads and writes, and whether the key
	// range was left to fill lazily instead of loaded. Records is the
	// size of the key range.
	TxnMode string `json:"txn_mode,omitempty"`
	TxnOps  int    `json:"txn_ops,omitempty"`
	TxnLazy bool   `json:"txn_lazy,omitempty"`
	// TxnReads is TxnReadsBatch when a transaction read its keys in one
	// request; "" when it read them one by one.
	TxnReads string `json:"txn_reads,omitempty"`
	// Groups workload only: the mode (GroupsModeGrouped or
	// GroupsModeUngrouped), the mean and standard deviation of a game's
	// size, how its players are chosen, its moves and the least think
	// time before a move. Records is the number of players.
	GroupMode       string  `json:"group_mode,omitempty"`
	GroupSize       int     `json:"group_size,omitempty"`
	GroupSizeStddev float64 `json:"group_size_stddev,omitempty"`
	GroupMembers    string  `json:"group_members,omitempty"`
	OpsPerGroup     int     `json:"ops_per_group,omitempty"`
	ThinkMs         float64 `json:"think_ms,omitempty"`
	// Round numbers, from 1, the runs of a groups benchmark that ran
	// each mode several times, alternating them (--rounds), or of a
	// comparison that ran every system several times in turn (groupkv
	// bench --round); 0 for a run of one round.
	Round int `json:"round,omitempty"`
	// NoCachedSnapshot: the grouped games' moves read the group's
	// snapshot from its leader each time (bench groups
	// --no-cached-snapshot), not from the one the previous move's commit
	// brought back.
	NoCachedSnapshot bool `json:"no_cached_snapshot,omitempty"`
}

// Host describes the machine that ran the benchmark client.
type Host struct {
	GOOS      string `json:"goos"`
	GOARCH    string `json:"goarch"`
	NumCPU    int    `json:"num_cpu"`
	GoVersion string `json:"go_version"`
}

// Latency summarizes the latencies of one operation, in microseconds.
// Percentiles are within 1% of the exact value (see Histogram).
type Latency struct {
	Count  int64   `json:"count"`
	Errors int64   `json:"errors"`
	MeanUs float64 `json:"mean_us"`
	P50Us  float64 `json:"p50_us"`
	P99Us  float64 `json:"p99_us"`
	P999Us float64 `json:"p999_us"`
	MaxUs  float64 `json:"max_us"`
}

func latencyOf(h *Histogram, errors int64) Latency {
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	return Latency{
		Count:  int64(h.Count()),
		Errors: errors,
		MeanUs: us(h.Mean()),
		P50Us:  us(h.Percentile(50)),
		P99Us:  us(h.Percentile(99)),
		P999Us: us(h.Percentile(99.9)),
		MaxUs:  us(h.Max()),
	}
}

// AppendResult appends res to the results file at path as one JSON line,
// creating the file if needed.
func AppendResult(path string, res Result) error {
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// ReadResults reads every result of a results file: JSON objects one after
// the other (one per line, as AppendResult writes them), or one JSON array
// of them.
func ReadResults(r io.Reader) ([]Result, error) {
	dec := json.NewDecoder(r)
	var out []Result
	for {
		var raw json.RawMessage
		err := dec.Decode(&raw)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("bench: reading results (record %d): %w", len(out)+1, err)
		}
		if len(raw) > 0 && raw[0] == '[' {
			var rs []Result
			if err := json.Unmarshal(raw, &rs); err != nil {
				return nil, fmt.Errorf("bench: reading results: %w", err)
			}
			out = append(out, rs...)
			continue
		}
		var res Result
		if err := json.Unmarshal(raw, &res); err != nil {
			return nil, fmt.Errorf("bench: reading results (record %d): %w", len(out)+1, err)
		}
		out = append(out, res)
	}
}

// ReadResultsFile reads the results file at path (see ReadResults).
func ReadResultsFile(path string) ([]Result, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadResults(f)
}

// LatestResults keeps, for each system, workload and round, the last result
// of rs (the most recent run in an appended file), ordered by workload,
// then system (Targets' order first, others after by name), then round.
func LatestResults(rs []Result) []Result {
	type key struct {
		system, workload string
		round            int
	}
	last := map[key]int{}
	for i, r := range rs {
		last[key{r.System, r.Workload, r.Params.Round}] = i
	}
	var out []Result
	for i, r := range rs {
		if last[key{r.System, r.Workload, r.Params.Round}] == i {
			out = append(out, r)
		}
	}
	sortResults(out)
	return out
}

// MedianResults keeps, for each system and workload, the round of rs
// whose throughput is the median of its rounds (the lower of the middle
// two for an even count), in LatestResults' order. For a paced workload
// (Params.Rate), whose rounds all ran at its rate, it is the round whose
// p99 latency is the median.
func MedianResults(rs []Result) []Result {
	rs = LatestResults(rs)
	type key struct{ system, workload string }
	byKey := map[key][]Result{}
	var keys []key
	for _, r := range rs {
		k := key{r.System, r.Workload}
		if _, ok := byKey[k]; !ok {
			keys = append(keys, k)
		}
		byKey[k] = append(byKey[k], r)
	}
	out := make([]Result, 0, len(keys))
	for _, k := range keys {
		runs := byKey[k]
		by := func(r Result) float64 { return r.OpsPerSec }
		if runs[0].Params.Rate > 0 {
			by = func(r Result) float64 { return r.Latency[AllOps].P99Us }
		}
		sort.SliceStable(runs, func(i, j int) bool { return by(runs[i]) < by(runs[j]) })
		out = append(out, runs[(len(runs)-1)/2])
	}
	return out
}

// Window is one window of a run's measured time (Options.Window): the
// operations that started in it and succeeded, and the slowest of them.
type Window struct {
	StartMs float64 `json:"start_ms"`
	Ops     int64   `json:"ops"`
	MaxMs   float64 `json:"max_ms"`
}
