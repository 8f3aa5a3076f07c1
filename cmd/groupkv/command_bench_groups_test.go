package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/groupkv/groupkv/internal/bench"
)

// TestBenchGroupsEmbedded loads players into a node in this process, plays
// both modes at two client counts, then reports the results.
func TestBenchGroupsEmbedded(t *testing.T) {
	if testing.Short() {
		t.Skip("opens a node")
	}
	dir := t.TempDir()
	results := filepath.Join(dir, "results.json")
	out, err := runBench(t, "groups", "--embedded", filepath.Join(dir, "node"), "--players", "500", "--load",
		"--group-size", "4", "--ops-per-group", "5", "--think", "1ms", "--clients", "1,3",
		"--duration", "600ms", "--warmup", "100ms", "--seed", "3", "--out", results)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"loaded 500 players", "mode grouped: 500 players, games of 4±1 contiguous players, 5 moves each",
		"mode ungrouped", "creations refused:", "| 3 | grouped |", "Overhead of groups", "| groupkv | 500 | 5 | 3 |"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	rs, err := bench.ReadResultsFile(results)
	if err != nil || len(rs) != 4 {
		t.Fatalf("%d results: %v", len(rs), err)
	}
	for i, r := range rs {
		if r.Workload != bench.GroupsWorkloadName || r.Groups == nil || r.Groups.Games == 0 || r.Errors != 0 {
			t.Errorf("result %d: %+v", i, r)
		}
	}
	if rs[0].Load == nil || rs[0].Params.GroupMode != bench.GroupsModeGrouped || rs[1].Params.GroupMode != bench.GroupsModeUngrouped ||
		rs[2].Params.Clients != 3 || rs[0].Params.Seed != 3 || rs[0].Params.ThinkMs != 1 {
		t.Errorf("results %+v", rs)
	}
	out, err = runBench(t, "report", "--in", results)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "| 1 | ungrouped |") || !strings.Contains(out, "grouped / ungrouped") {
		t.Errorf("report:\n%s", out)
	}
}

// TestBenchGroupsRounds runs the modes in three rounds, alternating their
// order, and reports the median of the rounds' overheads. Each round must
// play at least one game of each mode for its ratio to be reported, so a
// round lasts long enough that a stall of a loaded machine does not leave
// one empty.
func TestBenchGroupsRounds(t *testing.T) {
	dir := t.TempDir()
	results := filepath.Join(dir, "results.json")
	out, err := runBench(t, "groups", "--embedded", filepath.Join(dir, "node"), "--players", "300", "--load",
		"--group-size", "3", "--ops-per-group", "3", "--think", "1ms", "--clients", "2", "--rounds", "3",
		"--duration", "800ms", "--warmup", "100ms", "--seed", "4", "--out", results)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	rs, err := bench.ReadResultsFile(results)
	if err != nil || len(rs) != 6 {
		t.Fatalf("%d results: %v", len(rs), err)
	}
	g, u := bench.GroupsModeGrouped, bench.GroupsModeUngrouped
	want := []struct {
		round int
		mode  string
	}{{1, g}, {1, u}, {2, u}, {2, g}, {3, g}, {3, u}}
	for i, r := range rs {
		if r.Params.Round != want[i].round || r.Params.GroupMode != want[i].mode || r.Errors != 0 {
			t.Errorf("result %d: round %d mode %s errors %d, want round %d mode %s", i, r.Params.Round, r.Params.GroupMode, r.Errors, want[i].round, want[i].mode)
		}
	}
	for _, want := range []string{"| 2 | grouped, round 1 |", "| 2 | ungrouped, round 3 |", "each figure is the median of the rounds'", "| 3: "} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestBenchGroupsUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--clients", "1,x"}, "--clients"},
		{[]string{"--mode", "loose"}, "--mode"},
		{[]string{"--members", "sorted"}, `members "sorted"`},
		{[]string{"--group-size", "1"}, "group size 1"},
		{[]string{"--think", "-1ms"}, "think time"},
		{[]string{"--load-clients", "0"}, "--load-clients"},
		{[]string{"--rounds", "0"}, "--rounds"},
		{[]string{"--addr", ","}, "--addr"},
	} {
		_, err := runBench(t, append([]string{"groups"}, c.args...)...)
		wantUsage(t, err, c.want)
	}
}
