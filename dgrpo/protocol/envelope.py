"""The signed envelope: models, canonical signing bytes, wire encoding, and the signer.

Specified in ``docs/protocol.md``; a test keeps the field tables there equal to the models here. The
signature covers a canonical encoding of every field but ``sig`` (fields as msgpack arrays in model order,
behind a domain tag), never the wire bytes: any re-encoding of a message (other map key order, other int
widths) verifies, and has the same (author, nonce), so receivers drop it as a replay.
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Final, Literal

import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import (
    BaseModel,
    Discriminator,
    Field,
    SerializerFunctionWrapHandler,
    Tag,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from dgrpo.errors import DgrpoError
from dgrpo.protocol.identity import PUBLIC_KEY_BYTES, SIGNATURE_BYTES, Identity, peer_id_from_public_bytes
from dgrpo.protocol.limits import Limits
from dgrpo.protocol.messages import WEIGHTS_PATTERN, Rollout, SamplingParams, SplitMode
from dgrpo.protocol.nonce import NONCE_LIMIT, NonceSource
from dgrpo.protocol.replay import DIGEST_BYTES
from dgrpo.protocol.topics import RUN_ID_PATTERN, validate_run_id
from dgrpo.protocol.update_bodies import GlobalBody, UpdateBody
from dgrpo.protocol.wire import WireModel, strict_unpack

PROTOCOL_VERSION: Final = 1
DOMAIN_TAG = b"dgrpo/envelope/1\x00"  # separates these signatures from any other use of the same key
MAX_LISTEN_ADDRS = 8
STATE_HASH_BYTES = 32  # a heartbeat's state_root and state_base (SHA-256)
# Largest map on the wire has 10 keys (a global body); allow some unknown keys so they are "schema", not "malformed".
_MAX_MAP_LEN = 32
Kind = Literal["rollout", "heartbeat", "update", "global"]
_DEFAULT_LIMITS = Limits()


class ProtocolError(DgrpoError):
    """A message cannot be decoded or signed. ``reason`` is one of the codes in ``docs/protocol.md``."""

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else reason)


class WireSamplingParams(WireModel, SamplingParams):
    """:class:`SamplingParams` as sent on the wire (same fields and bounds; floats must be floats)."""


class RolloutBody(WireModel):
    """A :class:`~dgrpo.protocol.messages.Rollout` without the author and round (those are envelope fields)."""

    part: Annotated[int, Field(ge=0)]
    parts: Annotated[int, Field(ge=1)]
    # No length bound here: an id over MAX_ID_CHARS (or max_string_chars) is the validator's string_too_long,
    # as for every identifier, not "schema" (which would fire first and hide the limit's own reason).
    prompt_id: Annotated[str, Field(min_length=1)]
    prompt: str
    completions: tuple[str, ...]
    indices: tuple[Annotated[int, Field(ge=0, lt=2**32)], ...]
    model_id: str
    weights: Annotated[str, Field(pattern=WEIGHTS_PATTERN)]
    sampling: WireSamplingParams
    split: SplitMode
    # Optional (docs/protocol.md, "Sampled tokens"): absent from the encoding when empty, so a rollout
    # without them encodes, signs and verifies exactly as before the field existed.
    wire_optional: ClassVar[frozenset[str]] = frozenset({"tokens"})
    tokens: tuple[tuple[Annotated[int, Field(ge=0, lt=2**32)], ...], ...] = ()

    @model_validator(mode="after")
    def _part_below_parts(self) -> RolloutBody:
        if self.part >= self.parts:
            raise ValueError(f"part {self.part} must be below parts {self.parts}")
        if len(self.indices) != len(self.completions):
            raise ValueError(f"{len(self.indices)} indices for {len(self.completions)} completions")
        if self.tokens and len(self.tokens) != len(self.completions):
            raise ValueError(f"{len(self.tokens)} token lists for {len(self.completions)} completions")
        return self

    @model_serializer(mode="wrap")
    def _without_empty_tokens(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if not data.get("tokens"):
            data.pop("tokens", None)
        return data


class HeartbeatBody(WireModel):
    """Liveness and progress of a node, published on the control topic."""

    round: Annotated[int, Field(ge=0)]
    rounds_done: Annotated[int, Field(ge=0)]
    # "done": it has run all its rounds and stays on (gossip, status) without publishing rollouts: peers neither
    # wait for it nor count its progress in the network's round (a lingering node's round stays where it ended).
    status: Literal["running", "stopping", "done"]
    listen_addrs: Annotated[tuple[str, ...], Field(max_length=MAX_LISTEN_ADDRS)]
    # Optional (docs/protocol.md, "Weights sync"): the state the node holds after the round it last completed,
    # and the base weights it descends from (a joiner counts only peers of its own model). Absent from the
    # encoding when empty, so a heartbeat without them encodes, signs and verifies exactly as before.
    wire_optional: ClassVar[frozenset[str]] = frozenset({"state_round", "state_root", "state_base"})
    state_round: Annotated[int, Field(ge=0)] = 0
    state_root: Annotated[bytes, Field(max_length=STATE_HASH_BYTES)] = b""
    state_base: Annotated[bytes, Field(max_length=STATE_HASH_BYTES)] = b""

    @model_validator(mode="after")
    def _state_whole_or_absent(self) -> HeartbeatBody:
        hashes = (len(self.state_root), len(self.state_base))
        given = (self.state_round > 0, hashes == (STATE_HASH_BYTES, STATE_HASH_BYTES))
        absent = (self.state_round == 0, not self.state_root, not self.state_base)
        if not (all(given) or all(absent)):
            raise ValueError("state_round (>= 1), state_root and state_base (32 bytes each) are all given or none")
        return self

    @model_serializer(mode="wrap")
    def _without_empty_state(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if not self.state_round:
            for name in self.wire_optional:
                data.pop(name, None)
        return data


_BODY_TYPES: dict[str, type[BaseModel]] = {
    "rollout": RolloutBody,
    "heartbeat": HeartbeatBody,
    "update": UpdateBody,
    "global": GlobalBody,
}
# A key only that body has, to pick its model from a decoded map.
_BODY_KEYS = {"prompt_id": "rollout", "rounds_done": "heartbeat", "clients": "global", "samples": "update"}


def _body_tag(value: Any) -> str | None:
    # Picks the body model from the body's own keys so a schema error names one model's fields, not both;
    # whether the body fits the envelope's kind is checked after validation.
    if isinstance(value, dict):
        return next((kind for key, kind in _BODY_KEYS.items() if key in value), None)
    for kind, model in _BODY_TYPES.items():
        if type(value) is model:
            return kind
    return None


Body = Annotated[
    Annotated[RolloutBody, Tag("rollout")]
    | Annotated[HeartbeatBody, Tag("heartbeat")]
    | Annotated[UpdateBody, Tag("update")]
    | Annotated[GlobalBody, Tag("global")],
    Discriminator(
        _body_tag,
        custom_error_type="body_type",
        custom_error_message="not a rollout, heartbeat, update or global body",
    ),
]


class UnsignedEnvelope(WireModel):
    """Every envelope field the signature covers, in canonical order."""

    v: Literal[1]
    kind: Kind
    run: Annotated[str, Field(pattern=f"^{RUN_ID_PATTERN}$")]
    round: Annotated[int, Field(ge=0)]
    author: Annotated[bytes, Field(min_length=PUBLIC_KEY_BYTES, max_length=PUBLIC_KEY_BYTES)]
    nonce: Annotated[int, Field(ge=0, lt=NONCE_LIMIT)]
    ts: Annotated[int, Field(ge=0, lt=2**63)]
    body: Body

    @field_validator("v", mode="before")
    @classmethod
    def _version_is_int(cls, value: Any) -> Any:
        if type(value) is not int:  # Literal[1] alone would accept True (True == 1)
            raise ValueError(f"v must be an integer, got {type(value).__name__}")
        return value

    @model_validator(mode="after")
    def _body_matches_kind(self) -> UnsignedEnvelope:
        if not isinstance(self.body, _BODY_TYPES[self.kind]):
            raise ValueError(f"kind {self.kind!r} needs a {_BODY_TYPES[self.kind].__name__} body")
        if isinstance(self.body, HeartbeatBody) and self.body.round != self.round:
            raise ValueError(f"heartbeat body round {self.body.round} differs from envelope round {self.round}")
        return self


class Envelope(UnsignedEnvelope):
    """A signed message: :class:`UnsignedEnvelope` plus the Ed25519 signature of its canonical bytes."""

    sig: Annotated[bytes, Field(min_length=SIGNATURE_BYTES, max_length=SIGNATURE_BYTES)]


def _canonical_value(value: Any) -> Any:
    # Models and tuples become arrays in field order; str, bytes, int and float stay (msgpack packs
    # Python floats as float 64 and ints in their shortest form, which makes the encoding unique).
    # A field added to the protocol later (``wire_optional``, last in its model) is left out while empty, so
    # that a message without it signs exactly as before it existed.
    if isinstance(value, BaseModel):
        optional: frozenset[str] = getattr(type(value), "wire_optional", frozenset())
        return [
            _canonical_value(getattr(value, name))
            for name in type(value).model_fields
            if name not in optional or getattr(value, name)
        ]
    if isinstance(value, tuple):
        return [_canonical_value(v) for v in value]
    return value


def canonical_bytes(envelope: UnsignedEnvelope) -> bytes:
    """The bytes an envelope's signature covers: ``DOMAIN_TAG || msgpack([v, kind, ..., body_array])``.

    Works on an :class:`Envelope` too (its ``sig`` is left out).
    """
    fields = [_canonical_value(getattr(envelope, name)) for name in UnsignedEnvelope.model_fields]
    packed: bytes = msgpack.packb(fields, use_bin_type=True, use_single_float=False)
    return DOMAIN_TAG + packed


def content_digest(envelope: UnsignedEnvelope, signed: bytes | None = None) -> bytes:
    """What the replay guard remembers of an accepted message: the first 16 bytes of SHA-256 of its canonical
    bytes (``signed``, where the caller has them already). Equal for every re-encoding of one message (a
    replay), different for other signed content under the same nonce (an equivocation). 128 bits: finding two
    contents with one digest (2^64 work) would only let an equivocator pass as a replayer; its second message is
    rejected either way."""
    return hashlib.sha256(canonical_bytes(envelope) if signed is None else signed).digest()[:DIGEST_BYTES]


def encode(envelope: Envelope) -> bytes:
    """Wire bytes: a msgpack map with string keys (``v`` ... ``sig``), the body and sampling as nested maps."""
    packed: bytes = msgpack.packb(envelope.model_dump(), use_bin_type=True, use_single_float=False)
    return packed


def _schema_detail(error: ValidationError, limit: int = 3) -> str:
    # Without input values: hostile input must not end up verbatim (and unbounded) in logs.
    parts = []
    for err in error.errors(include_input=False, include_url=False)[:limit]:
        loc = ".".join(str(p) for p in err["loc"]) or "(message)"
        parts.append(f"{loc}: {err['msg']}")
    more = error.error_count() - limit
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def decode(data: bytes, limits: Limits | None = None) -> Envelope:
    """Parse wire bytes into an :class:`Envelope`, checking sizes and the schema, NOT the signature.

    Raises :class:`ProtocolError` with reason ``oversize``, ``malformed``, ``unsupported_version`` or ``schema``.
    """
    limits = limits or _DEFAULT_LIMITS
    if not isinstance(data, bytes | bytearray | memoryview):
        raise ProtocolError("malformed", f"expected bytes, got {type(data).__name__}")
    if len(data) > limits.max_message_bytes:
        raise ProtocolError("oversize", f"{len(data)} bytes > {limits.max_message_bytes}")
    try:
        obj = strict_unpack(
            data,
            max_bytes=limits.max_message_bytes,  # bin fields: author, sig, and update chunks
            # generous, so that too many completions is reported as such; a huge declared array fails here
            max_array_len=max(4 * limits.max_completions, 64),
            max_map_len=_MAX_MAP_LEN,
        )
    except Exception as e:  # msgpack raises ValueError, UnicodeDecodeError, StackError, ...; all mean malformed
        raise ProtocolError("malformed", f"{type(e).__name__}: {str(e)[:200]}") from None
    if not isinstance(obj, dict):
        raise ProtocolError("malformed", f"top level is a {type(obj).__name__}, not a map")
    version = obj.get("v")
    if type(version) is int and version != PROTOCOL_VERSION:
        raise ProtocolError("unsupported_version", f"version {version}, this node speaks {PROTOCOL_VERSION}")
    try:
        return Envelope.model_validate(obj)
    except ValidationError as e:
        raise ProtocolError("schema", _schema_detail(e)) from None


@functools.lru_cache(maxsize=4096)
def _public_key(author: bytes) -> Ed25519PublicKey:
    # Parsed once per author, not per message: a node checks every heartbeat and rollout of every peer.
    return Ed25519PublicKey.from_public_bytes(author)


def verify_signature(envelope: Envelope, signed: bytes | None = None) -> bool:
    """True if ``envelope.sig`` is the author's Ed25519 signature of its canonical bytes (``signed``, where the
    caller has them already)."""
    try:
        _public_key(envelope.author).verify(envelope.sig, canonical_bytes(envelope) if signed is None else signed)
    except (InvalidSignature, ValueError):
        return False
    return True


PeerNaming = Callable[[bytes], str]
"""How a network names the owner of a public key: libp2p derives the PeerId from the key
(:func:`peer_id_from_public_bytes`); a simulation's in-memory network keeps a directory of its nodes' names."""


def author_peer_id(envelope: UnsignedEnvelope, naming: PeerNaming = peer_id_from_public_bytes) -> str:
    """The peer id of the envelope's author key (by default its libp2p PeerId)."""
    return naming(envelope.author)


def to_rollout(envelope: Envelope, naming: PeerNaming = peer_id_from_public_bytes) -> Rollout:
    """The in-memory :class:`Rollout` of a (validated) rollout envelope."""
    body = envelope.body
    if not isinstance(body, RolloutBody):
        raise ProtocolError("wrong_kind", f"a {envelope.kind} envelope holds no rollout")
    return Rollout(
        author=author_peer_id(envelope, naming),
        round=envelope.round,
        part=body.part,
        parts=body.parts,
        prompt_id=body.prompt_id,
        prompt=body.prompt,
        completions=body.completions,
        indices=body.indices,
        model_id=body.model_id,
        weights=body.weights,
        sampling=SamplingParams.model_validate(body.sampling.model_dump()),
        split=body.split,
        tokens=body.tokens,
    )


class Signer:
    """Turns this node's rollouts, heartbeats and update chunks (federated mode) into signed wire messages."""

    def __init__(
        self,
        identity: Identity,
        run_id: str,
        nonces: NonceSource,
        clock: Callable[[], float] = time.time,
        limits: Limits | None = None,
        name: str | None = None,
    ) -> None:
        self.identity = identity
        self.run_id = validate_run_id(run_id)
        self.nonces = nonces
        self.clock = clock
        self.limits = limits or Limits()
        self.name = name or identity.peer_id  # the peer id this identity goes by (see PeerNaming)

    def sign(self, kind: Kind, round: int, body: RolloutBody | HeartbeatBody | UpdateBody | GlobalBody) -> bytes:
        """Wire bytes of a new envelope; takes the next nonce.

        Raises :class:`ProtocolError` (``schema``, ``oversize``) for a message receivers would reject.
        """
        try:
            unsigned = UnsignedEnvelope(
                v=PROTOCOL_VERSION,
                kind=kind,
                run=self.run_id,
                round=round,
                author=self.identity.public_bytes,
                nonce=self.nonces.next(),
                ts=int(self.clock() * 1000),
                body=body,
            )
        except ValidationError as e:
            raise ProtocolError("schema", _schema_detail(e)) from e
        fields = {name: getattr(unsigned, name) for name in UnsignedEnvelope.model_fields}
        envelope = Envelope(**fields, sig=self.identity.sign(canonical_bytes(unsigned)))
        data = encode(envelope)
        if len(data) > self.limits.max_message_bytes:
            # Receivers would drop it (and gossipsub drops > 1 MiB silently): fail loudly at the sender.
            raise ProtocolError("oversize", f"{len(data)} bytes > {self.limits.max_message_bytes}; split the message")
        return data

    def sign_rollout(self, rollout: Rollout) -> bytes:
        if rollout.author != self.name:
            raise ProtocolError("wrong_author", f"rollout author {rollout.author!r} is not {self.name}")
        body = RolloutBody(
            part=rollout.part,
            parts=rollout.parts,
            prompt_id=rollout.prompt_id,
            prompt=rollout.prompt,
            completions=rollout.completions,
            indices=rollout.indices,
            model_id=rollout.model_id,
            weights=rollout.weights,
            sampling=WireSamplingParams.model_validate(rollout.sampling.model_dump()),
            split=rollout.split,
            tokens=rollout.tokens,
        )
        return self.sign("rollout", rollout.round, body)

    def sign_heartbeat(self, body: HeartbeatBody, round: int) -> bytes:
        return self.sign("heartbeat", round, body)

    def sign_chunk(self, body: UpdateBody | GlobalBody, round: int) -> bytes:
        """An ``update`` or ``global`` envelope (:mod:`dgrpo.protocol.chunks` cuts a payload into bodies)."""
        return self.sign("update" if isinstance(body, UpdateBody) else "global", round, body)
