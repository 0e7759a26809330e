"""Fuzzing the decoder and validator with hypothesis (10,000 generated cases in all, derandomized for CI).

Three kinds of input: arbitrary bytes; msgpack maps shaped like an envelope with fields dropped, replaced,
mistyped or added (sometimes re-signed so the later checks are reached); mutations of a valid signed message
(byte flips, truncation, extension, a field replaced after signing, a re-signature by another key with the
author unchanged, a re-encoding, and the author's own re-signature of other content under the same nonce).

Properties, for every input: ``validate`` returns a verdict (it must not raise), a rejection's reason is one
of ``REASONS`` (never ``internal_error``), and accepted + rejections == calls. For mutations: with the
original accepted first, no mutation is accepted; ``replay`` means the mutation's canonical signing bytes
equal the original's (a re-encoding), ``equivocation`` means they differ under the original's (author,
nonce) with a valid signature. Without the author's key, a mutation given to a fresh validator is accepted
only if its canonical signing bytes and signature equal the original's.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from dgrpo.protocol.chunks import update_chunks
from dgrpo.protocol.envelope import (
    HeartbeatBody,
    ProtocolError,
    UnsignedEnvelope,
    canonical_bytes,
    decode,
    verify_signature,
)
from dgrpo.protocol.identity import Identity
from dgrpo.protocol.validator import REASONS, MessageValidator
from tests.protocol_helpers import (
    ALICE,
    BOB,
    RUN,
    FakeClock,
    make_rollout,
    memory_signer,
    pack,
    pack_wide,
    unpack,
    validator,
)

BYTES_EXAMPLES = 3_000
MAP_EXAMPLES = 3_000
MUTATION_EXAMPLES = 4_000  # 10,000 in all
FUZZ = settings(deadline=None, derandomize=True, database=None)
TS_OFFSETS_MS = (-(10**6), -(2 * 10**5), -1, 1, 2 * 10**5, 10**6)  # the default clock skew is 120 s

CLOCK = FakeClock()
_SIGNER = memory_signer(CLOCK)
ORIGINALS = (
    _SIGNER.sign_rollout(make_rollout(completions=("2", "3", "4"))),
    _SIGNER.sign_heartbeat(HeartbeatBody(round=3, rounds_done=2, status="running", listen_addrs=("/ip4/1.2.3.4",)), 3),
    _SIGNER.sign_chunk(update_chunks(b"\x07" * 48, 0.25, 0.5, 8, 2, base=bytes(32))[0], round=3),
)
KINDS = ("rollout", "heartbeat", "update")

# msgpack values of every type the decoder may meet (ints within msgpack's range so they can be packed).
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats()
    | st.text(max_size=24)
    | st.binary(max_size=72)
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


def fresh() -> MessageValidator:
    return validator(CLOCK)


def check_verdict(v: MessageValidator, data: Any, calls: int, **kwargs: Any) -> str | None:
    """Validate ``data`` as call number ``calls`` of ``v``; the properties every verdict must have."""
    verdict = v.validate(data, **kwargs)
    if verdict.ok:
        assert verdict.reason is None and verdict.envelope is not None
        assert verdict_is_genuine(data)
    else:
        assert verdict.reason in REASONS, verdict.reason  # also catches internal_error (a validator bug)
    stats = v.statistics()
    assert stats.accepted + sum(stats.rejected_by_reason.values()) == calls
    assert stats.rejected == sum(stats.rejected_by_reason.values())
    return verdict.reason


def verdict_is_genuine(data: bytes) -> bool:
    """What an accepted message must be, checked independently of the validator's own path."""
    env = decode(data)
    return verify_signature(env) and env.run == RUN


def canonical_or_none(data: bytes) -> tuple[bytes, bytes] | None:
    try:
        env = decode(data)
    except ProtocolError:
        return None
    return canonical_bytes(env), env.sig


# ----------------------------------------------------------------------------- (1) arbitrary bytes
def test_arbitrary_bytes() -> None:
    seen: Counter[str | None] = Counter()

    @settings(FUZZ, max_examples=BYTES_EXAMPLES)
    @given(
        data=st.binary(max_size=2048)
        # a map header first, so more inputs get past "not a map" into the msgpack parser's depths
        | st.binary(min_size=1, max_size=256).map(lambda b: bytes([0x80 | (b[0] & 0x0F)]) + b[1:]),
        kind=st.sampled_from((None, *KINDS)),
    )
    def run(data: bytes, kind: str | None) -> None:
        v = fresh()
        reason = check_verdict(v, data, 1, expected_kind=kind)
        assert reason is not None  # random bytes never make a signed envelope
        seen[reason] += 1
        check_verdict(v, data, 2, source_peer=BOB.peer_id)  # a second call: the counters keep adding up

    run()
    assert sum(seen.values()) == BYTES_EXAMPLES
    assert {"malformed", "schema"} <= set(seen), seen


# ----------------------------------------------------------------------------- (2) msgpack maps
def sign_map(fields: dict[str, Any], ident: Identity) -> dict[str, Any] | None:
    """``fields`` with ``sig`` set to ``ident``'s signature of their canonical bytes, or None if they are not a
    valid unsigned envelope (then nothing can be signed)."""
    unsigned_fields = {k: v for k, v in fields.items() if k != "sig"}
    try:
        unsigned = UnsignedEnvelope.model_validate(msgpack.unpackb(pack(unsigned_fields), raw=False, use_list=False))
    except Exception:  # any schema violation: the caller keeps the unsigned map
        return None
    return unsigned_fields | {"sig": ident.sign(canonical_bytes(unsigned))}


def like(value: Any) -> st.SearchStrategy[Any]:
    """Values of the same msgpack type as ``value``: they pass the type checks, so later checks are reached."""
    if isinstance(value, bool) or value is None:
        return VALUES
    if isinstance(value, int):
        # near the value: a nonce next to the original's, a timestamp up to 1000 s off (stale, future)
        return st.integers(min_value=0, max_value=2**64 - 1) | st.integers(max(0, value - 10**6), value + 10**6)
    if isinstance(value, float):
        return st.floats()
    if isinstance(value, str):
        return st.text(max_size=300) | st.sampled_from(("rollout", "heartbeat", "update", "global", "other-run"))
    if isinstance(value, bytes):
        return st.binary(min_size=max(len(value) - 1, 0), max_size=len(value) + 1)  # empty bytes: not -1
    if isinstance(value, list):
        return st.lists(st.text(max_size=40), max_size=80)
    return VALUES


@st.composite
def envelope_maps(draw: st.DrawFn) -> dict[str, Any]:
    """A valid message's map with a few fields (top level or in the body) dropped, replaced by a value of
    any type or of the same type, plus extra keys; half the time re-signed by the author, so what passes
    the schema reaches the later checks."""
    wire = unpack(draw(st.sampled_from(ORIGINALS)))

    def mutate(m: dict[str, Any]) -> dict[str, Any]:
        out = dict(m)
        for key in draw(st.lists(st.sampled_from(tuple(m)), max_size=3, unique=True)):
            action = draw(st.sampled_from(("drop", "any", "like", "like")))
            if action == "drop":
                del out[key]
            else:
                out[key] = draw(VALUES if action == "any" else like(m[key]))
        if draw(st.integers(0, 7)) == 0:
            out |= draw(st.dictionaries(st.text(max_size=10), VALUES, min_size=1, max_size=2))
        return out

    mutated = mutate(wire) if draw(st.booleans()) else dict(wire)
    if "ts" in mutated and draw(st.integers(0, 7)) == 0:
        # The clock checks, on purpose: a timestamp moved past the skew either way (stale, future) or within
        # it. Mutations alone reached "stale" a few times in 3,000 examples and on some runs never "future".
        mutated["ts"] = max(0, wire["ts"] + draw(st.sampled_from(TS_OFFSETS_MS)))
    if isinstance(mutated.get("body"), dict) and mutated["body"] and draw(st.booleans()):
        mutated["body"] = mutate(mutated["body"])
    if draw(st.booleans()):
        mutated = sign_map(mutated, ALICE) or mutated
    return mutated


def test_structured_maps() -> None:
    seen: Counter[str | None] = Counter()
    keys = st.sampled_from(tuple(unpack(ORIGINALS[0]))) | st.text(max_size=10)

    @settings(FUZZ, max_examples=MAP_EXAMPLES)
    @given(
        # mostly envelope-shaped maps; some maps of random fields under envelope and random keys
        obj=st.one_of(envelope_maps(), envelope_maps(), envelope_maps(), st.dictionaries(keys, VALUES, max_size=10)),
        kind=st.sampled_from((None, *KINDS)),
    )
    def run(obj: dict[str, Any], kind: str | None) -> None:
        reason = check_verdict(fresh(), pack(obj), 1, expected_kind=kind)
        seen[reason] += 1

    run()
    assert sum(seen.values()) == MAP_EXAMPLES
    # the maps reach every stage: decoding, the schema, the later checks and (re-signed) acceptance
    assert {"schema", "wrong_kind", "future", "stale", "bad_signature", None} <= set(seen), seen
    assert min(seen["stale"], seen["future"]) >= 10, seen  # not by a fluke of the draw


# ----------------------------------------------------------------------------- (3) mutations of a signed message
def _replace_field(draw: st.DrawFn, wire: dict[str, Any], *, keep: tuple[str, ...] = ()) -> dict[str, Any]:
    """``wire`` with one field (top level or in the body, not one of ``keep``) replaced."""
    out = dict(wire)
    target = out
    if draw(st.booleans()):
        target = out["body"] = dict(out["body"])
    key = draw(st.sampled_from(tuple(k for k in target if k not in keep)))
    target[key] = draw(like(target[key]) | VALUES)
    return out


@st.composite
def mutations(draw: st.DrawFn) -> tuple[int, bytes, bool, str]:
    """(index of the original, the mutated bytes, whether the author's key made them, the mutation's name)."""
    index = draw(st.integers(0, len(ORIGINALS) - 1))
    data = ORIGINALS[index]
    wire = unpack(data)
    how = draw(st.sampled_from(("flip", "truncate", "extend", "replace", "resign_other", "reencode", "equivocate")))
    if how == "flip":
        out = bytearray(data)
        for _ in range(draw(st.integers(1, 4))):
            out[draw(st.integers(0, len(out) - 1))] ^= draw(st.integers(1, 255))
        return index, bytes(out), False, how
    if how == "truncate":
        return index, data[: draw(st.integers(0, len(data) - 1))], False, how
    if how == "extend":
        return index, data + draw(st.binary(min_size=1, max_size=64)), False, how
    if how == "replace":  # a field changed after signing, the signature kept
        return index, pack(_replace_field(draw, wire)), False, how
    if how == "resign_other":  # maybe a field changed, then signed by another key; the author stays ALICE
        changed = _replace_field(draw, wire, keep=("author", "sig")) if draw(st.booleans()) else wire
        other = draw(st.sampled_from((BOB, Identity.from_seed(bytes([9]) * 32))))
        return index, pack(sign_map(changed, other) or sign_map(wire, other) or {}), False, how
    if how == "reencode":
        return index, pack_wide(wire), False, how
    # The author itself signs other content under the same nonce: an equivocation (if the content differs).
    changed = _replace_field(draw, wire, keep=("nonce", "author", "sig"))
    signed = sign_map(changed, ALICE)
    return index, pack(signed if signed is not None else changed), signed is not None, how


def test_mutations_of_a_signed_message() -> None:
    seen: Counter[tuple[str, str | None]] = Counter()

    @settings(FUZZ, max_examples=MUTATION_EXAMPLES)
    @given(case=mutations(), with_source=st.booleans())
    def run(case: tuple[int, bytes, bool, str], with_source: bool) -> None:
        index, mutated, by_author, how = case
        original, kind = ORIGINALS[index], KINDS[index]
        source = ALICE.peer_id if with_source else None
        primed = fresh()
        assert check_verdict(primed, original, 1, source_peer=source, expected_kind=kind) is None
        reason = check_verdict(primed, mutated, 2, source_peer=source, expected_kind=kind)
        seen[(how, reason)] += 1
        assert reason is not None, f"{how}: a mutation was accepted after the original"
        content, original_content = canonical_or_none(mutated), canonical_or_none(original)
        assert original_content is not None
        if reason == "replay":  # the same signed content, re-encoded (or byte-identical)
            assert content is not None and content[0] == original_content[0]
        if reason == "equivocation":  # other content, validly signed by the author, under the same nonce
            env = decode(mutated)
            assert by_author and verify_signature(env) and env.nonce == decode(original).nonce
            assert content is not None and content[0] != original_content[0]
        if not by_author:  # without the author's key only the original's signed content can be accepted
            alone = check_verdict(fresh(), mutated, 1, source_peer=source, expected_kind=kind)
            if alone is None:
                assert content == original_content, f"{how}: other content accepted"

    run()
    assert sum(seen.values()) == MUTATION_EXAMPLES
    reasons = {reason for _, reason in seen}
    assert {"malformed", "schema", "bad_signature", "replay", "equivocation"} <= reasons, seen
    assert {how for how, _ in seen} == {
        "flip", "truncate", "extend", "replace", "resign_other", "reencode", "equivocate",
    }  # fmt: skip
