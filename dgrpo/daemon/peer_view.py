"""One row per known peer for the live page (``/status`` ``peer_table``): what the node's parts count about it,
gathered in one place and bounded (peers are hostile: a Sybil crowd gets ``PEER_ROWS`` rows, not one each).

A peer is known when it sent a heartbeat, is connected, or is named by a counter (trained on, rejected).
Rows go active peers first, then connected ones, then the busiest (accepted plus rejected), so that a flood of
silent identities cannot push the peers a node works with off the page.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from dgrpo.net.p2p import PeerInfo

PEER_ROWS = 200


def reachability(listen_addrs: Iterable[str]) -> str | None:
    """What a peer's announced addresses say: ``direct`` (one that is not a relay circuit), ``relay only``
    (behind a NAT, reached through a relay), None (it announced none)."""
    addrs = list(listen_addrs)
    if not addrs:
        return None
    return "relay only" if all("/p2p-circuit" in a for a in addrs) else "direct"


def rejections(
    peer: str,
    wire: Mapping[str, Mapping[str, int]],
    admission: Mapping[str, Mapping[str, int]],
    defense: Mapping[str, int],
) -> dict[str, int]:
    """A peer's rejections by stage and reason: ``wire:<reason>`` (the validator and the transport),
    ``round:<reason>`` (the admit stage), ``defense`` (the defense chain counts by author, not by reason)."""
    out = {f"wire:{reason}": n for reason, n in wire.get(peer, {}).items() if n}
    out |= {f"round:{reason}": n for reason, n in admission.get(peer, {}).items() if n}
    if defense.get(peer):
        out["defense"] = defense[peer]
    return out


def peer_rows(
    self_id: str,
    heard: Iterable[PeerInfo],
    active: Collection[str],
    connections: Mapping[str, str],
    blacklisted: Collection[str],
    trained_by_author: Mapping[str, int],
    wire_rejected: Mapping[str, Mapping[str, int]],
    round_rejected: Mapping[str, Mapping[str, int]],
    defense_rejected: Mapping[str, int],
    now: float | None = None,
    limit: int = PEER_ROWS,
) -> dict[str, Any]:
    """``{"total": known peers, "shown": rows, "peers": [row, ...]}``, at most ``limit`` rows."""
    now = time.time() if now is None else now
    info = {p.peer_id: p for p in heard}
    known = set(info) | set(connections) | set(trained_by_author) | set(wire_rejected) | set(round_rejected)
    known |= set(defense_rejected)
    known.discard(self_id)
    keyed: list[tuple[tuple[bool, bool, int, str], dict[str, Any]]] = []
    for peer in known:
        p = info.get(peer)
        reasons = rejections(peer, wire_rejected, round_rejected, defense_rejected)
        accepted, rejected = int(trained_by_author.get(peer, 0)), sum(reasons.values())
        row = {
            "peer_id": peer,
            "round": p.round if p else None,
            "rounds_done": p.rounds_done if p else None,
            "status": p.status if p else None,  # as its last heartbeat said: running, done, stopping
            "last_seen_seconds": round(max(0.0, now - p.last_seen), 1) if p else None,
            "active": peer in active,
            "link": connections.get(peer),
            "reachability": reachability(p.listen_addrs) if p else None,
            "accepted": accepted,  # its completions this node trained on
            "rejected": rejected,
            "rejected_by_reason": reasons,
            "blacklisted": peer in blacklisted,
        }
        keyed.append(((peer not in active, peer not in connections, -(accepted + rejected), peer), row))
    keyed.sort(key=lambda kr: kr[0])
    rows = [row for _, row in keyed[:limit]]
    return {"total": len(keyed), "shown": len(rows), "peers": rows}
