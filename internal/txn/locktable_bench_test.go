package txn

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkLockTablePlainWrite measures what a plain write costs the lock
// table of its shard's leader when nothing contends: its exclusive lock on
// one key taken (AcquireAll) and released, from concurrent writers of
// distinct keys, as the node does around the proposal of every put.
//
//	go test ./internal/txn -run x -bench PlainWrite -benchmem
func BenchmarkLockTablePlainWrite(b *testing.B) {
	lt := NewLockTable(1, time.Second)
	ctx := context.Background()
	var seq atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			n := seq.Add(1)
			m := &Meta{ID: "plain-" + strconv.FormatInt(n, 10), Priority: PlainPriority, Plain: true}
			t := Target{Collection: 1, Key: []byte("user" + strconv.FormatInt(n%50000, 10))}
			if err := lt.AcquireAll(ctx, m, []Target{t}, nil); err != nil {
				b.Error(err)
				return
			}
			lt.Release(m.ID)
		}
	})
}
