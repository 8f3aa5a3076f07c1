package groupkv_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"

	"github.com/groupkv/groupkv"
)

// Read-modify-write in transactions: GetForUpdate locks the counter for
// the write that follows, so concurrent increments queue at the read
// instead of both reading it and one being run again. Every increment
// counts.
func ExampleTx_GetForUpdate() {
	dir, err := os.MkdirTemp("", "groupkv-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	db, err := groupkv.Open(dir) // a node in this process
	if err != nil {
		panic(err)
	}
	defer db.Close()
	ctx := context.Background()
	if _, err := db.CreateCollection(ctx, groupkv.CollectionOptions{Name: "counters"}); err != nil {
		panic(err)
	}
	key := []byte("visits")
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := db.Transact(ctx, func(tx *groupkv.Tx) error {
				n := 0
				rec, err := tx.GetForUpdate(ctx, groupkv.GetRequest{Collection: "counters", Key: key})
				switch {
				case err == nil:
					if n, err = strconv.Atoi(string(rec.Value)); err != nil {
						return err
					}
				case !errors.Is(err, groupkv.ErrNotFound):
					return err
				}
				return tx.Put(ctx, groupkv.PutRequest{Collection: "counters", Key: key, Value: []byte(strconv.Itoa(n + 1))})
			})
			if err != nil {
				panic(err)
			}
		}()
	}
	wg.Wait()
	rec, err := db.Get(ctx, groupkv.GetRequest{Collection: "counters", Key: key})
	if err != nil {
		panic(err)
	}
	fmt.Println(string(rec.Value))
	// Output: 8
}

// A transfer that reads both accounts in one request: BatchGetForUpdate
// locks them for the writes that follow, and answers them in order, an
// absent key with Found false.
func ExampleTx_BatchGetForUpdate() {
	dir, err := os.MkdirTemp("", "groupkv-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	db, err := groupkv.Open(dir)
	if err != nil {
		panic(err)
	}
	defer db.Close()
	ctx := context.Background()
	if _, err := db.CreateCollection(ctx, groupkv.CollectionOptions{Name: "accounts"}); err != nil {
		panic(err)
	}
	if _, err := db.Put(ctx, groupkv.PutRequest{Collection: "accounts", Key: []byte("alice"), Value: []byte("100")}); err != nil {
		panic(err)
	}
	keys := []groupkv.KeyRef{{Collection: "accounts", Key: []byte("alice")}, {Collection: "accounts", Key: []byte("bob")}}
	err = db.Transact(ctx, func(tx *groupkv.Tx) error {
		items, err := tx.BatchGetForUpdate(ctx, keys)
		if err != nil {
			return err
		}
		balance := make([]int, len(items))
		for i, it := range items {
			if it.Found {
				if balance[i], err = strconv.Atoi(string(it.Value)); err != nil {
					return err
				}
			}
		}
		balance[0], balance[1] = balance[0]-30, balance[1]+30
		for i, k := range keys {
			if err := tx.Put(ctx, groupkv.PutRequest{Collection: k.Collection, Key: k.Key, Value: []byte(strconv.Itoa(balance[i]))}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		panic(err)
	}
	res, err := db.BatchGet(ctx, keys)
	if err != nil {
		panic(err)
	}
	for _, it := range res.Items {
		fmt.Printf("%s %s\n", it.Key, it.Value)
	}
	// Output:
	// alice 70
	// bob 30
}
