package replication

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/shard"
)

// asyncOutcome records the calls of a ProposeAsync callback.
type asyncOutcome struct {
	calls atomic.Int32
	ch    chan proposeResult
}

func newAsyncOutcome() *asyncOutcome { return &asyncOutcome{ch: make(chan proposeResult, 2)} }

func (o *asyncOutcome) done(res shard.Result, err error) {
	o.calls.Add(1)
	o.ch <- proposeResult{res: res, err: err}
}

// TestProposeAsyncAnswersOnceApplied: the callback of ProposeAsync runs
// once, only after the command's entry is fsynced and applied (what it
// wrote is stored when it runs), with the version Propose would return.
func TestProposeAsyncAnswersOnceApplied(t *testing.T) {
	e, fs := startGatedHost(t)

	fs.hold()
	o := newAsyncOutcome()
	var stored string
	if err := e.h.ProposeAsync(testShardID, putCmd("a", "1", nil), func(res shard.Result, err error) {
		stored, _ = e.read("a")
		o.done(res, err)
	}); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, "a's fsync", fs.entered)
	select {
	case r := <-o.ch:
		t.Fatalf("answered %+v before its entry was fsynced", r)
	case <-time.After(20 * time.Millisecond):
	}
	fs.open()
	var r proposeResult
	select {
	case r = <-o.ch:
	case <-time.After(10 * time.Second):
		t.Fatal("no answer 10s after the fsync")
	}
	if r.err != nil || r.res.Err != nil || r.res.Version == 0 {
		t.Fatalf("ProposeAsync answered %+v, err %v; want a version", r.res, r.err)
	}
	if stored != "1" {
		t.Fatalf("a reads %q when the callback runs, want \"1\"", stored)
	}
	if val, v := e.read("a"); val != "1" || v != r.res.Version {
		t.Fatalf("a reads %q at version %d, answered version %d", val, v, r.res.Version)
	}

	// A refusal of the shard's state machine is the result's error, as
	// Propose returns it.
	wrong := r.res.Version + 10
	o2 := newAsyncOutcome()
	if err := e.h.ProposeAsync(testShardID, putCmd("a", "2", &wrong), o2.done); err != nil {
		t.Fatal(err)
	}
	r2 := <-o2.ch
	if r2.err != nil || kv.CodeOf(r2.res.Err) != kv.CodeConditionFailed {
		t.Fatalf("a put on a wrong condition answered %+v, err %v; want condition failed", r2.res, r2.err)
	}
	if o.calls.Load() != 1 || o2.calls.Load() != 1 {
		t.Fatalf("callbacks ran %d and %d times, want once each", o.calls.Load(), o2.calls.Load())
	}
}

// TestProposeAsyncRefusals: a proposal for a shard the host does not serve
// is answered unavailable through the callback; once the host stopped,
// ProposeAsync returns the error and never calls back.
func TestProposeAsyncRefusals(t *testing.T) {
	e, _ := startGatedHost(t)

	o := newAsyncOutcome()
	if err := e.h.ProposeAsync(testShardID+100, putCmd("a", "1", nil), o.done); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-o.ch:
		if kv.CodeOf(r.err) != kv.CodeUnavailable {
			t.Fatalf("a proposal for a shard not served answered %v, want unavailable", r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no answer for a shard not served")
	}

	e.h.Stop()
	o2 := newAsyncOutcome()
	if err := e.h.ProposeAsync(testShardID, putCmd("b", "1", nil), o2.done); kv.CodeOf(err) != kv.CodeUnavailable {
		t.Fatalf("ProposeAsync on a stopped host returned %v, want unavailable", err)
	}
	select {
	case r := <-o2.ch:
		t.Fatalf("a proposal refused at once was answered too: %+v", r)
	case <-time.After(20 * time.Millisecond):
	}
}
