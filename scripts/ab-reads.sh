#!/usr/bin/env bash
# ab-reads.sh compares the txn workload reading a transaction's keys one
# request at a time (--txn-reads each) against all in one request (batch),
# in rounds that alternate them, each on a fresh server. Per run it prints
# commits/s, p50 latency and the server's and the benchmark client's CPU
# per commit (from "groupkv bench"). MODE=none compares the same reads and
# writes outside transactions.
#
#   scripts/ab-reads.sh BINARY [ROUNDS]
#   KEYS=10000 SHARDS=1 scripts/ab-reads.sh ./groupkv 3
set -euo pipefail
[ $# -ge 1 ] || { sed -n 2,10p "$0"; exit 2; }
BIN=$1 ROUNDS=${2:-2}
KEYS=${KEYS:-100000} CLIENTS=${CLIENTS:-64} DURATION=${DURATION:-15} WARMUP=${WARMUP:-3}
SHARDS=${SHARDS:-8} MODE=${MODE:-serializable}
PORT=${PORT:-57590}
. "$(dirname "$0")/ab-lib.sh"
run() {
	local reads=$1 dir=$WORK/$1-$2
	ab_start "$BIN" "$dir"
	"$BIN" bench --addr 127.0.0.1:$PORT --workload txn --txn-keys "$KEYS" --txn-mode none --load --shards "$SHARDS" \
		--clients 16 --duration 1s --warmup 0s --seed 1 >/dev/null
	"$BIN" bench --addr 127.0.0.1:$PORT --workload txn --txn-keys "$KEYS" --txn-mode "$MODE" --txn-reads "$reads" \
		--clients "$CLIENTS" --duration "${DURATION}s" --warmup "${WARMUP}s" --seed 1 >"$dir/out.txt"
	ab_stop
	awk -v s="$reads" '
		$1=="txn" && $4+0>0 {rate=$4; p50=$6}
		/CPU over the measured time/ {match($0, /server [0-9]+/); srv=substr($0, RSTART+7, RLENGTH-7); match($0, /client [0-9]+/); cli=substr($0, RSTART+7, RLENGTH-7)}
		END {printf "reads %-5s %6d commits/s  p50 %6s ms  server %s µs/commit  client %s µs/commit\n", s, rate, p50, srv, cli}' "$dir/out.txt"
}
for r in $(seq "$ROUNDS"); do
	run each "$r"
	run batch "$r"
done
