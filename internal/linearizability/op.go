package linearizability

import "fmt"

// Kind is the kind of an operation.
type Kind uint8

// The kinds of operations.
const (
	KindPut Kind = iota + 1
	KindGet
	KindDelete
)

// String returns "put", "get" or "delete".
func (k Kind) String() string {
	switch k {
	case KindPut:
		return "put"
	case KindGet:
		return "get"
	case KindDelete:
		return "delete"
	default:
		return fmt.Sprintf("Kind(%d)", uint8(k))
	}
}

// Op is the input of an operation on one key.
type Op struct {
	Kind Kind
	Key  string
	// Value is the value a put writes; it is empty for gets and deletes.
	Value string
}

// Put returns the op that stores value under key.
func Put(key, value string) Op { return Op{Kind: KindPut, Key: key, Value: value} }

// Get returns the op that reads key.
func Get(key string) Op { return Op{Kind: KindGet, Key: key} }

// Delete returns the op that deletes key.
func Delete(key string) Op { return Op{Kind: KindDelete, Key: key} }

// String describes the op, as in put("k", "v").
func (o Op) String() string {
	if o.Kind == KindPut {
		return fmt.Sprintf("put(%q, %q)", o.Key, o.Value)
	}
	return fmt.Sprintf("%v(%q)", o.Kind, o.Key)
}

// Outcome is what the client observed when an operation returned. Its zero
// value is the unknown outcome. Build outcomes with PutOK, GetOK, DeleteOK,
// NotFound and Unknown.
type Outcome struct {
	// OK reports that the server answered definitively: for a put or a delete
	// that it acknowledged the write, for a get that it returned a read. When
	// OK is false the outcome is unknown (the operation may or may not have
	// taken effect) and the other fields are ignored. An unacknowledged put or
	// delete is therefore unknown; use Pending.Fail for one that definitely
	// did not take effect.
	OK bool
	// Found reports, for a get, that the key was present and, for a delete,
	// that it removed a present key (groupkv answers not_found for a delete of
	// an absent key, which changes nothing). Puts ignore it.
	Found bool
	// Value is the value a get returned.
	Value string
	// Version is the version a put was given, the version of the record a get
	// returned, or the version of a delete's tombstone (zero if the client
	// does not know it, in which case it is not checked).
	Version uint64
}

// PutOK is the outcome of a put acknowledged with the given version.
func PutOK(version uint64) Outcome { return Outcome{OK: true, Version: version} }

// GetOK is the outcome of a get that found value at version.
func GetOK(value string, version uint64) Outcome {
	return Outcome{OK: true, Found: true, Value: value, Version: version}
}

// DeleteOK is the outcome of a delete that removed a present key, writing a
// tombstone at version (zero if unknown to the client).
func DeleteOK(version uint64) Outcome { return Outcome{OK: true, Found: true, Version: version} }

// NotFound is the outcome of a get or a delete that found the key absent.
func NotFound() Outcome { return Outcome{OK: true} }

// Unknown is the outcome of an operation that may or may not have taken
// effect: a timeout, a lost connection, commit_unknown, a server that died.
func Unknown() Outcome { return Outcome{} }

// describe describes the outcome of an operation of kind k.
func (o Outcome) describe(k Kind) string {
	switch {
	case !o.OK:
		return "?"
	case k == KindPut:
		return fmt.Sprintf("ok v%d", o.Version)
	case !o.Found:
		return "not found"
	case k == KindGet:
		return fmt.Sprintf("%q v%d", o.Value, o.Version)
	case o.Version == 0:
		return "deleted"
	default:
		return fmt.Sprintf("deleted v%d", o.Version)
	}
}
