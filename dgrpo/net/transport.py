"""The transport interface: how a node's rollouts reach the others.

A transport only moves rollout messages: ``publish`` sends one to every other node, ``inbound`` yields what
others sent, each already checked by the protocol's validator. Round bookkeeping (quorum, stale rounds) is
the round's receive stage (:mod:`dgrpo.round.receive`), the same for every transport. Implementations:
libp2p gossipsub (:mod:`dgrpo.net.p2p`) and the in-memory network of simulations (:mod:`dgrpo.net.memory`),
both over the same signed wire format.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field

import trio

from dgrpo.protocol.messages import Rollout


class Transport(ABC):
    """Moves rollouts between nodes."""

    peer_id: str

    @abstractmethod
    async def publish(self, rollout: Rollout) -> None:
        """Send ``rollout`` to the other nodes (not back to ourselves)."""

    @abstractmethod
    def inbound(self) -> trio.MemoryReceiveChannel[Rollout]:
        """A channel of rollouts received from other nodes."""

    @abstractmethod
    def peers(self) -> set[str]:
        """Peer ids currently known to be taking part (excluding ourselves)."""

    @abstractmethod
    def statistics(self) -> TransportStatistics:
        """What was accepted, rejected (by reason and peer) and dropped so far (a frozen snapshot)."""


# Where a valid message can be dropped, the keys of ``TransportStatistics.dropped`` (docs/protocol.md, "Reason
# codes"): the transport's inbound channel was full, or gossipsub's delivery queue of a topic was.
DROP_REASONS = ("inbound_full", "subscription_full", "peer_queue_full")


@dataclass(frozen=True)
class TransportStatistics:
    """A transport's counters: the validator's verdicts, the transport's own rejections (an RPC over its size cap:
    ``oversize_rpc``) merged into them, and the messages it dropped (never silently)."""

    accepted: int = 0
    rejected_by_reason: Mapping[str, int] = field(default_factory=dict)
    rejected_by_peer: Mapping[str, int] = field(default_factory=dict)
    rejected_by_peer_reason: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # peer -> reason -> n
    dropped: Mapping[str, int] = field(default_factory=dict)  # by where: inbound queue full, ...
    equivocating_peers: tuple[str, ...] = ()  # authors that signed two contents under one nonce
    # The receive path (validation, dedup, quota) as the validator hook runs it: messages checked, by kind, and
    # the CPU seconds spent checking them (issue 24: this grows with the traffic, everything after it with J).
    received: Mapping[str, int] = field(default_factory=dict)
    receive_cpu_seconds: float = 0.0
