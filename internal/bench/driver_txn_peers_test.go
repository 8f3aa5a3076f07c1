package bench

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"testing"
	"time"
)

// The etcd and PostgreSQL transaction drivers are tested against real
// servers, started here on loopback ports in temporary directories, when
// their binaries are installed (scripts/bench-txn.sh installs them); the
// tests skip otherwise.

// freePort answers a loopback port nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startEtcd runs an etcd member on a fresh data directory and answers its
// client address; it is stopped when the test ends.
func startEtcd(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("etcd")
	if err != nil {
		t.Skip("etcd is not installed (apt-get install etcd-server, or run scripts/bench-txn.sh): the etcd driver is not tested")
	}
	client, peer := freePort(t), freePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", client)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peer)
	cmd := exec.Command(bin, "--name", "test", "--data-dir", t.TempDir(),
		"--listen-client-urls", "http://"+addr, "--advertise-client-urls", "http://"+addr,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "test="+peerURL, "--logger", "zap", "--log-level", "error")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return addr
}

// pgBinDir answers the newest /usr/lib/postgresql/*/bin holding initdb.
func pgBinDir() string {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		a, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		b, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return a > b
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d
		}
	}
	return ""
}

// startPostgres runs PostgreSQL on a fresh data directory (as the postgres
// user when the test runs as root, which PostgreSQL refuses to run as) and
// answers its connection URL; it is stopped when the test ends.
func startPostgres(t *testing.T) string {
	t.Helper()
	bin := pgBinDir()
	if bin == "" {
		t.Skip("PostgreSQL is not installed (apt-get install postgresql, or run scripts/bench-txn.sh): the postgresql driver is not tested")
	}
	var asUser []string
	dir, err := os.MkdirTemp("", "groupkv-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Skip("running as root and there is no postgres user to run PostgreSQL as: the postgresql driver is not tested")
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
		asUser = []string{"runuser", "-u", "postgres", "--"}
	}
	run := func(args ...string) {
		t.Helper()
		args = append(asUser, args...)
		out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	data := filepath.Join(dir, "data")
	port := freePort(t)
	run(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-instructions")
	run(filepath.Join(bin, "pg_ctl"), "-D", data, "-l", filepath.Join(dir, "log"), "-w", "-t", "60", "-o",
		fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=on -c synchronous_commit=on", port, dir), "start")
	t.Cleanup(func() { run(filepath.Join(bin, "pg_ctl"), "-D", data, "-m", "fast", "-w", "stop") })
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
}

// TestEtcdTxnDriver runs transfers and the txn workload through etcd's
// serializable STM.
func TestEtcdTxnDriver(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	addr := startEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var d *EtcdTxn
	var err error
	for {
		if d, err = OpenEtcdTxn(ctx, addr, DriverOptions{Table: "bank"}); err == nil {
			if _, err = d.Version(ctx); err == nil {
				break
			}
			d.Close()
		}
		if ctx.Err() != nil {
			t.Fatalf("etcd at %s: %v", addr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	defer d.Close()
	bankCheck(t, d, 12, 8, 25)
	runnerCheck(t, d)
}

// TestPostgresTxnDriver runs transfers and the txn workload through
// PostgreSQL's SERIALIZABLE transactions.
func TestPostgresTxnDriver(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	dsn := startPostgres(t)
	ctx := context.Background()
	d, err := OpenPostgres(ctx, dsn, DriverOptions{Table: "bank", Conns: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if v, err := d.Version(ctx); err != nil || v == "" {
		t.Fatalf("version %q: %v", v, err)
	}
	bankCheck(t, d, 12, 8, 25)
	runnerCheck(t, d)
	// The table leaves room for updates in place (pgFillFactor).
	var opts []string
	if err := d.pool.QueryRow(ctx, "SELECT reloptions FROM pg_class WHERE relname = $1", d.name).Scan(&opts); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("fillfactor=%d", pgFillFactor); !slices.Contains(opts, want) {
		t.Fatalf("table options %q, want %s", opts, want)
	}
}
