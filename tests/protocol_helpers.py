"""Shared builders for the protocol tests: identities, a fake clock, signers, rollouts and msgpack helpers."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import msgpack

from dgrpo.protocol.envelope import Signer, UnsignedEnvelope, canonical_bytes
from dgrpo.protocol.identity import Identity
from dgrpo.protocol.limits import Limits
from dgrpo.protocol.messages import Rollout, SamplingParams
from dgrpo.protocol.nonce import NonceCounter, NonceSource
from dgrpo.protocol.replay import ReplayGuard
from dgrpo.protocol.validator import MessageValidator

RUN = "test-run"
T0 = 1_700_000_000.0
ALICE = Identity.from_seed(bytes([1]) * 32)
BOB = Identity.from_seed(bytes([2]) * 32)


class FakeClock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class CountingNonces:
    """Nonces 1, 2, 3, ... in memory: for tests that need no files (hypothesis runs many examples)."""

    def __init__(self, start: int = 1) -> None:
        self._next = start

    def next(self) -> int:
        value = self._next
        self._next += 1
        return value


def make_signer(tmp_path: Path, clock: FakeClock, ident: Identity = ALICE, **limits: Any) -> Signer:
    nonces = NonceCounter(tmp_path / f"{ident.peer_id}.nonce")
    return Signer(ident, RUN, nonces, clock=clock, limits=Limits(**limits))


def memory_signer(clock: FakeClock, ident: Identity = ALICE, nonces: NonceSource | None = None) -> Signer:
    return Signer(ident, RUN, nonces or CountingNonces(), clock=clock)


def make_rollout(ident: Identity = ALICE, **overrides: Any) -> Rollout:
    fields: dict[str, Any] = dict(
        author=ident.peer_id, round=3, part=0, parts=1, prompt_id="p-1", prompt="1+1=", completions=("2", "3"),
        model_id="tiny", sampling=SamplingParams(temperature=0.7, seed=5), split="horizontal",
    )  # fmt: skip
    merged = fields | overrides
    merged.setdefault("indices", tuple(range(len(merged["completions"]))))
    merged.setdefault("weights", "")
    return Rollout(**merged)


def validator(clock: FakeClock, replay: ReplayGuard | None = None, **limits: Any) -> MessageValidator:
    return MessageValidator(RUN, Limits(**limits), replay, clock=clock)


def unpack(data: bytes) -> dict[str, Any]:
    out: dict[str, Any] = msgpack.unpackb(data, raw=False)
    return out


def pack(obj: Any) -> bytes:
    out: bytes = msgpack.packb(obj, use_bin_type=True)
    return out


def pack_wide(obj: Any) -> bytes:
    """Another valid msgpack encoding: widest formats everywhere and map keys in reverse order."""
    if isinstance(obj, dict):
        items = list(obj.items())[::-1]
        return b"\xdf" + struct.pack(">I", len(items)) + b"".join(pack_wide(k) + pack_wide(v) for k, v in items)
    if isinstance(obj, list | tuple):
        return b"\xdd" + struct.pack(">I", len(obj)) + b"".join(pack_wide(v) for v in obj)
    if isinstance(obj, str):
        raw = obj.encode()
        return b"\xdb" + struct.pack(">I", len(raw)) + raw
    if isinstance(obj, bytes):
        return b"\xc6" + struct.pack(">I", len(obj)) + obj
    if isinstance(obj, float):
        return b"\xcb" + struct.pack(">d", obj)
    return b"\xcf" + struct.pack(">Q", obj)


def resign(wire: dict[str, Any], ident: Identity) -> bytes:
    """Re-sign a (modified) wire map with ``ident`` so only the intended defect remains."""
    fields = {k: v for k, v in wire.items() if k != "sig"}
    unsigned = UnsignedEnvelope.model_validate(msgpack.unpackb(pack(fields), raw=False, use_list=False))
    return pack(fields | {"sig": ident.sign(canonical_bytes(unsigned))})
