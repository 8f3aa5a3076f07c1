package main

import (
	"bytes"
	"context"
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/spf13/cobra"

	groupkv "github.com/groupkv/groupkv"
	"github.com/groupkv/groupkv/internal/kv"
)

// groupCLIFake is execFake with the Key Groups of kv.GroupBackend: it
// records what it was asked and answers what the test set up, or err.
type groupCLIFake struct {
	execFake

	mu      sync.Mutex
	calls   []groupCLICall
	created kv.GroupCreated
	info    kv.GroupInfo
	infos   []kv.GroupInfo
	execRes kv.ExecResult
	err     error
}

// groupCLICall is a call of a kv.GroupBackend method: its name, the group
// it named ("" for CreateGroup and ListGroups) and its argument.
type groupCLICall struct {
	method, id string
	arg        any
}

var _ kv.GroupBackend = (*groupCLIFake)(nil)

func (f *groupCLIFake) record(method, id string, arg any) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, groupCLICall{method, id, arg})
	return f.err
}

func (f *groupCLIFake) CreateGroup(_ context.Context, spec kv.GroupSpec) (kv.GroupCreated, error) {
	return f.created, f.record("CreateGroup", "", spec)
}

func (f *groupCLIFake) DescribeGroup(_ context.Context, id string) (kv.GroupInfo, error) {
	return f.info, f.record("DescribeGroup", id, nil)
}

func (f *groupCLIFake) ListGroups(context.Context) ([]kv.GroupInfo, error) {
	return f.infos, f.record("ListGroups", "", nil)
}

func (f *groupCLIFake) DeleteGroup(_ context.Context, id string) error {
	return f.record("DeleteGroup", id, nil)
}

func (f *groupCLIFake) BeginGroupTxn(context.Context, string, kv.TxnOptions) (string, error) {
	return "", errSession()
}

func (f *groupCLIFake) ExecGroupTxn(_ context.Context, id string, req kv.ExecRequest) (kv.ExecResult, error) {
	return f.execRes, f.record("ExecGroupTxn", id, req)
}

// runGroupCLI runs "groupkv group op args" with stdin against the API
// served over f by a test server (serveAPI), dialing it for real with
// --addr.
func runGroupCLI(t *testing.T, f *groupCLIFake, stdin, op string, args ...string) (stdout string, err error) {
	t.Helper()
	addr := serveAPI(t, f)
	root := &cobra.Command{Use: "groupkv", SilenceUsage: true, SilenceErrors: true}
	root.AddCommand(groupCommand())
	var out, errOut bytes.Buffer
	argv := []string{"group"}
	if op != "" {
		argv = append(argv, op, "--addr", addr)
	}
	root.SetArgs(append(argv, args...))
	root.SetIn(strings.NewReader(stdin))
	root.SetOut(&out)
	root.SetErr(&errOut)
	err = root.ExecuteContext(context.Background())
	return out.String(), err
}

// lastGroupCall fails unless the last call of f is want.
func lastGroupCall(t *testing.T, f *groupCLIFake, want groupCLICall) {
	t.Helper()
	if len(f.calls) == 0 || !reflect.DeepEqual(f.calls[len(f.calls)-1], want) {
		t.Fatalf("the server got %#v, want last %#v", f.calls, want)
	}
}

func cliRef(coll, key string) kv.KeyRef { return kv.KeyRef{Collection: coll, Key: []byte(key)} }

func TestGroupCommandCreate(t *testing.T) {
	f := &groupCLIFake{created: kv.GroupCreated{ID: "match-17",
		Joined:  []kv.KeyRef{cliRef("matches", "17"), cliRef("players", "ada")},
		Refused: []kv.GroupRefusal{{KeyRef: cliRef("players", "b/o,b"), Reason: "locked"}}}}
	out, err := runGroupCLI(t, f, "", "create", "match-17", "--leader", "matches/17",
		"--member", "players/ada", "--member", "players/b/o,b", "--mode", "best_effort")
	if err != nil {
		t.Fatal(err)
	}
	const want = `{
  "id": "match-17",
  "joined": [
    {
      "collection": "matches",
      "key": "17"
    },
    {
      "collection": "players",
      "key": "ada"
    }
  ],
  "refused": [
    {
      "collection": "players",
      "key": "b/o,b",
      "reason": "locked"
    }
  ]
}
`
	if out != want {
		t.Fatalf("printed\n%s\nwant\n%s", out, want)
	}
	lastGroupCall(t, f, groupCLICall{"CreateGroup", "", kv.GroupSpec{ID: "match-17", Leader: cliRef("matches", "17"),
		Members: []kv.KeyRef{cliRef("players", "ada"), cliRef("players", "b/o,b")}, Mode: kv.GroupBestEffort}})

	// Atomic by default; no members but the leader.
	if _, err := runGroupCLI(t, f, "", "create", "solo", "--leader", "c/k"); err != nil {
		t.Fatal(err)
	}
	lastGroupCall(t, f, groupCLICall{"CreateGroup", "", kv.GroupSpec{ID: "solo", Leader: cliRef("c", "k"), Members: []kv.KeyRef{}, Mode: kv.GroupAtomic}})

	n := len(f.calls)
	for _, tc := range []struct {
		args  []string
		words string
	}{
		{[]string{}, "takes 1 arguments"},
		{[]string{"g1", "g2", "--leader", "c/k"}, "takes 1 arguments"},
		{[]string{"g1"}, "no leader"},
		{[]string{"", "--leader", "c/k"}, "group id"},
		{[]string{"g1", "--leader", "ck"}, `--leader "ck" is not COLLECTION/KEY`},
		{[]string{"g1", "--leader", "c/"}, "is not COLLECTION/KEY"},
		{[]string{"g1", "--leader", "C/k"}, "collection name"},
		{[]string{"g1", "--leader", "c/k", "--member", "x"}, `--member "x"`},
		{[]string{"g1", "--leader", "c/k", "--mode", "all"}, `--mode "all" is not known`},
		{[]string{"g1", "--leader", "c/k", "--atomic"}, "unknown flag"},
	} {
		_, err := runGroupCLI(t, f, "", "create", tc.args...)
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.words) {
			t.Errorf("create %q: error %v, want a usage error mentioning %q", tc.args, err, tc.words)
		}
	}
	if len(f.calls) != n {
		t.Fatalf("bad input reached the server: %+v", f.calls[n:])
	}

	// The server's error comes back with its code.
	f.err = kv.Errorf(kv.CodeGroupRefused, `key "ada" of collection "players": in_group`)
	_, err = runGroupCLI(t, f, "", "create", "g1", "--leader", "c/k", "--member", "players/ada")
	var e *groupkv.Error
	if !errors.As(err, &e) || e.Code != kv.CodeGroupRefused || !strings.Contains(e.Message, "in_group") {
		t.Fatalf("error %v, want the server's group_refused", err)
	}
}

func TestGroupCommandDescribeListDelete(t *testing.T) {
	f := &groupCLIFake{info: kv.GroupInfo{ID: "g/1", Leader: cliRef("c", "k0"), Members: []kv.KeyRef{cliRef("c", "k0"), cliRef("c", "k1")},
		Mode: kv.GroupAtomic, LeaderNode: 2, State: kv.GroupActive, ShipperLag: 5}}
	out, err := runGroupCLI(t, f, "", "describe", "g/1")
	if err != nil {
		t.Fatal(err)
	}
	const want = `{
  "id": "g/1",
  "leader": {
    "collection": "c",
    "key": "k0"
  },
  "members": [
    {
      "collection": "c",
      "key": "k0"
    },
    {
      "collection": "c",
      "key": "k1"
    }
  ],
  "mode": "atomic",
  "leader_node": 2,
  "state": "active",
  "shipper_lag": 5
}
`
	if out != want {
		t.Fatalf("printed\n%s\nwant\n%s", out, want)
	}
	lastGroupCall(t, f, groupCLICall{"DescribeGroup", "g/1", nil})

	out, err = runGroupCLI(t, f, "", "list")
	if err != nil || out != "{\n  \"groups\": []\n}\n" {
		t.Fatalf("list printed %q, %v", out, err)
	}
	f.infos = []kv.GroupInfo{f.info}
	out, err = runGroupCLI(t, f, "", "list")
	if err != nil || !strings.HasPrefix(out, "{\n  \"groups\": [\n    {\n      \"id\": \"g/1\",") || !strings.Contains(out, `"shipper_lag": 5`) {
		t.Fatalf("list printed %s, %v", out, err)
	}

	out, err = runGroupCLI(t, f, "", "delete", "g/1")
	if err != nil || out != "deleted group g/1\n" {
		t.Fatalf("delete printed %q, %v", out, err)
	}
	lastGroupCall(t, f, groupCLICall{"DeleteGroup", "g/1", nil})

	n := len(f.calls)
	for _, args := range [][]string{{"describe"}, {"delete"}, {"list", "x"}, {"delete", "a", "b"}} {
		_, err := runGroupCLI(t, f, "", args[0], args[1:]...)
		var ue usageError
		if !errors.As(err, &ue) {
			t.Errorf("%q: error %v, want a usage error", args, err)
		}
	}
	for _, op := range []string{"", "nope"} {
		var args []string
		if op != "" {
			args = []string{op}
		}
		_, err := runGroupCLI(t, f, "", "", args...)
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), "create, describe, list, delete or txn") {
			t.Errorf("group %q: error %v, want a usage error naming the operations", op, err)
		}
	}
	if len(f.calls) != n {
		t.Fatalf("bad input reached the server: %+v", f.calls[n:])
	}

	f.err = kv.Errorf(kv.CodeNotFound, "no group g9")
	_, err = runGroupCLI(t, f, "", "describe", "g9")
	var e *groupkv.Error
	if !errors.As(err, &e) || e.Code != kv.CodeNotFound {
		t.Fatalf("error %v, want the server's not_found", err)
	}
}

func TestGroupCommandTxn(t *testing.T) {
	f := &groupCLIFake{execRes: kv.ExecResult{Succeeded: false, Version: 41, Results: []kv.TxnOpResult{{Found: false}}}}
	out, err := runGroupCLI(t, f, txnInput, "txn", "match 17")
	if err != nil {
		t.Fatal(err)
	}
	const want = `{
  "succeeded": false,
  "version": 41,
  "results": [
    {
      "found": false
    }
  ]
}
`
	if out != want {
		t.Fatalf("printed\n%s\nwant\n%s", out, want)
	}
	lastGroupCall(t, f, groupCLICall{"ExecGroupTxn", "match 17", txnWant})
	if len(f.execFake.reqs) != 0 {
		t.Fatalf("a group transaction ran as a general one: %+v", f.execFake.reqs)
	}

	n := len(f.calls)
	for _, tc := range []struct{ in, words string }{
		{``, "empty"},
		{`{"then": [{"op": "increment", "collection": "c", "key": "a"}]}`, `then[0]: op "increment"`},
	} {
		_, err := runGroupCLI(t, f, tc.in, "txn", "g1")
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.words) {
			t.Errorf("input %s: error %v, want a usage error mentioning %q", tc.in, err, tc.words)
		}
	}
	if _, err := runGroupCLI(t, f, txnInput, "txn"); err == nil {
		t.Error("a transaction without a group ran")
	}
	if len(f.calls) != n {
		t.Fatalf("bad input reached the server: %+v", f.calls[n:])
	}

	f.err = kv.Errorf(kv.CodeInvalidArgument, `key "a" of collection "c" is not a member of group g1`)
	_, err = runGroupCLI(t, f, txnInput, "txn", "g1")
	var e *groupkv.Error
	if !errors.As(err, &e) || e.Code != kv.CodeInvalidArgument || !strings.Contains(e.Message, "not a member") {
		t.Fatalf("error %v, want the server's invalid_argument", err)
	}
}
