#!/usr/bin/env bash
# The main job: start a local nats-server with JetStream (installed by scripts/setup.sh into
# .tools/, store in .nats-data/), then `runtime start --role router --durable` and a worker
# (`--role worker` running deploy/worker-echo.py per task) against it; check that the router
# created its streams and answers `runtime status`, then delegate a demo task and print its
# result.
#   scripts/run.sh           keep running until Ctrl-C (stops both)
#   scripts/run.sh --smoke   exit 0 right after the check (non-zero when it fails)
# Env: NATS_PORT (default 4222), RUST_LOG, NATS_HUB_DELIVERY_CONFIG, OTEL_EXPORTER_OTLP_ENDPOINT.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
smoke=0
[ "${1:-}" = "--smoke" ] && smoke=1
port="${NATS_PORT:-4222}"
bash scripts/setup.sh >&2
cargo build --quiet --locked -p runtime --bin runtime
bin="$root/target/debug/runtime"
data="$root/.nats-data/$port"
mkdir -p "$data"
cat > "$data/nats-server.conf" <<CONF
listen: 127.0.0.1:$port
jetstream {
  store_dir: "$data/store"
  # fsync before every ack: acknowledged data survives power loss (see docs/SEMANTICS.md)
  sync_interval: always
}
CONF
export NATS_URL="nats://127.0.0.1:$port"
pids=()
# Stops in the reverse order of the starts, each before the next: the router finishes its
# graceful stop (its last acks and audit events) while nats-server still runs.
cleanup() {
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill -TERM "${pids[i]}" 2>/dev/null || true
    wait "${pids[i]}" 2>/dev/null || true
  done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$root/.tools/bin/nats-server" -c "$data/nats-server.conf" > "$data/nats-server.log" 2>&1 &
pids+=($!)
"$bin" start --role router --durable &
pids+=($!)

snapshot=""
for _ in $(seq 1 100); do
  if snapshot="$("$bin" status --timeout-secs 1 2>/dev/null)"; then break; fi
  snapshot=""
  sleep 0.2
done
if [ -z "$snapshot" ]; then
  echo "run: the router did not answer \`runtime status\` on $NATS_URL" >&2
  exit 1
fi
echo "$snapshot"
for stream in HUB_INGRESS HUB_INBOX HUB_TASKS; do
  if ! grep -q "\"$stream\"" <<<"$snapshot"; then
    echo "run: stream $stream missing from the router's snapshot" >&2
    exit 1
  fi
done
echo "run: router is up on $NATS_URL with streams HUB_INGRESS, HUB_INBOX, HUB_TASKS" >&2
# The worker joins its queue through the router, so it starts once the router answers.
"$bin" start --role worker --durable --worker-id demo-worker --queue demo \
  --exec "python3 $root/deploy/worker-echo.py" --journal-dir "$data/journal" &
pids+=($!)
echo "run: delegating a demo task to queue demo" >&2
if ! result="$("$bin" delegate --as demo-user --queue demo "hello from scripts/run.sh" --wait --timeout-secs 60)"; then
  echo "run: the demo task did not complete" >&2
  exit 1
fi
echo "$result"
if ! grep -q '"state":"completed"' <<<"$result"; then
  echo "run: the demo task did not complete" >&2
  exit 1
fi
if [ "$smoke" = 1 ]; then exit 0; fi
echo "run: Ctrl-C stops the router and nats-server" >&2
wait
