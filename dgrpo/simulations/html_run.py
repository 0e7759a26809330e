"""One run folder read for the HTML page: ``summary.json`` and ``metrics.jsonl``, as written by
:func:`dgrpo.simulations.runner.run_simulation` and :func:`dgrpo.simulations.federated.run_federated`.

A folder without a readable summary is an error (the page would have nothing to say). Past that, every value
is read defensively: the numbers may come from hostile peers or a hand-edited file, and a value of the wrong
type leaves its cell or point out instead of crashing the page.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dgrpo.errors import ConfigError


@dataclass(frozen=True)
class RunData:
    """A run folder's contents: its summary and its per-round rows (empty when ``metrics.jsonl`` is absent)."""

    folder: Path
    summary: Mapping[str, Any]
    rows: tuple[Mapping[str, Any], ...]

    @property
    def federated(self) -> Mapping[str, Any] | None:
        fed = self.summary.get("federated")
        return fed if isinstance(fed, Mapping) else None

    @property
    def config(self) -> Mapping[str, Any]:
        return mapping(self.summary.get("scenario_config"))


def load_run(folder: Path) -> RunData:
    """Read ``folder``; a missing or malformed ``summary.json`` or ``metrics.jsonl`` is a :class:`ConfigError`
    naming the file. ``folder`` may name the summary itself, as ``dgrpo report`` accepts."""
    folder = folder.parent if folder.is_file() else folder
    path = folder / "summary.json"
    if not path.is_file():
        raise ConfigError(f"no summary.json in {folder} (is it a `dgrpo simulate` output folder?)")
    summary = _json_object(path.read_text(errors="replace"), str(path))
    rows: list[Mapping[str, Any]] = []
    metrics = folder / "metrics.jsonl"
    if metrics.is_file():
        for n, line in enumerate(metrics.read_text(errors="replace").splitlines(), start=1):
            if line.strip():
                rows.append(_json_object(line, f"{metrics} line {n}"))
    return RunData(folder, summary, tuple(rows))


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
    """``[[round, value], ...]`` pairs, keeping only those that are two numbers."""
    out = []
    for item in value if isinstance(value, list) else []:
        if isinstance(item, list | tuple) and len(item) == 2:
            x, y = number(item[0]), number(item[1])
            if x is not None and y is not None:
                out.append((x, y))
    return out


def column(rows: tuple[Mapping[str, Any], ...], key: str) -> list[tuple[float, float]]:
    """``(round, row[key])`` for the rows where both are numbers."""
    out = []
    for row in rows:
        x, y = number(row.get("round")), number(row.get(key))
        if x is not None and y is not None:
            out.append((x, y))
    return out


def counts(value: Any) -> dict[str, float]:
    """A ``{name: count}`` mapping, keeping the numeric entries."""
    out = {}
    for key, count in mapping(value).items():
        n = number(count)
        if n is not None:
            out[str(key)] = n
    return out
