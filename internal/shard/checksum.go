package shard

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/storage"
)

// Replica consistency checks.
//
// A KindChecksum entry makes every replica that applies it sum its shard's
// replicated state as of the entry's log index: the state a read through
// the apply batch sees at the entry (the effects of the earlier entries of
// the same cycle count and nothing later does). Replicas that applied the
// same log must produce the same sum; the node compares them.
//
// The sum is not computed in Apply, which runs on the loop that applies
// every shard of the node: a shard of millions of pairs takes a second to
// sum, and every write of the node would wait for it. Apply returns a
// ChecksumJob holding what to sum: the shard's descriptor and a copy of
// the apply batch's writes so far. The Host takes a Pebble snapshot before
// it commits that batch (so the snapshot holds the state the batch was
// built on) and runs the job off the loop, reading the snapshot with the
// copied writes laid over it (overlay.go).
//
// The sum covers the pairs SnapshotData would ship (the same spans and
// ownership rules, snapshotSpans and eachOwned), except what legitimately
// differs between correct replicas at the same index:
//
//   - the "applied" and "max_version" items of the shard-state span:
//     FinishBatch writes them once per batch, so a read through the batch
//     sees them as of the replica's last batch boundary, which depends on
//     how its entries were grouped into cycles. The sum takes the index of
//     the entry and the in-memory max version (exact at every entry)
//     instead.
//   - for a tag collection, the latest-version pointers: a key moved to
//     another placement tag has versions in two shards that share one
//     pointer, and which shard's version it names at a given index of one
//     shard depends on how far the other shard's log was applied on that
//     node.
//
// Everything else is in: the shard's descriptor (the snapshot header), the
// GC threshold, the raft configuration (conf state, which configuration
// changes write into the same apply batch), the catalog and TSO mark of the
// meta shard, and a data shard's versions, tag index, change log,
// placement entries and (hash, range) latest pointers.

// checksumVersion is the first byte summed, so that a change of what the sum
// covers never compares equal to the old one.
const checksumVersion byte = 1

// Checksum is one replica's checksum of its shard's replicated state.
type Checksum struct {
	// ID names the check (EncodeChecksum).
	ID uint64 `json:"id"`
	// Index is the log index of the KindChecksum entry: the state summed is
	// the one every entry before it left.
	Index uint64 `json:"index"`
	// Sum is the SHA-256 of the state.
	Sum []byte `json:"sum"`
	// Pairs is the number of key/value pairs summed.
	Pairs int `json:"pairs"`
}

// ChecksumJob is a replica's checksum of its shard at a KindChecksum entry,
// to be computed off the apply loop (see the top of this file). Its ID and
// Index are set by Apply; Sum and Pairs once Done is closed, unless Err
// says why not.
type ChecksumJob struct {
	Checksum
	desc       Desc
	maxVersion uint64
	// prior is a copy of the apply batch's representation at the entry.
	prior []byte
	done  chan struct{}
	err   error
}

// applyChecksum records what to sum of the shard's replicated state as of
// the entry at index, read through b. It writes nothing.
func (s *Shard) applyChecksum(b *pebble.Batch, index, id uint64) *ChecksumJob {
	return &ChecksumJob{
		Checksum:   Checksum{ID: id, Index: index},
		desc:       s.desc,
		maxVersion: s.maxVersion,
		prior:      bytes.Clone(b.Repr()),
		done:       make(chan struct{}),
	}
}

// Run computes the sum, reading base: a snapshot of the engine taken after
// the batches committed before the job's apply batch and before that batch
// itself. It reads at most rate bytes (of keys and values) per second, any
// number when rate <= 0, and stops early, with an error, when stop is
// closed. It closes Done.
func (j *ChecksumJob) Run(base pebble.Reader, stop <-chan struct{}, rate int64) {
	defer close(j.done)
	over, err := newBatchOverlay(j.prior)
	j.prior = nil
	if err == nil {
		newIter := func(lower, upper []byte) (pairIter, func() error, error) {
			it, err := base.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
			if err != nil {
				return nil, nil, err
			}
			oi := over.iter(it, lower, upper)
			return oi, oi.Close, nil
		}
		j.Sum, j.Pairs, err = checksumState(newIter, j.desc, j.Index, j.maxVersion, newPacer(rate, stop))
	}
	if err != nil {
		j.err = fmt.Errorf("shard %d: checksum at %d: %w", j.desc.ShardID, j.Index, err)
	}
}

// ShardID is the shard summed.
func (j *ChecksumJob) ShardID() uint64 { return j.desc.ShardID }

// Done is closed once Run has returned.
func (j *ChecksumJob) Done() <-chan struct{} { return j.done }

// Err is why Run computed no sum (after Done).
func (j *ChecksumJob) Err() error { return j.err }

// checksumSpans are the spans summed: snapshotSpans but the latest pointers
// of a tag collection.
func checksumSpans(d Desc) []snapSpan {
	spans := snapshotSpans(d)
	if d.Partitioning != kv.PartitionTag {
		return spans
	}
	out := spans[:0]
	for _, sp := range spans {
		if sp.kind != spanLatest {
			out = append(out, sp)
		}
	}
	return out
}

// errChecksumStopped ends a sum when the node stops.
var errChecksumStopped = errors.New("the node is stopping")

// checksumPace is how many bytes a sum reads between two looks at its
// pacer, at most: at a low rate, a twentieth of a second's worth.
const checksumPace = 64 << 10

// pacer holds a sum to its rate and ends it when stop is closed.
type pacer struct {
	rate  int64 // bytes per second; <= 0: any
	stop  <-chan struct{}
	start time.Time
	read  int64 // bytes read so far
	next  int64 // read at the next look
}

func newPacer(rate int64, stop <-chan struct{}) *pacer {
	return &pacer{rate: rate, stop: stop, start: time.Now()}
}

// add counts n bytes read; every checksumPace bytes it waits until the
// bytes read are within the rate, or returns errChecksumStopped.
func (p *pacer) add(n int) error {
	p.read += int64(n)
	if p.read < p.next {
		return nil
	}
	step := int64(checksumPace)
	if p.rate > 0 {
		step = min(step, max(p.rate/20, 1))
	}
	p.next = p.read + step
	var wait time.Duration
	if p.rate > 0 {
		wait = time.Duration(float64(p.read)/float64(p.rate)*float64(time.Second)) - time.Since(p.start)
	}
	if wait <= 0 {
		select {
		case <-p.stop:
			return errChecksumStopped
		default:
			return nil
		}
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-p.stop:
		return errChecksumStopped
	case <-t.C:
		return nil
	}
}

// checksumState sums the state of shard d read through newIter at index,
// with maxVersion the shard's highest applied version (see the top of this
// file), at the pace of p.
func checksumState(newIter func(lower, upper []byte) (pairIter, func() error, error), d Desc, index, maxVersion uint64, p *pacer) ([]byte, int, error) {
	skipApplied := storage.ShardStateKey(d.ShardID, stateApplied)
	skipMaxVersion := storage.ShardStateKey(d.ShardID, stateMaxVersion)
	h := sha256.New()
	buf := append(make([]byte, 0, 256), checksumVersion)
	buf = appendSnapshotHeader(buf, d)
	buf = binary.AppendUvarint(buf, index)
	buf = binary.AppendUvarint(buf, maxVersion)
	h.Write(buf)
	pairs := 0
	for _, sp := range checksumSpans(d) {
		it, closeIter, err := newIter(sp.start, sp.end)
		if err != nil {
			return nil, 0, err
		}
		err = eachOwnedIn(it, sp, func(k, v []byte) error {
			if sp.kind == spanState && (bytes.Equal(k, skipApplied) || bytes.Equal(k, skipMaxVersion)) {
				return nil
			}
			if err := p.add(len(k) + len(v)); err != nil {
				return err
			}
			h.Write(binary.AppendUvarint(buf[:0], uint64(len(k))))
			h.Write(k)
			h.Write(binary.AppendUvarint(buf[:0], uint64(len(v))))
			h.Write(v)
			pairs++
			return nil
		})
		if cerr := closeIter(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, 0, err
		}
	}
	// The end of the pairs: no key is empty.
	h.Write([]byte{0})
	return h.Sum(nil), pairs, nil
}
