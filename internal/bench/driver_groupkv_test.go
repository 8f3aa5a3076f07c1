package bench

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	groupkv "github.com/groupkv/groupkv"
	"github.com/groupkv/groupkv/internal/node"
	"github.com/groupkv/groupkv/internal/server"
)

// startServer runs a groupkv server in this process on loopback ports.
func startServer(t *testing.T) *server.Server {
	t.Helper()
	s, err := server.Start(server.Config{
		Node:       node.Options{DataDir: t.TempDir()},
		Listen:     "127.0.0.1:0",
		PeerListen: "127.0.0.1:0",
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Close(ctx); err != nil {
			t.Errorf("closing the server: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Node.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestBenchGroupKVDriver runs workloads A and E, then the timeline
// workload, for about a second each against a server in this process.
func TestBenchGroupKVDriver(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	s := startServer(t)
	ctx := context.Background()
	d, err := OpenGroupKV(ctx, s.Addr(), DriverOptions{Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	opts := Options{Records: 2000, Clients: 8, Duration: time.Second, Warmup: 200 * time.Millisecond, Seed: 11,
		Users: 40, PerUser: 12, Shards: 4}

	fresh, err := NewRunner(d, opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fresh.Run(ctx, WorkloadC); !errors.Is(err, ErrNotLoaded) {
		t.Fatalf("Run on an empty server: %v, want ErrNotLoaded", err)
	}

	r, err := NewRunner(d, opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Load(ctx); err != nil {
		t.Fatal(err)
	}
	for _, w := range []Workload{WorkloadA, WorkloadE} {
		res, err := r.Run(ctx, w)
		if err != nil {
			t.Fatalf("workload %s: %v", w.Name, err)
		}
		t.Logf("workload %s: %.0f ops/s, p99 %.2fms", w.Name, res.OpsPerSec, res.Latency[AllOps].P99Us/1000)
		if res.Ops == 0 || res.Errors != 0 || res.System != "groupkv" || res.Version == "" {
			t.Fatalf("workload %s: %d ops, %d errors %q, system %q version %q", w.Name, res.Ops, res.Errors, res.ErrorSamples, res.System, res.Version)
		}
		for op, p := range w.Proportions {
			if p > 0.1 && res.Latency[OpType(op).String()].Count == 0 {
				t.Errorf("workload %s ran no %v", w.Name, OpType(op))
			}
		}
		// The server's /metrics answered its CPU time (here, this
		// process's, which also runs the clients).
		if res.ServerCPUSeconds <= 0 || res.ClientCPUSeconds <= 0 {
			t.Errorf("workload %s: server CPU %vs, client CPU %vs: not measured", w.Name, res.ServerCPUSeconds, res.ClientCPUSeconds)
		}
	}
	// Scans read what they ask for: the keys after a loaded key.
	n, err := d.Scan(ctx, KeyName(0), 10)
	if err != nil || n != 10 {
		t.Fatalf("Scan: %d records, %v", n, err)
	}
	if err := d.Read(ctx, []byte("absent")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Read of an absent key: %v", err)
	}

	for _, p := range []groupkv.Partitioning{groupkv.PartitionTag, groupkv.PartitionHash} {
		res, err := r.RunTimeline(ctx, p, true)
		if err != nil {
			t.Fatalf("timeline on %s: %v", p, err)
		}
		l := res.Latency[TimelineOp]
		t.Logf("timeline on %s: %.0f reads/s, p99 %.2fms", p, res.OpsPerSec, l.P99Us/1000)
		if res.Ops == 0 || res.Errors != 0 || l.Count != res.Ops || res.Workload != TimelineWorkload(string(p)) || res.Params.Partitioning != string(p) {
			t.Fatalf("timeline on %s: %+v", p, res)
		}
	}
	// A second run reuses the loaded timelines.
	r.opts.Duration, r.opts.Warmup = 200*time.Millisecond, 0
	if _, err := r.RunTimeline(ctx, groupkv.PartitionTag, false); err != nil {
		t.Fatal(err)
	}
}
