"""Run a scenario: N nodes in one process, joined by the in-memory network over the real wire format (signed
envelopes, each receiver's validator and replay window), each running the daemon's round
(:func:`dgrpo.round.run.run_round`'s three phases, each for every node at once: :mod:`dgrpo.simulations.phased`)
every round; the outcomes go to the same observer interface as a daemon's. Engines: ``docs/simulations.md``.

Outputs ``metrics.jsonl`` (one row per round), ``summary.json`` and ``curves.png`` in the output folder.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import trio

from dgrpo.round.observer import RoundObserver, notify
from dgrpo.round.outcome import RoundOutcome
from dgrpo.simulations.defense_metrics import DefenseMeter
from dgrpo.simulations.evaluation import EvalPoint, Evaluator
from dgrpo.simulations.federated import run_federated
from dgrpo.simulations.nodes import attack_stats, build_evaluator, build_nodes, wire_stats
from dgrpo.simulations.phased import phased_round
from dgrpo.simulations.plots import plot_asr, plot_curves
from dgrpo.simulations.pool import LearnerPool
from dgrpo.simulations.scenario import Scenario
from dgrpo.simulations.sim_node import SimNode
from dgrpo.tasks import get_task

if TYPE_CHECKING:
    from dgrpo.simulations.ray_engine import RayEngine

RoundCallback = Callable[[dict[str, Any]], None]


class RoundRows(RoundObserver):
    """``metrics.jsonl``: one row per round over all nodes (rewards and loss of the honest ones), with the
    defense meter's and the evaluator's numbers for that round (they observe first)."""

    def __init__(self, meter: DefenseMeter | None, evaluator: Evaluator, on_round: RoundCallback | None) -> None:
        self.meter = meter
        self.evaluator = evaluator
        self.callback = on_round
        self.rows: list[dict[str, Any]] = []
        self.trained = self.trained_from_attackers = 0  # completions honest nodes trained on, over the run

    def attacker_share(self) -> float | None:
        """The attackers' share of every completion the honest nodes trained on (their fair share is
        ``malicious / count``: each node contributes the same share of every round)."""
        return self.trained_from_attackers / self.trained if self.trained else None

    def on_round(self, round_idx: int, outcomes: Sequence[RoundOutcome]) -> None:
        honest = [o for o in outcomes if o.produced.attack is None]
        attackers = {o.peer_id for o in outcomes if o.produced.attack is not None}
        trained = sum(o.completions_trained for o in honest)
        from_attackers = sum(1 for o in honest for s in o.scoring.scored if s.author in attackers)
        self.trained += trained
        self.trained_from_attackers += from_attackers
        rejected: Counter[str] = Counter()
        for o in outcomes:
            rejected.update(o.admission.rejected)
        losses = [o.step.loss for o in honest if o.step is not None]
        row: dict[str, Any] = {
            "round": round_idx,
            "honest_mean_reward": sum(o.scoring.mean_reward for o in honest) / max(len(honest), 1),
            "honest_own_reward": sum(o.scoring.mean_reward_of(o.peer_id) for o in honest) / max(len(honest), 1),
            "completions_exchanged": sum(o.produced.completions for o in outcomes),
            "completions_accepted": sum(o.completions_trained for o in outcomes),
            "rejected": dict(rejected),
            "loss": sum(losses) / len(losses) if losses else None,
            "seconds": max((o.round_seconds for o in outcomes), default=0.0),
            "reward_seconds": sum(o.scoring.seconds for o in outcomes),
            "poison_published": sum(o.produced.poisoned_count for o in outcomes),
            "attacker_share": from_attackers / trained if trained and attackers else None,
        }
        row["by_author"] = _by_author(honest)
        if self.meter is not None:
            row["defense"] = self.meter.rows[round_idx]
        point = self.evaluator.point_at(round_idx)
        if point is not None:
            row.update(_eval_fields(point))
        self.rows.append(row)
        if self.callback is not None:
            self.callback(row)


def _by_author(honest: Sequence[RoundOutcome]) -> dict[str, dict[str, int]]:
    """Per author, over the honest nodes' round: completions trained on (scored), peers' completions the
    defenses checked and rejected, and messages the admit stage rejected (the HTML report's peer table)."""
    table: dict[str, Counter[str]] = {}

    def add(author: str, key: str, n: int) -> None:
        table.setdefault(author, Counter())[key] += n

    for o in honest:
        for s in o.scoring.scored:
            if s.author != o.peer_id:
                add(s.author, "trained", 1)
        for author, n in o.admission.rejected_by_author.items():
            add(author, "admission_rejected", n)
        if o.defense is not None:
            for author, n in o.defense.checked_by_author.items():
                add(author, "defense_checked", n)
            for author, n in o.defense.rejected_by_author.items():
                add(author, "defense_rejected", n)
    return {author: dict(sorted(c.items())) for author, c in sorted(table.items())}


def _eval_fields(point: EvalPoint) -> dict[str, Any]:
    row: dict[str, Any] = {"accuracy": point.accuracy, "mean_length": point.mean_length}
    if point.asr is not None:
        row["asr"] = point.asr
    return row


async def _simulate(
    scenario: Scenario, nodes: list[SimNode], observers: Sequence[RoundObserver], pool: LearnerPool | None = None
) -> None:
    limiter = trio.CapacityLimiter(1)  # one torch job at a time: reproducible, and no core contention
    async with trio.open_nursery() as pumps:
        for sim in nodes:
            pumps.start_soon(sim.inbox.pump, sim.transport.inbound())
        for round_idx in range(1, scenario.rounds + 1):
            # the daemon's round (run_round), phase by phase for every node at once; without a pool, the
            # nodes' torch work one job at a time
            done = await phased_round(
                nodes, round_idx, scenario.round.deadline_seconds, pool, None if pool is not None else limiter
            )
            await trio.to_thread.run_sync(notify, observers, round_idx, done, limiter=limiter)
        pumps.cancel_scope.cancel()


class InProcessEngine:
    """Every node in this process (``engine.name = "inprocess"``, the default), batched where
    ``engine.batched`` allows (:mod:`dgrpo.simulations.pool`)."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.nodes = build_nodes(scenario)
        batched = scenario.engine.batched and len(self.nodes) > 1
        self.pool = LearnerPool(sim.node.learner for sim in self.nodes) if batched else None
        self.eval_points: Callable[[], list[EvalPoint]] | None = None  # the evaluator reads self.nodes

    def run(self, observers: Sequence[RoundObserver]) -> None:
        trio.run(_simulate, self.scenario, self.nodes, observers, self.pool)

    def attack_stats(self) -> dict[str, int]:
        return attack_stats(self.nodes)

    def wire_stats(self) -> dict[str, Any]:
        return wire_stats(self.nodes)

    def info(self) -> dict[str, Any]:
        return {"name": "inprocess", "batched": self.pool.stats.as_dict() if self.pool is not None else None}

    def close(self) -> None:
        pass


def run_simulation(scenario: Scenario, out_dir: Path, on_round: RoundCallback | None = None) -> dict[str, Any]:
    """Run ``scenario`` and write its results to ``out_dir``; returns the summary. A ``[federated]``
    scenario runs in :func:`dgrpo.simulations.federated.run_federated`; ``engine.name = "ray"`` on Ray actors
    (:mod:`dgrpo.simulations.ray_engine`)."""
    if scenario.federated is not None:
        return run_federated(scenario, out_dir, on_round)
    t0 = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    if scenario.torch_threads:
        torch.set_num_threads(scenario.torch_threads)
    engine: InProcessEngine | RayEngine
    if scenario.engine.name == "ray":
        from dgrpo.simulations.ray_engine import RayEngine  # the optional `ray` extra

        engine = RayEngine(scenario)
        task = get_task(scenario.task.name, **scenario.task.options)
    else:
        engine = InProcessEngine(scenario)
        task = engine.nodes[0].node.task
    try:
        evaluator = build_evaluator(scenario, task, engine.nodes, engine.eval_points)
        # Measured with an attacker even without a chain: the admit stage's plan binding stops poison too.
        meter = DefenseMeter() if scenario.defense.chain or scenario.nodes.malicious else None
        rows = RoundRows(meter, evaluator, on_round)
        evaluator.start()
        engine.run([evaluator, *([meter] if meter else []), rows])
        attacks, wire, engine_info = engine.attack_stats(), engine.wire_stats(), engine.info()
    finally:
        engine.close()
    models = {f"node-{i}": scenario.node_model(i).name for i in range(scenario.nodes.count)}
    defense_summary = meter.summary(scenario.defense.chain, models) if meter is not None else None
    with (out_dir / "metrics.jsonl").open("w") as f:
        for row in rows.rows:
            f.write(json.dumps(row) + "\n")
    evals = evaluator.points
    accuracy = [(r, e.accuracy) for r, e in evals]
    asr = [[r, e.asr] for r, e in evals if e.asr is not None]
    metric = evaluator.detector.metric if evaluator.detector is not None else None
    summary: dict[str, Any] = {
        "scenario": scenario.name,
        "task": scenario.task.name,
        "model": scenario.model.name if scenario.nodes.mode == "homogeneous" else list(scenario.nodes.models),
        "nodes": scenario.nodes.count,
        "mode": scenario.nodes.mode,
        "split": scenario.rollout.split,
        "rounds": scenario.rounds,
        "initial_accuracy": accuracy[0][1],
        "final_accuracy": accuracy[-1][1],
        "accuracy": [list(a) for a in accuracy],
        "final_honest_reward": rows.rows[-1]["honest_mean_reward"] if rows.rows else None,
        "attack": scenario.adversary.name if scenario.adversary is not None else None,
        "malicious": scenario.nodes.malicious,
        "attacker_share": rows.attacker_share() if scenario.nodes.malicious else None,
        "fair_share": scenario.nodes.malicious / scenario.nodes.count,
        "asr_metric": metric,
        "asr": asr,
        "final_asr": asr[-1][1] if asr else None,
        "honest_final_accuracy": accuracy[-1][1],
        "mean_length": [[r, e.mean_length] for r, e in evals],
        "final_mean_length": evals[-1][1].mean_length,
        "attack_stats": attacks,
        "defense": defense_summary,
        "wire": wire,
        "wall_seconds": time.perf_counter() - t0,
        "engine": engine_info,
        "training_reward_seconds": sum(r["reward_seconds"] for r in rows.rows),  # every node's scoring, summed
        "scenario_config": scenario.model_dump(mode="json"),
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    title = f"{scenario.name}: {scenario.task.name}"
    plot_curves(rows.rows, accuracy, out_dir / "curves.png", title=title)
    if asr:
        plot_asr(asr, accuracy, out_dir / "asr.png", metric=metric or "asr", title=title)
    return summary
