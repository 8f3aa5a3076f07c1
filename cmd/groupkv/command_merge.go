package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/spf13/cobra"
)

func collectionsMergeCommand() *cobra.Command {
	var shard uint64
	cmd := &cobra.Command{
		Use:     "merge NAME --shard ID",
		Short:   "Merge a shard with its right neighbour (the next keys or buckets) into it",
		Example: "  groupkv collections merge events --shard 7",
		Args:    argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if shard == 0 {
				return usagef("give --shard ID: the shard that takes in its right neighbour (see groupkv collections describe %s)", args[0])
			}
			data, _ := json.Marshal(map[string]any{"shard": shard})
			r, err := remoteOf(cmd)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), time.Minute)
			defer cancel()
			answer, err := askNode(ctx, r, http.MethodPost, "/v1/collections/"+url.PathEscape(args[0])+"/merge", data)
			if err != nil {
				return err
			}
			var out bytes.Buffer
			if json.Indent(&out, answer, "", "  ") != nil {
				out.Write(answer)
			}
			fmt.Fprintln(cmd.OutOrStdout(), out.String())
			return nil
		},
	}
	addAddrFlag(cmd)
	cmd.Flags().Uint64Var(&shard, "shard", 0, "the shard that takes in its right neighbour")
	return cmd
}
