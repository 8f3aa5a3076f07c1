package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	groupkv "github.com/groupkv/groupkv"
	"github.com/groupkv/groupkv/internal/api"
	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/kv"
)

// A backup is a file of JSON lines (docs/backup.md):
//
//	{"groupkv_backup": 1, "version": V, "time": "..."}
//	{"collection": {"name", "partitioning", "shards", "split_points_base64"}}
//	{"key", "value" | "value_base64", "version", "tags"}   one per record, in key order
//	{"collection_end": {"name", "records"}}
//	... the next collections ...
//	{"group": {"id", "mode", "leader", "members"}}         one per key group
//	{"end": {"collections", "records", "groups", "sha256"}}
//
// The records are the collections' state at one version V, read by scans
// at V; the key groups are those active when the records were read, each
// of keys of the collections backed up. The last line's sha256 is the hex
// SHA-256 of every byte before it: a file cut short or changed is refused
// by restore before it writes. Format 1 is format 2 without groups.
const backupFormat = 2

// backupLine is any line of a backup; which fields are set tells its kind.
type backupLine struct {
	Format        *int                 `json:"groupkv_backup,omitempty"`
	Time          string               `json:"time,omitempty"`
	Collection    *backupCollection    `json:"collection,omitempty"`
	CollectionEnd *backupCollectionEnd `json:"collection_end,omitempty"`
	Group         *backupGroup         `json:"group,omitempty"`
	End           *backupEnd           `json:"end,omitempty"`
	api.KeyJSON
	api.ValueJSON
	Version *uint64  `json:"version,omitempty"`
	Tags    []string `json:"tags,omitempty"`
}

// backupCollection is what a restore needs to create a collection again.
type backupCollection struct {
	Name         string               `json:"name"`
	Partitioning groupkv.Partitioning `json:"partitioning"`
	Shards       int                  `json:"shards"`
	SplitPoints  [][]byte             `json:"split_points_base64,omitempty"`
}

type backupCollectionEnd struct {
	Name    string `json:"name"`
	Records int64  `json:"records"`
}

// backupGroup is a key group, as a restore creates it again.
type backupGroup struct {
	ID      string            `json:"id"`
	Mode    groupkv.GroupMode `json:"mode"`
	Leader  backupKey         `json:"leader"`
	Members []backupKey       `json:"members"`
}

// backupKey is a key of a collection.
type backupKey struct {
	Collection string `json:"collection"`
	api.KeyJSON
}

func toBackupKey(k groupkv.KeyRef) backupKey {
	return backupKey{Collection: k.Collection, KeyJSON: api.ToKeyJSON(k.Key)}
}

type backupEnd struct {
	Collections int    `json:"collections"`
	Records     int64  `json:"records"`
	Groups      int    `json:"groups,omitempty"`
	SHA256      string `json:"sha256"`
}

// backupSummary is what backup and restore print when they are done.
type backupSummary struct {
	Version     uint64 `json:"version"`
	Time        string `json:"time"`
	Collections int    `json:"collections"`
	Records     int64  `json:"records"`
	Groups      int    `json:"groups,omitempty"`
	File        string `json:"file,omitempty"`
}

// maxBackupLine bounds a line of a backup restore reads: a record of the
// largest key and a value of 16 MiB (above any node's value limit) in
// base64, with room to spare.
const maxBackupLine = 32 << 20

func backupCommand() *cobra.Command {
	var (
		out         string
		collections []string
		version     uint64
		ago         time.Duration
	)
	cmd := &cobra.Command{
		Use:   "backup",
		Short: "Write the records of every collection, as of one version, to a file",
		Long: `Write every collection (or those named by --collection) and its records to
a file, as of one version: one consistent state of the cluster, whatever
is written meanwhile. Restore it with groupkv restore.

The version is the present (every write acknowledged before the backup
began is in it), or --version N, or --ago D (the state D ago): both must
be within the servers' retention window (--retention, 1 hour by default),
and so must the whole backup, which reads at that version until it ends.

The file is JSON lines (docs/backup.md), written to FILE.tmp and renamed
to FILE once complete and synced. Its last line holds the SHA-256 of the
rest: a file cut short or changed is refused by restore.

Collections whose names begin with _ (groupkv's own) are not backed up.
Key groups active when the backup ends whose keys are all in collections
backed up are, and restore creates them again. A key in a group is backed
up as it was at the version, with the group's writes committed at or
below it (docs/groups.md#limits).`,
		Example: `  groupkv backup --out users.backup --collection users
  groupkv backup --out - | gzip > cluster.backup.gz
  groupkv backup --out before-the-mistake.backup --ago 10m`,
		Args: argsBetween(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return usagef("--out is required: a file, or - for standard output")
			}
			if version != 0 && ago != 0 {
				return usagef("--version and --ago: give one of them")
			}
			if ago < 0 {
				return usagef("--ago %v: give a duration into the past, such as 10m", ago)
			}
			if ago > 0 {
				version = cluster.TimestampFromTime(time.Now().Add(-ago))
			}
			db, err := dial(cmd)
			if err != nil {
				return err
			}
			defer db.Close()
			ctx := commandContext(cmd)
			return runBackup(ctx, cmd, db, out, collections, version)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&out, "out", "o", "", "the file to write (-: standard output)")
	f.StringSliceVar(&collections, "collection", nil, "back up only this collection (repeat, or separate with commas)")
	f.Uint64Var(&version, "version", 0, "back up the state as of this version (within the retention window); 0: the present")
	f.DurationVar(&ago, "ago", 0, "back up the state as of this long ago (within the retention window)")
	addAddrFlag(cmd)
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	return cmd
}

// runBackup writes the backup of db to out (a path, or - for cmd's
// standard output) and prints its summary.
func runBackup(ctx context.Context, cmd *cobra.Command, db groupkv.DB, out string, names []string, version uint64) error {
	infos, err := backupCollections(ctx, db, names)
	if err != nil {
		return err
	}
	if version == 0 {
		// The present: a first page of each collection waits for the
		// writes acknowledged before it (group writes shipped included)
		// and answers a version that has them; the highest of those has
		// them all, and every collection can be read there.
		for _, c := range infos {
			res, err := db.Scan(ctx, groupkv.ScanRequest{Collection: c.Name, Limit: 1})
			if err != nil {
				return fmt.Errorf("reading collection %q: %w", c.Name, err)
			}
			version = max(version, res.Version)
		}
		if version == 0 {
			version = 1
		}
	}

	var (
		w      io.Writer
		file   *os.File
		tmp    string
		stdout = out == "-"
	)
	if stdout {
		w = cmd.OutOrStdout()
	} else {
		tmp = out + ".tmp"
		if file, err = os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600); err != nil {
			return fmt.Errorf("creating the backup: %w", err)
		}
		defer func() {
			if file != nil {
				file.Close()
				os.Remove(tmp)
			}
		}()
		w = file
	}
	bw := bufio.NewWriterSize(w, 1<<20)
	sum := sha256.New()
	bk := &backupWriter{w: io.MultiWriter(bw, sum)}
	when := cluster.TimeFromTimestamp(version).UTC().Format(time.RFC3339Nano)
	format := backupFormat
	bk.line(backupLine{Format: &format, Version: &version, Time: when})
	var total int64
	for _, c := range infos {
		n, err := backupCollectionRecords(ctx, db, bk, c, version)
		if err != nil {
			return err
		}
		total += n
	}
	groups, err := backupGroups(ctx, cmd, db, infos)
	if err != nil {
		return err
	}
	for i := range groups {
		bk.line(backupLine{Group: &groups[i]})
	}
	end := &backupEnd{Collections: len(infos), Records: total, Groups: len(groups), SHA256: hex.EncodeToString(sum.Sum(nil))}
	bk.w = bw // the end line is not part of its own sum
	bk.line(backupLine{End: end})
	if bk.err != nil {
		return fmt.Errorf("writing the backup: %w", bk.err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("writing the backup: %w", err)
	}
	summary := backupSummary{Version: version, Time: when, Collections: len(infos), Records: total, Groups: len(groups)}
	if stdout {
		enc := json.NewEncoder(cmd.ErrOrStderr())
		return enc.Encode(summary)
	}
	if err := file.Sync(); err != nil {
		return fmt.Errorf("writing the backup: %w", err)
	}
	if err := file.Close(); err != nil {
		file = nil
		os.Remove(tmp)
		return fmt.Errorf("writing the backup: %w", err)
	}
	file = nil
	if err := os.Rename(tmp, out); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing the backup: %w", err)
	}
	if d, err := os.Open(filepath.Dir(out)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	summary.File = out
	return printJSON(cmd, summary)
}

// backupCollections describes the collections to back up: names, or every
// collection but groupkv's own.
func backupCollections(ctx context.Context, db groupkv.DB, names []string) ([]groupkv.CollectionInfo, error) {
	if len(names) == 0 {
		all, err := db.ListCollections(ctx)
		if err != nil {
			return nil, err
		}
		var infos []groupkv.CollectionInfo
		for _, c := range all {
			if !strings.HasPrefix(c.Name, "_") {
				infos = append(infos, c)
			}
		}
		slices.SortFunc(infos, func(a, b groupkv.CollectionInfo) int { return strings.Compare(a.Name, b.Name) })
		return infos, nil
	}
	var infos []groupkv.CollectionInfo
	for _, name := range names {
		if slices.ContainsFunc(infos, func(c groupkv.CollectionInfo) bool { return c.Name == name }) {
			continue
		}
		if strings.HasPrefix(name, "_") {
			return nil, usagef("--collection %q: collections whose names begin with _ are groupkv's own, not backed up", name)
		}
		c, err := db.DescribeCollection(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("collection %q: %w", name, err)
		}
		infos = append(infos, c)
	}
	return infos, nil
}

// backupCollectionRecords writes collection c's header, its records at
// version and its end line, and answers how many records it wrote.
func backupCollectionRecords(ctx context.Context, db groupkv.DB, bk *backupWriter, c groupkv.CollectionInfo, version uint64) (int64, error) {
	bc := &backupCollection{Name: c.Name, Partitioning: c.Partitioning, Shards: len(c.Shards)}
	if c.Partitioning == kv.PartitionRange {
		bc.SplitPoints = c.SplitPoints
	}
	bk.line(backupLine{Collection: bc})
	var n int64
	page := ""
	for {
		res, err := db.Scan(ctx, groupkv.ScanRequest{Collection: c.Name, Limit: kv.MaxPageSize, Page: page, Version: version})
		if err != nil {
			if groupkv.CodeOf(err) == groupkv.CodeCompacted {
				return n, fmt.Errorf("reading collection %q at version %d: %w (the version is older than the server's retention window, --retention: the backup took longer than the window, or --version or --ago reach back past it)", c.Name, version, err)
			}
			return n, fmt.Errorf("reading collection %q at version %d: %w", c.Name, version, err)
		}
		for _, rec := range res.Items {
			r := api.ToRecordJSON(rec)
			v := r.Version
			bk.line(backupLine{KeyJSON: r.KeyJSON, ValueJSON: r.ValueJSON, Version: &v, Tags: r.Tags})
			n++
		}
		if bk.err != nil {
			return n, fmt.Errorf("writing the backup: %w", bk.err)
		}
		if res.NextPage == "" {
			break
		}
		if res.NextPage == page {
			return n, fmt.Errorf("reading collection %q: the server answered page %q as its own next page", c.Name, page)
		}
		page = res.NextPage
	}
	bk.line(backupLine{CollectionEnd: &backupCollectionEnd{Name: c.Name, Records: n}})
	return n, nil
}

// backupGroups describes the key groups to back up: those active whose
// keys are all in the collections infos. The others are named on cmd's
// standard error.
func backupGroups(ctx context.Context, cmd *cobra.Command, db groupkv.DB, infos []groupkv.CollectionInfo) ([]backupGroup, error) {
	all, err := db.ListGroups(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing the key groups: %w", err)
	}
	backedUp := map[string]bool{}
	for _, c := range infos {
		backedUp[c.Name] = true
	}
	var out []backupGroup
	for _, g := range all {
		if g.State != groupkv.GroupActive {
			fmt.Fprintf(cmd.ErrOrStderr(), "backup: key group %q is not backed up: it is %s\n", g.ID, g.State)
			continue
		}
		i := slices.IndexFunc(g.Members, func(k groupkv.KeyRef) bool { return !backedUp[k.Collection] })
		if i >= 0 || !backedUp[g.Leader.Collection] {
			fmt.Fprintf(cmd.ErrOrStderr(), "backup: key group %q is not backed up: it holds keys of collections not backed up\n", g.ID)
			continue
		}
		bg := backupGroup{ID: g.ID, Mode: g.Mode, Leader: toBackupKey(g.Leader)}
		if bg.Mode == "" {
			bg.Mode = groupkv.GroupAtomic
		}
		for _, k := range g.Members {
			bg.Members = append(bg.Members, toBackupKey(k))
		}
		out = append(out, bg)
	}
	slices.SortFunc(out, func(a, b backupGroup) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// backupWriter writes lines of a backup, keeping the first error.
type backupWriter struct {
	w   io.Writer
	err error
	buf bytes.Buffer
}

func (b *backupWriter) line(l backupLine) {
	if b.err != nil {
		return
	}
	b.buf.Reset()
	enc := json.NewEncoder(&b.buf)
	enc.SetEscapeHTML(false)
	if b.err = enc.Encode(l); b.err != nil {
		return
	}
	_, b.err = b.w.Write(b.buf.Bytes())
}

func restoreCommand() *cobra.Command {
	var (
		overwrite   bool
		checkOnly   bool
		collections []string
		replicas    int
		parallel    int
	)
	cmd := &cobra.Command{
		Use:   "restore FILE",
		Short: "Write the collections and records of a backup into a cluster",
		Long: `Create the collections of a backup (groupkv backup) and write its records
into them. FILE - reads standard input (kept in a temporary file).

The whole file is read and checked first (its format, its counts and its
SHA-256): a damaged file is refused before anything is written.
--check-only stops there: it checks a backup without a server. A
collection of the backup that exists on the server is refused too, unless
--overwrite, which writes the backup's records into it (replacing those
keys; other keys stay).

Collections are created with the backup's partitioning, shard count and
split points (and --replicas, default as for groupkv collections create).
Records are written in batches, each atomic, --parallel at once, at new versions: a restored
record keeps its key, value and tags, not its version. A restore that
stops part way (the server went away) can be run again with --overwrite.`,
		Example: `  groupkv restore users.backup
  gunzip -c cluster.backup.gz | groupkv restore -
  groupkv restore cluster.backup --collection users --overwrite
  groupkv restore cluster.backup --check-only`,
		Args: argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if parallel < 1 {
				return usagef("--parallel %d: give at least 1", parallel)
			}
			if replicas < 0 {
				return usagef("--replicas %d: give a replication factor, or 0 for the default", replicas)
			}
			path := args[0]
			if path == "-" {
				tmp, err := copyToTemp(cmd.InOrStdin())
				if err != nil {
					return err
				}
				defer os.Remove(tmp)
				path = tmp
			}
			plan, err := checkBackup(path)
			if err != nil {
				return err
			}
			if err := plan.only(collections); err != nil {
				return err
			}
			if checkOnly {
				var n int64
				for _, c := range plan.collections {
					if plan.restores(c.Name) {
						n += plan.records[c.Name]
					}
				}
				return printJSON(cmd, backupSummary{Version: plan.version, Time: plan.time, Collections: len(plan.collections), Records: n, Groups: len(plan.restoredGroups())})
			}
			db, err := dial(cmd)
			if err != nil {
				return err
			}
			defer db.Close()
			ctx := commandContext(cmd)
			return runRestore(ctx, cmd, db, path, plan, overwrite, replicas, parallel)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&overwrite, "overwrite", false, "write into collections that exist on the server")
	f.StringSliceVar(&collections, "collection", nil, "restore only this collection of the backup (repeat, or separate with commas)")
	f.IntVar(&replicas, "replicas", 0, "replication factor of the collections created (0: 3 on a cluster of 3 or more nodes, else the node count)")
	f.IntVar(&parallel, "parallel", 4, "batches written at once")
	f.BoolVar(&checkOnly, "check-only", false, "check the file as a restore would, print what it holds, and write nothing (no server needed)")
	addAddrFlag(cmd)
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	return cmd
}

// copyToTemp copies r to a temporary file, for a restore from standard
// input, which is read twice.
func copyToTemp(r io.Reader) (string, error) {
	f, err := os.CreateTemp("", "groupkv-restore-*")
	if err != nil {
		return "", err
	}
	defer f.Close()
	if _, err := io.Copy(f, r); err != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("reading the backup from standard input: %w", err)
	}
	return f.Name(), nil
}

// restorePlan is what checkBackup found in a backup.
type restorePlan struct {
	version     uint64
	time        string
	collections []backupCollection
	records     map[string]int64 // by collection
	groups      []groupkv.GroupSpec
	selected    map[string]bool // nil: all
}

// restoredGroups are the key groups of the plan whose keys are all in
// collections restored.
func (p *restorePlan) restoredGroups() []groupkv.GroupSpec {
	var out []groupkv.GroupSpec
	for _, g := range p.groups {
		if p.restores(g.Leader.Collection) && !slices.ContainsFunc(g.Members, func(k groupkv.KeyRef) bool { return !p.restores(k.Collection) }) {
			out = append(out, g)
		}
	}
	return out
}

// only restricts the restore to names.
func (p *restorePlan) only(names []string) error {
	if len(names) == 0 {
		return nil
	}
	p.selected = map[string]bool{}
	for _, name := range names {
		if !slices.ContainsFunc(p.collections, func(c backupCollection) bool { return c.Name == name }) {
			return usagef("--collection %q: the backup has no such collection", name)
		}
		p.selected[name] = true
	}
	return nil
}

func (p *restorePlan) restores(name string) bool { return p.selected == nil || p.selected[name] }

// backupReader reads the lines of a backup, numbering them.
type backupReader struct {
	r    *bufio.Reader
	sum  hash.Hash
	path string
	n    int
}

func openBackup(path string) (*backupReader, *os.File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("opening the backup: %w", err)
	}
	return &backupReader{r: bufio.NewReaderSize(f, 1<<20), sum: sha256.New(), path: path}, f, nil
}

func (b *backupReader) errorf(format string, args ...any) error {
	return fmt.Errorf("backup %s is damaged or not a backup: line %d: %s", b.path, b.n, fmt.Sprintf(format, args...))
}

// next reads the next line; io.EOF at the end. Lines but the end line go
// into the running SHA-256.
func (b *backupReader) next() (backupLine, error) {
	var raw []byte
	for {
		chunk, err := b.r.ReadSlice('\n')
		raw = append(raw, chunk...)
		if len(raw) > maxBackupLine {
			b.n++
			return backupLine{}, b.errorf("a line over %d bytes", maxBackupLine)
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if err == io.EOF {
			if len(raw) == 0 {
				return backupLine{}, io.EOF
			}
			b.n++
			return backupLine{}, b.errorf("the last line has no newline: the file was cut short")
		}
		if err != nil {
			return backupLine{}, fmt.Errorf("reading the backup %s: %w", b.path, err)
		}
		break
	}
	b.n++
	var l backupLine
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&l); err != nil {
		return backupLine{}, b.errorf("%v", err)
	}
	if l.End == nil {
		b.sum.Write(raw)
	}
	return l, nil
}

// record returns the record of line l.
func (b *backupReader) record(l backupLine) (key, value []byte, tags []string, err error) {
	if l.Version == nil {
		return nil, nil, nil, b.errorf("a record without a version")
	}
	key, given, err := api.BytesFromJSON("key", l.Key, l.KeyBase64)
	if err != nil || !given || len(key) == 0 {
		return nil, nil, nil, b.errorf("a record without a valid key")
	}
	if err := kv.ValidateKey(key); err != nil {
		return nil, nil, nil, b.errorf("%s", kv.AsError(err).Message)
	}
	value, given, err = api.BytesFromJSON("value", l.Value, l.ValueBase64)
	if err != nil || !given {
		return nil, nil, nil, b.errorf("the record of key %q has no valid value", key)
	}
	if err := kv.ValidateTags(l.Tags); err != nil {
		return nil, nil, nil, b.errorf("the record of key %q: %s", key, kv.AsError(err).Message)
	}
	return key, value, l.Tags, nil
}

// group checks key group g of a backup, whose collections are those of
// plan, and returns it as a restore creates it.
func (b *backupReader) group(g backupGroup, plan *restorePlan) (groupkv.GroupSpec, error) {
	if err := kv.ValidateGroupID(g.ID); err != nil {
		return groupkv.GroupSpec{}, b.errorf("key group %q: %s", g.ID, kv.AsError(err).Message)
	}
	if slices.ContainsFunc(plan.groups, func(o groupkv.GroupSpec) bool { return o.ID == g.ID }) {
		return groupkv.GroupSpec{}, b.errorf("key group %q appears twice", g.ID)
	}
	if g.Mode != groupkv.GroupAtomic && g.Mode != groupkv.GroupBestEffort {
		return groupkv.GroupSpec{}, b.errorf("key group %q: mode %q is not atomic or best_effort", g.ID, g.Mode)
	}
	key := func(k backupKey) (groupkv.KeyRef, error) {
		if !slices.ContainsFunc(plan.collections, func(c backupCollection) bool { return c.Name == k.Collection }) {
			return groupkv.KeyRef{}, b.errorf("key group %q holds a key of collection %q, which the backup does not hold", g.ID, k.Collection)
		}
		key, given, err := api.BytesFromJSON("key", k.Key, k.KeyBase64)
		if err != nil || !given || len(key) == 0 {
			return groupkv.KeyRef{}, b.errorf("key group %q holds a key that is not valid", g.ID)
		}
		if err := kv.ValidateKey(key); err != nil {
			return groupkv.KeyRef{}, b.errorf("key group %q: %s", g.ID, kv.AsError(err).Message)
		}
		return groupkv.KeyRef{Collection: k.Collection, Key: key}, nil
	}
	spec := groupkv.GroupSpec{ID: g.ID, Mode: g.Mode}
	var err error
	if spec.Leader, err = key(g.Leader); err != nil {
		return groupkv.GroupSpec{}, err
	}
	if len(g.Members) == 0 {
		return groupkv.GroupSpec{}, b.errorf("key group %q has no members", g.ID)
	}
	for _, m := range g.Members {
		k, err := key(m)
		if err != nil {
			return groupkv.GroupSpec{}, err
		}
		spec.Members = append(spec.Members, k)
	}
	return spec, nil
}

// checkBackup reads the whole backup at path and checks its format, its
// counts and its SHA-256.
func checkBackup(path string) (*restorePlan, error) {
	b, f, err := openBackup(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	plan := &restorePlan{records: map[string]int64{}}
	head, err := b.next()
	if err == io.EOF {
		return nil, fmt.Errorf("backup %s is empty", path)
	}
	if err != nil {
		return nil, err
	}
	if head.Format == nil || head.Version == nil {
		return nil, b.errorf(`it does not begin with {"groupkv_backup": %d, ...}`, backupFormat)
	}
	if *head.Format < 1 || *head.Format > backupFormat {
		return nil, b.errorf("backup format %d: this groupkv reads formats 1 to %d", *head.Format, backupFormat)
	}
	format := *head.Format
	plan.version, plan.time = *head.Version, head.Time
	var (
		cur   *backupCollection
		count int64
		total int64
		last  []byte
	)
	for {
		l, err := b.next()
		if err == io.EOF {
			return nil, b.errorf("no end line: the file was cut short")
		}
		if err != nil {
			return nil, err
		}
		switch {
		case l.Collection != nil:
			if cur != nil {
				return nil, b.errorf("collection %q begins inside collection %q", l.Collection.Name, cur.Name)
			}
			c := *l.Collection
			if slices.ContainsFunc(plan.collections, func(o backupCollection) bool { return o.Name == c.Name }) {
				return nil, b.errorf("collection %q appears twice", c.Name)
			}
			opts := groupkv.CollectionOptions{Name: c.Name, Partitioning: c.Partitioning, Shards: c.Shards, SplitPoints: c.SplitPoints}
			if c.Partitioning == kv.PartitionRange {
				opts.Shards = 0
			}
			if err := kv.ValidateCollectionOptions(&opts); err != nil {
				return nil, b.errorf("collection %q: %s", c.Name, kv.AsError(err).Message)
			}
			if strings.HasPrefix(c.Name, "_") {
				return nil, b.errorf("collection %q is groupkv's own: it cannot be restored", c.Name)
			}
			plan.collections = append(plan.collections, c)
			cur, count, last = &plan.collections[len(plan.collections)-1], 0, nil
		case l.CollectionEnd != nil:
			if cur == nil || l.CollectionEnd.Name != cur.Name {
				return nil, b.errorf("the end of collection %q where it was not begun", l.CollectionEnd.Name)
			}
			if l.CollectionEnd.Records != count {
				return nil, b.errorf("collection %q: the backup says %d records, it holds %d", cur.Name, l.CollectionEnd.Records, count)
			}
			plan.records[cur.Name] = count
			total += count
			cur = nil
		case l.Group != nil:
			if format < 2 {
				return nil, b.errorf("a key group in a backup of format %d", format)
			}
			if cur != nil {
				return nil, b.errorf("key group %q inside collection %q", l.Group.ID, cur.Name)
			}
			g, err := b.group(*l.Group, plan)
			if err != nil {
				return nil, err
			}
			plan.groups = append(plan.groups, g)
		case l.End != nil:
			if cur != nil {
				return nil, b.errorf("the end inside collection %q", cur.Name)
			}
			if l.End.Collections != len(plan.collections) || l.End.Records != total {
				return nil, b.errorf("the backup says %d collections and %d records, it holds %d and %d", l.End.Collections, l.End.Records, len(plan.collections), total)
			}
			if l.End.Groups != len(plan.groups) {
				return nil, b.errorf("the backup says %d key groups, it holds %d", l.End.Groups, len(plan.groups))
			}
			if got := hex.EncodeToString(b.sum.Sum(nil)); got != l.End.SHA256 {
				return nil, b.errorf("its SHA-256 is %s, the backup says %s: the file was changed", got, l.End.SHA256)
			}
			if _, err := b.next(); err != io.EOF {
				return nil, b.errorf("lines after the end")
			}
			return plan, nil
		case l.Format != nil:
			return nil, b.errorf("a second header")
		default:
			if cur == nil {
				return nil, b.errorf("a record outside any collection")
			}
			if len(plan.groups) > 0 {
				return nil, b.errorf("collection %q after the key groups", cur.Name)
			}
			key, _, _, err := b.record(l)
			if err != nil {
				return nil, err
			}
			if last != nil && bytes.Compare(key, last) <= 0 {
				return nil, b.errorf("collection %q: key %q is not above the key before it", cur.Name, key)
			}
			last = append(last[:0], key...)
			count++
		}
	}
}

// Batches of a restore: at most this many records, and about this many
// bytes of keys and values (below a node's defaults: 1000 items, 16 MiB).
const (
	restoreBatchItems = 500
	restoreBatchBytes = 4 << 20
)

// runRestore creates the plan's collections on db and writes their
// records from the backup at path, which checkBackup checked.
func runRestore(ctx context.Context, cmd *cobra.Command, db groupkv.DB, path string, plan *restorePlan, overwrite bool, replicas, parallel int) error {
	existing, err := db.ListCollections(ctx)
	if err != nil {
		return err
	}
	exists := map[string]bool{}
	for _, c := range existing {
		exists[c.Name] = true
	}
	var clash []string
	for _, c := range plan.collections {
		if plan.restores(c.Name) && exists[c.Name] {
			clash = append(clash, c.Name)
		}
	}
	if len(clash) > 0 && !overwrite {
		return fmt.Errorf("nothing restored: the server has collections of the backup already (%s): drop them, restore elsewhere, or give --overwrite to write the backup's records into them",
			strings.Join(clash, ", "))
	}
	if len(clash) > 0 {
		if err := clearGroups(ctx, db, plan); err != nil {
			return err
		}
	}
	for _, c := range plan.collections {
		if !plan.restores(c.Name) || exists[c.Name] {
			continue
		}
		opts := groupkv.CollectionOptions{Name: c.Name, Partitioning: c.Partitioning, Shards: c.Shards, SplitPoints: c.SplitPoints, Replicas: replicas}
		if c.Partitioning == kv.PartitionRange {
			opts.Shards = 0 // the split points say
		}
		if _, err := db.CreateCollection(ctx, opts); err != nil {
			return fmt.Errorf("creating collection %q: %w", c.Name, err)
		}
	}

	r, f, err := openBackup(path)
	if err != nil {
		return err
	}
	defer f.Close()
	// Batches go out parallel at a time; a collection is complete once
	// every batch of it was answered.
	var (
		batches = map[int]*restoreBatch{} // by shard of cur
		info    groupkv.CollectionInfo    // cur's, for its shards
		cur     string
		done    []string
		wg      sync.WaitGroup
		slots   = make(chan struct{}, parallel)
		mu      sync.Mutex
		written int64
		failed  error
	)
	failure := func() error {
		mu.Lock()
		defer mu.Unlock()
		return failed
	}
	// settle waits for the batches in flight and answers the first error.
	settle := func() error {
		wg.Wait()
		if err := failure(); err != nil {
			return fmt.Errorf("restoring collection %q: %w (%d records of the backup written; collections complete: %s); run the restore again with --overwrite to finish it",
				cur, err, written, listOrNone(done))
		}
		return nil
	}
	send := func(b *restoreBatch) error {
		if len(b.items) == 0 {
			return nil
		}
		if failure() != nil {
			return settle()
		}
		items := b.items
		b.items, b.size = nil, 0
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			_, err := db.BatchPut(ctx, items)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if failed == nil {
					failed = err
				}
				return
			}
			written += int64(len(items))
		}()
		return nil
	}
	for {
		l, err := r.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			wg.Wait()
			return err
		}
		switch {
		case l.Collection != nil:
			cur = l.Collection.Name
			clear(batches)
			info = groupkv.CollectionInfo{}
			if plan.restores(cur) {
				if info, err = db.DescribeCollection(ctx, cur); err != nil {
					wg.Wait()
					return fmt.Errorf("collection %q: %w", cur, err)
				}
			}
		case l.CollectionEnd != nil:
			for _, sh := range slices.Sorted(maps.Keys(batches)) {
				if err := send(batches[sh]); err != nil {
					return err
				}
			}
			if err := settle(); err != nil {
				return err
			}
			if plan.restores(cur) {
				done = append(done, cur)
			}
			cur = ""
		case l.End != nil, l.Format != nil, l.Group != nil:
		default:
			if !plan.restores(cur) {
				continue
			}
			key, value, tags, err := r.record(l)
			if err != nil {
				wg.Wait()
				return err
			}
			sh := shardOf(info, key, tags)
			batch := batches[sh]
			if batch == nil {
				batch = &restoreBatch{}
				batches[sh] = batch
			}
			if len(batch.items) == restoreBatchItems || batch.size+len(key)+len(value) > restoreBatchBytes {
				if err := send(batch); err != nil {
					return err
				}
			}
			batch.items = append(batch.items, groupkv.PutItem{Collection: cur, Key: key, Value: value, Tags: tags})
			batch.size += len(key) + len(value)
		}
	}
	if err := settle(); err != nil {
		return err
	}
	groups, err := restoreGroups(ctx, db, plan.restoredGroups(), overwrite)
	if err != nil {
		return fmt.Errorf("%w (every record of the backup is written; key groups created: %s)", err, listOrNone(groups))
	}
	return printJSON(cmd, backupSummary{Version: plan.version, Time: plan.time, Collections: len(done), Records: written, Groups: len(groups)})
}

// clearGroups deletes, before a restore writes into collections that
// exist (--overwrite), the key groups of the server holding keys of
// those collections: their keys take no batch write. Each must be a group
// of the backup, which the restore creates again once the records are
// written; a group the backup does not have is refused, before any is
// deleted.
func clearGroups(ctx context.Context, db groupkv.DB, plan *restorePlan) error {
	groups, err := db.ListGroups(ctx)
	if err != nil {
		return fmt.Errorf("listing the key groups: %w", err)
	}
	backedUp := map[string]bool{}
	for _, g := range plan.restoredGroups() {
		backedUp[g.ID] = true
	}
	var clear, foreign []string
	for _, g := range groups {
		if !plan.restores(g.Leader.Collection) && !slices.ContainsFunc(g.Members, func(k groupkv.KeyRef) bool { return plan.restores(k.Collection) }) {
			continue
		}
		switch {
		case backedUp[g.ID]:
			clear = append(clear, g.ID)
		case slices.ContainsFunc(plan.groups, func(o groupkv.GroupSpec) bool { return o.ID == g.ID }):
			foreign = append(foreign, fmt.Sprintf("%q (it holds keys of collections not restored)", g.ID))
		default:
			foreign = append(foreign, fmt.Sprintf("%q (not in the backup)", g.ID))
		}
	}
	if len(foreign) > 0 {
		return fmt.Errorf("nothing restored: key groups hold keys of the collections the restore writes, and it would not create them again: %s; delete them first", strings.Join(foreign, ", "))
	}
	for _, id := range clear {
		if err := db.DeleteGroup(ctx, id); err != nil && groupkv.CodeOf(err) != groupkv.CodeNotFound {
			return fmt.Errorf("deleting key group %q before writing its keys (the restore creates it again): %w", id, err)
		}
	}
	return nil
}

// restoreGroups creates the key groups specs once their keys are
// restored, and answers the ids of those it created or found as they
// are. A group of the id that exists otherwise is refused, unless
// overwrite: then it is deleted and created again.
func restoreGroups(ctx context.Context, db groupkv.DB, specs []groupkv.GroupSpec, overwrite bool) ([]string, error) {
	var done []string
	for _, spec := range specs {
		cur, err := db.DescribeGroup(ctx, spec.ID)
		switch {
		case err == nil && sameGroup(cur, spec):
			done = append(done, spec.ID)
			continue
		case err == nil && !overwrite:
			return done, fmt.Errorf("key group %q exists on the server with other keys: delete it, or give --overwrite to replace it", spec.ID)
		case err == nil:
			if err := db.DeleteGroup(ctx, spec.ID); err != nil && groupkv.CodeOf(err) != groupkv.CodeNotFound {
				return done, fmt.Errorf("replacing key group %q: %w", spec.ID, err)
			}
		case groupkv.CodeOf(err) != groupkv.CodeNotFound:
			return done, fmt.Errorf("key group %q: %w", spec.ID, err)
		}
		created, err := db.CreateGroup(ctx, spec)
		if err != nil {
			return done, fmt.Errorf("creating key group %q: %w", spec.ID, err)
		}
		if len(created.Refused) > 0 {
			// best_effort: the group holds the keys that joined.
			r := created.Refused[0]
			return done, fmt.Errorf("key group %q was created without %d of its keys (the first: %q of collection %q, %s)", spec.ID, len(created.Refused), r.Key, r.Collection, r.Reason)
		}
		done = append(done, spec.ID)
	}
	return done, nil
}

// sameGroup reports whether group cur is spec: its mode, leader and keys.
func sameGroup(cur groupkv.GroupInfo, spec groupkv.GroupSpec) bool {
	mode := func(m groupkv.GroupMode) groupkv.GroupMode { return cmp.Or(m, groupkv.GroupAtomic) }
	if mode(cur.Mode) != mode(spec.Mode) || !sameKey(cur.Leader, spec.Leader) {
		return false
	}
	set := func(keys []groupkv.KeyRef, leader groupkv.KeyRef) map[string]bool {
		m := map[string]bool{leader.Collection + "\x00" + string(leader.Key): true}
		for _, k := range keys {
			m[k.Collection+"\x00"+string(k.Key)] = true
		}
		return m
	}
	return maps.Equal(set(cur.Members, cur.Leader), set(spec.Members, spec.Leader))
}

func sameKey(a, b groupkv.KeyRef) bool {
	return a.Collection == b.Collection && bytes.Equal(a.Key, b.Key)
}

// restoreBatch is a batch put a restore is filling: records of one shard,
// so that the batch commits in that shard alone.
type restoreBatch struct {
	items []groupkv.PutItem
	size  int // bytes of keys and values
}

// shardOf answers the index of the shard of info that a record of key
// with tags goes to, as the node routes it (cluster.CollectionDesc.Route);
// -1 when info has no shards. It only groups a restore's batches: a
// batch whose records turn out to be in several shards is still written,
// atomically.
func shardOf(info groupkv.CollectionInfo, key []byte, tags []string) int {
	if len(info.Shards) == 0 {
		return -1
	}
	if info.Partitioning == kv.PartitionRange {
		return sort.Search(len(info.SplitPoints), func(i int) bool { return bytes.Compare(info.SplitPoints[i], key) > 0 })
	}
	b := key
	if info.Partitioning == kv.PartitionTag && len(tags) > 0 {
		b = []byte(tags[0])
	}
	bucket := uint32(cluster.Bucket(b))
	return sort.Search(len(info.Shards), func(i int) bool { return info.Shards[i].BucketEnd > bucket })
}

func listOrNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}
