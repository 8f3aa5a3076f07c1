package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/groupkv/groupkv/internal/tlsfiles"
)

func certsCommand() *cobra.Command {
	var (
		dir      string
		validFor time.Duration
	)
	cmd := &cobra.Command{
		Use:   "certs",
		Short: "Create a CA and the TLS certificates of a cluster's nodes and clients",
		Long: `Create the files TLS needs: a CA, then a certificate signed by it for each
node (serve it with groupkv server --cert-file/--key-file on the client port
and --peer-cert-file/--peer-key-file on the peer port, with --peer-ca-file
ca.crt) and for each client that must present one (--client-ca-file on the
server; --cert-file/--key-file on the client). Files go to --dir as
NAME.crt and NAME.key; keys are readable by their owner only. A node's
certificate must list every host name and IP address clients and other
nodes dial it by. groupkv certs revoke adds certificates to the CA's
revocation list, ca.crl, which servers given it (--client-crl-file,
--peer-crl-file) read again when it changes. Servers also read their CA
files again when they change: to move to a new CA, add its certificate to
the CA files, issue new certificates, then remove the old CA.`,
		Example: `  groupkv certs ca --dir certs
  groupkv certs issue node1 --dir certs --host 10.0.0.1 --host db1.internal
  groupkv certs issue app --dir certs
  groupkv certs revoke app --dir certs`,
	}
	cmd.PersistentFlags().StringVar(&dir, "dir", "certs", "directory of the CA's files and of the certificates issued")
	cmd.PersistentFlags().DurationVar(&validFor, "valid-for", 5*365*24*time.Hour, "how long a certificate is valid (no longer than its CA)")

	ca := &cobra.Command{
		Use:   "ca",
		Short: "Create a CA: ca.crt (give it to nodes and clients), ca.key (keep it private) and ca.crl (its revocation list)",
		Args:  argsBetween(0, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := os.Stat(filepath.Join(dir, "ca.key")); err == nil {
				return fmt.Errorf("%s already holds a CA (ca.key): remove it first to create another; certificates it signed are not trusted by a new one", dir)
			}
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
			c, err := tlsfiles.NewCA("groupkv CA", validFor)
			if err != nil {
				return err
			}
			certFile, keyFile, err := c.WriteFiles(dir)
			if err != nil {
				return err
			}
			crl := filepath.Join(dir, "ca.crl")
			if _, err := c.Revoke(crl); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "CA certificate %s, key %s, revocation list %s (none revoked)\n", certFile, keyFile, crl)
			return nil
		},
	}
	var hosts []string
	issue := &cobra.Command{
		Use:   "issue NAME",
		Short: "Issue a certificate signed by the CA of --dir, as NAME.crt and NAME.key",
		Args:  argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if name == "ca" || filepath.Base(name) != name {
				return usagef("certificate name %q: give a plain file name other than ca", name)
			}
			c, err := tlsfiles.LoadCA(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key"))
			if err != nil {
				return fmt.Errorf("%v (create the CA first: groupkv certs ca --dir %s)", err, dir)
			}
			certFile, keyFile, err := c.IssueFiles(dir, name, hosts, validFor)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "certificate %s, key %s\n", certFile, keyFile)
			return nil
		},
	}
	issue.Flags().StringSliceVar(&hosts, "host", nil, "host name or IP address the certificate is valid for (repeat, or comma-separate; a node's every address)")
	revoke := &cobra.Command{
		Use:   "revoke NAME|FILE...",
		Short: "Revoke certificates: add them to ca.crl, the CA's revocation list",
		Long: `Add certificates signed by the CA of --dir to its certificate revocation
list, ca.crl in --dir (created if missing), signed by the CA. A NAME is
the certificate NAME.crt in --dir; a FILE (a path with a slash, or ending
in .crt) is read as it is. Give the list to the servers with
--client-crl-file (client certificates) and --peer-crl-file (node
certificates), and copy it to them again after each revocation: a server
refuses the certificates it lists within a second of the file changing,
at the next handshake. Connections open before stay open.`,
		Example: `  groupkv certs revoke app --dir certs
  groupkv certs revoke old/node3.crt --dir certs`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := tlsfiles.LoadCA(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key"))
			if err != nil {
				return fmt.Errorf("%v (revoking needs the CA's key, in --dir)", err)
			}
			var pems [][]byte
			for _, a := range args {
				file := a
				if !strings.Contains(a, "/") && !strings.HasSuffix(a, ".crt") {
					file = filepath.Join(dir, a+".crt")
				}
				data, err := os.ReadFile(file)
				if err != nil {
					return fmt.Errorf("the certificate to revoke: %w", err)
				}
				pems = append(pems, data)
			}
			crl := filepath.Join(dir, "ca.crl")
			serials, err := c.Revoke(crl, pems...)
			if err != nil {
				return err
			}
			for i, s := range serials {
				fmt.Fprintf(cmd.OutOrStdout(), "revoked %s (serial %x)\n", args[i], s)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "revocation list %s: give it to the servers (--client-crl-file, --peer-crl-file)\n", crl)
			return nil
		},
	}
	cmd.AddCommand(ca, issue, revoke)
	return cmd
}
