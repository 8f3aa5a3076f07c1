package shard

import (
	"bytes"
	"fmt"
	"slices"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/batchrepr"
)

// batchOverlay is the effect of a batch's writes (a copy of its
// representation, Batch.Repr) laid over a Pebble snapshot of the state the
// batch was built on: reading it gives what a read through the indexed
// batch gave when the representation was taken, for as long as the
// snapshot is open, while the batch itself is committed and the engine
// moves on.
type batchOverlay struct {
	// points are the keys the batch set or deleted, in key order, each with
	// its last state: a value, or deleted (by a point delete, or by a range
	// delete written after the point's last write).
	points []overlayPoint
	// dels are the spans of the batch's range deletions, in key order,
	// merged where they overlap or touch: every key of the snapshot in one
	// of them and not among points is deleted.
	dels []overlaySpan
}

type overlayPoint struct {
	key, value []byte
	deleted    bool
}

type overlaySpan struct{ start, end []byte }

// newBatchOverlay reads the records of a batch representation. It refuses
// a record it cannot lay over a snapshot (merges, range keys, ingestions):
// an apply batch writes none.
func newBatchOverlay(repr []byte) (*batchOverlay, error) {
	type point struct {
		seq     int
		value   []byte
		deleted bool
	}
	type rangeDel struct {
		seq        int
		start, end []byte
	}
	last := map[string]point{}
	var rdels []rangeDel
	r := batchrepr.Read(repr)
	for seq := 0; ; seq++ {
		kind, key, value, ok, err := r.Next()
		if err != nil {
			return nil, fmt.Errorf("reading the apply batch: %w", err)
		}
		if !ok {
			break
		}
		switch kind {
		case pebble.InternalKeyKindSet, pebble.InternalKeyKindSetWithDelete:
			last[string(key)] = point{seq: seq, value: value}
		case pebble.InternalKeyKindDelete, pebble.InternalKeyKindSingleDelete, pebble.InternalKeyKindDeleteSized:
			last[string(key)] = point{seq: seq, deleted: true}
		case pebble.InternalKeyKindRangeDelete:
			if bytes.Compare(key, value) < 0 {
				rdels = append(rdels, rangeDel{seq: seq, start: key, end: value})
			}
		case pebble.InternalKeyKindLogData:
		default:
			return nil, fmt.Errorf("the apply batch holds a record of kind %s, which a checksum cannot read", kind)
		}
	}
	o := &batchOverlay{points: make([]overlayPoint, 0, len(last))}
	for k, p := range last {
		deleted := p.deleted
		for _, d := range rdels {
			if d.seq > p.seq && bytes.Compare(d.start, []byte(k)) <= 0 && bytes.Compare([]byte(k), d.end) < 0 {
				deleted = true
				break
			}
		}
		o.points = append(o.points, overlayPoint{key: []byte(k), value: p.value, deleted: deleted})
	}
	slices.SortFunc(o.points, func(a, b overlayPoint) int { return bytes.Compare(a.key, b.key) })
	slices.SortFunc(rdels, func(a, b rangeDel) int { return bytes.Compare(a.start, b.start) })
	for _, d := range rdels {
		if n := len(o.dels); n > 0 && bytes.Compare(d.start, o.dels[n-1].end) <= 0 {
			if bytes.Compare(d.end, o.dels[n-1].end) > 0 {
				o.dels[n-1].end = d.end
			}
			continue
		}
		o.dels = append(o.dels, overlaySpan{d.start, d.end})
	}
	return o, nil
}

// iter returns an iterator over [lower, upper) of base (a snapshot's
// iterator bounded to the same span) with o laid over it. Closing the
// iterator is closing base.
func (o *batchOverlay) iter(base *pebble.Iterator, lower, upper []byte) *overlayIter {
	lo, _ := slices.BinarySearchFunc(o.points, lower, func(p overlayPoint, k []byte) int { return bytes.Compare(p.key, k) })
	hi := len(o.points)
	if upper != nil {
		hi, _ = slices.BinarySearchFunc(o.points, upper, func(p overlayPoint, k []byte) int { return bytes.Compare(p.key, k) })
		hi = max(hi, lo)
	}
	return &overlayIter{base: base, points: o.points[lo:hi], dels: o.dels}
}

// overlayIter merges a snapshot's iterator with a batchOverlay's points,
// hiding the snapshot's keys the batch deleted. It implements pairIter.
type overlayIter struct {
	base      *pebble.Iterator
	baseValid bool
	points    []overlayPoint
	i         int // the next point
	dels      []overlaySpan
	d         int // the first span that may cover the base's key
	// cur is the point at the position (nil: the base's key).
	cur *overlayPoint
	// valid tells whether the iterator is at a pair.
	valid bool
}

func (it *overlayIter) First() bool {
	it.baseValid = it.base.First()
	it.i, it.d = 0, 0
	return it.settle()
}

func (it *overlayIter) Next() bool {
	if !it.valid {
		return false
	}
	if it.cur != nil {
		if it.baseValid && bytes.Equal(it.base.Key(), it.cur.key) {
			it.baseValid = it.base.Next()
		}
		it.i++
	} else {
		it.baseValid = it.base.Next()
	}
	return it.settle()
}

// settle moves to the first visible pair at or after the sources'
// positions.
func (it *overlayIter) settle() bool {
	for {
		havePoint := it.i < len(it.points)
		if !it.baseValid && !havePoint {
			it.valid, it.cur = false, nil
			return false
		}
		if havePoint {
			p := &it.points[it.i]
			c := -1 // the point comes first when the base is done
			if it.baseValid {
				c = bytes.Compare(p.key, it.base.Key())
			}
			if c <= 0 {
				if !p.deleted {
					it.valid, it.cur = true, p
					return true
				}
				if c == 0 {
					it.baseValid = it.base.Next()
				}
				it.i++
				continue
			}
		}
		k := it.base.Key()
		for it.d < len(it.dels) && bytes.Compare(it.dels[it.d].end, k) <= 0 {
			it.d++
		}
		if it.d < len(it.dels) && bytes.Compare(it.dels[it.d].start, k) <= 0 {
			it.baseValid = it.base.Next() // deleted by the batch
			continue
		}
		it.valid, it.cur = true, nil
		return true
	}
}

func (it *overlayIter) Key() []byte {
	if it.cur != nil {
		return it.cur.key
	}
	return it.base.Key()
}

func (it *overlayIter) ValueAndErr() ([]byte, error) {
	if it.cur != nil {
		return it.cur.value, nil
	}
	return it.base.ValueAndErr()
}

func (it *overlayIter) Error() error { return it.base.Error() }

func (it *overlayIter) Close() error { return it.base.Close() }
