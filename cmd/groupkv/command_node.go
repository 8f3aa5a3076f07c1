package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/spf13/cobra"
)

func nodeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Manage the nodes of a cluster",
	}
	cmd.AddCommand(nodeDecommissionCommand())
	return cmd
}

func nodeDecommissionCommand() *cobra.Command {
	var (
		undo bool
		wait time.Duration
	)
	cmd := &cobra.Command{
		Use:   "decommission NODE-ID",
		Short: "Drain a node: its replicas move to other nodes, then it can be stopped",
		Long: `Drain a node: the cluster moves its replicas to other nodes and gives its
meta shard vote to another node. With --wait it waits until the node holds no
replica (see 'groupkv cluster status'); afterwards the node can be stopped
without loss of availability. --undo takes the decommission back.`,
		Args: argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseUint(args[0], 10, 64)
			if err != nil || id == 0 {
				return usagef("node id %q is not a positive integer", args[0])
			}
			r, err := remoteOf(cmd)
			if err != nil {
				return err
			}
			body, _ := json.Marshal(map[string]bool{"draining": !undo})
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			if _, err := askNode(ctx, r, http.MethodPost, fmt.Sprintf("/v1/nodes/%d/decommission", id), body); err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if undo {
				fmt.Fprintf(out, "node %d is no longer draining\n", id)
				return nil
			}
			fmt.Fprintf(out, "node %d is draining\n", id)
			if wait <= 0 {
				return nil
			}
			deadline := time.Now().Add(wait)
			for {
				ctx, cancel := context.WithTimeout(cmd.Context(), 5*time.Second)
				st, err := fetchClusterStatus(ctx, r)
				cancel()
				if err == nil {
					var cs struct {
						Nodes []struct {
							ID       uint64 `json:"id"`
							Replicas int    `json:"replicas"`
							Held     int    `json:"held"`
						} `json:"nodes"`
					}
					if json.Unmarshal(st, &cs) == nil {
						for _, n := range cs.Nodes {
							if n.ID == id && n.Replicas == 0 && n.Held == 0 {
								fmt.Fprintf(out, "node %d holds no replica: it can be stopped\n", id)
								return nil
							}
						}
					}
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("node %d still holds replicas after %v; see groupkv cluster status --addr %s", id, wait, r.addr)
				}
				time.Sleep(time.Second)
			}
		},
	}
	addAddrFlag(cmd)
	cmd.Flags().BoolVar(&undo, "undo", false, "take the decommission back")
	cmd.Flags().DurationVar(&wait, "wait", 0, "wait up to this long until the node holds no replica")
	return cmd
}
