//go:build docker

package main

import (
	"context"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestDockerCluster runs scripts/docker-cluster-test.sh: a three-node cluster
// in Docker, its replication, a partitioned node catching up and a killed
// one. It needs a Docker engine and is skipped without one:
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
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", script)
	// On timeout, SIGTERM lets the script remove its containers.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = time.Minute
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", script, err, out)
	}
	t.Logf("%s\n%s", script, out)
}
