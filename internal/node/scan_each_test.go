package node

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/groupkv/groupkv/internal/kv"
)

// TestScanEachMatchesScan: ScanEach hands each, in order, the records of
// the page Scan answers, with the same next page and version, on hash,
// range and tag collections, forward and reverse, whole and bounded, in
// pages of several sizes; and a failed scan fails the same way, having
// handed each nothing.
func TestScanEachMatchesScan(t *testing.T) {
	seed := mtSeed(t)
	rng := rand.New(rand.NewPCG(seed, 0))
	ctx := context.Background()
	n := mtOpen(t, t.TempDir(), Options{})
	for _, d := range mtCreateAll(t, n, "se") {
		for i := range 150 {
			if rng.IntN(5) == 0 {
				continue // a gap
			}
			val := make([]byte, rng.IntN(3)*rng.IntN(200))
			for j := range val {
				val[j] = byte(rng.IntN(256))
			}
			tags := mtTags(d, i)
			if rng.IntN(2) == 0 {
				tags = append(tags, fmt.Sprintf("extra%d", rng.IntN(3)))
			}
			if _, err := n.Put(ctx, kv.PutRequest{Collection: d.Name, Key: mtKey(i), Value: val, Tags: tags}); err != nil {
				t.Fatal(err)
			}
		}
		for i := range 150 {
			if rng.IntN(6) == 0 {
				if _, err := n.Delete(ctx, kv.DeleteRequest{Collection: d.Name, Key: mtKey(i)}); err != nil && kv.CodeOf(err) != kv.CodeNotFound {
					t.Fatal(err)
				}
			}
		}
		for _, limit := range []int{1, 7, 64, 0} {
			for _, reverse := range []bool{false, true} {
				for _, bounds := range [][2][]byte{{nil, nil}, {mtKey(20), mtKey(120)}} {
					req := kv.ScanRequest{Collection: d.Name, Start: bounds[0], End: bounds[1], Limit: limit, Reverse: reverse}
					name := fmt.Sprintf("%s limit %d reverse %v [%s, %s)", d.Name, limit, reverse, bounds[0], bounds[1])
					for pages := 0; ; pages++ {
						want, err := n.Scan(ctx, req)
						if err != nil {
							t.Fatalf("%s: %v", name, err)
						}
						var got []kv.Record
						res, err := n.ScanEach(ctx, req, func(r *kv.Record) {
							got = append(got, kv.Record{Key: clone(r.Key), Value: clone(r.Value), Tags: cloneTags(r.Tags), Version: r.Version})
						})
						if err != nil {
							t.Fatalf("%s: ScanEach: %v", name, err)
						}
						if res.Items != nil {
							t.Fatalf("%s: ScanEach answered %d items in its result", name, len(res.Items))
						}
						if got == nil {
							got = []kv.Record{}
						}
						res.Items = got
						if !reflect.DeepEqual(res, want) {
							t.Fatalf("%s, page %d (seed %d): ScanEach %s next %q at %d; Scan %s next %q at %d", name, pages, seed,
								mtDiffRecords(got, want.Items), res.NextPage, res.Version, mtDiffRecords(want.Items, got), want.NextPage, want.Version)
						}
						if want.NextPage == "" {
							break
						}
						if pages > 200 {
							t.Fatalf("%s: the scan does not end", name)
						}
						req.Page = want.NextPage
					}
				}
			}
		}
	}
	for _, req := range []kv.ScanRequest{
		{Collection: "absent"},
		{Collection: "seh", Limit: -1},
		{Collection: "seh", Start: []byte("b"), End: []byte("a")},
	} {
		_, want := n.Scan(ctx, req)
		calls := 0
		_, err := n.ScanEach(ctx, req, func(*kv.Record) { calls++ })
		if want == nil || err == nil || err.Error() != want.Error() || kv.CodeOf(err) != kv.CodeOf(want) || calls != 0 {
			t.Errorf("scan %+v: ScanEach %v after %d records, Scan %v", req, err, calls, want)
		}
	}
}
