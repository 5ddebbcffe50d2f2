#!/usr/bin/env bash
# CPU profile of sluice under closed-loop load (docs/benchmarks.md), memory and Redis backend:
#
#   integration/bench/profile.sh     # perf (Debian linux-perf), cpu-clock sampling, DWARF stacks
#
# Writes OUT/profile-<backend>.txt (top functions by self and inclusive time) and
# OUT/perf-<backend>.data for `perf report -i`. Instruction counts: instructions.sh.
# Starts its own redis-server on a free loopback port and stops everything it started.
set -euo pipefail
cd "$(dirname "$0")/../.."

OUT=${OUT:-target/bench/profile}
DURATION=${DURATION:-8}
BACKENDS=${BACKENDS:-memory redis}
mkdir -p "$OUT"
source integration/bench/common.sh
start_redis

for backend in $BACKENDS; do
  grpc=$($BENCH free-port)
  args=(serve --config integration/bench/config --grpc-addr "127.0.0.1:$grpc"
    --admin-addr 127.0.0.1:0 --log-level warn --backend "$backend")
  [ "$backend" = redis ] && args+=(--redis-url "$REDIS_URL" --redis-timeout 1s)
  $SLUICE "${args[@]}" >"$TMP/sluice.out" 2>"$TMP/sluice.out.err" &
  pid=$!
  started+=("$pid")
  wait_ready "$TMP/sluice.out" "sluice ready" "$pid"
  # Warm up first, so connection setup and the script load are not in the profile.
  $BENCH load --target "127.0.0.1:$grpc" --duration 1s --warmup 0s >/dev/null
  perf record -F 1999 --call-graph dwarf,32768 -p "$pid" -o "$OUT/perf-$backend.data" -- sleep "$DURATION" \
    2>"$TMP/perf.err" &
  perf_pid=$!
  started+=("$perf_pid")
  $BENCH load --target "127.0.0.1:$grpc" --duration "${DURATION}s" --warmup 0s --pid "sluice=$pid"
  wait "$perf_pid"
  {
    echo "# self time, top symbols ($backend backend)"
    perf report -i "$OUT/perf-$backend.data" --no-children --sort dso,symbol --stdio -g none 2>/dev/null \
      | grep -v '^#' | grep -v '^$' | sed -E 's/ +/ /g' | cut -c1-150 | head -60
    echo "# inclusive time (children), top symbols"
    perf report -i "$OUT/perf-$backend.data" --children --sort symbol --stdio -g none 2>/dev/null \
      | grep -v '^#' | grep -v '^$' | sed -E 's/ +/ /g' | cut -c1-150 | head -90
  } >"$OUT/profile-$backend.txt"
  stop "$pid"
  echo "== $OUT/profile-$backend.txt"
done
