"""The Ray engine (issue 27): nodes as Ray actors on a local Ray with 2 workers, carrying signed envelopes
between them, give the in-process engine's results for the same seeds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dgrpo.simulations.ray_engine import groups_of
from dgrpo.simulations.runner import run_simulation
from dgrpo.simulations.scenario import load_scenario
from dgrpo.simulations.summary import RunSummary

pytestmark = pytest.mark.slow


def test_groups_are_contiguous_and_balanced() -> None:
    assert groups_of(8, 2) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert groups_of(5, 3) == [[0, 1], [2, 3], [4]]
    assert groups_of(2, 4) == [[0], [1]]  # never an empty actor


def _untimed(value: Any) -> Any:
    """``value`` without the wall-clock figures (which no two runs share)."""
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if "seconds" not in k and "overhead" not in k}
    return value


def _run(tmp: Path, name: str, overrides: list[str]) -> tuple[RunSummary, list[dict[str, Any]]]:
    scenario = load_scenario(None, overrides)
    summary = run_simulation(scenario, tmp / name)
    rows = [json.loads(line) for line in (tmp / name / "metrics.jsonl").read_text().splitlines()]
    return summary, rows


def test_ray_engine_equals_the_in_process_engine(tmp_path: Path) -> None:
    """An attacked run (TEXT, 1 of 4 nodes, honest nodes defended by ``logit``) split 2 + 1 + 1 over three
    actors: every round's loss, rewards, rejections and defense numbers, the accuracy and ASR curves and the
    wire counters equal the in-process run's."""
    base = [
        "rounds=3", "eval.every=1", "eval.prompts=32", "eval.asr_prompts=32", "nodes.count=4", "nodes.malicious=1",
        "adversary.name=text", "model.name=dgrpo:tiny-arith-text", 'defense.chain=["logit"]',
    ]  # fmt: skip
    ray_summary, ray_rows = _run(tmp_path, "ray", [*base, "engine.name=ray", "engine.workers=3"])
    local_summary, local_rows = _run(tmp_path, "inprocess", base)
    assert ray_summary.engine["name"] == "ray" and ray_summary.engine["groups"] == [2, 1, 1]
    keys = ("loss", "honest_mean_reward", "honest_own_reward", "completions_accepted", "rejected", "defense")
    assert [_untimed({k: r.get(k) for k in keys}) for r in ray_rows] == [
        _untimed({k: r.get(k) for k in keys}) for r in local_rows
    ]
    for key in ("accuracy", "asr", "final_accuracy", "final_asr", "attack_stats", "wire", "defense"):
        assert _untimed(ray_summary.model_dump()[key]) == _untimed(local_summary.model_dump()[key]), key
    # the envelopes crossed between actors and were validated there: every node accepted the others' messages
    assert ray_summary.wire["messages_accepted"] == 3 * 4 * 8 * 3  # rounds x nodes x prompts x peers
    assert ray_summary.final_asr is not None
