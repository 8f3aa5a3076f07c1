package shard

import (
	"fmt"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2"
)

// TestBatchOverlayReadsLikeTheBatch builds random batches of sets, deletes,
// single deletes and range deletes over a random engine state and checks
// that a snapshot taken before the batch with the batch's representation
// laid over it reads, over random bounds, exactly what a read through the
// indexed batch read, also after the batch is committed and the engine
// has changed further.
func TestBatchOverlayReadsLikeTheBatch(t *testing.T) {
	rng, seed := seededRand(t, 1)
	db := memDB(t)
	key := func() []byte { return fmt.Appendf(nil, "k%03d", rng.IntN(200)) }
	val := func() []byte { return fmt.Appendf(nil, "v%d", rng.Uint32()) }
	for round := 0; round < 50; round++ {
		// Some committed state.
		for i := 0; i < 40; i++ {
			var err error
			if rng.IntN(4) == 0 {
				err = db.Delete(key(), pebble.NoSync)
			} else {
				err = db.Set(key(), val(), pebble.NoSync)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		b := db.NewIndexedBatch()
		for i, n := 0, rng.IntN(60); i < n; i++ {
			var err error
			switch rng.IntN(8) {
			case 0, 1:
				err = b.Delete(key(), nil)
			case 2:
				err = b.SingleDelete(key(), nil)
			case 3:
				err = b.DeleteSized(key(), 3, nil)
			case 4:
				lo, hi := key(), key()
				err = b.DeleteRange(lo, hi, nil) // empty when hi <= lo
			default:
				err = b.Set(key(), val(), nil)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		type bounds struct{ lo, hi []byte }
		var spans []bounds
		var want [][]string
		for i := 0; i < 5; i++ {
			sp := bounds{key(), key()}
			if rng.IntN(5) == 0 {
				sp.hi = nil
			}
			spans = append(spans, sp)
			it, err := b.NewIter(&pebble.IterOptions{LowerBound: sp.lo, UpperBound: sp.hi})
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, dumpIter(t, it))
			if err := it.Close(); err != nil {
				t.Fatal(err)
			}
		}
		snap := db.NewSnapshot()
		over, err := newBatchOverlay(slices.Clone(b.Repr()))
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Commit(pebble.NoSync); err != nil {
			t.Fatal(err)
		}
		b.Close()
		// The engine moves on; the overlay must not see it.
		for i := 0; i < 20; i++ {
			if err := db.Set(key(), []byte("later"), pebble.NoSync); err != nil {
				t.Fatal(err)
			}
		}
		for i, sp := range spans {
			base, err := snap.NewIter(&pebble.IterOptions{LowerBound: sp.lo, UpperBound: sp.hi})
			if err != nil {
				t.Fatal(err)
			}
			it := over.iter(base, sp.lo, sp.hi)
			got := dumpIter(t, it)
			if err := it.Close(); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want[i]) {
				t.Fatalf("seed %d, round %d, [%s, %s): the overlay read\n%v\nthe batch read\n%v", seed, round, sp.lo, sp.hi, got, want[i])
			}
		}
		snap.Close()
	}
}

func dumpIter(t *testing.T, it pairIter) []string {
	t.Helper()
	var out []string
	for valid := it.First(); valid; valid = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, string(it.Key())+"="+string(v))
	}
	if err := it.Error(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestBatchOverlayRefusesMerges: a record the overlay cannot lay over a
// snapshot is an error, not a wrong sum.
func TestBatchOverlayRefusesMerges(t *testing.T) {
	b := memDB(t).NewBatch()
	defer b.Close()
	if err := b.Merge([]byte("k"), []byte("v"), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := newBatchOverlay(b.Repr()); err == nil {
		t.Fatal("a merge record was read without an error")
	}
}
