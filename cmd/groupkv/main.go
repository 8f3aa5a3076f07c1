// Command groupkv is the one binary of groupkv: the server, the command-line
// client and the benchmark.
//
//	groupkv server [--data-dir D] [--listen A] [--peer-listen P] [--node-id N]
//	groupkv cluster status [--addr A] [--json]
//	groupkv cluster check [--addr A] [--shard N]... [--json] [--timeout D]
//	groupkv cluster local [--dir D] [--nodes N] [--base-port P]
//	groupkv collections [create|describe|drop] ...
//	groupkv put COLLECTION KEY [VALUE] [--tags a,b] [--if-version N]
//	groupkv get COLLECTION KEY [--version N] [--json]
//	groupkv del COLLECTION KEY [--if-version N]
//	groupkv batch get|put|delete < request.json
//	groupkv delete-range COLLECTION START [END]
//	groupkv scan COLLECTION [--start S] [--end E] [--limit N] [--reverse] [--all]
//	groupkv tags COLLECTION (--all a,b | --any a,b)
//	groupkv watch COLLECTION [--from-version N] [--after-key K]
//	groupkv txn [--file F] < txn.json
//	groupkv group create ID --leader C/K [--member C/K ...] [--mode best_effort]
//	groupkv group describe|delete ID
//	groupkv group list
//	groupkv group txn ID [--file F] < txn.json
//	groupkv certs ca|issue NAME [--dir D] [--host H]...
//	groupkv bench ...
package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	groupkv "github.com/groupkv/groupkv"
)

func main() {
	root := &cobra.Command{
		Use:           "groupkv",
		Short:         "groupkv: a sharded, raft-replicated key-value store with consistent access to groups of keys",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(serverCommand(), putCommand(), getCommand(), delCommand(), collectionsCommand(),
		scanCommand(), tagsCommand(), watchCommand(), batchCommand(), deleteRangeCommand(), txnCommand(),
		groupCommand())
	root.AddCommand(benchCommand(), nodeCommand())
	root.AddCommand(clusterCommand(), certsCommand(), backupCommand(), restoreCommand())
	if cmd, err := root.ExecuteC(); err != nil {
		var ue usageError
		if errors.As(err, &ue) {
			fmt.Fprintf(os.Stderr, "groupkv: %v\n", err)
			os.Exit(2)
		}
		var e *groupkv.Error
		if errors.As(err, &e) {
			// A wrapped error says what failed before the server's answer.
			fmt.Fprintf(os.Stderr, "groupkv: %v%s\n", err, tlsHint(cmd, e))
		} else {
			fmt.Fprintf(os.Stderr, "groupkv: %v\n", err)
		}
		os.Exit(1)
	}
}

// tlsHint answers a hint for a command that could not reach its server
// because the two disagree on TLS: a connection cut at its start is what a
// client in the clear meets at a TLS port, and what a client without a
// certificate meets at one that asks for it.
func tlsHint(cmd *cobra.Command, e *groupkv.Error) string {
	if cmd == nil || e.Code != groupkv.CodeUnavailable || cmd.Flags().Lookup("ca-file") == nil {
		return ""
	}
	m := e.Message
	if !strings.Contains(m, "preface") && !strings.Contains(m, "broken pipe") && !strings.Contains(m, "connection reset") &&
		!strings.Contains(m, "tls:") && !strings.Contains(m, "certificate") {
		return ""
	}
	if ca, _ := cmd.Flags().GetString("ca-file"); ca == "" {
		return " (if the server serves TLS, give --ca-file, and --cert-file and --key-file if it asks for a client certificate)"
	}
	if cert, _ := cmd.Flags().GetString("cert-file"); cert == "" {
		return " (if the server asks for a client certificate, give --cert-file and --key-file)"
	}
	return " (the server may have refused the client certificate: signed by a CA it does not trust, expired, or revoked)"
}

// usageError is a mistake on the command line (exit status 2).
type usageError struct{ error }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// exactArgs is cobra.ExactArgs with a usage error.
func argsBetween(lo, hi int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < lo || len(args) > hi {
			if lo == hi {
				return usagef("%s takes %d arguments, got %d (see --help)", cmd.Name(), lo, len(args))
			}
			return usagef("%s takes %d to %d arguments, got %d (see --help)", cmd.Name(), lo, hi, len(args))
		}
		return nil
	}
}

// defaultAddr is the client address of a server started with defaults.
const defaultAddr = "127.0.0.1:7070"
