# ab-lib.sh: what scripts/ab-*.sh share, sourced by them (not run). They
# set PORT before sourcing it; it makes WORK, a temporary directory removed
# on exit.
#
#   ab_start BIN DIR   starts "BIN server" on a fresh data directory under
#                      DIR (its log in DIR/server.log), on 127.0.0.1:PORT
#                      and PORT+1, waits until it answers /healthz, and
#                      sets AB_PID
#   ab_stop            stops it

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

ab_start() {
	local bin=$1 dir=$2
	rm -rf "$dir" && mkdir -p "$dir"
	"$bin" server --data-dir "$dir/d" --listen 127.0.0.1:$PORT --peer-listen 127.0.0.1:$((PORT + 1)) --log-level warn >"$dir/server.log" 2>&1 &
	AB_PID=$!
	for _ in $(seq 100); do
		curl -sf "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	echo "ab: the server of $bin did not answer on 127.0.0.1:$PORT (see $dir/server.log)" >&2
	return 1
}

ab_stop() {
	kill "$AB_PID" && wait "$AB_PID" 2>/dev/null || true
}
