package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	groupkv "github.com/groupkv/groupkv"
)

func collectionsCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "collections",
		Short: "List collections; create, describe or drop one",
		Args:  argsBetween(0, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			db, err := dial(cmd)
			if err != nil {
				return err
			}
			defer db.Close()
			cs, err := db.ListCollections(context.Background())
			if err != nil {
				return err
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "NAME\tPARTITIONING\tSHARDS")
			for _, c := range cs {
				fmt.Fprintf(w, "%s\t%s\t%d\n", c.Name, c.Partitioning, len(c.Shards))
			}
			return w.Flush()
		},
	}
	addAddrFlag(cmd)

	var (
		partitioning string
		shards       int
		splitPoints  string
	)
	create := &cobra.Command{
		Use:     "create NAME",
		Short:   "Create a collection",
		Example: "  groupkv collections create users --shards 8\n  groupkv collections create events --partitioning range --split-points g,p",
		Args:    argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts := groupkv.CollectionOptions{Name: args[0], Partitioning: groupkv.Partitioning(partitioning), Shards: shards}
			if splitPoints != "" {
				for _, p := range strings.Split(splitPoints, ",") {
					opts.SplitPoints = append(opts.SplitPoints, []byte(p))
				}
			}
			db, err := dial(cmd)
			if err != nil {
				return err
			}
			defer db.Close()
			info, err := db.CreateCollection(context.Background(), opts)
			if err != nil {
				return err
			}
			return printJSON(cmd, info)
		},
	}
	create.Flags().StringVar(&partitioning, "partitioning", "hash", "hash or range")
	create.Flags().IntVar(&shards, "shards", 0, "number of shards (default 8 for hash; split points + 1 for range)")
	create.Flags().StringVar(&splitPoints, "split-points", "", "comma-separated keys where the shards of a range collection begin")
	addAddrFlag(create)

	describe := &cobra.Command{
		Use:   "describe NAME",
		Short: "Show a collection and its shards as JSON",
		Args:  argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			db, err := dial(cmd)
			if err != nil {
				return err
			}
			defer db.Close()
			info, err := db.DescribeCollection(context.Background(), args[0])
			if err != nil {
				return err
			}
			return printJSON(cmd, info)
		},
	}
	addAddrFlag(describe)

	drop := &cobra.Command{
		Use:   "drop NAME",
		Short: "Drop a collection and all its records",
		Args:  argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			db, err := dial(cmd)
			if err != nil {
				return err
			}
			defer db.Close()
			if err := db.DropCollection(context.Background(), args[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "dropped %s\n", args[0])
			return nil
		},
	}
	addAddrFlag(drop)
	cmd.AddCommand(create, describe, drop, collectionsSplitCommand(), collectionsMergeCommand())
	return cmd
}

func printJSON(cmd *cobra.Command, v any) error {
	enc := json.NewEncoder(cmd.OutOrStdout())
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
