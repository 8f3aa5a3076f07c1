package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	groupkv "github.com/groupkv/groupkv"
	"github.com/groupkv/groupkv/internal/api"
	"github.com/groupkv/groupkv/internal/kv"
)

func groupCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "group (create|describe|list|delete|txn)",
		Short: "Create, describe, list and delete key groups; run a one-shot transaction on a group",
		Long: `A key group is a set of keys, of any collections, whose ownership moves to
the leader of one key's shard while the group lives: transactions on the
group run there. A key is given as COLLECTION/KEY (the key is everything
after the first '/'). Answers are printed as JSON in the shape of the HTTP
API's (POST /v1/groups, GET /v1/groups[/{id}]).

  create ID --leader C/K [--member C/K ...] [--mode atomic|best_effort]
          atomic (the default): every key joins or the creation fails with
          group_refused; best_effort: the keys that can join do, and the
          answer lists the others under "refused", with the reason
  describe ID
  list
  delete ID   answers once every key is owned by its shard again
  txn ID      a one-shot transaction on members of the group, read as JSON
              like 'groupkv txn' reads it (see groupkv txn --help)

A key that belongs to a group makes general transactions and batch writes
that touch it fail with key_in_group.`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("group needs an operation: create, describe, list, delete or txn (see --help)")
			}
			return usagef("unknown group operation %q: use create, describe, list, delete or txn (see --help)", args[0])
		},
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	cmd.AddCommand(groupCreateCommand(), groupDescribeCommand(), groupListCommand(), groupDeleteCommand(), groupTxnCommand())
	return cmd
}

// commandContext returns the command's context, Background when it has
// none.
func commandContext(cmd *cobra.Command) context.Context {
	if ctx := cmd.Context(); ctx != nil {
		return ctx
	}
	return context.Background()
}

// groupIDArg checks the group id argument. Its errors are usage errors.
func groupIDArg(id string) (string, error) {
	if err := api.ValidateGroupID(id); err != nil {
		return "", usagef("group id: %s", kv.AsError(err).Message)
	}
	return id, nil
}

func groupCreateCommand() *cobra.Command {
	var (
		leader  string
		members []string
		mode    string
	)
	cmd := &cobra.Command{
		Use:   "create ID --leader COLLECTION/KEY [--member COLLECTION/KEY ...]",
		Short: "Create a key group",
		Example: `  groupkv group create match-17 --leader matches/17 --member players/ada --member players/bob
  groupkv group create lobby --leader rooms/lobby --member players/ada --mode best_effort`,
		Args: argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := groupIDArg(args[0])
			if err != nil {
				return err
			}
			if leader == "" {
				return usagef("no leader: give --leader COLLECTION/KEY, the key whose shard's leader will own the group")
			}
			spec := groupkv.GroupSpec{ID: id, Members: make([]groupkv.KeyRef, len(members))}
			if spec.Leader, err = parseKeyArg("--leader", leader); err != nil {
				return err
			}
			for i, m := range members {
				if spec.Members[i], err = parseKeyArg("--member", m); err != nil {
					return err
				}
			}
			switch groupkv.GroupMode(mode) {
			case groupkv.GroupAtomic, groupkv.GroupBestEffort:
				spec.Mode = groupkv.GroupMode(mode)
			default:
				return usagef("--mode %q is not known: use %s or %s", mode, groupkv.GroupAtomic, groupkv.GroupBestEffort)
			}
			db, err := dialDB(cmd)
			if err != nil {
				return err
			}
			defer db.Close()
			created, err := db.CreateGroup(commandContext(cmd), spec)
			if err != nil {
				return err
			}
			return printJSON(cmd, api.ToGroupCreatedJSON(created))
		},
	}
	cmd.Flags().StringVar(&leader, "leader", "", "the leader key, COLLECTION/KEY: the leader of its shard owns the group")
	cmd.Flags().StringArrayVar(&members, "member", nil, "a member key, COLLECTION/KEY (repeat the flag for each; the leader may be listed or not)")
	cmd.Flags().StringVar(&mode, "mode", string(groupkv.GroupAtomic), "atomic (every key joins or none) or best_effort (the keys that can join do)")
	return multiCommand(cmd)
}

// parseKeyArg parses COLLECTION/KEY, the value of flag. Its errors are
// usage errors.
func parseKeyArg(flag, s string) (groupkv.KeyRef, error) {
	coll, key, ok := strings.Cut(s, "/")
	if !ok || key == "" {
		return groupkv.KeyRef{}, usagef("%s %q is not COLLECTION/KEY: give e.g. players/ada", flag, s)
	}
	if err := kv.ValidateCollectionName(coll); err != nil {
		return groupkv.KeyRef{}, usagef("%s %q: %s", flag, s, kv.AsError(err).Message)
	}
	if err := kv.ValidateKey([]byte(key)); err != nil {
		return groupkv.KeyRef{}, usagef("%s %q: %s", flag, s, kv.AsError(err).Message)
	}
	return groupkv.KeyRef{Collection: coll, Key: []byte(key)}, nil
}

func groupDescribeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "describe ID",
		Short:   "Show a key group as JSON: its keys, mode, state, leader node and shipper lag",
		Example: "  groupkv group describe match-17",
		Args:    argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := groupIDArg(args[0])
			if err != nil {
				return err
			}
			db, err := dialDB(cmd)
			if err != nil {
				return err
			}
			defer db.Close()
			info, err := db.DescribeGroup(commandContext(cmd), id)
			if err != nil {
				return err
			}
			return printJSON(cmd, api.ToGroupInfoJSON(info))
		},
	}
	return multiCommand(cmd)
}

func groupListCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "list",
		Short: `List the key groups as JSON, {"groups": [...]}`,
		Args:  argsBetween(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			db, err := dialDB(cmd)
			if err != nil {
				return err
			}
			defer db.Close()
			infos, err := db.ListGroups(commandContext(cmd))
			if err != nil {
				return err
			}
			return printJSON(cmd, api.ToGroupListJSON(infos))
		},
	}
	return multiCommand(cmd)
}

func groupDeleteCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "delete ID",
		Short:   "Delete a key group; its keys go back to their shards",
		Example: "  groupkv group delete match-17",
		Args:    argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := groupIDArg(args[0])
			if err != nil {
				return err
			}
			db, err := dialDB(cmd)
			if err != nil {
				return err
			}
			defer db.Close()
			if err := db.DeleteGroup(commandContext(cmd), id); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "deleted group %s\n", id)
			return nil
		},
	}
	return multiCommand(cmd)
}

func groupTxnCommand() *cobra.Command {
	var file string
	cmd := &cobra.Command{
		Use:   "txn ID",
		Short: "Run a one-shot transaction on members of a key group, given as JSON on standard input",
		Long: `Run a one-shot transaction on members of a key group, at the group's
leader. The transaction is read as JSON from standard input (or --file),
exactly as 'groupkv txn' reads it (the body of POST /v1/groups/{id}/exec,
the same as that of POST /v1/txn/exec), and the answer is printed in the
same shape. A key that is not a member of the group is invalid_argument.`,
		Example: `  echo '{"if": [{"collection": "players", "key": "ada", "version": 3}],
        "then": [{"op": "put", "collection": "players", "key": "ada", "value": "ready"}]}' | groupkv group txn match-17`,
		Args: argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := groupIDArg(args[0])
			if err != nil {
				return err
			}
			in, err := readTxnInput(cmd.InOrStdin(), file)
			if err != nil {
				return err
			}
			req, err := decodeTxn(in)
			if err != nil {
				return err
			}
			db, err := dialDB(cmd)
			if err != nil {
				return err
			}
			defer db.Close()
			res, err := db.Group(id).Exec(commandContext(cmd), req)
			if err != nil {
				return err
			}
			return printJSON(cmd, api.ToExecResponseJSON(req, res))
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "-", "read the transaction from this file (-: standard input)")
	return multiCommand(cmd)
}
