#!/usr/bin/env bash
# Redis's own time per EVALSHA of a limit script (INFO commandstats usec_per_call), in the three
# shapes sluice sends: one request of one key; a batch of 32 requests on one hot key (one read,
# one write, 32 decisions); a batch of 32 requests on 32 fresh keys (a read and a write each).
#
#   integration/bench/script-time.sh                      # lua/limit.lua
#   SRCS="old.lua lua/limit.lua" ROUNDS=3 integration/bench/script-time.sh    # alternating A/B
#
# Wall-clock microseconds inside Redis, so it moves with the machine's other load: compare
# scripts alternated in one run. script-instructions.sh counts instructions instead.
# Runs a private redis-server on a free loopback port (never 6379); stops it on exit.
set -euo pipefail
cd "$(dirname "$0")/../.."
SRCS=${SRCS:-lua/limit.lua}
ROUNDS=${ROUNDS:-1}
CALLS=${CALLS:-100000}
source integration/bench/script-common.sh
needs redis-server redis-cli redis-benchmark
port=$(free_port)
redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no --dir "$TMP" >/dev/null 2>&1 &
pid=$!
wait_for_redis "$port"

# usec N ARGS...: Redis's µs per EVALSHA over N calls from 16 clients.
usec() {
  local n=$1
  shift
  redis-cli -p "$port" config resetstat >/dev/null
  redis-benchmark -p "$port" -n "$n" -r 100000000 -c 16 -q "$@" >/dev/null
  redis-cli -p "$port" info commandstats | awk -F'[:=,]' '/^cmdstat_evalsha:/ { print $7 }'
}
# batch SHA KEY_PATTERN: EVALSHA of 32 one-key requests (token buckets with room to spare).
batch() {
  local args=(EVALSHA "$1" 32) i
  for i in $(seq 32); do args+=("${2//@/$i}"); done
  args+=("" 0)
  for i in $(seq 32); do args+=("$([ "$i" = 1 ] && echo 1 || echo 17)" 1000000 1000000 1000 1 0); done
  usec $((CALLS / 5)) "${args[@]}"
}
printf '%-28s %14s %24s %26s\n' script "1 key (us)" "32 on one key (us/req)" "32 fresh keys (us/key)"
for round in $(seq "$ROUNDS"); do
  for src in $SRCS; do
    sha=$(redis-cli -p "$port" script load "$(cat "$src")")
    one=$(usec "$CALLS" EVALSHA "$sha" 1 hot "" 0 1 1000 1000 1000 1 0)
    hot=$(batch "$sha" hot)
    fresh=$(batch "$sha" "fresh@:__rand_int__")
    awk -v s="$src" -v o="$one" -v h="$hot" -v f="$fresh" \
      'BEGIN { printf "%-28s %14.2f %24.2f %26.2f\n", s, o, h / 32, f / 32 }'
  done
done
