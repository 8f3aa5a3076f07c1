package bench

import (
	"errors"
	"fmt"
	"strings"
)

// Errors of setting up a run.
var (
	// ErrInvalidOptions wraps every problem of Options, a Workload or
	// TimelineOptions, all listed.
	ErrInvalidOptions = errors.New("bench: invalid options")
	// ErrUnknownWorkload is a workload name that is not a to f.
	ErrUnknownWorkload = errors.New("bench: unknown workload")
	// ErrUnknownTarget is a system with no driver.
	ErrUnknownTarget = errors.New("bench: unknown target")
	// ErrNotLoaded is a run on a store that holds no records of the
	// benchmark: run the load phase first (--load).
	ErrNotLoaded = errors.New("bench: the store holds no benchmark data: run the load phase first (--load)")
)

// Errors of operations; the runner counts them per operation.
var (
	// ErrNotFound is a read of a record that is not there.
	ErrNotFound = errors.New("bench: record not found")
	// ErrShortRead is a timeline read that found fewer records than loaded.
	ErrShortRead = errors.New("bench: fewer records than loaded")
)

// Errors of reading results.
var (
	// ErrNoResults is a results file with no record to chart or report.
	ErrNoResults = errors.New("bench: no results")
)

// joinProblems turns a list of problems into one ErrInvalidOptions error,
// or nil.
func joinProblems(what string, problems []string) error {
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s: %s", ErrInvalidOptions, what, strings.Join(problems, "; "))
}
