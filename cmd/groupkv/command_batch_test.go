package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/spf13/cobra"

	groupkv "github.com/groupkv/groupkv"
)

// These tests run the multi-record commands in process against cliFake, an
// in-memory DB that records what it was asked and answers what the test
// set up: they check argument and flag parsing, JSON input decoding and
// the output, not a server (the end-to-end tests do that).

// cliFake is a groupkv.DB for the command tests. The methods it does not
// override panic (the embedded DB is nil).
type cliFake struct {
	groupkv.DB

	mu       sync.Mutex
	calls    []any                         // the requests, in order
	pages    map[string]groupkv.ScanResult // Scan and GetByTags answers by page token
	getRes   groupkv.BatchGetResult
	writeRes []groupkv.WriteResult
	err      error // answered by every call when set
	deleted  int
	events   []groupkv.Event
	// afterEvents runs once the events were sent, before Watch waits for
	// its context.
	afterEvents func()
}

func (f *cliFake) record(req any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, req)
}

func (f *cliFake) Scan(_ context.Context, req groupkv.ScanRequest) (groupkv.ScanResult, error) {
	f.record(req)
	return f.pages[req.Page], f.err
}

func (f *cliFake) GetByTags(_ context.Context, q groupkv.TagQuery) (groupkv.ScanResult, error) {
	f.record(q)
	return f.pages[q.Page], f.err
}

func (f *cliFake) BatchGet(_ context.Context, keys []groupkv.KeyRef) (groupkv.BatchGetResult, error) {
	f.record(keys)
	return f.getRes, f.err
}

func (f *cliFake) BatchPut(_ context.Context, items []groupkv.PutItem) ([]groupkv.WriteResult, error) {
	f.record(items)
	return f.writeRes, f.err
}

func (f *cliFake) BatchDelete(_ context.Context, keys []groupkv.KeyRef) ([]groupkv.WriteResult, error) {
	f.record(keys)
	return f.writeRes, f.err
}

func (f *cliFake) DeleteRange(_ context.Context, req groupkv.DeleteRangeRequest) (groupkv.DeleteRangeResult, error) {
	f.record(req)
	return groupkv.DeleteRangeResult{Deleted: f.deleted}, f.err
}

func (f *cliFake) Watch(ctx context.Context, req groupkv.WatchRequest, fn func(groupkv.Event) error) error {
	f.record(req)
	if f.err != nil {
		return f.err
	}
	for _, ev := range f.events {
		if err := fn(ev); err != nil {
			return err
		}
	}
	if f.afterEvents != nil {
		f.afterEvents()
	}
	<-ctx.Done()
	return ctx.Err()
}

func (f *cliFake) Close() error { return nil }

// runCLI runs the groupkv command line args against f, with stdin as
// standard input, and answers what it printed and its error.
func runCLI(t *testing.T, ctx context.Context, f *cliFake, stdin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	old := dialDB
	dialDB = func(cmd *cobra.Command) (groupkv.DB, error) {
		if addr, _ := cmd.Flags().GetString("addr"); addr != defaultAddr && addr != "h:1" {
			t.Errorf("--addr = %q", addr)
		}
		return f, nil
	}
	defer func() { dialDB = old }()
	root := &cobra.Command{Use: "groupkv", SilenceUsage: true, SilenceErrors: true}
	root.AddCommand(scanCommand(), tagsCommand(), watchCommand(), batchCommand(), deleteRangeCommand())
	var out, errOut bytes.Buffer
	root.SetArgs(args)
	root.SetIn(strings.NewReader(stdin))
	root.SetOut(&out)
	root.SetErr(&errOut)
	err = root.ExecuteContext(ctx)
	return out.String(), errOut.String(), err
}

// wantUsage fails the test unless err is a usage error (exit status 2)
// whose message holds want.
func wantUsage(t *testing.T, err error, want string) {
	t.Helper()
	var ue usageError
	if !errors.As(err, &ue) {
		t.Fatalf("error %v (%T) is not a usage error", err, err)
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("usage error %q does not say %q", err, want)
	}
}

// jsonLines decodes every line of s as a JSON object.
func jsonLines(t *testing.T, s string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSuffix(s, "\n"), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("line %q is not a JSON object: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

// asJSON decodes s, one JSON value, into a generic value.
func asJSON(t *testing.T, s string) any {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("%q is not JSON: %v", s, err)
	}
	return v
}

func TestBatchScanTagsWatchDeleteRangeHelp(t *testing.T) {
	for _, args := range [][]string{
		{"scan", "--help"}, {"tags", "--help"}, {"watch", "-h"}, {"batch", "--help"},
		{"batch", "get", "--help"}, {"batch", "put", "--help"}, {"batch", "delete", "--help"},
		{"delete-range", "--help"},
	} {
		out, _, err := runCLI(t, context.Background(), &cliFake{}, "", args...)
		if err != nil || !strings.Contains(out, "Usage:") {
			t.Errorf("%v: %v, output %q", args, err, out)
		}
	}
}

func TestScanCommand(t *testing.T) {
	f := &cliFake{pages: map[string]groupkv.ScanResult{
		"": {Items: []groupkv.Record{
			{Key: []byte("a"), Value: []byte("va"), Tags: []string{"x"}, Version: 5},
			{Key: []byte{0xff, 0}, Value: []byte{0xff, 0xfe}, Version: 6},
			{Key: []byte("c"), Value: nil, Version: 7},
		}, NextPage: "tok2", Version: 9},
		"tok2": {Items: []groupkv.Record{{Key: []byte("d"), Value: []byte("vd"), Version: 8}}, Version: 9},
	}}
	// Flags before and after the collection.
	out, errOut, err := runCLI(t, context.Background(), f, "",
		"scan", "--limit", "3", "users", "--start", "a", "--end", "z", "--reverse", "--version", "9", "--addr", "h:1")
	if err != nil {
		t.Fatal(err)
	}
	wantReq := groupkv.ScanRequest{Collection: "users", Start: []byte("a"), End: []byte("z"), Limit: 3, Reverse: true, Version: 9}
	if !reflect.DeepEqual(f.calls, []any{wantReq}) {
		t.Fatalf("requests %+v, want %+v", f.calls, wantReq)
	}
	want := []map[string]any{
		{"key": "a", "value": "va", "version": 5.0, "tags": []any{"x"}},
		{"key_base64": "/wA=", "value_base64": "//4=", "version": 6.0, "tags": []any{}},
		{"key": "c", "value": "", "version": 7.0, "tags": []any{}},
	}
	if got := jsonLines(t, out); !reflect.DeepEqual(got, want) {
		t.Fatalf("output %v\nwant %v", got, want)
	}
	if errOut != "next page: tok2\n" {
		t.Fatalf("stderr %q", errOut)
	}

	// --page continues; the last page says nothing on stderr.
	f.calls = nil
	out, errOut, err = runCLI(t, context.Background(), f, "", "scan", "users", "--page", "tok2")
	if err != nil || errOut != "" || len(jsonLines(t, out)) != 1 {
		t.Fatalf("scan --page: %v, stdout %q, stderr %q", err, out, errOut)
	}
	if req := f.calls[0].(groupkv.ScanRequest); req.Page != "tok2" || req.Start != nil || req.End != nil {
		t.Fatalf("scan --page request %+v", req)
	}

	// --all follows the pages with the same request.
	f.calls = nil
	out, errOut, err = runCLI(t, context.Background(), f, "", "scan", "users", "--all", "--limit", "3")
	if err != nil || errOut != "" || len(jsonLines(t, out)) != 4 {
		t.Fatalf("scan --all: %v, stdout %q, stderr %q", err, out, errOut)
	}
	want2 := []any{
		groupkv.ScanRequest{Collection: "users", Limit: 3},
		groupkv.ScanRequest{Collection: "users", Limit: 3, Page: "tok2"},
	}
	if !reflect.DeepEqual(f.calls, want2) {
		t.Fatalf("scan --all requests %+v", f.calls)
	}

	// Errors of the server are returned as they are.
	f.err = &groupkv.Error{Code: groupkv.CodeCompacted, Message: "too old"}
	if _, _, err := runCLI(t, context.Background(), f, "", "scan", "users"); !errors.Is(err, groupkv.ErrCompacted) {
		t.Fatalf("scan failing: %v", err)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"scan"}, "takes 1 arguments, got 0"},
		{[]string{"scan", "a", "b"}, "takes 1 arguments, got 2"},
		{[]string{"scan", "users", "--limit", "-1"}, "--limit -1"},
		{[]string{"scan", "users", "--limit", "x"}, "invalid argument"},
		{[]string{"scan", "users", "--version", "-3"}, "invalid argument"},
		{[]string{"scan", "users", "--bogus"}, "unknown flag"},
	} {
		_, _, err := runCLI(t, context.Background(), &cliFake{}, "", tc.args...)
		wantUsage(t, err, tc.want)
	}
}

func TestTagsCommand(t *testing.T) {
	f := &cliFake{pages: map[string]groupkv.ScanResult{
		"":   {Items: []groupkv.Record{{Key: []byte("a"), Value: []byte("1"), Tags: []string{"x", "y"}, Version: 3}}, NextPage: "p", Version: 4},
		"p":  {Items: []groupkv.Record{{Key: []byte("b"), Value: []byte("2"), Tags: []string{"y"}, Version: 4}}, NextPage: "p2", Version: 4},
		"p2": {Version: 4},
	}}
	out, errOut, err := runCLI(t, context.Background(), f, "", "tags", "--all", "x,y", "users", "--limit", "1", "--version", "4")
	if err != nil || errOut != "next page: p\n" {
		t.Fatalf("tags --all: %v, stderr %q", err, errOut)
	}
	if want := (groupkv.TagQuery{Collection: "users", All: []string{"x", "y"}, Limit: 1, Version: 4}); !reflect.DeepEqual(f.calls, []any{want}) {
		t.Fatalf("requests %+v", f.calls)
	}
	if got, want := jsonLines(t, out), []map[string]any{{"key": "a", "value": "1", "version": 3.0, "tags": []any{"x", "y"}}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("output %v", got)
	}

	f.calls = nil
	out, errOut, err = runCLI(t, context.Background(), f, "", "tags", "users", "--any", "y", "--all-pages")
	if err != nil || errOut != "" || len(jsonLines(t, out)) != 2 || len(f.calls) != 3 {
		t.Fatalf("tags --any --all-pages: %v, stdout %q, stderr %q, calls %+v", err, out, errOut, f.calls)
	}
	if q := f.calls[2].(groupkv.TagQuery); q.Page != "p2" || !reflect.DeepEqual(q.Any, []string{"y"}) || q.All != nil {
		t.Fatalf("third query %+v", q)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"tags", "users"}, "exactly one of --all"},
		{[]string{"tags", "users", "--all", "a", "--any", "b"}, "exactly one of --all"},
		{[]string{"tags", "users", "--all", ""}, "--all names no tag"},
		{[]string{"tags", "users", "--any="}, "--any names no tag"},
		{[]string{"tags", "--all", "a"}, "takes 1 arguments, got 0"},
		{[]string{"tags", "users", "--all", "a", "--limit", "-2"}, "--limit -2"},
	} {
		_, _, err := runCLI(t, context.Background(), &cliFake{}, "", tc.args...)
		wantUsage(t, err, tc.want)
	}
}

func TestDeleteRangeCommand(t *testing.T) {
	f := &cliFake{deleted: 42}
	out, _, err := runCLI(t, context.Background(), f, "", "delete-range", "events", "2024-01", "2024-02")
	if err != nil || out != "deleted 42\n" {
		t.Fatalf("delete-range: %v, %q", err, out)
	}
	_, _, err = runCLI(t, context.Background(), f, "", "delete-range", "--addr", "h:1", "events", "")
	if err != nil {
		t.Fatal(err)
	}
	want := []any{
		groupkv.DeleteRangeRequest{Collection: "events", Start: []byte("2024-01"), End: []byte("2024-02")},
		groupkv.DeleteRangeRequest{Collection: "events"},
	}
	if !reflect.DeepEqual(f.calls, want) {
		t.Fatalf("requests %+v", f.calls)
	}
	_, _, err = runCLI(t, context.Background(), f, "", "delete-range", "events")
	wantUsage(t, err, "takes 2 to 3 arguments, got 1")
	_, _, err = runCLI(t, context.Background(), f, "", "delete-range", "events", "b", "a")
	wantUsage(t, err, "not below END")
	_, _, err = runCLI(t, context.Background(), f, "", "delete-range", "events", "a", "b", "c")
	wantUsage(t, err, "got 4")
}

func TestWatchCommand(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := &cliFake{
		events: []groupkv.Event{
			{Type: groupkv.EventPut, Key: []byte("a"), Value: []byte("va"), Tags: []string{"t"}, Version: 5},
			{Type: groupkv.EventPut, Key: []byte("b"), Value: []byte{0xff}, Version: 5},
			{Type: groupkv.EventDelete, Key: []byte{0xfe}, Version: 6},
			{Type: groupkv.EventProgress, Version: 9},
		},
		afterEvents: cancel,
	}
	out, _, err := runCLI(t, ctx, f, "", "watch", "--from-version", "4", "users", "--start", "a", "--end", "c", "--after-key", "0")
	if err != nil {
		t.Fatalf("watch ended by its context: %v", err)
	}
	wantReq := groupkv.WatchRequest{Collection: "users", Start: []byte("a"), End: []byte("c"), FromVersion: 4, AfterKey: []byte("0")}
	if !reflect.DeepEqual(f.calls, []any{wantReq}) {
		t.Fatalf("requests %+v", f.calls)
	}
	want := []map[string]any{
		{"type": "put", "key": "a", "value": "va", "version": 5.0, "tags": []any{"t"}},
		{"type": "put", "key": "b", "value_base64": "/w==", "version": 5.0, "tags": []any{}},
		{"type": "delete", "key_base64": "/g==", "version": 6.0, "tags": []any{}},
		{"type": "progress", "version": 9.0},
	}
	if got := jsonLines(t, out); !reflect.DeepEqual(got, want) {
		t.Fatalf("output %v\nwant %v", got, want)
	}

	// SIGINT ends the watch without an error.
	f = &cliFake{
		events:      f.events[:1],
		afterEvents: func() { _ = syscall.Kill(os.Getpid(), syscall.SIGINT) },
	}
	out, _, err = runCLI(t, context.Background(), f, "", "watch", "users")
	if err != nil || len(jsonLines(t, out)) != 1 {
		t.Fatalf("watch ended by SIGINT: %v, output %q", err, out)
	}

	// A server error ends it with that error.
	f = &cliFake{err: &groupkv.Error{Code: groupkv.CodeCompacted, Message: "version 1 is compacted"}}
	if _, _, err := runCLI(t, context.Background(), f, "", "watch", "users", "--from-version", "1"); !errors.Is(err, groupkv.ErrCompacted) {
		t.Fatalf("watch of a compacted version: %v", err)
	}

	_, _, err = runCLI(t, context.Background(), &cliFake{}, "", "watch")
	wantUsage(t, err, "takes 1 arguments, got 0")
	_, _, err = runCLI(t, context.Background(), &cliFake{}, "", "watch", "users", "--from-version", "x")
	wantUsage(t, err, "invalid argument")
}

func TestBatchDecode(t *testing.T) {
	keys, err := decodeBatchKeys([]byte(`{"keys": [{"collection": "users", "key": "u1"}, {"collection": "t", "key_base64": "AP8="}, {"collection": "e", "key": ""}]}`))
	if err != nil {
		t.Fatal(err)
	}
	wantKeys := []groupkv.KeyRef{{Collection: "users", Key: []byte("u1")}, {Collection: "t", Key: []byte{0, 0xff}}, {Collection: "e", Key: []byte{}}}
	if !reflect.DeepEqual(keys, wantKeys) {
		t.Fatalf("keys %+v", keys)
	}

	items, err := decodeBatchPut([]byte(`{"items": [
		{"collection": "users", "key": "u1", "value": "ada", "tags": ["a", "b"], "if_version": 0},
		{"collection": "users", "key": "u2", "value_base64": "3q0=", "if_version": 18446744073709551615},
		{"collection": "users", "key_base64": "/w==", "value": ""}
	]}`))
	if err != nil {
		t.Fatal(err)
	}
	wantItems := []groupkv.PutItem{
		{Collection: "users", Key: []byte("u1"), Value: []byte("ada"), Tags: []string{"a", "b"}, IfVersion: groupkv.Version(0)},
		{Collection: "users", Key: []byte("u2"), Value: []byte{0xde, 0xad}, IfVersion: groupkv.Version(1<<64 - 1)},
		{Collection: "users", Key: []byte{0xff}, Value: []byte{}},
	}
	if !reflect.DeepEqual(items, wantItems) {
		t.Fatalf("items %+v\nwant %+v", items, wantItems)
	}

	for _, tc := range []struct {
		in, want string
		put      bool
	}{
		{``, "input is empty", false},
		{`{}`, "no keys", false},
		{`{"keys": []}`, "no keys", false},
		{`{"keys": [{"collection": "c"}]}`, "keys[0]: no key", false},
		{`{"keys": [{"collection": "c", "key": "a", "key_base64": "YQ=="}]}`, "not both", false},
		{`{"keys": [{"collection": "c", "key_base64": "!!"}]}`, "not standard base64", false},
		{`{"keys": [{"collection": "c", "key": "a", "value": "v"}]}`, `unknown field "value"`, false},
		{`{"keys": [{"collection": "c", "key": "a"}]} {}`, "more than one JSON value", false},
		{`{"keys": [{"collection": "c", "key": "a"}]`, "unexpected EOF", false},
		{`{"items": [{"collection": "c", "key": "a"}]}`, `unknown field "items"`, false},
		{`{"items": []}`, "no items", true},
		{`{"items": [{"collection": "c", "key": "a"}]}`, "items[0]: no value", true},
		{`{"items": [{"collection": "c", "key": "a", "value": "v"}, {"collection": "c", "value": "v"}]}`, "items[1]: no key", true},
		{`{"items": [{"collection": "c", "key": "a", "value": "v", "value_base64": "dg=="}]}`, "not both", true},
		{`{"items": [{"collection": "c", "key": "a", "value": "v", "if_version": -1}]}`, "if_version", true},
		{`{"items": [{"collection": "c", "key": "a", "value": "v", "tags": "x"}]}`, "tags", true},
		{`{"keys": []}`, `unknown field "keys"`, true},
	} {
		var err error
		if tc.put {
			_, err = decodeBatchPut([]byte(tc.in))
		} else {
			_, err = decodeBatchKeys([]byte(tc.in))
		}
		if err == nil {
			t.Errorf("decoding %s: no error, want %q", tc.in, tc.want)
			continue
		}
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("decoding %s: %v, want a usage error saying %q", tc.in, err, tc.want)
		}
	}
}

func TestBatchCommands(t *testing.T) {
	f := &cliFake{getRes: groupkv.BatchGetResult{Version: 12, Items: []groupkv.BatchGetItem{
		{Collection: "users", Key: []byte("u1"), Found: true, Value: []byte("ada"), Tags: []string{"admin"}, Version: 10},
		{Collection: "users", Key: []byte{0xff}},
		{Collection: "teams", Key: []byte("t"), Found: true, Value: []byte{0x80}, Version: 11},
	}}}
	out, _, err := runCLI(t, context.Background(), f, `{"keys": [{"collection": "users", "key": "u1"}, {"collection": "users", "key_base64": "/w=="}, {"collection": "teams", "key": "t"}]}`,
		"batch", "get")
	if err != nil {
		t.Fatal(err)
	}
	wantKeys := []groupkv.KeyRef{{Collection: "users", Key: []byte("u1")}, {Collection: "users", Key: []byte{0xff}}, {Collection: "teams", Key: []byte("t")}}
	if !reflect.DeepEqual(f.calls, []any{wantKeys}) {
		t.Fatalf("batch get request %+v", f.calls)
	}
	wantGet := asJSON(t, `{"items": [
		{"collection": "users", "key": "u1", "found": true, "value": "ada", "version": 10, "tags": ["admin"]},
		{"collection": "users", "key_base64": "/w==", "found": false, "version": 0, "tags": []},
		{"collection": "teams", "key": "t", "found": true, "value_base64": "gA==", "version": 11, "tags": []}
	], "version": 12}`)
	if got := asJSON(t, out); !reflect.DeepEqual(got, wantGet) {
		t.Fatalf("batch get output %v\nwant %v", got, wantGet)
	}

	// put reads --file; delete reads stdin; both print the written records.
	file := filepath.Join(t.TempDir(), "put.json")
	if err := os.WriteFile(file, []byte(`{"items": [{"collection": "users", "key": "u1", "value": "ada", "if_version": 3}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	f = &cliFake{writeRes: []groupkv.WriteResult{{Collection: "users", Key: []byte("u1"), Version: 13}, {Collection: "users", Key: []byte{0xff}, Version: 13}}}
	out, _, err = runCLI(t, context.Background(), f, "not read", "batch", "put", "--file", file)
	if err != nil {
		t.Fatal(err)
	}
	if want := []any{[]groupkv.PutItem{{Collection: "users", Key: []byte("u1"), Value: []byte("ada"), IfVersion: groupkv.Version(3)}}}; !reflect.DeepEqual(f.calls, want) {
		t.Fatalf("batch put request %+v", f.calls)
	}
	wantWrite := asJSON(t, `{"items": [{"collection": "users", "key": "u1", "version": 13}, {"collection": "users", "key_base64": "/w==", "version": 13}]}`)
	if got := asJSON(t, out); !reflect.DeepEqual(got, wantWrite) {
		t.Fatalf("batch put output %v", got)
	}
	out, _, err = runCLI(t, context.Background(), f, `{"keys": [{"collection": "users", "key": "u1"}]}`, "batch", "delete", "-f", "-")
	if err != nil {
		t.Fatal(err)
	}
	if got := asJSON(t, out); !reflect.DeepEqual(got, wantWrite) {
		t.Fatalf("batch delete output %v", got)
	}

	// A BatchError prints the error and the applied records on stderr.
	f = &cliFake{err: &groupkv.BatchError{
		Err:     &groupkv.Error{Code: groupkv.CodeUnavailable, Message: "shard 3 has no leader"},
		Applied: []groupkv.WriteResult{{Collection: "users", Key: []byte("u1"), Version: 14}},
	}}
	out, errOut, err := runCLI(t, context.Background(), f, `{"items": [{"collection": "users", "key": "u1", "value": "v"}, {"collection": "users", "key": "u9", "value": "v"}]}`, "batch", "put")
	var be *groupkv.BatchError
	if !errors.As(err, &be) || out != "" {
		t.Fatalf("failed batch put: %v, stdout %q", err, out)
	}
	wantErr := asJSON(t, `{"error": {"code": "unavailable", "message": "shard 3 has no leader"}, "applied": [{"collection": "users", "key": "u1", "version": 14}]}`)
	if got := asJSON(t, errOut); !reflect.DeepEqual(got, wantErr) {
		t.Fatalf("failed batch put: stderr %v\nwant %v", got, wantErr)
	}
	// Any other error is returned without an applied list.
	f = &cliFake{err: &groupkv.Error{Code: groupkv.CodeConditionFailed, Message: "u1 is at version 14"}}
	_, errOut, err = runCLI(t, context.Background(), f, `{"keys": [{"collection": "users", "key": "u1"}]}`, "batch", "delete")
	if !errors.Is(err, groupkv.ErrConditionFailed) || errOut != "" {
		t.Fatalf("batch delete failing: %v, stderr %q", err, errOut)
	}

	for _, tc := range []struct {
		stdin string
		args  []string
		want  string
	}{
		{"", []string{"batch"}, "batch needs an operation"},
		{"", []string{"batch", "frobnicate"}, `unknown batch operation "frobnicate"`},
		{`{"keys": [{"collection": "c", "key": "k"}]}`, []string{"batch", "get", "extra"}, "takes 0 arguments, got 1"},
		{"", []string{"batch", "get"}, "input is empty"},
		{`{"keys": [{"collection": "c", "key": "k"}]}`, []string{"batch", "put"}, `unknown field "keys"`},
		{"", []string{"batch", "put", "--file", filepath.Join(t.TempDir(), "absent.json")}, "no such file"},
		{"", []string{"batch", "get", "--bogus"}, "unknown flag"},
	} {
		_, _, err := runCLI(t, context.Background(), &cliFake{}, tc.stdin, tc.args...)
		wantUsage(t, err, tc.want)
	}
}
