#!/usr/bin/env bash
# Usage: compare.sh [pairs=3] [duration_s=16] [warmup_s=2]
#
# Strand against NATS JetStream on the same machine: alternates a NATS JetStream run
# (run.sh: 3 nodes, R3 file stream, sync_interval always, 1 KiB, 256 in
# flight) with `strandctl bench` (3 brokers, 3 copies, majority_durable,
# 1 KiB, 256 in flight), both with the same warm-up and measured duration,
# and prints each pair and Strand's throughput and p99 as ratios of NATS's.
# Needs bin/strandctl and the service binaries (make build).
set -euo pipefail
PAIRS=${1:-3}
DUR=${2:-16}
WARM=${3:-2}
ROOT=$(cd "$(dirname "$0")" && pwd)
STRANDCTL=$ROOT/../../bin/strandctl
[[ -x $STRANDCTL ]] || { echo "compare.sh: $STRANDCTL not found (make build)" >&2; exit 1; }

# field NAME JSON: the number after "NAME": in a one-line JSON object.
field() { grep -o "\"$1\":[0-9.]*" <<<"$2" | head -n1 | cut -d: -f2; }

for ((p = 1; p <= PAIRS; p++)); do
  nats=$("$ROOT/run.sh" 1 "$DUR" "$WARM" acb | tail -n1)
  work=$(mktemp -d)
  warm=()
  if [[ $WARM != 0 ]]; then warm=(--warmup "${WARM}s"); fi
  strand=$(cd "$work" && "$STRANDCTL" bench --duration "${DUR}s" "${warm[@]}" --json 2>/dev/null) || { rm -rf "$work"; echo "compare.sh: strandctl bench failed" >&2; exit 1; }
  rm -rf "$work"
  awk -v nr="$(field msgs_per_s "$nats")" -v np="$(field p99_ms "$nats")" \
      -v sr="$(field records_per_s "$strand")" -v sp="$(field confirm_p99_ms "$strand")" \
      -v sc="$(field broker_cpu_us_per_record "$strand")" -v sm="$(field broker_peak_rss_mb "$strand")" \
      'BEGIN { printf "NATS %.0f msgs/s p99 %.1f ms | Strand %.0f rec/s p99 %.1f ms (%.1f us CPU/rec, %.0f MB peak RSS) | throughput %.2fx, p99 %.2fx\n", nr, np, sr, sp, sc, sm, sr / nr, sp / np }'
done
