package main

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestClusterDecommissionCLI drains a node of a four-node cluster of real
// processes with `groupkv node decommission --wait`: its replicas move,
// shard by shard, to the other nodes, the drained node reports no replica
// held, it is stopped,
// and every value written before is read back through the remaining nodes.
func TestClusterDecommissionCLI(t *testing.T) {
	c := newTCluster(t, 4)
	c.startAll()
	c.createCollection(1, "d", 2)
	versions := map[string]uint64{}
	for i := 0; i < 20; i++ {
		k := fmt.Sprint("k", i)
		versions[k] = c.put(1+i%4, "d", k, "v"+k)
	}
	// Split one of the two shards with the CLI: three shards, all served.
	st, err := c.status(1)
	if err != nil {
		t.Fatal(err)
	}
	first := st.shards("d")[0].Shard
	out, err := exec.Command(binary, "collections", "split", "d", "--shard", fmt.Sprint(first), "--addr", c.node(2).addr).CombinedOutput()
	if err != nil {
		t.Fatalf("groupkv collections split: %v\n%s", err, out)
	}
	c.eventually(30*time.Second, "three shards of d with leaders", func() error {
		st, err := c.status(3)
		if err != nil {
			return err
		}
		if ss := st.shards("d"); len(ss) != 3 || ss[0].Leader == 0 || ss[1].Leader == 0 || ss[2].Leader == 0 {
			return fmt.Errorf("shards of d: %+v", ss)
		}
		return nil
	})
	st, err = c.status(1)
	if err != nil {
		t.Fatal(err)
	}
	var drain int
	for _, s := range st.shards("d") {
		drain = s.Replicas[0]
	}
	if drain == 0 {
		t.Fatalf("no replica of d in %+v", st)
	}
	// Stopping the node that runs the command's target is fine: ask another.
	via := 1
	if via == drain {
		via = 2
	}
	out, err = exec.Command(binary, "node", "decommission", fmt.Sprint(drain), "--addr", c.node(via).addr, "--wait", "90s").CombinedOutput()
	if err != nil {
		t.Fatalf("groupkv node decommission %d: %v\n%s", drain, err, out)
	}
	if !strings.Contains(string(out), "holds no replica") {
		t.Fatalf("unexpected output:\n%s", out)
	}
	st, err = c.status(via)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st.shards("d") {
		for _, r := range s.Replicas {
			if r == drain {
				t.Fatalf("shard %d still lists node %d: %+v", s.Shard, drain, s)
			}
		}
	}
	c.stop(drain)
	for _, n := range c.nodes {
		if n.id == drain {
			continue
		}
		for k, v := range versions {
			c.eventually(30*time.Second, "a read after the drained node stopped", func() error {
				a, err := c.do(t.Context(), "GET", c.url(n.id)+"/v1/kv/d/"+k, "")
				if err != nil {
					return err
				}
				if a.code != 200 || string(a.body) != "v"+k {
					return fmt.Errorf("node %d reads %s: %s", n.id, k, a)
				}
				if got, err := getVersion(a); err != nil || got != v {
					return fmt.Errorf("node %d reads %s at version %d, want %d (%v)", n.id, k, got, v, err)
				}
				return nil
			})
		}
	}
}
