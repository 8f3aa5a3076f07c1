package main

import (
	"bytes"
	"context"
	"fmt"

	"github.com/spf13/cobra"

	groupkv "github.com/groupkv/groupkv"
)

func deleteRangeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "delete-range COLLECTION START [END]",
		Short: "Delete every key of [START, END); without END, every key from START on",
		Long: `Delete every key of [START, END) of a collection, atomically per shard.
Without END (or with an empty one) the range is unbounded above; START ""
is the first key, so '' without END empties the collection.`,
		Example: `  groupkv delete-range events 2024-01 2024-02
  groupkv delete-range events ''    # every key`,
		Args: argsBetween(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := groupkv.DeleteRangeRequest{Collection: args[0], Start: bytesArg(args[1])}
			if len(args) == 3 {
				req.End = bytesArg(args[2])
			}
			if len(req.End) > 0 && bytes.Compare(req.Start, req.End) >= 0 {
				return usagef("START %q is not below END %q: the range [START, END) is empty; omit END for an unbounded range", args[1], args[2])
			}
			db, err := dialDB(cmd)
			if err != nil {
				return err
			}
			defer db.Close()
			res, err := db.DeleteRange(context.Background(), req)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "deleted %d\n", res.Deleted)
			return err
		},
	}
	return multiCommand(cmd)
}
