package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
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
	file := func(body string, collections, records int, groups ...int) string {
		sum := sha256.Sum256([]byte(body))
		path := filepath.Join(t.TempDir(), "b")
		g := 0
		if len(groups) > 0 {
			g = groups[0]
		}
		data := body + fmt.Sprintf(`{"end":{"collections":%d,"records":%d,"groups":%d,"sha256":"%s"}}`+"\n", collections, records, g, hex.EncodeToString(sum[:]))
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
	head2 := `{"groupkv_backup":2,"version":5}` + "\n"
	group := func(body string) string { return `{"group":` + body + `}` + "\n" }
	g1 := group(`{"id":"g1","mode":"best_effort","leader":{"collection":"c","key":"a"},"members":[{"collection":"c","key":"a"},{"collection":"c","key_base64":"/w=="}]}`)
	plan, err = checkBackup(file(head2+coll+`{"key":"a","value":"1","version":3}`+"\n"+end(1)+g1, 1, 1, 1))
	if err != nil || len(plan.groups) != 1 || plan.groups[0].ID != "g1" || plan.groups[0].Mode != kv.GroupBestEffort ||
		len(plan.groups[0].Members) != 2 || string(plan.groups[0].Members[1].Key) != "\xff" {
		t.Fatalf("a good backup with a key group: %+v %v", plan, err)
	}
	if plan.only([]string{"c"}); len(plan.restoredGroups()) != 1 {
		t.Fatalf("restoring c: groups %+v, want g1", plan.restoredGroups())
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
		{"another format", `{"groupkv_backup":3,"version":5}` + "\n", 0, "backup format 3"},
		{"a group in format 1", head + coll + end(0) + g1, 0, "a key group in a backup of format 1"},
		{"a group inside a collection", head2 + coll + g1 + end(0), 0, `key group "g1" inside collection "c"`},
		{"a group of another collection", head2 + coll + end(0) + group(`{"id":"g","mode":"atomic","leader":{"collection":"d","key":"a"},"members":[{"collection":"d","key":"a"}]}`), 0, `collection "d", which the backup does not hold`},
		{"a group without members", head2 + coll + end(0) + group(`{"id":"g","mode":"atomic","leader":{"collection":"c","key":"a"},"members":[]}`), 0, "has no members"},
		{"a group of another mode", head2 + coll + end(0) + group(`{"id":"g","mode":"most","leader":{"collection":"c","key":"a"},"members":[{"collection":"c","key":"a"}]}`), 0, `mode "most"`},
		{"a group twice", head2 + coll + end(0) + g1 + g1, 0, `key group "g1" appears twice`},
		{"a group with no id", head2 + coll + end(0) + group(`{"id":"","mode":"atomic","leader":{"collection":"c","key":"a"},"members":[{"collection":"c","key":"a"}]}`), 0, "a group id is 1 to 256 bytes"},
		{"a collection after the groups", head2 + coll + end(0) + g1 + `{"collection":{"name":"d","partitioning":"hash","shards":2}}` + "\n" + `{"key":"a","value":"1","version":3}` + "\n" + `{"collection_end":{"name":"d","records":1}}` + "\n", 1, `collection "d" after the key groups`},
		{"a group miscount", head2 + coll + end(0) + g1, 0, "says 0 key groups, it holds 1"},
	} {
		collections := 1
		switch c.name {
		case "another format":
			collections = 0
		case "a collection after the groups":
			collections = 2
		}
		_, err := checkBackup(file(c.body, collections, c.records))
		if err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.says)
		}
	}
}

// FuzzCheckBackup: the check before a restore never panics on any file,
// and a file it accepts holds exactly the records it counts, each with a
// valid key, in each collection's key order (what the restore relies on).
func FuzzCheckBackup(f *testing.F) {
	body := `{"groupkv_backup":1,"version":5}` + "\n" +
		`{"collection":{"name":"c","partitioning":"range","shards":2,"split_points_base64":["bQ=="]}}` + "\n" +
		`{"key":"a","value":"1","version":3,"tags":["x"]}` + "\n" +
		`{"key_base64":"/wA=","value_base64":"AP8=","version":4}` + "\n" +
		`{"collection_end":{"name":"c","records":2}}` + "\n"
	sum := sha256.Sum256([]byte(body))
	f.Add([]byte(body + `{"end":{"collections":1,"records":2,"sha256":"` + hex.EncodeToString(sum[:]) + `"}}` + "\n"))
	f.Add([]byte(body))
	f.Add([]byte("{}\n"))
	body2 := strings.Replace(body, `"groupkv_backup":1`, `"groupkv_backup":2`, 1) +
		`{"group":{"id":"g","mode":"atomic","leader":{"collection":"c","key":"a"},"members":[{"collection":"c","key":"a"},{"collection":"c","key_base64":"/wA="}]}}` + "\n"
	sum2 := sha256.Sum256([]byte(body2))
	f.Add([]byte(body2 + `{"end":{"collections":1,"records":2,"groups":1,"sha256":"` + hex.EncodeToString(sum2[:]) + `"}}` + "\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(t.TempDir(), "b")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		plan, err := checkBackup(path)
		if err != nil {
			return
		}
		// Accepted: read it again as the restore does.
		b, file, err := openBackup(path)
		if err != nil {
			t.Fatal(err)
		}
		defer file.Close()
		counts := map[string]int64{}
		cur := ""
		var last []byte
		for {
			l, err := b.next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("an accepted file fails on a second reading: %v", err)
			}
			switch {
			case l.Collection != nil:
				cur, last = l.Collection.Name, nil
			case l.CollectionEnd != nil, l.End != nil, l.Format != nil, l.Group != nil:
			default:
				key, _, _, err := b.record(l)
				if err != nil {
					t.Fatalf("an accepted file holds a record the restore refuses: %v", err)
				}
				if last != nil && bytes.Compare(key, last) <= 0 {
					t.Fatalf("an accepted file holds keys out of order")
				}
				last = key
				counts[cur]++
			}
		}
		for _, g := range plan.groups {
			for _, k := range append(g.Members, g.Leader) {
				if !slices.ContainsFunc(plan.collections, func(c backupCollection) bool { return c.Name == k.Collection }) || kv.ValidateKey(k.Key) != nil {
					t.Fatalf("an accepted file holds key group %q with key %q of collection %q", g.ID, k.Key, k.Collection)
				}
			}
		}
		for _, c := range plan.collections {
			if counts[c.Name] != plan.records[c.Name] {
				t.Fatalf("collection %q: %d records, the check counted %d", c.Name, counts[c.Name], plan.records[c.Name])
			}
		}
	})
}
