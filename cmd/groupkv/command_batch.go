package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	groupkv "github.com/groupkv/groupkv"
	"github.com/groupkv/groupkv/internal/api"
	"github.com/groupkv/groupkv/internal/kv"
)

// maxBatchInput bounds the JSON request a batch command reads: the keys and
// values of one request are at most 16 MiB, which base64 and JSON quoting
// may blow up to about 22 MiB.
const maxBatchInput = 64 << 20

func batchCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "batch (get|put|delete)",
		Short: "Read, write or delete many records in one request, given as JSON on standard input",
		Long: `Read, write or delete many records, possibly of several collections, in
one request. The request is read as JSON from standard input (or --file),
in the shape of the HTTP API's bodies; the answer is printed as JSON in the
shape of its answers. A key or value is a JSON string, or standard base64 in
key_base64 / value_base64 for bytes that are not UTF-8.

  get     {"keys": [{"collection": "users", "key": "u1"}, ...]}
          answers {"items": [{"collection", "key", "found", "value", "version", "tags"}, ...], "version": N}
  put     {"items": [{"collection", "key", "value", "tags": [...], "if_version": N}, ...]}
          answers {"items": [{"collection", "key", "version"}, ...]}
  delete  {"keys": [...]}, answers like put

A put or delete that fails after some shards applied their part prints, on
standard error, the error and the records that were written (they stay
written) as {"error": {"code", "message"}, "applied": [...]}, and exits 1.`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("batch needs an operation: get, put or delete (see --help)")
			}
			return usagef("unknown batch operation %q: use get, put or delete (see --help)", args[0])
		},
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })

	var file string
	sub := func(use, short, example string, run func(cmd *cobra.Command, db groupkv.DB, in []byte) error) *cobra.Command {
		c := &cobra.Command{
			Use:     use,
			Short:   short,
			Example: example,
			Args:    argsBetween(0, 0),
			RunE: func(cmd *cobra.Command, _ []string) error {
				in, err := readBatchInput(cmd.InOrStdin(), file)
				if err != nil {
					return err
				}
				db, err := dialDB(cmd)
				if err != nil {
					return err
				}
				defer db.Close()
				return run(cmd, db, in)
			},
		}
		c.Flags().StringVarP(&file, "file", "f", "-", "read the request from this file (-: standard input)")
		return multiCommand(c)
	}
	cmd.AddCommand(
		sub("get", "Read keys at one version",
			`  echo '{"keys": [{"collection": "users", "key": "u1"}, {"collection": "teams", "key": "t1"}]}' | groupkv batch get`,
			func(cmd *cobra.Command, db groupkv.DB, in []byte) error {
				keys, err := decodeBatchKeys(in)
				if err != nil {
					return err
				}
				res, err := db.BatchGet(context.Background(), keys)
				if err != nil {
					return err
				}
				return printJSON(cmd, api.ToBatchGetResponseJSON(res))
			}),
		sub("put", "Write records",
			`  echo '{"items": [{"collection": "users", "key": "u1", "value": "ada", "tags": ["admin"]}]}' | groupkv batch put
  groupkv batch put --file records.json`,
			func(cmd *cobra.Command, db groupkv.DB, in []byte) error {
				items, err := decodeBatchPut(in)
				if err != nil {
					return err
				}
				rs, err := db.BatchPut(context.Background(), items)
				return printBatchWrite(cmd, rs, err)
			}),
		sub("delete", "Delete keys (absent keys are no-ops)",
			`  echo '{"keys": [{"collection": "users", "key": "u1"}]}' | groupkv batch delete`,
			func(cmd *cobra.Command, db groupkv.DB, in []byte) error {
				keys, err := decodeBatchKeys(in)
				if err != nil {
					return err
				}
				rs, err := db.BatchDelete(context.Background(), keys)
				return printBatchWrite(cmd, rs, err)
			}),
	)
	return cmd
}

// readBatchInput reads the request from file, or from stdin for "-" or "".
func readBatchInput(stdin io.Reader, file string) ([]byte, error) {
	from := "standard input"
	r := stdin
	if file != "" && file != "-" {
		f, err := os.Open(file)
		if err != nil {
			return nil, usagef("reading the batch request: %v", err)
		}
		defer f.Close()
		r, from = f, file
	}
	b, err := io.ReadAll(io.LimitReader(r, maxBatchInput+1))
	if err != nil {
		return nil, fmt.Errorf("reading the batch request from %s: %w", from, err)
	}
	if len(b) > maxBatchInput {
		return nil, usagef("the batch request in %s is over %d bytes: split it", from, maxBatchInput)
	}
	return b, nil
}

// decodeBatchKeys decodes the request of a batch get or delete,
// {"keys": [{"collection", "key" | "key_base64"}, ...]}. Its errors are
// usage errors.
func decodeBatchKeys(in []byte) ([]groupkv.KeyRef, error) {
	var req struct {
		Keys []api.KeyRefJSON `json:"keys"`
	}
	if err := decodeStrict(in, &req, "keys"); err != nil {
		return nil, err
	}
	if len(req.Keys) == 0 {
		return nil, usagef(`batch request: no keys: give {"keys": [{"collection": ..., "key": ...}, ...]}, at least one`)
	}
	keys := make([]groupkv.KeyRef, len(req.Keys))
	for i, k := range req.Keys {
		key, err := bytesInput(fmt.Sprintf("keys[%d]", i), "key", k.Key, k.KeyBase64, true)
		if err != nil {
			return nil, err
		}
		keys[i] = groupkv.KeyRef{Collection: k.Collection, Key: key}
	}
	return keys, nil
}

// decodeBatchPut decodes the request of a batch put, {"items": [{"collection",
// "key" | "key_base64", "value" | "value_base64", "tags", "if_version"}, ...]}.
// A value must be given, "" for an empty one. Its errors are usage errors.
func decodeBatchPut(in []byte) ([]groupkv.PutItem, error) {
	var req struct {
		Items []api.PutItemJSON `json:"items"`
	}
	if err := decodeStrict(in, &req, "items"); err != nil {
		return nil, err
	}
	if len(req.Items) == 0 {
		return nil, usagef(`batch request: no items: give {"items": [{"collection": ..., "key": ..., "value": ...}, ...]}, at least one`)
	}
	items := make([]groupkv.PutItem, len(req.Items))
	for i, it := range req.Items {
		where := fmt.Sprintf("items[%d]", i)
		key, err := bytesInput(where, "key", it.Key, it.KeyBase64, true)
		if err != nil {
			return nil, err
		}
		value, err := bytesInput(where, "value", it.Value, it.ValueBase64, true)
		if err != nil {
			return nil, err
		}
		items[i] = groupkv.PutItem{Collection: it.Collection, Key: key, Value: value, Tags: it.Tags, IfVersion: it.IfVersion}
	}
	return items, nil
}

// decodeStrict decodes one JSON object into v, refusing unknown fields and
// trailing data; field names the list the object must hold, for messages.
func decodeStrict(in []byte, v any, field string) error {
	dec := json.NewDecoder(bytes.NewReader(in))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if err == io.EOF {
			return usagef("batch request: the input is empty: give a JSON object with %q", field)
		}
		return usagef("batch request: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return usagef("batch request: more than one JSON value: give one object with %q", field)
	}
	return nil
}

// bytesInput returns the bytes of field name of element where, given as a
// string (s) or in standard base64 (b64), exactly one of them when required.
func bytesInput(where, name string, s, b64 *string, required bool) ([]byte, error) {
	b, given, err := api.BytesFromJSON(name, s, b64)
	switch {
	case err != nil:
		return nil, usagef("batch request: %s: %s", where, kv.AsError(err).Message)
	case !given && required:
		return nil, usagef("batch request: %s: no %s: give %s, or %s_base64 for bytes that are not UTF-8", where, name, name, name)
	}
	return b, nil
}

// batchErrorJSON is a failed batch write on standard error, in the shape of
// the HTTP API's error answer.
type batchErrorJSON struct {
	Error struct {
		Code    groupkv.Code `json:"code"`
		Message string       `json:"message"`
	} `json:"error"`
	Applied []api.WriteResultJSON `json:"applied"`
}

// printBatchWrite prints the answer of a batch put or delete: the written
// records, or for a *BatchError the error and the records applied before
// it, on standard error; the error is returned either way.
func printBatchWrite(cmd *cobra.Command, rs []groupkv.WriteResult, err error) error {
	if err == nil {
		return printJSON(cmd, api.BatchWriteResponseJSON{Items: api.ToWriteResultsJSON(rs)})
	}
	var be *groupkv.BatchError
	if errors.As(err, &be) && be.Err != nil {
		var out batchErrorJSON
		out.Error.Code, out.Error.Message = be.Err.Code, be.Err.Message
		out.Applied = api.ToWriteResultsJSON(be.Applied)
		enc := json.NewEncoder(cmd.ErrOrStderr())
		enc.SetIndent("", "  ")
		_ = enc.Encode(out)
	}
	return err
}
