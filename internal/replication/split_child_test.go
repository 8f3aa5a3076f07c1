package replication

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/shard"
	"github.com/groupkv/groupkv/internal/storage"
)

// TestSplitChildCreatedOnce: a split's child replica is created here either
// by the split applied in the parent (bootstrapped state) or by CreateEmpty
// (a replica placed here before the parent caught up), never both: the
// later of the two leaves the state alone.
func TestSplitChildCreatedOnce(t *testing.T) {
	e := newHostEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// Child 20 was placed here, empty, before the split was applied.
	if err := e.h.CreateEmpty(20, nil); err != nil {
		t.Fatal(err)
	}
	res, err := e.propose(ctx, shardSplitTrigger(20, kv.NumBuckets/2))
	if err != nil || res.Err != nil {
		t.Fatalf("split: %v %v", err, res.Err)
	}
	if res.Split == nil || !res.Split.Existing {
		t.Fatalf("split into a child created here: result %+v, want Existing", res.Split)
	}
	rs, err := loadRaftStorage(e.eng.DB, 20)
	if err != nil {
		t.Fatal(err)
	}
	if rs.truncIndex != 0 || rs.hardState.Commit != 0 || len(rs.confState.Voters) != 0 {
		t.Fatalf("the empty child's raft state was overwritten: truncated %d, hard state %+v, conf %+v",
			rs.truncIndex, rs.hardState, rs.confState)
	}
	if _, ok, err := storage.GetValue(e.eng.DB, storage.ShardStateKey(20, "span")); err != nil || ok {
		t.Fatalf("the split wrote the existing child's span (found %v, err %v)", ok, err)
	}

	// Child 21 is created by the split: CreateEmpty then refuses it.
	res, err = e.propose(ctx, shardSplitTrigger(21, kv.NumBuckets/4))
	if err != nil || res.Err != nil {
		t.Fatalf("split: %v %v", err, res.Err)
	}
	if res.Split == nil || res.Split.Existing {
		t.Fatalf("split into a new child: result %+v, want a new child", res.Split)
	}
	if err := e.h.CreateEmpty(21, nil); !errors.Is(err, ErrReplicaExists) {
		t.Fatalf("CreateEmpty of a split's child: %v, want ErrReplicaExists", err)
	}
	rs, err = loadRaftStorage(e.eng.DB, 21)
	if err != nil {
		t.Fatal(err)
	}
	if rs.truncIndex != bootstrapIndex || rs.hardState.Commit != bootstrapIndex || len(rs.confState.Voters) != 1 {
		t.Fatalf("the split's child state: truncated %d, hard state %+v, conf %+v",
			rs.truncIndex, rs.hardState, rs.confState)
	}
	if err := e.h.AddGroup(res.Split.Child, 1); err != nil {
		t.Fatalf("starting the split's child: %v", err)
	}
}

func shardSplitTrigger(child uint64, bucket uint32) []byte {
	return shard.EncodeSplitTrigger(child, nil, bucket)
}
