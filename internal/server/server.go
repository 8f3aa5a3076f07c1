// Package server runs a groupkv node behind its client port (HTTP/JSON and
// gRPC on one listener) and its peer port. It is what `groupkv server` runs
// and what end-to-end tests start in-process.
//
// server may import node and api; nothing imports server but cmd/groupkv.
package server

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/groupkv/groupkv/internal/api"
	"github.com/groupkv/groupkv/internal/auth"
	"github.com/groupkv/groupkv/internal/node"
	"github.com/groupkv/groupkv/internal/storage"
)

// Config configures a server.
type Config struct {
	Node node.Options
	// Listen is the client address (HTTP/JSON and gRPC); "127.0.0.1:0" picks
	// a port.
	Listen string
	// PeerListen is the node-to-node address.
	PeerListen string
	// AdvertiseAddr and AdvertisePeerAddr are the addresses other nodes and
	// clients use, when they differ from the bound ones ("" means the bound
	// address; a peer address defaults to AdvertiseAddr's host with the
	// bound peer port).
	AdvertiseAddr, AdvertisePeerAddr string
	// Pprof serves Go's profiles under /debug/pprof/ on the client address.
	Pprof bool
	// MaxConnections bounds the client connections served at once; more
	// wait to be accepted. 0 means what the process's file descriptor
	// limit leaves after the storage's share (storage.FileReserve) and
	// the peer port's, at most DefaultMaxConnections: connections beyond
	// that would take the descriptors the storage needs, and a node that
	// cannot open a file stops (connectionLimits).
	MaxConnections int
	// IdleTimeout is how long a client connection may go without a
	// request (HTTP) or a call (gRPC) before the server closes it, so that
	// idle connections do not keep others waiting under MaxConnections; 0
	// means 2 minutes. A gRPC connection with a stream open (the Go
	// client's Pipeline) is not idle.
	IdleTimeout time.Duration
	// TLS, when set, serves the client port over TLS only, HTTP/JSON and
	// gRPC alike (tlsfiles.Server); nil serves it in the clear. Start
	// wraps it with api.MuxTLS, which answers each client the ALPN
	// protocol that reaches the right server.
	TLS *tls.Config
	// PeerTLS, when set, serves the peer port over TLS only and should
	// require client certificates (tlsfiles.Peer): anyone who can reach a
	// peer port in the clear can speak for a node. The node dials other
	// nodes with Node.PeerTLS, which Start sets to PeerTLS when unset.
	PeerTLS *tls.Config
	// Roles, when set, checks every request of the client port against
	// its client's role (package auth), the client named by the
	// certificate it presented: TLS must ask for client certificates.
	Roles  *auth.Roles
	Logger *slog.Logger
}

// DefaultMaxConnections is the most client connections served at once by
// default, where the file descriptor limit allows more.
const DefaultMaxConnections = 10000

// minConnections is the fewest client connections a server starts with.
const minConnections = 16

// maxPeerConnections is the most node-to-node connections a server
// accepts at once: a few per other node, for clusters of hundreds.
const maxPeerConnections = 1024

// connectionLimits answers the client and the peer connections a server
// serves at once: of what the descriptor limit leaves after the storage's
// share, a quarter (up to maxPeerConnections) for peers and the rest (up
// to DefaultMaxConnections) for clients, or configured clients if set.
// Connections beyond them wait to be accepted, so that neither port can
// take the descriptors the storage needs.
func connectionLimits(configured int, fileLimit uint64) (clients, peers int, err error) {
	if configured < 0 {
		return 0, 0, fmt.Errorf("server: a connection limit of %d: want 0 (from the open file limit) or more", configured)
	}
	if fileLimit == 0 {
		return cmp.Or(configured, DefaultMaxConnections), maxPeerConnections, nil
	}
	reserve := storage.FileReserve(fileLimit)
	if fileLimit < reserve+2*minConnections {
		return 0, 0, fmt.Errorf("server: the limit of %d open files leaves no room for connections (the storage needs up to %d); raise it (ulimit -n)", fileLimit, reserve)
	}
	left := fileLimit - reserve
	peers = int(min(max(left/4, minConnections), maxPeerConnections))
	clients = int(min(left-uint64(peers), DefaultMaxConnections))
	return cmp.Or(configured, clients), peers, nil
}

// Server is a running node with its listeners.
type Server struct {
	Node     *node.Node
	cfg      Config
	mux      *api.Mux
	grpcSrv  *grpc.Server
	httpSrv  *http.Server
	peerL    net.Listener
	peerSrv  *grpc.Server
	serveErr chan error
	// cancelRequests ends every request in flight (Close).
	cancelRequests context.CancelFunc
	// draining, closed by Close, ends the Pipeline streams.
	draining  chan struct{}
	drainOnce sync.Once
	// openConns counts the client connections open.
	openConns prometheus.Gauge
}

// registerGauge registers a gauge named name with reg, or answers the one
// reg holds under that name.
func registerGauge(reg prometheus.Registerer, name, help string) prometheus.Gauge {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
	if err := reg.Register(g); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(prometheus.Gauge); ok {
				return existing
			}
		}
		panic(err)
	}
	return g
}

// countingListener counts in open the connections it accepted that are
// not closed yet.
type countingListener struct {
	net.Listener
	open prometheus.Gauge
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.open.Inc()
	return &countedConn{Conn: c, open: l.open}, nil
}

type countedConn struct {
	net.Conn
	open prometheus.Gauge
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(c.open.Dec)
	return c.Conn.Close()
}

// maxMessage is the largest gRPC message: a request of the largest value
// with room for its envelope.
const maxMessage = 64 << 20

// Start opens the node and starts serving. It returns once the listeners
// are bound; the node may not be ready yet (see /healthz).
// streamWorkers is the least number of gRPC stream workers: requests in
// flight beyond it each start a goroutine.
const streamWorkers = 256

func Start(cfg Config) (*Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.IdleTimeout == 0 {
		cfg.IdleTimeout = 2 * time.Minute
	}
	cfg.Node.Logger = cfg.Logger
	if cfg.Roles != nil && (cfg.TLS == nil || cfg.TLS.ClientAuth == tls.NoClientCert) {
		return nil, errors.New("server: a roles file names clients by their certificates: serve the client port over TLS and ask for client certificates")
	}
	if cfg.Node.PeerTLS == nil {
		cfg.Node.PeerTLS = cfg.PeerTLS
	}
	if cfg.Node.Registry == nil {
		cfg.Node.Registry = prometheus.NewRegistry()
	}
	conns, peerConns, err := connectionLimits(cfg.MaxConnections, storage.FileLimit())
	if err != nil {
		return nil, err
	}
	// The node first: a second server on the same data directory is refused
	// by the directory's lock before it touches any port.
	n, err := node.Open(cfg.Node)
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		n.Close()
		return nil, fmt.Errorf("server: listening on %s: %w", cfg.Listen, err)
	}
	// Connections beyond the limit wait in the kernel's accept queue.
	open := registerGauge(cfg.Node.Registry, "groupkv_client_connections", "Client connections open (HTTP and gRPC).")
	open.Set(0) // a server started again on the registry of one closed
	registerGauge(cfg.Node.Registry, "groupkv_client_connections_max",
		"Client connections served at once (--max-connections); more wait to be accepted.").Set(float64(conns))
	l = netutil.LimitListener(&countingListener{Listener: l, open: open}, conns)
	if cfg.TLS != nil {
		// The handshake runs in the mux's peek, under its deadline.
		l = tls.NewListener(l, api.MuxTLS(cfg.TLS))
	}
	peerL, err := net.Listen("tcp", cfg.PeerListen)
	if err != nil {
		l.Close()
		n.Close()
		return nil, fmt.Errorf("server: listening on peer address %s: %w", cfg.PeerListen, err)
	}
	peerL = netutil.LimitListener(peerL, peerConns)
	registerCertificateExpiry(cfg.Node.Registry, map[string]*tls.Config{"client": cfg.TLS, "peer": cfg.PeerTLS})
	metrics := api.NewMetrics(cfg.Node.Registry)
	s := &Server{Node: n, cfg: cfg, peerL: peerL, serveErr: make(chan error, 2), openConns: open}
	// Requests run under baseCtx so that Close can end long-lived ones
	// (watch streams), which Shutdown alone would wait for.
	baseCtx, cancelRequests := context.WithCancel(context.Background())
	s.cancelRequests = cancelRequests
	s.draining = make(chan struct{})
	s.grpcSrv = api.NewGRPCServerWith(n, api.GRPCConfig{Observe: metrics.Observe, Draining: s.draining, Roles: cfg.Roles},
		grpc.MaxRecvMsgSize(maxMessage), grpc.MaxSendMsgSize(maxMessage),
		// Reused workers keep their grown stacks; a goroutine per request
		// would grow its stack anew on every deep read. A request that
		// finds every worker busy gets such a goroutine, so there are
		// workers for more requests in flight than there are cores: an
		// idle worker costs its stack, a few KiB.
		grpc.NumStreamWorkers(uint32(max(streamWorkers, 16*runtime.GOMAXPROCS(0)))),
		// A connection without a call for IdleTimeout is closed (clients
		// reconnect when they call again): with connections bounded
		// (MaxConnections), idle ones would keep others waiting.
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: cfg.IdleTimeout}),
		grpc.ChainUnaryInterceptor(api.GRPCMetricsInterceptor(metrics.Observe)),
		grpc.ChainStreamInterceptor(api.GRPCStreamMetricsInterceptor(metrics.Observe)))
	var handler http.Handler = api.NewHTTPHandler(n, api.HTTPConfig{
		MaxValueSize: cfg.Node.MaxValueSize,
		Metrics:      metrics,
		Extra:        promhttp.HandlerFor(cfg.Node.Registry, promhttp.HandlerOpts{}),
		Roles:        cfg.Roles,
	})
	if cfg.Pprof {
		handler = withPprof(handler, cfg.Roles)
		// Contended locks, one in 100 sampled: /debug/pprof/mutex.
		runtime.SetMutexProfileFraction(100)
	}
	s.httpSrv = &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       cfg.IdleTimeout,
		BaseContext:       func(net.Listener) context.Context { return baseCtx },
		ConnContext:       api.ConnContext,
		ErrorLog:          slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn),
	}
	s.mux = api.NewMux(l, s.grpcSrv, s.httpSrv, api.MuxConfig{})
	// The peer port carries node-to-node traffic: raft messages, the peer
	// service and the standard health service.
	peerOpts := []grpc.ServerOption{grpc.MaxRecvMsgSize(1 << 30), grpc.MaxSendMsgSize(1 << 30),
		// A connection that has not finished its handshake (TLS, and
		// HTTP/2's preface) in time is closed: it holds one of the peer
		// port's few slots.
		grpc.ConnectionTimeout(10 * time.Second)}
	if cfg.PeerTLS != nil {
		peerOpts = append(peerOpts, grpc.Creds(credentials.NewTLS(cfg.PeerTLS)))
	}
	s.peerSrv = grpc.NewServer(peerOpts...)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(s.peerSrv, hs)
	n.RegisterPeer(s.peerSrv)
	go func() { s.serveErr <- s.mux.Serve() }()
	go func() { s.serveErr <- s.peerSrv.Serve(peerL) }()
	adv, advPeer, err := advertised(cfg, l.Addr().String(), peerL.Addr().String())
	if err != nil {
		s.Close(context.Background())
		return nil, err
	}
	n.Serve(adv, advPeer)
	cfg.Logger.Info("groupkv node started", "node", n.ID(), "listen", l.Addr().String(),
		"peer_listen", peerL.Addr().String(), "data_dir", cfg.Node.DataDir, "max_connections", conns,
		"tls", cfg.TLS != nil, "peer_tls", cfg.PeerTLS != nil, "roles", cfg.Roles != nil)
	if cfg.PeerTLS == nil && !isLoopback(peerL.Addr()) {
		cfg.Logger.Warn("the peer port is served in the clear on an address other machines may reach: anyone who reaches it can speak for a node; serve it over mutual TLS (--peer-cert-file, --peer-key-file, --peer-ca-file) or keep it on a private network",
			"peer_listen", peerL.Addr().String())
	}
	return s, nil
}

// registerCertificateExpiry registers groupkv_tls_certificate_expiry_seconds,
// when the certificate each port serves expires (a Unix time, read at each
// scrape, so a renewed certificate shows), for an alert well before a port
// stops taking connections. Ports served in the clear (nil) have none.
func registerCertificateExpiry(reg prometheus.Registerer, ports map[string]*tls.Config) {
	for port, cfg := range ports {
		if cfg == nil {
			continue
		}
		g := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "groupkv_tls_certificate_expiry_seconds",
			Help:        "When the certificate a port serves expires, in seconds since the Unix epoch.",
			ConstLabels: prometheus.Labels{"port": port},
		}, func() float64 {
			leaf := servedLeaf(cfg)
			if leaf == nil {
				return 0
			}
			return float64(leaf.NotAfter.Unix())
		})
		if err := reg.Register(g); err != nil {
			// A server started again on the registry of one closed
			// replaces the old gauge, which reads the old configuration.
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				panic(err)
			}
			reg.Unregister(are.ExistingCollector)
			reg.MustRegister(g)
		}
	}
}

// servedLeaf answers the certificate cfg serves now, or nil.
func servedLeaf(cfg *tls.Config) *x509.Certificate {
	var cert *tls.Certificate
	switch {
	case cfg.GetCertificate != nil:
		cert, _ = cfg.GetCertificate(&tls.ClientHelloInfo{})
	case len(cfg.Certificates) > 0:
		cert = &cfg.Certificates[0]
	}
	if cert == nil || len(cert.Certificate) == 0 {
		return nil
	}
	if cert.Leaf != nil {
		return cert.Leaf
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return nil
	}
	return leaf
}

// isLoopback reports whether addr is bound to a loopback address only.
func isLoopback(addr net.Addr) bool {
	ta, ok := addr.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}

// advertised returns the addresses the node announces to the cluster.
func advertised(cfg Config, bound, boundPeer string) (string, string, error) {
	adv, advPeer := cfg.AdvertiseAddr, cfg.AdvertisePeerAddr
	if adv == "" {
		adv = bound
	}
	if _, _, err := net.SplitHostPort(adv); err != nil {
		return "", "", fmt.Errorf("server: advertise address %q: %w", adv, err)
	}
	if advPeer == "" {
		if cfg.AdvertiseAddr == "" {
			advPeer = boundPeer
		} else {
			host, _, _ := net.SplitHostPort(adv)
			_, port, err := net.SplitHostPort(boundPeer)
			if err != nil {
				return "", "", err
			}
			advPeer = net.JoinHostPort(host, port)
		}
	}
	if _, _, err := net.SplitHostPort(advPeer); err != nil {
		return "", "", fmt.Errorf("server: advertise peer address %q: %w", advPeer, err)
	}
	return adv, advPeer, nil
}

// Addr is the client address.
func (s *Server) Addr() string { return s.mux.Addr().String() }

// PeerAddr is the peer address.
func (s *Server) PeerAddr() string { return s.peerL.Addr().String() }

// Close stops accepting, drains requests in flight for up to the context's
// deadline, then closes the node.
func (s *Server) Close(ctx context.Context) error {
	s.mux.Close()
	// Pipeline streams answer what they serve and end (GracefulStop
	// would wait for them): their clients send again elsewhere.
	s.drainOnce.Do(func() { close(s.draining) })
	// Requests in flight get a moment to finish; streams that would not
	// (watches) are then cancelled, so Shutdown does not wait for them.
	drained := make(chan struct{})
	defer close(drained)
	go func() {
		select {
		case <-time.After(time.Second):
			s.cancelRequests()
			s.grpcSrv.Stop()
		case <-drained:
		}
	}()
	defer s.cancelRequests()
	done := make(chan struct{})
	go func() {
		s.grpcSrv.GracefulStop()
		close(done)
	}()
	herr := s.httpSrv.Shutdown(ctx)
	select {
	case <-done:
	case <-ctx.Done():
		s.grpcSrv.Stop()
	}
	s.peerSrv.Stop()
	nerr := s.Node.Close()
	if herr != nil && !errors.Is(herr, context.DeadlineExceeded) {
		return herr
	}
	return nerr
}

// withPprof serves /debug/pprof/ from net/http/pprof and everything else
// from h (which must see its paths uncleaned, so no ServeMux in front of it).
func withPprof(h http.Handler, roles *auth.Roles) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/debug/pprof/") {
			if err := roles.Check(r.Context(), auth.Admin, "profiling"); err != nil {
				http.Error(w, err.Error(), http.StatusForbidden)
				return
			}
			mux.ServeHTTP(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
}
