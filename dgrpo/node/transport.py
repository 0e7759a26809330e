"""The transport interface, and the in-memory implementation used by simulations and unit tests.

A transport only moves rollout messages: ``publish`` sends one to every other node, ``inbound`` yields what
others sent. Round bookkeeping (quorum, stale rounds) lives in :mod:`dgrpo.node.inbox`, shared by every
transport; the libp2p gossipsub transport implements the same interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter

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


class InMemoryHub:
    """Connects in-memory transports within one trio run (one process, e.g. a simulation)."""

    def __init__(self, buffer: int = 100_000) -> None:
        self.buffer = buffer
        self._members: dict[str, InMemoryTransport] = {}
        self.dropped: Counter[str] = Counter()

    def join(self, peer_id: str) -> InMemoryTransport:
        if peer_id in self._members:
            raise ValueError(f"peer {peer_id!r} already joined")
        transport = InMemoryTransport(self, peer_id)
        self._members[peer_id] = transport
        return transport

    def deliver(self, sender: str, rollout: Rollout) -> None:
        for peer_id, member in self._members.items():
            if peer_id == sender:
                continue
            try:
                member._send.send_nowait(rollout)
            except trio.WouldBlock:
                # A full inbox drops the message, as gossipsub does; it is counted, never silent.
                self.dropped[peer_id] += 1

    def members(self) -> set[str]:
        return set(self._members)


class InMemoryTransport(Transport):
    def __init__(self, hub: InMemoryHub, peer_id: str) -> None:
        self.hub = hub
        self.peer_id = peer_id
        self._send, self._receive = trio.open_memory_channel[Rollout](hub.buffer)

    async def publish(self, rollout: Rollout) -> None:
        self.hub.deliver(self.peer_id, rollout)
        await trio.lowlevel.checkpoint()

    def inbound(self) -> trio.MemoryReceiveChannel[Rollout]:
        return self._receive

    def peers(self) -> set[str]:
        return self.hub.members() - {self.peer_id}
