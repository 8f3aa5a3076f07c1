// Package auth decides what a client may do: each client is known by the
// common name of the certificate it presented on the client port (which
// the port verified: --client-ca-file), and a roles file gives each name
// a role.
//
//	# name    role
//	reporting read
//	app       write
//	ops       admin
//	*         read      # any other client with a valid certificate
//
// read allows every read (gets, scans, tag queries, watches, batch gets,
// transactions that only read, describing collections, groups and the
// cluster); write adds every write of records (puts, deletes, batches,
// delete-range, transactions that write, Key Groups); admin adds creating
// and dropping collections, splits, merges, consistency checks and
// decommissioning nodes. A client whose name the file does not list, and
// there is no *, may do nothing. The file is read again when it changes
// (looked at, at most once a second, by the requests that need it); a file
// that does not load leaves the last good one in use.
package auth

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/groupkv/groupkv/internal/kv"
)

// Role is what a client may do; each role allows what the roles below it
// do.
type Role int

const (
	// None allows nothing.
	None Role = iota
	// Read allows reads.
	Read
	// Write allows reads and writes of records.
	Write
	// Admin allows everything.
	Admin
)

func (r Role) String() string {
	switch r {
	case Read:
		return "read"
	case Write:
		return "write"
	case Admin:
		return "admin"
	}
	return "none"
}

func parseRole(s string) (Role, bool) {
	switch s {
	case "read":
		return Read, true
	case "write":
		return Write, true
	case "admin":
		return Admin, true
	}
	return None, false
}

// recheck is how often the roles file is looked at.
const recheck = time.Second

// timeNow is the clock of the rechecks; tests replace it.
var timeNow = time.Now

// Roles is the roles file of a server.
type Roles struct {
	file string
	mu   struct {
		sync.Mutex
		roles   map[string]Role
		data    []byte
		checked time.Time
	}
}

// Load reads the roles file.
func Load(file string) (*Roles, error) {
	r := &Roles{file: file}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.reloadLocked(); err != nil {
		return nil, err
	}
	return r, nil
}

// Of answers the role of the client named name, after reading the file
// again if it changed (at most once a second).
func (r *Roles) Of(name string) Role {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now := timeNow(); now.Sub(r.mu.checked) >= recheck {
		r.mu.checked = now
		_ = r.reloadLocked()
	}
	if role, ok := r.mu.roles[name]; ok {
		return role
	}
	return r.mu.roles["*"]
}

func (r *Roles) reloadLocked() error {
	data, err := os.ReadFile(r.file)
	if err != nil {
		return fmt.Errorf("auth: reading the roles file: %w", err)
	}
	if r.mu.roles != nil && bytes.Equal(data, r.mu.data) {
		return nil
	}
	roles, err := parse(r.file, data)
	if err != nil {
		return err
	}
	r.mu.roles, r.mu.data = roles, data
	return nil
}

// parse reads lines of "NAME ROLE", with # comments and blank lines.
func parse(file string, data []byte) (map[string]Role, error) {
	roles := map[string]Role{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) != 2 {
			return nil, fmt.Errorf("auth: %s line %d: want a name and a role (read, write or admin), got %q", file, n, strings.TrimSpace(line))
		}
		role, ok := parseRole(f[1])
		if !ok {
			return nil, fmt.Errorf("auth: %s line %d: role %q is not read, write or admin", file, n, f[1])
		}
		if _, dup := roles[f[0]]; dup {
			return nil, fmt.Errorf("auth: %s line %d: %q is listed twice", file, n, f[0])
		}
		roles[f[0]] = role
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("auth: %s: %w", file, err)
	}
	return roles, nil
}

// NameOf answers the name a client is known by: the common name of the
// certificate it presented ("" for none).
func NameOf(state *tls.ConnectionState) string {
	if state == nil || len(state.PeerCertificates) == 0 {
		return ""
	}
	return state.PeerCertificates[0].Subject.CommonName
}

type clientKey struct{}

// client is what a request's context says of its client.
type client struct {
	name  string
	known bool // the connection said who the client is
}

// WithClient answers ctx carrying the client's name, as its connection
// presented it.
func WithClient(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, clientKey{}, client{name: name, known: true})
}

// Check answers nil when the client of ctx may do what needs role need,
// and a permission_denied error naming it and the operation (what)
// otherwise. A nil *Roles allows everything (no roles file).
func (r *Roles) Check(ctx context.Context, need Role, what string) error {
	if r == nil || need == None {
		return nil
	}
	c, _ := ctx.Value(clientKey{}).(client)
	if !c.known {
		return kv.Errorf(kv.CodePermissionDenied, "%s needs the %s role, and the client presented no certificate", what, need)
	}
	if has := r.Of(c.name); has < need {
		return kv.Errorf(kv.CodePermissionDenied, "%s needs the %s role; client %q has %s", what, need, c.name, has)
	}
	return nil
}
