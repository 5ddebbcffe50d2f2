#!/usr/bin/env bash
# RLQS (StreamRateLimitQuotas) against RLS (ShouldRateLimit) on the same build, config and
# machine: how many proxy requests one sluice governs per CPU-second each way.
#
#   integration/bench/rlqs.sh        # needs h2load (apt-get install nghttp2-client), curl, jq
#
# For the memory backend and then the Redis backend (a redis-server it starts on a free loopback
# port, never 6379), starts a release sluice on integration/bench/config and drives it with
# `sluice-bench rlqs` in each of SHAPES — S streams (data planes, one connection each) reporting
# B bucket ids `tenant=t<n>` (the config's 1,000,000/s rule: every share is a token bucket) with
# PER_REPORT requests per bucket per report, every INTERVAL like Envoy's `reporting_interval` or
# back to back ("flood": as fast as HTTP/2 flow control lets reports through) — then with
# `h2load -c 16 -m 32` on ShouldRateLimit (k=v1, answered OK; checked with curl first), reading
# the CPU of sluice and redis-server from /proc around every run. Prints one table; every line
# and JSON report is kept in OUT. Stops every process it started.
#
# A shape is name:streams:buckets:interval[:distinct] (interval `flood`: back to back; `distinct`:
# each stream its own bucket ids instead of the same B for all).
set -euo pipefail
cd "$(dirname "$0")/../.."

OUT=${OUT:-target/bench/rlqs}
DURATION=${DURATION:-10} # seconds measured, each RLQS shape and each h2load peak
WARMUP=${WARMUP:-3}
PER_REPORT=${PER_REPORT:-1000}
SHAPES=${SHAPES:-envoy:16:100:1s envoy-wide:16:2000:1s flood:16:100:flood flood-distinct:16:100:flood:distinct}
EXTRA_TOOLS=jq
source integration/bench/h2common.sh
CLK_TCK=$(getconf CLK_TCK)
start_redis

# start_sluice NAME ARGS...: sets SLUICE_PID, SLUICE_ADDR and SLUICE_ADMIN.
start_sluice() {
  local name=$1 grpc
  shift
  grpc=$($BENCH free-port)
  # Gone before the start, so the ready line waited for is this process's.
  rm -f "$TMP/$name.out"
  SLUICE_ADMIN=127.0.0.1:$($BENCH free-port)
  $SLUICE serve --config integration/bench/config --grpc-addr "127.0.0.1:$grpc" \
    --admin-addr "$SLUICE_ADMIN" --log-level warn "$@" >"$TMP/$name.out" 2>&1 &
  SLUICE_PID=$!
  started+=("$SLUICE_PID")
  wait_ready "$TMP/$name.out" "sluice ready" "$SLUICE_PID"
  SLUICE_ADDR=127.0.0.1:$grpc
}

# cpu_s PID: CPU seconds (user + system) the process has used (fields 14 and 15 of stat(5),
# counted after the command name, which may hold spaces).
cpu_s() {
  sed 's/.*) //' "/proc/$1/stat" | awk -v hz="$CLK_TCK" '{ printf "%.2f", ($12 + $13) / hz }'
}

ROWS=$OUT/table.tsv
: >"$ROWS"
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at the start" | tee "$OUT/run.txt"
for backend in memory redis; do
  args=(--backend "$backend")
  probe=()
  if [ "$backend" = redis ]; then
    args+=(--redis-url "$REDIS_URL" --redis-timeout "$REDIS_TIMEOUT")
    probe=(--pid "redis=$REDIS_PID" --redis-url "$REDIS_URL")
  fi
  redis-cli -p "$REDIS_PORT" flushall >/dev/null
  # RLS: h2load's peak on a fresh sluice of the same build and config, CPU read around it.
  start_sluice "$backend-rls" "${args[@]}"
  check "$SLUICE_ADDR"
  s0=$(cpu_s "$SLUICE_PID")
  r0=$(cpu_s "$REDIS_PID")
  peak "$backend-rls" "$SLUICE_ADDR" >"$TMP/peak.line"
  tee -a "$OUT/run.txt" <"$TMP/peak.line"
  s1=$(cpu_s "$SLUICE_PID")
  r1=$(cpu_s "$REDIS_PID")
  check "$SLUICE_ADDR"
  awk -v b="$backend" -v peak="$PEAK" -v s="$(awk -v a="$s0" -v z="$s1" 'BEGIN { print z - a }')" \
    -v r="$(awk -v a="$r0" -v z="$r1" 'BEGIN { print z - a }')" -v d="$DURATION" -v w="$WARMUP" \
    -v la="$(cut -d' ' -f1 /proc/loadavg)" 'BEGIN {
    # CPU was read around warm-up + measurement; the requests of both at the peak rate.
    n = peak * (d + w)
    printf "%s\tRLS h2load -c %d -m %d\t–\t–\t%.0f\t–\t%.0f\t%.2f\t%.2f\t%.0f\t%s\t%s\t%s\n", b, 16, 32, peak, peak,
      s / (d + w), s * 1e6 / n, n / s, (b == "redis" ? sprintf("%.0f", n / (s + r)) : "–"), "–", la
  }' >>"$ROWS"
  stop "$SLUICE_PID"
  for shape in $SHAPES; do
    # A fresh sluice (and an empty Redis) per run: no run inherits another's pools, debt or
    # breaker state.
    redis-cli -p "$REDIS_PORT" flushall >/dev/null
    IFS=: read -r name streams buckets interval distinct <<<"$shape"
    start_sluice "$backend-$name" "${args[@]}"
    flags=(--streams "$streams" --buckets "$buckets" --per-report "$PER_REPORT")
    [ "$interval" = flood ] || flags+=(--interval "$interval")
    [ "${distinct:-}" = distinct ] && flags+=(--distinct-buckets)
    json=$OUT/$backend-$name.json
    $BENCH rlqs --target "$SLUICE_ADDR" --admin "$SLUICE_ADMIN" "${flags[@]}" \
      --duration "${DURATION}s" --warmup "${WARMUP}s" --pid "sluice=$SLUICE_PID" "${probe[@]}" \
      --label "$backend $name" --json "$json" | tee -a "$OUT/run.txt"
    jq -r --arg b "$backend" --arg n "$name" '[$b, "RLQS " + $n,
        "\(.streams)×\(.buckets_per_stream)\(if .distinct_bucket_ids > .buckets_per_stream then " distinct" else "" end)",
        (if .interval_s then "\(.interval_s) s" else "flood" end),
        (.bucket_reports_per_s | round), (.assignments_per_s | round), (.covered_rps | round),
        (.cpu.sluice.cores * 100 | round / 100), (.cpu.sluice.us_per_request * 100 | round / 100),
        (.covered_per_cpu_s.sluice | round),
        (if .cpu.redis then (.covered_rps * .duration_s / (.cpu.sluice.seconds + .cpu.redis.seconds) | round) else "–" end),
        .unassigned, (.loadavg_1m)] | @tsv' "$json" >>"$ROWS"
    breaker=$(grep -c "circuit breaker open" "$TMP/$backend-$name.out" || true)
    [ "$breaker" = 0 ] || echo "  $backend $name: the Redis circuit breaker opened $breaker time(s) (push calls timed out)" | tee -a "$OUT/run.txt"
    stop "$SLUICE_PID"
  done
done
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at the end" | tee -a "$OUT/run.txt"

{
  printf 'backend\trun\tstreams×buckets\tinterval\tbucket-reports/s (RLS: decisions/s)\tassignments/s\tcovered req/s (%s per bucket-report)\tsluice cores\tsluice µs per bucket-report (RLS: per request)\tcovered req per sluice CPU-s\tper sluice+Redis CPU-s\tunassigned at the end\tload 1m\n' "$PER_REPORT"
  cat "$ROWS"
} | column -t -s $'\t' | tee "$OUT/table.txt"
