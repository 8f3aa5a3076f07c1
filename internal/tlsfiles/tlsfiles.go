package tlsfiles

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
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

// Server answers the configuration of a client port: it serves the key
// pair of certFile and keyFile, offers HTTP/2 (gRPC insists on it) and
// HTTP/1.1, and, when clientCAFile is set, requires every client to
// present a certificate signed by one of its CAs.
func Server(certFile, keyFile, clientCAFile string) (*tls.Config, error) {
	kp, err := loadKeyPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{
		MinVersion:     tls.VersionTLS12,
		NextProtos:     []string{"h2", "http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return kp.get() },
	}
	if clientCAFile != "" {
		pool, err := loadCAs(clientCAFile)
		if err != nil {
			return nil, err
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// Peer answers the configuration of node-to-node connections, mutual TLS
// both ways: a node serves its peer port with the key pair and accepts
// only peers whose certificate caFile's CAs signed, and it dials other
// nodes with the same key pair, accepting only their certificates signed
// by those CAs for the host it dials. All three files are required.
func Peer(certFile, keyFile, caFile string) (*tls.Config, error) {
	if certFile == "" || keyFile == "" || caFile == "" {
		return nil, errors.New("tls: peer TLS needs a certificate, its key and the CA that signed the other nodes' certificates, all three")
	}
	kp, err := loadKeyPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	pool, err := loadCAs(caFile)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion:           tls.VersionTLS12,
		GetCertificate:       func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return kp.get() },
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return kp.get() },
		ClientCAs:            pool,
		ClientAuth:           tls.RequireAndVerifyClientCert,
		RootCAs:              pool,
	}, nil
}

// Client answers the configuration of a client of a TLS port: it trusts
// caFile's CAs (the system's when caFile is empty) and, when certFile and
// keyFile are set, presents that key pair to servers that ask for one.
func Client(caFile, certFile, keyFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pool, err := loadCAs(caFile)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
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

// loadCAs reads the PEM certificates of file into a pool.
func loadCAs(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("tls: reading CA certificates: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("tls: %s holds no PEM certificate", file)
	}
	return pool, nil
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
	kp := &keyPair{certFile: certFile, keyFile: keyFile, now: time.Now}
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
