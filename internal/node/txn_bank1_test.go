package node

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
)

// TestTxnBankOneNode: transfers among four accounts at a time, on one node
// with a hash collection of four shards (so most transactions span
// shards), keep the total.
func TestTxnBankOneNode(t *testing.T) {
	n := openTest(t, t.TempDir(), Options{Logger: quietLogger(), TickInterval: 20 * time.Millisecond})
	defer n.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := n.CreateCollection(ctx, kv.CollectionOptions{Name: "bank", Partitioning: kv.PartitionHash, Shards: 4}); err != nil {
		t.Fatal(err)
	}
	const accounts, initial = 12, 100
	key := func(i int) []byte { return []byte(fmt.Sprintf("acct%02d", i)) }
	for i := range accounts {
		if _, err := n.Put(ctx, kv.PutRequest{Collection: "bank", Key: key(i), Value: []byte(strconv.Itoa(initial))}); err != nil {
			t.Fatal(err)
		}
	}
	seed := uint64(time.Now().UnixNano())
	var wg sync.WaitGroup
	for c := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(c)))
			for range 15 {
				perm := rng.Perm(accounts)[:4]
				x, y := rng.IntN(50), rng.IntN(50)
				_, _, err := transact(ctx, n, kv.TxnOptions{}, func(id string) error {
					var bal [4]int
					for i, a := range perm {
						r, _, err := n.TxnGet(ctx, id, kv.KeyRef{Collection: "bank", Key: key(a)})
						if err != nil {
							return err
						}
						bal[i], _ = strconv.Atoi(string(r.Value))
					}
					bal[0] -= x
					bal[1] += x
					bal[2] -= y
					bal[3] += y
					for i, a := range perm {
						if err := n.TxnPut(ctx, id, kv.PutItem{Collection: "bank", Key: key(a), Value: []byte(strconv.Itoa(bal[i]))}); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	sum := 0
	for i := range accounts {
		r, err := n.Get(ctx, kv.GetRequest{Collection: "bank", Key: key(i)})
		if err != nil {
			t.Fatal(err)
		}
		v, _ := strconv.Atoi(string(r.Value))
		sum += v
	}
	if sum != accounts*initial {
		t.Fatalf("seed %d: total %d, want %d", seed, sum, accounts*initial)
	}
}
