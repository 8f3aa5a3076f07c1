package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/groupkv/groupkv/internal/auth"
	"github.com/groupkv/groupkv/internal/node"
	"github.com/groupkv/groupkv/internal/server"
	"github.com/groupkv/groupkv/internal/storage"
	"github.com/groupkv/groupkv/internal/tlsfiles"
)

func serverCommand() *cobra.Command {
	var (
		cfg       server.Config
		logLevel  string
		mergeSize int64
		tlsFiles  serverTLSFiles
	)
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run a groupkv node",
		Long: `Run a groupkv node. With no flags it keeps its data under ./groupkv-data,
serves HTTP/JSON and gRPC on 127.0.0.1:7070 and listens for peers on
127.0.0.1:7071. Ctrl-C shuts it down cleanly.`,
		Args: argsBetween(0, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return usagef("--log-level %q: use debug, info, warn or error", logLevel)
			}
			for _, d := range []struct {
				flag string
				v    time.Duration
			}{{"txn-timeout", cfg.Node.TxnTimeout}, {"txn-idle-timeout", cfg.Node.TxnIdleTimeout}, {"max-txn-duration", cfg.Node.MaxTxnDuration}} {
				if d.v <= 0 {
					return usagef("--%s %v: give a positive duration", d.flag, d.v)
				}
			}
			cfg.Logger = slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			var err error
			if cfg.TLS, cfg.PeerTLS, err = tlsFiles.configs(); err != nil {
				return err
			}
			if tlsFiles.roles != "" {
				if tlsFiles.clientCA == "" {
					return usagef("--roles-file needs --client-ca-file: it names clients by the certificates they present")
				}
				if cfg.Roles, err = auth.Load(tlsFiles.roles); err != nil {
					return usagef("--roles-file: %v", err)
				}
			}
			switch {
			case !cmd.Flags().Changed("merge-size"):
				cfg.Node.MergeBytes = 0 // a quarter of the split size
			case mergeSize <= 0:
				cfg.Node.MergeBytes = -1
			default:
				cfg.Node.MergeBytes = mergeSize
			}
			if os.Getenv("GOGC") == "" {
				// A server's heap is small next to the machine's memory; a
				// collection every 2x growth instead of 1x halves GC work.
				debug.SetGCPercent(200)
			}
			if os.Getenv("GOMAXPROCS") == "" {
				runtime.GOMAXPROCS(serverProcs(runtime.GOMAXPROCS(0)))
			}
			// Signals are caught before the node says it serves, so that
			// one sent right after that line stops it cleanly.
			sig := make(chan os.Signal, 1)
			signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
			s, err := server.Start(cfg)
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "groupkv node %d serving on %s (peers: %s), data in %s\n", s.Node.ID(), s.Addr(), s.PeerAddr(), cfg.Node.DataDir)
			var failed error
			select {
			case got := <-sig:
				cfg.Logger.Info("shutting down", "signal", got.String())
			case <-s.Node.Failed():
				// Fail-stop: a node that could not read or write its own
				// state exits, and a supervisor's restart applies again
				// what its raft logs hold.
				failed = fmt.Errorf("node stopped serving: its storage failed: %v; restart it", s.Node.Failure())
				cfg.Logger.Error("storage failed; shutting down", "err", s.Node.Failure())
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if failed == nil {
				return s.Close(ctx)
			}
			// A node whose storage failed may not close: a write waiting
			// for a flush that will never succeed holds its loop. What it
			// acknowledged is in its log; it exits either way.
			closed := make(chan error, 1)
			go func() { closed <- s.Close(ctx) }()
			select {
			case <-closed:
			case <-time.After(failedCloseWait):
				cfg.Logger.Error("storage failed; the node did not close in time, exiting without it", "waited", failedCloseWait.String())
			}
			return failed
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Node.DataDir, "data-dir", "groupkv-data", "directory holding the node's data")
	f.StringVar(&cfg.Listen, "listen", "127.0.0.1:7070", "client address (HTTP/JSON and gRPC)")
	f.StringVar(&cfg.PeerListen, "peer-listen", "127.0.0.1:7071", "node-to-node address")
	f.StringSliceVar(&cfg.Node.Join, "join", nil, "peer address(es) of running cluster members to join (a new node only; a member restarts without it)")
	f.StringVar(&cfg.AdvertiseAddr, "advertise-addr", "", "client address other nodes and clients use (default: the --listen address)")
	f.StringVar(&cfg.AdvertisePeerAddr, "advertise-peer-addr", "", "peer address other nodes use (default: the host of --advertise-addr with the --peer-listen port)")
	f.Int64Var(&cfg.Node.SplitBytes, "split-size", 512<<20, "estimated bytes on disk above which a range shard splits at its middle key (negative: never)")
	f.Int64Var(&mergeSize, "merge-size", 512<<20/4, "estimated bytes on disk below which two adjacent range shards together merge (default: a quarter of --split-size; 0: never)")
	f.DurationVar(&cfg.Node.ConsistencyInterval, "consistency-interval", 10*time.Minute, "how often each shard's leader compares its replicas' checksums (negative: never)")
	f.Int64Var(&cfg.Node.ConsistencyRate, "consistency-rate", node.DefaultConsistencyRate, "bytes per second a replica reads when it sums its shard for a consistency check (negative: no limit)")
	f.Uint64Var(&cfg.Node.NodeID, "node-id", 0, "integer id of this node (default: the id stored in --data-dir, or 1 for a new one)")
	f.DurationVar(&cfg.Node.Retention, "retention", time.Hour, "how long old versions stay readable")
	f.IntVar(&cfg.Node.MaxValueSize, "max-value-size", 1<<20, "largest value accepted, in bytes")
	f.Uint64Var(&cfg.Node.TruncateAfter, "raft-log-entries", 10000, "applied entries a shard's raft log keeps for replicas that fall behind (a log every replica has is truncated sooner)")
	f.DurationVar(&cfg.Node.TxnTimeout, "txn-timeout", 5*time.Second, "how long a transaction's coordinator may go without a heartbeat before others may abort it (times its attempt number, up to 8); give every node of a cluster the same")
	f.DurationVar(&cfg.Node.TxnIdleTimeout, "txn-idle-timeout", 30*time.Second, "how long a session transaction may go without a request before its node aborts it")
	f.DurationVar(&cfg.Node.TxnRecordRetention, "txn-record-retention", 0, "how long the record of a finished transaction is kept after it was decided and resolved (default: 4 × --txn-idle-timeout; negative: forever)")
	f.DurationVar(&cfg.Node.MaxTxnDuration, "max-txn-duration", time.Minute, "longest a transaction attempt may run from its start to its commit")
	f.DurationVar(&cfg.Node.StorageFailureLimit, "storage-failure-limit", storage.DefaultBackgroundFailureLimit, "how long the storage's flushes, or its compactions, may fail every time they are tried (a full or failing disk) before the server stops (negative: never)")
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error")
	f.Int64Var(&cfg.Node.MinFreeBytes, "min-free-space", storage.DefaultMinFreeBytes, "bytes the node keeps free on its disk, so that no write finds no room: below it a node alone refuses writes (503) and serves reads until the disk has a quarter more free, and stops below half of it; a node in a cluster stops (negative: no check)")
	f.IntVar(&cfg.MaxConnections, "max-connections", 0, "client connections served at once; more wait to be accepted (default: what the open file limit leaves after the storage's share, at most 10000)")
	f.StringVar(&tlsFiles.cert, "cert-file", "", "certificate the client port serves, HTTP/JSON and gRPC alike, over TLS only (with --key-file; read again when it changes)")
	f.StringVar(&tlsFiles.key, "key-file", "", "key of --cert-file")
	f.StringVar(&tlsFiles.clientCA, "client-ca-file", "", "CA certificates of the clients the client port accepts: each must present a certificate one of them signed (needs --cert-file; read again when it changes)")
	f.StringVar(&tlsFiles.clientCRL, "client-crl-file", "", "certificate revocation list, signed by a CA of --client-ca-file: the client certificates it lists are refused (groupkv certs revoke; read again when it changes)")
	f.StringVar(&tlsFiles.roles, "roles-file", "", "roles of the clients, by their certificates' common names: lines of NAME ROLE (read, write or admin; * for any other client); requests beyond a client's role answer 403 permission_denied (needs --client-ca-file; read again when it changes)")
	f.StringVar(&tlsFiles.peerCert, "peer-cert-file", "", "certificate of this node on the peer port, served and presented to the nodes it dials: mutual TLS between nodes (with --peer-key-file and --peer-ca-file; list every name other nodes dial it by)")
	f.StringVar(&tlsFiles.peerKey, "peer-key-file", "", "key of --peer-cert-file")
	f.StringVar(&tlsFiles.peerCA, "peer-ca-file", "", "CA certificates of the cluster's nodes: a peer's certificate must be signed by one of them, both ways (read again when it changes)")
	f.StringVar(&tlsFiles.peerCRL, "peer-crl-file", "", "certificate revocation list, signed by a CA of --peer-ca-file: the node certificates it lists are refused, both ways (read again when it changes)")
	f.BoolVar(&cfg.Pprof, "pprof", false, "serve Go's CPU, heap, allocation and lock-contention profiles under /debug/pprof/ on the client address")
	return cmd
}

// serverTLSFiles are the server's TLS flags.
type serverTLSFiles struct {
	cert, key, clientCA, clientCRL     string
	peerCert, peerKey, peerCA, peerCRL string
	roles                              string
}

// configs answers the TLS configurations of the client port and of the
// peer port, nil for a port served in the clear.
func (f serverTLSFiles) configs() (client, peer *tls.Config, err error) {
	switch {
	case f.cert != "" || f.key != "":
		if f.clientCRL != "" && f.clientCA == "" {
			return nil, nil, usagef("--client-crl-file needs --client-ca-file: it revokes client certificates, which are asked for only then")
		}
		if client, err = tlsfiles.Server(f.cert, f.key, f.clientCA, f.clientCRL); err != nil {
			return nil, nil, usagef("--cert-file, --key-file, --client-ca-file and --client-crl-file: %v", err)
		}
	case f.clientCA != "" || f.clientCRL != "":
		return nil, nil, usagef("--client-ca-file and --client-crl-file need --cert-file and --key-file: client certificates are asked for over TLS")
	}
	if f.peerCert != "" || f.peerKey != "" || f.peerCA != "" || f.peerCRL != "" {
		if peer, err = tlsfiles.Peer(f.peerCert, f.peerKey, f.peerCA, f.peerCRL); err != nil {
			return nil, nil, usagef("--peer-cert-file, --peer-key-file, --peer-ca-file and --peer-crl-file: %v", err)
		}
	}
	return client, peer, nil
}

// serverProcs is the GOMAXPROCS a server runs with where Go would run
// procs: twice as many on a machine of fewer than four, up to four. With
// one scheduler slot per core, a write's path (the raft loop woken by its
// fsync, the handler woken by the loop) waits behind every request
// queued for those slots; with more threads than cores the kernel
// interleaves them. On 2 cores it measured 6% more throughput under YCSB
// A with a fifth less p99, 5% more under E, and 5% less under C (reads
// only), where the extra threads cost CPU (docs/benchmarks.md).
func serverProcs(procs int) int {
	if procs >= 4 {
		return procs
	}
	return min(2*procs, 4)
}

// failedCloseWait bounds how long a node whose storage failed is given to
// close before the server exits without it.
const failedCloseWait = 15 * time.Second
