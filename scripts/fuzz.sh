#!/usr/bin/env bash
# The fuzzing program (issue 29 §7): runs every cargo-fuzz target of fuzz/ (libFuzzer, nightly)
# for a set number of inputs, one target at a time and under `nice`, and prints per target the
# inputs run, the time, exec/s, libFuzzer's coverage (cov, ft) and whether it found a crash.
#
#   scripts/fuzz.sh [RUNS] [TARGET...]
#
# RUNS: inputs per target (default 10000000). TARGET: the targets to run (default: all of
# fuzz/fuzz_targets/). FUZZ_MAX_TIME: a safety cap in seconds per target (default 600; a
# target slower than RUNS/FUZZ_MAX_TIME exec/s stops there, and its real count is printed).
#
# New inputs go to fuzz/corpus/<target>/ and crashes to fuzz/artifacts/<target>/. Afterwards:
# minimise the corpus (`cd fuzz && cargo +nightly fuzz cmin -a <target>`), and replay it with
# `cargo test -p fuzz_checks` (tests/fuzz_checks/tests/replay.rs). Exits non-zero when a target
# crashed. Needs the nightly toolchain; installs cargo-fuzz when it is missing.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root/fuzz"

runs="${1:-10000000}"
shift || true
max_time="${FUZZ_MAX_TIME:-600}"
if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    targets=()
    for f in fuzz_targets/*.rs; do
        targets+=("$(basename "$f" .rs)")
    done
fi

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "fuzz.sh: the nightly toolchain is needed (rustup toolchain install nightly)" >&2
    exit 2
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "== installing cargo-fuzz"
    nice -n 10 cargo install cargo-fuzz --locked
fi

# `-a`: debug assertions and overflow checks, as `cargo test` replays the corpus with.
fuzz_flags=(-a)
logs="$root/fuzz/target/fuzz-logs"
mkdir -p "$logs"
echo "== building the targets"
nice -n 10 cargo +nightly fuzz build "${fuzz_flags[@]}"

printf '%-18s %12s %8s %9s %7s %8s  %s\n' target runs time_s exec/s cov ft crash
crashed=0
for target in "${targets[@]}"; do
    log="$logs/$target.log"
    mkdir -p "corpus/$target"
    start=$(date +%s)
    # A dictionary of tokens the target's inputs are made of (fuzz/dicts/).
    case "$target" in
        subjects) dict=(-dict=dicts/subjects.dict) ;;
        envelope_msgpack | audit) dict=() ;;
        *) dict=(-dict=dicts/json.dict) ;;
    esac
    status=0
    nice -n 10 cargo +nightly fuzz run "${fuzz_flags[@]}" "$target" -- "${dict[@]}" \
        -runs="$runs" -max_total_time="$max_time" -print_final_stats=1 >"$log" 2>&1 || status=$?
    # libFuzzer's own time (`Done <n> runs in <t> second(s)`), else the wall clock (a build).
    elapsed=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)
    elapsed="${elapsed:-$(($(date +%s) - start))}"
    done_runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    exec_s=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    # The last status line of libFuzzer: `#<n> <what> cov: <c> ft: <f> ...`.
    last=$(grep -E '^#[0-9]+' "$log" | grep -E 'cov: ' | tail -1 || true)
    cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
    ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
    if [ -z "$done_runs" ]; then
        done_runs=$(sed -n 's/^#\([0-9]*\).*/\1/p' <<<"$last")
    fi
    crash=no
    if [ "$status" -ne 0 ]; then
        crashed=$((crashed + 1))
        artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
        crash="yes (exit $status${artifact:+, $artifact}; log $log)"
    fi
    printf '%-18s %12s %8s %9s %7s %8s  %s\n' "$target" "${done_runs:-?}" "$elapsed" \
        "${exec_s:-?}" "${cov:-?}" "${ft:-?}" "$crash"
done
echo "${#targets[@]} targets, $crashed crashed"
[ "$crashed" -eq 0 ]
