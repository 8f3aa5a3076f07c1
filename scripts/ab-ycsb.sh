#!/usr/bin/env bash
# ab-ycsb.sh compares two groupkv binaries on a YCSB workload, in rounds
# that alternate them (A, B, A, B, ...), each on a fresh data directory:
# a server on loopback ports, a load of RECORDS records, then WORKLOAD from
# CLIENTS clients for DURATION after WARMUP. It prints, per run, ops/s,
# p50 and p99 of reads and updates (ms), and the server's CPU per
# operation over the measured time (groupkv bench's own figure, from the
# server's process_cpu_seconds_total), and the benchmark client's.
#
#   scripts/ab-ycsb.sh OLD-BINARY NEW-BINARY [ROUNDS]
#   WORKLOAD=c CLIENTS=16 scripts/ab-ycsb.sh /tmp/old /tmp/new 5
#   NODES=3 WORKLOAD=c scripts/ab-ycsb.sh /tmp/old /tmp/new 2
#
# With NODES=3 each binary runs a three-node "groupkv cluster local" and
# the collection has three replicas; the clients spread over the nodes and
# the CPU column is the three servers' together.
#
# The machine's other load moves single runs a lot: compare the medians of
# several rounds, and the CPU column before the rate.
set -euo pipefail
[ $# -ge 2 ] || { sed -n 2,14p "$0"; exit 2; }
A=$1 B=$2 ROUNDS=${3:-3}
NODES=${NODES:-1} WORKLOAD=${WORKLOAD:-a} RECORDS=${RECORDS:-50000} CLIENTS=${CLIENTS:-64} DURATION=${DURATION:-15s} WARMUP=${WARMUP:-2s}
PORT=${PORT:-57470}
. "$(dirname "$0")/ab-lib.sh"
run() {
	local bin=$1 label=$2 dir=$WORK/$2
	ab_start_nodes "$bin" "$dir"
	"$bin" bench --target groupkv --addr "$AB_ADDR" "${AB_EXTRA[@]}" --workload "$WORKLOAD" --records "$RECORDS" --load --clients "$CLIENTS" \
		--duration 1s --warmup 0s --seed 1 >/dev/null
	"$bin" bench --target groupkv --addr "$AB_ADDR" "${AB_EXTRA[@]}" --workload "$WORKLOAD" --records "$RECORDS" --clients "$CLIENTS" \
		--duration "$DURATION" --warmup "$WARMUP" --seed 2 >"$dir/out.txt"
	ab_stop
	awk -v l="$label" '
		$1=="read" || $1=="update" || $1=="scan" || $1=="insert" {ops = ops sprintf("  %s p50 %s p99 %s", $1, $6, $7)}
		$1=="all" {rate=$4}
		/CPU over the measured time/ {cpu=$7; ccpu=$13}
		END {printf "%-2s %7d ops/s%s  server cpu %s us/op  client cpu %s us/op\n", l, rate, ops, cpu, ccpu}' "$dir/out.txt"
}
for _ in $(seq "$ROUNDS"); do
	run "$A" A
	run "$B" B
done
