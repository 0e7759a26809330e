"""A node under oversize messages: a real ``dgrpo node run`` daemon, a hostile peer in this process.

    .venv/bin/python benchmarks/reliability_oversize.py [--n 30] [--out oversize.json]

The hostile peer sends ``n`` signed messages of 1 MiB + 1 byte (under the transport's RPC cap, over the
protocol's ``limits.max_message_bytes``: the validator rejects them, ``oversize``) and ``n`` raw RPCs of 10 MiB
(over ``max_inbound_rpc_size``: py-libp2p resets the stream after reading the length prefix, ``oversize_rpc``;
the hostile peer reconnects for the next). Blacklisting is raised out of reach so that every message arrives.
Reports whether the daemon is alive, what its /status counted, and its RSS growth (target < 50 MB), within a
bounded time (each phase stops at ``--phase-seconds``). Prints a table and writes JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import trio
from libp2p.pubsub.pb import rpc_pb2

from dgrpo.daemon.testnet import NetNode, launch_node, stop_nodes, tcp_address
from dgrpo.net.gossip import GossipConfig, GossipNode
from dgrpo.net.hostile import send_raw_rpc, signed_message
from dgrpo.protocol.identity import Identity
from dgrpo.protocol.topics import rollout_topic

MIB = 1024 * 1024
RUN_ID = "oversize"


def status(node: NetNode) -> dict[str, Any]:
    for _ in range(50):  # the node file names the status URL once the server is up
        data = node.status()
        if data is not None:
            return data
        time.sleep(0.1)
    raise RuntimeError(f"no /status from the daemon; its log:\n{(node.state_dir / 'node.log').read_text()[-2000:]}")


def rejected(node: NetNode, reason: str) -> int:
    return int(status(node)["messages_rejected"].get(reason, 0))


def rss_mb(node: NetNode) -> float:
    return float(psutil.Process(node.process.pid).memory_info().rss) / 1e6


async def counted(node: NetNode, reason: str, target: int, timeout: float) -> bool:
    with trio.move_on_after(timeout):
        while await trio.to_thread.run_sync(rejected, node, reason) < target:
            await trio.sleep(0.02)
        return True
    return False


async def attack(node: NetNode, n: int, phase_seconds: float) -> dict[str, Any]:
    config = GossipConfig(bootstrap=(tcp_address(node),), bootstrap_backoff_initial=0.05)
    out: dict[str, Any] = {}
    async with GossipNode.open(config, Identity.generate().to_libp2p_keypair()) as hostile:
        topic = rollout_topic(RUN_ID)
        await hostile.subscribe(topic)
        await hostile.wait_for_mesh(topic, 1, timeout=60)
        await trio.sleep(2.0)  # let the daemon settle before the baseline
        out["rss_before_mb"] = rss_mb(node)
        t0 = time.monotonic()
        with trio.move_on_after(phase_seconds):
            for i in range(n):  # 1 MiB + 1 byte: through the transport, rejected by the validator
                rpc = rpc_pb2.RPC(publish=[signed_message(hostile, topic, b"x" * (MIB + 1))])
                await send_raw_rpc(hostile, node.peer_id, rpc)
                await counted(node, "oversize", i + 1, 10.0)
        out["oversize_seconds"] = time.monotonic() - t0
        t0 = time.monotonic()
        huge = rpc_pb2.RPC(publish=[signed_message(hostile, topic, b"x" * (10 * MIB))])
        with trio.move_on_after(phase_seconds):
            for i in range(n):  # 10 MiB: over the RPC cap; the stream is reset, we reconnect and send the next
                while not await counted(node, "oversize_rpc", i + 1, 1.0):
                    await send_raw_rpc(hostile, node.peer_id, huge, timeout=5.0)
        out["oversize_rpc_seconds"] = time.monotonic() - t0
        await trio.sleep(2.0)
        out["rss_after_mb"] = rss_mb(node)
        out["hostile_peer"] = hostile.peer_id
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=30, help="messages of each size")
    parser.add_argument("--phase-seconds", type=float, default=50.0, help="bound on each phase")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        extra = [f"run_id='{RUN_ID}'", "limits.blacklist_after=1000000"]
        node = launch_node(0, 2, Path(tmp), rounds=None, bootstrap=[], run_id=RUN_ID, extra=extra)
        try:
            result = trio.run(attack, node, args.n, args.phase_seconds)
            final = status(node)
            alive = node.process.poll() is None
        finally:
            clean = stop_nodes([node])
    row = {
        "n": args.n,
        "alive": alive,
        "stopped_cleanly": clean,
        "oversize": final["messages_rejected"].get("oversize", 0),
        "oversize_rpc": final["messages_rejected"].get("oversize_rpc", 0),
        "by_peer": final["rejected_by_peer_reason"].get(result["hostile_peer"], {}),
        "rss_growth_mb": round(result["rss_after_mb"] - result["rss_before_mb"], 1),
        **{k: round(v, 1) for k, v in result.items() if k != "hostile_peer"},
    }
    print("| n per size | alive | oversize (1 MiB + 1) | oversize_rpc (10 MiB) | RSS before / after MB | growth MB |")
    print("| --- | --- | --- | --- | --- | --- |")
    print(
        f"| {row['n']} | {'yes' if alive else 'no'} | {row['oversize']} | {row['oversize_rpc']} "
        f"| {row['rss_before_mb']} / {row['rss_after_mb']} | {row['rss_growth_mb']} |"
    )
    print(f"phases: {row['oversize_seconds']} s (1 MiB + 1), {row['oversize_rpc_seconds']} s (10 MiB)")
    if args.out is not None:
        args.out.write_text(json.dumps(row, indent=2) + "\n")


if __name__ == "__main__":
    main()
