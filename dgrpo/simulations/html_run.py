"""One run folder read for the HTML pages: its typed summary (:func:`dgrpo.simulations.summary.load_summary`) and
its per-round rows (``metrics.jsonl``, :func:`read_rows`), as written by
:func:`dgrpo.simulations.runner.run_simulation` and :func:`dgrpo.simulations.federated.run_federated`; or a
``dgrpo testnet up`` folder, read as a run by :mod:`dgrpo.simulations.testnet_run`.

A folder without a readable summary is an error (the page would have nothing to say), and so is a summary that
is not one (a :class:`~dgrpo.errors.ConfigError` naming the file and the key). The rows stay dicts, read
defensively: a value of the wrong type leaves its cell or point out instead of crashing the page.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dgrpo.errors import ConfigError
from dgrpo.simulations.summary import FederatedSummary, RunSummary, load_summary
from dgrpo.simulations.testnet_run import is_testnet, read_testnet

METRICS_FILE = "metrics.jsonl"
Row = Mapping[str, Any]


@dataclass(frozen=True)
class RunData:
    """A run folder's contents: its summary and its per-round rows (empty when ``metrics.jsonl`` is absent)."""

    folder: Path
    summary: RunSummary
    rows: tuple[Row, ...]

    @property
    def federated(self) -> FederatedSummary | None:
        return self.summary.federated

    @property
    def config(self) -> Mapping[str, Any]:
        return self.summary.scenario_config


def read_rows(folder: Path) -> tuple[Row, ...]:
    """The per-round rows of the run in ``folder``: ``metrics.jsonl`` (none where it is absent; a malformed line
    is a :class:`ConfigError` naming it), or a testnet's rows in the same keys."""
    if is_testnet(folder):
        return tuple(read_testnet(folder)[1])
    rows: list[Row] = []
    metrics = folder / METRICS_FILE
    if metrics.is_file():
        for n, line in enumerate(metrics.read_text(errors="replace").splitlines(), start=1):
            if line.strip():
                rows.append(_json_object(line, f"{metrics} line {n}"))
    return tuple(rows)


def load_run(folder: Path) -> RunData:
    """Read ``folder`` (it may name the summary itself, as ``dgrpo report`` accepts); a missing or malformed
    ``summary.json`` or ``metrics.jsonl`` is a :class:`ConfigError` naming the file."""
    folder = folder.parent if folder.is_file() else folder
    if is_testnet(folder):
        summary, rows = read_testnet(folder)
        return RunData(folder, summary, tuple(rows))
    return RunData(folder, load_summary(folder), read_rows(folder))


def _json_object(text: str, where: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{where}: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a JSON object, found {type(data).__name__}")
    return data


def number(value: Any) -> float | None:
    """``value`` if it is a finite number (an int stays one: counts show as counts), else None (bools, strings,
    NaN, infinities and ints too large for a float are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int):  # JSON ints are unbounded; past 2**53 a float (and a plot) would lose or overflow
        return value if abs(value) < 2**53 else None
    return value if math.isfinite(value) else None


def mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def points(value: Any) -> list[tuple[float, float]]:
    """The ``(round, value)`` pairs of ``value`` whose two parts are finite numbers (a NaN is no point)."""
    out = []
    for item in value if isinstance(value, list | tuple) else []:
        if isinstance(item, list | tuple) and len(item) == 2:
            x, y = number(item[0]), number(item[1])
            if x is not None and y is not None:
                out.append((x, y))
    return out


def column(rows: tuple[Row, ...], key: str) -> list[tuple[float, float]]:
    """``(round, row[key])`` for the rows where both are numbers."""
    out = []
    for row in rows:
        x, y = number(row.get("round")), number(row.get(key))
        if x is not None and y is not None:
            out.append((x, y))
    return out


def defense_column(rows: tuple[Row, ...], key: str) -> list[tuple[float, float]]:
    """``(round, row["defense"][key])``: the defense meter's rate of that round, where it had one."""
    out = []
    for row in rows:
        r, v = number(row.get("round")), number(mapping(row.get("defense")).get(key))
        if r is not None and v is not None:
            out.append((r, v))
    return out


def counts(value: Any) -> dict[str, float]:
    """A ``{name: count}`` mapping, keeping the numeric entries."""
    out = {}
    for key, count in mapping(value).items():
        n = number(count)
        if n is not None:
            out[str(key)] = n
    return out
