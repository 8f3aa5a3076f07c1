package replication

import (
	"context"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/groupkv/groupkv/internal/shard"
	"github.com/groupkv/groupkv/internal/storage"
)

// memTransport delivers raft messages between Hosts of one process. Replica
// i of every group lives on host i. It can cut a host off.
type memTransport struct {
	mu    sync.Mutex
	hosts map[uint64]*Host
	down  map[uint64]bool
}

func (t *memTransport) Send(msgs []Message) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, m := range msgs {
		if t.down[m.Msg.From] || t.down[m.Msg.To] {
			continue
		}
		if h := t.hosts[m.Msg.To]; h != nil {
			h.Deliver(m)
		}
	}
}

func (t *memTransport) setDown(id uint64, down bool) {
	t.mu.Lock()
	t.down[id] = down
	t.mu.Unlock()
}

// sharedVersions is one oracle for every host of the test.
type sharedVersions struct {
	mu   sync.Mutex
	last uint64
}

func (v *sharedVersions) TryNext(floor uint64) (uint64, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.last = max(v.last+1, floor+1)
	return v.last, true
}

// threeHosts is three Hosts on in-memory engines, with replicas 1, 2 and
// 3 of the test shard, linked by a memTransport. Each has its own metrics
// registry. The test's cleanup stops them.
type threeHosts struct {
	t       *testing.T
	seed    uint64 // of the election timeouts: GROUPKV_SEED, else random
	tr      *memTransport
	engines map[uint64]*storage.Engine
	regs    map[uint64]*prometheus.Registry
}

// startThreeHosts starts threeHosts, and logs the seed of their election
// timeouts.
func startThreeHosts(t *testing.T) *threeHosts {
	t.Helper()
	seed := rand.Uint64()
	if s := os.Getenv("GROUPKV_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d", seed)
	th := &threeHosts{
		t:       t,
		seed:    seed,
		tr:      &memTransport{hosts: map[uint64]*Host{}, down: map[uint64]bool{}},
		engines: map[uint64]*storage.Engine{},
		regs:    map[uint64]*prometheus.Registry{},
	}
	t.Cleanup(func() {
		for _, h := range th.tr.hosts {
			h.Stop()
		}
		for _, e := range th.engines {
			e.Close()
		}
	})
	vs := &sharedVersions{}
	for id := uint64(1); id <= 3; id++ {
		eng, err := storage.Open("/data", storage.Options{FS: vfs.NewMem(), Logger: testLogger()})
		if err != nil {
			t.Fatal(err)
		}
		th.engines[id] = eng
		th.regs[id] = prometheus.NewRegistry()
		h := NewHost(Config{NodeID: id, Engine: eng, Versions: vs, Transport: th.tr,
			TickInterval: 5 * time.Millisecond, Logger: testLogger(), Metrics: NewMetrics(th.regs[id]),
			ElectionTicks: 10 + int(rand.New(rand.NewPCG(seed, id)).IntN(10))})
		if err := h.Bootstrap(testShardID, []uint64{1, 2, 3}, nil); err != nil {
			t.Fatal(err)
		}
		th.tr.mu.Lock()
		th.tr.hosts[id] = h
		th.tr.mu.Unlock()
	}
	for id, h := range th.tr.hosts {
		h.Start()
		if err := h.AddGroup(testDesc, id); err != nil {
			t.Fatal(err)
		}
	}
	return th
}

// leader waits for a ready leader of the test shard other than except (0:
// any) and answers its id.
func (th *threeHosts) leader(except uint64) uint64 {
	th.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		for id, h := range th.tr.hosts {
			if id != except && h.Ready(testShardID) {
				return id
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	th.t.Fatalf("seed %d: no leader elected within 20s", th.seed)
	return 0
}

// TestHostThreeReplicas runs one shard as a three-voter raft group over
// three Hosts: a leader is elected by ticks, writes reach every replica's
// state machine, and after the leader is cut off the other two elect a new
// leader that keeps every acknowledged write.
func TestHostThreeReplicas(t *testing.T) {
	th := startThreeHosts(t)
	tr, engines, seed := th.tr, th.engines, th.seed
	leader := func(except uint64) *Host { return tr.hosts[th.leader(except)] }
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	acked := map[string]uint64{}
	write := func(h *Host, n int, prefix string) {
		for i := range n {
			key := prefix + strconv.Itoa(i)
			res, err := h.Propose(ctx, testShardID, putCmd(key, "v"+key, nil))
			if err != nil || res.Err != nil {
				t.Fatalf("seed %d: put %s: %v %v", seed, key, err, res.Err)
			}
			acked[key] = res.Version
		}
	}
	first := leader(0)
	write(first, 50, "a")
	var firstID uint64
	for id, h := range tr.hosts {
		if h == first {
			firstID = id
		}
	}
	if err := first.ReadBarrier(ctx, testShardID); err != nil {
		t.Fatalf("seed %d: read barrier on the leader: %v", seed, err)
	}
	// Cut the leader off; the other two elect a new one. The old leader
	// must not confirm a read while it cannot reach a quorum.
	tr.setDown(firstID, true)
	rctx, rcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err := first.ReadBarrier(rctx, testShardID)
	rcancel()
	if err == nil {
		t.Fatalf("seed %d: a leader cut off from its quorum confirmed a read", seed)
	}
	second := leader(firstID)
	if err := second.ReadBarrier(ctx, testShardID); err != nil {
		t.Fatalf("seed %d: read barrier on the new leader: %v", seed, err)
	}
	write(second, 50, "b")
	// Heal; every replica converges on every acknowledged write.
	tr.setDown(firstID, false)
	deadline := time.Now().Add(20 * time.Second)
	for id, eng := range engines {
		for key, version := range acked {
			for {
				val, v, found, err := shard.ReadRecord(eng.DB, testDesc.Collection, []byte(key), shard.Latest)
				if err != nil {
					t.Fatal(err)
				}
				if found && v == version && string(val.Value) == "v"+key {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("seed %d: replica %d lacks %s@%d (found %v at %d)", seed, id, key, version, found, v)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
	}
}
