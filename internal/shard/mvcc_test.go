package shard

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/groupkv/groupkv/internal/storage"
)

// TestLatestPointerFormats: a write leaves a latest pointer that carries
// the newest version's value, and a read of the latest version through it
// agrees with a read through the versions. A pointer of format 2 (version
// and bucket only) still reads the same, and a write over it (which reads
// the old tags through it) replaces it and retires the old tags. A pointer
// of any other length is refused as corrupt.
func TestLatestPointerFormats(t *testing.T) {
	e := newSnapEnv(t, 3)
	e.createCollections()
	c := e.colls[0] // hash
	key := []byte("k")
	bucket, id := route(c, key)
	coll := c.ID

	e.writeAt(id, 10, Op{Type: OpPut, Bucket: bucket, Key: key, Tags: []string{"old", "kept"}, Value: []byte("v10")})
	ptrKey := storage.LatestKey(nil, coll, key)
	ptr := get(t, e.db, ptrKey)
	version, b, enc, err := storage.DecodeLatest(ptr)
	if err != nil || version != 10 || b != bucket {
		t.Fatalf("pointer %x: version %d bucket %d, %v", ptr, version, b, err)
	}
	if data := get(t, e.db, storage.DataKey(nil, coll, key, 10)); !bytes.Equal(enc, data) {
		t.Fatalf("the pointer carries %x, the version holds %x", enc, data)
	}
	want := readBoth(t, e.db, coll, key)
	if string(want.Value) != "v10" || !reflect.DeepEqual(want.Tags, []string{"old", "kept"}) {
		t.Fatalf("read %+v", want)
	}

	// A pointer of format 2.
	set(t, e.db, ptrKey, ptr[:10])
	if got := readBoth(t, e.db, coll, key); !reflect.DeepEqual(got, want) {
		t.Fatalf("through a format 2 pointer: %+v, want %+v", got, want)
	}
	e.writeAt(id, 11, Op{Type: OpPut, Bucket: bucket, Key: key, Tags: []string{"kept", "new"}, Value: []byte("v11")})
	if got := readBoth(t, e.db, coll, key); string(got.Value) != "v11" || !reflect.DeepEqual(got.Tags, []string{"kept", "new"}) {
		t.Fatalf("after the write over a format 2 pointer: %+v", got)
	}
	if len(get(t, e.db, ptrKey)) <= 10 {
		t.Fatal("the write left a pointer without its value")
	}
	for tag, wantKeys := range map[string]int{"old": 0, "kept": 1, "new": 1} {
		n := 0
		if err := TagKeys(e.db, coll, tag, Latest, nil, func(uint16) bool { return true }, func([]byte) bool { n++; return true }); err != nil {
			t.Fatal(err)
		}
		if n != wantKeys {
			t.Errorf("tag %q: %d keys, want %d", tag, n, wantKeys)
		}
	}

	// A deletion: the pointer carries the tombstone.
	e.writeAt(id, 12, Op{Type: OpDelete, Bucket: bucket, Key: key})
	if _, v, found, err := ReadRecord(e.db, coll, key, Latest); err != nil || found || v != 12 {
		t.Fatalf("after the delete: version %d found %v, %v", v, found, err)
	}

	for _, bad := range [][]byte{ptr[:9], append(ptr[:10:10], 0, 0)} {
		set(t, e.db, ptrKey, bad)
		if _, _, _, err := ReadRecord(e.db, coll, key, Latest); !errors.Is(err, storage.ErrCorruptValue) {
			t.Errorf("pointer %x: got %v, want ErrCorruptValue", bad, err)
		}
	}
}

// readBoth reads the newest version of key through its latest pointer and
// through the versions, and fails the test unless the two agree.
func readBoth(t *testing.T, db *pebble.DB, coll uint32, key []byte) storage.MVCCValue {
	t.Helper()
	v, version, found, err := ReadRecord(db, coll, key, Latest)
	if err != nil {
		t.Fatal(err)
	}
	w, wversion, wfound, err := ReadRecord(db, coll, key, Latest-1)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(v, w) || version != wversion || found != wfound {
		t.Fatalf("through the pointer %+v@%d (found %v), through the versions %+v@%d (found %v)", v, version, found, w, wversion, wfound)
	}
	return v
}

func get(t *testing.T, db *pebble.DB, k []byte) []byte {
	t.Helper()
	v, ok, err := storage.GetValue(db, k)
	if err != nil || !ok {
		t.Fatalf("get %x: %v (found %v)", k, err, ok)
	}
	return v
}
