"""A simulation's output folder: what is in it, and the rules that keep it from losing work.

- ``metrics.jsonl``: one row per round, appended (and flushed) as each round ends, so an interrupted or killed
  run keeps every round it finished;
- ``summary.json``: the typed :class:`~dgrpo.simulations.summary.RunSummary`, written at the end and when a
  run stops early (``complete: false``);
- ``state/snapshot.pkl``: what ``--resume`` continues from (the scenario and the whole simulation after the
  last saved round, :mod:`dgrpo.simulations.snapshot`), removed when the run completes;
- plots (``curves.png``, ``asr.png``).

A folder that holds a run is never overwritten silently: a new run into it is refused unless the caller asks to
resume it or to replace it (:func:`prepare`).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dgrpo.errors import ConfigError

METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
STATE = "state"
SNAPSHOT = "snapshot.pkl"
OUTPUTS = (METRICS, SUMMARY, "curves.png", "asr.png", STATE)


@dataclass(frozen=True)
class RunFolder:
    path: Path

    @property
    def metrics(self) -> Path:
        return self.path / METRICS

    @property
    def summary(self) -> Path:
        return self.path / SUMMARY

    @property
    def snapshot(self) -> Path:
        return self.path / STATE / SNAPSHOT

    def holds_run(self) -> bool:
        return any((self.path / name).exists() for name in OUTPUTS)

    def resumable(self) -> bool:
        return self.snapshot.is_file()

    def append_row(self, row: dict[str, Any]) -> None:
        with self.metrics.open("a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()

    def rewrite_rows(self, rows: list[dict[str, Any]]) -> None:
        """The rows of a resumed run: exactly those its snapshot holds (a row appended after the last snapshot,
        by a run killed in between, is dropped: that round runs again)."""
        self.metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def drop_state(self) -> None:
        shutil.rmtree(self.path / STATE, ignore_errors=True)

    def clear(self) -> None:
        for name in OUTPUTS:
            target = self.path / name
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()


def prepare(out: Path, *, resume: bool = False, overwrite: bool = False) -> RunFolder:
    """The folder for a run: a new one (refused where a run is already there, unless ``overwrite``), or, with
    ``resume``, one whose interrupted run can be continued."""
    folder = RunFolder(out)
    if resume:
        if folder.resumable():
            return folder
        if folder.summary.is_file() and not (out / STATE).exists():
            raise ConfigError(f"{out} holds a finished run: nothing to resume (a new run needs another --out)")
        raise ConfigError(
            f"{out} holds no interrupted run to resume (no {STATE}/{SNAPSHOT}); start it without --resume"
        )
    if folder.holds_run():
        if not overwrite:
            hint = "`--resume` continues it, " if folder.resumable() else ""
            raise ConfigError(f"{out} already holds a run; {hint}`--overwrite` replaces it, or choose another --out")
        folder.clear()
    out.mkdir(parents=True, exist_ok=True)
    return folder
