"""Federated mode's bodies: one chunk of a client's model update, or of the aggregator's global update.

A payload (a sparse update encoded by :mod:`dgrpo.federated.encoding`, opaque here) is cut into ``chunks``
pieces of at most the sender's chunk size so that every wire message stays under ``max_message_bytes``;
each chunk repeats the payload's length, its SHA-256, the hash of the global weights it was computed
against and the reported statistics, so any chunk tells the receiver what the whole is, and a chunk that
disagrees with the first one of its (author, round) is rejected (``docs/protocol.md``, "Federated mode";
reassembly is :mod:`dgrpo.protocol.chunks`).
"""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import Field, model_validator

from dgrpo.protocol.wire import WireModel

SHA256_BYTES = 32
MAX_CLIENTS = 64  # the largest federation (FederatedConfig.clients)
MAX_CLIENT_CHARS = 128  # a client is named by its peer id


class _Chunk(WireModel):
    chunk: Annotated[int, Field(ge=0)]
    chunks: Annotated[int, Field(ge=1)]
    size: Annotated[int, Field(ge=1)]
    sha256: Annotated[bytes, Field(min_length=SHA256_BYTES, max_length=SHA256_BYTES)]
    # The SHA-256 of the global weights the update was computed against (the author's global after the
    # previous round): a receiver never adds a delta taken from other weights, and a node whose weights
    # differ from most of its peers' finds out (docs/protocol.md, "Rounds").
    base: Annotated[bytes, Field(min_length=SHA256_BYTES, max_length=SHA256_BYTES)]

    def _check_chunk(self, data: bytes, floats: tuple[float, ...]) -> None:
        if self.chunk >= self.chunks:
            raise ValueError(f"chunk {self.chunk} must be below chunks {self.chunks}")
        if len(data) > self.size:
            raise ValueError(f"chunk of {len(data)} bytes is longer than the whole payload ({self.size})")
        if not all(math.isfinite(v) for v in floats):
            raise ValueError("statistics and weights must be finite")


class UpdateBody(_Chunk):
    """One chunk of a client's update for the envelope's round, with the statistics it reports."""

    mean: float
    std: float
    samples: Annotated[int, Field(ge=0)]
    groups: Annotated[int, Field(ge=0)]
    data: Annotated[bytes, Field(min_length=1)]

    @model_validator(mode="after")
    def _consistent(self) -> UpdateBody:
        self._check_chunk(self.data, (self.mean, self.std))
        return self


class GlobalBody(_Chunk):
    """One chunk of the aggregator's global update for the envelope's round (star topology)."""

    mean: float
    std: float
    # Each client's length (MAX_CLIENT_CHARS, or max_string_chars) is the validator's string_too_long.
    clients: Annotated[tuple[Annotated[str, Field(min_length=1)], ...], Field(max_length=MAX_CLIENTS)]
    weights: Annotated[tuple[float, ...], Field(max_length=MAX_CLIENTS)]
    data: Annotated[bytes, Field(min_length=1)]

    @model_validator(mode="after")
    def _consistent(self) -> GlobalBody:
        self._check_chunk(self.data, (self.mean, self.std, *self.weights))
        if len(self.weights) != len(self.clients):
            raise ValueError(f"{len(self.weights)} weights for {len(self.clients)} clients")
        return self


ChunkBody = UpdateBody | GlobalBody
