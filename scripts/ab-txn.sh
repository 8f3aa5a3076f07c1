#!/usr/bin/env bash
# ab-txn.sh compares two groupkv binaries on the txn workload, in rounds
# that alternate them (A, B, A, B, ...), each on a fresh data directory:
# a server on loopback ports, a load of KEYS keys, then serializable
# transactions from CLIENTS clients for DURATION seconds after WARMUP. It
# prints, per run, commits/s, p50 and p99 latency (ms), the server's CPU
# (utime+stime of its process over warm-up and measured time) per commit,
# and the bytes it wrote to disk per commit (write_bytes of /proc/PID/io
# over the same time: its WAL, flushes and compactions).
#
#   scripts/ab-txn.sh OLD-BINARY NEW-BINARY [ROUNDS]
#   KEYS=10000 CLIENTS=32 scripts/ab-txn.sh /tmp/old /tmp/new 5
#
# The machine's other load moves single runs a lot: compare the medians of
# several rounds, and the CPU column before the rate.
set -euo pipefail
[ $# -ge 2 ] || { sed -n 2,13p "$0"; exit 2; }
A=$1 B=$2 ROUNDS=${3:-3}
KEYS=${KEYS:-100000} CLIENTS=${CLIENTS:-64} DURATION=${DURATION:-15} WARMUP=${WARMUP:-3}
PORT=${PORT:-57370}
. "$(dirname "$0")/ab-lib.sh"
run() {
	local bin=$1 label=$2 dir=$WORK/$2
	ab_start "$bin" "$dir"
	"$bin" bench --addr 127.0.0.1:$PORT --workload txn --txn-keys "$KEYS" --txn-mode none --load --clients 16 --duration 1s --warmup 0s --seed 1 >/dev/null
	local c0 c1 w0 w1
	c0=$(awk '{print $14+$15}' /proc/$AB_PID/stat)
	w0=$(awk '/^write_bytes/ {print $2}' /proc/$AB_PID/io)
	"$bin" bench --addr 127.0.0.1:$PORT --workload txn --txn-keys "$KEYS" --txn-mode serializable --clients "$CLIENTS" \
		--duration "${DURATION}s" --warmup "${WARMUP}s" --seed 1 >"$dir/out.txt"
	c1=$(awk '{print $14+$15}' /proc/$AB_PID/stat)
	w1=$(awk '/^write_bytes/ {print $2}' /proc/$AB_PID/io)
	ab_stop
	awk -v l="$label" -v c=$((c1 - c0)) -v w=$((w1 - w0)) -v hz="$(getconf CLK_TCK)" -v s=$((DURATION + WARMUP)) \
		'$1=="txn" && $4+0>0 {printf "%-4s %6d commits/s  p50 %6s ms  p99 %6s ms  server cpu %.3f ms/commit  disk %.1f KB/commit\n", l, $4, $6, $7, c*1000/hz/($4*s), w/1000/($4*s)}' "$dir/out.txt"
}
for r in $(seq "$ROUNDS"); do
	run "$A" A
	run "$B" B
done
