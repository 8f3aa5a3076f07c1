package replication

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/groupkv/groupkv/internal/shard"
	"github.com/groupkv/groupkv/internal/storage"
)

// logEntries counts the raft log entries of shardID that eng stores.
func logEntries(t *testing.T, eng *storage.Engine) int {
	t.Helper()
	start, end := storage.RaftLogSpan(testShardID, 0, math.MaxUint64)
	it, err := eng.DB.NewIter(&pebble.IterOptions{LowerBound: start, UpperBound: end})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	n := 0
	for it.First(); it.Valid(); it.Next() {
		n++
	}
	if err := it.Error(); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitLogAtMost waits until eng stores at most n entries of the test
// shard's log: truncation follows the apply of the entries it removes.
func waitLogAtMost(t *testing.T, eng *storage.Engine, n int, what string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := logEntries(t, eng)
		if got <= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the log keeps %d entries, want at most %d", what, got, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestHostTruncatesSingleVoterLog: a group of one voter has no replica to
// keep its log for, so its log is truncated every caughtUpTruncateStep
// applied entries instead of keeping TruncateAfter (10,000) of them; what
// was applied survives a restart.
func TestHostTruncatesSingleVoterLog(t *testing.T) {
	e := newHostEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	writes := 3 * caughtUpTruncateStep
	want := map[string]uint64{}
	for i := range writes {
		key := "k" + strconv.Itoa(i)
		res, err := e.propose(ctx, putCmd(key, key, nil))
		if err != nil || res.Err != nil {
			t.Fatalf("put %s: %v %v", key, err, res.Err)
		}
		want[key] = res.Version
	}
	waitLogAtMost(t, e.eng, caughtUpTruncateStep, fmt.Sprintf("after %d writes", writes))
	if n, _ := e.metric("groupkv_raft_log_truncations_total"); n < 2 {
		t.Fatalf("%v truncations after %d writes, want at least 2", n, writes)
	}
	e.h.Stop()
	e.startHost(false, &testVersions{})
	for key, v := range want {
		if val, ver := e.read(key); val != key || ver != v {
			t.Fatalf("after a restart %s reads %q at %d, want itself at %d", key, val, ver, v)
		}
	}
	res, err := e.propose(ctx, putCmd("after", "after", nil))
	if err != nil || res.Err != nil {
		t.Fatalf("put after the restart: %v %v", err, res.Err)
	}
}

// TestHostKeepsLogForLaggingReplica: the leader of three voters truncates
// its log no further than its slowest replica has appended. With a
// follower cut off it keeps every entry since (TruncateAfter is 10,000),
// so that the follower, back, catches up from the log without a snapshot;
// once every replica has everything the log is truncated again, on the
// followers too (the leader tells them where, KindTruncateLog).
func TestHostKeepsLogForLaggingReplica(t *testing.T) {
	th := startThreeHosts(t)
	tr, engines, regs, seed := th.tr, th.engines, th.regs, th.seed
	leader := func() uint64 { return th.leader(0) }
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	acked := map[string]uint64{}
	write := func(prefix string, n int) {
		for i := range n {
			key := prefix + strconv.Itoa(i)
			for {
				res, err := tr.hosts[leader()].Propose(ctx, testShardID, putCmd(key, key, nil))
				if err == nil && res.Err == nil {
					acked[key] = res.Version
					break
				}
				if ctx.Err() != nil {
					t.Fatalf("seed %d: put %s: %v %v", seed, key, err, res.Err)
				}
				time.Sleep(5 * time.Millisecond) // the leader changed: ask the new one
			}
		}
	}

	lead := leader()
	lagging := lead%3 + 1
	tr.setDown(lagging, true)
	writes := 3 * caughtUpTruncateStep
	write("a", writes)
	// No host may have dropped what the lagging replica lacks, whichever
	// of the other two led meanwhile.
	for id, eng := range engines {
		if id == lagging {
			continue
		}
		if n := logEntries(t, eng); n < writes {
			t.Fatalf("seed %d: replica %d keeps %d log entries with replica %d %d writes behind", seed, id, n, lagging, writes)
		}
	}
	tr.setDown(lagging, false)
	deadline := time.Now().Add(30 * time.Second)
	for key, version := range acked {
		for {
			val, v, found, err := shard.ReadRecord(engines[lagging].DB, testDesc.Collection, []byte(key), shard.Latest)
			if err != nil {
				t.Fatal(err)
			}
			if found && v == version && string(val.Value) == key {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("seed %d: replica %d, back, lacks %s@%d", seed, lagging, key, version)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	for id, reg := range regs {
		if n := counterValue(t, reg, "groupkv_raft_snapshots_sent_total"); n != 0 {
			t.Fatalf("seed %d: replica %d sent %v snapshots; the lagging replica should catch up from the log", seed, id, n)
		}
	}
	// Every replica has everything: the logs are truncated again, the
	// followers' where the leader found every replica caught up.
	write("b", 2*caughtUpTruncateStep)
	for id, eng := range engines {
		waitLogAtMost(t, eng, 2*caughtUpTruncateStep, fmt.Sprintf("seed %d: replica %d (leader %d) once every replica caught up", seed, id, leader()))
	}
	for id, reg := range regs {
		if n := counterValue(t, reg, "groupkv_raft_snapshots_sent_total"); n != 0 {
			t.Fatalf("seed %d: replica %d sent %v snapshots after the truncations", seed, id, n)
		}
	}
}

// counterValue returns the value of the counter name in reg (0 if absent).
func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var v float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				v += m.GetCounter().GetValue()
			}
		}
	}
	return v
}
