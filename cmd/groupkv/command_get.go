package main

import (
	"context"
	"encoding/json"
	"fmt"
	"unicode/utf8"

	"github.com/spf13/cobra"

	groupkv "github.com/groupkv/groupkv"
)

func getCommand() *cobra.Command {
	var (
		version uint64
		asJSON  bool
	)
	cmd := &cobra.Command{
		Use:   "get COLLECTION KEY",
		Short: "Print a key's value (with --json: value, version and tags)",
		Example: `  groupkv get users u1
  groupkv get users u1 --json
  groupkv get users u1 --version 1818398113251491840`,
		Args: argsBetween(2, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			db, err := dial(cmd)
			if err != nil {
				return err
			}
			defer db.Close()
			rec, err := db.Get(context.Background(), groupkv.GetRequest{Collection: args[0], Key: []byte(args[1]), Version: version})
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if !asJSON {
				_, err := out.Write(rec.Value)
				if err == nil && len(rec.Value) > 0 && rec.Value[len(rec.Value)-1] != '\n' && utf8.Valid(rec.Value) {
					_, err = fmt.Fprintln(out)
				}
				return err
			}
			j := map[string]any{"key": string(rec.Key), "version": rec.Version, "tags": rec.Tags}
			if rec.Tags == nil {
				j["tags"] = []string{}
			}
			if utf8.Valid(rec.Value) {
				j["value"] = string(rec.Value)
			} else {
				j["value_base64"] = rec.Value
			}
			enc := json.NewEncoder(out)
			return enc.Encode(j)
		},
	}
	cmd.Flags().Uint64Var(&version, "version", 0, "read as of this version (within the retention window)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON object with value, version and tags")
	addAddrFlag(cmd)
	return cmd
}

func delCommand() *cobra.Command {
	var ifVersion int64
	cmd := &cobra.Command{
		Use:     "del COLLECTION KEY",
		Aliases: []string{"delete"},
		Short:   "Delete a key",
		Args:    argsBetween(2, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := groupkv.DeleteRequest{Collection: args[0], Key: []byte(args[1])}
			if cmd.Flags().Changed("if-version") {
				if ifVersion < 0 {
					return usagef("--if-version %d: versions are not negative", ifVersion)
				}
				req.IfVersion = groupkv.Version(uint64(ifVersion))
			}
			db, err := dial(cmd)
			if err != nil {
				return err
			}
			defer db.Close()
			v, err := db.Delete(context.Background(), req)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "version %d\n", v)
			return nil
		},
	}
	cmd.Flags().Int64Var(&ifVersion, "if-version", 0, "delete only if the key's current version is this")
	addAddrFlag(cmd)
	return cmd
}
