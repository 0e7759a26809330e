"""Run a scenario: N nodes in one process, joined by the in-memory network over the real wire format (signed
envelopes, each receiver's validator and replay window), each running the daemon's round
(:func:`dgrpo.round.run.run_round`'s three phases, each for every node at once: :mod:`dgrpo.simulations.phased`)
every round; the outcomes go to the same observer interface as a daemon's. Engines: ``docs/simulations.md``.

Outputs (:mod:`dgrpo.simulations.run_folder`): ``metrics.jsonl`` (a row appended as each round ends),
``summary.json`` (:class:`~dgrpo.simulations.summary.RunSummary`) and plots; between rounds, the snapshot that
:func:`resume_simulation` continues from (:mod:`dgrpo.simulations.snapshot`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import trio

from dgrpo.errors import ConfigError
from dgrpo.round.observer import RoundObserver, notify
from dgrpo.round.tensorboard import TensorBoardObserver
from dgrpo.simulations import snapshot
from dgrpo.simulations.defense_metrics import DefenseMeter
from dgrpo.simulations.evaluation import EvalPoint, Evaluator
from dgrpo.simulations.federated import run_federated
from dgrpo.simulations.nodes import attack_stats, build_evaluator, build_nodes, wire_stats
from dgrpo.simulations.phased import phased_round
from dgrpo.simulations.plots import plot_asr, plot_curves
from dgrpo.simulations.pool import LearnerPool
from dgrpo.simulations.round_rows import RoundRows, eval_fields
from dgrpo.simulations.run_folder import RunFolder, prepare
from dgrpo.simulations.scenario import Scenario
from dgrpo.simulations.sim_node import SimNode
from dgrpo.simulations.stopping import StopRequest
from dgrpo.simulations.summary import SUMMARY_FORMAT, DefenseSummary, RunSummary
from dgrpo.tasks import get_task

if TYPE_CHECKING:
    from dgrpo.simulations.ray_engine import RayEngine

RoundCallback = Callable[[dict[str, Any]], None]


Between = Callable[[int], bool]  # called after each round; True: stop the run there


async def _simulate(
    scenario: Scenario,
    nodes: list[SimNode],
    rounds: range,
    observers: Sequence[RoundObserver],
    between: Between,
    pool: LearnerPool | None = None,
) -> None:
    limiter = trio.CapacityLimiter(1)  # one torch job at a time: reproducible, and no core contention
    async with trio.open_nursery() as pumps:
        for sim in nodes:
            pumps.start_soon(sim.inbox.pump, sim.transport.inbound())
        for round_idx in rounds:
            # the daemon's round (run_round), phase by phase for every node at once; without a pool, the
            # nodes' torch work one job at a time
            done = await phased_round(
                nodes, round_idx, scenario.round.deadline_seconds, pool, None if pool is not None else limiter
            )
            await trio.to_thread.run_sync(notify, observers, round_idx, done, limiter=limiter)
            if await trio.to_thread.run_sync(between, round_idx, limiter=limiter):
                break
        pumps.cancel_scope.cancel()


class InProcessEngine:
    """Every node in this process (``engine.name = "inprocess"``, the default), batched where
    ``engine.batched`` allows (:mod:`dgrpo.simulations.pool`). ``nodes`` and ``pool``: a resumed run's, from
    its snapshot."""

    name = "inprocess"

    def __init__(self, scenario: Scenario, nodes: list[SimNode] | None = None, pool: LearnerPool | None = None) -> None:
        self.scenario = scenario
        self.nodes = nodes if nodes is not None else build_nodes(scenario)
        batched = scenario.engine.batched and len(self.nodes) > 1
        if nodes is None:
            pool = LearnerPool(sim.node.learner for sim in self.nodes) if batched else None
        self.pool = pool
        self.eval_points: Callable[[], list[EvalPoint]] | None = None  # the evaluator reads self.nodes

    def run(self, observers: Sequence[RoundObserver], rounds: range, between: Between) -> None:
        trio.run(_simulate, self.scenario, self.nodes, rounds, observers, between, self.pool)

    def attack_stats(self) -> dict[str, int]:
        return attack_stats(self.nodes)

    def wire_stats(self) -> dict[str, Any]:
        return wire_stats(self.nodes)

    def info(self) -> dict[str, Any]:
        return {"name": "inprocess", "batched": self.pool.stats.as_dict() if self.pool is not None else None}

    def close(self) -> None:
        pass


@dataclass
class _Tallies:
    """What a simulation carries from round to round besides its nodes (all of it in the snapshot)."""

    evaluator: Evaluator
    meter: DefenseMeter | None
    rows: RoundRows
    rounds_done: int = 0
    wall_seconds: float = 0.0  # of the run's earlier sessions


def run_simulation(
    scenario: Scenario,
    out_dir: Path,
    on_round: RoundCallback | None = None,
    *,
    overwrite: bool = False,
    stop: StopRequest | None = None,
    observers: Sequence[RoundObserver] = (),
) -> RunSummary:
    """Run ``scenario`` and write its results to ``out_dir`` (refused where a run is there already, unless
    ``overwrite``); returns the summary. A ``[federated]`` scenario runs in
    :func:`dgrpo.simulations.federated.run_federated`; ``engine.name = "ray"`` on Ray actors
    (:mod:`dgrpo.simulations.ray_engine`). ``stop``: set (e.g. by a signal) to stop after the round in
    progress, with everything saved for :func:`resume_simulation`."""
    folder = prepare(out_dir, overwrite=overwrite)
    if scenario.federated is not None:
        return run_federated(scenario, folder, on_round, stop=stop)
    return _run(scenario, folder, None, on_round, stop, observers)


def resume_simulation(
    out_dir: Path,
    on_round: RoundCallback | None = None,
    *,
    stop: StopRequest | None = None,
    observers: Sequence[RoundObserver] = (),
) -> RunSummary:
    """Continue the interrupted run in ``out_dir`` from its last saved round, with the same results as a run
    that was never interrupted (models, optimizers, adversaries' and defenses' memory, RNGs: the snapshot)."""
    folder = prepare(out_dir, resume=True)
    saved = snapshot.load(folder.snapshot)
    scenario: Scenario = saved["scenario"]
    if scenario.federated is not None:
        return run_federated(scenario, folder, on_round, stop=stop, saved=saved)
    return _run(scenario, folder, saved, on_round, stop, observers)


def _run(
    scenario: Scenario,
    folder: RunFolder,
    saved: dict[str, Any] | None,
    on_round: RoundCallback | None,
    stop: StopRequest | None,
    observers: Sequence[RoundObserver],
) -> RunSummary:
    t0 = time.perf_counter()
    if scenario.torch_threads:
        torch.set_num_threads(scenario.torch_threads)
    engine: InProcessEngine | RayEngine
    if scenario.engine.name == "ray":
        if saved is not None:
            raise ConfigError("a run on Ray cannot be resumed (its nodes' state lives in the actors); rerun it")
        from dgrpo.simulations.ray_engine import RayEngine  # the optional `ray` extra

        engine = RayEngine(scenario)
        task = get_task(scenario.task.name, **scenario.task.options)
    elif saved is not None:
        engine = InProcessEngine(scenario, saved["nodes"], saved["pool"])
        task = engine.nodes[0].node.task
    else:
        engine = InProcessEngine(scenario)
        task = engine.nodes[0].node.task
    board: TensorBoardObserver | None = None
    try:
        if saved is not None:
            tallies: _Tallies = saved["tallies"]
            folder.rewrite_rows(tallies.rows.rows)
        else:
            evaluator = build_evaluator(scenario, task, engine.nodes, engine.eval_points)
            # Measured with an attacker even without a chain: the admit stage's plan binding stops poison too.
            meter = DefenseMeter() if scenario.defense.chain or scenario.nodes.malicious else None
            tallies = _Tallies(evaluator, meter, RoundRows(meter, evaluator))
            evaluator.start()
        if scenario.logging.tensorboard is not None:  # after the rows: it writes the round's row under run/
            purge = tallies.rounds_done + 1 if saved is not None else None
            board = TensorBoardObserver(scenario.logging.tensorboard, rows=tallies.rows.rows, purge_step=purge)
            observers = [*observers, board]
            if saved is None:
                board.log_row(0, eval_fields(tallies.evaluator.points[0][1]))
        watchers = [tallies.evaluator, *([tallies.meter] if tallies.meter else []), tallies.rows, *observers]
        every = scenario.checkpoint_every

        def between(round_idx: int) -> bool:
            row = tallies.rows.rows[-1]
            folder.append_row(row)
            tallies.rounds_done = round_idx
            if on_round is not None:
                on_round(row)
            stopping = stop is not None and stop.requested
            due = stopping or (every and round_idx % every == 0)
            if every and due and isinstance(engine, InProcessEngine) and round_idx < scenario.rounds:
                _save(folder, engine, tallies, t0)
            return stopping

        rounds = range(tallies.rounds_done + 1, scenario.rounds + 1)
        engine.run(watchers, rounds, between)
        attacks, wire, engine_info = engine.attack_stats(), engine.wire_stats(), engine.info()
    finally:
        engine.close()
        if board is not None:
            board.close()
    summary = _summary(scenario, tallies, attacks, wire, engine_info, tallies.wall_seconds + time.perf_counter() - t0)
    summary.write(folder.path)
    if summary.complete:
        folder.drop_state()
    _plots(scenario, tallies, folder.path)
    return summary


def _save(folder: RunFolder, engine: InProcessEngine, tallies: _Tallies, t0: float) -> None:
    wall = tallies.wall_seconds
    tallies.wall_seconds = wall + time.perf_counter() - t0  # as saved: the time up to this round
    try:
        state = {"scenario": engine.scenario, "nodes": engine.nodes, "pool": engine.pool, "tallies": tallies}
        snapshot.save(folder.snapshot, state)
    finally:
        tallies.wall_seconds = wall


def _summary(
    scenario: Scenario,
    tallies: _Tallies,
    attacks: dict[str, int],
    wire: dict[str, Any],
    engine_info: dict[str, Any],
    wall_seconds: float,
) -> RunSummary:
    rows, evaluator, meter = tallies.rows, tallies.evaluator, tallies.meter
    models = {f"node-{i}": scenario.node_model(i).name for i in range(scenario.nodes.count)}
    evals = evaluator.points
    accuracy = [(float(r), e.accuracy) for r, e in evals]
    asr = [(float(r), e.asr) for r, e in evals if e.asr is not None]
    done = tallies.rounds_done
    return RunSummary(
        format=SUMMARY_FORMAT,
        scenario=scenario.name,
        task=scenario.task.name,
        model=scenario.model.name if scenario.nodes.mode == "homogeneous" else list(scenario.nodes.models),
        nodes=scenario.nodes.count,
        mode=scenario.nodes.mode,
        split=scenario.rollout.split,
        rounds=scenario.rounds,
        rounds_done=done,
        complete=done >= scenario.rounds,
        initial_accuracy=accuracy[0][1],
        final_accuracy=accuracy[-1][1],
        accuracy=accuracy,
        final_honest_reward=rows.rows[-1]["honest_mean_reward"] if rows.rows else None,
        attack=scenario.adversary.name if scenario.adversary is not None else None,
        malicious=scenario.nodes.malicious,
        attacker_share=rows.attacker_share() if scenario.nodes.malicious else None,
        fair_share=scenario.nodes.malicious / scenario.nodes.count,
        asr_metric=evaluator.detector.metric if evaluator.detector is not None else None,
        asr=asr,
        final_asr=asr[-1][1] if asr else None,
        honest_final_accuracy=accuracy[-1][1],
        mean_length=[(float(r), e.mean_length) for r, e in evals],
        final_mean_length=evals[-1][1].mean_length,
        attack_stats=attacks,
        defense=DefenseSummary(**meter.summary(scenario.defense.chain, models)) if meter is not None else None,
        wire=wire,
        wall_seconds=wall_seconds,
        engine=engine_info,
        training_reward_seconds=sum(r["reward_seconds"] for r in rows.rows),  # every node's scoring, summed
        scenario_config=scenario.model_dump(mode="json"),
    )


def _plots(scenario: Scenario, tallies: _Tallies, out: Path) -> None:
    evals = tallies.evaluator.points
    accuracy = [(r, e.accuracy) for r, e in evals]
    asr = [[r, e.asr] for r, e in evals if e.asr is not None]
    title = f"{scenario.name}: {scenario.task.name}"
    plot_curves(tallies.rows.rows, accuracy, out / "curves.png", title=title)
    if asr:
        metric = tallies.evaluator.detector.metric if tallies.evaluator.detector is not None else None
        plot_asr(asr, accuracy, out / "asr.png", metric=metric or "asr", title=title)
