#!/usr/bin/env bash
# The benchmark run (docs/benchmarks.md): sluice beside its floors, in one run, on this machine.
#
#   integration/bench/run.sh            # peaks, ½-peak p99, sweeps, Redis floor, plot, summary
#   SCALING=1 integration/bench/run.sh  # also config size, live keys, memory per bucket
#   MAIN=0 SCALING=1 integration/bench/run.sh   # only the scaling part
#
# Starts its own redis-server on a free loopback port (never 6379), the no-op RLS server, and
# sluice twice (memory backend, Redis backend), all on 127.0.0.1; drives each with
# `sluice-bench` at CONNECTIONS × IN_FLIGHT (16 × 32, like `h2load -c 16 -m 32`); writes JSON and
# SVG to OUT; stops every process it started, also on error or Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/../.."

OUT=${OUT:-target/bench/latest}
CONNECTIONS=${CONNECTIONS:-16}
IN_FLIGHT=${IN_FLIGHT:-32}
DURATION=${DURATION:-10s}
POINT_DURATION=${POINT_DURATION:-5s}
WARMUP=${WARMUP:-2s}
FRACTIONS=${FRACTIONS:-0.1,0.25,0.5,0.75,0.9,1.0,1.2}
KEYS=${KEYS:-10000}
DISTRIBUTION=${DISTRIBUTION:-zipf:1.0}
SCALING=${SCALING:-0}
MAIN=${MAIN:-1} # 0: only the scaling part
SCALE_DURATION=${SCALE_DURATION:-5s}
SCALE_RULES=${SCALE_RULES:-10 100 1000 10000}
SCALE_KEYS=${SCALE_KEYS:-1 100 10000 1000000}
EQUAL_RATE=${EQUAL_RATE:-10000}
# sluice's default is 15ms; at 512 calls in flight on a shared 2-core machine queueing alone can
# exceed it, and a closed loop would then measure fast failures instead of decisions.
REDIS_TIMEOUT=${REDIS_TIMEOUT:-200ms}
FLOOR_REQUESTS=${FLOOR_REQUESTS:-500000}
FLOOR_DURATION=${FLOOR_DURATION:-5s}

for tool in redis-server redis-cli redis-benchmark; do
  command -v "$tool" >/dev/null || { echo "error: $tool not found (apt-get install redis-server)" >&2; exit 1; }
done

source integration/bench/common.sh
CONFIG=integration/bench/config
mkdir -p "$OUT"
start_redis

# start_sluice NAME ARGS...: sets SLUICE_PID and SLUICE_ADDR.
start_sluice() {
  local name=$1
  shift
  local grpc admin
  grpc=$($BENCH free-port)
  admin=$($BENCH free-port)
  $SLUICE serve --grpc-addr "127.0.0.1:$grpc" --admin-addr "127.0.0.1:$admin" --log-level warn \
    "$@" >"$TMP/$name.out" 2>"$TMP/$name.out.err" &
  SLUICE_PID=$!
  started+=("$SLUICE_PID")
  wait_ready "$TMP/$name.out" "sluice ready" "$SLUICE_PID"
  SLUICE_ADDR="127.0.0.1:$grpc"
}

NOOP_PORT=$($BENCH free-port)
$BENCH noop --addr "127.0.0.1:$NOOP_PORT" >"$TMP/noop.out" 2>&1 &
NOOP_PID=$!
started+=("$NOOP_PID")
wait_ready "$TMP/noop.out" "noop ready" "$NOOP_PID"

start_sluice memory --config "$CONFIG" --backend memory
MEM_PID=$SLUICE_PID MEM_ADDR=$SLUICE_ADDR
start_sluice redis --config "$CONFIG" --backend redis --redis-url "$REDIS_URL" \
  --redis-timeout "$REDIS_TIMEOUT"
RED_PID=$SLUICE_PID RED_ADDR=$SLUICE_ADDR

mix_args=(--connections "$CONNECTIONS" --in-flight "$IN_FLIGHT" --warmup "$WARMUP" --keys "$KEYS"
  --distribution "$DISTRIBUTION")
load_args=("${mix_args[@]}" --duration "$DURATION")
sweep() { # sweep LABEL ADDR ARGS...
  local label=$1 addr=$2
  shift 2
  echo "== $label ($addr)"
  $BENCH sweep --label "$label" --target "$addr" "${load_args[@]}" --fractions "$FRACTIONS" \
    --point-duration "$POINT_DURATION" --json "$OUT/$label.json" "$@"
}

echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), cpu pressure $(head -1 /proc/pressure/cpu 2>/dev/null); $(redis-server --version | cut -d' ' -f1-3)"
if [ "$MAIN" = 1 ]; then
sweep noop "127.0.0.1:$NOOP_PORT" --pid "noop=$NOOP_PID"
sweep memory "$MEM_ADDR" --pid "sluice=$MEM_PID"
sweep redis "$RED_ADDR" --pid "sluice=$RED_PID" --pid "redis=$REDIS_PID" --redis-url "$REDIS_URL"

echo "== CPU per request at one offered load for all three (open loop, $EQUAL_RATE/s)"
equal() { # equal LABEL ADDR ARGS...
  local label=$1 addr=$2
  shift 2
  printf '%-7s' "$label"
  $BENCH load --target "$addr" "${mix_args[@]}" --duration "$POINT_DURATION" --rate "$EQUAL_RATE" \
    --json "$OUT/equal-$label.json" "$@"
}
equal noop "127.0.0.1:$NOOP_PORT" --pid "noop=$NOOP_PID"
equal memory "$MEM_ADDR" --pid "sluice=$MEM_PID"
equal redis "$RED_ADDR" --pid "sluice=$RED_PID" --pid "redis=$REDIS_PID" --redis-url "$REDIS_URL"

echo "== Redis floor: lua/limit.lua by EVALSHA at $((CONNECTIONS * IN_FLIGHT)) in flight"
$BENCH redis-floor --redis-url "$REDIS_URL" --in-flight "$((CONNECTIONS * IN_FLIGHT))" \
  --keys "$KEYS" --requests "$FLOOR_REQUESTS" --duration "$FLOOR_DURATION" --json "$OUT/floor.json"

$BENCH plot --out "$OUT/sweep.svg" noop="$OUT/noop.json" memory="$OUT/memory.json" redis="$OUT/redis.json"
echo "== summary ($OUT/summary.json, plot $OUT/sweep.svg)"
$BENCH summary --noop "$OUT/noop.json" --memory "$OUT/memory.json" --redis "$OUT/redis.json" \
  --floor "$OUT/floor.json" --json "$OUT/summary.json"
fi

[ "$SCALING" = 1 ] || exit 0

# ---- Scaling: per-request cost vs config size and live keys; memory per bucket.
mkdir -p "$OUT/scaling"
stop "$MEM_PID"
stop "$RED_PID"
rss() { awk '/VmRSS/ {print $2 * 1024}' "/proc/$1/status"; }
scale_args=(--connections "$CONNECTIONS" --in-flight "$IN_FLIGHT" --duration "$SCALE_DURATION" --warmup 1s)

echo "== throughput vs config size (memory backend, uniform over the rules)"
for rules in $SCALE_RULES; do
  $BENCH gen-config --rules "$rules" --out "$TMP/rules-$rules.yaml"
  start_sluice "rules-$rules" --config "$TMP/rules-$rules.yaml" --backend memory
  printf 'rules=%-6s ' "$rules"
  $BENCH load --target "$SLUICE_ADDR" "${scale_args[@]}" --keys "$rules" --distribution uniform \
    --pid "sluice=$SLUICE_PID" --json "$OUT/scaling/rules-$rules.json"
  stop "$SLUICE_PID"
done

echo "== throughput vs live keys (memory backend; every key populated first)"
for keys in $SCALE_KEYS; do
  start_sluice "keys-$keys" --config "$CONFIG" --backend memory --memory-max-buckets 2000000
  # Baseline after connections and buffers exist (one key touched), so the delta is buckets.
  $BENCH load --target "$SLUICE_ADDR" --connections "$CONNECTIONS" --in-flight "$IN_FLIGHT" \
    --warmup 0s --requests 20000 --keys 1 --value-prefix base >/dev/null
  base=$(rss "$SLUICE_PID")
  $BENCH load --target "$SLUICE_ADDR" --connections "$CONNECTIONS" --in-flight "$IN_FLIGHT" \
    --warmup 0s --requests "$keys" --keys "$keys" --distribution sequential >/dev/null
  populated=$(rss "$SLUICE_PID")
  printf 'keys=%-8s ' "$keys"
  $BENCH load --target "$SLUICE_ADDR" "${scale_args[@]}" --keys "$keys" --distribution uniform \
    --pid "sluice=$SLUICE_PID" --json "$OUT/scaling/memory-keys-$keys.json"
  echo "           sluice RSS: $((base / 1024)) KiB at start, $((populated / 1024)) KiB with $keys live buckets: $(( (populated - base) / keys )) B/bucket"
  stop "$SLUICE_PID"
done

echo "== throughput vs live keys (Redis backend)"
start_sluice redis-keys --config "$CONFIG" --backend redis --redis-url "$REDIS_URL" \
  --redis-timeout "$REDIS_TIMEOUT"
for keys in $SCALE_KEYS; do
  redis-cli -p "$REDIS_PORT" flushall >/dev/null
  before=$(redis-cli -p "$REDIS_PORT" info memory | awk -F: '/^used_memory:/ {print $2+0}')
  $BENCH load --target "$SLUICE_ADDR" --connections "$CONNECTIONS" --in-flight "$IN_FLIGHT" \
    --warmup 0s --requests "$keys" --keys "$keys" --distribution sequential >/dev/null
  after=$(redis-cli -p "$REDIS_PORT" info memory | awk -F: '/^used_memory:/ {print $2+0}')
  printf 'keys=%-8s ' "$keys"
  $BENCH load --target "$SLUICE_ADDR" "${scale_args[@]}" --keys "$keys" --distribution uniform \
    --pid "sluice=$SLUICE_PID" --pid "redis=$REDIS_PID" --redis-url "$REDIS_URL" \
    --json "$OUT/scaling/redis-keys-$keys.json"
  live=$(redis-cli -p "$REDIS_PORT" dbsize)
  sample=$(redis-cli -p "$REDIS_PORT" --scan | head -100 || true)
  total=0 n=0
  for key in $sample; do
    total=$((total + $(redis-cli -p "$REDIS_PORT" memory usage "$key" samples 0)))
    n=$((n + 1))
  done
  echo "           Redis: $live keys; MEMORY USAGE $((total / n)) B/bucket (mean of $n); used_memory +$(( (after - before) / keys )) B/bucket"
done
