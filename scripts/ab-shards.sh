#!/usr/bin/env bash
# ab-shards.sh compares the txn workload on a collection of SHARDS_A shards
# against one of SHARDS_B (default 8, groupkv's default, against 1), in
# rounds that alternate them, each on a fresh server: what the distributed
# commit costs on one node. Per run it prints commits/s, p50 latency and
# the server's and the benchmark client's CPU per commit (from "groupkv
# bench").
#
#   scripts/ab-shards.sh BINARY [ROUNDS]
#   SHARDS_A=8 SHARDS_B=2 KEYS=10000 scripts/ab-shards.sh ./groupkv 3
set -euo pipefail
[ $# -ge 1 ] || { sed -n 2,10p "$0"; exit 2; }
BIN=$1 ROUNDS=${2:-2}
SHARDS_A=${SHARDS_A:-8} SHARDS_B=${SHARDS_B:-1}
KEYS=${KEYS:-100000} CLIENTS=${CLIENTS:-64} DURATION=${DURATION:-15} WARMUP=${WARMUP:-3}
PORT=${PORT:-57570}
. "$(dirname "$0")/ab-lib.sh"
run() {
	local shards=$1 dir=$WORK/$1-$2
	ab_start "$BIN" "$dir"
	"$BIN" bench --addr 127.0.0.1:$PORT --workload txn --txn-keys "$KEYS" --txn-mode none --load --shards "$shards" \
		--clients 16 --duration 1s --warmup 0s --seed 1 >/dev/null
	"$BIN" bench --addr 127.0.0.1:$PORT --workload txn --txn-keys "$KEYS" --txn-mode serializable --clients "$CLIENTS" \
		--duration "${DURATION}s" --warmup "${WARMUP}s" --seed 1 >"$dir/out.txt"
	ab_stop
	awk -v s="$shards" '
		$1=="txn" && $4+0>0 {rate=$4; p50=$6}
		/CPU over the measured time/ {match($0, /server [0-9]+/); srv=substr($0, RSTART+7, RLENGTH-7); match($0, /client [0-9]+/); cli=substr($0, RSTART+7, RLENGTH-7)}
		END {printf "shards %-2s %6d commits/s  p50 %6s ms  server %s µs/commit  client %s µs/commit\n", s, rate, p50, srv, cli}' "$dir/out.txt"
}
for r in $(seq "$ROUNDS"); do
	run "$SHARDS_A" "$r"
	run "$SHARDS_B" "$r"
done
