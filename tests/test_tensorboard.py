"""TensorBoard logging (``logging.tensorboard``, issue 44): the observer's tags, steps and values, read back with
TensorBoard's own reader; the setting in scenarios and node settings; the daemon's observer and ``--tensorboard``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from typer.testing import CliRunner

from dgrpo.errors import ConfigError
from dgrpo.learner.batch import StepStats
from dgrpo.round.observer import notify
from dgrpo.round.outcome import (
    Admission,
    DefenseOutcome,
    Drawn,
    Produced,
    RoundOutcome,
    ScoredCompletion,
    Scoring,
)
from dgrpo.round.tensorboard import TensorBoardObserver, node_scalars, row_scalars

Events = dict[str, list[tuple[int, float]]]


def read(folder: Path) -> Events:
    """Every scalar in ``folder``'s event files, by tag: (step, value) in step order."""
    acc = EventAccumulator(str(folder))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def outcome(
    peer: str,
    round_idx: int,
    rewards: dict[str, list[float]],
    rejected: dict[str, int] | None = None,
    defense_rejected: dict[str, int] | None = None,
    loss: float | None = None,
    attack: str | None = None,
) -> RoundOutcome:
    """A node's round: the completions it trained on (rewards by author), what admission and the defense
    rejected, and its step's loss (None: no step)."""
    scored = tuple(ScoredCompletion(a, cast(Any, None), "", r) for a, rs in rewards.items() for r in rs)
    checked = {a: len(rs) for a, rs in rewards.items() if a != peer}
    return RoundOutcome(
        peer, round_idx, Produced(8, 1.0, attack=attack, poisoned_count=4 if attack else 0),
        Admission(messages=6, completions_received=24, admitted=(), rejected=rejected or {}),
        DefenseOutcome(("logit",), (), defense_rejected or {}, checked, {}, {"logit": 0.25}),
        Scoring(scored, 0.5),
        None if loss is None else StepStats(loss, 2.0, 16, 320, 0.1),
        3.0, round_seconds=4.0, drawn=Drawn((), offered=16, drawn=8, young_drawn=2),
    )  # fmt: skip


def test_per_node_scalars_by_round(tmp_path: Path) -> None:
    with TensorBoardObserver(tmp_path) as board:
        board.on_round(1, [
            outcome("node-0", 1, {"node-0": [1.0, 0.0], "node-1": [1.0, 1.0]}, {"stale_round": 2},
                    {"logit:outside_top_k": 1}, loss=0.5),
            outcome("node-1", 1, {"node-1": [0.0, 0.0]}, loss=0.25, attack="text"),
        ])  # fmt: skip
        board.on_round(2, [
            outcome("node-0", 2, {"node-0": [1.0]}),  # no rejection, no step
            outcome("node-1", 2, {"node-1": [1.0]}, {"off_plan": 3}, loss=0.75, attack="text"),
        ])  # fmt: skip
    ev = read(tmp_path)
    assert ev["node-0/reward"] == [(1, 0.75), (2, 1.0)]
    assert ev["node-0/own_reward"] == [(1, 0.5), (2, 1.0)]
    assert ev["node-0/completions_trained"] == [(1, 4), (2, 1)]
    assert ev["node-0/loss"] == [(1, 0.5)]  # round 2 trained no step: no point, not a zero
    assert ev["node-1/loss"] == [(1, 0.25), (2, 0.75)]
    assert ev["node-0/grad_norm"] == [(1, 2.0)]
    # Counts: a reason seen once is 0 in the rounds without it; one never seen is no tag.
    assert ev["node-0/rejected/stale_round"] == [(1, 2), (2, 0)]
    assert ev["node-1/rejected/off_plan"] == [(2, 3)]
    assert ev["node-0/rejected/total"] == [(1, 2), (2, 0)]
    assert "node-1/rejected/stale_round" not in ev
    assert ev["node-0/defense/rejected/logit:outside_top_k"] == [(1, 1), (2, 0)]
    assert ev["node-0/defense/checked"] == [(1, 2), (2, 0)]
    assert ev["node-0/defense/reject_rate"] == [(1, 0.5)]  # none checked in round 2: no rate
    assert ev["node-0/seconds/defense"] == [(1, 0.25), (2, 0.25)]
    assert ev["node-0/drawn/young"] == [(1, 2), (2, 2)]
    assert ev["node-1/poisoned"] == [(1, 4), (2, 4)]  # an attacker's own numbers
    assert "node-0/poisoned" not in ev
    assert ev["node-0/seconds/round"] == [(1, 4.0), (2, 4.0)]
    assert not any(tag.startswith("run/") for tag in ev)


def test_node_scalars_tag_names() -> None:
    tags = set(node_scalars(outcome("a", 1, {"a": [1.0]}, {"r": 1}, {"d": 1}, loss=0.1, attack="x")))
    assert tags == {
        "reward", "own_reward", "completions_trained", "completions_published", "completions_received",
        "rejected/total", "rejected/r", "seconds/round", "seconds/reward", "loss", "grad_norm", "tokens",
        "defense/checked", "defense/rejected/total", "defense/rejected/d", "defense/blacklisted", "seconds/defense",
        "drawn/offered", "drawn/drawn", "drawn/young", "poisoned",
    }  # fmt: skip


ROWS: list[dict[str, Any]] = [
    {
        "round": 1, "honest_mean_reward": 0.5, "loss": 0.2, "completions_accepted": 64, "rejected": {"off_plan": 2},
        "attacker_share": None, "by_author": {"node-1": {"trained": 8}}, "accuracy": 0.25, "mean_length": 12.5,
        "asr": 0.0, "defense": {"poison_received": 8, "poison_rejected": 6, "stop_rate": 0.75,
                                "false_positive_rate": 0.0, "overhead_ratio": None},
    },
    {
        "round": 2, "honest_mean_reward": 0.625, "loss": None, "completions_accepted": 60, "rejected": {},
        "attacker_share": 0.125, "by_author": {}, "defense": {"poison_received": 8, "stop_rate": 0.0,
                                                              "false_positive_rate": None},
    },
]  # fmt: skip


def test_run_rows(tmp_path: Path) -> None:
    with TensorBoardObserver(tmp_path) as board:
        for row in ROWS:
            board.log_row(row["round"], row)
    ev = read(tmp_path)
    assert ev["run/honest_mean_reward"] == [(1, 0.5), (2, 0.625)]
    assert [s for s, _ in ev["run/loss"]] == [1] and ev["run/loss"][0][1] == pytest.approx(0.2)  # float32
    assert ev["run/accuracy"] == [(1, 0.25)]  # evaluated in round 1 only
    assert ev["run/asr"] == [(1, 0.0)] and ev["run/mean_length"] == [(1, 12.5)]
    assert ev["run/attacker_share"] == [(2, 0.125)]
    assert ev["run/defense/stop_rate"] == [(1, 0.75), (2, 0.0)]
    assert ev["run/defense/false_positive_rate"] == [(1, 0.0)]
    assert ev["run/defense/poison_rejected"] == [(1, 6), (2, 0)]  # a count: 0 where the row leaves it out
    assert ev["run/rejected/off_plan"] == [(1, 2), (2, 0)]
    assert ev["run/completions_accepted"] == [(1, 64), (2, 60)]
    assert not any("by_author" in tag or tag == "run/round" for tag in ev)
    assert row_scalars({"round": 3, "full": True, "clients": ["a"], "name": "x", "n": {"a": {"b": 1}}}) == {"n/a/b": 1}


def test_rows_of_another_observer_and_a_flush_every_round(tmp_path: Path) -> None:
    """The simulation's wiring: the observer after the one that appends ``metrics.jsonl`` rows writes the
    round's row with the nodes' numbers; each round is on disk before the writer closes."""
    rows: list[dict[str, Any]] = []
    board = TensorBoardObserver(tmp_path, rows=rows)
    for r, row in enumerate(ROWS, start=1):
        rows.append(row)
        board.on_round(r, [outcome("node-0", r, {"node-0": [float(r)]})])
        ev = read(tmp_path)  # the writer is still open
        assert ev["run/honest_mean_reward"][-1][0] == r and ev["node-0/reward"][-1] == (r, float(r))
    board.on_round(3, [outcome("node-0", 3, {"node-0": [0.0]})])  # no row of round 3: none written
    board.close()
    board.close()
    ev = read(tmp_path)
    assert [s for s, _ in ev["run/honest_mean_reward"]] == [1, 2]
    assert [s for s, _ in ev["node-0/reward"]] == [1, 2, 3]
    with pytest.raises(ValueError, match="closed"):
        board.log_scalars(4, {"x": 1})


def test_one_prefix_and_accuracy(tmp_path: Path) -> None:
    """A daemon's wiring: its own numbers under ``node/``, its held-out accuracy where evaluated."""
    with TensorBoardObserver(tmp_path, prefix="node", accuracy=lambda r: 0.5 if r == 2 else None) as board:
        for r in (1, 2):
            board.on_round(r, [outcome("12D3KooWlongpeerid", r, {"12D3KooWlongpeerid": [1.0]})])
        board.log_scalars(2, {"extra": 7}, prefix="node")
    ev = read(tmp_path)
    assert ev["node/accuracy"] == [(2, 0.5)]
    assert ev["node/reward"] == [(1, 1.0), (2, 1.0)]
    assert ev["node/extra"] == [(2, 7)]
    assert not any(tag.startswith("12D3") for tag in ev)


# ----------------------------------------------------------------- configuration


def test_the_setting_in_scenarios_and_node_settings(tmp_path: Path) -> None:
    from dgrpo.daemon.join import overrides_run
    from dgrpo.daemon.run_manifest import run_config
    from dgrpo.daemon.settings import load_node_settings
    from dgrpo.simulations.scenario import load_scenario

    assert load_scenario(None, []).logging.tensorboard is None
    assert load_scenario(None, [f"logging.tensorboard={tmp_path}"]).logging.tensorboard == tmp_path
    settings = load_node_settings(None, ["logging.tensorboard=runs/tb"])
    assert settings.logging.tensorboard == Path("runs/tb")
    # A node's own: not in the run's manifest, and no reason not to learn the run from the bootstrap peers.
    assert "logging" not in run_config(settings)
    assert overrides_run(["logging.tensorboard=runs/tb"]) == []
    with pytest.raises(ConfigError, match="tensorboard"):
        load_scenario(None, ["logging.tensorbord=x"])


def test_the_daemon_observes_with_tensorboard_when_set(tmp_path: Path) -> None:
    from dgrpo.daemon.launch import open_daemon
    from dgrpo.daemon.settings import load_node_settings

    board_dir = tmp_path / "tb"
    sets = [f"state_dir={str(tmp_path / 'node')!r}", "status.enabled=false", "eval.every=1", "eval.prompts=2"]
    daemon = open_daemon(load_node_settings(None, [*sets, f"logging.tensorboard={str(board_dir)!r}"]))
    board = daemon.tensorboard
    assert board is not None and daemon.observers[-1] is board and board.prefix == "node"
    me = daemon.peer_id
    notify([daemon.held_out, board], 1, [outcome(me, 1, {me: [1.0, 0.0]}, loss=0.5)])  # evaluates, then logs
    board.close()
    ev = read(board_dir)
    assert ev["node/reward"] == [(1, 0.5)] and ev["node/loss"] == [(1, 0.5)]
    accuracy = daemon.held_out.accuracy_at(1)
    [(step, value)] = ev["node/accuracy"]
    assert step == 1 and accuracy is not None and value == pytest.approx(accuracy)
    plain = open_daemon(load_node_settings(None, [f"state_dir={str(tmp_path / 'plain')!r}", "status.enabled=false"]))
    assert plain.tensorboard is None
    assert not any(type(o).__name__ == "TensorBoardObserver" for o in plain.observers)


def test_node_run_tensorboard_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dgrpo.cli.node as node_cli
    import dgrpo.daemon.launch as launch
    from dgrpo.cli import app

    seen: list[Any] = []
    monkeypatch.setattr(launch, "run_daemon", lambda settings, **_: seen.append(settings))
    monkeypatch.setattr(node_cli, "daemon_logging", lambda: None)
    state = tmp_path / "state"
    result = CliRunner().invoke(app, ["node", "run", "--state-dir", str(state), "--tensorboard", str(tmp_path / "tb")])
    assert result.exit_code == 0, result.output
    assert seen[0].logging.tensorboard == tmp_path / "tb"


# ----------------------------------------------------------------- a simulation


def test_a_simulation_writes_readable_events(tmp_path: Path) -> None:
    from dgrpo.simulations.runner import run_simulation
    from dgrpo.simulations.scenario import load_scenario

    board_dir = tmp_path / "tb"
    overrides = ["nodes.count=2", "rounds=2", "eval.prompts=8", "eval.every=1", f"logging.tensorboard={board_dir}"]
    run_simulation(load_scenario(None, overrides), tmp_path / "out")
    ev = read(board_dir)
    for node in ("node-0", "node-1"):
        assert [s for s, _ in ev[f"{node}/reward"]] == [1, 2]
        assert [s for s, _ in ev[f"{node}/completions_trained"]] == [1, 2]
    assert [s for s, _ in ev["run/honest_mean_reward"]] == [1, 2]
    assert [s for s, _ in ev["run/accuracy"]] == [0, 1, 2]  # the untrained model's, then each round's
