package bench

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
)

// OpType is a kind of operation of a workload.
type OpType int

const (
	OpRead OpType = iota
	OpUpdate
	OpInsert
	OpScan
	// OpReadModifyWrite reads a record and writes it back changed (a get
	// then a put; none of the systems measured makes the pair atomic).
	OpReadModifyWrite
	numOpTypes
)

var opNames = [numOpTypes]string{"read", "update", "insert", "scan", "rmw"}

// String returns the op's name as results and tables show it.
func (o OpType) String() string {
	if o < 0 || o >= numOpTypes {
		return fmt.Sprintf("op(%d)", int(o))
	}
	return opNames[o]
}

// Request distributions: how a workload chooses the records it reads,
// updates and scans.
const (
	DistUniform = "uniform"
	DistZipfian = "zipfian"
	DistLatest  = "latest"
)

// Workload is a YCSB core workload: the proportions of its operations (they
// sum to 1) and how it chooses keys.
type Workload struct {
	// Name is the workload's short name: "a" to "f".
	Name        string
	Description string
	// Proportions of each OpType.
	Proportions [numOpTypes]float64
	// Distribution is the request distribution (DistUniform, DistZipfian
	// or DistLatest).
	Distribution string
	// MaxScanLength bounds the records of a scan; its length is uniform in
	// [1, MaxScanLength] (YCSB's defaults).
	MaxScanLength int
}

// The core workloads, as in YCSB's workloads/workload[a-f] files.
var (
	WorkloadA = Workload{Name: "a", Description: "update heavy: 50% read, 50% update, zipfian",
		Proportions: props(OpRead, 0.5, OpUpdate, 0.5), Distribution: DistZipfian}
	WorkloadB = Workload{Name: "b", Description: "read mostly: 95% read, 5% update, zipfian",
		Proportions: props(OpRead, 0.95, OpUpdate, 0.05), Distribution: DistZipfian}
	WorkloadC = Workload{Name: "c", Description: "read only: 100% read, zipfian",
		Proportions: props(OpRead, 1.0), Distribution: DistZipfian}
	WorkloadD = Workload{Name: "d", Description: "read latest: 95% read, 5% insert, latest",
		Proportions: props(OpRead, 0.95, OpInsert, 0.05), Distribution: DistLatest}
	WorkloadE = Workload{Name: "e", Description: "short ranges: 95% scan (1-100 records), 5% insert, zipfian",
		Proportions: props(OpScan, 0.95, OpInsert, 0.05), Distribution: DistZipfian, MaxScanLength: 100}
	WorkloadF = Workload{Name: "f", Description: "read-modify-write: 50% read, 50% read-modify-write, zipfian",
		Proportions: props(OpRead, 0.5, OpReadModifyWrite, 0.5), Distribution: DistZipfian}
)

// Workloads lists the core workloads in order.
var Workloads = []Workload{WorkloadA, WorkloadB, WorkloadC, WorkloadD, WorkloadE, WorkloadF}

func props(kv ...any) [numOpTypes]float64 {
	var p [numOpTypes]float64
	for i := 0; i < len(kv); i += 2 {
		p[kv[i].(OpType)] = kv[i+1].(float64)
	}
	return p
}

// LookupWorkload returns the core workload named name ("a".."f", any case).
func LookupWorkload(name string) (Workload, error) {
	n := strings.ToLower(strings.TrimSpace(name))
	n = strings.TrimPrefix(n, "workload")
	for _, w := range Workloads {
		if w.Name == n {
			return w, nil
		}
	}
	return Workload{}, fmt.Errorf("%w: %q (use a, b, c, d, e or f)", ErrUnknownWorkload, name)
}

// Validate reports every problem of w.
func (w Workload) Validate() error {
	var errs []string
	sum := 0.0
	for _, p := range w.Proportions {
		if p < 0 {
			errs = append(errs, "a proportion is negative")
		}
		sum += p
	}
	if sum < 0.999 || sum > 1.001 {
		errs = append(errs, fmt.Sprintf("proportions sum to %g, not 1", sum))
	}
	switch w.Distribution {
	case DistUniform, DistZipfian, DistLatest:
	default:
		errs = append(errs, fmt.Sprintf("distribution %q is not uniform, zipfian or latest", w.Distribution))
	}
	if w.Proportions[OpScan] > 0 && w.MaxScanLength < 1 {
		errs = append(errs, fmt.Sprintf("MaxScanLength %d: scans need at least 1", w.MaxScanLength))
	}
	return joinProblems("workload "+w.Name, errs)
}

// ChooseOp draws the next operation of w.
func (w Workload) ChooseOp(r *rand.Rand) OpType {
	u := r.Float64()
	last := OpRead
	for op, p := range w.Proportions {
		if p == 0 {
			continue
		}
		last = OpType(op)
		if u < p {
			return OpType(op)
		}
		u -= p
	}
	return last // rounding: the last op with a share
}

// ScanLength draws the length of a scan: uniform in [1, MaxScanLength].
func (w Workload) ScanLength(r *rand.Rand) int {
	return 1 + r.IntN(w.MaxScanLength)
}

// KeyName is YCSB's key of item keynum with hashed insert order (the
// default): "user" and the FNV hash of the item in decimal, so consecutive
// inserts land all over the key space.
func KeyName(keynum uint64) []byte {
	b := make([]byte, 0, 24)
	b = append(b, "user"...)
	return strconv.AppendUint(b, FNVHash64(keynum), 10)
}

// fillValue fills v with random printable bytes.
func fillValue(r *rand.Rand, v []byte) {
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"
	for i := 0; i < len(v); i += 8 {
		x := r.Uint64()
		for j := i; j < i+8 && j < len(v); j++ {
			v[j] = alphabet[x&63]
			x >>= 6
		}
	}
}
