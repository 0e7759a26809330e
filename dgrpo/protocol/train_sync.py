"""Weights sync of the completion exchange: the bytes a node that joins late (or fell behind, or diverged) and
a serving peer exchange to hand over the trainable state (``docs/protocol.md``, "Weights sync").

Nodes of a homogeneous run hold the same weights and optimizer state: they start from the same base weights and
train on the same completion strings each round ("Hail to the Thief", sec. 3). A node that joins at round 20
cannot replay 19 rounds it never saw, so it takes the state its peers hold. Which state is decided by the
peers' **announcements**: every node's signed heartbeat names the root of its state after its last completed
round (:func:`state_root`); a joiner takes only a root a strict majority of its peers under way announce
(:func:`majority_root`), so a minority (one hostile peer, a few Sybils) cannot hand it weights of its choosing.

The state is cut into pieces of ``piece_bytes``; the root is the SHA-256 of the piece hashes behind a domain
tag, as BitTorrent's info hash covers its piece hashes. The header a server answers with lists the piece
hashes: the client checks them against the announced root at once, and every piece as it arrives, so a bad
piece is rejected on its own and a broken transfer resumes from the first piece it lacks, from the same or
another holder of the root.

Bytes only here (no torch, no libp2p): framing, the header model, hashing, the majority rule and the checks,
each failure a reason code of :data:`STATE_REASONS`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Final, Literal

import msgpack
from pydantic import Field, ValidationError, model_validator

from dgrpo.errors import DgrpoError
from dgrpo.protocol.topics import RUN_ID_PATTERN, validate_run_id
from dgrpo.protocol.wire import WireModel, strict_unpack

STATE_VERSION: Final = 1
ROOT_TAG = b"dgrpo/train-state/1\x00"  # the root covers this tag: no other hash of the project passes for one
REQUEST_MAGIC = b"DGW1"
HEAD: Final = 0x01  # answer the header: which round and root the peer serves, and the piece hashes
PIECES: Final = 0x02  # answer the pieces [first, first + count) of the state with the given root
HEAD_REQUEST_BYTES = len(REQUEST_MAGIC) + 1
PIECES_REQUEST_BYTES = HEAD_REQUEST_BYTES + 32 + 4 + 4  # + root, first (uint32), count (uint32)
LENGTH_BYTES = 4  # the header's length, big-endian uint32
HASH_BYTES = 32
MIN_PIECE_BYTES = 64 * 1024
MAX_PIECE_BYTES = 4 * 1024 * 1024
PIECE_BYTES = 1024 * 1024  # what a dgrpo node serves
MAX_PIECES = 8192  # 8 GiB at the largest piece size; a header lists at most this many hashes
MAX_HEADER_BYTES = 64 + MAX_PIECES * (HASH_BYTES + 2) + 256
HELD: Final = 0x00  # the first byte of a pieces answer: the pieces follow
NOT_HELD: Final = 0x01  # the server no longer holds that root (it completed another round): nothing follows

# In the order the fetching side meets them, then the serving side's (docs/protocol.md, "Weights sync").
FETCH_REASONS = (
    "state_no_majority",
    "state_unavailable",
    "state_timeout",
    "state_oversize",
    "state_malformed",
    "state_wrong_run",
    "state_disagrees",
    "state_not_held",
    "state_bad_piece",
    "state_bad_layout",
)
SERVE_REASONS = ("state_bad_request", "state_busy")
STATE_REASONS = FETCH_REASONS + SERVE_REASONS


def state_protocol(run: str) -> str:
    """``/dgrpo/<run>/state/1``: the libp2p protocol id of the weights sync stream."""
    return f"/dgrpo/{validate_run_id(run)}/state/{STATE_VERSION}"


class StateRejected(DgrpoError):
    """A weights sync answer (or request) failed a check; ``reason`` is one of :data:`STATE_REASONS`."""

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else reason)


# ----------------------------------------------------------------- hashing
def piece_hashes(state: bytes, piece_bytes: int = PIECE_BYTES) -> tuple[bytes, ...]:
    """SHA-256 of each ``piece_bytes`` slice of ``state`` (the last one may be shorter; none for no bytes)."""
    return tuple(hashlib.sha256(state[i : i + piece_bytes]).digest() for i in range(0, len(state), piece_bytes))


def state_root(size: int, piece_bytes: int, pieces: Sequence[bytes]) -> bytes:
    """``SHA-256(ROOT_TAG || size (uint64 BE) || piece_bytes (uint32 BE) || piece hashes)``: what heartbeats
    announce. Equal roots mean equal states, byte for byte."""
    h = hashlib.sha256(ROOT_TAG)
    h.update(size.to_bytes(8, "big") + piece_bytes.to_bytes(4, "big"))
    for piece in pieces:
        h.update(piece)
    return h.digest()


def piece_count(size: int, piece_bytes: int) -> int:
    return -(-size // piece_bytes)


# ----------------------------------------------------------------- requests
def encode_head_request() -> bytes:
    """``"DGW1" || 0x01``."""
    return REQUEST_MAGIC + bytes([HEAD])


def encode_pieces_request(root: bytes, first: int, count: int) -> bytes:
    """``"DGW1" || 0x02 || root (32) || first (uint32 BE) || count (uint32 BE)``."""
    if len(root) != HASH_BYTES or not 0 <= first < 2**32 or not 1 <= count < 2**32:
        raise ValueError("a pieces request names a 32-byte root, a first piece and a positive count")
    return REQUEST_MAGIC + bytes([PIECES]) + root + first.to_bytes(4, "big") + count.to_bytes(4, "big")


@dataclass(frozen=True)
class Request:
    kind: int  # HEAD or PIECES
    root: bytes = b""
    first: int = 0
    count: int = 0


def parse_request_kind(prefix: bytes) -> int | None:
    """The kind a request's first :data:`HEAD_REQUEST_BYTES` bytes name, None when they are not a request."""
    if len(prefix) != HEAD_REQUEST_BYTES or prefix[:4] != REQUEST_MAGIC or prefix[4] not in (HEAD, PIECES):
        return None
    return prefix[4]


def parse_pieces_tail(tail: bytes) -> Request | None:
    """The rest of a pieces request (root, first, count), None when malformed (a zero count included)."""
    if len(tail) != PIECES_REQUEST_BYTES - HEAD_REQUEST_BYTES:
        return None
    first, count = int.from_bytes(tail[32:36], "big"), int.from_bytes(tail[36:40], "big")
    return Request(PIECES, tail[:32], first, count) if count else None


# ----------------------------------------------------------------- the header
class StateHeader(WireModel):
    """What a server serves: the state after ``round`` of run ``run``, ``size`` bytes in pieces of
    ``piece_bytes``, and the SHA-256 of each piece. Unsigned: the root it hashes to is what a majority of
    signed heartbeats announced, and the stream's peer is authenticated by libp2p."""

    v: Literal[1]
    run: Annotated[str, Field(pattern=f"^{RUN_ID_PATTERN}$")]
    round: Annotated[int, Field(ge=1)]
    size: Annotated[int, Field(ge=1)]
    piece_bytes: Annotated[int, Field(ge=MIN_PIECE_BYTES, le=MAX_PIECE_BYTES)]
    pieces: Annotated[
        tuple[Annotated[bytes, Field(min_length=HASH_BYTES, max_length=HASH_BYTES)], ...],
        Field(min_length=1, max_length=MAX_PIECES),
    ]

    @model_validator(mode="after")
    def _pieces_cover_the_size(self) -> StateHeader:
        if len(self.pieces) != piece_count(self.size, self.piece_bytes):
            raise ValueError(f"{len(self.pieces)} piece hashes for {self.size} bytes in pieces of {self.piece_bytes}")
        return self

    @property
    def root(self) -> bytes:
        return state_root(self.size, self.piece_bytes, self.pieces)

    def piece_size(self, index: int) -> int:
        return min(self.piece_bytes, self.size - index * self.piece_bytes)


def encode_header(run: str, round_idx: int, state: bytes, piece_bytes: int = PIECE_BYTES) -> bytes:
    """The framed header of ``state``: ``length (uint32 BE) || msgpack map`` (the fields of
    :class:`StateHeader`, in order)."""
    header = StateHeader(
        v=STATE_VERSION, run=run, round=round_idx, size=len(state), piece_bytes=piece_bytes,
        pieces=piece_hashes(state, piece_bytes),
    )  # fmt: skip
    packed: bytes = msgpack.packb(header.model_dump(), use_bin_type=True)
    return len(packed).to_bytes(LENGTH_BYTES, "big") + packed


def header_length(prefix: bytes) -> int:
    """The header's declared length; ``state_oversize`` above :data:`MAX_HEADER_BYTES`."""
    length = int.from_bytes(prefix, "big")
    if length > MAX_HEADER_BYTES:
        raise StateRejected("state_oversize", f"a header of {length} bytes (at most {MAX_HEADER_BYTES})")
    return length


def decode_header(data: bytes) -> StateHeader:
    """Parse a header (without its length prefix); ``state_malformed`` on any error."""
    try:
        obj = strict_unpack(data, max_bytes=MAX_HEADER_BYTES, max_array_len=MAX_PIECES, max_map_len=16)
        if not isinstance(obj, dict):
            raise ValueError(f"top level is a {type(obj).__name__}, not a map")
        return StateHeader.model_validate(obj)
    except ValidationError as e:
        raise StateRejected("state_malformed", f"{e.error_count()} schema error(s)") from None
    except Exception as e:  # msgpack raises several types; all mean malformed
        raise StateRejected("state_malformed", f"{type(e).__name__}: {str(e)[:200]}") from None


def check_header(header: StateHeader, run: str, root: bytes, max_bytes: int) -> None:
    """The checks on a decoded header against what the client wants; raises :class:`StateRejected`."""
    if header.run != run:
        raise StateRejected("state_wrong_run", f"run {header.run!r}")
    if header.size > max_bytes:
        raise StateRejected("state_oversize", f"a state of {header.size} bytes (at most {max_bytes})")
    if header.root != root:
        raise StateRejected("state_disagrees", f"root {header.root.hex()[:12]}…, not the announced {root.hex()[:12]}…")


def check_piece(header: StateHeader, index: int, data: bytes) -> None:
    """Piece ``index`` is the one the header hashes (``state_bad_piece``)."""
    if len(data) != header.piece_size(index) or hashlib.sha256(data).digest() != header.pieces[index]:
        raise StateRejected("state_bad_piece", f"piece {index} does not match its hash")


# ----------------------------------------------------------------- which state
@dataclass(frozen=True)
class Announcement:
    """A peer's last announced state: the round it completed and the root of its state after it."""

    round: int
    root: bytes


@dataclass(frozen=True)
class Majority:
    round: int
    root: bytes
    holders: tuple[str, ...]  # the peers announcing it, in id order


def majority_root(
    announced: Mapping[str, Announcement | None], at_least: int, own: Announcement | None = None
) -> Majority | None:
    """The state a strict majority of the voters hold, at the highest round where one does, or None.

    Voters are the peers in ``announced`` (None: a peer of the same model that announced no state yet, which
    counts against every root) and this node itself when ``own`` is given. Only states of round ``at_least`` or
    later are candidates. A root needs more than half of all voters: with two honest peers and one hostile
    one, the hostile root has 1 of 3 and is never taken; with one peer of each, neither is (an honest joiner
    then trains from where it is rather than trust either). Ties cannot arise: a strict majority is unique."""
    votes: dict[tuple[int, bytes], list[str]] = {}
    for peer, ann in announced.items():
        if ann is not None and ann.round >= at_least:
            votes.setdefault((ann.round, ann.root), []).append(peer)
    voters = len(announced) + (own is not None)
    if own is not None and own.round >= at_least:
        votes.setdefault((own.round, own.root), []).append("")
    for (round_idx, root), holders in sorted(votes.items(), key=lambda kv: (-kv[0][0], kv[0][1])):
        if 2 * len(holders) > voters:
            return Majority(round_idx, root, tuple(sorted(p for p in holders if p)))
    return None
