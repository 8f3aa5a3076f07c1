#!/usr/bin/env bash
# pause-leader.sh measures what a client of a three-node cluster sees when a
# shard's leader is paused (SIGSTOP: its process stops, its connections
# stay open): it starts three BIN servers on fresh data directories
# (loopback ports from PORT up), creates a one-shard collection with three
# replicas, writes a key, stops the shard's leader, then sends PUTS writes
# and one read of the key through another node, printing each one's status,
# time and answer, and resumes the leader before it stops everything.
#
#   scripts/pause-leader.sh BIN
#   PUTS=8 PORT=58100 scripts/pause-leader.sh /tmp/groupkv
#
# The first write may answer 503 commit_unknown (it may have reached the
# paused leader); none should wait for the leader to resume.
set -euo pipefail
[ $# -ge 1 ] || { sed -n 2,14p "$0"; exit 2; }
BIN=$1
PUTS=${PUTS:-4} PORT=${PORT:-58100}
WORK=$(mktemp -d)
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill -CONT "$p" 2>/dev/null || true; kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$WORK"
}
trap cleanup EXIT
for i in 1 2 3; do
	port=$((PORT + 10 * (i - 1)))
	join=()
	if ((i > 1)); then join=(--join "127.0.0.1:$((PORT + 1))"); fi
	"$BIN" server --node-id "$i" --data-dir "$WORK/n$i" --listen "127.0.0.1:$port" \
		--peer-listen "127.0.0.1:$((port + 1))" "${join[@]}" --log-level warn >"$WORK/n$i.log" 2>&1 &
	PIDS+=($!)
	for _ in $(seq 100); do curl -sf "127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.1; done
done
addr() { echo "127.0.0.1:$((PORT + 10 * ($1 - 1)))"; }
# leader NAME: the node leading the collection's only shard (empty: none yet).
leader() {
	"$BIN" cluster status --json --addr "$(addr 1)" 2>/dev/null | python3 -c '
import json, sys
for s in json.load(sys.stdin).get("shards", []):
    if s.get("collection") == sys.argv[1] and s.get("leader"):
        print(s["leader"])' "$1"
}
for _ in $(seq 300); do
	curl -sf -X POST "$(addr 1)/v1/collections" -d '{"name": "paused", "shards": 1, "replicas": 3}' >/dev/null && break
	sleep 0.1
done
for _ in $(seq 300); do
	curl -sf -X PUT "$(addr 1)/v1/kv/paused/k" -d 'v0' >/dev/null && [ -n "$(leader paused)" ] && break
	sleep 0.1
done
L=$(leader paused)
[ -n "$L" ] || { echo "no leader of the collection's shard" >&2; exit 1; }
VIA=$((L % 3 + 1))
echo "pausing node $L (leader of the shard); writing through node $VIA"
kill -STOP "${PIDS[$((L - 1))]}"
for i in $(seq "$PUTS"); do
	curl -s -m 60 -X PUT "$(addr "$VIA")/v1/kv/paused/k" -d "v$i" -o "$WORK/out" -w "put $i: %{http_code} in %{time_total}s: "
	head -c 300 "$WORK/out"
	echo
done
curl -s -m 60 "$(addr "$VIA")/v1/kv/paused/k" -o "$WORK/out" -w "get: %{http_code} in %{time_total}s: "
head -c 300 "$WORK/out"
echo
