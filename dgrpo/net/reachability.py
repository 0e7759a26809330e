"""Whether this node is publicly reachable: py-libp2p 0.8.1's AutoNAT (``libp2p.host.autonat``), patched where it
is wrong, and the addresses peers observe us at (Identify's observed-address manager).

Two bugs in 0.8.1, each pinned by a test in ``tests/test_reachability.py``:

1. The server's dial-back is ``host.connect(...)`` (autonat.py:396). It returns at once while any connection to
   the peer exists, and the asking peer is always connected (it asked over that connection), so the server
   answered OK without dialling: a closed port was reported reachable. :class:`DialBackAutoNAT` dials a fresh
   raw connection to the address and completes the security handshake (which proves the peer id), then closes
   it, without touching the swarm's connections.
2. A server that cannot be asked (transport error, timeout) or refuses to dial (``E_DIAL_REFUSED``: none of our
   addresses has the IP it sees) was recorded as a failed dial-back, i.e. as evidence that we are private. Only
   ``OK`` and ``E_DIAL_ERROR`` are verdicts here; the rest is no information.

A node behind NAT announces its LAN address, which no server may dial (the spec forbids dialling an IP other
than the one it observes), so we also offer our listen port on each observed IP: that is the address a
port-forwarded router would serve.
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import trio
from libp2p.host.autonat.autonat import AUTONAT_PROTOCOL_ID, AutoNATService
from libp2p.host.autonat.pb.autonat_pb2 import Message
from libp2p.peer.id import ID
from multiaddr import Multiaddr

log = logging.getLogger(__name__)

PUBLIC, PRIVATE, UNKNOWN = "public", "private", "unknown"


_ASKER: contextvars.ContextVar[ID | None] = contextvars.ContextVar("dgrpo_autonat_asker", default=None)


class DialBackAutoNAT(AutoNATService):
    """AutoNAT whose server really dials back (bug 1 above), and only the peer that asks: a request naming
    another peer id is ``E_BAD_REQUEST`` (py-libp2p dials whichever id the request names)."""

    def __init__(self, host: Any, dial_back_timeout: float, confirmations: int = 1) -> None:
        super().__init__(host, serve=True, confirmations=confirmations)
        self.dial_back_timeout = dial_back_timeout
        self.dial_backs = 0  # dial-backs we made for others (served requests)
        self.bad_requests = 0

    async def handle_stream(self, stream: Any) -> None:
        token = _ASKER.set(getattr(getattr(stream, "muxed_conn", None), "peer_id", None))
        try:
            await super().handle_stream(stream)
        finally:
            _ASKER.reset(token)

    async def _handle_dial(self, message: Message, observed_ip: str | None, is_relayed: bool) -> Message:
        asker = _ASKER.get()
        if asker is not None and bytes(message.dial.peer.id) != asker.to_bytes():
            self.bad_requests += 1
            response = Message()
            response.type = Message.DIAL_RESPONSE
            response.dialResponse.status = Message.E_BAD_REQUEST
            response.dialResponse.statusText = "the peer to dial back is not the peer asking"
            return response
        result: Message = await super()._handle_dial(message, observed_ip, is_relayed)
        return result

    async def _try_dial(self, peer_id: ID, addrs: list[bytes]) -> bytes | None:
        network: Any = self.host.get_network()  # the Swarm: its transports and upgrader
        for raw in addrs:
            try:
                addr = strip_p2p(Multiaddr(raw))
                transport = network.transport_manager.transport_for_dialing(addr)
                if transport is None:
                    continue
                self.dial_backs += 1
                with trio.fail_after(self.dial_back_timeout):
                    conn = await transport.dial(addr)
                    try:  # the handshake proves it is the peer that asked, not whoever holds the port
                        await network.upgrader.upgrade_security(conn, True, peer_id)
                    finally:
                        await conn.close()
                return bytes(raw)
            except Exception as error:  # refused, timed out, another identity: not reachable there
                log.debug("AutoNAT dial-back to %s at %s failed: %s", peer_id, raw, error)
        return None


def strip_p2p(addr: Multiaddr) -> Multiaddr:
    """``addr`` without a trailing ``/p2p/<id>``."""
    text = str(addr)
    head, sep, tail = text.rpartition("/p2p/")
    return Multiaddr(head) if sep and "/" not in tail and head else addr


@dataclass
class Reachability:
    """What AutoNAT servers told us, newest verdict per server, and what we conclude from them."""

    confirmations: int = 1
    max_age: float | None = None  # seconds a verdict counts (addresses and NAT mappings change); None: always
    verdicts: dict[str, tuple[bool, float]] = field(default_factory=dict)  # server -> (dialled us back, when)
    no_answer: dict[str, str] = field(default_factory=dict)  # server -> why it gave no verdict

    def _fresh(self) -> dict[str, bool]:
        now = time.time()
        return {s: ok for s, (ok, at) in self.verdicts.items() if self.max_age is None or now - at <= self.max_age}

    def record(self, server: str, status: int) -> None:
        self.no_answer.pop(server, None)
        if status == Message.OK:
            self.verdicts[server] = (True, time.time())
        elif status == Message.E_DIAL_ERROR:
            self.verdicts[server] = (False, time.time())
        else:  # E_DIAL_REFUSED, E_BAD_REQUEST, E_INTERNAL_ERROR: the server did not try (bug 2 above)
            self.no_answer[server] = Message.ResponseStatus.Name(status)  # type: ignore[arg-type]

    @property
    def status(self) -> str:
        """public / private once ``confirmations`` servers agree and they outnumber the others; else unknown.
        A majority, not any one server: a hostile peer alone cannot talk a private node out of using relays."""
        fresh = self._fresh()
        yes = sum(1 for ok in fresh.values() if ok)
        no = len(fresh) - yes
        if yes >= self.confirmations and yes > no:
            return PUBLIC
        if no >= self.confirmations and no > yes:
            return PRIVATE
        return UNKNOWN

    def snapshot(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "dialled_back_by": sorted(s for s, ok in self._fresh().items() if ok),
            "not_dialled_back_by": sorted(s for s, ok in self._fresh().items() if not ok),
            "no_verdict": dict(sorted(self.no_answer.items())),
        }


def dial_back_candidates(listen: Sequence[Multiaddr], observed: Sequence[Multiaddr]) -> list[Multiaddr]:
    """Our listen addresses, plus each listen port on each IP a peer observed us at (a router that forwards
    the port serves exactly that address). Deduplicated, order kept."""
    out: dict[str, Multiaddr] = {str(a): a for a in listen}
    for obs in observed:
        ip = _ip_of(obs)
        if ip is None:
            continue
        for addr in listen:
            port = _tcp_port(addr)
            if port is not None:
                candidate = Multiaddr(f"/{ip[0]}/{ip[1]}/tcp/{port}")
                out.setdefault(str(candidate), candidate)
    return list(out.values())


def _ip_of(addr: Multiaddr) -> tuple[str, str] | None:
    for proto in ("ip4", "ip6"):
        try:
            return proto, addr.value_for_protocol(proto)
        except Exception:
            continue
    return None


def _tcp_port(addr: Multiaddr) -> int | None:
    try:
        return int(addr.value_for_protocol("tcp"))
    except Exception:
        return None


async def ask(service: DialBackAutoNAT, server: ID, addrs: Sequence[Multiaddr], timeout: float) -> int | None:
    """One AutoNAT query; None where the server could not be asked (no verdict)."""
    try:
        status, _ = await service.query_server(server, [a.to_bytes() for a in addrs], timeout=timeout)
        return status
    except Exception as error:
        log.info("AutoNAT query to %s gave no verdict: %s: %s", server, type(error).__name__, error)
        return None


def supports_autonat(host: Any, peer: ID) -> bool:
    try:
        return AUTONAT_PROTOCOL_ID in host.get_peerstore().get_protocols(peer)
    except Exception:
        return False
