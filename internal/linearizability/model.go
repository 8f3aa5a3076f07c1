package linearizability

import (
	"fmt"

	"github.com/anishathalye/porcupine"
)

// State is the model's state of one key.
//
// Version has two readings. When Exact is true the key is present and
// Version is the version of its value. When Exact is false, Version is only a
// lower bound: a put whose outcome is unknown was linearized (so its version
// is greater than every version before it, but unobserved), or the key is
// absent and Version bounds the versions the key had before. A get that reads
// the value pins the version and makes it exact again.
type State struct {
	Present bool
	Value   string
	Version uint64
	Exact   bool
}

// String describes the state, as in "v" v7, "v" v≥7 or absent (v≥7).
func (s State) String() string {
	switch {
	case !s.Present:
		return fmt.Sprintf("absent (v≥%d)", s.Version)
	case s.Exact:
		return fmt.Sprintf("%q v%d", s.Value, s.Version)
	default:
		return fmt.Sprintf("%q v≥%d", s.Value, s.Version)
	}
}

// KVModel returns the porcupine model of a key-value store, partitioned by
// key. Operation inputs must be Op values and outputs Outcome values; the
// state of each partition is a State, initially absent at version 0.
//
// The model accepts a step when:
//
//   - an acknowledged put's version is greater than every version the key
//     had before (so versions must be at least 1);
//   - a get that found the key returns the current value and the version of
//     the put that wrote it, and a get that did not find it runs while the
//     key is absent;
//   - a delete that removed the key runs while it is present, and its
//     tombstone version, when given, is greater than the key's version; a
//     delete that found nothing runs while the key is absent;
//   - the operation's outcome is unknown. An unknown put or delete takes
//     effect when linearized (an unknown put gets an unobserved version
//     above the key's); since unknown operations respond after every other
//     event, the checker can place them last to model one that never took
//     effect.
func KVModel() porcupine.Model {
	return porcupine.Model{
		Partition:      partition,
		PartitionEvent: partitionEvents,
		Init:           func() interface{} { return State{} },
		Step: func(state, input, output interface{}) (bool, interface{}) {
			ok, next := step(state.(State), input.(Op), output.(Outcome))
			return ok, next
		},
		DescribeOperation: func(input, output interface{}) string {
			op := input.(Op)
			return fmt.Sprintf("%v → %s", op, output.(Outcome).describe(op.Kind))
		},
		DescribeState: func(state interface{}) string { return state.(State).String() },
	}
}

// step is the sequential specification of one key: whether op can return out
// in state s, and the state after it. Absent states are canonical (no value,
// inexact) so that equal states compare equal.
func step(s State, op Op, out Outcome) (bool, State) {
	switch op.Kind {
	case KindPut:
		if !out.OK {
			return true, State{Present: true, Value: op.Value, Version: s.Version + 1}
		}
		if out.Version <= s.Version {
			return false, s
		}
		return true, State{Present: true, Value: op.Value, Version: out.Version, Exact: true}
	case KindGet:
		switch {
		case !out.OK:
			return true, s
		case !out.Found:
			return !s.Present, s
		case !s.Present || out.Value != s.Value:
			return false, s
		case s.Exact:
			return out.Version == s.Version, s
		case out.Version < s.Version:
			return false, s
		}
		s.Version, s.Exact = out.Version, true
		return true, s
	case KindDelete:
		switch {
		case !out.OK:
			return true, State{Version: s.Version}
		case !out.Found:
			return !s.Present, s
		case !s.Present:
			return false, s
		case out.Version == 0:
			return true, State{Version: s.Version}
		case out.Version <= s.Version:
			return false, s
		}
		return true, State{Version: out.Version}
	}
	return false, s
}

// partition splits a history of operations by key, keys in order of first
// appearance.
func partition(history []porcupine.Operation) [][]porcupine.Operation {
	index := make(map[string]int)
	var parts [][]porcupine.Operation
	for _, o := range history {
		key := o.Input.(Op).Key
		i, ok := index[key]
		if !ok {
			i = len(parts)
			index[key] = i
			parts = append(parts, nil)
		}
		parts[i] = append(parts[i], o)
	}
	return parts
}

// partitionEvents splits a history of events by key; a return event goes
// with the call event of the same Id, which precedes it.
func partitionEvents(history []porcupine.Event) [][]porcupine.Event {
	index := make(map[string]int)
	partOf := make(map[int]int) // event Id → partition
	var parts [][]porcupine.Event
	for _, e := range history {
		if e.Kind == porcupine.CallEvent {
			key := e.Value.(Op).Key
			i, ok := index[key]
			if !ok {
				i = len(parts)
				index[key] = i
				parts = append(parts, nil)
			}
			partOf[e.Id] = i
		}
		i, ok := partOf[e.Id]
		if !ok {
			panic(fmt.Sprintf("linearizability: return event %d has no call event before it", e.Id))
		}
		parts[i] = append(parts[i], e)
	}
	return parts
}
