package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/kv"
)

// TestRestoreShardOf: the shard a restore groups a record under is the
// one the node routes it to, for hash, range and tag collections.
func TestRestoreShardOf(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, opts := range []kv.CollectionOptions{
		{Name: "h", Partitioning: kv.PartitionHash, Shards: 7},
		{Name: "r", Partitioning: kv.PartitionRange, Shards: 4, SplitPoints: [][]byte{[]byte("d"), []byte("k"), []byte("k\x00")}},
		{Name: "t", Partitioning: kv.PartitionTag, Shards: 5},
	} {
		d := cluster.NewCollectionDesc(opts, 1, 10, []uint64{1}, cluster.Load{Replicas: map[uint64]int{}, Leaders: map[uint64]int{}})
		info := d.Info(nil)
		for i := range 2000 {
			key := []byte(fmt.Sprintf("%c%d", 'a'+rng.IntN(26), i))
			var tags []string
			placement := ""
			if i%3 > 0 {
				placement = fmt.Sprintf("user%d", rng.IntN(50))
				tags = []string{placement, "other"}
			}
			if opts.Partitioning != kv.PartitionTag {
				placement = ""
			}
			_, want := d.Route(key, placement)
			if got := shardOf(info, key, tags); got != want {
				t.Fatalf("%s: key %q tags %v: shard %d, the node routes it to %d", opts.Name, key, tags, got, want)
			}
		}
	}
	if got := shardOf(kv.CollectionInfo{}, []byte("k"), nil); got != -1 {
		t.Errorf("no shards: %d, want -1", got)
	}
}

// TestCheckBackupRefuses: a backup whose checksum holds but whose content
// a restore could not write whole is refused by the check that precedes
// any write, naming the line.
func TestCheckBackupRefuses(t *testing.T) {
	head := `{"groupkv_backup":1,"version":5}` + "\n"
	coll := `{"collection":{"name":"c","partitioning":"hash","shards":2}}` + "\n"
	end := func(n int) string { return fmt.Sprintf(`{"collection_end":{"name":"c","records":%d}}`+"\n", n) }
	file := func(body string, collections, records int) string {
		sum := sha256.Sum256([]byte(body))
		path := filepath.Join(t.TempDir(), "b")
		data := body + fmt.Sprintf(`{"end":{"collections":%d,"records":%d,"sha256":"%s"}}`+"\n", collections, records, hex.EncodeToString(sum[:]))
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	good := head + coll + `{"key":"a","value":"1","version":3,"tags":["x"]}` + "\n" + end(1)
	plan, err := checkBackup(file(good, 1, 1))
	if err != nil || plan.version != 5 || plan.records["c"] != 1 {
		t.Fatalf("a good backup: %+v %v", plan, err)
	}
	for _, c := range []struct {
		name, body string
		records    int
		says       string
	}{
		{"a key too long", head + coll + `{"key":"` + strings.Repeat("k", 5000) + `","value":"1","version":3}` + "\n" + end(1), 1, "line 3: key is 5000 bytes"},
		{"a bad tag", head + coll + `{"key":"a","value":"1","version":3,"tags":["a,b"]}` + "\n" + end(1), 1, "line 3: the record of key \"a\""},
		{"no value", head + coll + `{"key":"a","version":3}` + "\n" + end(1), 1, "no valid value"},
		{"keys out of order", head + coll + `{"key":"b","value":"1","version":3}` + "\n" + `{"key":"a","value":"1","version":3}` + "\n" + end(2), 2, "line 4: collection \"c\": key \"a\" is not above"},
		{"a bad collection", head + `{"collection":{"name":"C!","partitioning":"hash","shards":2}}` + "\n" + end(0), 0, "line 2: collection \"C!\""},
		{"a system collection", head + `{"collection":{"name":"_groups","partitioning":"hash","shards":2}}` + "\n" + end(0), 0, "groupkv's own"},
		{"a miscount", head + coll + `{"key":"a","value":"1","version":3}` + "\n" + end(2), 1, "says 2 records, it holds 1"},
		{"an unknown field", head + coll + `{"key":"a","value":"1","version":3,"color":"red"}` + "\n" + end(1), 1, "unknown field"},
		{"another format", `{"groupkv_backup":2,"version":5}` + "\n", 0, "backup format 2"},
	} {
		collections := 1
		if c.name == "another format" {
			collections = 0
		}
		_, err := checkBackup(file(c.body, collections, c.records))
		if err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.says)
		}
	}
}
