#!/usr/bin/env bash
# The test command (README "Set up"): every Rust test (unit, in-process end-to-end, and
# integration tests against real redis-server processes) plus validation of deploy/.
# Needs redis-server/redis-cli (Debian package `redis-server`) and python3; .ci/run installs them.
set -euo pipefail
cd "$(dirname "$0")/.."

for tool in redis-server redis-cli faketime; do
  if ! command -v "$tool" >/dev/null; then
    echo "error: $tool not found: install it from Debian (apt-get install -y redis-server faketime)" >&2
    exit 1
  fi
done

if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --all-targets --locked --profile "${NEXTEST_PROFILE:-default}"
else
  echo "cargo-nextest not found; falling back to cargo test" >&2
  cargo test --workspace --all-targets --locked
fi

# Fuzz targets, each for a bounded time (FUZZ_SECONDS per target; 0 skips).
if [ "${FUZZ_SECONDS:-20}" -gt 0 ] && [ -x fuzz/run.sh ]; then
  fuzz/run.sh "${FUZZ_SECONDS:-20}"
fi

if [ -f deploy/validate.py ]; then
  venv="${SLUICE_VENV:-target/venv}"
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
  fi
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r deploy/requirements.txt
  "$venv/bin/python" deploy/validate.py
  "$venv/bin/python" -m pytest -q deploy/test_validate.py
fi
