"""The signed run manifest: what a run is (model, base weights, task, rollouts, schedule, sampler, defenses,
all of its run-defining configuration), signed by the run's creator, so that a joiner given only a bootstrap
address learns the run from the network (``docs/protocol.md``, "Run manifest").

Bytes and checks only (no libp2p, no configuration classes): the ``config`` object is whatever the run's
settings dump to; the daemon validates it as settings (:mod:`dgrpo.daemon.run_manifest`). The manifest is
canonical JSON (sorted keys, no whitespace, UTF-8): readable in ``<state_dir>/manifest.json`` and producible
by any JSON library that formats numbers as Python does. The signature covers a domain tag and the canonical
bytes of the manifest object; a document that is not byte-for-byte canonical is refused (``non_canonical``),
so every valid manifest has exactly one encoding and its SHA-256 names it.

A run id is the name its creator chose (it is the run id of the topic names, so existing runs keep theirs).
The first verified manifest a node holds for a run id pins it (its own, the one it joined with, or one given
by its SHA-256 out of band, ``dgrpo node join --manifest-sha256``): any other manifest for that run id is
refused, ``wrong_creator`` when another key signed it, ``conflicting_manifest`` when the creator signed two.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import Field, ValidationError, field_validator, model_validator

from dgrpo.protocol.envelope import PROTOCOL_VERSION
from dgrpo.protocol.identity import Identity, peer_id_from_public_bytes
from dgrpo.protocol.topics import RUN_ID_PATTERN
from dgrpo.protocol.wire import WireModel

MANIFEST_VERSION: Final = 1
DOMAIN_TAG = b"dgrpo/manifest/1\x00"  # neither an envelope's nor a sync header's signature passes for this one
MAX_MANIFEST_BYTES = 64 * 1024  # a document; the largest shipped configuration dumps to under 4 KiB
MAX_DEPTH = 16  # nesting of objects and arrays in a document; settings nest 4 deep
HEX_SHA256 = r"^[0-9a-f]{64}$"
DTYPES = ("float32", "bfloat16", "float16")

# In the order :func:`verify_document` checks them (docs/protocol.md, "Run manifest", "Verdicts").
DOCUMENT_REASONS = (
    "oversize",
    "malformed",
    "version",
    "non_canonical",
    "schema",
    "bad_signature",
    "wrong_run_id",
    "wrong_creator",
    "conflicting_manifest",
)


class BaseWeights(WireModel):
    """The weights a node of the run starts from: ``sha256`` as :meth:`dgrpo.learner.Learner.weights_digest`
    computes it on the freshly built learner (the ``weights`` its round-1 rollouts announce), ``dtype`` the
    dtype the parameters were loaded in (``model.dtype = "auto"`` resolves per device; named so that a
    mismatch can say why)."""

    sha256: Annotated[str, Field(pattern=HEX_SHA256)]
    dtype: Literal["float32", "bfloat16", "float16"]


class RunManifest(WireModel):
    """Every field the creator signs."""

    v: Literal[1]
    protocol: Annotated[int, Field(ge=1)]  # the envelope protocol the run speaks (PROTOCOL_VERSION)
    run_id: Annotated[str, Field(pattern=f"^{RUN_ID_PATTERN}$")]
    creator: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]  # raw Ed25519 public key, lowercase hex
    model_id: Annotated[str, Field(min_length=1, max_length=256)]
    base_weights: BaseWeights
    config: dict[str, Any]  # the run-defining settings (docs/protocol.md lists the sections)

    @field_validator("v", mode="before")
    @classmethod
    def _version_is_int(cls, value: Any) -> Any:
        if type(value) is not int:  # Literal[1] alone would accept true (True == 1)
            raise ValueError(f"v must be an integer, got {type(value).__name__}")
        return value

    @model_validator(mode="after")
    def _model_named_once(self) -> RunManifest:
        model = self.config.get("model")
        if not isinstance(model, dict) or model.get("name") != self.model_id:
            raise ValueError("config.model.name must equal model_id")
        return self

    @property
    def creator_peer_id(self) -> str:
        return peer_id_from_public_bytes(bytes.fromhex(self.creator))


class SignedManifest(WireModel):
    """A manifest with the creator's Ed25519 signature of :func:`signing_bytes` (lowercase hex)."""

    manifest: RunManifest
    signature: Annotated[str, Field(pattern=r"^[0-9a-f]{128}$")]

    @property
    def sha256(self) -> str:
        """The manifest's name: SHA-256 (hex) of its signing bytes."""
        return hashlib.sha256(signing_bytes(self.manifest)).hexdigest()

    def document(self) -> bytes:
        """What is served and saved: the canonical JSON of ``{"manifest": ..., "signature": ...}``."""
        return canonical_json(self.model_dump(mode="json"))


@dataclass(frozen=True)
class ManifestVerdict:
    """The outcome of checking a document: ``manifest`` when ``ok``, else a reason of :data:`DOCUMENT_REASONS`."""

    ok: bool
    reason: str = "ok"
    detail: str = ""
    manifest: SignedManifest | None = None

    def __str__(self) -> str:
        return self.reason + (f": {self.detail}" if self.detail else "")


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no whitespace, UTF-8 (no ``\\u`` escapes but for control characters), floats as Python's
    ``repr``; NaN and infinities are not JSON and raise ``ValueError``."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.encode("utf-8")


def signing_bytes(manifest: RunManifest) -> bytes:
    """What the signature covers: ``DOMAIN_TAG || canonical_json(manifest)``."""
    return DOMAIN_TAG + canonical_json(manifest.model_dump(mode="json"))


def sign_manifest(identity: Identity, manifest: RunManifest) -> SignedManifest:
    """Sign ``manifest``; its ``creator`` must be ``identity``'s key (a manifest names who vouches for it)."""
    if manifest.creator != identity.public_bytes.hex():
        raise ValueError("the manifest's creator is not this identity")
    return SignedManifest(manifest=manifest, signature=identity.sign(signing_bytes(manifest)).hex())


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Duplicate keys have no agreed meaning across JSON parsers: refuse them (a signed text must say one thing).
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("duplicate object key")
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _depth(value: Any, limit: int) -> int:
    # Iterative, so a hostile nesting cannot exhaust the stack here either.
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            if deepest > limit:
                return deepest
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def _schema_detail(error: ValidationError, limit: int = 3) -> str:
    # Without input values: hostile input must not end up verbatim (and unbounded) in logs.
    parts = [
        f"{'.'.join(str(p) for p in err['loc']) or '(document)'}: {err['msg']}"
        for err in error.errors(include_input=False, include_url=False)[:limit]
    ]
    more = error.error_count() - limit
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def verify_document(
    data: bytes,
    *,
    run_id: str | None = None,
    pinned: SignedManifest | None = None,
    sha256: str | None = None,
) -> ManifestVerdict:
    """Check a served or saved document; never raises for what it holds.

    ``run_id``: the run the caller expects; ``pinned``: the manifest the caller already holds for that run
    (its own or the one it joined with); ``sha256``: a manifest name given out of band. Any of them refuses
    every other manifest.
    """
    if not isinstance(data, bytes | bytearray):
        return ManifestVerdict(False, "malformed", f"expected bytes, got {type(data).__name__}")
    if len(data) > MAX_MANIFEST_BYTES:
        return ManifestVerdict(False, "oversize", f"{len(data)} bytes > {MAX_MANIFEST_BYTES}")
    try:
        obj = json.loads(bytes(data).decode("utf-8"), object_pairs_hook=_pairs, parse_constant=_no_constant)
        if _depth(obj, MAX_DEPTH) > MAX_DEPTH:
            raise ValueError(f"nested deeper than {MAX_DEPTH}")
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return ManifestVerdict(False, "malformed", f"{type(e).__name__}: {str(e)[:200]}")
    inner = obj.get("manifest") if isinstance(obj, dict) else None
    version = inner.get("v") if isinstance(inner, dict) else None
    protocol = inner.get("protocol") if isinstance(inner, dict) else None
    if type(version) is int and version != MANIFEST_VERSION:
        return ManifestVerdict(False, "version", f"manifest version {version}, this node reads {MANIFEST_VERSION}")
    if type(protocol) is int and protocol != PROTOCOL_VERSION:
        return ManifestVerdict(False, "version", f"protocol {protocol}, this node speaks {PROTOCOL_VERSION}")
    try:
        canonical = canonical_json(obj) == bytes(data)
    except ValueError:  # a lone surrogate escape (\\ud800) has no UTF-8 form
        canonical = False
    if not canonical:
        return ManifestVerdict(False, "non_canonical", "the bytes are not the document's canonical JSON")
    try:
        signed = SignedManifest.model_validate(obj)
    except ValidationError as e:
        return ManifestVerdict(False, "schema", _schema_detail(e))
    return check_signed(signed, run_id=run_id, pinned=pinned, sha256=sha256)


def check_signed(
    signed: SignedManifest,
    *,
    run_id: str | None = None,
    pinned: SignedManifest | None = None,
    sha256: str | None = None,
) -> ManifestVerdict:
    """The signature and the run binding of a (schema-valid) manifest; see :func:`verify_document`."""
    m = signed.manifest
    try:
        Ed25519PublicKey.from_public_bytes(bytes.fromhex(m.creator)).verify(
            bytes.fromhex(signed.signature), signing_bytes(m)
        )
    except (InvalidSignature, ValueError):
        return ManifestVerdict(False, "bad_signature", f"not signed by its creator {m.creator_peer_id}")
    expected = run_id if run_id is not None else (pinned.manifest.run_id if pinned is not None else None)
    if expected is not None and m.run_id != expected:
        return ManifestVerdict(False, "wrong_run_id", f"run {m.run_id!r}, expected {expected!r}")
    if pinned is not None and m.run_id == pinned.manifest.run_id and signed.sha256 != pinned.sha256:
        if m.creator != pinned.manifest.creator:
            who = f"{m.creator_peer_id}, not its creator {pinned.manifest.creator_peer_id}"
            return ManifestVerdict(False, "wrong_creator", f"run {m.run_id!r} signed by {who}")
        return ManifestVerdict(
            False,
            "conflicting_manifest",
            f"a second manifest {signed.sha256[:16]}… for run {m.run_id!r}, which is {pinned.sha256[:16]}…",
        )
    if sha256 is not None and signed.sha256 != sha256.lower():
        return ManifestVerdict(
            False, "conflicting_manifest", f"manifest {signed.sha256[:16]}…, expected {sha256.lower()[:16]}…"
        )
    return ManifestVerdict(True, manifest=signed)
