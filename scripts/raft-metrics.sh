#!/usr/bin/env bash
# raft-metrics.sh runs YCSB WORKLOAD against one groupkv server (BIN, on a
# fresh data directory and loopback ports) and prints, beside the
# benchmark's own table, what the server's metrics counted over the
# measured run: bytes allocated and written to the WAL, raft cycles (one
# fsync each) with their fsync and apply time, and garbage collections.
# Divide by the operations the table shows for per-operation figures.
#
#   scripts/raft-metrics.sh BIN
#   WORKLOAD=a DURATION=8s RATE=30000 scripts/raft-metrics.sh /tmp/groupkv
set -euo pipefail
[ $# -ge 1 ] || { sed -n 2,10p "$0"; exit 2; }
BIN=$1
WORKLOAD=${WORKLOAD:-a} RECORDS=${RECORDS:-50000} CLIENTS=${CLIENTS:-64} DURATION=${DURATION:-10s} RATE=${RATE:-0}
PORT=${PORT:-57900}
. "$(dirname "$0")/ab-lib.sh"
ab_start "$BIN" "$WORK/s"
"$BIN" bench --target groupkv --addr "127.0.0.1:$PORT" --workload "$WORKLOAD" --records "$RECORDS" --load --clients "$CLIENTS" \
	--duration 1s --warmup 0s --seed 1 >/dev/null
curl -sf "http://127.0.0.1:$PORT/metrics" >"$WORK/before"
"$BIN" bench --target groupkv --addr "127.0.0.1:$PORT" --workload "$WORKLOAD" --records "$RECORDS" --clients "$CLIENTS" \
	--duration "$DURATION" --warmup 0s --seed 2 --rate "$RATE" | grep -E '^ +(op|[a-z-]+) |CPU'
curl -sf "http://127.0.0.1:$PORT/metrics" >"$WORK/after"
ab_stop
for m in go_memstats_alloc_bytes_total go_gc_duration_seconds_count groupkv_pebble_wal_bytes_written_total \
	groupkv_raft_fsync_seconds_count groupkv_raft_fsync_seconds_sum groupkv_raft_apply_seconds_sum; do
	a=$(awk -v m="$m" '$1 == m {print $2}' "$WORK/before")
	b=$(awk -v m="$m" '$1 == m {print $2}' "$WORK/after")
	awk -v m="$m" -v a="${a:-0}" -v b="${b:-0}" 'BEGIN {printf "%-45s %.6g\n", m, b - a}'
done
