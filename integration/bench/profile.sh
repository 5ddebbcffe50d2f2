#!/usr/bin/env bash
# CPU profile of sluice under closed-loop load (README "Benchmarks"), memory and Redis backend:
#
#   integration/bench/profile.sh            # perf (Debian linux-perf), cpu-clock sampling
#   PROFILER=callgrind integration/bench/profile.sh   # valgrind: instruction counts instead
#
# Writes OUT/profile-<backend>.txt (top functions by self and inclusive time) and, with perf,
# OUT/perf-<backend>.data for `perf report -i`.
# Starts its own redis-server on a free loopback port and stops everything it started.
set -euo pipefail
cd "$(dirname "$0")/../.."

OUT=${OUT:-target/bench/profile}
DURATION=${DURATION:-8}
PROFILER=${PROFILER:-perf}
BACKENDS=${BACKENDS:-memory redis}
mkdir -p "$OUT"
cargo build --release --locked --bin sluice --bin sluice-bench
SLUICE=target/release/sluice
BENCH=target/release/sluice-bench
TMP=$(mktemp -d)

started=()
cleanup() {
  local status=$?
  for pid in "${started[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${started[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$TMP"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

REDIS_PORT=$($BENCH free-port)
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$TMP" \
  --logfile "$TMP/redis.log" &
started+=($!)
for _ in $(seq 100); do
  redis-cli -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG && break
  sleep 0.1
done

for backend in $BACKENDS; do
  grpc=$($BENCH free-port)
  admin=$($BENCH free-port)
  args=(serve --config integration/bench/config --grpc-addr "127.0.0.1:$grpc"
    --admin-addr "127.0.0.1:$admin" --log-level warn --backend "$backend")
  [ "$backend" = redis ] && args+=(--redis-url "redis://127.0.0.1:$REDIS_PORT" --redis-timeout 1s)
  if [ "$PROFILER" = callgrind ]; then
    valgrind --tool=callgrind --callgrind-out-file="$TMP/callgrind.out" $SLUICE "${args[@]}" \
      >"$TMP/sluice.out" 2>"$TMP/sluice.err" &
  else
    $SLUICE "${args[@]}" >"$TMP/sluice.out" 2>"$TMP/sluice.err" &
  fi
  pid=$!
  started+=("$pid")
  for _ in $(seq 600); do grep -q "sluice ready" "$TMP/sluice.out" && break; sleep 0.1; done
  # Warm up first, so connection setup and the script load are not in the profile.
  $BENCH load --target "127.0.0.1:$grpc" --duration 1s --warmup 0s >/dev/null
  if [ "$PROFILER" = callgrind ]; then
    $BENCH load --target "127.0.0.1:$grpc" --duration "${DURATION}s" --warmup 0s --pid "sluice=$pid"
    kill "$pid"; wait "$pid" || true
    callgrind_annotate --inclusive=no "$TMP/callgrind.out" | head -60 >"$OUT/profile-$backend.txt"
    callgrind_annotate --inclusive=yes "$TMP/callgrind.out" | head -80 >>"$OUT/profile-$backend.txt"
  else
    perf record -F 1999 --call-graph dwarf,32768 -p "$pid" -o "$OUT/perf-$backend.data" -- sleep "$DURATION" \
      2>"$TMP/perf.err" &
    perf_pid=$!
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
    kill "$pid"; wait "$pid" || true
  fi
  echo "== $OUT/profile-$backend.txt"
done
