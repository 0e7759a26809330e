"""``dgrpo sweep``: scenarios (attacks) x defense chains x seeds, run in this process or fanned out as Ray
tasks, collected into one table (issue 27).

A cell is one simulation: a scenario with ``defense.chain`` set and, for seed ``k`` > 0, ``run_id`` suffixed
``-s<k>`` and ``learner.seed = k`` (the run id is part of every seed of a run: prompts, sampling, keys), so
seed 0 is the scenario as shipped. Cells run one after another here (``engine = "inprocess"``), or each as a
Ray task on a local or existing Ray cluster (``engine = "ray"``; every cell itself runs the in-process engine,
batched). Either way the driver writes each cell's ``summary.json`` and ``metrics.jsonl`` under
``out/<scenario>/<defense>/seed<k>/`` and then ``sweep.csv`` and ``sweep.json`` (one row per cell),
``sweep.md`` (mean and standard error over seeds per scenario and defense) and ``sweep.png``.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dgrpo.simulations.report import table_rows
from dgrpo.simulations.scenario import Scenario, load_scenario

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Cell:
    scenario: str  # as given: a shipped name, a file, or "default"
    defense: tuple[str, ...]
    seed: int

    @property
    def defense_label(self) -> str:
        return "+".join(self.defense) or "none"

    @property
    def folder(self) -> str:
        return f"{Path(self.scenario).stem}/{self.defense_label}/seed{self.seed}"


def parse_chain(text: str) -> tuple[str, ...]:
    """``"none"`` or ``""``: no defense; otherwise names joined by ``,`` or ``+``."""
    names = [n.strip() for n in text.replace("+", ",").split(",") if n.strip()]
    return () if names in ([], ["none"]) else tuple(names)


def cells_of(scenarios: Sequence[str], defenses: Sequence[str], seeds: int) -> list[Cell]:
    return [Cell(s, parse_chain(d), k) for s in scenarios for d in defenses for k in range(seeds)]


def cell_scenario(cell: Cell, overrides: Sequence[str]) -> Scenario:
    """The cell's scenario (an invalid combination raises the scenario's own error, before anything runs)."""
    path = None if cell.scenario == "default" else Path(cell.scenario)
    base = load_scenario(path, list(overrides))
    mine = [f"defense.chain={json.dumps(list(cell.defense))}"]
    if cell.seed:
        mine += [f"run_id={base.run_id}-s{cell.seed}", f"learner.seed={cell.seed}"]
    return load_scenario(path, [*overrides, *mine])


def run_cell(scenario: Scenario, out: str) -> tuple[dict[str, Any], str]:
    """One cell, in this process (a Ray task's body as well): its summary and its ``metrics.jsonl``."""
    from dgrpo.simulations.runner import run_simulation

    folder = Path(out)
    here = scenario.model_copy(update={"engine": scenario.engine.model_copy(update={"name": "inprocess"})})
    summary = run_simulation(here, folder)
    return summary, (folder / "metrics.jsonl").read_text()


def run_sweep(
    scenarios: Sequence[str],
    defenses: Sequence[str],
    seeds: int,
    out: Path,
    overrides: Sequence[str] = (),
    engine: str = "inprocess",
    address: str | None = None,
    cpus_per_cell: float = 1.0,
    progress: Progress = print,
) -> list[dict[str, Any]]:
    """Run every cell and write the tables; returns one row per cell."""
    cells = cells_of(scenarios, defenses, seeds)
    built = [(c, cell_scenario(c, overrides)) for c in cells]  # every cell checked before the first runs
    out.mkdir(parents=True, exist_ok=True)
    results: dict[Cell, dict[str, Any]] = {}

    def keep(cell: Cell, summary: dict[str, Any], metrics: str) -> None:
        folder = out / cell.folder
        folder.mkdir(parents=True, exist_ok=True)  # a remote worker wrote its own copy on its own machine
        (folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        (folder / "metrics.jsonl").write_text(metrics)
        summary["_dir"] = str(folder)
        results[cell] = summary
        progress(f"[{len(results)}/{len(cells)}] {cell.folder}: {_brief(summary)}")

    if engine == "ray":
        _run_on_ray(built, out, address, cpus_per_cell, keep)
    else:
        for cell, scenario in built:
            summary, metrics = run_cell(scenario, str(out / cell.folder))
            keep(cell, summary, metrics)
    rows = []
    for cell in cells:
        (row,) = table_rows([results[cell]])
        rows.append({"scenario": Path(cell.scenario).stem, "defense": cell.defense_label, "seed": cell.seed, **row})
    write_tables(rows, out)
    return rows


def _run_on_ray(
    built: Sequence[tuple[Cell, Scenario]],
    out: Path,
    address: str | None,
    cpus_per_cell: float,
    keep: Callable[[Cell, dict[str, Any], str], None],
) -> None:
    import ray

    started = False
    if not ray.is_initialized():
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
        ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
        started = True
    try:
        task = ray.remote(num_cpus=cpus_per_cell)(run_cell)
        pending = {task.remote(scenario, str(out / cell.folder)): cell for cell, scenario in built}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                summary, metrics = ray.get(ref)
                keep(pending.pop(ref), summary, metrics)
    finally:
        if started:
            ray.shutdown()


def _brief(summary: dict[str, Any]) -> str:
    parts = [f"accuracy {summary['final_accuracy']:.3f}"]
    if summary.get("final_asr") is not None:
        parts.append(f"{summary.get('asr_metric') or 'asr'} {summary['final_asr']:.3f}")
    defense = summary.get("defense") or {}
    if defense.get("stop_rate") is not None:
        parts.append(f"stop {defense['stop_rate']:.3f}")
    if defense.get("false_positive_rate") is not None:
        parts.append(f"FPR {defense['false_positive_rate']:.3f}")
    return ", ".join(parts)


MEASURES = ("honest_final_accuracy", "final_asr", "stop_rate", "false_positive_rate", "attacker_share")


def aggregate(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and standard error over seeds, per scenario and defense (None where a measure does not apply)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["scenario"], r["defense"]), []).append(r)
    out = []
    for (scenario, defense), members in groups.items():
        entry: dict[str, Any] = {"scenario": scenario, "defense": defense, "seeds": len(members)}
        for m in MEASURES:
            values = [float(r[m]) for r in members if r.get(m) is not None]
            mean = sum(values) / len(values) if values else None
            se = (
                math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values))
                if mean is not None and len(values) > 1
                else None
            )
            entry[m], entry[f"{m}_se"] = mean, se
        out.append(entry)
    return out


def write_tables(rows: Sequence[dict[str, Any]], out: Path) -> None:
    (out / "sweep.json").write_text(json.dumps({"cells": list(rows), "table": aggregate(rows)}, indent=2) + "\n")
    with (out / "sweep.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    table = aggregate(rows)
    lines = [
        "| scenario | defense | seeds | " + " | ".join(MEASURES) + " |",
        "| --- | --- | --- | " + " | ".join("---" for _ in MEASURES) + " |",
    ]
    for e in table:
        cells = []
        for m in MEASURES:
            mean, se = e[m], e[f"{m}_se"]
            cells.append("-" if mean is None else f"{mean:.3f}" + ("" if se is None else f" ± {se:.3f}"))
        lines.append(f"| {e['scenario']} | {e['defense']} | {e['seeds']} | " + " | ".join(cells) + " |")
    (out / "sweep.md").write_text("\n".join(lines) + "\n")
    _plot(table, out / "sweep.png")


def _plot(table: Sequence[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 0.45 * len(table) + 1.8), sharey=True)
    names = [f"{e['scenario']} / {e['defense']}" for e in table][::-1]
    for ax, measure, title in zip(
        axes, ("honest_final_accuracy", "final_asr"), ("honest final accuracy", "final ASR (or length)"), strict=True
    ):
        values = [e[measure] if e[measure] is not None else 0.0 for e in table][::-1]
        errors = [e[f"{measure}_se"] or 0.0 for e in table][::-1]
        ax.barh(names, values, xerr=errors, color="#4c72b0" if measure == "honest_final_accuracy" else "#c44e52")
        ax.set_title(title)
    fig.suptitle("dgrpo sweep: mean over seeds, ± standard error")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
