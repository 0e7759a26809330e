"""Finding and keeping peers: the bootstrap list (every entry kept dialled, with backoff), peer exchange from
heartbeats and mDNS (:class:`dgrpo.net.peering.Peering`), and the addresses a node announces. Where NAT
traversal (:mod:`dgrpo.net.traversal`) says how to reach one peer, this says which peers to reach."""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import trio
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr
from multiaddr import Multiaddr
from multiaddr.utils import get_thin_waist_addresses

from dgrpo.errors import DgrpoError
from dgrpo.net.gossip_config import GossipConfig
from dgrpo.net.host import forget_dial_failures
from dgrpo.net.peering import Peering
from dgrpo.net.reachability import strip_p2p
from dgrpo.net.traversal import Traversal, is_circuit

logger = logging.getLogger("dgrpo.net.gossip")  # the node's logger: these are its lines

MAX_DISCOVERED = 256  # peers mDNS found, kept as dial candidates
WILDCARDS = ("/ip4/0.0.0.0/", "/ip6/::/")


class Discovery:
    def __init__(
        self,
        host: Any,
        config: GossipConfig,
        traversal: Traversal,
        counts: Counter[str],
        blacklisted: Callable[[], set[str]],
    ) -> None:
        self.host = host
        self.config = config
        self.traversal = traversal
        self.counts = counts  # the gossip node's statistics: bootstrap_attempts, bootstrap_failures
        self.blacklisted = blacklisted
        self.peer_id: str = host.get_id().to_base58()
        # Seeded by the node: every node draws its peer-exchange candidates in an order of its own.
        seed = int.from_bytes(hashlib.sha256(self.peer_id.encode()).digest()[:8], "big")
        self.peering = Peering(traversal.config, self.peer_id, seed=seed)
        self.discovered: dict[str, tuple[str, ...]] = {}  # mDNS: peer -> addresses, dial candidates

    # ----------------------------------------------------------------- addresses
    def local_addrs(self) -> list[str]:
        """The addresses we listen on, with ``/p2p/<peer id>`` (no circuits). A wildcard (``0.0.0.0``, ``::``)
        is no address to dial: it stands for each of this machine's interface addresses (py-libp2p's
        ``get_addrs`` returns it as is, and heartbeats announced ``/ip4/0.0.0.0/...``)."""
        out: list[str] = []
        for addr in self.host.get_addrs():
            head = strip_p2p(addr)
            expanded = get_thin_waist_addresses(head) if str(head).startswith(WILDCARDS) else [head]
            out += [f"{a}/p2p/{self.peer_id}" for a in (expanded or [head])]
        return list(dict.fromkeys(out))

    def listen_addrs(self) -> list[str]:
        """What we announce: full multiaddrs ending in ``/p2p/<peer id>``, the ``/p2p-circuit`` ones of the relay
        slots we hold first, then those we listen on (with the bound port) and those configured."""
        return self.traversal.announced_addrs(self.local_addrs())

    # ----------------------------------------------------------------- dialling
    def on_discovered(self, info: PeerInfo) -> None:
        """mDNS found ``info`` on the local network: a dial candidate for the peering loop. Called from
        zeroconf's thread: one dict assignment, bounded."""
        peer = info.peer_id.to_base58()
        if peer != self.peer_id and (peer in self.discovered or len(self.discovered) < MAX_DISCOVERED):
            self.discovered[peer] = tuple(f"{a}/p2p/{peer}" for a in info.addrs[:8])

    async def dial(self, peer_id: str, addrs: Sequence[str]) -> str | None:
        """Connect to ``peer_id`` at those of ``addrs`` that name it (``/p2p-circuit`` ones first, then direct:
        :meth:`dgrpo.net.traversal.Traversal.dial`): "direct", "relayed" or None."""
        mine = [a for a in addrs if a.endswith(f"/p2p/{peer_id}")]
        return await self.traversal.dial(peer_id, mine, self.config.dial_timeout)

    async def exchange_peers(self, known: Callable[[], Mapping[str, Sequence[str]]]) -> None:
        """Keep ``target_peers`` connections, dialling peers from ``known()`` (peer id -> announced addresses,
        from heartbeats) and those mDNS found, as :class:`dgrpo.net.peering.Peering` chooses. Runs until
        cancelled."""
        await self.peering.run(
            lambda: {**dict(self.discovered), **known()},
            lambda: {p.to_base58() for p in self.host.get_connected_peers()},
            self.blacklisted,
            self.dial,
            self.traversal.remote_addrs,
        )

    async def keep_dialled(self, addr: str) -> None:
        """Dial a bootstrap peer until connected, backing off exponentially, and again whenever it drops. Failures
        are logged, never raised: an unreachable bootstrap peer must not take the node down."""
        circuit = is_circuit(addr)  # a node behind NAT can offer a testnet through its relay slot
        target = ID.from_base58(addr.rsplit("/p2p/", 1)[1])
        info = PeerInfo(target, []) if circuit else info_from_p2p_addr(Multiaddr(addr))
        delay, failures = self.config.bootstrap_backoff_initial, 0
        while info.peer_id != self.host.get_id() and info.peer_id.to_base58() not in self.blacklisted():
            if info.peer_id not in self.host.get_connected_peers():
                self.counts["bootstrap_attempts"] += 1
                forget_dial_failures(self.host, info.peer_id)
                try:
                    with trio.fail_after(self.config.dial_timeout):
                        if circuit:
                            if not await self.traversal.client.dial(addr, self.config.dial_timeout):
                                raise DgrpoError("relayed dial failed")
                        else:
                            await self.host.connect(info)
                except Exception as error:
                    self.counts["bootstrap_failures"] += 1
                    failures += 1
                    reason = f"{type(error).__name__}: {error}".replace("\n", " ")
                    logger.warning(
                        "bootstrap dial to %s failed (%d in a row, %s); retrying in %s s", addr, failures, reason, delay
                    )
                    await trio.sleep(delay)
                    delay = min(2 * delay, self.config.bootstrap_backoff_max)
                    continue
                logger.info("connected to bootstrap peer %s", addr)
                delay, failures = self.config.bootstrap_backoff_initial, 0
            await trio.sleep(self.config.heartbeat_interval)  # then check the connection is still there
