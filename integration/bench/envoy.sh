#!/usr/bin/env bash
# What users pay, measured through a real Envoy (docs/benchmarks.md, "Through Envoy"): HTTP load
# from wrk through Envoy (`--concurrency 1`), one run, the variants alternated round by round:
#
#   alone            Envoy without a rate-limit filter
#   noop             + the ratelimit filter → `sluice-bench noop`: a no-op tonic RLS server on
#                    tokio's defaults (multi-threaded, LIFO slot on), the floor of asking at all
#   memory, redis    + the ratelimit filter → sluice on the memory / Redis backend
#   rlqs             + the rate_limit_quota filter → sluice (memory backend)
#   limitador-memory, limitador-redis   + the ratelimit filter → Kuadrant's limitador-server
#                    (only when LIMITADOR=/path/to/limitador-server is given)
#   memory-b, redis-b, rlqs-b   the same three on build B (SLUICE_B=path and/or SLUICE_B_ARGS=
#                    "flags"), when either is given: an A/B of two builds or two flag sets
#                    (B_VARIANTS picks among the three)
#
#   integration/bench/envoy.sh     # Envoy from target/venv (integration/test.sh), or ENVOY=path
#   ROUNDS=5 DURATION=10 LIMITADOR=/path/to/limitador-server integration/bench/envoy.sh
#   SLUICE=a/sluice SLUICE_B=b/sluice B_VARIANTS="memory-b redis-b" integration/bench/envoy.sh
#
# Every request takes the same path: wrk → Envoy listener → (filter → RPC) → the route's cluster,
# a second listener of the same Envoy answering 200 by `direct_response` (no app process). The
# route itself cannot be the direct_response: Envoy makes no RLS call for a route without a
# route entry. Every RPC asks about one descriptor, `k=v1` (a generic_key action), which the
# bench config's `k` rule answers OK (a roomy bucket, never exhausted); RLQS reports one bucket
# `tenant=t1` (the config's 1,000,000/s rule: never denied). Each variant has its own Envoy and
# server, started once and idle while the others are loaded.
#
# The headline is CPU per request per process: the CPU seconds (user + system, /proc/PID/stat)
# the server, redis-server and Envoy used over the same wrk run, divided by the requests wrk
# completed; throughput on a shared machine moves far more between rounds than CPU per request
# does. Per variant: the median over the rounds of each, the server's (+ redis-server's) CPU per
# request against the no-op server's of the same round, and the server's context switches per
# request (voluntary + involuntary, every thread: /proc/PID/task/*/status), beside wrk's req/s and
# p50/p99 (`--latency`). Per run also the deltas of Envoy's
# `cluster.backend.ratelimit.{ok,error,over_limit,failure_mode_allowed}` (RLQS has no filter
# stats: its 429s are wrk's non-2xx count, which must be 0). Prints one table; every wrk output
# and the per-run rows are kept in OUT, the whole output in OUT/run.txt
# (integration/bench/results/envoy.txt is one; ~6 min with limitador at the defaults). Only
# loopback addresses; redis-server on a free port (never 6379); stops every process it started.
# Needs wrk, curl, redis-server, python3.
set -euo pipefail
cd "$(dirname "$0")/../.."

OUT=${OUT:-target/bench/envoy}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-8}     # seconds per wrk run
WARMUP=${WARMUP:-3}         # seconds of wrk per variant before the first round (not measured)
CONNECTIONS=${CONNECTIONS:-32}
WRK_THREADS=${WRK_THREADS:-1}
REDIS_TIMEOUT=${REDIS_TIMEOUT:-200ms}
# Serving threads of sluice (`--worker-threads`) and runtime workers of the no-op server
# (`--threads`); unset: sluice's default and tokio's (the CPUs the process may use) for both.
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
  $BENCH --tokio-lifo-slot --threads "${WORKER_THREADS:-$(nproc)}" noop --addr "127.0.0.1:$SERVER_PORT" >"$TMP/noop.out" 2>&1 &
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
printf 'round\tvariant\treq_s\tp50_ms\tp99_ms\trequests\tnon2xx\tsocket_errors\tserver_us\tenvoy_us\tredis_us\tserver_cs\t%s\n' \
  "$(echo "$RL_STATS" | tr ' ' '\t')" >"$ROWS"
{
  echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at the start"
  echo "envoy: $("$ENVOY" --version | grep -o 'version: .*')"
  echo "sluice: $SLUICE (tree $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD 2>/dev/null || echo ' with uncommitted changes'))"
  echo "wrk -t $WRK_THREADS -c $CONNECTIONS -d ${DURATION}s --latency; $ROUNDS rounds; variants: $VARIANTS"
  echo "server threads: ${WORKER_THREADS:-default ($(nproc))}"
  if [ "$VARIANTS" != "${VARIANTS%-b}" ]; then echo "build B: $SLUICE_B $SLUICE_B_ARGS"; fi
} | tee "$OUT/run.txt"

# measure ROUND VARIANT: one wrk run, its row appended to ROWS.
measure() {
  local round=$1 v=$2 log=$OUT/$2.$1.wrk
  local admin=${V_ADMIN[$v]} s0 e0 r0 c0 s1 e1 r1 c1 st0 st1
  st0=$(rl_stats "$admin")
  c0=$(ctx_switches "${V_SERVER[$v]}")
  s0=$(cpu_ticks "${V_SERVER[$v]}") e0=$(cpu_ticks "${V_ENVOY[$v]}") r0=$(cpu_ticks "${V_REDIS[$v]}")
  wrk -t "$WRK_THREADS" -c "$CONNECTIONS" -d "${DURATION}s" --latency "http://127.0.0.1:${V_FRONT[$v]}/" >"$log"
  s1=$(cpu_ticks "${V_SERVER[$v]}") e1=$(cpu_ticks "${V_ENVOY[$v]}") r1=$(cpu_ticks "${V_REDIS[$v]}")
  c1=$(ctx_switches "${V_SERVER[$v]}")
  st1=$(rl_stats "$admin")
  python3 - "$log" "$round" "$v" "$CLK_TCK" "$((s1 - s0))" "$((e1 - e0))" "$((r1 - r0))" "$((c1 - c0))" \
    "${V_SERVER[$v]:+1}" "${V_REDIS[$v]:+1}" "$st0" "$st1" >>"$ROWS" <<'EOF'
import re, sys
log, rnd, v, hz, ds, de, dr, dc, has_server, has_redis, st0, st1 = sys.argv[1:]
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
                 us(ds) if has_server else "-", us(de), us(dr) if has_redis else "-",
                 "%.3f" % (int(dc) / requests) if has_server else "-"]
                + [str(s) for s in stats]))
EOF
  tail -1 "$ROWS" | awk -F'\t' '{ printf "round %s  %-17s server %5s µs/req  redis %5s  envoy %5s  cs/req %5s  %6s req/s  p50 %6s ms  p99 %6s ms  non-2xx %s  rl ok/err/over %s/%s/%s\n",
    $1, $2, $9, $11, $10, $12, $3, $4, $5, $7, $13, $14, $15 }' | tee -a "$OUT/run.txt"
}

for round in $(seq "$ROUNDS"); do
  for v in $VARIANTS; do
    measure "$round" "$v"
  done
done
echo "machine: load average $(cut -d' ' -f1-3 /proc/loadavg) at the end" | tee -a "$OUT/run.txt"

# The tables: CPU per request per process first (medians over the rounds; "× noop" is the median
# of the per-round ratios of the server's CPU per request, redis-server's added, to the no-op
# server's), then throughput and latency (per-round req/s, the medians of the per-round ratios to
# `alone` and `noop` and of the per-round added p50/p99 against `alone`, the summed counters).
python3 - "$ROWS" <<'EOF' | tee "$OUT/table.txt" | tee -a "$OUT/run.txt"
import csv, statistics as st, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
order = list(dict.fromkeys(r["variant"] for r in rows))
by = {(r["round"], r["variant"]): r for r in rows}
rounds = sorted({r["round"] for r in rows}, key=int)
def med(xs):
    xs = [x for x in xs if x is not None]
    return st.median(xs) if xs else None
def num(r, v, c):
    x = by[r, v][c]
    return None if x == "-" else float(x)
def col(v, c):
    return med([num(r, v, c) for r in rounds])
def paid(r, v):  # the limit service's CPU per request, its redis-server's included
    s = num(r, v, "server_us")
    return None if s is None else s + (num(r, v, "redis_us") or 0.0)
def ratio(v, base):
    if base not in order: return None
    return med([float(by[r, v]["req_s"]) / float(by[r, base]["req_s"]) for r in rounds])
def cpu_ratio(v):
    if "noop" not in order or paid(rounds[0], v) is None: return None
    return med([paid(r, v) / paid(r, "noop") for r in rounds])
def added(v, c):
    if "alone" not in order: return None
    return med([float(by[r, v][c]) - float(by[r, "alone"][c]) for r in rounds])
f = lambda x, fmt: "–" if x is None else fmt % x
def table(head, body):
    w = [max(len(r[i]) for r in [head] + body) for i in range(len(head))]
    for r in [head] + body:
        print("  ".join(c.ljust(w[i]) for i, c in enumerate(r)).rstrip())
print("CPU per request per process (µs; medians of %d rounds):" % len(rounds))
table(["variant", "server", "redis", "server+redis", "× noop", "envoy", "server cs/req", "req/s", "p50 ms", "p99 ms"],
      [[v, f(col(v, "server_us"), "%.1f"), f(col(v, "redis_us"), "%.1f"),
        f(med([paid(r, v) for r in rounds]), "%.1f"), f(cpu_ratio(v), "%.2f"),
        f(col(v, "envoy_us"), "%.1f"), f(col(v, "server_cs"), "%.3f"), "%.0f" % col(v, "req_s"),
        "%.2f" % col(v, "p50_ms"), "%.2f" % col(v, "p99_ms")] for v in order])
print()
print("Throughput and latency:")
body = []
for v in order:
    tot = lambda c: str(sum(int(by[r, v][c]) for r in rounds))
    body.append([v, " / ".join("%.0f" % float(by[r, v]["req_s"]) for r in rounds), "%.0f" % col(v, "req_s"),
                 f(ratio(v, "alone"), "%.2f"), f(ratio(v, "noop"), "%.2f"),
                 f(added(v, "p50_ms"), "%+.2f"), f(added(v, "p99_ms"), "%+.2f"),
                 tot("non2xx"), tot("ok"), tot("error"), tot("over_limit"), tot("failure_mode_allowed")])
table(["variant", "req/s per round", "median", "÷ alone", "÷ noop", "+p50 ms", "+p99 ms",
       "non-2xx", "rl ok", "error", "over_limit", "fm_allowed"], body)
EOF
