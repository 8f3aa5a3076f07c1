package node

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/groupkv/groupkv/internal/kv"
)

// BenchmarkGetLatest measures a point read of the newest version through
// the node (no network), with the keys' versions in the memtable.
func BenchmarkGetLatest(b *testing.B) {
	ctx := context.Background()
	n := openBenchRecords(b, kv.CollectionOptions{Name: "c"})
	runParallel(b, func(i int64) {
		if _, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte(fmt.Sprintf("user%06d", i%10000))}); err != nil {
			b.Fatal(err)
		}
	})
}

// BenchmarkScanLatest measures a scan of 50 records at the newest
// version through the node (no network), as YCSB E's scans: a range
// collection of 10,000 records of 100 bytes, each scan from a key of its
// own.
func BenchmarkScanLatest(b *testing.B) {
	ctx := context.Background()
	n := openBenchRecords(b, kv.CollectionOptions{Name: "c", Partitioning: kv.PartitionRange})
	runParallel(b, func(i int64) {
		res, err := n.Scan(ctx, kv.ScanRequest{Collection: "c", Start: []byte(fmt.Sprintf("user%06d", i%9950)), Limit: 50})
		if err != nil {
			b.Fatal(err)
		}
		if len(res.Items) != 50 {
			b.Fatalf("scan from user%06d: %d records, want 50", i%9950, len(res.Items))
		}
	})
}

// runParallel times fn in b's parallel loop, numbering its calls from 1
// across the loop's goroutines.
func runParallel(b *testing.B, fn func(i int64)) {
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			fn(next.Add(1))
		}
	})
}

// openBenchRecords opens a node (closed when b ends) with collection c
// holding 10,000 records of 100 bytes, keys user000000 to user009999.
func openBenchRecords(b *testing.B, c kv.CollectionOptions) *Node {
	b.Helper()
	ctx := context.Background()
	n := openTest(&testing.T{}, b.TempDir(), Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	b.Cleanup(func() { n.Close() })
	if _, err := n.CreateCollection(ctx, c); err != nil {
		b.Fatal(err)
	}
	for i := 0; i < 10000; i += 500 {
		var items []kv.PutItem
		for j := i; j < i+500; j++ {
			items = append(items, kv.PutItem{Collection: c.Name, Key: []byte(fmt.Sprintf("user%06d", j)), Value: make([]byte, 100)})
		}
		if _, err := n.BatchPut(ctx, items); err != nil {
			b.Fatal(err)
		}
	}
	return n
}
