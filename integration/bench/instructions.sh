#!/usr/bin/env bash
# Instructions per request (valgrind callgrind), for the no-op server and sluice on the memory and
# the Redis backend: a cost that, unlike time, other work on a shared machine does not change.
#
#   integration/bench/instructions.sh          # REQUESTS=20000 after a warm-up, 4 × 8 in flight
#
# Counters are zeroed after the warm-up (callgrind_control -z) and dumped after the measured
# requests (-d), so start-up is not counted. Prints Ir/request and the top functions; writes
# OUT/instructions.txt. Starts its own redis-server on a free loopback port; stops all it started.
set -euo pipefail
cd "$(dirname "$0")/../.."

OUT=${OUT:-target/bench/instructions}
REQUESTS=${REQUESTS:-20000}
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

: >"$OUT/instructions.txt"
for target in noop memory redis; do
  grpc=$($BENCH free-port)
  case $target in
    noop) cmd=($BENCH noop --addr "127.0.0.1:$grpc") ;;
    *) cmd=($SLUICE serve --config integration/bench/config --grpc-addr "127.0.0.1:$grpc"
         --admin-addr 127.0.0.1:0 --log-level warn --backend "$target"
         --redis-url "redis://127.0.0.1:$REDIS_PORT" --redis-timeout 5s) ;;
  esac
  valgrind --tool=callgrind --callgrind-out-file="$OUT/callgrind.$target.%p" "${cmd[@]}" \
    >"$TMP/$target.out" 2>"$TMP/$target.err" &
  pid=$!
  started+=("$pid")
  for _ in $(seq 600); do grep -q "ready" "$TMP/$target.out" && break; sleep 0.1; done
  load=(--target "127.0.0.1:$grpc" --connections 4 --in-flight 8 --warmup 0s --timeout 30s)
  $BENCH load "${load[@]}" --requests 2000 >/dev/null
  callgrind_control -z "$pid" >/dev/null 2>&1
  $BENCH load "${load[@]}" --requests "$REQUESTS" >"$TMP/$target.load"
  callgrind_control -d "$pid" >/dev/null 2>&1
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  dump=$(ls "$OUT"/callgrind."$target"."$pid".*[0-9] | grep -v "\.$pid$" | head -1)
  total=$(callgrind_annotate "$dump" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
  {
    echo "== $target: $((total / REQUESTS)) instructions per request ($total over $REQUESTS requests)"
    callgrind_annotate "$dump" 2>/dev/null | grep -E "^ *[0-9,]+ " | grep -v -E "PROGRAM TOTALS|\((100\.0|99\.[0-9]+)%\)" | head -25 | cut -c1-180
  } | tee -a "$OUT/instructions.txt"
done
