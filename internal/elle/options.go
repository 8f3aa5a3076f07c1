package elle

import (
	"errors"
	"fmt"
)

// Errors returned by Check. The checker finds anomalies in a Result, not in
// an error: an error means there is no verdict.
var (
	// ErrMalformed: the history breaks an invariant of Txn or Op (duplicate
	// IDs, a value appended twice to one key, an OK transaction completing
	// before its invocation, an unknown op kind or outcome). Fix the test
	// harness that recorded it.
	ErrMalformed = errors.New("elle: malformed history")
	// ErrInvalidOptions: Options.Validate found a problem.
	ErrInvalidOptions = errors.New("elle: invalid options")
)

// Model is a consistency model a history is checked against.
type Model uint8

// The consistency models. The zero value is StrictSerializable, the model
// groupkv promises.
const (
	// StrictSerializable forbids every anomaly this package detects,
	// including cycles through real-time edges: a transaction that
	// completed before another was invoked must appear to take effect first.
	StrictSerializable Model = iota
	// Serializable forbids every anomaly but ignores real time: no
	// real-time edges are inferred.
	Serializable
	// SnapshotIsolation forbids G0, G1a, G1b, G1c, G-single and
	// G-nonadjacent (and the non-cycle anomalies) but allows G2-item
	// cycles, whose anti-dependency edges include two adjacent ones (write
	// skew). No real-time edges are inferred.
	SnapshotIsolation
)

// String returns the model's name.
func (m Model) String() string {
	switch m {
	case StrictSerializable:
		return "strict-serializable"
	case Serializable:
		return "serializable"
	case SnapshotIsolation:
		return "snapshot-isolation"
	default:
		return fmt.Sprintf("Model(%d)", uint8(m))
	}
}

// allows reports whether m allows anomalies of type t.
func (m Model) allows(t AnomalyType) bool {
	return m == SnapshotIsolation && t == G2Item
}

// DefaultSearchBudget bounds the G-single search of one strongly connected
// component when Options.SearchBudget is zero: 50M edge visits take a second
// or two, and a valid history's components are single transactions that
// need none.
const DefaultSearchBudget = 50_000_000

// Options configures Check. The zero value checks strict serializability.
type Options struct {
	// Model is the consistency model to check against.
	Model Model
	// SearchBudget bounds the number of edges the search for G-single
	// cycles may visit in each strongly connected component of the
	// dependency graph (that search runs one breadth-first search per
	// anti-dependency target). When it runs out, the component is searched
	// for any cycle instead, which may then be reported as G2-item (or
	// G-nonadjacent) though it also holds a G-single, and Result.Incomplete
	// is set. Zero means DefaultSearchBudget.
	SearchBudget int
}

// EnsureDefaults fills the zero fields of o with their defaults.
func (o *Options) EnsureDefaults() {
	if o.SearchBudget == 0 {
		o.SearchBudget = DefaultSearchBudget
	}
}

// Validate reports every problem with o, wrapping ErrInvalidOptions.
func (o Options) Validate() error {
	var errs []error
	if o.Model > SnapshotIsolation {
		errs = append(errs, fmt.Errorf("%w: Model %v: use StrictSerializable, Serializable or SnapshotIsolation", ErrInvalidOptions, o.Model))
	}
	if o.SearchBudget < 0 {
		errs = append(errs, fmt.Errorf("%w: SearchBudget %d is negative: use zero for the default", ErrInvalidOptions, o.SearchBudget))
	}
	return errors.Join(errs...)
}
