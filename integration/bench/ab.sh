#!/usr/bin/env bash
# A/B of two sluice builds under h2load, interleaved so both see the same machine: for the memory
# and the Redis backend, A and B run side by side on the bench config and are loaded in turn
# (`h2load -c 16 -m 32` for DURATION, ROUNDS times each). A change is a loss only when B's peaks
# sit below A's across rounds, beyond the spread of A's own rounds. Beside each peak: the CPU the
# server (and, on Redis, redis-server) used per request over that run (/proc/PID/stat, warm-up
# included), which moves far less than the peak when other work shares the machine.
#
#   A=old/target/release/sluice B=target/release/sluice integration/bench/ab.sh
#   A=target/release/sluice B=target/release/sluice A_ARGS="--top-keys 0" integration/bench/ab.sh
#
# A_ARGS / B_ARGS: extra `serve` flags of each side (one build, two settings).
#
# BENCH (default target/release/sluice-bench) only finds free ports. Starts its own redis-server
# on a free loopback port (never 6379); stops every process it started.
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${A:?A=path to the first sluice binary}" "${B:?B=path to the second sluice binary}"
OUT=${OUT:-target/bench/ab}
ROUNDS=${ROUNDS:-3}
SLUICE=$A # set, so common.sh builds nothing
source integration/bench/h2common.sh
start_redis

echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
for backend in memory redis; do
  args=(--backend "$backend")
  [ "$backend" = redis ] && args+=(--redis-url "$REDIS_URL" --redis-timeout "$REDIS_TIMEOUT")
  # shellcheck disable=SC2086 # A_ARGS/B_ARGS are word lists
  SLUICE=$A start "a-$backend" integration/bench/config "${args[@]}" ${A_ARGS:-}
  addr_a=$ADDR pid_a=${started[-1]}
  # shellcheck disable=SC2086
  SLUICE=$B start "b-$backend" integration/bench/config "${args[@]}" ${B_ARGS:-}
  addr_b=$ADDR pid_b=${started[-1]}
  redis=
  [ "$backend" = redis ] && redis=$REDIS_PID
  check "$addr_a"
  check "$addr_b"
  for round in $(seq "$ROUNDS"); do
    for side in A B; do
      if [ $side = A ]; then addr=$addr_a pid=$pid_a; else addr=$addr_b pid=$pid_b; fi
      s0=$(cpu_ticks "$pid") r0=$(cpu_ticks "$redis")
      peak "$side-$backend-$round" "$addr"
      s1=$(cpu_ticks "$pid") r1=$(cpu_ticks "$redis")
      awk -v s=$((s1 - s0)) -v r=$((r1 - r0)) -v hz="$CLK_TCK" -v out="$OUT/$side-$backend-$round.peak.txt" -v redis="$redis" '
        BEGIN { while ((getline line < out) > 0) if (line ~ /^requests:/) { split(line, f, " "); n = f[2] }
                printf "%-14s server %.1f µs/req%s\n", "", s / hz * 1e6 / n, redis ? sprintf(", redis-server %.1f µs/req", r / hz * 1e6 / n) : "" }'
    done
  done
done
