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

from dgrpo.adversary import build_adversary
from dgrpo.defense import DefenseChain, Reputation
from dgrpo.node.inbox import RoundInbox
from dgrpo.node.learner import Learner
from dgrpo.node.node import Node, RoundReport
from dgrpo.node.round import run_round
from dgrpo.node.transport import InMemoryHub, InMemoryTransport
from dgrpo.simulations.defense_metrics import DefenseMeter
from dgrpo.simulations.evaluation import EvalPoint, Evaluator
from dgrpo.simulations.plots import plot_asr, plot_curves
from dgrpo.simulations.scenario import Scenario
from dgrpo.tasks import get_task
from dgrpo.tasks.base import Task

RoundCallback = Callable[[dict[str, Any]], None]


@dataclass
class SimNode:
    node: Node
    transport: InMemoryTransport
    inbox: RoundInbox
    honest: bool = True


def build_nodes(scenario: Scenario) -> list[SimNode]:
    """The scenario's nodes; the last ``nodes.malicious`` of them run the adversary."""
    hub = InMemoryHub()
    rollout = scenario.node_rollout()
    task = get_task(scenario.task.name, **scenario.task.options)
    first_malicious = scenario.nodes.count - scenario.nodes.malicious
    nodes = []
    for i in range(scenario.nodes.count):
        peer_id = f"node-{i}"
        learner = Learner(scenario.node_model(i), scenario.learner)
        adversary = None
        if i >= first_malicious and scenario.adversary is not None:
            adversary = build_adversary(scenario.adversary.model_copy(update={"seed": scenario.adversary.seed + i}))
        defense = reputation = None
        if adversary is None and scenario.defense is not None:
            defense = DefenseChain.from_config(scenario.defense)
            reputation = Reputation(scenario.defense.reputation)
        node = Node(peer_id, scenario.run_id, task, learner, rollout, scenario.sampling, adversary, defense, reputation)
        nodes.append(SimNode(node, hub.join(peer_id), RoundInbox(), honest=adversary is None))
    return nodes


def build_evaluator(scenario: Scenario, task: Task) -> Evaluator:
    detector = None
    asr_prompts = None
    if scenario.adversary is not None:
        detector = build_adversary(scenario.adversary).detector(task)
        asr_prompts = detector.eval_prompts(task, scenario.eval.asr_prompts)
    return Evaluator(
        task.eval_prompts(scenario.eval.prompts),
        detector,
        asr_prompts,
        greedy=scenario.eval.greedy,
        seed=scenario.eval.seed,
        dedupe=scenario.nodes.mode == "homogeneous",
    )


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
        "reward_seconds": sum(r.reward_seconds for r in reports),
    }


def _eval_fields(point: EvalPoint) -> dict[str, Any]:
    row: dict[str, Any] = {"accuracy": point.accuracy, "mean_length": point.mean_length}
    if point.asr is not None:
        row["asr"] = point.asr
    return row


async def _simulate(
    scenario: Scenario, nodes: list[SimNode], evaluate: Evaluator, on_round: RoundCallback | None
) -> tuple[list[dict[str, Any]], list[tuple[int, EvalPoint]], DefenseMeter]:
    limiter = trio.CapacityLimiter(1)  # one torch job at a time: reproducible, and no core contention
    rows: list[dict[str, Any]] = []
    evals: list[tuple[int, EvalPoint]] = [(0, await trio.to_thread.run_sync(evaluate, nodes, limiter=limiter))]
    meter = DefenseMeter([s.node for s in nodes])
    async with trio.open_nursery() as pumps:
        for sim in nodes:
            pumps.start_soon(sim.inbox.pump, sim.transport.inbound())
        for round_idx in range(1, scenario.rounds + 1):
            t0 = time.perf_counter()
            reports: list[RoundReport | None] = [None] * len(nodes)

            async def one(
                i: int, sim: SimNode, reports: list[RoundReport | None] = reports, round_idx: int = round_idx
            ) -> None:
                reputation = sim.node.reputation
                peers = [p for p in sim.transport.peers() if reputation is None or not reputation.is_blacklisted(p)]
                reports[i] = await run_round(
                    sim.node,
                    sim.transport,
                    sim.inbox,
                    round_idx,
                    peers,
                    scenario.round.deadline_seconds,
                    limiter,
                )

            async with trio.open_nursery() as nursery:
                for i, sim in enumerate(nodes):
                    nursery.start_soon(one, i, sim)
            done = [r for r in reports if r is not None]
            row = _round_row(round_idx, done, [s.honest for s in nodes], time.perf_counter() - t0)
            row["poison_published"] = sum(
                s.node.adversary.stats.last_round_poisoned for s in nodes if s.node.adversary is not None
            )
            if scenario.defense is not None:
                row["defense"] = meter.observe(round_idx, done)
            if round_idx % scenario.eval.every == 0 or round_idx == scenario.rounds:
                point = await trio.to_thread.run_sync(evaluate, nodes, limiter=limiter)
                evals.append((round_idx, point))
                row.update(_eval_fields(point))
            rows.append(row)
            if on_round is not None:
                on_round(row)
        pumps.cancel_scope.cancel()
    return rows, evals, meter


def run_simulation(scenario: Scenario, out_dir: Path, on_round: RoundCallback | None = None) -> dict[str, Any]:
    """Run ``scenario`` and write its results to ``out_dir``; returns the summary."""
    t0 = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    if scenario.torch_threads:
        torch.set_num_threads(scenario.torch_threads)
    nodes = build_nodes(scenario)
    evaluator = build_evaluator(scenario, nodes[0].node.task)
    rows, evals, meter = trio.run(_simulate, scenario, nodes, evaluator, on_round)
    defense_summary = meter.summary(scenario.defense.chain) if scenario.defense is not None else None
    with (out_dir / "metrics.jsonl").open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    accuracy = [(r, e.accuracy) for r, e in evals]
    asr = [[r, e.asr] for r, e in evals if e.asr is not None]
    metric = evaluator.detector.metric if evaluator.detector is not None else None
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
        "attack": scenario.adversary.name if scenario.adversary is not None else None,
        "malicious": scenario.nodes.malicious,
        "asr_metric": metric,
        "asr": asr,
        "final_asr": asr[-1][1] if asr else None,
        "honest_final_accuracy": accuracy[-1][1],
        "mean_length": [[r, e.mean_length] for r, e in evals],
        "final_mean_length": evals[-1][1].mean_length,
        "attack_stats": _attack_stats(nodes),
        "defense": defense_summary,
        "wall_seconds": time.perf_counter() - t0,
        "training_reward_seconds": sum(r["reward_seconds"] for r in rows),  # every node's scoring, summed
        "scenario_config": scenario.model_dump(mode="json"),
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    title = f"{scenario.name}: {scenario.task.name}"
    plot_curves(rows, accuracy, out_dir / "curves.png", title=title)
    if asr:
        plot_asr(asr, accuracy, out_dir / "asr.png", metric=metric or "asr", title=title)
    return summary


def _attack_stats(nodes: list[SimNode]) -> dict[str, int]:
    total: dict[str, int] = {}
    for sim in nodes:
        if sim.node.adversary is not None:
            for key, value in sim.node.adversary.stats.as_dict().items():
                total[key] = total.get(key, 0) + value
    return total
