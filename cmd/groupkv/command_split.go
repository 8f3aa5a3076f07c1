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

func collectionsSplitCommand() *cobra.Command {
	var (
		key   string
		shard uint64
	)
	cmd := &cobra.Command{
		Use:   "split NAME (--key K | --shard N)",
		Short: "Split a shard: a range collection's at a key, a hash or tag collection's in the middle of its buckets",
		Args:  argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			keySet := cmd.Flags().Changed("key")
			if keySet == (shard != 0) {
				return usagef("give --key K (range collections) or --shard N (hash and tag collections)")
			}
			body := map[string]any{}
			if keySet {
				body["key"] = key
			} else {
				body["shard"] = shard
			}
			data, _ := json.Marshal(body)
			r, err := remoteOf(cmd)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), time.Minute)
			defer cancel()
			answer, err := askNode(ctx, r, http.MethodPost, "/v1/collections/"+url.PathEscape(args[0])+"/split", data)
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
	cmd.Flags().StringVar(&key, "key", "", "range collections: the key the new shard starts at")
	cmd.Flags().Uint64Var(&shard, "shard", 0, "hash and tag collections: the shard to split in two")
	return cmd
}
