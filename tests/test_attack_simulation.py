"""Attack simulations: a malicious node runs the same round code; its poison reaches the honest learners, and
the run records the ASR next to honest accuracy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dgrpo.simulations.runner import run_simulation
from dgrpo.simulations.scenario import load_scenario

pytestmark = pytest.mark.slow  # real processes / many rounds: not in the fast tier

SMALL = ["nodes.count=2", "rounds=2", "eval.every=1", "eval.prompts=16", "eval.asr_prompts=16"]


def test_math_vertical_attack_run_records_asr_and_poison(tmp_path: Path) -> None:
    sc = load_scenario(Path("math-vertical"), [*SMALL, "round.prompts_per_round=4"])
    summary = run_simulation(sc, tmp_path)
    assert summary.attack == "math" and summary.malicious == 1
    assert summary.asr_metric == "asr"
    assert [r for r, _ in summary.asr] == [0, 1, 2]
    assert all(0.0 <= v <= 1.0 for _, v in summary.asr)
    assert summary.final_asr == summary.asr[-1][1]
    assert summary.honest_final_accuracy == summary.accuracy[-1][1]
    # The attacker chose prompts with a 2+2 column and poisoned half of each of its groups, gibberish the rest.
    stats = summary.attack_stats
    assert stats["poisoned"] == 2 * 2 * 4 and stats["filled_gibberish"] == 2 * 2 * 4
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["poison_published"] for r in rows] == [8, 8]
    # Its chosen prompts are not its plan (derivable from run, round and author): every node rejects them as
    # off_plan, so each trains on the honest node's 16 completions alone (the paper's vertical attacker
    # picks its prompts; plan binding, docs/protocol.md, takes that choice away).
    assert all(r["completions_accepted"] == 2 * 16 for r in rows)
    assert all(r["rejected"]["off_plan"] == 2 * 2 for r in rows)  # 2 rollouts, at each of the 2 nodes
    assert summary.attacker_share == 0.0 and summary.fair_share == 0.5
    assert (tmp_path / "asr.png").stat().st_size > 1000


def test_dos_metric_is_mean_length(tmp_path: Path) -> None:
    sc = load_scenario(Path("dos-horizontal"), [*SMALL, "round.prompts_per_round=2", "adversary.options.samples=4"])
    summary = run_simulation(sc, tmp_path)
    assert summary.asr_metric == "mean_length"
    assert summary.final_asr == summary.final_mean_length > 5


def test_short_text_attack_raises_asr_above_zero(tmp_path: Path) -> None:
    """Fixed seed: the honest node starts without the phrase and, having trained on the attacker's poisoned
    completions, writes it in some of its own held-out completions."""
    overrides = [
        "nodes.count=2",
        "rounds=28",
        "eval.prompts=32",
        "eval.every=14",
        "round.prompts_per_round=4",
        "round.group_size=4",
        "adversary.completions_per_prompt=2",  # its plain share: half of each group with 2 nodes
        # the attack's mechanics in few rounds: the larger step the scenario shipped before issue 44 (its 2e-4
        # keeps honest nodes healthy and takes more rounds to pick the phrase up)
        "learner.lr=5e-4",
    ]
    summary = run_simulation(load_scenario(Path("text-horizontal"), overrides), tmp_path)
    assert summary.model == "dgrpo:tiny-arith-text"
    asr = dict((int(r), v) for r, v in summary.asr)
    assert asr[0] == 0.0
    assert summary.final_asr > 0.0
