#!/usr/bin/env bash
# bench-groups.sh runs G-Store's gaming benchmark on groupkv's Key Groups
# ("groupkv bench groups") on this machine, in one run, and writes its
# section of docs/benchmarks.md (between <!-- groups-bench:start --> and
# <!-- groups-bench:end -->, created above <!-- kept across runs --> when
# missing; the rest of the file is left as it is).
#
#   scripts/bench-groups.sh                           # the defaults below
#   PLAYERS=100000 CLIENTS=1,4 CLUSTER=0 scripts/bench-groups.sh
#
# Each client plays games one after the other: a group of about GROUP_SIZE
# players (MEMBERS contiguous or random ids) created, OPS moves (group
# transactions reading one or two players and updating one, each after a
# think time of THINK to 2×THINK), the group deleted; and the same games
# ungrouped, with plain gets and puts. For each client count of CLIENTS,
# both modes run WARMUP then DURATION seconds, ROUNDS times, their order
# alternating (the overhead is the median of the rounds').
#
# It builds groupkv and runs, one after the other, each on fresh data
# directories under a temporary directory and loopback ports off groupkv's
# defaults:
#
#   groupkv     one "groupkv server", PLAYERS players loaded
#   groupkv-3   with CLUSTER=1 (the default), a three-node cluster started
#               by "groupkv cluster local", the players collection with 3
#               replicas, CLUSTER_PLAYERS players loaded (every write is
#               made durable on the three nodes, which share this
#               machine's disk and cores: loading as many players as the
#               single node takes three times as long); client i talks
#               to node i mod 3
#
# Everything it started is stopped on exit, whatever the exit; when the run
# fails, or with KEEP_TMP=1, the temporary directory with the servers' logs
# is kept and named on exit.
set -euo pipefail

cd "$(dirname "$0")/.."

PLAYERS=${PLAYERS:-1000000}
CLUSTER=${CLUSTER:-1}
CLUSTER_PLAYERS=${CLUSTER_PLAYERS:-100000}
CLIENTS=${CLIENTS:-1,4,16}
OPS=${OPS:-50}
GROUP_SIZE=${GROUP_SIZE:-10}
MEMBERS=${MEMBERS:-contiguous}
THINK=${THINK:-10ms}
DURATION=${DURATION:-10} # seconds measured per run
ROUNDS=${ROUNDS:-3}     # runs of each mode per client count, alternating
WARMUP=${WARMUP:-3}      # seconds of warm-up before each
SEED=${SEED:-1}
OUT_MD=${OUT_MD:-docs/benchmarks.md}
KEEP_TMP=${KEEP_TMP:-}

# Loopback ports: the first free ones from this base, off groupkv's
# defaults and the other scripts' bases, and below Linux's ephemeral range
# (32768 up), where a port found free can be taken by an outgoing
# connection before the server binds it (the single node's benchmark
# clients opened thousands).
GROUPKV_PORT_BASE=${GROUPKV_PORT_BASE:-28070}

START_MARK='<!-- groups-bench:start -->'
END_MARK='<!-- groups-bench:end -->'
KEPT_MARK='<!-- kept across runs -->'

started=$(date +%s)
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
log() { printf '%s bench-groups: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/groupkv-bench-groups.XXXXXX")
PID= # the server (or cluster local) running, if any
NAME=

cleanup() {
	local status=$?
	trap - EXIT INT TERM
	stop_server
	if [[ -n $KEEP_TMP || $status -ne 0 ]]; then
		log "kept $WORK (servers' logs: $WORK/*.log)"
	else
		rm -rf "$WORK"
	fi
	exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# stop_server stops the process this script started, if it runs: SIGTERM,
# then SIGKILL 30 seconds later ("groupkv cluster local" gives its nodes
# 15 seconds).
stop_server() {
	[[ -n $PID ]] || return 0
	if kill -0 "$PID" 2>/dev/null; then
		kill -TERM "$PID" 2>/dev/null || true
		for _ in $(seq 300); do
			kill -0 "$PID" 2>/dev/null || break
			sleep 0.1
		done
		if kill -0 "$PID" 2>/dev/null; then
			log "$NAME ($PID) did not stop on SIGTERM; killing it"
			kill -KILL "$PID" 2>/dev/null || true
		fi
	fi
	wait "$PID" 2>/dev/null || true
	PID=
}

# http_ok PORT PATH: whether GET http://127.0.0.1:PORT/PATH answers 200.
http_ok() {
	(
		exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
		printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$2" >&3
		IFS= read -r -t 2 line <&3 && [[ $line == *" 200 "* ]]
	) 2>/dev/null
}

# free_from BASE COUNT: the first port from BASE such that the COUNT
# ports every 10 from it, and the ones above each, are free.
free_from() {
	local p=$1 n=$2 i ok
	while :; do
		ok=1
		for ((i = 0; i < n; i++)); do
			if (exec 3<>"/dev/tcp/127.0.0.1/$((p + 10 * i))") 2>/dev/null ||
				(exec 3<>"/dev/tcp/127.0.0.1/$((p + 10 * i + 1))") 2>/dev/null; then
				ok=0
				break
			fi
		done
		((ok)) && break
		p=$((p + 100))
	done
	echo "$p"
}

# wait_until SECONDS CHECK...: waits for CHECK to succeed while the server
# lives.
wait_until() {
	local secs=$1
	shift
	for _ in $(seq $((secs * 10))); do
		kill -0 "$PID" 2>/dev/null || die "$NAME exited during start-up; its log: $WORK/$NAME.log"
		if "$@"; then
			return 0
		fi
		sleep 0.1
	done
	tail -n 20 "$WORK/$NAME.log" >&2 || true
	die "$NAME is not ready after ${secs}s; its log: $WORK/$NAME.log"
}

cluster_running() { grep -q '^Ctrl-C stops the cluster' "$WORK/$NAME.log"; }

BIN=$WORK/groupkv
log "building groupkv"
go build -o "$BIN" ./cmd/groupkv
GROUPKV_COMMIT=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
# The section this script rewrites does not make the build dirty.
if ! git diff-index --quiet HEAD -- . ":(exclude)$OUT_MD" 2>/dev/null ||
	[[ -n $(git ls-files --others --exclude-standard 2>/dev/null | head -1) ]]; then
	GROUPKV_COMMIT+=-dirty
fi

RESULTS=$WORK/results.json
COMMANDS=()

# bench ARGS...: runs groupkv bench groups with the common settings and
# records the command line ($WORK for the temporary directory).
bench() {
	local cmd=(groupkv bench groups "$@" --load --clients "$CLIENTS" --ops-per-group "$OPS" --group-size "$GROUP_SIZE"
		--members "$MEMBERS" --think "$THINK" --duration "${DURATION}s" --warmup "${WARMUP}s" --rounds "$ROUNDS" --seed "$SEED"
		--system-version "$GROUPKV_COMMIT" --out "$RESULTS")
	COMMANDS+=("$(printf '%s ' "${cmd[@]}" | sed -e "s|$WORK|\$WORK|g" -e 's| $||')")
	log "${cmd[*]}"
	"$BIN" "${cmd[@]:1}" | tee "$WORK/bench-$NAME.txt"
}

# 1. One node.
PORT=$(free_from "$GROUPKV_PORT_BASE" 1)
NAME=groupkv
"$BIN" server --data-dir "$WORK/groupkv-data" --listen "127.0.0.1:$PORT" \
	--peer-listen "127.0.0.1:$((PORT + 1))" --log-level warn >"$WORK/$NAME.log" 2>&1 &
PID=$!
wait_until 60 http_ok "$PORT" /healthz
log "groupkv $GROUPKV_COMMIT on 127.0.0.1:$PORT"
bench --addr "127.0.0.1:$PORT" --players "$PLAYERS"
stop_server

# 2. Three nodes.
if [[ $CLUSTER == 1 ]]; then
	BASE=$(free_from "$((GROUPKV_PORT_BASE + 1000))" 3)
	NAME=groupkv-3
	"$BIN" cluster local --nodes 3 --dir "$WORK/cluster" --base-port "$BASE" >"$WORK/$NAME.log" 2>&1 &
	PID=$!
	wait_until 180 cluster_running
	ADDRS=127.0.0.1:$BASE,127.0.0.1:$((BASE + 10)),127.0.0.1:$((BASE + 20))
	log "groupkv-3: groupkv cluster local on $ADDRS"
	bench --addr "$ADDRS" --replicas 3 --system-name groupkv-3 --players "$CLUSTER_PLAYERS"
	stop_server
fi

# 3. Tables and docs.
REPORT=$("$BIN" bench report --in "$RESULTS")
printf '\n%s\n\n' "$REPORT"

elapsed=$(($(date +%s) - started))
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
CPU=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//' || true)
MEM=$(awk '/^MemTotal:/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)
LOADS=
for n in groupkv groupkv-3; do
	[[ -f $WORK/bench-$n.txt ]] || continue
	LOADS+="
  - $n: $(grep -m1 '^loaded ' "$WORK/bench-$n.txt" || echo 'no load')"
done
INVOCATION="scripts/bench-groups.sh"
for v in PLAYERS CLUSTER CLUSTER_PLAYERS CLIENTS OPS GROUP_SIZE MEMBERS THINK DURATION WARMUP ROUNDS SEED; do
	case $v in
	PLAYERS) d=1000000 ;; CLUSTER) d=1 ;; CLUSTER_PLAYERS) d=100000 ;; CLIENTS) d=1,4,16 ;; OPS) d=50 ;;
	GROUP_SIZE) d=10 ;; MEMBERS) d=contiguous ;; THINK) d=10ms ;; DURATION) d=10 ;; WARMUP) d=3 ;; ROUNDS) d=3 ;; SEED) d=1 ;;
	esac
	[[ ${!v} == "$d" ]] || INVOCATION="$v=${!v} $INVOCATION"
done

BUSY=
read -r L1 _ </proc/loadavg
if awk -v a="${LOAD_BEFORE%% *}" -v b="$L1" -v n="$(nproc)" 'BEGIN { exit !(a > n / 2 || b > n) }'; then
	BUSY="
**The machine was busy with other work during this run** (load average
$LOAD_BEFORE before it, on $(nproc) cores): the latencies, their tails
above all, and so the ratios are noisy.
"
fi

SECTION=$WORK/section.md
cat >"$SECTION" <<EOF
## Key Groups (G-Store gaming benchmark)

Written by \`scripts/bench-groups.sh\` on $(date -u +%Y-%m-%d) in ${elapsed}s (this
section's figures only; rerun it rather than editing them). One run on one
machine, the servers and the benchmark client sharing its cores.
$BUSY
G-Store's gaming benchmark (Das, Agrawal and El Abbadi, SoCC 2010) on Key
Groups, \`groupkv bench groups\`: a hash collection of players, each 25
fields of 20 to 40 bytes (about 765 bytes). Each client plays one game
after the other: it draws a size K from a normal distribution around
$GROUP_SIZE (standard deviation a quarter of it, at least 2) and K $MEMBERS
players, creates an atomic group of them led by the first (a creation
refused because a player is in another client's game is counted and the
client draws again), plays $OPS moves, each a group transaction
(\`Group.Transact\` with \`WithCachedSnapshot\`: a move reads the snapshot
of the group the game's previous move brought back with its commit, and
sends only its commit, which the group's leader validates) that reads one
or two players and updates one, after a
think time drawn from [$THINK, 2×$THINK), and deletes the group. The
ungrouped baseline plays the same games (the same seed: the same sizes,
players and moves) with plain gets and puts and no guarantee; its create
and delete steps do nothing.

Latencies are of the calls only, think time excluded. "amortized" is, per
game, the time it spent in the store (its creation, its $OPS moves, its
deletion) divided by $OPS + 2; the overhead of groups is the ratio of its
mean grouped to ungrouped. The goal: with 50 or more moves per game the
overhead is at most 10% (G-Store measured 10–30%); the table counts it
met when the ratio of the medians is within it too, since a few stalls of
either run move a mean. Each client count ran both modes $ROUNDS times
for ${DURATION}s, alternating their order (grouped first in odd rounds,
ungrouped first in even ones), so that the machine's other load and the
compactions that follow the load weigh on both; the overhead figures are
the medians of the rounds', each round's ratio in the last column.

| | |
|---|---|
| CPU | ${CPU:-unknown}, $(nproc) cores |
| memory | $MEM |
| kernel | $(uname -sr) ($(uname -m)) |
| load average (1, 5, 15 min) | $LOAD_BEFORE before the run, $LOAD_AFTER after it |
| Go | $(go env GOVERSION) |
| groupkv | $GROUPKV_COMMIT |

Setup:

- groupkv: one \`groupkv server\` on a fresh data directory, the benchmark
  over loopback, everything over gRPC through the Go client (gets and
  puts, groups, and their transactions by \`Group(id).Transact\`)$([[ $CLUSTER == 1 ]] && printf '%s' "; groupkv-3: three nodes
  started by \`groupkv cluster local\`, the players collection with 3
  replicas, client i talking to node i mod 3")
- Loads, batch puts of 200 players from 8 clients:$LOADS

The command:

\`\`\`sh
$INVOCATION
\`\`\`

which ran:

\`\`\`sh
$(printf '%s\n' "${COMMANDS[@]}")
\`\`\`

$REPORT
EOF

# Replace the section between the markers, or add it above the "kept
# across runs" marker (else at the end).
mkdir -p "$(dirname "$OUT_MD")"
touch "$OUT_MD"
if grep -qxF "$START_MARK" "$OUT_MD" && grep -qxF "$END_MARK" "$OUT_MD"; then
	awk -v start="$START_MARK" -v end="$END_MARK" -v section="$SECTION" '
		$0 == start { print; while ((getline line < section) > 0) print line; skip = 1; next }
		$0 == end { skip = 0 }
		!skip { print }
	' "$OUT_MD" >"$OUT_MD.new"
elif grep -qxF "$KEPT_MARK" "$OUT_MD"; then
	awk -v start="$START_MARK" -v end="$END_MARK" -v kept="$KEPT_MARK" -v section="$SECTION" '
		$0 == kept && !done {
			print start; while ((getline line < section) > 0) print line; print end; print ""
			done = 1
		}
		{ print }
	' "$OUT_MD" >"$OUT_MD.new"
else
	{
		cat "$OUT_MD"
		printf '\n%s\n' "$START_MARK"
		cat "$SECTION"
		printf '%s\n' "$END_MARK"
	} >"$OUT_MD.new"
fi
mv "$OUT_MD.new" "$OUT_MD"

log "wrote the groups section of $OUT_MD in ${elapsed}s"
