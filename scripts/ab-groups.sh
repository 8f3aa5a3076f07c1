#!/usr/bin/env bash
# ab-groups.sh compares two groupkv binaries on the Key Groups gaming
# benchmark ("groupkv bench groups"), in rounds that alternate them (A, B,
# A, B, ...), each on a fresh data directory: a server on loopback ports,
# PLAYERS players loaded, then the grouped and the ungrouped games of
# CLIENTS clients (OPS moves per game, think time THINK) for DURATION
# after WARMUP each. Each binary drives its own server: a change of the
# client (the Go client's group transactions) counts with the server's.
# It prints, per run, the overhead of groups (grouped / ungrouped, means
# and medians, and of the moves alone), and the p50 of moves, creations
# and deletions (ms).
#
#   scripts/ab-groups.sh OLD-BINARY NEW-BINARY [ROUNDS]
#   CLIENTS=4 OPS=100 scripts/ab-groups.sh /tmp/old /tmp/new 3
#   NODES=3 PLAYERS=50000 CLIENTS=4 scripts/ab-groups.sh /tmp/old /tmp/new
#
# With NODES=3 each binary runs a three-node "groupkv cluster local"
# instead of one server, the players collection with 3 replicas, client i
# talking to node i mod 3.
#
# The machine's other load moves single runs a lot: compare the medians of
# several rounds.
set -euo pipefail
[ $# -ge 2 ] || { sed -n 2,17p "$0"; exit 2; }
A=$1 B=$2 ROUNDS=${3:-2}
PLAYERS=${PLAYERS:-100000} CLIENTS=${CLIENTS:-16} OPS=${OPS:-50} THINK=${THINK:-10ms}
DURATION=${DURATION:-15s} WARMUP=${WARMUP:-3s} NODES=${NODES:-1}
# Below Linux's ephemeral range (32768 up), off the other scripts' ports.
PORT=${PORT:-29370}
. "$(dirname "$0")/ab-lib.sh"
run() {
	local bin=$1 label=$2 dir=$WORK/$2
	ab_start_nodes "$bin" "$dir"
	"$bin" bench groups --addr "$AB_ADDR" "${AB_EXTRA[@]}" --players "$PLAYERS" --load --clients "$CLIENTS" --ops-per-group "$OPS" \
		--think "$THINK" --duration "$DURATION" --warmup "$WARMUP" --seed 1 >"$dir/out.txt" 2>&1
	ab_stop
	# The report's tables: per mode (columns: clients, mode, creates/s,
	# create p50, create p99, moves/s, move p50, ..., delete p50), then
	# the overhead (system, players, moves/game, clients, grouped ms/op,
	# ungrouped ms/op, ratio of means, of medians, of moves alone).
	awk -F'|' -v l="$label" -v c="$CLIENTS" '
		$2 ~ " "c" " && $3 ~ /grouped/ {gsub(/ /, "", $3); p[$3] = sprintf("move p50 %s", $8); if ($3 == "grouped") cd = sprintf("create p50 %s delete p50 %s", $5, $13)}
		$2 ~ /groupkv/ && NF > 10 {ov = sprintf("overhead %s (medians %s, moves %s)", $8, $9, $10)}
		END {gsub(/  +/, " "); printf "%-2s %s  grouped %s  ungrouped %s  %s\n", l, ov, p["grouped"], p["ungrouped"], cd}' "$dir/out.txt"
}
for _ in $(seq "$ROUNDS"); do
	run "$A" A
	run "$B" B
done
