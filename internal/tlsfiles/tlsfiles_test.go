package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// pki is a CA and files it issued in a test's directory.
type pki struct {
	t   *testing.T
	dir string
	ca  *CA
}

func newPKI(t *testing.T, dir string) *pki {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ca, err := NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := ca.WriteFiles(dir); err != nil {
		t.Fatal(err)
	}
	return &pki{t: t, dir: dir, ca: ca}
}

func (p *pki) caFile() string { return filepath.Join(p.dir, "ca.crt") }

// crlFile is the CA's revocation list, revoking certs (names issued),
// written first with none.
func (p *pki) crlFile(certs ...string) string {
	p.t.Helper()
	file := filepath.Join(p.dir, "ca.crl")
	var pems [][]byte
	for _, name := range certs {
		b, err := os.ReadFile(filepath.Join(p.dir, name+".crt"))
		if err != nil {
			p.t.Fatal(err)
		}
		pems = append(pems, b)
	}
	if _, err := p.ca.Revoke(file, pems...); err != nil {
		p.t.Fatal(err)
	}
	return file
}

// issue writes name.crt and name.key for hosts.
func (p *pki) issue(name string, hosts ...string) (certFile, keyFile string) {
	p.t.Helper()
	certFile, keyFile, err := p.ca.IssueFiles(p.dir, name, hosts, time.Hour)
	if err != nil {
		p.t.Fatal(err)
	}
	return certFile, keyFile
}

// handshake runs a TLS handshake between a server and a client
// configuration over loopback TCP and answers each side's error, and the
// common name of the certificate the client was served.
func handshake(t *testing.T, srv, cli *tls.Config, serverName string) (srvErr, cliErr error, served string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	deadline := time.Now().Add(10 * time.Second)
	done := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		_ = c.SetDeadline(deadline)
		sc := tls.Server(c, srv)
		if err := sc.Handshake(); err != nil {
			done <- err
			return
		}
		_, err = sc.Write([]byte{1})
		done <- err
	}()
	raw, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	_ = raw.SetDeadline(deadline)
	cli = cli.Clone()
	cli.ServerName = serverName
	cc := tls.Client(raw, cli)
	if cliErr = cc.Handshake(); cliErr == nil {
		// A TLS 1.3 client finishes before the server has checked its
		// certificate: a read sees the server's verdict.
		if _, err := cc.Read(make([]byte, 1)); err != nil {
			cliErr = err
		}
		if st := cc.ConnectionState(); len(st.PeerCertificates) > 0 {
			served = st.PeerCertificates[0].Subject.CommonName
		}
	} else {
		raw.Close()
	}
	return <-done, cliErr, served
}

func TestPeerIsMutual(t *testing.T) {
	dir := t.TempDir()
	good := newPKI(t, filepath.Join(dir, "good"))
	other := newPKI(t, filepath.Join(dir, "other"))
	c1, k1 := good.issue("node1", "127.0.0.1")
	c2, k2 := good.issue("node2", "127.0.0.1")
	cx, kx := other.issue("intruder", "127.0.0.1")
	peer := func(c, k, ca string) *tls.Config {
		cfg, err := Peer(c, k, ca, "")
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	n1, n2 := peer(c1, k1, good.caFile()), peer(c2, k2, good.caFile())
	if se, ce, served := handshake(t, n1, DialConfig(n2, "127.0.0.1"), "127.0.0.1"); se != nil || ce != nil || served != "node1" {
		t.Fatalf("node2 dialing node1: server %v, client %v, served %q", se, ce, served)
	}
	// A node whose certificate another CA signed is refused by the server
	// it dials, and a server with such a certificate by the node dialing it.
	intruder := peer(cx, kx, good.caFile())
	if se, _, _ := handshake(t, n1, DialConfig(intruder, "127.0.0.1"), "127.0.0.1"); se == nil {
		t.Fatal("node1 accepted a peer whose certificate another CA signed")
	}
	if _, ce, _ := handshake(t, intruder, DialConfig(n2, "127.0.0.1"), "127.0.0.1"); ce == nil {
		t.Fatal("node2 accepted a server whose certificate another CA signed")
	}
	// No client certificate at all: refused.
	anon, err := Client(good.caFile(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	if se, _, _ := handshake(t, n1, anon, "127.0.0.1"); se == nil {
		t.Fatal("node1 accepted a peer without a certificate")
	}
	// The certificate must name the host dialed.
	if _, ce, _ := handshake(t, n1, DialConfig(n2, "10.9.9.9"), "10.9.9.9"); ce == nil {
		t.Fatal("node2 accepted node1's certificate for a host it does not name")
	}
	// Dialed without DialConfig, an IP address has no name to verify for.
	if _, ce, _ := handshake(t, n1, n2, "127.0.0.1"); ce == nil || !strings.Contains(ce.Error(), "DialConfig") {
		t.Fatalf("node2 dialing an IP address without DialConfig: %v", ce)
	}
}

func TestServerClientCertificates(t *testing.T) {
	p := newPKI(t, t.TempDir())
	sc, sk := p.issue("node1", "localhost")
	ac, ak := p.issue("app")
	open, err := Server(sc, sk, "", "")
	if err != nil {
		t.Fatal(err)
	}
	closed, err := Server(sc, sk, p.caFile(), "")
	if err != nil {
		t.Fatal(err)
	}
	anon, err := Client(p.caFile(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	app, err := Client(p.caFile(), ac, ak)
	if err != nil {
		t.Fatal(err)
	}
	if se, ce, _ := handshake(t, open, anon, "localhost"); se != nil || ce != nil {
		t.Fatalf("no client certificates asked: server %v, client %v", se, ce)
	}
	if se, _, _ := handshake(t, closed, anon, "localhost"); se == nil {
		t.Fatal("a server with --client-ca-file accepted a client without a certificate")
	}
	if se, ce, _ := handshake(t, closed, app, "localhost"); se != nil || ce != nil {
		t.Fatalf("client certificate of the CA: server %v, client %v", se, ce)
	}
	// A client that trusts the system's CAs only refuses the test CA.
	sys, err := Client("", "", "")
	if err != nil {
		t.Fatal(err)
	}
	var uerr x509.UnknownAuthorityError
	if _, ce, _ := handshake(t, open, sys, "localhost"); !errors.As(ce, &uerr) {
		t.Fatalf("a client without --ca-file: %v, want an unknown authority", ce)
	}
}

func TestKeyPairIsReadAgain(t *testing.T) {
	p := newPKI(t, t.TempDir())
	certFile, keyFile := p.issue("node1", "localhost")
	kp, err := loadKeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	kp.now = func() time.Time { return now }
	serial := func() string {
		c, err := kp.get()
		if err != nil {
			t.Fatal(err)
		}
		x, err := x509.ParseCertificate(c.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return x.SerialNumber.String()
	}
	first := serial()
	// Renewed: served once a second has passed since the last look.
	p.issue("node1", "localhost")
	now = now.Add(recheck / 2)
	if got := serial(); got != first {
		t.Fatalf("the renewed certificate was read before a second passed")
	}
	now = now.Add(recheck)
	second := serial()
	if second == first {
		t.Fatal("the renewed certificate was not read again")
	}
	// A certificate that does not match its key (a renewal caught half
	// written) leaves the last good pair in use.
	other, _, err := p.ca.Issue("node1", []string{"localhost"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, other, 0o644); err != nil {
		t.Fatal(err)
	}
	now = now.Add(recheck)
	if got := serial(); got != second {
		t.Fatalf("a mismatched pair replaced the good one: serial %s, want %s", got, second)
	}
}

func TestBadFiles(t *testing.T) {
	p := newPKI(t, t.TempDir())
	other := newPKI(t, t.TempDir())
	c, k := p.issue("node1", "localhost")
	_, k2 := p.issue("node2", "localhost")
	notPEM := filepath.Join(p.dir, "junk")
	if err := os.WriteFile(notPEM, []byte("junk"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		err  func() error
		want string
	}{
		{"mismatched key", func() error { _, err := Server(c, k2, "", ""); return err }, "private key does not match"},
		{"missing key", func() error { _, err := Server(c, "", "", ""); return err }, "needs its key"},
		{"missing file", func() error { _, err := Server(c, filepath.Join(p.dir, "nope"), "", ""); return err }, "reading the key"},
		{"CA not PEM", func() error { _, err := Server(c, k, notPEM, ""); return err }, "holds no PEM certificate"},
		{"peer without CA", func() error { _, err := Peer(c, k, "", ""); return err }, "all three"},
		{"CRL without client CA", func() error { _, err := Server(c, k, "", p.crlFile()); return err }, "needs the CA file"},
		{"CRL missing", func() error { _, err := Server(c, k, p.caFile(), filepath.Join(p.dir, "nope.crl")); return err }, "reading the CRL"},
		{"CRL of another CA", func() error { _, err := Peer(c, k, p.caFile(), other.crlFile()); return err }, "not signed by a CA"},
		{"CRL not a CRL", func() error { _, err := Peer(c, k, p.caFile(), c); return err }, "not an X509 CRL"},
		{"client cert without key", func() error { _, err := Client(p.caFile(), c, ""); return err }, "give both or neither"},
		{"CA key not a CA", func() error { _, err := LoadCA(c, k); return err }, "not a CA certificate"},
	} {
		err := tc.err()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
}

// TestTrustIsReadAgain: a port's CA file and revocation list are read
// again when they change (at most once a second, on the injected clock):
// a CA added to the file is trusted, a certificate revoked is refused, by
// the client port and by both ends of a peer connection, and a file that
// no longer loads leaves the last good state in use.
func TestTrustIsReadAgain(t *testing.T) {
	now := time.Unix(1000, 0)
	timeNow = func() time.Time { return now }
	defer func() { timeNow = time.Now }()
	tick := func() { now = now.Add(recheck) }

	dir := t.TempDir()
	one := newPKI(t, filepath.Join(dir, "one"))
	two := newPKI(t, filepath.Join(dir, "two"))
	trusted := filepath.Join(dir, "trusted.crt")
	if err := os.WriteFile(trusted, one.ca.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	crl := one.crlFile()
	sc, sk := one.issue("node1", "localhost", "127.0.0.1")
	srv, err := Server(sc, sk, trusted, crl)
	if err != nil {
		t.Fatal(err)
	}
	client := func(p *pki, name string) *tls.Config {
		c, k := p.issue(name)
		cfg, err := Client(one.caFile(), c, k)
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	app1, app2 := client(one, "app1"), client(two, "app2")
	accepted := func(cli *tls.Config) error {
		se, ce, _ := handshake(t, srv, cli, "localhost")
		return errors.Join(se, ce)
	}
	if err := accepted(app1); err != nil {
		t.Fatalf("app1, of the trusted CA: %v", err)
	}
	if accepted(app2) == nil {
		t.Fatal("app2, of a CA not trusted yet, was accepted")
	}

	// A rotation: the second CA is added to the file.
	if err := os.WriteFile(trusted, append(append([]byte{}, one.ca.CertPEM...), two.ca.CertPEM...), 0o644); err != nil {
		t.Fatal(err)
	}
	if accepted(app2) == nil {
		t.Fatal("the CA file was read again before a second passed")
	}
	tick()
	if err := accepted(app2); err != nil {
		t.Fatalf("app2 after its CA was added: %v", err)
	}

	// A revocation.
	one.crlFile("app1")
	if err := accepted(app1); err != nil {
		t.Fatalf("the CRL was read again before a second passed: %v", err)
	}
	tick()
	se, _, _ := handshake(t, srv, app1, "localhost")
	if se == nil || !strings.Contains(se.Error(), "revoked") {
		t.Fatalf("app1 after its revocation: %v, want revoked", se)
	}

	// A CA file that does not load keeps the last good state.
	if err := os.WriteFile(trusted, []byte("half written"), 0o644); err != nil {
		t.Fatal(err)
	}
	tick()
	if err := accepted(app2); err != nil {
		t.Fatalf("app2 after a CA file that does not load: %v", err)
	}
	if accepted(app1) == nil {
		t.Fatal("app1 accepted again after a CA file that does not load")
	}

	// Peers: a revoked node is refused by the node it dials, and refused
	// as a server by a node dialing it.
	c2, k2 := one.issue("node2", "127.0.0.1")
	c3, k3 := one.issue("node3", "127.0.0.1")
	peerCRL := filepath.Join(dir, "peer.crl")
	if _, err := one.ca.Revoke(peerCRL); err != nil {
		t.Fatal(err)
	}
	n2, err := Peer(c2, k2, one.caFile(), peerCRL)
	if err != nil {
		t.Fatal(err)
	}
	n3, err := Peer(c3, k3, one.caFile(), peerCRL)
	if err != nil {
		t.Fatal(err)
	}
	if se, ce, _ := handshake(t, n2, DialConfig(n3, "127.0.0.1"), "127.0.0.1"); se != nil || ce != nil {
		t.Fatalf("node3 dialing node2: %v %v", se, ce)
	}
	node3PEM, err := os.ReadFile(c3)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := one.ca.Revoke(peerCRL, node3PEM); err != nil {
		t.Fatal(err)
	}
	tick()
	if se, _, _ := handshake(t, n2, DialConfig(n3, "127.0.0.1"), "127.0.0.1"); se == nil || !strings.Contains(se.Error(), "revoked") {
		t.Fatalf("node3, revoked, dialing node2: %v, want revoked", se)
	}
	if _, ce, _ := handshake(t, n3, DialConfig(n2, "127.0.0.1"), "127.0.0.1"); ce == nil || !strings.Contains(ce.Error(), "revoked") {
		t.Fatalf("node2 dialing node3, revoked: %v, want revoked", ce)
	}
}
