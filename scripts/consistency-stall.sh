#!/usr/bin/env bash
# consistency-stall.sh measures what a replica consistency check costs the
# writes of a node: it starts BIN's server on a fresh data directory
# (loopback ports) with --consistency-interval INTERVAL, loads RECORDS
# records, runs YCSB A paced at RATE operations per second for DURATION
# with 100 ms windows, and prints the server's consistency-check log lines
# and the benchmark's table and slowest windows. With INTERVAL shorter than
# DURATION the run crosses one or more checks of every shard.
#
#   scripts/consistency-stall.sh BIN
#   INTERVAL=40s DURATION=100s RATE=20000 scripts/consistency-stall.sh /tmp/groupkv
set -euo pipefail
[ $# -ge 1 ] || { sed -n 2,12p "$0"; exit 2; }
BIN=$1
INTERVAL=${INTERVAL:-40s} DURATION=${DURATION:-100s} RATE=${RATE:-20000} RECORDS=${RECORDS:-100000}
PORT=${PORT:-57900}
. "$(dirname "$0")/ab-lib.sh"
SERVER_FLAGS="--consistency-interval $INTERVAL --log-level debug" ab_start "$BIN" "$WORK/s"
"$BIN" bench --target groupkv --addr "127.0.0.1:$PORT" --workload a --records "$RECORDS" --load --clients 64 \
	--duration 1s --warmup 0s --seed 1 >/dev/null
"$BIN" bench --target groupkv --addr "127.0.0.1:$PORT" --workload a --records "$RECORDS" --rate "$RATE" \
	--duration "$DURATION" --warmup 0s --window 100ms --seed 2 >"$WORK/out.txt"
ab_stop
grep -i "consistency check" "$WORK/s/server.log" | cut -c1-220 | head -40 || true
cat "$WORK/out.txt"
