#!/usr/bin/env bash
# bench-cluster.sh measures a three-node groupkv cluster against a
# three-member etcd cluster and against a single groupkv node, with the same
# YCSB workloads, on this machine, in one run, and writes its own section of
# docs/benchmarks.md (between the markers <!-- cluster-bench:start --> and
# <!-- cluster-bench:end -->, created above <!-- kept across runs --> when
# missing; the rest of the file is left as it is).
#
#   scripts/bench-cluster.sh                          # the defaults below
#   DURATION=60s WORKLOADS=a,b,c scripts/bench-cluster.sh
#
# It installs etcd-server with apt when it is missing, builds groupkv, then
# for each system in turn starts it afresh (new data directories under a
# temporary directory, loopback ports off the systems' defaults), loads it,
# runs the workloads and stops it, so that only one system runs at a time:
#
#   groupkv-3  groupkv server --node-id 1, then nodes 2 and 3 with --join
#              to node 1's peer address; the benchmark's collection is
#              created with --replicas 3 (every shard on all three nodes)
#   etcd-3     three etcd members started together (--initial-cluster)
#   groupkv-1  one groupkv server, as scripts/bench-peers.sh runs it
#
# The benchmark's clients are spread over the nodes (members): client i of
# CLIENTS talks to node i mod 3 only. Everything it started is stopped on
# exit, whatever the exit (a SIGTERM to the script alone takes effect when
# the running "groupkv bench" ends; Ctrl-C stops that too); when the run
# fails, or with KEEP_TMP=1, the temporary directory with the servers' logs
# is kept and named on exit.
#
# scripts/bench-peers.sh rewrites everything above <!-- kept across runs -->,
# this section included: run this script again after it.
#
# Durability is each system's own: groupkv acknowledges a write once its
# raft entry is fsynced on a quorum and applied, etcd once its WAL entry is
# fsynced on a quorum (the default).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)

RECORDS=${RECORDS:-50000}
VALUE_SIZE=${VALUE_SIZE:-100}
CLIENTS=${CLIENTS:-64}
DURATION=${DURATION:-30s}
WARMUP=${WARMUP:-5s}
WORKLOADS=${WORKLOADS:-a,c}
SEED=${SEED:-1}
REPLICAS=${REPLICAS:-3}
OUT_MD=${OUT_MD:-docs/benchmarks.md}
KEEP_TMP=${KEEP_TMP:-}

# Loopback ports: the first free ones from these bases, off the systems'
# defaults (7070/7071, 2379/2380), off the other scripts' bases, and below
# Linux's ephemeral range (32768 up), where a port found free can be taken
# by an outgoing connection before the server binds it.
GROUPKV_PORT_BASE=${GROUPKV_PORT_BASE:-30070}
ETCD_PORT_BASE=${ETCD_PORT_BASE:-31790}

NODES=3
START_MARK='<!-- cluster-bench:start -->'
END_MARK='<!-- cluster-bench:end -->'
KEPT_MARK='<!-- kept across runs -->'

started=$(date +%s)
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
log() { printf '%s bench-cluster: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/groupkv-bench-cluster.XXXXXX")
PIDS=()   # every server this script started and has not stopped
NAMES=()  # their names, parallel to PIDS (their logs are $WORK/<name>.log)

cleanup() {
	local status=$?
	trap - EXIT INT TERM
	stop_all
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

# stop_all stops every server this script started: SIGTERM to all of them,
# then SIGKILL to those still running 15 seconds later.
stop_all() {
	local pid alive
	((${#PIDS[@]})) || return 0
	for pid in "${PIDS[@]}"; do
		kill -TERM "$pid" 2>/dev/null || true
	done
	for _ in $(seq 150); do
		alive=0
		for pid in "${PIDS[@]}"; do
			kill -0 "$pid" 2>/dev/null && alive=1
		done
		((alive)) || break
		sleep 0.1
	done
	for pid in "${PIDS[@]}"; do
		if kill -0 "$pid" 2>/dev/null; then
			log "process $pid did not stop on SIGTERM; killing it"
			kill -KILL "$pid" 2>/dev/null || true
		fi
		wait "$pid" 2>/dev/null || true
	done
	PIDS=()
	NAMES=()
}

# show_logs prints the last lines of the logs of the running servers.
show_logs() {
	local name
	for name in "${NAMES[@]}"; do
		log "last lines of $WORK/$name.log:"
		tail -n 20 "$WORK/$name.log" >&2 || true
	done
}

# check_alive dies when a server this script started has exited.
check_alive() {
	local i
	for i in "${!PIDS[@]}"; do
		if ! kill -0 "${PIDS[$i]}" 2>/dev/null; then
			show_logs
			die "${NAMES[$i]} exited; its log: $WORK/${NAMES[$i]}.log"
		fi
	done
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
	show_logs
	die "$name is not ready after 60s; its log: $WORK/$name.log"
}

# spawn NAME CMD...: starts CMD in the background, its output in
# $WORK/NAME.log, and records it; sets PID.
spawn() {
	local name=$1
	shift
	"$@" >"$WORK/$name.log" 2>&1 &
	PID=$!
	PIDS+=("$PID")
	NAMES+=("$name")
}

# 1. etcd.
if ! command -v etcd >/dev/null; then
	SUDO=
	[[ $(id -u) -eq 0 ]] || SUDO=sudo
	log "installing etcd-server with apt"
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq etcd-server >/dev/null
fi
command -v etcd >/dev/null || die "no etcd binary after installing etcd-server"
ETCD_VERSION=$(etcd --version | awk '/etcd Version/ {print $3}')

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
COMMANDS=()

# bench ARGS...: runs groupkv bench with the common settings, records the
# command line (the temporary directory as $WORK), and on failure shows
# the servers' logs. It loads the records first unless NO_LOAD is set, and
# appends its results to OUT (default: the results file).
bench() {
	local out=$WORK/bench-${#COMMANDS[@]}.out
	local cmd=(groupkv bench "$@" --workload "$WORKLOADS" --records "$RECORDS" --value-size "$VALUE_SIZE"
		--clients "$CLIENTS" --duration "$DURATION" --warmup "$WARMUP" --seed "$SEED" --out "${OUT:-$RESULTS}")
	[[ -n ${NO_LOAD:-} ]] || cmd+=(--load)
	COMMANDS+=("$(printf '%s ' "${cmd[@]}" | sed -e "s|$WORK|\$WORK|g" -e "s| $||")")
	log "${cmd[*]}"
	if ! "$BIN" "${cmd[@]:1}" | tee "$out"; then
		show_logs
		die "groupkv bench failed (its output above and in $out)"
	fi
	# A run whose operations failed still ends well: say so loudly.
	if grep -q '^  error: ' "$out"; then
		log "warning: some operations failed; the error samples:"
		grep '^  error: ' "$out" | sort | uniq -c >&2
	fi
	check_alive
}

# cluster_status ADDR: GET /v1/cluster of the groupkv node at ADDR.
cluster_status() { "$BIN" cluster status --json --addr "$1" 2>/dev/null; }

start_groupkv_cluster() {
	local i port peer join=() addrs=()
	GROUPKV_ADDRS=
	for i in $(seq "$NODES"); do
		pick_port port "$((GROUPKV_PORT_BASE + 10 * (i - 1)))"
		pick_port peer "$((port + 1))"
		if ((i == 1)); then
			GROUPKV_PEER1=$peer
		else
			join=(--join "127.0.0.1:$GROUPKV_PEER1")
		fi
		spawn "groupkv-node$i" "$BIN" server --node-id "$i" --data-dir "$WORK/groupkv-node$i" \
			--listen "127.0.0.1:$port" --peer-listen "127.0.0.1:$peer" "${join[@]}" --log-level warn
		wait_until "groupkv-node$i" "$PID" http_ok "$port" /healthz
		addrs+=("127.0.0.1:$port")
	done
	GROUPKV_ADDRS=$(
		IFS=,
		echo "${addrs[*]}"
	)
	# Every node must be a healthy member, and the meta shard replicated on
	# all three with a leader.
	local st
	for _ in $(seq 300); do
		st=$(cluster_status "${addrs[0]}" || true)
		if [[ $(grep -o '"healthy":true' <<<"$st" | wc -l) -eq $NODES ]] &&
			grep -Eq '"collection":"","shard":[0-9]+,"replicas":\[[0-9]+,[0-9]+,[0-9]+\],"leader":[1-9]' <<<"$st"; then
			log "groupkv cluster up: $GROUPKV_ADDRS"
			return 0
		fi
		check_alive
		sleep 0.1
	done
	show_logs
	die "the groupkv cluster did not come together in 30s; GET /v1/cluster answered: $st"
}

start_groupkv_single() {
	local port peer
	pick_port port "$((GROUPKV_PORT_BASE + 100))"
	pick_port peer "$((port + 1))"
	spawn groupkv-single "$BIN" server --data-dir "$WORK/groupkv-single" \
		--listen "127.0.0.1:$port" --peer-listen "127.0.0.1:$peer" --log-level warn
	wait_until groupkv-single "$PID" http_ok "$port" /healthz
	GROUPKV_SINGLE_ADDR=127.0.0.1:$port
}

# ETCD_CLIENT_PORTS and ETCD_PEER_PORTS are picked at the first start and
# kept: a restarted member must listen where the cluster's membership says
# it does.
ETCD_CLIENT_PORTS=() ETCD_PEER_PORTS=()
start_etcd_cluster() {
	local i initial=() addrs=()
	ETCD_STARTS=$((${ETCD_STARTS:-0} + 1)) # each start its own logs
	if ((${#ETCD_CLIENT_PORTS[@]} == 0)); then
		for i in $(seq "$NODES"); do
			pick_port "ETCD_CLIENT_PORTS[$i]" "$((ETCD_PORT_BASE + 10 * (i - 1)))"
			pick_port "ETCD_PEER_PORTS[$i]" "$((ETCD_CLIENT_PORTS[i] + 1))"
		done
	fi
	local -a ports=("${ETCD_CLIENT_PORTS[@]}") peers=("${ETCD_PEER_PORTS[@]}")
	ports=("" "${ports[@]}") peers=("" "${peers[@]}") # indexed from 1, as the members
	for i in $(seq "$NODES"); do
		initial+=("etcd$i=http://127.0.0.1:${peers[$i]}")
		addrs+=("127.0.0.1:${ports[$i]}")
	done
	local cluster token
	cluster=$(
		IFS=,
		echo "${initial[*]}"
	)
	token=bench-cluster-$$-$RANDOM
	for i in $(seq "$NODES"); do
		spawn "etcd$i-$ETCD_STARTS" etcd --name "etcd$i" --data-dir "$WORK/etcd$i" \
			--listen-client-urls "http://127.0.0.1:${ports[$i]}" --advertise-client-urls "http://127.0.0.1:${ports[$i]}" \
			--listen-peer-urls "http://127.0.0.1:${peers[$i]}" --initial-advertise-peer-urls "http://127.0.0.1:${peers[$i]}" \
			--initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token "$token" \
			--logger zap --log-level error
		ETCD_PIDS[$i]=$PID
	done
	# /health answers 200 once the member sees a leader.
	for i in $(seq "$NODES"); do
		wait_until "etcd$i" "${ETCD_PIDS[$i]}" http_ok "${ports[$i]}" /health
	done
	ETCD_ADDRS=$(
		IFS=,
		echo "${addrs[*]}"
	)
	log "etcd cluster up: $ETCD_ADDRS"
}

# 3. The runs, one system at a time.
log "groupkv $GROUPKV_COMMIT, etcd $ETCD_VERSION"
start_groupkv_cluster
bench --target groupkv --addr "$GROUPKV_ADDRS" --replicas "$REPLICAS" --system-name groupkv-$NODES \
	--system-version "$GROUPKV_COMMIT"
# Where the benchmark's shards are and which node leads each, after the runs.
CLUSTER_STATUS=$("$BIN" cluster status --addr "${GROUPKV_ADDRS%%,*}" 2>&1) ||
	die "groupkv cluster status failed after the runs: $CLUSTER_STATUS"
CLUSTER_JSON=$(cluster_status "${GROUPKV_ADDRS%%,*}" || true)
printf '%s\n' "$CLUSTER_STATUS" >&2
stop_all

# etcd 3.4 copies its whole read buffer of not yet committed writes into
# every read, and the buffer never shrinks: after the burst of a load every
# read copies what the load wrote between two backend commits, and etcd
# serves reads several times slower until it restarts (etcd PR 12933, in
# 3.5). So the members are loaded (with a 1s run whose result is dropped),
# restarted on the same data, then measured.
start_etcd_cluster
OUT=$WORK/etcd-load.json DURATION=1s WARMUP=0s WORKLOADS=a bench --target etcd --addr "$ETCD_ADDRS" --system-name etcd-$NODES >/dev/null
stop_all
start_etcd_cluster
NO_LOAD=1 bench --target etcd --addr "$ETCD_ADDRS" --system-name etcd-$NODES
stop_all

start_groupkv_single
bench --target groupkv --addr "$GROUPKV_SINGLE_ADDR" --system-name groupkv-1 --system-version "$GROUPKV_COMMIT"
stop_all

# 4. Tables and docs.
REPORT=$("$BIN" bench report --in "$RESULTS" --baseline groupkv-$NODES)
printf '\n%s\n\n' "$REPORT"

# Shards of the benchmark's collection, with how many each node leads.
SHARDS=$(grep -o '"collection":"usertable","shard":[0-9]*,"replicas":\[[0-9,]*\],"leader":[0-9]*' <<<"$CLUSTER_JSON" || true)
NSHARDS=$(grep -c . <<<"$SHARDS" || true)
LEADS=$(sed -n 's/.*"leader":\([0-9]*\)$/\1/p' <<<"$SHARDS" | sort -n | uniq -c | awk '{printf "%snode %s: %s", sep, $2, $1; sep=", "}')
REPLICATED=$(grep -Ec '"replicas":\[[0-9]+,[0-9]+,[0-9]+\]' <<<"$SHARDS" || true)

elapsed=$(($(date +%s) - started))
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
CPU=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//' || true)
MEM=$(awk '/^MemTotal:/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)
INVOCATION="scripts/bench-cluster.sh"
for v in RECORDS VALUE_SIZE CLIENTS DURATION WARMUP WORKLOADS SEED REPLICAS; do
	# Name the settings that differ from the defaults.
	case $v in
	RECORDS) d=50000 ;; VALUE_SIZE) d=100 ;; CLIENTS) d=64 ;; DURATION) d=30s ;; WARMUP) d=5s ;;
	WORKLOADS) d=a,c ;; SEED) d=1 ;; REPLICAS) d=3 ;;
	esac
	[[ ${!v} == "$d" ]] || INVOCATION="$v=${!v} $INVOCATION"
done

SECTION=$WORK/section.md
cat >"$SECTION" <<EOF
## Three-node clusters: groupkv and etcd

Written by \`scripts/bench-cluster.sh\` on $(date -u +%Y-%m-%d) in ${elapsed}s (this
section only; rerun it rather than editing it). A three-node groupkv cluster
(\`groupkv-3\`) against a three-member etcd cluster (\`etcd-3\`) and a single
groupkv node (\`groupkv-1\`), the same workloads in the same run, one system
at a time. All three nodes of a cluster and the benchmark client share this
machine's cores and talk over loopback: replication here costs CPU, not
network round trips. Read the ratios, not the absolute figures.

| | |
|---|---|
| CPU | ${CPU:-unknown}, $(nproc) cores |
| memory | $MEM |
| kernel | $(uname -sr) ($(uname -m)) |
| load average (1, 5, 15 min) | $LOAD_BEFORE before the run, $LOAD_AFTER after it |
| Go | $(go env GOVERSION) |
| groupkv | $GROUPKV_COMMIT |
| etcd | $ETCD_VERSION (Debian etcd-server) |

Setup:

- \`groupkv-3\`: \`groupkv server --node-id 1\`, then nodes 2 and 3 with
  \`--join\` to node 1's peer address, each on a fresh data directory, at
  log level warn; the run starts once every node answers \`/healthz\` and
  \`GET /v1/cluster\` shows three healthy members. The benchmark's
  collection is created with \`--replicas $REPLICAS\`: $NSHARDS shards, $REPLICATED of them
  with a replica on each of the three nodes; after the runs their leaders
  were on ${LEADS:-(unknown)}.
- \`etcd-3\`: three members started together (\`--initial-cluster\`,
  fresh data directories), at log level error; loaded, then restarted on
  their data before the runs: etcd 3.4 copies its buffer of writes not yet
  committed to its backend into every read, and that buffer keeps the
  size the load's burst gave it until the process restarts (fixed in etcd
  3.5, PR 12933).
- \`groupkv-1\`: one \`groupkv server\`, as in the tables above.
- Durability: a write is acknowledged once it is fsynced on a quorum
  (groupkv: its raft entry, then applied; etcd: its WAL entry).
  Reads are linearizable in both (etcd's default \`Get\`): a read on a
  follower first asks the leader for its read index (raft's ReadIndex).
- Clients: $CLIENTS closed-loop clients spread over the nodes, client i
  talking to node i mod 3 only, through one gRPC connection per node
  (\`groupkv.Dial\`; \`clientv3\` with that member as its only endpoint); a
  node forwards writes to the shard's leader. YCSB workloads $WORKLOADS, $RECORDS
  records of $VALUE_SIZE bytes, zipfian keys, $WARMUP warm-up then $DURATION
  measured per workload, seed $SEED. The harness has no write-only workload:
  workload A (50% reads, 50% updates) carries the writes.

The command:

\`\`\`sh
$INVOCATION
\`\`\`

which ran:

\`\`\`sh
$(printf '%s\n' "${COMMANDS[@]}")
\`\`\`

$REPORT

The benchmark's shards after the runs (\`groupkv cluster status\`):

\`\`\`
$CLUSTER_STATUS
\`\`\`
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

log "wrote the cluster section of $OUT_MD in ${elapsed}s"
