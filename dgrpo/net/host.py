"""What the gossip node needs of py-libp2p's host and router beyond their API: the security it offers, dial
addresses from heartbeats, whether an outbound queue is idle, and bounding the router's bookkeeping."""

from __future__ import annotations

import ipaddress
from collections import Counter
from contextlib import suppress
from typing import Any

from libp2p.crypto.x25519 import create_new_key_pair as create_new_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.rcmgr import ResourceLimits, ResourceManager
from libp2p.rcmgr.cidr_limits import CIDRLimiter
from libp2p.rcmgr.connection_limits import ConnectionLimits
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport


def noise_only(key_pair: Any) -> dict[TProtocol, Any]:
    """The one security protocol we offer: noise. py-libp2p 0.8.1 otherwise also offers TLS, secio and
    ``/plaintext/2.0.0``, and a peer choosing plaintext gets an unauthenticated, unencrypted connection (its
    messages are still signed, but the connection's peer id, which gossipsub credits as the forwarder, is not
    proven). go- and js-libp2p speak noise by default."""
    return {NOISE_PROTOCOL_ID: NoiseTransport(key_pair, noise_privkey=create_new_x25519_key_pair().private_key)}


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


class PerIPLimiter(CIDRLimiter):
    """At most ``limit`` connections from any one IP address, in the resource manager's CIDR slot: py-libp2p
    0.8.1's CIDR limiter bounds fixed subnets only, and Sybils come from a few addresses, not a few subnets.
    Loopback is exempt (a local testnet's daemons all share 127.0.0.1)."""

    def __init__(self, limit: int) -> None:
        super().__init__(None)
        self.limit = limit
        self._per_ip: Counter[str] = Counter()
        self.refused = 0

    @staticmethod
    def _key(endpoint_ip: str | None) -> str | None:
        try:
            ip = ipaddress.ip_address(endpoint_ip or "")
        except ValueError:
            return None
        return None if ip.is_loopback else str(ip)

    def allow(self, endpoint_ip: str | None) -> bool:
        key = self._key(endpoint_ip)
        if key is None or self._per_ip[key] < self.limit:
            return True
        with self._lock:  # the resource manager asks allow() before acquire(): most refusals happen here
            self.refused += 1
        return False

    def acquire(self, endpoint_ip: str | None) -> bool:
        key = self._key(endpoint_ip)
        if key is None:
            return True
        with self._lock:
            if self._per_ip[key] >= self.limit:
                self.refused += 1
                return False
            self._per_ip[key] += 1
            return True

    def release(self, endpoint_ip: str | None) -> None:
        key = self._key(endpoint_ip)
        if key is not None:
            with self._lock:
                self._per_ip[key] -= 1
                if self._per_ip[key] <= 0:
                    del self._per_ip[key]


def resource_manager(max_peers: int, max_per_ip: int, max_per_peer: int = 4) -> ResourceManager:
    """py-libp2p's resource manager bounding connections in total, per peer and per IP (:class:`PerIPLimiter`).

    py-libp2p 0.8.1's swarm admits each connection twice, a pre-upgrade scope and then the connection's own, and
    releases the first only after taking the second: both count, so a cap of N let N-1 connections in (and
    ``max_per_ip=1`` none). Each cap gets that one extra slot (tests/test_peering.py)."""
    manager = ResourceManager(
        limits=ResourceLimits(max_connections=max_peers + 1),
        connection_limits=ConnectionLimits(max_established_per_peer=max_per_peer, max_established_total=max_peers),
        enable_rate_limiting=False,  # a relay's clients reconnect in bursts after it restarts
    )
    manager.cidr_limiter = PerIPLimiter(max_per_ip + 1)
    return manager


def forget_dial_failures(host: Any, peer: Any) -> None:
    """Drop py-libp2p's 60 s "recently failed all addresses" entry for ``peer``: our own redial backoff decides
    when to try again, and a relay or bootstrap that restarted must be reachable again at once."""
    with suppress(Exception):
        host.get_network()._negative_peer_cache.evict(str(peer))
