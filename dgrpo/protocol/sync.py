"""Federated mode's state sync: the bytes a late joiner and a serving peer exchange on a libp2p stream
(``docs/protocol.md``, "Federated mode", "State sync").

A node that joins a federation under way needs the current global weights. A dense snapshot is megabytes,
so it travels on a request/response stream to the one node that asks, never through gossipsub (which would
flood it to everyone). The request is 5 bytes; the answer is a signed header (run, round, SHA-256 of the
weights, global statistics, aggregator, reward history), then, for a weights request, the float32 weights.

Bytes only here (no torch, no libp2p): framing, signing, and the header checks, each failure a reason code
of :data:`SYNC_REASONS`. The signature covers a canonical encoding behind its own domain tag, as the
envelope's does (:mod:`dgrpo.protocol.envelope`), so a sync header can never pass for an envelope or back.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal

import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import Field, ValidationError, model_validator

from dgrpo.errors import DgrpoError
from dgrpo.protocol.identity import PUBLIC_KEY_BYTES, SIGNATURE_BYTES, Identity, peer_id_from_public_bytes
from dgrpo.protocol.topics import RUN_ID_PATTERN, validate_run_id
from dgrpo.protocol.update_bodies import MAX_CLIENT_CHARS, MAX_CLIENTS, SHA256_BYTES
from dgrpo.protocol.wire import WireModel, strict_unpack

SYNC_VERSION: Final = 1
DOMAIN_TAG = b"dgrpo/fed-sync/1\x00"  # not the envelope's tag: neither signature passes for the other
REQUEST_MAGIC = b"DGS1"
HEAD: Final = 0x01  # answer the header only: which round and weights the peer holds (a cheap poll)
WEIGHTS: Final = 0x02  # answer the header, then the weights
REQUEST_BYTES = len(REQUEST_MAGIC) + 1
LENGTH_BYTES = 4  # the header's length, big-endian uint32
MAX_HEADER_BYTES = 16 * 1024  # the largest valid header (64 history entries, 128-character ids) is under 9 KiB
FLOAT_BYTES = 4  # weights are float32

# In the order the fetching side checks them, then the serving side's (docs/protocol.md, "State sync").
FETCH_REASONS = (
    "sync_unavailable",
    "sync_timeout",
    "sync_oversize",
    "sync_malformed",
    "sync_bad_signature",
    "sync_wrong_signer",
    "sync_wrong_run",
    "sync_size_mismatch",
    "sync_wrong_aggregator",
    "sync_disagrees",
    "sync_bad_hash",
    "sync_bad_weights",
)
SERVE_REASONS = ("sync_bad_request", "sync_busy")
SYNC_REASONS = FETCH_REASONS + SERVE_REASONS


def sync_protocol(run: str) -> str:
    """``/dgrpo/<run>/fed-sync/1``: the libp2p protocol id of the state sync stream."""
    return f"/dgrpo/{validate_run_id(run)}/fed-sync/{SYNC_VERSION}"


class SyncRejected(DgrpoError):
    """A sync answer (or request) failed a check; ``reason`` is one of :data:`SYNC_REASONS`."""

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else reason)


# ----------------------------------------------------------------- the request
def encode_request(what: int) -> bytes:
    """``"DGS1" || what``: :data:`HEAD` or :data:`WEIGHTS`."""
    if what not in (HEAD, WEIGHTS):
        raise ValueError(f"unknown sync request {what}")
    return REQUEST_MAGIC + bytes([what])


def parse_request(data: bytes) -> int | None:
    """What a request asks for, None when it is not exactly a valid request."""
    if len(data) != REQUEST_BYTES or data[: len(REQUEST_MAGIC)] != REQUEST_MAGIC or data[-1] not in (HEAD, WEIGHTS):
        return None
    return data[-1]


# ----------------------------------------------------------------- the header
class UnsignedSyncHeader(WireModel):
    """Every header field the signature covers, in canonical order."""

    v: Literal[1]
    run: Annotated[str, Field(pattern=f"^{RUN_ID_PATTERN}$")]
    round: Annotated[int, Field(ge=0)]
    size: Annotated[int, Field(ge=FLOAT_BYTES)]
    sha256: Annotated[bytes, Field(min_length=SHA256_BYTES, max_length=SHA256_BYTES)]
    mean: float | None
    std: float | None
    aggregator: Annotated[str, Field(min_length=1, max_length=MAX_CLIENT_CHARS)] | None
    clients: Annotated[
        tuple[Annotated[str, Field(min_length=1, max_length=MAX_CLIENT_CHARS)], ...], Field(max_length=MAX_CLIENTS)
    ]
    means: Annotated[tuple[float, ...], Field(max_length=MAX_CLIENTS)]
    signer: Annotated[bytes, Field(min_length=PUBLIC_KEY_BYTES, max_length=PUBLIC_KEY_BYTES)]

    @model_validator(mode="before")
    @classmethod
    def _optional_floats_are_floats(cls, data: Any) -> Any:
        # WireModel checks plain float fields; these may also be nil, and an int would be a second encoding.
        if isinstance(data, dict):
            for name in ("mean", "std"):
                if data.get(name) is not None and type(data[name]) is not float:
                    raise ValueError(f"{name} must be a float (msgpack float 64) or nil")
        return data

    @model_validator(mode="after")
    def _consistent(self) -> UnsignedSyncHeader:
        if self.size % FLOAT_BYTES:
            raise ValueError(f"size {self.size} is not a whole number of float32")
        if (self.mean is None) != (self.std is None):
            raise ValueError("mean and std are both nil (no global statistics yet) or both given")
        if not all(math.isfinite(v) for v in (self.mean or 0.0, self.std or 0.0, *self.means)):
            raise ValueError("statistics and history must be finite")
        if len(self.means) != len(self.clients):
            raise ValueError(f"{len(self.means)} means for {len(self.clients)} clients")
        if list(self.clients) != sorted(set(self.clients)):
            raise ValueError("clients must be ascending and distinct")
        return self


class SyncHeader(UnsignedSyncHeader):
    """A signed header: :class:`UnsignedSyncHeader` plus the signer's Ed25519 signature of its canonical bytes."""

    sig: Annotated[bytes, Field(min_length=SIGNATURE_BYTES, max_length=SIGNATURE_BYTES)]

    @property
    def peer_id(self) -> str:
        return peer_id_from_public_bytes(self.signer)

    @property
    def history(self) -> dict[str, float]:
        return dict(zip(self.clients, self.means, strict=True))


def canonical_bytes(header: UnsignedSyncHeader) -> bytes:
    """``DOMAIN_TAG || msgpack([v, run, round, size, sha256, mean, std, aggregator, [clients], [means], signer])``
    (shortest encodings, floats as float 64, nil for an absent value); works on a :class:`SyncHeader` too."""
    fields = [getattr(header, name) for name in UnsignedSyncHeader.model_fields]
    values = [list(v) if isinstance(v, tuple) else v for v in fields]
    packed: bytes = msgpack.packb(values, use_bin_type=True, use_single_float=False)
    return DOMAIN_TAG + packed


def sign_header(
    identity: Identity,
    run: str,
    round_idx: int,
    weights: bytes,
    stats: tuple[float, float] | None,
    aggregator: str | None,
    history: Mapping[str, float],
) -> bytes:
    """The framed header a server answers with: ``length (uint32 big-endian) || msgpack map``."""
    clients = tuple(sorted(history))
    unsigned = UnsignedSyncHeader(
        v=SYNC_VERSION,
        run=run,
        round=round_idx,
        size=len(weights),
        sha256=hashlib.sha256(weights).digest(),
        mean=None if stats is None else float(stats[0]),
        std=None if stats is None else float(stats[1]),
        aggregator=aggregator,
        clients=clients,
        means=tuple(float(history[c]) for c in clients),
        signer=identity.public_bytes,
    )
    fields = {name: getattr(unsigned, name) for name in UnsignedSyncHeader.model_fields}
    header = SyncHeader(**fields, sig=identity.sign(canonical_bytes(unsigned)))
    packed: bytes = msgpack.packb(header.model_dump(), use_bin_type=True, use_single_float=False)
    return len(packed).to_bytes(LENGTH_BYTES, "big") + packed


def header_length(prefix: bytes) -> int:
    """The header's declared length; :class:`SyncRejected` ``sync_oversize`` above :data:`MAX_HEADER_BYTES`."""
    length = int.from_bytes(prefix, "big")
    if length > MAX_HEADER_BYTES:
        raise SyncRejected("sync_oversize", f"a header of {length} bytes (at most {MAX_HEADER_BYTES})")
    return length


def decode_header(data: bytes) -> SyncHeader:
    """Parse a header (without its length prefix); :class:`SyncRejected` ``sync_malformed`` on any error."""
    try:
        obj = strict_unpack(data, max_bytes=MAX_HEADER_BYTES, max_array_len=MAX_CLIENTS, max_map_len=32)
        if not isinstance(obj, dict):
            raise ValueError(f"top level is a {type(obj).__name__}, not a map")
        return SyncHeader.model_validate(obj)
    except ValidationError as e:
        raise SyncRejected("sync_malformed", f"{e.error_count()} schema error(s)") from None
    except Exception as e:  # msgpack raises several types; all mean malformed
        raise SyncRejected("sync_malformed", f"{type(e).__name__}: {str(e)[:200]}") from None


def _signature_ok(header: SyncHeader) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(header.signer).verify(header.sig, canonical_bytes(header))
    except (InvalidSignature, ValueError):
        return False
    return True


def check_header(header: SyncHeader, peer: str, run: str, model_bytes: int, aggregator: str | None = None) -> None:
    """The checks on a decoded header, in the order of :data:`FETCH_REASONS`; raises :class:`SyncRejected`.

    ``peer``: whom the stream was opened to (libp2p authenticated it); the header must be signed by it.
    ``aggregator`` (star topology): the header must name it as the federation's aggregator.
    """
    if not _signature_ok(header):
        raise SyncRejected("sync_bad_signature")
    if header.peer_id != peer:
        raise SyncRejected("sync_wrong_signer", f"signed by {header.peer_id}, asked {peer}")
    if header.run != run:
        raise SyncRejected("sync_wrong_run", f"run {header.run!r}")
    if header.size != model_bytes:
        raise SyncRejected("sync_size_mismatch", f"{header.size} bytes of weights, the model has {model_bytes}")
    if aggregator is not None and header.aggregator != aggregator:
        raise SyncRejected("sync_wrong_aggregator", f"names {header.aggregator}, not {aggregator}")


def check_weights(header: SyncHeader, weights: bytes) -> None:
    """The received weights are the ones the header describes (``sync_size_mismatch``, ``sync_bad_hash``)."""
    if len(weights) != header.size:
        raise SyncRejected("sync_size_mismatch", f"{len(weights)} bytes, the header says {header.size}")
    if hashlib.sha256(weights).digest() != header.sha256:
        raise SyncRejected("sync_bad_hash")
