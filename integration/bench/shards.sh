#!/usr/bin/env bash
# Hot-key splitting measured: one hot descriptor (every request `k=v1`) against a 3-master Redis
# Cluster, with its rule unsplit (integration/bench/config-cluster) and with `shards: 4`
# (integration/bench/config-shards). Prints each run's h2load peak and how the script calls
# spread over the masters (each node's own INFO commandstats): unsplit, one master takes them
# all; split, the shards' slots share them.
#
#   integration/bench/shards.sh      # needs h2load (apt-get install nghttp2-client) and curl
#
# On this 2-core machine the three masters, sluice and h2load share the cores, so the peak
# cannot show what a real Cluster gains from spreading one tenant: the share of the busiest
# master is the figure that carries over (it bounds one tenant's rate at one master's ceiling).
# Starts its own Cluster on free loopback ports (never 6379); stops every process it started.
set -euo pipefail
cd "$(dirname "$0")/../.."

OUT=${OUT:-target/bench/shards}
source integration/bench/h2common.sh

ports=()
for i in 1 2 3; do
  port=$($BENCH free-port)
  mkdir -p "$TMP/node$i"
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$TMP/node$i" \
    --cluster-enabled yes --cluster-config-file nodes.conf --logfile "$TMP/node$i.log" &
  started+=("$!")
  ports+=("$port")
done
for port in "${ports[@]}"; do
  for _ in $(seq 100); do
    redis-cli -p "$port" ping 2>/dev/null | grep -q PONG && break
    sleep 0.1
  done
done
redis-cli --cluster create "${ports[@]/#/127.0.0.1:}" --cluster-replicas 0 --cluster-yes >"$TMP/create.log"
for _ in $(seq 100); do
  redis-cli -p "${ports[0]}" cluster info | grep -q 'cluster_state:ok' && break
  sleep 0.1
done
urls=$(printf 'redis://127.0.0.1:%s,' "${ports[@]}")
urls=${urls%,}

echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); 3 masters on ports ${ports[*]}"
for target in "unsplit integration/bench/config-cluster" "shards-4 integration/bench/config-shards"; do
  read -r label config <<<"$target"
  start "$label" "$config" --backend redis --redis-mode cluster --redis-url "$urls" \
    --redis-timeout "$REDIS_TIMEOUT"
  check "$ADDR"
  before=()
  for port in "${ports[@]}"; do before+=("$(script_calls "$port")"); done
  peak "$label" "$ADDR"
  shares=() total=0 most=0
  for i in 0 1 2; do
    n=$(($(script_calls "${ports[$i]}") - before[i]))
    shares+=("$n")
    total=$((total + n))
    [ "$n" -gt "$most" ] && most=$n
  done
  awk -v l="$label" -v a="${shares[0]}" -v b="${shares[1]}" -v c="${shares[2]}" -v t="$total" -v m="$most" \
    'BEGIN { printf "%-14s script calls per master %d / %d / %d; busiest master %.0f %% of %d\n", l, a, b, c, 100 * m / t, t }' |
    tee -a "$OUT/shares.txt"
  check "$ADDR"
  stop "${started[-1]}"
done
