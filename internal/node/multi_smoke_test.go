package node

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
)

func TestMultiSmoke(t *testing.T) {
	ctx := context.Background()
	n := openTest(t, t.TempDir(), Options{})
	defer n.Close()
	for _, p := range []kv.Partitioning{kv.PartitionHash, kv.PartitionRange, kv.PartitionTag} {
		name := "c-" + string(p)
		opts := kv.CollectionOptions{Name: name, Partitioning: p}
		if p == kv.PartitionRange {
			opts.SplitPoints = [][]byte{[]byte("k10"), []byte("k20")}
		}
		if _, err := n.CreateCollection(ctx, opts); err != nil {
			t.Fatal(err)
		}
		var items []kv.PutItem
		for i := range 30 {
			items = append(items, kv.PutItem{Collection: name, Key: []byte(fmt.Sprintf("k%02d", i)), Value: []byte(fmt.Sprint(i)), Tags: []string{fmt.Sprintf("t%d", i%3), "all"}})
		}
		res, err := n.BatchPut(ctx, items)
		if err != nil || len(res) != 30 {
			t.Fatalf("%s: batch put: %v %v", p, res, err)
		}
		page, err := n.Scan(ctx, kv.ScanRequest{Collection: name, Limit: 7})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		late := 0
		for {
			for _, r := range page.Items {
				got = append(got, string(r.Key))
			}
			if page.NextPage == "" {
				break
			}
			// Writes between pages must not show up in later pages.
			if _, err := n.Put(ctx, kv.PutRequest{Collection: name, Key: []byte("k29x"), Value: []byte("late"), Tags: []string{"t0"}}); err != nil {
				t.Fatal(err)
			}
			late++
			page, err = n.Scan(ctx, kv.ScanRequest{Collection: name, Limit: 7, Page: page.NextPage})
			if err != nil {
				t.Fatal(err)
			}
		}
		if len(got) != 30 || got[0] != "k00" || got[29] != "k29" {
			t.Fatalf("%s: scan got %v", p, got)
		}
		rev, err := n.Scan(ctx, kv.ScanRequest{Collection: name, Reverse: true, Limit: 3})
		if err != nil || len(rev.Items) != 3 || string(rev.Items[0].Key) != "k29x" {
			t.Fatalf("%s: reverse scan %+v %v", p, rev, err)
		}
		tq, err := n.GetByTags(ctx, kv.TagQuery{Collection: name, All: []string{"t1", "all"}})
		if err != nil || len(tq.Items) != 10 {
			t.Fatalf("%s: tags all: %d %v", p, len(tq.Items), err)
		}
		tq, err = n.GetByTags(ctx, kv.TagQuery{Collection: name, Any: []string{"t1", "t2"}, Limit: 1000})
		if err != nil || len(tq.Items) != 20 {
			t.Fatalf("%s: tags any: %d %v", p, len(tq.Items), err)
		}
		bg, err := n.BatchGet(ctx, []kv.KeyRef{{Collection: name, Key: []byte("k05")}, {Collection: name, Key: []byte("nope")}})
		if err != nil || !bg.Items[0].Found || bg.Items[1].Found || string(bg.Items[0].Value) != "5" {
			t.Fatalf("%s: batch get %+v %v", p, bg, err)
		}
		dr, err := n.DeleteRange(ctx, kv.DeleteRangeRequest{Collection: name, Start: []byte("k10"), End: []byte("k20")})
		if err != nil || dr.Deleted != 10 {
			t.Fatalf("%s: delete range %+v %v", p, dr, err)
		}
		if _, err := n.Get(ctx, kv.GetRequest{Collection: name, Key: []byte("k15")}); !errors.Is(err, kv.ErrNotFound) {
			t.Fatalf("%s: deleted key: %v", p, err)
		}
		tq, err = n.GetByTags(ctx, kv.TagQuery{Collection: name, All: []string{"all"}, Limit: 1000})
		if err != nil || len(tq.Items) != 20 {
			t.Fatalf("%s: tags after delete range: %d %v", p, len(tq.Items), err)
		}
		// Watch from the start sees every change, in version order.
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		var events []kv.Event
		err = n.Watch(wctx, kv.WatchRequest{Collection: name}, func(ev kv.Event) error {
			if ev.Type == kv.EventProgress {
				cancel()
				return nil
			}
			events = append(events, ev)
			return nil
		})
		cancel()
		if !errors.Is(err, context.Canceled) || len(events) != 30+late+10 {
			t.Fatalf("%s: watch: %d events, %v", p, len(events), err)
		}
		for i := 1; i < len(events); i++ {
			if events[i].Version < events[i-1].Version {
				t.Fatalf("%s: watch out of order", p)
			}
		}
	}
	// Tag placement: a live key keeps its placement tag.
	if _, err := n.Put(ctx, kv.PutRequest{Collection: "c-tag", Key: []byte("k00"), Value: []byte("x"), Tags: []string{"other"}}); !errors.Is(err, &kv.Error{Code: kv.CodePlacementTagChanged}) {
		t.Fatalf("placement change: %v", err)
	}
	if _, err := n.Delete(ctx, kv.DeleteRequest{Collection: "c-tag", Key: []byte("k00")}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Put(ctx, kv.PutRequest{Collection: "c-tag", Key: []byte("k00"), Value: []byte("x"), Tags: []string{"other"}}); err != nil {
		t.Fatalf("re-place after delete: %v", err)
	}
	if r, err := n.Get(ctx, kv.GetRequest{Collection: "c-tag", Key: []byte("k00")}); err != nil || string(r.Value) != "x" {
		t.Fatalf("get re-placed: %+v %v", r, err)
	}
}
