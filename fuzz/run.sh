#!/usr/bin/env bash
# Runs every cargo-fuzz target for a bounded time and prints how many inputs each executed.
#
#   fuzz/run.sh [SECONDS]        # per target; default 60
#
# Exit status: 0 when every target ran clean (or fuzzing is impossible on this machine, said
# loudly as SKIPPED), 1 when a target crashed, hung or ran out of memory (the reproducer is kept
# in fuzz/artifacts/<target>/) or the targets do not build.
#
# No nightly toolchain is needed: RUSTC_BOOTSTRAP=1 lets the installed compiler accept the
# sanitizer flags cargo-fuzz passes. The committed corpus (fuzz/corpus/<target>/) is read, never
# written: new inputs go to a scratch directory.
set -euo pipefail

seconds="${1:-60}"
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -lt 1 ]; then
    echo "usage: fuzz/run.sh [SECONDS]" >&2
    exit 2
fi

fuzz_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$fuzz_dir")"
targets=(config key decision wire)

skip() {
    echo "fuzz: SKIPPED: $*"
    exit 0
}

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz from crates.io"
    cargo install cargo-fuzz --locked --quiet || skip "cargo-fuzz could not be installed"
fi

export RUSTC_BOOTSTRAP=1

# Can this compiler build with libFuzzer's instrumentation and AddressSanitizer at all? If not,
# that is the machine, not the code: skip. A failure to build the targets below is the code.
probe_dir="$(mktemp -d)"
scratch="$(mktemp -d)"
trap 'rm -rf "$probe_dir" "$scratch"' EXIT
echo 'fn main() {}' >"$probe_dir/probe.rs"
if ! rustc -Zsanitizer=address -Cpasses=sancov-module \
    -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
    -o "$probe_dir/probe" "$probe_dir/probe.rs" >"$probe_dir/log" 2>&1; then
    cat "$probe_dir/log"
    skip "this Rust toolchain cannot build sanitizer-instrumented code"
fi

cd "$root"
echo "fuzz: building ${targets[*]}"
if ! cargo fuzz build --fuzz-dir fuzz -a >"$scratch/build.log" 2>&1; then
    tail -n 60 "$scratch/build.log"
    echo "fuzz: FAILED: the fuzz targets do not build"
    exit 1
fi

# Inputs larger than this are not generated (seeds may be larger): configs and requests
# beyond a few KiB add run time, not coverage.
max_len=8192
failed=()
for target in "${targets[@]}"; do
    mkdir -p "$scratch/$target"
    log="$scratch/$target.log"
    status=0
    cargo fuzz run --fuzz-dir fuzz -a "$target" "$scratch/$target" "fuzz/corpus/$target" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len="$max_len" \
        -print_final_stats=1 >"$log" 2>&1 || status=$?
    runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)"
    corpus="$(find "$scratch/$target" "fuzz/corpus/$target" -type f | wc -l)"
    if [ "$status" -ne 0 ]; then
        tail -n 40 "$log"
        echo "fuzz: $target: FAILED after ${runs:-?} executions (exit $status)"
        failed+=("$target")
    else
        echo "fuzz: $target: ${runs:-?} executions in ${seconds}s, corpus $corpus inputs"
    fi
done

if [ "${#failed[@]}" -gt 0 ]; then
    echo "fuzz: FAILED: ${failed[*]} (reproducers in fuzz/artifacts/)"
    exit 1
fi
echo "fuzz: ${#targets[@]} targets ran clean"
