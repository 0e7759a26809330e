"""Rules docs/protocol.md states exactly, pinned here: which reason an over-long identifier gets, the order of
the replay checks, and how ``incomplete`` is counted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dgrpo.config.rollout import RolloutConfig
from dgrpo.protocol.envelope import HeartbeatBody, RolloutBody, WireSamplingParams
from dgrpo.protocol.replay import ReplayGuard
from dgrpo.protocol.update_bodies import GlobalBody
from dgrpo.round.admit import Admitter
from dgrpo.round.binding import RoundPlan
from dgrpo.tasks import get_task
from tests.protocol_helpers import FakeClock, make_rollout, make_signer, pack, unpack, validator


# ----------------------------------------------------------------------------- identifiers: string_too_long
def rollout_body(**change: Any) -> RolloutBody:
    r = make_rollout()
    fields = r.model_dump(exclude={"author", "round", "sampling"}) | change
    return RolloutBody(**fields, sampling=WireSamplingParams.model_validate(r.sampling.model_dump()))


@pytest.mark.parametrize(
    ("change", "limits", "reason"),
    [
        ({"prompt_id": "p" * 257}, {}, "string_too_long"),  # was "schema": the schema's own cap fired first
        ({"model_id": "m" * 257}, {}, "string_too_long"),
        ({"prompt_id": "p" * 257}, {"max_string_chars": 1000}, "string_too_long"),  # 256 holds regardless
        ({"prompt_id": "p" * 256}, {}, None),
        ({"prompt_id": "p" * 11}, {"max_string_chars": 10}, "string_too_long"),
    ],
)
def test_an_identifier_over_its_cap_is_string_too_long(
    tmp_path: Path, change: dict[str, Any], limits: dict[str, Any], reason: str | None
) -> None:
    clock = FakeClock()
    data = make_signer(tmp_path, clock).sign("rollout", 3, rollout_body(**change))
    assert validator(clock, **limits).validate(data).reason == reason


def test_an_empty_prompt_id_is_schema(tmp_path: Path) -> None:
    clock = FakeClock()
    wire = unpack(make_signer(tmp_path, clock).sign_rollout(make_rollout()))
    wire["body"]["prompt_id"] = ""
    assert validator(clock).validate(pack(wire)).reason == "schema"


def test_listen_addresses_and_clients_have_the_same_reason(tmp_path: Path) -> None:
    clock = FakeClock()
    signer = make_signer(tmp_path, clock)
    heartbeat = HeartbeatBody(round=1, rounds_done=0, status="running", listen_addrs=("/ip4/1.2.3.4/tcp/1" * 15,))
    assert validator(clock, max_string_chars=300).validate(signer.sign("heartbeat", 1, heartbeat)).ok
    assert validator(clock).validate(signer.sign("heartbeat", 1, heartbeat)).reason == "string_too_long"

    def global_chunk(client: str) -> bytes:
        body = GlobalBody(
            chunk=0, chunks=1, size=1, sha256=bytes(32), base=bytes(32), mean=0.0, std=0.0, clients=(client,),
            weights=(1.0,), data=b"x",
        )  # fmt: skip
        return signer.sign("global", 1, body)

    assert validator(clock).validate(global_chunk("c" * 128)).ok
    assert validator(clock).validate(global_chunk("c" * 129)).reason == "string_too_long"  # was "schema"
    assert validator(clock, max_string_chars=1000).validate(global_chunk("c" * 129)).reason == "string_too_long"
    assert validator(clock, max_string_chars=10).validate(global_chunk("c" * 11)).reason == "string_too_long"


# ----------------------------------------------------------------------------- replay: the order of the checks
def test_replay_checks_in_the_documented_order() -> None:
    """The vector of "Replay protection", order of the checks."""
    guard = ReplayGuard(4)
    digest = {n: bytes([n]) * 16 for n in range(1, 12)}
    for n in range(1, 11):
        assert guard.check("a", n, digest[n]) is None
        guard.record("a", n, digest[n])
    other = b"\xee" * 16
    assert guard.check("a", 5, digest[5]) == "stale_nonce"  # remembered, same digest, below the window
    assert guard.check("a", 5, other) == "equivocation"  # the remembered digest wins over the window
    assert guard.check("a", 8, digest[8]) == "replay"
    assert guard.check("a", 8, other) == "equivocation"
    assert guard.check("a", 11, digest[11]) is None
    assert guard.check("a", 6) == "stale_nonce" and guard.check("a", 7) == "replay"  # 10 - 4 < 7
    assert guard.check("b", 1, other) is None  # an unknown author


def test_a_redelivered_message_below_the_window_is_stale_nonce(tmp_path: Path) -> None:
    clock = FakeClock()
    signer = make_signer(tmp_path, clock)
    messages = [signer.sign_rollout(make_rollout(part=0)) for _ in range(10)]
    check = validator(clock, replay_window=4)
    assert all(check.validate(m).ok for m in messages)
    assert check.validate(messages[4]).reason == "stale_nonce"  # its digest is remembered, and equal
    assert check.validate(messages[8]).reason == "replay"


# ----------------------------------------------------------------------------- incomplete: counted per rollout
def test_incomplete_counts_each_rollout_of_an_author_that_does_not_cover_its_plan() -> None:
    task = get_task("arith")
    plan = RoundPlan(task, RolloutConfig(prompts_per_round=3, completions_per_prompt=1), "run")
    admitter = Admitter(task, "horizontal", plan=plan, limits=validator(FakeClock()).limits, self_id="me")

    def parts(author: str, prompts: list[Any]) -> list[Any]:
        return [
            make_rollout(author=author, round=5, part=i, parts=3, prompt_id=p.id, prompt=p.text, completions=("1",))
            for i, p in enumerate(prompts)
        ]

    planned = plan.prompts("", 5)
    elsewhere = next(p for i in range(100) if (p := task.train_prompt(i)).id not in plan.ids("", 5))
    lost_one = parts("lost", planned[:2])  # the third part never arrived
    off_plan = parts("off", [*planned[:2], elsewhere])
    whole = parts("whole", planned)
    admission = admitter.admit([*lost_one, *off_plan, *whole], 5, lambda author: False)
    assert admission.rejected == {"incomplete": 4, "off_plan": 1}
    assert admission.rejected_by_author == {"lost": 2, "off": 3}
    assert {a.rollout.author for a in admission.admitted} == {"whole"}
