package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"

	"github.com/spf13/cobra"

	"github.com/groupkv/groupkv/internal/api"
	"github.com/groupkv/groupkv/internal/kv"
)

func txnCommand() *cobra.Command {
	var file string
	cmd := &cobra.Command{
		Use:   "txn",
		Short: "Run a one-shot transaction given as JSON on standard input",
		Long: `Run a one-shot transaction: if every condition of "if" holds, the
operations of "then" run, else those of "else", all in one transaction. It
is read as JSON from standard input (or --file), exactly the body of the
HTTP API's POST /v1/txn/exec, and the answer is printed as JSON in the
shape of its answer:

  {"if":   [{"collection": "c", "key": "a", "version": 7},   version 0: the key is absent
            {"collection": "c", "key": "d", "value": "x"}],  or the key's value
   "then": [{"op": "put", "collection": "c", "key": "a", "value": "1", "tags": ["t"]},
            {"op": "delete", "collection": "c", "key": "d"},
            {"op": "get", "collection": "c", "key": "e"}],
   "else": [{"op": "get", "collection": "c", "key": "a"}]}

answers {"succeeded": true|false, "version": N, "results": [...]}, one
result per operation of the branch that ran, in its order: {"version": N}
for a put or delete, {"found": true, "value", "version"} or
{"found": false} for a get. A key or value is a JSON string, or standard
base64 in key_base64 / value_base64 for bytes that are not UTF-8.

A failure is printed on standard error: a transaction that is not valid
JSON or not a valid request exits 2, one the server refused or could not
run exits 1; commit_unknown means the transaction may or may not have
been applied.`,
		Example: `  echo '{"if": [{"collection": "users", "key": "u1", "version": 0}],
        "then": [{"op": "put", "collection": "users", "key": "u1", "value": "ada"}]}' | groupkv txn
  groupkv txn --file txn.json --addr db1:7070`,
		Args: argsBetween(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			in, err := readTxnInput(cmd.InOrStdin(), file)
			if err != nil {
				return err
			}
			req, err := decodeTxn(in)
			if err != nil {
				return err
			}
			db, err := dialDB(cmd)
			if err != nil {
				return err
			}
			defer db.Close()
			ctx := commandContext(cmd)
			res, err := db.Exec(ctx, req)
			if err != nil {
				return err
			}
			return printJSON(cmd, api.ToExecResponseJSON(req, res))
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "-", "read the transaction from this file (-: standard input)")
	return multiCommand(cmd)
}

// readTxnInput reads the transaction from file, or from stdin for "-" or
// "".
func readTxnInput(stdin io.Reader, file string) ([]byte, error) {
	from := "standard input"
	r := stdin
	if file != "" && file != "-" {
		f, err := os.Open(file)
		if err != nil {
			return nil, usagef("reading the transaction: %v", err)
		}
		defer f.Close()
		r, from = f, file
	}
	b, err := io.ReadAll(io.LimitReader(r, maxBatchInput+1))
	if err != nil {
		return nil, fmt.Errorf("reading the transaction from %s: %w", from, err)
	}
	if len(b) > maxBatchInput {
		return nil, usagef("the transaction in %s is over %d bytes: split it", from, maxBatchInput)
	}
	return b, nil
}

// decodeTxn decodes and checks a one-shot transaction. Its errors are
// usage errors. Values are not checked against a size limit: the server
// applies its own.
func decodeTxn(in []byte) (kv.ExecRequest, error) {
	var req api.ExecRequestJSON
	dec := json.NewDecoder(bytes.NewReader(in))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		if err == io.EOF {
			return kv.ExecRequest{}, usagef(`transaction: the input is empty: give a JSON object with "if", "then" and "else" (see --help)`)
		}
		return kv.ExecRequest{}, usagef("transaction: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return kv.ExecRequest{}, usagef("transaction: more than one JSON value: give one object")
	}
	out, err := api.ExecRequestFromJSON(req, math.MaxInt)
	if err != nil {
		return kv.ExecRequest{}, usagef("transaction: %s", kv.AsError(err).Message)
	}
	return out, nil
}
