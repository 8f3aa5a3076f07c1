package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os/exec"
	"strings"
	"testing"
	"time"
)

type scanPage struct {
	Items []struct {
		Key     string   `json:"key"`
		Value   string   `json:"value"`
		Version uint64   `json:"version"`
		Tags    []string `json:"tags"`
	} `json:"items"`
	NextPage string `json:"next_page"`
	Version  uint64 `json:"version"`
}

type watchEvent struct {
	Type    string   `json:"type"`
	Key     string   `json:"key"`
	Value   string   `json:"value"`
	Version uint64   `json:"version"`
	Tags    []string `json:"tags"`
}

// readWatch reads NDJSON events from a watch until n change events (not
// progress) have arrived or the deadline passes.
func readWatch(t *testing.T, u string, n int) []watchEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", u, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("watch %s: status %d", u, resp.StatusCode)
	}
	var out []watchEvent
	sc := bufio.NewScanner(resp.Body)
	for len(out) < n && sc.Scan() {
		var ev watchEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("watch line %q: %v", sc.Text(), err)
		}
		if ev.Type != "progress" {
			out = append(out, ev)
		}
	}
	if len(out) < n {
		t.Fatalf("watch %s: got %d events, want %d (%v)", u, len(out), n, sc.Err())
	}
	return out
}

func TestEndToEndMultiRecord(t *testing.T) {
	dir := t.TempDir()
	p := startServer(t, dir)
	base := "http://" + p.addr
	for _, body := range []string{`{"name": "tl", "partitioning": "tag"}`, `{"name": "h", "shards": 8}`} {
		if code, _, b := httpDo(t, "POST", base+"/v1/collections", body); code != 200 {
			t.Fatalf("create: %d %s", code, b)
		}
	}
	// Batch put across collections and shards.
	var items []string
	for i := range 40 {
		items = append(items, fmt.Sprintf(`{"collection": "h", "key": "k%02d", "value": "v%d", "tags": ["t%d"]}`, i, i, i%4))
		items = append(items, fmt.Sprintf(`{"collection": "tl", "key": "post%02d", "value": "p%d", "tags": ["user%d", "post"]}`, i, i, i%5))
	}
	code, _, body := httpDo(t, "POST", base+"/v1/batch/put", `{"items": [`+strings.Join(items, ",")+`]}`)
	if code != 200 || strings.Count(body, `"version"`) != 80 {
		t.Fatalf("batch put: %d %.300s", code, body)
	}
	// Batch get, in request order, found and missing.
	code, _, body = httpDo(t, "POST", base+"/v1/batch/get", `{"keys": [{"collection": "h", "key": "k03"}, {"collection": "tl", "key": "nope"}, {"collection": "tl", "key": "post07"}]}`)
	var bg struct {
		Items []struct {
			Collection, Key, Value string
			Found                  bool
		}
		Version uint64
	}
	if err := json.Unmarshal([]byte(body), &bg); code != 200 || err != nil || len(bg.Items) != 3 ||
		!bg.Items[0].Found || bg.Items[0].Value != "v3" || bg.Items[1].Found || bg.Items[2].Value != "p7" || bg.Version == 0 {
		t.Fatalf("batch get: %d %s", code, body)
	}
	// A failing multi-shard batch says what was applied.
	code, _, body = httpDo(t, "POST", base+"/v1/batch/put", `{"items": [{"collection": "h", "key": "k00", "value": "x", "if_version": 1}, {"collection": "h", "key": "k01", "value": "y"}, {"collection": "h", "key": "k02", "value": "z"}]}`)
	var failed struct {
		Applied []struct{ Key string } `json:"applied"`
	}
	if err := json.Unmarshal([]byte(body), &failed); code != 412 || err != nil || failed.Applied == nil {
		t.Fatalf("failing batch: %d %s", code, body)
	}
	for _, a := range failed.Applied {
		if a.Key == "k00" {
			t.Fatalf("the failed record is listed as applied: %s", body)
		}
	}
	latePuts := 0
	// Scan pages of a hash collection come in key order at one version.
	var keys []string
	page := ""
	for range 20 {
		u := base + "/v1/scan/h?limit=7"
		if page != "" {
			if url.QueryEscape(page) != page {
				t.Fatalf("page token %q is not URL-safe", page)
			}
			u += "&page=" + page
		}
		code, _, body = httpDo(t, "GET", u, "")
		var sp scanPage
		if err := json.Unmarshal([]byte(body), &sp); code != 200 || err != nil {
			t.Fatalf("scan: %d %s", code, body)
		}
		for _, it := range sp.Items {
			keys = append(keys, it.Key)
		}
		// A write between pages is not seen by later pages.
		httpDo(t, "PUT", base+"/v1/kv/h/k99", "late")
		latePuts++
		if page = sp.NextPage; page == "" {
			break
		}
	}
	if len(keys) != 40 || keys[0] != "k00" || keys[39] != "k39" {
		t.Fatalf("scan keys: %v", keys)
	}
	// Tag queries: a tag collection places user3's posts together.
	code, _, body = httpDo(t, "GET", base+"/v1/tags/tl?all=user3,post", "")
	var tp scanPage
	if err := json.Unmarshal([]byte(body), &tp); code != 200 || err != nil || len(tp.Items) != 8 {
		t.Fatalf("tags: %d %s", code, body)
	}
	code, _, body = httpDo(t, "PUT", base+"/v1/kv/tl/post03?tags=user9", "moved")
	if code != 409 || !strings.Contains(body, "placement_tag_changed") {
		t.Fatalf("placement change: %d %s", code, body)
	}
	// Delete range, then watch the whole history of "h" from the start.
	code, _, body = httpDo(t, "POST", base+"/v1/delete_range", `{"collection": "h", "start": "k10", "end": "k20"}`)
	if code != 200 || strings.TrimSpace(body) != `{"deleted":10}` {
		t.Fatalf("delete range: %d %s", code, body)
	}
	events := readWatch(t, base+"/v1/watch/h?from_version=0", 40+len(failed.Applied)+latePuts+10)
	var lastV uint64
	for _, ev := range events {
		if ev.Version < lastV {
			t.Fatalf("watch out of version order: %+v", events)
		}
		lastV = ev.Version
	}
	// Resume after a restart from the middle of the batch's version.
	mid := events[20]
	p.stop(t)
	p = startServer(t, dir)
	defer p.stop(t)
	base = "http://" + p.addr
	resumed := readWatch(t, fmt.Sprintf("%s/v1/watch/h?from_version=%d&after_key=%s", base, mid.Version, url.QueryEscape(mid.Key)), len(events)-21)
	for i, ev := range resumed {
		if want := events[21+i]; ev.Key != want.Key || ev.Version != want.Version || ev.Type != want.Type {
			t.Fatalf("resumed event %d: %+v, want %+v", i, ev, want)
		}
	}
	// Server-sent events when asked.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/v1/watch/h?from_version=0", nil)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(resp.Body)
	if !sc.Scan() || !strings.HasPrefix(sc.Text(), "data: {") || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("SSE: %q %v", sc.Text(), resp.Header)
	}
	resp.Body.Close()
	// The CLI reads the same data.
	out, err := exec.Command(binary, "scan", "h", "--addr", p.addr, "--all").CombinedOutput()
	if err != nil || strings.Count(string(out), `"key"`) != 31 {
		t.Fatalf("cli scan: %v %s", err, out)
	}
	out, err = exec.Command(binary, "tags", "tl", "--any", "user1,user2", "--addr", p.addr).CombinedOutput()
	if err != nil || strings.Count(string(out), `"key"`) != 16 {
		t.Fatalf("cli tags: %v %s", err, out)
	}
}
