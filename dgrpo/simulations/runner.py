"""Run a scenario: N nodes in one process, joined by the in-memory transport, each running
:func:`dgrpo.node.round.run_round` (the daemon's round) every round.

Outputs ``metrics.jsonl`` (one row per round), ``summary.json`` and ``curves.png`` in the output folder.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import trio

from dgrpo.node.inbox import RoundInbox
from dgrpo.node.learner import Learner
from dgrpo.node.node import Node, RoundReport
from dgrpo.node.round import run_round
from dgrpo.node.transport import InMemoryHub, InMemoryTransport
from dgrpo.simulations.plots import plot_curves
from dgrpo.simulations.scenario import Scenario
from dgrpo.tasks import get_task
from dgrpo.tasks.base import Prompt

RoundCallback = Callable[[dict[str, Any]], None]


@dataclass
class SimNode:
    node: Node
    transport: InMemoryTransport
    inbox: RoundInbox
    honest: bool = True


def build_nodes(scenario: Scenario) -> list[SimNode]:
    hub = InMemoryHub()
    rollout = scenario.node_rollout()
    task = get_task(scenario.task.name, **scenario.task.options)
    nodes = []
    for i in range(scenario.nodes.count):
        peer_id = f"node-{i}"
        learner = Learner(scenario.node_model(i), scenario.learner)
        node = Node(peer_id, scenario.run_id, task, learner, rollout, scenario.sampling)
        nodes.append(SimNode(node, hub.join(peer_id), RoundInbox()))
    return nodes


class Evaluator:
    """Held-out accuracy of the honest nodes. Nodes with identical weights (the homogeneous setting) give
    identical results under the same evaluation seed, so each distinct set of weights is evaluated once."""

    def __init__(self, scenario: Scenario, prompts: list[Prompt]) -> None:
        self.scenario = scenario
        self.prompts = prompts

    def __call__(self, nodes: list[SimNode]) -> float:
        cache: dict[str, float] = {}
        values = []
        for sim in nodes:
            if not sim.honest:
                continue
            digest = sim.node.learner.weights_digest() if self.scenario.nodes.mode == "homogeneous" else ""
            if not digest or digest not in cache:
                acc = sim.node.evaluate(self.prompts, greedy=self.scenario.eval.greedy, seed=self.scenario.eval.seed)
                if not digest:
                    values.append(acc)
                    continue
                cache[digest] = acc
            values.append(cache[digest])
        return sum(values) / len(values) if values else 0.0


def _round_row(round_idx: int, reports: list[RoundReport], honest: list[bool], seconds: float) -> dict[str, Any]:
    honest_reports = [r for r, h in zip(reports, honest, strict=True) if h]
    rejected: dict[str, int] = {}
    for r in reports:
        for reason, n in r.rejected.items():
            rejected[reason] = rejected.get(reason, 0) + n
    losses = [r.step.loss for r in honest_reports if r.step is not None]
    return {
        "round": round_idx,
        "honest_mean_reward": sum(r.mean_reward for r in honest_reports) / max(len(honest_reports), 1),
        "honest_own_reward": sum(r.own_mean_reward for r in honest_reports) / max(len(honest_reports), 1),
        "completions_exchanged": sum(r.completions_published for r in reports),
        "completions_accepted": sum(r.completions_accepted for r in reports),
        "rejected": rejected,
        "loss": sum(losses) / len(losses) if losses else None,
        "seconds": seconds,
    }


async def _simulate(
    scenario: Scenario, nodes: list[SimNode], evaluate: Evaluator, on_round: RoundCallback | None
) -> tuple[list[dict[str, Any]], list[tuple[int, float]]]:
    limiter = trio.CapacityLimiter(1)  # one torch job at a time: reproducible, and no core contention
    rows: list[dict[str, Any]] = []
    accuracy: list[tuple[int, float]] = [(0, await trio.to_thread.run_sync(evaluate, nodes, limiter=limiter))]
    async with trio.open_nursery() as pumps:
        for sim in nodes:
            pumps.start_soon(sim.inbox.pump, sim.transport.inbound())
        for round_idx in range(1, scenario.rounds + 1):
            t0 = time.perf_counter()
            reports: list[RoundReport | None] = [None] * len(nodes)

            async def one(
                i: int, sim: SimNode, reports: list[RoundReport | None] = reports, round_idx: int = round_idx
            ) -> None:
                reports[i] = await run_round(
                    sim.node,
                    sim.transport,
                    sim.inbox,
                    round_idx,
                    sim.transport.peers(),
                    scenario.round.deadline_seconds,
                    limiter,
                )

            async with trio.open_nursery() as nursery:
                for i, sim in enumerate(nodes):
                    nursery.start_soon(one, i, sim)
            done = [r for r in reports if r is not None]
            row = _round_row(round_idx, done, [s.honest for s in nodes], time.perf_counter() - t0)
            if round_idx % scenario.eval.every == 0 or round_idx == scenario.rounds:
                acc = await trio.to_thread.run_sync(evaluate, nodes, limiter=limiter)
                accuracy.append((round_idx, acc))
                row["accuracy"] = acc
            rows.append(row)
            if on_round is not None:
                on_round(row)
        pumps.cancel_scope.cancel()
    return rows, accuracy


def run_simulation(scenario: Scenario, out_dir: Path, on_round: RoundCallback | None = None) -> dict[str, Any]:
    """Run ``scenario`` and write its results to ``out_dir``; returns the summary."""
    t0 = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    if scenario.torch_threads:
        torch.set_num_threads(scenario.torch_threads)
    nodes = build_nodes(scenario)
    prompts = nodes[0].node.task.eval_prompts(scenario.eval.prompts)
    rows, accuracy = trio.run(_simulate, scenario, nodes, Evaluator(scenario, prompts), on_round)
    with (out_dir / "metrics.jsonl").open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    summary: dict[str, Any] = {
        "scenario": scenario.name,
        "task": scenario.task.name,
        "model": scenario.model.name if scenario.nodes.mode == "homogeneous" else list(scenario.nodes.models),
        "nodes": scenario.nodes.count,
        "mode": scenario.nodes.mode,
        "split": scenario.round.split,
        "rounds": scenario.rounds,
        "initial_accuracy": accuracy[0][1],
        "final_accuracy": accuracy[-1][1],
        "accuracy": [list(a) for a in accuracy],
        "final_honest_reward": rows[-1]["honest_mean_reward"] if rows else None,
        "wall_seconds": time.perf_counter() - t0,
        "scenario_config": scenario.model_dump(mode="json"),
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot_curves(rows, accuracy, out_dir / "curves.png", title=f"{scenario.name}: {scenario.task.name}")
    return summary
