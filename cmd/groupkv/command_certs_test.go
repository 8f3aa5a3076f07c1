package main

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	groupkv "github.com/groupkv/groupkv"
)

// TestCertsCommand: `groupkv certs` makes a CA and certificates it signs
// for the hosts given, keeps keys private, and refuses what would be a
// mistake: a second CA over the first, a name that is not a plain file
// name, an issue without a CA.
func TestCertsCommand(t *testing.T) {
	dir := t.TempDir()
	run := func(args ...string) (string, error) {
		out, err := exec.Command(binary, append([]string{"certs"}, args...)...).CombinedOutput()
		return string(out), err
	}
	if out, err := run("issue", "node1", "--dir", dir); err == nil || !strings.Contains(out, "create the CA first") {
		t.Fatalf("issue without a CA: %v %s", err, out)
	}
	if out, err := run("ca", "--dir", dir); err != nil {
		t.Fatalf("ca: %v %s", err, out)
	}
	if out, err := run("issue", "node1", "--dir", dir, "--host", "10.1.2.3,db1.internal", "--host", "localhost"); err != nil {
		t.Fatalf("issue: %v %s", err, out)
	}
	for _, bad := range [][]string{{"ca", "--dir", dir}, {"issue", "ca", "--dir", dir}, {"issue", "../x", "--dir", dir}} {
		if out, err := run(bad...); err == nil {
			t.Errorf("certs %v succeeded: %s", bad, out)
		}
	}

	read := func(name string) *x509.Certificate {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, name+".crt"))
		if err != nil {
			t.Fatal(err)
		}
		blk, _ := pem.Decode(b)
		if blk == nil {
			t.Fatalf("%s.crt holds no PEM block", name)
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	ca, node := read("ca"), read("node1")
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	for _, host := range []string{"10.1.2.3", "db1.internal", "localhost"} {
		if _, err := node.Verify(x509.VerifyOptions{Roots: roots, DNSName: host, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("node1's certificate for %s: %v", host, err)
		}
	}
	if _, err := node.Verify(x509.VerifyOptions{Roots: roots, DNSName: "10.9.9.9"}); err == nil {
		t.Error("node1's certificate verifies for a host it was not issued for")
	}
	if _, err := node.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("node1's certificate as a client's (nodes dial each other with it): %v", err)
	}
	// Revocation: ca.crl is made with the CA, empty; revoke adds to it.
	crl := func() *x509.RevocationList {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, "ca.crl"))
		if err != nil {
			t.Fatal(err)
		}
		blk, _ := pem.Decode(b)
		if blk == nil || blk.Type != "X509 CRL" {
			t.Fatal("ca.crl holds no PEM CRL")
		}
		l, err := x509.ParseRevocationList(blk.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.CheckSignatureFrom(ca); err != nil {
			t.Fatalf("ca.crl: %v", err)
		}
		return l
	}
	if n := len(crl().RevokedCertificateEntries); n != 0 {
		t.Fatalf("a new CA's list revokes %d certificates", n)
	}
	if out, err := run("issue", "app", "--dir", dir); err != nil {
		t.Fatalf("issue app: %v %s", err, out)
	}
	if out, err := run("revoke", "node1", "--dir", dir); err != nil || !strings.Contains(out, "revoked node1") {
		t.Fatalf("revoke node1: %v %s", err, out)
	}
	if out, err := run("revoke", filepath.Join(dir, "app.crt"), "--dir", dir); err != nil {
		t.Fatalf("revoke app.crt: %v %s", err, out)
	}
	l := crl()
	if len(l.RevokedCertificateEntries) != 2 || l.RevokedCertificateEntries[0].SerialNumber.Cmp(node.SerialNumber) != 0 ||
		l.RevokedCertificateEntries[1].SerialNumber.Cmp(read("app").SerialNumber) != 0 {
		t.Errorf("ca.crl after two revocations: %+v", l.RevokedCertificateEntries)
	}
	other := t.TempDir()
	if out, err := run("ca", "--dir", other); err != nil {
		t.Fatalf("ca: %v %s", err, out)
	}
	if out, err := run("revoke", filepath.Join(dir, "app.crt"), "--dir", other); err == nil || !strings.Contains(out, "not signed by this CA") {
		t.Errorf("revoking a certificate of another CA: %v %s", err, out)
	}
	for _, key := range []string{"ca.key", "node1.key"} {
		fi, err := os.Stat(filepath.Join(dir, key))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", key, fi.Mode().Perm())
		}
	}
}

// TestServerTLSFlags: the server's TLS flags are checked before anything
// starts, each mistake named.
func TestServerTLSFlags(t *testing.T) {
	dir := t.TempDir()
	if out, err := exec.Command(binary, "certs", "ca", "--dir", dir).CombinedOutput(); err != nil {
		t.Fatalf("certs ca: %v %s", err, out)
	}
	for _, name := range []string{"node1", "node2"} {
		if out, err := exec.Command(binary, "certs", "issue", name, "--dir", dir, "--host", "127.0.0.1").CombinedOutput(); err != nil {
			t.Fatalf("certs issue: %v %s", err, out)
		}
	}
	f := func(name string) string { return filepath.Join(dir, name) }
	data := filepath.Join(dir, "data")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--client-ca-file", f("ca.crt")}, "--client-ca-file and --client-crl-file need --cert-file"},
		{[]string{"--cert-file", f("node1.crt"), "--key-file", f("node1.key"), "--client-crl-file", f("ca.crl")}, "--client-crl-file needs --client-ca-file"},
		{[]string{"--peer-cert-file", f("node1.crt"), "--peer-key-file", f("node1.key"), "--peer-ca-file", f("ca.crt"), "--peer-crl-file", f("ca.crt")}, "not an X509 CRL"},
		{[]string{"--cert-file", f("node1.crt"), "--key-file", f("node1.key"), "--roles-file", f("ca.crt")}, "--roles-file needs --client-ca-file"},
		{[]string{"--cert-file", f("node1.crt"), "--key-file", f("node1.key"), "--client-ca-file", f("ca.crt"), "--roles-file", f("ca.crt")}, "is not read, write or admin"},
		{[]string{"--cert-file", f("node1.crt")}, "needs its key"},
		{[]string{"--cert-file", f("node1.crt"), "--key-file", f("node2.key")}, "private key does not match"},
		{[]string{"--peer-cert-file", f("node1.crt"), "--peer-key-file", f("node1.key")}, "all three"},
		{[]string{"--cert-file", f("node1.crt"), "--key-file", f("node1.key"), "--client-ca-file", f("node1.key")}, "holds no PEM certificate"},
	} {
		out, err := exec.Command(binary, append([]string{"server", "--data-dir", data, "--listen", "127.0.0.1:0", "--peer-listen", "127.0.0.1:0"}, c.args...)...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), c.want) {
			t.Errorf("server %v: %v %s; want an error saying %q", c.args, err, out, c.want)
		}
		if ee, ok := err.(*exec.ExitError); ok && ee.ExitCode() != 2 {
			t.Errorf("server %v: exit status %d, want 2 (a usage error)", c.args, ee.ExitCode())
		}
	}
	if _, err := os.Stat(data); err == nil {
		t.Error("a server refused for its TLS flags created its data directory")
	}
}

func TestTLSHint(t *testing.T) {
	cmd := &cobra.Command{Use: "get"}
	addAddrFlag(cmd)
	unavailable := &groupkv.Error{Code: groupkv.CodeUnavailable, Message: `grpc Unavailable: connection error: desc = "error reading server preface: EOF"`}
	if h := tlsHint(cmd, unavailable); !strings.Contains(h, "--ca-file") {
		t.Errorf("no TLS flags, a connection cut at its start: hint %q, want one naming --ca-file", h)
	}
	if err := cmd.Flags().Set("ca-file", "ca.crt"); err != nil {
		t.Fatal(err)
	}
	if h := tlsHint(cmd, unavailable); !strings.Contains(h, "--cert-file") || strings.Contains(h, "--ca-file") {
		t.Errorf("--ca-file given: hint %q, want one naming --cert-file only", h)
	}
	if err := cmd.Flags().Set("cert-file", "app.crt"); err != nil {
		t.Fatal(err)
	}
	cut := &groupkv.Error{Code: groupkv.CodeUnavailable, Message: "grpc Unavailable: write tcp 127.0.0.1:1->127.0.0.1:2: write: broken pipe"}
	if h := tlsHint(cmd, cut); !strings.Contains(h, "revoked") {
		t.Errorf("a client certificate given, a connection cut: hint %q, want one saying it may be refused", h)
	}
	other := &groupkv.Error{Code: groupkv.CodeUnavailable, Message: "no leader for shard 3"}
	if h := tlsHint(cmd, other); h != "" {
		t.Errorf("an unavailable shard: hint %q, want none", h)
	}
	if h := tlsHint(cmd, &groupkv.Error{Code: groupkv.CodeNotFound, Message: "broken pipe"}); h != "" {
		t.Errorf("not found: hint %q, want none", h)
	}
}
