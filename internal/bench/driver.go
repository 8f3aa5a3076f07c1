package bench

import (
	"context"
	"crypto/tls"
	"fmt"
	"strings"
	"time"

	groupkv "github.com/groupkv/groupkv"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// Driver is one system under test, reached through its ordinary Go client.
// Every method is safe for concurrent use; the runner calls the record
// methods from all its clients at once. The runner owns none of the byte
// slices it passes: a driver must not keep them after the call returns.
//
// A record method answers an error for an operation that did not succeed;
// the runner counts it and goes on. A read of an absent record answers an
// error wrapping ErrNotFound.
type Driver interface {
	// System is the system's name in results: "groupkv", "etcd", "redis".
	System() string
	// Version describes the server (and for groupkv, the build), as well as
	// the system lets a client find out.
	Version(ctx context.Context) (string, error)
	// Reset removes every record a previous run left and prepares an empty
	// table; the load phase calls it first.
	Reset(ctx context.Context) error
	// Check answers ErrNotLoaded when the table is missing or empty.
	Check(ctx context.Context) error
	// Load writes records in one request or a few (the load phase).
	Load(ctx context.Context, keys, values [][]byte) error

	Read(ctx context.Context, key []byte) error
	Update(ctx context.Context, key, value []byte) error
	Insert(ctx context.Context, key, value []byte) error
	// Scan reads up to n records from key on, in key order, and answers how
	// many it read.
	Scan(ctx context.Context, key []byte, n int) (int, error)

	Close() error
}

// DriverOptions configure a driver. The zero value means the defaults.
type DriverOptions struct {
	// Table is the collection (groupkv), key prefix (etcd, Redis) holding
	// the records; "" means "usertable", YCSB's name.
	Table string
	// Shards is the shard count of the groupkv collection Reset creates;
	// 0 means groupkv's default.
	Shards int
	// Replicas is the replication factor of the groupkv collections the
	// driver creates; 0 means groupkv's default (3 on a cluster of three
	// nodes or more, else the node count).
	Replicas int
	// Conns is the connection pool size (Redis); 0 means 64, one per
	// default client, since a Redis connection carries one request at a
	// time. The gRPC clients (groupkv, etcd) multiplex one connection.
	Conns int
	// DialTimeout bounds connecting; 0 means 10 seconds.
	DialTimeout time.Duration
	// TLS, when set, reaches groupkv servers over TLS (their gRPC, and the
	// /metrics the CPU is read from).
	TLS *tls.Config
	// NoCachedSnapshot makes the groups driver's group transactions read
	// the group's snapshot from its leader each time, instead of from
	// the one their last commit brought back (groupkv.WithCachedSnapshot).
	NoCachedSnapshot bool
}

// EnsureDefaults fills the defaults of zero fields.
func (o *DriverOptions) EnsureDefaults() {
	if o.Table == "" {
		o.Table = "usertable"
	}
	if o.Conns == 0 {
		o.Conns = 64
	}
	if o.DialTimeout == 0 {
		o.DialTimeout = 10 * time.Second
	}
}

// dialOptions are the Go client's options of a groupkv driver.
func (o DriverOptions) dialOptions() []groupkv.DialOption {
	opts := []groupkv.DialOption{groupkv.WithDialTimeout(o.DialTimeout)}
	if o.TLS != nil {
		opts = append(opts, groupkv.WithTLS(o.TLS))
	}
	return opts
}

// transportCredentials are those of a groupkv driver's own gRPC
// connections.
func (o DriverOptions) transportCredentials() credentials.TransportCredentials {
	if o.TLS != nil {
		return credentials.NewTLS(o.TLS)
	}
	return insecure.NewCredentials()
}

// Targets lists the systems Open knows, in the order results show them.
var Targets = []string{"groupkv", "etcd", "redis"}

// DefaultAddr is the address of each target's server started with its
// defaults.
var DefaultAddr = map[string]string{
	"groupkv": "127.0.0.1:7070",
	"etcd":    "127.0.0.1:2379",
	"redis":   "127.0.0.1:6379",
}

// Open connects the driver of target to the server at addr (host:port).
// For groupkv and etcd, addr may list the nodes (members) of a cluster,
// comma-separated: the driver then connects to each and spreads the
// clients of a run over them (see OpenGroupKV, OpenEtcd). Redis takes one
// address.
func Open(ctx context.Context, target, addr string, opts DriverOptions) (Driver, error) {
	switch strings.ToLower(target) {
	case "groupkv":
		return OpenGroupKV(ctx, addr, opts)
	case "etcd":
		return OpenEtcd(ctx, addr, opts)
	case "redis":
		if len(SplitAddrs(addr)) > 1 {
			return nil, fmt.Errorf("%w: redis takes one address, not %q", ErrInvalidOptions, addr)
		}
		return OpenRedis(ctx, addr, opts)
	}
	return nil, fmt.Errorf("%w: %q (use %s)", ErrUnknownTarget, target, strings.Join(Targets, ", "))
}

// SplitAddrs splits a comma-separated list of addresses, dropping blanks.
func SplitAddrs(addr string) []string {
	var out []string
	for _, a := range strings.Split(addr, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// clientKey is the context key of the index of the runner's client that
// makes a driver call.
type clientKey struct{}

// withClient marks ctx as the context of the runner's client id.
func withClient(ctx context.Context, id int) context.Context {
	return context.WithValue(ctx, clientKey{}, id)
}

// clientOf answers the index of the runner's client whose call ctx is, if
// it is one.
func clientOf(ctx context.Context) (int, bool) {
	id, ok := ctx.Value(clientKey{}).(int)
	return id, ok
}

// spread picks which of n connections serves a call on ctx: client i of a
// run always uses connection i mod n, so a run's clients are spread evenly
// over the connections and each keeps to one, as a client of a real
// deployment keeps to the node it was given; calls that are not a client's
// (Reset, Check, Version) use connection 0.
func spread(ctx context.Context, n int) int {
	if n <= 1 {
		return 0
	}
	if id, ok := clientOf(ctx); ok && id >= 0 {
		return id % n
	}
	return 0
}
