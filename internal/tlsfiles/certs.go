package tlsfiles

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CA is a certificate authority that signs the certificates of a
// cluster's nodes and clients (groupkv certs).
type CA struct {
	cert *x509.Certificate
	key  crypto.Signer
	// CertPEM is the CA's certificate, the file nodes and clients trust.
	CertPEM []byte
	// KeyPEM is its private key.
	KeyPEM []byte
}

// NewCA creates a CA named name, valid for validFor from now.
func NewCA(name string, validFor time.Duration) (*CA, error) {
	key, keyPEM, err := newKey()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name, Organization: []string{"groupkv"}},
		NotBefore:             now.Add(-time.Hour), // a node whose clock is a little behind
		NotAfter:              now.Add(validFor),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("tls: creating the CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{cert: cert, key: key, CertPEM: encodePEM("CERTIFICATE", der), KeyPEM: keyPEM}, nil
}

// LoadCA reads a CA from its certificate and key files.
func LoadCA(certFile, keyFile string) (*CA, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("tls: reading the CA certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("tls: reading the CA key: %w", err)
	}
	cb, _ := pem.Decode(certPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("tls: %s holds no PEM certificate", certFile)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("tls: %s: %w", certFile, err)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("tls: %s is not a CA certificate", certFile)
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return nil, fmt.Errorf("tls: %s holds no PEM key", keyFile)
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("tls: %s: %w", keyFile, err)
	}
	key, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("tls: %s is not a signing key", keyFile)
	}
	return &CA{cert: cert, key: key, CertPEM: certPEM, KeyPEM: keyPEM}, nil
}

// Issue signs a certificate named name for hosts (IP addresses or DNS
// names; a server's certificate must list every name clients and other
// nodes dial it by), valid for validFor from now and for both ends of a
// connection: a node serves it and presents it when it dials other nodes.
// It answers the certificate and its key, PEM encoded.
func (ca *CA) Issue(name string, hosts []string, validFor time.Duration) (certPEM, keyPEM []byte, err error) {
	if name == "" {
		return nil, nil, errors.New("tls: a certificate needs a name")
	}
	key, keyPEM, err := newKey()
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: name, Organization: []string{"groupkv"}},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(validFor),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	if tmpl.NotAfter.After(ca.cert.NotAfter) {
		tmpl.NotAfter = ca.cert.NotAfter
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return nil, nil, fmt.Errorf("tls: signing the certificate of %s: %w", name, err)
	}
	return encodePEM("CERTIFICATE", der), keyPEM, nil
}

// WriteFiles writes the CA to dir as ca.crt and ca.key (WriteFiles).
func (ca *CA) WriteFiles(dir string) (certFile, keyFile string, err error) {
	return WriteFiles(dir, "ca", ca.CertPEM, ca.KeyPEM)
}

// IssueFiles issues a certificate (Issue) and writes it to dir as
// name.crt and name.key (WriteFiles).
func (ca *CA) IssueFiles(dir, name string, hosts []string, validFor time.Duration) (certFile, keyFile string, err error) {
	certPEM, keyPEM, err := ca.Issue(name, hosts, validFor)
	if err != nil {
		return "", "", err
	}
	return WriteFiles(dir, name, certPEM, keyPEM)
}

// WriteFiles writes a certificate and its key to dir as name.crt and
// name.key (the key readable by its owner only), replacing each file
// whole (a server reading it at a handshake never sees half of it).
func WriteFiles(dir, name string, certPEM, keyPEM []byte) (certFile, keyFile string, err error) {
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := writeFileAtomic(keyFile, keyPEM, 0o600); err != nil {
		return "", "", err
	}
	if err := writeFileAtomic(certFile, certPEM, 0o644); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

func writeFileAtomic(file string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(file), "."+filepath.Base(file)+".tmp*")
	if err != nil {
		return fmt.Errorf("tls: %w", err)
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, file)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("tls: writing %s: %w", file, err)
	}
	return nil
}

func newKey() (crypto.Signer, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("tls: generating a key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return key, encodePEM("PRIVATE KEY", der), nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n
}

func encodePEM(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

// Revoke writes crlFile, a certificate revocation list the CA signs, that
// revokes the certificates certPEMs (PEM, each signed by the CA) besides
// those the file revoked already (a file that is there must be a CRL of
// this CA). It answers the serial numbers revoked now. Servers given the
// file (--client-crl-file, --peer-crl-file) refuse those certificates
// within a second of it changing. The CRL's next update is ten years away:
// servers do not enforce it.
func (ca *CA) Revoke(crlFile string, certPEMs ...[]byte) ([]*big.Int, error) {
	tmpl := &x509.RevocationList{Number: big.NewInt(1)}
	if data, err := os.ReadFile(crlFile); err == nil {
		block, _ := pem.Decode(data)
		if block == nil || block.Type != "X509 CRL" {
			return nil, fmt.Errorf("tls: %s holds no PEM CRL", crlFile)
		}
		old, err := x509.ParseRevocationList(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("tls: %s: %w", crlFile, err)
		}
		if err := old.CheckSignatureFrom(ca.cert); err != nil {
			return nil, fmt.Errorf("tls: %s is not a CRL of this CA: %w", crlFile, err)
		}
		tmpl.RevokedCertificateEntries = old.RevokedCertificateEntries
		tmpl.Number = new(big.Int).Add(old.Number, big.NewInt(1))
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("tls: reading the CRL: %w", err)
	}
	now := time.Now()
	var revoked []*big.Int
	for _, certPEM := range certPEMs {
		block, _ := pem.Decode(certPEM)
		if block == nil || block.Type != "CERTIFICATE" {
			return nil, errors.New("tls: a certificate to revoke is not a PEM certificate")
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("tls: a certificate to revoke: %w", err)
		}
		if err := c.CheckSignatureFrom(ca.cert); err != nil {
			return nil, fmt.Errorf("tls: the certificate of %q was not signed by this CA: %w", c.Subject.CommonName, err)
		}
		tmpl.RevokedCertificateEntries = append(tmpl.RevokedCertificateEntries, x509.RevocationListEntry{SerialNumber: c.SerialNumber, RevocationTime: now})
		revoked = append(revoked, c.SerialNumber)
	}
	tmpl.ThisUpdate, tmpl.NextUpdate = now.Add(-time.Minute), now.AddDate(10, 0, 0)
	der, err := x509.CreateRevocationList(rand.Reader, tmpl, ca.cert, ca.key)
	if err != nil {
		return nil, fmt.Errorf("tls: signing the CRL: %w", err)
	}
	if err := writeFileAtomic(crlFile, encodePEM("X509 CRL", der), 0o644); err != nil {
		return nil, err
	}
	return revoked, nil
}
