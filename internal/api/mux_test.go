package api

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// muxTester runs a Mux over a real gRPC server (the standard health
// service) and a real HTTP server (NewHTTPHandler over a fake backend).
type muxTester struct {
	t        *testing.T
	mux      *Mux
	grpcSrv  *grpc.Server
	httpSrv  *http.Server
	addr     string
	serveErr chan error
}

func newMuxTester(t *testing.T, cfg MuxConfig, withGRPC, withHTTP bool) *muxTester {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mt := &muxTester{t: t, addr: l.Addr().String(), serveErr: make(chan error, 1)}
	if withGRPC {
		mt.grpcSrv = grpc.NewServer()
		healthpb.RegisterHealthServer(mt.grpcSrv, health.NewServer())
	}
	if withHTTP {
		mt.httpSrv = &http.Server{Handler: NewHTTPHandler(newHTTPFakeBackend(), HTTPConfig{})}
	}
	mt.mux = NewMux(l, mt.grpcSrv, mt.httpSrv, cfg)
	go func() { mt.serveErr <- mt.mux.Serve() }()
	t.Cleanup(func() {
		mt.mux.Close()
		if mt.grpcSrv != nil {
			mt.grpcSrv.Stop()
		}
		if mt.httpSrv != nil {
			mt.httpSrv.Close()
		}
	})
	return mt
}

// grpcCheck calls the gRPC health service through the mux.
func (mt *muxTester) grpcCheck() error {
	cc, err := grpc.NewClient("passthrough:///"+mt.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(false))
	if err != nil {
		return err
	}
	if resp.Status != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("health status %v", resp.Status)
	}
	return nil
}

// httpGet gets path through the mux on a fresh connection.
func (mt *muxTester) httpGet(path string) (int, string, error) {
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get("http://" + mt.addr + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// waitServe waits for Serve to return and answers its error.
func (mt *muxTester) waitServe() error {
	mt.t.Helper()
	select {
	case err := <-mt.serveErr:
		return err
	case <-time.After(10 * time.Second):
		mt.t.Fatal("Serve did not return")
		return nil
	}
}

func TestMuxServesGRPCAndHTTP(t *testing.T) {
	mt := newMuxTester(t, MuxConfig{}, true, true)

	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := 0; i < 20; i++ {
		wg.Add(2)
		go func() {
			defer wg.Done()
			errs <- mt.grpcCheck()
		}()
		go func() {
			defer wg.Done()
			status, body, err := mt.httpGet("/healthz")
			if err == nil && (status != http.StatusOK || !strings.Contains(body, `"ok"`)) {
				err = fmt.Errorf("GET /healthz: %d %s", status, body)
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}

	// HTTP requests whose first bytes share a prefix with the HTTP/2
	// preface ('P') go to HTTP.
	client := &http.Client{Timeout: 10 * time.Second}
	req, _ := http.NewRequest("PUT", "http://"+mt.addr+"/v1/kv/nope/k", strings.NewReader("v"))
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("PUT through the mux: %d, want 404 collection_not_found", resp.StatusCode)
	}

	// Shutdown in the documented order.
	if err := mt.mux.Close(); err != nil {
		t.Fatal(err)
	}
	mt.grpcSrv.GracefulStop()
	if err := mt.httpSrv.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := mt.waitServe(); !errors.Is(err, ErrMuxClosed) {
		t.Fatalf("Serve after Close: %v, want ErrMuxClosed", err)
	}
	if c, err := net.Dial("tcp", mt.addr); err == nil {
		c.Close()
		t.Fatal("the port still accepts after Close")
	}
}

func TestMuxShortHTTPRequest(t *testing.T) {
	// "GET /healthz HTTP/1.0\r\n\r\n" is 25 bytes, "GET / HTTP/1.0\r\n\r\n" 18:
	// the mux must not wait for the 24 bytes of the preface.
	mt := newMuxTester(t, MuxConfig{PeekTimeout: time.Hour}, true, true)
	for _, path := range []string{"/", "/healthz"} {
		c, err := net.Dial("tcp", mt.addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(c, "GET %s HTTP/1.0\r\n\r\n", path)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("GET %s over HTTP/1.0: %v", path, err)
		}
		resp.Body.Close()
		c.Close()
	}
}

func TestMuxSilentClientBlocksNoOne(t *testing.T) {
	// With an hour to peek, silent connections would block every later one
	// if the peek ran in the accept loop.
	mt := newMuxTester(t, MuxConfig{PeekTimeout: time.Hour}, true, true)
	for i := 0; i < 5; i++ {
		c, err := net.Dial("tcp", mt.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	// A client that sent part of the preface and stopped blocks no one either.
	c, err := net.Dial("tcp", mt.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, http2Preface[:10])

	if status, _, err := mt.httpGet("/healthz"); err != nil || status != http.StatusOK {
		t.Fatalf("HTTP behind silent clients: %d %v", status, err)
	}
	if err := mt.grpcCheck(); err != nil {
		t.Fatalf("gRPC behind silent clients: %v", err)
	}

	// Close closes the connections still being peeked.
	mt.mux.Close()
	wantClosed(t, c, "a connection being peeked at Close")
	if err := mt.waitServe(); !errors.Is(err, ErrMuxClosed) {
		t.Fatalf("Serve: %v", err)
	}
}

// wantClosed fails unless the peer closes c within 10 seconds.
func wantClosed(t *testing.T, c net.Conn, what string) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("%s: read answered %v, want the connection closed", what, err)
	}
}

func TestMuxPeekTimeout(t *testing.T) {
	mt := newMuxTester(t, MuxConfig{PeekTimeout: 100 * time.Millisecond}, true, true)
	c, err := net.Dial("tcp", mt.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	wantClosed(t, c, "a silent connection")
	// Others are served as usual.
	if status, _, err := mt.httpGet("/healthz"); err != nil || status != http.StatusOK {
		t.Fatalf("HTTP: %d %v", status, err)
	}
}

func TestMuxCloseLeavesServedConnections(t *testing.T) {
	mt := newMuxTester(t, MuxConfig{}, true, true)
	c, err := net.Dial("tcp", mt.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	get := func() error {
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			return err
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return err
	}
	if err := get(); err != nil {
		t.Fatal(err)
	}
	mt.mux.Close()
	if err := mt.waitServe(); !errors.Is(err, ErrMuxClosed) {
		t.Fatalf("Serve: %v", err)
	}
	// The connection handed to the HTTP server lives on until the server
	// is shut down.
	if err := get(); err != nil {
		t.Fatalf("request on a served connection after Close: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := mt.httpSrv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := get(); err == nil {
		t.Fatal("request after Shutdown succeeded")
	}
}

func TestMuxOneServerStopped(t *testing.T) {
	mt := newMuxTester(t, MuxConfig{}, true, true)
	// The HTTP server shuts down first: HTTP connections are closed, gRPC
	// goes on.
	if err := mt.httpSrv.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, _, err := mt.httpGet("/healthz"); err == nil {
		t.Fatal("HTTP served after its server shut down")
	}
	if err := mt.grpcCheck(); err != nil {
		t.Fatalf("gRPC after the HTTP server shut down: %v", err)
	}
	mt.grpcSrv.Stop()
	mt.mux.Close()
	if err := mt.waitServe(); !errors.Is(err, ErrMuxClosed) {
		t.Fatalf("Serve: %v", err)
	}
}

func TestMuxNilServer(t *testing.T) {
	mt := newMuxTester(t, MuxConfig{}, false, true)
	if status, _, err := mt.httpGet("/healthz"); err != nil || status != http.StatusOK {
		t.Fatalf("HTTP without a gRPC server: %d %v", status, err)
	}
	// A gRPC connection is closed.
	c, err := net.Dial("tcp", mt.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, http2Preface)
	wantClosed(t, c, "a gRPC connection without a gRPC server")
}

func TestServeUntilListenerClosed(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	grpcSrv := grpc.NewServer()
	healthpb.RegisterHealthServer(grpcSrv, health.NewServer())
	defer grpcSrv.Stop()
	httpSrv := &http.Server{Handler: NewHTTPHandler(newHTTPFakeBackend(), HTTPConfig{})}
	defer httpSrv.Close()
	done := make(chan error, 1)
	go func() { done <- Serve(l, grpcSrv, httpSrv) }()

	mt := &muxTester{t: t, addr: l.Addr().String()}
	if err := mt.grpcCheck(); err != nil {
		t.Fatal(err)
	}
	if status, _, err := mt.httpGet("/healthz"); err != nil || status != http.StatusOK {
		t.Fatalf("HTTP: %d %v", status, err)
	}
	l.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Serve after l.Close: %v, want net.ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after l.Close")
	}
}

func TestMuxServeTwice(t *testing.T) {
	mt := newMuxTester(t, MuxConfig{}, true, true)
	if status, _, err := mt.httpGet("/healthz"); err != nil || status != http.StatusOK { // the first Serve runs
		t.Fatalf("HTTP: %d %v", status, err)
	}
	if err := mt.mux.Serve(); err == nil || errors.Is(err, ErrMuxClosed) {
		t.Fatalf("second Serve: %v", err)
	}
}
