package shard

import (
	"fmt"
	"strings"
	"testing"
)

// TestClearShard removes each shard of the snapshot tests' collections in
// turn: every key it owns goes, every key of every other shard stays.
func TestClearShard(t *testing.T) {
	src := newSnapEnv(t, 3)
	src.createCollections()
	src.workload(0)
	before := rawDump(t, src.db)
	for _, c := range src.colls {
		for _, sd := range c.Shards {
			d := DescFor(c, sd)
			t.Run(fmt.Sprintf("%s/shard%d", c.Name, d.ShardID), func(t *testing.T) {
				env := newSnapEnv(t, 3)
				env.createCollections()
				env.workload(0)
				owned := ownedDump(t, env.colls, rawDump(t, env.db), d.ShardID)
				if len(owned) < 20 {
					t.Fatalf("the workload left too little in shard %d", d.ShardID)
				}
				b := env.db.NewBatch()
				if err := ClearShard(b, env.db, d); err != nil {
					t.Fatal(err)
				}
				if err := b.Commit(nil); err != nil {
					t.Fatal(err)
				}
				after := rawDump(t, env.db)
				want := map[string]string{}
				for k, v := range before {
					if _, ok := owned[k]; !ok {
						want[k] = v
					}
				}
				if diffs := diffDumps(after, want); len(diffs) > 0 {
					t.Fatalf("after clearing shard %d:\n%s", d.ShardID, strings.Join(diffs, "\n"))
				}
			})
		}
	}
}
