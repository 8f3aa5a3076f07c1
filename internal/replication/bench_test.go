package replication

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// BenchmarkHostPropose measures the raft cycle: puts of 100-byte values
// to distinct keys of one single-voter shard, each proposed, appended and
// persisted, committed, applied and answered by a Host on Pebble.
//
//   - serial: one proposer, so every put is a cycle of its own;
//   - parallel: 64 proposers, whose puts the cycles gather (group
//     commit); entries/fsync reports how many each cycle persisted.
//
// On the in-memory filesystem ("mem") an fsync costs nothing and ns/op is
// the CPU of the cycle's work; on disk ("disk", under the test's temporary
// directory) the serial form adds an fsync to every put.
//
//	go test ./internal/replication -run x -bench HostPropose -benchmem
func BenchmarkHostPropose(b *testing.B) {
	for _, fsName := range []string{"mem", "disk"} {
		for _, proposers := range []int{1, 64} {
			name := fmt.Sprintf("%s/serial", fsName)
			if proposers > 1 {
				name = fmt.Sprintf("%s/parallel-%d", fsName, proposers)
			}
			b.Run(name, func(b *testing.B) {
				var e *hostEnv
				if fsName == "mem" {
					e = newHostEnv(b)
				} else {
					e = newHostEnvOn(b, vfs.Default, b.TempDir())
				}
				e.mu.Lock()
				e.mu.discard = true
				e.mu.Unlock()
				value := string(make([]byte, 100))
				ctx := context.Background()
				var seq atomic.Int64
				put := func() {
					key := "k" + strconv.FormatInt(seq.Add(1), 10)
					if _, err := e.propose(ctx, putCmd(key, value, nil)); err != nil {
						b.Error(err)
					}
				}
				fsyncs0, entries0 := e.metric("groupkv_raft_entries_per_fsync")
				b.ResetTimer()
				if proposers == 1 {
					for b.Loop() {
						put()
					}
				} else {
					b.SetParallelism(max(1, proposers/runtime.GOMAXPROCS(0)))
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							put()
						}
					})
				}
				b.StopTimer()
				fsyncs, entries := e.metric("groupkv_raft_entries_per_fsync")
				if n := fsyncs - fsyncs0; n > 0 {
					b.ReportMetric((entries-entries0)/n, "entries/fsync")
				}
			})
		}
	}
}
