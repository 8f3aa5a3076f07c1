package main

import (
	"context"
	"strings"

	"github.com/spf13/cobra"

	groupkv "github.com/groupkv/groupkv"
)

func tagsCommand() *cobra.Command {
	var (
		allOf, anyOf string
		allPages     bool
		paging       pagingFlags
	)
	cmd := &cobra.Command{
		Use:   "tags COLLECTION (--all a,b | --any a,b)",
		Short: "Print the records carrying tags, one JSON object a line",
		Long: `Print the records of a collection that carry every tag of --all, or one
of the tags of --any, in key order, one JSON object a line, like scan.

Without --all-pages one page is printed and, if there is more, a last line
"next page: TOKEN" on standard error: pass it as --page, with the same other
flags, to continue.`,
		Example: `  groupkv tags users --all admin,paris
  groupkv tags users --any team-a,team-b --all-pages`,
		Args: argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := paging.check(); err != nil {
				return err
			}
			q := groupkv.TagQuery{Collection: args[0], Limit: paging.limit, Version: paging.version}
			hasAll, hasAny := cmd.Flags().Changed("all"), cmd.Flags().Changed("any")
			switch {
			case hasAll == hasAny:
				return usagef("give exactly one of --all a,b (records carrying every tag) and --any a,b (records carrying one of them)")
			case hasAll && allOf == "":
				return usagef("--all names no tag: give --all a,b")
			case hasAny && anyOf == "":
				return usagef("--any names no tag: give --any a,b")
			case hasAll:
				q.All = strings.Split(allOf, ",")
			default:
				q.Any = strings.Split(anyOf, ",")
			}
			db, err := dialDB(cmd)
			if err != nil {
				return err
			}
			defer db.Close()
			ctx := context.Background()
			return printPages(cmd.OutOrStdout(), cmd.ErrOrStderr(), allPages, paging.page, func(page string) (groupkv.ScanResult, error) {
				q.Page = page
				return db.GetByTags(ctx, q)
			})
		},
	}
	cmd.Flags().StringVar(&allOf, "all", "", "comma-separated tags a record must all carry")
	cmd.Flags().StringVar(&anyOf, "any", "", "comma-separated tags a record must carry one of")
	cmd.Flags().BoolVar(&allPages, "all-pages", false, "follow the next pages to the end")
	paging.add(cmd)
	return multiCommand(cmd)
}
