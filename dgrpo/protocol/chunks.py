"""Federated mode's chunking: cut an encoded update into signed-message-sized chunks, and put the chunks of
each (kind, author, round) back together with bounds (``docs/protocol.md``, "Federated mode").

The payload is opaque here (the sparse-update encoding is :mod:`dgrpo.federated.encoding`, decoded by the
daemon, which reports a failure back as ``bad_update``). Hostile chunks get a reason code, counted by reason
and by author, never an exception; the codes, in the order they are checked, are :data:`REASSEMBLY_REASONS`.
"""

from __future__ import annotations

import hashlib
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dgrpo.protocol.counting import PeerReasons
from dgrpo.protocol.limits import Limits
from dgrpo.protocol.update_bodies import ChunkBody, GlobalBody, UpdateBody

DEFAULT_CHUNK_BYTES = 128 * 1024  # payload bytes per message: far below max_message_bytes (1 MiB)
# Checked on arrival of each chunk, in this order, then on completion (bad_hash); the daemon adds the last two.
REASSEMBLY_REASONS = (
    "closed_round",
    "future_round",
    "duplicate_update",
    "chunk_mismatch",
    "duplicate_chunk",
    "size_mismatch",
    "buffer_full",
    "bad_hash",
)
DAEMON_REASONS = ("wrong_aggregator", "bad_update", "stale_base")
FEDERATED_REASONS = REASSEMBLY_REASONS + DAEMON_REASONS
_HEAD_FIELDS = ("chunks", "size", "sha256", "base", "mean", "std", "samples", "groups", "clients", "weights")

Key = tuple[str, str, int]  # (kind, author, round)


def split_payload(payload: bytes, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> list[bytes]:
    """``payload`` in consecutive pieces of at most ``chunk_bytes`` (at least one piece)."""
    if chunk_bytes < 1:
        raise ValueError("chunk_bytes must be positive")
    if not payload:
        raise ValueError("nothing to send")
    return [payload[i : i + chunk_bytes] for i in range(0, len(payload), chunk_bytes)]


def frames(payload: bytes, base: bytes, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> list[dict[str, Any]]:
    """The fields every chunk body shares: its index, the count, the payload's size and hash, the global
    weights' hash it applies to, its piece."""
    pieces = split_payload(payload, chunk_bytes)
    sha = hashlib.sha256(payload).digest()
    return [
        {"chunk": i, "chunks": len(pieces), "size": len(payload), "sha256": sha, "base": base, "data": piece}
        for i, piece in enumerate(pieces)
    ]


def update_chunks(
    payload: bytes,
    mean: float,
    std: float,
    samples: int,
    groups: int,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    *,
    base: bytes,
) -> list[UpdateBody]:
    """The bodies of a client's update computed against the global weights hashing to ``base``: every chunk
    carries the payload's size, hash, ``base`` and the statistics."""
    return [
        UpdateBody(**frame, mean=float(mean), std=float(std), samples=samples, groups=groups)
        for frame in frames(payload, base, chunk_bytes)
    ]


def global_chunks(
    payload: bytes,
    mean: float,
    std: float,
    clients: Sequence[str],
    weights: Sequence[float],
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    *,
    base: bytes,
) -> list[GlobalBody]:
    """The bodies of the aggregator's global update, to be added to the global weights hashing to ``base``:
    the aggregated delta, statistics, clients and weights."""
    return [
        GlobalBody(
            **frame,
            mean=float(mean),
            std=float(std),
            clients=tuple(clients),
            weights=tuple(float(w) for w in weights),
        )
        for frame in frames(payload, base, chunk_bytes)
    ]


@dataclass(frozen=True)
class Assembled:
    """A complete, hash-checked payload and the chunk that described it."""

    kind: str
    author: str
    round: int
    head: ChunkBody  # the first chunk that arrived (statistics, clients, weights)
    payload: bytes


@dataclass
class _Partial:
    head: ChunkBody
    pieces: dict[int, bytes] = field(default_factory=dict)
    buffered: int = 0


@dataclass(frozen=True)
class ReassemblyStatistics:
    completed: int
    rejected_by_reason: dict[str, int]
    rejected_by_author: dict[str, int]
    rejected_by_author_reason: dict[str, dict[str, int]] = field(default_factory=dict)  # author -> reason -> n


def _head(body: ChunkBody) -> tuple[object, ...]:
    return tuple(getattr(body, name, None) for name in _HEAD_FIELDS)


class Reassembler:
    """Chunks of updates for rounds ``current_round`` .. ``current_round + limits.rounds_ahead``.

    At most ``max_buffered_bytes`` of incomplete payloads are held (default: 8 x ``limits.max_update_bytes``);
    a completed (kind, author, round) is remembered until its round closes, so a second copy is
    ``duplicate_update``. Thread-safe.
    """

    def __init__(self, limits: Limits | None = None, max_buffered_bytes: int | None = None) -> None:
        self.limits = limits or Limits()
        self.max_buffered_bytes = max_buffered_bytes or 8 * self.limits.max_update_bytes
        self.current_round = 0
        self.completed = 0
        self._partial: dict[Key, _Partial] = {}
        self._done: set[Key] = set()
        self._buffered = 0
        self._by_reason: Counter[str] = Counter()
        self._by_author = PeerReasons(self.limits.max_tracked_peers)
        self._lock = threading.Lock()

    def add(self, kind: str, author: str, round_idx: int, body: ChunkBody) -> Assembled | None:
        """Keep one validated chunk; the whole payload once its last chunk arrived, else None (a rejection is
        counted; see :meth:`statistics`)."""
        with self._lock:
            reason, assembled = self._add(kind, author, round_idx, body)
            if reason is not None:
                self._count(reason, author)
            return assembled

    def _add(self, kind: str, author: str, round_idx: int, body: ChunkBody) -> tuple[str | None, Assembled | None]:
        if round_idx < self.current_round:
            return "closed_round", None
        if round_idx > self.current_round + self.limits.rounds_ahead:
            return "future_round", None
        key = (kind, author, round_idx)
        if key in self._done:
            return "duplicate_update", None
        partial = self._partial.get(key)
        if partial is not None and _head(partial.head) != _head(body):
            return "chunk_mismatch", None
        if partial is not None and body.chunk in partial.pieces:
            return "duplicate_chunk", None
        buffered = (partial.buffered if partial is not None else 0) + len(body.data)
        if buffered > body.size:
            self._drop(key)
            return "size_mismatch", None
        if self._buffered + len(body.data) > self.max_buffered_bytes:
            return "buffer_full", None
        if partial is None:
            partial = self._partial[key] = _Partial(body)
        partial.pieces[body.chunk] = body.data
        partial.buffered = buffered
        self._buffered += len(body.data)
        if len(partial.pieces) < body.chunks:
            return None, None
        self._drop(key)
        self._done.add(key)
        payload = b"".join(partial.pieces[i] for i in range(body.chunks))
        if len(payload) != body.size:
            return "size_mismatch", None
        if hashlib.sha256(payload).digest() != body.sha256:
            return "bad_hash", None
        self.completed += 1
        return None, Assembled(kind, author, round_idx, partial.head, payload)

    def _drop(self, key: Key) -> None:
        partial = self._partial.pop(key, None)
        if partial is not None:
            self._buffered -= partial.buffered

    def advance(self, round_idx: int) -> None:
        """Rounds before ``round_idx`` are closed: their incomplete payloads are dropped."""
        with self._lock:
            self.current_round = round_idx
            for key in [k for k in self._partial if k[2] < round_idx]:
                self._drop(key)
            self._done = {k for k in self._done if k[2] >= round_idx}

    def started(self, kind: str, round_idx: int) -> set[str]:
        """Authors of which some chunk of ``kind`` for ``round_idx`` has been kept (complete or not)."""
        with self._lock:
            keys = [*self._partial, *self._done]
        return {author for k, author, r in keys if k == kind and r == round_idx}

    def reject(self, reason: str, author: str) -> None:
        """Count a rejection decided outside (the daemon: ``wrong_aggregator``, ``bad_update``)."""
        with self._lock:
            self._count(reason, author)

    def _count(self, reason: str, author: str) -> None:
        self._by_reason[reason] += 1
        self._by_author.add(author, reason)  # the least recently rejected is forgotten first

    def statistics(self) -> ReassemblyStatistics:
        with self._lock:
            return ReassemblyStatistics(
                self.completed, dict(self._by_reason), self._by_author.by_peer(), self._by_author.snapshot()
            )
