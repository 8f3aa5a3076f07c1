package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// errGroupTxnGone: a group transaction's node answered 503 or went away.
var errGroupTxnGone = errors.New("unavailable")

// TestEndToEndGroupBankWithKill: a bank inside a key group, over HTTP on
// three real nodes. Transfers and audits run as group transactions
// (POST /v1/groups/{id}/txn, then /v1/txn/{id}/get|put|commit, retried
// with retry_of on 409); the node leading the group is killed with
// SIGKILL mid-run and restarted, then the node leading it is paused
// (SIGSTOP) for 3 s and resumed. Every audit sees the same total, and so
// does every scan of the accounts in pages from outside the group; after
// DELETE /v1/groups/{id}, plain GETs through every node do too.
func TestEndToEndGroupBankWithKill(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three server processes")
	}
	c := newTCluster(t, 3)
	c.startAll()
	const coll, accounts, initial = "bank", 8, 100
	c.createCollection(1, coll, 4)
	c.leaderOf(coll)
	key := func(i int) string { return fmt.Sprintf("acct%02d", i) }
	var members []string
	for i := range accounts {
		c.put(1, coll, key(i), strconv.Itoa(initial))
		members = append(members, fmt.Sprintf(`{"collection": %q, "key": %q}`, coll, key(i)))
	}
	body := fmt.Sprintf(`{"id": "g1", "leader": {"collection": %q, "key": %q}, "members": [%s], "mode": "atomic"}`,
		coll, key(0), strings.Join(members, ", "))
	c.eventually(60*time.Second, "the group is created", func() error {
		a, err := c.do(context.Background(), "POST", c.url(2)+"/v1/groups", body)
		if err != nil || a.code != 200 {
			return fmt.Errorf("%v %s", err, a)
		}
		var created struct {
			ID      string            `json:"id"`
			Joined  []json.RawMessage `json:"joined"`
			Refused []json.RawMessage `json:"refused"`
		}
		if err := json.Unmarshal([]byte(a.body), &created); err != nil || created.ID != "g1" || len(created.Joined) != accounts || len(created.Refused) != 0 {
			t.Fatalf("create answered %s", a)
		}
		return nil
	})
	describe := func(id int) (map[string]any, error) {
		a, err := c.do(context.Background(), "GET", c.url(id)+"/v1/groups/g1", "")
		if err != nil || a.code != 200 {
			return nil, fmt.Errorf("%v %s", err, a)
		}
		var d map[string]any
		return d, json.Unmarshal([]byte(a.body), &d)
	}
	var d map[string]any
	c.eventually(60*time.Second, "a description", func() error {
		var err error
		d, err = describe(1)
		return err
	})
	if d["state"] != "active" || d["id"] != "g1" {
		t.Fatalf("describe: %v", d)
	}
	leaderNode := int(d["leader_node"].(float64))
	if leaderNode < 1 || leaderNode > 3 {
		t.Fatalf("describe names leader node %v", d["leader_node"])
	}
	// A plain batch write over a member is refused; a plain PUT of one is
	// the group's.
	c.eventually(30*time.Second, "a batch put of a member is refused", func() error {
		a, err := c.do(context.Background(), "POST", c.url(1)+"/v1/batch/put",
			fmt.Sprintf(`{"items": [{"collection": %q, "key": %q, "value": "0"}]}`, coll, key(3)))
		if err != nil || a.code == 503 {
			return fmt.Errorf("%v %s", err, a)
		}
		if a.code != 409 || a.errCode != "key_in_group" {
			t.Fatalf("batch put of a member answered %s, want 409 key_in_group", a)
		}
		return nil
	})

	// txn runs fn in group transaction attempts through node id until one
	// commits; it answers false when the outcome is unknown or the node
	// went away.
	txn := func(id int, fn func(get func(k string) (int, error), put func(k string, v int) error) error) (bool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		retryOf := ""
		for attempt := 0; attempt < 200; attempt++ {
			begin := "{}"
			if retryOf != "" {
				begin = fmt.Sprintf(`{"retry_of": %q}`, retryOf)
			}
			a, err := c.do(ctx, "POST", c.url(id)+"/v1/groups/g1/txn", begin)
			if err != nil || a.code == 503 {
				return false, nil
			}
			if a.code != 200 {
				return false, fmt.Errorf("begin: %s", a)
			}
			var b struct {
				Txn string `json:"txn"`
			}
			if err := json.Unmarshal([]byte(a.body), &b); err != nil || b.Txn == "" {
				return false, fmt.Errorf("begin answered %s", a)
			}
			base := c.url(id) + "/v1/txn/" + b.Txn
			aborted := false
			get := func(k string) (int, error) {
				a, err := c.do(ctx, "POST", base+"/get", fmt.Sprintf(`{"collection": %q, "key": %q}`, coll, k))
				if err != nil || a.code == 503 {
					return 0, errGroupTxnGone
				}
				if a.code == 409 {
					aborted = true
					return 0, fmt.Errorf("aborted")
				}
				if a.code != 200 {
					return 0, fmt.Errorf("get %s: %s", k, a)
				}
				var r struct {
					Found bool   `json:"found"`
					Value string `json:"value"`
				}
				if err := json.Unmarshal([]byte(a.body), &r); err != nil || !r.Found {
					return 0, fmt.Errorf("get %s answered %s", k, a)
				}
				return strconv.Atoi(r.Value)
			}
			put := func(k string, v int) error {
				a, err := c.do(ctx, "POST", base+"/put", fmt.Sprintf(`{"collection": %q, "key": %q, "value": "%d"}`, coll, k, v))
				if err != nil || a.code == 503 {
					return errGroupTxnGone
				}
				if a.code == 409 {
					aborted = true
					return fmt.Errorf("aborted")
				}
				if a.code != 200 {
					return fmt.Errorf("put %s: %s", k, a)
				}
				return nil
			}
			if err := fn(get, put); err != nil {
				if aborted {
					retryOf = b.Txn
					continue
				}
				if errors.Is(err, errGroupTxnGone) || ctx.Err() != nil {
					return false, nil // the node went away, or no leader yet
				}
				return false, err
			}
			a, err = c.do(ctx, "POST", base+"/commit", "")
			switch {
			case err != nil || a.code == 503:
				return false, nil // commit_unknown or the node went away
			case a.code == 409:
				retryOf = b.Txn
				continue
			case a.code != 200:
				return false, fmt.Errorf("commit: %s", a)
			}
			var cm struct {
				Committed bool   `json:"committed"`
				Version   uint64 `json:"version"`
			}
			if err := json.Unmarshal([]byte(a.body), &cm); err != nil || !cm.Committed {
				return false, fmt.Errorf("commit answered %s", a)
			}
			return true, nil
		}
		return false, fmt.Errorf("no attempt of 200 committed")
	}

	seed := time.Now().UnixNano()
	t.Logf("seed %d; the group is led by node %d", seed, leaderNode)
	var down atomic.Int64
	var stop atomic.Bool
	var transfers, audits atomic.Int64
	errs := make(chan error, 16)
	pick := func(rng *rand.Rand) int {
		for {
			if id := rng.IntN(3) + 1; int64(id) != down.Load() {
				return id
			}
		}
	}
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(seed), uint64(w)))
			for !stop.Load() {
				from, to := rng.IntN(accounts), rng.IntN(accounts)
				if from == to {
					continue
				}
				ok, err := txn(pick(rng), func(get func(string) (int, error), put func(string, int) error) error {
					x, err := get(key(from))
					if err != nil {
						return err
					}
					y, err := get(key(to))
					if err != nil {
						return err
					}
					if err := put(key(from), x-1); err != nil {
						return err
					}
					return put(key(to), y+1)
				})
				if err != nil {
					errs <- fmt.Errorf("transfer: %w", err)
					return
				}
				if ok {
					transfers.Add(1)
				} else {
					time.Sleep(100 * time.Millisecond)
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(uint64(seed), 99))
		for !stop.Load() {
			sum := 0
			ok, err := txn(pick(rng), func(get func(string) (int, error), _ func(string, int) error) error {
				sum = 0
				for i := range accounts {
					v, err := get(key(i))
					if err != nil {
						return err
					}
					sum += v
				}
				return nil
			})
			if err != nil {
				errs <- fmt.Errorf("audit: %w", err)
				return
			}
			if !ok {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			if sum != accounts*initial {
				errs <- fmt.Errorf("an audit saw a total of %d, want %d", sum, accounts*initial)
				return
			}
			audits.Add(1)
		}
	}()
	// Audits from outside the group: scans of the collection in pages of
	// three through any node up (every page after the first reads at the
	// first's version, where the shards store the group's writes at the
	// versions they were committed at).
	var scanAudits atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(uint64(seed), 98))
		for !stop.Load() {
			node, sum, page, ok := pick(rng), 0, "", true
			for {
				u := c.url(node) + "/v1/scan/" + coll + "?limit=3"
				if page != "" {
					u += "&page=" + page
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				a, err := c.do(ctx, "GET", u, "")
				cancel()
				if err != nil || a.code != 200 {
					ok = false // a node down, a leader moving
					break
				}
				var sp scanPage
				if err := json.Unmarshal([]byte(a.body), &sp); err != nil {
					errs <- fmt.Errorf("a scan page: %v: %s", err, a.body)
					return
				}
				for _, it := range sp.Items {
					v, _ := strconv.Atoi(it.Value)
					sum += v
				}
				if page = sp.NextPage; page == "" {
					break
				}
			}
			if !ok {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			if sum != accounts*initial {
				errs <- fmt.Errorf("a paged scan outside the group saw a total of %d, want %d", sum, accounts*initial)
				return
			}
			scanAudits.Add(1)
		}
	}()
	waitTransfers := func(n int64, what string) {
		c.eventually(90*time.Second, what, func() error {
			if got := transfers.Load(); got < n {
				return fmt.Errorf("%d transfers", got)
			}
			return nil
		})
	}
	waitTransfers(20, "transfers before the kill")
	down.Store(int64(leaderNode))
	c.kill(leaderNode)
	waitTransfers(transfers.Load()+20, "transfers with the group's leader node killed")
	c.start(leaderNode, false)
	c.waitHealthy(leaderNode)
	down.Store(0)
	waitTransfers(transfers.Load()+10, "transfers after the restart")
	// The node leading the group now is paused (SIGSTOP) for 3 s, long
	// enough for its shards to elect other leaders, and resumed; the
	// clients go on sending to it. A group transaction it ran on from
	// a leadership it lost would show in the audits.
	var paused int
	c.eventually(60*time.Second, "the group's leader after the restart", func() error {
		d, err := describe(1)
		if err != nil {
			return err
		}
		if ln, _ := d["leader_node"].(float64); ln >= 1 && ln <= 3 {
			paused = int(ln)
			return nil
		}
		return fmt.Errorf("describe: %v", d)
	})
	c.signal(paused, syscall.SIGSTOP)
	time.Sleep(3 * time.Second)
	c.signal(paused, syscall.SIGCONT)
	t.Logf("paused node %d (leading the group) for 3s", paused)
	waitTransfers(transfers.Load()+10, "transfers after the pause")
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	c.eventually(60*time.Second, "a description after the kill", func() error {
		d, err := describe(1)
		if err != nil {
			return err
		}
		if ln, _ := d["leader_node"].(float64); ln == 0 || d["state"] != "active" {
			t.Fatalf("describe after the kill: %v", d)
		}
		return nil
	})
	c.eventually(60*time.Second, "the group is deleted", func() error {
		a, err := c.do(context.Background(), "DELETE", c.url(1)+"/v1/groups/g1", "")
		if err != nil || a.code != 200 {
			return fmt.Errorf("%v %s", err, a)
		}
		return nil
	})
	if a, err := c.do(context.Background(), "GET", c.url(2)+"/v1/groups/g1", ""); err != nil || a.code != 404 {
		t.Fatalf("describe after the delete: %v %s", err, a)
	}
	for id := 1; id <= 3; id++ {
		c.eventually(60*time.Second, "the final total", func() error {
			sum := 0
			for i := range accounts {
				a, err := c.do(context.Background(), "GET", c.url(id)+"/v1/kv/"+coll+"/"+key(i), "")
				if err != nil || a.code != 200 {
					return fmt.Errorf("node %d: account %d: %v %s", id, i, err, a)
				}
				v, err := strconv.Atoi(a.body)
				if err != nil {
					return fmt.Errorf("node %d: account %d holds %q", id, i, a.body)
				}
				sum += v
			}
			if sum != accounts*initial {
				return fmt.Errorf("node %d: total %d, want %d", id, sum, accounts*initial)
			}
			return nil
		})
	}
	t.Logf("%d transfers and %d audits committed, %d paged scans outside the group", transfers.Load(), audits.Load(), scanAudits.Load())
	if audits.Load() == 0 || scanAudits.Load() == 0 {
		t.Fatalf("%d audits committed, %d paged scans answered; want some of each", audits.Load(), scanAudits.Load())
	}
}

// TestEndToEndGroupCLI runs `groupkv group create|describe|list|txn|delete`
// against a real server process.
func TestEndToEndGroupCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server process")
	}
	c := newTCluster(t, 1)
	c.startAll()
	ctx := context.Background()
	if a, err := c.do(ctx, "POST", c.url(1)+"/v1/collections", `{"name": "p", "shards": 2}`); err != nil || a.code != 200 {
		t.Fatalf("create collection: %v %s", err, a)
	}
	c.put(1, "p", "ada", "10")
	c.put(1, "p", "bob", "10")
	addr := c.node(1).addr
	run := func(stdin string, args ...string) (string, error) {
		cmd := exec.Command(binary, append(args, "--addr", addr)...)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run("", "group", "create", "match", "--leader", "p/ada", "--member", "p/bob")
	if err != nil || !strings.Contains(out, `"joined"`) || !strings.Contains(out, `"bob"`) {
		t.Fatalf("group create: %v\n%s", err, out)
	}
	out, err = run("", "group", "describe", "match")
	if err != nil || !strings.Contains(out, `"state": "active"`) || !strings.Contains(out, `"leader_node": 1`) {
		t.Fatalf("group describe: %v\n%s", err, out)
	}
	out, err = run("", "group", "list")
	if err != nil || !strings.Contains(out, `"id": "match"`) {
		t.Fatalf("group list: %v\n%s", err, out)
	}
	txn := `{"if": [{"collection": "p", "key": "ada", "value": "10"}],
	  "then": [{"op": "put", "collection": "p", "key": "ada", "value": "9"}, {"op": "put", "collection": "p", "key": "bob", "value": "11"}]}`
	out, err = run(txn, "group", "txn", "match")
	if err != nil || !strings.Contains(out, `"succeeded": true`) {
		t.Fatalf("group txn: %v\n%s", err, out)
	}
	// A read-only transaction outside the group reads its keys at its
	// timestamp: the group's writes committed before it.
	b, err := c.do(ctx, "POST", c.url(1)+"/v1/txn", `{"read_only": true}`)
	if err != nil || b.code != 200 {
		t.Fatalf("begin a read-only transaction: %v %s", err, b)
	}
	var begun struct{ Txn string }
	if err := json.Unmarshal([]byte(b.body), &begun); err != nil {
		t.Fatal(err)
	}
	if a, err := c.do(ctx, "POST", c.url(1)+"/v1/txn/"+begun.Txn+"/get", `{"collection": "p", "key": "bob"}`); err != nil || a.code != 200 || !strings.Contains(a.body, `"value":"11"`) {
		t.Fatalf("a read-only transaction's get of a group's key: %v %s, want 200 with the group's 11", err, a)
	}
	// A key outside the group is refused, with the server's message.
	out, err = run(`{"then": [{"op": "get", "collection": "p", "key": "cy"}]}`, "group", "txn", "match")
	if err == nil || !strings.Contains(out, "not a member") {
		t.Fatalf("group txn over a non-member: %v\n%s", err, out)
	}
	out, err = run("", "group", "delete", "match")
	if err != nil {
		t.Fatalf("group delete: %v\n%s", err, out)
	}
	if out, err = run("", "group", "describe", "match"); err == nil {
		t.Fatalf("group describe after the delete succeeded:\n%s", out)
	}
	for key, want := range map[string]string{"ada": "9", "bob": "11"} {
		a, err := c.do(ctx, "GET", c.url(1)+"/v1/kv/p/"+key, "")
		if err != nil || a.code != 200 || a.body != want {
			t.Fatalf("%s after the delete: %v %s, want %s", key, err, a, want)
		}
	}
}

// TestEndToEndGroupTagCollection: over HTTP, keys of a tag collection
// join a group; another group's create is refused them with the reason
// in_group; a group write or a plain put of a member that changes its
// placement tag answers 409 placement_tag_changed and writes nothing; reads
// and tag queries see the group's values, and so do plain reads after the
// group is deleted.
func TestEndToEndGroupTagCollection(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server process")
	}
	c := newTCluster(t, 1)
	c.startAll()
	ctx := context.Background()
	call := func(method, path, body string, code int, contains ...string) string {
		t.Helper()
		a, err := c.do(ctx, method, c.url(1)+path, body)
		if err != nil || a.code != code {
			t.Fatalf("%s %s %s: %v %s, want %d", method, path, body, err, a, code)
		}
		for _, s := range contains {
			if !strings.Contains(a.body, s) {
				t.Fatalf("%s %s %s: %s, want it to contain %s", method, path, body, a.body, s)
			}
		}
		return a.body
	}
	call("POST", "/v1/collections", `{"name": "posts", "partitioning": "tag"}`, 200)
	call("PUT", "/v1/kv/posts/p1?tags=ada,news", "one", 200)
	call("PUT", "/v1/kv/posts/p2?tags=bob", "two", 200)
	call("POST", "/v1/groups", `{"id": "feed", "leader": {"collection": "posts", "key": "p1"}, "members": [{"collection": "posts", "key": "p2"}]}`,
		200, `"key":"p1"`, `"key":"p2"`, `"refused":[]`)
	call("POST", "/v1/groups", `{"id": "other", "leader": {"collection": "posts", "key": "p3"}, "members": [{"collection": "posts", "key": "p2"}], "mode": "best_effort"}`,
		200, `"key":"p2","reason":"in_group"`)
	call("DELETE", "/v1/groups/other", "", 200)

	// A group write that keeps the placement tag first commits.
	call("POST", "/v1/groups/feed/exec", `{"then": [{"op": "put", "collection": "posts", "key": "p1", "value": "one-edited", "tags": ["ada", "edited"]}]}`,
		200, `"succeeded":true`)
	// One that changes it answers 409, and writes none of its puts.
	call("POST", "/v1/groups/feed/exec", `{"then": [{"op": "put", "collection": "posts", "key": "p1", "value": "lost", "tags": ["ada"]}, {"op": "put", "collection": "posts", "key": "p2", "value": "moved", "tags": ["ada"]}]}`,
		409, `placement_tag_changed`)
	// So does a plain put of a member, which the group's leader serves.
	call("PUT", "/v1/kv/posts/p2?tags=cy", "moved", 409, `placement_tag_changed`)
	call("PUT", "/v1/kv/posts/p2?tags=bob,edited", "two-edited", 200)
	if got := call("GET", "/v1/kv/posts/p1", "", 200); got != "one-edited" {
		t.Fatalf("p1 in the group: %q", got)
	}
	call("GET", "/v1/tags/posts?all=edited", "", 200, `"key":"p1","value":"one-edited"`, `"key":"p2","value":"two-edited"`)

	call("DELETE", "/v1/groups/feed", "", 200)
	for key, want := range map[string]string{"p1": "one-edited", "p2": "two-edited"} {
		if got := call("GET", "/v1/kv/posts/"+key, "", 200); got != want {
			t.Fatalf("%s after the delete: %q, want %q", key, got, want)
		}
	}
	call("GET", "/v1/tags/posts?all=bob", "", 200, `"key":"p2","value":"two-edited","version"`)
	// Free again: the placement tag moves only by the rule for live keys.
	call("PUT", "/v1/kv/posts/p2?tags=cy", "moved", 409, `placement_tag_changed`)
}
