"""Getting through NATs: the node's reachability (AutoNAT), its relay role (serving circuits, holding slots),
hole punching (DCUtR) and dialling a peer by whichever address works. py-libp2p 0.8.1 does each part
(:mod:`dgrpo.net.reachability`, :mod:`dgrpo.net.relay`); this is the loop that runs them and the view of them
``/status`` shows: reachability, observed and announced addresses, and for each peer direct or relayed."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from typing import Any

import trio
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.relay.circuit_v2.dcutr import DCUtRProtocol
from libp2p.tools.anyio_service import background_trio_service
from multiaddr import Multiaddr

from dgrpo.net.host import forget_dial_failures
from dgrpo.net.reachability import (
    PUBLIC,
    DialBackAutoNAT,
    Reachability,
    ask,
    dial_back_candidates,
    strip_p2p,
    supports_autonat,
)
from dgrpo.net.relay import CountingRelay, RelayClient, connection_kind, relay_limits, transport_addrs_of
from dgrpo.net.traversal_config import TraversalConfig

log = logging.getLogger(__name__)

UNKNOWN_RECHECK_SECONDS = 2.0  # while reachability is unknown, ask again this soon
MAX_AUTONAT_SERVERS = 4


def is_circuit(addr: str) -> bool:
    return "/p2p-circuit" in addr


class PromptDCUtR(DCUtRProtocol):
    """py-libp2p's DCUtR, closing the relayed leg ``grace`` seconds after a hole punch instead of its fixed 60
    (``RELAY_CLOSE_GRACE_PERIOD``): the pubsub stream opened over the relay carries the pair's gossip until that
    leg closes, so for a minute a punched pair still loaded the relay as much as an unpunched one
    (``benchmarks/nat.py``)."""

    def __init__(self, host: Any, dial_timeout: int, grace: float) -> None:
        super().__init__(host, dial_timeout=dial_timeout)
        self.grace = grace
        self.punched: set[str] = set()  # peers a hole punch of ours verified a direct connection to

    def _schedule_relay_close(self, peer_id: ID) -> None:
        # Called exactly where a punch verified its direct connection: recording it here, not by polling the
        # connection kinds, cannot miss a relayed connection that was upgraded between two polls.
        self.punched.add(peer_id.to_base58())
        super()._schedule_relay_close(peer_id)

    async def _close_relayed_conns_after_grace(self, peer_id: ID, grace: float | None = None) -> None:
        await super()._close_relayed_conns_after_grace(peer_id, self.grace if grace is None else grace)


class Traversal:
    def __init__(self, host: Any, config: TraversalConfig) -> None:
        self.host = host
        self.config = config
        limits = relay_limits(config.relay_limits)
        self.protocol = CountingRelay(host, limits=limits, allow_hop=config.relay_service)
        self.client = RelayClient(host, self.protocol, config.relay_limits, config.max_relays)
        self.autonat = DialBackAutoNAT(host, config.dial_back_timeout)
        # A verdict counts for three checks: a server that went away, or a NAT that changed, is not believed forever.
        self.reachability = Reachability(config.reachability_confirmations, max_age=3 * config.reachability_interval)
        self.dcutr = (
            PromptDCUtR(host, dial_timeout=config.hole_punch_dial_timeout, grace=config.relayed_grace_seconds)
            if config.hole_punching
            else None
        )
        self.dials: Counter[str] = Counter()  # direct_ok, direct_failed, relayed_ok, relayed_failed
        self.upgraded: set[str] = set()  # peers first reached relayed, now also direct (hole punched)
        self._seen_relayed: set[str] = set()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Traversal]:
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(background_trio_service(self.protocol))
            if self.dcutr is not None:
                await stack.enter_async_context(background_trio_service(self.dcutr))
            nursery = await stack.enter_async_context(trio.open_nursery())
            nursery.start_soon(self._reachability_loop)
            nursery.start_soon(self._relay_loop)
            try:
                yield self
            finally:
                nursery.cancel_scope.cancel()

    # ----------------------------------------------------------------- reachability
    def observed_addrs(self) -> list[str]:
        """Addresses peers told us (Identify) they see us at, each seen by at least one peer."""
        manager = getattr(self.host, "_observed_addr_manager", None)
        if manager is None:
            return []
        with suppress(Exception):
            return sorted({str(a) for a in manager.addrs(min_observers=1)})
        return []

    async def _reachability_loop(self) -> None:
        while True:
            await self.check_reachability()
            known = self.reachability.status != "unknown"
            await trio.sleep(self.config.reachability_interval if known else UNKNOWN_RECHECK_SECONDS)

    async def check_reachability(self) -> str:
        """Ask directly connected AutoNAT servers to dial us back (a relayed connection is refused by spec)."""
        candidates = dial_back_candidates(
            list(self.host.get_transport_addrs()), [Multiaddr(a) for a in self.observed_addrs()]
        )
        candidates += [Multiaddr(a) for a in self.config.announce]
        servers = [
            peer
            for peer, conns in list(self.host.get_network().connections.items())
            if any(connection_kind(c) == "direct" for c in conns) and supports_autonat(self.host, peer)
        ][:MAX_AUTONAT_SERVERS]
        # The server dials each candidate on our observed IP in turn, each for up to dial_back_timeout.
        timeout = self.config.dial_back_timeout * max(1, len(candidates)) + 10
        for server in servers:
            status = await ask(self.autonat, server, candidates, timeout=timeout)
            if status is None:
                self.reachability.no_answer[server.to_base58()] = "no_answer"
            else:
                self.reachability.record(server.to_base58(), status)
        return self.reachability.status

    # ----------------------------------------------------------------- relays
    def _relay_public_addrs(self, relay: str) -> list[str]:
        """Where others can reach ``relay``: the address we reached it at, with the port it listens on."""
        peer = ID.from_base58(relay)
        known = transport_addrs_of(self.host, peer)
        ips: set[str] = set()
        for conn in self.host.get_network().connections.get(peer) or []:
            with suppress(Exception):
                ips.add(conn.muxed_conn.secured_conn.get_remote_address()[0])
        matching = [a for a in known if any(f"/{ip}/" in a for ip in ips)]
        return matching or known[:1]

    async def _relay_loop(self) -> None:
        while True:
            wanted = self.config.use_relays and self.reachability.status != PUBLIC
            with suppress(Exception):  # a relay that misbehaves mid-reservation must not end the loop
                await self.client.maintain(wanted, self._relay_public_addrs)
            self._track_upgrades()
            await trio.sleep(self.config.peering_interval)

    def _track_upgrades(self) -> None:
        for peer in self.dcutr.punched if self.dcutr is not None else ():
            if peer not in self.upgraded:
                self.upgraded.add(peer)
                log.info("hole punched: direct connection to %s (DCUtR)", peer)
        for peer, kind in self.connections().items():
            if kind == "relayed":
                self._seen_relayed.add(peer)
            elif peer in self._seen_relayed and peer not in self.upgraded:
                self.upgraded.add(peer)
                log.info("hole punched: direct connection to %s (was relayed)", peer)

    # ----------------------------------------------------------------- addresses and dials
    def announced_addrs(self, own: Sequence[str]) -> list[str]:
        """What we announce (heartbeats): circuit addresses first while we hold slots (they work from anywhere),
        then our configured and own addresses."""
        out = [*self.client.circuit_addrs(), *own]
        me = self.host.get_id().to_base58()
        out += [f"{strip_p2p(Multiaddr(a))}/p2p/{me}" for a in self.config.announce]
        return list(dict.fromkeys(out))

    def remote_addrs(self) -> dict[str, str]:
        """For each peer with a direct connection, the address it is connected from (``/ip4/<ip>/tcp/<port>``):
        what it is, not what it announces."""
        out: dict[str, str] = {}
        for peer, conns in list(self.host.get_network().connections.items()):
            for conn in conns:
                if connection_kind(conn) != "direct":
                    continue
                with suppress(Exception):
                    ip, port = conn.muxed_conn.secured_conn.get_remote_address()
                    out[peer.to_base58()] = f"/{'ip6' if ':' in ip else 'ip4'}/{ip}/tcp/{port}"
                    break
        return out

    def connections(self) -> dict[str, str]:
        """direct / relayed per connected peer (direct wins when a peer has both)."""
        out: dict[str, str] = {}
        for peer, conns in list(self.host.get_network().connections.items()):
            kinds = {connection_kind(c) for c in conns}
            if kinds:
                out[peer.to_base58()] = "direct" if "direct" in kinds else "relayed"
        return out

    async def dial(self, peer: str, addrs: Sequence[str], timeout: float) -> str | None:
        """Connect to ``peer``. A peer that announces ``/p2p-circuit`` addresses says it is not publicly
        reachable, so those go first (DCUtR then upgrades the connection where the NATs allow); its direct
        addresses are private ones a dial would wait out. Returns "direct", "relayed" or None."""
        target = ID.from_base58(peer)
        forget_dial_failures(self.host, target)
        circuits = [a for a in addrs if is_circuit(a)]
        for addr in circuits:
            if await self.client.dial(addr, timeout):
                self.dials["relayed_ok"] += 1
                return "relayed"
            self.dials["relayed_failed"] += 1
        direct = [strip_p2p(Multiaddr(a)) for a in addrs if not is_circuit(a)]
        if direct:
            try:
                with trio.fail_after(timeout):
                    await self.host.connect(PeerInfo(target, direct))
                self.dials["direct_ok"] += 1
                return "direct"
            except Exception as error:
                self.dials["direct_failed"] += 1
                log.debug("direct dial to %s failed: %s", peer, error)
        return None

    def hole_punched(self, kinds: Mapping[str, str]) -> list[str]:
        """Peers a hole punch reached: what the relay loop recorded, and what it has not polled yet (a punch DCUtR
        verified, a peer seen relayed that is direct now in ``kinds``). The status may be asked between the punch
        and the loop's next pass: CI saw the homes direct in ``connections`` and ``hole_punched`` still empty.
        Copies first: the status server reads from its own thread."""
        punched = set(tuple(self.dcutr.punched)) if self.dcutr is not None else set()
        seen = set(tuple(self._seen_relayed))
        return sorted(
            set(tuple(self.upgraded)) | punched | {p for p, k in kinds.items() if k == "direct" and p in seen}
        )

    def snapshot(self) -> dict[str, Any]:
        kinds = self.connections()
        return {
            "reachability": self.reachability.snapshot(),
            "observed_addrs": self.observed_addrs(),
            "relay_service": self.config.relay_service,
            "relay_service_circuits": len(self.protocol._active_relays),
            "relay_service_bytes": self.protocol.relayed_bytes,
            "relay_service_reservations": len(getattr(self.protocol.resource_manager, "_reservations", {})),
            "relays": self.client.relays(),
            "circuit_addrs": self.client.circuit_addrs(),
            "connections": dict(sorted(kinds.items())),
            "direct_peers": sum(1 for k in kinds.values() if k == "direct"),
            "relayed_peers": sum(1 for k in kinds.values() if k == "relayed"),
            "hole_punched": self.hole_punched(kinds),
            "dials": dict(self.dials),
            "autonat_dial_backs_served": self.autonat.dial_backs,
        }
