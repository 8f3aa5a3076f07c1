# ab-lib.sh: what scripts/ab-*.sh share, sourced by them (not run). They
# set PORT before sourcing it; it makes WORK, a temporary directory removed
# on exit.
#
#   ab_start BIN DIR   starts "BIN server" on a fresh data directory under
#                      DIR (its log in DIR/server.log), on 127.0.0.1:PORT
#                      and PORT+1, waits until it answers /healthz, and
#                      sets AB_PID
#   ab_start_cluster BIN DIR
#                      starts a three-node "BIN cluster local" under DIR
#                      (its log in DIR/cluster.log) on PORT, PORT+10 and
#                      PORT+20 (and the ports above them), waits until its
#                      last node answers, and sets AB_PID
#   ab_start_nodes BIN DIR
#                      ab_start_cluster with NODES=3, else ab_start; sets
#                      AB_ADDR to the address(es) for --addr and AB_EXTRA
#                      to the bench flags the cluster needs (--replicas 3)
#   ab_stop            stops it
#   ab_wait URL WHAT   waits up to a minute for URL to answer, else says
#                      that WHAT did not start and fails

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

ab_start() {
	local bin=$1 dir=$2
	rm -rf "$dir" && mkdir -p "$dir"
	"$bin" server --data-dir "$dir/d" --listen 127.0.0.1:$PORT --peer-listen 127.0.0.1:$((PORT + 1)) --log-level warn ${SERVER_FLAGS:-} >"$dir/server.log" 2>&1 &
	AB_PID=$!
	ab_wait "http://127.0.0.1:$PORT/healthz" "the server of $bin (see $dir/server.log)"
}

ab_start_cluster() {
	local bin=$1 dir=$2
	rm -rf "$dir" && mkdir -p "$dir"
	"$bin" cluster local --nodes 3 --dir "$dir/c" --base-port "$PORT" >"$dir/cluster.log" 2>&1 &
	AB_PID=$!
	ab_wait "http://127.0.0.1:$((PORT + 20))/healthz" "the cluster of $bin (see $dir/cluster.log)"
}

ab_start_nodes() {
	AB_ADDR=127.0.0.1:$PORT AB_EXTRA=()
	if [ "${NODES:-1}" = 3 ]; then
		ab_start_cluster "$1" "$2"
		AB_ADDR=127.0.0.1:$PORT,127.0.0.1:$((PORT + 10)),127.0.0.1:$((PORT + 20))
		AB_EXTRA=(--replicas 3)
	else
		ab_start "$1" "$2"
	fi
}

ab_wait() {
	local url=$1 what=$2
	for _ in $(seq 600); do
		curl -sf "$url" >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	echo "ab: $what did not start" >&2
	return 1
}

ab_stop() {
	kill "$AB_PID" && wait "$AB_PID" 2>/dev/null || true
}
