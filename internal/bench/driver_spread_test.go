package bench

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestSplitAddrs(t *testing.T) {
	for in, want := range map[string][]string{
		"127.0.0.1:7070":                    {"127.0.0.1:7070"},
		"a:1,b:2, c:3":                      {"a:1", "b:2", "c:3"},
		" a:1 ,,b:2,":                       {"a:1", "b:2"},
		"":                                  nil,
		"127.0.0.1:7070,127.0.0.1:7070,x:9": {"127.0.0.1:7070", "127.0.0.1:7070", "x:9"},
	} {
		if got := SplitAddrs(in); !slices.Equal(got, want) {
			t.Errorf("SplitAddrs(%q) = %q, want %q", in, got, want)
		}
	}
}

// clientDriver records which runner client made each read.
type clientDriver struct {
	*memDriver
	mu      sync.Mutex
	clients map[int]int // client id -> the connection spread chose
	other   int         // reads on a context that is no client's
}

func (d *clientDriver) Read(ctx context.Context, key []byte) error {
	d.mu.Lock()
	if id, ok := clientOf(ctx); ok {
		if conn, seen := d.clients[id]; seen && conn != spread(ctx, 3) {
			d.mu.Unlock()
			panic("a client changed connection")
		}
		d.clients[id] = spread(ctx, 3)
	} else {
		d.other++
	}
	d.mu.Unlock()
	return d.memDriver.Read(ctx, key)
}

// TestSpreadClients checks that every call of a run's client carries the
// client's id, so that a driver of several nodes keeps each client on one
// node and spreads the clients evenly.
func TestSpreadClients(t *testing.T) {
	d := &clientDriver{memDriver: newMemDriver(), clients: map[int]int{}}
	r, err := NewRunner(d, Options{Records: 100, Clients: 7, Duration: 100 * time.Millisecond, Seed: 3, System: "mem-3", Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := r.Load(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := r.Run(ctx, WorkloadC)
	if err != nil {
		t.Fatal(err)
	}
	if res.System != "mem-3" || res.Params.Replicas != 3 {
		t.Errorf("result names system %q, replicas %d; want mem-3, 3", res.System, res.Params.Replicas)
	}
	if d.other != 0 || len(d.clients) != 7 {
		t.Fatalf("%d reads without a client, clients %v", d.other, d.clients)
	}
	per := map[int]int{}
	for id, conn := range d.clients {
		if conn != id%3 {
			t.Errorf("client %d used connection %d, want %d", id, conn, id%3)
		}
		per[conn]++
	}
	if per[0] != 3 || per[1] != 2 || per[2] != 2 {
		t.Errorf("clients per connection %v, want 3, 2, 2", per)
	}
	if got := spread(ctx, 3); got != 0 {
		t.Errorf("spread of a context that is no client's = %d, want 0", got)
	}
}

// TestBenchGroupKVDriverAddrs runs the groupkv driver given a list of
// addresses (the same server twice) with an explicit replication factor.
func TestBenchGroupKVDriverAddrs(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	s := startServer(t)
	ctx := context.Background()
	d, err := OpenGroupKV(ctx, s.Addr()+", "+s.Addr(), DriverOptions{Shards: 2, Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if len(d.dbs) != 2 {
		t.Fatalf("%d clients for two addresses", len(d.dbs))
	}
	res := loadAndRun(t, d, Options{Records: 500, Clients: 4, Duration: 300 * time.Millisecond, Seed: 5, Shards: 2, Replicas: 1}, WorkloadA)
	if res.Ops == 0 || res.Errors != 0 {
		t.Fatalf("%d ops, %d errors %q", res.Ops, res.Errors, res.ErrorSamples)
	}
	if _, err := OpenGroupKV(ctx, s.Addr()+",127.0.0.1", DriverOptions{}); err == nil {
		t.Fatal("OpenGroupKV accepted an address without a port")
	}
}
