package node

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
)

// TestTxnReadsMergeOwnWrites: a scan (either way) and a tag query inside a
// transaction read every record once, in order, as the transaction wrote
// it — its puts in, its deletes out, a record it retagged in or out of a
// tag query — over pages of every size, in serializable and snapshot
// attempts, over random contents (the seed is printed on failure).
func TestTxnReadsMergeOwnWrites(t *testing.T) {
	n := openTest(t, t.TempDir(), Options{Logger: quietLogger(), TickInterval: 20 * time.Millisecond})
	t.Cleanup(func() { n.Close() })
	ctx := context.Background()
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "r", Partitioning: kv.PartitionRange,
		SplitPoints: [][]byte{[]byte("k05"), []byte("k12")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "h", Shards: 3}); err != nil {
		t.Fatal(err)
	}
	seed := rand.Uint64()
	rng := rand.New(rand.NewPCG(seed, 7))
	t.Logf("seed %d", seed)

	type rec struct {
		value string
		tags  []string
	}
	tagsOf := func() []string {
		var tags []string
		for _, tg := range []string{"x", "y"} {
			if rng.IntN(2) == 0 {
				tags = append(tags, tg)
			}
		}
		return tags
	}
	for round := range 12 {
		coll := []string{"r", "h"}[round%2]
		// Stored: a random set of k00..k19.
		stored := map[string]rec{}
		for i := range 20 {
			k := fmt.Sprintf("k%02d", i)
			if _, err := n.Delete(ctx, kv.DeleteRequest{Collection: coll, Key: []byte(k)}); err != nil && kv.CodeOf(err) != kv.CodeNotFound {
				t.Fatal(err)
			}
			if rng.IntN(2) == 0 {
				r := rec{value: fmt.Sprintf("s%d-%d", round, i), tags: tagsOf()}
				if _, err := n.Put(ctx, kv.PutRequest{Collection: coll, Key: []byte(k), Value: []byte(r.value), Tags: r.tags}); err != nil {
					t.Fatal(err)
				}
				stored[k] = r
			}
		}
		for _, iso := range []kv.Isolation{kv.IsolationSerializable, kv.IsolationSnapshot} {
			id, err := n.BeginTxn(ctx, kv.TxnOptions{Isolation: iso})
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]rec{}
			for k, r := range stored {
				want[k] = r
			}
			for i := range 20 {
				k := fmt.Sprintf("k%02d", i)
				switch rng.IntN(4) {
				case 0:
					r := rec{value: fmt.Sprintf("w%d-%d", round, i), tags: tagsOf()}
					if err := n.TxnPut(ctx, id, kv.PutItem{Collection: coll, Key: []byte(k), Value: []byte(r.value), Tags: r.tags}); err != nil {
						t.Fatal(err)
					}
					want[k] = r
				case 1:
					if err := n.TxnDelete(ctx, id, kv.KeyRef{Collection: coll, Key: []byte(k)}); err != nil {
						t.Fatal(err)
					}
					delete(want, k)
				}
			}
			describe := func(items []kv.Record) string {
				var b strings.Builder
				for _, r := range items {
					fmt.Fprintf(&b, "%s=%s%v ", r.Key, r.Value, r.Tags)
				}
				return b.String()
			}
			check := func(what string, got []kv.Record, match func(rec) bool, start, end string, reverse bool) {
				t.Helper()
				var keys []string
				for k, r := range want {
					if k >= start && (end == "" || k < end) && match(r) {
						keys = append(keys, k)
					}
				}
				slices.Sort(keys)
				if reverse {
					slices.Reverse(keys)
				}
				var exp []kv.Record
				for _, k := range keys {
					exp = append(exp, kv.Record{Key: []byte(k), Value: []byte(want[k].value), Tags: want[k].tags})
				}
				ok := len(got) == len(exp)
				for i := 0; ok && i < len(got); i++ {
					ok = bytes.Equal(got[i].Key, exp[i].Key) && bytes.Equal(got[i].Value, exp[i].Value) && slices.Equal(got[i].Tags, exp[i].Tags)
				}
				if !ok {
					t.Fatalf("seed %d, round %d (%s, %s), %s:\n got  %s\n want %s", seed, round, coll, iso, what, describe(got), describe(exp))
				}
			}
			for _, limit := range []int{1, 2, 3, 7, 0} {
				for _, reverse := range []bool{false, true} {
					start, end := "", ""
					if coll == "r" && rng.IntN(2) == 0 {
						start, end = fmt.Sprintf("k%02d", rng.IntN(10)), fmt.Sprintf("k%02d", 10+rng.IntN(10))
					}
					var got []kv.Record
					req := kv.ScanRequest{Collection: coll, Start: []byte(start), End: []byte(end), Limit: limit, Reverse: reverse}
					for pages := 0; ; pages++ {
						if pages > 40 {
							t.Fatalf("seed %d: a scan of 20 keys took more than 40 pages", seed)
						}
						res, err := n.TxnScan(ctx, id, req)
						if err != nil {
							t.Fatalf("seed %d: scan: %v", seed, err)
						}
						if limit > 0 && len(res.Items) > limit {
							t.Fatalf("seed %d: a page of limit %d held %d records", seed, limit, len(res.Items))
						}
						got = append(got, res.Items...)
						if res.NextPage == "" {
							break
						}
						req.Page = res.NextPage
					}
					check(fmt.Sprintf("scan [%q, %q) limit %d reverse %v", start, end, limit, reverse), got, func(rec) bool { return true }, start, end, reverse)
				}
				for _, q := range []kv.TagQuery{{All: []string{"x", "y"}}, {Any: []string{"x", "y"}}, {All: []string{"y"}}} {
					q.Collection, q.Limit = coll, limit
					var got []kv.Record
					for pages := 0; ; pages++ {
						if pages > 40 {
							t.Fatalf("seed %d: a tag query over 20 keys took more than 40 pages", seed)
						}
						res, err := n.TxnGetByTags(ctx, id, q)
						if err != nil {
							t.Fatalf("seed %d: tag query: %v", seed, err)
						}
						got = append(got, res.Items...)
						if res.NextPage == "" {
							break
						}
						q.Page = res.NextPage
					}
					match := func(r rec) bool { return hasTags(r.tags, append(q.All, q.Any...), len(q.All) > 0) }
					check(fmt.Sprintf("tag query all %v any %v limit %d", q.All, q.Any, limit), got, match, "", "", false)
				}
			}
			if err := n.AbortTxn(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
	}
}
