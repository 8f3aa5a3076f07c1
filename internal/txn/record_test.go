package txn

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestRecordTransition runs the scripts in testdata/record against
// Transition. Rewrite the expected outputs with -rewrite and read the diff
// before keeping it.
//
// Commands (arguments in brackets are optional):
//
//	record [exists=BOOL] [status=pending|committed|aborted] [hb=N] [commit-ts=N] [reason=R] [start=N]
//	    Sets the current record (exists=false: no record yet; the default
//	    is true) and the attempt's start timestamp (Meta.Start, default 0).
//	    Prints the record and its LastAlive.
//	apply op=heartbeat|abort|commit|status|retry|N [ts=N] [if-idle-before=N] [deadline=N] [reason=R] [by=ID] [next=ID]
//	    Applies one command to the current record and prints whether it is
//	    written and the next record. A written record becomes the current
//	    one (and exists); an unwritten one leaves it as it was.
//	apply-each
//	    Applies one command of every op (and an unknown op) to the current
//	    record without changing it, one line each.
type recordEnv struct {
	cur    Record
	exists bool
	meta   Meta
}

func TestRecordTransition(t *testing.T) {
	datadriven.Walk(t, "testdata/record", func(t *testing.T, path string) {
		e := &recordEnv{exists: true}
		datadriven.RunTest(t, path, e.run)
	})
}

func formatRecord(r Record) string {
	var b strings.Builder
	b.WriteString(r.Status.String())
	if r.CommitTS != 0 {
		fmt.Fprintf(&b, " commit-ts=%d", r.CommitTS)
	}
	fmt.Fprintf(&b, " hb=%d", r.Heartbeat)
	if r.Reason != "" {
		fmt.Fprintf(&b, " reason=%q", r.Reason)
	}
	if r.WoundedBy != nil {
		fmt.Fprintf(&b, " wounded-by=%s", r.WoundedBy.ID)
	}
	if r.RetriedAs != nil {
		fmt.Fprintf(&b, " retried-as=%s", r.RetriedAs.ID)
	}
	return b.String()
}

func (e *recordEnv) run(t *testing.T, td *datadriven.TestData) string {
	switch td.Cmd {
	case "record":
		e.cur, e.exists, e.meta = Record{}, true, Meta{ID: "t"}
		td.MaybeScanArgs(t, "exists", &e.exists)
		if td.HasArg("status") {
			var s string
			td.ScanArgs(t, "status", &s)
			e.cur.Status = parseStatus(t, td, s)
		}
		td.MaybeScanArgs(t, "hb", &e.cur.Heartbeat)
		td.MaybeScanArgs(t, "commit-ts", &e.cur.CommitTS)
		td.MaybeScanArgs(t, "reason", &e.cur.Reason)
		td.MaybeScanArgs(t, "start", &e.meta.Start)
		return e.describe()
	case "apply":
		var op string
		td.ScanArgs(t, "op", &op)
		cmd := RecordCmd{Op: parseOp(t, td, op), Meta: e.meta}
		td.MaybeScanArgs(t, "ts", &cmd.TS)
		td.MaybeScanArgs(t, "if-idle-before", &cmd.IfIdleBefore)
		td.MaybeScanArgs(t, "deadline", &cmd.Deadline)
		td.MaybeScanArgs(t, "reason", &cmd.Reason)
		if td.HasArg("by") {
			cmd.By = &Meta{}
			td.ScanArgs(t, "by", &cmd.By.ID)
		}
		if td.HasArg("next") {
			cmd.Next = &Meta{}
			td.ScanArgs(t, "next", &cmd.Next.ID)
		}
		next, write := Transition(e.cur, e.exists, cmd)
		if write {
			e.cur, e.exists = next, true
		}
		return fmt.Sprintf("write=%t next: %s", write, formatRecord(next))
	case "apply-each":
		var out strings.Builder
		for _, c := range []struct {
			name string
			cmd  RecordCmd
		}{
			{"heartbeat ts=1000", RecordCmd{Op: OpHeartbeat, TS: 1000}},
			{"abort (wound)", RecordCmd{Op: OpAbort, Reason: "wounded"}},
			{"abort if-idle-before=1000", RecordCmd{Op: OpAbort, IfIdleBefore: 1000, Reason: "expired"}},
			{"commit ts=1000", RecordCmd{Op: OpCommit, TS: 1000}},
			{"commit ts=1000 deadline=10", RecordCmd{Op: OpCommit, TS: 1000, Deadline: 10}},
			{"status", RecordCmd{Op: OpStatus}},
			{"retry next=t2", RecordCmd{Op: OpRetry, Next: &Meta{ID: "t2"}}},
			{"op=9", RecordCmd{Op: 9, TS: 1000}},
		} {
			c.cmd.Meta = e.meta
			next, write := Transition(e.cur, e.exists, c.cmd)
			fmt.Fprintf(&out, "%s: write=%t next: %s\n", c.name, write, formatRecord(next))
		}
		return out.String()
	}
	td.Fatalf(t, "unknown command %q", td.Cmd)
	return ""
}

func (e *recordEnv) describe() string {
	ex := "exists"
	if !e.exists {
		ex = "absent"
	}
	return fmt.Sprintf("%s (%s) last-alive=%d", formatRecord(e.cur), ex, LastAlive(e.cur, e.meta))
}

func parseStatus(t *testing.T, td *datadriven.TestData, s string) Status {
	switch s {
	case "pending":
		return Pending
	case "committed":
		return Committed
	case "aborted":
		return Aborted
	}
	td.Fatalf(t, "unknown status %q", s)
	return 0
}

func parseOp(t *testing.T, td *datadriven.TestData, s string) RecordOp {
	switch s {
	case "heartbeat":
		return OpHeartbeat
	case "abort":
		return OpAbort
	case "commit":
		return OpCommit
	case "status":
		return OpStatus
	case "retry":
		return OpRetry
	}
	var n uint8
	if _, err := fmt.Sscanf(s, "%d", &n); err != nil {
		td.Fatalf(t, "unknown op %q", s)
	}
	return RecordOp(n)
}

func TestRecordRoundTrip(t *testing.T) {
	for _, c := range []struct {
		r      Record
		bucket uint16
	}{
		{Record{}, 0},
		{Record{Status: Pending, Heartbeat: 17}, 65535},
		{Record{Status: Committed, CommitTS: 1 << 62, Heartbeat: 3}, 12},
		{Record{Status: Aborted, Heartbeat: 9, Reason: "wounded by a transaction of priority 5"}, 300},
		{Record{Status: Aborted, Reason: "\x00\xff not utf-8 \xfe"}, 1},
		{Record{Status: Aborted, Reason: "wounded", WoundedBy: &Meta{ID: "w", Priority: 4, Attempt: 2, Start: 9, Anchor: Anchor{Collection: 3, Bucket: 8, Key: []byte("k")}}}, 5},
		{Record{Status: Aborted, RetriedAs: &Meta{ID: "n", Priority: 4, Attempt: 3, Start: 11, Anchor: Anchor{Collection: 3, Bucket: 8, Key: []byte("k")}}}, 5},
		{Record{Status: Aborted, Reason: "wounded", WoundedBy: &Meta{ID: "w", Priority: 2, Anchor: Anchor{Key: []byte("a")}}, RetriedAs: &Meta{ID: "n", Priority: 4, Attempt: 3, Anchor: Anchor{Key: []byte("b")}}}, 6},
		{Record{Status: Committed, CommitTS: 8, ForgetAfter: 1 << 60}, 7},
		{Record{Status: Committed, CommitTS: 8, Listed: true}, 7},
		{Record{Status: Aborted, Reason: "wounded", AbortedAt: 1 << 62, ForgetAfter: 3}, 7},
		{Record{Status: Committed, CommitTS: 8, Participants: []uint64{3, 1 << 40, 5}, Listed: true, ForgetAfter: 4, Reason: "r"}, 7},
		{Record{Status: Aborted, Reason: "wounded", WoundedBy: &Meta{ID: "w", Priority: 2, Anchor: Anchor{Key: []byte("a")}}, RetriedAs: &Meta{ID: "n", Priority: 4, Anchor: Anchor{Key: []byte("b")}}, ForgetAfter: 1}, 6},
	} {
		b := EncodeRecord(c.r, c.bucket)
		r, bucket, err := DecodeRecord(b)
		if err != nil || !reflect.DeepEqual(r, c.r) || bucket != c.bucket {
			t.Errorf("DecodeRecord(EncodeRecord(%+v, %d)) = %+v, %d, %v", c.r, c.bucket, r, bucket, err)
		}
		// The decoded record does not alias the encoding.
		if len(b) > 20 {
			reason := r.Reason
			b[len(b)-1]++
			if r.Reason != reason {
				t.Errorf("decoded reason changed with its encoding")
			}
		}
	}
}

func TestDecodeRecordCorrupt(t *testing.T) {
	good := EncodeRecord(Record{Status: Committed, CommitTS: 5, Heartbeat: 4, Reason: "r"}, 7)
	badStatus := bytes.Clone(good)
	badStatus[0] = 3
	for name, b := range map[string][]byte{
		"nil":                nil,
		"empty":              {},
		"one byte":           {0},
		"truncated":          good[:19],
		"bad status":         badStatus,
		"status 255":         append([]byte{255}, good[1:]...),
		"bad flags":          append(bytes.Clone(good[:19]), 8),
		"flag, no meta":      append(bytes.Clone(good[:19]), recordRetriedAs),
		"forget-after short": append(append(bytes.Clone(good[:19]), recordForgetAfter), 0, 0, 1),
		"forget-after 0":     append(append(bytes.Clone(good[:19]), recordForgetAfter), make([]byte, 8)...),
	} {
		if r, bucket, err := DecodeRecord(b); !errors.Is(err, ErrCorruptRecord) {
			t.Errorf("%s: DecodeRecord(%x) = %+v, %d, %v: want ErrCorruptRecord", name, b, r, bucket, err)
		}
	}
	// The shortest record: no reason.
	if _, _, err := DecodeRecord(good[:20]); err != nil {
		t.Errorf("DecodeRecord of a record without a reason: %v", err)
	}
}

// FuzzDecodeRecord checks that every input either fails to decode with
// ErrCorruptRecord or decodes to a record that encodes back to it.
func FuzzDecodeRecord(f *testing.F) {
	f.Add(EncodeRecord(Record{}, 0))
	f.Add(EncodeRecord(Record{Status: Committed, CommitTS: 20, Heartbeat: 5}, 9))
	f.Add(EncodeRecord(Record{Status: Aborted, Heartbeat: 5, Reason: "wounded"}, 65535))
	f.Add([]byte{3})
	f.Add(EncodeRecord(Record{Status: Aborted, Reason: "wounded", WoundedBy: &Meta{ID: "x", Priority: 3, Anchor: Anchor{Collection: 1, Key: []byte("k")}}}, 2))
	f.Add(EncodeRecord(Record{Status: Aborted, WoundedBy: &Meta{ID: "x", Priority: 3}, RetriedAs: &Meta{ID: "y", Priority: 5, Attempt: 2}}, 2))
	f.Add(EncodeRecord(Record{Status: Committed, CommitTS: 3, ForgetAfter: 99}, 2))
	f.Add(EncodeRecord(Record{Status: Committed, CommitTS: 3, Participants: []uint64{7, 300}, Listed: true}, 2))
	f.Add(EncodeRecord(Record{Status: Aborted, AbortedAt: 12, RetriedAs: &Meta{ID: "y"}}, 2))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, bucket, err := DecodeRecord(b)
		if err != nil {
			if !errors.Is(err, ErrCorruptRecord) {
				t.Fatalf("DecodeRecord(%x): %v is not ErrCorruptRecord", b, err)
			}
			return
		}
		if r.Status > Aborted {
			t.Fatalf("DecodeRecord(%x) = status %v", b, r.Status)
		}
		if got := EncodeRecord(r, bucket); !bytes.Equal(got, b) {
			t.Fatalf("EncodeRecord(DecodeRecord(%x)) = %x", b, got)
		}
	})
}
