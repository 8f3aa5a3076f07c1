package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	groupkv "github.com/groupkv/groupkv"
	"github.com/groupkv/groupkv/internal/api"
	"github.com/groupkv/groupkv/internal/kv"
)

// The multi-record commands (scan, tags, watch, batch, delete-range) print
// and read JSON in the shapes of the HTTP API (docs/api.md), with its types
// (internal/api/wire.go): a key or value is a JSON string when it is valid
// UTF-8 and standard base64 in a _base64 twin field ("key_base64",
// "value_base64") otherwise; tags are [] when there are none; versions are
// JSON numbers.

// dialDB connects the multi-record commands to the server named by --addr.
// Tests replace it with an in-memory DB.
var dialDB = dial

// multiCommand finishes a multi-record command: the --addr flag, and flag
// mistakes answered as usage errors (exit status 2).
func multiCommand(cmd *cobra.Command) *cobra.Command {
	addAddrFlag(cmd)
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	return cmd
}

// printPages prints the records of the page fetch answers for first, one
// JSON object a line. With all it follows the next pages to the end;
// without, it says on errOut how to continue, if there is more.
func printPages(out, errOut io.Writer, all bool, first string, fetch func(page string) (groupkv.ScanResult, error)) error {
	w := bufio.NewWriter(out)
	enc := json.NewEncoder(w)
	page := first
	for {
		res, err := fetch(page)
		if err != nil {
			_ = w.Flush()
			return err
		}
		for _, rec := range res.Items {
			if err := enc.Encode(api.ToRecordJSON(rec)); err != nil {
				return err
			}
		}
		if err := w.Flush(); err != nil {
			return err
		}
		if res.NextPage == "" {
			return nil
		}
		if !all {
			_, err := fmt.Fprintf(errOut, "next page: %s\n", res.NextPage)
			return err
		}
		if res.NextPage == page {
			return fmt.Errorf("the server answered page %q as its own next page: stopping", page)
		}
		page = res.NextPage
	}
}

// pagingFlags are the flags that page a scan or tag query.
type pagingFlags struct {
	limit   int
	page    string
	version uint64
}

func (p *pagingFlags) add(cmd *cobra.Command) {
	cmd.Flags().IntVar(&p.limit, "limit", 0, fmt.Sprintf("records per page, at most %d (0: %d)", kv.MaxPageSize, kv.DefaultPageSize))
	cmd.Flags().StringVar(&p.page, "page", "", "continue from this page token (printed as \"next page: TOKEN\"); give the other flags as before")
	cmd.Flags().Uint64Var(&p.version, "version", 0, "read as of this version (within the retention window); 0 reads the latest")
}

func (p *pagingFlags) check() error {
	if p.limit < 0 {
		return usagef("--limit %d: a page size is not negative", p.limit)
	}
	return nil
}

func scanCommand() *cobra.Command {
	var (
		start, end string
		reverse    bool
		all        bool
		paging     pagingFlags
	)
	cmd := &cobra.Command{
		Use:   "scan COLLECTION",
		Short: "Print the records of a key range, one JSON object a line",
		Long: `Print the records of a collection in key order, or of [--start, --end),
one JSON object a line: {"key", "value" (or "value_base64"), "version", "tags"}.

Without --all one page is printed and, if there is more, a last line
"next page: TOKEN" on standard error: pass it as --page, with the same other
flags, to continue. Every page reads at the version of the first.`,
		Example: `  groupkv scan users
  groupkv scan users --start u1 --end u5 --limit 10 --reverse
  groupkv scan users --all > users.jsonl`,
		Args: argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := paging.check(); err != nil {
				return err
			}
			req := groupkv.ScanRequest{
				Collection: args[0],
				Start:      bytesArg(start),
				End:        bytesArg(end),
				Limit:      paging.limit,
				Reverse:    reverse,
				Version:    paging.version,
			}
			db, err := dialDB(cmd)
			if err != nil {
				return err
			}
			defer db.Close()
			ctx := context.Background()
			return printPages(cmd.OutOrStdout(), cmd.ErrOrStderr(), all, paging.page, func(page string) (groupkv.ScanResult, error) {
				req.Page = page
				return db.Scan(ctx, req)
			})
		},
	}
	cmd.Flags().StringVar(&start, "start", "", "first key (inclusive); empty: the first key of the collection")
	cmd.Flags().StringVar(&end, "end", "", "end key (exclusive); empty: unbounded")
	cmd.Flags().BoolVar(&reverse, "reverse", false, "walk the range in descending key order")
	cmd.Flags().BoolVar(&all, "all", false, "follow the next pages to the end")
	paging.add(cmd)
	return multiCommand(cmd)
}

// bytesArg is a key given on the command line: nil when empty.
func bytesArg(s string) []byte {
	if s == "" {
		return nil
	}
	return []byte(s)
}
