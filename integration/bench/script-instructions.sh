#!/usr/bin/env bash
# Instructions redis-server spends per EVALSHA of a limit script (valgrind callgrind): Redis's
# own cost of one decision, independent of other load on the machine.
#
#   integration/bench/script-instructions.sh                 # lua/limit.lua, 1 and 4 keys
#   SRC=other.lua KEYS_PER_CALL="1 8" integration/bench/script-instructions.sh
#
# Runs a private redis-server under callgrind on a free loopback port (never 6379), loads the
# script, warms up, zeroes the counters, sends CALLS calls with redis-benchmark (8 clients,
# pipeline PIPELINE), dumps and divides. Every key is a token bucket with room to spare.
set -euo pipefail
cd "$(dirname "$0")/../.."
SRC=${SRC:-lua/limit.lua}
CALLS=${CALLS:-3000}
PIPELINE=${PIPELINE:-1}
KEYS_PER_CALL=${KEYS_PER_CALL:-1 4}
source integration/bench/script-common.sh
needs valgrind callgrind_control callgrind_annotate redis-server redis-cli redis-benchmark
for k in $KEYS_PER_CALL; do
  port=$(free_port)
  valgrind --tool=callgrind --callgrind-out-file="$TMP/cg.%p" redis-server --bind 127.0.0.1 \
    --port "$port" --save '' --appendonly no >/dev/null 2>&1 &
  pid=$!
  wait_for_redis "$port"
  sha=$(redis-cli -p "$port" script load "$(cat "$SRC")")
  args=()
  for i in $(seq "$k"); do args+=("{bench}k$i"); done
  args+=("" 0)
  for i in $(seq "$k"); do args+=(1 1000000 1000000 1000 1 0); done
  call=(-p "$port" -c 8 -P "$PIPELINE" evalsha "$sha" "$k" "${args[@]}")
  redis-cli -p "$port" evalsha "$sha" "$k" "${args[@]}" >/dev/null
  redis-benchmark -n 500 "${call[@]}" >/dev/null 2>&1
  callgrind_control -z "$pid" >/dev/null 2>&1
  redis-benchmark -n "$CALLS" "${call[@]}" >/dev/null 2>&1
  callgrind_control -d "$pid" >/dev/null 2>&1
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
  dump=$(ls "$TMP"/cg.*.1)
  total=$(callgrind_annotate "$dump" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
  printf '%s, %d key(s) per call, pipeline %d: %d instructions per call, %d per key\n' \
    "$SRC" "$k" "$PIPELINE" "$((total / CALLS))" "$((total / CALLS / k))"
  rm -f "$TMP"/cg.*
done
