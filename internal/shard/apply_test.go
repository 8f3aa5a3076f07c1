package shard

import (
	"encoding/hex"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/kv"
	"github.com/groupkv/groupkv/internal/storage"
	"github.com/groupkv/groupkv/internal/txn"
)

// TestApply runs the scripts in testdata/*.txt against shards over a Pebble
// DB on an in-memory filesystem. Each script gets a fresh DB. Rewrite the
// expected outputs with -rewrite and read the diff before keeping it.
//
// Commands (arguments in brackets are optional):
//
//	new-shard id=N collection=N partitioning=hash buckets=LO-HI
//	new-shard id=N collection=N partitioning=range [start=K] [end=K]
//	new-shard meta
//	    Loads the state machine of a shard from the DB and makes it current.
//	use id=N
//	    Makes an already created shard current.
//	put key=K [value=V] [tags=a,b] version=N [if-version=N] [bucket=N] [must-exist]
//	delete key=K version=N [if-version=N] [bucket=N] [must-exist]
//	batch version=N
//	    One write of the ops in the input, one put or delete line each.
//	gc threshold=N
//	tso hwm=N
//	create-collection name=C [partitioning=P] [shards=N] [split-points=(a,b)] [nodes=(1,2)]
//	drop-collection name=C
//	merge-shards name=C shard=N
//	freeze into=N version=N
//	merge-trigger right=N into=N frozen-index=N max-version=N gc=N [start=K] [end=K] [buckets=LO-HI]
//	    The three steps of a merge (merge.go): the catalog change, the
//	    freeze of the right shard, the trigger in the left shard.
//	raw hex=H
//	    Applies the command whose encoding is H.
//	    Every applying command takes [index=N] (default: the next index) and
//	    [term=N] (default 1). It applies in an indexed batch that is committed
//	    only when Apply returns no error, and prints the Result or the error.
//	get key=K [as-of=N] [bucket=N]
//	scan
//	    Every data key in the DB (all collections) with its decoded version.
//	state
//	span
//	    The current shard's span as applied.
//	reload
//	    Loads the current shard again from the DB and compares it with the
//	    in-memory state machine.
//	catalog
//	    The collection descriptors and id counters of the catalog.
func TestApply(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no scripts in testdata")
	}
	for _, path := range files {
		t.Run(strings.TrimSuffix(filepath.Base(path), ".txt"), func(t *testing.T) {
			env := newApplyEnv(t)
			defer env.close()
			datadriven.RunTest(t, path, env.run)
		})
	}
}

type applyEnv struct {
	eng    *storage.Engine
	shards map[uint64]*Shard
	cur    *Shard
	// lastRes is the result of the last command applied.
	lastRes Result
}

func newApplyEnv(t *testing.T) *applyEnv {
	eng, err := storage.Open("/d", storage.Options{FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	return &applyEnv{eng: eng, shards: map[uint64]*Shard{}}
}

func (e *applyEnv) close() { e.eng.Close() }

func (e *applyEnv) run(t *testing.T, td *datadriven.TestData) string {
	switch td.Cmd {
	case "new-shard":
		return e.newShard(t, td)
	case "use":
		var id uint64
		td.ScanArgs(t, "id", &id)
		s, ok := e.shards[id]
		if !ok {
			td.Fatalf(t, "no shard %d", id)
		}
		e.cur = s
		return ""
	case "put", "delete":
		var version uint64
		td.ScanArgs(t, "version", &version)
		op := e.parseOp(t, td.Pos, td.Cmd, td.CmdArgs)
		cmd := EncodeWrite([]Op{op})
		SetVersion(cmd, version)
		return e.apply(t, td, cmd)
	case "batch":
		var version uint64
		td.ScanArgs(t, "version", &version)
		var ops []Op
		eachInputLine(t, td, func(cmd string, args []datadriven.CmdArg) {
			ops = append(ops, e.parseOp(t, td.Pos, cmd, args))
		})
		cmd := EncodeWrite(ops)
		SetVersion(cmd, version)
		return e.apply(t, td, cmd)
	case "gc":
		var threshold uint64
		td.ScanArgs(t, "threshold", &threshold)
		return e.apply(t, td, EncodeGC(threshold))
	case "tso":
		var hwm uint64
		td.ScanArgs(t, "hwm", &hwm)
		return e.apply(t, td, EncodeTSO(hwm))
	case "create-collection":
		var opts kv.CollectionOptions
		td.ScanArgs(t, "name", &opts.Name)
		if td.HasArg("partitioning") {
			var p string
			td.ScanArgs(t, "partitioning", &p)
			opts.Partitioning = kv.Partitioning(p)
		}
		td.MaybeScanArgs(t, "shards", &opts.Shards)
		if arg, ok := td.Arg("split-points"); ok {
			for _, v := range arg.Vals {
				opts.SplitPoints = append(opts.SplitPoints, []byte(v))
			}
		}
		var nodes []uint64
		if arg, ok := td.Arg("nodes"); ok {
			for _, v := range arg.Vals {
				n, err := strconv.ParseUint(v, 10, 64)
				if err != nil {
					td.Fatalf(t, "nodes: %v", err)
				}
				nodes = append(nodes, n)
			}
		}
		return e.apply(t, td, EncodeCreateCollection(opts, nodes))
	case "drop-collection":
		var name string
		td.ScanArgs(t, "name", &name)
		return e.apply(t, td, EncodeDropCollection(name))
	case "merge-shards":
		var name string
		var shard uint64
		td.ScanArgs(t, "name", &name)
		td.ScanArgs(t, "shard", &shard)
		return e.apply(t, td, EncodeMergeShards(name, shard))
	case "freeze":
		var into, version uint64
		td.ScanArgs(t, "into", &into)
		td.ScanArgs(t, "version", &version)
		cmd := EncodeFreeze(into)
		SetVersion(cmd, version)
		return e.apply(t, td, cmd)
	case "merge-trigger":
		var right Desc
		var f FrozenState
		td.ScanArgs(t, "right", &right.ShardID)
		td.ScanArgs(t, "into", &f.Into)
		td.ScanArgs(t, "frozen-index", &f.Index)
		td.ScanArgs(t, "max-version", &f.MaxVersion)
		td.ScanArgs(t, "gc", &f.GCThreshold)
		if td.HasArg("start") {
			var k string
			td.ScanArgs(t, "start", &k)
			right.Start = []byte(k)
		}
		if td.HasArg("end") {
			var k string
			td.ScanArgs(t, "end", &k)
			right.End = []byte(k)
		}
		if td.HasArg("buckets") {
			var b string
			td.ScanArgs(t, "buckets", &b)
			lo, hi, _ := strings.Cut(b, "-")
			l, _ := strconv.ParseUint(lo, 10, 32)
			h, _ := strconv.ParseUint(hi, 10, 32)
			right.BucketStart, right.BucketEnd = uint32(l), uint32(h)
		}
		return e.apply(t, td, EncodeMergeTrigger(right, f))
	case "span":
		d := e.current(t, td).Desc()
		if d.Partitioning == kv.PartitionRange {
			return fmt.Sprintf("shard %d keys [%q, %q) unbounded-end=%v", d.ShardID, d.Start, d.End, d.End == nil)
		}
		return fmt.Sprintf("shard %d buckets [%d, %d)", d.ShardID, d.BucketStart, d.BucketEnd)
	case "raw":
		var h string
		td.ScanArgs(t, "hex", &h)
		data, err := hex.DecodeString(h)
		if err != nil {
			td.Fatalf(t, "hex: %v", err)
		}
		return e.apply(t, td, data)
	case "record":
		return e.record(t, td)
	case "forget":
		return e.forget(t, td)
	case "records":
		return e.records(t, td)
	case "due-records":
		return e.dueRecords(t, td)
	case "unmarked-records":
		var before, abortedBefore uint64
		limit := 100
		td.ScanArgs(t, "before", &before)
		td.MaybeScanArgs(t, "aborted-before", &abortedBefore)
		td.MaybeScanArgs(t, "limit", &limit)
		recs, err := UnmarkedTxnRecords(e.eng.DB, e.current(t, td).Desc(), before, abortedBefore, limit)
		if err != nil {
			return "error: " + err.Error()
		}
		var b strings.Builder
		for _, r := range recs {
			if r.Status == txn.Aborted {
				fmt.Fprintf(&b, "%s key=%s ABORTED\n", r.Ref.ID, r.Ref.Anchor.Key)
				continue
			}
			fmt.Fprintf(&b, "%s key=%s commit-ts=%d participants=%v\n", r.Ref.ID, r.Ref.Anchor.Key, r.CommitTS, r.Participants)
		}
		if b.Len() == 0 {
			return "none"
		}
		return b.String()
	case "place":
		return e.place(t, td)
	case "placement":
		var key string
		td.ScanArgs(t, "key", &key)
		tag, pin, ok, err := ReadPlacementPin(e.eng.DB, e.current(t, td).Desc().Collection, []byte(key))
		switch {
		case err != nil:
			return "error: " + err.Error()
		case !ok:
			return "not placed"
		case pin != "":
			return fmt.Sprintf("tag=%q pinned by %s", tag, pin)
		}
		return fmt.Sprintf("tag=%q", tag)
	case "get":
		return e.get(t, td)
	case "scan":
		return e.scan(t)
	case "state":
		return formatState(e.current(t, td))
	case "reload":
		return e.reload(t, td)
	case "catalog":
		return e.catalog(t)
	default:
		td.Fatalf(t, "unknown command %q", td.Cmd)
		return ""
	}
}

func (e *applyEnv) current(t *testing.T, td *datadriven.TestData) *Shard {
	if e.cur == nil {
		td.Fatalf(t, "no shard: use new-shard first")
	}
	return e.cur
}

// place applies a KindPlace: place key=K bucket=B [old=T] [new=T]
// [op=set|pin|unpin] [pin=P].
func (e *applyEnv) place(t *testing.T, td *datadriven.TestData) string {
	var p Placement
	var key, op string
	var bucket uint64
	td.ScanArgs(t, "key", &key)
	td.ScanArgs(t, "bucket", &bucket)
	p.Key, p.Bucket = []byte(key), uint16(bucket)
	if td.HasArg("old") {
		p.HasOld = true
		td.ScanArgs(t, "old", &p.Old)
	}
	td.MaybeScanArgs(t, "new", &p.New)
	td.MaybeScanArgs(t, "pin", &p.Pin)
	td.MaybeScanArgs(t, "op", &op)
	switch op {
	case "", "set":
	case "pin":
		p.Op = PlacePin
	case "unpin":
		p.Op = PlaceUnpin
	default:
		td.Fatalf(t, "unknown op %q", op)
	}
	return e.apply(t, td, EncodePlace(p))
}

func (e *applyEnv) newShard(t *testing.T, td *datadriven.TestData) string {
	var d Desc
	if td.HasArg("meta") {
		d = MetaDesc
	} else {
		td.ScanArgs(t, "id", &d.ShardID)
		var coll uint64
		td.ScanArgs(t, "collection", &coll)
		d.Collection = uint32(coll)
		var p string
		td.ScanArgs(t, "partitioning", &p)
		d.Partitioning = kv.Partitioning(p)
		switch d.Partitioning {
		case kv.PartitionRange:
			if td.HasArg("start") {
				var s string
				td.ScanArgs(t, "start", &s)
				d.Start = []byte(s)
			}
			if td.HasArg("end") {
				var s string
				td.ScanArgs(t, "end", &s)
				d.End = []byte(s)
			}
		default:
			var b string
			td.ScanArgs(t, "buckets", &b)
			lo, hi, ok := strings.Cut(b, "-")
			l, err1 := strconv.ParseUint(lo, 10, 32)
			h, err2 := strconv.ParseUint(hi, 10, 32)
			if !ok || err1 != nil || err2 != nil {
				td.Fatalf(t, "buckets=%q: want LO-HI", b)
			}
			d.BucketStart, d.BucketEnd = uint32(l), uint32(h)
		}
	}
	s, err := Load(e.eng.DB, d)
	if err != nil {
		return fmt.Sprintf("error: %v", err)
	}
	e.shards[d.ShardID] = s
	e.cur = s
	return formatState(s)
}

// parseOp parses the arguments of one put or delete.
func (e *applyEnv) parseOp(t *testing.T, pos, cmd string, args []datadriven.CmdArg) Op {
	var op Op
	switch cmd {
	case "put":
		op.Type = OpPut
	case "delete":
		op.Type = OpDelete
	default:
		t.Fatalf("%s: unknown op %q", pos, cmd)
	}
	hasBucket := false
	for _, a := range args {
		val := ""
		if len(a.Vals) > 0 {
			val = a.Vals[0]
		}
		num := func() uint64 {
			n, err := strconv.ParseUint(val, 10, 64)
			if err != nil {
				t.Fatalf("%s: %s=%q: %v", pos, a.Key, val, err)
			}
			return n
		}
		switch a.Key {
		case "key":
			op.Key = []byte(val)
		case "value":
			op.Value = []byte(val)
		case "tags":
			if val != "" {
				op.Tags = strings.Split(val, ",")
			}
		case "if-version":
			op.HasCond, op.CondVersion = true, num()
		case "must-exist":
			op.MustExist = true
		case "bucket":
			hasBucket = true
			op.Bucket = uint16(num())
		case "version", "index", "term":
		default:
			t.Fatalf("%s: unknown argument %q of %s", pos, a.Key, cmd)
		}
	}
	if !hasBucket && e.cur != nil && e.cur.Desc().Partitioning != kv.PartitionRange {
		op.Bucket = cluster.Bucket(op.Key)
	}
	return op
}

// apply applies data as the next entry of the current shard in one indexed
// batch, committed only when Apply succeeds.
func (e *applyEnv) apply(t *testing.T, td *datadriven.TestData, data []byte) string {
	s := e.current(t, td)
	applied, _ := s.Applied()
	index, term := applied+1, uint64(1)
	td.MaybeScanArgs(t, "index", &index)
	td.MaybeScanArgs(t, "term", &term)
	b := e.eng.DB.NewIndexedBatch()
	res, err := s.Apply(b, index, term, data)
	e.lastRes = res
	if err != nil {
		s.EndBatch()
		if cerr := b.Close(); cerr != nil {
			t.Fatal(cerr)
		}
		return fmt.Sprintf("error: %v", err)
	}
	if err := s.FinishBatch(b); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	return formatResult(res)
}

func formatResult(res Result) string {
	if res.Err != nil {
		return fmt.Sprintf("%s: %s", res.Err.Code, res.Err.Message)
	}
	if res.Txn != nil {
		return fmt.Sprintf("ok %s", res.Txn.Status)
	}
	if res.Desc != nil {
		return "ok\n" + formatCollection(res.Desc)
	}
	if f := res.Freeze; f != nil {
		return fmt.Sprintf("ok version=%d frozen into=%d index=%d max-version=%d gc-threshold=%d", res.Version, f.Into, f.Index, f.MaxVersion, f.GCThreshold)
	}
	if m := res.Merge; m != nil {
		return fmt.Sprintf("ok merged shard %d", m.Right)
	}
	return fmt.Sprintf("ok version=%d", res.Version)
}

func formatCollection(d *cluster.CollectionDesc) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "collection %s id=%d partitioning=%s", d.Name, d.ID, d.Partitioning)
	if len(d.SplitPoints) > 0 {
		fmt.Fprintf(&sb, " split-points=%q", d.SplitPoints)
	}
	sb.WriteString("\n")
	for _, s := range d.Shards {
		fmt.Fprintf(&sb, "  shard %d", s.ID)
		if d.Partitioning == kv.PartitionRange {
			start, end := "-inf", "+inf"
			if s.Start != nil {
				start = strconv.Quote(string(s.Start))
			}
			if s.End != nil {
				end = strconv.Quote(string(s.End))
			}
			fmt.Fprintf(&sb, " keys [%s, %s)", start, end)
		} else {
			fmt.Fprintf(&sb, " buckets [%d, %d)", s.BucketStart, s.BucketEnd)
		}
		sb.WriteString(" replicas")
		for _, r := range s.Replicas {
			fmt.Fprintf(&sb, " n%d/r%d", r.Node, r.ID)
		}
		sb.WriteString("\n")
	}
	for _, s := range d.Merged {
		fmt.Fprintf(&sb, "  merged shard %d into %d\n", s.ID, s.MergedInto)
	}
	return sb.String()
}

func formatState(s *Shard) string {
	index, term := s.Applied()
	out := fmt.Sprintf("shard %d: applied=%d/%d max-version=%d gc-threshold=%d", s.Desc().ShardID, index, term, s.MaxVersion(), s.GCThreshold())
	if s.Desc().IsMeta() {
		out += fmt.Sprintf(" tso-hwm=%d", s.TSOHighWater())
	}
	if f := s.Frozen(); f != nil {
		out += fmt.Sprintf(" frozen-into=%d at=%d", f.Into, f.Index)
	}
	return out
}

func formatValue(v storage.MVCCValue) string {
	if v.Tombstone {
		return "tombstone"
	}
	return fmt.Sprintf("tags=[%s] value=%q", strings.Join(v.Tags, ","), v.Value)
}

func (e *applyEnv) get(t *testing.T, td *datadriven.TestData) string {
	s := e.current(t, td)
	var key string
	td.ScanArgs(t, "key", &key)
	asOf := Latest
	td.MaybeScanArgs(t, "as-of", &asOf)
	var bucket uint16
	if td.HasArg("bucket") {
		td.ScanArgs(t, "bucket", &bucket)
	} else if s.Desc().Partitioning != kv.PartitionRange {
		bucket = cluster.Bucket([]byte(key))
	}
	_ = bucket // versions are found by key; the bucket is stored in the value
	val, version, found, err := ReadRecord(e.eng.DB, s.Desc().Collection, []byte(key), asOf)
	if err != nil {
		return fmt.Sprintf("error: %v", err)
	}
	var out string
	switch {
	case found:
		out = fmt.Sprintf("%q@%d: %s", key, version, formatValue(val))
	case val.Tombstone:
		out = fmt.Sprintf("%q@%d: tombstone (not found)", key, version)
	default:
		out = fmt.Sprintf("%q: absent (not found)", key)
	}
	// A node answers compacted for a read below the GC threshold
	// (node.Get); the read itself is shown for what GC left behind.
	if asOf != Latest && asOf < s.GCThreshold() {
		out += fmt.Sprintf("\nas-of %d is below the gc threshold %d: a read answers compacted", asOf, s.GCThreshold())
	}
	return out
}

// scan dumps every data key in the DB with its decoded parts.
func (e *applyEnv) scan(t *testing.T) string {
	// Every data key starts with the data prefix byte, the first byte of
	// any collection's span.
	start, _ := storage.CollectionSpan(0)
	start = start[:1]
	end := []byte{start[0] + 1}
	it, err := e.eng.DB.NewIter(&pebble.IterOptions{LowerBound: start, UpperBound: end})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	var sb strings.Builder
	for valid := it.First(); valid; valid = it.Next() {
		dk, err := storage.DecodeDataKey(it.Key())
		if err != nil {
			t.Fatalf("data key %x: %v", it.Key(), err)
		}
		v, err := storage.DecodeValue(it.Value())
		if err != nil {
			t.Fatalf("value of %x: %v", it.Key(), err)
		}
		fmt.Fprintf(&sb, "c%d/b%d %q@%d: %s\n", dk.Collection, v.Bucket, dk.UserKey, dk.Version, formatValue(v))
	}
	if err := it.Error(); err != nil {
		t.Fatal(err)
	}
	if sb.Len() == 0 {
		return "(empty)"
	}
	return sb.String()
}

func (e *applyEnv) reload(t *testing.T, td *datadriven.TestData) string {
	s := e.current(t, td)
	r, err := Load(e.eng.DB, s.Desc())
	if err != nil {
		return fmt.Sprintf("error: %v", err)
	}
	got, want := formatState(r), formatState(s)
	if got != want {
		return fmt.Sprintf("MISMATCH\n  loaded:    %s\n  in memory: %s", got, want)
	}
	return got
}

func (e *applyEnv) catalog(t *testing.T) string {
	descs, err := LoadCatalog(e.eng.DB)
	if err != nil {
		return fmt.Sprintf("error: %v", err)
	}
	var sb strings.Builder
	for _, d := range descs {
		sb.WriteString(formatCollection(d))
	}
	nc, err := storage.GetUint64(e.eng.DB, storage.CatalogKey(catalogNextCollection))
	if err != nil {
		t.Fatal(err)
	}
	ns, err := storage.GetUint64(e.eng.DB, storage.CatalogKey(catalogNextShard))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(&sb, "next-collection=%d next-shard=%d", nc, ns)
	return sb.String()
}

// txnRef parses id= key= [bucket=] into a record reference of the current
// shard's collection (the bucket defaults to the key's; 0 in a range shard).
func (e *applyEnv) txnRef(t *testing.T, pos string, args []datadriven.CmdArg) TxnRecordRef {
	r := TxnRecordRef{Anchor: txn.Anchor{Collection: e.cur.Desc().Collection}}
	hasBucket := false
	for _, a := range args {
		if a.Key == "participants" || a.Key == "now" {
			continue // record's
		}
		if len(a.Vals) != 1 {
			t.Fatalf("%s: %s wants one value", pos, a.Key)
		}
		switch a.Key {
		case "id":
			r.ID = a.Vals[0]
		case "key":
			r.Anchor.Key = []byte(a.Vals[0])
		case "bucket":
			b, err := strconv.ParseUint(a.Vals[0], 10, 16)
			if err != nil {
				t.Fatalf("%s: bucket: %v", pos, err)
			}
			r.Anchor.Bucket, hasBucket = uint16(b), true
		case "op", "ts":
		default:
			t.Fatalf("%s: unknown argument %q", pos, a.Key)
		}
	}
	if !hasBucket && e.cur.Desc().Partitioning != kv.PartitionRange {
		r.Anchor.Bucket = cluster.Bucket(r.Anchor.Key)
	}
	return r
}

// record applies a record command: record op=heartbeat|commit|abort id= key= [bucket=] [ts=].
func (e *applyEnv) record(t *testing.T, td *datadriven.TestData) string {
	e.current(t, td)
	r := e.txnRef(t, td.Pos, td.CmdArgs)
	c := txn.RecordCmd{Meta: txn.Meta{ID: r.ID, Anchor: r.Anchor, Start: 1}}
	var op string
	td.ScanArgs(t, "op", &op)
	switch op {
	case "heartbeat":
		c.Op = txn.OpHeartbeat
	case "commit":
		c.Op = txn.OpCommit
	case "abort":
		c.Op, c.Reason = txn.OpAbort, "test"
	default:
		td.Fatalf(t, "unknown op %q", op)
	}
	c.TS = 2
	td.MaybeScanArgs(t, "ts", &c.TS)
	td.MaybeScanArgs(t, "now", &c.Now)
	for _, a := range td.CmdArgs {
		if a.Key != "participants" {
			continue
		}
		c.Listed = true
		for _, p := range a.Vals {
			if p == "" {
				continue
			}
			v, err := strconv.ParseUint(p, 10, 64)
			if err != nil {
				td.Fatalf(t, "participant %q: %v", p, err)
			}
			c.Participants = append(c.Participants, v)
		}
	}
	return e.apply(t, td, EncodeTxnRecord(c))
}

// forget removes the records named one per input line (id= key= [bucket=]),
// or with after=N marks them removable after N.
func (e *applyEnv) forget(t *testing.T, td *datadriven.TestData) string {
	e.current(t, td)
	var c TxnForgetCmd
	if td.HasArg("after") {
		td.ScanArgs(t, "after", &c.After)
	}
	eachInputLine(t, td, func(cmd string, args []datadriven.CmdArg) {
		if cmd != "record" {
			td.Fatalf(t, "forget: %q is not a record", cmd)
		}
		c.Records = append(c.Records, e.txnRef(t, td.Pos, args))
	})
	return e.apply(t, td, EncodeTxnForget(&c)) + fmt.Sprintf(" forgot=%d", e.lastRes.Count)
}

// records lists the transaction records of the current shard's collection.
func (e *applyEnv) records(t *testing.T, td *datadriven.TestData) string {
	coll := e.current(t, td).Desc().Collection
	lo, hi := storage.TxnRecordSpan(coll)
	it, err := e.eng.DB.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	var sb strings.Builder
	for it.First(); it.Valid(); it.Next() {
		k := it.Key()
		rec, _, err := txn.DecodeRecord(it.Value())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&sb, "%s %s", k[len(k)-40:], rec.Status)
		if rec.ForgetAfter != 0 {
			fmt.Fprintf(&sb, " forget-after=%d", rec.ForgetAfter)
		}
		sb.WriteString("\n")
	}
	if sb.Len() == 0 {
		return "none"
	}
	return sb.String()
}

// dueRecords lists the records the current shard would remove at now=N
// (DueTxnRecords), at most limit=N (default 100).
func (e *applyEnv) dueRecords(t *testing.T, td *datadriven.TestData) string {
	var now uint64
	td.ScanArgs(t, "now", &now)
	limit := 100
	if td.HasArg("limit") {
		td.ScanArgs(t, "limit", &limit)
	}
	refs, err := DueTxnRecords(e.eng.DB, e.current(t, td).Desc(), now, limit)
	if err != nil {
		return "error: " + err.Error()
	}
	var sb strings.Builder
	for _, r := range refs {
		fmt.Fprintf(&sb, "%s key=%s bucket=%d\n", r.ID, r.Anchor.Key, r.Anchor.Bucket)
	}
	if sb.Len() == 0 {
		return "none"
	}
	return sb.String()
}

// eachInputLine calls fn with the command and arguments of every non-empty
// line of td's input.
func eachInputLine(t *testing.T, td *datadriven.TestData, fn func(cmd string, args []datadriven.CmdArg)) {
	t.Helper()
	for _, line := range strings.Split(td.Input, "\n") {
		cmd, args, err := datadriven.ParseLine(line)
		if err != nil {
			td.Fatalf(t, "%v", err)
		}
		if cmd != "" {
			fn(cmd, args)
		}
	}
}
