"""Federated mode's exchange over gossipsub: clients' updates and the aggregator's global update, as signed
chunks on their own topics (``docs/protocol.md``, "Federated mode").

Sending: an encoded update (:mod:`dgrpo.federated.encoding`) is cut into chunks of ``chunk_bytes``
(:mod:`dgrpo.protocol.chunks`), each signed as its own envelope. Receiving: every message passed the protocol's
validator inside gossipsub (size, schema, limits, signature, replay); :meth:`UpdateExchange.handle` then
checks what needs the round and the topology, reassembles the chunks per (kind, author, round), decodes the
payload against the model size and keeps the result. Every rejection has a reason code, counted by author in
the reassembler (``/status`` ``round_rejections``, ``/metrics`` ``dgrpo_admission_rejected_total``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import torch
import trio

from dgrpo.federated.client import GlobalStats, Submission
from dgrpo.federated.encoding import MalformedUpdate, decode
from dgrpo.federated.sparse import SparseUpdate
from dgrpo.federated.stats import ClientStats
from dgrpo.net.p2p import Libp2pTransport
from dgrpo.protocol.chunks import Assembled, Reassembler, global_chunks, update_chunks
from dgrpo.protocol.envelope import Envelope, Signer
from dgrpo.protocol.identity import peer_id_from_public_bytes
from dgrpo.protocol.topics import global_topic, update_topic
from dgrpo.protocol.update_bodies import GlobalBody, UpdateBody

log = logging.getLogger("dgrpo.net")
POLL_SECONDS = 0.05


@dataclass(frozen=True)
class ReceivedGlobal:
    """The aggregator's global update for one round, decoded."""

    round: int
    author: str
    stats: GlobalStats
    weights: dict[str, float]
    delta: torch.Tensor  # dense float32: global <- global + delta
    base: bytes  # SHA-256 of the global weights the aggregator added it to


def sparse_of(delta: torch.Tensor) -> SparseUpdate:
    """``delta`` as a sparse update of its nonzero entries (the encoder picks the smaller position format)."""
    flat = delta.reshape(-1).to(torch.float32)
    indices = torch.nonzero(flat, as_tuple=False).reshape(-1).to(torch.int64)
    return SparseUpdate(flat.numel(), indices, flat[indices].clone())


def updates_complete(expected: set[str], have: set[str], awaited: set[str], settled: bool) -> bool:
    """Whether an aggregating node has the round's updates: every ``expected`` author's is in ``have``; or those
    still missing are from authors no longer ``awaited`` (departed) and everything received so far has been
    handled (``settled``). Without that last condition a departure overtakes the update its peer sent just
    before it: both arrive in order, but on two topics read by separate tasks, and nodes that close the round
    with different sets of updates hold different global weights (decentralised topology).

    Worked example (``tests/test_fed_membership.py``): expected {a, b, c}, have {a, b}: with c awaited, not
    complete; with c departed, complete once settled, not before.
    """
    missing = expected - have
    return not missing or (not missing & awaited and settled)


class UpdateExchange:
    """Publishes this node's chunks and collects the round's submissions (and, star topology, global updates).

    ``aggregator``: the peer whose global updates are accepted (star), None in the decentralised topology,
    where a ``global`` message from anyone is ``wrong_aggregator``.
    """

    def __init__(
        self,
        peer_id: str,
        signer: Signer,
        reassembler: Reassembler,
        model_size: int,
        run_id: str,
        chunk_bytes: int,
        aggregator: str | None = None,
        publish: Callable[[str, bytes], Awaitable[None]] | None = None,
    ) -> None:
        self.peer_id = peer_id
        self.signer = signer
        self.reassembler = reassembler
        self.model_size = model_size
        self.chunk_bytes = chunk_bytes
        self.aggregator = aggregator
        self.update_topic = update_topic(run_id)
        self.global_topic = global_topic(run_id)
        self._publish = publish
        self._settled: Callable[[], bool] = lambda: True  # nothing in flight without a network
        self.submissions: dict[int, dict[str, Submission]] = {}
        self.bases: dict[int, dict[str, bytes]] = {}  # round -> author -> the global weights' hash it trained from
        self.globals: dict[int, ReceivedGlobal] = {}
        # author -> the newest round it sent a chunk for (signed, validated; kept or not): how far along the
        # federation is, fresher than heartbeats (a joiner picks its first round from it). The least recently
        # heard authors are forgotten first beyond limits.max_tracked_peers.
        self.latest: dict[str, int] = {}
        self.bytes_sent = 0
        self.messages_sent = 0

    # ----------------------------------------------------------------- network
    async def start(self, transport: Libp2pTransport, nursery: trio.Nursery) -> None:
        self._publish = transport.publish_signed
        self._settled = lambda: transport.settled(self.update_topic) and transport.settled(self.global_topic)
        updates = await transport.open_topic(nursery, self.update_topic, "update")
        globals_ = await transport.open_topic(nursery, self.global_topic, "global")
        nursery.start_soon(self._drain, updates)
        nursery.start_soon(self._drain, globals_)

    async def _drain(self, channel: trio.MemoryReceiveChannel[Envelope]) -> None:
        async for env in channel:
            try:
                self.handle(env)
            except Exception:  # a bug, not hostile input: log it and keep receiving
                log.exception("handling a federated update failed")

    async def _send(self, topic: str, messages: list[bytes]) -> int:
        if self._publish is None:
            raise RuntimeError("the exchange is not started")
        for data in messages:
            await self._publish(topic, data)
            self.bytes_sent += len(data)
            self.messages_sent += 1
        return sum(map(len, messages))

    async def publish_update(self, round_idx: int, stats: ClientStats, payload: bytes, base: bytes) -> int:
        """Sign and publish this node's update for ``round_idx``, computed against the global weights hashing
        to ``base``, as chunks; returns the wire bytes sent."""
        bodies = update_chunks(payload, stats.mean, stats.std, stats.samples, stats.groups, self.chunk_bytes, base=base)
        return await self._send(self.update_topic, [self.signer.sign_chunk(b, round_idx) for b in bodies])

    async def publish_global(
        self, round_idx: int, stats: GlobalStats, weights: dict[str, float], payload: bytes, base: bytes
    ) -> int:
        """Sign and publish the aggregated update of ``round_idx``, to be added to the global weights hashing to
        ``base`` (star topology, the aggregator only)."""
        clients = sorted(weights)
        values = [weights[c] for c in clients]
        bodies = global_chunks(payload, stats.mean, stats.std, clients, values, self.chunk_bytes, base=base)
        return await self._send(self.global_topic, [self.signer.sign_chunk(b, round_idx) for b in bodies])

    async def wait(self, ready: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``ready()`` or ``timeout`` seconds; returns ``ready()``."""
        with trio.move_on_after(timeout):
            while not ready():
                await trio.sleep(POLL_SECONDS)
        return ready()

    def settled(self) -> bool:
        """Whether every update and global chunk received from the network so far has been handled."""
        return self._settled()

    # ----------------------------------------------------------------- receiving
    def handle(self, env: Envelope) -> None:
        """Take one validated envelope of the update or global topic (never raises for hostile input)."""
        author = peer_id_from_public_bytes(env.author)
        body = env.body
        if not isinstance(body, UpdateBody | GlobalBody) or author == self.peer_id:
            return
        self._heard(author, env.round)
        if isinstance(body, GlobalBody) and author != self.aggregator:
            self.reassembler.reject("wrong_aggregator", author)
            return
        assembled = self.reassembler.add(env.kind, author, env.round, body)
        if assembled is None:
            return
        try:
            update = decode(assembled.payload, expected_size=self.model_size)
        except MalformedUpdate as exc:
            log.warning("%s's %s for round %d does not decode: %s", author, env.kind, env.round, exc)
            self.reassembler.reject("bad_update", author)
            return
        self._keep(assembled, update)

    def _heard(self, author: str, round_idx: int) -> None:
        newest = max(round_idx, self.latest.pop(author, 0))
        self.latest[author] = newest  # re-inserted: dict order is recency
        if len(self.latest) > self.reassembler.limits.max_tracked_peers:
            del self.latest[next(iter(self.latest))]

    def _keep(self, assembled: Assembled, update: SparseUpdate) -> None:
        head, r = assembled.head, assembled.round
        if isinstance(head, UpdateBody):
            stats = ClientStats(head.mean, head.std, head.samples, head.groups)
            self.submissions.setdefault(r, {})[assembled.author] = Submission(assembled.author, r, stats, update)
            self.bases.setdefault(r, {})[assembled.author] = head.base
        else:
            weights = dict(zip(head.clients, head.weights, strict=True))
            self.globals[r] = ReceivedGlobal(
                r, assembled.author, GlobalStats(head.mean, head.std), weights, update.dense(), head.base
            )

    def add_own(self, submission: Submission, base: bytes) -> None:
        self.submissions.setdefault(submission.round, {})[submission.client] = submission
        self.bases.setdefault(submission.round, {})[submission.client] = base

    def advance(self, round_idx: int) -> None:
        """Round ``round_idx`` is open: earlier rounds' chunks are dropped from now on."""
        self.reassembler.advance(round_idx)
        for r in [r for r in self.submissions if r < round_idx]:
            del self.submissions[r]
            self.bases.pop(r, None)
        for r in [r for r in self.globals if r < round_idx]:
            del self.globals[r]

    def received(self, round_idx: int) -> dict[str, Submission]:
        return dict(self.submissions.get(round_idx, {}))
