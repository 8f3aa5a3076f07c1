package main

import (
	"strings"
	"testing"
)

// TestBenchRefusesNegativeRound: a round below 0 is refused before
// anything is dialed, saying how rounds are numbered.
func TestBenchRefusesNegativeRound(t *testing.T) {
	out, err := runBench(t, "--workload", "a", "--addr", "127.0.0.1:1", "--round", "-1")
	if err == nil || !strings.Contains(err.Error(), "--round -1: rounds are numbered from 1") {
		t.Fatalf("bench --round -1: err %v, output %q", err, out)
	}
}
