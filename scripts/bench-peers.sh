#!/usr/bin/env bash
# bench-peers.sh measures groupkv against etcd and Redis with the same YCSB
# workloads, on this machine, in one run, and writes docs/benchmarks.md and
# docs/benchmarks.png.
#
#   scripts/bench-peers.sh                         # the defaults below
#   DURATION=60s RECORDS=200000 scripts/bench-peers.sh
#
# It installs etcd-server and redis-server with apt when they are missing,
# builds groupkv, then for each system in turn starts a fresh server (a new
# data directory under a temporary directory, loopback ports that are not
# the systems' defaults), loads it, runs the workloads, and stops it; every
# server runs alone, so the others do not take its CPU. It does so ROUNDS
# times (groupkv, etcd, Redis, then Redis, etcd, groupkv, and so on), so
# that a slow minute of a shared machine falls on every system alike: the
# report gives each ratio as the median of the rounds' ratios, with every
# round's. Then it runs the
# timeline workload (correlated reads, groupkv only) on a tag and a hash
# collection, prints the tables and writes the docs. Everything it started
# is stopped on exit, whatever the exit.
#
# Durability is each system's own, as close to "acknowledged = on disk" as
# it offers: groupkv acknowledges a write after its raft entry is fsynced
# (group commit), etcd after its WAL is fsynced (default), Redis with
# appendonly yes and appendfsync always (fsync per event-loop write batch).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)

RECORDS=${RECORDS:-50000}
VALUE_SIZE=${VALUE_SIZE:-100}
CLIENTS=${CLIENTS:-64}
DURATION=${DURATION:-15s}
WARMUP=${WARMUP:-3s}
ROUNDS=${ROUNDS:-3}
WORKLOADS=${WORKLOADS:-a,b,c,e}
SEED=${SEED:-1}
# PACED_RATE: after its closed-loop workloads, groupkv and Redis each run
# workload A once more at this many operations per second (groupkv bench
# --rate: latencies from the scheduled starts), so that their latencies
# compare at the same load too; 0 leaves it out. etcd cannot keep up
# with it on two cores and does not run it.
PACED_RATE=${PACED_RATE:-30000}
TIMELINE_USERS=${TIMELINE_USERS:-1000}
TIMELINE_PER_USER=${TIMELINE_PER_USER:-20}
OUT_MD=${OUT_MD:-docs/benchmarks.md}
OUT_PNG=${OUT_PNG:-docs/benchmarks.png}
KEEP_TMP=${KEEP_TMP:-}

# Loopback ports: the first free ones from these bases, off the systems'
# defaults (7070, 2379/2380, 6379) so that neither a service the package
# install started nor another groupkv on this machine collides.
GROUPKV_PORT_BASE=${GROUPKV_PORT_BASE:-27070}
ETCD_PORT_BASE=${ETCD_PORT_BASE:-23790}
REDIS_PORT_BASE=${REDIS_PORT_BASE:-26379}

started=$(date +%s)
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
log() { printf '%s bench-peers: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/groupkv-bench.XXXXXX")
PIDS=()

cleanup() {
	local status=$?
	for pid in "${PIDS[@]}"; do
		stop_pid "$pid"
	done
	if [[ -n $KEEP_TMP ]]; then
		log "kept $WORK"
	else
		rm -rf "$WORK"
	fi
	exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# stop_pid stops a process this script started: SIGTERM, then SIGKILL after
# 15 seconds.
stop_pid() {
	local pid=$1
	kill -0 "$pid" 2>/dev/null || return 0
	kill -TERM "$pid" 2>/dev/null || true
	for _ in $(seq 150); do
		kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
		sleep 0.1
	done
	log "process $pid did not stop on SIGTERM; killing it"
	kill -KILL "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
}

# forget_pid drops a stopped process from the list cleanup walks.
forget_pid() {
	local keep=() p
	for p in "${PIDS[@]}"; do
		[[ $p == "$1" ]] || keep+=("$p")
	done
	PIDS=("${keep[@]}")
}

# http_ok PORT PATH: whether GET http://127.0.0.1:PORT/PATH answers 200
# (bash's /dev/tcp, so that curl is not needed).
http_ok() {
	(
		exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
		printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$2" >&3
		IFS= read -r -t 2 line <&3 && [[ $line == *" 200 "* ]]
	) 2>/dev/null
}

# redis_ok PORT: whether Redis answers PING.
redis_ok() {
	(
		exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
		printf 'PING\r\n' >&3
		IFS= read -r -t 2 line <&3 && [[ $line == "+PONG"* ]]
	) 2>/dev/null
}

# pick_port VAR BASE: sets VAR to the first port from BASE on that nothing
# listens on and that this script has not picked yet.
PICKED=" "
pick_port() {
	local p=$2
	while [[ $PICKED == *" $p "* ]] || (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; do
		p=$((p + 1))
	done
	PICKED+="$p "
	printf -v "$1" %d "$p"
}

# wait_until NAME PID CHECK...: waits up to 60s for CHECK to succeed while
# PID lives.
wait_until() {
	local name=$1 pid=$2
	shift 2
	for _ in $(seq 600); do
		kill -0 "$pid" 2>/dev/null || die "$name exited during start-up; its log: $WORK/$name.log"
		if "$@"; then
			# The answer must be our server's, not another on a port it
			# failed to bind.
			sleep 0.2
			kill -0 "$pid" 2>/dev/null || die "$name exited during start-up; its log: $WORK/$name.log"
			return 0
		fi
		sleep 0.1
	done
	die "$name is not ready after 60s; its log: $WORK/$name.log"
}

# 1. Peers.
missing=()
command -v etcd >/dev/null || missing+=(etcd-server)
command -v redis-server >/dev/null || missing+=(redis-server)
if ((${#missing[@]})); then
	SUDO=
	[[ $(id -u) -eq 0 ]] || SUDO=sudo
	log "installing ${missing[*]} with apt"
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
command -v etcd >/dev/null || die "no etcd binary after installing etcd-server"
command -v redis-server >/dev/null || die "no redis-server binary after installing redis-server"

# 2. groupkv.
BIN=$WORK/groupkv
log "building groupkv"
go build -o "$BIN" ./cmd/groupkv
GROUPKV_COMMIT=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
# diff-index and ls-files read the tree without writing the index.
if ! git diff-index --quiet HEAD -- 2>/dev/null ||
	[[ -n $(git ls-files --others --exclude-standard 2>/dev/null | head -1) ]]; then
	GROUPKV_COMMIT+=-dirty
fi

RESULTS=$WORK/results.json
TIMELINE_RESULTS=$WORK/timeline.json
COMMANDS=()

# bench ARGS...: runs groupkv bench with the common settings and records the
# command line (with the temporary directory as $WORK). It loads the records
# first unless NO_LOAD is set.
bench() {
	local cmd=(groupkv bench "$@" --value-size "$VALUE_SIZE" --clients "$CLIENTS"
		--duration "$DURATION" --warmup "$WARMUP" --seed "$SEED")
	[[ -n ${NO_LOAD:-} ]] || cmd+=(--load)
	COMMANDS+=("$(printf '%s ' "${cmd[@]}" | sed -e "s|$WORK|\$WORK|g" -e "s| $||")")
	log "${cmd[*]}"
	"$BIN" "${cmd[@]:1}"
}

start_groupkv() {
	pick_port GROUPKV_PORT "$GROUPKV_PORT_BASE"
	pick_port GROUPKV_PEER_PORT "$((GROUPKV_PORT + 1))"
	"$BIN" server --data-dir "$WORK/groupkv-data" --listen "127.0.0.1:$GROUPKV_PORT" \
		--peer-listen "127.0.0.1:$GROUPKV_PEER_PORT" --log-level warn >"$WORK/groupkv.log" 2>&1 &
	PID=$!
	PIDS+=("$PID")
	wait_until groupkv "$PID" http_ok "$GROUPKV_PORT" /healthz
}

. "$(dirname "$0")/bench-etcd.sh" # start_etcd

start_redis() {
	pick_port REDIS_PORT "$REDIS_PORT_BASE"
	mkdir -p "$WORK/redis-data"
	redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --dir "$WORK/redis-data" \
		--appendonly yes --appendfsync always --save '' --daemonize no >"$WORK/redis.log" 2>&1 &
	PID=$!
	PIDS+=("$PID")
	wait_until redis "$PID" redis_ok "$REDIS_PORT"
}

stop_server() {
	stop_pid "$PID"
	forget_pid "$PID"
}

# 3. The runs, one system at a time, ROUNDS times: groupkv, etcd, Redis in
# the odd rounds, Redis, etcd, groupkv in the even ones, so that a machine
# slowing down (or speeding up) through the run favours no system.
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "ROUNDS=$ROUNDS: give a whole number of rounds, 1 or more"
run_groupkv() {
	log "round $round of $ROUNDS: groupkv $GROUPKV_COMMIT"
	rm -rf "$WORK/groupkv-data"
	start_groupkv
	bench --target groupkv --addr "127.0.0.1:$GROUPKV_PORT" --workload "$WORKLOADS" --records "$RECORDS" \
		--out "$RESULTS" --system-version "$GROUPKV_COMMIT" "${ROUND[@]}"
	if [[ $PACED_RATE != 0 ]]; then
		NO_LOAD=1 bench --target groupkv --addr "127.0.0.1:$GROUPKV_PORT" --workload a --rate "$PACED_RATE" \
			--records "$RECORDS" --out "$RESULTS" --system-version "$GROUPKV_COMMIT" --window 100ms "${ROUND[@]}"
	fi
	if ((round == 1)); then
		bench --target groupkv --addr "127.0.0.1:$GROUPKV_PORT" --workload timeline --partitioning tag,hash \
			--users "$TIMELINE_USERS" --records-per-user "$TIMELINE_PER_USER" --out "$TIMELINE_RESULTS" \
			--system-version "$GROUPKV_COMMIT"
	fi
	stop_server
	# The server's warnings (a storage write stall, a slow disk operation)
	# go with the run's output, since its log goes with WORK.
	grep -E '"level":"(WARN|ERROR)"' "$WORK/groupkv.log" | head -20 | while IFS= read -r line; do
		log "groupkv server: $line"
	done || true
}
# etcd is loaded (with a 1s run whose result is dropped), restarted on the
# same data (why: see bench-etcd.sh), then measured.
run_etcd() {
	log "round $round of $ROUNDS: etcd"
	rm -rf "$WORK/etcd-data"
	start_etcd
	DURATION=1s WARMUP=0s bench --target etcd --addr "127.0.0.1:$ETCD_PORT" --workload a --records "$RECORDS" >/dev/null
	stop_server
	start_etcd
	NO_LOAD=1 bench --target etcd --addr "127.0.0.1:$ETCD_PORT" --workload "$WORKLOADS" --records "$RECORDS" --out "$RESULTS" "${ROUND[@]}"
	stop_server
}
run_redis() {
	log "round $round of $ROUNDS: Redis"
	rm -rf "$WORK/redis-data"
	start_redis
	bench --target redis --addr "127.0.0.1:$REDIS_PORT" --workload "$WORKLOADS" --records "$RECORDS" --out "$RESULTS" "${ROUND[@]}"
	if [[ $PACED_RATE != 0 ]]; then
		NO_LOAD=1 bench --target redis --addr "127.0.0.1:$REDIS_PORT" --workload a --rate "$PACED_RATE" \
			--records "$RECORDS" --out "$RESULTS" --window 100ms "${ROUND[@]}"
	fi
	stop_server
}
for round in $(seq "$ROUNDS"); do
	ROUND=()
	((ROUNDS == 1)) || ROUND=(--round "$round")
	if ((round % 2 == 1)); then
		run_groupkv
		run_etcd
		run_redis
	else
		run_redis
		run_etcd
		run_groupkv
	fi
done

# 4. Tables, chart, docs.
REPORT=$("$BIN" bench report --in "$RESULTS" --baseline groupkv)
TIMELINE_REPORT=$("$BIN" bench report --in "$TIMELINE_RESULTS" --baseline groupkv)
mkdir -p "$(dirname "$OUT_MD")" "$(dirname "$OUT_PNG")"
"$BIN" bench chart --in "$RESULTS" --out "$OUT_PNG" >/dev/null
printf '\n%s\n\n%s\n\n' "$REPORT" "$TIMELINE_REPORT"

elapsed=$(($(date +%s) - started))
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
CPU=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//' || true)
MEM=$(awk '/^MemTotal:/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)
INVOCATION="scripts/bench-peers.sh"
for v in RECORDS VALUE_SIZE CLIENTS DURATION WARMUP ROUNDS WORKLOADS SEED PACED_RATE TIMELINE_USERS TIMELINE_PER_USER; do
	# Name the settings that differ from the defaults.
	case $v in
	RECORDS) d=50000 ;; VALUE_SIZE) d=100 ;; CLIENTS) d=64 ;; DURATION) d=15s ;; WARMUP) d=3s ;; ROUNDS) d=3 ;;
	WORKLOADS) d=a,b,c,e ;; SEED) d=1 ;; PACED_RATE) d=30000 ;; TIMELINE_USERS) d=1000 ;; TIMELINE_PER_USER) d=20 ;;
	esac
	[[ ${!v} == "$d" ]] || INVOCATION="$v=${!v} $INVOCATION"
done

{
	cat <<EOF
# Benchmarks: groupkv, etcd and Redis

Written by \`scripts/bench-peers.sh\` on $(date -u +%Y-%m-%d) in ${elapsed}s; rerun it
rather than editing this file. Every number comes from one run of the
script on one machine, the servers and the benchmark client sharing its
cores: read the ratios, not the absolute figures. The systems ran
$ROUNDS round(s) in turn (groupkv, etcd, Redis in the odd rounds, the
other way round in the even ones); the ratios are the medians of the
rounds' ratios, and the chart shows each system's median round.

## Machine

| | |
|---|---|
| CPU | ${CPU:-unknown}, $(nproc) cores |
| memory | $MEM |
| kernel | $(uname -sr) ($(uname -m)) |
| load average (1, 5, 15 min) | $LOAD_BEFORE before the run, $LOAD_AFTER after it |

## Versions

| | |
|---|---|
| Go | $(go env GOVERSION) |
| groupkv | $GROUPKV_COMMIT |
| etcd | $(etcd --version | awk '/etcd Version/ {print $3}') (Debian etcd-server) |
| Redis | $(redis-server --version | sed -n 's/.* v=\([^ ]*\).*/\1/p') (Debian redis-server) |

## Setup

- Each system runs alone, one node or member, on a fresh data directory,
  listening on 127.0.0.1: started, loaded, measured and stopped before the
  next one starts, in every round. groupkv logs at warn and etcd at error (under load etcd
  logs a warning per slow request, which slows it further).
- etcd is restarted on its data between the load and the runs: etcd 3.4
  copies its buffer of writes not yet committed to its backend into every
  read, and that buffer keeps the size the load's burst gave it until the
  process restarts (fixed in etcd 3.5, PR 12933). Loaded and not
  restarted, etcd served workload C at about a sixth of its rate.
- Durability, each system's strictest ordinary setting: groupkv acknowledges
  a write once its raft entry is fsynced and applied (one fsync per group
  commit cycle); etcd once its WAL entry is fsynced (the default); Redis runs
  with \`--appendonly yes --appendfsync always --save ''\`.
- Clients go through each system's ordinary Go client: groupkv's
  \`groupkv.Dial\` (gRPC), \`go.etcd.io/etcd/client/v3\` (linearizable gets),
  \`github.com/redis/go-redis/v9\`. Scans: groupkv \`Scan\`, etcd a ranged
  \`Get\` with a limit, Redis a sorted set of the keys (\`ZRANGE BYLEX\`) and
  \`MGET\`, as YCSB's Redis binding does.
- Workloads: YCSB core workloads $WORKLOADS ($RECORDS records of
  $VALUE_SIZE bytes, keys \`user<fnv(n)>\`, requests scrambled zipfian with
  constant 0.99 (workload D: latest), scans of 1–100 records), $CLIENTS closed-loop clients, $WARMUP
  warm-up then $DURATION measured per workload, seed $SEED. Latencies are
  per operation, from the client; p99 is over every operation of the
  workload.
- $( [[ $PACED_RATE != 0 ]] && echo "\`a@${PACED_RATE}/s\`: workload A again, on the same server after the
  workloads above, at a fixed $PACED_RATE operations/s (\`groupkv bench
  --rate\`: each client starts an operation every $CLIENTS/$PACED_RATE s,
  and a latency counts from its scheduled start, so a system that falls
  behind is charged for the wait), for groupkv and Redis: their latencies
  at the same load, where the closed loop compares each at its own pace.
  etcd does not run it (it cannot keep up on two cores). Its runs record
  every 100 ms window's slowest operation (\`--window 100ms\`), and the
  script's output names the five slowest: where a stall was." || echo "No paced run (PACED_RATE=0).")
- CPU: "server CPU µs/op" is the CPU time the server used over the
  measured time (groupkv's and etcd's \`process_cpu_seconds_total\`,
  Redis's \`INFO cpu\`) per operation; "client CPU µs/op" that of the
  benchmark process. On a shared machine they vary less between runs than
  throughput does.

The command:

\`\`\`sh
$INVOCATION
\`\`\`

which ran:

\`\`\`sh
$(printf '%s\n' "${COMMANDS[@]}")
\`\`\`

## Results

![throughput and p99 latency per workload and system]($(basename "$OUT_PNG"))

$REPORT

## Correlated reads: the timeline workload

$TIMELINE_USERS users with $TIMELINE_PER_USER records each, every record tagged
with its user's tag; each operation reads one user's whole timeline with
\`GetByTags(all=[user-tag])\` (users chosen zipfian). \`timeline-tag\` runs on a
collection placed by tag (a user's records share a shard), \`timeline-hash\`
on a hash collection (they are spread over all shards). groupkv only; the
peers have no tag queries.

$TIMELINE_REPORT

## Caveats

- Two cores run the server under test and the 64 clients of the benchmark
  together; a server that needs less CPU per operation leaves more to the
  client. Redis serves every request on one thread and does no consensus;
  etcd and groupkv run raft even on one node.
- An etcd ranged \`Get\` with a limit still counts every key of the range
  (etcd 3.4 has no way to skip the count), so its workload E scans cost
  grows with the record count.
- The machine may be shared: the load average above says how busy it was
  around the run.
- On one node every shard is local, so the timeline workload shows only
  what a tag query costs per shard it touches; placement by tag is meant to
  pay off when a collection's shards live on different nodes.
- Server-side profiles: run the server with \`--pprof\` and take
  \`/debug/pprof/profile\` and \`/debug/pprof/heap\` during a run.
EOF
} >"$OUT_MD.new"
# The cluster, transaction and Key Groups benchmarks' sections
# (scripts/bench-cluster.sh, bench-txn.sh, bench-groups.sh) survive a
# rerun, and so does the hand-written history (before/after figures, goals)
# below the marker line.
if [ -f "$OUT_MD" ] && grep -q '^<!-- cluster-bench:start -->$' "$OUT_MD"; then
  printf '\n' >>"$OUT_MD.new"
  sed -n '/^<!-- cluster-bench:start -->$/,/^<!-- cluster-bench:end -->$/p' "$OUT_MD" >>"$OUT_MD.new"
fi
if [ -f "$OUT_MD" ] && grep -q '^<!-- txn-bench:start -->$' "$OUT_MD"; then
  printf '\n' >>"$OUT_MD.new"
  sed -n '/^<!-- txn-bench:start -->$/,/^<!-- txn-bench:end -->$/p' "$OUT_MD" >>"$OUT_MD.new"
fi
if [ -f "$OUT_MD" ] && grep -q '^<!-- groups-bench:start -->$' "$OUT_MD"; then
  printf '\n' >>"$OUT_MD.new"
  sed -n '/^<!-- groups-bench:start -->$/,/^<!-- groups-bench:end -->$/p' "$OUT_MD" >>"$OUT_MD.new"
fi
if [ -f "$OUT_MD" ] && grep -q '^<!-- kept across runs -->$' "$OUT_MD"; then
  printf '\n' >>"$OUT_MD.new"
  sed -n '/^<!-- kept across runs -->$/,$p' "$OUT_MD" >>"$OUT_MD.new"
fi
mv "$OUT_MD.new" "$OUT_MD"

log "wrote $OUT_MD and $OUT_PNG in ${elapsed}s"
