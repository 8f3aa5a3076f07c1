package main

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestCollectionsMerge runs `groupkv collections merge` against a server
// that checks the request's form: POST /v1/collections/{name}/merge with
// {"shard": ID}.
func TestCollectionsMerge(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got = append(got, r.Method+" "+r.URL.EscapedPath()+" "+string(body))
		if strings.Contains(string(body), `"shard":9`) {
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"error":{"code":"invalid_argument","message":"shard 9 is the last shard of \"my events\": it has no right neighbour to merge with"}}`)
			return
		}
		io.WriteString(w, `{"name":"my events","id":3,"partitioning":"range","shards":[{"id":7,"start":"","end":"","leader":1}]}`)
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	run := func(args ...string) (string, error) {
		cmd := collectionsCommand()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(append([]string{"merge"}, append(args, "--addr", addr)...))
		cmd.SilenceUsage, cmd.SilenceErrors = true, true
		err := cmd.Execute()
		return out.String(), err
	}
	out, err := run("my events", "--shard", "7")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != `POST /v1/collections/my%20events/merge {"shard":7}` {
		t.Fatalf("requests: %q", got)
	}
	if !strings.Contains(out, `"id": 7`) || !strings.Contains(out, `"name": "my events"`) {
		t.Fatalf("output:\n%s", out)
	}
	if _, err := run("my events", "--shard", "9"); err == nil || !strings.Contains(err.Error(), "no right neighbour") {
		t.Fatalf("a refused merge: %v", err)
	}
	got = nil
	if _, err := run("my events"); err == nil || !strings.Contains(err.Error(), "--shard") || got != nil {
		t.Fatalf("a merge without --shard: %v (requests %q)", err, got)
	}
}
