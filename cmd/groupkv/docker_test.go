//go:build docker

package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestDockerCluster runs scripts/docker-cluster-test.sh: a three-node cluster
// in Docker, its replication, a partitioned node catching up and a killed
// one; then the same over TLS (TLS=1). It needs a Docker engine and is
// skipped without one:
//
//	go test -tags docker -run DockerCluster -v ./cmd/groupkv/
func TestDockerCluster(t *testing.T) {
	if out, err := exec.Command("docker", "info").CombinedOutput(); err != nil {
		t.Skipf("no Docker engine answers (docker info: %v)\n%s", err, out)
	}
	script, err := filepath.Abs(filepath.Join("..", "..", "scripts", "docker-cluster-test.sh"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tls := range []string{"0", "1"} {
		t.Run("tls="+tls, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, "bash", script)
			cmd.Env = append(os.Environ(), "TLS="+tls)
			// On timeout, SIGTERM lets the script remove its containers.
			cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
			cmd.WaitDelay = time.Minute
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("TLS=%s %s: %v\n%s", tls, script, err, out)
			}
			t.Logf("TLS=%s %s\n%s", tls, script, out)
		})
	}
}
