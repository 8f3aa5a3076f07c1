package linearizability

import (
	"fmt"
	"math"
	"os"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// DefaultTimeout bounds Recorder.Check when its Timeout is zero.
const DefaultTimeout = time.Minute

// Operation is one operation of a history: what a client asked, what it
// observed, and when.
type Operation struct {
	// Client identifies the client, a small non-negative integer.
	Client int
	Op     Op
	Out    Outcome
	// Call is when the client invoked the operation and Return when it got
	// its answer or gave up, on one clock shared by every operation of the
	// history (a Recorder uses nanoseconds). An operation whose Return is
	// less than another's Call happened before it. Return is ignored when
	// the outcome is unknown: such an operation is checked as returning
	// after every other event.
	Call, Return int64
}

// History is a history of operations, in any order.
type History []Operation

// Result is the verdict of Check.
type Result struct {
	// Ok reports that the history is linearizable.
	Ok bool
	// TimedOut reports that the checker ran out of time before finding a
	// linearization or proving there is none; Ok is then false although no
	// violation was found.
	TimedOut bool
	// Visualization is the path of the HTML visualisation written when Ok
	// is false: the history with the longest partial linearizations found
	// and, for a violation, the operations that could not be linearized.
	Visualization string
	// Ops is the number of operations checked: those of the history less
	// the gets whose outcome is unknown.
	Ops int
}

// Check checks that h is linearizable under KVModel, giving up after timeout
// (zero: no limit). When it is not shown linearizable (a violation or a
// timeout), Check writes porcupine's HTML visualisation to a new file under
// os.TempDir() and returns its path in the Result.
//
// The error is non-nil for a malformed history (no verdict) or when the
// visualisation could not be written (the verdict stands).
func Check(h History, timeout time.Duration) (Result, error) {
	return CheckDir(h, timeout, "")
}

// CheckDir is Check writing the visualisation under dir instead of
// os.TempDir() (dir empty: os.TempDir()).
func CheckDir(h History, timeout time.Duration, dir string) (Result, error) {
	ops, err := h.operations()
	if err != nil {
		return Result{}, err
	}
	model := KVModel()
	verdict, info := porcupine.CheckOperationsVerbose(model, ops, timeout)
	res := Result{
		Ok:       verdict == porcupine.Ok,
		TimedOut: verdict == porcupine.Unknown,
		Ops:      len(ops),
	}
	if res.Ok {
		return res, nil
	}
	path, err := writeVisualization(model, info, dir)
	if err != nil {
		return res, fmt.Errorf("linearizability: writing the visualisation of a history that is not shown linearizable (%s): %w", verdict, err)
	}
	res.Visualization = path
	return res, nil
}

// Check checks the history recorded so far (see Check), failing t with the
// seed and the path of the visualisation on a violation and logging the
// number of operations otherwise. A check that times out is logged with its
// visualisation and does not fail t: no violation was found.
func (r *Recorder) Check(t testing.TB, seed int64) {
	t.Helper()
	timeout := r.Timeout
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	res, err := CheckDir(r.History(), timeout, r.Dir)
	switch {
	case err != nil:
		t.Fatalf("linearizability check failed (seed %d): %v", seed, err)
	case res.Ok:
		t.Logf("linearizability: %d operations are linearizable (seed %d)", res.Ops, seed)
	case res.TimedOut:
		t.Logf("linearizability: the check of %d operations timed out after %v with no violation found (seed %d); visualisation: %s",
			res.Ops, timeout, seed, res.Visualization)
	default:
		t.Fatalf("linearizability violation among %d operations (seed %d); visualisation: %s", res.Ops, seed, res.Visualization)
	}
}

// operations converts h to porcupine operations: unknown outcomes return at
// +infinity, unknown gets are left out.
func (h History) operations() ([]porcupine.Operation, error) {
	ops := make([]porcupine.Operation, 0, len(h))
	for i, o := range h {
		if o.Op.Kind < KindPut || o.Op.Kind > KindDelete {
			return nil, fmt.Errorf("linearizability: operation %d: invalid kind %v", i, o.Op.Kind)
		}
		if o.Client < 0 {
			return nil, fmt.Errorf("linearizability: operation %d (%v): negative client %d", i, o.Op, o.Client)
		}
		out, ret := o.Out, o.Return
		if !out.OK {
			if o.Op.Kind == KindGet {
				continue
			}
			out, ret = Unknown(), math.MaxInt64
		} else if ret < o.Call {
			return nil, fmt.Errorf("linearizability: operation %d (%v): returns at %d before its call at %d", i, o.Op, ret, o.Call)
		}
		ops = append(ops, porcupine.Operation{ClientId: o.Client, Input: o.Op, Call: o.Call, Output: out, Return: ret})
	}
	return ops, nil
}

// writeVisualization writes porcupine's visualisation of info to a new file
// under dir and returns its path.
func writeVisualization(model porcupine.Model, info porcupine.LinearizationInfo, dir string) (string, error) {
	f, err := os.CreateTemp(dir, "linearizability-*.html")
	if err != nil {
		return "", err
	}
	err = porcupine.Visualize(model, info, f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}
