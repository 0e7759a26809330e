"""Defenses in simulations: the chain sits between validate and reward on every honest node; poison is
rejected and counted, the attacker is blacklisted, and summary.json carries the defense metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dgrpo.errors import ConfigError
from dgrpo.simulations.runner import run_simulation
from dgrpo.simulations.scenario import load_scenario

pytestmark = pytest.mark.slow  # real processes / many rounds: not in the fast tier

SMALL = ["nodes.count=3", "rounds=3", "eval.every=3", "eval.prompts=16", "eval.asr_prompts=16"]


def test_logit_stops_text_and_blacklists_the_attacker(tmp_path: Path) -> None:
    """TEXT on the digits-only model: every poisoned completion is outside the top-k; after round 1 the
    attacker's rejection rate (1.0) blacklists it and its messages no longer reach the learners."""
    overrides = [*SMALL, "model.name=dgrpo:tiny-arith", "learner.lr=5e-5", 'defense.chain=["logit"]',
                 "round.prompts_per_round=4", "round.group_size=6", "adversary.completions_per_prompt=2"]  # fmt: skip
    summary = run_simulation(load_scenario(Path("text-horizontal"), overrides), tmp_path)
    d = summary.defense
    assert d is not None
    assert d.names == ["logit"]
    assert d.stop_rate == 1.0 and d.false_positive_rate == 0.0
    assert d.counts["poison_received"] >= 2 * 4 * 2  # round 1: 8 poisoned completions to each honest node
    assert d.blacklisted == {"node-0": {"node-2": 1}, "node-1": {"node-2": 1}}
    assert d.overhead_ratio is not None and d.overhead_ratio > 0
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["defense"]["stop_rate"] == 1.0
    # From round 2 on the honest nodes train on the honest completions only (2 nodes x 4 prompts x 4); the
    # attacker, which runs no defense, still takes all 6 per prompt.
    assert [r["completions_accepted"] for r in rows[1:]] == [2 * 4 * 4 + 4 * 6] * 2


# Every digit pair with a one-digit sum made false as 2+2=5 is (a+b -> a+b+1): most planned prompts then have a
# column to falsify. The paper's 2+2=5 alone needs the attacker to pick prompts with a 2+2 column, which the
# plan binding rejects (off_plan).
EVERY_PAIR = "[" + ",".join(f'"{a}+{b}={a + b + 1}"' for a in range(10) for b in range(10) if a + b < 9) + "]"


def test_sampling_proof_stops_math_where_logit_does_not(tmp_path: Path) -> None:
    """MATH, vertical, on the attacker's own plan: 'logit' lets the false steps through (digits are in the
    top-k), 'sampling-proof' rejects them; neither rejects an honest completion."""
    base = [*SMALL, "round.prompts_per_round=3", "rollout.sampler=seeded", "defense.reputation.enabled=false",
            "adversary.options.choose_prompts=false", f"adversary.options.facts={EVERY_PAIR}",
            "adversary.in_sync=true"]  # fmt: skip
    stop = {}
    for name in ["logit", "sampling-proof"]:
        out = tmp_path / name
        summary = run_simulation(load_scenario(Path("math-vertical"), [*base, f'defense.chain=["{name}"]']), out)
        d = summary.defense
        assert d is not None
        assert d.false_positive_rate == 0.0
        assert d.counts["poison_received"] > 0
        stop[name] = d.stop_rate
    assert stop["sampling-proof"] == 1.0
    assert stop["logit"] < 0.5


def test_sampling_proof_needs_the_seeded_sampler() -> None:
    with pytest.raises(ConfigError, match="seeded"):
        load_scenario(Path("math-vertical"), ['defense.chain=["sampling-proof"]'])
