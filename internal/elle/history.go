package elle

import (
	"fmt"
	"strings"
)

// OpKind is the kind of a micro-operation.
type OpKind uint8

// The kinds of micro-operations.
const (
	// OpAppend appends an integer to the list stored at a key.
	OpAppend OpKind = iota + 1
	// OpRead reads the list stored at a key.
	OpRead
)

// String returns "append" or "read".
func (k OpKind) String() string {
	switch k {
	case OpAppend:
		return "append"
	case OpRead:
		return "read"
	default:
		return fmt.Sprintf("OpKind(%d)", uint8(k))
	}
}

// Op is one micro-operation of a transaction.
type Op struct {
	Kind OpKind
	Key  string
	// Value is the integer an append adds to the end of the list at Key.
	// Invariant: no two appends of a history, in any transactions, append
	// the same Value to the same Key. Reads ignore it.
	Value int
	// Values is the list a read observed, oldest element first; nil and
	// empty both mean the empty list. It is meaningful only in a transaction
	// whose outcome is OK; appends ignore it. The checker does not modify it.
	Values []int
}

// Append returns the op that appends value to the list at key.
func Append(key string, value int) Op { return Op{Kind: OpAppend, Key: key, Value: value} }

// Read returns the op that read the list at key and observed values (none
// for the empty list, or for a read whose result is not known yet).
func Read(key string, values ...int) Op { return Op{Kind: OpRead, Key: key, Values: values} }

// String describes the op, as in append(x, 3) or read(x) -> [1 2 3].
func (o Op) String() string {
	switch o.Kind {
	case OpAppend:
		return fmt.Sprintf("append(%s, %d)", o.Key, o.Value)
	case OpRead:
		return fmt.Sprintf("read(%s) -> %s", o.Key, formatList(o.Values))
	default:
		return fmt.Sprintf("%v(%s)", o.Kind, o.Key)
	}
}

// Outcome is what the client learned about a transaction. Its zero value is
// the unknown outcome, Info.
type Outcome uint8

// The outcomes of a transaction.
const (
	// Info: the outcome is unknown (a timeout, a lost connection, a node
	// that died). The transaction may or may not have committed; its reads
	// are ignored and its appends count only if some read observed them.
	Info Outcome = iota
	// OK: the transaction committed and its reads returned what its ops say.
	OK
	// Fail: the transaction definitely did not commit; no read may observe
	// its appends.
	Fail
)

// String returns "info", "ok" or "fail".
func (o Outcome) String() string {
	switch o {
	case Info:
		return "info"
	case OK:
		return "ok"
	case Fail:
		return "fail"
	default:
		return fmt.Sprintf("Outcome(%d)", uint8(o))
	}
}

// Txn is one transaction attempt of a history.
type Txn struct {
	// ID names the transaction in explanations ("T12"). Invariant: unique
	// within a history.
	ID int
	// Process identifies the client that ran the transaction. The checker
	// only reports it; it infers no order from it.
	Process int
	// Invoke is when the client sent the transaction and Complete when it
	// learned its outcome, on one clock shared by every transaction of the
	// history (a Recorder uses nanoseconds; a logical counter will do). A
	// transaction whose Complete is less than another's Invoke precedes it
	// in real time. Complete is ignored when the outcome is Info: such a
	// transaction may take effect at any time after its Invoke.
	// Invariant for OK transactions: Invoke <= Complete.
	Invoke, Complete int64
	Outcome          Outcome
	// Ops are the micro-operations, in the order the transaction ran them.
	Ops []Op
}

// String describes the transaction, as in T3 ok [append(x, 1) read(y) -> []].
func (t Txn) String() string {
	ops := make([]string, len(t.Ops))
	for i, o := range t.Ops {
		ops[i] = o.String()
	}
	return fmt.Sprintf("T%d %v [%s]", t.ID, t.Outcome, strings.Join(ops, " "))
}

// History is a history of transactions, in any order.
type History []Txn

// validate reports every way in which h breaks the invariants of Txn and Op,
// each error wrapping ErrMalformed.
func (h History) validate() error {
	var problems []string
	ids := make(map[int]int, len(h))
	type kv struct {
		key   string
		value int
	}
	appends := make(map[kv]int)
	for i, t := range h {
		if j, ok := ids[t.ID]; ok {
			problems = append(problems, fmt.Sprintf("transactions %d and %d share the ID %d", j, i, t.ID))
		}
		ids[t.ID] = i
		if t.Outcome > Fail {
			problems = append(problems, fmt.Sprintf("T%d: invalid outcome %v", t.ID, t.Outcome))
		}
		if t.Outcome == OK && t.Complete < t.Invoke {
			problems = append(problems, fmt.Sprintf("T%d: completes at %d before its invocation at %d", t.ID, t.Complete, t.Invoke))
		}
		for _, o := range t.Ops {
			switch o.Kind {
			case OpAppend:
				if j, ok := appends[kv{o.Key, o.Value}]; ok {
					problems = append(problems, fmt.Sprintf("T%d and T%d both append %d to %s (use a fresh value for every append, retries included)",
						h[j].ID, t.ID, o.Value, o.Key))
				}
				appends[kv{o.Key, o.Value}] = i
			case OpRead:
			default:
				problems = append(problems, fmt.Sprintf("T%d: invalid op kind %v", t.ID, o.Kind))
			}
		}
	}
	if len(problems) == 0 {
		return nil
	}
	const most = 10 // enough to see the pattern without flooding a test log
	more := ""
	if len(problems) > most {
		more = fmt.Sprintf("; and %d more", len(problems)-most)
		problems = problems[:most]
	}
	return fmt.Errorf("%w: %s%s", ErrMalformed, strings.Join(problems, "; "), more)
}

// formatList formats a list as [1 2 3].
func formatList(l []int) string {
	if len(l) == 0 {
		return "[]"
	}
	return fmt.Sprint(l)
}
