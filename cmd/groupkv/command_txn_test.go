package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/spf13/cobra"

	groupkv "github.com/groupkv/groupkv"
	"github.com/groupkv/groupkv/internal/kv"
)

// execFake is a kv.Backend (whose plain methods panic: the embedded
// interface is nil) with the one-shot transaction of kv.TxnBackend: it
// records the request and answers res or err. The session methods answer
// unimplemented.
type execFake struct {
	kv.Backend

	mu   sync.Mutex
	reqs []kv.ExecRequest
	res  kv.ExecResult
	err  error
}

var _ kv.TxnBackend = (*execFake)(nil)

func (f *execFake) ExecTxn(_ context.Context, req kv.ExecRequest) (kv.ExecResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reqs = append(f.reqs, req)
	return f.res, f.err
}

func errSession() error { return kv.Errorf(kv.CodeUnimplemented, "not in this fake") }

// ListCollections answers as a server without collections: a dialed
// client's shard map, which its group transactions consult, stays empty.
func (f *execFake) ListCollections(context.Context) ([]kv.CollectionInfo, error) { return nil, nil }

func (f *execFake) BeginTxn(context.Context, kv.TxnOptions) (string, error) { return "", errSession() }
func (f *execFake) TxnGet(context.Context, string, kv.KeyRef) (kv.Record, bool, error) {
	return kv.Record{}, false, errSession()
}
func (f *execFake) TxnGetForUpdate(context.Context, string, kv.KeyRef) (kv.Record, bool, error) {
	return kv.Record{}, false, errSession()
}
func (f *execFake) TxnBatchGet(context.Context, string, []kv.KeyRef, bool) ([]kv.BatchGetItem, error) {
	return nil, errSession()
}
func (f *execFake) TxnPut(context.Context, string, kv.PutItem) error   { return errSession() }
func (f *execFake) TxnDelete(context.Context, string, kv.KeyRef) error { return errSession() }
func (f *execFake) TxnScan(context.Context, string, kv.ScanRequest) (kv.ScanResult, error) {
	return kv.ScanResult{}, errSession()
}
func (f *execFake) TxnGetByTags(context.Context, string, kv.TagQuery) (kv.ScanResult, error) {
	return kv.ScanResult{}, errSession()
}
func (f *execFake) CommitTxn(context.Context, string) (uint64, error) { return 0, errSession() }
func (f *execFake) AbortTxn(context.Context, string) error            { return nil }

// runTxnCLI runs "groupkv txn args" with stdin against the API served over
// f by a test server (serveAPI), dialing it for real with --addr.
func runTxnCLI(t *testing.T, f *execFake, stdin string, args ...string) (stdout string, err error) {
	t.Helper()
	addr := serveAPI(t, f)
	root := &cobra.Command{Use: "groupkv", SilenceUsage: true, SilenceErrors: true}
	root.AddCommand(txnCommand())
	var out, errOut bytes.Buffer
	root.SetArgs(append([]string{"txn", "--addr", addr}, args...))
	root.SetIn(strings.NewReader(stdin))
	root.SetOut(&out)
	root.SetErr(&errOut)
	err = root.ExecuteContext(context.Background())
	return out.String(), err
}

// txnInput is the one-shot transaction of the API's documentation.
const txnInput = `{"if": [{"collection": "c", "key": "a", "version": 7}, {"collection": "c", "key": "b", "version": 0}, {"collection": "c", "key": "d", "value": "x"}],
  "then": [{"op": "put", "collection": "c", "key": "a", "value": "1", "tags": ["t"]}, {"op": "delete", "collection": "c", "key": "d"}, {"op": "get", "collection": "c", "key": "e"}],
  "else": [{"op": "get", "collection": "c", "key": "a"}]}`

var txnWant = kv.ExecRequest{
	If: []kv.Compare{
		{Collection: "c", Key: []byte("a"), Version: 7},
		{Collection: "c", Key: []byte("b"), Version: 0},
		{Collection: "c", Key: []byte("d"), HasValue: true, Value: []byte("x")},
	},
	Then: []kv.TxnOp{
		{Op: kv.TxnOpPut, Collection: "c", Key: []byte("a"), Value: []byte("1"), Tags: []string{"t"}},
		{Op: kv.TxnOpDelete, Collection: "c", Key: []byte("d")},
		{Op: kv.TxnOpGet, Collection: "c", Key: []byte("e")},
	},
	Else: []kv.TxnOp{{Op: kv.TxnOpGet, Collection: "c", Key: []byte("a")}},
}

func TestTxnCommand(t *testing.T) {
	f := &execFake{res: kv.ExecResult{Succeeded: true, Version: 42, Results: []kv.TxnOpResult{
		{Version: 42}, {Version: 42}, {Found: true, Value: []byte("..."), Version: 40},
	}}}
	out, err := runTxnCLI(t, f, txnInput)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{
  "succeeded": true,
  "version": 42,
  "results": [
    {
      "version": 42
    },
    {
      "version": 42
    },
    {
      "found": true,
      "value": "...",
      "version": 40
    }
  ]
}
`
	if out != want {
		t.Fatalf("printed\n%s\nwant\n%s", out, want)
	}
	if len(f.reqs) != 1 || !reflect.DeepEqual(f.reqs[0], txnWant) {
		t.Fatalf("the server got\n %#v\nwant %#v", f.reqs, txnWant)
	}

	// From a file; the else branch ran; base64 both ways.
	f.reqs = nil
	f.res = kv.ExecResult{Succeeded: false, Version: 41, Results: []kv.TxnOpResult{{Found: true, Value: []byte{0xff}, Version: 3}}}
	path := filepath.Join(t.TempDir(), "txn.json")
	in := `{"if": [{"collection": "c", "key_base64": "/w==", "value_base64": "AA=="}],
		"then": [{"op": "delete", "collection": "c", "key": "a"}], "else": [{"op": "get", "collection": "c", "key": "a"}]}`
	if err := os.WriteFile(path, []byte(in), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err = runTxnCLI(t, f, "", "--file", path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, `"succeeded": false`) || !strings.Contains(out, `"value_base64": "/w=="`) {
		t.Fatalf("printed %s", out)
	}
	wantReq := kv.ExecRequest{
		If:   []kv.Compare{{Collection: "c", Key: []byte{0xff}, HasValue: true, Value: []byte{0}}},
		Then: []kv.TxnOp{{Op: kv.TxnOpDelete, Collection: "c", Key: []byte("a")}},
		Else: []kv.TxnOp{{Op: kv.TxnOpGet, Collection: "c", Key: []byte("a")}},
	}
	if len(f.reqs) != 1 || !reflect.DeepEqual(f.reqs[0], wantReq) {
		t.Fatalf("the server got\n %#v\nwant %#v", f.reqs, wantReq)
	}
}

func TestTxnCommandErrors(t *testing.T) {
	f := &execFake{}
	for _, tc := range []struct{ in, words string }{
		{``, "empty"},
		{`{"then": [{"op": "increment", "collection": "c", "key": "a"}]}`, `then[0]: op "increment"`},
		{`{"if": [{"collection": "c", "key": "a"}], "then": [{"op": "get", "collection": "c", "key": "a"}]}`, "if[0]: no condition"},
		{`{"if": [{"collection": "c", "key": "a", "version": 1, "value": "x"}], "then": [{"op": "get", "collection": "c", "key": "a"}]}`, "not both"},
		{`{"then": [], "otherwise": []}`, "unknown field"},
		{`{"then": [{"op": "get", "collection": "c", "key": "a"}]} {}`, "more than one"},
	} {
		_, err := runTxnCLI(t, f, tc.in)
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.words) {
			t.Errorf("input %s: error %v, want a usage error mentioning %q", tc.in, err, tc.words)
		}
	}
	if _, err := runTxnCLI(t, f, "", "--file", filepath.Join(t.TempDir(), "absent.json")); err == nil {
		t.Error("an absent file was read")
	}
	if len(f.reqs) != 0 {
		t.Fatalf("bad input reached the server: %+v", f.reqs)
	}

	// The server's error comes back with its code.
	f.err = kv.Errorf(kv.CodeCommitUnknown, "the coordinator lost its lease")
	_, err := runTxnCLI(t, f, txnInput)
	var e *groupkv.Error
	if !errors.As(err, &e) || e.Code != kv.CodeCommitUnknown || !strings.Contains(e.Message, "lease") {
		t.Fatalf("error %v, want the server's commit_unknown", err)
	}
}
