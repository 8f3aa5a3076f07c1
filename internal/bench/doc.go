// Package bench measures groupkv against its peers (etcd, Redis) with the
// YCSB core workloads, groupkv alone with a correlated-read workload,
// groupkv's transactions against etcd's and PostgreSQL's with the txn
// workload, and groupkv's Key Groups against the same operations without
// groups with the groups workload (G-Store's gaming benchmark).
//
// It owns the parts of a load generator: key choosers that reproduce YCSB's
// generators (uniform, scrambled zipfian, skewed latest, the acknowledged
// insert counter), the workload definitions A–F, a log-bucketed latency
// histogram, a closed-loop runner with warm-up and a progress callback, the
// drivers that talk to each system through its ordinary Go client, the JSON
// result record and a PNG bar chart of results.
//
// Generators are pure: they draw from the *rand.Rand the caller passes, so a
// seed reproduces a run's key sequence. The runner reads the clock; the
// drivers do network I/O.
//
// The caller owns the Driver: it opens it, hands it to a Runner, and closes
// it after the last run. A Runner is used by one goroutine at a time; its
// runs share the insert counter, so workloads that insert (D, E) run one
// after the other on the same data never overwrite each other's keys.
//
//	d, err := bench.OpenGroupKV(ctx, "127.0.0.1:7070", bench.DriverOptions{})
//	if err != nil { ... }
//	defer d.Close()
//	r, err := bench.NewRunner(d, bench.Options{Records: 100000, Duration: 30 * time.Second})
//	if err != nil { ... }
//	if _, err := r.Load(ctx); err != nil { ... }
//	res, err := r.Run(ctx, bench.WorkloadA)
//	if err != nil { ... }
//	err = bench.AppendResult("results.json", res)
//
// The txn workload (txn.go) measures multi-key transactions through a
// TxnDriver: groupkv's interactive transactions (GroupKVTxn, over any
// kv.TxnBackend: the gRPC client api.TxnClient, or a node in this process),
// etcd's serializable STM (EtcdTxn) and PostgreSQL's SERIALIZABLE
// transactions (Postgres, pgx). Each driver retries an attempt aborted by a
// conflict until it commits and answers the attempts it took; a TxnRunner
// runs the workload and records them in an AttemptHistogram. pgbench runs of
// scripts/txn.pgbench join the results through PgbenchResult.
//
//	d, err := bench.OpenGroupKVEmbedded(ctx, dir, bench.DriverOptions{Table: "txn"})
//	if err != nil { ... }
//	defer d.Close()
//	r, err := bench.NewTxnRunner(d, bench.Options{Duration: 10 * time.Second})
//	if err != nil { ... }
//	w := bench.TxnWorkload{Keys: 1000}
//	if _, err := r.Load(ctx, w); err != nil { ... }
//	res, err := r.Run(ctx, w) // res.Attempts: p50, p99, max attempts per commit
//
// The groups workload (groups.go) plays games through a GroupsDriver
// (GroupKVGroups: a remote groupkv.DB, or a node in this process): each
// client creates a key group of players, runs OpsPerGroup group
// transactions on them with think times between, and deletes the group;
// its "ungrouped" mode plays the same games with plain gets and puts.
// GroupsOverheads answers the ratio of the two modes' mean latency per
// operation, creation and deletion amortized.
//
//	d, err := bench.OpenGroupKVGroups(ctx, "127.0.0.1:7070", bench.DriverOptions{Table: "players"})
//	if err != nil { ... }
//	defer d.Close()
//	r, err := bench.NewGroupsRunner(d, bench.Options{Clients: 4, Duration: 15 * time.Second})
//	if err != nil { ... }
//	w := bench.GroupsWorkload{Players: 100000, Think: 10 * time.Millisecond}
//	if _, err := r.Load(ctx, w); err != nil { ... }
//	grouped, err := r.Run(ctx, w)
//	w.Mode = bench.GroupsModeUngrouped
//	ungrouped, err := r.Run(ctx, w)
//	overhead := bench.GroupsOverheads([]bench.Result{grouped, ungrouped})
package bench
