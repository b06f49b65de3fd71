#!/usr/bin/env python3
"""Send and receive DMs through the hub router from Python (nats-py), with nothing but the wire
protocol of docs/PROTOCOL.md: proof that it is language-neutral.

    PYTHONPATH=.tools/pylib python3 examples/python/dm.py nats://127.0.0.1:4222 alice bob 3

Sends N DMs from <sender> to <recipient> through the ingress (a JetStream publish to
hub.pub.<sender>.inbox), then attaches as <recipient> (request on hub.delivery.<recipient>.inbox;
the router creates inbox-<recipient>), pulls the DMs from the returned consumer, acks them and
prints one JSON line per DM: {"id", "from", "body"}. Exits 0 when all N arrived.
"""
import asyncio
import json
import sys
import uuid

import nats


async def main(url: str, sender: str, recipient: str, n: int) -> int:
    nc = await nats.connect(url)
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
    url, sender, recipient, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    sys.exit(asyncio.run(main(url, sender, recipient, n)))
