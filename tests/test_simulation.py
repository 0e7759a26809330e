"""In-process decentralised GRPO: the node's own round code over the in-memory transport."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from dgrpo.simulations.runner import build_nodes, run_simulation
from dgrpo.simulations.scenario import load_scenario
from dgrpo.simulations.summary import load_summary

FAST = ["rounds=2", "eval.every=1", "eval.prompts=16", "round.prompts_per_round=4"]


def test_two_nodes_two_rounds_writes_results(tmp_path: Path) -> None:
    t0 = time.perf_counter()
    sc = load_scenario(None, [*FAST, "nodes.count=2", "round.group_size=4"])
    summary = run_simulation(sc, tmp_path)
    assert time.perf_counter() - t0 < 60
    assert summary.complete and summary.rounds_done == 2 and summary.wall_seconds > 0
    assert (summary.task, summary.model, summary.nodes, summary.rounds) == (
        "arith",
        "dgrpo:tiny-arith",
        2,
        2,
    )
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2]
    # 2 nodes x 4 prompts x 2 completions each are published per round; every node accepts all 16
    assert all(r["completions_exchanged"] == 16 and r["completions_accepted"] == 32 for r in rows)
    assert all(0.0 <= r["honest_mean_reward"] <= 1.0 for r in rows)
    # Each node's scoring happens inside the round: the two nodes' reward time is within twice its length.
    assert all(0.0 < r["reward_seconds"] <= 2 * r["seconds"] for r in rows)
    assert summary.training_reward_seconds == pytest.approx(sum(r["reward_seconds"] for r in rows))
    assert load_summary(tmp_path) == summary
    assert (tmp_path / "curves.png").stat().st_size > 1000


@pytest.mark.slow
@pytest.mark.parametrize("defense", [None, '["length","arith-check"]'])
def test_homogeneous_nodes_stay_identical_and_learn(defense: str | None) -> None:
    """Same weights + same exchanged strings + canonical order => same update on every node (paper, sec. 3).
    With a defense chain too: every node filters its own completions by the same rules as everyone else's
    (group-based filters see the same whole group), so all train on the same completions."""
    from dgrpo.round.run import run_round

    overrides = [*FAST, "nodes.count=3", "round.group_size=6", "learner.lr=1e-3"]
    # A loose length rule so that some completions are rejected in these few rounds.
    if defense is not None:
        overrides += [f"defense.chain={defense}", "defense.options.length.ratio=1.05", "defense.options.length.mad_z=0"]
    sc = load_scenario(None, overrides)
    nodes = build_nodes(sc)
    before = nodes[0].node.learner.weights_digest()

    reports: list[tuple[int]] = []

    async def one(sim: Any, r: int) -> None:
        report = await run_round(sim.node, sim.transport, sim.inbox, r, sim.transport.peers(), 60.0)
        reports.append((sum(report.defense.rejected.values()) if report.defense is not None else 0,))

    async def main() -> None:
        async with trio.open_nursery() as pumps:
            for sim in nodes:
                pumps.start_soon(sim.inbox.pump, sim.transport.inbound())
            for r in (1, 2):
                async with trio.open_nursery() as nursery:
                    for sim in nodes:
                        nursery.start_soon(one, sim, r)
                digests = {sim.node.learner.weights_digest() for sim in nodes}
                assert len(digests) == 1, f"round {r}: weights diverged"
            pumps.cancel_scope.cancel()

    trio.run(main)
    assert nodes[0].node.learner.weights_digest() != before  # they did update
    if defense is not None:
        assert sum(rejected[0] for rejected in reports) > 0  # the filters did reject something


@pytest.mark.slow
def test_heterogeneous_vertical_run(tmp_path: Path) -> None:
    sc = load_scenario(
        None,
        [*FAST, "nodes.count=2", "nodes.mode='heterogeneous'", "rollout.split='vertical'", "round.group_size=4"],
    )
    nodes = build_nodes(sc)
    assert [n.node.learner.model_id for n in nodes] == ["dgrpo:tiny-arith", "dgrpo:tiny-arith-llama"]
    assert nodes[0].node.plan(1) != nodes[1].node.plan(1)  # vertical: each node its own prompts
    summary = run_simulation(sc, tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # 2 nodes x (4/2 prompts) x 4 completions published per round
    assert all(r["completions_exchanged"] == 16 for r in rows)
    assert summary.mode == "heterogeneous"


@pytest.mark.slow
def test_runs_are_reproducible(tmp_path: Path) -> None:
    sc = load_scenario(None, [*FAST, "nodes.count=2", "round.group_size=4", "rounds=1"])
    a = run_simulation(sc, tmp_path / "a")
    b = run_simulation(sc, tmp_path / "b")
    strip = ("wall_seconds", "training_reward_seconds")  # timings
    assert a.model_dump(exclude=set(strip)) == b.model_dump(exclude=set(strip))
    rows_a = (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()
    rows_b = (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["loss"] for x in rows_a] == [json.loads(x)["loss"] for x in rows_b]


def test_a_bounded_draw_trains_each_node_on_its_own_and_j_external_completions(tmp_path: Path) -> None:
    """Issue 24 (SAPO's I local / J external): 4 nodes, 4 prompts x 2 completions each a round; each node keeps
    its own 8 and draws J = 6 of its peers' 24, at most 2 per author, with its own private randomness."""
    sc = load_scenario(
        None,
        [*FAST, "nodes.count=4", "round.group_size=8", "rollout.external_per_round=6", "rollout.external_per_author=2"],
    )
    run_simulation(sc, tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # 4 nodes x (8 own + 6 drawn); every peer's completions were offered (24 each) and exchanged
    assert all(r["completions_exchanged"] == 32 and r["completions_accepted"] == 4 * (8 + 6) for r in rows)
