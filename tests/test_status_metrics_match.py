"""A real 3-daemon testnet with rejections at every stage: each daemon's /metrics counters equal its /status
counts, read at a moment when nothing changes (the rounds are over; the daemons linger and keep serving)."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import trio
from libp2p.pubsub.pb import rpc_pb2
from prometheus_client.parser import text_string_to_metric_families

from dgrpo.daemon.testnet import NetNode, start_testnet, stop_nodes, tcp_address, wait_rounds
from dgrpo.net.gossip import GossipConfig, GossipNode
from dgrpo.net.hostile import send_raw_rpc, signed_message
from dgrpo.protocol.identity import Identity
from dgrpo.protocol.topics import rollout_topic

pytestmark = pytest.mark.slow  # real processes

FAST = ["rounds.deadline_seconds=20", "rounds.peer_timeout_seconds=6", "sampling.max_new_tokens=96"]
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


def _samples(text: str) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.endswith("_created")
    }


def _family(samples: Samples, name: str, *labels: str) -> dict[Any, float]:
    """``name``'s samples keyed by the values of ``labels`` (one label: the value itself)."""
    out: dict[Any, float] = {}
    for (sample, key), value in samples.items():
        if sample == name:
            values = tuple(dict(key)[label] for label in labels)
            out[values[0] if len(values) == 1 else values] = value
    return out


def _pairs(table: dict[str, dict[str, int]]) -> dict[tuple[str, str], float]:
    return {(peer, reason): float(n) for peer, reasons in table.items() for reason, n in reasons.items()}


COMPARED = (
    "state", "round", "messages_accepted", "messages_rejected", "rejected_by_peer", "rejected_by_peer_reason",
    "round_rejections", "round_rejections_by_peer", "round_rejections_by_peer_reason", "completions_trained",
    "blacklisted_peers",
)  # fmt: skip


def _still(node: NetNode) -> tuple[dict[str, Any], Samples]:
    """/status and /metrics of ``node`` read while none of the compared counts changed (/status before and
    after equal). Lingering daemons still accept heartbeats, so this retries until a quiet moment."""
    assert node.status_url is not None
    for _ in range(100):
        before = json.loads(_get(node.status_url + "/status"))
        metrics = _samples(_get(node.status_url + "/metrics"))
        after = json.loads(_get(node.status_url + "/status"))
        if after["state"] == "done" and all(before[k] == after[k] for k in COMPARED):
            return after, metrics
        time.sleep(0.1)
    raise AssertionError(f"node-{node.index}'s /status kept changing (or never reached state done)")


async def _hostile(target: NetNode, run_id: str) -> str:
    """A peer that sends node ``target`` two malformed messages (validator: ``malformed``) and one RPC over the
    transport's cap (``oversize_rpc``); its peer id."""
    config = GossipConfig(bootstrap=(tcp_address(target),), bootstrap_backoff_initial=0.05)
    async with GossipNode.open(config, Identity.generate().to_libp2p_keypair()) as node:
        topic = rollout_topic(run_id)
        await node.subscribe(topic)
        await node.wait_for_mesh(topic, 1, timeout=30)
        for junk in (b"\xc1", b"\x00junk"):
            await node.publish(topic, junk)
        huge = rpc_pb2.RPC(publish=[signed_message(node, topic, b"x" * (2 * 1024 * 1024))])
        await send_raw_rpc(node, target.peer_id, huge)
        await trio.sleep(1.0)
        return node.peer_id


def test_metrics_counters_equal_status_counts_on_every_daemon(tmp_path: Path) -> None:
    nodes = start_testnet(3, tmp_path, rounds=2, defense=["sampling-proof"], extra=FAST, adversary=("over-publish", 1))
    try:
        hostile = trio.run(_hostile, nodes[0], "testnet")
        assert wait_rounds(nodes, 2, lambda statuses: None, timeout=300)
        nonzero: set[str] = set()
        for node in nodes:
            status, m = _still(node)
            assert m[("dgrpo_messages_accepted_total", ())] == status["messages_accepted"]
            assert _family(m, "dgrpo_messages_rejected_total", "reason") == status["messages_rejected"]
            assert _family(m, "dgrpo_admission_rejected_total", "reason") == status["round_rejections"]
            by_peer = _family(m, "dgrpo_peer_messages_rejected_total", "peer", "reason")
            assert by_peer == _pairs(status["rejected_by_peer_reason"])
            admission_by_peer = _family(m, "dgrpo_peer_admission_rejected_total", "peer", "reason")
            assert admission_by_peer == _pairs(status["round_rejections_by_peer_reason"])
            # the per-peer tables add up to the per-peer totals /status has always shown
            for table, totals in (
                (status["rejected_by_peer_reason"], status["rejected_by_peer"]),
                (status["round_rejections_by_peer_reason"], status["round_rejections_by_peer"]),
            ):
                assert {peer: sum(r.values()) for peer, r in table.items()} == totals
            assert m[("dgrpo_completions_trained_total", ())] == status["completions_trained"]
            assert m[("dgrpo_round", ())] == status["round"] - 1 == status["last_round"]["round"]  # last completed
            assert m[("dgrpo_blacklisted_peers", ())] == len(status["blacklisted_peers"])
            for name, value in (
                ("accepted", status["messages_accepted"]),
                ("rejected", sum(status["messages_rejected"].values())),
                ("admission", sum(status["round_rejections"].values())),
                ("trained", status["completions_trained"]),
                ("blacklisted", len(status["blacklisted_peers"])),
            ):
                if value:
                    nonzero.add(name)
        # wired counters, not 0 == 0: every kind was non-zero somewhere
        assert nonzero == {"accepted", "rejected", "admission", "trained", "blacklisted"}, nonzero
        first = _still(nodes[0])[0]
        assert first["rejected_by_peer_reason"][hostile] == {"malformed": 2, "oversize_rpc": 1}
    finally:
        assert stop_nodes(nodes)
