package txn

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestLockTableRandom runs seeded random workloads on a LockTable: a few
// workers run transactions one after another, each of random locks in random
// modes, with priorities taken from a shared oracle (a transaction keeps its
// priority across attempts), and a few more run plain writes, all through a
// resolver that keeps every attempt's record. A wounded attempt stops at its
// next step, releases everything and retries. It checks that
//
//   - no two live attempts ever hold conflicting locks (each grant is checked
//     against the locks the other PENDING attempts were granted, and the
//     table's Dump against itself);
//   - every Wound comes from an older transaction to a younger one, never
//     from or to a plain write, and never hits the oldest live transaction;
//   - an attempt refused as aborted (ErrAborted) was aborted;
//   - every transaction commits within a bounded number of attempts and
//     the run ends before its deadline (no deadlock), leaving no lock.
//
// The seed fixes the workload, not the interleaving. Each run prints its
// seed on failure; GROUPKV_SEED=N runs seed N only. Run it with -race.
func TestLockTableRandom(t *testing.T) {
	seeds := make([]uint64, 0, 32)
	if s := os.Getenv("GROUPKV_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("GROUPKV_SEED=%q: %v", s, err)
		}
		seeds = append(seeds, seed)
	} else {
		base := uint64(time.Now().UnixNano())
		n := 32
		if testing.Short() {
			n = 4
		}
		for i := range n {
			seeds = append(seeds, base+uint64(i))
		}
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			errs, stats := runRandomLocks(seed)
			t.Log(stats)
			if len(errs) > 0 {
				t.Errorf("GROUPKV_SEED=%d:\n%s", seed, strings.Join(errs, "\n"))
			}
		})
	}
}

const (
	randWorkers      = 8
	randPlainWorkers = 2
	randTxnsPerWork  = 6
	randKeys         = 6
	randMaxAttempts  = 1000
	randDeadline     = 30 * time.Second
)

type randOp struct {
	t    Target
	mode Mode
	// plain: a plain write's lock (compatible with other plain writes').
	plain bool
}

func (o randOp) String() string {
	m := "s"
	if o.mode == Exclusive {
		m = "x"
	}
	if o.t.IsSpan {
		return fmt.Sprintf("[%s,%s) %s", o.t.Key, o.t.End, m)
	}
	return fmt.Sprintf("%s %s", o.t.Key, m)
}

type randTxn struct {
	name    string
	plain   bool
	ops     []randOp
	prepare bool
}

// randSim is the workload's shared state and its Resolver.
type randSim struct {
	lt     *LockTable
	cancel context.CancelFunc

	mu struct {
		sync.Mutex
		oracle uint64
		// live are the priorities of the transactions started and not
		// committed.
		live   map[uint64]bool
		status map[string]Status
		// granted: the locks of each attempt, as the attempt saw them
		// granted, while it is PENDING (plain writes: while they hold).
		granted  map[string][]randOp
		attempts int
		wounds   int
		admitted int // plain writes AdmitPlain admitted
		errs     []string
	}
}

type randRequesterKey struct{}

func (s *randSim) failf(format string, args ...any) {
	s.mu.Lock()
	s.mu.errs = append(s.mu.errs, fmt.Sprintf(format, args...))
	s.mu.Unlock()
	s.cancel()
}

func (s *randSim) Wound(ctx context.Context, victim *Meta) (bool, error) {
	req, _ := ctx.Value(randRequesterKey{}).(*Meta)
	if req == nil || req.Plain || victim.Plain || !Older(req, victim) {
		s.failf("wound of %+v by %+v: only an older transaction wounds, and only a transaction", *victim, req)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	oldest := true
	for p := range s.mu.live {
		oldest = oldest && p >= victim.Priority
	}
	if oldest {
		s.mu.errs = append(s.mu.errs, fmt.Sprintf("the oldest live transaction (%s) was wounded by %+v", victim.ID, req))
	}
	switch s.mu.status[victim.ID] {
	case Pending:
		s.mu.status[victim.ID] = Aborted
		s.mu.wounds++
		return true, nil
	case Aborted:
		return true, nil
	}
	return false, nil
}

// Aborted implements SelfChecker.
func (s *randSim) Aborted(ctx context.Context, m *Meta) (bool, error) {
	return s.status(m.ID) == Aborted, nil
}

func (s *randSim) Check(ctx context.Context, holder *Meta, prepared bool) (bool, error) {
	if holder.Plain {
		s.failf("Check of plain write %s", holder.ID)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.status[holder.ID] != Pending, nil
}

func opsConflict(a, b randOp) bool {
	if a.mode == Shared && b.mode == Shared || a.plain && b.plain {
		return false
	}
	switch {
	case a.t.IsSpan:
		return a.t.covers(b.t.Collection, b.t.Key)
	case b.t.IsSpan:
		return b.t.covers(a.t.Collection, a.t.Key)
	}
	return bytes.Equal(a.t.Key, b.t.Key)
}

// granted records that m was granted op, and checks it against the locks
// of every other live attempt. An attempt that was aborted meanwhile (its
// locks may already be gone from the table) records nothing.
func (s *randSim) granted(m *Meta, op randOp) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.status[m.ID] != Pending {
		return
	}
	op.plain = m.Plain
	for id, ops := range s.mu.granted {
		if id == m.ID || s.mu.status[id] != Pending {
			continue
		}
		for _, o := range ops {
			if opsConflict(o, op) {
				s.mu.errs = append(s.mu.errs, fmt.Sprintf("%s was granted %v while %s, PENDING, holds %v", m.ID, op, id, o))
			}
		}
	}
	s.mu.granted[m.ID] = append(s.mu.granted[m.ID], op)
}

// checkDump checks that the table's locks (one collection) are compatible.
func checkDump(lines []string) []string {
	type lock struct {
		id   string
		op   randOp
		line string
	}
	var locks []lock
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) < 3 {
			return []string{"bad Dump line " + l}
		}
		op := randOp{t: Target{Collection: 1}, mode: Shared}
		if f[1] == "X" {
			op.mode = Exclusive
		}
		if strings.HasPrefix(f[0], "[") {
			from, to, _ := strings.Cut(strings.TrimSuffix(strings.TrimPrefix(f[0], "["), ")"), ",")
			op.t.IsSpan, op.t.Key, op.t.End = true, []byte(from), []byte(to)
		} else {
			op.t.Key = []byte(f[0])
		}
		op.plain = f[len(f)-1] == "plain"
		locks = append(locks, lock{f[2], op, l})
	}
	var errs []string
	for i, a := range locks {
		for _, b := range locks[i+1:] {
			if a.id != b.id && opsConflict(a.op, b.op) {
				errs = append(errs, fmt.Sprintf("the table holds %q and %q", a.line, b.line))
			}
		}
	}
	return errs
}

func randWorkload(rng *rand.Rand) [][]*randTxn {
	key := func() []byte { return []byte{'k', byte('0' + rng.IntN(randKeys))} }
	var workers [][]*randTxn
	for w := range randWorkers + randPlainWorkers {
		var txns []*randTxn
		for i := range randTxnsPerWork {
			tx := &randTxn{name: fmt.Sprintf("w%d.%d", w, i), prepare: rng.IntN(2) == 0}
			if w >= randWorkers {
				tx.plain = true
				tx.ops = []randOp{{t: Target{Collection: 1, Key: key()}, mode: Exclusive}}
				txns = append(txns, tx)
				continue
			}
			for range 1 + rng.IntN(4) {
				op := randOp{t: Target{Collection: 1, Key: key()}, mode: Shared}
				if rng.IntN(2) == 0 {
					op.mode = Exclusive
				}
				if rng.IntN(6) == 0 {
					op.mode, op.t.IsSpan = Shared, true
					if rng.IntN(3) > 0 {
						op.t.End = key()
					}
				}
				tx.ops = append(tx.ops, op)
			}
			txns = append(txns, tx)
		}
		workers = append(workers, txns)
	}
	return workers
}

func runRandomLocks(seed uint64) (errs []string, stats string) {
	rng := rand.New(rand.NewPCG(seed, 0))
	workers := randWorkload(rng)
	ctx, cancel := context.WithTimeout(context.Background(), randDeadline)
	defer cancel()
	s := &randSim{lt: NewLockTable(1, time.Millisecond), cancel: cancel}
	s.mu.live = map[uint64]bool{}
	s.mu.status = map[string]Status{}
	s.mu.granted = map[string][]randOp{}

	var wg sync.WaitGroup
	for w, txns := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(w)+1))
			for _, tx := range txns {
				if !s.runTxn(ctx, tx, rng) {
					return
				}
			}
		}()
	}
	wg.Wait()

	s.mu.Lock()
	errs = append(errs, s.mu.errs...)
	stats = fmt.Sprintf("%d attempts, %d wounds, %d plain writes admitted without locks", s.mu.attempts, s.mu.wounds, s.mu.admitted)
	s.mu.Unlock()
	if d := s.lt.Dump(); len(d) > 0 {
		errs = append(errs, "locks left after the run: "+strings.Join(d, "; "))
	}
	if len(errs) > 0 {
		for _, txns := range workers {
			for _, tx := range txns {
				errs = append(errs, fmt.Sprintf("%s plain=%t prepare=%t ops %v", tx.name, tx.plain, tx.prepare, tx.ops))
			}
		}
	}
	return errs, stats
}

// runTxn runs tx to its commit, retrying it while it is wounded, and
// reports whether it committed.
func (s *randSim) runTxn(ctx context.Context, tx *randTxn, rng *rand.Rand) bool {
	s.mu.Lock()
	s.mu.oracle++
	priority := s.mu.oracle
	if tx.plain {
		priority = PlainPriority
	} else {
		s.mu.live[priority] = true
	}
	s.mu.Unlock()
	for attempt := uint32(1); ; attempt++ {
		if attempt > randMaxAttempts {
			s.failf("%s: %d attempts and no commit", tx.name, randMaxAttempts)
			return false
		}
		m := &Meta{ID: tx.name + "/" + strconv.Itoa(int(attempt)), Priority: priority, Attempt: attempt, Plain: tx.plain}
		if !tx.plain {
			m.ID = NewID(priority, attempt)
		}
		s.mu.Lock()
		s.mu.status[m.ID] = Pending
		s.mu.attempts++
		s.mu.Unlock()
		actx := context.WithValue(ctx, randRequesterKey{}, m)

		if tx.plain && rng.IntN(2) == 0 && s.lt.AdmitPlain() {
			// Admitted without locks: no transaction may be granted a
			// lock until DonePlain, which granted checks.
			for _, op := range tx.ops {
				s.granted(m, op)
				for range rng.IntN(3) {
					runtime.Gosched()
				}
			}
			s.mu.Lock()
			s.mu.status[m.ID] = Committed
			delete(s.mu.granted, m.ID)
			s.mu.admitted++
			s.mu.Unlock()
			s.lt.DonePlain()
			return true
		}
		live := true
		for _, op := range tx.ops {
			if s.status(m.ID) != Pending {
				live = false
				break
			}
			err := s.lt.Acquire(actx, m, op.t, op.mode, s)
			if errors.Is(err, ErrAborted) {
				// Refused as wounded (here, or found so while it waited):
				// it must be.
				if st := s.status(m.ID); st != Aborted {
					s.failf("%s attempt %d: Acquire %v refused it as aborted, but its record is %v", tx.name, attempt, op, st)
					return false
				}
				live = false
				break
			}
			if err != nil {
				s.failf("%s attempt %d: Acquire %v: %v (deadlock?); table: %s", tx.name, attempt, op, err,
					strings.Join(s.lt.Dump(), "; "))
				return false
			}
			s.granted(m, op)
			if errs := checkDump(s.lt.Dump()); len(errs) > 0 {
				s.failf("%s", strings.Join(errs, "\n"))
			}
			for range rng.IntN(3) {
				runtime.Gosched()
			}
		}
		if live && tx.prepare {
			s.lt.MarkPrepared(m.ID)
			runtime.Gosched()
		}
		// The commit point: PENDING → COMMITTED unless wounded first.
		s.mu.Lock()
		if live && s.mu.status[m.ID] == Pending {
			s.mu.status[m.ID] = Committed
			delete(s.mu.live, priority)
		} else {
			live = false
		}
		delete(s.mu.granted, m.ID)
		s.mu.Unlock()
		s.lt.Release(m.ID)
		if live {
			return true
		}
	}
}

func (s *randSim) status(id string) Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.status[id]
}
