package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	groupkv "github.com/groupkv/groupkv"
	"github.com/groupkv/groupkv/internal/api"
)

func watchCommand() *cobra.Command {
	var (
		fromVersion     uint64
		start, end, key string
	)
	cmd := &cobra.Command{
		Use:   "watch COLLECTION",
		Short: "Print the changes of a collection as they happen, one JSON object a line, until Ctrl-C",
		Long: `Print the changes of a collection, or of [--start, --end), with versions
above --from-version, one JSON object a line, until interrupted (Ctrl-C ends
it with exit status 0):

  {"type": "put", "key", "value" (or "value_base64"), "version", "tags"}
  {"type": "delete", "key", "version", "tags": []}
  {"type": "progress", "version"}: no change at or below version is to come

To resume a watch, pass the version of the last event as --from-version,
and its key as --after-key when it was a put or a delete.`,
		Example: `  groupkv watch users --from-version 1818398113251491840
  groupkv watch users --start u1 --end u5 --from-version 1818398113251491840 --after-key u3`,
		Args: argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := groupkv.WatchRequest{
				Collection:  args[0],
				Start:       bytesArg(start),
				End:         bytesArg(end),
				FromVersion: fromVersion,
				AfterKey:    bytesArg(key),
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			db, err := dialDB(cmd)
			if err != nil {
				return err
			}
			defer db.Close()
			return runWatch(ctx, db, req, cmd.OutOrStdout())
		},
	}
	cmd.Flags().Uint64Var(&fromVersion, "from-version", 0, "print the changes above this version (within the retention window)")
	cmd.Flags().StringVar(&start, "start", "", "first key of the watched range (inclusive)")
	cmd.Flags().StringVar(&end, "end", "", "end of the watched range (exclusive); empty: unbounded")
	cmd.Flags().StringVar(&key, "after-key", "", "with --from-version: resume after this key's change at that version")
	return multiCommand(cmd)
}

// runWatch prints the events of the watch to out until ctx ends, which is
// not an error.
func runWatch(ctx context.Context, db groupkv.DB, req groupkv.WatchRequest, out io.Writer) error {
	enc := json.NewEncoder(out)
	err := db.Watch(ctx, req, func(ev groupkv.Event) error {
		return enc.Encode(api.ToEventJSON(ev))
	})
	if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		return nil
	}
	return err
}
