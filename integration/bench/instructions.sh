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
source integration/bench/common.sh
start_redis

: >"$OUT/instructions.txt"
for target in noop memory redis; do
  grpc=$($BENCH free-port)
  case $target in
    noop) cmd=($BENCH noop --addr "127.0.0.1:$grpc") ;;
    *) cmd=($SLUICE serve --config integration/bench/config --grpc-addr "127.0.0.1:$grpc"
         --admin-addr 127.0.0.1:0 --log-level warn --backend "$target"
         --redis-url "$REDIS_URL" --redis-timeout 5s) ;;
  esac
  valgrind --tool=callgrind --callgrind-out-file="$OUT/callgrind.$target.%p" "${cmd[@]}" \
    >"$TMP/$target.out" 2>"$TMP/$target.err" &
  pid=$!
  started+=("$pid")
  wait_ready "$TMP/$target.out" "ready" "$pid"
  load=(--target "127.0.0.1:$grpc" --connections 4 --in-flight 8 --warmup 0s --timeout 30s)
  $BENCH load "${load[@]}" --requests 2000 >/dev/null
  callgrind_control -z "$pid" >/dev/null 2>&1
  $BENCH load "${load[@]}" --requests "$REQUESTS" >"$TMP/$target.load"
  callgrind_control -d "$pid" >/dev/null 2>&1
  stop "$pid"
  dump=$(ls "$OUT"/callgrind."$target"."$pid".*[0-9] | grep -v "\.$pid$" | head -1)
  total=$(callgrind_annotate "$dump" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
  {
    echo "== $target: $((total / REQUESTS)) instructions per request ($total over $REQUESTS requests)"
    callgrind_annotate "$dump" 2>/dev/null | grep -E "^ *[0-9,]+ " | grep -v -E "PROGRAM TOTALS|\((100\.0|99\.[0-9]+)%\)" | head -25 | cut -c1-180 || true
  } | tee -a "$OUT/instructions.txt"
done
