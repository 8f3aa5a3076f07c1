package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
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
			addr, _ := cmd.Flags().GetString("addr")
			ctx, cancel := context.WithTimeout(cmd.Context(), time.Minute)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost,
				fmt.Sprintf("http://%s/v1/collections/%s/merge", addr, url.PathEscape(args[0])), bytes.NewReader(data))
			if err != nil {
				return usagef("--addr %q is not host:port: give e.g. %s", addr, defaultAddr)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return fmt.Errorf("cannot reach a groupkv node at %s: %v", addr, err)
			}
			defer resp.Body.Close()
			answer, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
			if resp.StatusCode != http.StatusOK {
				return httpAnswerError(addr, resp.Status, answer)
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
