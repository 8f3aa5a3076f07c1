package txn

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/cockroachdb/datadriven"
)

// TestLockTable runs the scripts in testdata/locktable against a LockTable
// and a scripted Resolver. Rewrite the expected outputs with -rewrite and
// read the diff before keeping it.
//
// Each script runs in a synctest bubble: after every command the test waits
// until every Acquire it started has returned or is durably blocked, so
// "waiting" means blocked for good until another command changes something.
// The clock is the bubble's: it moves only with tick, so Check is called only
// when the script ticks.
//
// Transactions are named by their ids (t1, t2, ...); a transaction is
// defined at its first use by prio=N (or plain, a plain write) and keeps its
// priority. Ties of priority are broken by name (Older). A plain write has
// PlainPriority unless prio says otherwise.
//
// Commands (arguments in brackets are optional):
//
//	new [check-interval=DURATION]
//	    A new, empty table (term 1; the default interval is 1s). Acquires
//	    still waiting in the previous table are canceled first.
//	acquire txn=T [prio=N] [plain] (key=K | from=K [to=K]) mode=s|x [coll=N] [canceled]
//	    Starts Acquire in a goroutine (one at a time per transaction) with a
//	    context of its own (canceled: already canceled). Prints "T: granted", "T: error: ..." or, if it
//	    blocks, "T: waiting"; a waiting Acquire prints its outcome under the
//	    command that ends it. from/to lock the span [from, to) (no to:
//	    unbounded).
//	cancel txn=T
//	    Cancels the context of T's waiting Acquire.
//	release txn=T
//	prepare txn=T
//	    MarkPrepared; prints what it reports.
//	restore txn=T [prio=N] [writes=(K,...)] [reads=(K,...)] [from=K [to=K]]
//	    Restore of a prepared transaction; from/to add a read span.
//	close
//	resolver [wound (T=aborted|committed|error)...] [check (T=alive|done|error)...]
//	    How the resolver answers about victim/holder T from now on (wound:
//	    aborted by default; check: alive by default).
//	tick [n=N | for=DURATION]
//	    Moves the clock N check intervals (default 1), or DURATION.
//	dump
//	    The table's Dump and, for every known transaction, Holds.
//
// Every Resolver call a command causes is printed as "R: wound V -> answer"
// or "R: check H prepared=B -> answer", R being the requester, followed by
// R's outcome if it has one. Lines are grouped by requester (sorted by
// name) and sorted within a group, the outcome last: the order in which
// Acquire visits the holders of a lock is not specified. The output is
// deterministic only if no two waiters race for one lock; the scripts avoid
// that.
func TestLockTable(t *testing.T) {
	datadriven.Walk(t, "testdata/locktable", func(t *testing.T, path string) {
		synctest.Test(t, func(t *testing.T) {
			e := &ltEnv{txns: map[string]*Meta{}, pending: map[string]*pendingAcquire{}}
			e.res = &scriptResolver{env: e, wound: map[string]string{}, check: map[string]string{}}
			e.newTable(time.Second)
			datadriven.RunTest(t, path, e.run)
			e.cancelAll()
		})
	})
}

type ltEnv struct {
	lt       *LockTable
	interval time.Duration
	res      *scriptResolver
	txns     map[string]*Meta

	mu struct {
		sync.Mutex
		log []logLine
	}
	// pending are the acquires started and not yet reported done, by
	// transaction name.
	pending map[string]*pendingAcquire
}

type logLine struct{ who, text string }

type pendingAcquire struct {
	cancel context.CancelFunc
	done   chan struct{}
	// reported: the command that started it printed "waiting".
	reported bool
}

type requesterKey struct{}

func requester(ctx context.Context) string {
	s, _ := ctx.Value(requesterKey{}).(string)
	return s
}

func (e *ltEnv) logf(who, format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.mu.log = append(e.mu.log, logLine{who, fmt.Sprintf(format, args...)})
}

// scriptResolver answers as the script says and logs every call.
type scriptResolver struct {
	env *ltEnv
	mu  sync.Mutex
	// wound and check are the answers by transaction name.
	wound, check map[string]string
}

var errResolver = errors.New("resolver: injected failure")

func (r *scriptResolver) Wound(ctx context.Context, victim *Meta) (bool, error) {
	r.mu.Lock()
	ans := r.wound[victim.ID]
	r.mu.Unlock()
	if ans == "" {
		ans = "aborted"
	}
	r.env.logf(requester(ctx), "wound %s -> %s", victim.ID, ans)
	switch ans {
	case "aborted":
		return true, nil
	case "committed":
		return false, nil
	}
	return false, errResolver
}

func (r *scriptResolver) Check(ctx context.Context, holder *Meta, prepared bool) (bool, error) {
	r.mu.Lock()
	ans := r.check[holder.ID]
	r.mu.Unlock()
	if ans == "" {
		ans = "alive"
	}
	r.env.logf(requester(ctx), "check %s prepared=%t -> %s", holder.ID, prepared, ans)
	switch ans {
	case "alive":
		return false, nil
	case "done":
		return true, nil
	}
	return false, errResolver
}

func (e *ltEnv) newTable(interval time.Duration) {
	e.cancelAll()
	e.interval = interval
	e.lt = NewLockTable(1, interval)
}

// cancelAll cancels every waiting Acquire and waits for them to return.
func (e *ltEnv) cancelAll() {
	for name, p := range e.pending {
		p.cancel()
		<-p.done
		delete(e.pending, name)
	}
	e.mu.Lock()
	e.mu.log = nil
	e.mu.Unlock()
}

func (e *ltEnv) txn(t *testing.T, td *datadriven.TestData) *Meta {
	var name string
	td.ScanArgs(t, "txn", &name)
	m := e.txns[name]
	if m == nil {
		m = &Meta{ID: name}
		m.Plain = td.HasArg("plain")
		switch {
		case td.HasArg("prio"):
			td.ScanArgs(t, "prio", &m.Priority)
		case m.Plain:
			m.Priority = PlainPriority
		default:
			td.Fatalf(t, "first use of %s: give prio=N or plain", name)
		}
		e.txns[name] = m
	} else if td.HasArg("prio") {
		var p uint64
		td.ScanArgs(t, "prio", &p)
		if p != m.Priority {
			td.Fatalf(t, "%s has priority %d", name, m.Priority)
		}
	}
	return m
}

func (e *ltEnv) target(t *testing.T, td *datadriven.TestData) Target {
	tg := Target{Collection: 1}
	td.MaybeScanArgs(t, "coll", &tg.Collection)
	var k string
	switch {
	case td.HasArg("key"):
		td.ScanArgs(t, "key", &k)
		tg.Key = []byte(k)
	case td.HasArg("from"):
		td.ScanArgs(t, "from", &k)
		tg.IsSpan, tg.Key = true, []byte(k)
		if td.HasArg("to") {
			td.ScanArgs(t, "to", &k)
			tg.End = []byte(k)
		}
	default:
		td.Fatalf(t, "give key=K or from=K [to=K]")
	}
	return tg
}

func (e *ltEnv) run(t *testing.T, td *datadriven.TestData) string {
	var out []string
	var started string
	switch td.Cmd {
	case "new":
		interval := time.Second
		if td.HasArg("check-interval") {
			var s string
			td.ScanArgs(t, "check-interval", &s)
			d, err := time.ParseDuration(s)
			if err != nil {
				td.Fatalf(t, "%v", err)
			}
			interval = d
		}
		e.txns = map[string]*Meta{}
		e.res.mu.Lock()
		e.res.wound, e.res.check = map[string]string{}, map[string]string{}
		e.res.mu.Unlock()
		e.newTable(interval)
		return "ok"
	case "acquire":
		m := e.txn(t, td)
		if e.pending[m.ID] != nil {
			td.Fatalf(t, "%s is already acquiring", m.ID)
		}
		tg := e.target(t, td)
		var mode string
		td.ScanArgs(t, "mode", &mode)
		md := map[string]Mode{"s": Shared, "x": Exclusive}[mode]
		if md == 0 {
			td.Fatalf(t, "mode: s or x")
		}
		ctx, cancel := context.WithCancel(context.WithValue(context.Background(), requesterKey{}, m.ID))
		if td.HasArg("canceled") {
			cancel()
		}
		p := &pendingAcquire{cancel: cancel, done: make(chan struct{})}
		e.pending[m.ID] = p
		lt := e.lt
		go func() {
			defer close(p.done)
			defer cancel()
			if err := lt.Acquire(ctx, m, tg, md, e.res); err != nil {
				e.logf(m.ID, "error: %s", describeErr(err))
			} else {
				e.logf(m.ID, "granted")
			}
		}()
		started = m.ID
	case "cancel":
		m := e.txn(t, td)
		p := e.pending[m.ID]
		if p == nil {
			td.Fatalf(t, "%s is not acquiring", m.ID)
		}
		p.cancel()
	case "release":
		e.lt.Release(e.txn(t, td).ID)
	case "prepare":
		out = append(out, fmt.Sprintf("held: %t", e.lt.MarkPrepared(e.txn(t, td).ID)))
	case "restore":
		m := e.txn(t, td)
		var writes, reads []Target
		if arg, ok := td.Arg("writes"); ok {
			for _, k := range arg.Vals {
				writes = append(writes, Target{Collection: 1, Key: []byte(k)})
			}
		}
		if arg, ok := td.Arg("reads"); ok {
			for _, k := range arg.Vals {
				reads = append(reads, Target{Collection: 1, Key: []byte(k)})
			}
		}
		if td.HasArg("from") {
			reads = append(reads, e.target(t, td))
		}
		e.lt.Restore(m, writes, reads)
	case "close":
		e.lt.Close()
		out = append(out, fmt.Sprintf("closed: %t", e.lt.Closed()))
	case "resolver":
		e.res.mu.Lock()
		var answers map[string]string
		for _, arg := range td.CmdArgs {
			switch {
			case arg.Key == "wound" && len(arg.Vals) == 0:
				answers = e.res.wound
			case arg.Key == "check" && len(arg.Vals) == 0:
				answers = e.res.check
			case answers != nil && len(arg.Vals) == 1:
				answers[arg.Key] = arg.Vals[0]
			default:
				e.res.mu.Unlock()
				td.Fatalf(t, "resolver wound T=answer... check T=answer...")
			}
		}
		e.res.mu.Unlock()
		return "ok"
	case "tick":
		n := 1
		td.MaybeScanArgs(t, "n", &n)
		d := time.Duration(n) * e.interval
		if td.HasArg("for") {
			var s string
			td.ScanArgs(t, "for", &s)
			var err error
			if d, err = time.ParseDuration(s); err != nil {
				td.Fatalf(t, "%v", err)
			}
		}
		time.Sleep(d)
	case "dump":
		out = append(out, e.lt.Dump()...)
		if len(out) == 0 {
			out = append(out, "(no locks)")
		}
		var names []string
		for name := range e.txns {
			names = append(names, name)
		}
		sort.Strings(names)
		var holds []string
		for _, name := range names {
			if e.lt.Holds(name) {
				holds = append(holds, name)
			}
		}
		if len(holds) == 0 {
			holds = append(holds, "(none)")
		}
		out = append(out, "holders: "+strings.Join(holds, " "))
	default:
		td.Fatalf(t, "unknown command %q", td.Cmd)
	}

	// Let every goroutine run until it returns or blocks for good.
	synctest.Wait()
	for name, p := range e.pending {
		select {
		case <-p.done:
			delete(e.pending, name)
		default:
			if name == started {
				e.logf(name, "waiting")
			}
		}
	}
	e.mu.Lock()
	log := e.mu.log
	e.mu.log = nil
	e.mu.Unlock()
	sort.SliceStable(log, func(i, j int) bool {
		a, b := log[i], log[j]
		if a.who != b.who {
			return a.who < b.who
		}
		if ao, bo := isOutcome(a.text), isOutcome(b.text); ao != bo {
			return bo
		}
		return a.text < b.text
	})
	for _, l := range log {
		out = append(out, l.who+": "+l.text)
	}
	if len(out) == 0 {
		return "ok"
	}
	return strings.Join(out, "\n")
}

func isOutcome(s string) bool {
	return s == "granted" || s == "waiting" || strings.HasPrefix(s, "error: ")
}

func describeErr(err error) string {
	switch {
	case errors.Is(err, ErrLocksLost):
		return "ErrLocksLost"
	case errors.Is(err, context.Canceled):
		return "context canceled"
	case errors.Is(err, errResolver):
		return "resolver failed"
	}
	return err.Error()
}
