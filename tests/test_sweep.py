"""``dgrpo sweep`` (issue 27): scenarios x defenses x seeds, in this process or as Ray tasks, one table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dgrpo.cli import app
from dgrpo.simulations.sweep import Cell, aggregate, cell_scenario, cells_of, parse_chain


def test_chains_and_cells() -> None:
    assert parse_chain("none") == () and parse_chain("") == ()
    assert parse_chain("code-policy+sampling-proof") == ("code-policy", "sampling-proof")
    assert parse_chain("logit, length") == ("logit", "length")
    cells = cells_of(["a", "b"], ["none", "logit"], 3)
    assert len(cells) == 12 and cells[0] == Cell("a", (), 0) and cells[-1] == Cell("b", ("logit",), 2)
    assert cells[4].folder == "a/logit/seed1"


def test_seed_zero_is_the_scenario_as_shipped_and_other_seeds_change_the_run_id() -> None:
    zero = cell_scenario(Cell("default", ("logit",), 0), ["rounds=2"])
    two = cell_scenario(Cell("default", (), 2), ["rounds=2"])
    assert zero.run_id == "sim" and zero.defense.chain == ["logit"] and zero.rounds == 2
    assert two.run_id == "sim-s2" and two.learner.seed == 2 and two.defense.chain == []


def test_mean_and_standard_error_by_hand() -> None:
    rows = [
        {"scenario": "s", "defense": "d", "honest_final_accuracy": a, "final_asr": None, "stop_rate": 1.0,
         "false_positive_rate": 0.0, "attacker_share": None}
        for a in (0.5, 0.7, 0.9)
    ]  # fmt: skip
    (entry,) = aggregate(rows)
    # mean 0.7; sample sd sqrt(((0.2)^2 + 0 + (0.2)^2) / 2) = 0.2; s.e. 0.2 / sqrt(3) = 0.11547
    assert entry["honest_final_accuracy"] == pytest.approx(0.7)
    assert entry["honest_final_accuracy_se"] == pytest.approx(0.2 / 3**0.5)
    assert entry["final_asr"] is None and entry["stop_rate"] == 1.0 and entry["stop_rate_se"] == 0.0


@pytest.mark.slow
def test_a_sweep_on_ray_gives_the_in_process_table(tmp_path: Path) -> None:
    """Four cells (no defense and `logit` against TEXT, two seeds) as Ray tasks on a local Ray, and the same
    one after another here: the same table, cell by cell."""
    common = [
        "default", "-d", "none", "-d", "logit", "--seeds", "2", "-s", "rounds=2", "-s", "eval.prompts=16",
        "-s", "nodes.malicious=1", "-s", "adversary.name=text", "-s", "model.name=dgrpo:tiny-arith-text",
    ]  # fmt: skip
    runner = CliRunner()
    for engine in ("inprocess", "ray"):
        result = runner.invoke(app, ["sweep", *common, "--engine", engine, "--out", str(tmp_path / engine)])
        assert result.exit_code == 0, result.output
        assert "| default | logit | 2 |" in result.output
    tables = {e: json.loads((tmp_path / e / "sweep.json").read_text()) for e in ("inprocess", "ray")}
    keys = ("scenario", "defense", "seed", "honest_final_accuracy", "final_asr", "stop_rate", "false_positive_rate")
    local = [{k: c[k] for k in keys} for c in tables["inprocess"]["cells"]]
    assert [{k: c[k] for k in keys} for c in tables["ray"]["cells"]] == local
    assert {c["stop_rate"] for c in local if c["defense"] == "logit"} == {1.0}
    assert len({c["honest_final_accuracy"] for c in local}) > 1  # the seeds are different runs
    for engine in ("inprocess", "ray"):
        assert (tmp_path / engine / "default" / "logit" / "seed1" / "summary.json").is_file()
        assert (tmp_path / engine / "sweep.png").stat().st_size > 0
