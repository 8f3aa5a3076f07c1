package linearizability

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

var seedFlag = flag.Int64("seed", 0, "seed of the randomized tests (0: from the clock)")

// op builds a hand-made history entry.
func op(client int, o Op, out Outcome, call, ret int64) Operation {
	return Operation{Client: client, Op: o, Out: out, Call: call, Return: ret}
}

// mustPass checks h and fails t unless it is linearizable.
func mustPass(t *testing.T, h History) Result {
	t.Helper()
	res, err := CheckDir(h, 10*time.Second, t.TempDir())
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	if !res.Ok {
		t.Fatalf("history should be linearizable; got %+v", res)
	}
	if res.Visualization != "" {
		t.Fatalf("a linearizable history wrote a visualisation: %s", res.Visualization)
	}
	return res
}

// mustFail checks h and fails t unless it is shown not linearizable with a
// visualisation file that exists.
func mustFail(t *testing.T, h History) Result {
	t.Helper()
	res, err := CheckDir(h, 10*time.Second, t.TempDir())
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	if res.Ok || res.TimedOut {
		t.Fatalf("history should be a violation; got %+v", res)
	}
	assertVisualization(t, res.Visualization)
	return res
}

// assertVisualization fails t unless path is a non-empty HTML file.
func assertVisualization(t *testing.T, path string) {
	t.Helper()
	if path == "" {
		t.Fatal("no visualisation path")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("visualisation: %v", err)
	}
	if !strings.Contains(string(b), "<html") {
		t.Fatalf("visualisation %s is not HTML (%d bytes)", path, len(b))
	}
}

func TestConcurrentLinearizableHistoryPasses(t *testing.T) {
	h := History{
		op(0, Put("x", "a"), PutOK(1), 0, 10),
		op(1, Get("x"), NotFound(), 5, 15),    // overlaps the put: before it
		op(2, Get("x"), GetOK("a", 1), 6, 20), // overlaps the put: after it
		op(1, Put("x", "b"), PutOK(3), 16, 30),
		op(0, Delete("x"), DeleteOK(4), 25, 40),
		op(2, Get("x"), GetOK("b", 3), 21, 45), // between the put of b and the delete
		op(0, Get("x"), NotFound(), 41, 50),
		op(1, Delete("x"), NotFound(), 51, 52),
		op(3, Put("y", "a"), PutOK(2), 1, 60), // versions are per key: y interleaves with x
		op(3, Get("y"), GetOK("a", 2), 61, 70),
		op(1, Delete("y"), DeleteOK(0), 62, 63), // tombstone version unknown to the client
		op(1, Put("y", "c"), PutOK(5), 64, 80),
		op(2, Get("y"), GetOK("c", 5), 65, 90),
	}
	if res := mustPass(t, h); res.Ops != len(h) {
		t.Fatalf("Ops = %d, want %d", res.Ops, len(h))
	}
}

func TestStaleReadFails(t *testing.T) {
	h := History{
		op(0, Put("x", "a"), PutOK(1), 0, 10),
		op(1, Put("x", "b"), PutOK(2), 20, 30),
		op(0, Get("x"), GetOK("a", 1), 40, 50), // after b was acknowledged
	}
	mustFail(t, h)

	// Check writes under os.TempDir().
	res, err := Check(h, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(res.Visualization) })
	if res.Ok {
		t.Fatal("stale read passed")
	}
	assertVisualization(t, res.Visualization)
	if dir := filepath.Dir(res.Visualization); dir != filepath.Clean(os.TempDir()) {
		t.Fatalf("visualisation in %s, want %s", dir, os.TempDir())
	}
}

func TestReadOfUnwrittenValueFails(t *testing.T) {
	mustFail(t, History{op(0, Get("x"), GetOK("zzz", 1), 0, 10)})
	mustFail(t, History{
		op(0, Put("x", "a"), PutOK(1), 0, 10),
		op(1, Get("x"), GetOK("zzz", 1), 5, 15),
	})
}

func TestUnknownPutReadLaterPasses(t *testing.T) {
	mustPass(t, History{
		op(0, Put("x", "a"), Unknown(), 0, 5),
		op(1, Get("x"), GetOK("a", 7), 10, 20),
		op(1, Get("x"), GetOK("a", 7), 30, 40),
	})
	// The unknown put takes effect after an acknowledged put that began
	// after it, so its version is above that put's.
	mustPass(t, History{
		op(0, Put("x", "a"), PutOK(1), 0, 1),
		op(0, Put("x", "b"), Unknown(), 2, 3),
		op(1, Put("x", "c"), PutOK(2), 4, 5),
		op(1, Get("x"), GetOK("c", 2), 6, 7),
		op(2, Get("x"), GetOK("b", 3), 8, 9),
	})
}

func TestUnknownPutNeverReadPasses(t *testing.T) {
	mustPass(t, History{
		op(0, Put("x", "a"), Unknown(), 0, 5),
		op(1, Get("x"), NotFound(), 10, 20),
		op(2, Put("x", "b"), PutOK(2), 30, 40),
		op(1, Get("x"), GetOK("b", 2), 50, 60),
	})
	// It cannot have taken effect between two puts whose versions leave no
	// room for it, so it did not (or did so last).
	mustPass(t, History{
		op(0, Put("x", "a"), PutOK(1), 0, 1),
		op(0, Put("x", "b"), Unknown(), 2, 3),
		op(1, Put("x", "c"), PutOK(2), 4, 5),
		op(1, Get("x"), GetOK("c", 2), 6, 7),
	})
}

func TestVersionsGoingBackwardsFails(t *testing.T) {
	mustFail(t, History{
		op(0, Put("x", "a"), PutOK(5), 0, 10),
		op(1, Put("x", "b"), PutOK(3), 20, 30),
	})
	// Equal versions are not increasing either.
	mustFail(t, History{
		op(0, Put("x", "a"), PutOK(5), 0, 10),
		op(1, Put("x", "b"), PutOK(5), 20, 30),
	})
	// Versions are per key: a lower version on another key is fine.
	mustPass(t, History{
		op(0, Put("x", "a"), PutOK(5), 0, 10),
		op(1, Put("y", "b"), PutOK(3), 20, 30),
	})
}

func TestMoreViolationsFail(t *testing.T) {
	for name, h := range map[string]History{
		"get returns another version than the put's": {
			op(0, Put("x", "a"), PutOK(5), 0, 10),
			op(1, Get("x"), GetOK("a", 4), 20, 30),
		},
		"get misses an acknowledged put": {
			op(0, Put("x", "a"), PutOK(1), 0, 10),
			op(1, Get("x"), NotFound(), 20, 30),
		},
		"get finds a deleted key": {
			op(0, Put("x", "a"), PutOK(1), 0, 10),
			op(0, Delete("x"), DeleteOK(2), 20, 30),
			op(1, Get("x"), GetOK("a", 1), 40, 50),
		},
		"delete of an absent key removes it": {
			op(0, Delete("x"), DeleteOK(1), 0, 10),
		},
		"delete misses a present key": {
			op(0, Put("x", "a"), PutOK(1), 0, 10),
			op(0, Delete("x"), NotFound(), 20, 30),
		},
		"tombstone version not above the put's": {
			op(0, Put("x", "a"), PutOK(4), 0, 10),
			op(0, Delete("x"), DeleteOK(4), 20, 30),
		},
		"put after a delete reuses a version": {
			op(0, Put("x", "a"), PutOK(4), 0, 10),
			op(0, Delete("x"), DeleteOK(0), 20, 30),
			op(0, Put("x", "b"), PutOK(4), 40, 50),
		},
		"unknown put observed, then lost": {
			op(0, Put("x", "a"), Unknown(), 0, 5),
			op(1, Get("x"), GetOK("a", 7), 10, 20),
			op(1, Get("x"), NotFound(), 30, 40),
		},
		"unknown put read at a version it cannot have": {
			op(0, Put("x", "a"), PutOK(1), 0, 1),
			op(0, Put("x", "b"), Unknown(), 2, 3),
			op(1, Put("x", "c"), PutOK(2), 4, 5),
			op(2, Get("x"), GetOK("b", 2), 8, 9),
		},
		"unknown put observed before its invocation": {
			op(1, Get("x"), GetOK("a", 1), 0, 10),
			op(0, Put("x", "a"), Unknown(), 20, 25),
		},
	} {
		t.Run(name, func(t *testing.T) { mustFail(t, h) })
	}
}

func TestUnknownDeleteAndGet(t *testing.T) {
	// An unknown delete may take effect late; an unknown get is not checked.
	res := mustPass(t, History{
		op(0, Put("x", "a"), PutOK(1), 0, 10),
		op(1, Delete("x"), Unknown(), 20, 25),
		op(2, Get("x"), GetOK("a", 1), 30, 40),
		op(2, Get("x"), NotFound(), 50, 60),
		op(0, Get("x"), Outcome{Value: "garbage"}, 70, 80),
	})
	if res.Ops != 4 {
		t.Fatalf("Ops = %d, want 4 (the unknown get is left out)", res.Ops)
	}
	mustFail(t, History{
		op(0, Put("x", "a"), PutOK(1), 0, 10),
		op(1, Delete("x"), Unknown(), 20, 25),
		op(2, Get("x"), NotFound(), 30, 40),
		op(2, Get("x"), GetOK("a", 1), 50, 60),
	})
}

func TestMalformedHistory(t *testing.T) {
	for name, h := range map[string]History{
		"invalid kind":        {op(0, Op{Key: "x"}, NotFound(), 0, 1)},
		"return before call":  {op(0, Get("x"), NotFound(), 5, 1)},
		"negative client":     {op(-1, Get("x"), NotFound(), 0, 1)},
		"kind beyond the end": {op(0, Op{Kind: KindDelete + 1, Key: "x"}, NotFound(), 0, 1)},
	} {
		if _, err := Check(h, time.Second); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	// Return is ignored for an unknown outcome.
	mustPass(t, History{op(0, Put("x", "a"), Unknown(), 5, 1)})
}

func TestTimeoutIsReported(t *testing.T) {
	// Thirty concurrent puts of unknown outcome and a read of a value none
	// wrote: refuting it means trying every subset of the puts.
	var h History
	for i := range 30 {
		h = append(h, op(i, Put("x", fmt.Sprint(i)), Unknown(), 0, 1))
	}
	h = append(h, op(30, Get("x"), GetOK("zzz", 1), 2, 3))
	res, err := CheckDir(h, 200*time.Millisecond, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if !res.TimedOut || res.Ok {
		t.Fatalf("want a timeout, got %+v", res)
	}
	assertVisualization(t, res.Visualization)

	r := &Recorder{Timeout: 200 * time.Millisecond, Dir: t.TempDir()}
	for i := range 30 {
		r.Begin(i, Put("x", fmt.Sprint(i))).End(Unknown())
	}
	r.Begin(30, Get("x")).End(GetOK("zzz", 1))
	tb := &fakeTB{TB: t}
	r.Check(tb, 7)
	if len(tb.fatals) != 0 || len(tb.logs) != 1 || !strings.Contains(tb.logs[0], "timed out") {
		t.Fatalf("a timeout should be logged, not fatal: fatals %q, logs %q", tb.fatals, tb.logs)
	}
}

// fakeTB records the failures and logs of Recorder.Check.
type fakeTB struct {
	testing.TB
	fatals, logs []string
}

func (f *fakeTB) Fatalf(format string, args ...any) {
	f.fatals = append(f.fatals, fmt.Sprintf(format, args...))
}

func (f *fakeTB) Logf(format string, args ...any) {
	f.logs = append(f.logs, fmt.Sprintf(format, args...))
}

func TestRecorderCheck(t *testing.T) {
	dir := t.TempDir()
	r := &Recorder{Dir: dir}
	r.Begin(0, Put("x", "a")).End(PutOK(1))
	r.Begin(1, Put("x", "b")).End(PutOK(2))
	p := r.Begin(0, Get("x"))

	tb := &fakeTB{TB: t}
	r.Check(tb, 42) // the get is pending: unknown, so left out
	if len(tb.fatals) != 0 || len(tb.logs) != 1 || !strings.Contains(tb.logs[0], "2 operations") {
		t.Fatalf("want a success with 2 operations: fatals %q, logs %q", tb.fatals, tb.logs)
	}

	p.End(GetOK("a", 1)) // stale
	tb = &fakeTB{TB: t}
	r.Check(tb, 42)
	if len(tb.fatals) != 1 {
		t.Fatalf("want one failure, got fatals %q, logs %q", tb.fatals, tb.logs)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "linearizability-*.html"))
	if len(files) != 1 {
		t.Fatalf("visualisations %q, want one", files)
	}
	if msg := tb.fatals[0]; !strings.Contains(msg, "seed 42") || !strings.Contains(msg, files[0]) {
		t.Fatalf("failure %q lacks the seed or the visualisation %s", msg, files[0])
	}
	assertVisualization(t, files[0])
}

func TestRecorderPendingAndFail(t *testing.T) {
	var r Recorder
	r.Begin(0, Put("x", "a")).Fail()        // refused: dropped
	r.Begin(1, Put("x", "b")).End(PutOK(1)) // acknowledged
	r.Begin(2, Put("x", "c"))               // never answered: unknown
	r.Begin(3, Delete("y")).End(NotFound()) // definite
	r.Begin(3, Delete("y")).End(Outcome{})  // unknown
	r.Begin(0, Get("x")).End(GetOK("c", 9)) // reads the unanswered put
	r.Begin(1, Get("x")).End(GetOK("b", 1)) // ... but this one overlaps nothing
	h := r.History()
	if len(h) != 6 {
		t.Fatalf("history has %d operations, want 6: %+v", len(h), h)
	}
	if h[0].Op != Put("x", "b") {
		t.Fatalf("failed operation kept: %+v", h[0])
	}
	if h[1].Out.OK || h[1].Return <= h[1].Call {
		t.Fatalf("pending operation not unknown: %+v", h[1])
	}
	for i := 1; i < len(h); i++ {
		if h[i].Call <= h[i-1].Call {
			t.Fatalf("calls not increasing: %+v", h)
		}
	}
	// The last get returned b after a get of c completed: c came after b,
	// so reading b again is stale.
	res, err := CheckDir(h, 10*time.Second, t.TempDir())
	if err != nil || res.Ok {
		t.Fatalf("want a violation, got %+v, %v", res, err)
	}

	p := r.Begin(0, Get("x"))
	p.End(NotFound())
	defer func() {
		if recover() == nil {
			t.Fatal("a second End did not panic")
		}
	}()
	p.Fail()
}

func TestClockIsSharedAndStrictlyIncreasing(t *testing.T) {
	var c clock
	const goroutines, n = 8, 2000
	readings := make([][]int64, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for range n {
				readings[g] = append(readings[g], c.now())
			}
		})
	}
	wg.Wait()
	seen := make(map[int64]bool)
	for _, rs := range readings {
		for i, v := range rs {
			if i > 0 && v <= rs[i-1] {
				t.Fatalf("clock went from %d to %d", rs[i-1], v)
			}
			if seen[v] {
				t.Fatalf("reading %d returned twice", v)
			}
			seen[v] = true
		}
	}
}

func TestPartitionEvent(t *testing.T) {
	call := func(id int, o Op) porcupine.Event {
		return porcupine.Event{ClientId: id, Kind: porcupine.CallEvent, Value: o, Id: id}
	}
	ret := func(id int, out Outcome) porcupine.Event {
		return porcupine.Event{ClientId: id, Kind: porcupine.ReturnEvent, Value: out, Id: id}
	}
	events := []porcupine.Event{
		call(0, Put("x", "a")),
		call(1, Put("y", "b")),
		ret(0, PutOK(1)),
		call(2, Get("x")),
		ret(1, PutOK(2)),
		call(3, Get("y")),
		ret(2, GetOK("a", 1)),
		ret(3, GetOK("b", 2)),
	}
	parts := KVModel().PartitionEvent(events)
	if len(parts) != 2 || len(parts[0]) != 4 || len(parts[1]) != 4 {
		t.Fatalf("partitions %v, want two of four events", parts)
	}
	if !porcupine.CheckEvents(KVModel(), events) {
		t.Fatal("linearizable events rejected")
	}
	events[6] = ret(2, GetOK("b", 2)) // x never held b
	if porcupine.CheckEvents(KVModel(), events) {
		t.Fatal("non-linearizable events accepted")
	}
}

// memStore is an in-memory key-value store behind one mutex: linearizable,
// with versions from one counter. When stale is set, gets answer the key's
// state before its last write, a bug the checker must catch.
type memStore struct {
	mu      sync.Mutex
	version uint64
	data    map[string]memRecord
	prev    map[string]memRecord
	stale   bool
}

type memRecord struct {
	present bool
	value   string
	version uint64
}

func newMemStore(stale bool) *memStore {
	return &memStore{data: make(map[string]memRecord), prev: make(map[string]memRecord), stale: stale}
}

func (s *memStore) put(key, value string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.version++
	s.prev[key] = s.data[key]
	s.data[key] = memRecord{present: true, value: value, version: s.version}
	return s.version
}

func (s *memStore) get(key string) memRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stale {
		return s.prev[key]
	}
	return s.data[key]
}

// del deletes key, answering the tombstone's version, or false if the key was
// absent.
func (s *memStore) del(key string) (uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.data[key].present {
		return 0, false
	}
	s.version++
	s.prev[key] = s.data[key]
	s.data[key] = memRecord{}
	return s.version, true
}

// do performs o on s and returns its outcome.
func (s *memStore) do(o Op) Outcome {
	switch o.Kind {
	case KindPut:
		return PutOK(s.put(o.Key, o.Value))
	case KindGet:
		if rec := s.get(o.Key); rec.present {
			return GetOK(rec.value, rec.version)
		}
		return NotFound()
	default:
		if v, ok := s.del(o.Key); ok {
			return DeleteOK(v)
		}
		return NotFound()
	}
}

// runClients has clients goroutines issue ops operations each against s,
// recording them in r. Operations on shared keys are random, with injected
// faults: writes refused (dropped), writes of unknown outcome that take
// effect never, before the client gives up, or after it; gets of unknown
// outcome. Clients pause at random around each store call, as a network
// would. Every tenth operation a client puts a key of its own and reads it
// back, faultless.
func runClients(r *Recorder, s *memStore, seed int64, clients, ops int) {
	keys := []string{"a", "b", "c", "d"}
	var wg, late sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(seed), uint64(c)))
			own := fmt.Sprintf("own-%d", c)
			for i := range ops {
				value := fmt.Sprintf("%d.%d", c, i)
				if i%10 == 9 {
					r.Begin(c, Put(own, value)).End(s.do(Put(own, value)))
					r.Begin(c, Get(own)).End(s.do(Get(own)))
					continue
				}
				key := keys[rng.IntN(len(keys))]
				var o Op
				switch n := rng.IntN(100); {
				case n < 40:
					o = Put(key, value)
				case n < 85:
					o = Get(key)
				default:
					o = Delete(key)
				}
				p := r.Begin(c, o)
				switch fault := rng.IntN(100); {
				case fault < 3 && o.Kind != KindGet:
					p.Fail()
				case fault < 6:
					switch rng.IntN(3) {
					case 0: // lost before it reached the store
					case 1: // applied, answer lost
						s.do(o)
					case 2: // applied after the client gave up
						late.Go(func() {
							runtime.Gosched()
							s.do(o)
						})
					}
					p.End(Unknown())
				default:
					latency(rng)
					out := s.do(o)
					latency(rng)
					p.End(out)
				}
			}
		})
	}
	wg.Wait()
	late.Wait()
}

// latency delays a client a little, as a network would, so that its
// operations overlap others'.
func latency(rng *rand.Rand) {
	if rng.IntN(2) == 0 {
		time.Sleep(time.Duration(rng.IntN(50)) * time.Microsecond)
	} else {
		runtime.Gosched()
	}
}

func randomSeed(t *testing.T) int64 {
	seed := *seedFlag
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	t.Logf("seed %d (rerun with -args -seed=%d)", seed, seed)
	return seed
}

func TestRandomizedInMemoryMapIsLinearizable(t *testing.T) {
	seed := randomSeed(t)
	var r Recorder
	runClients(&r, newMemStore(false), seed, 16, 250)
	r.Check(t, seed)
}

func TestRandomizedStaleReadsFail(t *testing.T) {
	seed := randomSeed(t)
	var r Recorder
	runClients(&r, newMemStore(true), seed, 8, 100)
	res, err := CheckDir(r.History(), time.Minute, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if res.Ok || res.TimedOut {
		t.Fatalf("a store serving stale reads passed: %+v", res)
	}
	assertVisualization(t, res.Visualization)
}
