"""Reliability of the protocol rows: how many hostile messages the real validator accepts (target 0).

    .venv/bin/python benchmarks/reliability_protocol.py [--n 1000] [--out runs/reliability-protocol.json]

Every message is made by the real :class:`~dgrpo.protocol.envelope.Signer` (nonces from a persisted
:class:`~dgrpo.protocol.nonce.NonceCounter`) and judged by the real
:class:`~dgrpo.protocol.validator.MessageValidator` with default limits (except a small replay window where
that row needs one), on a clock the benchmark moves. One row per scenario: N hostile messages, how many
were accepted, the target, and the reasons they were rejected with. Equivocation rows also count the
authors flagged for blacklisting. Exits 1 if a row misses its target.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from dgrpo.protocol.envelope import Signer, UnsignedEnvelope, canonical_bytes
from dgrpo.protocol.identity import Identity
from dgrpo.protocol.limits import Limits
from dgrpo.protocol.messages import Rollout, SamplingParams
from dgrpo.protocol.nonce import NonceCounter
from dgrpo.protocol.replay import ReplayGuard
from dgrpo.protocol.validator import MessageValidator

RUN = "bench-reliability"
T0 = 1_700_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@dataclass
class Row:
    scenario: str
    trials: int
    accepted: int
    target: str
    met: bool
    reasons: dict[str, int] = field(default_factory=dict)
    flagged: int | None = None  # equivocation rows: authors flagged for blacklisting


class Bench:
    """An honest author (ALICE), an attacker (MALLORY), the clock, and a folder for state files."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.clock = Clock()
        self.alice = Identity.from_seed(hashlib.sha256(b"bench/alice").digest())
        self.mallory = Identity.from_seed(hashlib.sha256(b"bench/mallory").digest())
        self.signer = self.signer_for(self.alice, NonceCounter(folder / "alice.nonce"))
        self._messages = 0

    def signer_for(self, ident: Identity, nonces: Any) -> Signer:
        return Signer(ident, RUN, nonces, clock=self.clock)

    def validator(self, replay: ReplayGuard | None = None, **limits: Any) -> MessageValidator:
        return MessageValidator(RUN, Limits(**limits), replay, clock=self.clock)

    def rollout(self, ident: Identity | None = None, completion: str | None = None) -> Rollout:
        self._messages += 1
        return Rollout(
            author=(ident or self.alice).peer_id,
            round=1,
            part=0,
            parts=1,
            prompt_id=f"p-{self._messages}",
            prompt="What is 2+2?",
            completions=(completion or f"4 (answer {self._messages})", "5"),
            indices=(0, 1),
            model_id="bench",
            weights="",
            sampling=SamplingParams(temperature=0.7, seed=self._messages),
            split="horizontal",
        )

    def honest(self) -> bytes:
        return self.signer.sign_rollout(self.rollout())


def unpack(data: bytes) -> dict[str, Any]:
    out: dict[str, Any] = msgpack.unpackb(data, raw=False)
    return out


def pack(obj: Any) -> bytes:
    out: bytes = msgpack.packb(obj, use_bin_type=True)
    return out


def signed_by(wire: dict[str, Any], ident: Identity) -> bytes:
    """``wire`` with its signature replaced by ``ident``'s over the same fields (the author is unchanged)."""
    fields = {k: v for k, v in wire.items() if k != "sig"}
    unsigned = UnsignedEnvelope.model_validate(msgpack.unpackb(pack(fields), raw=False, use_list=False))
    return pack(fields | {"sig": ident.sign(canonical_bytes(unsigned))})


def pack_wide(obj: Any) -> bytes:
    """Another valid msgpack encoding of ``obj``: widest formats everywhere, map keys in reverse order."""
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


def judge(
    name: str, v: MessageValidator, hostile: list[bytes], *, source: Callable[[int], str | None] = lambda i: None
) -> Row:
    """Validate every hostile message; the target is 0 accepted."""
    reasons: Counter[str] = Counter()
    accepted = 0
    for i, data in enumerate(hostile):
        verdict = v.validate(data, source_peer=source(i), expected_kind="rollout")
        accepted += verdict.ok
        reasons[verdict.reason or "accepted"] += 1
    return Row(name, len(hostile), accepted, "0", accepted == 0, dict(reasons))


def accept_all(v: MessageValidator, messages: list[bytes]) -> None:
    """The honest originals, which must all be accepted first (or the replay rows would measure nothing)."""
    verdicts = [v.validate(m, expected_kind="rollout") for m in messages]
    bad = [x.reason for x in verdicts if not x.ok]
    if bad:
        raise SystemExit(f"honest messages rejected: {Counter(bad)}")


# ----------------------------------------------------------------------------- authenticity
def forged_signature(b: Bench, n: int) -> Row:
    hostile = [pack({**unpack(b.honest()), "sig": os.urandom(64)}) for _ in range(n)]
    return judge("forged signature (random 64 bytes)", b.validator(), hostile)


def wrong_key(b: Bench, n: int) -> Row:
    hostile = [signed_by(unpack(b.honest()), b.mallory) for _ in range(n)]
    return judge("wrong key (author kept, signed by another)", b.validator(), hostile)


def author_not_source(b: Bench, n: int) -> Row:
    hostile = [b.honest() for _ in range(n)]  # valid, but gossipsub says MALLORY published them
    return judge("author != gossipsub source", b.validator(), hostile, source=lambda i: b.mallory.peer_id)


def unsigned(b: Bench, n: int) -> Row:
    def strip(i: int) -> bytes:
        wire = unpack(b.honest())
        if i % 3 == 0:
            del wire["sig"]
        else:
            wire["sig"] = b"" if i % 3 == 1 else bytes(64)
        return pack(wire)

    return judge("unsigned (sig missing / empty / zeros)", b.validator(), [strip(i) for i in range(n)])


# ----------------------------------------------------------------------------- replay
def replay_immediate(b: Bench, n: int) -> Row:
    v, originals = b.validator(), [b.honest() for _ in range(n)]
    accept_all(v, originals)
    return judge("replay, immediate", v, originals)


def replay_after_nonce_window(b: Bench, n: int, window: int = 256) -> Row:
    v, originals = b.validator(replay_window=window), [b.honest() for _ in range(n)]
    accept_all(v, originals + [b.honest() for _ in range(window)])  # pushes the originals out of the window
    return judge(f"replay after the nonce window ({window})", v, originals)


def replay_after_clock_skew(b: Bench, n: int) -> Row:
    v, originals = b.validator(), [b.honest() for _ in range(n)]
    accept_all(v, originals)
    b.clock.now += Limits().clock_skew_seconds + 1.0
    try:
        return judge("replay after the clock-skew window", v, originals)
    finally:
        b.clock.now -= Limits().clock_skew_seconds + 1.0


def replay_across_restart(b: Bench, n: int) -> Row:
    v, originals = b.validator(), [b.honest() for _ in range(n)]
    accept_all(v, originals)
    path = b.folder / "replay.json"
    v.save_replay_state(path)
    restarted = b.validator(ReplayGuard.load(path))
    return judge("replay across a restart (state saved, loaded)", restarted, originals)


def replay_reencoded(b: Bench, n: int) -> Row:
    v, originals = b.validator(), [b.honest() for _ in range(n)]
    accept_all(v, originals)
    return judge("replay re-encoded (other msgpack bytes)", v, [pack_wide(unpack(m)) for m in originals])


# ----------------------------------------------------------------------------- equivocation
class SameNonce:
    def __init__(self, value: int) -> None:
        self.value = value

    def next(self) -> int:
        return self.value


def equivocation(b: Bench, n: int, *, forged_second: bool = False) -> Row:
    """N authors each sign two rollouts under one nonce; with ``forged_second`` the second one is signed by
    MALLORY instead (author kept), which must neither be accepted nor flag the honest author."""
    v = b.validator()
    accepted_per_pair: list[int] = []
    reasons: Counter[str] = Counter()
    authors = [Identity.from_seed(hashlib.sha256(f"bench/equivocator/{i}".encode()).digest()) for i in range(n)]
    for i, ident in enumerate(authors):
        signer = b.signer_for(ident, SameNonce(1_000 + i))
        first = signer.sign_rollout(b.rollout(ident, completion="4"))
        second = signer.sign_rollout(b.rollout(ident, completion="5"))
        if forged_second:
            second = signed_by(unpack(second), b.mallory)
        # gossipsub names the real publisher: the author for its own messages, MALLORY for the forgery
        sources = (ident.peer_id, b.mallory.peer_id if forged_second else ident.peer_id)
        verdicts = [
            v.validate(m, source_peer=s, expected_kind="rollout") for m, s in zip((first, second), sources, strict=True)
        ]
        accepted_per_pair.append(sum(x.ok for x in verdicts))
        reasons.update(x.reason for x in verdicts if x.reason)
    flagged = sum(v.should_blacklist(a.peer_id) for a in authors)
    stats = v.statistics()
    if forged_second:
        name, target = "equivocation forged by another key (pairs)", "<=1 per pair, 0 flagged"
        met = max(accepted_per_pair) <= 1 and flagged == 0 and not stats.equivocators
    else:
        name, target = "equivocation (pairs, same nonce)", "<=1 per pair, all flagged"
        met = max(accepted_per_pair) <= 1 and flagged == n and len(stats.equivocators) == n
    return Row(name, n, sum(accepted_per_pair), target, met, dict(reasons), flagged)


def forged_equivocation(b: Bench, n: int) -> Row:
    return equivocation(b, n, forged_second=True)


SCENARIOS: list[Callable[[Bench, int], Row]] = [
    forged_signature,
    wrong_key,
    author_not_source,
    unsigned,
    replay_immediate,
    replay_after_nonce_window,
    replay_after_clock_skew,
    replay_across_restart,
    replay_reencoded,
    equivocation,
    forged_equivocation,
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1000, help="hostile messages (or equivocating pairs) per scenario")
    ap.add_argument("--out", type=Path, default=Path("runs/reliability-protocol.json"))
    args = ap.parse_args()
    rows: list[Row] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dgrpo-reliability-") as folder:
        bench = Bench(Path(folder))
        for scenario in SCENARIOS:
            rows.append(scenario(bench, args.n))
    elapsed = time.perf_counter() - started
    print(f"{'scenario':48} {'trials':>6} {'accepted':>8} {'target':>25} {'flagged':>7}  met  reasons")
    for r in rows:
        flagged = "" if r.flagged is None else str(r.flagged)
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(r.reasons.items()))
        met = "yes" if r.met else "NO "
        print(f"{r.scenario:48} {r.trials:6d} {r.accepted:8d} {r.target:>25} {flagged:>7}  {met}  {reasons}")
    print(f"{sum(r.trials for r in rows)} trials in {elapsed:.1f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"n": args.n, "seconds": elapsed, "rows": [asdict(r) for r in rows]}, indent=2))
    print(f"wrote {args.out}")
    if not all(r.met for r in rows):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
