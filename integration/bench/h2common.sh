# Shared by h2load.sh, shards.sh and batch.sh (sourced with OUT set, and EXTRA_TOOLS naming any
# tool beyond h2load, curl, redis-server and redis-cli): the load defaults, the tool check, then
# common.sh; the one gRPC request body, its check, the closed-loop peak, the open-loop half-peak
# run and a Redis node's script-call counter.
CLIENTS=${CLIENTS:-16}
STREAMS=${STREAMS:-32}
DURATION=${DURATION:-5}
WARMUP=${WARMUP:-1}
REDIS_TIMEOUT=${REDIS_TIMEOUT:-200ms}
for tool in h2load curl redis-server redis-cli ${EXTRA_TOOLS:-}; do
  command -v "$tool" >/dev/null || { echo "error: $tool not found (h2load: apt-get install nghttp2-client)" >&2; exit 1; }
done
mkdir -p "$OUT"
source integration/bench/common.sh

# script_calls PORT: EVALSHA + EVAL calls the Redis node on PORT has run.
script_calls() {
  redis-cli -p "$1" info commandstats |
    awk -F'[:=,]' '/^cmdstat_(evalsha|eval):/ { n += $3 } END { print n + 0 }'
}

# RateLimitRequest { domain: "bench", descriptors: [{ entries: [{ key: "k", value: "v1" }] }],
# hits_addend: 1 } as protobuf (20 bytes), behind the 5-byte gRPC frame header.
BODY=$OUT/request.bin
printf '\x00\x00\x00\x00\x14\x0a\x05bench\x12\x09\x0a\x07\x0a\x01k\x12\x02v1\x18\x01' >"$BODY"
PATH_RLS=/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit
HEADERS=(-H 'content-type: application/grpc' -H 'te: trailers')

# check ADDR: the body gets a real OK decision (not a gRPC error in the trailers).
check() {
  local dump="$TMP/check.headers" reply="$TMP/check.bin"
  curl -s --http2-prior-knowledge "${HEADERS[@]}" --data-binary @"$BODY" -D "$dump" \
    -o "$reply" "http://$1$PATH_RLS"
  grep -q '^HTTP/2 200' "$dump" || { echo "error: $1 answered $(head -1 "$dump")" >&2; exit 1; }
  grep -qi '^grpc-status: 0' "$dump" || { echo "error: $1: $(grep -i grpc- "$dump" | tr -d '\r')" >&2; exit 1; }
  # Byte 6–7 of the reply: field 1 (overall_code) = 1 (OK).
  [ "$(od -An -tx1 -j5 -N2 "$reply" | tr -d ' \n')" = 0801 ] ||
    { echo "error: $1: overall_code is not OK: $(od -An -tx1 "$reply")" >&2; exit 1; }
}

# peak LABEL ADDR: closed loop; prints and sets PEAK (req/s).
peak() {
  local out="$OUT/$1.peak.txt"
  h2load -c "$CLIENTS" -m "$STREAMS" -D "$DURATION" --warm-up-time "$WARMUP" "${HEADERS[@]}" \
    -d "$BODY" "http://$2$PATH_RLS" >"$out"
  PEAK=$(awk '/^finished in/ {gsub(",", ""); for (i = 1; i <= NF; i++) if ($i == "req/s") print $(i - 1)}' "$out")
  local codes errored
  codes=$(grep '^status codes:' "$out")
  errored=$(awk '/^requests:/ {for (i = 1; i <= NF; i++) if ($(i + 1) ~ /^errored/) print $i}' "$out")
  printf '%-14s peak %8.0f req/s  (%s; errored %s)\n' "$1" "$PEAK" "$codes" "$errored"
}

# fixed LABEL ADDR RATE CONNECTIONS STREAMS: open loop at RATE req/s in all (--rps per
# connection) over CONNECTIONS × STREAMS; prints p50/p90/p99 from the per-request log (µs).
# h2load appends to a log file, so each run starts a new one.
fixed() {
  local name="$1.$3.c$4m$5" rps
  local log="$OUT/$name.log"
  rm -f "$log"
  rps=$(awk -v r="$3" -v c="$4" 'BEGIN { r = r / c; print (r < 1 ? 1 : int(r)) }')
  h2load -c "$4" -m "$5" -D "$DURATION" --warm-up-time "$WARMUP" --rps "$rps" \
    "${HEADERS[@]}" -d "$BODY" --log-file "$log" "http://$2$PATH_RLS" >"$OUT/$name.txt"
  # Log lines: start time, HTTP status, duration (µs).
  # Answered below the offered rate: h2load fell behind (a connection's calls waited for its
  # streams), so the latencies understate the offered load's.
  cut -f3 "$log" | sort -n | awk -v label="$1" -v offered="$((rps * $4))" -v shape="$4 x $5" -v d="$DURATION" '
    { v[NR] = $1 }
    END { printf "%-14s at %6d req/s offered over %-7s: p50 %5.0f us, p90 %5.0f us, p99 %6.0f us (answered %d/s)\n",
          label, offered, shape, v[int(NR * 0.50) + 1], v[int(NR * 0.90) + 1], v[int(NR * 0.99) + 1], NR / d }'
}

# half LABEL ADDR: fixed load at half of PEAK, with the peak's connections and streams and with
# one stream per connection (h2load's --rps releases a connection's calls in bursts of up to its
# streams, which queue behind each other).
half() {
  local rate
  rate=$(awk -v p="$PEAK" 'BEGIN { print int(p / 2) }')
  fixed "$1" "$2" "$rate" "$CLIENTS" "$STREAMS"
  fixed "$1" "$2" "$rate" "$CLIENTS" 1
}

start() { # start NAME CONFIG_DIR ARGS...: sets ADDR
  local name=$1 config=$2 grpc
  shift 2
  grpc=$($BENCH free-port)
  $SLUICE serve --config "$config" --grpc-addr "127.0.0.1:$grpc" \
    --admin-addr 127.0.0.1:0 --log-level warn "$@" >"$TMP/$name.out" 2>&1 &
  started+=("$!")
  wait_ready "$TMP/$name.out" "sluice ready" "$!"
  ADDR=127.0.0.1:$grpc
}
