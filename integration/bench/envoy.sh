#!/usr/bin/env bash
# What users pay, measured through a real Envoy (docs/benchmarks.md, "Through Envoy"): HTTP load
# from wrk through Envoy (`--concurrency 1`), one run, the variants alternated round by round:
#
#   alone            Envoy without a rate-limit filter
#   noop             + the ratelimit filter → `sluice-bench noop` (the floor of asking at all)
#   memory, redis    + the ratelimit filter → sluice on the memory / Redis backend
#   rlqs             + the rate_limit_quota filter → sluice (memory backend)
#   limitador-memory, limitador-redis   + the ratelimit filter → Kuadrant's limitador-server
#                    (only when LIMITADOR=/path/to/limitador-server is given)
#   memory-b, redis-b, rlqs-b   the same three on build B (SLUICE_B=path and/or SLUICE_B_ARGS=
#                    "flags"), when either is given: an A/B of two builds or two flag sets
#                    (B_VARIANTS picks among the three)
#
#   integration/bench/envoy.sh     # Envoy from target/venv (integration/test.sh), or ENVOY=path
#   ROUNDS=4 DURATION=10 LIMITADOR=/path/to/limitador-server integration/bench/envoy.sh
#
# Every request takes the same path: wrk → Envoy listener → (filter → RPC) → the route's cluster,
# a second listener of the same Envoy answering 200 by `direct_response` (no app process). The
# route itself cannot be the direct_response: Envoy makes no RLS call for a route without a
# route entry. Every RPC asks about one descriptor, `k=v1` (a generic_key action), which the
# bench config's `k` rule answers OK (a roomy bucket, never exhausted); RLQS reports one bucket
# `tenant=t1` (the config's 1,000,000/s rule: never denied). Each variant has its own Envoy and
# server, started once and idle while the others are loaded.
#
# Per run: wrk's req/s and p50/p99 (`--latency`), the CPU seconds the server, Envoy and
# redis-server used (/proc/PID/stat) per request, and the deltas of Envoy's
# `cluster.backend.ratelimit.{ok,error,over_limit,failure_mode_allowed}` (RLQS has no filter
# stats: its 429s are wrk's non-2xx count, which must be 0). Prints one table; every wrk output
# and the per-run rows are kept in OUT, the whole output in OUT/run.txt
# (integration/bench/results/envoy.txt is one; ~6 min with limitador at the defaults). Only
# loopback addresses; redis-server on a free port (never 6379); stops every process it started.
# Needs wrk, curl, redis-server, python3.
set -euo pipefail
cd "$(dirname "$0")/../.."

OUT=${OUT:-target/bench/envoy}
ROUNDS=${ROUNDS:-4}
DURATION=${DURATION:-10}    # seconds per wrk run
WARMUP=${WARMUP:-3}         # seconds of wrk per variant before the first round (not measured)
CONNECTIONS=${CONNECTIONS:-32}
WRK_THREADS=${WRK_THREADS:-1}
REDIS_TIMEOUT=${REDIS_TIMEOUT:-200ms}
# Runtime workers of sluice (`--worker-threads`) and of the no-op server (`--threads`), so the
# floor runs on the same runtime; unset: sluice's default (the CPUs it may use) for both.
WORKER_THREADS=${WORKER_THREADS:-}
LIMITADOR=${LIMITADOR:-}
SLUICE_B=${SLUICE_B:-}
SLUICE_B_ARGS=${SLUICE_B_ARGS:-}
mkdir -p "$OUT"
source integration/bench/common.sh
find_envoy
for tool in wrk curl redis-server redis-cli python3 "$ENVOY"; do
  command -v "$tool" >/dev/null || { echo "error: $tool not found (wrk: apt-get install wrk)" >&2; exit 1; }
done
start_redis

VARIANTS=${VARIANTS:-alone noop memory redis rlqs}
if [ -n "$LIMITADOR" ]; then VARIANTS="$VARIANTS limitador-memory limitador-redis"; fi
if [ -n "$SLUICE_B$SLUICE_B_ARGS" ]; then VARIANTS="$VARIANTS ${B_VARIANTS:-memory-b redis-b rlqs-b}"; fi
SLUICE_B=${SLUICE_B:-$SLUICE}

# ---- the RLS/RLQS servers: each sets SERVER_PID and SERVER_PORT (sluice: serve_sluice in
# common.sh).

start_noop() {
  SERVER_PORT=$($BENCH free-port)
  $BENCH --threads "${WORKER_THREADS:-$(nproc)}" noop --addr "127.0.0.1:$SERVER_PORT" >"$TMP/noop.out" 2>&1 &
  SERVER_PID=$!
  started+=("$SERVER_PID")
  wait_ready "$TMP/noop.out" "noop ready" "$SERVER_PID"
}

# The bench config's `k` rule for limitador: one counter per value of descriptors[0].k, 1e9 a
# day, so every request is a read-modify-write that answers OK.
cat >"$TMP/limitador.yaml" <<'EOF'
- namespace: bench
  max_value: 1000000000
  seconds: 86400
  conditions: []
  variables:
    - descriptors[0].k
EOF

start_limitador() { # start_limitador NAME STORAGE ARGS...
  local name=$1 http
  shift
  SERVER_PORT=$($BENCH free-port)
  http=$($BENCH free-port)
  "$LIMITADOR" --rls-ip 127.0.0.1 --rls-port "$SERVER_PORT" --http-ip 127.0.0.1 \
    --http-port "$http" "$TMP/limitador.yaml" "$@" >"$TMP/$name.out" 2>&1 &
  SERVER_PID=$!
  started+=("$SERVER_PID")
  wait_http "http://127.0.0.1:$http/status"
}

# ---- Envoy

# filter_yaml KIND: the HTTP filters before the router (alone: none).
filter_yaml() {
  case $1 in
    alone) ;;
    rls) rls_filter_yaml ;;
    # No token bucket in no_assignment_behavior: Envoy 1.36–1.40 dereferences a null one and crashes.
    rlqs) cat <<'EOF'
                  - name: envoy.filters.http.rate_limit_quota
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig
                      domain: bench
                      rlqs_server: { envoy_grpc: { cluster_name: rls } }
                      bucket_matchers:
                        on_no_match:
                          action:
                            name: bench
                            typed_config:
                              "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings
                              bucket_id_builder:
                                bucket_id_builder:
                                  tenant: { string_value: t1 }
                              reporting_interval: 1s
                              no_assignment_behavior:
                                fallback_rate_limit: { blanket_rule: ALLOW_ALL }
                              expired_assignment_behavior:
                                fallback_rate_limit: { blanket_rule: ALLOW_ALL }
EOF
    ;;
  esac
}

# envoy KIND NAME RLS_PORT: start_envoy (common.sh) with KIND's filters; every route asks about
# the one descriptor k=v1 (the filter of `alone` and `rlqs` never reads it).
envoy() {
  start_envoy "$2" "$3" "$(filter_yaml "$1")" \
    '                              - actions:
                                  - generic_key: { descriptor_key: k, descriptor_value: v1 }'
}

# check VARIANT KIND: the path works and the filter asked — requests answered 200 until (RLS)
# one was decided `ok` or (RLQS) the quota stream is open. Up to 10 tries: a first call can
# outlast Envoy's 20 ms RLS timeout (connection set-up, the Redis script load) and count an error.
check() {
  local code
  for _ in $(seq 10); do
    code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$FRONT/")
    [ "$code" = 200 ] || { echo "error: $1: Envoy answered $code" >&2; exit 1; }
    case $2 in
      alone) return 0 ;;
      rls) [ "$(envoy_counter "$ADMIN" cluster.backend.ratelimit.ok)" -ge 1 ] && return 0 ;;
      rlqs) [ "$(envoy_counter "$ADMIN" cluster.rls.upstream_rq_total)" -ge 1 ] && return 0 ;;
    esac
    sleep 0.2
  done
  echo "error: $1: the filter got no answer (ratelimit ok/error/over_limit/failure_mode_allowed: $(rl_stats "$ADMIN"))" >&2
  exit 1
}

# ---- start every variant once

# start_variant VARIANT: its server, if any; sets KIND (alone, rls, rlqs) and SERVER_PID (empty
# for alone) and SERVER_PORT. A `-b` variant is the same on build B (SLUICE_B, SLUICE_B_ARGS).
start_variant() {
  local v=$1 binary=$SLUICE extra=()
  KIND=rls SERVER_PID= SERVER_PORT=0
  case $v in
    memory-b | redis-b | rlqs-b)
      binary=$SLUICE_B v=${v%-b}
      read -ra extra <<<"$SLUICE_B_ARGS" ;;
  esac
  case $v in
    alone) KIND=alone ;;
    noop) start_noop ;;
    memory) serve_sluice "$1" "$binary" --backend memory "${extra[@]}" ;;
    redis) serve_sluice "$1" "$binary" --backend redis --redis-url "$REDIS_URL" --redis-timeout "$REDIS_TIMEOUT" "${extra[@]}" ;;
    rlqs)
      KIND=rlqs
      serve_sluice "$1" "$binary" --backend memory --rlqs-assignment-ttl 3s --rlqs-push-interval 1s "${extra[@]}" ;;
    limitador-memory) start_limitador "$v" memory ;;
    limitador-redis) start_limitador "$v" redis "$REDIS_URL" ;;
    *) echo "error: unknown variant $v" >&2; exit 1 ;;
  esac
}

declare -A V_ENVOY V_FRONT V_ADMIN V_SERVER V_REDIS
for v in $VARIANTS; do
  start_variant "$v"
  server=$SERVER_PID
  envoy "$KIND" "$v" "$SERVER_PORT"
  V_ENVOY[$v]=$ENVOY_PID V_FRONT[$v]=$FRONT V_ADMIN[$v]=$ADMIN V_SERVER[$v]=$server V_REDIS[$v]=
  case $v in *redis*) V_REDIS[$v]=$REDIS_PID ;; esac
  check "$v" "$KIND"
  echo "started $v: envoy pid $ENVOY_PID on 127.0.0.1:$FRONT${server:+, server pid $server}"
done

# Warm-up: connections, the RLQS assignment, the Redis script load. Not measured.
for v in $VARIANTS; do
  wrk -t "$WRK_THREADS" -c "$CONNECTIONS" -d "${WARMUP}s" "http://127.0.0.1:${V_FRONT[$v]}/" >/dev/null
done

ROWS=$OUT/runs.tsv
printf 'round\tvariant\treq_s\tp50_ms\tp99_ms\trequests\tnon2xx\tsocket_errors\tserver_us\tenvoy_us\tredis_us\t%s\n' \
  "$(echo "$RL_STATS" | tr ' ' '\t')" >"$ROWS"
{
  echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at the start"
  echo "envoy: $("$ENVOY" --version | grep -o 'version: .*')"
  echo "wrk -t $WRK_THREADS -c $CONNECTIONS -d ${DURATION}s --latency; $ROUNDS rounds; variants: $VARIANTS"
  echo "server workers: ${WORKER_THREADS:-default ($(nproc))}"
  if [ "$VARIANTS" != "${VARIANTS%-b}" ]; then echo "build B: $SLUICE_B $SLUICE_B_ARGS"; fi
} | tee "$OUT/run.txt"

# measure ROUND VARIANT: one wrk run, its row appended to ROWS.
measure() {
  local round=$1 v=$2 log=$OUT/$2.$1.wrk
  local admin=${V_ADMIN[$v]} s0 e0 r0 s1 e1 r1 st0 st1
  st0=$(rl_stats "$admin")
  s0=$(cpu_ticks "${V_SERVER[$v]}") e0=$(cpu_ticks "${V_ENVOY[$v]}") r0=$(cpu_ticks "${V_REDIS[$v]}")
  wrk -t "$WRK_THREADS" -c "$CONNECTIONS" -d "${DURATION}s" --latency "http://127.0.0.1:${V_FRONT[$v]}/" >"$log"
  s1=$(cpu_ticks "${V_SERVER[$v]}") e1=$(cpu_ticks "${V_ENVOY[$v]}") r1=$(cpu_ticks "${V_REDIS[$v]}")
  st1=$(rl_stats "$admin")
  python3 - "$log" "$round" "$v" "$CLK_TCK" "$((s1 - s0))" "$((e1 - e0))" "$((r1 - r0))" \
    "${V_SERVER[$v]:+1}" "${V_REDIS[$v]:+1}" "$st0" "$st1" >>"$ROWS" <<'EOF'
import re, sys
log, rnd, v, hz, ds, de, dr, has_server, has_redis, st0, st1 = sys.argv[1:]
text = open(log).read()
def ms(s):
    n, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", s).groups()
    return float(n) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]
pct = dict(re.findall(r"^\s+(\d+)%\s+(\S+)$", text, re.M))
requests = int(re.search(r"^\s+(\d+) requests in", text, re.M).group(1))
rps = float(re.search(r"^Requests/sec:\s+([\d.]+)", text, re.M).group(1))
non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
us = lambda ticks: "%.1f" % (int(ticks) / float(hz) * 1e6 / requests)
stats = [int(b) - int(a) for a, b in zip(st0.split(), st1.split())]
print("\t".join([rnd, v, "%.0f" % rps, "%.3f" % ms(pct["50"]), "%.3f" % ms(pct["99"]), str(requests),
                 non2xx.group(1) if non2xx else "0",
                 str(sum(map(int, sock.groups()))) if sock else "0",
                 us(ds) if has_server else "-", us(de), us(dr) if has_redis else "-"]
                + [str(s) for s in stats]))
EOF
  tail -1 "$ROWS" | awk -F'\t' '{ printf "round %s  %-17s %8s req/s  p50 %6s ms  p99 %6s ms  non-2xx %s  server %s µs/req  envoy %s µs/req  rl ok/err/over %s/%s/%s\n",
    $1, $2, $3, $4, $5, $7, $9, $10, $12, $13, $14 }' | tee -a "$OUT/run.txt"
}

for round in $(seq "$ROUNDS"); do
  for v in $VARIANTS; do
    measure "$round" "$v"
  done
done
echo "machine: load average $(cut -d' ' -f1-3 /proc/loadavg) at the end" | tee -a "$OUT/run.txt"

# The table: per variant the rounds' req/s, the medians of the per-round ratios to `alone` and
# `noop` and of the per-round added p50/p99 against `alone`, the median CPU per request, and the
# summed counters.
python3 - "$ROWS" <<'EOF' | tee "$OUT/table.txt" | tee -a "$OUT/run.txt"
import csv, statistics as st, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
order = list(dict.fromkeys(r["variant"] for r in rows))
by = {(r["round"], r["variant"]): r for r in rows}
rounds = sorted({r["round"] for r in rows}, key=int)
def med(xs):
    xs = [x for x in xs if x is not None]
    return st.median(xs) if xs else None
def ratio(v, base):
    if base not in order: return None
    return med([float(by[r, v]["req_s"]) / float(by[r, base]["req_s"]) for r in rounds])
def added(v, col):
    if "alone" not in order: return None
    return med([float(by[r, v][col]) - float(by[r, "alone"][col]) for r in rounds])
def cpu(v, col):
    xs = [by[r, v][col] for r in rounds]
    return None if "-" in xs else med([float(x) for x in xs])
f = lambda x, fmt: "–" if x is None else fmt % x
head = ["variant", "req/s per round", "median", "÷ alone", "÷ noop", "+p50 ms", "+p99 ms",
        "server µs/req", "envoy µs/req", "redis µs/req", "non-2xx", "rl ok", "error", "over_limit", "fm_allowed"]
out = [head]
for v in order:
    rs = [float(by[r, v]["req_s"]) for r in rounds]
    tot = lambda col: str(sum(int(by[r, v][col]) for r in rounds))
    out.append([v, " / ".join("%.0f" % x for x in rs), "%.0f" % st.median(rs),
                f(ratio(v, "alone"), "%.2f"), f(ratio(v, "noop"), "%.2f"),
                f(added(v, "p50_ms"), "%+.2f"), f(added(v, "p99_ms"), "%+.2f"),
                f(cpu(v, "server_us"), "%.1f"), f(cpu(v, "envoy_us"), "%.1f"), f(cpu(v, "redis_us"), "%.1f"),
                tot("non2xx"), tot("ok"), tot("error"), tot("over_limit"), tot("failure_mode_allowed")])
w = [max(len(r[i]) for r in out) for i in range(len(head))]
for r in out:
    print("  ".join(c.ljust(w[i]) for i, c in enumerate(r)).rstrip())
EOF
