package tlsfiles

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// recheck is how often a handshake looks at the files of a key pair:
// often enough that a renewed certificate is served within seconds, rarely
// enough that handshakes do not stat files each.
const recheck = time.Second

// timeNow is the clock of the files' rechecks; tests replace it.
var timeNow = time.Now

// Server answers the configuration of a client port: it serves the key
// pair of certFile and keyFile and offers HTTP/2 (gRPC insists on it) and
// HTTP/1.1. When clientCAFile is set it requires every client to present
// a certificate signed by one of its CAs and not revoked by clientCRLFile
// (optional: a CRL one of those CAs signed).
func Server(certFile, keyFile, clientCAFile, clientCRLFile string) (*tls.Config, error) {
	kp, err := loadKeyPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{
		MinVersion:     tls.VersionTLS12,
		NextProtos:     []string{"h2", "http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return kp.get() },
	}
	if clientCAFile == "" {
		if clientCRLFile != "" {
			return nil, errors.New("tls: a CRL of client certificates needs the CA file of the clients (the client CA file)")
		}
		return cfg, nil
	}
	tr, err := loadTrust(clientCAFile, clientCRLFile)
	if err != nil {
		return nil, err
	}
	// The chain is verified by VerifyConnection, against the CAs and the
	// CRL as their files hold them at the handshake.
	cfg.ClientAuth = tls.RequireAnyClientCert
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		return tr.verify(cs.PeerCertificates, x509.ExtKeyUsageClientAuth, "")
	}
	return cfg, nil
}

// Peer answers the configuration of node-to-node connections, mutual TLS
// both ways: a node serves its peer port with the key pair and accepts
// only peers whose certificate caFile's CAs signed, and it dials other
// nodes with the same key pair, accepting only their certificates signed
// by those CAs for the host it dials. A certificate that crlFile
// (optional: a CRL one of those CAs signed) revokes is refused either
// way. The three other files are required.
func Peer(certFile, keyFile, caFile, crlFile string) (*tls.Config, error) {
	if certFile == "" || keyFile == "" || caFile == "" {
		return nil, errors.New("tls: peer TLS needs a certificate, its key and the CA that signed the other nodes' certificates, all three")
	}
	kp, err := loadKeyPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	tr, err := loadTrust(caFile, crlFile)
	if err != nil {
		return nil, err
	}
	getCert := func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return kp.get() }
	// The server end of a connection: its handshakes get this
	// configuration from GetConfigForClient, the dialing end the other.
	// The peer port speaks only gRPC (HTTP/2).
	srv := &tls.Config{
		MinVersion:     tls.VersionTLS12,
		NextProtos:     []string{"h2"},
		GetCertificate: getCert,
		ClientAuth:     tls.RequireAnyClientCert,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return tr.verify(cs.PeerCertificates, x509.ExtKeyUsageClientAuth, "")
		},
	}
	cfg := &tls.Config{
		MinVersion:           tls.VersionTLS12,
		GetCertificate:       getCert,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return kp.get() },
		GetConfigForClient:   func(*tls.ClientHelloInfo) (*tls.Config, error) { return srv, nil },
		// The server's chain and host are verified by VerifyConnection,
		// against the CAs and the CRL as their files hold them now. The
		// state it is given names the host only when it is not an IP
		// address (which has no SNI): DialConfig names it.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if cs.ServerName == "" {
				return errors.New("tls: no host to verify the peer's certificate for: dial with tlsfiles.DialConfig")
			}
			return tr.verify(cs.PeerCertificates, x509.ExtKeyUsageServerAuth, cs.ServerName)
		},
	}
	peerTrusts.Store(cfg, tr)
	return cfg, nil
}

// peerTrusts maps each configuration Peer made to its trust, for
// DialConfig.
var peerTrusts sync.Map // *tls.Config → *trust

// DialConfig answers the configuration with which a node dials host (a
// name or an IP address, without a port), given its configuration from
// Peer: the server's certificate is verified for host. For a
// configuration Peer did not make it is cfg with ServerName set.
func DialConfig(cfg *tls.Config, host string) *tls.Config {
	dial := cfg.Clone()
	dial.ServerName = host
	if v, ok := peerTrusts.Load(cfg); ok {
		tr := v.(*trust)
		dial.VerifyConnection = func(cs tls.ConnectionState) error {
			return tr.verify(cs.PeerCertificates, x509.ExtKeyUsageServerAuth, host)
		}
	}
	return dial
}

// Client answers the configuration of a client of a TLS port: it trusts
// caFile's CAs (the system's when caFile is empty) and, when certFile and
// keyFile are set, presents that key pair to servers that ask for one.
func Client(caFile, certFile, keyFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		cas, err := readCAs(caFile)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = x509.NewCertPool()
		for _, c := range cas {
			cfg.RootCAs.AddCert(c)
		}
	}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("tls: a client certificate needs its key, and a key its certificate: give both or neither")
	}
	if certFile != "" {
		kp, err := loadKeyPair(certFile, keyFile)
		if err != nil {
			return nil, err
		}
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return kp.get() }
	}
	return cfg, nil
}

// readCAs reads the PEM certificates of file.
func readCAs(file string) ([]*x509.Certificate, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("tls: reading CA certificates: %w", err)
	}
	return parseCAs(file, data)
}

func parseCAs(file string, data []byte) ([]*x509.Certificate, error) {
	var cas []*x509.Certificate
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("tls: %s: %w", file, err)
		}
		cas = append(cas, c)
	}
	if len(cas) == 0 {
		return nil, fmt.Errorf("tls: %s holds no PEM certificate", file)
	}
	return cas, nil
}

// trust is the CAs a port accepts certificates of, and the certificates
// revoked, read again from their files when they change: a CA added to
// the file (a rotation) or a certificate revoked takes effect within a
// second, without a restart. Files that no longer load leave the last
// good state in use.
type trust struct {
	caFile, crlFile string
	now             func() time.Time

	mu struct {
		sync.Mutex
		roots *x509.CertPool
		// revoked holds the revoked certificates as issuer (DER) and
		// serial number.
		revoked map[string]bool
		// caData and crlData are the bytes roots and revoked were read
		// from.
		caData, crlData []byte
		checked         time.Time
	}
}

func loadTrust(caFile, crlFile string) (*trust, error) {
	t := &trust{caFile: caFile, crlFile: crlFile, now: timeNow}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.reloadLocked(); err != nil {
		return nil, err
	}
	return t, nil
}

// current answers the CAs and the revoked certificates, read again first
// when a second has passed since the files were last looked at.
func (t *trust) current() (*x509.CertPool, map[string]bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if now := t.now(); now.Sub(t.mu.checked) >= recheck {
		t.mu.checked = now
		_ = t.reloadLocked()
	}
	return t.mu.roots, t.mu.revoked
}

// reloadLocked reads the files and, when they changed and load, replaces
// the CAs and the revoked certificates.
func (t *trust) reloadLocked() error {
	caData, err := os.ReadFile(t.caFile)
	if err != nil {
		return fmt.Errorf("tls: reading CA certificates: %w", err)
	}
	var crlData []byte
	if t.crlFile != "" {
		if crlData, err = os.ReadFile(t.crlFile); err != nil {
			return fmt.Errorf("tls: reading the CRL: %w", err)
		}
	}
	if t.mu.roots != nil && bytes.Equal(caData, t.mu.caData) && bytes.Equal(crlData, t.mu.crlData) {
		return nil
	}
	cas, err := parseCAs(t.caFile, caData)
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	for _, c := range cas {
		roots.AddCert(c)
	}
	revoked := map[string]bool{}
	if t.crlFile != "" {
		if revoked, err = parseCRL(t.crlFile, crlData, cas); err != nil {
			return err
		}
	}
	t.mu.roots, t.mu.revoked, t.mu.caData, t.mu.crlData = roots, revoked, caData, crlData
	return nil
}

// parseCRL reads a CRL (PEM or DER) that one of cas signed and answers the
// certificates it revokes. Its next update is not enforced: a CRL past it
// still revokes what it lists.
func parseCRL(file string, data []byte, cas []*x509.Certificate) (map[string]bool, error) {
	der := data
	if block, _ := pem.Decode(data); block != nil {
		if block.Type != "X509 CRL" {
			return nil, fmt.Errorf("tls: %s holds a PEM %q block, not an X509 CRL", file, block.Type)
		}
		der = block.Bytes
	}
	crl, err := x509.ParseRevocationList(der)
	if err != nil {
		return nil, fmt.Errorf("tls: %s: %w", file, err)
	}
	signed := false
	for _, ca := range cas {
		if crl.CheckSignatureFrom(ca) == nil {
			signed = true
			break
		}
	}
	if !signed {
		return nil, fmt.Errorf("tls: the CRL %s is not signed by a CA of the CA file", file)
	}
	revoked := map[string]bool{}
	for _, e := range crl.RevokedCertificateEntries {
		revoked[revocationKey(crl.RawIssuer, e.SerialNumber.Bytes())] = true
	}
	return revoked, nil
}

func revocationKey(issuer, serial []byte) string { return string(issuer) + "\x00" + string(serial) }

// verify checks a certificate chain presented in a handshake (the leaf
// first) for usage, and for host when it is set: signed by a CA of the
// file, and no certificate of the chain revoked.
func (t *trust) verify(certs []*x509.Certificate, usage x509.ExtKeyUsage, host string) error {
	if len(certs) == 0 {
		return errors.New("tls: no certificate presented")
	}
	roots, revoked := t.current()
	opts := x509.VerifyOptions{Roots: roots, Intermediates: x509.NewCertPool(), DNSName: host, KeyUsages: []x509.ExtKeyUsage{usage}}
	for _, c := range certs[1:] {
		opts.Intermediates.AddCert(c)
	}
	chains, err := certs[0].Verify(opts)
	if err != nil {
		return err
	}
	for _, chain := range chains {
		for _, c := range chain {
			if revoked[revocationKey(c.RawIssuer, c.SerialNumber.Bytes())] {
				return fmt.Errorf("tls: the certificate of %q (serial %x) is revoked", c.Subject.CommonName, c.SerialNumber)
			}
		}
	}
	return nil
}

// keyPair is a certificate and its key, read again from their files when
// they change.
type keyPair struct {
	certFile, keyFile string
	now               func() time.Time

	mu struct {
		sync.Mutex
		cert *tls.Certificate
		// certPEM and keyPEM are the bytes cert was loaded from.
		certPEM, keyPEM []byte
		checked         time.Time
	}
}

func loadKeyPair(certFile, keyFile string) (*keyPair, error) {
	if certFile == "" || keyFile == "" {
		return nil, errors.New("tls: a certificate needs its key, and a key its certificate: give both")
	}
	kp := &keyPair{certFile: certFile, keyFile: keyFile, now: timeNow}
	kp.mu.Lock()
	defer kp.mu.Unlock()
	if err := kp.reloadLocked(); err != nil {
		return nil, err
	}
	return kp, nil
}

// get answers the key pair, read again first when a second has passed
// since the files were last looked at and they changed. A pair that no
// longer loads leaves the last good one in use, so a renewal caught half
// written is picked up at a later handshake.
func (kp *keyPair) get() (*tls.Certificate, error) {
	kp.mu.Lock()
	defer kp.mu.Unlock()
	if now := kp.now(); now.Sub(kp.mu.checked) >= recheck {
		kp.mu.checked = now
		_ = kp.reloadLocked()
	}
	return kp.mu.cert, nil
}

// reloadLocked reads both files and, when they differ from what cert was
// loaded from and form a valid pair, replaces cert.
func (kp *keyPair) reloadLocked() error {
	certPEM, err := os.ReadFile(kp.certFile)
	if err != nil {
		return fmt.Errorf("tls: reading the certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(kp.keyFile)
	if err != nil {
		return fmt.Errorf("tls: reading the key: %w", err)
	}
	if kp.mu.cert != nil && bytes.Equal(certPEM, kp.mu.certPEM) && bytes.Equal(keyPEM, kp.mu.keyPEM) {
		return nil
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("tls: the certificate %s and the key %s: %w", kp.certFile, kp.keyFile, err)
	}
	kp.mu.cert, kp.mu.certPEM, kp.mu.keyPEM = &cert, certPEM, keyPEM
	return nil
}
