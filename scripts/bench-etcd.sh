# bench-etcd.sh: the one-member etcd that scripts/bench-peers.sh and
# scripts/bench-txn.sh measure; sourced by them (not run). They define
# pick_port, wait_until, http_ok, WORK, PIDS and ETCD_PORT_BASE first.
#
#   start_etcd   starts etcd on $WORK/etcd-data, its log appended to
#                $WORK/etcd.log, waits until it answers /health, and sets
#                PID and ETCD_PORT. A restart listens on the ports of the
#                first start, where the member's record says it is.
#
# The scripts restart etcd between a load and the measured runs: etcd 3.4
# copies its whole read buffer of writes not yet committed to its backend
# into every read, and the buffer never shrinks, so after the burst of a
# load every read copies what the load wrote between two backend commits
# and etcd serves reads several times slower until it restarts (etcd PR
# 12933, in 3.5; Debian ships 3.4).

start_etcd() {
	if [[ -z ${ETCD_PORT:-} ]]; then
		pick_port ETCD_PORT "$ETCD_PORT_BASE"
		pick_port ETCD_PEER_PORT "$((ETCD_PORT + 10))"
	fi
	etcd --name bench --data-dir "$WORK/etcd-data" \
		--listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
		--listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
		--initial-cluster "bench=http://127.0.0.1:$ETCD_PEER_PORT" \
		--logger zap --log-level error >>"$WORK/etcd.log" 2>&1 &
	PID=$!
	PIDS+=("$PID")
	wait_until etcd "$PID" http_ok "$ETCD_PORT" /health
}
