package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/api"
	"github.com/groupkv/groupkv/internal/kv"
)

func TestChooseTxnKeys(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("SEED=%d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	for _, tc := range []struct{ n, k uint64 }{{1000, 10}, {10, 10}, {11, 10}, {10_000_000, 10}, {1, 1}} {
		dst := make([]uint64, tc.k)
		for range 2000 {
			ChooseTxnKeys(rng, tc.n, dst)
			seen := map[uint64]bool{}
			for _, x := range dst {
				if x >= tc.n {
					t.Fatalf("range %d: key %d out of range (SEED=%d)", tc.n, x, seed)
				}
				if seen[x] {
					t.Fatalf("range %d: key %d twice in %v (SEED=%d)", tc.n, x, dst, seed)
				}
				seen[x] = true
			}
		}
	}
	// Uniform: over a range of 20, 10 keys a draw, every key is drawn in
	// half of the draws, and every position holds every key as often.
	const n, k, draws = 20, 10, 40000
	var hits [n]int
	var first [n]int
	dst := make([]uint64, k)
	for range draws {
		ChooseTxnKeys(rng, n, dst)
		for _, x := range dst {
			hits[x]++
		}
		first[dst[0]]++
	}
	for i := range n {
		if p := float64(hits[i]) / draws; p < 0.47 || p > 0.53 {
			t.Errorf("key %d drawn in %.3f of the draws, want 0.5 (SEED=%d)", i, p, seed)
		}
		if p := float64(first[i]) / draws; p < 0.04 || p > 0.06 {
			t.Errorf("key %d first in %.3f of the draws, want 0.05 (SEED=%d)", i, p, seed)
		}
	}
}

func TestTxnWorkloadValidate(t *testing.T) {
	w := TxnWorkload{Keys: 5, Ops: 10, Mode: "snapshot", LoadMax: -1}
	err := w.Validate()
	if !errors.Is(err, ErrInvalidOptions) {
		t.Fatalf("Validate = %v, want ErrInvalidOptions", err)
	}
	for _, want := range []string{"key range 5", "mode \"snapshot\"", "load limit -1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%v does not mention %s", err, want)
		}
	}
	w = TxnWorkload{Keys: 10_000_000}
	w.EnsureDefaults()
	if err := w.Validate(); err != nil || w.Loaded() || w.Ops != 10 || w.Mode != TxnModeSerializable {
		t.Errorf("defaults %+v: %v, loaded %v", w, err, w.Loaded())
	}
	if string(TxnKey(42)) != "k42" {
		t.Errorf("TxnKey(42) = %q", TxnKey(42))
	}
	if v, err := DecodeCounter(nil, false); v != 0 || err != nil {
		t.Errorf("absent counter = %d, %v", v, err)
	}
	if _, err := DecodeCounter([]byte("x"), true); !errors.Is(err, ErrBadValue) {
		t.Errorf("bad counter: %v", err)
	}
}

func TestAttemptHistogram(t *testing.T) {
	var h AttemptHistogram
	if h.Percentile(50) != 0 || h.Max() != 0 || h.Mean() != 0 {
		t.Fatal("empty histogram is not zero")
	}
	// 90 transactions of 1 attempt, 8 of 2, one of 5, one of 300.
	for range 90 {
		h.Record(1)
	}
	var o AttemptHistogram
	for range 8 {
		o.Record(2)
	}
	o.Record(5)
	o.Record(300)
	o.Record(0) // counts as 1
	h.Merge(&o)
	if h.Count() != 101 {
		t.Fatalf("count %d, want 101", h.Count())
	}
	for _, c := range []struct {
		q    float64
		want int
	}{{0, 1}, {50, 1}, {90, 1}, {91, 2}, {99, 5}, {99.5, 300}, {100, 300}} {
		if got := h.Percentile(c.q); got != c.want {
			t.Errorf("p%g = %d, want %d", c.q, got, c.want)
		}
	}
	s := h.Stats()
	want := []AttemptBucket{{1, 91}, {2, 8}, {5, 1}, {300, 1}}
	if fmt.Sprint(s.Buckets) != fmt.Sprint(want) || s.Max != 300 || s.P50 != 1 || s.P99 != 5 {
		t.Errorf("stats %+v, want buckets %v, max 300, p50 1, p99 5", s, want)
	}
	if m := h.Mean(); m < 4.07 || m > 4.08 { // (91 + 16 + 5 + 300) / 101
		t.Errorf("mean %g", m)
	}
}

func TestParsePgbenchLog(t *testing.T) {
	log := "0 0 1500 0 1700000000 100000 0\n" +
		"1 0 2500 0 1700000000 200000 2\n" +
		"0 1 serialization 0 1700000001 0 5\n" +
		"1 1 900 0 1700000003 0 0\n"
	txns, err := ParsePgbenchLog(strings.NewReader(log))
	if err != nil {
		t.Fatal(err)
	}
	if len(txns) != 4 || txns[1].Retries != 2 || txns[1].Latency != 2500*time.Microsecond || !txns[2].Failed {
		t.Fatalf("parsed %+v", txns)
	}
	if _, err := ParsePgbenchLog(strings.NewReader("0 0 x\n")); !errors.Is(err, ErrBadPgbenchLog) {
		t.Errorf("short line: %v", err)
	}
	dir := t.TempDir()
	name := dir + "/pgbench_log.1"
	if err := os.WriteFile(name, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	// The first transaction started at 1700000000.0985; with a warm-up of
	// 0.9s the measured window starts at .9985, after the first two, and
	// holds the failed one and the last.
	res, err := PgbenchResult([]string{name}, PgbenchRun{Keys: 1000, Ops: 10, Clients: 2, Warmup: 900 * time.Millisecond, Duration: 2500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if res.Ops != 1 || res.Errors != 1 {
		t.Errorf("window holds %d commits, %d failures; want 1, 1", res.Ops, res.Errors)
	}
	res, err = PgbenchResult([]string{name}, PgbenchRun{Keys: 1000, Ops: 10, Clients: 2, Duration: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if res.Ops != 3 || res.Attempts.Max != 3 || res.System != PgbenchSystem || res.Params.Records != 1000 {
		t.Errorf("result %+v attempts %+v", res, res.Attempts)
	}
}

// TestWriteTxnMarkdown checks the ratios and goals of a made-up set of
// results.
func TestWriteTxnMarkdown(t *testing.T) {
	mk := func(system, mode string, keys int, rate float64, maxAttempts int) Result {
		r := Result{System: system, Workload: TxnWorkloadName, OpsPerSec: rate, Ops: int64(rate * 10),
			Params: Params{Records: keys, TxnMode: mode}, Latency: map[string]Latency{AllOps: {}}}
		if mode == TxnModeSerializable {
			var h AttemptHistogram
			h.Record(1)
			h.Record(maxAttempts)
			s := h.Stats()
			r.Attempts = &s
		}
		return r
	}
	rs := []Result{
		mk("groupkv", TxnModeSerializable, 100_000, 1000, 1),
		mk("groupkv", TxnModeNone, 100_000, 1500, 0),
		mk("etcd", TxnModeSerializable, 100_000, 50, 2),
		mk("postgresql", TxnModeSerializable, 100_000, 300, 2),
		mk(PgbenchSystem, TxnModeSerializable, 100_000, 250, 2),
		mk("groupkv", TxnModeSerializable, 1000, 150, 9),
	}
	var b bytes.Buffer
	if err := WriteTxnMarkdown(&b, rs); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"| 100000 | 20.00 | 3.33 | 4.00 | 0.67 | – |",
		"| 1000 | – | – | – | – | 0.15 |",
		"| low contention: groupkv ≥ 10× etcd STM | 20.00× at 100000 keys | yes |",
		"(the faster of pgx and pgbench) | 3.33× at 100000 keys | no |",
		"0.67× at 100000 keys | yes |",
		"0.15×; 0 failed transactions; at most 9 attempts | no |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}

// bankCheck runs clients×perClient transfers through d, each moving
// amounts between four distinct accounts of a few (so that they conflict
// often), then checks in one transaction that the accounts still hold
// their total: the transfers were atomic and isolated. It answers the
// attempts histogram.
func bankCheck(t *testing.T, d TxnDriver, accounts, clients, perClient int) AttemptHistogram {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := d.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	const initial = 100
	var keys, values [][]byte
	for i := range accounts {
		keys = append(keys, TxnKey(uint64(i)))
		values = append(values, EncodeCounter(initial))
	}
	if err := d.Load(ctx, keys, values); err != nil {
		t.Fatal(err)
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("SEED=%d", seed)
	var (
		mu   sync.Mutex
		hist AttemptHistogram
		wg   sync.WaitGroup
		errs = make(chan error, clients)
	)
	for c := range clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(c)))
			items := make([]uint64, 4)
			for range perClient {
				ChooseTxnKeys(rng, uint64(accounts), items)
				x, y := rng.Int64N(50), rng.Int64N(50)
				n, err := d.Transact(ctx, func(ctx context.Context, tx Tx) error {
					var bal [4]int64
					for i, it := range items {
						v, found, err := tx.Get(ctx, TxnKey(it))
						if err != nil {
							return err
						}
						if bal[i], err = DecodeCounter(v, found); err != nil {
							return err
						}
					}
					bal[0] -= x
					bal[1] += x
					bal[2] -= y
					bal[3] += y
					for i, it := range items {
						if err := tx.Put(ctx, TxnKey(it), EncodeCounter(bal[i])); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					errs <- fmt.Errorf("transfer after %d attempts: %w (SEED=%d)", n, err, seed)
					return
				}
				mu.Lock()
				hist.Record(n)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var sum int64
	if _, err := d.Transact(ctx, func(ctx context.Context, tx Tx) error {
		sum = 0
		for i := range accounts {
			v, found, err := tx.Get(ctx, TxnKey(uint64(i)))
			if err != nil {
				return err
			}
			b, err := DecodeCounter(v, found)
			if err != nil {
				return err
			}
			sum += b
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if want := int64(accounts * initial); sum != want {
		t.Fatalf("%s: the accounts hold %d after the transfers, want %d (SEED=%d)", d.System(), sum, want, seed)
	}
	if hist.Count() != uint64(clients*perClient) {
		t.Fatalf("%d transfers committed, want %d", hist.Count(), clients*perClient)
	}
	t.Logf("%s: %d transfers, attempts p50 %d p99 %d max %d", d.System(), hist.Count(), hist.Percentile(50), hist.Percentile(99), hist.Max())
	return hist
}

// runnerCheck runs the txn workload through a TxnRunner on a small key
// range, with no warm-up so that every transaction is counted, and checks
// that the keys hold 10 increments per committed transaction: no
// read-modify-write was lost.
func runnerCheck(t *testing.T, d TxnDriver) {
	t.Helper()
	for _, reads := range []string{TxnReadsEach, TxnReadsBatch} {
		runnerCheckReads(t, d, reads)
	}
}

// runnerCheckReads runs the txn workload reading keys as reads says, and
// checks that every committed transaction's increments are in the keys.
func runnerCheckReads(t *testing.T, d TxnDriver, reads string) {
	t.Helper()
	ctx := context.Background()
	r, err := NewTxnRunner(d, Options{Clients: 8, Duration: time.Second, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	w := TxnWorkload{Keys: 200, Reads: reads}
	if _, err := r.Load(ctx, w); err != nil {
		t.Fatal(err)
	}
	res, err := r.Run(ctx, w)
	if err != nil {
		t.Fatal(err)
	}
	if res.Ops == 0 || res.Errors != 0 || res.Attempts == nil || res.Attempts.Count != uint64(res.Ops) {
		t.Fatalf("reads %s: %d commits, %d errors, attempts %+v; samples %v", reads, res.Ops, res.Errors, res.Attempts, res.ErrorSamples)
	}
	if want := map[string]string{TxnReadsEach: "", TxnReadsBatch: TxnReadsBatch}[reads]; res.Params.TxnReads != want {
		t.Fatalf("reads %s: the result says txn_reads %q, want %q", reads, res.Params.TxnReads, want)
	}
	var sum int64
	for i := range 200 {
		v, found, err := d.Plain().Get(ctx, TxnKey(uint64(i)))
		if err != nil {
			t.Fatal(err)
		}
		n, err := DecodeCounter(v, found)
		if err != nil {
			t.Fatal(err)
		}
		sum += n
	}
	if want := 10 * res.Ops; sum != want {
		t.Fatalf("%s, reads %s: the keys hold %d increments after %d transactions of 10, want %d", d.System(), reads, sum, res.Ops, want)
	}
	t.Logf("%s, reads %s: %d commits/s, attempts p50 %d p99 %d max %d", d.System(), reads, int(res.OpsPerSec), res.Attempts.P50, res.Attempts.P99, res.Attempts.Max)
}

// TestGroupKVTxnEmbedded runs transfers and the txn workload through the
// groupkv driver on a node in this process.
func TestGroupKVTxnEmbedded(t *testing.T) {
	if testing.Short() {
		t.Skip("opens a node")
	}
	ctx := context.Background()
	d, err := OpenGroupKVEmbedded(ctx, t.TempDir(), DriverOptions{Table: "bank", Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	bankCheck(t, d, 12, 8, 40)
	runnerCheck(t, d)
}

// TestGroupKVTxnGRPC runs transfers and the txn workload through the
// driver OpenGroupKVTxn connects, against a node in this process behind the
// real gRPC server.
func TestGroupKVTxnGRPC(t *testing.T) {
	if testing.Short() {
		t.Skip("opens a node")
	}
	ctx := context.Background()
	d, err := OpenGroupKVTxn(ctx, serveNodeGRPC(t), DriverOptions{Table: "bank", Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, ok := d.txn.(*api.TxnClient); !ok {
		t.Fatalf("the driver's transactions go through %T, not the gRPC client", d.txn)
	}
	bankCheck(t, d, 12, 8, 25)
	runnerCheck(t, d)

	// Errors keep their codes.
	if _, _, err := d.txn.TxnGet(ctx, "no-such-txn", kv.KeyRef{Collection: "bank", Key: []byte("k1")}); kv.CodeOf(err) == kv.CodeInternal || err == nil {
		t.Errorf("get in an unknown transaction: %v", err)
	}
	if _, err := d.plain.Get(ctx, kv.GetRequest{Collection: "bank", Key: []byte("absent")}); kv.CodeOf(err) != kv.CodeNotFound {
		t.Errorf("plain get of an absent key: %v", err)
	}
}
