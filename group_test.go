package groupkv

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/groupkv/groupkv/internal/kv"
)

// These tests run the Key Groups methods and Group.Transact against
// groupFake, txnFake with groups, through both DBs as the transaction
// tests do.

// groupFake is a txnFake that is also a kv.GroupBackend: it keeps the
// groups it created, every key joining; group attempts are txnFake's
// attempts (ids "t<n>"), so that their operations and commits are the
// transaction methods'. Its calls are recorded in txnFake's list with the
// group id in place of the attempt, and f.fail applies to them too.
type groupFake struct {
	*txnFake
	groups map[string]kv.GroupInfo // under txnFake.mu
}

var _ kv.GroupBackend = (*groupFake)(nil)

func newGroupFake() *groupFake {
	return &groupFake{txnFake: newTxnFake(), groups: map[string]kv.GroupInfo{}}
}

func (f *groupFake) CreateGroup(_ context.Context, spec kv.GroupSpec) (kv.GroupCreated, error) {
	_, err := f.enter("CreateGroup", "", spec)
	defer f.mu.Unlock()
	if err != nil {
		return kv.GroupCreated{}, err
	}
	if _, ok := f.groups[spec.ID]; ok {
		return kv.GroupCreated{}, kv.Errorf(kv.CodeAlreadyExists, "group %s exists", spec.ID)
	}
	members := []kv.KeyRef{spec.Leader}
	for _, m := range spec.Members {
		if m.Collection != spec.Leader.Collection || string(m.Key) != string(spec.Leader.Key) {
			members = append(members, m)
		}
	}
	f.groups[spec.ID] = kv.GroupInfo{ID: spec.ID, Leader: spec.Leader, Members: members, Mode: spec.Mode, LeaderNode: 1, State: kv.GroupActive}
	return kv.GroupCreated{ID: spec.ID, Joined: members, Refused: []kv.GroupRefusal{}}, nil
}

func (f *groupFake) DescribeGroup(_ context.Context, id string) (kv.GroupInfo, error) {
	_, err := f.enter("DescribeGroup", id, nil)
	defer f.mu.Unlock()
	if err != nil {
		return kv.GroupInfo{}, err
	}
	info, ok := f.groups[id]
	if !ok {
		return kv.GroupInfo{}, kv.Errorf(kv.CodeNotFound, "no group %s", id)
	}
	return info, nil
}

func (f *groupFake) ListGroups(context.Context) ([]kv.GroupInfo, error) {
	_, err := f.enter("ListGroups", "", nil)
	defer f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	out := []kv.GroupInfo{}
	for _, info := range f.groups {
		out = append(out, info)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

func (f *groupFake) DeleteGroup(_ context.Context, id string) error {
	_, err := f.enter("DeleteGroup", id, nil)
	defer f.mu.Unlock()
	if err != nil {
		return err
	}
	if _, ok := f.groups[id]; !ok {
		return kv.Errorf(kv.CodeNotFound, "no group %s", id)
	}
	delete(f.groups, id)
	return nil
}

func (f *groupFake) BeginGroupTxn(_ context.Context, id string, opts kv.TxnOptions) (string, error) {
	_, err := f.enter("BeginGroupTxn", id, opts)
	defer f.mu.Unlock()
	if err != nil {
		return "", err
	}
	if _, ok := f.groups[id]; !ok {
		return "", kv.Errorf(kv.CodeNotFound, "no group %s", id)
	}
	return f.begin(opts), nil
}

func (f *groupFake) ExecGroupTxn(_ context.Context, id string, req kv.ExecRequest) (kv.ExecResult, error) {
	_, err := f.enter("ExecGroupTxn", id, req)
	defer f.mu.Unlock()
	if err != nil {
		return kv.ExecResult{}, err
	}
	return f.execRes, nil
}

func forEachGroupDB(t *testing.T, test func(t *testing.T, f *groupFake, db DB)) {
	for _, k := range dbKinds {
		t.Run(k.name, func(t *testing.T) {
			f := newGroupFake()
			test(t, f, k.open(t, f))
		})
	}
}

func keyRef(coll, key string) KeyRef { return KeyRef{Collection: coll, Key: []byte(key)} }

// mustCreate creates group id of leader c/k0 and members c/k1 and c/k2.
func mustCreate(t *testing.T, db DB, id string) {
	t.Helper()
	spec := GroupSpec{ID: id, Leader: keyRef("c", "k0"), Members: []KeyRef{keyRef("c", "k1"), keyRef("c", "k2")}, Mode: GroupAtomic}
	if _, err := db.CreateGroup(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
}

func TestGroupAdmin(t *testing.T) {
	forEachGroupDB(t, func(t *testing.T, f *groupFake, db DB) {
		ctx := context.Background()
		bin := KeyRef{Collection: "d", Key: []byte{0xff, 0x00}}
		spec := GroupSpec{ID: "room/7 é", Leader: keyRef("c", "k0"), Members: []KeyRef{keyRef("c", "k0"), bin}, Mode: GroupBestEffort}
		created, err := db.CreateGroup(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		want := GroupCreated{ID: spec.ID, Joined: []KeyRef{keyRef("c", "k0"), bin}, Refused: []GroupRefusal{}}
		if !reflect.DeepEqual(created, want) {
			t.Fatalf("CreateGroup answered\n %#v\nwant %#v", created, want)
		}
		if got := f.callsOf("CreateGroup"); len(got) != 1 || !reflect.DeepEqual(got[0].arg, spec) {
			t.Fatalf("the backend got %#v, want %#v", got, spec)
		}

		info, err := db.DescribeGroup(ctx, spec.ID)
		wantInfo := GroupInfo{ID: spec.ID, Leader: keyRef("c", "k0"), Members: []KeyRef{keyRef("c", "k0"), bin}, Mode: GroupBestEffort, LeaderNode: 1, State: GroupActive}
		if err != nil || !reflect.DeepEqual(info, wantInfo) {
			t.Fatalf("DescribeGroup = %#v, %v; want %#v", info, err, wantInfo)
		}
		if got := f.callsOf("DescribeGroup"); len(got) != 1 || got[0].txn != spec.ID {
			t.Fatalf("the backend was asked about %+v", got)
		}
		mustCreate(t, db, "a")
		infos, err := db.ListGroups(ctx)
		if err != nil || len(infos) != 2 || infos[0].ID != "a" || !reflect.DeepEqual(infos[1], wantInfo) {
			t.Fatalf("ListGroups = %+v, %v", infos, err)
		}

		if _, err := db.CreateGroup(ctx, spec); !errors.Is(err, ErrAlreadyExists) || CodeOf(err) != CodeAlreadyExists {
			t.Fatalf("creating a group twice: %v, want ErrAlreadyExists", err)
		}
		if err := db.DeleteGroup(ctx, spec.ID); err != nil {
			t.Fatal(err)
		}
		if got := f.callsOf("DeleteGroup"); len(got) != 1 || got[0].txn != spec.ID {
			t.Fatalf("the backend deleted %+v", got)
		}
		if _, err := db.DescribeGroup(ctx, spec.ID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("DescribeGroup of a deleted group: %v, want ErrNotFound", err)
		}
		if err := db.DeleteGroup(ctx, spec.ID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("DeleteGroup of a deleted group: %v, want ErrNotFound", err)
		}

		f.fail = func(method string, _ int) error {
			if method == "CreateGroup" {
				return kv.Errorf(kv.CodeGroupRefused, `key "k1" of collection "c": locked`)
			}
			return nil
		}
		_, err = db.CreateGroup(ctx, GroupSpec{ID: "g2", Leader: keyRef("c", "k0"), Members: []KeyRef{keyRef("c", "k1")}, Mode: GroupAtomic})
		if !errors.Is(err, ErrGroupRefused) || !strings.Contains(err.Error(), "locked") {
			t.Fatalf("refused creation: %v, want ErrGroupRefused with the reason", err)
		}
	})
}

// TestGroupTransact checks that Group.Transact begins its attempts with
// BeginGroupTxn on its group, operates on them with the transaction
// methods, and retries them as DB.Transact does.
func TestGroupTransact(t *testing.T) {
	forEachGroupDB(t, func(t *testing.T, f *groupFake, db DB) {
		ctx := context.Background()
		mustCreate(t, db, "g/1")
		g := db.Group("g/1")
		if g.ID() != "g/1" {
			t.Fatalf("ID %q", g.ID())
		}
		f.fail = func(method string, n int) error {
			if method == "CommitTxn" && n <= 2 {
				return kv.Errorf(kv.CodeTxnAborted, "validation failed: k1 changed")
			}
			return nil
		}
		runs := 0
		err := g.Transact(ctx, func(tx *Tx) error {
			runs++
			if _, err := tx.Get(ctx, GetRequest{Collection: "c", Key: []byte("k1")}); err != nil && !errors.Is(err, ErrNotFound) {
				return err
			}
			return tx.Put(ctx, PutRequest{Collection: "c", Key: []byte("k1"), Value: []byte(fmt.Sprint(runs))})
		})
		if err != nil {
			t.Fatal(err)
		}
		if runs != 3 {
			t.Fatalf("fn ran %d times, want 3", runs)
		}
		var retryOf []string
		for _, c := range f.callsOf("BeginGroupTxn") {
			opts := c.arg.(kv.TxnOptions)
			if c.txn != "g/1" || opts.Isolation != kv.IsolationSerializable {
				t.Fatalf("begin %+v", c)
			}
			retryOf = append(retryOf, opts.RetryOf)
		}
		if want := []string{"", "t1", "t2"}; !reflect.DeepEqual(retryOf, want) {
			t.Fatalf("retry_of of the attempts %q, want %q", retryOf, want)
		}
		if n := len(f.callsOf("BeginTxn")); n != 0 {
			t.Fatalf("a group transaction began %d general attempts", n)
		}
		if rec, _ := f.record("c", "k1"); string(rec.Value) != "3" {
			t.Fatalf("committed %+v, want the third run's write", rec)
		}

		// fn's own error, untouched, after an abort.
		f.fail = nil
		if err := g.Transact(ctx, func(tx *Tx) error {
			_, _ = tx.Get(ctx, GetRequest{Collection: "c", Key: []byte("k2")}) // begins a remote attempt
			return errMine
		}); err != errMine {
			t.Fatalf("Transact = %v, want fn's error itself", err)
		}
		if got := f.callsOf("AbortTxn"); len(got) != 1 || got[0].txn != "t4" {
			t.Fatalf("aborts %+v", got)
		}

		// A commit in doubt is not retried.
		f.fail = func(method string, _ int) error {
			if method == "CommitTxn" {
				return kv.Errorf(kv.CodeCommitUnknown, "the leader lost its lease")
			}
			return nil
		}
		err = g.Transact(ctx, func(tx *Tx) error { return nil })
		var cu *CommitUnknownError
		if !errors.As(err, &cu) || !errors.Is(err, ErrCommitUnknown) || cu.Txn != "t5" {
			t.Fatalf("Transact = %#v, want a *CommitUnknownError", err)
		}

		// A context that ends: a *TxnContextError.
		f.fail = nil
		cctx, cancel := context.WithCancel(ctx)
		err = g.Transact(cctx, func(tx *Tx) error { cancel(); return nil })
		var ce *TxnContextError
		if !errors.As(err, &ce) || !errors.Is(err, context.Canceled) {
			t.Fatalf("Transact = %v, want a *TxnContextError", err)
		}

		// An unknown group: its begin's error.
		begins := len(f.callsOf("BeginGroupTxn"))
		ran := false
		err = db.Group("nope").Transact(ctx, func(tx *Tx) error { ran = true; return nil })
		if !errors.Is(err, ErrNotFound) || len(f.callsOf("BeginGroupTxn")) != begins+1 {
			t.Fatalf("Transact on an unknown group = %v", err)
		}
		if ran != isRemote(db) { // a remote attempt is begun by its commit here
			t.Fatalf("fn ran: %v", ran)
		}

		// Snapshot isolation is refused before anything is sent.
		n := len(f.calls)
		err = g.Transact(ctx, func(tx *Tx) error { t.Fatal("fn ran"); return nil }, WithIsolation(Snapshot))
		if CodeOf(err) != kv.CodeInvalidArgument || len(f.calls) != n {
			t.Fatalf("snapshot group transaction: %v after %d calls", err, len(f.calls)-n)
		}
	})
}

func TestGroupExec(t *testing.T) {
	forEachGroupDB(t, func(t *testing.T, f *groupFake, db DB) {
		req := ExecRequest{
			If:   []Compare{{Collection: "c", Key: []byte("k1"), Version: 7}},
			Then: []TxnOp{{Op: TxnOpPut, Collection: "c", Key: []byte("k1"), Value: []byte{0xfe}}},
			Else: []TxnOp{{Op: TxnOpGet, Collection: "c", Key: []byte("k1")}},
		}
		f.execRes = ExecResult{Succeeded: true, Version: 42, Results: []TxnOpResult{{Version: 42}}}
		res, err := db.Group("g 1").Exec(context.Background(), req)
		if err != nil || !reflect.DeepEqual(res, f.execRes) {
			t.Fatalf("Exec = %+v, %v", res, err)
		}
		if got := f.callsOf("ExecGroupTxn"); len(got) != 1 || got[0].txn != "g 1" || !reflect.DeepEqual(got[0].arg, req) {
			t.Fatalf("the backend got %#v", got)
		}
		if n := len(f.callsOf("ExecTxn")); n != 0 {
			t.Fatalf("a group exec ran %d general ones", n)
		}
		f.fail = func(string, int) error { return kv.Errorf(kv.CodeCommitUnknown, "in doubt") }
		if _, err := db.Group("g 1").Exec(context.Background(), req); !errors.Is(err, ErrCommitUnknown) {
			t.Fatalf("Exec = %v, want ErrCommitUnknown", err)
		}
	})
}

// TestTransactKeyInGroup checks that a key_in_group error ends DB.Transact
// and Group.Transact without a commit or a retry, whatever fn made of it.
func TestTransactKeyInGroup(t *testing.T) {
	inGroup := kv.Errorf(kv.CodeKeyInGroup, `key "k1" of collection "c" is in group g0`)
	for _, tc := range []struct {
		name string
		// fail answers inGroup or another error, for the attempt's calls.
		fail func(method string) error
		fn   func(ctx context.Context, tx *Tx) error
	}{
		{"fn returns it", func(m string) error {
			if m == "TxnPut" {
				return inGroup
			}
			return nil
		}, func(ctx context.Context, tx *Tx) error {
			return tx.Put(ctx, PutRequest{Collection: "c", Key: []byte("k1"), Value: []byte("v")})
		}},
		{"fn swallows it", func(m string) error {
			if m == "TxnGet" {
				return inGroup
			}
			return nil
		}, func(ctx context.Context, tx *Tx) error {
			_, _ = tx.Get(ctx, GetRequest{Collection: "c", Key: []byte("k1")})
			return nil
		}},
		{"then aborted", func(m string) error {
			switch m {
			case "TxnGet":
				return inGroup
			case "TxnPut":
				return kv.Errorf(kv.CodeTxnAborted, "aborted")
			}
			return nil
		}, func(ctx context.Context, tx *Tx) error {
			_, _ = tx.Get(ctx, GetRequest{Collection: "c", Key: []byte("k1")})
			return tx.Put(ctx, PutRequest{Collection: "c", Key: []byte("k2"), Value: []byte("v")})
		}},
		{"at commit", func(m string) error {
			if m == "CommitTxn" {
				return inGroup
			}
			return nil
		}, func(ctx context.Context, tx *Tx) error {
			return tx.Put(ctx, PutRequest{Collection: "c", Key: []byte("k1"), Value: []byte("v")})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			forEachGroupDB(t, func(t *testing.T, f *groupFake, db DB) {
				ctx := context.Background()
				mustCreate(t, db, "g0")
				for _, run := range []struct {
					begin    string
					transact func(fn func(tx *Tx) error) error
				}{
					{"BeginTxn", func(fn func(tx *Tx) error) error { return db.Transact(ctx, fn) }},
					{"BeginGroupTxn", func(fn func(tx *Tx) error) error { return db.Group("g0").Transact(ctx, fn) }},
				} {
					f.fail = func(method string, _ int) error { return tc.fail(method) }
					begins, commits := len(f.callsOf(run.begin)), len(f.callsOf("CommitTxn"))
					err := run.transact(func(tx *Tx) error { return tc.fn(ctx, tx) })
					f.fail = nil
					if !errors.Is(err, ErrKeyInGroup) || !strings.Contains(err.Error(), "in group g0") {
						t.Fatalf("%s: Transact = %v, want the key_in_group error", run.begin, err)
					}
					if n := len(f.callsOf(run.begin)) - begins; n != 1 {
						t.Fatalf("%s: %d attempts, want 1", run.begin, n)
					}
					wantCommits := 0
					if tc.name == "at commit" {
						wantCommits = 1
					}
					if n := len(f.callsOf("CommitTxn")) - commits; n != wantCommits {
						t.Fatalf("%s: %d commits, want %d", run.begin, n, wantCommits)
					}
				}
				if _, ok := f.record("c", "k1"); ok {
					t.Fatal("a write of a transaction that met a group was applied")
				}
			})
		})
	}
}

// noGroupBackend is a kv.TxnBackend that is not a kv.GroupBackend.
type noGroupBackend struct{ *txnFake }

func TestGroupUnimplemented(t *testing.T) {
	for _, k := range dbKinds {
		t.Run(k.name, func(t *testing.T) {
			db := k.open(t, noGroupBackend{newTxnFake()})
			ctx := context.Background()
			_, err1 := db.CreateGroup(ctx, GroupSpec{ID: "g1", Leader: keyRef("c", "k")})
			_, err2 := db.DescribeGroup(ctx, "g1")
			_, err3 := db.ListGroups(ctx)
			err4 := db.DeleteGroup(ctx, "g1")
			err5 := db.Group("g1").Transact(ctx, func(tx *Tx) error { return nil }) // fn runs remotely: its commit begins
			_, err6 := db.Group("g1").Exec(ctx, ExecRequest{Then: []TxnOp{{Op: TxnOpGet, Collection: "c", Key: []byte("k")}}})
			for i, err := range []error{err1, err2, err3, err4, err5, err6} {
				if CodeOf(err) != kv.CodeUnimplemented {
					t.Errorf("call %d: %v, want unimplemented", i+1, err)
				}
			}
		})
	}
}

func TestGroupRemoteClosed(t *testing.T) {
	f := newGroupFake()
	addr, _ := serveGRPC(t, f, nil)
	db, err := Dial(addr, WithoutShardRouting())
	if err != nil {
		t.Fatal(err)
	}
	g := db.Group("g1")
	db.Close()
	ctx := context.Background()
	_, err1 := db.CreateGroup(ctx, GroupSpec{ID: "g1", Leader: keyRef("c", "k")})
	_, err2 := db.ListGroups(ctx)
	err3 := g.Transact(ctx, func(tx *Tx) error { t.Fatal("fn ran"); return nil })
	_, err4 := g.Exec(ctx, ExecRequest{})
	for i, err := range []error{err1, err2, err3, err4} {
		if !errors.Is(err, ErrUnavailable) {
			t.Errorf("call %d on a closed DB: %v, want ErrUnavailable", i+1, err)
		}
	}
	if len(f.calls) != 0 {
		t.Fatalf("a closed DB reached the server: %+v", f.calls)
	}
}
