"""Circuit relay v2 (py-libp2p 0.8.1's ``libp2p.relay.circuit_v2``): serving as a relay, holding reservations on
relays, and dialling peers through them. Only the glue is ours:

- py-libp2p's swarm drops ``/p2p-circuit`` addresses from ``host.connect`` ("relay-only", swarm.py:824) and the
  circuit transport is not registered with it, so a relayed dial goes to :class:`CircuitV2Transport` directly.
- Its reservation refresher lives in whichever nursery the first ``reserve`` ran in and never notices a relay
  that restarted (the relay forgot the slot; the refresher only counts down the old expiry). We reserve on a
  fresh stream ourselves, and again whenever the connection to that relay is new or the slot is near expiry.
- ``host.get_addrs()`` cannot announce a circuit address: it strips "any existing /p2p/" by decapsulating the
  first ``/p2p/<relay>``, which also removes ``/p2p-circuit`` (basic_host.py:528). Circuit addresses are
  announced by :meth:`RelayClient.circuit_addrs`, in our signed heartbeats.
- Dialling with ``RelayRole.CLIENT`` makes a reservation for the dialer on every dial (transport.py:399): a
  dialler that only wants to reach a peer asks only for STOP, and reservations are made here, explicitly.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_PROTOCOL_ID
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
from libp2p.relay.circuit_v2.resources import RelayLimits
from libp2p.relay.circuit_v2.transport import CircuitV2Transport
from multiaddr import Multiaddr

from dgrpo.net.reachability import strip_p2p
from dgrpo.net.traversal_config import RelayLimitsConfig

log = logging.getLogger(__name__)

RENEW_BEFORE_SECONDS = 60  # renew a slot this long before it expires


class CountingRelay(CircuitV2Protocol):
    """py-libp2p's circuit relay v2 (hop and stop), counting the bytes it relays for others, both directions
    together (py-libp2p keeps per-circuit budgets only): ``/status`` ``network.relay_service_bytes``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.relayed_bytes = 0

    async def _read_stream_with_retry(self, *args: Any, **kwargs: Any) -> bytes | None:
        # Read only by _relay_data, once per chunk it forwards.
        data: bytes | None = await super()._read_stream_with_retry(*args, **kwargs)
        if data:
            self.relayed_bytes += len(data)
        return data


def relay_limits(config: RelayLimitsConfig) -> RelayLimits:
    return RelayLimits(
        duration=config.duration_seconds,
        data=config.data_bytes,
        max_circuit_conns=config.max_circuits,
        max_reservations=config.max_reservations,
        reservation_ttl=config.reservation_ttl_seconds,
    )


@dataclass
class Slot:
    relay: str
    addrs: tuple[str, ...]  # the relay's public transport addresses (no /p2p)
    expires: float
    connection: int  # id() of the connection the slot was made on: a new one means the relay may have restarted


class RelayClient:
    """Reservations on up to ``max_relays`` relays, the circuit addresses they give us, relayed dials."""

    def __init__(self, host: Any, protocol: CircuitV2Protocol, limits: RelayLimitsConfig, max_relays: int) -> None:
        self.host = host
        self.max_relays = max_relays
        self.transport = CircuitV2Transport(
            host, protocol, RelayConfig(roles=RelayRole.STOP, limits=relay_limits(limits))
        )
        self.slots: dict[str, Slot] = {}
        self.reservation_failures = 0
        self.relayed_dials = 0
        self.relayed_dial_failures = 0

    def circuit_addrs(self) -> list[str]:
        """``<relay addr>/p2p/<relay>/p2p-circuit/p2p/<us>`` for every slot we hold: where peers reach us."""
        me = self.host.get_id().to_base58()
        return [f"{addr}/p2p/{slot.relay}/p2p-circuit/p2p/{me}" for slot in self.slots.values() for addr in slot.addrs]

    def relays(self) -> list[str]:
        return sorted(self.slots)

    async def maintain(self, wanted: bool, public_addr: Callable[[str], list[str]]) -> None:
        """One pass: drop slots whose relay is gone, renew those near expiry or made on an older connection,
        and reserve on connected relays until ``max_relays`` (only while ``wanted``: not publicly reachable)."""
        connections = self.host.get_network().connections
        for relay, slot in list(self.slots.items()):
            conns = connections.get(ID.from_base58(relay)) or []
            if not wanted or not conns:
                del self.slots[relay]
            elif slot.expires - time.time() < RENEW_BEFORE_SECONDS or all(id(c) != slot.connection for c in conns):
                await self._reserve(relay, public_addr(relay))
        if not wanted:
            return
        for peer in list(connections):
            if len(self.slots) >= self.max_relays:
                break
            relay = peer.to_base58()
            if relay in self.slots or not _is_relay(self.host, peer) or not _has_direct(connections.get(peer)):
                continue
            await self._reserve(relay, public_addr(relay))

    async def _reserve(self, relay: str, addrs: list[str]) -> None:
        peer = ID.from_base58(relay)
        try:
            with trio.fail_after(10):
                stream = await self.host.new_stream(peer, [HOP_PROTOCOL_ID])
                try:
                    ok = await self.transport._make_reservation(stream, peer)
                finally:
                    await stream.close()
        except Exception as error:
            ok = False
            log.debug("reservation on %s failed: %s", relay, error)
        conns = self.host.get_network().connections.get(peer) or []
        if not ok or not conns or not addrs:
            self.reservation_failures += 1
            self.slots.pop(relay, None)
            return
        now = time.time()
        expires = float(self.transport._reservations.get(peer, 0) or 0)
        if expires <= now + RENEW_BEFORE_SECONDS:  # an answer without a usable expiry: renew in a few minutes,
            expires = now + 5 * RENEW_BEFORE_SECONDS  # not at every pass of the loop
        if relay not in self.slots:
            log.info("reserved a relay slot on %s; reachable at %s/p2p/%s/p2p-circuit", relay, addrs[0], relay)
        self.slots[relay] = Slot(relay, tuple(addrs), expires, id(conns[0]))

    async def dial(self, circuit_addr: str, timeout: float) -> bool:
        """Connect through a relay (``.../p2p/<relay>/p2p-circuit/p2p/<peer>``); the connection joins the swarm,
        so gossipsub and our streams use it like any other."""
        self.relayed_dials += 1
        try:
            with trio.fail_after(timeout):
                await self.transport.dial(Multiaddr(circuit_addr))
            return True
        except Exception as error:
            self.relayed_dial_failures += 1
            log.debug("relayed dial %s failed: %s", circuit_addr, error)
            return False


def _is_relay(host: Any, peer: ID) -> bool:
    try:
        return HOP_PROTOCOL_ID in host.get_peerstore().get_protocols(peer)
    except Exception:
        return False


def _has_direct(conns: Any) -> bool:
    return any(connection_kind(c) == "direct" for c in (conns or []))


def connection_kind(conn: Any) -> str:
    """direct or relayed. py-libp2p tags relayed swarm connections (type RELAYED, or a ``/p2p-circuit`` transport
    address); ``get_transport_addresses`` itself falls back to the peerstore, which may hold a direct peer's
    circuit addresses too, so only the connection's own record is read."""
    kind = getattr(getattr(conn, "get_connection_type", lambda: None)(), "value", None)
    if kind == "relayed":
        return "relayed"
    actual = getattr(conn, "_actual_transport_addresses", None) or []
    return "relayed" if any("/p2p-circuit" in str(a) for a in actual) else "direct"


def transport_addrs_of(host: Any, peer: ID) -> list[str]:
    """A peer's dialable transport addresses from the peerstore (no circuits, no /p2p suffix)."""
    try:
        addrs = host.get_peerstore().addrs(peer)
    except Exception:
        return []
    return [str(strip_p2p(a)) for a in addrs if "/p2p-circuit" not in str(a)]
