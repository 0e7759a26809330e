"""Rejections counted by peer and reason, for a bounded number of peers.

Peer ids come from the network: an attacker can make up as many as it likes (keys are free), so every
per-peer counter keeps at most ``cap`` peers and forgets the least recently rejected first. The reasons of
one peer are a fixed set of codes, so ``cap`` bounds the whole table (and the ``/metrics`` labels built on it).
"""

from __future__ import annotations

from collections import Counter, OrderedDict


class PeerReasons:
    """``peer -> reason -> rejections`` for at most ``cap`` peers (not thread-safe: callers hold their lock)."""

    def __init__(self, cap: int) -> None:
        if cap < 1:
            raise ValueError("cap must be >= 1")
        self.cap = cap
        self._by_peer: OrderedDict[str, Counter[str]] = OrderedDict()

    def add(self, peer: str, reason: str, n: int = 1) -> None:
        reasons = self._by_peer.pop(peer, None) or Counter()
        reasons[reason] += n
        self._by_peer[peer] = reasons  # reinserted last: the order is recency of rejection
        while len(self._by_peer) > self.cap:
            self._by_peer.popitem(last=False)

    def total(self, peer: str) -> int:
        return sum(self._by_peer.get(peer, Counter()).values())

    def __contains__(self, peer: object) -> bool:
        return peer in self._by_peer

    def __len__(self) -> int:
        return len(self._by_peer)

    def by_peer(self) -> dict[str, int]:
        return {peer: sum(reasons.values()) for peer, reasons in self._by_peer.items()}

    def snapshot(self) -> dict[str, dict[str, int]]:
        return {peer: dict(reasons) for peer, reasons in self._by_peer.items()}


def merge(*tables: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """Several ``peer -> reason -> n`` tables added up."""
    out: dict[str, Counter[str]] = {}
    for table in tables:
        for peer, reasons in table.items():
            out.setdefault(peer, Counter()).update(reasons)
    return {peer: dict(reasons) for peer, reasons in out.items()}
