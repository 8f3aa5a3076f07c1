package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/groupkv/groupkv/internal/tlsfiles"
)

// groupkvCLI runs the binary with args and fails the test on an error.
func groupkvCLI(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(binary, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("groupkv %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// counter answers the sum of the samples of the counter name on node
// id's /metrics.
func (c *tcluster) counter(id int, name string) float64 {
	c.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, err := c.do(ctx, "GET", c.url(id)+"/metrics", "")
	if err != nil || a.code != 200 {
		c.tb.Fatalf("node %d /metrics: %v %s", id, err, a)
	}
	total := 0.0
	for _, line := range strings.Split(a.body, "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && (f[0] == name || strings.HasPrefix(f[0], name+"{")) {
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				c.tb.Fatalf("node %d /metrics: %q", id, line)
			}
			total += v
		}
	}
	return total
}

// servedSerial answers the serial number of the certificate served at addr.
func servedSerial(addr string, roots *x509.CertPool) (string, error) {
	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, NextProtos: []string{"http/1.1"}})
	if err != nil {
		return "", err
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber.String(), nil
}

// TestEndToEndTLSCluster runs a three-node cluster of real processes with
// certificates made by `groupkv certs`: client ports over TLS that ask for
// client certificates, peer ports over mutual TLS. It writes and reads over
// HTTPS and with the CLI, kills a node and restarts it (it catches up over
// mutual TLS), has `groupkv cluster check` find every replica equal, and
// renews a node's certificate in place: the node serves the new one
// without a restart; revokes the client's certificate: every node
// refuses it, without a restart; and refuses a write to a client whose
// role (--roles-file) is read.
func TestEndToEndTLSCluster(t *testing.T) {
	certs := t.TempDir()
	groupkvCLI(t, "certs", "ca", "--dir", certs)
	if out, err := exec.Command(binary, "certs", "ca", "--dir", certs).CombinedOutput(); err == nil || !strings.Contains(string(out), "already holds a CA") {
		t.Fatalf("a second CA in the same directory: %v %s, want a refusal", err, out)
	}
	roles := filepath.Join(certs, "roles")
	if err := os.WriteFile(roles, []byte("app admin\napp2 admin\nviewer read\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := newTCluster(t, 3)
	for _, n := range c.nodes {
		name := fmt.Sprint("node", n.id)
		groupkvCLI(t, "certs", "issue", name, "--dir", certs, "--host", "127.0.0.1,localhost")
		crt, key := filepath.Join(certs, name+".crt"), filepath.Join(certs, name+".key")
		n.args = []string{"--cert-file", crt, "--key-file", key, "--client-ca-file", filepath.Join(certs, "ca.crt"),
			"--client-crl-file", filepath.Join(certs, "ca.crl"),
			"--peer-cert-file", crt, "--peer-key-file", key, "--peer-ca-file", filepath.Join(certs, "ca.crt"),
			"--peer-crl-file", filepath.Join(certs, "ca.crl"), "--roles-file", roles,
			// Short raft logs: a node that was down catches up by snapshot,
			// streamed over the peer port's TLS too.
			"--raft-log-entries", "8"}
	}
	groupkvCLI(t, "certs", "issue", "app", "--dir", certs)
	caFile, appCert, appKey := filepath.Join(certs, "ca.crt"), filepath.Join(certs, "app.crt"), filepath.Join(certs, "app.key")
	appTLS, err := tlsfiles.Client(caFile, appCert, appKey)
	if err != nil {
		t.Fatal(err)
	}
	c.scheme = "https://"
	c.client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: appTLS, MaxIdleConnsPerHost: 64}}
	c.cliArgs = []string{"--ca-file", caFile, "--cert-file", appCert, "--key-file", appKey}

	c.startAll()
	c.createCollection(1, "s", 4)
	versions := map[string]uint64{}
	for i := range 30 {
		k := fmt.Sprint("k", i)
		versions[k] = c.put(1+i%3, "s", k, "v"+k)
	}
	for k, v := range versions {
		c.wantRead(2, "s", k, "v"+k, v)
	}

	// The CLI, with and without its TLS flags.
	cli := append([]string{"--addr", c.node(3).addr}, c.cliArgs...)
	groupkvCLI(t, append([]string{"put", "s", "cli", "over-tls"}, cli...)...)
	if out := groupkvCLI(t, append([]string{"get", "s", "cli"}, cli...)...); strings.TrimSpace(out) != "over-tls" {
		t.Fatalf("groupkv get over TLS: %q", out)
	}
	if out, err := exec.Command(binary, "get", "s", "cli", "--addr", c.node(3).addr).CombinedOutput(); err == nil {
		t.Fatalf("groupkv get in the clear from a TLS port succeeded: %s", out)
	}
	if out, err := exec.Command(binary, "get", "s", "cli", "--addr", c.node(3).addr, "--ca-file", caFile).CombinedOutput(); err == nil {
		t.Fatalf("groupkv get without a client certificate succeeded: %s", out)
	}
	if out := groupkvCLI(t, append([]string{"cluster", "status"}, cli...)...); !strings.Contains(out, "member") {
		t.Fatalf("groupkv cluster status over TLS:\n%s", out)
	}

	// Node 2 killed, written past (beyond what the raft logs keep for
	// it), restarted: it rejoins over mutual TLS and catches up, by
	// snapshots.
	c.kill(2)
	for i := range 80 {
		k := fmt.Sprint("after", i)
		versions[k] = c.put(1, "s", k, "v"+k)
	}
	c.start(2, false)
	c.waitHealthy(2)
	c.wantCheckedOK(1, "s", 4)
	for k, v := range versions {
		c.wantRead(2, "s", k, "v"+k, v)
	}
	if n := c.counter(2, "groupkv_raft_snapshots_applied_total"); n == 0 {
		t.Fatal("node 2 caught up without a snapshot: the test does not cover the snapshot stream over TLS")
	}

	// Node 1's certificate renewed in place (the same files): new
	// connections to both its ports are served the new one.
	roots := x509.NewCertPool()
	pem, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	roots.AppendCertsFromPEM(pem)
	old, err := servedSerial(c.node(1).addr, roots)
	if err != nil {
		t.Fatal(err)
	}
	groupkvCLI(t, "certs", "issue", "node1", "--dir", certs, "--host", "127.0.0.1,localhost")
	renewed := ""
	c.eventually(30*time.Second, "node 1 serves its renewed certificate", func() error {
		s, err := servedSerial(c.node(1).addr, roots)
		if err != nil {
			return err
		}
		if s == old {
			return fmt.Errorf("still serial %s", s)
		}
		renewed = s
		return nil
	})
	peerTLS, err := tlsfiles.Peer(filepath.Join(certs, "node2.crt"), filepath.Join(certs, "node2.key"), caFile, "")
	if err != nil {
		t.Fatal(err)
	}
	c.eventually(30*time.Second, "node 1's peer port serves its renewed certificate", func() error {
		cfg := tlsfiles.DialConfig(peerTLS, "127.0.0.1")
		cfg.NextProtos = []string{"h2"}
		conn, err := tls.Dial("tcp", c.node(1).peerAddr, cfg)
		if err != nil {
			return err
		}
		defer conn.Close()
		if s := conn.ConnectionState().PeerCertificates[0].SerialNumber.String(); s != renewed {
			return fmt.Errorf("peer port serves serial %s, want %s", s, renewed)
		}
		return nil
	})
	// And the cluster still serves writes through every node.
	for id := 1; id <= 3; id++ {
		k := fmt.Sprint("renewed", id)
		v := c.put(id, "s", k, "v")
		c.wantRead(1+id%3, "s", k, "v", v)
	}

	// The app's certificate revoked (ca.crl, which every node reads again
	// when it changes): the CLI with it is refused by every node, one with
	// a new certificate is served.
	groupkvCLI(t, "certs", "revoke", "app", "--dir", certs)
	for id := 1; id <= 3; id++ {
		c.eventually(30*time.Second, fmt.Sprintf("node %d refuses the revoked certificate", id), func() error {
			out, err := exec.Command(binary, append([]string{"get", "s", "cli", "--addr", c.node(id).addr}, c.cliArgs...)...).CombinedOutput()
			if err == nil {
				return fmt.Errorf("served: %s", out)
			}
			if !strings.Contains(string(out), "certificate") {
				t.Fatalf("node %d: the CLI with a revoked certificate: %s", id, out)
			}
			return nil
		})
	}
	groupkvCLI(t, "certs", "issue", "app2", "--dir", certs)
	for id := 1; id <= 3; id++ {
		out := groupkvCLI(t, "get", "s", "cli", "--addr", c.node(id).addr, "--ca-file", caFile,
			"--cert-file", filepath.Join(certs, "app2.crt"), "--key-file", filepath.Join(certs, "app2.key"))
		if strings.TrimSpace(out) != "over-tls" {
			t.Fatalf("node %d, with a new client certificate: %q", id, out)
		}
	}
	// A client whose role is read: it reads, and a write is refused.
	groupkvCLI(t, "certs", "issue", "viewer", "--dir", certs)
	viewer := []string{"--ca-file", caFile, "--cert-file", filepath.Join(certs, "viewer.crt"), "--key-file", filepath.Join(certs, "viewer.key")}
	if out := groupkvCLI(t, append([]string{"get", "s", "cli", "--addr", c.node(1).addr}, viewer...)...); strings.TrimSpace(out) != "over-tls" {
		t.Fatalf("the viewer's get: %q", out)
	}
	out, err := exec.Command(binary, append([]string{"put", "s", "cli", "no", "--addr", c.node(1).addr}, viewer...)...).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "permission_denied") {
		t.Fatalf("the viewer's put: %v %s, want permission_denied", err, out)
	}
	// A backup over TLS holds what was written.
	backup := filepath.Join(t.TempDir(), "s.backup")
	groupkvCLI(t, "backup", "--out", backup, "--collection", "s", "--addr", c.node(2).addr, "--ca-file", caFile,
		"--cert-file", filepath.Join(certs, "app2.crt"), "--key-file", filepath.Join(certs, "app2.key"))
	_, got := readBackupFile(t, backup)
	if len(got["s"]) != len(versions)+4 || got["s"]["cli"].Value != "over-tls" {
		t.Fatalf("backup over TLS: %d records, cli %+v; want %d and over-tls", len(got["s"]), got["s"]["cli"], len(versions)+4)
	}
}
