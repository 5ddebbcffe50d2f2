#!/usr/bin/env bash
# The gRPC floor measured with h2load (nghttp2's HTTP/2 load tool, written in C): sluice-bench
# costs 15–18 µs of CPU per call and caps near 30k calls/s on this machine, below what the
# servers can answer; h2load costs far less, so the peaks here are the servers'.
#
#   integration/bench/h2load.sh        # needs h2load (apt-get install nghttp2-client) and curl
#
# Drives two no-op servers (one on a multi-threaded runtime with tokio's LIFO slot off,
# src/runtime.rs's build_with; one, noop-tokio, on tokio's defaults, as a plain tonic server
# runs), sluice (memory backend),
# sluice (Redis backend, on two serving threads and on one: --worker-threads 1) and sluice (Redis
# backend, `lease: 100`: integration/bench/config-lease) with one gRPC
# ShouldRateLimit request (domain bench, k=v1: the bench config's roomy rule, so every answer is
# an OK decision) at `h2load -c 16 -m 32` for DURATION, then at half of each peak (--rps per
# client; 16 × 32 and 16 × 1) and at 1,000/s on one connection for the p50/p90/p99 from
# h2load's per-request log; then the Redis script floor
# (redis-benchmark EVALSHA of lua/limit.lua at the same 512 in flight, -P 1 and -P 16). Before
# loading, each target's answer to that exact body is checked with curl: HTTP 200,
# grpc-status 0 in the trailers and overall_code OK in the message, so the figures are
# decisions, not errors. Starts its own redis-server on a free loopback port (never 6379);
# stops every process it started.
set -euo pipefail
cd "$(dirname "$0")/../.."

OUT=${OUT:-target/bench/h2load}
EXTRA_TOOLS=redis-benchmark
source integration/bench/h2common.sh
start_redis

NOOP_PORT=$($BENCH free-port)
$BENCH noop --addr "127.0.0.1:$NOOP_PORT" >"$TMP/noop.out" 2>&1 &
started+=("$!")
wait_ready "$TMP/noop.out" "noop ready" "$!"
NOOP_TOKIO_PORT=$($BENCH free-port)
$BENCH --tokio-lifo-slot noop --addr "127.0.0.1:$NOOP_TOKIO_PORT" >"$TMP/noop-tokio.out" 2>&1 &
started+=("$!")
wait_ready "$TMP/noop-tokio.out" "noop ready" "$!"
start memory integration/bench/config --backend memory
MEM_ADDR=$ADDR
start redis integration/bench/config --backend redis --redis-url "$REDIS_URL" --redis-timeout "$REDIS_TIMEOUT"
RED_ADDR=$ADDR
# One worker: on a machine whose cores the load and Redis share, fewer cross-thread wake-ups.
start redis-1w integration/bench/config --backend redis --redis-url "$REDIS_URL" \
  --redis-timeout "$REDIS_TIMEOUT" --worker-threads 1
RED1_ADDR=$ADDR
# The same Redis backend with `lease: 100` on the rule (integration/bench/config-lease).
start lease integration/bench/config-lease --backend redis --redis-url "$REDIS_URL" \
  --redis-timeout "$REDIS_TIMEOUT"
LEASE_ADDR=$ADDR

echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); $(h2load --version | head -1)"
declare -A PEAKS
# Script calls per request of each target's peak run, from Redis's own command counters.
for target in "noop 127.0.0.1:$NOOP_PORT" "noop-tokio 127.0.0.1:$NOOP_TOKIO_PORT" "memory $MEM_ADDR" \
  "redis $RED_ADDR" "redis-1w $RED1_ADDR" "lease $LEASE_ADDR"; do
  read -r label addr <<<"$target"
  check "$addr"
  before=$(script_calls "$REDIS_PORT")
  peak "$label" "$addr"
  calls=$(($(script_calls "$REDIS_PORT") - before))
  requests=$(awk '/^requests:/ { print $2; exit }' "$OUT/$label.peak.txt")
  awk -v c="$calls" -v r="$requests" -v l="$label" \
    'BEGIN { printf "%-14s script calls per request %.4f (%d calls, warm-up included; %d measured requests)\n", l, (r ? c / r : 0), c, r }'
  PEAKS[$label]=$PEAK
  half "$label" "$addr"
  # The latency floor: 1,000 calls/s on one connection, one at a time.
  fixed "$label" "$addr" 1000 1 1
  check "$addr"
done

echo "== Redis floor: lua/limit.lua by EVALSHA at $((CLIENTS * STREAMS)) in flight"
$BENCH redis-floor --redis-url "$REDIS_URL" --in-flight "$((CLIENTS * STREAMS))" --pipelines 1,16 \
  --sockets 1 --duration "${DURATION}s" --json "$OUT/floor.json" | tee "$OUT/floor.txt"
floor() { # floor P: calls/s of redis-benchmark -P P
  awk -v p="-P $1:" '$0 ~ p { for (i = 1; i <= NF; i++) if ($i ~ /\/s$/) { sub("/s", "", $i); print $i; exit } }' "$OUT/floor.txt"
}
P1=$(floor 1)
P16=$(floor 16)
echo "== ratios (h2load -c $CLIENTS -m $STREAMS)"
awk -v n="${PEAKS[noop]}" -v t="${PEAKS[noop-tokio]}" -v m="${PEAKS[memory]}" -v r="${PEAKS[redis]}" \
  -v r1="${PEAKS[redis-1w]}" -v l="${PEAKS[lease]}" -v p1="$P1" -v p16="$P16" 'BEGIN {
  printf "%-30s %14s %14s\n", "", "/ no-op", "/ no-op-tokio"
  printf "%-30s %14.2f %14.2f  (target >= 0.85)\n", "memory", m / n, m / t
  printf "%-30s %14.2f %14.2f  (target >= 0.4)\n", "redis", r / n, r / t
  printf "%-30s %14.2f %14.2f  (target >= 0.4)\n", "redis, 1 worker", r1 / n, r1 / t
  printf "%-30s %14.2f %14.2f  (target >= 0.7)\n", "lease 100", l / n, l / t
  printf "no-op / no-op-tokio %.2f (what the LIFO slot costs a server that does nothing)\n", n / t
  printf "redis / redis-benchmark -P 1  %.2f, 1 worker %.2f (target >= 0.7)\n", r / p1, r1 / p1
  printf "redis / redis-benchmark -P 16 %.2f, 1 worker %.2f\n", r / p16, r1 / p16
}' | tee "$OUT/ratios.txt"
