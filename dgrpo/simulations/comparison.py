"""``dgrpo report RUN...``: every output of the comparison, from one read of the runs.

Into ``out``: ``report.md`` and ``report.csv`` (one row per run, :mod:`dgrpo.simulations.report`), ``report.png``
(ASR and accuracy overlay), and ``report.html``, the comparison page (:mod:`dgrpo.simulations.html_compare`),
with each run's own page in ``out/runs/``. A run is a simulation's folder, a sweep's or a study's folder of
them, or a testnet's folder (:func:`dgrpo.simulations.run_set.collect`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dgrpo.errors import ConfigError
from dgrpo.simulations.html_compare import write_comparison
from dgrpo.simulations.html_run import load_run
from dgrpo.simulations.report import overlay_plot, table_rows, to_csv, to_markdown
from dgrpo.simulations.run_set import collect


@dataclass(frozen=True)
class Comparison:
    rows: list[dict[str, Any]]  # the table, one row per run
    files: list[Path]  # what was written: report.md, report.csv, report.png, report.html


def build_comparison(paths: Sequence[Path], out: Path, baseline: Path | None = None) -> Comparison:
    runs = collect(paths)
    base = load_run(baseline) if baseline is not None else None
    rows = table_rows(runs, base.summary if base is not None else None)
    md, csv, png = out / "report.md", out / "report.csv", out / "report.png"
    try:
        out.mkdir(parents=True, exist_ok=True)
        md.write_text(to_markdown(rows))
        csv.write_text(to_csv(rows))
    except OSError as exc:
        raise ConfigError(f"cannot write the report in {out}: {exc}") from None
    overlay_plot(runs, png)
    html = write_comparison(runs, out, base)
    return Comparison(rows, [md, csv, png, html])
