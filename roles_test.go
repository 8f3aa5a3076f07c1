package groupkv_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	groupkv "github.com/groupkv/groupkv"
	"github.com/groupkv/groupkv/internal/auth"
	"github.com/groupkv/groupkv/internal/server"
	"github.com/groupkv/groupkv/internal/tlsfiles"
)

// TestRoles runs three in-process servers with a roles file: over gRPC
// (the Go client: its Pipeline stream, transactions, routed requests) and
// HTTP, each client may do what its certificate's role allows and is
// answered permission_denied beyond it; a client the file does not list
// may do nothing; a change of the file takes effect without a restart.
func TestRoles(t *testing.T) {
	p := newTestPKI(t)
	rolesFile := filepath.Join(t.TempDir(), "roles")
	writeRoles := func(s string) {
		t.Helper()
		if err := os.WriteFile(rolesFile, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeRoles("reader read\nwriter write\nadmin admin\n")
	servers, _ := startServers(t, p.nodeTLS, func(i int, cfg *server.Config) {
		var err error
		if cfg.Roles, err = auth.Load(rolesFile); err != nil {
			t.Fatal(err)
		}
		cfg.Pprof = true
	})
	clientTLS := map[string]*tls.Config{}
	dial := func(name string) groupkv.DB {
		t.Helper()
		c, k := p.issue(name)
		cfg, err := tlsfiles.Client(p.caFile(), c, k)
		if err != nil {
			t.Fatal(err)
		}
		clientTLS[name] = cfg
		db, err := groupkv.Dial(servers[0].Addr(), groupkv.WithTLS(cfg))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	}
	admin, writer, reader, stranger := dial("admin"), dial("writer"), dial("reader"), dial("stranger")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	denied := func(what string, err error) {
		t.Helper()
		if groupkv.CodeOf(err) != groupkv.CodePermissionDenied {
			t.Errorf("%s: %v, want permission_denied", what, err)
		}
	}
	allowed := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}

	opts := groupkv.CollectionOptions{Name: "c", Shards: 3, Replicas: 3}
	_, err := writer.CreateCollection(ctx, opts)
	denied("writer creating a collection", err)
	_, err = admin.CreateCollection(ctx, opts)
	allowed("admin creating a collection", err)

	_, err = writer.Put(ctx, groupkv.PutRequest{Collection: "c", Key: []byte("k"), Value: []byte("v")})
	allowed("writer put", err)
	_, err = reader.Put(ctx, groupkv.PutRequest{Collection: "c", Key: []byte("k"), Value: []byte("x")})
	denied("reader put", err)
	rec, err := reader.Get(ctx, groupkv.GetRequest{Collection: "c", Key: []byte("k")})
	if err != nil || string(rec.Value) != "v" {
		t.Errorf("reader get: %q %v", rec.Value, err)
	}
	_, err = stranger.Get(ctx, groupkv.GetRequest{Collection: "c", Key: []byte("k")})
	denied("a client the file does not list, get", err)
	_, err = reader.BatchPut(ctx, []groupkv.PutItem{{Collection: "c", Key: []byte("b"), Value: []byte("x")}})
	denied("reader batch put", err)
	_, err = reader.Scan(ctx, groupkv.ScanRequest{Collection: "c"})
	allowed("reader scan", err)
	err = reader.Transact(ctx, func(tx *groupkv.Tx) error {
		_, err := tx.Get(ctx, groupkv.GetRequest{Collection: "c", Key: []byte("k")})
		return err
	})
	allowed("reader's read-only transaction", err)
	err = reader.Transact(ctx, func(tx *groupkv.Tx) error {
		_, err := tx.GetForUpdate(ctx, groupkv.GetRequest{Collection: "c", Key: []byte("k")})
		return err
	})
	denied("reader's read for update", err)
	err = reader.Transact(ctx, func(tx *groupkv.Tx) error {
		return tx.Put(ctx, groupkv.PutRequest{Collection: "c", Key: []byte("t"), Value: []byte("x")})
	})
	denied("reader's writing transaction", err)
	err = writer.Transact(ctx, func(tx *groupkv.Tx) error {
		return tx.Put(ctx, groupkv.PutRequest{Collection: "c", Key: []byte("t"), Value: []byte("x")})
	})
	allowed("writer's transaction", err)
	if _, err := reader.Get(ctx, groupkv.GetRequest{Collection: "c", Key: []byte("x-never")}); groupkv.CodeOf(err) != groupkv.CodeNotFound {
		t.Errorf("reader get of an absent key: %v, want not_found", err)
	}
	if _, err := stranger.ListCollections(ctx); groupkv.CodeOf(err) != groupkv.CodePermissionDenied {
		t.Errorf("stranger listing collections: %v", err)
	}

	// HTTP: the same roles; /healthz is open.
	httpDo := func(name, method, path, body string) (int, string) {
		t.Helper()
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: clientTLS[name]}}
		req, err := http.NewRequestWithContext(ctx, method, "https://"+servers[1].Addr()+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, c := range []struct {
		who, method, path, body string
		want                    int
	}{
		{"reader", "GET", "/v1/kv/c/k", "", 200},
		{"reader", "PUT", "/v1/kv/c/k", "x", 403},
		{"writer", "PUT", "/v1/kv/c/k", "w", 200},
		{"writer", "POST", "/v1/collections", `{"name": "d"}`, 403},
		{"writer", "DELETE", "/v1/collections/c", "", 403},
		{"reader", "POST", "/v1/txn/exec", `{"then": [{"op": "get", "collection": "c", "key": "k"}]}`, 403},
		{"writer", "POST", "/v1/txn/exec", `{"then": [{"op": "get", "collection": "c", "key": "k"}]}`, 200},
		{"stranger", "GET", "/v1/kv/c/k", "", 403},
		{"stranger", "GET", "/healthz", "", 200},
		{"writer", "GET", "/debug/pprof/cmdline", "", 403},
		{"admin", "GET", "/debug/pprof/cmdline", "", 200},
	} {
		code, body := httpDo(c.who, c.method, c.path, c.body)
		if code != c.want || code == 403 && !strings.Contains(body, "permission_denied") {
			t.Errorf("%s %s %s: %d %s, want %d", c.who, c.method, c.path, code, body, c.want)
		}
	}

	// A read for update in an HTTP session needs write too.
	code, body := httpDo("reader", "POST", "/v1/txn", `{}`)
	var begun struct{ Txn string }
	if err := json.Unmarshal([]byte(body), &begun); code != 200 || err != nil {
		t.Fatalf("reader beginning a transaction: %d %s", code, body)
	}
	if code, body := httpDo("reader", "POST", "/v1/txn/"+begun.Txn+"/get", `{"collection": "c", "key": "k", "for_update": true}`); code != 403 {
		t.Errorf("reader's read for update over HTTP: %d %s, want 403", code, body)
	}
	if code, body := httpDo("reader", "POST", "/v1/txn/"+begun.Txn+"/get", `{"collection": "c", "key": "k"}`); code != 200 {
		t.Errorf("reader's read over HTTP: %d %s, want 200", code, body)
	}
	httpDo("reader", "POST", "/v1/txn/"+begun.Txn+"/abort", "")

	// A change of the file: the reader may write, anyone else read (each
	// server looks at the file at most once a second).
	writeRoles("reader write\nwriter write\nadmin admin\n* read\n")
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := reader.Put(ctx, groupkv.PutRequest{Collection: "c", Key: []byte("k"), Value: []byte("r")})
		if err == nil {
			_, err = stranger.Get(ctx, groupkv.GetRequest{Collection: "c", Key: []byte("k")})
		}
		if err == nil {
			break
		}
		if groupkv.CodeOf(err) != groupkv.CodePermissionDenied || time.Now().After(deadline) {
			t.Fatalf("after the roles file gave the reader write and others read: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	_, err = stranger.Put(ctx, groupkv.PutRequest{Collection: "c", Key: []byte("k"), Value: []byte("s")})
	denied("a client the file does not list, put, with * read", err)
}

// TestRolesNeedClientCertificates: a roles file without client
// certificates to name clients by is refused at start.
func TestRolesNeedClientCertificates(t *testing.T) {
	file := filepath.Join(t.TempDir(), "roles")
	if err := os.WriteFile(file, []byte("app write\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	roles, err := auth.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	_, err = server.Start(server.Config{Listen: "127.0.0.1:0", PeerListen: "127.0.0.1:0", Roles: roles})
	if err == nil || !strings.Contains(err.Error(), "ask for client certificates") {
		t.Fatalf("a server with roles and no TLS: %v", err)
	}
}
