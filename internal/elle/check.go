package elle

import (
	"sort"
	"testing"
)

// Check infers the dependencies between the transactions of h and reports
// the anomalies it finds that opts.Model forbids (and, apart, those it
// allows). The zero Options check strict serializability.
//
// The error is non-nil, with no verdict, when opts are invalid
// (ErrInvalidOptions) or h is malformed (ErrMalformed). Check does not
// modify h.
func Check(h History, opts Options) (Result, error) {
	if err := opts.Validate(); err != nil {
		return Result{}, err
	}
	opts.EnsureDefaults()
	if err := h.validate(); err != nil {
		return Result{}, err
	}
	c := &checker{h: h, opts: opts, keys: make(map[string]*keyState)}
	c.indexOps()
	for k := range c.keys {
		c.sortedKeys = append(c.sortedKeys, k)
	}
	sort.Strings(c.sortedKeys)
	for _, k := range c.sortedKeys {
		c.checkReads(k, c.keys[k])
		c.versionOrder(k, c.keys[k])
	}
	res := Result{Model: opts.Model, Txns: c.chooseNodes()}
	c.g = newGraph(len(h))
	for _, k := range c.sortedKeys {
		c.dependencies(k, c.keys[k])
	}
	realtime := opts.Model == StrictSerializable
	if realtime {
		c.realtime()
	}
	res.Edges = len(c.g.edges)
	res.Incomplete = c.searchCycles(realtime)
	for _, a := range c.found {
		if opts.Model.allows(a.Type) {
			res.Allowed = append(res.Allowed, a)
		} else {
			res.Anomalies = append(res.Anomalies, a)
		}
	}
	res.Valid = len(res.Anomalies) == 0
	return res, nil
}

// Check checks the history recorded so far (see Check), failing t with the
// seed and the anomalies found, and logging the size of the history
// otherwise.
func (r *Recorder) Check(t testing.TB, seed int64, opts Options) Result {
	t.Helper()
	res, err := Check(r.History(), opts)
	switch {
	case err != nil:
		t.Fatalf("elle check failed (seed %d): %v", seed, err)
	case !res.Valid:
		t.Fatalf("elle (seed %d): %v", seed, res)
	default:
		t.Logf("elle (seed %d): %v", seed, res)
	}
	return res
}
