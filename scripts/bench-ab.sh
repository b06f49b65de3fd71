#!/usr/bin/env bash
# Alternating A/B runs of bench_dm and bench_task (docs/PERFORMANCE.md): this checkout's release
# examples against another build's, five runs each, one after the other, then the medians.
#
#   git worktree add /tmp/old REV && CARGO_TARGET_DIR=/tmp/old-target \
#     cargo build --release -p examples --examples --manifest-path /tmp/old/Cargo.toml
#   cargo build --release -p examples --examples
#   scripts/bench-ab.sh /tmp/old-target/release/examples > ab.log; python3 scripts/bench_medians.py ab.log
set -euo pipefail
old=${1:?usage: scripts/bench-ab.sh OLD_EXAMPLES_DIR}
here=$(cd "$(dirname "$0")/.." && pwd)
new=$here/target/release/examples
export NATS_SERVER_BIN=${NATS_SERVER_BIN:-$here/.tools/bin/nats-server} RUST_LOG=warn
for i in 1 2 3 4 5; do
  echo "=== dm new $i"; "$new/bench_dm" 50000 1 3 2>&1 | tail -12
  echo "=== dm old $i"; "$old/bench_dm" 50000 1 3 2>&1 | tail -12
done
for i in 1 2 3 4 5; do
  echo "=== task new $i"; "$new/bench_task" 2000 3 3 2>&1 | tail -15
  echo "=== task old $i"; "$old/bench_task" 2000 3 3 2>&1 | tail -15
done
