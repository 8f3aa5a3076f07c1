package main

import (
	"crypto/tls"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	groupkv "github.com/groupkv/groupkv"
	"github.com/groupkv/groupkv/internal/tlsfiles"
)

// remote is the server a client command talks to: its client address
// and, for a server that serves TLS, how to reach it.
type remote struct {
	addr   string
	tls    *tls.Config  // nil: in the clear
	client *http.Client // for its HTTP API; one per remote, so that repeated requests reuse connections
}

// remoteOf reads the command's --addr and TLS flags (addAddrFlag).
func remoteOf(cmd *cobra.Command) (remote, error) {
	f := cmd.Flags()
	addr, _ := f.GetString("addr")
	ca, _ := f.GetString("ca-file")
	cert, _ := f.GetString("cert-file")
	key, _ := f.GetString("key-file")
	r := remote{addr: addr, client: http.DefaultClient}
	if ca == "" && cert == "" && key == "" {
		return r, nil
	}
	cfg, err := tlsfiles.Client(ca, cert, key)
	if err != nil {
		return remote{}, usagef("--ca-file, --cert-file and --key-file: %v", err)
	}
	r.tls = cfg
	r.client = &http.Client{Transport: &http.Transport{TLSClientConfig: cfg, Proxy: http.ProxyFromEnvironment,
		IdleConnTimeout: 90 * time.Second}}
	return r, nil
}

// url answers the HTTP URL of path on the server.
func (r remote) url(path string) string {
	if r.tls != nil {
		return "https://" + r.addr + path
	}
	return "http://" + r.addr + path
}

// dial connects the Go client to the server.
func (r remote) dial() (groupkv.DB, error) {
	if r.tls != nil {
		return groupkv.Dial(r.addr, groupkv.WithTLS(r.tls))
	}
	return groupkv.Dial(r.addr)
}

// dial connects to the server named by the command's --addr and TLS flags.
func dial(cmd *cobra.Command) (groupkv.DB, error) {
	r, err := remoteOf(cmd)
	if err != nil {
		return nil, err
	}
	return r.dial()
}

// addAddrFlag adds --addr and the flags of a server served over TLS.
func addAddrFlag(cmd *cobra.Command) {
	cmd.Flags().String("addr", defaultAddr, "server address as host:port (no scheme)")
	addTLSFlags(cmd)
}

// addTLSFlags adds the flags of a client of a server served over TLS,
// which remoteOf reads.
func addTLSFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.String("ca-file", "", "CA certificates trusted to sign the server's certificate: talk to it over TLS (groupkv server --cert-file)")
	f.String("cert-file", "", "client certificate, for a server that asks for one (groupkv server --client-ca-file; with --key-file)")
	f.String("key-file", "", "key of --cert-file")
}
