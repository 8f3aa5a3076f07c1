package node

import (
	"context"
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/groupkv/groupkv/internal/kv"
)

// TestPebbleWriteMetrics: the bytes Pebble writes to sstables, by flushes
// and by compactions, are exported (docs/benchmarks.md compares them
// between builds), and count what was written.
func TestPebbleWriteMetrics(t *testing.T) {
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	n := openTest(t, t.TempDir(), Options{Logger: quietLogger(), Registry: reg})
	t.Cleanup(func() { n.Close() })
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "c"}); err != nil {
		t.Fatal(err)
	}
	flushed0 := gatherValue(t, reg, "groupkv_pebble_flushed_bytes_total")
	for round := range 2 {
		var items []kv.PutItem
		for i := range 200 {
			items = append(items, kv.PutItem{Collection: "c", Key: []byte(fmt.Sprintf("k%03d", i)), Value: make([]byte, 1000)})
		}
		if _, err := n.BatchPut(ctx, items); err != nil {
			t.Fatal(err)
		}
		if err := n.eng.DB.Flush(); err != nil {
			t.Fatalf("flush %d: %v", round, err)
		}
	}
	flushed := gatherValue(t, reg, "groupkv_pebble_flushed_bytes_total") - flushed0
	wal := gatherValue(t, reg, "groupkv_pebble_wal_bytes_written_total")
	// What a flush writes came through the WAL, but an sstable also
	// carries index, filter and properties blocks the WAL has not: about
	// as many bytes as the WAL wrote, whether the raft entries were
	// truncated before the flush or not, and far from twice that (bytes
	// counted twice).
	t.Logf("flushed %.0f bytes, the WAL %.0f", flushed, wal)
	if flushed < 2*200*1000 || flushed > wal*1.1 {
		t.Errorf("groupkv_pebble_flushed_bytes_total grew by %.0f after flushing two batches of 200 KB, want at least 400000 and at most a tenth over the WAL's %.0f", flushed, wal)
	}
	if err := n.eng.DB.Compact(ctx, []byte{0}, []byte{0xff}, true); err != nil {
		t.Fatal(err)
	}
	if got := gatherValue(t, reg, "groupkv_pebble_compacted_bytes_total"); got <= 0 {
		t.Errorf("groupkv_pebble_compacted_bytes_total is %.0f after a manual compaction", got)
	}
}
