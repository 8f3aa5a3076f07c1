package node

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/groupkv/groupkv/internal/kv"
)

// readFaults fails reads of table files (sstables) with EIO, each with
// probability p, while it is on: a disk that returns errors for some of
// its blocks.
type readFaults struct {
	on       atomic.Bool
	injected atomic.Int64

	mu  sync.Mutex
	rng *rand.Rand
	p   float64
}

func (f *readFaults) String() string { return fmt.Sprintf("EIO on sstable reads, p=%v", f.p) }

func (f *readFaults) MaybeError(op errorfs.Op) error {
	if !f.on.Load() || (op.Kind != errorfs.OpFileRead && op.Kind != errorfs.OpFileReadAt) || !strings.HasSuffix(op.Path, ".sst") {
		return nil
	}
	f.mu.Lock()
	hit := f.rng.Float64() < f.p
	f.mu.Unlock()
	if !hit {
		return nil
	}
	f.injected.Add(1)
	return injectedEIO("read", op)
}

// faultyDisk is a crashable in-memory disk holding /data, and the options
// of a node on it whose file operations go through faults first.
func faultyDisk(t *testing.T, faults errorfs.Injector) (*vfs.MemFS, Options) {
	t.Helper()
	mem := vfs.NewCrashableMem()
	crashMakeDir(t, mem, "/data")
	return mem, Options{DataDir: "/data", FS: errorfs.Wrap(mem, faults), TickInterval: 10 * time.Millisecond,
		ConsistencyInterval: -1, Logger: crashLogger()}
}

// injectedEIO is the error a fault injector answers for op.
func injectedEIO(what string, op errorfs.Op) error {
	return fmt.Errorf("injected %s fault on %s: %w", what, op.Path, syscall.EIO)
}

// flushToTables writes everything n holds in memory to sstables and
// compacts them, so that reads of it go to the files.
func flushToTables(ctx context.Context, t *testing.T, n *Node) {
	t.Helper()
	if err := n.eng.DB.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := n.eng.DB.Compact(ctx, []byte{0}, bytes.Repeat([]byte{0xff}, 64), false); err != nil {
		t.Fatal(err)
	}
}

// faultRecord is what a key of TestReadFaultsAnswerErrorsNotWrongData holds.
type faultRecord struct {
	value   []byte
	tags    []string
	version uint64
}

// TestReadFaultsAnswerErrorsNotWrongData stores records in sstables, reopens
// the node with cold caches on a disk that fails sstable reads at random,
// and reads them every way a client can (get, batch get, scan forward and
// back, tag queries, transaction reads): every answer must be the stored
// data or an error; never a record missing, a key reported absent, or a
// scan or query cut short. With the faults off again every read must be
// right (a failed read leaves no damage behind).
func TestReadFaultsAnswerErrorsNotWrongData(t *testing.T) {
	seed := crashSeed(t)
	t.Logf("seed %d (replay with GROUPKV_SEED=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	faults := &readFaults{rng: rand.New(rand.NewPCG(seed, 2)), p: 0.05}
	fs := errorfs.Wrap(vfs.NewMem(), faults)
	crashMakeDir(t, fs, "/data")
	// No latest cache: reads of the latest values go to Pebble.
	opts := Options{DataDir: "/data", FS: fs, TickInterval: 10 * time.Millisecond, LatestCacheBytes: -1,
		ConsistencyInterval: -1, Logger: crashLogger()}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	n := crashOpen(t, seed, opts)
	crashCreate(t, seed, n, kv.CollectionOptions{Name: "c", Shards: 4})
	const numKeys = 600
	want := map[string]faultRecord{}
	keys := make([]string, numKeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%04d", i)
	}
	var items []kv.PutItem
	for i, k := range keys {
		value := bytes.Repeat([]byte{byte('a' + i%26)}, 1024+rng.IntN(2048))
		tags := []string{"all", fmt.Sprintf("g%d", i%7)}
		items = append(items, kv.PutItem{Collection: "c", Key: []byte(k), Value: value, Tags: tags})
		if len(items) == 50 || i == len(keys)-1 {
			res, err := n.BatchPut(ctx, items)
			if err != nil {
				t.Fatalf("seed %d: batch put: %v", seed, err)
			}
			for j, it := range items {
				want[string(it.Key)] = faultRecord{it.Value, it.Tags, res[j].Version}
			}
			items = items[:0]
		}
	}
	// Every eleventh key deleted: absent keys must read absent, too.
	for i := 0; i < numKeys; i += 11 {
		if _, err := n.Delete(ctx, kv.DeleteRequest{Collection: "c", Key: []byte(keys[i])}); err != nil {
			t.Fatalf("seed %d: delete: %v", seed, err)
		}
		delete(want, keys[i])
	}
	flushToTables(ctx, t, n)
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}

	n = crashOpen(t, seed, opts)
	defer func() { n.Close() }()
	var (
		okReads, failedReads int
		failures             []string
	)
	fail := func(format string, args ...any) {
		if len(failures) < 20 {
			failures = append(failures, fmt.Sprintf(format, args...))
		}
	}
	checkRecord := func(what string, key []byte, found bool, rec kv.Record) {
		w, ok := want[string(key)]
		switch {
		case ok != found:
			fail("%s %s: found %v, want %v", what, key, found, ok)
		case ok && (!bytes.Equal(rec.Value, w.value) || !slices.Equal(rec.Tags, w.tags) || rec.Version != w.version):
			fail("%s %s: %d bytes, tags %v, version %d; want %d bytes, tags %v, version %d",
				what, key, len(rec.Value), rec.Tags, rec.Version, len(w.value), w.tags, w.version)
		}
	}
	// checkList checks the records of a scan or tag query against the keys
	// that should be there, in order.
	checkList := func(what string, got []kv.Record, wantKeys []string) {
		gotKeys := make([]string, len(got))
		for i, r := range got {
			gotKeys[i] = string(r.Key)
			checkRecord(what, r.Key, true, r)
		}
		if !slices.Equal(gotKeys, wantKeys) {
			fail("%s: %d records, want %d (first missing or extra near %s)", what, len(gotKeys), len(wantKeys), firstDiff(gotKeys, wantKeys))
		}
	}
	var sample []string
	readError := func(what string, err error) {
		failedReads++
		if len(sample) < 3 {
			sample = append(sample, fmt.Sprintf("%s: %v", what, err))
		}
		if c := kv.CodeOf(err); c == kv.CodeNotFound || c == kv.CodeInvalidArgument {
			fail("%s: a read fault answered as %v", what, err)
		}
	}
	present := slices.Sorted(func(yield func(string) bool) {
		for k := range want {
			if !yield(k) {
				return
			}
		}
	})
	withTag := func(tag string) []string {
		var out []string
		for _, k := range present {
			if slices.Contains(want[k].tags, tag) {
				out = append(out, k)
			}
		}
		return out
	}

	// readAll reads with one of the ways a client can, chosen by op.
	readAll := func(op int) {
		switch op {
		case 0: // get
			k := keys[rng.IntN(numKeys)]
			rec, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte(k)})
			switch {
			case kv.CodeOf(err) == kv.CodeNotFound:
				okReads++
				checkRecord("get", []byte(k), false, rec)
			case err != nil:
				readError("get "+k, err)
			default:
				okReads++
				checkRecord("get", []byte(k), true, rec)
			}
		case 1: // batch get
			var refs []kv.KeyRef
			for range 10 {
				refs = append(refs, kv.KeyRef{Collection: "c", Key: []byte(keys[rng.IntN(numKeys)])})
			}
			res, err := n.BatchGet(ctx, refs)
			if err != nil {
				readError("batch get", err)
				return
			}
			okReads++
			if len(res.Items) != len(refs) {
				fail("batch get: %d items for %d keys", len(res.Items), len(refs))
				return
			}
			for _, it := range res.Items {
				checkRecord("batch get", it.Key, it.Found, kv.Record{Key: it.Key, Value: it.Value, Tags: it.Tags, Version: it.Version})
			}
		case 2, 3: // scan, forward or back, in pages
			reverse := op == 3
			var got []kv.Record
			page := ""
			for {
				res, err := n.Scan(ctx, kv.ScanRequest{Collection: "c", Limit: 100, Reverse: reverse, Page: page})
				if err != nil {
					readError(fmt.Sprintf("scan (reverse %v)", reverse), err)
					return
				}
				got = append(got, res.Items...)
				if page = res.NextPage; page == "" {
					break
				}
			}
			okReads++
			wantKeys := present
			if reverse {
				wantKeys = slices.Clone(present)
				slices.Reverse(wantKeys)
			}
			checkList(fmt.Sprintf("scan (reverse %v)", reverse), got, wantKeys)
		case 4: // tag query
			tag := fmt.Sprintf("g%d", rng.IntN(7))
			var got []kv.Record
			page := ""
			for {
				res, err := n.GetByTags(ctx, kv.TagQuery{Collection: "c", All: []string{tag}, Limit: 100, Page: page})
				if err != nil {
					readError("tag query "+tag, err)
					return
				}
				got = append(got, res.Items...)
				if page = res.NextPage; page == "" {
					break
				}
			}
			okReads++
			slices.SortFunc(got, func(a, b kv.Record) int { return bytes.Compare(a.Key, b.Key) })
			checkList("tag query "+tag, got, withTag(tag))
		case 5: // reads in a read-only transaction (it writes nothing)
			id, err := n.BeginTxn(ctx, kv.TxnOptions{ReadOnly: true})
			if err != nil {
				readError("begin", err)
				return
			}
			defer n.AbortTxn(ctx, id)
			for range 5 {
				k := keys[rng.IntN(numKeys)]
				rec, found, err := n.TxnGet(ctx, id, kv.KeyRef{Collection: "c", Key: []byte(k)})
				if err != nil {
					readError("txn get "+k, err)
					return
				}
				okReads++
				checkRecord("txn get", []byte(k), found, rec)
			}
		}
	}

	faults.on.Store(true)
	for range 400 {
		readAll(rng.IntN(6))
	}
	faults.on.Store(false)
	injected := faults.injected.Load()
	t.Logf("with faults: %d reads answered, %d failed, %d faults injected; failures such as %q", okReads, failedReads, injected, sample)
	if injected == 0 || failedReads == 0 {
		t.Errorf("seed %d: %d faults injected, %d reads failed, %d answered: the test tested nothing", seed, injected, failedReads, okReads)
	}
	// A fault met by a write the reads made (a transaction's record, a
	// lock's release) stops the node; restarted, it serves again.
	select {
	case <-n.Failed():
		t.Logf("the node stopped (%v); restarting it", n.Failure())
		n.Close()
		n = crashOpen(t, seed, opts)
	default:
	}
	// Without faults, every way of reading answers, and answers right.
	failedReads = 0
	for op := range 6 {
		for range 3 {
			readAll(op)
		}
	}
	if failedReads > 0 {
		fail("%d reads failed after the faults ended", failedReads)
	}
	for _, f := range failures {
		t.Errorf("seed %d: %s", seed, f)
	}
}

// firstDiff names the first key where two sorted key lists differ.
func firstDiff(a, b []string) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return fmt.Sprintf("%q / %q", a[i], b[i])
		}
	}
	if len(a) > len(b) {
		return fmt.Sprintf("%q (extra)", a[len(b)])
	}
	if len(b) > len(a) {
		return fmt.Sprintf("%q (missing)", b[len(a)])
	}
	return "nowhere"
}

// TestReadFaultsDuringWrites writes while sstable reads fail at random (a
// write reads the record it replaces, for its tags), then crashes the node
// (unsynced data dropped) and restarts it without faults: every
// acknowledged write must be there (or a later attempt on its key), and the
// tag index must agree with the records. A node that cannot read while it
// applies stops (Failed), says why, and answers every request unavailable
// at once until it is restarted. Rounds, each on what the last left, until
// three stopped the node (a round that did not makes faults likelier).
func TestReadFaultsDuringWrites(t *testing.T) {
	seed := crashSeed(t)
	t.Logf("seed %d (replay with GROUPKV_SEED=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	faults := &readFaults{rng: rand.New(rand.NewPCG(seed, 2)), p: 0.01}
	mem, opts := faultyDisk(t, faults)
	opts.LatestCacheBytes = -1
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	const (
		maxRounds = 10
		numKeys   = 200
		writers   = 4
		perKey    = numKeys / writers
		tagsN     = 5
	)
	// attempt is one write of a key, in the order its writer made them.
	type attempt struct {
		value   string
		tags    []string
		version uint64 // 0: not acknowledged (failed, or unknown)
	}
	history := make([][]attempt, numKeys) // by key index
	key := func(i int) string { return fmt.Sprintf("key-%04d", i) }
	tagsOf := func(g int) []string { return []string{"all", fmt.Sprintf("g%d", g)} }

	n := crashOpen(t, seed, opts)
	crashCreate(t, seed, n, kv.CollectionOptions{Name: "c", Shards: 2})
	for i := range numKeys {
		a := attempt{value: fmt.Sprintf("%s-initial-%s", key(i), strings.Repeat("x", 1024)), tags: tagsOf(rng.IntN(tagsN))}
		v, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte(key(i)), Value: []byte(a.value), Tags: a.tags})
		if err != nil {
			t.Fatalf("seed %d: put: %v", seed, err)
		}
		a.version = v
		history[i] = append(history[i], a)
	}

	var stops int
	for round := 0; round < maxRounds && stops < 3; round++ {
		// The records in sstables, the caches cold: writes read the disk.
		flushToTables(ctx, t, n)
		if err := n.Close(); err != nil {
			t.Fatal(err)
		}
		n = crashOpen(t, seed, opts)

		faults.injected.Store(0)
		faults.on.Store(true)
		var (
			wg            sync.WaitGroup
			acked, failed atomic.Int64
			mu            sync.Mutex
			unexpected    []string
		)
		for w := range writers {
			wrng := rand.New(rand.NewPCG(seed, uint64(100*round+w+10)))
			wg.Add(1)
			go func() {
				defer wg.Done()
				for op := range 60 {
					i := w*perKey + wrng.IntN(perKey) // each writer owns its keys
					a := attempt{value: fmt.Sprintf("%s-r%d-w%d-%d-%s", key(i), round, w, op, strings.Repeat("y", wrng.IntN(2048))),
						tags: tagsOf(wrng.IntN(tagsN))}
					v, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte(key(i)), Value: []byte(a.value), Tags: a.tags})
					if err == nil {
						a.version = v
						acked.Add(1)
					} else {
						failed.Add(1)
						if c := kv.CodeOf(err); c != kv.CodeUnavailable && c != kv.CodeCommitUnknown && c != kv.CodeInternal {
							mu.Lock()
							unexpected = append(unexpected, fmt.Sprintf("put %s: %v", key(i), err))
							mu.Unlock()
						}
					}
					mu.Lock()
					history[i] = append(history[i], a)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		faults.on.Store(false)
		for _, u := range unexpected {
			t.Errorf("seed %d round %d: %s", seed, round, u)
		}
		stopped := false
		select {
		case <-n.Failed():
			stopped = true
			stops++
			// It says why, and answers at once, without trying.
			if err := n.Ready(); err == nil || !strings.Contains(err.Error(), "storage failed") {
				t.Errorf("seed %d round %d: stopped node's Ready: %v, want its storage failure", seed, round, err)
			}
			_, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte(key(0)), Value: []byte("late")})
			if kv.CodeOf(err) != kv.CodeUnavailable || !strings.Contains(err.Error(), "storage failed") {
				t.Errorf("seed %d round %d: put on the stopped node: %v, want unavailable: storage failed", seed, round, err)
			}
			if _, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte(key(0))}); kv.CodeOf(err) != kv.CodeUnavailable {
				t.Errorf("seed %d round %d: get on the stopped node: %v, want unavailable", seed, round, err)
			}
		default:
			faults.mu.Lock()
			faults.p = min(1, 3*faults.p)
			faults.mu.Unlock()
		}
		t.Logf("round %d: %d faults injected, %d writes acknowledged, %d failed; node stopped: %v (%v)",
			round, faults.injected.Load(), acked.Load(), failed.Load(), stopped, n.Failure())

		crashed := mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 50, RNG: rand.New(rand.NewPCG(seed, uint64(1000+round)))})
		n.Close() // may report the failure that stopped it
		mem = crashed
		opts.FS = errorfs.Wrap(mem, faults)
		n = crashOpen(t, seed, opts)

		// Each key holds its last acknowledged write or a later attempt.
		holds := map[string][]string{} // tag -> keys, as the records say
		for i := range numKeys {
			rec, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte(key(i))})
			if err != nil {
				t.Fatalf("seed %d round %d: get %s after the restart: %v", seed, round, key(i), err)
			}
			h := history[i]
			last := 0
			for j, a := range h {
				if a.version != 0 {
					last = j
				}
			}
			found := -1
			for j := last; j < len(h); j++ {
				if string(rec.Value) == h[j].value && slices.Equal(rec.Tags, h[j].tags) {
					found = j
				}
			}
			if found < 0 || rec.Version < h[last].version {
				t.Fatalf("seed %d round %d: %s holds %.40q (tags %v, version %d); want its write acknowledged at version %d (%.40q) or a later attempt",
					seed, round, key(i), rec.Value, rec.Tags, rec.Version, h[last].version, h[last].value)
			}
			// What it holds is what later rounds must find.
			h[found].version = rec.Version
			history[i] = h[:found+1]
			for _, tag := range rec.Tags {
				holds[tag] = append(holds[tag], key(i))
			}
		}
		// The tag index agrees with the records.
		for g := range tagsN {
			tag := fmt.Sprintf("g%d", g)
			var got []string
			page := ""
			for {
				res, err := n.GetByTags(ctx, kv.TagQuery{Collection: "c", All: []string{tag}, Limit: 100, Page: page})
				if err != nil {
					t.Fatalf("seed %d round %d: tag query %s: %v", seed, round, tag, err)
				}
				for _, r := range res.Items {
					got = append(got, string(r.Key))
				}
				if page = res.NextPage; page == "" {
					break
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, holds[tag]) {
				t.Errorf("seed %d round %d: tag %s lists %d keys, the records %d (first difference at %s)",
					seed, round, tag, len(got), len(holds[tag]), firstDiff(got, holds[tag]))
			}
		}
	}
	n.Close()
	if stops == 0 {
		t.Errorf("seed %d: no round stopped the node: the faults never reached a write", seed)
	}
}

// tableWriteFaults fails the writes and syncs of table files (sstables)
// with EIO while it is on: of each file with probability p, its writes
// from one on at random. Flushes and compactions fail, and Pebble retries
// them into new files.
type tableWriteFaults struct {
	readFaults
	// failFrom is, by path, the write of the file from which on it fails
	// (-1: it does not); ops counts its writes so far (under mu).
	failFrom map[string]int
	ops      map[string]int
	// all fails every write of every file instead.
	all bool
}

// isFileWrite reports whether op writes or syncs a file.
func isFileWrite(op errorfs.Op) bool {
	switch op.Kind {
	case errorfs.OpFileWrite, errorfs.OpFileWriteAt, errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpFileSyncTo:
		return true
	}
	return false
}

func (f *tableWriteFaults) MaybeError(op errorfs.Op) error {
	if !isFileWrite(op) || !f.on.Load() || !strings.HasSuffix(op.Path, ".sst") {
		return nil
	}
	if f.all {
		f.injected.Add(1)
		return injectedEIO("write", op)
	}
	f.mu.Lock()
	from, ok := f.failFrom[op.Path]
	if !ok {
		from = -1
		if f.rng.Float64() < f.p {
			from = f.rng.IntN(4)
		}
		f.failFrom[op.Path] = from
	}
	k := f.ops[op.Path]
	f.ops[op.Path] = k + 1
	f.mu.Unlock()
	if from < 0 || k < from {
		return nil
	}
	f.injected.Add(1)
	return injectedEIO("write", op)
}

// TestTableWriteFaultsLoseNothing writes while the writes of about a third
// of the sstables fail (flushes and compactions fail and are retried), then
// crashes the node and restarts it without faults: every acknowledged write
// must be there, and the node must have gone on serving throughout.
func TestTableWriteFaultsLoseNothing(t *testing.T) {
	seed := crashSeed(t)
	t.Logf("seed %d (replay with GROUPKV_SEED=%d)", seed, seed)
	faults := &tableWriteFaults{readFaults: readFaults{rng: rand.New(rand.NewPCG(seed, 2)), p: 0.3}, failFrom: map[string]int{}, ops: map[string]int{}}
	mem, opts := faultyDisk(t, faults)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n := crashOpen(t, seed, opts)
	crashCreate(t, seed, n, kv.CollectionOptions{Name: "c", Shards: 2})

	const (
		writers = 4
		perW    = 150
	)
	type acked struct {
		value   string
		version uint64
	}
	last := make([]map[string]acked, writers) // each writer's keys
	faults.on.Store(true)
	var (
		wg        sync.WaitGroup
		failed    atomic.Int64
		flushErrs atomic.Int64
		mu        sync.Mutex
		errs      []string
	)
	for w := range writers {
		last[w] = map[string]acked{}
		wrng := rand.New(rand.NewPCG(seed, uint64(10+w)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for op := range perW {
				k := fmt.Sprintf("w%d-key-%03d", w, wrng.IntN(60))
				value := fmt.Sprintf("%s-%d-%s", k, op, strings.Repeat("z", 512+wrng.IntN(2048)))
				v, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte(k), Value: []byte(value), Tags: []string{fmt.Sprint("t", op%3)}})
				if err != nil {
					failed.Add(1)
					mu.Lock()
					errs = append(errs, err.Error())
					mu.Unlock()
					continue
				}
				last[w][k] = acked{value, v}
				if op%25 == 0 {
					// Flushes that fail leave the memtable to a retry.
					if err := n.eng.DB.Flush(); err != nil {
						flushErrs.Add(1)
					}
				}
			}
		}()
	}
	wg.Wait()
	faults.on.Store(false)
	t.Logf("%d faults injected; %d flushes asked for failed; %d of %d writes failed", faults.injected.Load(), flushErrs.Load(), failed.Load(), writers*perW)
	if faults.injected.Load() == 0 {
		t.Errorf("seed %d: no fault injected: the test tested nothing", seed)
	}
	if failed.Load() > 0 {
		t.Errorf("seed %d: %d writes failed while only table writes did (first: %s)", seed, failed.Load(), errs[0])
	}
	select {
	case <-n.Failed():
		t.Errorf("seed %d: the node stopped: %v", seed, n.Failure())
	default:
	}

	crashed := mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 50, RNG: rand.New(rand.NewPCG(seed, 3))})
	n.Close()
	opts.FS = crashed
	n = crashOpen(t, seed, opts)
	defer n.Close()
	for w := range writers {
		for k, a := range last[w] {
			rec, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte(k)})
			if err != nil {
				t.Fatalf("seed %d: get %s after the restart: %v", seed, k, err)
			}
			if string(rec.Value) != a.value || rec.Version != a.version {
				t.Errorf("seed %d: %s holds %.30q at version %d; its last acknowledged write is %.30q at version %d",
					seed, k, rec.Value, rec.Version, a.value, a.version)
			}
		}
	}
}

// bitRotFS flips a bit in every block read from a table file (sstable)
// while it is on: data damaged on disk, which Pebble's checksums catch.
type bitRotFS struct {
	vfs.FS
	on    atomic.Bool
	flips atomic.Int64
}

func (fs *bitRotFS) Open(name string, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.Open(name, opts...)
	if err != nil || !strings.HasSuffix(name, ".sst") {
		return f, err
	}
	return &bitRotFile{File: f, fs: fs}, nil
}

type bitRotFile struct {
	vfs.File
	fs *bitRotFS
}

func (f *bitRotFile) ReadAt(p []byte, off int64) (int, error) {
	n, err := f.File.ReadAt(p, off)
	if n > 0 && f.fs.on.Load() {
		p[n/2] ^= 0x10
		f.fs.flips.Add(1)
	}
	return n, err
}

// TestCorruptionStopsTheNode reads records while every block read from the
// node's sstables comes back damaged (a bit flipped): no read answers
// wrong data or an absent key, and the first that meets the damage stops
// the node — it says so (Failed, Failure, Ready), answers every request
// unavailable, and closes cleanly, without the panic that is Pebble's
// default on corruption.
func TestCorruptionStopsTheNode(t *testing.T) {
	seed := crashSeed(t)
	t.Logf("seed %d (replay with GROUPKV_SEED=%d)", seed, seed)
	fs := &bitRotFS{FS: vfs.NewMem()}
	crashMakeDir(t, fs, "/data")
	opts := Options{DataDir: "/data", FS: fs, TickInterval: 10 * time.Millisecond, LatestCacheBytes: -1,
		ConsistencyInterval: -1, Logger: crashLogger()}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n := crashOpen(t, seed, opts)
	crashCreate(t, seed, n, kv.CollectionOptions{Name: "c", Shards: 2})
	want := map[string]string{}
	for i := range 200 {
		k := fmt.Sprintf("key-%03d", i)
		want[k] = fmt.Sprintf("%s-%s", k, strings.Repeat(string(rune('a'+i%26)), 2048))
		if _, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte(k), Value: []byte(want[k])}); err != nil {
			t.Fatal(err)
		}
	}
	flushToTables(ctx, t, n)
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}

	// Reopened with cold caches, the node reads its records from disk.
	n = crashOpen(t, seed, opts)
	defer func() {
		if err := n.Close(); err != nil {
			t.Logf("close: %v", err)
		}
	}()
	fs.on.Store(true)
	var answered, failed int
	for k, v := range want {
		rec, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte(k)})
		switch {
		case err != nil:
			failed++
			if c := kv.CodeOf(err); c == kv.CodeNotFound {
				t.Errorf("seed %d: get %s: %v: damage answered as an absent key", seed, k, err)
			}
		case string(rec.Value) != v:
			t.Errorf("seed %d: get %s: %.20q, want %.20q", seed, k, rec.Value, v)
		default:
			answered++
		}
	}
	fs.on.Store(false)
	t.Logf("%d blocks read damaged; %d reads answered, %d failed", fs.flips.Load(), answered, failed)
	select {
	case <-n.Failed():
	default:
		t.Fatalf("seed %d: reads of damaged blocks did not stop the node (%d failed)", seed, failed)
	}
	if err := n.Failure(); err == nil || !strings.Contains(err.Error(), "on-disk corruption") {
		t.Errorf("seed %d: Failure %v, want the corruption", seed, err)
	}
	if err := n.Ready(); err == nil || !strings.Contains(err.Error(), "storage failed") {
		t.Errorf("seed %d: Ready %v, want the storage failure", seed, err)
	}
	if _, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte("new"), Value: []byte("v")}); kv.CodeOf(err) != kv.CodeUnavailable {
		t.Errorf("seed %d: put on the stopped node: %v, want unavailable", seed, err)
	}
}

// TestClusterOutlivesANodesFailedDisk fails every sstable read of one node
// of three while clients write through another: the node stops (it cannot
// read what its writes replace), the other two go on taking writes, and
// restarted with a working disk it catches up: every acknowledged write
// reads back through it, and a consistency check of every shard finds the
// three replicas equal.
func TestClusterOutlivesANodesFailedDisk(t *testing.T) {
	seed := crashSeed(t)
	t.Logf("seed %d (replay with GROUPKV_SEED=%d)", seed, seed)
	faults := &readFaults{rng: rand.New(rand.NewPCG(seed, 2)), p: 1}
	c := startCluster(t, 3, func(o *Options) {
		o.ConsistencyInterval = -1
		o.LatestCacheBytes = -1 // writes read the records they replace from disk
		if o.NodeID == 3 {
			o.FS = errorfs.Wrap(vfs.Default, faults)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n1 := c.node(1).n
	if _, err := n1.CreateCollection(ctx, kv.CollectionOptions{Name: "c", Shards: 2, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	const numKeys = 100
	want := map[string]uint64{} // key -> last acknowledged version
	value := map[string]string{}
	put := func(i, round int) error {
		k := fmt.Sprintf("key-%03d", i)
		v := fmt.Sprintf("%s-%d", k, round)
		ver, err := n1.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte(k), Value: []byte(v), Tags: []string{fmt.Sprint("t", round)}})
		if err == nil {
			want[k], value[k] = ver, v
		}
		return err
	}
	for i := range numKeys {
		if err := put(i, 0); err != nil {
			t.Fatal(err)
		}
	}
	// Node 3 holds its replicas in sstables, and its disk fails.
	n3 := c.node(3).n
	c.eventually(30*time.Second, "node 3 applied every write", func() error {
		for _, id := range n3.localShardIDs() {
			if a, _ := n3.host.AppliedIndex(id); a == 0 {
				return fmt.Errorf("shard %d not applied", id)
			}
		}
		_, err := n3.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte(fmt.Sprintf("key-%03d", numKeys-1))})
		return err
	})
	flushToTables(ctx, t, n3)
	faults.on.Store(true)
	failedWrites := 0
	for round := 1; round <= 3; round++ {
		for i := range numKeys {
			if err := put(i, round); err != nil {
				failedWrites++ // a leader on node 3 lost: retried below
				if err := put(i, round); err != nil {
					t.Logf("round %d: put key-%03d: %v", round, i, err)
				}
			}
		}
	}
	select {
	case <-n3.Failed():
		t.Logf("node 3 stopped: %v (%d writes failed once meanwhile)", n3.Failure(), failedWrites)
	default:
		t.Fatalf("seed %d: node 3 did not stop though every read of its tables failed (%d faults)", seed, faults.injected.Load())
	}
	// Every acknowledged write is there through node 1.
	for k, ver := range want {
		rec, err := n1.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte(k)})
		if err != nil || rec.Version != ver || string(rec.Value) != value[k] {
			t.Fatalf("seed %d: %s through node 1: %+v %v, want version %d", seed, k, rec, err, ver)
		}
	}

	// Node 3 restarts with a working disk and catches up.
	faults.on.Store(false)
	old := c.node(3)
	old.srv.Stop()
	old.n.Close()
	tn := c.startNode(3, old.n.opts.DataDir, nil, old.peer)
	c.nodes[2] = tn
	c.eventually(60*time.Second, "node 3 reads every acknowledged write", func() error {
		for k, ver := range want {
			rec, err := tn.n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte(k)})
			if err != nil {
				return err
			}
			if rec.Version != ver || string(rec.Value) != value[k] {
				return fmt.Errorf("%s at version %d, want %d", k, rec.Version, ver)
			}
		}
		return nil
	})
	c.eventually(60*time.Second, "every shard's replicas equal", func() error {
		res, err := n1.CheckConsistency(ctx, nil)
		if err != nil {
			return err
		}
		for _, r := range res {
			if r.Status == kv.ConsistencyMismatch {
				t.Fatalf("seed %d: shard %d: %s", seed, r.Shard, r.Summary())
			}
			if r.Status != kv.ConsistencyOK {
				return fmt.Errorf("shard %d: %s %v", r.Shard, r.Status, r.Errors)
			}
		}
		return nil
	})
}

// TestFailingFlushesStopTheNode fails every write of every sstable: no
// flush can succeed, and Pebble retries them for good. Small memtables
// fill and queue as writes go on, until writes stall for a flush that
// will not come. After StorageFailureLimit of failures the node stops
// (Failed names the flushes) instead of leaving writes to wait without an
// error: the writes in flight answer (commit_unknown), and the reads,
// though the stalled write still holds the replication loop; new requests
// answer unavailable; Close returns (after FailedCloseWait) though the
// node cannot finish closing. With the disk working again it does; after
// a crash it has every write it acknowledged (they were in its log).
func TestFailingFlushesStopTheNode(t *testing.T) {
	seed := crashSeed(t)
	t.Logf("seed %d (replay with GROUPKV_SEED=%d)", seed, seed)
	faults := &tableWriteFaults{readFaults: readFaults{rng: rand.New(rand.NewPCG(seed, 2)), p: 1}, failFrom: map[string]int{}, ops: map[string]int{}, all: true}
	mem, opts := faultyDisk(t, faults)
	opts.StorageFailureLimit = 300 * time.Millisecond
	opts.FailedCloseWait = 300 * time.Millisecond
	// Small memtables fill while their flushes fail: two full ones
	// waiting stall writes (Pebble's stop threshold).
	opts.MemTableSize = 64 << 10
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n := crashOpen(t, seed, opts)
	// However the test ends, the disk works again and the node finishes
	// closing: Pebble retries failed flushes without a pause, for good.
	first := n
	closeFirst := sync.OnceFunc(func() {
		faults.on.Store(false)
		first.Close()
		select {
		case <-first.closeDone: // a Close that gave up finishes now
		case <-time.After(60 * time.Second):
			t.Errorf("seed %d: the node did not finish closing 60 s after the disk took writes again", seed)
		}
	})
	t.Cleanup(closeFirst)
	crashCreate(t, seed, n, kv.CollectionOptions{Name: "c", Shards: 2})

	var (
		mu      sync.Mutex
		acked   = map[string]uint64{}
		unknown atomic.Int64
		writes  atomic.Int64
	)
	faults.on.Store(true)
	var active sync.WaitGroup
	// A reader reads meanwhile: its read in flight at the stop answers too.
	active.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-n.Failed():
				return
			default:
			}
			_, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte(fmt.Sprintf("key-%03d", i%200))})
			if c := kv.CodeOf(err); err != nil && c != kv.CodeNotFound && c != kv.CodeUnavailable {
				t.Errorf("seed %d: get: %v, want a value, not_found or unavailable", seed, err)
			}
		}
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer active.Wait()
		for i := 0; ; i++ {
			select {
			case <-n.Failed():
				return
			default:
			}
			k := fmt.Sprintf("key-%03d", i%200)
			v, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte(k), Value: []byte(fmt.Sprintf("%s-%d", k, i))})
			writes.Add(1)
			switch c := kv.CodeOf(err); {
			case err == nil:
				mu.Lock()
				acked[k] = v
				mu.Unlock()
			case c == kv.CodeCommitUnknown:
				unknown.Add(1)
			case c != kv.CodeUnavailable:
				t.Errorf("seed %d: put %s: %v, want unavailable or commit_unknown", seed, k, err)
			}
		}
	}()
	select {
	case <-n.Failed():
	case <-ctx.Done():
		t.Fatalf("seed %d: the node did not stop while every flush failed (%d faults injected, %d writes)", seed, faults.injected.Load(), writes.Load())
	}
	// Liveness: a generous deadline that only catches a write left
	// waiting on the stopped node.
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("seed %d: a write or a read still waits 30 s after the node stopped", seed)
	}
	t.Logf("%d faults injected; the node stopped after %d writes (%d answered commit_unknown), %d write stalls: %v", faults.injected.Load(), writes.Load(), unknown.Load(), n.eng.WriteStalls(), n.Failure())
	if err := n.Failure(); err == nil || !strings.Contains(err.Error(), "flushes have failed") {
		t.Errorf("seed %d: Failure %v, want the flushes named", seed, err)
	}
	if err := n.Ready(); err == nil || !strings.Contains(err.Error(), "storage failed") {
		t.Errorf("seed %d: Ready %v, want the storage failure", seed, err)
	}
	if _, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte("new"), Value: []byte("v")}); kv.CodeOf(err) != kv.CodeUnavailable {
		t.Errorf("seed %d: put on the stopped node: %v, want unavailable", seed, err)
	}

	// Close, the disk still failing, returns: it waits FailedCloseWait
	// for a node held by a stalled write (Pebble's Close would wait for
	// that write too, and for its flushes).
	closed := make(chan error, 1)
	go func() { closed <- n.Close() }()
	select {
	case err := <-closed:
		t.Logf("Close on the failing disk: %v", err)
		switch {
		case err != nil && !strings.Contains(err.Error(), "storage failed"):
			t.Errorf("seed %d: Close on the failing disk: %v, want the storage failure named", seed, err)
		case err == nil && n.eng.WriteStalls() > 0:
			// A stalled write holds Pebble's commit lock, which its
			// Close takes: the node cannot have closed.
			t.Errorf("seed %d: Close on the failing disk with a write stalled answered no error", seed)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("seed %d: Close still waits 60 s after it was called on the failing disk", seed)
	}

	crashed := mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 50, RNG: rand.New(rand.NewPCG(seed, 3))})
	closeFirst() // the disk works again: a stalled write goes through, and the node finishes closing
	opts.FS = crashed
	n = crashOpen(t, seed, opts)
	defer n.Close()
	for k, v := range acked {
		rec, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte(k)})
		if err != nil || rec.Version < v {
			t.Errorf("seed %d: %s after the restart: version %d, %v; its last acknowledged write is version %d", seed, k, rec.Version, err, v)
		}
	}
}

// walFaults fails every write and sync of the write-ahead log (Pebble's
// *.log files) while it is on: a disk that stops taking the log.
type walFaults struct {
	on       atomic.Bool
	injected atomic.Int64
}

func (f *walFaults) String() string { return "EIO on WAL writes and syncs" }

func (f *walFaults) MaybeError(op errorfs.Op) error {
	if !isFileWrite(op) || !f.on.Load() || !strings.HasSuffix(op.Path, ".log") {
		return nil
	}
	f.injected.Add(1)
	return injectedEIO("WAL", op)
}

// TestWALFaultsStopTheNode has the log's writes fail while clients write:
// no write is acknowledged that is not durable. The node stops (no panic;
// it says why), its writes in flight answer an error, and restarted on a
// working disk after a crash that drops what was not synced, every
// acknowledged write is there.
func TestWALFaultsStopTheNode(t *testing.T) {
	seed := crashSeed(t)
	t.Logf("seed %d (replay with GROUPKV_SEED=%d)", seed, seed)
	faults := &walFaults{}
	mem, opts := faultyDisk(t, faults)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n := crashOpen(t, seed, opts)
	crashCreate(t, seed, n, kv.CollectionOptions{Name: "c", Shards: 2})

	const writers = 4
	rng := rand.New(rand.NewPCG(seed, 5))
	failAfter := time.Duration(20+rng.IntN(80)) * time.Millisecond
	var (
		mu     sync.Mutex
		acked  = map[string]uint64{}
		failed atomic.Int64
		wg     sync.WaitGroup
	)
	time.AfterFunc(failAfter, func() { faults.on.Store(true) })
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-n.Failed():
					return
				case <-ctx.Done():
					return
				default:
				}
				k := fmt.Sprintf("w%d-%03d", w, i%100)
				v, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte(k), Value: []byte(fmt.Sprint(i))})
				if err != nil {
					failed.Add(1)
					if c := kv.CodeOf(err); c != kv.CodeUnavailable && c != kv.CodeCommitUnknown {
						t.Errorf("seed %d: put %s: %v, want unavailable or commit_unknown", seed, k, err)
					}
					continue
				}
				mu.Lock()
				acked[k] = max(acked[k], v)
				mu.Unlock()
			}
		}()
	}
	select {
	case <-n.Failed():
	case <-ctx.Done():
		t.Fatalf("seed %d: the node did not stop while its log could not be written (%d faults injected)", seed, faults.injected.Load())
	}
	wg.Wait()
	t.Logf("faults from %v: %d injected, %d writes acknowledged (keys), %d failed; failure: %v", failAfter, faults.injected.Load(), len(acked), failed.Load(), n.Failure())
	if n.Failure() == nil {
		t.Errorf("seed %d: Failed closed without a Failure", seed)
	}
	if _, err := n.Put(ctx, kv.PutRequest{Collection: "c", Key: []byte("new"), Value: []byte("v")}); kv.CodeOf(err) != kv.CodeUnavailable {
		t.Errorf("seed %d: put on the stopped node: %v, want unavailable", seed, err)
	}

	faults.on.Store(false)
	crashed := mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
	n.Close()
	opts.FS = crashed
	n = crashOpen(t, seed, opts)
	defer n.Close()
	for k, v := range acked {
		rec, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte(k)})
		if err != nil || rec.Version < v {
			t.Errorf("seed %d: %s after the restart: version %d, %v; it was acknowledged at version %d", seed, k, rec.Version, err, v)
		}
	}
}
