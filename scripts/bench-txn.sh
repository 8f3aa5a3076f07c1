#!/usr/bin/env bash
# bench-txn.sh measures groupkv's multi-key transactions against etcd's
# serializable STM and PostgreSQL's SERIALIZABLE transactions with the txn
# workload of "groupkv bench", on this machine, in one run, and writes its
# section of docs/benchmarks.md (between <!-- txn-bench:start --> and
# <!-- txn-bench:end -->, created above <!-- kept across runs --> when
# missing; the rest of the file is left as it is).
#
#   scripts/bench-txn.sh                          # the defaults below
#   KEYS=100000,1000 DURATION=20 scripts/bench-txn.sh
#   READS=batch scripts/bench-txn.sh              # its own section
#
# READS=batch reads a transaction's keys in one request instead of one at
# a time (groupkv bench --txn-reads batch; pgbench runs
# scripts/txn-batch.pgbench), and writes a section of its own (between
# <!-- txn-bench-batch:start --> and <!-- txn-bench-batch:end -->).
#
# Each transaction reads OPS distinct keys drawn uniformly from a range of
# KEYS keys and writes each back incremented, retried until it commits; the
# key range sets the contention. For each system in turn it starts a fresh
# server (a new data directory under a temporary directory, loopback ports
# off the systems' defaults), runs every key range, and stops it:
#
#   groupkv     transactions (and, as the baseline, the same reads and
#               writes without transactions) over gRPC when the server has
#               the /v1/txn endpoints, else on a node inside the benchmark
#               process (groupkv bench --embedded): see the docs section
#   etcd        concurrency.NewSTM with concurrency.Serializable
#   postgresql  BEGIN ISOLATION LEVEL SERIALIZABLE through pgx, and the same
#               transaction in pgbench (scripts/txn.pgbench, --max-tries=0)
#
# It installs etcd-server and postgresql with apt when they are missing.
# PostgreSQL runs as the postgres user when this script runs as root, with
# fsync=on and synchronous_commit=on. Everything it started is stopped on
# exit, whatever the exit.
set -euo pipefail

cd "$(dirname "$0")/.."

KEYS=${KEYS:-10000000,100000,10000,1000}
OPS=${OPS:-10}
CLIENTS=${CLIENTS:-64}
DURATION=${DURATION:-15} # seconds measured per run
WARMUP=${WARMUP:-3}      # seconds of warm-up before each
SEED=${SEED:-1}
LOAD_MAX=${LOAD_MAX:-1000000} # larger key ranges start empty (absent = 0)
OUT_MD=${OUT_MD:-docs/benchmarks.md}
READS=${READS:-each}
KEEP_TMP=${KEEP_TMP:-}

GROUPKV_PORT_BASE=${GROUPKV_PORT_BASE:-27170}
ETCD_PORT_BASE=${ETCD_PORT_BASE:-23890}
PG_PORT_BASE=${PG_PORT_BASE:-25432}

START_MARK='<!-- txn-bench:start -->'
END_MARK='<!-- txn-bench:end -->'
PGB_SCRIPT=scripts/txn.pgbench
case $READS in
each) ;;
batch)
	START_MARK='<!-- txn-bench-batch:start -->'
	END_MARK='<!-- txn-bench-batch:end -->'
	PGB_SCRIPT=scripts/txn-batch.pgbench
	;;
*)
	echo "bench-txn: READS=$READS: use each or batch" >&2
	exit 2
	;;
esac
KEPT_MARK='<!-- kept across runs -->'

started=$(date +%s)
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
log() { printf '%s bench-txn: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/groupkv-bench-txn.XXXXXX")
PGDIR=
PIDS=()
PG_STARTED=

cleanup() {
	local status=$?
	for pid in "${PIDS[@]}"; do
		stop_pid "$pid"
	done
	[[ -n $PG_STARTED ]] && stop_postgres
	if [[ -n $KEEP_TMP || $status -ne 0 ]]; then
		# A failed run keeps what its error names.
		log "kept $WORK ${PGDIR:+and $PGDIR}"
	else
		rm -rf "$WORK"
		[[ -n $PGDIR ]] && rm -rf "$PGDIR"
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

forget_pid() {
	local keep=() p
	for p in "${PIDS[@]}"; do
		[[ $p == "$1" ]] || keep+=("$p")
	done
	PIDS=("${keep[@]}")
}

# http_ok PORT PATH: whether GET http://127.0.0.1:PORT/PATH answers 200.
http_ok() {
	(
		exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
		printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$2" >&3
		IFS= read -r -t 2 line <&3 && [[ $line == *" 200 "* ]]
	) 2>/dev/null
}

# txn_http_ok PORT: whether the groupkv server at PORT begins a transaction
# on POST /v1/txn (the attempt it begins expires unused).
txn_http_ok() {
	(
		exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
		body='{"isolation": "serializable"}'
		printf 'POST /v1/txn HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s' "${#body}" "$body" >&3
		IFS= read -r -t 5 line <&3 && [[ $line == *" 200 "* ]]
	) 2>/dev/null
}

PICKED=" "
pick_port() {
	local p=$2
	while [[ $PICKED == *" $p "* ]] || (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; do
		p=$((p + 1))
	done
	PICKED+="$p "
	printf -v "$1" %d "$p"
}

wait_until() {
	local name=$1 pid=$2
	shift 2
	for _ in $(seq 600); do
		kill -0 "$pid" 2>/dev/null || die "$name exited during start-up; its log: $WORK/$name.log"
		if "$@"; then
			sleep 0.2
			kill -0 "$pid" 2>/dev/null || die "$name exited during start-up; its log: $WORK/$name.log"
			return 0
		fi
		sleep 0.1
	done
	die "$name is not ready after 60s; its log: $WORK/$name.log"
}

pg_bindir() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1; }

# 1. Peers.
missing=()
command -v etcd >/dev/null || missing+=(etcd-server)
{ [[ -n $(pg_bindir) ]] && [[ -x $(pg_bindir)/initdb ]] && command -v pgbench >/dev/null; } || missing+=(postgresql)
if ((${#missing[@]})); then
	SUDO=
	[[ $(id -u) -eq 0 ]] || SUDO=sudo
	log "installing ${missing[*]} with apt"
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
command -v etcd >/dev/null || die "no etcd binary after installing etcd-server"
PGBIN=$(pg_bindir)
[[ -x $PGBIN/initdb ]] || die "no initdb under /usr/lib/postgresql/*/bin after installing postgresql"
command -v pgbench >/dev/null || die "no pgbench after installing postgresql"
pgbench --help | grep -q -- --max-tries || die "this pgbench has no --max-tries (PostgreSQL 15 or later needed)"
[[ -n ${INSTALL_ONLY:-} ]] && exit 0

# 2. groupkv.
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

# bench ARGS...: runs groupkv bench with the common settings and records the
# command line (temporary directories as $WORK and $PGDIR).
bench() {
	local cmd=(groupkv bench --workload txn "$@" --txn-ops "$OPS" --txn-reads "$READS" --txn-load-max "$LOAD_MAX" --clients "$CLIENTS"
		--duration "${DURATION}s" --warmup "${WARMUP}s" --seed "$SEED" --out "${OUT:-$RESULTS}")
	record "${cmd[@]}"
	log "${cmd[*]}"
	"$BIN" "${cmd[@]:1}"
}

record() {
	local line
	line=$(printf '%s ' "$@" | sed -e "s|$WORK|\$WORK|g" -e "s| $||")
	[[ -n $PGDIR ]] && line=${line//$PGDIR/\$PGDIR}
	COMMANDS+=("$line")
}

stop_server() {
	stop_pid "$PID"
	forget_pid "$PID"
}

# 3. groupkv: over HTTP if the server has the transaction endpoints, else
# in this process.
pick_port GROUPKV_PORT "$GROUPKV_PORT_BASE"
pick_port GROUPKV_PEER_PORT "$((GROUPKV_PORT + 1))"
"$BIN" server --data-dir "$WORK/groupkv-data" --listen "127.0.0.1:$GROUPKV_PORT" \
	--peer-listen "127.0.0.1:$GROUPKV_PEER_PORT" --log-level warn >"$WORK/groupkv.log" 2>&1 &
PID=$!
PIDS+=("$PID")
wait_until groupkv "$PID" http_ok "$GROUPKV_PORT" /healthz
if txn_http_ok "$GROUPKV_PORT"; then
	GROUPKV_MODE=http
	log "groupkv $GROUPKV_COMMIT: transactions over HTTP on 127.0.0.1:$GROUPKV_PORT"
	bench --target groupkv --addr "127.0.0.1:$GROUPKV_PORT" --txn-keys "$KEYS" --txn-mode serializable,none \
		--load --system-version "$GROUPKV_COMMIT"
	stop_server
else
	GROUPKV_MODE=embedded
	stop_server
	log "groupkv $GROUPKV_COMMIT: the server has no /v1/txn endpoints; running a node in the benchmark process"
	bench --target groupkv --embedded "$WORK/groupkv-embedded" --txn-keys "$KEYS" --txn-mode serializable,none \
		--load --system-version "$GROUPKV_COMMIT"
fi

# 4. etcd, one key range at a time: a loaded range is loaded (with a 1s run
# whose result is dropped), etcd restarted on the same data (why: see
# bench-etcd.sh), then measured.
. "$(dirname "$0")/bench-etcd.sh" # start_etcd
IFS=, read -r -a KEY_LIST <<<"$KEYS"
start_etcd
for k in "${KEY_LIST[@]}"; do
	if ((k <= LOAD_MAX)); then
		OUT=$WORK/etcd-load.json DURATION=1 WARMUP=0 bench --target etcd --addr "127.0.0.1:$ETCD_PORT" --txn-keys "$k" --txn-mode serializable --load >/dev/null
		stop_server
		start_etcd
		bench --target etcd --addr "127.0.0.1:$ETCD_PORT" --txn-keys "$k" --txn-mode serializable
	else
		bench --target etcd --addr "127.0.0.1:$ETCD_PORT" --txn-keys "$k" --txn-mode serializable --load
	fi
done
stop_server

# 5. PostgreSQL, as the postgres user when we are root (it refuses root).
PGDIR=$(mktemp -d "${TMPDIR:-/tmp}/groupkv-bench-pg.XXXXXX")
AS_PG=()
if [[ $(id -u) -eq 0 ]]; then
	id postgres >/dev/null 2>&1 || die "running as root and there is no postgres user to run PostgreSQL as"
	chmod 755 "$PGDIR"
	chown postgres: "$PGDIR"
	AS_PG=(runuser -u postgres --)
fi
stop_postgres() {
	"${AS_PG[@]}" "$PGBIN/pg_ctl" -D "$PGDIR/data" -m fast -w stop >/dev/null 2>&1 || true
	PG_STARTED=
}
pick_port PG_PORT "$PG_PORT_BASE"
"${AS_PG[@]}" "$PGBIN/initdb" -D "$PGDIR/data" -U postgres --auth=trust -E UTF8 --no-instructions >"$WORK/initdb.log" 2>&1 ||
	die "initdb failed; its log: $WORK/initdb.log"
PG_OPTS="-p $PG_PORT -k $PGDIR -c listen_addresses=127.0.0.1 -c fsync=on -c synchronous_commit=on -c max_connections=200"
PG_STARTED=1
"${AS_PG[@]}" "$PGBIN/pg_ctl" -D "$PGDIR/data" -l "$PGDIR/postgresql.log" -w -t 60 -o "$PG_OPTS" start >/dev/null ||
	die "PostgreSQL did not start; its log: $PGDIR/postgresql.log"
PG_VERSION=$("$PGBIN/postgres" --version | awk '{print $3}')
DSN="postgres://postgres@127.0.0.1:$PG_PORT/postgres?sslmode=disable"
for k in "${KEY_LIST[@]}"; do
	bench --target postgresql --addr "$DSN" --txn-keys "$k" --txn-mode serializable --load
	PGB=(env PGOPTIONS="-c enable_seqscan=off" pgbench -n -f "$PGB_SCRIPT" -D "keys=$k" -c "$CLIENTS" -j "$(nproc)" -T "$((WARMUP + DURATION))"
		--max-tries=0 --random-seed="$SEED" -l --log-prefix="$WORK/pgbench-log-$k" -h 127.0.0.1 -p "$PG_PORT" -U postgres postgres)
	record PGOPTIONS="'-c enable_seqscan=off'" "${PGB[@]:2}"
	log "${PGB[*]}"
	"${PGB[@]}" >"$WORK/pgbench-out-$k.txt" 2>&1 || die "pgbench failed; its output: $WORK/pgbench-out-$k.txt"
	grep -E '^(tps|number of (transactions|failed|transactions retried)|total number of retries|latency average)' "$WORK/pgbench-out-$k.txt" >&2 || true
	IMPORT=(groupkv bench pgbench --txn-keys "$k" --txn-ops "$OPS" --txn-load-max "$LOAD_MAX" --clients "$CLIENTS"
		--warmup "${WARMUP}s" --duration "${DURATION}s" --seed "$SEED" --system-version "$PG_VERSION" --out "$RESULTS")
	record "${IMPORT[@]}" "\$WORK/pgbench-log-$k.*"
	"$BIN" "${IMPORT[@]:1}" "$WORK/pgbench-log-$k".*
done
stop_postgres

# 6. Tables and docs.
REPORT=$("$BIN" bench report --in "$RESULTS")
printf '\n%s\n\n' "$REPORT"

elapsed=$(($(date +%s) - started))
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
CPU=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//' || true)
MEM=$(awk '/^MemTotal:/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)
INVOCATION="scripts/bench-txn.sh"
for v in KEYS OPS CLIENTS DURATION WARMUP SEED LOAD_MAX READS; do
	case $v in
	KEYS) d=10000000,100000,10000,1000 ;; OPS) d=10 ;; CLIENTS) d=64 ;; DURATION) d=15 ;; WARMUP) d=3 ;;
	SEED) d=1 ;; LOAD_MAX) d=1000000 ;; READS) d=each ;;
	esac
	[[ ${!v} == "$d" ]] || INVOCATION="$v=${!v} $INVOCATION"
done
if [[ $GROUPKV_MODE == embedded ]]; then
	GROUPKV_HOW="in the benchmark process (\`groupkv bench --embedded\`): the
  server of this tree has no HTTP transaction endpoints (\`POST /v1/txn\`)
  yet, so groupkv's side ran on a node inside the benchmark process, through
  the same driver code (\`kv.TxnBackend\`) the HTTP client implements, with no
  network and no encoding between client and node, while etcd and
  PostgreSQL were reached over loopback TCP. This favours groupkv: its
  ratios to the peers are upper bounds of what the server over HTTP would
  show. Its ratio to its own non-transactional mode is like for like (both
  in process)."
else
	GROUPKV_HOW="a server on 127.0.0.1, transactions over its gRPC
  transaction RPCs (one connection; the gets and the commits as messages
  of its Pipeline stream, the attempts' writes kept in the client until
  the commit), the non-transactional baseline by the Go client's gets and
  puts over gRPC (on the Pipeline stream too)."
fi

# Only the load before the run tells of other work: the runs themselves
# (64 clients, pgbench's threads) keep the load above the cores.
BUSY=
if awk -v a="${LOAD_BEFORE%% *}" -v n="$(nproc)" 'BEGIN { exit !(a > n / 2) }'; then
	BUSY="
**The machine was busy with other work when this run began** (load
average above half its $(nproc) cores, see above): the systems ran one after the other,
each under whatever else ran at the time, so the absolute figures and the
ratios between systems are noisy; rerun on an idle machine before reading
much into a ratio near a goal's threshold.
"
fi

TITLE="Transactions: groupkv, etcd STM and PostgreSQL SERIALIZABLE"
READS_HOW=
if [[ $READS == batch ]]; then
	TITLE="Transactions with their reads in one request: groupkv, etcd STM and PostgreSQL SERIALIZABLE"
	READS_HOW="
**Reads in one request** (\`READS=batch\`, \`--txn-reads batch\`): each
transaction reads its $OPS keys in one request, as a transaction that
knows its keys up front would: groupkv's \`Tx.BatchGetForUpdate\` (one
message of the Pipeline stream; the node locks each shard's keys in one
request and confirms the attempt once), one \`Get\` of the $OPS keys of
etcd's STM (which fetches them all in one Txn), one \`SELECT … WHERE k =
ANY(\$1)\` for PostgreSQL through pgx and one SELECT of $OPS subqueries in
\`scripts/txn-batch.pgbench\`; the baseline (\"none\") reads with one
batch get. The writes, the commits and everything else are as in the
section above, where each read is a request of its own.
"
fi
SECTION=$WORK/section.md
cat >"$SECTION" <<EOF
## $TITLE

Written by \`scripts/bench-txn.sh\` on $(date -u +%Y-%m-%d) in ${elapsed}s (this
section only; rerun it rather than editing it). One run on one machine, the
servers and the benchmark client sharing its cores: read the ratios, not the
absolute figures.
$BUSY$READS_HOW
Each transaction reads $OPS distinct keys drawn uniformly from a range of
KEYS keys, then writes each back incremented (a read-modify-write of every
key it read), and is retried until it commits; commits/s and the latency of
a committed transaction (from its first attempt's start to its commit,
retries included) are measured over $CLIENTS closed-loop clients, ${WARMUP}s of
warm-up then ${DURATION}s measured per cell. The key range sets the contention:
on 10,000,000 keys two transactions practically never meet; on 1,000 keys
they often do.

| | |
|---|---|
| CPU | ${CPU:-unknown}, $(nproc) cores |
| memory | $MEM |
| kernel | $(uname -sr) ($(uname -m)) |
| load average (1, 5, 15 min) | $LOAD_BEFORE before the run, $LOAD_AFTER after it |
| Go | $(go env GOVERSION) |
| groupkv | $GROUPKV_COMMIT |
| etcd | $(etcd --version | awk '/etcd Version/ {print $3}') (Debian etcd-server), client go.etcd.io/etcd/client/v3 $(go list -m -f '{{.Version}}' go.etcd.io/etcd/client/v3) |
| PostgreSQL | $PG_VERSION (Debian postgresql), client github.com/jackc/pgx/v5 $(go list -m -f '{{.Version}}' github.com/jackc/pgx/v5) and $(pgbench --version) |

Setup:

- groupkv ran $GROUPKV_HOW
  Serializable transactions (two-phase locking with wound-wait); each read
  is a \`GetForUpdate\` (it locks the key for the write that follows, as a
  groupkv user would read in a read-modify-write); an attempt
  aborted with \`txn_aborted\` is retried with \`RetryOf\`, keeping its
  priority. The baseline ("none") runs the same $OPS gets then $OPS puts one by
  one, outside transactions.
- etcd: one member on a fresh data directory, \`concurrency.NewSTM\` with
  \`concurrency.WithIsolation(concurrency.Serializable)\`; each read is a
  Get, the writes go in the commit's Txn, which fails (and the STM runs the
  function again) when a key read has changed. After loading a key range
  etcd is restarted on its data before it is measured: etcd 3.4 copies its
  buffer of writes not yet committed to its backend into every read, and
  that buffer keeps the size the load's burst gave it until the process
  restarts (fixed in etcd 3.5, PR 12933); loaded and not restarted, etcd's
  STM committed about 25 transactions/s at 100,000 keys instead of several
  hundred.
- PostgreSQL reads with plain SELECTs under SERIALIZABLE (its SSI needs no
  locks to be serializable; \`SELECT … FOR UPDATE\` over keys taken in random
  order would deadlock, and each deadlock waits \`deadlock_timeout\`, 1 s,
  before it is broken).
- PostgreSQL: a fresh cluster (initdb) on 127.0.0.1, fsync=on,
  synchronous_commit=on, a table \`txn (k text primary key, v bytea)\`
  with fillfactor 50 (room on each page for an update to stay there, a
  HOT update that adds no index entry: loaded full, the table's updates
  added entries to the index whose pages the serializable reads lock,
  and about 9 of 10 attempts failed at 10,000 keys);
  each transaction is \`BEGIN ISOLATION LEVEL SERIALIZABLE\`, $OPS SELECTs,
  $OPS \`INSERT … ON CONFLICT DO UPDATE\`, COMMIT, retried on SQLSTATE 40001
  (and 40P01). Measured twice: by \`groupkv bench\` through pgx (one pooled
  connection per client, prepared statements), and by PostgreSQL's own
  pgbench running \`scripts/txn.pgbench\` with \`--max-tries=0\` (retry until
  it commits), its per-transaction log read by \`groupkv bench pgbench\`.
  Both run with \`enable_seqscan=off\`, so that every read is an index
  scan of the primary key, as on a large table with statistics: a
  sequential scan (which the planner may pick on a table just loaded or
  still filling) takes a relation-level SIREAD lock that makes every pair
  of serializable transactions conflict.
  pgbench draws one key from each tenth of the range (visited in random
  order) instead of 10 distinct keys from the whole range: every key is as
  likely and two transactions share as many keys on average.
- Retries: \`groupkv bench\` waits a random time of up to min(attempt-1, 10) ms
  before each retry, the same for the three systems; pgbench retries at once.
- Key ranges up to $LOAD_MAX keys are loaded before the runs (every value 0);
  a larger range (10,000,000 keys) starts empty and fills as it is written,
  a read of an absent key counting as 0 (loading ten million keys into each
  system takes longer than the whole benchmark).
  Such a range is not like a loaded one for every system: etcd answers the
  read of an absent key from its in-memory index without reading its
  backend, PostgreSQL's table and index grow during the run, and groupkv
  writes new keys. The loaded ranges compare like for like.
- The goals table is \`groupkv bench report\`'s reading of the results:
  "low contention" is every range of 100,000 keys or more, PostgreSQL's
  rate the faster of its two measurements.
- "Uncontended" is groupkv's transactional rate on the largest key range.
- Durability: groupkv acknowledges a commit once its raft entries are
  fsynced, etcd once its WAL is fsynced, PostgreSQL once its WAL is flushed.

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

log "wrote the txn section of $OUT_MD in ${elapsed}s"
