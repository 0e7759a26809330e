"""What ``dgrpo report`` compares: the runs under the folders it is given, each with a label and a group.

A folder may be one run (it holds ``summary.json``), a testnet's output (``node-<i>/rounds.jsonl``, read as one
run by :mod:`dgrpo.simulations.testnet_run`), or a sweep's or a study's output (runs below it, at any
depth: ``<scenario>/<defense>/seed<k>/`` for ``dgrpo sweep``, ``<cell>/seed<k>/`` for a study). A run's
label is its path below the folder given (its folder name for a single run), made unique where two runs
given separately share a name; its group is the label without a trailing ``seed<k>`` part, so that the seeds
of one cell are drawn and tabled together (mean and spread).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dgrpo.errors import ConfigError
from dgrpo.simulations.summary import SUMMARY_FILE, RunSummary, load_summary
from dgrpo.simulations.testnet_run import is_testnet, summarise_testnet

_SEED = re.compile(r"^seed(\d+)$")


@dataclass(frozen=True)
class ReportRun:
    label: str
    folder: Path
    summary: RunSummary
    group: str
    seed: int | None = None


def runs_under(root: Path) -> list[Path]:
    """The run folders at or below ``root``, in path order (a run's own folders are not searched)."""
    if (root / SUMMARY_FILE).is_file():
        return [root]
    found = sorted(p.parent for p in root.rglob(SUMMARY_FILE))
    return [p for p in found if not any(q != p and q in p.parents for q in found)]


def _split_seed(parts: tuple[str, ...]) -> tuple[str, int | None]:
    if parts and (m := _SEED.match(parts[-1])):
        return "/".join(parts[:-1]) or parts[-1], int(m.group(1))
    return "/".join(parts), None


def collect(paths: Sequence[Path]) -> list[ReportRun]:
    """Every run under ``paths`` (see the module docstring); a path with no run is an error naming it."""
    if not paths:
        raise ConfigError("report: give at least one run, sweep or study folder")
    found: list[tuple[Path, Path]] = []  # (root given, run folder)
    for path in paths:
        if path.is_file() and path.name == SUMMARY_FILE:
            path = path.parent
        if not path.exists():
            raise ConfigError(f"report: {path} does not exist")
        runs = [path] if is_testnet(path) else runs_under(path)  # a testnet's folder is one run
        if not runs:
            raise ConfigError(
                f"report: no run under {path} (a run folder holds summary.json; `dgrpo simulate`, `dgrpo sweep` "
                "and `dgrpo testnet up` write them)"
            )
        found += [(path, run) for run in runs]
    labelled: list[ReportRun] = []
    for root, run in found:
        parts = run.relative_to(root).parts if run != root else (run.name,)
        group, seed = _split_seed(parts)
        label = "/".join(parts)
        summary = summarise_testnet(run) if is_testnet(run) else load_summary(run)
        labelled.append(ReportRun(label, run, summary, group, seed))
    return _unique(labelled)


def _unique(runs: list[ReportRun]) -> list[ReportRun]:
    """Runs given separately may share a label (``a/seed0``, ``b/seed0``): those are named by their path."""
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.label] = counts.get(r.label, 0) + 1
    out = []
    for r in runs:
        if counts[r.label] > 1:
            group, seed = _split_seed(r.folder.parts)
            out.append(ReportRun(str(r.folder), r.folder, r.summary, group, seed))
        else:
            out.append(r)
    return out
