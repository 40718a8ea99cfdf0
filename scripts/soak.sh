#!/usr/bin/env bash
# soak.sh: a long run under load, to see that a cluster's footprint stays flat.
#
# Starts a dev cluster of its own (strandctl dev, in a temporary data dir on
# its own ports), publishes across STREAMS streams with strandctl bench for
# DURATION, and every EVERY seconds samples etcd's database size (etcdctl
# endpoint status) and each broker's resident memory (/proc/PID/status).
# At the end it prints the samples and two ratios: etcd's db size and the
# brokers' summed RSS at the end over their value at the first sample at or
# after FLAT_AFTER seconds (the warm-up: streams created, caches filled).
# docs/etcd.md says why the db size stays flat under compaction.
#
#   scripts/soak.sh                        # 30 minutes, 1,000 streams
#   DURATION=5m STREAMS=100 scripts/soak.sh
#
# Every loop is bounded: the sampler stops with the bench, the bench stops
# at DURATION (and its own --timeout per request), and the cluster is
# stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-30m}
STREAMS=${STREAMS:-1000}
INFLIGHT=${INFLIGHT:-256}
EVERY=${EVERY:-60}
FLAT_AFTER=${FLAT_AFTER:-300}
PORT_BASE=${PORT_BASE:-24379}
BIN=${BIN:-bin}
GO=${GO:-go}

dir=$(mktemp -d /tmp/strand-soak.XXXXXX)
echo "soak: data in $dir, $STREAMS streams, $INFLIGHT in flight, for $DURATION"
"$BIN/strandctl" dev --data-dir "$dir" --bin-dir "$BIN" --port-base "$PORT_BASE" >"$dir/dev.log" 2>&1 &
dev=$!
trap 'kill -INT $dev 2>/dev/null; wait $dev 2>/dev/null || true' EXIT

# Wait (bounded) until the dev cluster has written cluster.json and answers.
for _ in $(seq 1 120); do
	if [ -f "$dir/cluster.json" ] && "$BIN/strandctl" brokers --data-dir "$dir" >/dev/null 2>&1; then break; fi
	if ! kill -0 $dev 2>/dev/null; then echo "soak: dev exited"; cat "$dir/dev.log"; exit 1; fi
	sleep 1
done
"$BIN/strandctl" brokers --data-dir "$dir" >/dev/null

# The bench dials the running cluster (strandctl dev's ports: etcd on P,
# the controller on P+2, broker i on P+10+i).
etcd=http://127.0.0.1:$PORT_BASE
brokers=127.0.0.1:$((PORT_BASE + 11)),127.0.0.1:$((PORT_BASE + 12)),127.0.0.1:$((PORT_BASE + 13))
"$BIN/strandctl" bench --controller "127.0.0.1:$((PORT_BASE + 2))" --broker "$brokers" --streams "$STREAMS" --inflight "$INFLIGHT" \
	--duration "$DURATION" --etcd "$etcd" --json >"$dir/bench.json" 2>"$dir/bench.log" &
bench=$!

samples=$dir/samples.tsv
printf 'secs\tetcd_db_bytes\tbroker_rss_kib\tetcd_db_in_use_bytes\n' >"$samples"
start=$(date +%s)
while kill -0 $bench 2>/dev/null; do
	status=$($GO tool etcdctl --endpoints "$etcd" endpoint status -w fields 2>/dev/null || true)
	db=$(echo "$status" | awk -F: '/"DBSize"/ {gsub(/[ ,]/, "", $2); print $2}')
	# In use: what the live keys and their kept history take. The file
	# (DBSize) only ever grows until a defragmentation (docs/etcd.md).
	inuse=$(echo "$status" | awk -F: '/"DBSizeInUse"/ {gsub(/[ ,]/, "", $2); print $2}')
	rss=0
	for pid in $(pgrep -f "strand-broker.*$dir" || true); do
		kib=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)
		rss=$((rss + ${kib:-0}))
	done
	printf '%s\t%s\t%s\t%s\n' $(($(date +%s) - start)) "${db:-0}" "$rss" "${inuse:-0}" >>"$samples"
	# Sleep in one-second steps so the loop ends soon after the bench.
	for _ in $(seq 1 "$EVERY"); do kill -0 $bench 2>/dev/null || break; sleep 1; done
done
wait $bench || { echo "soak: bench failed"; tail -20 "$dir/bench.log"; exit 1; }

cat "$samples"
awk -v after="$FLAT_AFTER" 'NR > 1 {
	if (!base && $1 >= after) { db0 = $2; rss0 = $3; use0 = $4; base = 1 }
	db1 = $2; rss1 = $3; use1 = $4
} END {
	if (!base) { print "soak: no sample after the warm-up; run longer than FLAT_AFTER"; exit 1 }
	printf "etcd_db_ratio %.2f (end %d / at warm-up %d bytes)\n", db1 / db0, db1, db0
	if (use0 > 0) printf "etcd_db_in_use_ratio %.2f (end %d / at warm-up %d bytes)\n", use1 / use0, use1, use0
	printf "broker_rss_ratio %.2f (end %d / at warm-up %d KiB)\n", rss1 / rss0, rss1, rss0
}' "$samples"
echo "bench result: $dir/bench.json"
