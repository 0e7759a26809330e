"""The numbers of the comparison page (``dgrpo report``): each run's curves over rounds, and per group of runs
(the seeds of one cell, :mod:`dgrpo.simulations.run_set`) their mean with its spread.

A curve is a list of ``(round, value)`` points:

- ``accuracy``: the honest nodes' held-out accuracy at each evaluation (``summary.json``);
- ``reward``: the honest nodes' (federated: clients') mean training reward per round (``metrics.jsonl``);
- ``asr``: the attack success rate at each evaluation, for runs whose attack has one;
- ``length``: the honest nodes' mean completion length (characters) at each evaluation, for runs whose attack
  is measured by length (DoS): a length is not a rate, so it has its own chart, never the ASR's;
- ``stop_rate`` and ``fpr``: the defense meter's stop rate and false-positive rate of each round
  (``metrics.jsonl``'s ``defense`` block; a round without that kind of completion has no point).

A group's curve at a round is the mean over the runs that have a point there, with their least and most
(the band) and the standard error; a group's final figures are tabled as mean ± standard error over its runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dgrpo.simulations.html_run import RunData, column, defense_column, number, points
from dgrpo.simulations.run_set import ReportRun
from dgrpo.simulations.summary import RunSummary

Point = tuple[float, float]


@dataclass(frozen=True)
class Measure:
    key: str
    title: str
    ylabel: str
    unit_range: bool
    caption: str


MEASURES = [
    Measure(
        "accuracy", "Held-out accuracy", "accuracy", True, "Honest nodes' held-out accuracy (round 0: before training)."
    ),
    Measure(
        "reward", "Honest reward", "mean reward", False, "Honest nodes' (federated: clients') mean training reward."
    ),
    Measure("asr", "Attack success rate", "attack success rate", True, "ASR of the honest nodes at each evaluation."),
    Measure(
        "length",
        "Mean completion length (DoS)",
        "mean completion length (chars)",
        False,
        "Honest nodes' mean completion length at each evaluation, for attacks measured by length (DoS); the "
        "baseline run, if given, dotted.",
    ),
    Measure("stop_rate", "Defense stop rate", "stop rate", True, "Poisoned completions stopped / received, per round."),
    Measure("fpr", "Defense false-positive rate", "FPR", True, "Honest completions rejected / received, per round."),
]
BY_KEY = {m.key: m for m in MEASURES}


def length_points(s: RunSummary) -> list[Point]:
    """A DoS run's mean length per evaluation (``mean_length``; older summaries hold it in ``asr`` only)."""
    return points(s.mean_length) or (points(s.asr) if s.length_metric else [])


def run_series(run: RunData) -> dict[str, list[Point]]:
    """Every curve of ``run`` it has points for, by measure key."""
    s = run.summary
    reward = "mean_reward" if run.federated is not None else "honest_mean_reward"
    found = {
        "accuracy": points(s.accuracy),
        "reward": column(run.rows, reward),
        "asr": points(s.asr) if s.attack and not s.length_metric else [],
        "length": length_points(s) if s.length_metric else [],
        "stop_rate": defense_column(run.rows, "stop_rate"),
        "fpr": defense_column(run.rows, "false_positive_rate"),
    }
    return {key: pts for key, pts in found.items() if pts}


@dataclass(frozen=True)
class Band:
    """A group's curve: the mean over its runs at each round, the least and most of them, and how many runs
    drew it (1: a plain line, no band)."""

    label: str
    color: int
    mean: list[Point]
    low: list[Point]
    high: list[Point]
    runs: int
    dashed: bool = False


def band(label: str, color: int, curves: Sequence[Sequence[Point]], dashed: bool = False) -> Band:
    by_round: dict[float, list[float]] = {}
    for curve in curves:
        for x, y in curve:
            by_round.setdefault(x, []).append(y)
    rounds = sorted(by_round)
    return Band(
        label,
        color,
        [(x, sum(by_round[x]) / len(by_round[x])) for x in rounds],
        [(x, min(by_round[x])) for x in rounds],
        [(x, max(by_round[x])) for x in rounds],
        sum(1 for c in curves if c),
        dashed,
    )


@dataclass(frozen=True)
class Group:
    """The runs of one group (one cell's seeds), in the order given."""

    name: str
    color: int
    runs: list[tuple[ReportRun, RunData]]


def groups_of(runs: Sequence[tuple[ReportRun, RunData]]) -> list[Group]:
    order: dict[str, list[tuple[ReportRun, RunData]]] = {}
    for run, data in runs:
        order.setdefault(run.group, []).append((run, data))
    return [Group(name, i, members) for i, (name, members) in enumerate(order.items())]


def group_label(group: Group) -> str:
    n = len(group.runs)
    return group.name if n == 1 else f"{group.name} (mean of {n})"


def bands(groups: Sequence[Group], key: str) -> list[Band]:
    """One band per group that has points for ``key``."""
    out = []
    for g in groups:
        curves = [run_series(data).get(key, []) for _, data in g.runs]
        if any(curves):
            out.append(band(group_label(g), g.color, curves))
    return out


@dataclass(frozen=True)
class Stat:
    """Mean and standard error (sample standard deviation / sqrt(n)) over the ``n`` runs that have a value;
    ``se`` is None for one run."""

    mean: float
    se: float | None
    n: int


def stat(values: Sequence[float | None]) -> Stat | None:
    found = [v for v in (number(x) for x in values) if v is not None]
    if not found:
        return None
    n = len(found)
    mean = sum(found) / n
    if n == 1:
        return Stat(mean, None, 1)
    var = sum((v - mean) ** 2 for v in found) / (n - 1)
    return Stat(mean, math.sqrt(var) / math.sqrt(n), n)


def group_stat(group: Group, value: Callable[[RunSummary], float | int | None]) -> Stat | None:
    return stat([value(run.summary) for run, _ in group.runs])
