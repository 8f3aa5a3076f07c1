package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestFileLimitKeepsTheServerUp runs a server under a limit of 256 open
// files, holds 300 connections to its peer port, and has 400 clients
// write to it at once, half of them on a new connection for every
// request: connections beyond what the limit leaves after the storage's
// share wait to be accepted, so the storage never
// fails to open a file (a node that cannot is stopped, or crashed by
// Pebble when the file is its next write-ahead log). The server stays up
// and healthy, its log has no "too many open files", and the writes it
// acknowledged read back.
func TestFileLimitKeepsTheServerUp(t *testing.T) {
	args := append([]string{"-c", `ulimit -n 256 && exec "$0" "$@"`, binary}, serverArgs(t.TempDir())...)
	srv := startWatchedCmd(t, exec.Command("sh", args...))
	base := "http://" + srv.serving(t)
	// 300 connections to the peer port, held open for the whole run, as a
	// scan of the port, or a misbehaving peer, would.
	peer := regexp.MustCompile(`\(peers: (\S+)\)`).FindStringSubmatch(srv.log.String())
	if peer == nil {
		t.Fatalf("the server's log names no peer address:\n%s", srv.log.String())
	}
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for range 300 {
		c, err := net.DialTimeout("tcp", peer[1], time.Second)
		if err != nil {
			break // the accept queue is full: the rest are refused
		}
		held = append(held, c)
	}
	if code, _, body := httpDo(t, "POST", base+"/v1/collections", `{"name": "c", "shards": 8}`); code != 200 {
		t.Fatalf("create collection: %d %s", code, body)
	}
	value := func(c, i int) []byte { return bytes.Repeat([]byte{byte('a' + (c+i)%26)}, 4<<10) }
	const clients = 400
	var (
		mu     sync.Mutex
		acked  [][2]int
		failed int
		wg     sync.WaitGroup
	)
	end := time.Now().Add(5 * time.Second)
	for c := range clients {
		wg.Go(func() {
			tr := &http.Transport{MaxIdleConnsPerHost: 1, DisableKeepAlives: c%2 == 0}
			defer tr.CloseIdleConnections()
			hc := &http.Client{Timeout: 30 * time.Second, Transport: tr}
			for i := 0; time.Now().Before(end); i++ {
				req, _ := http.NewRequest("PUT", fmt.Sprintf("%s/v1/kv/c/k%03d-%05d", base, c, i), bytes.NewReader(value(c, i)))
				resp, err := hc.Do(req)
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				mu.Lock()
				if err == nil && resp.StatusCode == 200 {
					acked = append(acked, [2]int{c, i})
				} else {
					failed++ // a connection the client gave up on, say
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	select {
	case <-srv.done:
		t.Fatalf("the server exited under the load: %v\n%s", srv.err, lastLines(srv.log.String(), 30))
	default:
	}
	if code, _, body := httpDo(t, "GET", base+"/healthz", ""); code != 200 {
		t.Fatalf("/healthz after the load: %d %s\n%s", code, body, lastLines(srv.log.String(), 10))
	}
	log := srv.log.String()
	if strings.Contains(log, "too many open files") || strings.Contains(log, "panic") {
		t.Errorf("the server ran out of files or panicked:\n%s", lastLines(log, 10))
	}
	if len(acked) < 1000 {
		t.Fatalf("%d writes acknowledged (%d failed): too few to show anything", len(acked), failed)
	}
	for j := 0; j < len(acked); j += len(acked) / 500 {
		c, i := acked[j][0], acked[j][1]
		if code, _, body := httpDo(t, "GET", fmt.Sprintf("%s/v1/kv/c/k%03d-%05d", base, c, i), ""); code != 200 || body != string(value(c, i)) {
			t.Fatalf("acknowledged write k%03d-%05d reads %d, %d bytes", c, i, code, len(body))
		}
	}
	t.Logf("%d peer connections held; %d writes from %d clients acknowledged, %d failed; the server's log:\n%s", len(held), len(acked), clients, failed, lastLines(log, 3))
}
