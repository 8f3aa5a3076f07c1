package api

import (
	"fmt"

	"github.com/groupkv/groupkv/internal/kv"
)

// The JSON shapes of the transaction forms of the HTTP API (http_txn.go),
// shared with the Go client's remote transactions and the command-line
// client. Bytes, tags and versions are put in JSON as in the multi-record
// forms (see http_multi.go): a key or value is a string, or standard base64
// in a _base64 twin for bytes that are not UTF-8.

// TxnBeginRequestJSON is the body of POST /v1/txn; an empty body is the
// zero value, a serializable read-write transaction.
type TxnBeginRequestJSON struct {
	// Isolation is "serializable" (also when empty) or "snapshot".
	Isolation kv.Isolation `json:"isolation,omitempty"`
	// RetryOf names an aborted attempt whose priority the new one keeps.
	RetryOf  string `json:"retry_of,omitempty"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

const txnBeginFields = "isolation, retry_of, read_only"

// TxnBeginResponseJSON answers POST /v1/txn: the id of the attempt, used in
// the path of its operations as it is.
type TxnBeginResponseJSON struct {
	Txn string `json:"txn"`
}

// TxnOptionsFromJSON validates req.
func TxnOptionsFromJSON(req TxnBeginRequestJSON) (kv.TxnOptions, error) {
	return validTxnOptions(kv.TxnOptions{Isolation: req.Isolation, RetryOf: req.RetryOf, ReadOnly: req.ReadOnly})
}

// validTxnOptions checks the isolation of opts, an empty one made
// serializable; the HTTP and gRPC begins share it.
func validTxnOptions(opts kv.TxnOptions) (kv.TxnOptions, error) {
	switch opts.Isolation {
	case "":
		opts.Isolation = kv.IsolationSerializable
	case kv.IsolationSerializable, kv.IsolationSnapshot:
	default:
		return kv.TxnOptions{}, kv.Errorf(kv.CodeInvalidArgument, "isolation %q is not known: use %q (the default) or %q",
			clip(string(opts.Isolation)), kv.IsolationSerializable, kv.IsolationSnapshot)
	}
	return opts, nil
}

// checkGroupIsolation refuses an isolation other than serializable for a
// group transaction.
func checkGroupIsolation(iso kv.Isolation) error {
	if iso != kv.IsolationSerializable {
		return kv.Errorf(kv.CodeInvalidArgument,
			"isolation %q: a group transaction is serializable (optimistic, validated at commit by the group's leader): omit isolation or give %q",
			iso, kv.IsolationSerializable)
	}
	return nil
}

// TxnPutRequestJSON is the body of POST /v1/txn/{id}/put: key or
// key_base64, value or value_base64 ("" for an empty value), and tags.
type TxnPutRequestJSON struct {
	Collection  string   `json:"collection"`
	Key         *string  `json:"key,omitempty"`
	KeyBase64   *string  `json:"key_base64,omitempty"`
	Value       *string  `json:"value,omitempty"`
	ValueBase64 *string  `json:"value_base64,omitempty"`
	Tags        []string `json:"tags,omitempty"`
}

const txnPutFields = "collection, key, key_base64, value, value_base64, tags"

// TxnGetRequestJSON is the body of POST /v1/txn/{id}/get: the key, and
// for_update to take its lock exclusively with the read (the read of a
// read-modify-write; kv.TxnBackend.TxnGetForUpdate).
type TxnGetRequestJSON struct {
	KeyRefJSON
	ForUpdate bool `json:"for_update"`
}

const txnGetFields = keyRefFields + ", for_update"

// TxnBatchGetResponseJSON answers POST /v1/txn/{id}/batch_get: the keys
// in request order, each as an item of POST /v1/batch/get answers it
// (version 0 for a key the transaction wrote).
type TxnBatchGetResponseJSON struct {
	Items []BatchGetItemJSON `json:"items"`
}

// TxnGetResponseJSON answers POST /v1/txn/{id}/get: found, and for a found
// record its value (or value_base64), version and tags ([] for none). An
// absent key is {"found": false} and nothing else.
type TxnGetResponseJSON struct {
	Found bool `json:"found"`
	ValueJSON
	Version *uint64   `json:"version,omitempty"`
	Tags    *[]string `json:"tags,omitempty"`
}

// ToTxnGetResponseJSON returns the answer of a get on the wire.
func ToTxnGetResponseJSON(rec kv.Record, found bool) TxnGetResponseJSON {
	if !found {
		return TxnGetResponseJSON{}
	}
	tags := TagsJSON(rec.Tags)
	version := rec.Version
	return TxnGetResponseJSON{Found: true, ValueJSON: ToValueJSON(rec.Value), Version: &version, Tags: &tags}
}

// TxnScanRequestJSON is the body of POST /v1/txn/{id}/scan: the parameters
// of a plain scan but version, which is the transaction's to choose.
type TxnScanRequestJSON struct {
	Collection  string  `json:"collection"`
	Start       *string `json:"start,omitempty"`
	StartBase64 *string `json:"start_base64,omitempty"`
	End         *string `json:"end,omitempty"`
	EndBase64   *string `json:"end_base64,omitempty"`
	Limit       int     `json:"limit,omitempty"`
	Reverse     bool    `json:"reverse,omitempty"`
	Page        string  `json:"page,omitempty"`
}

const txnScanFields = "collection, start, start_base64, end, end_base64, limit, reverse, page"

// TxnTagQueryRequestJSON is the body of POST /v1/txn/{id}/tags: all or any
// (exactly one, a non-empty list of tags), limit and page.
type TxnTagQueryRequestJSON struct {
	Collection string   `json:"collection"`
	All        []string `json:"all,omitempty"`
	Any        []string `json:"any,omitempty"`
	Limit      int      `json:"limit,omitempty"`
	Page       string   `json:"page,omitempty"`
}

const txnTagsFields = "collection, all, any, limit, page"

// TxnCommitResponseJSON answers POST /v1/txn/{id}/commit.
type TxnCommitResponseJSON struct {
	Committed bool   `json:"committed"`
	Version   uint64 `json:"version"`
}

// CompareJSON is a condition of a one-shot transaction: the key's version
// is version (0: the key is absent), or its value is value (value_base64).
// Exactly one of the two kinds is given.
type CompareJSON struct {
	Collection  string  `json:"collection"`
	Key         *string `json:"key,omitempty"`
	KeyBase64   *string `json:"key_base64,omitempty"`
	Version     *uint64 `json:"version,omitempty"`
	Value       *string `json:"value,omitempty"`
	ValueBase64 *string `json:"value_base64,omitempty"`
}

const compareFields = "collection, key, key_base64, version, value, value_base64"

// TxnOpJSON is an operation of a one-shot transaction: op is "get", "put"
// or "delete"; a put has a value (or value_base64) and tags, the others
// neither.
type TxnOpJSON struct {
	Op          string   `json:"op"`
	Collection  string   `json:"collection"`
	Key         *string  `json:"key,omitempty"`
	KeyBase64   *string  `json:"key_base64,omitempty"`
	Value       *string  `json:"value,omitempty"`
	ValueBase64 *string  `json:"value_base64,omitempty"`
	Tags        []string `json:"tags,omitempty"`
}

const txnOpFields = "op, collection, key, key_base64, value, value_base64, tags"

// ExecRequestJSON is the body of POST /v1/txn/exec.
type ExecRequestJSON struct {
	If   []CompareJSON `json:"if"`
	Then []TxnOpJSON   `json:"then"`
	Else []TxnOpJSON   `json:"else"`
}

const execFields = "if, then, else"

// TxnOpResultJSON is the outcome of one operation of a one-shot
// transaction: {"version": N} for a put or a delete; for a get
// {"found": true, "value", "version"} with "tags" when the record has
// some, or {"found": false}.
type TxnOpResultJSON struct {
	Found *bool `json:"found,omitempty"`
	ValueJSON
	Version *uint64   `json:"version,omitempty"`
	Tags    *[]string `json:"tags,omitempty"`
}

// ExecResponseJSON answers POST /v1/txn/exec: whether the conditions held,
// the commit version, and the results of the branch that ran, in its
// order.
type ExecResponseJSON struct {
	Succeeded bool              `json:"succeeded"`
	Version   uint64            `json:"version"`
	Results   []TxnOpResultJSON `json:"results"`
}

// ExecRequestFromJSON validates req. Its errors are *kv.Error with code
// invalid_argument or too_large, their messages naming the element, as
// "then[2]".
func ExecRequestFromJSON(req ExecRequestJSON, maxValueSize int) (kv.ExecRequest, error) {
	out := kv.ExecRequest{If: make([]kv.Compare, len(req.If))}
	n := 0
	for i, c := range req.If {
		cmp, err := compareFromJSON(c)
		if err != nil {
			return kv.ExecRequest{}, at(fmt.Sprintf("if[%d]", i), err)
		}
		out.If[i] = cmp
		n += len(cmp.Key) + len(cmp.Value)
	}
	var err error
	var m int
	if out.Then, m, err = txnOpsFromJSON("then", req.Then, maxValueSize); err != nil {
		return kv.ExecRequest{}, err
	}
	n += m
	if out.Else, m, err = txnOpsFromJSON("else", req.Else, maxValueSize); err != nil {
		return kv.ExecRequest{}, err
	}
	n += m
	if len(out.Then) == 0 && len(out.Else) == 0 {
		return kv.ExecRequest{}, kv.Errorf(kv.CodeInvalidArgument,
			`no operations: give "then" (run when every condition of "if" holds) and/or "else" (run otherwise), at least one operation`)
	}
	return out, checkRequestBytes(n)
}

func compareFromJSON(c CompareJSON) (kv.Compare, error) {
	ref, err := KeyRefJSON{Collection: c.Collection, Key: c.Key, KeyBase64: c.KeyBase64}.toKeyRef()
	if err != nil {
		return kv.Compare{}, err
	}
	value, hasValue, err := BytesFromJSON("value", c.Value, c.ValueBase64)
	if err != nil {
		return kv.Compare{}, err
	}
	switch {
	case hasValue && c.Version != nil:
		return kv.Compare{}, kv.Errorf(kv.CodeInvalidArgument, "give version or value (value_base64), not both: a condition compares one of them")
	case !hasValue && c.Version == nil:
		return kv.Compare{}, kv.Errorf(kv.CodeInvalidArgument,
			"no condition: give version (the key's current version; 0: the key is absent) or value (value_base64)")
	}
	cmp := kv.Compare{Collection: ref.Collection, Key: ref.Key, HasValue: hasValue, Value: value}
	if c.Version != nil {
		cmp.Version = *c.Version
	}
	return cmp, nil
}

// txnOpsFromJSON validates the operations of branch name and answers them
// with the bytes of their keys and values.
func txnOpsFromJSON(name string, ops []TxnOpJSON, maxValueSize int) ([]kv.TxnOp, int, error) {
	if len(ops) == 0 {
		return nil, 0, nil
	}
	out := make([]kv.TxnOp, len(ops))
	n := 0
	for i, o := range ops {
		op, err := txnOpFromJSON(o, maxValueSize)
		if err != nil {
			return nil, 0, at(fmt.Sprintf("%s[%d]", name, i), err)
		}
		out[i] = op
		n += len(op.Key) + len(op.Value)
	}
	return out, n, nil
}

func txnOpFromJSON(o TxnOpJSON, maxValueSize int) (kv.TxnOp, error) {
	switch o.Op {
	case kv.TxnOpGet, kv.TxnOpPut, kv.TxnOpDelete:
	case "":
		return kv.TxnOp{}, kv.Errorf(kv.CodeInvalidArgument, `no op: give "op": "get", "put" or "delete"`)
	default:
		return kv.TxnOp{}, kv.Errorf(kv.CodeInvalidArgument, `op %q is not known: use "get", "put" or "delete"`, clip(o.Op))
	}
	ref, err := KeyRefJSON{Collection: o.Collection, Key: o.Key, KeyBase64: o.KeyBase64}.toKeyRef()
	if err != nil {
		return kv.TxnOp{}, err
	}
	value, given, err := BytesFromJSON("value", o.Value, o.ValueBase64)
	if err != nil {
		return kv.TxnOp{}, err
	}
	op := kv.TxnOp{Op: o.Op, Collection: ref.Collection, Key: ref.Key}
	if o.Op != kv.TxnOpPut {
		if given || o.Tags != nil {
			return kv.TxnOp{}, kv.Errorf(kv.CodeInvalidArgument, "a %s takes no value and no tags: only a put does", o.Op)
		}
		return op, nil
	}
	if !given {
		return kv.TxnOp{}, kv.Errorf(kv.CodeInvalidArgument, `no value: give value, or value_base64 for a value that is not UTF-8 ("" for an empty value)`)
	}
	if len(value) > maxValueSize {
		return kv.TxnOp{}, kv.Errorf(kv.CodeTooLarge, "value is %d bytes, the limit is %d", len(value), maxValueSize)
	}
	if err := kv.ValidateTags(o.Tags); err != nil {
		return kv.TxnOp{}, err
	}
	op.Value, op.Tags = value, o.Tags
	return op, nil
}

// ToExecRequestJSON returns req on the wire, for a client.
func ToExecRequestJSON(req kv.ExecRequest) ExecRequestJSON {
	out := ExecRequestJSON{If: make([]CompareJSON, len(req.If))}
	for i, c := range req.If {
		k := ToKeyJSON(c.Key)
		cj := CompareJSON{Collection: c.Collection, Key: k.Key, KeyBase64: k.KeyBase64}
		if c.HasValue {
			v := ToValueJSON(c.Value)
			cj.Value, cj.ValueBase64 = v.Value, v.ValueBase64
		} else {
			version := c.Version
			cj.Version = &version
		}
		out.If[i] = cj
	}
	out.Then = toTxnOpsJSON(req.Then)
	out.Else = toTxnOpsJSON(req.Else)
	return out
}

func toTxnOpsJSON(ops []kv.TxnOp) []TxnOpJSON {
	if len(ops) == 0 {
		return nil
	}
	out := make([]TxnOpJSON, len(ops))
	for i, o := range ops {
		k := ToKeyJSON(o.Key)
		oj := TxnOpJSON{Op: o.Op, Collection: o.Collection, Key: k.Key, KeyBase64: k.KeyBase64}
		if o.Op == kv.TxnOpPut {
			v := ToValueJSON(o.Value)
			oj.Value, oj.ValueBase64, oj.Tags = v.Value, v.ValueBase64, o.Tags
		}
		out[i] = oj
	}
	return out
}

// ToExecResponseJSON returns res, the outcome of req, on the wire: each
// result is rendered as the operation of the same place in the branch that
// ran (res.Succeeded: Then, else Else) asks. A result with no operation in
// that place (which a correct backend never answers) is rendered in full.
func ToExecResponseJSON(req kv.ExecRequest, res kv.ExecResult) ExecResponseJSON {
	branch := req.Else
	if res.Succeeded {
		branch = req.Then
	}
	out := ExecResponseJSON{Succeeded: res.Succeeded, Version: res.Version, Results: make([]TxnOpResultJSON, len(res.Results))}
	for i, r := range res.Results {
		op := ""
		if i < len(branch) {
			op = branch[i].Op
		}
		version := r.Version
		var rj TxnOpResultJSON
		switch {
		case op == kv.TxnOpPut || op == kv.TxnOpDelete:
			rj.Version = &version
		case op == kv.TxnOpGet && !r.Found:
			rj.Found = new(bool)
		default:
			found := r.Found
			rj = TxnOpResultJSON{Found: &found, ValueJSON: ToValueJSON(r.Value), Version: &version}
			if len(r.Tags) > 0 {
				tags := r.Tags
				rj.Tags = &tags
			}
		}
		out.Results[i] = rj
	}
	return out
}

// ExecResultFromJSON returns the outcome a server answered, for a client.
func ExecResultFromJSON(resp ExecResponseJSON) (kv.ExecResult, error) {
	out := kv.ExecResult{Succeeded: resp.Succeeded, Version: resp.Version, Results: make([]kv.TxnOpResult, len(resp.Results))}
	for i, r := range resp.Results {
		value, _, err := BytesFromJSON("value", r.Value, r.ValueBase64)
		if err != nil {
			return kv.ExecResult{}, at(fmt.Sprintf("results[%d]", i), err)
		}
		res := kv.TxnOpResult{Found: r.Found != nil && *r.Found, Value: value}
		if r.Version != nil {
			res.Version = *r.Version
		}
		if r.Tags != nil {
			res.Tags = *r.Tags
		}
		out.Results[i] = res
	}
	return out, nil
}

// TxnGetFromJSON returns the record a get answered, for a client; the key
// is not in the answer and is left nil.
func TxnGetFromJSON(resp TxnGetResponseJSON) (rec kv.Record, found bool, err error) {
	if !resp.Found {
		return kv.Record{}, false, nil
	}
	value, _, err := BytesFromJSON("value", resp.Value, resp.ValueBase64)
	if err != nil {
		return kv.Record{}, false, err
	}
	rec = kv.Record{Value: value}
	if resp.Version != nil {
		rec.Version = *resp.Version
	}
	if resp.Tags != nil {
		rec.Tags = *resp.Tags
	}
	return rec, true, nil
}

// ScanPageJSON is a kv.ScanResult as a client reads it: the answer of a
// scan or a tag query, plain or in a transaction.
type ScanPageJSON struct {
	Items    []RecordJSON `json:"items"`
	NextPage string       `json:"next_page"`
	Version  uint64       `json:"version"`
}

// ScanResultFromJSON returns the page a server answered, for a client.
func ScanResultFromJSON(p ScanPageJSON) (kv.ScanResult, error) {
	res := kv.ScanResult{Items: make([]kv.Record, len(p.Items)), NextPage: p.NextPage, Version: p.Version}
	for i, r := range p.Items {
		key, _, err := BytesFromJSON("key", r.Key, r.KeyBase64)
		if err != nil {
			return kv.ScanResult{}, at(fmt.Sprintf("items[%d]", i), err)
		}
		value, _, err := BytesFromJSON("value", r.Value, r.ValueBase64)
		if err != nil {
			return kv.ScanResult{}, at(fmt.Sprintf("items[%d]", i), err)
		}
		res.Items[i] = kv.Record{Key: key, Value: value, Tags: r.Tags, Version: r.Version}
	}
	return res, nil
}
