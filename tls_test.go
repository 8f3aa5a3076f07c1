package groupkv_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	groupkv "github.com/groupkv/groupkv"
	"github.com/groupkv/groupkv/internal/server"
	"github.com/groupkv/groupkv/internal/tlsfiles"
)

// testPKI writes a CA and certificates it issued to dir.
type testPKI struct {
	t   *testing.T
	dir string
	ca  *tlsfiles.CA
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	ca, err := tlsfiles.NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	p := &testPKI{t: t, dir: t.TempDir(), ca: ca}
	if _, _, err := ca.WriteFiles(p.dir); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *testPKI) caFile() string { return filepath.Join(p.dir, "ca.crt") }

// nodeTLS configures node i of startServers: its client port over TLS,
// asking for certificates of the CA, and mutual TLS between nodes.
func (p *testPKI) nodeTLS(i int, cfg *server.Config) {
	cert, key := p.issue(fmt.Sprint("node", i), "127.0.0.1")
	var err error
	if cfg.TLS, err = tlsfiles.Server(cert, key, p.caFile(), ""); err != nil {
		p.t.Fatal(err)
	}
	if cfg.PeerTLS, err = tlsfiles.Peer(cert, key, p.caFile(), ""); err != nil {
		p.t.Fatal(err)
	}
}

func (p *testPKI) issue(name string, hosts ...string) (certFile, keyFile string) {
	p.t.Helper()
	certFile, keyFile, err := p.ca.IssueFiles(p.dir, name, hosts, time.Hour)
	if err != nil {
		p.t.Fatal(err)
	}
	return certFile, keyFile
}

// TestTLSCluster runs three in-process servers whose client ports serve
// TLS and ask for client certificates, and whose peer ports speak mutual
// TLS: the Go client (routed to shard leaders, transactions on its
// Pipeline stream) and HTTP/JSON work over it, and a client in the clear,
// one without a certificate, and a node of another CA are refused.
func TestTLSCluster(t *testing.T) {
	p := newTestPKI(t)
	servers, regs := startServers(t, p.nodeTLS)

	appCert, appKey := p.issue("app")
	appTLS, err := tlsfiles.Client(p.caFile(), appCert, appKey)
	if err != nil {
		t.Fatal(err)
	}
	db, err := groupkv.Dial(servers[0].Addr(), groupkv.WithTLS(appTLS))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if _, err := db.CreateCollection(ctx, groupkv.CollectionOptions{Name: "c", Shards: 6, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	// The client routes puts to the shards' leaders on the other nodes:
	// its shard map came from the dialed node's HTTP API over TLS.
	wantRoutedPuts(t, db, regs)

	// Each port's certificate expiry is a metric.
	mfs, err := regs[0].Gather()
	if err != nil {
		t.Fatal(err)
	}
	expiries := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() == "groupkv_tls_certificate_expiry_seconds" {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "port" {
						expiries[l.GetValue()] = m.GetGauge().GetValue()
					}
				}
			}
		}
	}
	soon, late := float64(time.Now().Add(30*time.Minute).Unix()), float64(time.Now().Add(2*time.Hour).Unix())
	for _, port := range []string{"client", "peer"} {
		if e := expiries[port]; e < soon || e > late { // issued for an hour
			t.Errorf("groupkv_tls_certificate_expiry_seconds{port=%q} = %v, want about an hour from now", port, e)
		}
	}

	// A transaction across shards.
	keys := []string{"a", "b", "c", "d"}
	err = db.Transact(ctx, func(tx *groupkv.Tx) error {
		for _, k := range keys {
			if err := tx.Put(ctx, groupkv.PutRequest{Collection: "c", Key: []byte(k), Value: []byte("t-" + k)}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("transaction over TLS: %v", err)
	}
	for _, k := range keys {
		r, err := db.Get(ctx, groupkv.GetRequest{Collection: "c", Key: []byte(k)})
		if err != nil || string(r.Value) != "t-"+k {
			t.Fatalf("get %s after the transaction: %q, %v", k, r.Value, err)
		}
	}

	// HTTP/JSON from a client that would speak HTTP/2 if offered it: it is
	// served HTTP/1.1 by the HTTP API, not handed to gRPC.
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: appTLS.Clone(), ForceAttemptHTTP2: true}}
	url := "https://" + servers[1].Addr() + "/v1/kv/c/a"
	resp, err := hc.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "t-a" || resp.Proto != "HTTP/1.1" {
		t.Fatalf("GET %s: %s %s %q, want 200 HTTP/1.1 \"t-a\"", url, resp.Proto, resp.Status, body)
	}
	// The same request in the clear is told to use TLS.
	resp, err = http.Get("http://" + servers[1].Addr() + "/v1/kv/c/a")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "TLS") {
		t.Fatalf("GET in the clear: %s %q, want 400 saying the port serves TLS", resp.Status, body)
	}

	// Refused: a Go client in the clear, and one without a certificate.
	anonTLS, err := tlsfiles.Client(p.caFile(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	for name, opts := range map[string][]groupkv.DialOption{
		"in the clear":          nil,
		"without a certificate": {groupkv.WithTLS(anonTLS)},
	} {
		bad, err := groupkv.Dial(servers[0].Addr(), opts...)
		if err != nil {
			t.Fatal(err)
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err = bad.Get(cctx, groupkv.GetRequest{Collection: "c", Key: []byte("a")})
		cancel()
		bad.Close()
		if groupkv.CodeOf(err) != groupkv.CodeUnavailable {
			t.Errorf("a client %s: get answered %v, want unavailable", name, err)
		}
	}

	// A would-be node with a certificate of another CA: the peer port
	// refuses its handshake.
	other := newTestPKI(t)
	xc, xk := other.issue("intruder", "127.0.0.1")
	xTLS, err := tlsfiles.Peer(xc, xk, p.caFile(), "") // it even trusts the cluster's CA
	if err != nil {
		t.Fatal(err)
	}
	if err := peerHandshake(servers[0].PeerAddr(), xTLS); err == nil {
		t.Fatal("the peer port accepted a node whose certificate another CA signed")
	}
	// A node of the cluster's CA is accepted (the check above can fail).
	c4, k4 := p.issue("node4", "127.0.0.1")
	n4TLS, err := tlsfiles.Peer(c4, k4, p.caFile(), "")
	if err != nil {
		t.Fatal(err)
	}
	if err := peerHandshake(servers[0].PeerAddr(), n4TLS); err != nil {
		t.Fatalf("the peer port refused a node of the cluster's CA: %v", err)
	}
}

// peerHandshake dials addr over TLS with cfg and answers whether the
// server accepted the handshake: under TLS 1.3 a refused client
// certificate shows at the first read, which then fails with the
// server's alert rather than waiting for data.
func peerHandshake(addr string, cfg *tls.Config) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	cfg = tlsfiles.DialConfig(cfg, host)
	cfg.NextProtos = []string{"h2"}
	c, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	// The server's HTTP/2 SETTINGS frame arrives on an accepted connection.
	_, err = c.Read(make([]byte, 1))
	return err
}
