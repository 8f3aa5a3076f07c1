package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	groupkv "github.com/groupkv/groupkv"
	"github.com/groupkv/groupkv/internal/api"
)

// backedUp is a record as a backup file holds it.
type backedUp struct {
	Value string
	Tags  []string
}

// readBackupFile parses a backup file on its own terms (not with the
// command's reader): the records of each collection, and its header's
// version.
func readBackupFile(t *testing.T, path string) (uint64, map[string]map[string]backedUp) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]backedUp{}
	var version uint64
	cur := ""
	for i, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		var l map[string]json.RawMessage
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatalf("line %d: %v: %s", i+1, err, line)
		}
		switch {
		case l["groupkv_backup"] != nil:
			if err := json.Unmarshal(l["version"], &version); err != nil {
				t.Fatal(err)
			}
		case l["collection"] != nil:
			var c struct{ Name string }
			json.Unmarshal(l["collection"], &c)
			cur = c.Name
			out[cur] = map[string]backedUp{}
		case l["collection_end"] != nil, l["end"] != nil:
			cur = ""
		default:
			var r api.RecordJSON
			if err := json.Unmarshal([]byte(line), &r); err != nil {
				t.Fatal(err)
			}
			key, _, _ := api.BytesFromJSON("key", r.Key, r.KeyBase64)
			value, _, _ := api.BytesFromJSON("value", r.Value, r.ValueBase64)
			out[cur][string(key)] = backedUp{Value: string(value), Tags: r.Tags}
		}
	}
	return version, out
}

// scanAll reads every record of collection coll, at the latest version.
func scanAll(t *testing.T, db groupkv.DB, coll string) map[string]backedUp {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out := map[string]backedUp{}
	page := ""
	for {
		res, err := db.Scan(ctx, groupkv.ScanRequest{Collection: coll, Page: page, Limit: 1000})
		if err != nil {
			t.Fatalf("scanning %s: %v", coll, err)
		}
		for _, r := range res.Items {
			out[string(r.Key)] = backedUp{Value: string(r.Value), Tags: r.Tags}
		}
		if res.NextPage == "" {
			return out
		}
		page = res.NextPage
	}
}

// sameRecords reports how want and got differ ("" when they do not);
// no tags and [] are the same.
func sameRecords(want, got map[string]backedUp) string {
	for k, w := range want {
		g, ok := got[k]
		switch {
		case !ok:
			return fmt.Sprintf("key %q missing", k)
		case g.Value != w.Value || len(g.Tags)+len(w.Tags) > 0 && !reflect.DeepEqual(g.Tags, w.Tags):
			return fmt.Sprintf("key %q: %q %v, want %q %v", k, g.Value, g.Tags, w.Value, w.Tags)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			return fmt.Sprintf("key %q not expected", k)
		}
	}
	return ""
}

// TestEndToEndBackupRestore: groupkv backup of a server whose bank
// collection takes transfers throughout is one consistent state (the
// total is the same), has every write acknowledged before it began and
// none acknowledged after it ended; --version reads an older state;
// groupkv restore recreates the collections (partitioning, shards, split
// points) and records (bytes that are not UTF-8, tags) on another server,
// refuses collections that exist, and refuses a changed or truncated file
// before it writes anything.
func TestEndToEndBackupRestore(t *testing.T) {
	dir, a, b, dbA, dbB := startBackupPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	for _, o := range []groupkv.CollectionOptions{
		{Name: "users", Shards: 4},
		{Name: "events", Partitioning: groupkv.PartitionRange, SplitPoints: [][]byte{[]byte("g"), []byte("p")}},
		{Name: "timeline", Partitioning: "tag", Shards: 2},
		{Name: "bank", Shards: 4},
		{Name: "vault", Shards: 2},
	} {
		if _, err := dbA.CreateCollection(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	var items []groupkv.PutItem
	for i := range 1500 { // more than one page and one restore batch
		items = append(items, groupkv.PutItem{Collection: "users", Key: []byte(fmt.Sprintf("u%04d", i)), Value: []byte(fmt.Sprintf("user %d", i)), Tags: []string{"t" + strconv.Itoa(i%3)}})
		if len(items) == 500 {
			if _, err := dbA.BatchPut(ctx, items); err != nil {
				t.Fatal(err)
			}
			items = items[:0]
		}
	}
	for _, it := range []groupkv.PutItem{
		{Collection: "users", Key: []byte{0xff, 0x00, 'k'}, Value: []byte{0x00, 0xfe, 0xff}},
		{Collection: "users", Key: []byte("empty"), Value: []byte{}},
		{Collection: "events", Key: []byte("apple"), Value: []byte("1")},
		{Collection: "events", Key: []byte("kiwi"), Value: []byte("2")},
		{Collection: "events", Key: []byte("zucchini"), Value: []byte("3")},
		{Collection: "timeline", Key: []byte("post1"), Value: []byte("hi"), Tags: []string{"alice", "news"}},
		{Collection: "timeline", Key: []byte("post2"), Value: []byte("yo"), Tags: []string{"bob"}},
	} {
		if _, err := dbA.Put(ctx, groupkv.PutRequest{Collection: it.Collection, Key: it.Key, Value: it.Value, Tags: it.Tags}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := dbA.Delete(ctx, groupkv.DeleteRequest{Collection: "users", Key: []byte("u0007")}); err != nil {
		t.Fatal(err)
	}
	const accounts, initial = 20, 100
	// The accounts are in two collections: a backup that read them at two
	// versions would not add up.
	acct := func(i int) []byte { return []byte(fmt.Sprintf("acct%02d", i)) }
	coll := func(i int) string { return []string{"bank", "vault"}[i%2] }
	for i := range accounts {
		if _, err := dbA.Put(ctx, groupkv.PutRequest{Collection: coll(i), Key: acct(i), Value: []byte(strconv.Itoa(initial))}); err != nil {
			t.Fatal(err)
		}
	}
	v1, err := dbA.Put(ctx, groupkv.PutRequest{Collection: "users", Key: []byte("pit"), Value: []byte("one")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dbA.Put(ctx, groupkv.PutRequest{Collection: "users", Key: []byte("pit"), Value: []byte("two")}); err != nil {
		t.Fatal(err)
	}
	wantUsers := scanAll(t, dbA, "users")
	if len(wantUsers) != 1502 {
		t.Fatalf("users holds %d records before the backup, want 1502", len(wantUsers))
	}

	// Transfers run while the backup reads.
	stopTransfers := startTransfers(t, ctx, []groupkv.DB{dbA}, accounts, coll, acct)
	full := filepath.Join(dir, "full.backup")
	out, err := exec.Command(binary, "backup", "--addr", a.addr, "--out", full).CombinedOutput()
	if err != nil {
		t.Fatalf("backup: %v\n%s", err, out)
	}
	if _, err := dbA.Put(ctx, groupkv.PutRequest{Collection: "users", Key: []byte("late"), Value: []byte("after the backup")}); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d transfers; backup: %s", stopTransfers(), out)
	if _, err := os.Stat(full + ".tmp"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the backup's temporary file is left: %v", err)
	}

	version, got := readBackupFile(t, full)
	if version == 0 || len(got) != 5 {
		t.Fatalf("backup at version %d with collections %v, want 5", version, slices.Collect(mapKeys(got)))
	}
	if d := sameRecords(wantUsers, got["users"]); d != "" {
		t.Errorf("backed-up users: %s", d)
	}
	wantBalanced(t, got, accounts, accounts*initial)

	// --check-only: what the file holds, with no server.
	out, err = exec.Command(binary, "restore", full, "--check-only", "--addr", "127.0.0.1:1").CombinedOutput()
	var checked backupSummary
	if err != nil || json.Unmarshal(out, &checked) != nil || checked.Version != version || checked.Collections != 5 || checked.Records != 1502+3+2+20 {
		t.Fatalf("restore --check-only: %v %+v\n%s", err, checked, out)
	}

	// Restore on b: the same collections and records.
	out, err = exec.Command(binary, "restore", full, "--addr", b.addr).CombinedOutput()
	if err != nil {
		t.Fatalf("restore: %v\n%s", err, out)
	}
	for _, name := range []string{"users", "events", "timeline", "bank", "vault"} {
		if d := sameRecords(got[name], scanAll(t, dbB, name)); d != "" {
			t.Errorf("restored %s: %s", name, d)
		}
		ia, err := dbA.DescribeCollection(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		ib, err := dbB.DescribeCollection(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if ia.Partitioning != ib.Partitioning || len(ia.Shards) != len(ib.Shards) || !reflect.DeepEqual(ia.SplitPoints, ib.SplitPoints) {
			t.Errorf("restored %s: %s, %d shards, split points %q; want %s, %d, %q", name,
				ib.Partitioning, len(ib.Shards), ib.SplitPoints, ia.Partitioning, len(ia.Shards), ia.SplitPoints)
		}
	}
	res, err := dbB.GetByTags(ctx, groupkv.TagQuery{Collection: "timeline", Any: []string{"alice"}})
	if err != nil || len(res.Items) != 1 || string(res.Items[0].Key) != "post1" {
		t.Errorf("tag query on the restored timeline: %+v %v", res.Items, err)
	}

	// Collections that exist are refused; nothing is written.
	if _, err := dbB.Put(ctx, groupkv.PutRequest{Collection: "users", Key: []byte("u0001"), Value: []byte("changed")}); err != nil {
		t.Fatal(err)
	}
	u0001 := func() string {
		r, err := dbB.Get(ctx, groupkv.GetRequest{Collection: "users", Key: []byte("u0001")})
		if err != nil {
			t.Fatal(err)
		}
		return string(r.Value)
	}
	restore := func(wantOK bool, says string, args ...string) {
		t.Helper()
		cmd := exec.Command(binary, append([]string{"restore", "--addr", b.addr}, args...)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		if wantOK != (err == nil) || !strings.Contains(stderr.String(), says) {
			t.Errorf("restore %v: %v, %q; want success %v and %q", args, err, stderr.String(), wantOK, says)
		}
	}
	restore(false, "already (bank, events, timeline, users, vault)", full)
	if v := u0001(); v != "changed" {
		t.Errorf("a refused restore wrote u0001: %q", v)
	}

	// A changed or truncated file is refused before anything is written.
	raw, err := os.ReadFile(full)
	if err != nil {
		t.Fatal(err)
	}
	changed := bytes.Replace(raw, []byte(`"user 1"`), []byte(`"user X"`), 1)
	cut := raw[:len(raw)*2/3]
	cut = cut[:bytes.LastIndexByte(cut, '\n')+1]
	for name, data := range map[string][]byte{"changed": changed, "cut": cut, "empty": nil} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		says := map[string]string{"changed": "the file was changed", "cut": "cut short", "empty": "is empty"}[name]
		restore(false, says, path, "--overwrite")
		restore(false, says, path, "--check-only")
	}
	if v := u0001(); v != "changed" {
		t.Errorf("a restore of a damaged file wrote u0001: %q", v)
	}

	// --overwrite of one collection, from standard input.
	cmd := exec.Command(binary, "restore", "-", "--addr", b.addr, "--overwrite", "--collection", "users")
	cmd.Stdin = bytes.NewReader(raw)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("restore --overwrite: %v\n%s", err, out)
	}
	if v := u0001(); v != "user 1" {
		t.Errorf("after restore --overwrite, u0001 is %q", v)
	}

	// An older state: --version.
	pit := filepath.Join(dir, "pit.backup")
	if out, err := exec.Command(binary, "backup", "--addr", a.addr, "--out", pit, "--collection", "users", "--version", strconv.FormatUint(v1, 10)).CombinedOutput(); err != nil {
		t.Fatalf("backup --version: %v\n%s", err, out)
	}
	_, old := readBackupFile(t, pit)
	if len(old) != 1 || old["users"]["pit"].Value != "one" || len(old["users"]) != 1502 {
		t.Errorf("backup at version %d: pit %+v, %d users; want one, 1502", v1, old["users"]["pit"], len(old["users"]))
	}
	if _, ok := got["users"]["late"]; ok {
		t.Errorf("the backup holds a write acknowledged after it ended")
	}
}

// startTransfers runs transactions that move money between accounts
// (acct(i) in collection coll(i)) through dbs until the function it
// returns is called, which answers how many committed. A transfer that
// met a shard without a leader for longer than a request waits for one
// (unavailable: a node was killed and its shards' elections ran long), or
// whose commit's outcome is unknown, is given up: it committed whole or
// not at all, and the total is the same either way. Any other failure
// fails the test.
func startTransfers(t *testing.T, ctx context.Context, dbs []groupkv.DB, accounts int, coll func(int) string, acct func(int) []byte) func() int64 {
	seed := time.Now().UnixNano()
	t.Logf("transfers: seed %d", seed)
	var stop atomic.Bool
	var wg sync.WaitGroup
	var transfers, gaveUp atomic.Int64
	errs := make(chan error, 4)
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(seed), uint64(w)))
			db := dbs[w%len(dbs)]
			for !stop.Load() {
				from, to := rng.IntN(accounts), rng.IntN(accounts)
				if from == to {
					continue
				}
				err := db.Transact(ctx, func(tx *groupkv.Tx) error {
					x, err := tx.Get(ctx, groupkv.GetRequest{Collection: coll(from), Key: acct(from)})
					if err != nil {
						return err
					}
					y, err := tx.Get(ctx, groupkv.GetRequest{Collection: coll(to), Key: acct(to)})
					if err != nil {
						return err
					}
					xv, _ := strconv.Atoi(string(x.Value))
					yv, _ := strconv.Atoi(string(y.Value))
					if err := tx.Put(ctx, groupkv.PutRequest{Collection: coll(from), Key: acct(from), Value: []byte(strconv.Itoa(xv - 3))}); err != nil {
						return err
					}
					return tx.Put(ctx, groupkv.PutRequest{Collection: coll(to), Key: acct(to), Value: []byte(strconv.Itoa(yv + 3))})
				})
				var unknown *groupkv.CommitUnknownError
				switch {
				case err == nil:
					transfers.Add(1)
				case errors.As(err, &unknown), groupkv.CodeOf(err) == groupkv.CodeUnavailable:
					gaveUp.Add(1)
				default:
					errs <- err
					return
				}
			}
		}()
	}
	for deadline := time.Now().Add(time.Minute); transfers.Load() < 20 && len(errs) == 0; { // the load is under way
		if time.Now().After(deadline) {
			t.Fatalf("%d transfers committed in a minute (%d given up)", transfers.Load(), gaveUp.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return func() int64 {
		stop.Store(true)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("transfer: %v", err)
		}
		if n := gaveUp.Load(); n > 0 {
			t.Logf("%d transfers given up (unavailable or commit_unknown)", n)
		}
		return transfers.Load()
	}
}

// wantBalanced checks that the accounts of a backup, in its collections
// bank and vault, are all there and add up to total.
func wantBalanced(t *testing.T, got map[string]map[string]backedUp, accounts, total int) {
	t.Helper()
	sum := 0
	for _, c := range []string{"bank", "vault"} {
		for k, r := range got[c] {
			n, err := strconv.Atoi(r.Value)
			if err != nil {
				t.Fatalf("%s %s: %q", c, k, r.Value)
			}
			sum += n
		}
	}
	if n := len(got["bank"]) + len(got["vault"]); n != accounts || sum != total {
		t.Errorf("the backup's accounts: %d, total %d; want %d and %d (not one state)", n, sum, accounts, total)
	}
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// TestBackupFlags: mistakes on backup's and restore's command lines are
// usage errors (exit status 2) that say what was wrong.
func TestBackupFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"backup"}, "--out is required"},
		{[]string{"backup", "--out", "x", "--version", "5", "--ago", "1m"}, "give one of them"},
		{[]string{"backup", "--out", "x", "--ago", "-1m"}, "into the past"},
		{[]string{"restore"}, "restore takes 1 arguments, got 0"},
		{[]string{"restore", "f", "--replicas", "-1"}, "replication factor"},
	} {
		cmd := exec.Command(binary, c.args...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(stderr.String(), c.says) {
			t.Errorf("%v: %v, %q; want exit status 2 and %q", c.args, err, stderr.String(), c.says)
		}
	}
	// A backup of groupkv's own collections is refused before any request.
	cmd0 := exec.Command(binary, "backup", "--out", filepath.Join(t.TempDir(), "b"), "--collection", "_groups", "--addr", "127.0.0.1:1")
	var stderr0 bytes.Buffer
	cmd0.Stderr = &stderr0
	var exit *exec.ExitError
	if err := cmd0.Run(); !errors.As(err, &exit) || !strings.Contains(stderr0.String(), "groupkv's own") {
		t.Errorf("backup --collection _groups: %v, %q", err, stderr0.String())
	}
	// A restore of a file that is not a backup says so.
	path := filepath.Join(t.TempDir(), "x")
	os.WriteFile(path, []byte("{\"hello\": 1}\n"), 0o600)
	cmd := exec.Command(binary, "restore", path)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err == nil || !strings.Contains(stderr.String(), "not a backup") {
		t.Errorf("restore of a file that is not a backup: %v, %q", err, stderr.String())
	}
}

// TestEndToEndBackupCluster: on a three-node cluster (real processes), a
// backup through one node while transactions run through the others adds
// up, and so does one taken with a node down; a dropped collection is
// restored from it, replicated three times again.
func TestEndToEndBackupCluster(t *testing.T) {
	c := newTCluster(t, 3)
	c.startAll()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c.createCollection(1, "bank", 4)
	c.createCollection(1, "vault", 2)
	c.leaderOf("bank")
	c.leaderOf("vault")
	const accounts, initial = 16, 100
	acct := func(i int) []byte { return []byte(fmt.Sprintf("acct%02d", i)) }
	coll := func(i int) string { return []string{"bank", "vault"}[i%2] }
	for i := range accounts {
		c.put(1+i%3, coll(i), string(acct(i)), strconv.Itoa(initial))
	}
	dbs := []groupkv.DB{dialTest(t, c.node(1).addr), dialTest(t, c.node(2).addr), dialTest(t, c.node(3).addr)}
	backup := func(via int, path string) map[string]map[string]backedUp {
		t.Helper()
		out, err := exec.Command(binary, "backup", "--addr", c.node(via).addr, "--out", path).CombinedOutput()
		if err != nil {
			t.Fatalf("backup through node %d: %v\n%s", via, err, out)
		}
		_, got := readBackupFile(t, path)
		return got
	}
	dir := t.TempDir()
	stop := startTransfers(t, ctx, []groupkv.DB{dbs[0], dbs[2]}, accounts, coll, acct)
	wantBalanced(t, backup(2, filepath.Join(dir, "one")), accounts, accounts*initial)
	t.Logf("%d transfers during the first backup", stop())

	c.kill(3)
	stop = startTransfers(t, ctx, []groupkv.DB{dbs[0], dbs[1]}, accounts, coll, acct)
	second := backup(1, filepath.Join(dir, "two"))
	t.Logf("%d transfers during the backup with node 3 down", stop())
	wantBalanced(t, second, accounts, accounts*initial)

	if err := dbs[1].DropCollection(ctx, "vault"); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(binary, "restore", filepath.Join(dir, "two"), "--collection", "vault", "--addr", c.node(2).addr).CombinedOutput()
	if err != nil {
		t.Fatalf("restore: %v\n%s", err, out)
	}
	if d := sameRecords(second["vault"], scanAll(t, dbs[0], "vault")); d != "" {
		t.Errorf("restored vault: %s", d)
	}
	info, err := dbs[0].DescribeCollection(ctx, "vault")
	if err != nil || len(info.Shards) != 2 {
		t.Fatalf("restored vault: %+v %v", info, err)
	}
	st, err := c.status(1)
	if err != nil {
		t.Fatal(err)
	}
	for _, sh := range st.shards("vault") {
		if len(sh.Replicas) != 3 {
			t.Errorf("restored vault's shard %d has replicas %v, want 3", sh.Shard, sh.Replicas)
		}
	}
}

// TestEndToEndBackupRestoreInterrupted: a backup whose server is killed
// part way fails and leaves no file, nor its temporary one; a restore
// whose server is killed part way fails, and the same restore with
// --overwrite, once the server is back, finishes it: every record of the
// backup is there.
func TestEndToEndBackupRestoreInterrupted(t *testing.T) {
	dir := t.TempDir()
	a := startServer(t, filepath.Join(dir, "a"))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dbA := dialTest(t, a.addr)
	for _, o := range []groupkv.CollectionOptions{{Name: "big", Shards: 2}, {Name: "small", Shards: 2}} {
		if _, err := dbA.CreateCollection(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	const records, batch = 150_000, 500
	value := bytes.Repeat([]byte("v"), 100)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := w; b*batch < records; b += 4 {
				items := make([]groupkv.PutItem, 0, batch)
				for i := b * batch; i < (b+1)*batch; i++ {
					items = append(items, groupkv.PutItem{Collection: "big", Key: []byte(fmt.Sprintf("k%07d", i)), Value: value})
				}
				if _, err := dbA.BatchPut(ctx, items); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for i := range 10 {
		if _, err := dbA.Put(ctx, groupkv.PutRequest{Collection: "small", Key: []byte(fmt.Sprint("s", i)), Value: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	full := filepath.Join(dir, "full.backup")
	if out, err := exec.Command(binary, "backup", "--addr", a.addr, "--out", full).CombinedOutput(); err != nil {
		t.Fatalf("backup: %v\n%s", err, out)
	}
	_, want := readBackupFile(t, full)
	if len(want["big"]) != records || len(want["small"]) != 10 {
		t.Fatalf("the backup holds %d and %d records, want %d and 10", len(want["big"]), len(want["small"]), records)
	}

	// The server killed while a backup writes.
	cut := filepath.Join(dir, "cut.backup")
	backup := exec.Command(binary, "backup", "--addr", a.addr, "--out", cut)
	var stderr bytes.Buffer
	backup.Stderr = &stderr
	if err := backup.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the backup to have written 1 MiB", func() bool {
		fi, err := os.Stat(cut + ".tmp")
		return err == nil && fi.Size() >= 1<<20
	})
	a.kill()
	if err := backup.Wait(); err == nil {
		t.Fatal("a backup whose server was killed part way succeeded")
	}
	for _, f := range []string{cut, cut + ".tmp"} {
		if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a failed backup left %s (%v); its error: %s", f, err, stderr.String())
		}
	}

	// The server killed while a restore writes, then the restore again.
	bdir := filepath.Join(dir, "b")
	b := startServer(t, bdir)
	dbB := dialTest(t, b.addr)
	restore := exec.Command(binary, "restore", full, "--addr", b.addr, "--parallel", "1")
	stderr.Reset()
	restore.Stderr = &stderr
	if err := restore.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the restore to have written records", func() bool {
		res, err := dbB.Scan(ctx, groupkv.ScanRequest{Collection: "big", Start: []byte("k0050000"), Limit: 1})
		return err == nil && len(res.Items) > 0
	})
	b.kill()
	dbB.Close()
	if err := restore.Wait(); err == nil {
		t.Fatal("a restore whose server was killed part way succeeded")
	}
	if msg := stderr.String(); !strings.Contains(msg, "restoring collection") && !strings.Contains(msg, "collection \"") {
		t.Errorf("the interrupted restore does not say where it stopped: %s", msg)
	}
	t.Logf("the interrupted restore: %s", strings.TrimSpace(stderr.String()))
	b = startServer(t, bdir)
	if out, err := exec.Command(binary, "restore", full, "--addr", b.addr, "--overwrite").CombinedOutput(); err != nil {
		t.Fatalf("restore --overwrite after the interrupted one: %v\n%s", err, out)
	}
	dbB = dialTest(t, b.addr)
	for _, name := range []string{"big", "small"} {
		if d := sameRecords(want[name], scanAll(t, dbB, name)); d != "" {
			t.Errorf("%s after the restore finished: %s", name, d)
		}
	}
}

// dialTest dials addr with the Go client, closed when the test ends.
func dialTest(t *testing.T, addr string) groupkv.DB {
	t.Helper()
	db, err := groupkv.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// startBackupPair starts two servers in a new directory, dir: a, to back
// up, and b, to restore into, and dials both.
func startBackupPair(t *testing.T) (dir string, a, b *proc, dbA, dbB groupkv.DB) {
	t.Helper()
	dir = t.TempDir()
	a = startServer(t, filepath.Join(dir, "a"))
	b = startServer(t, filepath.Join(dir, "b"))
	return dir, a, b, dialTest(t, a.addr), dialTest(t, b.addr)
}

// waitFor polls cond every few milliseconds until it holds, failing the
// test after a minute (a bound that only catches hangs).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited a minute for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestEndToEndBackupGroups: key groups are backed up with their keys, and
// restore creates them again, once their keys are written: an atomic
// group over keys of several shards and a best_effort one, the group's
// writes in the restored keys, group transactions on the restored
// groups. A group of another collection is left out of a backup of one
// collection; a restore --overwrite replaces the server's groups of the
// backup (deleted before their keys are written, created after), and
// refuses, before it writes, when a group it would not create again holds
// keys it writes.
func TestEndToEndBackupGroups(t *testing.T) {
	dir, a, b, dbA, dbB := startBackupPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, name := range []string{"players", "items"} {
		if _, err := dbA.CreateCollection(ctx, groupkv.CollectionOptions{Name: name, Shards: 4}); err != nil {
			t.Fatal(err)
		}
	}
	key := func(i int) []byte { return []byte(fmt.Sprintf("p%02d", i)) }
	ref := func(i int) groupkv.KeyRef { return groupkv.KeyRef{Collection: "players", Key: key(i)} }
	for i := range 12 {
		if _, err := dbA.Put(ctx, groupkv.PutRequest{Collection: "players", Key: key(i), Value: []byte("100")}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := dbA.Put(ctx, groupkv.PutRequest{Collection: "items", Key: []byte("sword"), Value: []byte("1")}); err != nil {
		t.Fatal(err)
	}
	specs := []groupkv.GroupSpec{
		{ID: "match-1", Leader: ref(0), Members: []groupkv.KeyRef{ref(0), ref(1), ref(2), ref(3), ref(4)}},
		{ID: "team b", Mode: groupkv.GroupBestEffort, Leader: ref(5), Members: []groupkv.KeyRef{ref(5), ref(6)}},
		{ID: "loot", Leader: ref(7), Members: []groupkv.KeyRef{ref(7), {Collection: "items", Key: []byte("sword")}}},
	}
	for _, s := range specs {
		if _, err := dbA.CreateGroup(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	// A transfer inside match-1, shipped to its keys' shards before the
	// backup reads them.
	if _, err := dbA.Group("match-1").Exec(ctx, groupkv.ExecRequest{Then: []groupkv.TxnOp{
		{Op: groupkv.TxnOpPut, Collection: "players", Key: key(1), Value: []byte("70")},
		{Op: groupkv.TxnOpPut, Collection: "players", Key: key(3), Value: []byte("130")},
	}}); err != nil {
		t.Fatal(err)
	}

	full := filepath.Join(dir, "full.backup")
	if out, err := exec.Command(binary, "backup", "--addr", a.addr, "--out", full).CombinedOutput(); err != nil {
		t.Fatalf("backup: %v\n%s", err, out)
	}
	if out, err := exec.Command(binary, "restore", "--check-only", full).CombinedOutput(); err != nil || !strings.Contains(string(out), `"groups": 3`) {
		t.Fatalf("restore --check-only: %v\n%s", err, out)
	}
	out, err := exec.Command(binary, "restore", "--addr", b.addr, full).CombinedOutput()
	if err != nil || !strings.Contains(string(out), `"groups": 3`) {
		t.Fatalf("restore: %v\n%s", err, out)
	}
	for _, s := range specs {
		got, err := dbB.DescribeGroup(ctx, s.ID)
		if err != nil {
			t.Fatalf("restored group %q: %v", s.ID, err)
		}
		want, _ := dbA.DescribeGroup(ctx, s.ID)
		if !sameGroup(got, s) || got.State != groupkv.GroupActive || !sameGroup(want, s) {
			t.Fatalf("restored group %q: %+v, want %+v as on the first server (%+v)", s.ID, got, s, want)
		}
	}
	if got, want := scanAll(t, dbB, "players"), scanAll(t, dbA, "players"); sameRecords(want, got) != "" {
		t.Fatalf("players restored: %s", sameRecords(want, got))
	}
	// The restored groups hold their keys: a batch write of a member is
	// refused, a group transaction commits.
	if _, err := dbB.BatchPut(ctx, []groupkv.PutItem{{Collection: "players", Key: key(2), Value: []byte("0")}, {Collection: "players", Key: key(9), Value: []byte("0")}}); groupkv.CodeOf(err) != groupkv.CodeKeyInGroup {
		t.Fatalf("a batch put of a member of a restored group: %v, want key_in_group", err)
	}
	res, err := dbB.Group("match-1").Exec(ctx, groupkv.ExecRequest{Then: []groupkv.TxnOp{
		{Op: groupkv.TxnOpGet, Collection: "players", Key: key(3)},
		{Op: groupkv.TxnOpPut, Collection: "players", Key: key(4), Value: []byte("99")},
	}})
	if err != nil || string(res.Results[0].Value) != "130" {
		t.Fatalf("a group transaction on a restored group: %+v %v", res, err)
	}

	// Restored again: the groups are there as the backup has them.
	if out, err := exec.Command(binary, "restore", "--addr", b.addr, "--overwrite", full).CombinedOutput(); err != nil || !strings.Contains(string(out), `"groups": 3`) {
		t.Fatalf("restore --overwrite over the restored groups: %v\n%s", err, out)
	}
	// A group of the id with other keys: refused, then replaced.
	if err := dbB.DeleteGroup(ctx, "team b"); err != nil {
		t.Fatal(err)
	}
	if _, err := dbB.CreateGroup(ctx, groupkv.GroupSpec{ID: "team b", Leader: ref(10), Members: []groupkv.KeyRef{ref(10), ref(11)}}); err != nil {
		t.Fatal(err)
	}
	out, err = exec.Command(binary, "restore", "--addr", b.addr, "--overwrite", "--collection", "players", full).CombinedOutput()
	if err == nil || !strings.Contains(string(out), `"loot" (it holds keys of collections not restored)`) {
		t.Fatalf("restore --overwrite of players with loot, of players and items, on the server: %v\n%s", err, out)
	}
	if err := dbB.DeleteGroup(ctx, "loot"); err != nil {
		t.Fatal(err)
	}
	out, err = exec.Command(binary, "restore", "--addr", b.addr, "--overwrite", "--collection", "players", full).CombinedOutput()
	if err != nil || !strings.Contains(string(out), `"groups": 2`) {
		t.Fatalf("restore --overwrite of players: %v\n%s", err, out)
	}
	if got, err := dbB.DescribeGroup(ctx, "team b"); err != nil || !sameGroup(got, specs[1]) {
		t.Fatalf("team b after restore --overwrite: %+v %v, want the backup's", got, err)
	}

	// A backup of players alone leaves loot (a key of items) out.
	one := filepath.Join(dir, "players.backup")
	out, err = exec.Command(binary, "backup", "--addr", a.addr, "--out", one, "--collection", "players").CombinedOutput()
	if err != nil || !strings.Contains(string(out), `key group "loot" is not backed up`) || !strings.Contains(string(out), `"groups": 2`) {
		t.Fatalf("backup of players: %v\n%s", err, out)
	}
}
