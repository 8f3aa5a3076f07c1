package groupkv_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/groupkv/groupkv"
)

// TestRemoteGetsUnderLoad: many concurrent gets of a dialed DB (which
// shares BatchGets among them when its connection is busy) answer what
// each asks: the newest value of its key, ErrNotFound for a missing key,
// ErrCollectionNotFound for an unknown collection, each its own copy of
// the value, while puts change the keys.
func TestRemoteGetsUnderLoad(t *testing.T) {
	s := startTxnServer(t, 0)
	db, err := groupkv.Dial(s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := db.CreateCollection(ctx, groupkv.CollectionOptions{Name: "c", Partitioning: groupkv.PartitionHash, Shards: 4}); err != nil {
		t.Fatal(err)
	}
	const keys = 50
	key := func(i int) []byte { return []byte(fmt.Sprintf("k%03d", i)) }
	for i := range keys {
		if _, err := db.Put(ctx, groupkv.PutRequest{Collection: "c", Key: key(i), Value: []byte(fmt.Sprintf("%d/0", i))}); err != nil {
			t.Fatal(err)
		}
	}
	// Writers move key i through "i/1", "i/2"...: a get never sees a
	// generation older than one it saw before.
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for gen := 1; ; gen++ {
				select {
				case <-stop:
					return
				default:
				}
				for i := w; i < keys; i += 2 {
					if _, err := db.Put(ctx, groupkv.PutRequest{Collection: "c", Key: key(i), Value: []byte(fmt.Sprintf("%d/%d", i, gen))}); err != nil {
						t.Error(err)
						return
					}
				}
			}
		}()
	}
	var readers sync.WaitGroup
	for r := range 32 {
		readers.Add(1)
		go func() {
			defer readers.Done()
			last := make([]int, keys)
			for j := range 300 {
				i := (r*7 + j) % keys
				switch j % 10 {
				case 3:
					if _, err := db.Get(ctx, groupkv.GetRequest{Collection: "c", Key: []byte(fmt.Sprintf("missing-%d", j))}); !errors.Is(err, groupkv.ErrNotFound) {
						t.Errorf("get of a missing key: %v", err)
						return
					}
					continue
				case 7:
					if _, err := db.Get(ctx, groupkv.GetRequest{Collection: "nope", Key: key(i)}); !errors.Is(err, groupkv.ErrCollectionNotFound) {
						t.Errorf("get in an unknown collection: %v", err)
						return
					}
					continue
				}
				rec, err := db.Get(ctx, groupkv.GetRequest{Collection: "c", Key: key(i)})
				if err != nil {
					t.Errorf("get %s: %v", key(i), err)
					return
				}
				var ki, gen int
				if _, err := fmt.Sscanf(string(rec.Value), "%d/%d", &ki, &gen); err != nil || ki != i || string(rec.Key) != string(key(i)) || rec.Version == 0 {
					t.Errorf("get %s: %+v", key(i), rec)
					return
				}
				if gen < last[i] {
					t.Errorf("get %s: generation %d after %d", key(i), gen, last[i])
					return
				}
				last[i] = gen
				for b := range rec.Value {
					rec.Value[b] = 'x' // each reader its own copy
				}
			}
		}()
	}
	readers.Wait()
	close(stop)
	wg.Wait()
}
