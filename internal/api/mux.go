package api

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
)

// http2Preface is the client connection preface of HTTP/2 (RFC 9113, 3.4).
// A gRPC client sends it first; an HTTP/1.x client never does.
const http2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// DefaultPeekTimeout bounds the wait for a connection's first bytes when
// MuxConfig.PeekTimeout is zero. Clients of both protocols speak first and
// at once, so a connection silent this long is dead or hostile; 10s leaves
// room for a slow TLS handshake on a lossy link.
const DefaultPeekTimeout = 10 * time.Second

// ErrMuxClosed is returned by Mux.Serve after Close.
var ErrMuxClosed = errors.New("api: mux closed")

// MuxConfig configures a Mux. The zero value of every field means its
// default.
type MuxConfig struct {
	// PeekTimeout bounds the wait for the first bytes of a connection, TLS
	// handshake included when the listener is a tls.Listener; a connection
	// that has not told its protocol by then is closed. Zero or negative
	// means DefaultPeekTimeout.
	PeekTimeout time.Duration
}

// Mux serves gRPC and HTTP/1.x on one listener. It peeks at the first bytes
// of every connection it accepts: a connection that opens with the HTTP/2
// client preface goes to the gRPC server, any other to the HTTP server. Each
// server sees a listener of its own that yields the connections routed to
// it, with the peeked bytes put back.
//
// The peek happens in a goroutine per connection under a read deadline, so a
// client that connects and stays silent delays no one and is closed after
// PeekTimeout.
//
// The mux sees the bytes the listener yields. To serve TLS, wrap the
// listener with tls.NewListener and a configuration from MuxTLS, and give
// both servers no TLS of their own; the handshake then runs inside the
// peek, under its deadline. HTTP/2 for anything but gRPC is not routed to
// the HTTP server (MuxTLS keeps HTTP clients on HTTP/1.1).
//
// Shutdown. Stop a node in this order:
//
//  1. Close the Mux. The port stops accepting, connections still being
//     peeked are closed, and the servers' listeners report net.ErrClosed,
//     so grpcSrv.Serve and httpSrv.Serve return. Connections already handed
//     to a server stay open.
//  2. Drain those: grpcSrv.GracefulStop() and httpSrv.Shutdown(ctx), in
//     either order or concurrently (grpcSrv.Stop and httpSrv.Close to cut
//     them instead).
//
// Serve returns ErrMuxClosed once its own goroutines and both servers' Serve
// calls have returned, which step 1 alone brings about. The reverse order
// works too but is worse for clients: a server that stops first closes its
// listener, and from then on the mux accepts its clients' connections only
// to close them.
type Mux struct {
	l           net.Listener
	grpcSrv     *grpc.Server // nil: gRPC connections are closed
	httpSrv     *http.Server // nil: HTTP connections are closed
	grpcL       *subListener
	httpL       *subListener
	peekTimeout time.Duration

	serving   atomic.Bool
	done      chan struct{} // closed by Close
	closeOnce sync.Once
	closeErr  error
	peeks     sync.WaitGroup // one per connection being peeked or handed over

	mu struct {
		sync.Mutex
		// closed is set by Close; no connection is added to pending after.
		closed bool
		// pending are the connections being peeked, which Close closes.
		// Nothing blocking is done while holding mu.
		pending map[net.Conn]struct{}
	}
}

// MuxTLS answers base set up for the tls.Listener of a Mux, which tells
// gRPC from HTTP by the HTTP/2 preface: a client that offers HTTP/1.1
// among its ALPN protocols (curl, browsers, Go's http.Client) is answered
// "http/1.1", so it speaks HTTP/1.1 and reaches the HTTP server; one that
// offers only "h2" (gRPC clients, which insist on it) is answered "h2".
// base's own NextProtos and GetConfigForClient are not used.
func MuxTLS(base *tls.Config) *tls.Config {
	h1, h2 := base.Clone(), base.Clone()
	h1.NextProtos, h2.NextProtos = []string{"http/1.1"}, []string{"h2"}
	h1.GetConfigForClient, h2.GetConfigForClient = nil, nil
	cfg := h1.Clone()
	cfg.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		if slices.Contains(hello.SupportedProtos, "h2") && !slices.Contains(hello.SupportedProtos, "http/1.1") {
			return h2, nil
		}
		return h1, nil
	}
	return cfg
}

// NewMux returns a Mux that routes the connections of l between grpcSrv and
// httpSrv; either may be nil, and then the connections meant for it are
// closed. Call Serve to start it. The Mux owns l: Close closes it.
func NewMux(l net.Listener, grpcSrv *grpc.Server, httpSrv *http.Server, cfg MuxConfig) *Mux {
	if cfg.PeekTimeout <= 0 {
		cfg.PeekTimeout = DefaultPeekTimeout
	}
	m := &Mux{
		l:           l,
		grpcSrv:     grpcSrv,
		httpSrv:     httpSrv,
		peekTimeout: cfg.PeekTimeout,
		done:        make(chan struct{}),
	}
	m.grpcL = newSubListener(l.Addr())
	m.httpL = newSubListener(l.Addr())
	m.mu.pending = make(map[net.Conn]struct{})
	return m
}

// Serve serves gRPC and HTTP on l with the default MuxConfig until l fails
// or is closed, and then returns the error of l.Accept (net.ErrClosed after
// l.Close). See Mux for the shutdown order; use NewMux to be able to Close.
func Serve(l net.Listener, grpcSrv *grpc.Server, httpSrv *http.Server) error {
	return NewMux(l, grpcSrv, httpSrv, MuxConfig{}).Serve()
}

// Serve accepts connections and routes them, runs grpcSrv.Serve and
// httpSrv.Serve on their listeners, and returns when all of that has
// stopped: ErrMuxClosed after Close, else the error that stopped it (the
// listener's, or an unexpected one of a server's Serve), after closing the
// Mux. A server whose Serve returns because it was stopped or shut down is
// not an error; the mux keeps serving the other and closes the connections
// meant for the stopped one. Serve may be called once.
func (m *Mux) Serve() error {
	if !m.serving.CompareAndSwap(false, true) {
		return errors.New("api: Mux.Serve called twice")
	}
	var servers sync.WaitGroup
	serverErrs := make(chan error, 2)
	run := func(l *subListener, serve func(net.Listener) error) {
		servers.Add(1)
		go func() {
			defer servers.Done()
			err := serve(l)
			l.Close() // both servers close it already; do not rely on it
			if !isServerStopped(err) {
				serverErrs <- err
				m.Close()
			}
		}()
	}
	if m.grpcSrv != nil {
		run(m.grpcL, m.grpcSrv.Serve)
	} else {
		m.grpcL.Close()
	}
	if m.httpSrv != nil {
		run(m.httpL, m.httpSrv.Serve)
	} else {
		m.httpL.Close()
	}

	err := m.acceptLoop()
	m.Close()
	m.peeks.Wait()
	servers.Wait()
	select {
	case serr := <-serverErrs:
		return serr
	default:
	}
	return err
}

// isServerStopped reports whether err is what a server's Serve returns when
// it was stopped or its listener closed, as opposed to a failure.
func isServerStopped(err error) bool {
	return err == nil || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, http.ErrServerClosed) || errors.Is(err, grpc.ErrServerStopped)
}

// acceptLoop accepts connections until Close or a listener failure, and
// starts a goroutine per connection to route it.
func (m *Mux) acceptLoop() error {
	var backoff time.Duration
	for {
		c, err := m.l.Accept()
		if err != nil {
			if m.isClosed() {
				return ErrMuxClosed
			}
			var te interface{ Temporary() bool }
			if errors.As(err, &te) && te.Temporary() {
				// Out of file descriptors and the like: back off as
				// http.Server does, up to a second.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				select {
				case <-time.After(backoff):
					continue
				case <-m.done:
					return ErrMuxClosed
				}
			}
			return err
		}
		backoff = 0
		if !m.track(c) {
			c.Close()
			return ErrMuxClosed
		}
		m.peeks.Add(1)
		go m.route(c)
	}
}

// route peeks at c and hands it to the server of its protocol.
func (m *Mux) route(c net.Conn) {
	defer m.peeks.Done()
	isGRPC, pc, err := peek(c, m.peekTimeout)
	if !m.untrack(c) || err != nil {
		// An HTTP request sent in the clear to a TLS port is told so, as
		// net/http's own TLS server does, rather than cut without a word.
		var re tls.RecordHeaderError
		if errors.As(err, &re) && re.Conn != nil && looksLikeHTTP(re.RecordHeader) {
			_ = re.Conn.SetWriteDeadline(time.Now().Add(time.Second))
			_, _ = io.WriteString(re.Conn, "HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain\r\n\r\nthis port serves TLS: use https://\n")
		}
		c.Close() // closed by Close already, or silent, or broken
		return
	}
	target := m.httpL
	if isGRPC {
		target = m.grpcL
	}
	target.deliver(pc, m.done)
}

// looksLikeHTTP reports whether the first bytes of a connection are
// those of an HTTP/1.x request.
func looksLikeHTTP(hdr [5]byte) bool {
	switch string(hdr[:]) {
	case "GET /", "HEAD ", "POST ", "PUT /", "DELET", "OPTIO", "PATCH":
		return true
	}
	return false
}

// peek reads from c until its first bytes tell whether it opens with the
// HTTP/2 client preface, within timeout. It returns c with the bytes read
// put back. It decides on the first byte that differs from the preface, so
// a short HTTP/1.0 request ("GET / HTTP/1.0\r\n\r\n" is shorter than the
// preface) is not left waiting for bytes that will never come.
func peek(c net.Conn, timeout time.Duration) (isGRPC bool, pc net.Conn, err error) {
	if err := c.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return false, nil, err
	}
	buf := make([]byte, len(http2Preface))
	n := 0
	for {
		k, err := c.Read(buf[n:])
		n += k
		if string(buf[:n]) != http2Preface[:n] {
			break // HTTP/1.x; an error that came with the bytes recurs on the next Read
		}
		if n == len(http2Preface) {
			isGRPC = true
			break
		}
		if err != nil {
			return false, nil, err
		}
	}
	if err := c.SetReadDeadline(time.Time{}); err != nil {
		return false, nil, err
	}
	return isGRPC, &peekedConn{Conn: c, peeked: buf[:n]}, nil
}

// peekedConn is a net.Conn whose first bytes were read already.
type peekedConn struct {
	net.Conn
	peeked []byte // read from Conn, not yet from peekedConn
}

// NetConn answers the connection c reads from (for its TLS state).
func (c *peekedConn) NetConn() net.Conn { return c.Conn }

func (c *peekedConn) Read(p []byte) (int, error) {
	if len(c.peeked) > 0 {
		n := copy(p, c.peeked)
		c.peeked = c.peeked[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// Close stops the Mux: it closes the listener, the connections being
// peeked, and the servers' listeners, so that Serve returns. It does not
// wait for Serve to return, and leaves the connections handed to the
// servers to them (see Mux for the shutdown order). Close may be called more
// than once; it returns the error of closing the listener.
func (m *Mux) Close() error {
	m.closeOnce.Do(func() {
		m.mu.Lock()
		m.mu.closed = true
		pending := m.mu.pending
		m.mu.pending = nil
		m.mu.Unlock()

		close(m.done)
		if err := m.l.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			m.closeErr = err
		}
		m.grpcL.Close()
		m.httpL.Close()
		for c := range pending {
			c.Close()
		}
	})
	return m.closeErr
}

// Addr is the address of the listener.
func (m *Mux) Addr() net.Addr { return m.l.Addr() }

func (m *Mux) isClosed() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mu.closed
}

// track adds c to the connections being peeked; false when the Mux is
// closed.
func (m *Mux) track(c net.Conn) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.mu.closed {
		return false
	}
	m.mu.pending[c] = struct{}{}
	return true
}

// untrack removes c from the connections being peeked; false when the Mux
// was closed meanwhile (and Close has closed c).
func (m *Mux) untrack(c net.Conn) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.mu.closed {
		return false
	}
	delete(m.mu.pending, c)
	return true
}

// subListener is the net.Listener of one server behind the Mux: Accept
// yields the connections the Mux routes to it.
type subListener struct {
	addr      net.Addr
	conns     chan net.Conn // unbuffered: a conn is accepted or closed, never stranded
	done      chan struct{} // closed by Close
	closeOnce sync.Once
}

func newSubListener(addr net.Addr) *subListener {
	return &subListener{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
}

// deliver hands c to Accept, or closes it when l or the Mux (muxDone) is
// closed first.
func (l *subListener) deliver(c net.Conn, muxDone <-chan struct{}) {
	select {
	case l.conns <- c:
	case <-l.done:
		c.Close()
	case <-muxDone:
		c.Close()
	}
}

func (l *subListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close makes Accept return net.ErrClosed; the Mux closes the connections
// routed to l from then on. Closing l does not close the Mux.
func (l *subListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return nil
}

func (l *subListener) Addr() net.Addr { return l.addr }
