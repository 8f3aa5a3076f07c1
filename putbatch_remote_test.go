package groupkv_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/groupkv/groupkv"
)

// TestRemotePutsUnderLoad: many concurrent puts of a dialed DB (which
// shares independent BatchPuts among them when its connection is busy)
// are each written as a put of its own: every acknowledged put of a key
// has a version of its own, a key ends with the value of its put answered
// with the highest version, and a put in an unknown collection fails with
// ErrCollectionNotFound without failing the puts it shared a call with.
// The server must have answered some of them in batches.
func TestRemotePutsUnderLoad(t *testing.T) {
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
	const (
		writers = 32
		puts    = 60
		keys    = 20
	)
	type ack struct {
		value   string
		version uint64
	}
	var (
		mu    sync.Mutex
		acked = map[string][]ack{}
		wg    sync.WaitGroup
	)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range puts {
				if j%10 == 9 {
					_, err := db.Put(ctx, groupkv.PutRequest{Collection: "nope", Key: []byte("k"), Value: []byte("x")})
					if !errors.Is(err, groupkv.ErrCollectionNotFound) {
						t.Errorf("put in an unknown collection: %v", err)
						return
					}
					continue
				}
				key := fmt.Sprintf("k%02d", (w*7+j)%keys)
				value := fmt.Sprintf("%d/%d", w, j)
				v, err := db.Put(ctx, groupkv.PutRequest{Collection: "c", Key: []byte(key), Value: []byte(value), Tags: []string{"w" + strconv.Itoa(w)}})
				if err != nil {
					t.Errorf("put %s: %v", key, err)
					return
				}
				mu.Lock()
				acked[key] = append(acked[key], ack{value, v})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	for key, acks := range acked {
		versions := map[uint64]bool{}
		last := acks[0]
		for _, a := range acks {
			if versions[a.version] {
				t.Fatalf("two puts of %s answered version %d", key, a.version)
			}
			versions[a.version] = true
			if a.version > last.version {
				last = a
			}
		}
		rec, err := db.Get(ctx, groupkv.GetRequest{Collection: "c", Key: []byte(key)})
		if err != nil || string(rec.Value) != last.value || rec.Version != last.version {
			t.Fatalf("get %s: %q@%d, %v; want %q@%d, its put answered last", key, rec.Value, rec.Version, err, last.value, last.version)
		}
		w, _, _ := strings.Cut(last.value, "/")
		if len(rec.Tags) != 1 || rec.Tags[0] != "w"+w {
			t.Fatalf("get %s: tags %v, want [w%s]", key, rec.Tags, w)
		}
	}
	if n := servedOps(t, s.Addr(), "batch_put"); n == 0 {
		t.Fatal("no put shared a BatchPut")
	}
}

// servedOps reads groupkv_requests_total of op from the server's metrics,
// summed over codes.
func servedOps(t *testing.T, addr, op string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var n float64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "groupkv_requests_total{") || !strings.Contains(line, `op="`+op+`"`) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		n += v
	}
	return n
}
