"""Runs that survive an interruption (issue 44): rows appended as rounds end, a stop after the round in progress,
``--resume`` equal to a run never interrupted, round for round, and no output folder overwritten silently."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dgrpo.errors import ConfigError
from dgrpo.simulations.runner import resume_simulation, run_simulation
from dgrpo.simulations.scenario import load_scenario
from dgrpo.simulations.stopping import StopRequest
from dgrpo.simulations.summary import RunSummary, load_summary

SMALL = ["rounds=3", "eval.every=2", "eval.prompts=8", "eval.asr_prompts=8"]
TIMINGS = ("seconds", "overhead_ratio", "defense_seconds", "generation_seconds", "wall_seconds", "engine")


def _untimed(value: Any) -> Any:
    """``value`` without wall-clock measurements (they differ between any two runs)."""
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if not any(t in k for t in TIMINGS)}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value


def _rows(folder: Path) -> list[dict[str, Any]]:
    return [_untimed(json.loads(line)) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def _stopped_at(round_idx: int) -> tuple[StopRequest, Any]:
    stop = StopRequest()

    def on_round(row: dict[str, Any]) -> None:
        if row["round"] == round_idx:
            stop.set("test")

    return stop, on_round


def _same(a: RunSummary, b: RunSummary) -> None:
    assert _untimed(a.to_json()) == _untimed(b.to_json())


@pytest.mark.parametrize(
    "name, sets",
    [
        # an attacker, a same-model chain with the seeded sampler, the reputation policy: every kind of state
        (
            "text-horizontal",
            ["defense.chain=logit,sampling-proof", "rollout.sampler='seeded'", "round.prompts_per_round=4"],
        ),
        ("fed-grpo", ["federated.clients=3", "federated.local_steps=1", "federated.prompts_per_step=4"]),
        # two model families and the cross-model chain (its encoder, reference samples, transformers' hooks)
        (
            "text-horizontal",
            [
                "nodes.mode=heterogeneous",
                "nodes.models=dgrpo:tiny-arith-code-text,dgrpo:tiny-arith-text",
                "defense.chain=heterogeneous",
                "round.group_size=4",
            ],
        ),
    ],
)
def test_a_resumed_run_equals_the_uninterrupted_run_round_for_round(tmp_path: Path, name: str, sets: list[str]) -> None:
    scenario = load_scenario(Path(name), [*SMALL, *sets])
    whole = run_simulation(scenario, tmp_path / "whole")
    stop, on_round = _stopped_at(2)
    cut = run_simulation(scenario, tmp_path / "cut", on_round, stop=stop)
    assert not cut.complete and cut.rounds_done == 2 and len(_rows(tmp_path / "cut")) == 2
    assert load_summary(tmp_path / "cut").rounds_done == 2  # what ran is summarised
    resumed = resume_simulation(tmp_path / "cut")
    assert resumed.complete and resumed.rounds_done == 3
    assert _rows(tmp_path / "cut") == _rows(tmp_path / "whole")
    _same(resumed, whole)
    assert not (tmp_path / "cut" / "state").exists()  # a finished run keeps no snapshot


def test_a_round_logged_after_the_last_snapshot_runs_again(tmp_path: Path) -> None:
    """A run killed between appending a round's row and saving that round's snapshot: the resumed run drops
    the row and runs the round again."""
    scenario = load_scenario(None, SMALL)
    whole = run_simulation(scenario, tmp_path / "whole")
    stop, on_round = _stopped_at(2)
    run_simulation(scenario, tmp_path / "cut", on_round, stop=stop)  # rows and snapshot of rounds 1-2
    third = (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()[2]
    with (tmp_path / "cut" / "metrics.jsonl").open("a") as f:
        f.write(third + "\n")  # round 3 logged, its snapshot never written
    resumed = resume_simulation(tmp_path / "cut")
    assert _rows(tmp_path / "cut") == _rows(tmp_path / "whole")
    _same(resumed, whole)


def test_an_output_folder_holding_a_run_is_never_overwritten_silently(tmp_path: Path) -> None:
    scenario = load_scenario(None, ["rounds=1", "eval.prompts=8"])
    first = run_simulation(scenario, tmp_path)
    before = (tmp_path / "metrics.jsonl").read_text()
    with pytest.raises(ConfigError, match="already holds a run; `--overwrite` replaces it"):
        run_simulation(scenario, tmp_path)
    assert (tmp_path / "metrics.jsonl").read_text() == before
    with pytest.raises(ConfigError, match="holds a finished run: nothing to resume"):
        resume_simulation(tmp_path)
    with pytest.raises(ConfigError, match="no interrupted run to resume"):
        resume_simulation(tmp_path / "empty")
    again = run_simulation(scenario, tmp_path, overwrite=True)
    _same(again, first)


ENV = {**os.environ, "COLUMNS": "200"}


def _dgrpo(*args: str) -> list[str]:
    return [sys.executable, "-m", "dgrpo", *args]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_dgrpo(*args), env=ENV, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sigterm_stops_after_the_round_and_resume_continues(tmp_path: Path) -> None:
    """The command line as a user meets it: SIGTERM in the middle of a run stops it after the round in
    progress (exit 130, the command to continue printed), and `dgrpo simulate --resume` finishes it with the
    rows of a run never interrupted."""
    sets = ["-s", "rounds=6", "-s", "eval.every=3", "-s", "eval.prompts=8"]
    whole = _run("simulate", *sets, "--out", str(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr
    proc = subprocess.Popen(
        _dgrpo("simulate", *sets, "--out", str(tmp_path / "cut")), env=ENV, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    lines = []
    for _ in range(200):  # bounded: a line per round and a few more
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("round   2"):
            proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=300)
    output = "".join(lines)
    assert proc.returncode == 130, output
    assert "SIGTERM: stopping after the round in progress" in output
    assert f"continue with: dgrpo simulate --resume {tmp_path / 'cut'}" in output
    assert "Traceback" not in output
    done = len(_rows(tmp_path / "cut"))
    assert 2 <= done < 6
    resumed = _run("simulate", "--resume", str(tmp_path / "cut"))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resuming {tmp_path / 'cut'} after round {done}" in resumed.stdout
    assert _rows(tmp_path / "cut") == _rows(tmp_path / "whole")
    refused = _run("simulate", *sets, "--out", str(tmp_path / "cut"))
    assert refused.returncode == 2 and "already holds a run" in refused.stdout + refused.stderr
    assert "Traceback" not in refused.stdout + refused.stderr
