package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/groupkv/groupkv/internal/bench"
)

func runBench(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := &cobra.Command{Use: "groupkv", SilenceUsage: true, SilenceErrors: true}
	root.AddCommand(benchCommand())
	var out bytes.Buffer
	root.SetArgs(append([]string{"bench"}, args...))
	root.SetOut(&out)
	root.SetErr(&out)
	err := root.Execute()
	return out.String(), err
}

// TestBenchTxnEmbedded runs the txn workload in both modes on a node in
// this process, then reports the results.
func TestBenchTxnEmbedded(t *testing.T) {
	if testing.Short() {
		t.Skip("opens a node")
	}
	dir := t.TempDir()
	results := filepath.Join(dir, "results.json")
	out, err := runBench(t, "--workload", "txn", "--embedded", filepath.Join(dir, "node"), "--txn-keys", "2_000,100",
		"--txn-load-max", "1000", "--txn-mode", "serializable,none", "--load", "--clients", "4",
		"--duration", "500ms", "--warmup", "0s", "--out", results)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"2000 keys (not loaded", "100 keys, 10 reads and 10 writes", "attempts per commit: p50"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	rs, err := bench.ReadResultsFile(results)
	if err != nil || len(rs) != 4 {
		t.Fatalf("%d results: %v", len(rs), err)
	}
	if rs[0].Params.TxnMode != bench.TxnModeSerializable || !rs[0].Params.TxnLazy || rs[0].Attempts == nil ||
		rs[1].Params.TxnMode != bench.TxnModeNone || rs[1].Attempts != nil || rs[2].Load == nil {
		t.Errorf("results %+v", rs)
	}
	out, err = runBench(t, "report", "--in", results)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "| 100 | groupkv | serializable |") || !strings.Contains(out, "groupkv txn / non-txn") {
		t.Errorf("report:\n%s", out)
	}
}

func TestBenchTxnUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--txn-keys", "abc"}, "--txn-keys"},
		{[]string{"--txn-mode", "snapshot"}, "--txn-mode"},
		{[]string{"--target", "redis"}, "use groupkv, etcd or postgresql"},
		{[]string{"--target", "etcd", "--embedded", "/tmp/x"}, "--embedded"},
		{[]string{"--txn-keys", "5"}, "key range 5"},
	} {
		_, err := runBench(t, append([]string{"--workload", "txn"}, c.args...)...)
		wantUsage(t, err, c.want)
	}
}
