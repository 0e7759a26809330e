"""Keeping ``target_peers`` connections from more than one source: peer exchange.

Every node announces its dialable addresses (direct and ``/p2p-circuit``) in its signed heartbeats, which
gossipsub spreads to everyone; this loop dials the peers it has heard of until the node holds
``target_peers`` connections, so a node finds more peers than its bootstrap list and the mesh stops being a
star around the public nodes. A failed dial backs off exponentially per peer (``redial_*``). Peers are drawn
at most ``max_per_subnet`` per /24 (IPv4) or /48 (IPv6) of their announced direct addresses, so one operator's
Sybil farm behind one address block cannot take every slot, and in random order (seeded by the node), not
whoever answered first.
"""

from __future__ import annotations

import ipaddress
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

import trio
from multiaddr import Multiaddr

from dgrpo.net.traversal_config import TraversalConfig

log = logging.getLogger(__name__)

Dialer = Callable[[str, Sequence[str]], Awaitable[str | None]]


@dataclass
class Backoff:
    failures: int = 0
    until: float = 0.0


def subnet_of(addrs: Sequence[str]) -> str | None:
    """The /24 or /48 of a peer's first direct IP address; None for relay-only peers (their relays differ)."""
    for addr in addrs:
        if "/p2p-circuit" in addr:
            continue
        for proto, prefix in (("ip4", 24), ("ip6", 48)):
            try:
                ip = Multiaddr(addr).value_for_protocol(proto)
            except Exception:
                continue
            return str(ipaddress.ip_network(f"{ip}/{prefix}", strict=False))
    return None


@dataclass
class Peering:
    config: TraversalConfig
    me: str
    seed: int = 0
    backoff: dict[str, Backoff] = field(default_factory=dict)
    dialled: dict[str, str] = field(default_factory=dict)  # peer -> how we reached it last (direct / relayed)

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)

    def candidates(
        self,
        known: Mapping[str, Sequence[str]],
        connected: set[str],
        excluded: set[str],
        now: float,
        remote: Mapping[str, str] | None = None,
    ) -> list[str]:
        """Whom to dial next: not connected, not excluded (blacklisted), not backing off, at most
        ``max_per_subnet`` per address block counting those already connected, as many as are missing.
        ``remote``: the address (a multiaddr) each directly connected peer is connected from. A connected
        peer counts in the block it is connected from, else in the block of what it announced: a peer that
        fell out of ``known`` (its heartbeats late) kept its place, and the next Sybil of its block was dialled."""
        missing = self.config.target_peers - len(connected)
        if missing <= 0:
            return []
        remote = remote or {}
        per_subnet: dict[str, int] = {}
        for peer in connected:
            net = subnet_of([remote[peer]]) if peer in remote else subnet_of(known.get(peer, ()))
            if net is not None:
                per_subnet[net] = per_subnet.get(net, 0) + 1
        pool = [
            p
            for p in sorted(known)
            if p != self.me
            and p not in connected
            and p not in excluded
            and known[p]
            and self.backoff.get(p, Backoff()).until <= now
        ]
        self._random.shuffle(pool)
        chosen: list[str] = []
        for peer in pool:
            net = subnet_of(known[peer])
            if net is not None and per_subnet.get(net, 0) >= self.config.max_per_subnet:
                continue
            if net is not None:
                per_subnet[net] = per_subnet.get(net, 0) + 1
            chosen.append(peer)
            if len(chosen) >= missing:
                break
        return chosen

    def record(self, peer: str, how: str | None, now: float) -> None:
        if how is not None:
            self.backoff.pop(peer, None)
            self.dialled[peer] = how
            return
        b = self.backoff.setdefault(peer, Backoff())
        b.failures += 1
        delay = min(self.config.redial_max_seconds, self.config.redial_initial_seconds * 2 ** (b.failures - 1))
        b.until = now + delay * (0.5 + self._random.random() / 2)  # jitter: peers that lost a relay do not stampede

    async def run(
        self,
        known: Callable[[], Mapping[str, Sequence[str]]],
        connected: Callable[[], set[str]],
        excluded: Callable[[], set[str]],
        dial: Dialer,
        remote: Callable[[], Mapping[str, str]] = dict,
    ) -> None:
        while True:
            now = time.time()
            table = known()
            for peer in self.candidates(table, connected(), excluded(), now, remote()):
                how = await dial(peer, table[peer])
                self.record(peer, how, time.time())
                if how is not None:
                    log.info("peer exchange: connected to %s (%s)", peer, how)
            await trio.sleep(self.config.peering_interval)
