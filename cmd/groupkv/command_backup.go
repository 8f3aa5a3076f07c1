package main

import (
	"bufio"
	"bytes"
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
//	{"end": {"collections", "records", "sha256"}}
//
// The records are the collections' state at one version V, read by scans
// at V. The last line's sha256 is the hex SHA-256 of every byte before it:
// a file cut short or changed is refused by restore before it writes.
const backupFormat = 1

// backupLine is any line of a backup; which fields are set tells its kind.
type backupLine struct {
	Format        *int                 `json:"groupkv_backup,omitempty"`
	Time          string               `json:"time,omitempty"`
	Collection    *backupCollection    `json:"collection,omitempty"`
	CollectionEnd *backupCollectionEnd `json:"collection_end,omitempty"`
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

type backupEnd struct {
	Collections int    `json:"collections"`
	Records     int64  `json:"records"`
	SHA256      string `json:"sha256"`
}

// backupSummary is what backup and restore print when they are done.
type backupSummary struct {
	Version     uint64 `json:"version"`
	Time        string `json:"time"`
	Collections int    `json:"collections"`
	Records     int64  `json:"records"`
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

Collections whose names begin with _ (groupkv's own) are not backed up,
nor are key groups: a key in a group is backed up as its own shard holds
it at the version, which has the group's writes only once they are
shipped there (docs/groups.md#limits); the backup says so on standard
error when groups are active.`,
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
	if groups, err := db.ListGroups(ctx); err == nil && len(groups) > 0 {
		fmt.Fprintf(cmd.ErrOrStderr(), "backup: %d key groups are active: their keys are backed up as their own shards hold them at version %d, with the groups' writes shipped there by then (docs/groups.md#limits)\n",
			len(groups), version)
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
	end := &backupEnd{Collections: len(infos), Records: total, SHA256: hex.EncodeToString(sum.Sum(nil))}
	bk.w = bw // the end line is not part of its own sum
	bk.line(backupLine{End: end})
	if bk.err != nil {
		return fmt.Errorf("writing the backup: %w", bk.err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("writing the backup: %w", err)
	}
	summary := backupSummary{Version: version, Time: when, Collections: len(infos), Records: total}
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
				return printJSON(cmd, backupSummary{Version: plan.version, Time: plan.time, Collections: len(plan.collections), Records: n})
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
	selected    map[string]bool  // nil: all
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
	if *head.Format != backupFormat {
		return nil, b.errorf("backup format %d: this groupkv reads format %d", *head.Format, backupFormat)
	}
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
		case l.End != nil:
			if cur != nil {
				return nil, b.errorf("the end inside collection %q", cur.Name)
			}
			if l.End.Collections != len(plan.collections) || l.End.Records != total {
				return nil, b.errorf("the backup says %d collections and %d records, it holds %d and %d", l.End.Collections, l.End.Records, len(plan.collections), total)
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
		case l.End != nil, l.Format != nil:
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
	return printJSON(cmd, backupSummary{Version: plan.version, Time: plan.time, Collections: len(done), Records: written})
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
