#!/usr/bin/env bash
# server-latency.sh sets the latency a client measures beside the time the
# server spent in the request: it starts BIN's server on a fresh data
# directory (loopback ports), loads RECORDS records, runs WORKLOAD from
# CLIENTS clients for DURATION, and prints the share of OP requests the
# server's groupkv_request_duration_seconds histogram counts under each
# bucket over the run, then the benchmark's own per-operation table.
#
#   scripts/server-latency.sh BIN [OP]
#   WORKLOAD=e CLIENTS=4 scripts/server-latency.sh /tmp/groupkv scan
set -euo pipefail
[ $# -ge 1 ] || { sed -n 2,10p "$0"; exit 2; }
BIN=$1 OP=${2:-scan}
WORKLOAD=${WORKLOAD:-e} RECORDS=${RECORDS:-50000} CLIENTS=${CLIENTS:-4} DURATION=${DURATION:-10s}
PORT=${PORT:-57800}
. "$(dirname "$0")/ab-lib.sh"
buckets() {
	curl -sf "http://127.0.0.1:$PORT/metrics" | grep "^groupkv_request_duration_seconds_bucket{op=\"$OP\"," |
		sed 's/.*le="\([^"]*\)"} \(.*\)/\1 \2/'
}
ab_start "$BIN" "$WORK/s"
"$BIN" bench --target groupkv --addr "127.0.0.1:$PORT" --workload "$WORKLOAD" --records "$RECORDS" --load --clients 64 \
	--duration 1s --warmup 0s --seed 1 >/dev/null
"$BIN" bench --target groupkv --addr "127.0.0.1:$PORT" --workload "$WORKLOAD" --records "$RECORDS" --clients "$CLIENTS" \
	--duration 2s --warmup 0s --seed 3 >/dev/null # warm-up
buckets >"$WORK/before"
"$BIN" bench --target groupkv --addr "127.0.0.1:$PORT" --workload "$WORKLOAD" --records "$RECORDS" --clients "$CLIENTS" \
	--duration "$DURATION" --warmup 0s --seed 2 >"$WORK/out.txt"
buckets >"$WORK/after"
ab_stop
paste "$WORK/before" "$WORK/after" | awk -v op="$OP" '
	{le[NR] = $1; n[NR] = $4 - $2}
	END {
		total = n[NR]
		printf "%d %s requests, share the server answered within:", total, op
		for (i = 1; i < NR && le[i] + 0 <= 0.0256; i++) printf "  %g ms %.1f%%", le[i] * 1000, 100 * n[i] / total
		printf "\n"
	}'
grep -E '^ +(op|[a-z-]+) ' "$WORK/out.txt"
