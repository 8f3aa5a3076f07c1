// Package bench measures groupkv against its peers (etcd, Redis) with the
// YCSB core workloads, and groupkv alone with a correlated-read workload.
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
package bench
