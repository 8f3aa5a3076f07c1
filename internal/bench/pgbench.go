package bench

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"time"
)

// PgbenchSystem is the system name of PostgreSQL measured by pgbench.
const PgbenchSystem = "postgresql-pgbench"

// PgbenchTxn is one transaction of a pgbench per-transaction log (pgbench
// -l): when it ended, how long it took with its retries, how many retries
// it needed, and whether it failed.
type PgbenchTxn struct {
	End     time.Time
	Latency time.Duration
	Retries int
	Failed  bool
}

// ParsePgbenchLog reads a pgbench per-transaction log written with -l and
// --max-tries (PostgreSQL 15 and later), one transaction a line:
//
//	client_id transaction_no time script_no time_epoch time_us [retries]
//
// where time is the latency in microseconds, or "failed", "serialization"
// or "deadlock" for a transaction that failed, and retries is present when
// --max-tries is not 1.
func ParsePgbenchLog(r io.Reader) ([]PgbenchTxn, error) {
	var out []PgbenchTxn
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if len(f) < 6 {
			return nil, fmt.Errorf("%w: pgbench log line %d: %q has %d fields, want 6 or more", ErrBadPgbenchLog, line, sc.Text(), len(f))
		}
		var t PgbenchTxn
		sec, err1 := strconv.ParseInt(f[4], 10, 64)
		usec, err2 := strconv.ParseInt(f[5], 10, 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("%w: pgbench log line %d: bad time %s %s", ErrBadPgbenchLog, line, f[4], f[5])
		}
		t.End = time.Unix(sec, usec*1000)
		switch f[2] {
		case "failed", "serialization", "deadlock", "skipped":
			t.Failed = true
		default:
			us, err := strconv.ParseInt(f[2], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("%w: pgbench log line %d: bad latency %q", ErrBadPgbenchLog, line, f[2])
			}
			t.Latency = time.Duration(us) * time.Microsecond
		}
		if len(f) >= 7 {
			n, err := strconv.Atoi(f[len(f)-1])
			if err != nil {
				return nil, fmt.Errorf("%w: pgbench log line %d: bad retries %q", ErrBadPgbenchLog, line, f[len(f)-1])
			}
			t.Retries = n
		}
		out = append(out, t)
	}
	return out, sc.Err()
}

// ErrBadPgbenchLog is a pgbench log that ParsePgbenchLog cannot read.
var ErrBadPgbenchLog = fmt.Errorf("bench: not a pgbench per-transaction log")

// PgbenchRun describes a pgbench run of scripts/txn.pgbench, to turn its
// logs into a Result.
type PgbenchRun struct {
	Keys, Ops, Clients int
	// Warmup and Duration split the run: transactions that started in the
	// first Warmup after the first transaction started are not counted,
	// nor those that started after Warmup+Duration.
	Warmup, Duration time.Duration
	Version          string
	Lazy             bool
	Seed             uint64
}

// PgbenchResult reads the per-transaction logs of a pgbench run (one file
// per pgbench thread) and summarizes it as a txn workload result of
// PgbenchSystem.
func PgbenchResult(files []string, run PgbenchRun) (Result, error) {
	var txns []PgbenchTxn
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return Result{}, err
		}
		t, err := ParsePgbenchLog(f)
		f.Close()
		if err != nil {
			return Result{}, fmt.Errorf("%s: %w", name, err)
		}
		txns = append(txns, t...)
	}
	if len(txns) == 0 {
		return Result{}, fmt.Errorf("%w: no transaction in %s", ErrNoResults, strings.Join(files, ", "))
	}
	start := time.Unix(math.MaxInt32, 0)
	for _, t := range txns {
		if s := t.End.Add(-t.Latency); s.Before(start) {
			start = s
		}
	}
	from, to := start.Add(run.Warmup), start.Add(run.Warmup+run.Duration)
	var (
		lat      Histogram
		attempts AttemptHistogram
		failed   int64
		last     = from
	)
	for _, t := range txns {
		s := t.End.Add(-t.Latency)
		if s.Before(from) || !s.Before(to) {
			continue
		}
		if t.End.After(last) {
			last = t.End
		}
		if t.Failed {
			failed++
			continue
		}
		lat.Record(t.Latency)
		attempts.Record(t.Retries + 1)
	}
	res := Result{
		System:   PgbenchSystem,
		Version:  run.Version,
		Workload: TxnWorkloadName,
		Time:     start.UTC(),
		Params: Params{
			Records: run.Keys, Clients: run.Clients, Distribution: DistUniform, Seed: run.Seed,
			DurationSeconds: run.Duration.Seconds(), WarmupSeconds: run.Warmup.Seconds(),
			TxnMode: TxnModeSerializable, TxnOps: run.Ops, TxnLazy: run.Lazy,
		},
		Host:    hostInfo(),
		Seconds: last.Sub(from).Seconds(),
		Ops:     int64(lat.Count()),
		Errors:  failed,
		Latency: map[string]Latency{},
	}
	if res.Seconds > 0 {
		res.OpsPerSec = float64(res.Ops) / res.Seconds
	}
	res.Latency[TxnOp] = latencyOf(&lat, failed)
	res.Latency[AllOps] = latencyOf(&lat, failed)
	s := attempts.Stats()
	res.Attempts = &s
	return res, nil
}
