# Shared by the benchmark scripts (sourced, not run): builds the release binaries, keeps the pids
# of everything started so an exit, error or Ctrl-C stops them, and starts a private redis-server
# on a free loopback port (never 6379).
# SLUICE=path BENCH=path: use those binaries instead (A/B runs of two builds); no build then.
if [ -z "${SLUICE:-}" ]; then
  cargo build --release --locked -p sluice -p sluice-bench --bins
fi
SLUICE=${SLUICE:-target/release/sluice}
BENCH=${BENCH:-target/release/sluice-bench}
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
