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

// TestHostThreeReplicas runs one shard as a three-voter raft group over
// three Hosts: a leader is elected by ticks, writes reach every replica's
// state machine, and after the leader is cut off the other two elect a new
// leader that keeps every acknowledged write.
func TestHostThreeReplicas(t *testing.T) {
	seed := rand.Uint64()
	if s := os.Getenv("GROUPKV_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d", seed)
	tr := &memTransport{hosts: map[uint64]*Host{}, down: map[uint64]bool{}}
	vs := &sharedVersions{}
	var engines []*storage.Engine
	for id := uint64(1); id <= 3; id++ {
		eng, err := storage.Open("/data", storage.Options{FS: vfs.NewMem(), Logger: testLogger()})
		if err != nil {
			t.Fatal(err)
		}
		engines = append(engines, eng)
		h := NewHost(Config{NodeID: id, Engine: eng, Versions: vs, Transport: tr,
			TickInterval: 5 * time.Millisecond, Logger: testLogger(),
			ElectionTicks: 10 + int(rand.New(rand.NewPCG(seed, id)).IntN(10))})
		if err := h.Bootstrap(testShardID, []uint64{1, 2, 3}, nil); err != nil {
			t.Fatal(err)
		}
		tr.mu.Lock()
		tr.hosts[id] = h
		tr.mu.Unlock()
	}
	for id, h := range tr.hosts {
		h.Start()
		if err := h.AddGroup(testDesc, id); err != nil {
			t.Fatal(err)
		}
	}
	defer func() {
		for _, h := range tr.hosts {
			h.Stop()
		}
		for _, e := range engines {
			e.Close()
		}
	}()

	leader := func(except uint64) *Host {
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			for id, h := range tr.hosts {
				if id != except && h.Ready(testShardID) {
					return h
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Fatalf("seed %d: no leader elected within 20s", seed)
		return nil
	}
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
	for i, eng := range engines {
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
					t.Fatalf("seed %d: replica %d lacks %s@%d (found %v at %d)", seed, i+1, key, version, found, v)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
	}
}
