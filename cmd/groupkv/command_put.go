package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	groupkv "github.com/groupkv/groupkv"
)

func putCommand() *cobra.Command {
	var (
		tags      string
		ifVersion int64
	)
	cmd := &cobra.Command{
		Use:   "put COLLECTION KEY [VALUE]",
		Short: "Store a value (read from standard input when VALUE is omitted)",
		Example: `  groupkv put users u1 ada --tags admin,paris
  echo -n ada | groupkv put users u1
  groupkv put users u1 grace --if-version 0   # only if absent`,
		Args: argsBetween(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			var value []byte
			if len(args) == 3 {
				value = []byte(args[2])
			} else {
				v, err := io.ReadAll(io.LimitReader(os.Stdin, 64<<20))
				if err != nil {
					return fmt.Errorf("reading the value from standard input: %w", err)
				}
				value = v
			}
			req := groupkv.PutRequest{Collection: args[0], Key: []byte(args[1]), Value: value}
			if tags != "" {
				req.Tags = strings.Split(tags, ",")
			}
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
			v, err := db.Put(context.Background(), req)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "version %d\n", v)
			return nil
		},
	}
	cmd.Flags().StringVar(&tags, "tags", "", "comma-separated tags")
	cmd.Flags().Int64Var(&ifVersion, "if-version", 0, "store only if the key's current version is this (0: only if absent)")
	addAddrFlag(cmd)
	return cmd
}
