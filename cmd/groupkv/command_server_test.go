package main

import (
	"os"
	"testing"
)

// TestServerFlagValidation: a transaction timeout that is not a positive
// duration is a usage error that names the flag, given before anything
// starts (no data directory is created).
func TestServerFlagValidation(t *testing.T) {
	dir := t.TempDir() + "/data"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--txn-timeout", "0s"}, "--txn-timeout 0s"},
		{[]string{"--txn-timeout", "-1s"}, "--txn-timeout -1s"},
		{[]string{"--txn-idle-timeout", "0s"}, "--txn-idle-timeout 0s"},
		{[]string{"--max-txn-duration", "-2m"}, "--max-txn-duration -2m0s"},
		{[]string{"--log-level", "loud"}, "--log-level"},
	} {
		cmd := serverCommand()
		cmd.SetArgs(append([]string{"--data-dir", dir, "--listen", "127.0.0.1:0", "--peer-listen", "127.0.0.1:0"}, tc.args...))
		cmd.SilenceUsage, cmd.SilenceErrors = true, true
		err := cmd.Execute()
		wantUsage(t, err, tc.want)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("a refused server left %s: %v", dir, err)
	}
}
