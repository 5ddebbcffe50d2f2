#!/usr/bin/env bash
# RLQS against RLS through real Envoys (docs/benchmarks.md, "RLQS through real Envoys"): ENVOYS
# Envoys (1.40, `--concurrency 1` each) in front of one release sluice, first with the
# rate_limit_quota filter (RLQS), then the same Envoys with the ratelimit filter (RLS) on the
# same rule, alternated window by window, for every backend and number of tenants:
#
#   integration/bench/rlqs-envoy.sh        # Envoy from target/venv (integration/test.sh), or ENVOY=path
#   ENVOYS=4 TENANTS="100 2000" BACKENDS="memory redis" DURATION=20 integration/bench/rlqs-envoy.sh
#
# Every request carries `x-tenant: t<n>`: each Envoy's wrk (`-c CONNECTIONS`, a Lua script) cycles
# over TENANTS distinct values, so every Envoy holds that many RLQS buckets `{tenant: t<n>}` and
# each of its usage reports (every 5 s, hard-coded in Envoy 1.36–1.40, all of the domain's buckets
# in one message) carries TENANTS usages. With RLS the route's `request_headers` action sends the
# descriptor `tenant=t<n>`. Both reach the bench config's `tenant` rule (1,000,000/s per tenant:
# every RLQS share is a token bucket and nothing is denied, so the figures are cost). The RLQS
# filter has the shape of deploy/envoy/envoy-rlqs.yaml: a header matcher building the bucket id
# from the header, an on_no_match catch-all bucket, `reporting_interval: 1s`, no
# `no_assignment_behavior` (a token bucket there crashes Envoy), a token bucket of the rule's limit
# as `expired_assignment_behavior`, and HTTP/2 keepalive on the sluice cluster.
#
# Each window: a fresh sluice (and an emptied redis-server of its own, on a free loopback port,
# never 6379), ENVOYS fresh Envoys, one check request per Envoy, WARMUP s of load (every bucket
# subscribed and assigned), then DURATION s measured (≥ 15: three report ticks at least): requests
# through the Envoys; the CPU of sluice, the Envoys and redis-server around the window from
# /proc/PID/task/*/schedstat (ns: RLQS's sluice CPU is a few 10 ms ticks of /proc/PID/stat, whose
# utime+stime for sluice is printed beside it); sluice's `sluice_rlqs_assignments_sent_total`,
# `sluice_rlqs_buckets_subscribed` (ENVOYS × TENANTS) and `sluice_rlqs_streams_open` (ENVOYS); the
# bytes the Envoys sent on the sluice cluster; then SETTLE s idle (sluice's CPU without traffic;
# one report tick) and sluice's `sluice_rlqs_reported_requests_total` against every request wrk and
# the checks sent (the RLQS path was used; flagged outside 0.97–1.03). It stops with an error if an
# Envoy or sluice died, and flags any Envoy warning beyond the two every start prints. Usages
# served in the window are ENVOYS × TENANTS × DURATION / 5 s (sluice counts reported requests, not
# bucket reports).
#
# Then one RLQS window per backend on a limiting rule (LIMIT_RATE/s per tenant, burst the same,
# LIMIT_TENANTS tenants, no warm-up, LIMIT_DURATION s from the first request): admitted (2xx)
# against LIMIT_TENANTS × (C + r·T), a sanity line (the bound counts what sluice assigned; Envoy
# admits until a bucket's first assignment, one round trip, outside it).
#
# Prints one table; every wrk output, Envoy log, the rows and the whole output (OUT/run.txt) are
# kept in OUT (integration/bench/results/rlqs-envoy.txt holds four runs; ~6 min at the defaults).
# Needs wrk, curl, redis-server, python3.
set -euo pipefail
cd "$(dirname "$0")/../.."

OUT=${OUT:-target/bench/rlqs-envoy}
ENVOYS=${ENVOYS:-4}
TENANTS=${TENANTS:-100 2000}
BACKENDS=${BACKENDS:-memory redis}
MODES=${MODES:-rlqs rls}
DURATION=${DURATION:-20}     # seconds measured per window
WARMUP=${WARMUP:-6}          # seconds of load before it (not measured)
SETTLE=${SETTLE:-6}          # idle seconds after it (sluice's idle CPU): one report tick, then the reported count is read
CONNECTIONS=${CONNECTIONS:-8} # wrk connections per Envoy
LIMIT_TENANTS=${LIMIT_TENANTS:-10}
LIMIT_RATE=${LIMIT_RATE:-100}
LIMIT_DURATION=${LIMIT_DURATION:-20}
LIMIT_BACKENDS=${LIMIT_BACKENDS-$BACKENDS} # empty: no limiting windows
REDIS_TIMEOUT=${REDIS_TIMEOUT:-200ms}
[ "$DURATION" -ge 15 ] || echo "warning: DURATION=$DURATION: Envoy reports every 5 s, a window under 15 s sees too few reports" >&2
mkdir -p "$OUT"
source integration/bench/common.sh
find_envoy
for tool in wrk curl redis-server redis-cli python3 "$ENVOY"; do
  command -v "$tool" >/dev/null || { echo "error: $tool not found (wrk: apt-get install wrk)" >&2; exit 1; }
done
start_redis

# The limiting rule's config: the bench config with the `tenant` rule at LIMIT_RATE/s.
LIMIT_CONFIG=$TMP/limit-config
mkdir -p "$LIMIT_CONFIG"
cat >"$LIMIT_CONFIG/bench.yaml" <<EOF
domain: bench
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: $LIMIT_RATE}
EOF

# wrk's script for B tenants: each connection's requests cycle over x-tenant t1..tB (the
# requests are formatted once).
lua() { # lua B: the script's path
  local f=$TMP/tenants-$1.lua
  [ -f "$f" ] || cat >"$f" <<EOF
local reqs, n, i = {}, $1, 0
init = function(args)
  for t = 1, n do reqs[t] = wrk.format(nil, nil, { ["x-tenant"] = "t" .. t }) end
end
request = function()
  i = i % n + 1
  return reqs[i]
end
EOF
  echo "$f"
}

# filters MODE FALLBACK_RATE: the HTTP filters before the router. RLQS mirrors
# deploy/envoy/envoy-rlqs.yaml; FALLBACK_RATE is its expired-assignment token bucket (per second).
filters() {
  case $1 in
    rls) rls_filter_yaml ;;
    # No no_assignment_behavior (ALLOW_ALL until the first assignment): a token bucket there
    # crashes Envoy 1.36–1.40.
    rlqs) cat <<EOF
                  - name: envoy.filters.http.rate_limit_quota
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig
                      domain: bench
                      rlqs_server: { envoy_grpc: { cluster_name: rls } }
                      bucket_matchers:
                        matcher_list:
                          matchers:
                            - predicate:
                                single_predicate:
                                  input:
                                    name: x-tenant
                                    typed_config:
                                      "@type": type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput
                                      header_name: x-tenant
                                  value_match:
                                    safe_regex: { google_re2: {}, regex: ".+" }
                              on_match:
                                action:
                                  name: tenant
                                  typed_config:
                                    "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings
                                    bucket_id_builder:
                                      bucket_id_builder:
                                        tenant:
                                          custom_value:
                                            name: x-tenant
                                            typed_config:
                                              "@type": type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput
                                              header_name: x-tenant
                                    reporting_interval: 1s
                                    expired_assignment_behavior:
                                      expired_assignment_behavior_timeout: 600s
                                      fallback_rate_limit:
                                        token_bucket: { max_tokens: $2, tokens_per_fill: $2, fill_interval: 1s }
                        on_no_match:
                          action:
                            name: anonymous
                            typed_config:
                              "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings
                              bucket_id_builder:
                                bucket_id_builder:
                                  tenant: { string_value: anonymous }
                              reporting_interval: 1s
                              expired_assignment_behavior:
                                expired_assignment_behavior_timeout: 600s
                                fallback_rate_limit:
                                  token_bucket: { max_tokens: $2, tokens_per_fill: $2, fill_interval: 1s }
EOF
    ;;
  esac
}
# The route's rate_limits (read by the ratelimit filter only): the tenant header as descriptor.
RATE_LIMITS='                              - actions:
                                  - request_headers: { header_name: x-tenant, descriptor_key: tenant }'
# As deploy/envoy/envoy-rlqs.yaml: pings notice a vanished sluice.
ENVOY_RLS_H2='{ connection_keepalive: { interval: 10s, timeout: 5s } }'

# load SECONDS B TAG: wrk on every Envoy at once, outputs in OUT/LABEL.TAG.e<i>.wrk.
load() {
  local i pids=() script
  script=$(lua "$2")
  for i in "${!FRONTS[@]}"; do
    wrk -t 1 -c "$CONNECTIONS" -d "${1}s" --latency -s "$script" "http://127.0.0.1:${FRONTS[$i]}/" \
      >"$OUT/$LABEL.$3.e$i.wrk" &
    pids+=("$!")
  done
  for i in "${pids[@]}"; do wait "$i"; done
}

# sent TAG: requests wrk sent over every Envoy in its TAG run (2xx and not).
sent() {
  cat "$OUT/$LABEL.$1".e*.wrk | awk '/ requests in / { n += $1 } END { print n + 0 }'
}

alive() { # alive: every Envoy and sluice of the window still runs
  local pid
  for pid in "${ENVOY_PIDS[@]}" "$SERVER_PID"; do
    kill -0 "$pid" 2>/dev/null || { echo "error: $LABEL: process $pid died" >&2; ls "$TMP" >&2; cat "$TMP"/*.envoy.out >&2; exit 1; }
  done
}

# rl_sum, tx_sum: over this window's Envoys, the four ratelimit counters (rl_stats) and the
# bytes sent to the RLS/RLQS cluster.
rl_sum() {
  local a
  for a in "${ADMINS[@]}"; do rl_stats "$a"; done |
    awk '{ for (i = 1; i <= NF; i++) s[i] += $i } END { print s[1] + 0, s[2] + 0, s[3] + 0, s[4] + 0 }'
}
tx_sum() {
  local a
  for a in "${ADMINS[@]}"; do envoy_counter "$a" cluster.rls.upstream_cx_tx_bytes_total; done | awk '{ n += $1 } END { print n + 0 }'
}

# rlqs_reported: requests sluice's RLQS streams have reported (allowed + denied).
rlqs_reported() { sluice_metric "$SERVER_ADMIN" sluice_rlqs_reported_requests_total; }

# window BACKEND MODE B MEASURE WARMUP FALLBACK_RATE [CONFIG]: one measured window (above);
# appends its row to ROWS.
window() {
  local backend=$1 mode=$2 b=$3 measure=$4 warm=$5 fallback=$6 args=() i code checks=0
  local s0 s1 k0 k1 e0 e1 r0 r1 a0 a1 rl0 rl1 x0 x1 i0 idle=0 subscribed streams reported=- t0 t1 logged
  LABEL=$backend-$mode-$b${7:+-limit}
  args=(--backend "$backend")
  [ "$backend" = redis ] && args+=(--redis-url "$REDIS_URL" --redis-timeout "$REDIS_TIMEOUT")
  redis-cli -p "$REDIS_PORT" flushall >/dev/null
  SLUICE_CONFIG=${7:-} serve_sluice "$LABEL" "$SLUICE" "${args[@]}"
  ENVOY_PIDS=() FRONTS=() ADMINS=()
  for i in $(seq "$ENVOYS"); do
    start_envoy "$LABEL.e$i" "$SERVER_PORT" "$(filters "$mode" "$fallback")" "$RATE_LIMITS"
    ENVOY_PIDS+=("$ENVOY_PID") FRONTS+=("$FRONT") ADMINS+=("$ADMIN")
  done
  # One request per Envoy answered 200 and the filter asked: RLS decided it, or the RLQS stream
  # is open.
  for i in "${!FRONTS[@]}"; do
    for _ in $(seq 20); do
      code=$(curl -s -o /dev/null -w '%{http_code}' -H 'x-tenant: t1' "http://127.0.0.1:${FRONTS[$i]}/")
      checks=$((checks + 1))
      [ "$code" = 200 ] || { echo "error: $LABEL: Envoy $i answered $code" >&2; exit 1; }
      case $mode in
        rls) [ "$(envoy_counter "${ADMINS[$i]}" cluster.backend.ratelimit.ok)" -ge 1 ] && break ;;
        rlqs) [ "$(envoy_counter "${ADMINS[$i]}" cluster.rls.upstream_rq_total)" -ge 1 ] && break ;;
      esac
      sleep 0.2
    done
  done
  [ "$warm" = 0 ] || load "$warm" "$b" warmup
  rl0=$(rl_sum) x0=$(tx_sum)
  a0=$(sluice_metric "$SERVER_ADMIN" sluice_rlqs_assignments_sent_total)
  s0=$(cpu_ns "$SERVER_PID") k0=$(cpu_ticks "$SERVER_PID") e0=$(cpu_ns "${ENVOY_PIDS[@]}") r0=$(cpu_ns "$REDIS_PID")
  t0=$(date +%s.%N)
  load "$measure" "$b" measured
  t1=$(date +%s.%N)
  s1=$(cpu_ns "$SERVER_PID") k1=$(cpu_ticks "$SERVER_PID") e1=$(cpu_ns "${ENVOY_PIDS[@]}") r1=$(cpu_ns "$REDIS_PID")
  a1=$(sluice_metric "$SERVER_ADMIN" sluice_rlqs_assignments_sent_total)
  subscribed=$(sluice_metric "$SERVER_ADMIN" sluice_rlqs_buckets_subscribed)
  streams=$(sluice_metric "$SERVER_ADMIN" sluice_rlqs_streams_open)
  rl1=$(rl_sum) x1=$(tx_sum)
  # Idle: no traffic; with RLQS every bucket still subscribed, reported (zero usage) every 5 s
  # and assigned every push; with RLS sluice's own background work only.
  i0=$(cpu_ns "$SERVER_PID")
  sleep "$SETTLE"
  idle=$(( $(cpu_ns "$SERVER_PID") - i0 ))
  [ "$mode" = rls ] || reported=$(rlqs_reported)
  alive
  # Envoy's own complaints (warning and worse; it runs at --log-level warn), every Envoy together,
  # but for the two every start prints (the RLQS API is work in progress; no global connection
  # limit). The logs are kept in OUT.
  for i in $(seq "$ENVOYS"); do cp "$TMP/$LABEL.e$i.envoy.out" "$OUT/$LABEL.e$i.envoy.log"; done
  logged=$(cat "$OUT/$LABEL".e*.envoy.log | grep '\]\[\(warning\|error\|critical\)\]' |
    grep -cv 'marked as work-in-progress\|no configured limit to the number of allowed active downstream' || true)
  local total=$((checks + $(sent measured) + $( [ "$warm" = 0 ] && echo 0 || sent warmup)))
  python3 - "$OUT/$LABEL.measured" "$backend" "$mode" "$b" "$ENVOYS" "$CLK_TCK" \
    "$((s1 - s0))" "$((k1 - k0))" "$((e1 - e0))" "$((r1 - r0))" "$((a1 - a0))" "$subscribed" \
    "$reported" "$total" "$rl0" "$rl1" "$((x1 - x0))" "$idle" "$SETTLE" "$t0" "$t1" \
    "$(cut -d' ' -f1 /proc/loadavg)" "${7:+limit}" "$streams" "$logged" >>"$ROWS" <<'EOF'
import glob, re, sys
(prefix, backend, mode, b, envoys, hz, ds, dk, de, dr, assigned, subscribed, reported, total,
 rl0, rl1, tx, idle, settle, t0, t1, load, limit, streams, logged) = sys.argv[1:]
req = non2xx = 0
rps = 0.0
p99 = []
for f in sorted(glob.glob(prefix + ".e*.wrk")):
    text = open(f).read()
    req += int(re.search(r"^\s+(\d+) requests in", text, re.M).group(1))
    rps += float(re.search(r"^Requests/sec:\s+([\d.]+)", text, re.M).group(1))
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    non2xx += int(m.group(1)) if m else 0
    v, unit = re.search(r"^\s+99%\s+([\d.]+)(us|ms|s)$", text, re.M).groups()
    p99.append(float(v) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit])
secs = float(t1) - float(t0)
cpu_s, cpu_e, cpu_r = int(ds) / 1e9, int(de) / 1e9, int(dr) / 1e9
rl = [int(b_) - int(a_) for a_, b_ in zip(rl0.split(), rl1.split())]
rlqs = mode == "rlqs"
usages = int(envoys) * int(b) * secs / 5 if rlqs else 0
redis = backend == "redis"
print("\t".join(map(str, [
    backend, mode, b, envoys, "%.1f" % secs, req, "%.0f" % rps, non2xx, "%.2f" % max(p99),
    "%.4f" % cpu_s, "%.2f" % (int(dk) / float(hz)), "%.2f" % cpu_e, "%.4f" % cpu_r if redis else "-",
    "%.0f" % (req / cpu_s), "%.0f" % (req / (cpu_s + cpu_r)) if redis else "-",
    "%.3f" % (cpu_s * 1e6 / req), "%.1f" % (cpu_e * 1e6 / req), "%.2f" % (cpu_r * 1e6 / req) if redis else "-",
    "%.1f" % (cpu_s * 1e3 / secs),
    "%.0f" % (usages / secs) if rlqs else "-",
    "%.1f" % (cpu_s * 1e3 / (usages / 1000)) if rlqs else "-",
    "%.1f" % ((cpu_s + cpu_r) * 1e3 / (usages / 1000)) if rlqs and redis else "-",
    "%.0f" % (int(tx) / usages) if rlqs else "-",
    "%.0f" % (int(assigned) / secs) if rlqs else "-",
    "%.1f" % (int(idle) / 1e6 / float(settle)),
    subscribed if rlqs else "-", reported, total,
    "%.4f" % (int(reported) / int(total)) if rlqs else "-",
    " ".join(map(str, rl)) if not rlqs else "-", load, limit or "-", streams if rlqs else "-", logged])))
EOF
  tail -1 "$ROWS" | awk -F'\t' '{
    printf "%-6s %-4s %5s tenants%s: %7s req/s (%s non-2xx, p99 %s ms)  sluice %s CPU-s (stat %s) = %s µs/req, %s req per sluice CPU-s  envoys %s µs/req",
      $1, $2, $3, ($32 == "limit" ? " (limiting rule)" : ""), $7, $8, $9, $10, $11, $16, $14, $17
    if ($1 == "redis") printf "  redis %s µs/req", $18
    if ($2 == "rlqs") printf "  usages %s/s, %s ms sluice CPU per 1,000 (%s B sent each); assignments %s/s; idle %s ms/s; streams %s, subscribed %s; reported %s of %s sent (%s)", $20, $21, $23, $24, $25, $33, $26, $27, $28, $29
    else printf "  ratelimit ok/error/over/fm_allowed %s; idle %s ms/s", $30, $25
    if ($34 != 0) printf "  ENVOY LOGGED %s warning(s) or worse", $34
    if ($2 == "rlqs" && ($29 < 0.97 || $29 > 1.03)) printf "  REPORTED IS NOT SENT"
    if ($2 == "rlqs" && $33 != $4) printf "  STREAMS ARE NOT ENVOYS"
    printf "\n" }' | tee -a "$OUT/run.txt"
  for i in "${ENVOY_PIDS[@]}"; do stop "$i"; done
  stop "$SERVER_PID"
}

ROWS=$OUT/rows.tsv
printf 'backend\tmode\ttenants\tenvoys\tseconds\trequests\treq_s\tnon2xx\tp99_ms_max\tsluice_cpu_s\tsluice_cpu_s_stat\tenvoy_cpu_s\tredis_cpu_s\treq_per_sluice_cpu_s\treq_per_sluice_redis_cpu_s\tsluice_us_per_req\tenvoy_us_per_req\tredis_us_per_req\tsluice_ms_per_s\tusages_s\tsluice_ms_per_1000_usages\tsluice_redis_ms_per_1000_usages\tenvoy_tx_bytes_per_usage\tassignments_s\tidle_sluice_ms_per_s\tsubscribed\treported\tsent\treported_over_sent\trl_ok_err_over_fm\tload1\tlimit\tstreams\tenvoy_warnings\n' >"$ROWS"
{
  echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at the start"
  echo "envoy: $("$ENVOY" --version | grep -o 'version: .*'); $ENVOYS Envoys, --concurrency 1 each"
  echo "sluice: $SLUICE ($(git rev-parse --short HEAD 2>/dev/null || echo '?')), default workers; redis-server $(redis-server --version | grep -o 'v=[^ ]*')"
  echo "per Envoy: wrk -t 1 -c $CONNECTIONS --latency, x-tenant cycling over B tenants; windows: ${WARMUP}s warm-up, ${DURATION}s measured, ${SETTLE}s settle (RLQS)"
} | tee "$OUT/run.txt"

for backend in $BACKENDS; do
  for b in $TENANTS; do
    for mode in $MODES; do
      window "$backend" "$mode" "$b" "$DURATION" "$WARMUP" 1000000
    done
  done
done
for backend in $LIMIT_BACKENDS; do
  window "$backend" rlqs "$LIMIT_TENANTS" "$LIMIT_DURATION" 0 "$LIMIT_RATE" "$LIMIT_CONFIG"
done
echo "machine: load average $(cut -d' ' -f1-3 /proc/loadavg) at the end" | tee -a "$OUT/run.txt"

# The table: per backend and tenants, RLQS beside RLS and the ratio of requests governed per
# sluice CPU-second; then the limiting windows against C + r·T.
python3 - "$ROWS" "$LIMIT_RATE" <<'EOF' | tee "$OUT/table.txt" | tee -a "$OUT/run.txt"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
rate = float(sys.argv[2])
main = [r for r in rows if r["limit"] == "-"]
head = ["backend", "tenants", "mode", "req/s", "per Envoy×bucket", "sluice µs/req", "req per sluice CPU-s", "RLQS ÷ RLS",
        "per sluice+Redis CPU-s", "Redis µs/req", "Envoy µs/req", "sluice ms/s", "usages/s",
        "sluice ms per 1,000 usages", "+Redis", "assignments/s", "idle ms/s", "reported/sent", "non-2xx", "load"]
out = [head]
by = {(r["backend"], r["tenants"], r["mode"]): r for r in main}
for r in main:
    ratio = "–"
    other = by.get((r["backend"], r["tenants"], "rls"))
    if r["mode"] == "rlqs" and other:
        ratio = "%.0f" % (float(r["req_per_sluice_cpu_s"]) / float(other["req_per_sluice_cpu_s"]))
    per = float(r["req_s"]) / (int(r["envoys"]) * int(r["tenants"]))
    out.append([r["backend"], r["tenants"], r["mode"].upper(), r["req_s"], "%.1f" % per, r["sluice_us_per_req"],
                r["req_per_sluice_cpu_s"], ratio, r["req_per_sluice_redis_cpu_s"], r["redis_us_per_req"],
                r["envoy_us_per_req"], r["sluice_ms_per_s"], r["usages_s"], r["sluice_ms_per_1000_usages"],
                r["sluice_redis_ms_per_1000_usages"], r["assignments_s"], r["idle_sluice_ms_per_s"],
                r["reported_over_sent"], r["non2xx"], r["load1"]])
w = [max(len(x[i]) for x in out) for i in range(len(head))]
for x in out:
    print("  ".join(c.ljust(w[i]) for i, c in enumerate(x)).rstrip())
for r in rows:
    if r["limit"] != "limit":
        continue
    t, b = float(r["seconds"]), int(r["tenants"])
    admitted = int(r["requests"]) - int(r["non2xx"])
    bound = b * (rate + rate * t)
    print("limiting rule, %s: %d tenants × (C %g + r %g/s × T %.1f s) = %.0f; admitted %d (%.3f of it), denied %d, of %d sent"
          % (r["backend"], b, rate, rate, t, bound, admitted, admitted / bound, int(r["non2xx"]), int(r["requests"])))
EOF
