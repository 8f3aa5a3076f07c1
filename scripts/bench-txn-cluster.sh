#!/usr/bin/env bash
# bench-txn-cluster.sh runs the txn workload on a three-node cluster: it
# starts three BIN servers on fresh data directories (loopback ports from
# PORT up; nodes 2 and 3 join node 1), loads KEYS keys with three
# replicas, runs `groupkv bench --workload txn --txn-mode serializable`
# with every client coordinated by node 1 (READS=each or batch), and
# prints the benchmark's table, node 1's mean time per transaction
# request (groupkv_request_duration_seconds) and the read validations of
# all three nodes during the run (groupkv_txn_read_validations_total).
#
#   scripts/bench-txn-cluster.sh BIN
#   READS=batch DURATION=15s KEYS=100000 scripts/bench-txn-cluster.sh /tmp/groupkv
set -euo pipefail
[ $# -ge 1 ] || { sed -n 2,12p "$0"; exit 2; }
BIN=$1
KEYS=${KEYS:-100000} READS=${READS:-each} DURATION=${DURATION:-15s} CLIENTS=${CLIENTS:-64} PORT=${PORT:-58200}
WORK=$(mktemp -d)
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$WORK"
}
trap cleanup EXIT
addr() { echo "127.0.0.1:$((PORT + 10 * ($1 - 1)))"; }
for i in 1 2 3; do
	join=()
	if ((i > 1)); then join=(--join "127.0.0.1:$((PORT + 1))"); fi
	"$BIN" server --node-id "$i" --data-dir "$WORK/n$i" --listen "$(addr "$i")" \
		--peer-listen "127.0.0.1:$((PORT + 10 * (i - 1) + 1))" "${join[@]}" --log-level warn >"$WORK/n$i.log" 2>&1 &
	PIDS+=($!)
	for _ in $(seq 100); do curl -sf "$(addr "$i")/healthz" >/dev/null && break; sleep 0.1; done
done
# Every node a healthy member, and the meta shard on all three with a leader.
for _ in $(seq 300); do
	st=$("$BIN" cluster status --json --addr "$(addr 1)" 2>/dev/null || true)
	[[ $(grep -o '"healthy":true' <<<"$st" | wc -l) -eq 3 ]] &&
		grep -Eq '"collection":"","shard":[0-9]+,"replicas":\[[0-9]+,[0-9]+,[0-9]+\],"leader":[1-9]' <<<"$st" && break
	sleep 0.1
done
"$BIN" bench --addr "$(addr 1)" --replicas 3 --workload txn --txn-keys "$KEYS" --txn-mode none --load \
	--clients 16 --duration 1s >/dev/null
validations() {
	for i in 1 2 3; do curl -s "$(addr "$i")/metrics"; done |
		awk '/^groupkv_txn_read_validations_total/ {s += $2} END {print s + 0}'
}
v0=$(validations)
"$BIN" bench --addr "$(addr 1)" --replicas 3 --workload txn --txn-keys "$KEYS" --txn-mode serializable \
	--clients "$CLIENTS" --duration "$DURATION" --warmup 3s --seed 1 --txn-reads "$READS"
v1=$(validations)
echo "node 1, mean per request (the load included):"
curl -s "$(addr 1)/metrics" | awk '
	/^groupkv_request_duration_seconds_sum\{op="txn_/ {match($0, /op="[a-z_]+"/); op = substr($0, RSTART + 4, RLENGTH - 5); sum[op] = $2}
	/^groupkv_request_duration_seconds_count\{op="txn_/ {match($0, /op="[a-z_]+"/); op = substr($0, RSTART + 4, RLENGTH - 5); n[op] = $2}
	END {for (op in n) if (n[op] > 0) printf "  %s: %.2f ms (%d)\n", op, 1000 * sum[op] / n[op], n[op]}'
echo "read validations during the run (warm-up included): $((v1 - v0))"
