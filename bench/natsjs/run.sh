#!/usr/bin/env bash
# The NATS JetStream side of `make bench-nats`: a 3-node
# JetStream cluster, an R3 file stream with sync_interval: always, 1 KiB
# messages, 256 in flight. Compare with `strandctl bench --duration 16s
# --warmup 2s` run right before or after it on the same machine (make
# bench-nats runs both, alternating).
#
# Usage: run.sh [runs=1] [duration_s=10] [warmup_s=2] [mode=acb]
#
# For each run: start a fresh 3-node nats-server JetStream cluster on
# 127.0.0.1 (client 14222-14224, cluster 16222-16224, monitor 18222-18224),
# wait (bounded) for a meta leader, run the publisher, print its JSON line,
# then stop the servers and remove their data dirs. Every wait is bounded.
set -euo pipefail

RUNS=${1:-1}
DUR=${2:-10}
WARM=${3:-2}
MODE=${4:-acb}

ROOT=$(cd "$(dirname "$0")" && pwd)
BIN=$ROOT/.bin
DATA=${TMPDIR:-/tmp}/strand-natsjs
export PATH=/usr/local/go/bin:$PATH

READY_TIMEOUT=${READY_TIMEOUT:-30}   # s to wait for a meta leader
STOP_TIMEOUT=${STOP_TIMEOUT:-10}     # s to wait for graceful server exit
PORT_TIMEOUT=${PORT_TIMEOUT:-10}     # s to wait for ports to be free

log() { echo "[run.sh] $*" >&2; }

# Build binaries if missing.
if [[ ! -x $BIN/nats-server ]]; then
  log "building nats-server"
  (cd "$ROOT" && timeout 600 go build -o "$BIN/nats-server" github.com/nats-io/nats-server/v2)
fi
if [[ ! -x $BIN/pub || $ROOT/main.go -nt $BIN/pub ]]; then
  log "building pub"
  (cd "$ROOT" && timeout 300 go build -o "$BIN/pub" .)
fi

PIDS=()
RUNDIR=""

stop_servers() {
  local pid
  for pid in "${PIDS[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  local deadline=$((SECONDS + STOP_TIMEOUT))
  for pid in "${PIDS[@]}"; do
    while kill -0 "$pid" 2>/dev/null && (( SECONDS < deadline )); do
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      log "server pid $pid did not exit in ${STOP_TIMEOUT}s; SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true   # reaps our own child; it is dead by now
  done
  PIDS=()
  if [[ -n $RUNDIR && -d $RUNDIR ]]; then
    rm -rf "$RUNDIR"
  fi
  RUNDIR=""
}
trap stop_servers EXIT
trap 'exit 130' INT TERM

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_ports_free() {
  local deadline=$((SECONDS + PORT_TIMEOUT)) p busy
  while :; do
    busy=""
    for p in 14222 14223 14224 16222 16223 16224 18222 18223 18224; do
      if port_busy "$p"; then busy="$busy $p"; fi
    done
    [[ -z $busy ]] && return 0
    if (( SECONDS >= deadline )); then
      log "ports still in use:$busy"
      return 1
    fi
    sleep 0.2
  done
}

dump_logs() {
  local i
  for i in 1 2 3; do
    if [[ -f $RUNDIR/n$i.log ]]; then
      log "---- tail n$i.log ----"
      tail -n 20 "$RUNDIR/n$i.log" >&2 || true
    fi
  done
}

start_cluster() {
  mkdir -p "$DATA"
  RUNDIR=$(mktemp -d "$DATA/run.XXXXXX")
  local i
  for i in 1 2 3; do
    mkdir -p "$RUNDIR/n$i/store"
    cat >"$RUNDIR/n$i.conf" <<EOF
server_name: n$i
listen: 127.0.0.1:$((14221 + i))
http: 127.0.0.1:$((18221 + i))
jetstream {
  store_dir: "$RUNDIR/n$i/store"
  sync_interval: always
}
cluster {
  name: bench
  listen: 127.0.0.1:$((16221 + i))
  routes: [
    nats-route://127.0.0.1:16222
    nats-route://127.0.0.1:16223
    nats-route://127.0.0.1:16224
  ]
}
EOF
    "$BIN/nats-server" -c "$RUNDIR/n$i.conf" -l "$RUNDIR/n$i.log" </dev/null >/dev/null 2>&1 &
    PIDS+=($!)
  done
}

# Ready when every node's /healthz?js-enabled-only=true is ok and every node
# reports the same non-empty meta leader in /jsz.
wait_ready() {
  local deadline=$((SECONDS + READY_TIMEOUT)) i leaders l ok pid
  while (( SECONDS < deadline )); do
    for pid in "${PIDS[@]}"; do
      if ! kill -0 "$pid" 2>/dev/null; then
        log "a nats-server exited during startup"
        return 1
      fi
    done
    ok=1; leaders=""
    for i in 1 2 3; do
      if ! curl -fsS -m 1 "http://127.0.0.1:$((18221 + i))/healthz?js-enabled-only=true" >/dev/null 2>&1; then
        ok=0; break
      fi
      l=$(curl -fsS -m 1 "http://127.0.0.1:$((18221 + i))/jsz" 2>/dev/null \
          | tr -d '\n' | grep -o '"meta_cluster": *{[^}]*' \
          | grep -o '"leader": *"[^"]*"' | head -n1 | sed 's/.*"\([^"]*\)"$/\1/') || true
      if [[ -z $l ]]; then ok=0; break; fi
      leaders="$leaders $l"
    done
    if (( ok )) && [[ $(echo $leaders | tr ' ' '\n' | sort -u | wc -l) -eq 1 ]]; then
      log "meta leader:$(echo $leaders | cut -d' ' -f1) ($((READY_TIMEOUT - (deadline - SECONDS)))s)"
      return 0
    fi
    sleep 0.2
  done
  log "cluster not ready within ${READY_TIMEOUT}s"
  return 1
}

PUB_TIMEOUT=$((DUR + WARM + 90))  # setup 30 + drain 10 + margin
rc=0
for ((r = 1; r <= RUNS; r++)); do
  log "run $r/$RUNS mode=$MODE duration=${DUR}s warmup=${WARM}s"
  wait_ports_free
  start_cluster
  if ! wait_ready; then
    dump_logs; stop_servers; rc=1; continue
  fi
  if ! timeout -k 5 "$PUB_TIMEOUT" "$BIN/pub" -mode "$MODE" \
      -duration "${DUR}s" -warmup "${WARM}s" -window 256 -size 1024; then
    log "publisher failed or timed out"
    dump_logs; rc=1
  fi
  stop_servers
done
exit $rc
