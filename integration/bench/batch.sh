#!/usr/bin/env bash
# Batching on the Redis backend (standalone): the h2load peak and the latency at a fixed load of
# sluice with --redis-max-batch 1 (one script call per request), 32 (keys) and the default
# (128 keys), alternating ROUNDS times on one redis-server, each with its script calls per request from
# Redis's own counters.
#
#   integration/bench/batch.sh        # needs h2load (apt-get install nghttp2-client) and curl
set -euo pipefail
cd "$(dirname "$0")/../.."

OUT=${OUT:-target/bench/batch}
ROUNDS=${ROUNDS:-2}
source integration/bench/h2common.sh
start_redis

start unbatched integration/bench/config --backend redis --redis-url "$REDIS_URL" \
  --redis-timeout "$REDIS_TIMEOUT" --redis-max-batch 1
ONE=$ADDR
start batch-32 integration/bench/config --backend redis --redis-url "$REDIS_URL" \
  --redis-timeout "$REDIS_TIMEOUT" --redis-max-batch 32
SOME=$ADDR
start batched integration/bench/config --backend redis --redis-url "$REDIS_URL" \
  --redis-timeout "$REDIS_TIMEOUT"
MANY=$ADDR

echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); $(h2load --version | head -1)"
for round in $(seq "$ROUNDS"); do
  for target in "max-batch-1 $ONE" "max-batch-32 $SOME" "max-batch-128 $MANY"; do
    read -r label addr <<<"$target"
    check "$addr"
    before=$(script_calls "$REDIS_PORT")
    peak "$label" "$addr"
    [ "$label" = max-batch-1 ] && ONE_PEAK=$PEAK
    calls=$(($(script_calls "$REDIS_PORT") - before))
    requests=$(awk '/^requests:/ { print $2; exit }' "$OUT/$label.peak.txt")
    awk -v c="$calls" -v r="$requests" -v l="$label" -v n="$round" \
      'BEGIN { printf "round %d %-14s script calls per request %.4f (warm-up included)\n", n, l, (r ? c / r : 0) }'
  done
done
# Latency at one fixed load both can carry: half the last unbatched peak.
HALF=$(awk -v p="$ONE_PEAK" 'BEGIN { print int(p / 2) }')
fixed max-batch-1 "$ONE" "$HALF" "$CLIENTS" 1
fixed max-batch-32 "$SOME" "$HALF" "$CLIENTS" 1
fixed max-batch-128 "$MANY" "$HALF" "$CLIENTS" 1
fixed max-batch-1 "$ONE" 1000 1 1
fixed max-batch-32 "$SOME" 1000 1 1
fixed max-batch-128 "$MANY" 1000 1 1
