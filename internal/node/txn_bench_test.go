package node

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
)

// BenchmarkTxnReadModifyWrite: transactions of 10 reads and 10 updates of
// distinct random keys out of 100,000, in parallel, on one node with a
// hash collection of 8 shards; "plain" runs the same operations without a
// transaction. Compare with benchstat:
//
//	go test ./internal/node -run '^$' -bench TxnReadModifyWrite -benchtime 5s
func BenchmarkTxnReadModifyWrite(b *testing.B) {
	for _, mode := range []string{"txn", "plain"} {
		b.Run(mode, func(b *testing.B) {
			n := openTest(&testing.T{}, b.TempDir(), Options{Logger: quietLogger()})
			defer n.Close()
			ctx := context.Background()
			if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "m", Partitioning: kv.PartitionHash, Shards: 8}); err != nil {
				b.Fatal(err)
			}
			const keys = 100000
			key := func(i int) []byte { return []byte(fmt.Sprintf("k%07d", i)) }
			b.SetParallelism(32)
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				rng := rand.New(rand.NewPCG(rand.Uint64(), 0))
				for pb.Next() {
					picked := map[int]bool{}
					var ks []int
					for len(ks) < 10 {
						if i := rng.IntN(keys); !picked[i] {
							picked[i] = true
							ks = append(ks, i)
						}
					}
					if mode == "plain" {
						for _, i := range ks {
							r, err := n.Get(ctx, kv.GetRequest{Collection: "m", Key: key(i)})
							v := 0
							if err == nil {
								v, _ = strconv.Atoi(string(r.Value))
							}
							if _, err := n.Put(ctx, kv.PutRequest{Collection: "m", Key: key(i), Value: []byte(strconv.Itoa(v + 1))}); err != nil {
								b.Error(err)
								return
							}
						}
						continue
					}
					_, _, err := transact(ctx, n, kv.TxnOptions{}, func(id string) error {
						for _, i := range ks {
							r, found, err := n.TxnGet(ctx, id, kv.KeyRef{Collection: "m", Key: key(i)})
							if err != nil {
								return err
							}
							v := 0
							if found {
								v, _ = strconv.Atoi(string(r.Value))
							}
							if err := n.TxnPut(ctx, id, kv.PutItem{Collection: "m", Key: key(i), Value: []byte(strconv.Itoa(v + 1))}); err != nil {
								return err
							}
						}
						return nil
					})
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "txn/s")
		})
	}
}
