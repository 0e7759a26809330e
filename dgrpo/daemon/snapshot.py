"""A daemon's ``/status``: one JSON object of everything an operator or a test reads (counters by reason and by
peer, the network's view, the manifest, the defense), built from the daemon's parts."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

from dgrpo.daemon.history import RoundHistory
from dgrpo.daemon.manifest_exchange import ManifestService
from dgrpo.daemon.monitor import PoisonMonitor
from dgrpo.daemon.observers import MetricsObserver, NodeCounters, outcome_json
from dgrpo.daemon.peer_view import peer_rows
from dgrpo.daemon.settings import NodeSettings
from dgrpo.defense.reputation import Reputation
from dgrpo.learner.learner import Learner
from dgrpo.net.gossip import GossipNode
from dgrpo.net.p2p import Libp2pTransport
from dgrpo.net.transport import TransportStatistics
from dgrpo.round.admit import AdmissionStatistics
from dgrpo.round.node import Node


class Observed(Protocol):
    """What ``/status`` reads of a daemon (:class:`dgrpo.daemon.daemon.Daemon` has it all)."""

    peer_id: str
    settings: NodeSettings
    state: str
    round: int
    rounds_done: int
    transport: Libp2pTransport | None
    gossip: GossipNode | None
    counters: NodeCounters
    node: Node
    monitor: PoisonMonitor
    reputation: Reputation | None
    metrics_observer: MetricsObserver
    history: RoundHistory
    learner: Learner
    catch_ups: int
    paced_steps: int
    paced_seconds: float
    arrival_evidence: Counter[str]
    status_url: str | None
    manifest: ManifestService

    @property
    def errors(self) -> Sequence[str]: ...

    def _transport_statistics(self) -> TransportStatistics: ...

    def _admission_statistics(self) -> AdmissionStatistics: ...


def process_rss() -> int:
    """The resident set of this process, from ``/proc/self/statm`` (0 where there is none)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def node_snapshot(node: Observed) -> dict[str, Any]:
    wire = node._transport_statistics()
    admission = node._admission_statistics()
    counters = node.counters
    last = counters.last
    transport = node.transport
    gossip = node.gossip
    network = gossip.traversal.snapshot() if gossip else None
    blacklisted = sorted(gossip.blacklisted()) if gossip else []
    return {
        "peer_id": node.peer_id,
        "run_id": node.settings.run_id,
        "mode": node.settings.mode,
        "state": node.state,
        "round": node.round,
        "rounds_done": node.rounds_done,
        "peers": sorted(transport.peers()) if transport else [],
        "connected_peers": sorted(gossip.connected_peers()) if gossip else [],
        "listen_addrs": gossip.listen_addrs() if gossip else [],
        "network": network,
        "mean_reward": last.scoring.mean_reward if last else None,
        "last_round": outcome_json(last) if last else None,
        "messages_accepted": wire.accepted,
        "messages_rejected": dict(wire.rejected_by_reason),
        "rejected_by_peer": dict(wire.rejected_by_peer),
        "rejected_by_peer_reason": {peer: dict(reasons) for peer, reasons in wire.rejected_by_peer_reason.items()},
        "messages_dropped": dict(wire.dropped),
        "equivocating_peers": list(wire.equivocating_peers),
        "receive": {  # the receive path: every message's validation, dedup and quota (grows with the traffic)
            "messages": dict(wire.received),
            "cpu_seconds": round(wire.receive_cpu_seconds, 4),
            "rss_bytes": process_rss(),  # the process's: a light peer shares it (dgrpo.daemon.light)
        },
        "gossip": asdict(gossip.statistics()) if gossip else None,
        "round_rejections": dict(admission.rejected_by_reason),
        "round_rejections_by_peer": dict(admission.rejected_by_author),
        "round_rejections_by_peer_reason": admission.rejected_by_author_reason,
        "completions_trained": counters.completions_trained,
        "completions_trained_by_author": dict(counters.trained_by_author),
        "draw": {
            "external_per_round": node.settings.rollout.external_per_round,
            "rounds": counters.draw_rounds,
            "rounds_full": counters.draw_full_rounds,
            "offered": counters.offered_external,
            "drawn": counters.drawn_external,
            "drawn_young": counters.drawn_young,
            "seniority": node.node.seniority.snapshot(),
        },
        "poison_monitor": node.monitor.snapshot(),
        "adversary": None
        if node.node.adversary is None
        else {"name": node.node.adversary.name, **node.node.adversary.stats.as_dict()},
        "blacklisted_peers": blacklisted,
        "catch_ups": node.catch_ups,
        "paced": {"steps": node.paced_steps, "seconds": round(node.paced_seconds, 1)},
        "arrival_evidence": dict(node.arrival_evidence),
        "last_departed": list(last.departed) if last else [],
        "stuck_peers": sorted(gossip.stuck_peers()) if gossip else [],
        "dropped_to_peer": gossip.dropped_to_peer() if gossip else {},
        "defense": None
        if node.node.defense is None
        else {
            "chain": node.node.defense.names,
            "checked_by_author": dict(counters.defense_checked_by_author),
            "rejected_by_author": dict(counters.defense_rejected_by_author),
            "rejected_by_reason": dict(counters.defense_rejected_by_reason),
            "reputation": node.reputation.snapshot() if node.reputation is not None else {},
            "blacklisted": dict(node.reputation.blacklisted) if node.reputation is not None else {},
        },
        "reward": {
            "isolation": node.node.task.reward_isolation(),
            "seconds_last_round": last.scoring.seconds if last else None,
            **node.metrics_observer.reward_counts,
        },
        "weights_sha256": node.learner.weights_digest() if node.state == "stopped" else None,
        "last_errors": list(node.errors),
        "status_url": node.status_url,
        "manifest": node.manifest.snapshot(),
        # the live page's (dgrpo.daemon.live_page): one bounded row per known peer, and the reward curve
        "peer_table": peer_rows(
            node.peer_id,
            transport.peer_table() if transport else (),
            transport.peers() if transport else set(),
            (network or {}).get("connections") or {},
            set(blacklisted),
            counters.trained_by_author,
            wire.rejected_by_peer_reason,
            admission.rejected_by_author_reason,
            counters.defense_rejected_by_author,
        ),
        "history": node.history.snapshot(),
    }
