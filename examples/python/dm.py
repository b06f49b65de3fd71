#!/usr/bin/env python3
"""Send and receive DMs through the hub router from Python (nats-py), with nothing but the wire
protocol of docs/PROTOCOL.md: proof that it is language-neutral.

    PYTHONPATH=.tools/pylib python3 examples/python/dm.py nats://127.0.0.1:4222 alice bob 3

usage: dm.py NATS_URL SENDER RECIPIENT N (-h/--help prints it and exits 0; wrong arguments print
it on one line to stderr and exit 64; a NATS server that cannot be reached, or nats-py missing,
exits 69).

Sends N DMs from <sender> to <recipient> through the ingress (a JetStream publish to
hub.pub.<sender>.inbox), then attaches as <recipient> (request on hub.delivery.<recipient>.inbox;
the router creates inbox-<recipient>), pulls the DMs from the returned consumer, acks them and
prints one JSON line per DM: {"id", "from", "body"}. Exits 0 when all N arrived.
"""
import asyncio
import json
import re
import sys
import uuid

USAGE = "usage: dm.py NATS_URL SENDER RECIPIENT N"
EXIT_USAGE = 64
EXIT_UNAVAILABLE = 69
# AgentId: 1-128 bytes of [A-Za-z0-9_-], not starting with the reserved `hub-` (docs/PROTOCOL.md).
AGENT_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
SCHEMES = ("nats://", "tls://", "ws://", "wss://")


class UsageError(Exception):
    """Arguments this script cannot use; the message says what is wrong."""


def agent_id(what: str, value: str) -> str:
    if not AGENT_ID.fullmatch(value) or value.startswith("hub-"):
        raise UsageError(f"{what} must be an agent id ([A-Za-z0-9_-], 1-128 bytes, not hub-...), got {value!r}")
    return value


def parse_args(argv: list) -> tuple:
    """(url, sender, recipient, n) from the arguments after the script name."""
    if len(argv) != 4:
        raise UsageError(f"expected 4 arguments, got {len(argv)}")
    url, sender, recipient, n = argv
    if not url.startswith(SCHEMES):
        raise UsageError("NATS_URL must start with nats://, tls://, ws:// or wss://")
    if not re.fullmatch(r"[0-9]+", n) or int(n) < 1:
        raise UsageError(f"N must be a positive integer, got {n!r}")
    return url, agent_id("SENDER", sender), agent_id("RECIPIENT", recipient), int(n)


def shown_url(url: str) -> str:
    """The URL without any credentials before an `@`."""
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.rpartition('@')[2]}" if "@" in rest else url


async def main(url: str, sender: str, recipient: str, n: int) -> int:
    try:
        import nats  # after the arguments: printing the usage needs no NATS client
    except ImportError:
        print("dm.py: nats-py is not installed: run scripts/setup.sh, then PYTHONPATH=.tools/pylib", file=sys.stderr)
        return EXIT_UNAVAILABLE

    async def quiet(_error: Exception) -> None:
        pass  # nats-py prints a traceback per failed attempt by default; one line below says it

    try:
        # One attempt and one retry, then NoServersError (0 would mean: retry forever).
        nc = await nats.connect(
            url,
            allow_reconnect=False,
            max_reconnect_attempts=1,
            reconnect_time_wait=0.5,
            connect_timeout=5,
            error_cb=quiet,
        )
    except Exception as e:  # nats-py raises several kinds; all mean "not reachable"
        print(f"dm.py: cannot connect to nats at {shown_url(url)}: {type(e).__name__}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    js = nc.jetstream()

    run = uuid.uuid4().hex[:8]
    for i in range(n):
        envelope = {"meta": {"id": f"py-{run}-{i}", "to": recipient}, "body": f"hello {i} from python"}
        ack = await js.publish(f"hub.pub.{sender}.inbox", json.dumps(envelope).encode())
        assert ack.stream == "HUB_INGRESS", ack

    reply = await nc.request(f"hub.delivery.{recipient}.inbox", b"{}", timeout=5)
    attached = json.loads(reply.data)
    if "error" in attached:
        print(f"attach refused: {attached['error']}", file=sys.stderr)
        return 1
    sub = await js.pull_subscribe_bind(durable=attached["consumer"], stream=attached["stream"])

    got = 0
    wanted = {f"py-{run}-{i}" for i in range(n)}
    while wanted:
        try:
            msgs = await sub.fetch(batch=min(n, 100), timeout=10)
        except nats.errors.TimeoutError:
            print(f"timed out with {len(wanted)} DMs missing", file=sys.stderr)
            return 1
        for msg in msgs:
            env = json.loads(msg.data)
            meta = env["meta"]
            await msg.ack()
            if meta["id"] in wanted:
                wanted.discard(meta["id"])
                got += 1
                print(json.dumps({"id": meta["id"], "from": meta.get("from"), "body": env["body"]}))
    await nc.drain()
    return 0


if __name__ == "__main__":
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(USAGE)
        sys.exit(0)
    try:
        args = parse_args(sys.argv[1:])
    except UsageError as e:
        print(f"dm.py: {e}; {USAGE}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    sys.exit(asyncio.run(main(*args)))
