"""``dgrpo sweep``: run a study's cells (:mod:`dgrpo.simulations.study`) and make its tables.

Cells run one after another in this process, ``jobs`` at a time in worker processes, or each as a Ray task on a
local or existing Ray cluster (every cell itself runs the in-process engine). Each writes its run folder,
``OUT/<cell>/seed<k>/``, as ``dgrpo simulate`` would.

A sweep started again into the same folder continues: a cell whose run finished is skipped (its
configuration must be the one the study now asks for: another is refused, never mixed into a table), a cell
that was interrupted resumes from its last saved round (:func:`dgrpo.simulations.runner.resume_simulation`),
the others run. Ctrl-C or SIGTERM stops every running cell after its round in progress and the sweep says
how to continue. Then the tables (:mod:`dgrpo.simulations.study_tables`) are made from every finished run.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import re
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dgrpo.errors import ConfigError
from dgrpo.simulations.run_folder import RunFolder
from dgrpo.simulations.scenario import Scenario, load_scenario
from dgrpo.simulations.stopping import StopRequest, stop_on_signals
from dgrpo.simulations.study import Cell, Study, StudySpec
from dgrpo.simulations.study_tables import write_tables
from dgrpo.simulations.summary import RunSummary, has_summary, load_summary

Progress = Callable[[str], None]
STUDY_COPY = "study.toml"  # the study file a sweep folder was made with (for people)
STUDY_SPEC = "study.json"  # the study itself, as ``dgrpo report`` reads it again


@dataclass(frozen=True)
class SweepResult:
    ran: int
    skipped: int
    complete: bool  # every cell finished (False: stopped; run the sweep again to continue)
    tables: str  # tables.md


def cell_scenario(cell: Cell) -> Scenario:
    """The cell's scenario (an invalid combination raises the scenario's own error, before anything runs)."""
    path = None if cell.scenario in (None, "default") else Path(cell.scenario)
    base = load_scenario(path, list(cell.overrides))
    mine = [f"learner.seed={cell.seed}", f"run_id={base.run_id}-s{cell.seed}"] if cell.seed else []
    return load_scenario(path, [*cell.overrides, *mine])


def saved_study(out: Path) -> Study | None:
    """The study a sweep into ``out`` ran (None where ``out`` is no sweep's folder)."""
    path = out / STUDY_SPEC
    if not path.is_file():
        return None
    try:
        return Study(StudySpec.model_validate_json(path.read_text()), "")
    except ValueError as exc:
        raise ConfigError(f"{path}: not a study ({exc})") from None


def _state(out: Path, cell: Cell, scenario: Scenario) -> str:
    """``done``, ``resume`` or ``run``; a finished run of another configuration is refused."""
    folder = RunFolder(out / cell.folder)
    if has_summary(folder.path):
        summary = load_summary(folder.path)
        if summary.scenario_config != scenario.model_dump(mode="json"):
            raise ConfigError(
                f"{folder.path} holds a run of another configuration than the study's cell {cell.name} (seed "
                f"{cell.seed}); the study changed: sweep into another --out, or remove that folder"
            )
        if summary.complete:
            return "done"
    return "resume" if folder.resumable() else "run"


def run_cell(scenario: Scenario, out: str, how: str, stop: StopRequest | None = None) -> RunSummary:
    """One cell, in this process (a worker's or a Ray task's body as well)."""
    from dgrpo.simulations.runner import resume_simulation, run_simulation

    if how == "resume":
        return resume_simulation(Path(out), stop=stop)
    here = scenario.model_copy(update={"engine": scenario.engine.model_copy(update={"name": "inprocess"})})
    return run_simulation(here, Path(out), overwrite=True, stop=stop)


def _worker_cell(scenario: Scenario, out: str, how: str) -> RunSummary:
    """A worker process's cell: a signal (the terminal's Ctrl-C reaches the whole group) stops it after the
    round in progress, saved, as in the parent."""
    stop = StopRequest()
    with stop_on_signals(stop):
        return run_cell(scenario, out, how, stop)


def run_study(
    study: Study,
    out: Path,
    extra: Sequence[str] = (),
    *,
    only: str | None = None,
    jobs: int = 1,
    engine: str = "inprocess",
    address: str | None = None,
    cpus_per_cell: float = 1.0,
    progress: Progress = print,
    stop: StopRequest | None = None,
) -> SweepResult:
    """Run the cells of ``study`` not finished in ``out`` (``only``: those whose ``<cell>/seed<k>`` matches
    this regular expression), then write its tables."""
    cells = study.cells(tuple(extra))
    if only is not None:
        try:
            pattern = re.compile(only)
        except re.error as exc:
            raise ConfigError(f"--only {only!r}: not a regular expression ({exc})") from None
        cells = [c for c in cells if pattern.search(c.folder)]
        if not cells:
            raise ConfigError(f"--only {only!r} matches no cell of study {study.name}")
    built = [(c, cell_scenario(c)) for c in cells]  # every cell checked before the first runs
    out.mkdir(parents=True, exist_ok=True)
    if study.source:
        (out / STUDY_COPY).write_text(study.source)
    (out / STUDY_SPEC).write_text(study.spec.model_dump_json(indent=2) + "\n")
    todo = []
    for cell, scenario in built:
        how = _state(out, cell, scenario)
        if how == "done":
            progress(f"{cell.folder}: done already")
        else:
            todo.append((cell, scenario, how))
    stop = stop or StopRequest()
    finished: list[RunSummary] = []

    def keep(cell: Cell, summary: RunSummary) -> None:
        finished.append(summary)
        state = "" if summary.complete else f" (stopped after round {summary.rounds_done})"
        progress(f"[{len(finished)}/{len(todo)}] {cell.folder}: {_brief(summary)}{state}")

    if engine == "ray":
        _run_on_ray(todo, out, address, cpus_per_cell, keep)
    elif jobs > 1:
        _run_in_workers(todo, out, jobs, keep, stop, progress)
    else:
        for cell, scenario, how in todo:
            if stop.requested:
                break
            progress(f"{cell.folder}: {'resuming' if how == 'resume' else 'running'}")
            keep(cell, run_cell(scenario, str(out / cell.folder), how, stop))
    complete = len(finished) == len(todo) and all(s.complete for s in finished)
    return SweepResult(len(finished), len(built) - len(todo), complete, write_tables(study, out))


def _run_in_workers(
    todo: Sequence[tuple[Cell, Scenario, str]],
    out: Path,
    jobs: int,
    keep: Callable[[Cell, RunSummary], None],
    stop: StopRequest,
    progress: Progress,
) -> None:
    """``jobs`` cells at a time, each in a fresh worker process (spawned: torch and threads start clean)."""
    pending = list(todo)
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        running: dict[Future[RunSummary], Cell] = {}
        while pending or running:
            while pending and len(running) < jobs and not stop.requested:
                cell, scenario, how = pending.pop(0)
                progress(f"{cell.folder}: {'resuming' if how == 'resume' else 'running'}")
                running[pool.submit(_worker_cell, scenario, str(out / cell.folder), how)] = cell
            if not running:
                break
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                keep(running.pop(future), future.result())


def _run_on_ray(
    todo: Sequence[tuple[Cell, Scenario, str]],
    out: Path,
    address: str | None,
    cpus_per_cell: float,
    keep: Callable[[Cell, RunSummary], None],
) -> None:
    import ray

    started = False
    if not ray.is_initialized():
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
        ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
        started = True
    try:
        task = ray.remote(num_cpus=cpus_per_cell)(_ray_cell)
        pending = {task.remote(scenario, str(out / cell.folder), how): cell for cell, scenario, how in todo}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                cell = pending.pop(ref)
                summary, files = ray.get(ref)
                folder = out / cell.folder  # a remote worker wrote its own copy on its own machine
                folder.mkdir(parents=True, exist_ok=True)
                for name, text in files.items():
                    (folder / name).write_text(text)
                keep(cell, summary)
    finally:
        if started:
            ray.shutdown()


def _ray_cell(scenario: Scenario, out: str, how: str) -> tuple[RunSummary, dict[str, Any]]:
    summary = run_cell(scenario, out, how)
    folder = RunFolder(Path(out))
    return summary, {"summary.json": folder.summary.read_text(), "metrics.jsonl": folder.metrics.read_text()}


def _brief(summary: RunSummary) -> str:
    parts = [f"accuracy {summary.honest_accuracy:.3f}"]
    if summary.final_asr is not None:
        parts.append(f"{'mean length' if summary.length_metric else 'ASR'} {summary.final_asr:.3f}")
    if summary.stop_rate is not None:
        parts.append(f"stop {summary.stop_rate:.3f}")
    if summary.false_positive_rate is not None:
        parts.append(f"FPR {summary.false_positive_rate:.3f}")
    return ", ".join(parts)
