# Shared by script-instructions.sh and script-time.sh (sourced, not run): the tool check, a
# scratch directory, and a private redis-server's pid (`pid`, set by the caller when it starts
# one) stopped on exit. Unlike common.sh it builds nothing: these measure Redis alone.
# needs TOOL...: exits unless each is installed.
needs() {
  local tool
  for tool in "$@"; do
    command -v "$tool" >/dev/null || { echo "error: $tool not found" >&2; exit 1; }
  done
}
TMP=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT
# free_port: a free port from the kernel's ephemeral range on loopback (so never 6379).
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
# wait_for_redis PORT: until it answers PING (20 s at most; under valgrind start-up is slow).
wait_for_redis() {
  for _ in $(seq 100); do redis-cli -p "$1" ping >/dev/null 2>&1 && return 0; sleep 0.2; done
  echo "error: no redis-server on port $1" >&2
  exit 1
}
