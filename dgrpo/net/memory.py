"""The in-memory network of simulations, over the real wire format.

Every node has an Ed25519 identity and a :class:`~dgrpo.protocol.envelope.Signer`; a published rollout is
signed and encoded exactly as a daemon does, and every receiving node decodes and checks it with its own
:class:`~dgrpo.protocol.validator.MessageValidator` (size, schema, run, limits, timestamp, signature, its own
replay window) before the round sees it. So simulations run the daemon's code from the signer to the round;
only gossipsub's routing is left out (what it adds, relaying and peer scoring, is tested between real
processes).

Peer names: libp2p names a node by a hash of its public key; a simulation names its nodes ``node-0``,
``node-1``, ... (every seed of a run derives from these names, so runs stay comparable across versions). The
network keeps the directory from keys to names that the validator and the conversion to a rollout use, as
libp2p's PeerId derivation is used between daemons. An unknown key gets its libp2p PeerId.
"""

from __future__ import annotations

import hashlib
from collections import Counter

import trio

from dgrpo.net.transport import Transport, TransportStatistics
from dgrpo.protocol.envelope import Signer, to_rollout
from dgrpo.protocol.identity import Identity, peer_id_from_public_bytes
from dgrpo.protocol.limits import Limits
from dgrpo.protocol.messages import Rollout
from dgrpo.protocol.nonce import VolatileNonceCounter
from dgrpo.protocol.validator import MessageValidator


def simulated_identity(run_id: str, name: str) -> Identity:
    """A node's identity in a simulation: derived from the run and the node's name (reproducible)."""
    return Identity.from_seed(hashlib.sha256(f"dgrpo/sim/{run_id}/{name}".encode()).digest())


class InMemoryNetwork:
    """Connects in-memory transports within one trio run (one process, e.g. a simulation)."""

    def __init__(self, run_id: str, limits: Limits | None = None, buffer: int = 100_000) -> None:
        self.run_id = run_id
        self.limits = limits or Limits()
        self.buffer = buffer
        self._members: dict[str, InMemoryTransport] = {}
        self._names: dict[bytes, str] = {}

    def name_of(self, public_key: bytes) -> str:
        """The name a key goes by in this network (its libp2p PeerId when it is not a member)."""
        return self._names.get(public_key) or peer_id_from_public_bytes(public_key)

    def join(self, name: str, identity: Identity | None = None) -> InMemoryTransport:
        if name in self._members:
            raise ValueError(f"peer {name!r} already joined")
        identity = identity or simulated_identity(self.run_id, name)
        self._names[identity.public_bytes] = name
        transport = InMemoryTransport(self, name, identity)
        self._members[name] = transport
        return transport

    def deliver(self, sender: str, data: bytes) -> None:
        for name, member in self._members.items():
            if name != sender:
                member.receive(data)

    def inject(self, data: bytes) -> None:
        """Deliver raw bytes to every member, as a hostile peer outside the simulation would (tests)."""
        for member in self._members.values():
            member.receive(data)

    def members(self) -> set[str]:
        return set(self._members)


class InMemoryTransport(Transport):
    def __init__(self, network: InMemoryNetwork, name: str, identity: Identity) -> None:
        self.network = network
        self.peer_id = name
        self.identity = identity
        limits = network.limits
        self.signer = Signer(identity, network.run_id, VolatileNonceCounter(), limits=limits, name=name)
        self.validator = MessageValidator(network.run_id, limits, naming=network.name_of)
        self._send, self._receive = trio.open_memory_channel[Rollout](network.buffer)
        self.dropped: Counter[str] = Counter()

    def __getstate__(self) -> dict[str, object]:
        """A simulation's snapshot (:mod:`dgrpo.simulations.snapshot`) is taken between rounds, when the
        inbound channel is empty: the channel pair is a trio resource, made anew on load."""
        state = dict(self.__dict__)
        del state["_send"], state["_receive"]
        state["_buffer"] = self.network.buffer  # the network may be loaded after this transport (a cycle)
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        buffer = state.pop("_buffer")
        self.__dict__.update(state)
        assert isinstance(buffer, int)
        self._send, self._receive = trio.open_memory_channel[Rollout](buffer)

    async def publish(self, rollout: Rollout) -> None:
        self.network.deliver(self.peer_id, self.signer.sign_rollout(rollout))
        await trio.lowlevel.checkpoint()

    def receive(self, data: bytes) -> None:
        """What gossipsub's topic validator and subscriber do for a daemon: validate, then hand over."""
        verdict = self.validator.validate(data, expected_kind="rollout")
        if not verdict.ok or verdict.envelope is None:
            return  # counted by the validator, by reason and peer
        try:
            self._send.send_nowait(to_rollout(verdict.envelope, self.network.name_of))
        except trio.WouldBlock:
            # A full inbox drops the message, as gossipsub does; it is counted, never silent.
            self.dropped["inbound_full"] += 1

    def inbound(self) -> trio.MemoryReceiveChannel[Rollout]:
        return self._receive

    def peers(self) -> set[str]:
        return self.network.members() - {self.peer_id}

    def statistics(self) -> TransportStatistics:
        stats = self.validator.statistics()
        return TransportStatistics(
            accepted=stats.accepted,
            rejected_by_reason=dict(stats.rejected_by_reason),
            rejected_by_peer=dict(stats.rejected_by_peer),
            rejected_by_peer_reason={peer: dict(reasons) for peer, reasons in stats.rejected_by_peer_reason.items()},
            dropped=dict(self.dropped),
            equivocating_peers=stats.equivocators,
        )
