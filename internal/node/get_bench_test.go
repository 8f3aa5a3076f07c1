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
	n := openTest(&testing.T{}, b.TempDir(), Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer n.Close()
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "c"}); err != nil {
		b.Fatal(err)
	}
	for i := 0; i < 10000; i += 500 {
		var items []kv.PutItem
		for j := i; j < i+500; j++ {
			items = append(items, kv.PutItem{Collection: "c", Key: []byte(fmt.Sprintf("user%06d", j)), Value: make([]byte, 100)})
		}
		if _, err := n.BatchPut(ctx, items); err != nil {
			b.Fatal(err)
		}
	}
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := next.Add(1)
			if _, err := n.Get(ctx, kv.GetRequest{Collection: "c", Key: []byte(fmt.Sprintf("user%06d", i%10000))}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
