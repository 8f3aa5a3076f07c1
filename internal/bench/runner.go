package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Options configure a Runner. The zero value of each field means its
// default.
type Options struct {
	// Records is the number of records of the load phase; 0 means 100,000:
	// a working set a few times YCSB's default of 1,000, so that zipfian
	// reads do not all hit one cache line, yet loaded in seconds.
	Records int
	// ValueSize is the size of a value in bytes; 0 means 100.
	ValueSize int
	// Clients is the number of concurrent clients, each with one request
	// in flight (a closed loop); 0 means 64.
	Clients int
	// Rate, when positive, is the operations per second the clients
	// start together (YCSB's -target): each client starts its operations
	// on a fixed schedule, Clients/Rate seconds apart, instead of one as
	// soon as the last ended. A latency counts from the operation's
	// scheduled start, so a server that falls behind is charged for the
	// wait it caused (no coordinated omission): two systems are then
	// compared at the same load rather than each at its own pace.
	Rate float64
	// Duration is the measured time of a run; 0 means 30 seconds.
	Duration time.Duration
	// Warmup runs before the measured time and is not recorded; 0 means
	// none.
	Warmup time.Duration
	// Distribution, when set, replaces the request distribution of every
	// workload (DistUniform, DistZipfian, DistLatest).
	Distribution string
	// Seed seeds the clients' random sources; 0 means one taken from the
	// clock. Results record the seed used.
	Seed uint64
	// LoadBatch is the number of records per load request; 0 means 100.
	LoadBatch int
	// Addr is recorded in results; the runner does not dial it.
	Addr string
	// Shards is recorded in results (the driver's DriverOptions.Shards).
	Shards int
	// Replicas is recorded in results (the driver's
	// DriverOptions.Replicas).
	Replicas int
	// System, when set, replaces the driver's System() in results, e.g. to
	// tell a three-node cluster's results from a single node's.
	System string

	// Window, when positive, splits the measured time into windows of
	// this length and records each one's operations and slowest latency
	// in Result.Windows, by when the operations started: where a run's
	// tail comes from stalls, they show as windows.
	Window time.Duration

	// Users and PerUser size the timeline workload: Users users with
	// PerUser records each; 0 means 1,000 users and 20 records.
	Users, PerUser int

	// Progress, when set, is called about every ProgressInterval (0 means
	// 250ms) from a goroutine of the runner while a phase runs, and once at
	// its end with Done set.
	Progress         func(Status)
	ProgressInterval time.Duration
}

// EnsureDefaults fills the defaults of zero fields.
func (o *Options) EnsureDefaults() {
	if o.Records == 0 {
		o.Records = 100_000
	}
	if o.ValueSize == 0 {
		o.ValueSize = 100
	}
	if o.Clients == 0 {
		o.Clients = 64
	}
	if o.Duration == 0 {
		o.Duration = 30 * time.Second
	}
	if o.Seed == 0 {
		o.Seed = uint64(time.Now().UnixNano())
	}
	if o.LoadBatch == 0 {
		o.LoadBatch = 100
	}
	if o.Users == 0 {
		o.Users = 1000
	}
	if o.PerUser == 0 {
		o.PerUser = 20
	}
	if o.ProgressInterval == 0 {
		o.ProgressInterval = 250 * time.Millisecond
	}
}

// Validate reports every problem of o.
func (o *Options) Validate() error {
	var errs []string
	if o.Records < 1 {
		errs = append(errs, fmt.Sprintf("records %d: need at least 1", o.Records))
	}
	if o.ValueSize < 0 {
		errs = append(errs, fmt.Sprintf("value size %d is negative", o.ValueSize))
	}
	if o.Clients < 1 {
		errs = append(errs, fmt.Sprintf("clients %d: need at least 1", o.Clients))
	}
	if o.Duration <= 0 {
		errs = append(errs, fmt.Sprintf("duration %v: must be positive", o.Duration))
	}
	if o.Warmup < 0 {
		errs = append(errs, fmt.Sprintf("warmup %v is negative", o.Warmup))
	}
	if o.Rate < 0 || math.IsNaN(o.Rate) || math.IsInf(o.Rate, 0) {
		errs = append(errs, fmt.Sprintf("rate %v: must be a positive number of operations per second, or 0 for a closed loop", o.Rate))
	} else if o.Rate > 0 && o.Clients > 0 && time.Duration(float64(o.Clients)/o.Rate*float64(time.Second)) < time.Microsecond {
		errs = append(errs, fmt.Sprintf("rate %v: over a million operations per second per client (%d clients)", o.Rate, o.Clients))
	}
	switch o.Distribution {
	case "", DistUniform, DistZipfian, DistLatest:
	default:
		errs = append(errs, fmt.Sprintf("distribution %q: use uniform, zipfian or latest", o.Distribution))
	}
	if o.Window < 0 {
		errs = append(errs, fmt.Sprintf("window %v is negative", o.Window))
	} else if o.Window > 0 && o.Duration/o.Window > maxWindows {
		errs = append(errs, fmt.Sprintf("window %v: more than %d windows in %v", o.Window, maxWindows, o.Duration))
	}
	if o.LoadBatch < 1 {
		errs = append(errs, fmt.Sprintf("load batch %d: need at least 1", o.LoadBatch))
	}
	if o.Replicas < 0 {
		errs = append(errs, fmt.Sprintf("replicas %d is negative", o.Replicas))
	}
	if o.Users < 1 {
		errs = append(errs, fmt.Sprintf("users %d: need at least 1", o.Users))
	}
	if o.PerUser < 1 {
		errs = append(errs, fmt.Sprintf("records per user %d: need at least 1", o.PerUser))
	}
	return joinProblems("options", errs)
}

// Status is the progress of a phase.
type Status struct {
	// Phase is "load", "warmup" or "run".
	Phase string
	// Workload is the workload's name ("" while loading).
	Workload string
	// Elapsed and Total are the time the phase has run and will run; for
	// the load phase they count records instead (Total = Records).
	Elapsed, Total time.Duration
	// Ops and Errors count the operations (records, while loading) done
	// in the phase so far.
	Ops, Errors int64
	// Done is set on the last call of a phase.
	Done bool
}

// Runner runs workloads against one driver. Its runs share the insert
// counter: records [0, inserted) exist in the store.
type Runner struct {
	d    Driver
	opts Options
	// inserts hands out the item numbers of inserts; the items below
	// inserts.Count() are in the store. nil until Load or the first Run.
	inserts *Counter
	runs    uint64 // counts runs, to give each its own random streams
	// meter reads the server's CPU time, if the driver can.
	meter CPUMeter
}

// NewRunner returns a runner of d with opts.
func NewRunner(d Driver, opts Options) (*Runner, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	m, _ := d.(CPUMeter)
	return &Runner{d: d, opts: opts, meter: m}, nil
}

// Options are the runner's options, defaults filled.
func (r *Runner) Options() Options { return r.opts }

// LoadResult describes a load phase.
type LoadResult struct {
	Records    int     `json:"records"`
	Seconds    float64 `json:"seconds"`
	RecordsPer float64 `json:"records_per_sec"`
}

// Load empties the store (Driver.Reset) and writes Records records,
// LoadBatch per request, from Clients clients.
func (r *Runner) Load(ctx context.Context) (LoadResult, error) {
	if err := r.d.Reset(ctx); err != nil {
		return LoadResult{}, fmt.Errorf("resetting %s: %w", r.d.System(), err)
	}
	n, b := r.opts.Records, r.opts.LoadBatch
	var next atomic.Int64 // the next batch
	var done atomic.Int64 // records written
	stopProgress := r.progress(func() Status {
		return Status{Phase: "load", Elapsed: time.Duration(done.Load()), Total: time.Duration(n), Ops: done.Load()}
	})
	start := time.Now()
	err := r.parallel(ctx, func(ctx context.Context, id int) error {
		rng := rand.New(rand.NewPCG(r.opts.Seed, uint64(id)))
		for {
			i := int(next.Add(1) - 1)
			lo := i * b
			if lo >= n {
				return nil
			}
			hi := min(lo+b, n)
			keys := make([][]byte, 0, hi-lo)
			values := make([][]byte, 0, hi-lo)
			for k := lo; k < hi; k++ {
				keys = append(keys, KeyName(uint64(k)))
				v := make([]byte, r.opts.ValueSize)
				fillValue(rng, v)
				values = append(values, v)
			}
			if err := r.d.Load(ctx, keys, values); err != nil {
				return fmt.Errorf("loading records %d to %d into %s: %w", lo, hi-1, r.d.System(), err)
			}
			done.Add(int64(hi - lo))
		}
	})
	stopProgress()
	if err != nil {
		return LoadResult{}, err
	}
	secs := time.Since(start).Seconds()
	r.inserts = NewCounter(uint64(n))
	return LoadResult{Records: n, Seconds: secs, RecordsPer: float64(n) / secs}, nil
}

// parallel runs f on Clients goroutines and returns the first error; an
// error cancels the others' context.
func (r *Runner) parallel(ctx context.Context, f func(ctx context.Context, id int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for id := range r.opts.Clients {
		wg.Go(func() {
			if err := f(withClient(ctx, id), id); err != nil {
				once.Do(func() { first = err; cancel() })
			}
		})
	}
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}

// progress calls Options.Progress with snap() every ProgressInterval until
// the returned function is called, which makes a last call with Done set.
func (r *Runner) progress(snap func() Status) (stop func()) {
	if r.opts.Progress == nil {
		return func() {}
	}
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(r.opts.ProgressInterval)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				r.opts.Progress(snap())
			}
		}
	})
	return func() {
		close(quit)
		wg.Wait()
		s := snap()
		s.Done = true
		r.opts.Progress(s)
	}
}

// Run runs workload w for Warmup then Duration and returns what the
// measured time recorded. Without a Load first it checks that the store
// holds the benchmark's records (ErrNotLoaded otherwise) and assumes there
// are Records of them.
func (r *Runner) Run(ctx context.Context, w Workload) (Result, error) {
	if r.opts.Distribution != "" {
		w.Distribution = r.opts.Distribution
	}
	if err := w.Validate(); err != nil {
		return Result{}, err
	}
	if r.inserts == nil {
		if err := r.d.Check(ctx); err != nil {
			return Result{}, err
		}
		r.inserts = NewCounter(uint64(r.opts.Records))
	}
	version, err := r.d.Version(ctx)
	if err != nil {
		return Result{}, fmt.Errorf("asking %s for its version: %w", r.d.System(), err)
	}
	var latest *Latest
	if w.Distribution == DistLatest {
		latest = NewLatest(r.inserts)
	}
	records := uint64(r.opts.Records)
	newChooser := func() Chooser {
		switch w.Distribution {
		case DistUniform:
			return Uniform{N: records}
		case DistLatest:
			return latest.Clone()
		default:
			return NewScrambledZipfian(records)
		}
	}
	ops := opNames[:]
	res, err := r.loop(ctx, w.Name, ops, func(c *client) stepFunc {
		chooser := newChooser()
		c.value = make([]byte, r.opts.ValueSize)
		// nextKey is YCSB's nextKeynum: a chosen item not yet
		// acknowledged is drawn again.
		nextKey := func() []byte {
			for {
				k := chooser.Next(c.rng)
				if k <= r.inserts.Last() {
					return KeyName(k)
				}
			}
		}
		return func(ctx context.Context) error {
			op := w.ChooseOp(c.rng)
			switch op {
			case OpRead:
				key := nextKey()
				return c.do(int(OpRead), func() error { return r.d.Read(ctx, key) })
			case OpUpdate:
				key := nextKey()
				fillValue(c.rng, c.value)
				return c.do(int(OpUpdate), func() error { return r.d.Update(ctx, key, c.value) })
			case OpInsert:
				k := r.inserts.Next()
				defer r.inserts.Acknowledge(k)
				fillValue(c.rng, c.value)
				return c.do(int(OpInsert), func() error { return r.d.Insert(ctx, KeyName(k), c.value) })
			case OpScan:
				key, n := nextKey(), w.ScanLength(c.rng)
				return c.do(int(OpScan), func() error { _, err := r.d.Scan(ctx, key, n); return err })
			case OpReadModifyWrite:
				key := nextKey()
				return c.do(int(OpReadModifyWrite), func() error {
					if err := c.do(int(OpRead), func() error { return r.d.Read(ctx, key) }); err != nil {
						return err
					}
					fillValue(c.rng, c.value)
					return c.do(int(OpUpdate), func() error { return r.d.Update(ctx, key, c.value) })
				})
			}
			return fmt.Errorf("bench: workload %s chose unknown op %v", w.Name, op)
		}
	})
	if err != nil {
		return Result{}, err
	}
	res.System, res.Version = r.system(), version
	res.Params.Distribution = w.Distribution
	if w.Proportions[OpScan] > 0 {
		res.Params.MaxScanLength = w.MaxScanLength
	}
	return res, nil
}

// PacedWorkload is the name under which results record workload w run at
// rate operations per second (Options.Rate), e.g. "a@45000/s": reports
// and charts keep it apart from the closed-loop runs of w.
func PacedWorkload(w string, rate float64) string {
	return fmt.Sprintf("%s@%g/s", w, rate)
}

// stepFunc runs one top-level operation of a client: it times the
// operations it performs with client.do and answers the error of the
// top-level one.
type stepFunc func(ctx context.Context) error

// client is the state of one closed-loop client of a run. Only its own
// goroutine touches it until the run ends.
type client struct {
	rng       *rand.Rand
	value     []byte // scratch value of writes
	measuring bool   // the current operation started in the measured time
	ops       []opStats
	all       Histogram // successful top-level operations
	allErrors int64     // failed top-level operations
	samples   []string  // the first errors, distinct
	lastEnd   time.Time // the end of the last measured operation
	windows   []Window  // by start time, when Options.Window > 0
	// scheduled is the scheduled start of the current top-level
	// operation in a paced run (Options.Rate), zero otherwise: its first
	// client.do counts its latency from there.
	scheduled time.Time
}

// opStats are a client's records of one operation.
type opStats struct {
	hist   Histogram // successful operations only
	errors int64
}

// maxSamples bounds the distinct error messages a result keeps.
const maxSamples = 5

// do runs f as operation op and, if the current top-level operation
// started in the measured time, records its latency or its error.
func (c *client) do(op int, f func() error) error {
	t0 := time.Now()
	if !c.scheduled.IsZero() {
		t0, c.scheduled = c.scheduled, time.Time{}
	}
	err := f()
	if !c.measuring {
		return err
	}
	if err != nil {
		c.ops[op].errors++
		c.sample(err)
		return err
	}
	c.ops[op].hist.Record(time.Since(t0))
	return nil
}

func (c *client) sample(err error) {
	if len(c.samples) >= maxSamples {
		return
	}
	msg := err.Error()
	for _, s := range c.samples {
		if s == msg {
			return
		}
	}
	c.samples = append(c.samples, msg)
}

// loop runs Clients clients, each built by newClient, for Warmup then
// Duration, and merges what they recorded: closed-loop clients, or with a
// Rate clients that start operations on a schedule. ops names the
// operation ids the steps pass to client.do.
func (r *Runner) loop(ctx context.Context, workload string, ops []string, newClient func(c *client) stepFunc) (Result, error) {
	r.runs++
	start := time.Now()
	measureStart := start.Add(r.opts.Warmup)
	end := measureStart.Add(r.opts.Duration)
	// Operations still in flight long after the end (a server that hangs)
	// are cut off rather than awaited forever.
	opCtx, cancel := context.WithDeadline(ctx, end.Add(30*time.Second))
	defer cancel()

	var done, failed atomic.Int64 // top-level operations of the current phase
	var measuring atomic.Bool
	stopProgress := r.progress(func() Status {
		s := Status{Phase: "warmup", Workload: workload, Elapsed: time.Since(start), Total: r.opts.Warmup, Ops: done.Load(), Errors: failed.Load()}
		if measuring.Load() {
			s.Phase, s.Elapsed, s.Total = "run", time.Since(measureStart), r.opts.Duration
		}
		s.Elapsed = min(s.Elapsed, s.Total)
		return s
	})
	// The CPU window opens when the first client enters the measured
	// time, before its operation starts: the clients entering it wait in
	// switchOnce until the meters are read, so no measured operation runs
	// before them. (A timer firing at measureStart could run late on a
	// busy machine, after measured operations began.)
	cpu := cpuWindow{meter: r.meter}
	var switchOnce sync.Once
	switchPhase := func() {
		switchOnce.Do(func() {
			cpu.start(opCtx)
			done.Store(0)
			failed.Store(0)
			measuring.Store(true)
		})
	}
	if r.opts.Warmup == 0 {
		switchPhase()
	}

	clients := make([]*client, r.opts.Clients)
	var wg sync.WaitGroup
	for id := range clients {
		c := &client{
			rng: rand.New(rand.NewPCG(r.opts.Seed, r.runs<<32|uint64(id))),
			ops: make([]opStats, len(ops)),
		}
		clients[id] = c
		step := newClient(c)
		cctx := withClient(opCtx, id)
		var (
			interval time.Duration
			next     time.Time
		)
		if r.opts.Rate > 0 {
			// The clients' schedules are staggered over one interval, so
			// that they do not all start at once.
			interval = time.Duration(float64(r.opts.Clients) / r.opts.Rate * float64(time.Second))
			next = start.Add(interval * time.Duration(id) / time.Duration(r.opts.Clients))
		}
		wg.Go(func() {
			for ctx.Err() == nil {
				now := time.Now()
				if interval > 0 {
					if !next.Before(end) {
						return
					}
					if !sleepUntil(ctx, next) {
						return
					}
					now, c.scheduled = next, next
					next = next.Add(interval)
				}
				if !now.Before(end) {
					return
				}
				c.measuring = !now.Before(measureStart)
				if c.measuring {
					switchPhase()
				}
				err := step(cctx)
				c.scheduled = time.Time{}
				if c.measuring {
					t := time.Now()
					c.lastEnd = t
					if err == nil {
						c.all.Record(t.Sub(now))
						c.recordWindow(now.Sub(measureStart), t.Sub(now), r.opts.Window)
					} else {
						c.allErrors++
					}
				}
				done.Add(1)
				if err != nil {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	stopProgress()
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}

	if r.opts.Rate > 0 {
		workload = PacedWorkload(workload, r.opts.Rate)
	}
	res := Result{
		Workload: workload,
		Time:     start.UTC(),
		Params:   r.params(),
		Host:     hostInfo(),
		Latency:  map[string]Latency{},
	}
	cpu.finish(ctx, &res)
	var all Histogram
	last := measureStart
	merged := make([]opStats, len(ops))
	var samples []string
	res.Windows = mergeWindows(clients)
	for _, c := range clients {
		all.Merge(&c.all)
		res.Errors += c.allErrors
		for i := range ops {
			merged[i].hist.Merge(&c.ops[i].hist)
			merged[i].errors += c.ops[i].errors
		}
		if c.lastEnd.After(last) {
			last = c.lastEnd
		}
		for _, s := range c.samples {
			if len(samples) < maxSamples && !contains(samples, s) {
				samples = append(samples, s)
			}
		}
	}
	res.Seconds = last.Sub(measureStart).Seconds()
	res.Ops = int64(all.Count())
	if res.Seconds > 0 {
		res.OpsPerSec = float64(res.Ops) / res.Seconds
	}
	for i, name := range ops {
		m := &merged[i]
		if m.hist.Count() == 0 && m.errors == 0 {
			continue
		}
		res.Latency[name] = latencyOf(&m.hist, m.errors)
		// Errors of nested operations (the read of a read-modify-write)
		// show in their own line; the total counts top-level ones, below.
	}
	res.Latency[AllOps] = latencyOf(&all, res.Errors)
	res.ErrorSamples = samples
	if res.Ops == 0 && res.Errors > 0 {
		return res, fmt.Errorf("%w: every operation of workload %s against %s failed; first: %s",
			errAllFailed, workload, r.system(), first(samples))
	}
	return res, nil
}

// maxWindows bounds Options.Duration/Options.Window: every client keeps
// its own windows until the run ends.
const maxWindows = 10_000

// recordWindow counts a measured operation that started at offset from
// the measured time's start and took latency, in windows of length w.
func (c *client) recordWindow(offset, latency, w time.Duration) {
	if w <= 0 || offset < 0 {
		return
	}
	i := int(offset / w)
	for len(c.windows) <= i {
		c.windows = append(c.windows, Window{StartMs: float64(time.Duration(len(c.windows))*w) / 1e6})
	}
	win := &c.windows[i]
	win.Ops++
	win.MaxMs = max(win.MaxMs, float64(latency)/1e6)
}

// mergeWindows sums the clients' windows: operations added, the slowest
// kept.
func mergeWindows(clients []*client) []Window {
	var out []Window
	for _, c := range clients {
		for i, w := range c.windows {
			if i == len(out) {
				out = append(out, Window{StartMs: w.StartMs})
			}
			out[i].Ops += w.Ops
			out[i].MaxMs = max(out[i].MaxMs, w.MaxMs)
		}
	}
	return out
}

// sleepUntil waits until t, or answers false when ctx ends first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// errAllFailed is a run in which nothing succeeded; its result still
// carries the error samples.
var errAllFailed = errors.New("bench: no operation succeeded")

func first(s []string) string {
	if len(s) == 0 {
		return "(none recorded)"
	}
	return s[0]
}

func contains(s []string, x string) bool {
	for _, y := range s {
		if x == y {
			return true
		}
	}
	return false
}

func (r *Runner) params() Params {
	o := r.opts
	return Params{
		Addr:            o.Addr,
		Records:         o.Records,
		ValueSize:       o.ValueSize,
		Clients:         o.Clients,
		DurationSeconds: o.Duration.Seconds(),
		WarmupSeconds:   o.Warmup.Seconds(),
		Rate:            o.Rate,
		Seed:            o.Seed,
		Shards:          o.Shards,
		Replicas:        o.Replicas,
	}
}

// system is the system's name in results: Options.System, else the
// driver's.
func (r *Runner) system() string {
	if r.opts.System != "" {
		return r.opts.System
	}
	return r.d.System()
}

func hostInfo() Host {
	return Host{GOOS: runtime.GOOS, GOARCH: runtime.GOARCH, NumCPU: runtime.NumCPU(), GoVersion: runtime.Version()}
}

// sortedOps returns the operation names of res in a stable order: the core
// operations first, as opNames lists them, then others, then AllOps.
func sortedOps(res Result) []string {
	rank := func(name string) int {
		for i, n := range opNames {
			if n == name {
				return i
			}
		}
		if name == AllOps {
			return len(opNames) + 1
		}
		return len(opNames)
	}
	var names []string
	for name := range res.Latency {
		names = append(names, name)
	}
	sort.Slice(names, func(i, j int) bool {
		ri, rj := rank(names[i]), rank(names[j])
		if ri != rj {
			return ri < rj
		}
		return names[i] < names[j]
	})
	return names
}
