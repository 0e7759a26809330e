"""The ``ServerApp``: runs :class:`dgrpo.flower.strategy.FedGRPO` for the scenario's rounds and measures the
global model's held-out accuracy on the server, as dgrpo's simulation does (every ``eval.every`` rounds and
at the end, on the task's evaluation prompts, with the evaluation seed).

Run configuration (``flwr run ... --run-config``): ``scenario`` (a shipped scenario's name or a TOML file),
``overrides`` (``key=value`` separated by ``;``), ``out`` (a folder: the run's ``metrics.jsonl``, one row per
round as it ends, and ``summary.json`` in the simulation's format, plus Flower's overhead per round),
``timeout`` (seconds to wait for the clients of a round).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

from dgrpo.federated.params import assign_parameters, flat_parameters
from dgrpo.flower.config import scenario_of
from dgrpo.flower.records import weights_of, weights_record
from dgrpo.flower.strategy import FedGRPO
from dgrpo.learner.learner import Learner
from dgrpo.simulations.federated import accuracy, federated_run_summary, federated_summary
from dgrpo.tasks import get_task

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    t0 = time.perf_counter()
    config = context.run_config
    scenario = scenario_of(config)
    fed = scenario.federated
    assert fed is not None
    if scenario.torch_threads:
        torch.set_num_threads(scenario.torch_threads)
    out = Path(str(config.get("out", ""))) if config.get("out") else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    task = get_task(scenario.task.name, **scenario.task.options)
    learner = Learner(scenario.model, scenario.learner, scenario.lr_rounds())
    eval_prompts = task.eval_prompts(scenario.eval.prompts)
    initial = flat_parameters(learner.model)
    rows: list[dict[str, Any]] = []
    points: list[list[float]] = []

    def on_round(row: dict[str, Any]) -> None:
        rows.append(row)

    def evaluate(round_idx: int, arrays: ArrayRecord) -> MetricRecord | None:
        """Called after every round (and before the first): held-out accuracy where the scenario asks for it,
        and the round's row out as progress."""
        metrics = None
        if round_idx == 0 or round_idx % scenario.eval.every == 0 or round_idx == scenario.rounds:
            assign_parameters(learner.model, weights_of(arrays))
            value = accuracy(learner, task, eval_prompts, scenario)
            points.append([round_idx, value])
            metrics = MetricRecord({"accuracy": value})
            if rows and rows[-1]["round"] == round_idx:
                rows[-1]["accuracy"] = value
        if out is not None and rows and rows[-1]["round"] == round_idx:
            with (out / "metrics.jsonl").open("a") as f:
                f.write(json.dumps(rows[-1]) + "\n")
        return metrics

    timeout = float(config.get("timeout", 600))
    strategy = FedGRPO(fed, initial, timeout=timeout, on_round=on_round)
    result = strategy.start(
        grid=grid, initial_arrays=weights_record(initial), num_rounds=scenario.rounds, timeout=timeout,
        evaluate_fn=evaluate,
    )  # fmt: skip
    final = weights_of(result.arrays) if len(result.arrays) else initial
    wall = time.perf_counter() - t0
    summary = federated_run_summary(
        scenario,
        points,
        federated_summary(fed, strategy.size, rows, points, final, fed.attack is not None),
        scenario.rounds,  # start() returns after every round (one no client answered has no row)
        engine="flower",
        flower={
            "round_seconds": [r["seconds"] for r in rows],  # configure_train to aggregate_train, clients included
            "rejected": [{"node": n, "reason": why, "count": c} for (n, why), c in strategy.rejected.items()],
            "client_weights": [r["weights"] for r in rows],
            "client_signal": [r["client_signal"] for r in rows],
        },
        wall_seconds=wall,
    )
    if out is not None:
        summary.write(out)
