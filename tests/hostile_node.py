#!/usr/bin/env python3
"""A hostile bootstrap node for the join tests (``tests/test_nat.py``, row 5): a real libp2p process that

* serves a **forged run manifest**: the honest run's manifest (read from the creator's ``manifest.json``),
  same run id and settings, re-signed by its own key (``--forge``), or the honest document unchanged;
* keeps ``--sybils`` **Sybil identities** in the run, each its own libp2p host with its own key, heartbeating
  on the run's control topic with its own (dialable) address, and never doing any work;
* tries to **eclipse** whoever joins through it: its gossipsub validators pass only its Sybils' messages, so
  nothing an honest node publishes is forwarded by it.

It stops by itself after ``--seconds``. Usage (inside the NAT lab's internet namespace)::

    python tests/hostile_node.py --ip 203.0.113.1 --port 4002 --bootstrap <relay addr> \\
        --manifest R/manifest.json --forge --sybils 8 --out hostile.json --seconds 600
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import AsyncExitStack
from pathlib import Path

import trio

from dgrpo.daemon.manifest_exchange import ManifestService
from dgrpo.daemon.run_manifest import load_manifest
from dgrpo.net.gossip import GossipConfig, GossipNode
from dgrpo.net.traversal_config import TraversalConfig
from dgrpo.protocol.envelope import HeartbeatBody, Signer
from dgrpo.protocol.identity import Identity
from dgrpo.protocol.manifest import RunManifest, sign_manifest
from dgrpo.protocol.topics import control_topic, rollout_topic

HEARTBEAT_SECONDS = 0.5
PLAIN = TraversalConfig(use_relays=False, hole_punching=False, reachability_interval=3600.0)


class Nonces:
    def __init__(self) -> None:
        self.value = 0

    def next(self) -> int:
        self.value += 1
        return self.value


async def sybil(node: GossipNode, identity: Identity, run_id: str) -> None:
    signer = Signer(identity, run_id, Nonces())
    await node.subscribe(control_topic(run_id))
    address = f"{node.local_addrs()[0]}"
    while True:  # idle: round 0, nothing done, never a rollout
        body = HeartbeatBody(round=0, rounds_done=0, status="running", listen_addrs=(address,))
        await node.publish(control_topic(run_id), signer.sign_heartbeat(body, 0))
        await trio.sleep(HEARTBEAT_SECONDS)


async def main(args: argparse.Namespace) -> None:
    honest = load_manifest(Path(args.manifest))
    assert honest is not None, f"no manifest in {args.manifest}"
    me = Identity.generate()
    served = honest
    if args.forge:  # the same run, signed by us
        body = RunManifest.model_validate({**honest.manifest.model_dump(mode="json"), "creator": me.public_bytes.hex()})
        served = sign_manifest(me, body)
    run_id = honest.manifest.run_id
    sybils = [Identity.generate() for _ in range(args.sybils)]
    sybil_ids = {s.peer_id for s in sybils}
    config = GossipConfig(listen=f"/ip4/{args.ip}/tcp/{args.port}", bootstrap=tuple(args.bootstrap))
    with trio.move_on_after(args.seconds):
        async with GossipNode.open(config, me.to_libp2p_keypair(), PLAIN) as hub:
            ManifestService(served, "created").serve(hub)
            for topic in (control_topic(run_id), rollout_topic(run_id)):
                hub.set_validator(topic, lambda data, source, forwarder: source in sybil_ids)
                await hub.subscribe(topic)
            hub_addr = hub.local_addrs()[0]
            async with AsyncExitStack() as stack, trio.open_nursery() as nursery:
                for i, identity in enumerate(sybils):
                    cfg = GossipConfig(listen=f"/ip4/{args.ip}/tcp/{args.port + 1 + i}", bootstrap=(hub_addr,))
                    node = await stack.enter_async_context(GossipNode.open(cfg, identity.to_libp2p_keypair(), PLAIN))
                    nursery.start_soon(sybil, node, identity, run_id)
                info = {"peer_id": me.peer_id, "address": hub_addr, "sybils": sorted(sybil_ids)}
                info["manifest_sha256"] = served.sha256
                Path(args.out).write_text(json.dumps(info, indent=2))
                await trio.sleep_forever()


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ip", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--bootstrap", action="append", default=[])
    p.add_argument("--manifest", required=True, help="the honest creator's manifest.json")
    p.add_argument("--forge", action="store_true", help="serve the manifest re-signed by this node's key")
    p.add_argument("--sybils", type=int, default=8)
    p.add_argument("--out", required=True, help="where to write this node's address and its Sybils' ids")
    p.add_argument("--seconds", type=float, default=600.0, help="stop after this long")
    return p.parse_args(argv)


if __name__ == "__main__":
    trio.run(main, parse(sys.argv[1:]))
