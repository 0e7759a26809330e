"""What the gossip node needs of py-libp2p's host and router beyond their API: the security it offers, dial
addresses from heartbeats, whether an outbound queue is idle, and bounding the router's bookkeeping."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import suppress
from typing import Any

from libp2p.crypto.x25519 import create_new_key_pair as create_new_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from multiaddr import Multiaddr


def noise_only(key_pair: Any) -> dict[TProtocol, Any]:
    """The one security protocol we offer: noise. py-libp2p 0.8.1 otherwise also offers TLS, secio and
    ``/plaintext/2.0.0``, and a peer choosing plaintext gets an unauthenticated, unencrypted connection (its
    messages are still signed, but the connection's peer id, which gossipsub credits as the forwarder, is not
    proven). go- and js-libp2p speak noise by default."""
    return {NOISE_PROTOCOL_ID: NoiseTransport(key_pair, noise_privkey=create_new_x25519_key_pair().private_key)}


def dial_addrs(peer: ID, addrs: Sequence[str]) -> list[Multiaddr]:
    """The transport addresses of ``addrs`` (as heartbeats announce them, ``.../p2p/<id>``) that name ``peer``;
    unparsable ones are skipped: they come from the network."""
    out: list[Multiaddr] = []
    for addr in addrs:
        with suppress(Exception):
            info = info_from_p2p_addr(Multiaddr(addr))
            if info.peer_id == peer:
                out.extend(info.addrs)
    return out


def queue_idle(queue: Any) -> bool:
    """An outbound queue is empty and its sender waits for more (so its last write has finished)."""
    notify = getattr(queue, "_notify", None)
    return len(queue) == 0 and (notify is None or notify.statistics().tasks_waiting > 0)


def trim_router_state(router: Any, keep: int) -> None:
    """Bound gossipsub bookkeeping that grows with every message in py-libp2p 0.8.1."""
    kept = router.equivocation_detection  # dict in insertion order, of whole messages
    for key in list(kept)[: max(0, len(kept) - keep)]:
        del kept[key]
    router.recent_message_deliveries.clear()  # these three are read only by adaptive gossip, which is off
    router.recent_peer_connections.clear()
    router.recent_peer_disconnections.clear()
