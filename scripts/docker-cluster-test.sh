#!/usr/bin/env bash
# docker-cluster-test.sh runs a three-node groupkv cluster in Docker and
# checks that it replicates and survives the loss of a node:
#
#   1. builds the static binary and the image groupkv:test (Dockerfile; no
#      base image is pulled);
#   2. starts node1, then node2 and node3 joining it, as docker-compose.yml
#      describes (with `docker compose`, else `docker-compose`, else the same
#      containers with plain `docker run`), and waits for each /healthz and
#      for /v1/cluster to list three healthy nodes;
#   3. creates a collection with 3 replicas, writes a key through every node
#      and reads every key through every node;
#   4. cuts a node that does not lead the meta shard off the network
#      (`docker network disconnect`) and writes through the other two;
#   5. reconnects it and reads the latest values through it;
#   6. kills (`docker kill`) the meta shard's leader and writes and reads
#      through the two others.
#
# With TLS=1 the nodes serve both ports over TLS only (mutual TLS between
# them, client certificates asked for), with certificates made by `groupkv
# certs` for their network names (node1..node3) and 127.0.0.1, mounted
# read-only; the checks above run over HTTPS, and a request in the clear
# must be refused. With compose, TLS mode adds docker-compose.tls.yml.
#
# Every wait is bounded (WAIT seconds). Whatever the exit, the containers,
# the network and the volumes it made are removed; on failure it prints the
# nodes' logs and exits 1.
#
#   scripts/docker-cluster-test.sh
#   COMPOSE=plain WAIT=120 scripts/docker-cluster-test.sh
#   TLS=1 scripts/docker-cluster-test.sh
#
# Environment:
#   COMPOSE   "docker compose", "docker-compose" or "plain" (default: the
#             first of these that works)
#   IMAGE     image tag to build and run (default groupkv:test)
#   PORTS     host ports of the nodes' client API (default "27070 27080 27090",
#             off the defaults so that a local cluster does not clash)
#   WAIT      bound of each wait, in seconds (default 60)
#   PROJECT   compose project, prefix of the containers, network and volumes
#             (default groupkvtest<pid>)
#   TLS       1: the nodes serve TLS (see above; default 0)
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)

IMAGE=${IMAGE:-groupkv:test}
read -r -a PORT <<<"${PORTS:-27070 27080 27090}"
WAIT=${WAIT:-60}
PROJECT=${PROJECT:-groupkvtest$$}
TLS=${TLS:-0}
COLLECTION=dockertest

say() { echo "[$(date +%H:%M:%S)] $*"; }

FAILED=""
fail() {
	FAILED=1
	echo "FAIL: $*" >&2
	exit 1
}

for tool in docker go curl; do
	command -v "$tool" >/dev/null || fail "$tool is not installed"
done
docker info >/dev/null 2>&1 || fail "no Docker engine answers (docker info fails)"
if [[ ${#PORT[@]} -ne 3 ]]; then
	fail "PORTS must name 3 ports, not '${PORTS:-}'"
fi

if [[ -z ${COMPOSE:-} ]]; then
	if docker compose version >/dev/null 2>&1; then
		COMPOSE="docker compose"
	elif command -v docker-compose >/dev/null && docker-compose version >/dev/null 2>&1; then
		COMPOSE="docker-compose"
	else
		COMPOSE=plain
	fi
fi
case $COMPOSE in
"docker compose" | docker-compose | plain) ;;
*) fail "COMPOSE must be \"docker compose\", docker-compose or plain, not '$COMPOSE'" ;;
esac
COMPOSE_FILES=(-f "$ROOT/docker-compose.yml")
case $TLS in
0) ;;
1) COMPOSE_FILES+=(-f "$ROOT/docker-compose.tls.yml") ;;
*) fail "TLS must be 0 or 1, not '$TLS'" ;;
esac

TMP=$(mktemp -d "${TMPDIR:-/tmp}/groupkv-docker.XXXXXX")
NET="" # the cluster's network, known once node1 runs
declare -A CID=() # node number -> container id

compose() {
	# shellcheck disable=SC2086 # $COMPOSE is one or two words
	GROUPKV_IMAGE=$IMAGE GROUPKV_PORT1=${PORT[0]} GROUPKV_PORT2=${PORT[1]} GROUPKV_PORT3=${PORT[2]} \
		GROUPKV_CERTS=$TMP/certs $COMPOSE -p "$PROJECT" "${COMPOSE_FILES[@]}" "$@"
}

dump_logs() {
	local n
	for n in 1 2 3; do
		[[ -n ${CID[$n]:-} ]] || continue
		echo "----- node$n ($(docker inspect -f '{{.State.Status}}' "${CID[$n]}" 2>/dev/null || echo gone)): last lines of its log -----" >&2
		docker logs --tail 40 "${CID[$n]}" 2>&1 | sed 's/^/  /' >&2 || true
	done
}

cleanup() {
	local status=$?
	set +e
	if [[ $status -ne 0 ]]; then
		if [[ $status -eq 130 || $status -eq 143 ]]; then
			echo "FAIL: interrupted" >&2
		elif [[ -z $FAILED ]]; then
			echo "FAIL: a command failed with status $status (line ${LINENO_AT_ERR:-?})" >&2
		fi
		dump_logs
	fi
	say "cleaning up"
	if [[ $COMPOSE == plain ]]; then
		docker rm -f -v "$PROJECT-node1" "$PROJECT-node2" "$PROJECT-node3" >/dev/null 2>&1
		docker network rm "$PROJECT-net" >/dev/null 2>&1
		docker volume rm "$PROJECT-node1-data" "$PROJECT-node2-data" "$PROJECT-node3-data" >/dev/null 2>&1
	else
		compose down -v --remove-orphans -t 5 >/dev/null 2>&1
	fi
	rm -rf "$TMP"
	if [[ $status -eq 0 ]]; then
		say "PASS"
	fi
	exit "$status"
}
trap 'LINENO_AT_ERR=$LINENO' ERR
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------------------
# Build.

say "building the binary and the image $IMAGE"
mkdir -p "$TMP/context"
CGO_ENABLED=0 GOOS=linux go build -trimpath -o "$TMP/context/groupkv" ./cmd/groupkv
cp Dockerfile "$TMP/context/"
# The client below runs on this machine, whatever its OS.
CGO_ENABLED=0 go build -trimpath -o "$TMP/groupkv" ./cmd/groupkv
docker build -t "$IMAGE" "$TMP/context" >"$TMP/build.out" 2>&1 || {
	cat "$TMP/build.out" >&2
	fail "docker build failed"
}

# TLS: the certificates, the nodes' flags (paths in their containers) and
# the clients' (paths here).
NODE_TLS=()   # node N's flags, with N for the node's number
CURL_TLS=()   # curl's
CLIENT_TLS=() # the groupkv CLI's
SCHEME=http
if [[ $TLS == 1 ]]; then
	say "making a CA and certificates (groupkv certs)"
	mkdir -p "$TMP/certs"
	"$TMP/groupkv" certs ca --dir "$TMP/certs" >/dev/null
	for n in 1 2 3; do
		"$TMP/groupkv" certs issue "node$n" --dir "$TMP/certs" --host "node$n" --host 127.0.0.1 >/dev/null
	done
	"$TMP/groupkv" certs issue client --dir "$TMP/certs" >/dev/null
	# Keep in step with docker-compose.tls.yml.
	NODE_TLS=(--cert-file /certs/nodeN.crt --key-file /certs/nodeN.key
		--client-ca-file /certs/ca.crt --client-crl-file /certs/ca.crl
		--peer-cert-file /certs/nodeN.crt --peer-key-file /certs/nodeN.key
		--peer-ca-file /certs/ca.crt --peer-crl-file /certs/ca.crl)
	CURL_TLS=(--cacert "$TMP/certs/ca.crt" --cert "$TMP/certs/client.crt" --key "$TMP/certs/client.key")
	CLIENT_TLS=(--ca-file "$TMP/certs/ca.crt" --cert-file "$TMP/certs/client.crt" --key-file "$TMP/certs/client.key")
	SCHEME=https
fi

# ---------------------------------------------------------------------------
# Helpers.

# port N: the host port of node N's client API.
port() { echo "${PORT[$(($1 - 1))]}"; }

# start_node N: start node N (nodes 2 and 3 join node1) and record its container.
start_node() {
	local n=$1
	if [[ $COMPOSE == plain ]]; then
		# Keep in step with docker-compose.yml.
		local join=() tls=() mounts=()
		[[ $n -eq 1 ]] || join=(--join node1:7071)
		if [[ $TLS == 1 ]]; then
			tls=("${NODE_TLS[@]//nodeN/node$n}")
			mounts=(-v "$TMP/certs:/certs:ro")
		fi
		docker run -d --name "$PROJECT-node$n" --network "$PROJECT-net" --network-alias "node$n" \
			--restart on-failure -p "127.0.0.1:$(port "$n"):7070" -v "$PROJECT-node$n-data:/data" "${mounts[@]}" \
			"$IMAGE" server --node-id "$n" --data-dir /data --listen 0.0.0.0:7070 --peer-listen 0.0.0.0:7071 \
			--advertise-addr "node$n:7070" "${join[@]}" "${tls[@]}" >/dev/null
		CID[$n]=$PROJECT-node$n
	else
		compose up -d --no-build "node$n" >"$TMP/compose.out" 2>&1 || {
			cat "$TMP/compose.out" >&2
			fail "$COMPOSE up node$n failed"
		}
		CID[$n]=$(compose ps -q "node$n")
		[[ -n ${CID[$n]} ]] || fail "$COMPOSE ps finds no container for node$n"
	fi
	if [[ -z $NET ]]; then
		NET=$(docker inspect -f '{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{end}}' "${CID[$n]}")
		NET=${NET%% *}
	fi
}

# request METHOD N PATH [BODY]: one HTTP request to node N; sets CODE (000
# when there is no answer) and BODY.
request() {
	local method=$1 n=$2 path=$3
	local args=(-sS -m 5 -o "$TMP/body" -w '%{http_code}' -X "$method" "${CURL_TLS[@]}")
	[[ $# -lt 4 ]] || args+=(--data-binary "$4")
	rm -f "$TMP/body"
	CODE=$(curl "${args[@]}" "$SCHEME://127.0.0.1:$(port "$n")$path" 2>"$TMP/curl.err") || CODE=000
	BODY=$(cat "$TMP/body" 2>/dev/null || true)
	[[ $CODE != 000 ]] || BODY=$(cat "$TMP/curl.err")
}

# wait_healthy N: wait until node N's /healthz answers 200.
wait_healthy() {
	local n=$1 deadline=$((SECONDS + WAIT))
	while :; do
		request GET "$n" /healthz
		[[ $CODE != 200 ]] || return 0
		((SECONDS < deadline)) || fail "node$n: /healthz did not answer 200 within ${WAIT}s (last: $CODE $BODY)"
		sleep 0.5
	done
}

# status N: the cluster status table as node N sees it (empty if it fails).
status() { "$TMP/groupkv" cluster status --addr "127.0.0.1:$(port "$1")" "${CLIENT_TLS[@]}" 2>"$TMP/status.err" || true; }

# wait_nodes_healthy N: wait until node N lists three nodes, all healthy.
wait_nodes_healthy() {
	local n=$1 deadline=$((SECONDS + WAIT)) table healthy
	while :; do
		table=$(status "$n")
		healthy=$(awk '/^NODE /{s=1; next} /^$/{s=0} s && $4=="yes"{c++} END{print c+0}' <<<"$table")
		[[ $healthy -ne 3 ]] || return 0
		((SECONDS < deadline)) || fail "node$n does not list 3 healthy nodes within ${WAIT}s; it lists:
$table$(cat "$TMP/status.err")"
		sleep 0.5
	done
}

# meta_leader N: set LEADER to the id of the meta shard's leader as node N
# sees it, waiting until there is one.
meta_leader() {
	local n=$1 deadline=$((SECONDS + WAIT))
	while :; do
		LEADER=$(status "$n" | awk '$1=="(meta)"{print $4; exit}')
		if [[ $LEADER =~ ^[0-9]+$ && $LEADER -ge 1 && $LEADER -le 3 ]]; then
			return 0
		fi
		((SECONDS < deadline)) || fail "node$n names no leader of the meta shard within ${WAIT}s: $(status "$n")$(cat "$TMP/status.err")"
		sleep 0.5
	done
}

# put N KEY VALUE: write through node N, retrying answers that say "try
# again" (5xx, no answer) until WAIT has passed.
put() {
	local n=$1 key=$2 value=$3 deadline=$((SECONDS + WAIT))
	while :; do
		request PUT "$n" "/v1/kv/$COLLECTION/$key" "$value"
		[[ $CODE != 200 ]] || return 0
		[[ $CODE == 000 || $CODE == 5* ]] || fail "put $key=$value through node$n: $CODE $BODY"
		((SECONDS < deadline)) || fail "put $key=$value through node$n not done within ${WAIT}s (last: $CODE $BODY)"
		sleep 0.3
	done
}

# get N KEY WANT: read through node N until it answers WANT or WAIT has passed.
get() {
	local n=$1 key=$2 want=$3 deadline=$((SECONDS + WAIT))
	while :; do
		request GET "$n" "/v1/kv/$COLLECTION/$key"
		[[ $CODE != 200 || $BODY != "$want" ]] || return 0
		((SECONDS < deadline)) || fail "get $key through node$n: want '$want', got $CODE '$BODY' after ${WAIT}s"
		sleep 0.3
	done
}

# ---------------------------------------------------------------------------
# Start the cluster.

say "starting 3 nodes ($COMPOSE mode, project $PROJECT, host ports ${PORT[*]})"
if [[ $COMPOSE == plain ]]; then
	docker network create "$PROJECT-net" >/dev/null
fi
for n in 1 2 3; do
	start_node "$n"
	wait_healthy "$n"
	say "node$n is healthy"
done
for n in 1 2 3; do
	wait_nodes_healthy "$n"
done
say "every node lists 3 healthy nodes"
# The meta shard gains its three voters a moment after the nodes are
# healthy; losing a node before that would leave it without a quorum.
deadline=$((SECONDS + WAIT))
until curl -s "${CURL_TLS[@]}" "$SCHEME://127.0.0.1:$(port 1)/v1/cluster" | tr -d ' \n' | grep -q '"collection":"","shard":1,[^}]*"voters":\[[0-9]*,[0-9]*,[0-9]*\]'; do
	((SECONDS < deadline)) || fail "the meta shard has not got three voters within ${WAIT}s"
	sleep 0.5
done
say "the meta shard has three voters"
if [[ $TLS == 1 ]]; then
	# In the clear, the client port answers 400; a client without a
	# certificate is refused.
	code=$(curl -s -m 5 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$(port 1)/healthz" || true)
	[[ $code == 400 ]] || fail "a request in the clear to node1's TLS port: $code, want 400"
	if curl -s -m 5 -o /dev/null --cacert "$TMP/certs/ca.crt" "https://127.0.0.1:$(port 1)/healthz"; then
		fail "node1 served a client without a certificate"
	fi
	say "the nodes serve TLS only, to clients with certificates"
fi

# ---------------------------------------------------------------------------
# Replication.

deadline=$((SECONDS + WAIT))
while :; do
	request POST 1 /v1/collections "{\"name\": \"$COLLECTION\", \"replicas\": 3}"
	[[ $CODE != 200 ]] || break
	# A retry after a lost answer may find the collection made.
	[[ $CODE != 409 ]] || break
	[[ $CODE == 000 || $CODE == 5* ]] || fail "create collection: $CODE $BODY"
	((SECONDS < deadline)) || fail "create collection not done within ${WAIT}s (last: $CODE $BODY)"
	sleep 0.5
done
say "created collection $COLLECTION with 3 replicas"

for n in 1 2 3; do
	put "$n" "k$n" "v$n-via-node$n"
done
for n in 1 2 3; do
	for k in 1 2 3; do
		get "$n" "k$k" "v$k-via-node$k"
	done
done
say "each node reads what every node wrote"

# ---------------------------------------------------------------------------
# Partition a node that does not lead the meta shard.

meta_leader 1
leader=$LEADER
victim=3
[[ $leader -ne 3 ]] || victim=2
others=()
for n in 1 2 3; do
	[[ $n -eq $victim ]] || others+=("$n")
done
say "meta shard leader: node$leader; disconnecting node$victim from $NET"
docker network disconnect "$NET" "${CID[$victim]}"

for n in "${others[@]}"; do
	for k in 1 2 3; do
		put "$n" "k$k" "v$k-partitioned-via-node$n"
	done
	put "$n" "p$n" "p$n-partitioned"
done
last=${others[1]}
for n in "${others[@]}"; do
	for k in 1 2 3; do
		get "$n" "k$k" "v$k-partitioned-via-node$last"
	done
	for m in "${others[@]}"; do
		get "$n" "p$m" "p$m-partitioned"
	done
done
say "node${others[0]} and node${others[1]} serve writes and reads without node$victim"

say "reconnecting node$victim"
docker network connect --alias "node$victim" "$NET" "${CID[$victim]}"
wait_healthy "$victim"
for k in 1 2 3; do
	get "$victim" "k$k" "v$k-partitioned-via-node$last"
done
for m in "${others[@]}"; do
	get "$victim" "p$m" "p$m-partitioned"
done
put "$victim" "r$victim" "written-after-reconnect"
for n in 1 2 3; do
	get "$n" "r$victim" "written-after-reconnect"
done
say "node$victim caught up: it reads the latest values and serves writes"

# ---------------------------------------------------------------------------
# Kill the meta shard's leader.

meta_leader "$victim"
leader=$LEADER
survivors=()
for n in 1 2 3; do
	[[ $n -eq $leader ]] || survivors+=("$n")
done
say "killing node$leader, the meta shard's leader"
docker kill "${CID[$leader]}" >/dev/null

for n in "${survivors[@]}"; do
	for k in 1 2 3; do
		put "$n" "k$k" "v$k-after-kill-via-node$n"
	done
	put "$n" "x$n" "x$n-after-kill"
done
last=${survivors[1]}
for n in "${survivors[@]}"; do
	for k in 1 2 3; do
		get "$n" "k$k" "v$k-after-kill-via-node$last"
	done
	for m in "${survivors[@]}"; do
		get "$n" "x$m" "x$m-after-kill"
	done
done
say "node${survivors[0]} and node${survivors[1]} serve writes and reads without node$leader"
echo "cluster status as node${survivors[0]} sees it:"
status "${survivors[0]}" | sed 's/^/  /'
